// The sum of a Q8_0/Q8_1 activation block's 32 int8 codes, which the Q4_0 / Q4_1 kernels fold
// in once per (block, token) instead of offsetting every weight code. AVX2 instructions: include
// only from the ISA kernel files (AVX2 or AVX-512 flags), at file scope; internal linkage.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

// sad of (a xor 0x80) = sum(a + 128), minus 32 * 128.
inline int32_t SumCodes32(const uint8_t* codes) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(a, _mm256_set1_epi8(static_cast<char>(0x80))), _mm256_setzero_si256());
  const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return static_cast<int32_t>(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 32 * 128);
}

}  // namespace
}  // namespace kvfs::cpu
