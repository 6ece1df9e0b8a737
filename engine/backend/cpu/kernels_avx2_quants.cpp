// AVX2 dot products of the quantized formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
// with Q8_0 / Q8_1 / Q8_K activations. No VNNI: products of u8 x s8 pairs with vpmaddubsw, then
// vpmaddwd to int32 (exact: the pair sums stay below 2^15). Each block's (sub-block's) int sum
// is exact as in the scalar reference; only the float accumulation order differs.
//
// matmul_tile unpacks each weight block once into registers and applies it to up to 4 tokens.
#include "engine/backend/cpu/kernels_avx2_common.h"

namespace kvfs::cpu {
namespace {

// ------------------------------------------------------------------------------------------
// 32-element formats.

enum class Fmt { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };
template <Fmt F>
struct Traits {
  static constexpr bool kMin = F == Fmt::kQ4_1 || F == Fmt::kQ5_1;  // x = d*q + m, unsigned codes
  static constexpr int kW = F == Fmt::kQ4_0 ? 18 : F == Fmt::kQ4_1 ? 20 : F == Fmt::kQ5_0 ? 22 : F == Fmt::kQ5_1 ? 24 : 34;
  static constexpr int kA = kMin ? 36 : 34;   // Q8_1 / Q8_0 activation block bytes
  static constexpr int kAQs = kMin ? 4 : 2;
};

// Bit e of the 32-bit word -> byte e = 0xFF or 0x00.
inline __m256i BytesFromBits(uint32_t bits) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf),
                                        _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

inline __m256i Nibbles(const uint8_t* qs) {
  const __m128i q = LoadU128(qs);
  const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
  return _mm256_set_m128i(hi, lo);
}

// The 32 codes of weight block b: signed (q - offset) for the symmetric formats, unsigned q
// for the formats with a min.
template <Fmt F>
inline __m256i BlockCodes(const uint8_t* b) {
  if constexpr (F == Fmt::kQ8_0) {
    return LoadU256(b + 2);
  } else if constexpr (F == Fmt::kQ4_0) {
    return _mm256_sub_epi8(Nibbles(b + 2), _mm256_set1_epi8(8));
  } else if constexpr (F == Fmt::kQ4_1) {
    return Nibbles(b + 4);
  } else {
    constexpr int kQh = F == Fmt::kQ5_0 ? 2 : 4;
    uint32_t qh;
    std::memcpy(&qh, b + kQh, 4);
    const __m256i q = _mm256_or_si256(Nibbles(b + kQh + 4), _mm256_and_si256(BytesFromBits(qh), _mm256_set1_epi8(16)));
    return F == Fmt::kQ5_0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(16)) : q;
  }
}

template <Fmt F, int NT>
void RowDot(const uint8_t* w, const uint8_t* const (&x)[NT], int64_t nb, float* out) {
  using T = Traits<F>;
  __m256 acc[NT];
  float accm[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    accm[t] = 0.0f;
  }
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = w + i * T::kW;
    const __m256i codes = BlockCodes<F>(b);
    const float dw = HalfToFloat(b);
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = x[t] + i * T::kA;
      const __m256i av = LoadU256(a + T::kAQs);
      const __m256i isum = T::kMin ? DotU8S8(codes, av) : DotS8S8(codes, av);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * HalfToFloat(a)), acc[t]);
      if constexpr (T::kMin) accm[t] += HalfToFloat(b + 2) * HalfToFloat(a + 2);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = HSum8(acc[t]) + accm[t];
}

// ------------------------------------------------------------------------------------------
// K-quants against Q8_K (float d, 256 codes at 4, 16 int16 sums of 16 codes at 260).

// One super-block unpacked: 8 groups of 32 unsigned codes and int16 multipliers of the
// maddubs pair sums (a scale per 32, or for Q6_K per 16, elements), plus the min/offset words.
struct KWeights {
  __m256i codes[8];
  __m256i scale[8];
  __m256i minwords;  // against the 16 bsums
  float d, dmin;
};

