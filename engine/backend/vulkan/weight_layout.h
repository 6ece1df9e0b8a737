// WeightLayout::kSplitRows (vk_ops.h): rows rewritten at upload so that every unit's codes
// start at an aligned offset, read with one 16-byte load (NVIDIA's memory pipeline moves a
// 128-bit load per invocation for the cost of a 32-bit one). The values are the same; the
// shaders read the rows back in weight_units.glsl (LoadUnit, WEIGHT_LAYOUT 1).
//
// Q4_0 and Q8_0: a row of n blocks becomes
//   [n x f16 scale][zero padding to a multiple of 16 bytes][n x code bytes (16 or 32)]
// (the GGUF block's code bytes as they are).
//
// Q6_K (210-byte super-blocks, so GGUF rows put a unit's 24 code bytes at any even offset and
// the shaders read them as 16 words, some two loads each): a row of s super-blocks and
// n = 8 s units of 32 values becomes
//   [s x f16 d][padding to 16][n x 2 int8 scales (elements 0-15, 16-31)][padding to 16]
//   [n x 8 bytes of high bits][n x 16 bytes of low nibbles]
// where unit u's element e (0-31) has its low nibble in byte e % 16 of its 16 (bits 0-3 for
// e < 16, 4-7 for e >= 16: Q4_0's order) and its high 2 bits in byte e % 8 of its 8, at bit
// 2 (e / 8). The padding is zero.
//
// SplitRowBytes is the GGUF row's length when the row has a multiple of 8 blocks (Q4_0, Q8_0)
// or of 8 super-blocks (Q6_K); shorter rows may take a few bytes more.
#pragma once

#include <cstdint>

#include "engine/model/ggml_types.h"

namespace kvfs::vk {

// Whether kSplitRows exists for matrices of this type.
bool SplitRowsApplies(GgmlType type);
// Bytes of one split row of n_in values (n_in a multiple of the type's block).
int64_t SplitRowBytes(GgmlType type, int64_t n_in);
// Rewrites n_rows GGUF rows (src, src_row_bytes apart) as split rows into dst
// (n_rows x SplitRowBytes bytes).
void SplitRows(GgmlType type, int64_t n_in, const uint8_t* src, int64_t src_row_bytes, int64_t n_rows, uint8_t* dst);

}  // namespace kvfs::vk
