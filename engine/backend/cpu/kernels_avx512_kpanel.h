// The K-quant super-block formats (Q4_K, Q5_K, Q6_K) against Q8_K activations as the AVX-512
// kernels see them, and the prefill panel kernel shared by the plain layout
// (kernels_avx512_kquants.cpp) and the row-interleaved one (kernels_avx512_packed_kquants.cpp):
// both fill a KPanel and run KPanelTokens over it. Same rules as kernels_avx512_common.h:
// include only from files compiled with the AVX-512 flags; internal linkage.
#pragma once

#include "engine/backend/cpu/kernels_avx512_common.h"

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose (see kernels_avx512_common.h)

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

// Panel kernels (kernels_avx512_common.h): 32 rows x 2 super-blocks unpacked and transposed.

constexpr int kSbPerChunk = kChunkK / kQK_K;  // 2
constexpr int kGroupsK = kChunkK / 32;        // 16 groups of 32 elements

struct alignas(64) KPanel {
  uint8_t codes[kGroupsK][8][128];        // [group][dword j][row * 4 + byte]
  float scale[kGroupsK][2][kPanelRows];   // d * sub-block scale; Q6_K: one per 16 elements
  int32_t pairs[kSbPerChunk][8][kPanelRows];  // words multiplying bsums dword i (mins / 32*sc)
  float dmin[kSbPerChunk][kPanelRows];    // float scale of that sum (Q6_K: d)
};

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

// The panel loop of both weight layouts: K chunks of kSbPerChunk super-blocks, passes of
// TokensOfPass tokens, 32-row panels filled by fill(r0, sb0, nsb, panel) (rows r0.., super-blocks
// sb0..sb0+nsb), then every token of the pass through KPanelTokens, 4 at a time; before each of
// those calls, when a next panel exists, ahead(r0 + kPanelRows, sb0, nsb, part, parts) prefetches
// part `part` of `parts` of what its fill reads.
template <KFmt F, class Fill, class Ahead>
void KPanelPasses(int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes, int64_t n_tokens, int64_t nsb_total,
                  float* y, int64_t y_stride, Fill&& fill, Ahead&& ahead) {
  KPanel panel;
  for (int64_t sb0 = 0; sb0 < nsb_total; sb0 += kSbPerChunk) {
    const int nsb = static_cast<int>(nsb_total - sb0 < kSbPerChunk ? nsb_total - sb0 : kSbPerChunk);
    const bool accumulate = sb0 > 0;
    for (int64_t t0 = 0, nt = 0; t0 < n_tokens; t0 += nt) {
      nt = TokensOfPass(n_tokens - t0);
      const uint8_t* xc = x_quant + t0 * x_row_bytes + sb0 * kQ8KBytes;
      for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
        const int64_t rows = n_rows - r0;
        fill(r0, sb0, nsb, panel);
        const __mmask16 m0 = RowMask(rows, 0), m1 = RowMask(rows, 1);
        float* yb = y + t0 * y_stride + r0;
        const bool next = rows > kPanelRows;
        int64_t t = 0;
        for (; t + 4 <= nt; t += 4) {
          if (next) ahead(r0 + kPanelRows, sb0, nsb, t / 4, nt / 4);
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

}  // namespace
}  // namespace kvfs::cpu
