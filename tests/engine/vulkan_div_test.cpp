// common.glsl's exact division (Div, DivQuotient), checked off the device: the shader takes
// the significands' quotient from the device's own division, which Vulkan lets be 2.5 ulp off,
// and corrects it with the exact integer remainder. What a device's division contributes is
// modelled here as the whole range it could take, and more: the first estimate off by up to 16
// units of the 25-bit quotient either way (a 2.5-ulp division is at most 5 off, 10 where a
// device reads its ulp at a result of 2), the remainder step's floor off by one either way. For
// each, the result must be the host's IEEE quotient.
// The twin below follows the GLSL line by line (uint arithmetic wrapping mod 2^32, int casts
// keeping the bits); the Vulkan ops tests then hold the shaders that call Div to the CPU's bits.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>

namespace kvfs {
namespace {

// DivQuotient with the device's two divisions replaced: `estimate` is the first guess of Q,
// `floor_error` what the device's floor(r / mb) adds to the exact one.
uint32_t DivQuotientTwin(uint32_t ma, uint32_t mb, uint32_t q, int floor_error, uint32_t* remainder) {
  int32_t r = static_cast<int32_t>((ma << 24) - q * mb);
  const int32_t step = static_cast<int32_t>(std::floor(static_cast<double>(r) / mb)) + floor_error;
  q = static_cast<uint32_t>(static_cast<int32_t>(q) + step);
  r -= step * static_cast<int32_t>(mb);
  if (r < 0) {
    q -= 1u;
    r += static_cast<int32_t>(mb);
  } else if (r >= static_cast<int32_t>(mb)) {
    q += 1u;
    r -= static_cast<int32_t>(mb);
  }
  *remainder = static_cast<uint32_t>(r);
  return q;
}

// Div with the estimate `exact Q + estimate_error`; nullopt where the shader falls back to the
// device's division (zeros, infinities, NaN, subnormals, results out of the normal range).
std::optional<float> DivTwin(float a, float b, int estimate_error, int floor_error) {
  const uint32_t ua = std::bit_cast<uint32_t>(a), ub = std::bit_cast<uint32_t>(b);
  const uint32_t ea = (ua >> 23) & 0xFFu, eb = (ub >> 23) & 0xFFu;
  if (ea == 0u || ea == 0xFFu || eb == 0u || eb == 0xFFu) return std::nullopt;
  uint32_t ma = (ua & 0x7FFFFFu) | 0x800000u;
  const uint32_t mb = (ub & 0x7FFFFFu) | 0x800000u;
  int e = static_cast<int>(ea) - static_cast<int>(eb) + 127;
  if (ma < mb) {
    ma <<= 1;
    e -= 1;
  }
  const uint64_t exact_q = (static_cast<uint64_t>(ma) << 24) / mb;
  uint32_t remainder = 0;
  uint32_t q = DivQuotientTwin(ma, mb, static_cast<uint32_t>(static_cast<int64_t>(exact_q) + estimate_error), floor_error,
                               &remainder);
  const bool round_bit = (q & 1u) != 0u;
  q >>= 1;
  if (round_bit && (remainder != 0u || (q & 1u) != 0u)) q += 1u;
  if (q == 0x1000000u) {
    q >>= 1;
    e += 1;
  }
  if (e <= 0 || e >= 255) return std::nullopt;
  return std::bit_cast<float>(((ua ^ ub) & 0x80000000u) | (static_cast<uint32_t>(e) << 23) | (q & 0x7FFFFFu));
}

// A device's floor(r / mb) can only be off where r / mb is within a hair of an integer; the
// twin is still required to be exact with the floor off by one either way for every input.
TEST(VulkanDivTest, QuotientIsIeeeForEveryEstimateADeviceCouldMake) {
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<int> exponent(-60, 60);
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    // Random significands and signs at exponents around 0, and a few hand-picked edge shapes.
    float a = std::ldexp(1.0f + (bits(rng) & 0x7FFFFFu) / 8388608.0f, exponent(rng));
    float b = std::ldexp(1.0f + (bits(rng) & 0x7FFFFFu) / 8388608.0f, exponent(rng));
    if (i % 7 == 0) b = std::ldexp(1.0f, exponent(rng));                       // powers of two
    if (i % 11 == 0) a = b * static_cast<float>(1 + bits(rng) % 4096);        // exact quotients
    if (i % 13 == 0) b = std::bit_cast<float>(std::bit_cast<uint32_t>(a) + 1u - 2u * (bits(rng) & 1u));  // a / b ~ 1
    if (bits(rng) & 1u) a = -a;
    if (bits(rng) & 1u) b = -b;
    const float want = a / b;
    for (int estimate_error = -16; estimate_error <= 16; ++estimate_error) {
      for (int floor_error = -1; floor_error <= 1; ++floor_error) {
        const std::optional<float> got = DivTwin(a, b, estimate_error, floor_error);
        if (!got) continue;
        ASSERT_EQ(std::bit_cast<uint32_t>(*got), std::bit_cast<uint32_t>(want))
            << a << " / " << b << " with the estimate off by " << estimate_error << " and the floor by "
            << floor_error;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 200000 * 33 * 3 * 9 / 10);  // nearly every case is in the normal range
}

// Results at the edges of the normal range: kept where normal, the device's division outside.
// (No quotient of two floats lies exactly halfway between two floats, so Div's ties-to-even
// branch never decides: b times a midpoint of 25 significant bits is no float.)
TEST(VulkanDivTest, RangeEdgesAreExactOrFallBack) {
  constexpr float kMax = std::numeric_limits<float>::max(), kMin = std::numeric_limits<float>::min();
  for (int estimate_error : {-16, 0, 16}) {
    EXPECT_FALSE(DivTwin(1e30f, 1e-30f, estimate_error, 0).has_value());  // overflows
    EXPECT_FALSE(DivTwin(1e-30f, 1e30f, estimate_error, 0).has_value());  // below the normal range
    EXPECT_FALSE(DivTwin(0.0f, 3.0f, estimate_error, 0).has_value());     // zero
    EXPECT_FALSE(DivTwin(kMin * 1.5f, 2.0f, estimate_error, 0).has_value());  // biased exponent 0: subnormal
    EXPECT_EQ(DivTwin(1.0f, 3.0f, estimate_error, 0), std::optional<float>(1.0f / 3.0f));
    EXPECT_EQ(DivTwin(kMax, 2.0f, estimate_error, 0), std::optional<float>(kMax / 2.0f));
    EXPECT_EQ(DivTwin(kMin * 4.0f, 2.0f, estimate_error, 0), std::optional<float>(kMin * 2.0f));
    EXPECT_EQ(DivTwin(kMin * 3.0f, 1.5f, estimate_error, 0), std::optional<float>(kMin * 2.0f));
    EXPECT_EQ(DivTwin(-7.0f, 0.1f, estimate_error, 0), std::optional<float>(-7.0f / 0.1f));
  }
}

}  // namespace
}  // namespace kvfs
