// AVX-512 (VNNI) dot products of the K-quant super-block formats Q4_K, Q5_K and Q6_K with
// activations quantized to Q8_K (float d, 256 int8 codes, 16 sums of 16 codes).
//
// Codes are unsigned (0..15, 0..31, 0..63) and activations signed, so vpdpbusd applies. One
// vpdpbusd from zero leaves in each int32 lane a sum of 4 products, |sum| <= 63*127*4 < 2^15,
// so the lane fits an int16 and vpdpwssd against (scale, 0) word pairs multiplies it by its
// sub-block scale and accumulates: the super-block sum sum_s sc[s] * dot_s stays exact in
// int32, as in the scalar reference. Mins (Q4_K/Q5_K) and Q6_K's -32 offset come from the
// activation block sums: one vpmaddwd/vpdpwssd of (min or 32*scale) pairs with the bsums.
#include "engine/backend/cpu/kernels_avx512_common.h"

namespace kvfs::cpu {
namespace {

#include "engine/backend/cpu/dpbusd_broadcast.h"

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

// ------------------------------------------------------------------------------------------
// Panel kernels (kernels_avx512_common.h): 32 rows x 2 super-blocks unpacked and transposed.

constexpr int kSbPerChunk = kChunkK / kQK_K;  // 2
constexpr int kGroupsK = kChunkK / 32;        // 16 groups of 32 elements

struct alignas(64) KPanel {
  uint8_t codes[kGroupsK][8][128];        // [group][dword j][row * 4 + byte]
  float scale[kGroupsK][2][kPanelRows];   // d * sub-block scale; Q6_K: one per 16 elements
  int32_t pairs[kSbPerChunk][8][kPanelRows];  // words multiplying bsums dword i (mins / 32*sc)
  float dmin[kSbPerChunk][kPanelRows];    // float scale of that sum (Q6_K: d)
};

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

// NT tokens x 32 rows over nsb super-blocks of a panel; x points at the first token's block of
// the chunk. Results are added to y per super-block (few registers: y traffic is negligible
// against the 64 vpdpbusd per row vector and token in between).
template <KFmt F, int NT>
void KPanelTokens(const KPanel& p, int nsb, const uint8_t* x, int64_t x_row_bytes, float* y, int64_t y_stride,
                  __mmask16 m0, __mmask16 m1, bool accumulate) {
  for (int sb = 0; sb < nsb; ++sb) {
    __m512 f[2][NT];
    for (int t = 0; t < NT; ++t) f[0][t] = f[1][t] = _mm512_setzero_ps();
    const uint8_t* xb = x + sb * kQ8KBytes;
    for (int s = 0; s < 8; ++s) {
      const int g = 8 * sb + s;
      constexpr int kParts = F == KFmt::kQ6K ? 2 : 1;  // Q6_K: a scale per 16 elements
      for (int part = 0; part < kParts; ++part) {
        __m512i isum[2][NT];
        for (int t = 0; t < NT; ++t) isum[0][t] = isum[1][t] = _mm512_setzero_si512();
        for (int j = 8 / kParts * part; j < 8 / kParts * (part + 1); ++j) {
          const __m512i w0 = _mm512_load_si512(p.codes[g][j]);
          const __m512i w1 = _mm512_load_si512(p.codes[g][j] + 64);
          for (int t = 0; t < NT; ++t) {
            const __m512i a = _mm512_set1_epi32(static_cast<int>(LoadU32(xb + t * x_row_bytes + kQ8KQs + 32 * s + 4 * j)));
            isum[0][t] = _mm512_dpbusd_epi32(isum[0][t], w0, a);
            isum[1][t] = _mm512_dpbusd_epi32(isum[1][t], w1, a);
          }
        }
        const __m512 sc0 = _mm512_load_ps(p.scale[g][part]), sc1 = _mm512_load_ps(p.scale[g][part] + 16);
        for (int t = 0; t < NT; ++t) {
          f[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[0][t]), sc0, f[0][t]);
          f[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[1][t]), sc1, f[1][t]);
        }
      }
    }
    const __m512 dmin0 = _mm512_load_ps(p.dmin[sb]), dmin1 = _mm512_load_ps(p.dmin[sb] + 16);
    for (int t = 0; t < NT; ++t) {
      const uint8_t* xt = xb + t * x_row_bytes;
      __m512i mi0 = _mm512_setzero_si512(), mi1 = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) {
        const __m512i bs = _mm512_set1_epi32(static_cast<int>(LoadU32(xt + kQ8KSums + 4 * i)));
        mi0 = _mm512_dpwssd_epi32(mi0, _mm512_load_si512(p.pairs[sb][i]), bs);
        mi1 = _mm512_dpwssd_epi32(mi1, _mm512_load_si512(p.pairs[sb][i] + 16), bs);
      }
      const __m512 dy = _mm512_set1_ps(LoadF32(xt));
      const __m512 r0 = _mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi0), dmin0, f[0][t]), dy);
      const __m512 r1 = _mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi1), dmin1, f[1][t]), dy);
      StoreRows(y + t * y_stride, r0, m0, accumulate || sb > 0);
      StoreRows(y + t * y_stride + 16, r1, m1, accumulate || sb > 0);
    }
  }
}

