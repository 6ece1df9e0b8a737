// The packed Q8_0 layouts: groups of kRows interleaved rows, so that one vector load holds 4
// codes of each row. The AVX-512 packed kernels (kernels_avx512_packed.cpp) and the amx table's
// prompts (kernels_amx.cpp) use PackedQ8_0Layout (16 rows, codes made unsigned for vpdpbusd);
// the kernels without VNNI (packed_rows_kernel.h) keep the codes signed, 8 or 16 rows a group.
//
// Layout of one group (rows kRows*g .. kRows*g + kRows-1; rows past the matrix are zero, scale
// 0): blocks in pairs of kPairBytes,
//   [2*kRows: f16 d of block 2p][2*kRows: of 2p + 1][32*kRows: block 2p codes][32*kRows: 2p + 1]
// a block's codes being 8 chunks of 4*kRows bytes, chunk j lane i (bytes 4i..4i+3) = codes
// 4j..4j+3 of row i, xor kCodeXor (0x80 makes them unsigned, as the avx512 panels hold them;
// then chunk j is also row j of an AMX B tile of the block, after the xor back). An odd last
// block is paired with a zero block. The rows' bytes exactly (34 per block and row).
//
// Include only from the ISA kernel files, like their common headers: internal linkage.
#pragma once

#include <cstdint>
#include <cstring>

#include "engine/backend/cpu/packed_rows_walk.h"

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

template <int kRowsOfGroup, uint8_t kCodeXor>
struct PackedQ8_0LayoutOf {
  static constexpr int kRows = kRowsOfGroup;
  static constexpr int64_t kQ8Bytes = 34;  // Q8_0 block: f16 d, 32 int8 codes
  static constexpr int64_t kScaleBytes = 2 * kRows;
  static constexpr int64_t kChunkBytes = 4 * kRows;
  static constexpr int64_t kCodeBytes = 32 * kRows;
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
    ForEachPackedBlock<kRows, kQ8Bytes>(
        w_rows, w_row_bytes, n_rows, n_in, GroupBytes(n_in / 32), dst, [](uint8_t* group, int i, int64_t b, const uint8_t* src) {
          std::memcpy(const_cast<uint8_t*>(ScalesOf(group, b)) + 2 * i, src, 2);
          uint8_t* codes = const_cast<uint8_t*>(CodesOf(group, b));
          for (int j = 0; j < 8; ++j) {
            for (int k = 0; k < 4; ++k) codes[kChunkBytes * j + 4 * i + k] = static_cast<uint8_t>(src[2 + 4 * j + k] ^ kCodeXor);
          }
        });
  }
};

using PackedQ8_0Layout = PackedQ8_0LayoutOf<16, 0x80>;

}  // namespace
}  // namespace kvfs::cpu
