// WeightLayout::kSplitRows (vk_ops.h): Q4_0 and Q8_0 rows rewritten at upload so that every
// block's codes start at a 16-byte boundary. A row of n blocks becomes
//   [n x f16 scale][zero padding to a multiple of 16 bytes][n x code bytes (16 or 32)]
// and is SplitRowBytes long (the same as the GGUF row when n is a multiple of 8). The shaders
// read it back in weight_units.glsl (LoadUnit, WEIGHT_LAYOUT 1); the values are the same.
#pragma once

#include <cstdint>

#include "engine/model/ggml_types.h"

namespace kvfs::vk {

// Whether kSplitRows exists for matrices of this type.
bool SplitRowsApplies(GgmlType type);
// Bytes of one split row of n_in values (n_in a multiple of 32).
int64_t SplitRowBytes(GgmlType type, int64_t n_in);
// Rewrites n_rows GGUF rows (src, src_row_bytes apart) as split rows into dst
// (n_rows x SplitRowBytes bytes).
void SplitRows(GgmlType type, int64_t n_in, const uint8_t* src, int64_t src_row_bytes, int64_t n_rows, uint8_t* dst);

}  // namespace kvfs::vk