template <KFmt F>
void KPanelTile(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant,
                int64_t x_row_bytes, int64_t n_tokens, int64_t nsb_total, float* y, int64_t y_stride) {
  KPanel panel;
  for (int64_t sb0 = 0; sb0 < nsb_total; sb0 += kSbPerChunk) {
    const int nsb = static_cast<int>(nsb_total - sb0 < kSbPerChunk ? nsb_total - sb0 : kSbPerChunk);
    const bool accumulate = sb0 > 0;
    for (int64_t t0 = 0, nt = 0; t0 < n_tokens; t0 += nt) {
      nt = TokensOfPass(n_tokens - t0);
      const uint8_t* xc = x_quant + t0 * x_row_bytes + sb0 * kQ8KBytes;
      for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
        const int64_t rows = n_rows - r0;
        FillKPanel<F>(w_rows + r0 * w_row_bytes + sb0 * kBlockBytes<F>, w_row_bytes, rows, nsb, panel);
        const __mmask16 m0 = RowMask(rows, 0), m1 = RowMask(rows, 1);
        float* yb = y + t0 * y_stride + r0;
        // The next panel's rows, a share per 4-token call (PrefetchRowsShare). Tinyllama
        // q4_k_m, this and TokensOfPass against neither, alternated pass by pass in one process:
        // 512-token turns 8-12% faster, a pass of 8 agents' 17-token turns 17-19%.
        const int64_t after = rows - kPanelRows;  // rows past this panel
        const int64_t next_rows = after <= 0 ? 0 : after < kPanelRows ? after : kPanelRows;
        int64_t t = 0;
        for (; t + 4 <= nt; t += 4) {
          PrefetchRowsShare(w_rows + (r0 + kPanelRows) * w_row_bytes + sb0 * kBlockBytes<F>, w_row_bytes, next_rows,
                            nsb * kBlockBytes<F>, t / 4, nt / 4);
          KPanelTokens<F, 4>(panel, nsb, xc + t * x_row_bytes, x_row_bytes, yb + t * y_stride, y_stride, m0, m1, accumulate);
        }
        const uint8_t* xt = xc + t * x_row_bytes;
        float* yt = yb + t * y_stride;
        switch (nt - t) {
          case 3: KPanelTokens<F, 3>(panel, nsb, xt, x_row_bytes, yt, y_stride, m0, m1, accumulate); break;
          case 2: KPanelTokens<F, 2>(panel, nsb, xt, x_row_bytes, yt, y_stride, m0, m1, accumulate); break;
          case 1: KPanelTokens<F, 1>(panel, nsb, xt, x_row_bytes, yt, y_stride, m0, m1, accumulate); break;
          default: break;
        }
      }
    }
  }
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

