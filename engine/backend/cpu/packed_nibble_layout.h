// The packed layouts of the 4- and 5-bit block formats (Q4_0, Q4_1, Q5_0, Q5_1) for the AVX2
// (kRows = 8) and AVX-512 (kRows = 16) packed kernels: groups of kRows interleaved rows, so that
// one vector load holds 4 code bytes of each row.
//
// Layout of one group (rows kRows*g .. kRows*g + kRows-1; rows past the matrix are zero, scale
// 0): blocks in pairs of kPairBytes (a multiple of the vector width), each field of block 2p
// followed by the same field of 2p + 1:
//   [2*kRows: f16 d] x 2
//   [2*kRows: f16 m] x 2          Q4_1, Q5_1 (x = d * q + m)
//   [4*kRows: fifth bits] x 2     Q5_0, Q5_1
//   [16*kRows: codes] x 2
// so the kernels read every cache line in address order (scales after the codes measured ~25%
// slower from DRAM on AVX-512). A block's codes are 4 chunks of 4*kRows bytes; chunk k, lane i
// (bytes 4i..4i+3) = bytes 4k..4k+3 of row i's 16 nibble bytes: low nibbles = elements
// 4k..4k+3, high nibbles = elements 16+4k..16+4k+3 (the formats keep element j in the low and
// j+16 in the high nibble). The fifth bits are one dword per row, the row's qh rearranged so
// that chunk k's come out with one 32-bit shift:
//   bit 8b + 4 + k = the fifth bit of element 4k + b       ((bits >> k) & 0x10 in byte b)
//   bit 8b + k     = the fifth bit of element 16 + 4k + b  ((bits << (4 - k)) & 0x10 in byte b)
// for b, k < 4: each byte's bit 4 comes from that byte, so the lanes' dword shifts need no byte
// shuffle. An odd last block is paired with a zero block. Group g starts at g * GroupBytes(nb).
// The rows' bytes exactly.
//
// Why Q5_0 matters: llama.cpp's Q4_K_M mixture falls back to it for matrices whose input size is
// not a multiple of 256 (most matrices of Qwen2.5-0.5B, 896 wide), as Q5_K_M falls back to Q5_1.
//
// Include only from the ISA kernel files, like their common headers: internal linkage.
#pragma once

#include <cstdint>
#include <cstring>

#include "engine/backend/cpu/packed_rows_walk.h"

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

template <int kRowsOfGroup, bool kFifthBits, bool kMins>
struct PackedNibbleLayout {
  static constexpr int kRows = kRowsOfGroup;
  static constexpr bool kHasBits = kFifthBits;
  static constexpr bool kHasMins = kMins;
  // The GGUF block: f16 d, [f16 m], [uint32 qh], 16 nibble bytes.
  static constexpr int64_t kSrcMin = 2, kSrcBits = kMins ? 4 : 2, kSrcCodes = kSrcBits + (kFifthBits ? 4 : 0);
  static constexpr int64_t kSrcBytes = kSrcCodes + 16;
  static constexpr int64_t kScaleBytes = 2 * kRows;
  static constexpr int64_t kBitsBytes = kFifthBits ? 4 * kRows : 0;
  static constexpr int64_t kCodeBytes = 16 * kRows;
  static constexpr int64_t kChunkBytes = 4 * kRows;
  static constexpr int64_t kMinsAt = 2 * kScaleBytes;
  static constexpr int64_t kBitsAt = kMinsAt + (kMins ? 2 * kScaleBytes : 0);
  static constexpr int64_t kCodesAt = kBitsAt + 2 * kBitsBytes;
  static constexpr int64_t kPairBytes = kCodesAt + 2 * kCodeBytes;

  static constexpr int64_t GroupBytes(int64_t nb) { return (nb + 1) / 2 * kPairBytes; }
  static const uint8_t* ScalesOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + (b & 1) * kScaleBytes;
  }
  static const uint8_t* MinsOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + kMinsAt + (b & 1) * kScaleBytes;
  }
  static const uint8_t* BitsOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + kBitsAt + (b & 1) * kBitsBytes;
  }
  static const uint8_t* CodesOf(const uint8_t* group, int64_t b) {
    return group + (b >> 1) * kPairBytes + kCodesAt + (b & 1) * kCodeBytes;
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
    ForEachPackedBlock<kRows, kSrcBytes>(
        w_rows, w_row_bytes, n_rows, n_in, GroupBytes(n_in / 32), dst, [](uint8_t* group, int i, int64_t b, const uint8_t* src) {
          std::memcpy(const_cast<uint8_t*>(ScalesOf(group, b)) + 2 * i, src, 2);
          if constexpr (kMins) std::memcpy(const_cast<uint8_t*>(MinsOf(group, b)) + 2 * i, src + kSrcMin, 2);
          if constexpr (kFifthBits) {
            uint32_t qh;
            std::memcpy(&qh, src + kSrcBits, 4);
            const uint32_t bits = RearrangeBits(qh);
            std::memcpy(const_cast<uint8_t*>(BitsOf(group, b)) + 4 * i, &bits, 4);
          }
          uint8_t* codes = const_cast<uint8_t*>(CodesOf(group, b));
          for (int k = 0; k < 4; ++k) std::memcpy(codes + kChunkBytes * k + 4 * i, src + kSrcCodes + 4 * k, 4);
        });
  }
};

template <int kRows>
using PackedQ4_0Layout = PackedNibbleLayout<kRows, false, false>;
template <int kRows>
using PackedQ4_1Layout = PackedNibbleLayout<kRows, false, true>;
template <int kRows>
using PackedQ5_0Layout = PackedNibbleLayout<kRows, true, false>;
template <int kRows>
using PackedQ5_1Layout = PackedNibbleLayout<kRows, true, true>;

}  // namespace
}  // namespace kvfs::cpu
