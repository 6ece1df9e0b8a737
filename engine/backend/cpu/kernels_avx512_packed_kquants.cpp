// K-quant weights repacked at load (PackedKernels in kernels.h) into groups of 16 interleaved
// rows, as packed Q4_0 is (kernels_avx512_packed.cpp): Q4_K, Q5_K and Q6_K, the types of the
// q4_k_m and q5_k_m models' matrices.
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
// super-block, kPackedSbBytes<F> each (read in address order):
//   d[16], dmin[16]      f16, as stored
//   sc[8][16], m[8][16]  the 6-bit scales and mins, one byte each
//   codes[4][8][16][4]   pair c (sub-blocks 2c, 2c + 1), chunk k, row i: bytes 4k..4k+3 of
//                        the row's 32 code bytes of pair c (low nibbles: elements 4k..4k+3 of
//                        sub-block 2c; high nibbles: the same of 2c + 1)
//   qh[8][16][4]         Q5_K only: chunk k, row i: the row's qh bytes 4k..4k+3, whose bit s is
//                        the fifth bit of the code of element 4k.. of sub-block s
// (Q4_K: 2368 bytes a group, the rows' 2304 and 2.8%; Q5_K: 2880, the rows' 2816 and 2.3%.)
//
// Arithmetic: KPanelTokens' operations in its order, per row, token and super-block, whether
// the panels (prefill; filled from this layout) or the row groups (decode) run: so a token
// gets the same bits alone or among others.
constexpr int kPackedRows = 16;
constexpr int64_t kPackedScOffset = 64, kPackedMinOffset = 192, kPackedCodesOffset = 320, kPackedQhOffset = 2368;
template <KFmt F>
constexpr int64_t kPackedSbBytes = F == KFmt::kQ4K ? 2368 : 2880;
static_assert(kPackedSbBytes<KFmt::kQ4K> % 64 == 0 && kPackedSbBytes<KFmt::kQ5K> % 64 == 0);

template <KFmt F>
int64_t PackedQ45KBytes(int64_t n_rows, int64_t n_in) {
  return (n_rows + kPackedRows - 1) / kPackedRows * (n_in / kQK_K) * kPackedSbBytes<F>;
}

template <KFmt F>
void PackQ45K(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, int64_t n_in, uint8_t* dst) {
  constexpr int kQs = F == KFmt::kQ4K ? 16 : 48;
  const int64_t nsb = n_in / kQK_K, groups = (n_rows + kPackedRows - 1) / kPackedRows;
  std::memset(dst, 0, static_cast<size_t>(PackedQ45KBytes<F>(n_rows, n_in)));
  for (int64_t g = 0; g < groups; ++g) {
    for (int i = 0; i < kPackedRows && kPackedRows * g + i < n_rows; ++i) {
      const uint8_t* row = w_rows + (kPackedRows * g + i) * w_row_bytes;
      for (int64_t sb = 0; sb < nsb; ++sb) {
        const uint8_t* b = row + sb * kBlockBytes<F>;
        uint8_t* out = dst + (g * nsb + sb) * kPackedSbBytes<F>;
        std::memcpy(out + 2 * i, b, 2);
        std::memcpy(out + 32 + 2 * i, b + 2, 2);
        alignas(16) uint8_t scm[16];
        _mm_store_si128(reinterpret_cast<__m128i*>(scm), UnpackScalesMins(b + 4));
        for (int s = 0; s < 8; ++s) {
          out[kPackedScOffset + 16 * s + i] = scm[s];
          out[kPackedMinOffset + 16 * s + i] = scm[8 + s];
        }
        for (int c = 0; c < 4; ++c) {
          for (int k = 0; k < 8; ++k) std::memcpy(out + kPackedCodesOffset + 512 * c + 64 * k + 4 * i, b + kQs + 32 * c + 4 * k, 4);
        }
        if constexpr (F == KFmt::kQ5K) {
          for (int k = 0; k < 8; ++k) std::memcpy(out + kPackedQhOffset + 64 * k + 4 * i, b + 16 + 4 * k, 4);
        }
      }
    }
  }
}

// The per-row factors of one group's super-block, shared by the tokens of a pass.
struct PackedQ45KFactors {
  __m512 scale[8];  // d * sc[s], as KBlockScales makes it
  __m512i pairs[8];  // (m[s], m[s]) words
  __m512 dmin;
};

