// AVX-512 (VNNI) dot products of the K-quant super-block formats Q4_K, Q5_K and Q6_K with
// activations quantized to Q8_K (float d, 256 int8 codes, 16 sums of 16 codes).
//
// Codes are unsigned (0..15, 0..31, 0..63) and activations signed, so vpdpbusd applies. One
// vpdpbusd from zero leaves in each int32 lane a sum of 4 products, |sum| <= 63*127*4 < 2^15,
// so the lane fits an int16 and vpdpwssd against (scale, 0) word pairs multiplies it by its
// sub-block scale and accumulates: the super-block sum sum_s sc[s] * dot_s stays exact in
// int32, as in the scalar reference. Mins (Q4_K/Q5_K) and Q6_K's -32 offset come from the
// activation block sums: one vpmaddwd/vpdpwssd of (min or 32*scale) pairs with the bsums.
#include "engine/backend/cpu/kernels_avx512_kpanel.h"

namespace kvfs::cpu {
namespace {

// Constant tables.
constexpr Vec64 MakeHalfShift(int lo, int hi) {  // 16-bit shift counts: lo for bytes 0..31, hi for 32..63
  Vec64 v{};
  for (int w = 0; w < 32; ++w) v.b[2 * w] = static_cast<uint8_t>(w < 16 ? lo : hi);
  return v;
}
constexpr Vec64 kShift0_4 = MakeHalfShift(0, 4);
constexpr Vec64 kShiftL4_2 = MakeHalfShift(4, 2);
constexpr Vec64 kShiftR0_2 = MakeHalfShift(0, 2);
constexpr Vec64 MakeBitPair(int c) {  // bit 2c for bytes 0..31, bit 2c+1 for 32..63
  Vec64 v{};
  for (int j = 0; j < 64; ++j) v.b[j] = static_cast<uint8_t>(1u << (j < 32 ? 2 * c : 2 * c + 1));
  return v;
}
constexpr Vec64 kBitPair[4] = {MakeBitPair(0), MakeBitPair(1), MakeBitPair(2), MakeBitPair(3)};

// ------------------------------------------------------------------------------------------
// Row kernels: one super-block of a weight row is unpacked into 4 zmm of codes (64 elements
// each, in element order, so the Q8_K codes are used as stored) and 4 zmm of scale words, then
// applied to each of NT tokens.

struct KWeights {
  __m512i codes[4];
  __m512i scale[4];   // per int32 lane: (sub-block scale, 0) as int16 words
  __m256i minpairs;   // Q4_K/Q5_K: (m[s], m[s]) words; Q6_K: the 16 scales as words
  float d, dmin;      // Q6_K: dmin unused (offset uses d * 32)
};

template <KFmt F>
inline void LoadKWeights(const uint8_t* b, KWeights& k) {
  if constexpr (F == KFmt::kQ6K) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    k.d = HalfToFloat(b + 208);
    k.dmin = 0.0f;
    const __m512i hq = _mm512_loadu_si512(qh);
    const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m512i l = _mm512_loadu_si512(ql + 64 * h);
      // qh half h, twice (the shuffle immediate must be a constant, hence the two calls)
      const __m512i c = h == 0 ? _mm512_shuffle_i64x2(hq, hq, 0x44) : _mm512_shuffle_i64x2(hq, hq, 0xEE);
      // Elements 128h + 0..63: low nibbles of ql, qh bits 0-1 (then 2-3) moved to bits 4-5.
      k.codes[2 * h] = _mm512_ternarylogic_epi32(
          l, _mm512_and_si512(_mm512_sllv_epi16(c, Load(kShiftL4_2)), bits45), low4, 0xEC);  // (l & low4) | x
      // Elements 128h + 64..127: high nibbles of ql, qh bits 4-5 (then 6-7).
      k.codes[2 * h + 1] = _mm512_ternarylogic_epi32(
          _mm512_srli_epi16(l, 4), _mm512_and_si512(_mm512_srlv_epi16(c, Load(kShiftR0_2)), bits45), low4, 0xEC);
    }
    // Lane l of code vector c is in sub-block 4c + l/4.
    const __m512i sc32 = _mm512_and_si512(_mm512_cvtepi8_epi32(sc8), _mm512_set1_epi32(0xFFFF));
    for (int c = 0; c < 4; ++c) {
      const __m512i idx = _mm512_add_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2),
                                           _mm512_set1_epi32(4 * c));
      k.scale[c] = _mm512_permutexvar_epi32(idx, sc32);
    }
    k.minpairs = _mm256_cvtepi8_epi16(sc8);
  } else {
    constexpr int kQs = F == KFmt::kQ4K ? 16 : 48;
    k.d = HalfToFloat(b);
    k.dmin = HalfToFloat(b + 2);
    const __m128i scm = UnpackScalesMins(b + 4);
    __m512i qh = _mm512_setzero_si512();
    if constexpr (F == KFmt::kQ5K) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
    for (int c = 0; c < 4; ++c) {
      // 32 bytes hold sub-blocks 2c (low nibbles) and 2c+1 (high nibbles).
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kQs + 32 * c)));
      __m512i code = _mm512_and_si512(_mm512_srlv_epi16(q, Load(kShift0_4)), _mm512_set1_epi8(0x0F));
      if constexpr (F == KFmt::kQ5K) {
        code = _mm512_mask_add_epi8(code, _mm512_test_epi8_mask(qh, Load(kBitPair[c])), code, _mm512_set1_epi8(16));
      }
      k.codes[c] = code;
    }
    const __m512i sc32 = _mm512_cvtepu8_epi32(scm);  // lanes 0..7 scales, 8..15 mins
    for (int c = 0; c < 4; ++c) {
      const __m512i idx = _mm512_set_epi32(2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1,
                                           2 * c + 1, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c);
      k.scale[c] = _mm512_permutexvar_epi32(idx, sc32);
    }
    // (m[s], m[s]) words, against bsums (2s, 2s+1) which both lie in sub-block s.
    const __m128i dup = _mm_shuffle_epi8(scm, _mm_set_epi8(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8));
    k.minpairs = _mm256_cvtepu8_epi16(dup);
  }
}

