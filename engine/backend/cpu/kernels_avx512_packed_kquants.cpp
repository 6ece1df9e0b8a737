// K-quant weights repacked at load (PackedKernels in kernels.h) into groups of 16 interleaved
// rows, as packed Q4_0 is (kernels_avx512_packed.cpp): Q4_K and Q6_K, the types of a q4_k_m
// model's matrices.
#include "engine/backend/cpu/kernels_avx512_kpanel.h"

namespace kvfs::cpu {
namespace {

#include "engine/backend/cpu/dpbusd_broadcast.h"

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
const PackedKernels PackedQ4_K{&PackedQ4KBytes, &PackQ4K, &MatMulPackedQ4K};
}  // namespace avx512
}  // namespace kvfs::cpu
