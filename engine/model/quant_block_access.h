// Alignment-safe access to the blocks of quant_blocks.h, shared by the dequantizers and the
// scalar CPU kernels.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/model/quant_blocks.h"

namespace kvfs {

// Copies block i of a row that starts at `row` (no alignment assumed).
template <typename Block>
inline Block LoadBlock(const void* row, int64_t i) {
  static_assert(std::is_trivially_copyable_v<Block>);
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(row) + i * static_cast<int64_t>(sizeof(Block)),
              sizeof(Block));
  return b;
}

// Writes block i of a row that starts at `row` (no alignment assumed).
template <typename Block>
inline void StoreBlock(void* row, int64_t i, const Block& b) {
  static_assert(std::is_trivially_copyable_v<Block>);
  std::memcpy(static_cast<uint8_t*>(row) + i * static_cast<int64_t>(sizeof(Block)), &b,
              sizeof(Block));
}

// The 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K super-block, unpacked from the
// 12-byte array as described in quant_blocks.h.
struct KScaleMin {
  int scale;
  int min;
};
inline KScaleMin UnpackKScaleMin(const uint8_t (&scales)[kKScaleBytes], int s) {
  if (s < 4) {
    return {scales[s] & 63, scales[s + 4] & 63};
  }
  const int scale = (scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4);
  const int min = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  return {scale, min};
}

// The 4-bit code of element e (0..31) of a 32-element block packed as Q4_0/Q4_1/Q5_0/Q5_1:
// elements 0..15 in the low nibbles, 16..31 in the high nibbles.
inline int LowBitsOf32(const uint8_t (&qs)[16], int e) {
  return e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4);
}

// Bit 4 of element e (0..31) of a Q5_0/Q5_1 block, as 0 or 16.
inline int HighBitOf32(const uint8_t (&qh)[4], int e) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof(bits));  // little-endian host (checked by CMake)
  return ((bits >> e) & 1u) ? 16 : 0;
}

// The 4-bit code of element e (0..255) of a Q4_K/Q5_K super-block.
inline int KLowBits(const uint8_t (&qs)[kQK_K / 2], int e) {
  const int chunk = e / 64;    // 32 bytes per 64 elements
  const int within = e % 64;   // first 32 in low nibbles, next 32 in high nibbles
  const uint8_t byte = qs[chunk * 32 + within % 32];
  return within < 32 ? (byte & 0x0F) : (byte >> 4);
}

// The 6-bit code (0..63, before subtracting 32) of element e (0..255) of a Q6_K super-block.
inline int Q6KCode(const BlockQ6_K& b, int e) {
  const int half = e / 128;
  const int quarter = (e % 128) / 32;  // which of the four 32-element groups of the half
  const int l = e % 32;
  const uint8_t lo_byte = b.ql[half * 64 + (quarter % 2) * 32 + l];
  const int lo = quarter < 2 ? (lo_byte & 0x0F) : (lo_byte >> 4);
  const int hi = (b.qh[half * 32 + l] >> (2 * quarter)) & 3;
  return lo | (hi << 4);
}

}  // namespace kvfs