inline void LoadPackedQ45KFactors(const uint8_t* sbp, PackedQ45KFactors& f) {
  const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sbp)));
  f.dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sbp + 32)));
  for (int s = 0; s < 8; ++s) {
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sbp + kPackedScOffset + 16 * s)));
    f.scale[s] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    const __m512i m = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sbp + kPackedMinOffset + 16 * s)));
    f.pairs[s] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
  }
}

// Chunk k of pair c as the codes of sub-blocks 2c (lo) and 2c + 1 (hi): KGroupCodes' values.
template <KFmt F>
inline void PairCodes(const uint8_t* sbp, int c, int k, __m512i& lo, __m512i& hi) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i v = _mm512_load_si512(sbp + kPackedCodesOffset + 512 * c + 64 * k);
  lo = _mm512_and_si512(v, nibble);
  hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
  if constexpr (F == KFmt::kQ5K) {
    const __m512i qh = _mm512_load_si512(sbp + kPackedQhOffset + 64 * k), sixteen = _mm512_set1_epi8(16);
    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, _mm512_set1_epi8(static_cast<char>(1 << (2 * c)))), lo, sixteen);
    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, _mm512_set1_epi8(static_cast<char>(1 << (2 * c + 1)))), hi,
                              sixteen);
  }
}

// One group of 16 rows over all super-blocks against NT tokens (x: token 0's Q8_K row):
// y[t * y_stride + lane] = row . token t, for the lanes in m.
template <KFmt F, int NT>
void PackedQ45KGroup(const uint8_t* group, int64_t nsb, const uint8_t* x, int64_t x_row_bytes, float* y, int64_t y_stride,
                     __mmask16 m) {
  constexpr int64_t kSb = kPackedSbBytes<F>;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* sbp = group + sb * kSb;
    // The lines two super-blocks ahead (the stream the hardware prefetcher would start on only
    // after some misses).
    for (int i = 0; i < kSb / 64; ++i) asm volatile("prefetcht0 %0" ::"m"(*(sbp + 2 * kSb + 64 * i)));
    PackedQ45KFactors f;
    LoadPackedQ45KFactors(sbp, f);
    const uint8_t* xb = x + sb * kQ8KBytes;
    __m512 fs[NT];
    for (int t = 0; t < NT; ++t) fs[t] = _mm512_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      __m512i lo[8], hi[8];
      for (int k = 0; k < 8; ++k) PairCodes<F>(sbp, c, k, lo[k], hi[k]);
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
template <KFmt F>
void FillQ45KPanelPacked(const uint8_t* packed, int64_t group0, int64_t groups_left, int64_t nsb_total, int64_t sb0,
                         int nsb, KPanel& p) {
  for (int half = 0; half < 2; ++half) {
    const bool present = half < groups_left;
    for (int sb = 0; sb < nsb; ++sb) {
      const uint8_t* sbp = packed + ((group0 + half) * nsb_total + sb0 + sb) * kPackedSbBytes<F>;
      if (!present) {
        for (int s = 0; s < 8; ++s) {
          for (int j = 0; j < 8; ++j) _mm512_store_si512(p.codes[8 * sb + s][j] + 64 * half, _mm512_setzero_si512());
          _mm512_store_ps(p.scale[8 * sb + s][0] + 16 * half, _mm512_setzero_ps());
          _mm512_store_si512(p.pairs[sb][s] + 16 * half, _mm512_setzero_si512());
        }
        _mm512_store_ps(p.dmin[sb] + 16 * half, _mm512_setzero_ps());
        continue;
      }
      PackedQ45KFactors f;
      LoadPackedQ45KFactors(sbp, f);
      for (int s = 0; s < 8; ++s) {
        _mm512_store_ps(p.scale[8 * sb + s][0] + 16 * half, f.scale[s]);
        _mm512_store_si512(p.pairs[sb][s] + 16 * half, f.pairs[s]);
      }
      _mm512_store_ps(p.dmin[sb] + 16 * half, f.dmin);
      for (int c = 0; c < 4; ++c) {
        for (int k = 0; k < 8; ++k) {
          __m512i lo, hi;
          PairCodes<F>(sbp, c, k, lo, hi);
          _mm512_store_si512(p.codes[8 * sb + 2 * c][k] + 64 * half, lo);
          _mm512_store_si512(p.codes[8 * sb + 2 * c + 1][k] + 64 * half, hi);
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Packed Q6_K. Layout of a group, super-block by super-block (kPackedQ6SbBytes, 53 lines):
//   d[16]                f16, as stored
//   sc[16][16]           the 16 int8 sub-block scales (16 elements each), row-interleaved
//   (32 bytes of padding)
//   ql[2][2][8][16][4]   half h, pair q2, chunk k, row i: ql bytes 64h + 32q2 + 4k .. + 3 of
//                        the row (low nibbles: elements of group 4h + q2, high: of 4h + q2 + 2)
//   qh[2][8][16][4]      half h, chunk k, row i: qh bytes 32h + 4k .. + 3 (bits 2q, 2q + 1:
//                        group 4h + q)
// where group s is elements 32s .. 32s + 31 and its code k-th dword is elements 4k .. 4k + 3
// (KGroupCodes' arithmetic). The same bytes as the rows (3360 a group) and the padding.
constexpr int64_t kPackedQ6ScOffset = 32, kPackedQ6QlOffset = 320, kPackedQ6QhOffset = 320 + 2048;
constexpr int64_t kPackedQ6SbBytes = kPackedQ6QhOffset + 1024;
static_assert(kPackedQ6SbBytes % 64 == 0);

int64_t PackedQ6KBytes(int64_t n_rows, int64_t n_in) {
  return (n_rows + kPackedRows - 1) / kPackedRows * (n_in / kQK_K) * kPackedQ6SbBytes;
}

void PackQ6K(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, int64_t n_in, uint8_t* dst) {
  const int64_t nsb = n_in / kQK_K, groups = (n_rows + kPackedRows - 1) / kPackedRows;
  std::memset(dst, 0, static_cast<size_t>(PackedQ6KBytes(n_rows, n_in)));
  for (int64_t g = 0; g < groups; ++g) {
    for (int i = 0; i < kPackedRows && kPackedRows * g + i < n_rows; ++i) {
      const uint8_t* row = w_rows + (kPackedRows * g + i) * w_row_bytes;
      for (int64_t sb = 0; sb < nsb; ++sb) {
        const uint8_t* b = row + sb * kBlockBytes<KFmt::kQ6K>;
        uint8_t* out = dst + (g * nsb + sb) * kPackedQ6SbBytes;
        std::memcpy(out + 2 * i, b + 208, 2);
        for (int t = 0; t < 16; ++t) out[kPackedQ6ScOffset + 16 * t + i] = b[192 + t];
        for (int h = 0; h < 2; ++h) {
          for (int k = 0; k < 8; ++k) {
            for (int q2 = 0; q2 < 2; ++q2) {
              std::memcpy(out + kPackedQ6QlOffset + 64 * ((2 * h + q2) * 8 + k) + 4 * i, b + 64 * h + 32 * q2 + 4 * k, 4);
            }
            std::memcpy(out + kPackedQ6QhOffset + 64 * (8 * h + k) + 4 * i, b + 128 + 32 * h + 4 * k, 4);
          }
        }
      }
    }
  }
}

// The 8 code vectors (dword k of 16 rows) of group s of a packed super-block.
inline void PackedQ6KCodes(const uint8_t* sbp, int s, __m512i (&codes)[8]) {
  const int h = s / 4, q = s % 4;
  const __m512i bits45 = _mm512_set1_epi8(0x30), low4 = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 8; ++k) {
    const __m512i l = _mm512_load_si512(sbp + kPackedQ6QlOffset + 64 * ((2 * h + q % 2) * 8 + k));
    const __m512i hq = _mm512_load_si512(sbp + kPackedQ6QhOffset + 64 * (8 * h + k));
    // Bits 2q, 2q + 1 of each qh byte to bits 4, 5 (16-bit shifts: the bits that cross into
    // the next byte are masked away).
    const __m512i hb = q == 0 ? _mm512_slli_epi16(hq, 4) : q == 1 ? _mm512_slli_epi16(hq, 2) : q == 2 ? hq : _mm512_srli_epi16(hq, 2);
    const __m512i nib = q < 2 ? l : _mm512_srli_epi16(l, 4);
    codes[k] = _mm512_ternarylogic_epi32(nib, _mm512_and_si512(hb, bits45), low4, 0xEC);  // (nib & low4) | hb
  }
}

// The per-row factors of one group's super-block, as KBlockScales makes them.
struct alignas(64) PackedQ6KFactors {
  float scale[16][16];  // d * sc[t]
  int32_t pairs[8][16];  // (32 sc[2s], 32 sc[2s + 1]) words
  float d[16];
};

inline void LoadPackedQ6KFactors(const uint8_t* sbp, PackedQ6KFactors& f) {
  const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sbp)));
  _mm512_store_ps(f.d, d);
  __m512i sc[16];
  for (int t = 0; t < 16; ++t) {
    sc[t] = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sbp + kPackedQ6ScOffset + 16 * t)));
    _mm512_store_ps(f.scale[t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc[t])));
  }
  for (int s = 0; s < 8; ++s) {
    const __m512i lo = _mm512_and_si512(_mm512_slli_epi32(sc[2 * s], 5), _mm512_set1_epi32(0xFFFF));
    _mm512_store_si512(f.pairs[s], _mm512_or_si512(lo, _mm512_slli_epi32(sc[2 * s + 1], 21)));
  }
}

