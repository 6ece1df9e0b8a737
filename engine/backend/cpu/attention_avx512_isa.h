// The AVX-512 attention ISA (16 float lanes, 32 registers) of the attention_simd_*.h templates,
// shared by two tables compiled with different flags: attention_avx512.cpp (F/BW/VL/DQ + VNNI +
// VBMI: vpdpbusd, vpermb) and attention_avx512bw.cpp (F/BW/VL/DQ only, for CPUs such as
// Skylake-SP: the int8 dot products through vpmaddubsw + vpmaddwd and the byte interleaves
// through unpacks, as the AVX2 table makes them). Everything else is the same code, so both
// give the same results wherever the integer sums are exact (all of them).
//
// Include inside the including file's anonymous namespace (internal linkage, compiled with
// that file's flags), after attention_x86_shared.h, like attention_simd_impl.h.
#pragma once

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define KVFS_ATTN_AVX512_VNNI 1
#include "engine/backend/cpu/dpbusd_broadcast.h"
#else
#define KVFS_ATTN_AVX512_VNNI 0
#endif

struct Avx512 {
  static constexpr int W = 16;
  // Register tiles: dot 2 panels x 12 queries = 24 accumulators + 2 K vectors; axpy 4 chunks
  // (64 values) x 6 queries = 24 accumulators + 4 V vectors + 1 broadcast: all within 32.
  static constexpr int kDotQ = 12;
  static constexpr int kAxpyQ = 6;
  static constexpr int kAxpyC = 4;
  using V = __m512;

