// Random operands for the conformance tests: weight matrices of random code bytes with the
// scale fields (and float types' values) set to sane values, so that products stay finite and
// comparable; activations with the cases quantizers get wrong (zero blocks, rounding ties).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/backend/cpu/kernels.h"
#include "engine/model/ggml_types.h"
#include "engine/model/quants.h"

namespace kvfs::testing {

inline void PutHalf(uint8_t* p, float v) {
  const uint16_t h = Fp32ToFp16(v);
  std::memcpy(p, &h, 2);
}

// Overwrites the f16 scale fields of every block of n_rows rows of n values of type t in w
// (random bytes could make them NaN or huge), and float types' values, with draws from rng:
// N(0, 1) values, scales of a type-dependent magnitude.
inline void SetSaneScales(GgmlType t, std::vector<uint8_t>& w, int64_t n_rows, int64_t n, std::mt19937& rng) {
  const int64_t row_bytes = RowBytes(t, n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.5f, 2.0f);
  const GgmlTypeTraits* info = GgmlTypeInfo(static_cast<uint32_t>(t));
  const int64_t nb = n / info->block_elems, bb = info->block_bytes;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t* b = w.data() + r * row_bytes + i * bb;
      switch (t) {
        case GgmlType::kF32: {
          const float v = normal(rng);
          std::memcpy(b, &v, 4);
          break;
        }
        case GgmlType::kF16: PutHalf(b, normal(rng)); break;
        case GgmlType::kBF16: {
          const uint16_t h = Fp32ToBf16(normal(rng));
          std::memcpy(b, &h, 2);
          break;
        }
        case GgmlType::kQ4_0:
        case GgmlType::kQ5_0:
        case GgmlType::kQ8_0: PutHalf(b, 0.01f * mag(rng)); break;
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_1:
          PutHalf(b, 0.01f * mag(rng));
          PutHalf(b + 2, -0.1f * mag(rng));
          break;
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K:
          PutHalf(b, 0.001f * mag(rng));
          PutHalf(b + 2, 0.001f * mag(rng));
          break;
        case GgmlType::kQ6_K: PutHalf(b + 208, 0.001f * mag(rng)); break;
        default: break;
      }
    }
  }
}

// Activations: N(0, 1) scaled per 32 values by 10^U(-2, 2), one all-zero block and one block of
// exact halves at unit scale (rounding ties) when n allows.
inline std::vector<float> RandomActivations(int64_t n, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-2.0f, 2.0f);
  for (int64_t i = 0; i < n; i += 32) {
    const float s = std::pow(10.0f, expo(rng));
    for (int64_t j = i; j < std::min(n, i + 32); ++j) x[j] = s * normal(rng);
  }
  if (n >= 96) {
    for (int64_t j = 32; j < 64; ++j) x[j] = 0.0f;
    // amax 127 makes the Q8_0 scale factor exactly 1, so these halves are rounding ties.
    for (int64_t j = 64; j < 96; ++j) x[j] = (j % 2 ? -1.0f : 1.0f) * (0.5f + static_cast<float>(j % 7));
    x[64] = -127.0f;
  }
  return x;
}

// w (n_rows rows of n values, row_bytes apart) packed by pk into 64-byte aligned memory, as the
// CPU backend allocates packed matrices.
struct AlignedPacked {
  std::vector<uint8_t> storage;
  uint8_t* data = nullptr;
};
inline AlignedPacked PackAligned(const cpu::PackedKernels& pk, const std::vector<uint8_t>& w, int64_t row_bytes,
                                 int64_t n_rows, int64_t n) {
  AlignedPacked p;
  p.storage.resize(static_cast<size_t>(pk.bytes(n_rows, n) + 64));
  p.data = p.storage.data() + (64 - reinterpret_cast<uintptr_t>(p.storage.data()) % 64) % 64;
  pk.pack(w.data(), row_bytes, n_rows, n, p.data);
  return p;
}

}  // namespace kvfs::testing
