// The packed Q4_0 layout of the AVX2 (kRows = 8) and AVX-512 (kRows = 16) packed kernels:
// groups of kRows interleaved rows, so that one vector load holds 4 code bytes of each row.
//
// Layout of one group (rows kRows*g .. kRows*g + kRows-1; rows past the matrix are zero, scale
// 0): blocks in pairs of kPairBytes (a multiple of the vector width):
//   [2*kRows: f16 scales of block 2p][2*kRows: of 2p+1][16*kRows: block 2p codes][16*kRows: 2p+1]
// so the kernels read every cache line in address order (scales after the codes measured ~25%
// slower from DRAM on AVX-512). A block's codes are 4 chunks of 4*kRows bytes; chunk k, lane i
// (bytes 4i..4i+3) = bytes 4k..4k+3 of row i's 16 nibble bytes: low nibbles = elements
// 4k..4k+3, high nibbles = elements 16+4k..16+4k+3 (Q4_0 keeps element j in the low and j+16
// in the high nibble). An odd last block is paired with a zero block. Group g starts at
// g * GroupBytes(nb).
//
// Include only from the ISA kernel files, like their common headers: internal linkage.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

template <int kRows>
struct PackedQ4_0Layout {
  static constexpr int64_t kQ4Bytes = 18;  // Q4_0 block: f16 d, 16 nibble bytes
  static constexpr int64_t kScaleBytes = 2 * kRows;
  static constexpr int64_t kCodeBytes = 16 * kRows;
  static constexpr int64_t kChunkBytes = 4 * kRows;
  static constexpr int64_t kPairBytes = 2 * (kScaleBytes + kCodeBytes);

  static constexpr int64_t GroupBytes(int64_t nb) { return (nb + 1) / 2 * kPairBytes; }
  static const uint8_t* CodesOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + 2 * kScaleBytes + (b & 1) * kCodeBytes;
  }
  static const uint8_t* ScalesOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + (b & 1) * kScaleBytes;
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
          const uint8_t* src = row + b * kQ4Bytes;
          std::memcpy(const_cast<uint8_t*>(ScalesOf(group, b)) + 2 * i, src, 2);
          uint8_t* codes = const_cast<uint8_t*>(CodesOf(group, b));
          for (int k = 0; k < 4; ++k) std::memcpy(codes + kChunkBytes * k + 4 * i, src + 2 + 4 * k, 4);
        }
      }
    }
  }
};

}  // namespace
}  // namespace kvfs::cpu
