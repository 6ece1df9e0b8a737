#include "engine/kv/kv_format.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

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

TEST(KvFormat, Q4kGeometry) {
  const KvFormat f = *MakeKvFormat("q4k", "", 4, 64);
  EXPECT_EQ(f.type, KvType::kQ4K);
  EXPECT_EQ(f.group, 16);  // V sub-blocks of 16, inside one head
  EXPECT_EQ(f.chunk, 64);  // K chunks of 64 tokens
  EXPECT_TRUE(f.rotate);
  EXPECT_TRUE(f.RotatesV());
  EXPECT_FALSE(f.RotatesK());  // per-channel keys are never rotated
  EXPECT_TRUE(f.KeysByChannel());
  EXPECT_EQ(f.Name(), "q4k");
  EXPECT_EQ(MakeKvFormat("q4k", "off", 4, 64)->Name(), "q4k-norot");
  EXPECT_EQ(MakeKvFormat("q4k", "", 4, 8)->group, 8);    // stories260K: one head's 8 values
  EXPECT_EQ(MakeKvFormat("q4k", "", 2, 40)->group, 10);  // largest even divisor of 40 up to 16
  EXPECT_FALSE(MakeKvFormat("q4k", "", 4, 7).ok());      // odd head_dim: no nibble pairs
  EXPECT_FALSE(MakeKvFormat("q4", "", 4, 64)->KeysByChannel());
  EXPECT_EQ(MakeKvFormat("q4", "", 4, 64)->chunk, 0);
}

TEST(KvFormat, BytesPerValue) {
  auto f16 = *MakeKvFormat("f16", "", 4, 64), q8 = *MakeKvFormat("q8", "", 4, 64), q4 = *MakeKvFormat("q4", "", 4, 64);
  EXPECT_EQ(f16.RowBytes(256), 512);
  EXPECT_EQ(q8.RowBytes(256), 4 * 66);
  EXPECT_EQ(q4.RowBytes(256), 4 * 36);
  EXPECT_LE(static_cast<double>(q4.RowBytes(256)) / f16.RowBytes(256), 0.29);
}