// One group of 16 rows over all super-blocks against NT tokens: KPanelTokens<kQ6K>'s
// operations per row.
template <int NT>
void PackedQ6KGroup(const uint8_t* group, int64_t nsb, const uint8_t* x, int64_t x_row_bytes, float* y, int64_t y_stride,
                    __mmask16 m) {
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  PackedQ6KFactors f;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* sbp = group + sb * kPackedQ6SbBytes;
    for (int i = 0; i < kPackedQ6SbBytes / 64; ++i) asm volatile("prefetcht0 %0" ::"m"(*(sbp + 2 * kPackedQ6SbBytes + 64 * i)));
    LoadPackedQ6KFactors(sbp, f);
    const uint8_t* xb = x + sb * kQ8KBytes;
    __m512 fs[NT];
    for (int t = 0; t < NT; ++t) fs[t] = _mm512_setzero_ps();
    for (int s = 0; s < 8; ++s) {
      __m512i codes[8];
      PackedQ6KCodes(sbp, s, codes);
      for (int t = 0; t < NT; ++t) {
        const uint8_t* a = xb + t * x_row_bytes + kQ8KQs + 32 * s;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          s0 = DpbusdBroadcast(s0, codes[k], a + 4 * k);
          s1 = DpbusdBroadcast(s1, codes[4 + k], a + 16 + 4 * k);
        }
        fs[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_load_ps(f.scale[2 * s]), fs[t]);
        fs[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_load_ps(f.scale[2 * s + 1]), fs[t]);
      }
    }
    const __m512 d = _mm512_load_ps(f.d);
    for (int t = 0; t < NT; ++t) {
      const uint8_t* xt = xb + t * x_row_bytes;
      __m512i mi = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) {
        mi = _mm512_dpwssd_epi32(mi, _mm512_load_si512(f.pairs[i]), _mm512_set1_epi32(static_cast<int>(LoadU32(xt + kQ8KSums + 4 * i))));
      }
      const __m512 r = _mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi), d, fs[t]), _mm512_set1_ps(LoadF32(xt)));
      acc[t] = sb == 0 ? r : _mm512_add_ps(r, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) StoreRows(y + t * y_stride, acc[t], m, false);
}

