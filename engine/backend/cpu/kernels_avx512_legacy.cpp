// AVX-512 (VNNI, VBMI) dot products of the 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1 and
// Q8_0 with activations quantized to Q8_0 / Q8_1.
//
// Integer products use vpdpbusd (u8 x s8 -> s32): weight codes are made unsigned (nibbles are;
// Q8_0 codes get +128 by xor 0x80) and activations stay signed, so sum((q - off) * a) =
// dpbusd(q, a) - off * sum(a). Each block's exact int32 sum is then scaled in float, as the
// scalar reference does; only the float summation order differs.
//
// vec_dot: row kernels load 8 blocks at a time with whole-zmm loads and pick codes and scales
// out with byte/word permutes (a block is 18..36 bytes, unaligned).
// Decode (few tokens): the same weight unpacking against activations prepared once per call.
// Prefill (many tokens): panel kernels, see kernels_avx512_common.h.
#include "engine/backend/cpu/kernels_avx512_legacy_panel.h"

#include <type_traits>

namespace kvfs::cpu {
namespace {

// ------------------------------------------------------------------------------------------
// Row kernels.

// Unsigned codes of block pair p of a step: lanes of bytes 0..31 = block 2p, 32..63 = 2p+1.
template <class L, int kPair>
inline __m512i PairCodes(const Step8<L::kW>& ws) {
  if constexpr (L::kQ8) {
    return _mm512_xor_si512(PickPair<L::kW, Pick::kNatural, L::kQs, kPair>(ws), _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    __m512i c = UnpackDupNibbles(PickPair<L::kW, Pick::kDupQs, L::kQs, kPair>(ws));
    if constexpr (L::kQh >= 0) {
      const __m512i qh = PickPair<L::kW, Pick::kQhBytes, L::kQh, kPair>(ws);
      c = _mm512_mask_add_epi8(c, _mm512_test_epi8_mask(qh, Load(kQhBit)), c, _mm512_set1_epi8(16));
    }
    return c;
  }
}

template <class L, int kPair>
inline __m512 PairDot(__m512i codes, __m256 scale, const Step8<L::kA>& as, __m512 acc) {
  const __m512i a = PickPair<L::kA, Pick::kNatural, L::kAQs, kPair>(as);
  __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, a);
  if constexpr (L::kOffset != 0) {
    const __m512i off = _mm512_set1_epi8(static_cast<char>(L::kOffset));
    isum = _mm512_sub_epi32(isum, _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, a));
  }
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), SpreadPair<kPair>(scale), acc);
}

// 8 blocks of one weight row against NT activation rows: the weights are unpacked once, then
// each token's 8 blocks are loaded and used in turn (keeps the live registers few).
template <class L, int NT>
inline void RowStep(const uint8_t* w, const uint8_t* const (&xs)[NT], __m512 (&acc)[2][NT], __m256 (&accm)[NT]) {
  Step8<L::kW> ws;
  ws.Load(w);
  const __m512i c0 = PairCodes<L, 0>(ws), c1 = PairCodes<L, 1>(ws), c2 = PairCodes<L, 2>(ws),
                c3 = PairCodes<L, 3>(ws);
  const __m256 dw = PickHalves<L::kW, 0>(ws);
  __m256 m = _mm256_setzero_ps();
  if constexpr (L::kMin) m = PickHalves<L::kW, L::kM>(ws);
  for (int t = 0; t < NT; ++t) {
    Step8<L::kA> as;
    as.Load(xs[t]);
    const __m256 scale = _mm256_mul_ps(dw, PickHalves<L::kA, 0>(as));
    // Two accumulators per token halve the dependent-FMA chain.
    acc[0][t] = PairDot<L, 0>(c0, scale, as, acc[0][t]);
    acc[1][t] = PairDot<L, 1>(c1, scale, as, acc[1][t]);
    acc[0][t] = PairDot<L, 2>(c2, scale, as, acc[0][t]);
    acc[1][t] = PairDot<L, 3>(c3, scale, as, acc[1][t]);
    if constexpr (L::kMin) accm[t] = _mm256_fmadd_ps(m, PickHalves<L::kA, L::kAS>(as), accm[t]);
  }
}