// q4k on tinyllama's geometry (4 KV heads x 64): V rows of 4 + 4 quads x (5 + 32) bytes, K
// chunks of 256 channels x (4 + 32) bytes per 64 tokens; per token and layer 144 + 152 bytes
// of f16's 1024, within the 0.29x.
TEST(KvFormat, Q4kBytesPerToken) {
  const KvFormat q4k = *MakeKvFormat("q4k", "", 4, 64), f16 = *MakeKvFormat("f16", "", 4, 64);
  EXPECT_EQ(q4k.RowBytes(256), 152);
  EXPECT_EQ(q4k.ChunkBytes(256), 256 * 36);
  const double per_token = static_cast<double>(q4k.ChunkBytes(256)) / q4k.chunk + q4k.RowBytes(256);
  EXPECT_EQ(per_token, 296.0);
  EXPECT_LE(per_token / (2 * f16.RowBytes(256)), 0.29);
  // A last quad of fewer than 4 sub-blocks keeps its 5 bytes of fields.
  EXPECT_EQ(MakeKvFormat("q4k", "", 1, 80)->RowBytes(80), 4 + 2 * 5 + 40);
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

// Hand-built q4k V row: units D, M; sub-block fields of 10 bits in a quad; values M*mn + D*sc*q.
TEST(KvFormat, Q4kRowDecodesDocumentedLayout) {
  KvFormat f{KvType::kQ4K, 2, false, 64};  // sub-blocks of 2 values: 5 sub-blocks, 2 quads
  std::vector<uint8_t> row(f.RowBytes(10), 0);
  ASSERT_EQ(row.size(), 4u + 2 * 5 + 5u);
  const uint16_t D = Fp32ToFp16(0.25f), M = Fp32ToFp16(0.5f);
  std::memcpy(row.data(), &D, 2);
  std::memcpy(row.data() + 2, &M, 2);
  // (sc, mn) per sub-block; field = sc | (mn + 15) << 5 at bit 10 * (j % 4) of its quad.
  const int sc[5] = {4, 31, 0, 7, 2}, mn[5] = {-3, 15, -15, 0, 1};
  for (int j = 0; j < 5; ++j) {
    const uint64_t field = static_cast<uint64_t>(sc[j]) | (static_cast<uint64_t>(mn[j] + 15) << 5);
    uint8_t* quad = row.data() + Q4kFieldsOffset(2, j);
    uint64_t bits = 0;
    std::memcpy(&bits, quad, 5);
    bits |= field << (10 * (j % 4));
    std::memcpy(quad, &bits, 5);
    row[Q4kCodesOffset(2, j)] = static_cast<uint8_t>((j + 1) | ((15 - j) << 4));  // codes j+1, 15-j
  }
  EXPECT_EQ(Q4kFieldsOffset(2, 4), 4 + 5 + 4);  // second quad after the first's fields and codes
  EXPECT_EQ(Q4kCodesOffset(2, 4), 4 + 9 + 5);
  std::vector<float> out(10);
  KvDequantize(f, row.data(), 0, 10, out.data());
  for (int j = 0; j < 5; ++j) {
    const float m = 0.5f * mn[j], d = 0.25f * sc[j];
    EXPECT_FLOAT_EQ(out[2 * j], m + d * (j + 1)) << j;
    EXPECT_FLOAT_EQ(out[2 * j + 1], m + d * (15 - j)) << j;
  }
  KvDequantize(f, row.data(), 3, 4, out.data());  // a slice across sub-blocks and quads
  EXPECT_FLOAT_EQ(out[0], 0.5f * 15 + 0.25f * 31 * 14);
  EXPECT_FLOAT_EQ(out[3], 0.0f + 0.25f * 7 * 4);    // value 6: sub-block 3, code 4
}

// q4k V rows: each sub-block's squared error is at most that of covering its range with the
// row's units (half the covering step per value), whatever the search picks; rows whose heads
// differ in scale by 100x and rows of one constant stay within the bound too.
TEST(KvFormat, Q4kRowRoundTripWithinBound) {
  std::mt19937 rng(8);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const KvFormat f = *MakeKvFormat("q4k", "off", 4, 64);
  const int64_t n = 256, S = f.group;
  std::vector<float> x(n), y(n);
  std::vector<uint8_t> row(f.RowBytes(n));
  double sse_total = 0.0, sse_cover_total = 0.0;
  for (int iter = 0; iter < 200; ++iter) {
    const int kind = iter % 4;
    for (int64_t i = 0; i < n; ++i) {
      const float head_scale = kind == 1 ? std::pow(10.0f, static_cast<float>(i / 64) - 2.0f) : 1.0f;
      x[i] = kind == 3 ? 1.5f : (kind == 2 ? 3.0f : 0.0f) + head_scale * dist(rng);
    }
    KvQuantizeRow(f, x.data(), row.data(), n);
    KvDequantize(f, row.data(), 0, n, y.data());
    float D, M;
    {
      uint16_t h;
      std::memcpy(&h, row.data(), 2);
      D = Fp16ToFp32(h);
      std::memcpy(&h, row.data() + 2, 2);
      M = Fp16ToFp32(h);
    }
    for (int64_t j = 0; j < n / S; ++j) {
      float lo = x[j * S], hi = x[j * S];
      double sse = 0.0;
      for (int64_t i = j * S; i < (j + 1) * S; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
        sse += static_cast<double>(x[i] - y[i]) * (x[i] - y[i]);
      }
      // Covering: minimum within a unit M below lo, step within a unit D above (hi - min)/15.
      const double step = (hi - lo + M) / 15.0 + D;
      const double cover = S * step * step / 4.0;
      ASSERT_LE(sse, cover * 1.001 + 1e-9) << "row kind " << kind << " sub-block " << j;
      sse_total += sse;
      sse_cover_total += cover;
    }
  }
  std::printf("[kv_format] q4k V rows: squared error %.3g of the covering bound\n", sse_total / sse_cover_total);
}

// q4k K chunks: every channel is a q4 group over the chunk's tokens; the error of each value is
// within half its channel's step (plus f16 rounding of scale and minimum), so channels of very
// different offsets and ranges keep their own precision.
TEST(KvFormat, Q4kKeyChunkRoundTripWithinBound) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const KvFormat f = *MakeKvFormat("q4k", "", 2, 64);
  const int64_t n = 128, C = f.chunk;
  std::vector<float> x(C * n);
  for (int64_t t = 0; t < C; ++t) {
    for (int64_t c = 0; c < n; ++c) {
      // Channel c: offset up to +-20, spread from 0.01 to 4 (an outlier channel every 16th).
      const float offset = static_cast<float>((c * 37) % 41) - 20.0f;
      const float spread = c % 16 == 0 ? 4.0f : 0.01f + static_cast<float>(c % 7) * 0.3f;
      x[t * n + c] = offset + spread * dist(rng);
    }
  }
  std::vector<uint8_t> chunk(f.ChunkBytes(n));
  KvQuantizeKChunk(f, x.data(), n, chunk.data(), n);
  std::vector<float> y(n);
  for (int64_t t = 0; t < C; ++t) {
    KvDequantizeKChunk(f, chunk.data(), t, 0, n, y.data());
    for (int64_t c = 0; c < n; ++c) {
      float lo = x[c], hi = x[c];
      for (int64_t u = 0; u < C; ++u) {
        lo = std::min(lo, x[u * n + c]);
        hi = std::max(hi, x[u * n + c]);
      }
      const float bound = 0.5f * (hi - lo) / 15.0f * 1.01f + 1e-3f * std::fabs(lo) + 1e-3f * (hi - lo);
      ASSERT_LE(std::fabs(x[t * n + c] - y[c]), bound) << "token " << t << " channel " << c;
    }
    // A slice of channels decodes the same values.
    std::vector<float> part(10);
    KvDequantizeKChunk(f, chunk.data(), t, 70, 10, part.data());
    for (int i = 0; i < 10; ++i) ASSERT_EQ(part[i], y[70 + i]);
  }
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
