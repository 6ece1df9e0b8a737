// The ggml tensor types that GGUF files use: ids as stored on disk, block geometry, names.
// Constants only; dequantization and dot products live in quants.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvfs {

// Values are the on-disk ggml_type ids (gguf spec); do not renumber.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct GgmlTypeTraits {
  std::string_view name;
  int64_t block_elems;  // elements per block (1 for plain float types)
  int64_t block_bytes;  // bytes per block
  bool supported;       // kvfs can compute with it (dequantize and dot)
};

// Returns nullptr for ids that are not ggml types at all.
const GgmlTypeTraits* GgmlTypeInfo(uint32_t type_id);

// Super-block geometry shared by the k-quants.
inline constexpr int kQK_K = 256;
inline constexpr int kQK4_0 = 32;
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK5_0 = 32;
inline constexpr int kQK5_1 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK8_1 = 32;

}  // namespace kvfs
