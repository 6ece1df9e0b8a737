// KV cache formats. One token's K (or V) vector of one layer, n_head_kv * head_dim values, is
// stored as a row of groups of G consecutive values:
//   f16: G halfs                                   (2 bytes/value)
//   q8:  f16 scale d, G int8 codes     x = d*q     (G+2 bytes per group)
//   q4:  f16 scale d, f16 min m, G/2 bytes of nibbles, x = m + d*q, q in 0..15,
//        value 2i in the low nibble of byte i, value 2i+1 in the high nibble   (G/2+4 bytes)
// With rotation, each head's K and V are multiplied by the orthonormal Walsh-Hadamard matrix
// before quantization (spreads outliers across the head so 4-bit groups lose less); Q is
// rotated alike so Q.K is unchanged, and the attention output is rotated back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/status.h"

namespace kvfs {

enum class KvType : uint32_t { kF16 = 1, kQ8 = 2, kQ4 = 3 };  // stored in files: do not renumber

struct KvFormat {
  KvType type = KvType::kF16;
  int64_t group = 64;   // values per group (f16: unused, kept 0)
  bool rotate = false;  // Walsh-Hadamard rotation per head

  // Bytes of one row of n values (n a multiple of group).
  int64_t RowBytes(int64_t n) const;
  std::string Name() const;  // "f16", "q8", "q4", "q4-norot"...
  bool operator==(const KvFormat&) const = default;
};

// A 32-bit id of the format (type, group, rotation) for file headers: type | rotate << 8 | group << 16.
uint32_t KvFormatId(const KvFormat& f);

// The format for a model's geometry: group = largest divisor of n_head_kv*head_dim up to 64;
// rotation on by default for q4/q8 when head_dim is a power of two.
// type_name: "f16", "q8" or "q4"; rotate: "on", "off" or "" (default).
Result<KvFormat> MakeKvFormat(std::string_view type_name, std::string_view rotate, int64_t n_head_kv,
                              int64_t head_dim);

// Encodes n values (already rotated when the format rotates) into a row.
void KvQuantizeRow(const KvFormat& f, const float* x, uint8_t* row, int64_t n);
// Decodes values [begin, begin + n) of a row; begin and n are multiples of... anything:
// partial groups are handled (attention decodes one head's slice at a time).
void KvDequantize(const KvFormat& f, const uint8_t* row, int64_t begin, int64_t n, float* out);

// In-place orthonormal fast Walsh-Hadamard transform of n values (n a power of two).
void HadamardTransform(float* x, int64_t n);
bool IsPowerOfTwo(int64_t n);

}  // namespace kvfs
