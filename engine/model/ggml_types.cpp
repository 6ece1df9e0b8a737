#include "engine/model/ggml_types.h"

namespace kvfs {

const GgmlTypeTraits* GgmlTypeInfo(uint32_t type_id) {
  // Block sizes from the ggml format definitions (block_q4_0 = f16 d + 16 nibble bytes, ...).
  static const GgmlTypeTraits kF32{"F32", 1, 4, true};
  static const GgmlTypeTraits kF16{"F16", 1, 2, true};
  static const GgmlTypeTraits kQ4_0{"Q4_0", 32, 18, true};
  static const GgmlTypeTraits kQ4_1{"Q4_1", 32, 20, true};
  static const GgmlTypeTraits kQ5_0{"Q5_0", 32, 22, true};
  static const GgmlTypeTraits kQ5_1{"Q5_1", 32, 24, true};
  static const GgmlTypeTraits kQ8_0{"Q8_0", 32, 34, true};
  static const GgmlTypeTraits kQ8_1{"Q8_1", 32, 36, false};
  static const GgmlTypeTraits kQ2_K{"Q2_K", 256, 84, false};
  static const GgmlTypeTraits kQ3_K{"Q3_K", 256, 110, false};
  static const GgmlTypeTraits kQ4_K{"Q4_K", 256, 144, true};
  static const GgmlTypeTraits kQ5_K{"Q5_K", 256, 176, true};
  static const GgmlTypeTraits kQ6_K{"Q6_K", 256, 210, true};
  static const GgmlTypeTraits kQ8_K{"Q8_K", 256, 292, false};
  static const GgmlTypeTraits kI8{"I8", 1, 1, false};
  static const GgmlTypeTraits kI16{"I16", 1, 2, false};
  static const GgmlTypeTraits kI32{"I32", 1, 4, false};
  static const GgmlTypeTraits kI64{"I64", 1, 8, false};
  static const GgmlTypeTraits kF64{"F64", 1, 8, false};
  static const GgmlTypeTraits kBF16{"BF16", 1, 2, true};
  switch (static_cast<GgmlType>(type_id)) {
    case GgmlType::kF32: return &kF32;
    case GgmlType::kF16: return &kF16;
    case GgmlType::kQ4_0: return &kQ4_0;
    case GgmlType::kQ4_1: return &kQ4_1;
    case GgmlType::kQ5_0: return &kQ5_0;
    case GgmlType::kQ5_1: return &kQ5_1;
    case GgmlType::kQ8_0: return &kQ8_0;
    case GgmlType::kQ8_1: return &kQ8_1;
    case GgmlType::kQ2_K: return &kQ2_K;
    case GgmlType::kQ3_K: return &kQ3_K;
    case GgmlType::kQ4_K: return &kQ4_K;
    case GgmlType::kQ5_K: return &kQ5_K;
    case GgmlType::kQ6_K: return &kQ6_K;
    case GgmlType::kQ8_K: return &kQ8_K;
    case GgmlType::kI8: return &kI8;
    case GgmlType::kI16: return &kI16;
    case GgmlType::kI32: return &kI32;
    case GgmlType::kI64: return &kI64;
    case GgmlType::kF64: return &kF64;
    case GgmlType::kBF16: return &kBF16;
  }
  return nullptr;
}

}  // namespace kvfs