// out[t] = dot(w, x[t]) over nb blocks.
template <class L, int NT>
void RowDot(const uint8_t* w, const uint8_t* const (&x)[NT], int64_t nb, float* out) {
  __m512 acc[2][NT];
  __m256 accm[NT];
  for (int t = 0; t < NT; ++t) {
    acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    accm[t] = _mm256_setzero_ps();
  }
  const uint8_t* xs[NT];
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    for (int t = 0; t < NT; ++t) xs[t] = x[t] + b * L::kA;
    RowStep<L, NT>(w + b * L::kW, xs, acc, accm);
  }
  if (b < nb) {
    // The last 1..7 blocks go through zero-padded copies (a zero scale adds nothing), so the
    // step never reads past the row.
    alignas(64) uint8_t wt[8 * L::kW] = {};
    alignas(64) uint8_t xt[NT][8 * L::kA] = {};
    std::memcpy(wt, w + b * L::kW, static_cast<size_t>((nb - b) * L::kW));
    for (int t = 0; t < NT; ++t) {
      std::memcpy(xt[t], x[t] + b * L::kA, static_cast<size_t>((nb - b) * L::kA));
      xs[t] = xt[t];
    }
    RowStep<L, NT>(wt, xs, acc, accm);
  }
  for (int t = 0; t < NT; ++t) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm[t]), _mm256_extractf128_ps(accm[t], 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    out[t] = HSum(_mm512_add_ps(acc[0][t], acc[1][t])) + _mm_cvtss_f32(m);
  }
}

template <class L>
float VecDot(const void* w, const void* a, int64_t n) {
  const uint8_t* x[1] = {static_cast<const uint8_t*>(a)};
  float out[1];
  RowDot<L, 1>(static_cast<const uint8_t*>(w), x, n / 32, out);
  return out[0];
}

// ------------------------------------------------------------------------------------------
// Decode path of matmul_tile: the few tokens' activations are first rearranged once per call
// ("prepared") into the layout the unpacked weights come in, with their per-block scale and
// offset term spread over the int32 lanes, so that the per-row work is only: unpack the weight
// codes, two vpdpbusd per 4 blocks (Q8_0: one per 2 blocks), int->float, two multiplies.
//
// Nibble formats use the quad layout: a zmm holds bytes 0..15 (low nibbles: elements 0..15,
// high nibbles: 16..31) of 4 blocks, so one permute of the raw blocks and an and / shift+and
// give the codes of 4 blocks; lanes 4b..4b+3 of the int32 sums belong to block b.

//
// Symmetric formats (x = d * (q - offset)) take the weights as signed codes q - offset and the
// activations as unsigned a + 128: sum((a + 128)(q - off)) = sum(a (q - off)) + 128 sum(q - off),
// and the last term depends on the weights only, so it is computed once per row and 4 blocks
// and serves every token (with the offset on the activation side it cost a load per token).
// Formats with a min have unsigned codes and signed activations, and no offset term.
struct alignas(64) QuadUnit {  // 4 blocks of one token
  int8_t lo[64];               // elements 0..15 of blocks 0..3 (symmetric formats: + 128, as u8)
  int8_t hi[64];               // elements 16..31
  float da[16];                // activation block scale, per lane
};
struct alignas(64) QuadUnitMin : QuadUnit {
  float c[16];  // s / 4 per lane (4 lanes add up to s)
};
struct alignas(64) PairUnit {  // Q8_0: 2 blocks of one token, natural order
  int8_t codes[64];
  int32_t corr[16];
  float da[16];
};
template <class L>
using PUnit = std::conditional_t<L::kQ8, PairUnit, std::conditional_t<L::kMin, QuadUnitMin, QuadUnit>>;
template <class L>
constexpr int kUnitsPerStep = L::kQ8 ? 4 : 2;  // per 8 blocks

// Stack space for prepared activations: all of K for up to 8 tokens of the usual widths (8
// tokens x 2048 inputs: 40 KiB, about L1; x 5632: 110 KiB, in L2). A K chunk that covers only
// part of the rows makes the weights stream as row segments, which measured 2-5x slower from
// DRAM than whole rows (the hardware prefetcher does not follow it), so chunks are a fallback
// for very wide matrices only.
constexpr int kPrepBytes = 192 * 1024;

