// Dequantization of hand-built blocks. The blocks are written byte by byte at the offsets of
// the ggml format definitions (not through kvfs's block structs), and the expected values are
// computed here from the format definition, plus literal values worked out by hand.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "engine/model/quant_blocks.h"
#include "engine/model/quants.h"

namespace kvfs {
namespace {

// fp16 bit patterns of the scales used below.
constexpr uint16_t kHalf0_25 = 0x3400;
constexpr uint16_t kHalf0_5 = 0x3800;
constexpr uint16_t kHalfMinus0_5 = 0xB800;
constexpr uint16_t kHalf1 = 0x3C00;
constexpr uint16_t kHalfMinus1_5 = 0xBE00;
constexpr uint16_t kHalf2 = 0x4000;
constexpr uint16_t kHalfMinus2 = 0xC000;
constexpr uint16_t kHalf3 = 0x4200;

void PutU16(std::vector<uint8_t>& row, size_t off, uint16_t v) {
  row[off] = static_cast<uint8_t>(v & 0xFF);
  row[off + 1] = static_cast<uint8_t>(v >> 8);
}

// Dequantizes from an odd address, so that any misaligned load would trip UBSan.
std::vector<float> Dequant(GgmlType t, const std::vector<uint8_t>& row, int64_t n) {
  EXPECT_EQ(static_cast<int64_t>(row.size()), RowBytes(t, n));
  std::vector<uint8_t> buf(row.size() + 1);
  std::memcpy(buf.data() + 1, row.data(), row.size());
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  DequantizeRow(t, buf.data() + 1, out.data(), n);
  return out;
}

// The block structs put every field at the byte offset the ggml format uses.
static_assert(offsetof(BlockQ4_1, m) == 2 && offsetof(BlockQ4_1, qs) == 4);
static_assert(offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6);
static_assert(offsetof(BlockQ5_1, qh) == 4 && offsetof(BlockQ5_1, qs) == 8);
static_assert(offsetof(BlockQ8_0, qs) == 2);
static_assert(offsetof(BlockQ8_1, s) == 2 && offsetof(BlockQ8_1, qs) == 4);
static_assert(offsetof(BlockQ4_K, dmin) == 2 && offsetof(BlockQ4_K, scales) == 4 &&
              offsetof(BlockQ4_K, qs) == 16);
static_assert(offsetof(BlockQ5_K, qh) == 16 && offsetof(BlockQ5_K, qs) == 48);
static_assert(offsetof(BlockQ6_K, qh) == 128 && offsetof(BlockQ6_K, scales) == 192 &&
              offsetof(BlockQ6_K, d) == 208);
static_assert(offsetof(BlockQ8_K, qs) == 4 && offsetof(BlockQ8_K, bsums) == 260);

TEST(QuantRowBytes, MatchesBlockGeometry) {
  EXPECT_EQ(RowBytes(GgmlType::kF32, 7), 28);
  EXPECT_EQ(RowBytes(GgmlType::kF16, 10), 20);
  EXPECT_EQ(RowBytes(GgmlType::kBF16, 10), 20);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_0, 64), 36);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_1, 64), 40);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_0, 64), 44);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_1, 64), 48);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_1, 64), 72);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_K, 512), 288);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_K, 512), 352);
  EXPECT_EQ(RowBytes(GgmlType::kQ6_K, 512), 420);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_K, 256), 292);
}

TEST(QuantDequant, F32F16Bf16) {
  const float f32[3] = {1.5f, -0.0f, 3.0e-39f};
  std::vector<uint8_t> row(sizeof(f32));
  std::memcpy(row.data(), f32, sizeof(f32));
  const auto a = Dequant(GgmlType::kF32, row, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(f32[i]));

  std::vector<uint8_t> h(10);
  const uint16_t halves[5] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x3555};
  for (int i = 0; i < 5; ++i) PutU16(h, 2 * i, halves[i]);
  const auto b = Dequant(GgmlType::kF16, h, 5);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.0f);
  EXPECT_EQ(b[2], 5.9604644775390625e-08f);  // 2^-24
  EXPECT_EQ(b[3], 65504.0f);
  EXPECT_EQ(b[4], 0.333251953125f);

  std::vector<uint8_t> bf(6);
  PutU16(bf, 0, 0x3F80);
  PutU16(bf, 2, 0xC040);
  PutU16(bf, 4, 0x4049);
  const auto c = Dequant(GgmlType::kBF16, bf, 3);
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_EQ(c[1], -3.0f);
  EXPECT_EQ(c[2], 3.140625f);
}

