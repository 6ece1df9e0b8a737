// The AVX2 attention ISA (8 float lanes, 16 registers) of the attention_simd_*.h templates,
// shared by two tables compiled with different flags: attention_avx2.cpp (AVX2 + FMA + F16C: the
// int8 dot products of q4 keys and values through vpmaddubsw + vpmaddwd) and
// attention_avxvnni.cpp (plus AVX-VNNI: one vpdpbusd). Everything else is the same code, and the
// integer sums are exact either way, so both give the same results.
//
// Include inside the including file's anonymous namespace (internal linkage, compiled with
// that file's flags), after attention_x86_shared.h, like attention_simd_impl.h.
#pragma once

#if defined(__AVXVNNI__)
#define KVFS_ATTN_AVX_VNNI 1
#else
#define KVFS_ATTN_AVX_VNNI 0
#endif

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
    if (n == 8) Store(p, v);
    else _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), v);
  }
  static V Bcast(float x) { return _mm256_set1_ps(x); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static bool AnyNegative(V x) { return _mm256_movemask_ps(_mm256_cmp_ps(x, Zero(), _CMP_LT_OQ)) != 0; }
  static __m256i Mask(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  // The first n lanes (n <= 8) of p, zeros after; never reads past p + n.
  static V LoadN(const float* p, int n) { return n == 8 ? Load(p) : _mm256_maskload_ps(p, Mask(n)); }
  // Lanes < n from a, the others from b.
  static V Select(int n, V a, V b) { return n == 8 ? a : _mm256_blendv_ps(b, a, _mm256_castsi256_ps(Mask(n))); }
  static float ReduceMax(V v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  // lanes[l] += lanes[l + w] for w = 8, 4, 2, 1 over a chunk of 16 held in e[0], e[1]
  // (cpu::Softmax's order); returns lanes[0].
  static float PairwiseSum16(const V* e) {
    const __m256 a = _mm256_add_ps(e[0], e[1]);
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
  }
  // One Hadamard stage of span len (1, 2, 4) inside the vector: lane i gets x[i] + x[i + len]
  // where bit len of i is clear, x[i - len] - x[i] where it is set.
  static V Butterfly(V x, int len) {
    switch (len) {
      case 1: {
        const V p = _mm256_permute_ps(x, 0xB1);
        return _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xAA);
      }
      case 2: {
        const V p = _mm256_permute_ps(x, 0x4E);
        return _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xCC);
      }
      default: {
        const V p = _mm256_permute2f128_ps(x, x, 0x01);
        return _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xF0);
      }
    }
  }
  // Integer path (DotRowsQ8): 8 lanes of int32, a panel of 8 rows, one block in registers.
  using IV = __m256i;
  static constexpr int kQ8Blocks = 1;
  static IV ZeroI() { return _mm256_setzero_si256(); }
  static IV SetI(int32_t x) { return _mm256_set1_epi32(x); }
  static IV AddI(IV a, IV b) { return _mm256_add_epi32(a, b); }
  static V CvtI(IV x) { return _mm256_cvtepi32_ps(x); }
#if KVFS_ATTN_AVX_VNNI
  static IV DotU8S8(IV acc, IV u8, IV s8) { return _mm256_dpbusd_avx_epi32(acc, u8, s8); }
#else
  // No VNNI: pairs of u8 x s8 products into int16 (|2 * 15 * 127| and |2 * 127 * 8| cannot
  // saturate), then pairs of those into int32.
  static IV DotU8S8(IV acc, IV u8, IV s8) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
  }