// ------------------------------------------------------------------------------------------
// Packed Q4_K (PackedKernels in kernels.h): weights repacked at load into groups of 16
// interleaved rows, as packed Q4_0 is (kernels_avx512_packed.cpp). With the plain layout one
// decoded token unpacks a row's scales and mins, broadcasts its codes and sums a zmm across
// lanes for every row and super-block: on Emerald Rapids that bound decode at ~5.6 GB/s a
// thread (`bench_kernels decode_tile/avx512/Q4_K`), against ~13 for packed Q4_0. Here one
// zmm lane is one row: a 64-byte load holds 4 code bytes of each of 16 rows, whose low
// nibbles feed one vpdpbusd for sub-block 2c and whose high nibbles one for 2c + 1.
//
// Layout of a group (rows 16g .. 16g + 15; rows past the matrix are zero), super-block by
// super-block, kPackedSbBytes each (37 lines, read in address order):
//   d[16], dmin[16]      f16, as stored
//   sc[8][16], m[8][16]  the 6-bit scales and mins, one byte each
//   codes[4][8][16][4]   pair c (sub-blocks 2c, 2c + 1), chunk k, row i: bytes 4k..4k+3 of
//                        the row's 32 code bytes of pair c (low nibbles: elements 4k..4k+3 of
//                        sub-block 2c; high nibbles: the same of 2c + 1)
//
// Arithmetic: KPanelTokens' operations in its order, per row, token and super-block, whether
// the panels (prefill; filled from this layout) or the row groups (decode) run: so a token
// gets the same bits alone or among others.
constexpr int kPackedRows = 16;
constexpr int64_t kPackedSbBytes = 64 + 256 + 2048;
static_assert(kPackedSbBytes % 64 == 0);
constexpr int64_t kPackedScOffset = 64, kPackedMinOffset = 192, kPackedCodesOffset = 320;

int64_t PackedQ4KBytes(int64_t n_rows, int64_t n_in) {
  return (n_rows + kPackedRows - 1) / kPackedRows * (n_in / kQK_K) * kPackedSbBytes;
}

void PackQ4K(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, int64_t n_in, uint8_t* dst) {
  const int64_t nsb = n_in / kQK_K, groups = (n_rows + kPackedRows - 1) / kPackedRows;
  std::memset(dst, 0, static_cast<size_t>(PackedQ4KBytes(n_rows, n_in)));
  for (int64_t g = 0; g < groups; ++g) {
    for (int i = 0; i < kPackedRows && kPackedRows * g + i < n_rows; ++i) {
      const uint8_t* row = w_rows + (kPackedRows * g + i) * w_row_bytes;
      for (int64_t sb = 0; sb < nsb; ++sb) {
        const uint8_t* b = row + sb * kBlockBytes<KFmt::kQ4K>;
        uint8_t* out = dst + (g * nsb + sb) * kPackedSbBytes;
        std::memcpy(out + 2 * i, b, 2);
        std::memcpy(out + 32 + 2 * i, b + 2, 2);
        alignas(16) uint8_t scm[16];
        _mm_store_si128(reinterpret_cast<__m128i*>(scm), UnpackScalesMins(b + 4));
        for (int s = 0; s < 8; ++s) {
          out[kPackedScOffset + 16 * s + i] = scm[s];
          out[kPackedMinOffset + 16 * s + i] = scm[8 + s];
        }
        for (int c = 0; c < 4; ++c) {
          for (int k = 0; k < 8; ++k) std::memcpy(out + kPackedCodesOffset + 512 * c + 64 * k + 4 * i, b + 16 + 32 * c + 4 * k, 4);
        }
      }
    }
  }
}

// The per-row factors of one group's super-block, shared by the tokens of a pass.
struct PackedQ4KFactors {
  __m512 scale[8];  // d * sc[s], as KBlockScales makes it
  __m512i pairs[8];  // (m[s], m[s]) words
  __m512 dmin;
};

