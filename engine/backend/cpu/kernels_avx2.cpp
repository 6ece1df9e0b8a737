// TEMPORARY placeholder
#include "engine/backend/cpu/kernels.h"
namespace kvfs::cpu {
const KernelTable& Avx2Kernels() {
  static const KernelTable kTable = [] { KernelTable t = ScalarKernels(); t.name = "avx2"; return t; }();
  return kTable;
}
}  // namespace kvfs::cpu
