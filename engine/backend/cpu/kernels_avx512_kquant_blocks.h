// The K-quant super-block formats (Q4_K, Q5_K, Q6_K) and their Q8_K activations as the AVX-512
// kernels read them: shared by kernels_avx512_kquants.cpp and the AMX table's
// kernels_amx_kquants.cpp. Include only from files compiled with the AVX-512 flags; internal
// linkage, as kernels_avx512_common.h explains.
#pragma once

#include "engine/backend/cpu/kernels_avx512_common.h"

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

constexpr int kQ8KBytes = 292;  // float d, int8 qs[256], int16 bsums[16]
constexpr int kQ8KQs = 4;
constexpr int kQ8KSums = 260;

enum class KFmt { kQ4K, kQ5K, kQ6K };
template <KFmt F>
constexpr int kBlockBytes = F == KFmt::kQ4K ? 144 : F == KFmt::kQ5K ? 176 : 210;

// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block as bytes sc[0..7], m[0..7] (the 12-byte
// packing of quant_blocks.h, unpacked 4 at a time with 32-bit masks).
inline __m128i UnpackScalesMins(const uint8_t* scales12) {
  uint32_t u[4];
  std::memcpy(u, scales12, 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);  // m[4..7]
  const uint32_t m_lo = u[1] & kLow6;                             // m[0..3]
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);           // sc[4..7]
  u[2] = m_lo;
  u[0] &= kLow6;  // sc[0..3]
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
}

// The 32 codes of group s (0..7) of one block, unsigned, in element order.
template <KFmt F>
inline __m256i KGroupCodes(const uint8_t* b, int s) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (F == KFmt::kQ6K) {
    const int h = s / 4, q = s % 4;
    const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (q % 2)));
    const __m256i nib = q < 2 ? _mm256_and_si256(l, low4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), low4);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * q)), _mm256_set1_epi8(3));
    return _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));
  } else {
    constexpr int kQs = F == KFmt::kQ4K ? 16 : 48;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kQs + 32 * (s / 2)));
    __m256i code = s % 2 == 0 ? _mm256_and_si256(q, low4) : _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    if constexpr (F == KFmt::kQ5K) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      code = _mm256_mask_add_epi8(code, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1u << s))), code,
                                  _mm256_set1_epi8(16));
    }
    return code;
  }
}

}  // namespace
}  // namespace kvfs::cpu
