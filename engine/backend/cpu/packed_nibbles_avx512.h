// The nibble formats' packed groups (packed_nibble_layout.h: Q4_0, Q4_1, Q5_0, Q5_1) as
// unsigned codes on zmm, for the AVX-512 packed kernels (kernels_avx512_packed.cpp) and the amx
// table's prompts (kernels_amx.cpp). Same rules as kernels_avx512_common.h: include only from
// files compiled with the AVX-512 flags; internal linkage.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "engine/backend/cpu/packed_nibble_layout.h"

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

// The codes of chunks 0..3 of block b: the nibbles, with the fifth bits where the format has
// them (chunk k's by one dword shift each).
template <class L>
inline void NibbleChunks(const uint8_t* group, int64_t b, __m512i (&lo)[4], __m512i (&hi)[4]) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const uint8_t* codes = L::CodesOf(group, b);
  for (int k = 0; k < 4; ++k) {
    const __m512i v = _mm512_load_si512(codes + 64 * k);
    lo[k] = _mm512_and_si512(v, nibble);
    hi[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
  }
  if constexpr (L::kHasBits) {
    const __m512i bits = _mm512_load_si512(L::BitsOf(group, b)), bit4 = _mm512_set1_epi8(0x10);
    for (int k = 0; k < 4; ++k) {
      lo[k] = _mm512_or_si512(lo[k], _mm512_and_si512(_mm512_srli_epi32(bits, k), bit4));
      hi[k] = _mm512_or_si512(hi[k], _mm512_and_si512(_mm512_slli_epi32(bits, 4 - k), bit4));
    }
  }
}

// The 16 rows' f16 scales (or minimums) at p as floats.
inline __m512 HalvesToFloats(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))); }

}  // namespace
}  // namespace kvfs::cpu
