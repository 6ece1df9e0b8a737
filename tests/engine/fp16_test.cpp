// IEEE half and bfloat16 conversions (engine/model/quants.h).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "engine/model/quants.h"

namespace kvfs {
namespace {

bool IsHalfNan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }

// The value of a (non-NaN) half straight from the IEEE definition, in double.
double HalfValue(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1.0 + mant / 1024.0, exp - 15);
  }
  return sign ? -v : v;
}

float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(Fp16, AllHalvesRoundTripThroughFloat) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = Fp16ToFp32(h);
    if (IsHalfNan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      const uint16_t back = Fp32ToFp16(f);
      ASSERT_TRUE(IsHalfNan(back)) << std::hex << h << " -> " << back;
      ASSERT_EQ(back & 0x8000u, h & 0x8000u) << "NaN sign lost for " << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), HalfValue(h)) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
    ASSERT_EQ(Fp32ToFp16(f), h) << std::hex << h;
  }
}

TEST(Fp16, HandCheckedValues) {
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x3800), 0.5f);
  EXPECT_EQ(Fp16ToFp32(0x3555), 0.333251953125f);
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0xFBFF), -65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));           // smallest subnormal
  EXPECT_EQ(Fp16ToFp32(0x03FF), 1023.0f * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(Fp16ToFp32(0x0400), std::ldexp(1.0f, -14));           // smallest normal
  EXPECT_EQ(Fp16ToFp32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp16ToFp32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp16ToFp32(0x0000), 0.0f);
  EXPECT_FALSE(std::signbit(Fp16ToFp32(0x0000)));
  EXPECT_TRUE(std::signbit(Fp16ToFp32(0x8000)));
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7E00)));
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7C01)));  // signalling NaN stays NaN (not inf)

  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xC000);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(1023.0f * std::ldexp(1.0f, -24)), 0x03FF);
  EXPECT_EQ(Fp32ToFp16(0.0f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_TRUE(IsHalfNan(Fp32ToFp16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsHalfNan(Fp32ToFp16(FromBits(0x7F800001u))));  // payload only in low bits
  EXPECT_TRUE(IsHalfNan(Fp32ToFp16(FromBits(0xFFC00000u))));
  EXPECT_EQ(Fp32ToFp16(FromBits(0xFFC00000u)) & 0x8000u, 0x8000u);
}

TEST(Fp16, FloatToHalfRoundsToNearestEven) {
  const float ulp1 = std::ldexp(1.0f, -10);  // half ulp at 1.0 is 2^-10
  // Exact ties between two halves go to the even mantissa.
  EXPECT_EQ(Fp32ToFp16(1.0f + ulp1 / 2), 0x3C00);      // 0x3C00 | 0x3C01 -> 0x3C00
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * ulp1 / 2), 0x3C02);  // 0x3C01 | 0x3C02 -> 0x3C02
  EXPECT_EQ(Fp32ToFp16(-(1.0f + ulp1 / 2)), 0xBC00);
  // Just above / below a tie.
  EXPECT_EQ(Fp32ToFp16(std::nextafter(1.0f + ulp1 / 2, 2.0f)), 0x3C01);
  EXPECT_EQ(Fp32ToFp16(std::nextafter(1.0f + 3 * ulp1 / 2, 0.0f)), 0x3C01);
  // Mantissa carry into the exponent: 2 - 2^-11 is the tie between 0x3FFF (2 - 2^-10, odd)
  // and 0x4000 (2.0).
  EXPECT_EQ(Fp32ToFp16(2.0f - std::ldexp(1.0f, -11)), 0x4000);
  EXPECT_EQ(Fp32ToFp16(std::nextafter(2.0f - std::ldexp(1.0f, -11), 0.0f)), 0x3FFF);
  // Overflow: 65520 is the tie between 65504 (odd mantissa) and 2^16, so it rounds to inf.
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(-65520.0f), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(1.0e6f), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::max()), 0x7C00);
  // Subnormal results.
  const float tiny = std::ldexp(1.0f, -24);
  EXPECT_EQ(Fp32ToFp16(tiny / 2), 0x0000);                                  // tie -> 0 (even)
  EXPECT_EQ(Fp32ToFp16(std::nextafter(tiny / 2, 1.0f)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(-tiny / 2), 0x8000);
  EXPECT_EQ(Fp32ToFp16(3 * tiny / 2), 0x0002);                              // tie 1|2 -> 2
  EXPECT_EQ(Fp32ToFp16(5 * tiny / 2), 0x0002);                              // tie 2|3 -> 2
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -14) - tiny / 2), 0x0400);          // tie -> normal
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::min()), 0x0000);
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-std::numeric_limits<float>::denorm_min()), 0x8000);
}

