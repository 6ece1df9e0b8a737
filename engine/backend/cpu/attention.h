// Attention kernels over encoded KV rows (kv_format.h), one table per instruction set like the
// matrix kernels. They read K and V in their stored format and decode inside the kernel: a
// quantized cache is never expanded into a full-precision copy.
//
// Rows: `rows` points at n_rows consecutive encoded rows (row_bytes apart: one KV block's
// plane, or part of one). A row holds every KV head; a kernel reads the slice of one head:
// values [head * hd, (head + 1) * hd).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "engine/kv/kv_format.h"

namespace kvfs::cpu {

struct KvRows {
  const uint8_t* rows;  // first row
  int64_t row_bytes;    // stride between rows
  int64_t n_rows;
  int64_t head;         // which head's slice
  int64_t hd;           // head_dim
};

// q4k keys (kv_format.h): tokens [0, n_tokens) of consecutive K chunks (chunk_bytes apart: one
// KV block's K plane, or part of one), each of f.chunk tokens; a kernel reads one head's
// channels [head * hd, (head + 1) * hd) of each chunk (contiguous records). Every chunk read
// must be complete (all f.chunk tokens encoded), even when n_tokens ends inside it.
struct KvChunks {
  const uint8_t* chunks;  // first chunk
  int64_t chunk_bytes;    // stride between chunks
  int64_t n_tokens;
  int64_t head;
  int64_t hd;
};

// scores[i * s_stride + p] = dot(q[i * hd .. (i+1) * hd), K row p's head slice), i < nq, p < n_rows.
using KvDotRowsFn = void (*)(const KvFormat& f, const KvRows& k, const float* q, int64_t nq, float* scores,
                             int64_t s_stride);
// The same over q4k K chunks: scores[i * s_stride + p] = dot(q_i, key of token p), p < n_tokens.
// When KeyChunksUseInt8 (head_dim a multiple of 32), as an integer dot product like q4 keys':
// per (query, chunk) the products a_c = q_c * d_c of the query with the chunk's channel scales
// are quantized to int8 (ChunkQueryQ8), and
//   score = base + t_0 + t_1 + ..., added with fma in that order, t_b = float(isum_b) * sa_b
// where base = sum_c q_c * (m_c + 8 d_c) and isum_b = sum over block b's 32 channels of
// code(a_c) x (key code - 8). The centring keeps the int8 rounding away from the channels' large
// minimums; it adds a few percent of the error the 4-bit keys already have (see the test).
using KvDotChunksFn = void (*)(const KvFormat& f, const KvChunks& k, const float* q, int64_t nq, float* scores,
                               int64_t s_stride);
// q4 keys are dotted with int8 queries, as the reference engine does for its 4-bit caches (it
// quantizes Q like an activation): an integer dot product of codes with codes is 4x the work per
// instruction of a float one, and needs no decode of the keys to floats. Each query's head
// slice is cut into blocks of kQueryBlock values, quantized to int8 (Int8Queries), and
//   score = t_0 + t_1 + ... (left to right), t_b = fma(m + 8 * d, qsum_b, float(isum_b) * (d * sq_b))
// where d, m are the scale and minimum of the K group holding block b (a key value is
// m + d * c = (m + 8d) + d * (c - 8)), isum_b = sum of query code x (key code - 8) over the block
// (exact integers), sq_b the block's query scale and qsum_b the float sum of its 32 unquantized
// query values. So the query's rounding errors meet only the centred d * (c - 8), never the
// keys' offset m (which is large in real keys), and the error stays well below that of the
// 4-bit keys themselves. Every table (and the Vulkan shader) computes these same operations,
// so they agree bit for bit. Used when KeysUseInt8Queries; else dot_rows.
constexpr int64_t kQueryBlock = 32;

// Whether q4 keys of this format and head_dim take the int8-query path (every block of 32 lies
// inside one K group).
bool KeysUseInt8Queries(const KvFormat& f, int64_t hd);

// Queries quantized for it: nq queries of hd values (hd % kQueryBlock == 0).
//   codes[i * hd + b * 32 + k]: block b's 32 codes in the byte order of a q4 group's nibbles,
//     as dword lanes read them: dword 2j holds the codes of values 8j, 8j+2, 8j+4, 8j+6 (low
//     nibbles of key bytes 4j..4j+3), dword 2j+1 those of 8j+1, 8j+3, 8j+5, 8j+7 (high nibbles)
//   scales[i * nb + b] = sq_b: the power of two 2^(E-7) for max|x| = f * 2^E, f in [0.5, 1);
//     codes are round(x / sq_b), half to even, clamped to [-127, 127] (0 when all x are 0)
//   sums[i * nb + b]   = qsum_b, the block's values added in order
//   code_sums[i * nb + b]: the sum of the block's codes (so isum_b = sum code x c - 8 * that)
// A power-of-two scale makes quantizing exact arithmetic (no division), so every implementation
// gets the same codes; it costs under half a bit against max|x| / 127.
struct Int8Queries {
  const int8_t* codes;
  const float* scales;
  const float* sums;
  const int32_t* code_sums;
};
// Position in a block's codes of the block's value j (the order above).
constexpr int64_t Int8QueryCodeIndex(int64_t j) { return 4 * (2 * (j / 8) + (j % 2)) + (j % 8) / 2; }
// The power-of-two scale of an int8 block whose largest magnitude is amax > 0: scale = 2^e with
// e = E - 7 for amax = f * 2^E, f in [0.5, 1); inv = 2^-e, or 0 where that is not a normal
// float (then codes are ldexp(x, -e), rounded). Every integer path takes its scales from here.
struct Int8BlockScale {
  int e;
  float scale, inv;
};
// Defined here with internal linkage: the SIMD tables inline it into their per-query loops, and
// a copy compiled with their ISA flags must never be the one a scalar caller links to (see
// attention_simd_impl.h).
namespace {
inline Int8BlockScale BlockScaleFor(float amax) {
  // frexp and ldexp by the bits where amax is normal (this runs per block on the decode path).
  uint32_t bits;
  std::memcpy(&bits, &amax, 4);
  const int biased = static_cast<int>((bits >> 23) & 0xFF);
  int e = biased - 126 - 7;
  if (biased == 0) {  // subnormal
    std::frexp(amax, &e);
    e -= 7;
  }
  auto pow2 = [](int k) {  // 2^k, k in [-126, 127]: a normal float
    const uint32_t b = static_cast<uint32_t>(k + 127) << 23;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  return {e, e >= -126 ? pow2(e) : std::ldexp(1.0f, e), -e <= 126 ? pow2(-e) : 0.0f};
}
}  // namespace
// Quantizes 32 values x (natural order) by the rule of Int8Queries into codes; returns the scale
// (0 for an all-zero block) and the codes' sum. The SIMD quantizers give these bits and call it
// where the exponent leaves the normal range.
struct QuantizedBlock {
  float scale;
  int32_t code_sum;
};
QuantizedBlock QuantizeInt8Block(const float* x, int8_t* codes);
// Fills codes (nq * hd), scales, sums and code_sums (nq * hd / 32 each) from q (nq * hd floats).
void QuantizeQueries(const float* q, int64_t nq, int64_t hd, int8_t* codes, float* scales, float* sums,
                     int32_t* code_sums);

// q4k keys with int8 weights: whether dot_chunks takes the integer path for this head_dim.
bool KeyChunksUseInt8(int64_t hd);
// One query against one chunk's head slice (hd <= kMaxChunkHd):
//   codes[32b + j]: the int8 code of a_c for channel c = 32b + j (natural order), rounded half
//     to even against sa_b = scales[b], the power of two 2^(E-7) for the block's max|a| =
//     f * 2^E (as Int8Queries), clamped to [-127, 127]; 0 and sa_b = 0 when the block is all 0
//   code_sums[b]: the sum of block b's codes
//   base: sum_c fma(q_c, m_c + 8 d_c) over 16 interleaved partial sums (channel c into lane
//     c % 16, in order), then lanes[l] += lanes[l + w] for w = 8, 4, 2, 1
constexpr int64_t kMaxChunkHd = 256;
struct ChunkQueryQ8 {
  int8_t codes[kMaxChunkHd];
  float scales[kMaxChunkHd / kQueryBlock];
  int32_t code_sums[kMaxChunkHd / kQueryBlock];
  float base;
};
// From q (hd values) and the chunk slice's channel scales d and minimums m (hd floats each).
// Tables may vectorise it but must give these bits (per block, QuantizeInt8Block's).
void QuantizeChunkQuery(const float* q, const float* d, const float* m, int64_t hd, ChunkQueryQ8* out);

// QuantizeQueries as a table entry: the SIMD tables give its bits (it runs per attention item on
// the decode path).
using QuantizeQueriesFn = void (*)(const float* q, int64_t nq, int64_t hd, int8_t* codes, float* scales, float* sums,
                                   int32_t* code_sums);

// dot_rows over q4 K rows with int8 queries: scores[i * s_stride + p] = score of query i, row p.
using KvDotRowsQ8Fn = void (*)(const KvFormat& f, const KvRows& k, const Int8Queries& q, int64_t nq, float* scores,
                               int64_t s_stride);

// out[i * hd + d] += sum_p w[i * w_stride + p] * V row p's head slice [d], i < nq.
using KvAxpyRowsFn = void (*)(const KvFormat& f, const KvRows& v, const float* w, int64_t nq, int64_t w_stride,
                              float* out);
// The same over a sequence's KV blocks in position order: w's columns run on across blocks
// (block b's row p is column p + the rows of blocks before it). Where every table takes the
// scalar path (head_dim not a multiple of 16; float values: position p into lane p % 16, one
// pairwise tree at the end) the lanes run on across blocks, so the whole context is one sum as
// in the reference engine's f16 GEMM; a tree per block moved stories260K p3 logits by up to
// 0.025 after position 256 (the block size). Otherwise (int8-weight values, the SIMD tables'
// head sizes) blocks are summed one by one.
using KvAxpyBlocksFn = void (*)(const KvFormat& f, std::span<const KvRows> blocks, const float* w, int64_t nq,
                                int64_t w_stride, float* out);
// q4 values (when ValuesUseInt8Weights) are summed the same way with int8 weights: an integer
// dot product over positions, codes against codes, is 4x the work per instruction of a float
// one and needs no decode of V to floats. For query i and 32-value block b of the head slice
// (its q4 group holds scale d_p and minimum m_p at row p; a value is (m + 8d) + d (c - 8)), the
// rows are cut into spans of kValueSpan positions, each span into tiles of kQueryBlock (the last
// ones shorter), and
//   a_p = w_p * d_p, quantized per tile by the rule of Int8Queries (QuantizeInt8Block):
//     codes k_p, power-of-two scale sa, code sum ks
//   acc_c = fma(float(isum_c), sa, acc_c) tile by tile from 0, isum_c = sum_p k_p (c_p - 8)
//     (exact integers) for each value c of the block
//   base = sum_p fma(w_p, m_p + 8 d_p) over 16 interleaved partial sums (position p into lane
//     p % 16, in order), then lanes[l] += lanes[l + w] for w = 8, 4, 2, 1
//   out_c = out_c + (acc_c + base), once per span.
// The weights' rounding errors meet only the centred codes d (c - 8), never the large minimums
// (see the test for how it compares with the error of the 4-bit values). Every table and the
// Vulkan shader quantize the same codes; the CPU tables also agree bit for bit.
constexpr int64_t kValueSpan = 128;
bool ValuesUseInt8Weights(const KvFormat& f, int64_t hd);

// One query's attention weights, in place: s[p] = softmax(scale * s[p]) over p < n (the
// positions it may see), each rounded to f16 and back when round_f16 (the reference's f16 path
// multiplies V by f16 weights), and s[p] = 0 for n <= p < n_total. Every table computes exactly
// what cpu::Softmax (ops.h) does, bit for bit: same exp polynomial, same summation order.
using KvSoftmaxFn = void (*)(float* s, int64_t n, int64_t n_total, float scale, bool round_f16);

// x[i] = f32(f16(x[i])) for i < n, rounding to nearest even (queries for an f16 cache).
using RoundF16Fn = void (*)(float* x, int64_t n);

// HadamardTransform (kv_format.h) of n values in place, bit for bit (rotating queries and
// outputs of a rotated cache).
using HadamardFn = void (*)(float* x, int64_t n);

struct AttentionKernels {
  const char* name;
  KvDotRowsFn dot_rows;
  KvDotRowsQ8Fn dot_rows_q8;
  QuantizeQueriesFn quantize_queries;
  KvAxpyRowsFn axpy_rows;
  KvAxpyBlocksFn axpy_blocks;
  KvDotChunksFn dot_chunks;
  KvSoftmaxFn softmax;
  RoundF16Fn round_f16;
  HadamardFn hadamard;
};

const AttentionKernels& ScalarAttentionKernels();
// The attention table matching a matrix kernel table name ("scalar", "avx2", "avxvnni",
// "avx512bw", "avx512"; "amx" takes avx512's); the scalar one when there is no specialised table for that
// name or this CPU lacks its ISA.
// Debugging knob: KVFS_ATTN=scalar|avx2|avxvnni|avx512bw|avx512 in the environment overrides the name (an
// unsupported choice falls back as above), so the SIMD attention kernels can be run end to end
// (golden tests, kvfs bench) under any matrix kernel table.
const AttentionKernels& AttentionKernelsFor(const std::string& table_name);
// The attention table of that name if this build has it and this CPU can run it, else null.
const AttentionKernels* AttentionKernelsByName(const std::string& name);

#if defined(__x86_64__) || defined(_M_X64)
// The SIMD tables themselves (attention_avx2.cpp, attention_avx512.cpp). Compiled with their
// ISA flags: call only after the matching cpuid check (AttentionKernelsByName does it).
const AttentionKernels& Avx2AttentionKernels();
const AttentionKernels& AvxVnniAttentionKernels();  // AVX2's, with vpdpbusd (AVX-VNNI)
const AttentionKernels& Avx512BwAttentionKernels();  // AVX-512 without VNNI/VBMI
const AttentionKernels& Avx512AttentionKernels();
#endif

}  // namespace kvfs::cpu