template <KFmt F>
inline void LoadKWeights(const uint8_t* b, KWeights& k) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (F == KFmt::kQ6K) {
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    k.d = HalfToFloat(b + 208);
    k.dmin = k.d;
    for (int s = 0; s < 8; ++s) {
      const int h = s / 4, q = s % 4;
      const __m256i l = LoadU256(b + 64 * h + 32 * (q % 2));
      const __m256i nib = q < 2 ? _mm256_and_si256(l, low4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), low4);
      const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(LoadU256(b + 128 + 32 * h), _mm_cvtsi32_si128(2 * q)),
                                          _mm256_set1_epi8(3));
      k.codes[s] = _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));
      // maddubs pairs 0..7 are elements 0..15 (sub-block 2s), 8..15 the next 16.
      k.scale[s] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * s + 1]), _mm_set1_epi16(sc[2 * s]));
    }
    // -32 * sum_i sc_i * bsum_i: the codes are q, not q - 32.
    k.minwords = _mm256_slli_epi16(_mm256_cvtepi8_epi16(LoadU128(b + 192)), 5);
  } else {
    constexpr int kQs = F == KFmt::kQ4K ? 16 : 48;
    k.d = HalfToFloat(b);
    k.dmin = HalfToFloat(b + 2);
    uint8_t sc[8], m[8];
    UnpackScalesMins(b + 4, sc, m);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (F == KFmt::kQ5K) qh = LoadU256(b + 16);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = LoadU256(b + kQs + 32 * c);
      k.codes[2 * c] = _mm256_and_si256(q, low4);
      k.codes[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    }
    for (int s = 0; s < 8; ++s) {
      if constexpr (F == KFmt::kQ5K) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1u << s));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        k.codes[s] = _mm256_or_si256(k.codes[s], _mm256_and_si256(set, _mm256_set1_epi8(16)));
      }
      k.scale[s] = _mm256_set1_epi16(sc[s]);
    }
    // (m[s], m[s]) against bsums (2s, 2s+1), which both lie in sub-block s.
    k.minwords = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)),
                                                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(m))));
  }
}

template <KFmt F>
inline void KBlockDot(const KWeights& k, const uint8_t* x, __m256& acc, __m256& accm) {
  __m256i isum = _mm256_setzero_si256();
  for (int s = 0; s < 8; ++s) {
    const __m256i p = _mm256_maddubs_epi16(k.codes[s], LoadU256(x + 4 + 32 * s));
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, k.scale[s]));
  }
  const __m256i mins = _mm256_madd_epi16(k.minwords, LoadU256(x + 260));
  const float dy = LoadF32(x);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(k.d * dy), acc);
  accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(-k.dmin * dy), accm);
}

