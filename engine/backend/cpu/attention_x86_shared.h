// Helpers the AVX2 and AVX-512 attention tables share, written with the 128- and 256-bit
// operations both have: q4k V quads (kv_format.h: 5 field bytes, then 4 sub-blocks of 8 code
// bytes) and the byte interleave of 4 rows. Included by those files only, inside their anonymous
// namespace: each copy is compiled with its file's ISA flags and has internal linkage (see
// attention_simd_impl.h).
#pragma once

// One quad of a row: lane k of d and m is sub-block k's d = D * sc and m = M * mn (the
// operations of DecodeChunkQ4k), q[k] its 16 codes in value order.
struct Q4kQuad {
  __m128 d, m;
  __m128i q[4];
};

inline Q4kQuad UnpackQ4kQuad(const uint8_t* fields, float D, float M) {
  uint64_t bits;
  std::memcpy(&bits, fields, 8);  // the 5 field bytes (the quad's codes follow within the row)
  const __m256i f64 = _mm256_and_si256(
      _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(bits)), _mm256_setr_epi64x(0, 10, 20, 30)),
      _mm256_set1_epi64x(0x3FF));
  const __m128i f = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(f64, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
  Q4kQuad out;
  out.d = _mm_mul_ps(_mm_set1_ps(D), _mm_cvtepi32_ps(_mm_and_si128(f, _mm_set1_epi32(31))));
  out.m = _mm_mul_ps(_mm_set1_ps(M), _mm_cvtepi32_ps(_mm_sub_epi32(_mm_srli_epi32(f, 5), _mm_set1_epi32(15))));
  // Sub-block k's 8 code bytes are bytes 8k..8k+7; value 2i is byte i's low nibble.
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(fields + 5));
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(x, nib), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
  const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);  // (0 | 2), (1 | 3)
  out.q[0] = _mm256_castsi256_si128(a);
  out.q[1] = _mm256_castsi256_si128(b);
  out.q[2] = _mm256_extracti128_si256(a, 1);
  out.q[3] = _mm256_extracti128_si256(b, 1);
  return out;
}

// Byte t of a, b, c, d (t = 0..15) as dword t of the four quarters in order: quarter k holds
// dwords 4k..4k+3. Byte and word unpacks, for tables without VBMI's vpermb.
inline void InterleaveBytes4(__m128i a, __m128i b, __m128i c, __m128i d, __m128i quarters[4]) {
  const __m128i ab_lo = _mm_unpacklo_epi8(a, b), cd_lo = _mm_unpacklo_epi8(c, d);  // bytes 0..7
  const __m128i ab_hi = _mm_unpackhi_epi8(a, b), cd_hi = _mm_unpackhi_epi8(c, d);  // bytes 8..15
  quarters[0] = _mm_unpacklo_epi16(ab_lo, cd_lo);
  quarters[1] = _mm_unpackhi_epi16(ab_lo, cd_lo);
  quarters[2] = _mm_unpacklo_epi16(ab_hi, cd_hi);
  quarters[3] = _mm_unpackhi_epi16(ab_hi, cd_hi);
}
