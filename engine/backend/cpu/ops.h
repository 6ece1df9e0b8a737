// Element-wise and row ops of the CPU forward pass (f32). Arithmetic follows the reference
// engine's definitions (double accumulation in norms and softmax sums) so logits match it.
#pragma once

#include <cstdint>

#include "engine/model/hparams.h"

namespace kvfs::cpu {

// y = x / sqrt(mean(x^2) + eps) * w, over n elements.
void RmsNorm(const float* x, const float* w, float* y, int64_t n, float eps);

// Rotates the first n_rot dimensions of each of n_heads head vectors (head_dim apart) in place
// for position pos. freq_factors (n_rot/2 divisors) may be null.
struct RopeParams {
  int64_t n_rot;
  int64_t head_dim;
  float freq_base;
  float freq_scale;
  RopeStyle style;
  const float* freq_factors;
};
// cos/sin table for one position: n_rot/2 pairs.
void RopeAngles(const RopeParams& p, int64_t pos, float* cos_out, float* sin_out);
void RopeApply(const RopeParams& p, const float* cos_t, const float* sin_t, float* x, int64_t n_heads);

// exp(x) by range reduction to 2^n * e^b (|b| <= ln2/2) and a degree-5 polynomial: the
// scheme of Arm's optimized-routines expf, which the reference engine vectorises for softmax
// and SiLU. Max error ~1.5 ulp. Using the same function keeps our attention weights on the
// same side of f16 rounding boundaries as the reference. Below -103.97 it returns 0.
float ExpPoly(float x);

// In place: x = exp(x - max) / sum over n; returns nothing. n >= 1.
void Softmax(float* x, int64_t n);

// out = silu(gate) * up over rows of n (n_rows rows), every value with ExpPoly. (The reference
// takes expf for the last n mod 16 values of a row; libm's bits cannot be had on a GPU, and real
// models' rows are multiples of 16, so every backend uses the polynomial throughout.)
void SwiGlu(const float* gate, const float* up, float* out, int64_t n, int64_t n_rows = 1);

}  // namespace kvfs::cpu
