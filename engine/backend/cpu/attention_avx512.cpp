// AVX-512 (F/BW/VL/DQ/VNNI, with F16C and FMA) attention kernels: 16 lanes, 32 registers. Compiled with
// AVX-512 flags (engine/CMakeLists.txt); reached only through AttentionKernelsFor after a cpuid
// check. Everything but the table accessor has internal linkage (see attention_simd_impl.h).
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

constexpr AttentionKernels kAvx512Table{"avx512", &detail::DotRowsAny<Avx512>, &detail::DotRowsQ8Any<Avx512>, &detail::QuantizeQueriesT<Avx512>,
                                        &detail::AxpyRowsAny<Avx512>, &detail::AxpyBlocksAny<Avx512>, &detail::DotChunksAny<Avx512>,
                                        &detail::SoftmaxRow<Avx512>, &detail::RoundF16<Avx512>,
                                        &detail::Hadamard<Avx512>};

}  // namespace

const AttentionKernels& Avx512AttentionKernels() { return kAvx512Table; }

}  // namespace kvfs::cpu

#endif  // x86-64
