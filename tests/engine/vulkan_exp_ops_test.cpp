// The Vulkan ops built on the exp polynomial, SwiGLU and softmax, against the CPU bit for bit.
// Their one device-dependent step is the polynomial's fma: Vulkan lets a device fuse it or
// round the product first, and lavapipe rounds it twice (GPUs fuse, as the CPU's std::fma).
// So the expectation is computed here both ways, by an oracle written from the CPU's operations
// (ExpPolyOracle: checked to give cpu::ExpPoly's bits when fused), and the device must give
// one of them in every value: all else (the order of the softmax's sums, 1 / sum, the
// divisions) must be the CPU's exactly. A GPU must give the fused one.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#if defined(KVFS_VULKAN)

#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/ops.h"
#include "tests/engine/vulkan_test_util.h"

namespace kvfs::testing {
namespace {

float FmaRounded(float a, float b, float c, bool fused) { return fused ? std::fma(a, b, c) : a * b + c; }

// cpu::ExpPoly's operations (ops.cpp), each fma fused or rounded twice.
float ExpPolyOracle(float x, bool fused) {
  const float shift = 0x1.8p23f;
  const float z = FmaRounded(x, 0x1.715476p+0f, shift, fused);
  const float n = z - shift;
  const float b = FmaRounded(-n, 0x1.7f7d1cp-20f, FmaRounded(-n, 0x1.62e4p-1f, x, fused), fused);
  const float u = b * b;
  const float j = FmaRounded(FmaRounded(FmaRounded(0x1.0e4020p-7f, b, 0x1.573e2ep-5f, fused), u,
                                        FmaRounded(0x1.555e66p-3f, b, 0x1.fffdb6p-2f, fused), fused),
                             u, FmaRounded(0x1.ffffecp-1f, b, 1.0f, fused), fused);
  const float nc = std::fmin(std::fmax(n, -192.0f), 192.0f);
  const int32_t n1 = static_cast<int32_t>(nc) / 2, n2 = static_cast<int32_t>(nc) - n1;
  const float r = j * std::ldexp(1.0f, n1) * std::ldexp(1.0f, n2);
  return n < -192.0f ? 0.0f : (n > 192.0f ? INFINITY : r);
}

// cpu::Softmax of attention rows (SoftmaxScalar: scale, max, exp, chunks of 16 summed as a tree
// then in double, (float)(1.0 / sum), f16 rounding), with ExpPolyOracle.
void SoftmaxOracle(float* s, int64_t n, float scale, bool round_f16, bool fused) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::fmax(max, s[i] *= scale);
  double sum = 0.0;
  for (int64_t c = 0; c < n; c += 16) {
    float lanes[16] = {};
    for (int64_t l = 0; l < 16 && c + l < n; ++l) lanes[l] = s[c + l] = ExpPolyOracle(s[c + l] - max, fused);
    for (int width = 8; width >= 1; width /= 2) {
      for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    sum += lanes[0];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) s[i] = round_f16 ? Fp16ToFp32(Fp32ToFp16(s[i] * inv)) : s[i] * inv;
}

// Which oracle the device's values equal everywhere: "fused", "rounded twice" or nullptr.
const char* MatchingOracle(const std::vector<float>& got, const std::vector<float>& fused,
                           const std::vector<float>& twice) {
  const auto same = [&](const std::vector<float>& want) {
    return want.size() == got.size() && std::memcmp(want.data(), got.data(), got.size() * 4) == 0;
  };
  return same(fused) ? "fused" : same(twice) ? "rounded twice" : nullptr;
}

int64_t Differing(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

class VulkanExpOpsTest : public VulkanOpsTest {
 protected:
  bool IsGpu() const { return ctx_->info().type != "cpu"; }
};

TEST_F(VulkanExpOpsTest, OracleIsTheCpuExpPoly) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> x(-110.0f, 90.0f);
  int64_t twice_differs = 0;
  for (int i = 0; i < 200000; ++i) {
    const float v = x(rng);
    ASSERT_EQ(ExpPolyOracle(v, true), cpu::ExpPoly(v)) << v;
    twice_differs += ExpPolyOracle(v, false) != cpu::ExpPoly(v);
  }
  // Rounding twice must matter, or the tests below could not tell the two apart.
  EXPECT_GT(twice_differs, 1000);
}

// Rows of 1000 (62 chunks and a tail) and of 172 (stories260K's n_ff) and 35; overflowing and
// underflowing gates.
TEST_F(VulkanExpOpsTest, SwiGluMatchesCpuBitForBit) {
  std::mt19937 rng(13);
  for (const int64_t n : {1000, 172, 35}) {
    const int64_t rows = 3;
    std::normal_distribution<float> normal(0.0f, 4.0f);
    std::vector<float> gate(rows * n), up(rows * n), want(rows * n), twice(rows * n);
    for (float& v : gate) v = normal(rng);
    for (float& v : up) v = normal(rng);
    gate[0] = -200.0f;
    gate[1] = 200.0f;
    cpu::SwiGlu(gate.data(), up.data(), want.data(), n, rows);
    for (int64_t i = 0; i < rows * n; ++i) twice[i] = gate[i] / (1.0f + ExpPolyOracle(-gate[i], false)) * up[i];
    const vk::Buffer g = Input(gate), u = Input(up), y = Output(rows * n * 4);
    ASSERT_TRUE(Run([&](vk::Recorder& rec) { return ops_->SwiGlu(rec, g, u, y, rows * n); }).ok());
    const std::vector<float> got = Read<float>(y, rows * n);
    const char* match = MatchingOracle(got, want, twice);
    std::printf("[vulkan swiglu] n=%lld: equal to the CPU's with the fma %s (%lld differ from fused, %lld from twice)\n",
                static_cast<long long>(n), match != nullptr ? match : "NEITHER",
                static_cast<long long>(Differing(got, want)), static_cast<long long>(Differing(got, twice)));
    EXPECT_NE(match, nullptr) << "n=" << n;
    if (IsGpu()) {
      EXPECT_EQ(Differing(got, want), 0) << "n=" << n;
    }
  }
}

// Causal rows of 301 to 304 positions, of 536 (stories260K's prompt) and of 5000 (an invocation
// takes more than one chunk of 16), both with and without f16 rounding (an f16 cache): the sums'
// order and 1 / sum as the CPU's. (With f16 rounding the two fma roundings mostly give the same
// weights; the f32 cases tell them apart.)
TEST_F(VulkanExpOpsTest, SoftmaxMatchesCpuBitForBit) {
  std::mt19937 rng(17);
  const int64_t n_head = 3;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const cpu::AttentionKernels& attn = cpu::ScalarAttentionKernels();
  for (const auto& [T, pos0] : {std::pair<int64_t, int64_t>{4, 300}, {2, 534}, {1, 4999}}) {
    const int64_t stride = pos0 + T;
    for (bool round_f16 : {false, true}) {
      std::vector<float> s(T * n_head * stride);
      for (float& v : s) v = normal(rng);
      std::vector<float> want = s, fused = s, twice = s;
      for (int64_t r = 0; r < T * n_head; ++r) {
        const int64_t n = pos0 + r / n_head + 1;
        attn.softmax(want.data() + r * stride, n, stride, 0.125f, round_f16);
        SoftmaxOracle(fused.data() + r * stride, n, 0.125f, round_f16, true);
        SoftmaxOracle(twice.data() + r * stride, n, 0.125f, round_f16, false);
      }
      const vk::Buffer sb = Output(s.size() * 4);
      std::memcpy(sb.mapped(), s.data(), s.size() * 4);
      ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                    return ops_->Softmax(rec, sb, n_head, T, pos0, stride, 0.125f, round_f16);
                  }).ok());
      const std::vector<float> got = Read<float>(sb, s.size());
      // Positions past a row's visible ones are not written by the shader (the CPU zeroes them).
      std::vector<float> g, w, f, t;
      for (int64_t r = 0; r < T * n_head; ++r) {
        for (int64_t p = 0; p <= pos0 + r / n_head; ++p) {
          g.push_back(got[r * stride + p]);
          w.push_back(want[r * stride + p]);
          f.push_back(fused[r * stride + p]);
          t.push_back(twice[r * stride + p]);
        }
      }
      ASSERT_EQ(Differing(f, w), 0) << "the fused oracle must be the CPU's softmax";
      const char* match = MatchingOracle(g, w, t);
      std::printf("[vulkan softmax] n=%lld round_f16=%d: equal to the CPU's with the fma %s (%lld of %zu differ "
                  "from fused, %lld from twice)\n",
                  static_cast<long long>(pos0 + T), round_f16, match != nullptr ? match : "NEITHER",
                  static_cast<long long>(Differing(g, w)), g.size(), static_cast<long long>(Differing(g, t)));
      EXPECT_NE(match, nullptr) << "pos0=" << pos0 << " round_f16=" << round_f16;
      if (IsGpu()) {
        EXPECT_EQ(Differing(g, w), 0);
      }
    }
  }
}

}  // namespace
}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
