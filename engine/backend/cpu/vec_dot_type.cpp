// Which activation format each weight type is dotted with, and the size of such rows.
#include <cassert>

#include "engine/backend/cpu/kernels.h"
#include "engine/model/quants.h"

namespace kvfs::cpu {

GgmlType VecDotType(GgmlType weight_type) {
  switch (weight_type) {
    case GgmlType::kF32: return GgmlType::kF32;
    case GgmlType::kF16: return GgmlType::kF16;
    case GgmlType::kBF16: return GgmlType::kBF16;
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0: return GgmlType::kQ8_0;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1: return GgmlType::kQ8_1;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return GgmlType::kQ8_K;
    default:
      // No kernel exists for this weight type (its table entries are nullptr); asking is a
      // programming error. Release builds get F32, which is at least a valid type.
      assert(false && "VecDotType: no dot product for this weight type");
      return GgmlType::kF32;
  }
}

int64_t QuantizedActivationRowBytes(GgmlType weight_type, int64_t n) {
  return RowBytes(VecDotType(weight_type), n);
}

}  // namespace kvfs::cpu
