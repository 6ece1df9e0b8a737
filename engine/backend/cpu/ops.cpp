#include "engine/backend/cpu/ops.h"

#include <cmath>

namespace kvfs::cpu {

void RmsNorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
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

void Softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace kvfs::cpu