template <class L>
void PrepareStep(const uint8_t* x, PUnit<L>* u) {
  Step8<L::kA> as;
  as.Load(x);
  const __m256 da8 = PickHalves<L::kA, 0>(as);
  if constexpr (L::kQ8) {
    const __m512i off = _mm512_set1_epi8(static_cast<char>(0x80));
    auto one = [&](auto pair, PairUnit& pu) {
      constexpr int kP = decltype(pair)::value;
      const __m512i a = PickPair<L::kA, Pick::kNatural, L::kAQs, kP>(as);
      _mm512_store_si512(pu.codes, a);
      _mm512_store_si512(pu.corr, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, a)));
      _mm512_store_ps(pu.da, SpreadPair<kP>(da8));
    };
    one(std::integral_constant<int, 0>{}, u[0]);
    one(std::integral_constant<int, 1>{}, u[1]);
    one(std::integral_constant<int, 2>{}, u[2]);
    one(std::integral_constant<int, 3>{}, u[3]);
  } else {
    auto one = [&](auto quad, PUnit<L>& qu) {
      constexpr int kQ = decltype(quad)::value;
      // Blocks 4q..4q+3 as two natural pairs, then their 16-byte halves regrouped.
      const __m512i p0 = PickPair<L::kA, Pick::kNatural, L::kAQs, 2 * kQ>(as);
      const __m512i p1 = PickPair<L::kA, Pick::kNatural, L::kAQs, 2 * kQ + 1>(as);
      __m512i lo = _mm512_shuffle_i64x2(p0, p1, 0x88);
      __m512i hi = _mm512_shuffle_i64x2(p0, p1, 0xDD);
      _mm512_store_ps(qu.da, SpreadQuad<kQ>(da8));
      if constexpr (L::kMin) {
        _mm512_store_ps(qu.c, _mm512_mul_ps(SpreadQuad<kQ>(PickHalves<L::kA, L::kAS>(as)), _mm512_set1_ps(0.25f)));
      } else {
        const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
        lo = _mm512_xor_si512(lo, x80);  // a + 128 as u8
        hi = _mm512_xor_si512(hi, x80);
      }
      _mm512_store_si512(qu.lo, lo);
      _mm512_store_si512(qu.hi, hi);
    };
    one(std::integral_constant<int, 0>{}, u[0]);
    one(std::integral_constant<int, 1>{}, u[1]);
  }
}

// Blocks [b0, b0 + 8 * steps) of one activation row, step s at out + s * step_stride units;
// blocks past nb read as zero.
template <class L>
void Prepare(const uint8_t* x, int64_t b0, int64_t steps, int64_t nb, PUnit<L>* out, int64_t step_stride) {
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t b = b0 + 8 * s;
    if (b + 8 <= nb) {
      PrepareStep<L>(x + b * L::kA, out + s * step_stride);
    } else {
      alignas(64) uint8_t tail[8 * L::kA] = {};
      std::memcpy(tail, x + b * L::kA, static_cast<size_t>((nb - b) * L::kA));
      PrepareStep<L>(tail, out + s * step_stride);
    }
  }
}

// Accumulator chains per (row, token): two halve the dependent-FMA chain while they fit in
// the 32 zmm registers with the codes and scales; with many (row, token) pairs one.
template <int R, int NT>
constexpr int kChains = R * NT > 8 ? 1 : 2;

