// Weight formats: element conversions and exact dequantization as the ggml formats define
// them. Block layouts are in quant_blocks.h. The dot-product kernels are in the CPU backend.
#pragma once

#include <cstdint>

#include "engine/model/ggml_types.h"

namespace kvfs {

// IEEE half and bfloat16 conversions (subnormals, inf and NaN handled exactly;
// float->half rounds to nearest even).
float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
float Bf16ToFp32(uint16_t b);
uint16_t Fp32ToBf16(float f);  // round to nearest even, NaN kept quiet

// Bytes of a row of n elements of type t (n must be a multiple of the block size).
int64_t RowBytes(GgmlType t, int64_t n);

// Dequantizes n elements (a multiple of the block size) of type t into dst. Types without
// GgmlTypeInfo(t)->supported are a programming error (asserted).
void DequantizeRow(GgmlType t, const void* src, float* dst, int64_t n);

}  // namespace kvfs