void FillQ6KPanelPacked(const uint8_t* packed, int64_t group0, int64_t groups_left, int64_t nsb_total, int64_t sb0,
                        int nsb, KPanel& p) {
  PackedQ6KFactors f;
  for (int half = 0; half < 2; ++half) {
    const bool present = half < groups_left;
    for (int sb = 0; sb < nsb; ++sb) {
      const uint8_t* sbp = packed + ((group0 + half) * nsb_total + sb0 + sb) * kPackedQ6SbBytes;
      if (present) LoadPackedQ6KFactors(sbp, f);
      for (int s = 0; s < 8; ++s) {
        __m512i codes[8];
        if (present) PackedQ6KCodes(sbp, s, codes);
        for (int k = 0; k < 8; ++k) _mm512_store_si512(p.codes[8 * sb + s][k] + 64 * half, present ? codes[k] : _mm512_setzero_si512());
        for (int part = 0; part < 2; ++part) {
          _mm512_store_ps(p.scale[8 * sb + s][part] + 16 * half, present ? _mm512_load_ps(f.scale[2 * s + part]) : _mm512_setzero_ps());
        }
        _mm512_store_si512(p.pairs[sb][s] + 16 * half, present ? _mm512_load_si512(f.pairs[s]) : _mm512_setzero_si512());
      }
      _mm512_store_ps(p.dmin[sb] + 16 * half, present ? _mm512_load_ps(f.d) : _mm512_setzero_ps());
    }
  }
}
// The packed formats' functions.
template <KFmt F>
struct PackedK {
  static constexpr int64_t kSbBytes = F == KFmt::kQ6K ? kPackedQ6SbBytes : kPackedSbBytes<F>;
  static constexpr int64_t kPanelMinTokens = F == KFmt::kQ6K ? kPanelMinTokensQ6K : kPanelMinTokensK;
  static void Fill(const uint8_t* packed, int64_t group0, int64_t groups_left, int64_t nsb_total, int64_t sb0, int nsb,
                   KPanel& p) {
    if constexpr (F == KFmt::kQ6K) FillQ6KPanelPacked(packed, group0, groups_left, nsb_total, sb0, nsb, p);
    else FillQ45KPanelPacked<F>(packed, group0, groups_left, nsb_total, sb0, nsb, p);
  }
  template <int NT>
  static void Group(const uint8_t* group, int64_t nsb, const uint8_t* x, int64_t x_row_bytes, float* y, int64_t y_stride,
                    __mmask16 m) {
    if constexpr (F == KFmt::kQ6K) PackedQ6KGroup<NT>(group, nsb, x, x_row_bytes, y, y_stride, m);
    else PackedQ45KGroup<F, NT>(group, nsb, x, x_row_bytes, y, y_stride, m);
  }
};