inline void LoadPackedQ4KFactors(const uint8_t* sbp, PackedQ4KFactors& f) {
  const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sbp)));
  f.dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sbp + 32)));
  for (int s = 0; s < 8; ++s) {
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sbp + kPackedScOffset + 16 * s)));
    f.scale[s] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    const __m512i m = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sbp + kPackedMinOffset + 16 * s)));
    f.pairs[s] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
  }
}

// One group of 16 rows over all super-blocks against NT tokens (x: token 0's Q8_K row):
// y[t * y_stride + lane] = row . token t, for the lanes in m.
template <int NT>
void PackedQ4KGroup(const uint8_t* group, int64_t nsb, const uint8_t* x, int64_t x_row_bytes, float* y, int64_t y_stride,
                    __mmask16 m) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* sbp = group + sb * kPackedSbBytes;
    // The next super-block's lines (kPackedSbBytes ahead: the stream the hardware prefetcher
    // would start on only after some misses).
    for (int i = 0; i < 37; ++i) asm volatile("prefetcht0 %0" ::"m"(*(sbp + 2 * kPackedSbBytes + 64 * i)));
    PackedQ4KFactors f;
    LoadPackedQ4KFactors(sbp, f);
    const uint8_t* xb = x + sb * kQ8KBytes;
    __m512 fs[NT];
    for (int t = 0; t < NT; ++t) fs[t] = _mm512_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      __m512i lo[8], hi[8];
      for (int k = 0; k < 8; ++k) {
        const __m512i v = _mm512_load_si512(sbp + kPackedCodesOffset + 512 * c + 64 * k);
        lo[k] = _mm512_and_si512(v, nibble);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      }
      for (int t = 0; t < NT; ++t) {
        const uint8_t* a = xb + t * x_row_bytes + kQ8KQs + 64 * c;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int k = 0; k < 8; ++k) {
          s0 = DpbusdBroadcast(s0, lo[k], a + 4 * k);
          s1 = DpbusdBroadcast(s1, hi[k], a + 32 + 4 * k);
        }
        fs[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), f.scale[2 * c], fs[t]);
        fs[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), f.scale[2 * c + 1], fs[t]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      const uint8_t* xt = xb + t * x_row_bytes;
      __m512i mi = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) {
        mi = _mm512_dpwssd_epi32(mi, f.pairs[i], _mm512_set1_epi32(static_cast<int>(LoadU32(xt + kQ8KSums + 4 * i))));
      }
      const __m512 r = _mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi), f.dmin, fs[t]), _mm512_set1_ps(LoadF32(xt)));
      acc[t] = sb == 0 ? r : _mm512_add_ps(r, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) StoreRows(y + t * y_stride, acc[t], m, false);
}

// A panel (32 rows = 2 groups, kSbPerChunk super-blocks from sb0) filled from the packed
// groups: the codes are already row-interleaved (an and / shift per 64 bytes), the factors
// those KBlockScales makes from the plain rows.
void FillKPanelPacked(const uint8_t* packed, int64_t group0, int64_t groups_left, int64_t nsb_total, int64_t sb0, int nsb,
                      KPanel& p) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int half = 0; half < 2; ++half) {
    const bool present = half < groups_left;
    for (int sb = 0; sb < nsb; ++sb) {
      const uint8_t* sbp = packed + ((group0 + half) * nsb_total + sb0 + sb) * kPackedSbBytes;
      if (!present) {
        for (int s = 0; s < 8; ++s) {
          for (int j = 0; j < 8; ++j) _mm512_store_si512(p.codes[8 * sb + s][j] + 64 * half, _mm512_setzero_si512());
          _mm512_store_ps(p.scale[8 * sb + s][0] + 16 * half, _mm512_setzero_ps());
          _mm512_store_si512(p.pairs[sb][s] + 16 * half, _mm512_setzero_si512());
        }
        _mm512_store_ps(p.dmin[sb] + 16 * half, _mm512_setzero_ps());
        continue;
      }
      PackedQ4KFactors f;
      LoadPackedQ4KFactors(sbp, f);
      for (int s = 0; s < 8; ++s) {
        _mm512_store_ps(p.scale[8 * sb + s][0] + 16 * half, f.scale[s]);
        _mm512_store_si512(p.pairs[sb][s] + 16 * half, f.pairs[s]);
      }
      _mm512_store_ps(p.dmin[sb] + 16 * half, f.dmin);
      for (int c = 0; c < 4; ++c) {
        for (int k = 0; k < 8; ++k) {
          const __m512i v = _mm512_load_si512(sbp + kPackedCodesOffset + 512 * c + 64 * k);
          _mm512_store_si512(p.codes[8 * sb + 2 * c][k] + 64 * half, _mm512_and_si512(v, nibble));
          _mm512_store_si512(p.codes[8 * sb + 2 * c + 1][k] + 64 * half, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
        }
      }
    }
  }
}