#endif
  static IV LowNibbles(IV x) { return _mm256_and_si256(x, _mm256_set1_epi8(0x0F)); }
  static IV HighNibbles(IV x) { return _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0F)); }
  // 4-bit codes 0..15 as signed bytes c - 8.
  static IV CentreCodes(IV x) { return _mm256_sub_epi8(x, _mm256_set1_epi8(8)); }
  // out[k] lane r = dword k of the 16 bytes at p + row_off[r].
  static void LoadRowDwords(const uint8_t* p, const int32_t* row_off, IV out[4]) {
    auto row = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + row_off[r])); };
    IV z[4];  // z[j], 128-bit lane b: row 4b + j
    for (int j = 0; j < 4; ++j) z[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(row(j)), row(4 + j), 1);
    const IV a = _mm256_unpacklo_epi32(z[0], z[1]), b = _mm256_unpackhi_epi32(z[0], z[1]);
    const IV c = _mm256_unpacklo_epi32(z[2], z[3]), d = _mm256_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm256_unpacklo_epi64(a, c);
    out[1] = _mm256_unpackhi_epi64(a, c);
    out[2] = _mm256_unpacklo_epi64(b, d);
    out[3] = _mm256_unpackhi_epi64(b, d);
  }
  static IV LoadOffsets(const int32_t* row_off) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_off)); }
  // Lane r: the dword at p + offsets[r].
  static IV GatherDwords(const uint8_t* p, IV offsets) {
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), offsets, 1);
  }
  // The low (high) halves of the 8 dwords, as floats: bytes of each 128-bit lane regrouped
  // (low halves first), then the 64-bit quarters put in order.
  static __m256i SplitHalves(IV x) {
    const IV bytes = _mm256_shuffle_epi8(
        x, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10,
                            11, 14, 15));
    return _mm256_permute4x64_epi64(bytes, 0xD8);
  }
  static V HalvesLow(IV x) { return _mm256_cvtph_ps(_mm256_castsi256_si128(SplitHalves(x))); }
  static V HalvesHigh(IV x) { return _mm256_cvtph_ps(_mm256_extracti128_si256(SplitHalves(x), 1)); }
  static void BcastDwords4(const int8_t* p, IV out[4]) {
    const IV x = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    out[0] = _mm256_shuffle_epi32(x, 0x00);
    out[1] = _mm256_shuffle_epi32(x, 0x55);
    out[2] = _mm256_shuffle_epi32(x, 0xAA);
    out[3] = _mm256_shuffle_epi32(x, 0xFF);
  }
  // q4k V rows with sub-blocks of 16: one quad (4 sub-blocks, 64 values) decoded at once, the
  // same operations as DecodeChunkQ4k per sub-block (d = D * sc, m = M * mn, value m + d * q).
  static constexpr bool kQ4kQuads = true;
  static void DecodeQuadQ4k(const uint8_t* fields, float D, float M, float* out) {
    const Q4kQuad quad = UnpackQ4kQuad(fields, D, M);
    const __m256 d = _mm256_castps128_ps256(quad.d), m = _mm256_castps128_ps256(quad.m);
    for (int k = 0; k < 4; ++k) {
      const __m256i lane = _mm256_set1_epi32(k);
      const V dk = _mm256_permutevar8x32_ps(d, lane), mk = _mm256_permutevar8x32_ps(m, lane);
      const V q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(quad.q[k]));
      const V q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(quad.q[k], 8)));
      Store(out + 16 * k, Add(mk, Mul(dk, q0)));
      Store(out + 16 * k + 8, Add(mk, Mul(dk, q1)));
    }
  }

  // q4 values (AxpyRowsQ8): one query x one block of 32 values = 4 integer and 4 float accumulators.
  static constexpr int kAxpyQ8Queries = 1;
  static constexpr int kAxpyQ8Blocks = 1;
  // out[n] lane k = byte 8n + k of the 16 bytes at r[0], r[1], r[2], r[3] (in that byte order).
  static void InterleaveRows4(const uint8_t* const r[4], IV out[2]) {
    auto row = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[j])); };
    __m128i q[4];
    InterleaveBytes4(row(0), row(1), row(2), row(3), q);
    out[0] = _mm256_set_m128i(q[1], q[0]);
    out[1] = _mm256_set_m128i(q[3], q[2]);
  }
  // Every lane: the 4 bytes at p.
  static IV BcastDword(const int8_t* p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm256_set1_epi32(x);
  }
  // DotU8S8 against the dword at p in every lane.
  static IV DotU8S8Dword(IV acc, IV u8, const int8_t* p) { return DotU8S8(acc, u8, BcastDword(p)); }
  // (first, second) = lo[0], hi[0], lo[1], hi[1], ..., lo[7], hi[7].
  static void InterleaveLanes(V lo, V hi, V* first, V* second) {
    const V a = _mm256_unpacklo_ps(lo, hi), b = _mm256_unpackhi_ps(lo, hi);  // per 128-bit lane
    *first = _mm256_permute2f128_ps(a, b, 0x20);
    *second = _mm256_permute2f128_ps(a, b, 0x31);
  }

  static V Abs(V x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
  static IV CvtRound(V x) { return _mm256_cvtps_epi32(x); }  // MXCSR: half to even
  static IV ClampI127(IV x) { return _mm256_max_epi32(_mm256_min_epi32(x, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127)); }
  static void StoreI8(int8_t* p, IV x) {  // values in [-127, 127]: the packs do not saturate
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
  }
  static int32_t ReduceAddI(IV x) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
  }
  // q4k K records (channel-major, 2 tokens per byte): lane t = the codes of token t of the 4
  // channels at p, p + record, p + 2 record, p + 3 record (4 code bytes = 8 tokens each).
  static IV ChannelQuad(const uint8_t* p, int64_t record) {
    auto codes = [&](int j) {
      int32_t v;
      std::memcpy(&v, p + j * record, 4);
      return v;
    };
    const __m128i x = _mm_setr_epi32(codes(0), codes(1), codes(2), codes(3));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(x, mask), hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
    // Channels 0 and 1 (2 and 3), 8 tokens each in order; then pairs (channel 0 token t, channel 1
    // token t); then the pairs of both halves interleaved: dword t = channels 0..3 of token t.
    const __m128i pairs = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    const __m128i a = _mm_shuffle_epi8(_mm_unpacklo_epi8(lo, hi), pairs);
    const __m128i b = _mm_shuffle_epi8(_mm_unpackhi_epi8(lo, hi), pairs);
    return _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
  }
  static V RoundF16(V x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
  // 2^k as a float, for -126 <= k <= 127.
  static V Pow2(__m256i k) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23)); }
  // cpu::ExpPoly lane by lane, with the same fused and unfused operations in the same order.
  // ldexp(j, n) is j * 2^n, one rounding, when 2^n is a normal float; beyond that range it is
  // done in two steps whose first is exact (j * 2^(n -+ 100) stays normal), so still one rounding.
  static V Exp(V x) {
    const V shift = Bcast(0x1.8p23f);
    const V z = _mm256_fmadd_ps(x, Bcast(0x1.715476p+0f), shift);
    const V n = _mm256_sub_ps(z, shift);
    const V b = _mm256_fnmadd_ps(n, Bcast(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, Bcast(0x1.62e4p-1f), x));
    const V u = _mm256_mul_ps(b, b);
    const V j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(Bcast(0x1.0e4020p-7f), b, Bcast(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(Bcast(0x1.555e66p-3f), b, Bcast(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(Bcast(0x1.ffffecp-1f), b, Bcast(1.0f)));
    // |n| > 192 is settled below; clamp first so the integer conversion stays in range.
    const V nc = _mm256_min_ps(_mm256_max_ps(n, Bcast(-192.0f)), Bcast(192.0f));
    const __m256i k = _mm256_cvtps_epi32(nc);  // exact: nc is an integer
    V r = _mm256_mul_ps(j, Pow2(k));
    const __m256i low = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), k);
    const __m256i high = _mm256_cmpgt_epi32(k, _mm256_set1_epi32(127));
    if (!_mm256_testz_si256(_mm256_or_si256(low, high), _mm256_or_si256(low, high))) {
      const V r_low = _mm256_mul_ps(_mm256_mul_ps(j, Pow2(_mm256_add_epi32(k, _mm256_set1_epi32(100)))), Bcast(0x1p-100f));
      const V r_high = _mm256_mul_ps(_mm256_mul_ps(j, Pow2(_mm256_sub_epi32(k, _mm256_set1_epi32(100)))), Bcast(0x1p100f));
      r = _mm256_blendv_ps(r, r_low, _mm256_castsi256_ps(low));
      r = _mm256_blendv_ps(r, r_high, _mm256_castsi256_ps(high));
    }
    const V big = _mm256_cmp_ps(_mm256_andnot_ps(Bcast(-0.0f), n), Bcast(192.0f), _CMP_GT_OQ);
    if (_mm256_movemask_ps(big) != 0) {
      const V inf_or_zero = _mm256_and_ps(_mm256_cmp_ps(n, Zero(), _CMP_GT_OQ), Bcast(__builtin_inff()));
      r = _mm256_blendv_ps(r, inf_or_zero, big);
    }
    return r;
  }

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
