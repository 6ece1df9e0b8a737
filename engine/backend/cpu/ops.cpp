#include "engine/backend/cpu/ops.h"

#include "engine/backend/cpu/cpu_features.h"

#include <cmath>
#include <cstdint>

namespace kvfs::cpu {

void RmsNorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);  // float square, double sum (as the reference)
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

void RopeAngles(const RopeParams& p, int64_t pos, float* cos_out, float* sin_out) {
  // theta_i = pos * base^(-2i/n_rot) * freq_scale / factor_i, with the power built up by
  // repeated multiplication in float as the reference does (keeps its rounding).
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < p.n_rot / 2; ++i) {
    const float factor = p.freq_factors != nullptr ? p.freq_factors[i] : 1.0f;
    const float angle = p.freq_scale * (theta / factor);
    cos_out[i] = std::cos(angle);
    sin_out[i] = std::sin(angle);
    theta *= theta_scale;
  }
}

void RopeApply(const RopeParams& p, const float* cos_t, const float* sin_t, float* x, int64_t n_heads) {
  const int64_t half = p.n_rot / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * p.head_dim;
    for (int64_t i = 0; i < half; ++i) {
      // Normal style pairs neighbours; NeoX pairs dimension i with i + n_rot/2.
      const int64_t a = p.style == RopeStyle::kNormal ? 2 * i : i;
      const int64_t b = p.style == RopeStyle::kNormal ? 2 * i + 1 : i + half;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cos_t[i] - x1 * sin_t[i];
      v[b] = x0 * sin_t[i] + x1 * cos_t[i];
    }
  }
}

namespace {

// The body of ExpPoly, written so that loops over it vectorise: every step is an IEEE operation
// (fma, multiply, select, bit cast) with the same result in any vector width, so every clone
// below computes bit-identical values.
inline float ExpPolyInline(float x) {
  const float shift = 0x1.8p23f;  // adding it rounds to an integer (|x / ln2| < 2^22)
  const float z = std::fma(x, 0x1.715476p+0f, shift);
  const float n = z - shift;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  // 2^n in two normal factors, so results down to the subnormal range stay right.
  const float nc = n < -192.0f ? -192.0f : (n > 192.0f ? 192.0f : n);
  const int32_t n1 = static_cast<int32_t>(nc) / 2;
  const int32_t n2 = static_cast<int32_t>(nc) - n1;
  const float s1 = __builtin_bit_cast(float, (n1 + 127) << 23);
  const float s2 = __builtin_bit_cast(float, (n2 + 127) << 23);
  const float r = j * s1 * s2;
  return n < -192.0f ? 0.0f : (n > 192.0f ? INFINITY : r);
}

// Element loops compiled three times (AVX-512, AVX2+FMA, baseline) and chosen once by cpuid.
// Every variant performs the same IEEE operations, so results are bit-identical. (Not
// target_clones: its ifunc resolvers run before sanitizer runtimes initialise.)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif
namespace avx512 {
#include "engine/backend/cpu/element_loops.inc"
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
#include "engine/backend/cpu/element_loops.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
namespace baseline {
#include "engine/backend/cpu/element_loops.inc"
}  // namespace baseline

struct ElementLoops {
  void (*exp_shifted)(const float*, float, float*, int64_t);
  void (*swiglu)(const float*, const float*, float*, int64_t);
};

const ElementLoops& Loops() {
  static const ElementLoops loops = [] {
    const CpuFeatures& cpu = HostCpuFeatures();
    if (cpu.avx512_core) {
      return ElementLoops{avx512::ExpShifted, avx512::SwiGluPoly};
    }
    if (cpu.avx2_fma_f16c) {
      return ElementLoops{avx2::ExpShifted, avx2::SwiGluPoly};
    }
    return ElementLoops{baseline::ExpShifted, baseline::SwiGluPoly};
  }();
  return loops;
}

void ExpShifted(const float* x, float shift, float* y, int64_t n) { Loops().exp_shifted(x, shift, y, n); }
void SwiGluPoly(const float* gate, const float* up, float* out, int64_t n) { Loops().swiglu(gate, up, out, n); }

}  // namespace

float ExpPoly(float x) { return ExpPolyInline(x); }

void Softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
  // Sum in chunks of 16 (each reduced pairwise in float) accumulated in double: the
  // reference's order, so normalised weights round to f16 the same way.
  ExpShifted(x, max, x, n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; i += 16) {
    float lanes[16] = {};
    for (int64_t l = 0; l < 16 && i + l < n; ++l) lanes[l] = x[i + l];
    for (int width = 8; width >= 1; width /= 2) {
      for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    sum += lanes[0];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n, int64_t n_rows) {
  for (int64_t r = 0; r < n_rows; ++r) SwiGluPoly(gate + r * n, up + r * n, out + r * n, n);
}

}  // namespace kvfs::cpu
