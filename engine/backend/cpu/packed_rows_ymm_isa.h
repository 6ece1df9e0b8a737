// The ymm Isa of packed_rows_kernel.h (8 rows per group, one dword lane per row), shared by two
// tables compiled with different flags: the AVX2 table (kernels_avx2_packed.cpp: AVX2 + FMA +
// F16C, a block's byte products through vpmaddubsw into int16, then vpmaddwd) and the avxvnni
// table (kernels_avxvnni_packed.cpp: plus AVX-VNNI, one vpdpbusd instead). The integer sums are
// exact either way and the float steps are the same, so both give a row the same bits.
//
// Include only from the ISA kernel files, like packed_rows_kernel.h: internal linkage, compiled
// with the including file's flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if defined(__AVXVNNI__)
#define KVFS_PACKED_YMM_VNNI 1
#else
#define KVFS_PACKED_YMM_VNNI 0
#endif

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

struct YmmIsa {
  static constexpr int kRows = 8;
  // The 16 ymm registers hold 4 tokens' int16 sums and float accumulators with the codes; 5 or
  // more spill (8 tokens in one pass measured 3.04 ms against 2 x 1.20 for two passes of 4,
  // `bench_kernels packed_decode_tile*`, 5632 x 2048, one thread).
  static constexpr int kPassTokens = 4;
  using I = __m256i;
  using F = __m256;
  static constexpr bool kDotBytes = KVFS_PACKED_YMM_VNNI;
#if KVFS_PACKED_YMM_VNNI
  static I DotBytes(I acc, I u8, I s8) { return _mm256_dpbusd_avx_epi32(acc, u8, s8); }
#endif

  static I Load(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static I LowNibbles(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I HighNibbles(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static I Broadcast32(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
  }
  static I MulAddPairs(I codes, I act) { return _mm256_maddubs_epi16(codes, act); }
  static I Add16(I a, I b) { return _mm256_add_epi16(a, b); }
  static void KeepChain(I& v) { asm("" : "+x"(v)); }
  static I BlockSums(I sum16, int32_t init) { return Add32(Widen(sum16), Set32(init)); }
  static I Abs8(I w) { return _mm256_abs_epi8(w); }
  static I SignOf(I a, I w) { return _mm256_sign_epi8(a, w); }
  static I Widen(I p) { return _mm256_madd_epi16(p, _mm256_set1_epi16(1)); }
  static I Add32(I a, I b) { return _mm256_add_epi32(a, b); }
  static I Set32(int32_t v) { return _mm256_set1_epi32(v); }
  static I ShiftRight32(I v, int n) { return _mm256_srli_epi32(v, n); }
  static I ShiftLeft32(I v, int n) { return _mm256_slli_epi32(v, n); }
  static I WithBit4(I codes, I bits) { return _mm256_or_si256(codes, _mm256_and_si256(bits, _mm256_set1_epi8(0x10))); }
  static F Scales(const uint8_t* p) { return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p))); }
  static F FmaScaled(I isum, F dw, float da, F acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(da)), acc);
  }
  static F FmaBroadcast(F w, float s, F acc) { return _mm256_fmadd_ps(w, _mm256_set1_ps(s), acc); }
  static F LoadF(const float* p) { return _mm256_load_ps(p); }
  static void StoreF(float* p, F v) { _mm256_store_ps(p, v); }
  static void StoreFU(float* p, F v) { _mm256_storeu_ps(p, v); }
};

}  // namespace
}  // namespace kvfs::cpu