// Q4_0: [d:2][qs:16]; element j (j < 16) = low nibble of qs[j], element j+16 = high nibble;
// x = d * (q - 8).
TEST(QuantDequant, Q4_0) {
  std::vector<uint8_t> row(2 * 18);
  const uint16_t d[2] = {kHalf0_5, kHalfMinus2};
  for (int b = 0; b < 2; ++b) {
    PutU16(row, 18 * b, d[b]);
    for (int j = 0; j < 16; ++j) row[18 * b + 2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  }
  const auto y = Dequant(GgmlType::kQ4_0, row, 64);
  const float scale[2] = {0.5f, -2.0f};
  for (int b = 0; b < 2; ++b) {
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[32 * b + j], scale[b] * static_cast<float>(j - 8)) << b << " " << j;
      EXPECT_EQ(y[32 * b + 16 + j], scale[b] * static_cast<float>(7 - j)) << b << " " << j;
    }
  }
  EXPECT_EQ(y[0], -4.0f);    // q 0 -> (0-8)*0.5
  EXPECT_EQ(y[16], 3.5f);    // q 15
  EXPECT_EQ(y[47], -14.0f);  // block 1 (d = -2), element 15 = low nibble of qs[15] = 15
  EXPECT_EQ(y[63], 16.0f);   // block 1, element 31 = high nibble of qs[15] = 0: (0-8)*-2
}

// Q4_1: [d:2][m:2][qs:16]; x = d * q + m.
TEST(QuantDequant, Q4_1) {
  std::vector<uint8_t> row(20);
  PutU16(row, 0, kHalf0_25);
  PutU16(row, 2, kHalfMinus1_5);
  for (int j = 0; j < 16; ++j) row[4 + j] = static_cast<uint8_t>(j | ((j ^ 5) << 4));
  const auto y = Dequant(GgmlType::kQ4_1, row, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * static_cast<float>(j) - 1.5f) << j;
    EXPECT_EQ(y[16 + j], 0.25f * static_cast<float>(j ^ 5) - 1.5f) << j;
  }
  EXPECT_EQ(y[0], -1.5f);
  EXPECT_EQ(y[16], -0.25f);  // q = 5
  EXPECT_EQ(y[31], 1.0f);    // q = 15 ^ 5 = 10
}

// Q5_0: [d:2][qh:4][qs:16]; bit e of the little-endian uint32 qh = bit 4 of element e;
// x = d * (q - 16).
TEST(QuantDequant, Q5_0) {
  constexpr uint32_t kQh = 0xA5C30F96u;
  std::vector<uint8_t> row(22);
  PutU16(row, 0, kHalf0_5);
  for (int k = 0; k < 4; ++k) row[2 + k] = static_cast<uint8_t>(kQh >> (8 * k));
  for (int j = 0; j < 16; ++j) {
    row[6 + j] = static_cast<uint8_t>(((j * 7) & 15) | (((j * 3 + 1) & 15) << 4));
  }
  const auto y = Dequant(GgmlType::kQ5_0, row, 32);
  for (int e = 0; e < 32; ++e) {
    const int low = e < 16 ? ((e * 7) & 15) : (((e - 16) * 3 + 1) & 15);
    const int high = static_cast<int>((kQh >> e) & 1u);
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(low + 16 * high - 16)) << e;
  }
  EXPECT_EQ(y[0], -8.0f);   // low 0, bit 0 of 0x..96 is 0: q = 0
  EXPECT_EQ(y[1], 3.5f);    // low 7, bit 1 of 0x96 is 1: q = 23 -> (23-16)*0.5
  EXPECT_EQ(y[31], 7.0f);   // low (15*3+1)&15 = 14, bit 31 (0xA5) is 1: q = 30
}

// Q5_1: [d:2][m:2][qh:4][qs:16]; x = d * q + m.
TEST(QuantDequant, Q5_1) {
  constexpr uint32_t kQh = 0x0FF03C69u;
  std::vector<uint8_t> row(24);
  PutU16(row, 0, kHalf2);
  PutU16(row, 2, kHalfMinus0_5);
  for (int k = 0; k < 4; ++k) row[4 + k] = static_cast<uint8_t>(kQh >> (8 * k));
  for (int j = 0; j < 16; ++j) row[8 + j] = static_cast<uint8_t>((15 - j) | (j << 4));
  const auto y = Dequant(GgmlType::kQ5_1, row, 32);
  for (int e = 0; e < 32; ++e) {
    const int low = e < 16 ? 15 - e : e - 16;
    const int high = static_cast<int>((kQh >> e) & 1u);
    EXPECT_EQ(y[e], 2.0f * static_cast<float>(low + 16 * high) - 0.5f) << e;
  }
  EXPECT_EQ(y[0], 61.5f);   // low 15 + bit 0 (0x69 = 0110'1001 -> 1): q = 31
  EXPECT_EQ(y[16], -0.5f);  // low 0, bit 16 (byte 2 = 0xF0, bit 0 -> 0): q = 0
  EXPECT_EQ(y[31], -0.5f + 2.0f * 15.0f);  // low 15, bit 31 (0x0F top bit) -> 0: q = 15
}

