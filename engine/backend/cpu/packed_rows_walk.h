// The packing loop the row-interleaved layouts share (packed_nibble_layout.h,
// packed_q8_0_layout.h): every block of every row, by group. Include only from the ISA kernel
// files, like the layouts; internal linkage.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

// Zeroes dst (groups of kRows rows, group_bytes each; rows past the matrix stay zero), then calls
// block(group, i, b, src) for row i of each group and each of its blocks b of 32 inputs, src
// being the block's bytes in the row (kSrcBlockBytes each).
template <int kRows, int64_t kSrcBlockBytes, class Block>
void ForEachPackedBlock(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, int64_t n_in, int64_t group_bytes,
                        uint8_t* dst, Block&& block) {
  const int64_t nb = n_in / 32, groups = (n_rows + kRows - 1) / kRows;
  std::memset(dst, 0, static_cast<size_t>(groups * group_bytes));
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* group = dst + g * group_bytes;
    for (int i = 0; i < kRows && kRows * g + i < n_rows; ++i) {
      const uint8_t* row = w_rows + (kRows * g + i) * w_row_bytes;
      for (int64_t b = 0; b < nb; ++b) block(group, i, b, row + b * kSrcBlockBytes);
    }
  }
}

}  // namespace
}  // namespace kvfs::cpu
