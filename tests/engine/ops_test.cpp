#include "engine/backend/cpu/ops.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

namespace kvfs::cpu {
namespace {

TEST(CpuOps, ExpPolyWithinTwoAndAHalfUlpOfExp) {  // documented: 1.45 ulp + 0.5 rounding
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-87.0f, 88.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = u(rng);
    const double ref = std::exp(static_cast<double>(x));
    const float got = ExpPoly(x);
    const double ulp = std::nextafter(static_cast<float>(ref), INFINITY) - static_cast<float>(ref);
    ASSERT_LE(std::fabs(got - ref), 2.5 * ulp) << "x=" << x;
  }
  EXPECT_EQ(ExpPoly(0.0f), 1.0f);
  EXPECT_EQ(ExpPoly(-200.0f), 0.0f);
  EXPECT_EQ(ExpPoly(-INFINITY), 0.0f);
  // Subnormal results: within a couple of subnormal steps (2^-149) of the true value.
  for (float x : {-90.0f, -100.0f, -103.0f}) EXPECT_NEAR(ExpPoly(x), std::exp(static_cast<double>(x)), 3 * 1.4e-45) << x;
}

TEST(CpuOps, SoftmaxIsADistributionMatchingDoubleReference) {
  std::vector<float> x = {1.0f, 2.0f, -3.0f, 0.5f, 10.0f, -50.0f, 2.0f, 0.0f, 3.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 7.0f};
  std::vector<double> ref(x.size());
  double mx = -1e30, sum = 0.0;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  for (size_t i = 0; i < x.size(); ++i) sum += ref[i] = std::exp(x[i] - mx);
  Softmax(x.data(), static_cast<int64_t>(x.size()));
  double total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], ref[i] / sum, 1e-6);
    total += x[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
}

TEST(CpuOps, SwiGluMatchesFormula) {
  std::vector<float> g(70), u(70), out(70);
  for (int i = 0; i < 70; ++i) {
    g[i] = -8.0f + 0.23f * i;
    u[i] = 0.5f - 0.01f * i;
  }
  SwiGlu(g.data(), u.data(), out.data(), 35, 2);  // two rows of 35 (32 vectorised + a tail of 3)
  for (int i = 0; i < 70; ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-5 * (1.0 + std::fabs(ref))) << i;
    // Every value, the rows' tails too, from ExpPoly (what the Vulkan shaders compute), not libm.
    EXPECT_EQ(out[i], g[i] / (1.0f + ExpPoly(-g[i])) * u[i]) << i;
  }
}

TEST(CpuOps, RmsNormMatchesDoubleReference) {
  std::vector<float> x(100), w(100), y(100);
  for (int i = 0; i < 100; ++i) {
    x[i] = std::sin(0.7f * i) * 3.0f;
    w[i] = 1.0f + 0.01f * i;
  }
  RmsNorm(x.data(), w.data(), y.data(), 100, 1e-5f);
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ss / 100 + 1e-5);
  for (int i = 0; i < 100; ++i) EXPECT_NEAR(y[i], x[i] * scale * w[i], 1e-5);
}

TEST(CpuOps, RopeRotatesPairsAndPreservesNorm) {
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    RopeParams p{8, 8, 10000.0f, 1.0f, style, nullptr};
    std::vector<float> c(4), s(4);
    std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, orig = x;
    RopeAngles(p, 0, c.data(), s.data());
    RopeApply(p, c.data(), s.data(), x.data(), 1);
    EXPECT_EQ(x, orig);  // position 0: identity
    RopeAngles(p, 7, c.data(), s.data());
    RopeApply(p, c.data(), s.data(), x.data(), 1);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 8; ++i) {
      n0 += orig[i] * orig[i];
      n1 += x[i] * x[i];
    }
    EXPECT_NEAR(n0, n1, 1e-3);
    // The first pair rotates by exactly pos radians (frequency base^0 = 1).
    const int a = 0, b = style == RopeStyle::kNormal ? 1 : 4;
    EXPECT_NEAR(x[a], orig[a] * std::cos(7.0) - orig[b] * std::sin(7.0), 1e-5);
    EXPECT_NEAR(x[b], orig[a] * std::sin(7.0) + orig[b] * std::cos(7.0), 1e-5);
  }
  // Frequency factors divide the angle (Llama-3 rope_freqs).
  const float factors[2] = {2.0f, 1.0f};
  RopeParams p{4, 4, 10000.0f, 1.0f, RopeStyle::kNormal, factors};
  float c[2], s[2];
  RopeAngles(p, 3, c, s);
  EXPECT_NEAR(c[0], std::cos(1.5), 1e-6);
}

}  // namespace
}  // namespace kvfs::cpu
