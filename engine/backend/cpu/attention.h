// Attention kernels over encoded KV rows (kv_format.h), one table per instruction set like the
// matrix kernels. They read K and V in their stored format and decode inside the kernel: a
// quantized cache is never expanded into a full-precision copy.
//
// Rows: `rows` points at n_rows consecutive encoded rows (row_bytes apart: one KV block's
// plane, or part of one). A row holds every KV head; a kernel reads the slice of one head:
// values [head * hd, (head + 1) * hd).
#pragma once

#include <cstdint>
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
using KvDotChunksFn = void (*)(const KvFormat& f, const KvChunks& k, const float* q, int64_t nq, float* scores,
                               int64_t s_stride);
// out[i * hd + d] += sum_p w[i * w_stride + p] * V row p's head slice [d], i < nq.
using KvAxpyRowsFn = void (*)(const KvFormat& f, const KvRows& v, const float* w, int64_t nq, int64_t w_stride,
                              float* out);

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
  KvAxpyRowsFn axpy_rows;
  KvDotChunksFn dot_chunks;
  KvSoftmaxFn softmax;
  RoundF16Fn round_f16;
  HadamardFn hadamard;
};

const AttentionKernels& ScalarAttentionKernels();
// The attention table matching a matrix kernel table name ("scalar", "avx2", "avx512"); the
// scalar one when there is no specialised table for that name or this CPU lacks its ISA.
// Debugging knob: KVFS_ATTN=scalar|avx2|avx512 in the environment overrides the name (an
// unsupported choice falls back as above), so the SIMD attention kernels can be run end to end
// (golden tests, kvfs bench) under any matrix kernel table.
const AttentionKernels& AttentionKernelsFor(const std::string& table_name);
// The attention table of that name if this build has it and this CPU can run it, else null.
const AttentionKernels* AttentionKernelsByName(const std::string& name);

#if defined(__x86_64__) || defined(_M_X64)
// The SIMD tables themselves (attention_avx2.cpp, attention_avx512.cpp). Compiled with their
// ISA flags: call only after the matching cpuid check (AttentionKernelsByName does it).
const AttentionKernels& Avx2AttentionKernels();
const AttentionKernels& Avx512AttentionKernels();
#endif

}  // namespace kvfs::cpu
