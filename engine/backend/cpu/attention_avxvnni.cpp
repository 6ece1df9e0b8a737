// Attention kernels for the "avxvnni" matrix table (AVX2 + AVX-VNNI, no AVX-512: Intel client
// cores since Alder Lake, E-core Xeons): the AVX2 table's code (attention_avx2_isa.h) compiled
// with AVX-VNNI, so the int8 dot products of q4 keys and values take one vpdpbusd. Reached only
// through AttentionKernelsFor after a cpuid check. Everything but the table accessor has
// internal linkage (see attention_simd_impl.h).
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

#include "engine/backend/cpu/attention_avx2_isa.h"

#include "engine/backend/cpu/attention_simd_impl.h"

static_assert(KVFS_ATTN_AVX_VNNI, "attention_avxvnni.cpp must be compiled with AVX-VNNI");

constexpr AttentionKernels kAvxVnniTable{"avxvnni", &detail::DotRowsAny<Avx2>, &detail::DotRowsQ8Any<Avx2>,
                                         &detail::QuantizeQueriesT<Avx2>, &detail::AxpyRowsAny<Avx2>, &detail::AxpyBlocksAny<Avx2>,
                                         &detail::DotChunksAny<Avx2>, &detail::SoftmaxRow<Avx2>, &detail::RoundF16<Avx2>,
                                         &detail::Hadamard<Avx2>};

}  // namespace

const AttentionKernels& AvxVnniAttentionKernels() { return kAvxVnniTable; }

}  // namespace kvfs::cpu

#endif  // x86-64