// 8 blocks of R weight rows against NT tokens' prepared units (rows share each activation
// load).
template <class L, int R, int NT>
inline void PStep(const uint8_t* const (&w)[R], const PUnit<L>* const (&pu)[NT], __m512 (&acc)[kChains<R, NT>][R][NT]) {
  constexpr int kC = kChains<R, NT>;
  if constexpr (L::kQ8) {
    const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i c[R][4];
    __m512 s[R][4];
    for (int r = 0; r < R; ++r) {
      Step8<L::kW> ws;
      ws.Load(w[r]);
      const __m256 dw = PickHalves<L::kW, 0>(ws);
      c[r][0] = _mm512_xor_si512(PickPair<L::kW, Pick::kNatural, L::kQs, 0>(ws), x80);
      c[r][1] = _mm512_xor_si512(PickPair<L::kW, Pick::kNatural, L::kQs, 1>(ws), x80);
      c[r][2] = _mm512_xor_si512(PickPair<L::kW, Pick::kNatural, L::kQs, 2>(ws), x80);
      c[r][3] = _mm512_xor_si512(PickPair<L::kW, Pick::kNatural, L::kQs, 3>(ws), x80);
      s[r][0] = SpreadPair<0>(dw);
      s[r][1] = SpreadPair<1>(dw);
      s[r][2] = SpreadPair<2>(dw);
      s[r][3] = SpreadPair<3>(dw);
    }
    for (int t = 0; t < NT; ++t) {
      for (int p = 0; p < 4; ++p) {
        const PairUnit& u = pu[t][p];
        const __m512i corr = _mm512_load_si512(u.corr), a = _mm512_load_si512(u.codes);
        const __m512 da = _mm512_load_ps(u.da);
        for (int r = 0; r < R; ++r) {
          const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corr, c[r][p], a)), da);
          acc[p % kC][r][t] = _mm512_fmadd_ps(f, s[r][p], acc[p % kC][r][t]);
        }
      }
    }
  } else {
    __m512i lo[R][2], hi[R][2], init[R][2];
    __m512 s[R][2], m[R][2];
    for (int r = 0; r < R; ++r) {
      Step8<L::kW> ws;
      ws.Load(w[r]);
      auto unpack = [&](auto quad) {
        constexpr int kQ = decltype(quad)::value;
        const __m512i q = PickPair<L::kW, Pick::kQuadLo, L::kQs, kQ>(ws);
        lo[r][kQ] = _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
        hi[r][kQ] = _mm512_and_si512(_mm512_srli_epi16(q, 4), _mm512_set1_epi8(0x0F));
        if constexpr (L::kQh >= 0) {
          const __m512i bit = Load(kQhBit), sixteen = _mm512_set1_epi8(16);
          const __mmask64 ml = _mm512_test_epi8_mask(PickPair<L::kW, Pick::kQuadQhLo, L::kQh, kQ>(ws), bit);
          const __mmask64 mh = _mm512_test_epi8_mask(PickPair<L::kW, Pick::kQuadQhHi, L::kQh, kQ>(ws), bit);
          lo[r][kQ] = _mm512_mask_add_epi8(lo[r][kQ], ml, lo[r][kQ], sixteen);
          hi[r][kQ] = _mm512_mask_add_epi8(hi[r][kQ], mh, hi[r][kQ], sixteen);
        }
        if constexpr (L::kMin) {
          init[r][kQ] = _mm512_setzero_si512();
        } else {
          // Signed codes q - offset; the sums start at -128 * (sum of 4 codes) per lane.
          const __m512i off = _mm512_set1_epi8(static_cast<char>(L::kOffset)), x80 = _mm512_set1_epi8(static_cast<char>(0x80));
          lo[r][kQ] = _mm512_sub_epi8(lo[r][kQ], off);
          hi[r][kQ] = _mm512_sub_epi8(hi[r][kQ], off);
          const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), x80, lo[r][kQ]), x80, hi[r][kQ]);
          init[r][kQ] = _mm512_sub_epi32(_mm512_setzero_si512(), sum);
        }
      };
      unpack(std::integral_constant<int, 0>{});
      unpack(std::integral_constant<int, 1>{});
      const __m256 dw = PickHalves<L::kW, 0>(ws);
      s[r][0] = SpreadQuad<0>(dw);
      s[r][1] = SpreadQuad<1>(dw);
      if constexpr (L::kMin) {
        const __m256 m8 = PickHalves<L::kW, L::kM>(ws);
        m[r][0] = SpreadQuad<0>(m8);
        m[r][1] = SpreadQuad<1>(m8);
      }
    }
    for (int t = 0; t < NT; ++t) {
      for (int q = 0; q < 2; ++q) {
        const PUnit<L>& u = pu[t][q];
        const __m512i alo = _mm512_load_si512(u.lo), ahi = _mm512_load_si512(u.hi);
        const __m512 da = _mm512_load_ps(u.da);
        for (int r = 0; r < R; ++r) {
          // dpbusd multiplies unsigned bytes (first) by signed ones.
          const __m512i isum = L::kMin
              ? _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init[r][q], lo[r][q], alo), hi[r][q], ahi)
              : _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init[r][q], alo, lo[r][q]), ahi, hi[r][q]);
          const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), da);
          acc[q % kC][r][t] = _mm512_fmadd_ps(f, s[r][q], acc[q % kC][r][t]);  // a chain per quad: shorter
          if constexpr (L::kMin) acc[q % kC][r][t] = _mm512_fmadd_ps(m[r][q], _mm512_load_ps(u.c), acc[q % kC][r][t]);
        }
      }
    }
  }
}