// Q8_0: [d:2][qs:32 int8]; x = d * q.
TEST(QuantDequant, Q8_0) {
  std::vector<uint8_t> row(2 * 34);
  PutU16(row, 0, kHalf0_25);
  PutU16(row, 34, kHalf3);
  for (int j = 0; j < 32; ++j) {
    row[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
    row[36 + j] = static_cast<uint8_t>(static_cast<int8_t>(127 - j));
  }
  const auto y = Dequant(GgmlType::kQ8_0, row, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y[j], 0.25f * static_cast<float>(j * 8 - 128)) << j;
    EXPECT_EQ(y[32 + j], 3.0f * static_cast<float>(127 - j)) << j;
  }
  EXPECT_EQ(y[0], -32.0f);
  EXPECT_EQ(y[32], 381.0f);
}

// The 6-bit scales (sc) and mins (m) of the 8 sub-blocks used for Q4_K/Q5_K, chosen so that
// every value of the two high bits appears among sc[4..7] and m[4..7], and the packed bytes
// worked out by hand from the layout in quant_blocks.h.
constexpr int kSc[8] = {63, 17, 32, 5, 18, 33, 50, 7};
constexpr int kMin[8] = {1, 62, 21, 40, 9, 27, 44, 61};
constexpr uint8_t kPackedScales[12] = {0x7F, 0x91, 0xE0, 0x05, 0x01, 0x7E,
                                       0x95, 0xE8, 0x92, 0xB1, 0xC2, 0xD7};

TEST(QuantDequant, KScalePackingByHand) {
  // Pack from the definition and compare with the hand-computed bytes.
  uint8_t packed[12] = {};
  for (int i = 0; i < 4; ++i) {
    packed[i] = static_cast<uint8_t>(kSc[i] | ((kSc[i + 4] >> 4) << 6));
    packed[i + 4] = static_cast<uint8_t>(kMin[i] | ((kMin[i + 4] >> 4) << 6));
    packed[i + 8] = static_cast<uint8_t>((kSc[i + 4] & 15) | ((kMin[i + 4] & 15) << 4));
  }
  for (int i = 0; i < 12; ++i) EXPECT_EQ(packed[i], kPackedScales[i]) << i;
}

uint8_t K4Byte(int k) { return static_cast<uint8_t>(((k * 5 + 3) & 15) | (((k * 11 + 7) & 15) << 4)); }

// Fills the expected 4-bit codes of a Q4_K/Q5_K super-block by walking the qs bytes: byte
// 32c + l gives element 64c + l (low nibble) and element 64c + 32 + l (high nibble).
void KLowCodes(int (&codes)[256]) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = K4Byte(32 * c + l);
      codes[64 * c + l] = byte & 15;
      codes[64 * c + 32 + l] = byte >> 4;
    }
  }
}

// Q4_K: [d:2][dmin:2][scales:12][qs:128]; x = d*sc[s]*q - dmin*m[s], s = e / 32.
TEST(QuantDequant, Q4_K) {
  std::vector<uint8_t> row(2 * 144);
  const uint16_t d[2] = {kHalf0_5, kHalfMinus2};
  const uint16_t dmin[2] = {kHalf0_25, kHalf1};
  for (int b = 0; b < 2; ++b) {
    const size_t o = 144 * b;
    PutU16(row, o, d[b]);
    PutU16(row, o + 2, dmin[b]);
    for (int i = 0; i < 12; ++i) row[o + 4 + i] = kPackedScales[i];
    for (int k = 0; k < 128; ++k) row[o + 16 + k] = K4Byte(k);
  }
  const auto y = Dequant(GgmlType::kQ4_K, row, 512);
  int codes[256];
  KLowCodes(codes);
  const double fd[2] = {0.5, -2.0};
  const double fmin[2] = {0.25, 1.0};
  for (int b = 0; b < 2; ++b) {
    for (int e = 0; e < 256; ++e) {
      const int s = e / 32;
      const double want = fd[b] * kSc[s] * codes[e] - fmin[b] * kMin[s];
      EXPECT_EQ(y[256 * b + e], static_cast<float>(want)) << b << " " << e;
    }
  }
  // Hand-computed: element 0 = q 3, s 0 (sc 63, m 1); 32 = q 7, s 1 (17, 62);
  // 100 = q 3, s 3 (5, 40); 200 = q 11, s 6 (50, 44); 255 = q 12, s 7 (7, 61).
  EXPECT_EQ(y[0], 94.25f);
  EXPECT_EQ(y[32], 44.0f);
  EXPECT_EQ(y[100], -2.5f);
  EXPECT_EQ(y[200], 264.0f);
  EXPECT_EQ(y[255], 26.75f);
  EXPECT_EQ(y[256 + 255], -2.0f * 7 * 12 - 61.0f);
}

