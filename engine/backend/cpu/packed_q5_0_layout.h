// The packed Q5_0 layout of the AVX2 (kRows = 8) and AVX-512 (kRows = 16) packed kernels: Q5_0
// is the weight type llama.cpp's Q4_K_M mixture falls back to where a matrix's input size is not
// a multiple of 256 (most matrices of Qwen2.5-0.5B, 896 wide), so those models decode mostly Q5_0.
//
// Layout of one group (rows kRows*g .. kRows*g + kRows-1; rows past the matrix are zero, scale
// 0): blocks in pairs of kPairBytes,
//   [2*kRows: f16 d of block 2p][2*kRows: of 2p + 1][4*kRows: fifth bits of 2p][4*kRows: of 2p + 1]
//   [16*kRows: block 2p codes][16*kRows: 2p + 1 codes]
// The codes are Q4_0's (packed_q4_0_layout.h): chunk k, lane i = bytes 4k..4k+3 of row i's 16
// nibble bytes (low nibbles: elements 4k..4k+3, high: 16+4k..16+4k+3). The fifth bits are one
// dword per row, the row's qh rearranged so that chunk k's come out with one 32-bit shift:
//   bit 8b + 4 + k = the fifth bit of element 4k + b       ((bits >> k) & 0x10 in byte b)
//   bit 8b + k     = the fifth bit of element 16 + 4k + b  ((bits << (4 - k)) & 0x10 in byte b)
// for b, k < 4. Each byte's bit 4 then comes from that byte, so the lanes' 32-bit shifts need no
// byte shuffle. The rows' bytes exactly (22 per block and row).
//
// Include only from the ISA kernel files, like their common headers: internal linkage.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

template <int kRowsOfGroup>
struct PackedQ5_0Layout {
  static constexpr int kRows = kRowsOfGroup;
  static constexpr int64_t kQ5Bytes = 22;  // Q5_0 block: f16 d, uint32 qh, 16 nibble bytes
  static constexpr int64_t kScaleBytes = 2 * kRows;
  static constexpr int64_t kBitsBytes = 4 * kRows;
  static constexpr int64_t kCodeBytes = 16 * kRows;
  static constexpr int64_t kChunkBytes = 4 * kRows;
  static constexpr int64_t kPairBytes = 2 * (kScaleBytes + kBitsBytes + kCodeBytes);

  static constexpr int64_t GroupBytes(int64_t nb) { return (nb + 1) / 2 * kPairBytes; }
  static const uint8_t* ScalesOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + (b & 1) * kScaleBytes;
  }
  static const uint8_t* BitsOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + 2 * kScaleBytes + (b & 1) * kBitsBytes;
  }
  static const uint8_t* CodesOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + 2 * (kScaleBytes + kBitsBytes) + (b & 1) * kCodeBytes;
  }

  // qh (bit j: element j's fifth bit) in the order above.
  static uint32_t RearrangeBits(uint32_t qh) {
    uint32_t out = 0;
    for (int k = 0; k < 4; ++k) {
      for (int b = 0; b < 4; ++b) {
        out |= ((qh >> (4 * k + b)) & 1u) << (8 * b + 4 + k);
        out |= ((qh >> (16 + 4 * k + b)) & 1u) << (8 * b + k);
      }
    }
    return out;
  }

  static int64_t Bytes(int64_t n_rows, int64_t n_in) { return (n_rows + kRows - 1) / kRows * GroupBytes(n_in / 32); }

  static void Pack(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, int64_t n_in, uint8_t* dst) {
    const int64_t nb = n_in / 32, groups = (n_rows + kRows - 1) / kRows;
    std::memset(dst, 0, static_cast<size_t>(groups * GroupBytes(nb)));
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* group = dst + g * GroupBytes(nb);
      for (int i = 0; i < kRows && kRows * g + i < n_rows; ++i) {
        const uint8_t* row = w_rows + (kRows * g + i) * w_row_bytes;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* src = row + b * kQ5Bytes;
          std::memcpy(const_cast<uint8_t*>(ScalesOf(group, b)) + 2 * i, src, 2);
          uint32_t qh;
          std::memcpy(&qh, src + 2, 4);
          const uint32_t bits = RearrangeBits(qh);
          std::memcpy(const_cast<uint8_t*>(BitsOf(group, b)) + 4 * i, &bits, 4);
          uint8_t* codes = const_cast<uint8_t*>(CodesOf(group, b));
          for (int k = 0; k < 4; ++k) std::memcpy(codes + kChunkBytes * k + 4 * i, src + 6 + 4 * k, 4);
        }
      }
    }
  }
};

}  // namespace
}  // namespace kvfs::cpu
