// AVX-512 attention kernels for CPUs without VNNI/VBMI (the "avx512bw" matrix table: Skylake-SP,
// Cascade Lake without DL Boost): the AVX-512 table's code (attention_avx512_isa.h) compiled
// with F/BW/VL/DQ only, so its int8 dot products run as vpmaddubsw + vpmaddwd. Reached only
// through AttentionKernelsFor after a cpuid check. Everything but the table accessor has
// internal linkage (see attention_simd_impl.h).
//
// Why: on such a CPU, decode steps of 8 agents with 1024-token q4 contexts spent 29% in AVX2's
// attention (q4 keys 3.2 ns per (row, query) against 1.38 with VNNI on zmm).
#include "engine/backend/cpu/attention.h"

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace kvfs::cpu {
namespace {

#include "engine/backend/cpu/attention_x86_shared.h"
#include "engine/backend/cpu/attention_avx512_isa.h"

#include "engine/backend/cpu/attention_simd_impl.h"

static_assert(!KVFS_ATTN_AVX512_VNNI, "attention_avx512bw.cpp must be compiled without VNNI/VBMI flags");

constexpr AttentionKernels kAvx512BwTable{"avx512bw", &detail::DotRowsAny<Avx512>, &detail::DotRowsQ8Any<Avx512>,
                                          &detail::QuantizeQueriesT<Avx512>, &detail::AxpyRowsAny<Avx512>, &detail::AxpyBlocksAny<Avx512>,
                                          &detail::DotChunksAny<Avx512>, &detail::SoftmaxRow<Avx512>,
                                          &detail::RoundF16<Avx512>, &detail::Hadamard<Avx512>};

}  // namespace

const AttentionKernels& Avx512BwAttentionKernels() { return kAvx512BwTable; }

}  // namespace kvfs::cpu

#endif  // x86-64
