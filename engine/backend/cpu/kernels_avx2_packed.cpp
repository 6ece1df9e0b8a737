// The 32-value block formats' weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) repacked at load into groups
// of 8 interleaved rows, for CPUs whose best table is AVX2: the kernels of packed_rows_kernel.h on
// ymm registers (one dword lane per row).
#include "engine/backend/cpu/kernels_avx2_common.h"
#include "engine/backend/cpu/packed_rows_kernel.h"
#include "engine/backend/cpu/packed_rows_ymm_isa.h"

namespace kvfs::cpu {

static_assert(!YmmIsa::kDotBytes, "kernels_avx2_packed.cpp must be compiled without AVX-VNNI");

namespace avx2 {
const PackedKernels PackedQ4_0 = PackedRowsKernel<YmmIsa, Q4_0Rows>::kKernels;
const PackedKernels PackedQ4_1 = PackedRowsKernel<YmmIsa, Q4_1Rows>::kKernels;
const PackedKernels PackedQ5_0 = PackedRowsKernel<YmmIsa, Q5_0Rows>::kKernels;
const PackedKernels PackedQ5_1 = PackedRowsKernel<YmmIsa, Q5_1Rows>::kKernels;
const PackedKernels PackedQ8_0 = PackedRowsKernel<YmmIsa, Q8_0Rows>::kKernels;
}  // namespace avx2
}  // namespace kvfs::cpu
