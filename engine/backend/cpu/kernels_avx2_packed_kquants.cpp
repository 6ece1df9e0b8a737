// The AVX2 table's packed K-quant kernels (Q4_K, Q5_K, Q6_K in groups of 8 rows): those of
// packed_kquants_ymm.h, compiled with AVX2 + FMA + F16C only (int16 steps, no vpdpbusd).
#include "engine/backend/cpu/kernels_avx2_common.h"
#include "engine/backend/cpu/packed_kquants_ymm.h"

namespace kvfs::cpu {

static_assert(!KVFS_KQUANTS_YMM_VNNI, "kernels_avx2_packed_kquants.cpp must be compiled without AVX-VNNI");

namespace avx2 {
const PackedKernels PackedQ4_K = kPackedKQuant<KFmt::kQ4K>;
const PackedKernels PackedQ5_K = kPackedKQuant<KFmt::kQ5K>;
const PackedKernels PackedQ6_K = kPackedKQuant<KFmt::kQ6K>;
}  // namespace avx2
}  // namespace kvfs::cpu