  static V Zero() { return _mm512_setzero_ps(); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void StoreN(float* p, V v, int n) {
    if (n == 16) Store(p, v);
    else _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
  }
  static V Bcast(float x) { return _mm512_set1_ps(x); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Min(V a, V b) { return _mm512_min_ps(a, b); }
  static bool AnyNegative(V x) { return _mm512_cmp_ps_mask(x, Zero(), _CMP_LT_OQ) != 0; }
  static __mmask16 Mask(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  // The first n lanes (n <= 16) of p, zeros after; never reads past p + n.
  static V LoadN(const float* p, int n) { return n == 16 ? Load(p) : _mm512_maskz_loadu_ps(Mask(n), p); }
  // Lanes < n from a, the others from b.
  static V Select(int n, V a, V b) { return n == 16 ? a : _mm512_mask_mov_ps(b, Mask(n), a); }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
  // lanes[l] += lanes[l + w] for w = 8, 4, 2, 1 (cpu::Softmax's order); returns lanes[0].
  static float PairwiseSum16(const V* e) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(e[0]), _mm512_extractf32x8_ps(e[0], 1));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
  }
  // PairwiseSum16 of 16 vectors at once (the same additions, so the same bits): sums[k] = that
  // of e[k]. Each level adds the upper half of every vector's active lanes to the lower half,
  // packing two vectors' results into one, so 16 reductions cost 15 adds and 30 shuffles
  // instead of 64 dependent steps.
  static void PairwiseSums16x16(const V* e, float* sums) {
    V a[8], b[4], c[2];
    for (int k = 0; k < 8; ++k) {  // lanes[l] += lanes[l + 8]: [e_2k | e_2k+1] halves
      a[k] = _mm512_add_ps(_mm512_shuffle_f32x4(e[2 * k], e[2 * k + 1], 0x44),
                           _mm512_shuffle_f32x4(e[2 * k], e[2 * k + 1], 0xEE));
    }
    for (int k = 0; k < 4; ++k) {  // += lanes[l + 4]: 128-bit lane j of b[k] is vector 4k + j
      b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x88),
                           _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xDD));
    }
    for (int k = 0; k < 2; ++k) {  // += lanes[l + 2]: lane j holds vectors 8k + j, 8k + 4 + j
      c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44),
                           _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
    }
    // += lanes[l + 1]: element i of 128-bit lane j is the sum of vector 4i + j.
    const V d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(sums, _mm512_permutexvar_ps(order, d));
  }
  // One Hadamard stage of span len (1, 2, 4, 8) inside the vector: lane i gets x[i] + x[i + len]
  // where bit len of i is clear, x[i - len] - x[i] where it is set.
  static V Butterfly(V x, int len) {
    V p;
    __mmask16 hi;
    switch (len) {
      case 1: p = _mm512_permute_ps(x, 0xB1); hi = 0xAAAA; break;
      case 2: p = _mm512_permute_ps(x, 0x4E); hi = 0xCCCC; break;
      case 4: p = _mm512_shuffle_f32x4(x, x, 0xB1); hi = 0xF0F0; break;
      default: p = _mm512_shuffle_f32x4(x, x, 0x4E); hi = 0xFF00; break;
    }
    return _mm512_mask_sub_ps(_mm512_add_ps(x, p), hi, p, x);
  }
  static V RoundF16(V x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
  // cpu::ExpPoly lane by lane, with the same fused and unfused operations in the same order;
  // scalef is ldexp (one rounding, subnormal results included).
  static V Exp(V x) {
    const V shift = Bcast(0x1.8p23f);
    const V z = _mm512_fmadd_ps(x, Bcast(0x1.715476p+0f), shift);
    const V n = _mm512_sub_ps(z, shift);
    const V b = _mm512_fnmadd_ps(n, Bcast(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, Bcast(0x1.62e4p-1f), x));
    const V u = _mm512_mul_ps(b, b);
    const V j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(Bcast(0x1.0e4020p-7f), b, Bcast(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(Bcast(0x1.555e66p-3f), b, Bcast(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(Bcast(0x1.ffffecp-1f), b, Bcast(1.0f)));
    V r = _mm512_scalef_ps(j, n);
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), Bcast(192.0f), _CMP_GT_OQ);
    if (big != 0) {
      const __mmask16 pos = _mm512_cmp_ps_mask(n, Zero(), _CMP_GT_OQ);
      r = _mm512_mask_mov_ps(r, big, _mm512_mask_mov_ps(Zero(), pos, Bcast(__builtin_inff())));
    }
    return r;
  }

  static V LoadF16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V LoadI8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // 16 4-bit codes from 8 bytes: value 2i is the low nibble of byte i, 2i+1 the high one.
  static V LoadU4(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
  }

  // q4k V rows with sub-blocks of 16: one quad (4 sub-blocks, 64 values) decoded at once, the
  // same operations as DecodeChunkQ4k per sub-block (d = D * sc, m = M * mn, value m + d * q),
  // with the 4 fields and the 32 code bytes unpacked as vectors instead of one sub-block at a time.
  static constexpr bool kQ4kQuads = true;
  static void DecodeQuadQ4k(const uint8_t* fields, float D, float M, float* out) {
    const Q4kQuad quad = UnpackQ4kQuad(fields, D, M);
    const __m512 d = _mm512_castps128_ps512(quad.d), m = _mm512_castps128_ps512(quad.m);
    for (int k = 0; k < 4; ++k) {
      const __m512i lane = _mm512_set1_epi32(k);
      const V qf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(quad.q[k]));
      Store(out + 16 * k, Add(_mm512_permutexvar_ps(lane, m), Mul(_mm512_permutexvar_ps(lane, d), qf)));
    }
  }

  // Integer path (DotRowsQ8): 16 lanes of int32, a panel of 16 rows, two blocks in registers.
  using IV = __m512i;
  static constexpr int kQ8Blocks = 2;
  static IV ZeroI() { return _mm512_setzero_si512(); }
  static IV SetI(int32_t x) { return _mm512_set1_epi32(x); }
  static IV AddI(IV a, IV b) { return _mm512_add_epi32(a, b); }
  static V CvtI(IV x) { return _mm512_cvtepi32_ps(x); }
#if KVFS_ATTN_AVX512_VNNI
  static IV DotU8S8(IV acc, IV u8, IV s8) { return _mm512_dpbusd_epi32(acc, u8, s8); }
  // DotU8S8 against the dword at p in every lane, the broadcast embedded in the instruction
  // (dpbusd_broadcast.h). Decode steps of 8 agents 0.3-0.9% faster.
  static IV DotU8S8Dword(IV acc, IV u8, const int8_t* p) { return DpbusdBroadcast(acc, u8, p); }
#else
  // No VNNI: pairs of u8 x s8 products into int16 (|2 * 15 * 127| and |2 * 127 * 8| cannot
  // saturate, as in the AVX2 table), then pairs of those into int32.
  static IV DotU8S8(IV acc, IV u8, IV s8) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u8, s8), _mm512_set1_epi16(1)));
  }
  static IV DotU8S8Dword(IV acc, IV u8, const int8_t* p) { return DotU8S8(acc, u8, BcastDword(p)); }
