// AVX2 + FMA + F16C attention kernels: 8 lanes, 16 registers. Compiled with those flags
// (engine/CMakeLists.txt); reached only through AttentionKernelsFor after a cpuid check.
// Everything but the table accessor has internal linkage (see attention_simd_impl.h).
#include "engine/backend/cpu/attention.h"

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvfs::cpu {
namespace {

struct Avx2 {
  static constexpr int W = 8;
  // Register tiles: dot 2 panels x 6 queries = 12 accumulators + 2 K vectors + 1 broadcast;
  // axpy 2 chunks (16 values) x 6 queries = 12 accumulators + 2 V vectors + 1 broadcast.
  static constexpr int kDotQ = 6;
  static constexpr int kAxpyQ = 6;
  static constexpr int kAxpyC = 2;
  using V = __m256;

  static V Zero() { return _mm256_setzero_ps(); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void StoreN(float* p, V v, int n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane), v);
  }
  static V Bcast(float x) { return _mm256_set1_ps(x); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }

  static V LoadF16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V LoadI8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // 8 4-bit codes from 4 bytes: value 2i is the low nibble of byte i, 2i+1 the high one.
  static V LoadU4(const uint8_t* p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    const __m128i b = _mm_cvtsi32_si128(x);
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
  }

  // In-register 8x8 transpose: r[j] becomes column j (24 shuffles).
  static void Transpose(V r[8]) {
    V t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + k]: in 128-bit lane L, rows 4g..4g+3 of column 4L + k.
    for (int g = 0; g < 2; ++g) {
      u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
      u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
      r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
      r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
  }
};

#include "engine/backend/cpu/attention_simd_impl.h"

constexpr AttentionKernels kAvx2Table{"avx2", &detail::DotRowsAny<Avx2>, &detail::AxpyRowsAny<Avx2>};

}  // namespace

const AttentionKernels& Avx2AttentionKernels() { return kAvx2Table; }

}  // namespace kvfs::cpu

#endif  // x86-64
