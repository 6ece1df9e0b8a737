// The "avxvnni" kernel table, for CPUs with AVX-VNNI but no AVX-512: Intel's client cores since
// Alder Lake (Raptor, Meteor, Arrow and Lunar Lake) and its E-core Xeons (Sierra Forest). The
// AVX2 table, with every packed matmul (the 32-value block formats and the K-quants, 8 rows per
// group on ymm) taking a block's byte products with one vpdpbusd into int32, where AVX2 needs
// vpmaddubsw into int16, an int16 add and a vpmaddwd. Compiled with AVX2 + FMA + F16C + AVX-VNNI
// (engine/CMakeLists.txt) and nothing of AVX-512.
//
// The packed layouts and the float steps are the AVX2 table's, and the integer sums are exact
// either way, so a row gets the same bits from both tables (and from the AVX-512 ones:
// KernelConformance.PackedSameBitsInEveryTable).
#include "engine/backend/cpu/kernels_avx2_common.h"
#include "engine/backend/cpu/packed_kquants_ymm.h"
#include "engine/backend/cpu/packed_rows_kernel.h"
#include "engine/backend/cpu/packed_rows_ymm_isa.h"

namespace kvfs::cpu {
namespace {

static_assert(YmmIsa::kDotBytes && KVFS_KQUANTS_YMM_VNNI, "kernels_avxvnni_packed.cpp must be compiled with AVX-VNNI");

KernelTable MakeAvxVnniTable() {
  KernelTable t = Avx2Kernels();
  t.name = "avxvnni";
  auto packed = [&t](GgmlType type, const PackedKernels& k) { t.packed[static_cast<uint32_t>(type)] = k; };
  packed(GgmlType::kQ4_0, PackedRowsKernel<YmmIsa, Q4_0Rows>::kKernels);
  packed(GgmlType::kQ4_1, PackedRowsKernel<YmmIsa, Q4_1Rows>::kKernels);
  packed(GgmlType::kQ5_0, PackedRowsKernel<YmmIsa, Q5_0Rows>::kKernels);
  packed(GgmlType::kQ5_1, PackedRowsKernel<YmmIsa, Q5_1Rows>::kKernels);
  packed(GgmlType::kQ8_0, PackedRowsKernel<YmmIsa, Q8_0Rows>::kKernels);
  packed(GgmlType::kQ4_K, kPackedKQuant<KFmt::kQ4K>);
  packed(GgmlType::kQ5_K, kPackedKQuant<KFmt::kQ5K>);
  packed(GgmlType::kQ6_K, kPackedKQuant<KFmt::kQ6K>);
  return t;
}

}  // namespace

// Only reached after kernel_select.cpp has seen AVX2, FMA, F16C and AVX-VNNI in cpuid.
const KernelTable& AvxVnniKernels() {
  static const KernelTable kTable = MakeAvxVnniTable();
  return kTable;
}

}  // namespace kvfs::cpu