#endif
  static IV LowNibbles(IV x) { return _mm512_and_si512(x, _mm512_set1_epi8(0x0F)); }
  static IV HighNibbles(IV x) { return _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0F)); }
  // 4-bit codes 0..15 as signed bytes c - 8.
  static IV CentreCodes(IV x) { return _mm512_sub_epi8(x, _mm512_set1_epi8(8)); }
  // out[k] lane r = dword k of the 16 bytes at p + row_off[r].
  static void LoadRowDwords(const uint8_t* p, const int32_t* row_off, IV out[4]) {
    auto row = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + row_off[r])); };
    IV z[4];  // z[j], 128-bit lane b: row 4b + j
    for (int j = 0; j < 4; ++j) {
      z[j] = _mm512_inserti32x4(_mm512_castsi128_si512(row(j)), row(4 + j), 1);
      z[j] = _mm512_inserti32x4(z[j], row(8 + j), 2);
      z[j] = _mm512_inserti32x4(z[j], row(12 + j), 3);
    }
    // A 4x4 dword transpose inside every 128-bit lane: lane (b, j) of out[k] = dword k of z[j]'s lane b.
    const IV a = _mm512_unpacklo_epi32(z[0], z[1]), b = _mm512_unpackhi_epi32(z[0], z[1]);
    const IV c = _mm512_unpacklo_epi32(z[2], z[3]), d = _mm512_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm512_unpacklo_epi64(a, c);
    out[1] = _mm512_unpackhi_epi64(a, c);
    out[2] = _mm512_unpacklo_epi64(b, d);
    out[3] = _mm512_unpackhi_epi64(b, d);
  }
  static IV LoadOffsets(const int32_t* row_off) { return _mm512_loadu_si512(row_off); }
  // Lane r: the dword at p + offsets[r].
  static IV GatherDwords(const uint8_t* p, IV offsets) { return _mm512_i32gather_epi32(offsets, p, 1); }
  static V HalvesLow(IV x) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)); }
  static V HalvesHigh(IV x) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16))); }
  // out[k] = dword k of the 16 bytes at p in every lane: one 16-byte broadcast, then in-register
  // shuffles (broadcasts from memory issue half as fast as dpbusd on Zen 5).
  static void BcastDwords4(const int8_t* p, IV out[4]) {
    const IV x = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    out[0] = _mm512_shuffle_epi32(x, _MM_PERM_AAAA);
    out[1] = _mm512_shuffle_epi32(x, _MM_PERM_BBBB);
    out[2] = _mm512_shuffle_epi32(x, _MM_PERM_CCCC);
    out[3] = _mm512_shuffle_epi32(x, _MM_PERM_DDDD);
  }

  // q4 values (AxpyRowsQ8): 2 queries x 2 blocks of 32 values = 8 integer and 8 float accumulators.
  static constexpr int kAxpyQ8Queries = 2;
  static constexpr int kAxpyQ8Blocks = 2;
  // out[0] lane k = byte k of the 16 bytes at r[0], r[1], r[2], r[3] (in that byte order).
  static void InterleaveRows4(const uint8_t* const r[4], IV out[1]) {
    auto row = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[j])); };
#if KVFS_ATTN_AVX512_VNNI
    IV x = _mm512_inserti32x4(_mm512_castsi128_si512(row(0)), row(1), 1);
    x = _mm512_inserti32x4(x, row(2), 2);
    x = _mm512_inserti32x4(x, row(3), 3);
    out[0] = _mm512_permutexvar_epi8(ByteOfLanes(), x);
#else
    __m128i q[4];
    InterleaveBytes4(row(0), row(1), row(2), row(3), q);
    out[0] = JoinQuarters(q);
#endif
  }
  // Every lane: the 4 bytes at p.
  static IV BcastDword(const int8_t* p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm512_set1_epi32(x);
  }
  // (first, second) = lo[0], hi[0], lo[1], hi[1], ..., lo[15], hi[15].
  static void InterleaveLanes(V lo, V hi, V* first, V* second) {
    *first = _mm512_permutex2var_ps(lo, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), hi);
    *second = _mm512_permutex2var_ps(lo, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), hi);
  }
