#include "engine/backend/vulkan/weight_layout.h"

#include <cstring>

namespace kvfs::vk {

namespace {

constexpr int64_t kScaleBytes = 2;  // one f16 per block, at the start of each GGUF block

int64_t CodeBytes(GgmlType type) { return type == GgmlType::kQ4_0 ? 16 : 32; }

int64_t Align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// Q6_K's GGUF super-block (engine/model/quant_blocks.h): 128 bytes of low nibbles, 64 of high
// bit pairs, 16 int8 scales, the f16 d.
constexpr int64_t kQ6kBlockBytes = 210, kQ6kScales = 192, kQ6kD = 208;
constexpr int64_t kUnitHighBytes = 8, kUnitLowBytes = 16;

struct Q6kSplit {  // byte offsets in a split row of n units
  int64_t scales, high, low, end;
};
Q6kSplit Q6kOffsets(int64_t n_units) {
  Q6kSplit s;
  s.scales = Align16(n_units / 8 * 2);
  s.high = s.scales + Align16(n_units * 2);
  s.low = s.high + n_units * kUnitHighBytes;
  s.end = s.low + n_units * kUnitLowBytes;
  return s;
}

// Unit s (0-7) of a GGUF super-block: element e's 6-bit code as its low nibble and high pair,
// from the super-block's layout (ggml's dequantize_row_q6_K: 128-value halves; in a half, ql
// byte l holds values l and l + 64 in its low and high nibbles, ql byte l + 32 values l + 32 and
// l + 96, qh byte l bit pairs 0-3 values l, l + 32, l + 64, l + 96).
void SplitQ6kUnit(const uint8_t* block, int64_t s, uint8_t* high, uint8_t* low) {
  const int64_t half = s / 4, quarter = s % 4;
  const uint8_t* ql = block + 64 * half + 32 * (quarter & 1);
  const uint8_t* qh = block + 128 + 32 * half;
  const int lo_shift = 4 * static_cast<int>(quarter >> 1), hi_shift = 2 * static_cast<int>(quarter);
  std::memset(high, 0, kUnitHighBytes);
  std::memset(low, 0, kUnitLowBytes);
  for (int e = 0; e < 32; ++e) {
    const int nibble = (ql[e] >> lo_shift) & 15, pair = (qh[e] >> hi_shift) & 3;
    low[e % 16] = static_cast<uint8_t>(low[e % 16] | (nibble << (e < 16 ? 0 : 4)));
    high[e % 8] = static_cast<uint8_t>(high[e % 8] | (pair << (2 * (e / 8))));
  }
}

void SplitQ6kRow(int64_t n_in, const uint8_t* in, uint8_t* out) {
  const int64_t n_units = n_in / 32, n_blocks = n_units / 8;
  const Q6kSplit at = Q6kOffsets(n_units);
  std::memset(out, 0, static_cast<size_t>(at.high));  // d, scales and their padding
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = in + b * kQ6kBlockBytes;
    std::memcpy(out + 2 * b, block + kQ6kD, 2);
    for (int64_t s = 0; s < 8; ++s) {
      const int64_t u = 8 * b + s;
      std::memcpy(out + at.scales + 2 * u, block + kQ6kScales + 2 * s, 2);
      SplitQ6kUnit(block, s, out + at.high + u * kUnitHighBytes, out + at.low + u * kUnitLowBytes);
    }
  }
}

}  // namespace

bool SplitRowsApplies(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0 || type == GgmlType::kQ6_K;
}

int64_t SplitRowBytes(GgmlType type, int64_t n_in) {
  if (type == GgmlType::kQ6_K) return Q6kOffsets(n_in / 32).end;
  const int64_t n_blocks = n_in / 32;
  return Align16(n_blocks * kScaleBytes) + n_blocks * CodeBytes(type);
}

void SplitRows(GgmlType type, int64_t n_in, const uint8_t* src, int64_t src_row_bytes, int64_t n_rows, uint8_t* dst) {
  const int64_t dst_row_bytes = SplitRowBytes(type, n_in);
  if (type == GgmlType::kQ6_K) {
    for (int64_t r = 0; r < n_rows; ++r) SplitQ6kRow(n_in, src + r * src_row_bytes, dst + r * dst_row_bytes);
    return;
  }
  const int64_t n_blocks = n_in / 32;
  const int64_t code_bytes = CodeBytes(type);
  const int64_t block_bytes = kScaleBytes + code_bytes;
  const int64_t scales_end = Align16(n_blocks * kScaleBytes);
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* in = src + r * src_row_bytes;
    uint8_t* out = dst + r * dst_row_bytes;
    std::memset(out + n_blocks * kScaleBytes, 0, static_cast<size_t>(scales_end - n_blocks * kScaleBytes));
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* block = in + b * block_bytes;
      std::memcpy(out + b * kScaleBytes, block, kScaleBytes);
      std::memcpy(out + scales_end + b * code_bytes, block + kScaleBytes, static_cast<size_t>(code_bytes));
    }
  }
}

}  // namespace kvfs::vk
