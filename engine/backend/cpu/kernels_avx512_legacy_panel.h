// The 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) as seen by the AVX-512 kernels,
// and the prefill panel kernel shared by the plain (kernels_avx512_legacy.cpp) and the
// row-interleaved (kernels_avx512_packed.cpp) weight layouts: both unpack weights into a Panel
// and run PanelTokens over it. Same rules as kernels_avx512_common.h: include only from files
// compiled with the AVX-512 flags; internal linkage.
#pragma once

#include "engine/backend/cpu/activation_code_sum.h"
#include "engine/backend/cpu/kernels_avx512_common.h"

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose (see kernels_avx512_common.h)

// Format of one weight type and of its activation blocks. Offsets are bytes within a block;
// -1 = field absent.
template <int kW_, int kQs_, int kQh_, int kM_, bool kQ8_, int kOffset_>
struct Legacy {
  static constexpr int kW = kW_;            // weight block bytes (fp16 d first)
  static constexpr int kQs = kQs_;          // nibbles (16 bytes) or int8 codes (32 bytes)
  static constexpr int kQh = kQh_;          // 4 bytes of 5th bits
  static constexpr int kM = kM_;            // fp16 block minimum m (x = d*q + m)
  static constexpr bool kQ8 = kQ8_;         // codes are int8 (made u8 by xor 0x80)
  static constexpr int kOffset = kOffset_;  // x = d * (q - offset) for the symmetric formats
  static constexpr bool kMin = kM_ >= 0;
  // Activations: Q8_1 (d, s, 32 codes) with a min, else Q8_0 (d, 32 codes).
  static constexpr int kA = kMin ? 36 : 34;
  static constexpr int kAQs = kMin ? 4 : 2;
  static constexpr int kAS = 2;  // fp16 s = d * sum(codes) of Q8_1
};
using FmtQ4_0 = Legacy<18, 2, -1, -1, false, 8>;
using FmtQ4_1 = Legacy<20, 4, -1, 2, false, 0>;
using FmtQ5_0 = Legacy<22, 6, 2, -1, false, 16>;
using FmtQ5_1 = Legacy<24, 8, 4, 2, false, 0>;
using FmtQ8_0 = Legacy<34, 2, -1, -1, true, 128>;

// 32 unsigned codes of one weight block, in element order.
template <class L>
inline __m256i BlockCodes(const uint8_t* b) {
  if constexpr (L::kQ8) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + L::kQs)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + L::kQs));
    const __m128i lo = _mm_and_si128(qs, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), _mm_set1_epi8(0x0F));
    __m256i c = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    if constexpr (L::kQh >= 0) {
      c = _mm256_mask_add_epi8(c, static_cast<__mmask32>(LoadU32(b + L::kQh)), c, _mm256_set1_epi8(16));
    }
    return c;
  }
}

// One block (b: row 0's) of 16 rows, row i at b + i * row_bytes: its unsigned codes into r[i],
// d and m (formats with a minimum) into dw[i], mw[i]; rows from `rows` on zero.
template <class L>
inline void LoadBlockRows(const uint8_t* b, int64_t row_bytes, int64_t rows, __m256i (&r)[16], float* dw, float* mw) {
  for (int i = 0; i < 16; ++i) {
    if (i < rows) {
      const uint8_t* bi = b + i * row_bytes;
      r[i] = BlockCodes<L>(bi);
      dw[i] = HalfToFloat(bi);
      if constexpr (L::kMin) mw[i] = HalfToFloat(bi + L::kM);
    } else {
      r[i] = _mm256_setzero_si256();
      dw[i] = 0.0f;
      if constexpr (L::kMin) mw[i] = 0.0f;
    }
  }
}

// Panel kernels: 32 rows unpacked to u8 codes, transposed (see kernels_avx512_common.h).
constexpr int kGroups = kChunkK / 32;  // blocks per K chunk

struct alignas(64) Panel {
  uint8_t codes[kGroups][8][128];  // [block][dword j][row * 4 + byte]: rows 0..15, then 16..31
  float dw[kGroups][kPanelRows];   // block scale d per row (0 for absent rows)
  float mw[kGroups][kPanelRows];   // block minimum m (formats with a min)
};

// Per (token, block) of the activations: scale and, for the symmetric formats, offset * sum of
// codes (int, subtracted before the int->float conversion), else Q8_1's s (float).
struct alignas(64) ActInfo {
  float da[kMaxTokenBlock][kGroups];
  int32_t corr[kMaxTokenBlock][kGroups];
  float sa[kMaxTokenBlock][kGroups];
};

template <class L>
void FillActInfo(const uint8_t* x, int64_t x_row_bytes, int nt, int ng, ActInfo& info) {
  for (int t = 0; t < nt; ++t) {
    for (int g = 0; g < ng; ++g) {
      const uint8_t* b = x + t * x_row_bytes + g * L::kA;
      info.da[t][g] = HalfToFloat(b);
      if constexpr (L::kMin) {
        info.sa[t][g] = HalfToFloat(b + L::kAS);
      } else {
        info.corr[t][g] = static_cast<int32_t>(L::kOffset * SumCodes32(b + L::kAQs));
      }
    }
  }
}

