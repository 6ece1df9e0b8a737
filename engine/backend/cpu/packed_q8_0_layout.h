// The packed Q8_0 layout of the AVX-512 packed kernels (kernels_avx512_packed.cpp) and of the
// amx table's prompts from it (kernels_amx.cpp): groups of 16 interleaved rows, so that one
// 64-byte load holds 4 codes of each row.
//
// Layout of one group (rows 16g .. 16g + 15; rows past the matrix are zero, scale 0): blocks in
// pairs of kPairBytes,
//   [32: f16 d of block 2p][32: of 2p + 1][512: block 2p codes][512: 2p + 1 codes]
// a block's codes being 8 chunks of 64 bytes, chunk j lane i (bytes 4i..4i+3) = codes
// 4j..4j+3 of row i, made unsigned (xor 0x80, as the avx512 panels hold them). Chunk j is also
// row j of an AMX B tile of the block (after the xor back). An odd last block is paired with a
// zero block. The rows' bytes exactly (544 per block and 16 rows).
//
// Include only from the ISA kernel files, like their common headers: internal linkage.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

struct PackedQ8_0Layout {
  static constexpr int kRows = 16;
  static constexpr int64_t kQ8Bytes = 34;  // Q8_0 block: f16 d, 32 int8 codes
  static constexpr int64_t kPairBytes = 2 * (32 + 512);

  static constexpr int64_t GroupBytes(int64_t nb) { return (nb + 1) / 2 * kPairBytes; }
  static const uint8_t* CodesOf(const uint8_t* group, int64_t b) { return group + (b >> 1) * kPairBytes + 64 + (b & 1) * 512; }
  static const uint8_t* ScalesOf(const uint8_t* group, int64_t b) { return group + (b >> 1) * kPairBytes + (b & 1) * 32; }

  static int64_t Bytes(int64_t n_rows, int64_t n_in) { return (n_rows + kRows - 1) / kRows * GroupBytes(n_in / 32); }

  static void Pack(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, int64_t n_in, uint8_t* dst) {
    const int64_t nb = n_in / 32, groups = (n_rows + kRows - 1) / kRows;
    std::memset(dst, 0, static_cast<size_t>(groups * GroupBytes(nb)));
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* group = dst + g * GroupBytes(nb);
      for (int i = 0; i < kRows && kRows * g + i < n_rows; ++i) {
        const uint8_t* row = w_rows + (kRows * g + i) * w_row_bytes;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* src = row + b * kQ8Bytes;
          std::memcpy(const_cast<uint8_t*>(ScalesOf(group, b)) + 2 * i, src, 2);
          uint8_t* codes = const_cast<uint8_t*>(CodesOf(group, b));
          for (int j = 0; j < 8; ++j) {
            for (int k = 0; k < 4; ++k) codes[64 * j + 4 * i + k] = static_cast<uint8_t>(src[2 + 4 * j + k] ^ 0x80);
          }
        }
      }
    }
  }
};

}  // namespace
}  // namespace kvfs::cpu
