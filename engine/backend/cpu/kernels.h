// CPU kernel tables: one per instruction set, chosen at run time by kernel_select.cpp (cpuid,
// or KVFS_CPU=scalar|avx2|avxvnni|avx512bw|avx512|amx). kernels_scalar.cpp is the reference; kernels_avx2*.cpp and
// kernels_avx512*.cpp are compiled with their own ISA flags. Every table must agree with the
// scalar reference (tests/engine/kernel_conformance_test.cpp checks by NMSE; the activation
// quantizers give identical codes).
#pragma once

#include <cstdint>

#include "engine/model/ggml_types.h"

namespace kvfs::cpu {

inline constexpr int kNumGgmlTypes = 32;  // ggml type ids are below this

// The type activations are quantized to before a dot product with a weight row of type t,
// as the reference engine does (so results match it closely):
// F32 -> F32, F16 -> F16, BF16 -> BF16, Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1 -> Q8_1,
// Q4_K/Q5_K/Q6_K -> Q8_K.
GgmlType VecDotType(GgmlType weight_type);

// Bytes of a row of n activations quantized to VecDotType(t) (Q8_K rows include the float
// scale and the 16 block sums).
int64_t QuantizedActivationRowBytes(GgmlType weight_type, int64_t n);

using QuantizeRowFn = void (*)(const float* x, void* dst, int64_t n);
using VecDotFn = float (*)(const void* weight_row, const void* activation_row, int64_t n);

// Many rows times many tokens (prefill, and batched decode):
//   y[t * y_stride + r] = vec_dot(w_rows + r * w_row_bytes, x_quant + t * x_row_bytes, n_in)
// for r < n_rows, t < n_tokens. x_quant holds rows quantized by quantize_row of the same weight
// type. Faster tables reuse each weight block, once loaded (and unpacked), across several tokens
// and rows; results agree with vec_dot up to float rounding (summation order), not bit for bit.
// No alignment is assumed for any pointer or stride.
using MatMulTileFn = void (*)(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows,
                              const uint8_t* x_quant, int64_t x_row_bytes, int64_t n_tokens,
                              int64_t n_in, float* y, int64_t y_stride);

// Weights repacked once, at load, into a table's own layout (rows interleaved so that one
// vector load holds the same elements of many rows): a decode step of several tokens then
// shares every activation load across those rows instead of repeating it per row.
//   bytes(n_rows, n_in): size of the packed form (rows padded to the table's row group)
//   pack(w_rows, w_row_bytes, n_rows, n_in, dst): dst 64-byte aligned, bytes(...) long
//   matmul(packed, r0, n_rows, ...): matmul_tile over rows [r0, r0 + n_rows) of the packed
//     matrix (r0 a multiple of 32); y receives rows r0.. at y[t * y_stride + (r - r0)].
// Results for one token do not depend on how many tokens share the call, up to 8 (a batched
// decode step gives every sequence what it would get alone).
struct PackedKernels {
  int64_t (*bytes)(int64_t n_rows, int64_t n_in) = nullptr;
  void (*pack)(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, int64_t n_in, uint8_t* dst) = nullptr;
  void (*matmul)(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                 int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) = nullptr;
  bool available() const { return pack != nullptr; }
};

struct KernelTable {
  const char* name;                         // "scalar", "avx2", "avxvnni", "avx512bw", "avx512", "amx"
  QuantizeRowFn quantize_row[kNumGgmlTypes];  // indexed by the WEIGHT type id
  VecDotFn vec_dot[kNumGgmlTypes];            // indexed by the weight type id
  MatMulTileFn matmul_tile[kNumGgmlTypes];    // indexed by the weight type id
  PackedKernels packed[kNumGgmlTypes];        // indexed by the weight type id; mostly absent
};

const KernelTable& ScalarKernels();
#if defined(KVFS_X86_KERNELS)
// Built from files compiled with AVX2+FMA+F16C and AVX-512 flags: only call these after
// kernel_select.cpp has checked cpuid (KernelTableByName / DefaultKernelTable do).
const KernelTable& Avx2Kernels();
const KernelTable& AvxVnniKernels();   // AVX2's, with the packed matmuls on vpdpbusd (AVX-VNNI)
const KernelTable& Avx512BwKernels();  // AVX2's, with packed Q4_0 on zmm (AVX-512 without VNNI)
const KernelTable& Avx512Kernels();
const KernelTable& AmxKernels();  // AVX-512's, with prompt-sized 32-value block products on AMX tiles
#endif

}  // namespace kvfs::cpu