// acc += this block's dot with one Q8_K block x (main part); accm (8 lanes) += min part.
template <KFmt F>
inline void KBlockDot(const KWeights& k, const uint8_t* x, __m512& acc, __m256& accm) {
  __m512i isum = _mm512_setzero_si512();
  for (int c = 0; c < 4; ++c) {
    const __m512i a = _mm512_loadu_si512(x + kQ8KQs + 64 * c);
    const __m512i lane = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k.codes[c], a);
    isum = _mm512_dpwssd_epi32(isum, lane, k.scale[c]);
  }
  const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + kQ8KSums));
  const __m256i mins = _mm256_madd_epi16(k.minpairs, bsums);
  const float dy = LoadF32(x);
  if constexpr (F == KFmt::kQ6K) {
    // sum_i sc_i * (dot_i - 32 * bsum_i): the offset joins the exact int sum.
    isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(mins, 5)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(k.d * dy), acc);
  } else {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(k.d * dy), acc);
    accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(-k.dmin * dy), accm);
  }
}

template <KFmt F, int NT>
void KRowDot(const uint8_t* w, const uint8_t* const (&x)[NT], int64_t nsb, float* out) {
  __m512 acc[NT];
  __m256 accm[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_setzero_ps();
    accm[t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < nsb; ++i) {
    KWeights k;
    LoadKWeights<F>(w + i * kBlockBytes<F>, k);
    for (int t = 0; t < NT; ++t) KBlockDot<F>(k, x[t] + i * kQ8KBytes, acc[t], accm[t]);
  }
  for (int t = 0; t < NT; ++t) {
    const __m512 all = _mm512_add_ps(acc[t], _mm512_zextps256_ps512(accm[t]));
    out[t] = HSum(all);
  }
}

template <KFmt F>
float KVecDot(const void* w, const void* a, int64_t n) {
  const uint8_t* x[1] = {static_cast<const uint8_t*>(a)};
  float out[1];
  KRowDot<F, 1>(static_cast<const uint8_t*>(w), x, n / kQK_K, out);
  return out[0];
}

template <KFmt F, int NT>
void KRowsTokens(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x, int64_t x_row_bytes,
                 int64_t nsb, float* y, int64_t y_stride) {
  const uint8_t* xs[NT];
  for (int t = 0; t < NT; ++t) xs[t] = x + t * x_row_bytes;
  for (int64_t r = 0; r < n_rows; ++r) {
    float out[NT];
    KRowDot<F, NT>(w_rows + r * w_row_bytes, xs, nsb, out);
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = out[t];
  }
}

// The 32 codes of group s (0..7) of one block, and its scales into the panel.
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

template <KFmt F>
void KBlockScales(const uint8_t* b, int sb, int row, KPanel& p) {
  if constexpr (F == KFmt::kQ6K) {
    const float d = HalfToFloat(b + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int s = 0; s < 8; ++s) {
      p.scale[8 * sb + s][0][row] = d * static_cast<float>(sc[2 * s]);
      p.scale[8 * sb + s][1][row] = d * static_cast<float>(sc[2 * s + 1]);
      const uint32_t lo = static_cast<uint16_t>(static_cast<int16_t>(32 * sc[2 * s]));
      const uint32_t hi = static_cast<uint16_t>(static_cast<int16_t>(32 * sc[2 * s + 1]));
      p.pairs[sb][s][row] = static_cast<int32_t>(lo | (hi << 16));
    }
    p.dmin[sb][row] = d;
  } else {
    const float d = HalfToFloat(b), dmin = HalfToFloat(b + 2);
    alignas(16) uint8_t scm[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(scm), UnpackScalesMins(b + 4));
    for (int s = 0; s < 8; ++s) {
      p.scale[8 * sb + s][0][row] = d * static_cast<float>(scm[s]);
      p.pairs[sb][s][row] = static_cast<int32_t>(scm[8 + s] | (static_cast<uint32_t>(scm[8 + s]) << 16));
    }
    p.dmin[sb][row] = dmin;
  }
}

template <KFmt F>
void FillKPanel(const uint8_t* w, int64_t w_row_bytes, int64_t rows, int nsb, KPanel& p) {
  for (int sb = 0; sb < nsb; ++sb) {
    for (int64_t row = 0; row < kPanelRows; ++row) {
      if (row < rows) {
        KBlockScales<F>(w + row * w_row_bytes + sb * kBlockBytes<F>, sb, static_cast<int>(row), p);
      } else {
        for (int s = 0; s < 8; ++s) {
          p.scale[8 * sb + s][0][row] = p.scale[8 * sb + s][1][row] = 0.0f;
          p.pairs[sb][s][row] = 0;
        }
        p.dmin[sb][row] = 0.0f;
      }
    }
    for (int half = 0; half < 2; ++half) {
      for (int s = 0; s < 8; ++s) {
        __m256i r[16];
        for (int i = 0; i < 16; ++i) {
          const int64_t row = 16 * half + i;
          r[i] = row < rows ? KGroupCodes<F>(w + row * w_row_bytes + sb * kBlockBytes<F>, s) : _mm256_setzero_si256();
        }
        TransposeStore16x8(r, p.codes[8 * sb + s][0] + 64 * half);
      }
    }
  }
}

template <KFmt F>
void KPanelTile(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant,
                int64_t x_row_bytes, int64_t n_tokens, int64_t nsb_total, float* y, int64_t y_stride) {
  const auto fill = [&](int64_t r0, int64_t sb0, int nsb, KPanel& p) {
    FillKPanel<F>(w_rows + r0 * w_row_bytes + sb0 * kBlockBytes<F>, w_row_bytes, n_rows - r0, nsb, p);
  };
  // The next panel's rows, a share per 4-token call. Tinyllama q4_k_m, this and TokensOfPass
  // against neither, alternated pass by pass in one process: 512-token turns 8-12% faster, a
  // pass of 8 agents' 17-token turns 17-19%.
  const auto ahead = [&](int64_t r0, int64_t sb0, int nsb, int64_t part, int64_t parts) {
    const int64_t rows = n_rows - r0 < kPanelRows ? n_rows - r0 : kPanelRows;
    PrefetchRowsShare(w_rows + r0 * w_row_bytes + sb0 * kBlockBytes<F>, w_row_bytes, rows, nsb * kBlockBytes<F>, part,
                      parts);
  };
  KPanelPasses<F>(n_rows, x_quant, x_row_bytes, n_tokens, nsb_total, y, y_stride, fill, ahead);
}

template <KFmt F>
void KTile(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
           int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  const int64_t nsb = n_in / kQK_K;
  if (n_tokens >= (F == KFmt::kQ6K ? kPanelMinTokensQ6K : kPanelMinTokensK)) {
    KPanelTile<F>(w_rows, w_row_bytes, n_rows, x_quant, x_row_bytes, n_tokens, nsb, y, y_stride);
    return;
  }
  // Up to 8 tokens per pass over the weights (see the legacy formats' Tile).
  ForTokenPasses(n_tokens, 8, [&]<int NT>(int64_t t) {
    KRowsTokens<F, NT>(w_rows, w_row_bytes, n_rows, x_quant + t * x_row_bytes, x_row_bytes, nsb, y + t * y_stride, y_stride);
  });
}

}  // namespace

namespace avx512 {

float VecDotQ4_K(const void* w, const void* a, int64_t n) { return KVecDot<KFmt::kQ4K>(w, a, n); }
float VecDotQ5_K(const void* w, const void* a, int64_t n) { return KVecDot<KFmt::kQ5K>(w, a, n); }
float VecDotQ6_K(const void* w, const void* a, int64_t n) { return KVecDot<KFmt::kQ6K>(w, a, n); }

const MatMulTileFn TileQ4_K = &KTile<KFmt::kQ4K>;
const MatMulTileFn TileQ5_K = &KTile<KFmt::kQ5K>;
const MatMulTileFn TileQ6_K = &KTile<KFmt::kQ6K>;

}  // namespace avx512
}  // namespace kvfs::cpu