// KPanelTile's passes over the packed layout; the next panel's groups prefetched in shares.
template <KFmt F>
void PackedKPanels(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                   int64_t n_tokens, int64_t nsb_total, float* y, int64_t y_stride) {
  constexpr int64_t kSb = PackedK<F>::kSbBytes;
  const auto fill = [&](int64_t r, int64_t sb0, int nsb, KPanel& p) {
    const int64_t rows = n_rows - r;
    PackedK<F>::Fill(packed, (r0 + r) / kPackedRows, (rows + kPackedRows - 1) / kPackedRows, nsb_total, sb0, nsb, p);
  };
  const auto ahead = [&](int64_t r, int64_t sb0, int nsb, int64_t part, int64_t parts) {
    const int64_t groups = n_rows - r > kPackedRows ? 2 : 1, per_group = nsb * kSb / 64, lines = groups * per_group;
    const uint8_t* first = packed + ((r0 + r) / kPackedRows * nsb_total + sb0) * kSb;
    for (int64_t i = lines * part / parts, end = lines * (part + 1) / parts; i < end; ++i) {
      PrefetchBytes(first + (i / per_group) * nsb_total * kSb + 64 * (i % per_group), 64);
    }
  };
  KPanelPasses<F>(n_rows, x_quant, x_row_bytes, n_tokens, nsb_total, y, y_stride, fill, ahead);
}

template <KFmt F>
void MatMulPackedK(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                   int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  const int64_t nsb = n_in / kQK_K;
  if (n_tokens >= PackedK<F>::kPanelMinTokens) {
    PackedKPanels<F>(packed, r0, n_rows, x_quant, x_row_bytes, n_tokens, nsb, y, y_stride);
    return;
  }
  ForTokenPasses(n_tokens, 4, [&]<int NT>(int64_t t) {
    for (int64_t r = 0; r < n_rows; r += kPackedRows) {
      const int64_t left = n_rows - r;
      const __mmask16 m = RowMask(left, 0);
      PackedK<F>::template Group<NT>(packed + (r0 + r) / kPackedRows * nsb * PackedK<F>::kSbBytes, nsb,
                                     x_quant + t * x_row_bytes, x_row_bytes, y + t * y_stride + r, y_stride, m);
    }
  });
}

}  // namespace

namespace avx512 {
const PackedKernels PackedQ4_K{&PackedQ45KBytes<KFmt::kQ4K>, &PackQ45K<KFmt::kQ4K>, &MatMulPackedK<KFmt::kQ4K>};
const PackedKernels PackedQ5_K{&PackedQ45KBytes<KFmt::kQ5K>, &PackQ45K<KFmt::kQ5K>, &MatMulPackedK<KFmt::kQ5K>};
const PackedKernels PackedQ6_K{&PackedQ6KBytes, &PackQ6K, &MatMulPackedK<KFmt::kQ6K>};
}  // namespace avx512
}  // namespace kvfs::cpu
