// AVX2 + FMA + F16C attention kernels: 8 lanes, 16 registers. Compiled with those flags
// (engine/CMakeLists.txt); reached only through AttentionKernelsFor after a cpuid check.
// Everything but the table accessor has internal linkage (see attention_simd_impl.h).
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

static_assert(!KVFS_ATTN_AVX_VNNI, "attention_avx2.cpp must be compiled without AVX-VNNI");

constexpr AttentionKernels kAvx2Table{"avx2", &detail::DotRowsAny<Avx2>, &detail::DotRowsQ8Any<Avx2>, &detail::QuantizeQueriesT<Avx2>,
                                      &detail::AxpyRowsAny<Avx2>, &detail::AxpyBlocksAny<Avx2>, &detail::DotChunksAny<Avx2>,
                                      &detail::SoftmaxRow<Avx2>, &detail::RoundF16<Avx2>,
                                      &detail::Hadamard<Avx2>};

}  // namespace

const AttentionKernels& Avx2AttentionKernels() { return kAvx2Table; }

}  // namespace kvfs::cpu

#endif  // x86-64
