// Shared pieces of the AVX2 kernel files (kernels_avx2*.cpp, compiled with -mavx2 -mfma
// -mf16c). Include ONLY from those files: every helper has internal linkage so the linker can
// never pick an AVX2 copy of an inline function for a portable caller, and no std:: function
// template is called at run time.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/backend/cpu/kernels.h"
#include "engine/model/quant_blocks.h"

namespace kvfs::cpu::avx2 {

void QuantizeQ8_0(const float* x, void* dst, int64_t n);
void QuantizeQ8_1(const float* x, void* dst, int64_t n);
void QuantizeQ8_K(const float* x, void* dst, int64_t n);

float VecDotQ4_0(const void* w, const void* a, int64_t n);
float VecDotQ4_1(const void* w, const void* a, int64_t n);
float VecDotQ5_0(const void* w, const void* a, int64_t n);
float VecDotQ5_1(const void* w, const void* a, int64_t n);
float VecDotQ8_0(const void* w, const void* a, int64_t n);
float VecDotQ4_K(const void* w, const void* a, int64_t n);
float VecDotQ5_K(const void* w, const void* a, int64_t n);
float VecDotQ6_K(const void* w, const void* a, int64_t n);

// Prefill tiles: bound to template instantiations in the ISA's own files (function pointers,
// so no AVX-compiled symbol with vague linkage is ever shared with portable code).
extern const MatMulTileFn TileQ4_0, TileQ4_1, TileQ5_0, TileQ5_1, TileQ8_0, TileQ4_K, TileQ5_K, TileQ6_K;
// The 32-value block formats in groups of 8 interleaved rows (kernels_avx2_packed.cpp).
extern const PackedKernels PackedQ4_0, PackedQ4_1, PackedQ5_0, PackedQ5_1, PackedQ8_0;
// Q4_K, Q5_K and Q6_K in groups of 8 interleaved rows (kernels_avx2_packed_kquants.cpp).
extern const PackedKernels PackedQ4_K, PackedQ5_K, PackedQ6_K;

}  // namespace kvfs::cpu::avx2

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline __m256i LoadU256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i LoadU128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// Pairwise tree over 8 lanes (l += l+4, l += l+2, l += l+1), the tail of the scalar F32 order.
inline float HSum8(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline int32_t HSumI32x8(__m256i v) {
  __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4E));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1));
  return _mm_cvtsi128_si32(q);
}

// The K-quant super-block formats and their bytes.
enum class KFmt { kQ4K, kQ5K, kQ6K };
template <KFmt F>
constexpr int kBlockBytes = F == KFmt::kQ4K ? 144 : F == KFmt::kQ5K ? 176 : 210;

// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K super-block (the 12-byte packing of
// quant_blocks.h), unpacked 4 at a time with 32-bit masks.
inline void UnpackScalesMins(const uint8_t* scales12, uint8_t (&sc)[8], uint8_t (&m)[8]) {
  uint32_t u[4];
  std::memcpy(u, scales12, 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t m_lo = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = m_lo;
  u[0] &= kLow6;
  std::memcpy(sc, u, 8);
  std::memcpy(m, u + 2, 8);
}

// sum over pairs of u8 x s8 products -> 8 int32 lanes (maddubs then madd with ones; the int16
// pair sums cannot saturate for codes below 128 against activations in -127..127).
inline __m256i DotU8S8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// The same for signed x signed: |w| against a with w's sign.
inline __m256i DotS8S8(__m256i w, __m256i a) { return DotU8S8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)); }

}  // namespace
}  // namespace kvfs::cpu