#if KVFS_ATTN_AVX512_VNNI
  // vpermb indices: byte 4t + j of the result = byte t of 128-bit lane j.
  static IV ByteOfLanes() {
    return _mm512_set_epi8(63, 47, 31, 15, 62, 46, 30, 14, 61, 45, 29, 13, 60, 44, 28, 12, 59, 43, 27, 11, 58, 42, 26, 10,
                           57, 41, 25, 9, 56, 40, 24, 8, 55, 39, 23, 7, 54, 38, 22, 6, 53, 37, 21, 5, 52, 36, 20, 4, 51, 35,
                           19, 3, 50, 34, 18, 2, 49, 33, 17, 1, 48, 32, 16, 0);
  }
#else
  // Without VBMI's vpermb, the byte interleave is InterleaveBytes4's unpacks (attention_x86_shared.h,
  // as in the AVX2 table); its four quarters in order make the vector.
  static IV JoinQuarters(const __m128i q[4]) {
    IV x = _mm512_castsi128_si512(q[0]);
    x = _mm512_inserti32x4(x, q[1], 1);
    x = _mm512_inserti32x4(x, q[2], 2);
    return _mm512_inserti32x4(x, q[3], 3);
  }
#endif

  static V Abs(V x) { return _mm512_abs_ps(x); }
  static IV CvtRound(V x) { return _mm512_cvtps_epi32(x); }  // MXCSR: half to even
  static IV ClampI127(IV x) { return _mm512_max_epi32(_mm512_min_epi32(x, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127)); }
  static void StoreI8(int8_t* p, IV x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(x)); }
  static int32_t ReduceAddI(IV x) { return _mm512_reduce_add_epi32(x); }
  // q4k K records (channel-major, 2 tokens per byte): lane t = the codes of token t of the 4
  // channels at p, p + record, p + 2 record, p + 3 record (8 code bytes = 16 tokens each).
  static IV ChannelQuad(const uint8_t* p, int64_t record) {
    auto codes = [&](int j) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + j * record)); };
#if KVFS_ATTN_AVX512_VNNI
    IV x = _mm512_inserti32x4(_mm512_castsi128_si512(codes(0)), codes(1), 1);
    x = _mm512_inserti32x4(x, codes(2), 2);
    x = _mm512_inserti32x4(x, codes(3), 3);
    // 128-bit lane j: channel j's 16 tokens in order (low nibble = even token).
    const IV tokens = _mm512_unpacklo_epi8(LowNibbles(x), HighNibbles(x));
    return _mm512_permutexvar_epi8(ByteOfLanes(), tokens);  // byte 4t + j = token t of channel j
#else
    auto tokens = [&](int j) {  // channel j's 16 tokens in order (low nibble = even token)
      const __m128i x = codes(j), mask = _mm_set1_epi8(0x0F);
      return _mm_unpacklo_epi8(_mm_and_si128(x, mask), _mm_and_si128(_mm_srli_epi16(x, 4), mask));
    };
    __m128i q[4];
    InterleaveBytes4(tokens(0), tokens(1), tokens(2), tokens(3), q);
    return JoinQuarters(q);  // dword t = token t of the 4
#endif
  }

  // In-register 16x16 transpose: r[j] becomes column j. Pairs of rows are interleaved, then
  // pairs of pairs, then 128-bit lanes are gathered across groups of four rows (64 shuffles).
  static void Transpose(V r[16]) {
    V t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + k]: in 128-bit lane L, rows 4g..4g+3 of column 4L + k.
    for (int g = 0; g < 4; ++g) {
      const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
      const __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
      u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int k = 0; k < 4; ++k) {
      const V a = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);  // lanes: g0L0 g0L2 g1L0 g1L2
      const V b = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);  // g0L1 g0L3 g1L1 g1L3
      const V c = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
      const V d = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
      r[k] = _mm512_shuffle_f32x4(a, c, 0x88);       // column k      (lane 0 of every group)
      r[8 + k] = _mm512_shuffle_f32x4(a, c, 0xdd);   // column 8 + k  (lane 2)
      r[4 + k] = _mm512_shuffle_f32x4(b, d, 0x88);   // column 4 + k  (lane 1)
      r[12 + k] = _mm512_shuffle_f32x4(b, d, 0xdd);  // column 12 + k (lane 3)
    }
  }
};