// NT tokens x 32 rows over ng blocks of a panel. x[t] points at token t's first block of the
// chunk; ti is the token's index in the ActInfo.
template <class L, int NT>
void PanelTokens(const Panel& p, int ng, const uint8_t* x, int64_t x_row_bytes, const ActInfo& info, int ti,
                 float* y, int64_t y_stride, __mmask16 m0, __mmask16 m1, bool accumulate) {
  // A later K chunk continues each row's sum from what the earlier chunks stored, so the sum is
  // one chain of fmas over the blocks in order, as in the packed row passes: a token's results
  // do not depend on whether its pass took the panels or the rows.
  __m512 acc[2][NT];
  for (int t = 0; t < NT; ++t) {
    acc[0][t] = accumulate ? _mm512_maskz_loadu_ps(m0, y + t * y_stride) : _mm512_setzero_ps();
    acc[1][t] = accumulate ? _mm512_maskz_loadu_ps(m1, y + t * y_stride + 16) : _mm512_setzero_ps();
  }
  for (int g = 0; g < ng; ++g) {
    __m512i isum[2][NT];
    for (int t = 0; t < NT; ++t) isum[0][t] = isum[1][t] = _mm512_setzero_si512();
    const uint8_t* xa = x + g * L::kA + L::kAQs;
    for (int j = 0; j < 8; ++j) {
      const __m512i w0 = _mm512_load_si512(p.codes[g][j]);
      const __m512i w1 = _mm512_load_si512(p.codes[g][j] + 64);
      for (int t = 0; t < NT; ++t) {
        const __m512i a = _mm512_set1_epi32(static_cast<int>(LoadU32(xa + t * x_row_bytes + 4 * j)));
        isum[0][t] = _mm512_dpbusd_epi32(isum[0][t], w0, a);
        isum[1][t] = _mm512_dpbusd_epi32(isum[1][t], w1, a);
      }
    }
    const __m512 dw0 = _mm512_load_ps(p.dw[g]), dw1 = _mm512_load_ps(p.dw[g] + 16);
    for (int t = 0; t < NT; ++t) {
      const __m512 da = _mm512_set1_ps(info.da[ti + t][g]);
      if constexpr (!L::kMin) {
        const __m512i corr = _mm512_set1_epi32(info.corr[ti + t][g]);
        isum[0][t] = _mm512_sub_epi32(isum[0][t], corr);
        isum[1][t] = _mm512_sub_epi32(isum[1][t], corr);
      }
      acc[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[0][t]), _mm512_mul_ps(dw0, da), acc[0][t]);
      acc[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[1][t]), _mm512_mul_ps(dw1, da), acc[1][t]);
      if constexpr (L::kMin) {
        const __m512 sa = _mm512_set1_ps(info.sa[ti + t][g]);
        acc[0][t] = _mm512_fmadd_ps(_mm512_load_ps(p.mw[g]), sa, acc[0][t]);
        acc[1][t] = _mm512_fmadd_ps(_mm512_load_ps(p.mw[g] + 16), sa, acc[1][t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    StoreRows(y + t * y_stride, acc[0][t], m0, false);
    StoreRows(y + t * y_stride + 16, acc[1][t], m1, false);
  }
}

// The panel loop of both weight layouts: K chunks of kGroups blocks, passes of TokensOfPass
// tokens, 32-row panels filled by fill(r, g0, ng, panel) (rows r.., blocks g0..g0+ng), then
// every token of the pass through PanelTokens, 4 at a time. Between those calls,
// ahead(r + kPanelRows, g0, ng, part, parts) prefetches part `part` of `parts` of what the next
// panel's fill reads, so the fill finds it in cache (PrefetchBytes). With it against without,
// alternated pass by pass in one process: tinyllama Q4_0 (packed) 512-token turns 5-8% faster, a
// pass of 8 agents' 17-token turns over 1024-token contexts 3-4.5% (prefetching all of the
// next panel at once before the tokens: 1-3%); Q8_0 (this layout) 3-6% and 7-10%.
template <class L, class Fill, class Ahead>
void PanelPasses(int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes, int64_t n_tokens, int64_t nb, float* y,
                 int64_t y_stride, Fill&& fill, Ahead&& ahead) {
  Panel panel;
  ActInfo info;
  for (int64_t g0 = 0; g0 < nb; g0 += kGroups) {
    const int ng = static_cast<int>(nb - g0 < kGroups ? nb - g0 : kGroups);
    const bool accumulate = g0 > 0;
    for (int64_t t0 = 0, nt = 0; t0 < n_tokens; t0 += nt) {
      nt = TokensOfPass(n_tokens - t0);
      const uint8_t* xc = x_quant + t0 * x_row_bytes + g0 * L::kA;
      FillActInfo<L>(xc, x_row_bytes, static_cast<int>(nt), ng, info);
      for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
        const int64_t rows = n_rows - r0;
        fill(r0, g0, ng, panel);
        const __mmask16 m0 = RowMask(rows, 0), m1 = RowMask(rows, 1);
        float* yb = y + t0 * y_stride + r0;
        const bool next = rows > kPanelRows;
        const int parts = static_cast<int>(nt / 4);
        int t = 0;
        for (; t + 4 <= nt; t += 4) {
          if (next) ahead(r0 + kPanelRows, g0, ng, t / 4, parts);
          PanelTokens<L, 4>(panel, ng, xc + t * x_row_bytes, x_row_bytes, info, t, yb + t * y_stride, y_stride, m0,
                            m1, accumulate);
        }
        const uint8_t* xt = xc + t * x_row_bytes;
        float* yt = yb + t * y_stride;
        switch (nt - t) {
          case 3: PanelTokens<L, 3>(panel, ng, xt, x_row_bytes, info, t, yt, y_stride, m0, m1, accumulate); break;
          case 2: PanelTokens<L, 2>(panel, ng, xt, x_row_bytes, info, t, yt, y_stride, m0, m1, accumulate); break;
          case 1: PanelTokens<L, 1>(panel, ng, xt, x_row_bytes, info, t, yt, y_stride, m0, m1, accumulate); break;
          default: break;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvfs::cpu