template <KFmt F, int NT>
void KRowDot(const uint8_t* w, const uint8_t* const (&x)[NT], int64_t nsb, float* out) {
  __m256 acc[NT], accm[NT];
  for (int t = 0; t < NT; ++t) acc[t] = accm[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i) {
    KWeights k;
    LoadKWeights<F>(w + i * kBlockBytes<F>, k);
    for (int t = 0; t < NT; ++t) KBlockDot<F>(k, x[t] + i * 292, acc[t], accm[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = HSum8(_mm256_add_ps(acc[t], accm[t]));
}

// ------------------------------------------------------------------------------------------
// Tiles: each row against up to 4 tokens at a time.

template <class Row, int NT>
void RowsTokens(Row row, const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x,
                int64_t x_row_bytes, int64_t nb, float* y, int64_t y_stride) {
  const uint8_t* xs[NT];
  for (int t = 0; t < NT; ++t) xs[t] = x + t * x_row_bytes;
  for (int64_t r = 0; r < n_rows; ++r) {
    float out[NT];
    row.template operator()<NT>(w_rows + r * w_row_bytes, xs, nb, out);
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = out[t];
  }
}

template <class Row>
void Tile(Row row, const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant,
          int64_t x_row_bytes, int64_t n_tokens, int64_t nb, float* y, int64_t y_stride) {
  int64_t t = 0;
  for (; t + 4 <= n_tokens; t += 4) {
    RowsTokens<Row, 4>(row, w_rows, w_row_bytes, n_rows, x_quant + t * x_row_bytes, x_row_bytes, nb, y + t * y_stride, y_stride);
  }
  const uint8_t* xt = x_quant + t * x_row_bytes;
  float* yt = y + t * y_stride;
  switch (n_tokens - t) {
    case 3: RowsTokens<Row, 3>(row, w_rows, w_row_bytes, n_rows, xt, x_row_bytes, nb, yt, y_stride); break;
    case 2: RowsTokens<Row, 2>(row, w_rows, w_row_bytes, n_rows, xt, x_row_bytes, nb, yt, y_stride); break;
    case 1: RowsTokens<Row, 1>(row, w_rows, w_row_bytes, n_rows, xt, x_row_bytes, nb, yt, y_stride); break;
    default: break;
  }
}

template <Fmt F>
struct LegacyRow {
  template <int NT>
  void operator()(const uint8_t* w, const uint8_t* const (&x)[NT], int64_t nb, float* out) const {
    RowDot<F, NT>(w, x, nb, out);
  }
};
template <KFmt F>
struct KRow {
  template <int NT>
  void operator()(const uint8_t* w, const uint8_t* const (&x)[NT], int64_t nsb, float* out) const {
    KRowDot<F, NT>(w, x, nsb, out);
  }
};

template <Fmt F>
float VecDot(const void* w, const void* a, int64_t n) {
  const uint8_t* x[1] = {static_cast<const uint8_t*>(a)};
  float out[1];
  RowDot<F, 1>(static_cast<const uint8_t*>(w), x, n / 32, out);
  return out[0];
}
template <KFmt F>
float KVecDot(const void* w, const void* a, int64_t n) {
  const uint8_t* x[1] = {static_cast<const uint8_t*>(a)};
  float out[1];
  KRowDot<F, 1>(static_cast<const uint8_t*>(w), x, n / kQK_K, out);
  return out[0];
}

}  // namespace

namespace avx2 {

float VecDotQ4_0(const void* w, const void* a, int64_t n) { return VecDot<Fmt::kQ4_0>(w, a, n); }
float VecDotQ4_1(const void* w, const void* a, int64_t n) { return VecDot<Fmt::kQ4_1>(w, a, n); }
float VecDotQ5_0(const void* w, const void* a, int64_t n) { return VecDot<Fmt::kQ5_0>(w, a, n); }
float VecDotQ5_1(const void* w, const void* a, int64_t n) { return VecDot<Fmt::kQ5_1>(w, a, n); }
float VecDotQ8_0(const void* w, const void* a, int64_t n) { return VecDot<Fmt::kQ8_0>(w, a, n); }
float VecDotQ4_K(const void* w, const void* a, int64_t n) { return KVecDot<KFmt::kQ4K>(w, a, n); }
float VecDotQ5_K(const void* w, const void* a, int64_t n) { return KVecDot<KFmt::kQ5K>(w, a, n); }
float VecDotQ6_K(const void* w, const void* a, int64_t n) { return KVecDot<KFmt::kQ6K>(w, a, n); }

// The table's tile signature takes n_in; the row walkers count blocks.
template <class Row, int64_t kBlockElems>
void TileFor(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
             int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  Tile(Row{}, w_rows, w_row_bytes, n_rows, x_quant, x_row_bytes, n_tokens, n_in / kBlockElems, y, y_stride);
}
const MatMulTileFn TileQ4_0 = &TileFor<LegacyRow<Fmt::kQ4_0>, 32>;
const MatMulTileFn TileQ4_1 = &TileFor<LegacyRow<Fmt::kQ4_1>, 32>;
const MatMulTileFn TileQ5_0 = &TileFor<LegacyRow<Fmt::kQ5_0>, 32>;
const MatMulTileFn TileQ5_1 = &TileFor<LegacyRow<Fmt::kQ5_1>, 32>;
const MatMulTileFn TileQ8_0 = &TileFor<LegacyRow<Fmt::kQ8_0>, 32>;
const MatMulTileFn TileQ4_K = &TileFor<KRow<KFmt::kQ4K>, kQK_K>;
const MatMulTileFn TileQ5_K = &TileFor<KRow<KFmt::kQ5K>, kQK_K>;
const MatMulTileFn TileQ6_K = &TileFor<KRow<KFmt::kQ6K>, kQK_K>;

}  // namespace avx2
}  // namespace kvfs::cpu