// R rows (from r0) x NT tokens over prepared steps [s0, s0 + steps); prep holds, per step, the
// NT tokens' units one after another.
template <class L, int R, int NT>
inline void PRows(const uint8_t* w_rows, int64_t w_row_bytes, int64_t r0, const PUnit<L>* prep, int64_t s0,
                  int64_t steps, int64_t nb, float* y, int64_t y_stride) {
  constexpr int kC = kChains<R, NT>;
  __m512 acc[kC][R][NT];
  for (int c = 0; c < kC; ++c) {
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < NT; ++t) acc[c][r][t] = _mm512_setzero_ps();
    }
  }
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t b = 8 * (s0 + s);
    const PUnit<L>* pu[NT];
    for (int t = 0; t < NT; ++t) pu[t] = prep + (s * NT + t) * kUnitsPerStep<L>;
    const uint8_t* w[R];
    alignas(64) uint8_t tail[R][8 * L::kW];
    for (int r = 0; r < R; ++r) {
      w[r] = w_rows + (r0 + r) * w_row_bytes + b * L::kW;
      if (b + 8 > nb) {  // zero-padded copy of the last 1..7 blocks: zero scales add nothing
        std::memset(tail[r], 0, sizeof(tail[r]));
        std::memcpy(tail[r], w[r], static_cast<size_t>((nb - b) * L::kW));
        w[r] = tail[r];
      }
    }
    PStep<L, R, NT>(w, pu, acc);
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < NT; ++t) {
      const float v = HSum(kC == 2 ? _mm512_add_ps(acc[0][r][t], acc[kC - 1][r][t]) : acc[0][r][t]);
      float& out = y[t * y_stride + r0 + r];
      out = s0 == 0 ? v : out + v;
    }
  }
}

// Rows x NT tokens through prepared activations, K in chunks that fit the stack buffer.
template <class L, int NT>
void PRowsTokens(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x, int64_t x_row_bytes,
                 int64_t nb, float* y, int64_t y_stride) {
  constexpr int64_t kStepBytes = kUnitsPerStep<L> * static_cast<int64_t>(sizeof(PUnit<L>));
  constexpr int64_t kChunkSteps = kPrepBytes / (NT * kStepBytes);
  static_assert(kChunkSteps >= 1);
  // Rows per pass. 1: on Zen 5 two rows in lockstep (two DRAM streams sharing the activation
  // loads) measured slower from DRAM (~17 vs ~30 GB/s on one thread) though a little faster
  // from cache; decode reads from DRAM.
  constexpr int kR = 1;
  // Step-major ([step][token][unit]): the units one weight step meets are contiguous. (A
  // token-major buffer with a 48 KiB stride per token put every token's unit of a step in the
  // same L1 set: 8 tokens thrashed it.)
  alignas(64) PUnit<L> prep[kChunkSteps * NT * kUnitsPerStep<L>];
  const int64_t nsteps = (nb + 7) / 8;
  for (int64_t s0 = 0; s0 < nsteps; s0 += kChunkSteps) {
    const int64_t steps = nsteps - s0 < kChunkSteps ? nsteps - s0 : kChunkSteps;
    for (int t = 0; t < NT; ++t) Prepare<L>(x + t * x_row_bytes, 8 * s0, steps, nb, prep + t * kUnitsPerStep<L>, NT * kUnitsPerStep<L>);
    int64_t r = 0;
    for (; r + kR <= n_rows; r += kR) PRows<L, kR, NT>(w_rows, w_row_bytes, r, prep, s0, steps, nb, y, y_stride);
    for (; r < n_rows; ++r) PRows<L, 1, NT>(w_rows, w_row_bytes, r, prep, s0, steps, nb, y, y_stride);
  }
}