// KPanelTile's passes over the packed layout.
void PackedQ4KPanels(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                     int64_t n_tokens, int64_t nsb_total, float* y, int64_t y_stride) {
  KPanel panel;
  for (int64_t sb0 = 0; sb0 < nsb_total; sb0 += kSbPerChunk) {
    const int nsb = static_cast<int>(nsb_total - sb0 < kSbPerChunk ? nsb_total - sb0 : kSbPerChunk);
    const bool accumulate = sb0 > 0;
    for (int64_t t0 = 0, nt = 0; t0 < n_tokens; t0 += nt) {
      nt = TokensOfPass(n_tokens - t0);
      const uint8_t* xc = x_quant + t0 * x_row_bytes + sb0 * kQ8KBytes;
      for (int64_t r = 0; r < n_rows; r += kPanelRows) {
        const int64_t rows = n_rows - r;
        FillKPanelPacked(packed, (r0 + r) / kPackedRows, (rows + kPackedRows - 1) / kPackedRows, nsb_total, sb0, nsb, panel);
        const __mmask16 m0 = RowMask(rows, 0), m1 = RowMask(rows, 1);
        float* yb = y + t0 * y_stride + r;
        int64_t t = 0;
        for (; t + 4 <= nt; t += 4) {
          KPanelTokens<KFmt::kQ4K, 4>(panel, nsb, xc + t * x_row_bytes, x_row_bytes, yb + t * y_stride, y_stride, m0, m1,
                                      accumulate);
        }
        const uint8_t* xt = xc + t * x_row_bytes;
        float* yt = yb + t * y_stride;
        switch (nt - t) {
          case 3: KPanelTokens<KFmt::kQ4K, 3>(panel, nsb, xt, x_row_bytes, yt, y_stride, m0, m1, accumulate); break;
          case 2: KPanelTokens<KFmt::kQ4K, 2>(panel, nsb, xt, x_row_bytes, yt, y_stride, m0, m1, accumulate); break;
          case 1: KPanelTokens<KFmt::kQ4K, 1>(panel, nsb, xt, x_row_bytes, yt, y_stride, m0, m1, accumulate); break;
          default: break;
        }
      }
    }
  }
}

void MatMulPackedQ4K(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                     int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  const int64_t nsb = n_in / kQK_K;
  if (n_tokens >= kPanelMinTokensK) {
    PackedQ4KPanels(packed, r0, n_rows, x_quant, x_row_bytes, n_tokens, nsb, y, y_stride);
    return;
  }
  ForTokenPasses(n_tokens, 4, [&]<int NT>(int64_t t) {
    for (int64_t r = 0; r < n_rows; r += kPackedRows) {
      const int64_t left = n_rows - r;
      const __mmask16 m = left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << left) - 1);
      PackedQ4KGroup<NT>(packed + (r0 + r) / kPackedRows * nsb * kPackedSbBytes, nsb, x_quant + t * x_row_bytes,
                         x_row_bytes, y + t * y_stride + r, y_stride, m);
    }
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
const PackedKernels PackedQ4_K{&PackedQ4KBytes, &PackQ4K, &MatMulPackedQ4K};

}  // namespace avx512
}  // namespace kvfs::cpu