uint8_t K5HighByte(int l) { return static_cast<uint8_t>((l * 37 + 11) & 255); }

// Q5_K: [d:2][dmin:2][scales:12][qh:32][qs:128]; bit s of qh[l] = bit 4 of element 32s + l.
TEST(QuantDequant, Q5_K) {
  std::vector<uint8_t> row(176);
  PutU16(row, 0, kHalf0_5);
  PutU16(row, 2, kHalf0_25);
  for (int i = 0; i < 12; ++i) row[4 + i] = kPackedScales[i];
  for (int l = 0; l < 32; ++l) row[16 + l] = K5HighByte(l);
  for (int k = 0; k < 128; ++k) row[48 + k] = K4Byte(k);
  const auto y = Dequant(GgmlType::kQ5_K, row, 256);
  int codes[256];
  KLowCodes(codes);
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const int e = 32 * s + l;
      const int q = codes[e] + (((K5HighByte(l) >> s) & 1) ? 16 : 0);
      EXPECT_EQ(y[e], static_cast<float>(0.5 * kSc[s] * q - 0.25 * kMin[s])) << e;
    }
  }
  EXPECT_EQ(y[0], 598.25f);  // q 3 + 16 (qh[0] = 11, bit 0)
  EXPECT_EQ(y[32], 180.0f);  // q 7 + 16 (bit 1)
  EXPECT_EQ(y[100], 37.5f);  // q 3 + 16 (qh[4] = 159, bit 3)
  EXPECT_EQ(y[200], 264.0f); // q 11 (qh[8] = 51, bit 6 clear)
  EXPECT_EQ(y[255], 82.75f); // q 12 + 16 (qh[31] = 134, bit 7)
}

constexpr int8_t kQ6Scales[16] = {-128, 127, -1, 1, 2, -3, 5, -8, 13, -21, 34, -55, 89, -100, 64, -64};
uint8_t Q6Low(int k) { return static_cast<uint8_t>((k * 13 + 5) & 255); }
uint8_t Q6High(int k) { return static_cast<uint8_t>((k * 29 + 17) & 255); }

// Q6_K: [ql:128][qh:64][scales:16 int8][d:2]; x = d * scales[e/16] * (q - 32).
TEST(QuantDequant, Q6_K) {
  std::vector<uint8_t> row(2 * 210);
  const uint16_t d[2] = {kHalf0_25, kHalfMinus0_5};
  for (int b = 0; b < 2; ++b) {
    const size_t o = 210 * b;
    for (int k = 0; k < 128; ++k) row[o + k] = Q6Low(k);
    for (int k = 0; k < 64; ++k) row[o + 128 + k] = Q6High(k);
    for (int k = 0; k < 16; ++k) row[o + 192 + k] = static_cast<uint8_t>(kQ6Scales[k]);
    PutU16(row, o + 208, d[b]);
  }
  const auto y = Dequant(GgmlType::kQ6_K, row, 512);
  // Expected codes by walking the bytes of each 128-element half.
  int codes[256];
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int a = Q6Low(64 * h + l);
      const int bb = Q6Low(64 * h + 32 + l);
      const int c = Q6High(32 * h + l);
      codes[128 * h + l] = (a & 15) | ((c & 3) << 4);
      codes[128 * h + 32 + l] = (bb & 15) | (((c >> 2) & 3) << 4);
      codes[128 * h + 64 + l] = (a >> 4) | (((c >> 4) & 3) << 4);
      codes[128 * h + 96 + l] = (bb >> 4) | (((c >> 6) & 3) << 4);
    }
  }
  const double fd[2] = {0.25, -0.5};
  for (int b = 0; b < 2; ++b) {
    for (int e = 0; e < 256; ++e) {
      const double want = fd[b] * kQ6Scales[e / 16] * (codes[e] - 32);
      EXPECT_EQ(y[256 * b + e], static_cast<float>(want)) << b << " " << e;
    }
  }
  // Hand-computed (code, scale): 0 (21, -128), 45 (46, -1), 77 (10, 2), 127 (35, -8),
  // 128 (21, 13), 200 (26, 89), 255 (7, -64).
  EXPECT_EQ(y[0], 352.0f);
  EXPECT_EQ(y[45], -3.5f);
  EXPECT_EQ(y[77], -11.0f);
  EXPECT_EQ(y[127], -6.0f);
  EXPECT_EQ(y[128], -35.75f);
  EXPECT_EQ(y[200], -133.5f);
  EXPECT_EQ(y[255], 400.0f);
  EXPECT_EQ(y[256], -704.0f);
}

}  // namespace
}  // namespace kvfs