// For random finite floats in (and a bit beyond) the half range, the result must be the
// nearest half, ties to even; checked against the neighbours with exact double arithmetic.
TEST(Fp16, FloatToHalfIsNearestForRandomFloats) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> mant(0, 0x7FFFFF);
  std::uniform_int_distribution<int> exp(127 - 27, 127 + 15);
  std::bernoulli_distribution neg(0.5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = (neg(rng) ? 0x80000000u : 0u) |
                       (static_cast<uint32_t>(exp(rng)) << 23) | mant(rng);
    const float f = FromBits(u);
    const uint16_t h = Fp32ToFp16(f);
    ASSERT_FALSE(IsHalfNan(h));
    const double x = f;
    const double err = std::fabs(HalfValue(h) - x);
    const auto mag = static_cast<uint16_t>(h & 0x7FFFu);
    const auto sgn = static_cast<uint16_t>(h & 0x8000u);
    if (mag == 0x7C00u) {  // infinity: only for |x| >= 65520
      ASSERT_GE(std::fabs(x), 65520.0) << x;
      continue;
    }
    ASSERT_EQ(std::signbit(x), sgn != 0);
    // Neighbours with the same sign (one step towards zero and one away, finite only).
    for (int step : {-1, 1}) {
      const int nm = static_cast<int>(mag) + step;
      if (nm < 0 || nm > 0x7BFF) continue;
      const double other = std::fabs(HalfValue(static_cast<uint16_t>(sgn | nm)) - x);
      ASSERT_LE(err, other) << "x=" << x << " h=" << std::hex << h;
      if (err == other) {
        ASSERT_EQ(mag & 1u, 0u) << "tie not to even: x=" << x;
      }
    }
    if (mag == 0x7BFF) {
      ASSERT_LT(std::fabs(x), 65520.0);
    }
  }
}

TEST(Bf16, HandCheckedValues) {
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFp32(0xC040), -3.0f);
  EXPECT_EQ(Bf16ToFp32(0x4049), 3.140625f);
  EXPECT_EQ(Bf16ToFp32(0x0001), FromBits(0x00010000u));  // subnormal
  EXPECT_EQ(Bf16ToFp32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Bf16ToFp32(0x7FC0)));

  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(-3.0f), 0xC040);
  EXPECT_EQ(Fp32ToBf16(3.14159265f), 0x4049);
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3F818000u)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_EQ(Fp32ToBf16(FromBits(0x3F807FFFu)), 0x3F80);  // below the tie
  EXPECT_EQ(Fp32ToBf16(FromBits(0x00010000u)), 0x0001);  // subnormals kept
  EXPECT_EQ(Fp32ToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
  EXPECT_EQ(Fp32ToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(Fp32ToBf16(-0.0f), 0x8000);
  // NaN stays NaN and quiet, even when the payload sits only in the dropped low bits.
  EXPECT_EQ(Fp32ToBf16(FromBits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(Fp32ToBf16(FromBits(0xFFC00000u)), 0xFFC0);
  const uint16_t nan = Fp32ToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7FC0u, 0x7FC0u);
}

TEST(Bf16, AllValuesRoundTripThroughFloat) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<uint16_t>(i);
    const float f = Bf16ToFp32(b);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), i << 16);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(f))));
    } else {
      ASSERT_EQ(Fp32ToBf16(f), b);
    }
  }
}

}  // namespace
}  // namespace kvfs