// ------------------------------------------------------------------------------------------
// Panel kernels.

template <class L>
void FillPanel(const uint8_t* w, int64_t w_row_bytes, int64_t rows, int ng, Panel& p) {
  for (int half = 0; half < 2; ++half) {
    for (int g = 0; g < ng; ++g) {
      __m256i r[16];
      LoadBlockRows<L>(w + 16 * half * w_row_bytes + g * L::kW, w_row_bytes, rows - 16 * half, r, p.dw[g] + 16 * half,
                       p.mw[g] + 16 * half);
      TransposeStore16x8(r, p.codes[g][0] + 64 * half);
    }
  }
}

template <class L>
void PanelTile(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant,
               int64_t x_row_bytes, int64_t n_tokens, int64_t nb, float* y, int64_t y_stride) {
  const auto fill = [&](int64_t r0, int64_t g0, int ng, Panel& p) {
    FillPanel<L>(w_rows + r0 * w_row_bytes + g0 * L::kW, w_row_bytes, n_rows - r0, ng, p);
  };
  // The next panel's rows (up to 32), each a run of ng blocks from block g0.
  const auto ahead = [&](int64_t r, int64_t g0, int ng, int part, int parts) {
    PrefetchRowsShare(w_rows + r * w_row_bytes + g0 * L::kW, w_row_bytes, n_rows - r < kPanelRows ? n_rows - r : kPanelRows,
                      ng * L::kW, part, parts);
  };
  PanelPasses<L>(n_rows, x_quant, x_row_bytes, n_tokens, nb, y, y_stride, fill, ahead);
}

template <class L>
void Tile(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
          int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  const int64_t nb = n_in / 32;
  if (n_tokens >= kPanelMinTokens) {
    PanelTile<L>(w_rows, w_row_bytes, n_rows, x_quant, x_row_bytes, n_tokens, nb, y, y_stride);
    return;
  }
  // Up to 8 tokens (a batched decode step of up to 8 sequences) in one pass over the weights:
  // they stream from DRAM once, whatever the batch. Q8_0 keeps 4 codes vectors and scales
  // per row in registers and spills beyond 4 tokens (measured 2x slower at 8): 4 per pass.
  // Past L1 (48 KiB) the prepared activations are read from L2 for every row: wide inputs
  // (TinyLlama's ffn_down, 5632: 68 KiB for 8 tokens) measured faster as two passes of 4.
  constexpr int64_t kPrepL1Bytes = 40 * 1024;
  const int64_t step_bytes = kUnitsPerStep<L> * static_cast<int64_t>(sizeof(PUnit<L>));
  const bool wide = 8 * ((nb + 7) / 8) * step_bytes > kPrepL1Bytes;
  const int64_t per_pass = L::kQ8 || wide ? 4 : 8;
  ForTokenPasses(n_tokens, per_pass, [&]<int NT>(int64_t t) {
    PRowsTokens<L, NT>(w_rows, w_row_bytes, n_rows, x_quant + t * x_row_bytes, x_row_bytes, nb, y + t * y_stride, y_stride);
  });
}

}  // namespace

namespace avx512 {

float VecDotQ4_0(const void* w, const void* a, int64_t n) { return VecDot<FmtQ4_0>(w, a, n); }
float VecDotQ4_1(const void* w, const void* a, int64_t n) { return VecDot<FmtQ4_1>(w, a, n); }
float VecDotQ5_0(const void* w, const void* a, int64_t n) { return VecDot<FmtQ5_0>(w, a, n); }
float VecDotQ5_1(const void* w, const void* a, int64_t n) { return VecDot<FmtQ5_1>(w, a, n); }
float VecDotQ8_0(const void* w, const void* a, int64_t n) { return VecDot<FmtQ8_0>(w, a, n); }

const MatMulTileFn TileQ4_0 = &Tile<FmtQ4_0>;
const MatMulTileFn TileQ4_1 = &Tile<FmtQ4_1>;
const MatMulTileFn TileQ5_0 = &Tile<FmtQ5_0>;
const MatMulTileFn TileQ5_1 = &Tile<FmtQ5_1>;
const MatMulTileFn TileQ8_0 = &Tile<FmtQ8_0>;

}  // namespace avx512
}  // namespace kvfs::cpu
