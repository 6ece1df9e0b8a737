#version 450
#extension GL_GOOGLE_include_directive : require
// y = W x for a few activation rows with float weights (F32, F16, BF16: WEIGHT_TYPE) and f32
// activations, rounded to the weight's type first as the CPU's dot products do. A workgroup
// computes ROWS rows for TOKENS activation rows; invocations stride over the row's elements
// and the partial sums are added up in shared memory. Epilogue as in matvec_quant.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // invocations, a power of two
layout(constant_id = 1) const uint WEIGHT_TYPE = 1;
layout(constant_id = 2) const uint ROWS = 2;
layout(constant_id = 3) const uint TOKENS = 1;

layout(push_constant) uniform Params {
  uint n_in;       // values per row
  uint row_bytes;  // bytes per weight row
  uint n_rows;     // rows in this part of the matrix
  uint row_begin;  // first row (within the part) of this dispatch
  uint n_tokens;   // activation rows
  uint x_stride;   // floats between rows of x
  uint y_stride;   // floats between rows of y (the matrix's n_out)
  uint y_col0;     // column of y (and index of bias) of the part's row 0
  uint flags;      // 1: add to y's old value; 2: add bias
} p;

layout(binding = 0) readonly buffer Weights { uint weight_words[]; };  // n_rows rows of row_bytes
layout(binding = 1) readonly buffer Input { float x[]; };              // [n_tokens][x_stride]
layout(binding = 2) buffer Output { float y[]; };                      // [n_tokens][y_stride]
layout(binding = 3) readonly buffer Bias { float bias[]; };            // [y_stride] when flags & 2

#include "common.glsl"
#include "weight_bytes.glsl"
#include "weight_values.glsl"

shared float partial[ROWS * TOKENS * WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r0 = p.row_begin + gl_WorkGroupID.x * ROWS;
  const uint t0 = gl_WorkGroupID.y * TOKENS;
  float acc[ROWS * TOKENS];
  for (uint i = 0u; i < ROWS * TOKENS; ++i) acc[i] = 0.0;

  for (uint e = tid; e < p.n_in; e += WG) {
    float xs[TOKENS];
    for (uint t = 0u; t < TOKENS; ++t) {
      xs[t] = t0 + t < p.n_tokens ? ActivationValue(x[(t0 + t) * p.x_stride + e]) : 0.0;
    }
    for (uint r = 0u; r < ROWS; ++r) {
      if (r0 + r >= p.n_rows) break;
      const float w = WeightValue((r0 + r) * p.row_bytes, e);
      for (uint t = 0u; t < TOKENS; ++t) acc[r * TOKENS + t] = fma(w, xs[t], acc[r * TOKENS + t]);
    }
  }

  for (uint i = 0u; i < ROWS * TOKENS; ++i) partial[i * WG + tid] = acc[i];
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1) {
    if (tid < s) {
      for (uint i = 0u; i < ROWS * TOKENS; ++i) partial[i * WG + tid] += partial[i * WG + tid + s];
    }
    barrier();
  }
  for (uint i = tid; i < ROWS * TOKENS; i += WG) {
    const uint r = r0 + i / TOKENS, t = t0 + i % TOKENS;
    if (r >= p.n_rows || t >= p.n_tokens) continue;
    const uint at = t * p.y_stride + p.y_col0 + r;
    float v = partial[i * WG];
    if ((p.flags & 2u) != 0u) v += bias[p.y_col0 + r];
    if ((p.flags & 1u) != 0u) v = y[at] + v;
    y[at] = v;
  }
}
