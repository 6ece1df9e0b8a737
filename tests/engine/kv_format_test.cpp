#include "engine/kv/kv_format.h"

#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "engine/model/quants.h"

namespace kvfs {
namespace {

TEST(KvFormat, GroupIsLargestDivisorUpTo64) {
  EXPECT_EQ(MakeKvFormat("q4", "", 4, 64)->group, 64);   // tinyllama: 256 values per row
  EXPECT_EQ(MakeKvFormat("q4", "", 4, 8)->group, 32);    // stories260K: 32 values
  EXPECT_EQ(MakeKvFormat("q8", "", 3, 20)->group, 60);   // 60 values
  EXPECT_EQ(MakeKvFormat("q4", "", 1, 50)->group, 50);
  EXPECT_FALSE(MakeKvFormat("q5", "", 4, 64).ok());
  EXPECT_FALSE(MakeKvFormat("q4", "maybe", 4, 64).ok());
  EXPECT_FALSE(MakeKvFormat("q4", "on", 4, 48).ok());    // rotation needs a power of two
  EXPECT_TRUE(MakeKvFormat("q4", "", 4, 64)->rotate);
  EXPECT_FALSE(MakeKvFormat("q4", "", 4, 48)->rotate);
  EXPECT_FALSE(MakeKvFormat("q4", "off", 4, 64)->rotate);
  EXPECT_FALSE(MakeKvFormat("f16", "", 4, 64)->rotate);
}

TEST(KvFormat, BytesPerValue) {
  auto f16 = *MakeKvFormat("f16", "", 4, 64), q8 = *MakeKvFormat("q8", "", 4, 64), q4 = *MakeKvFormat("q4", "", 4, 64);
  EXPECT_EQ(f16.RowBytes(256), 512);
  EXPECT_EQ(q8.RowBytes(256), 4 * 66);
  EXPECT_EQ(q4.RowBytes(256), 4 * 36);
  EXPECT_LE(static_cast<double>(q4.RowBytes(256)) / f16.RowBytes(256), 0.29);
}

// Hand-built q4 group: decoding is m + d*q with the documented nibble order.
TEST(KvFormat, Q4DecodesDocumentedLayout) {
  KvFormat f{KvType::kQ4, 4, false};
  uint8_t row[4 + 2];
  const uint16_t d = Fp32ToFp16(0.5f), m = Fp32ToFp16(-1.0f);
  std::memcpy(row, &d, 2);
  std::memcpy(row + 2, &m, 2);
  row[4] = 0x3 | (0xF << 4);  // values 0,1 -> codes 3, 15
  row[5] = 0x0 | (0x8 << 4);  // values 2,3 -> codes 0, 8
  float out[4];
  KvDequantize(f, row, 0, 4, out);
  EXPECT_FLOAT_EQ(out[0], -1.0f + 0.5f * 3);
  EXPECT_FLOAT_EQ(out[1], -1.0f + 0.5f * 15);
  EXPECT_FLOAT_EQ(out[2], -1.0f);
  EXPECT_FLOAT_EQ(out[3], -1.0f + 0.5f * 8);
  KvDequantize(f, row, 1, 2, out);  // a slice
  EXPECT_FLOAT_EQ(out[0], 6.5f);
  EXPECT_FLOAT_EQ(out[1], -1.0f);
}

// Round trip error within each format's bound: |x - x'| <= d/2 (+ f16 rounding of scales).
TEST(KvFormat, RoundTripWithinBound) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (const char* type : {"f16", "q8", "q4"}) {
    KvFormat f = *MakeKvFormat(type, "off", 4, 64);
    std::vector<float> x(256), y(256);
    for (int iter = 0; iter < 50; ++iter) {
      for (float& v : x) v = dist(rng);
      std::vector<uint8_t> row(f.RowBytes(256));
      KvQuantizeRow(f, x.data(), row.data(), 256);
      KvDequantize(f, row.data(), 0, 256, y.data());
      for (int g = 0; g < 4; ++g) {
        float lo = 1e9f, hi = -1e9f, amax = 0.0f;
        for (int i = 0; i < 64; ++i) {
          lo = std::min(lo, x[g * 64 + i]);
          hi = std::max(hi, x[g * 64 + i]);
          amax = std::max(amax, std::fabs(x[g * 64 + i]));
        }
        const float step = f.type == KvType::kQ4 ? (hi - lo) / 15.0f : f.type == KvType::kQ8 ? amax / 127.0f : 0.0f;
        for (int i = 0; i < 64; ++i) {
          const float err = std::fabs(x[g * 64 + i] - y[g * 64 + i]);
          const float bound = 0.5f * step * 1.01f + std::fabs(x[g * 64 + i]) * 1e-3f + 1e-3f * (hi - lo);
          ASSERT_LE(err, bound) << type << " group " << g << " i " << i;
        }
      }
    }
  }
}

TEST(KvFormat, HadamardIsOrthonormalAndSelfInverse) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int n : {1, 2, 8, 64, 128}) {
    std::vector<float> x(n), y;
    for (float& v : x) v = u(rng);
    y = x;
    HadamardTransform(y.data(), n);
    double nx = 0, ny = 0;
    for (int i = 0; i < n; ++i) {
      nx += x[i] * x[i];
      ny += y[i] * y[i];
    }
    EXPECT_NEAR(nx, ny, 1e-4 * nx);
    HadamardTransform(y.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(x[i], y[i], 1e-5);
  }
  // H e0 = (1,...,1)/sqrt(n): an independent fact about the Walsh-Hadamard matrix.
  std::vector<float> e(8, 0.0f);
  e[0] = 1.0f;
  HadamardTransform(e.data(), 8);
  for (float v : e) EXPECT_NEAR(v, 1.0f / std::sqrt(8.0f), 1e-6);
}

}  // namespace
}  // namespace kvfs
