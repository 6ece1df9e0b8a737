// K-quant weights repacked at load for the ymm tables: Q4_K, Q5_K and Q6_K, the matrices of
// q4_k_m and q5_k_m models, in groups of 8 interleaved rows, one dword lane per row, as packed
// Q4_0 is (packed_rows_kernel.h). Included by kernels_avx2_packed_kquants.cpp (the AVX2 table,
// and the AVX-512BW table, which starts from it) and kernels_avxvnni_packed.cpp (the avxvnni
// table: compiled with AVX-VNNI, whose vpdpbusd replaces the int16 steps below; the integer sums
// are exact either way, so the two give the same bits). Internal linkage, compiled with the
// including file's flags.
//
// Why: the plain AVX2 kernel (kernels_avx2_quants.cpp) unpacks a row's scales and mins and sums
// 8 lanes across for every row, super-block and token. One-token decode of tinyllama q4_k_m ran
// at 33% of the read bandwidth with it (Emerald Rapids, KVFS_CPU=avx2), where packed Q4_0
// reaches ~100%. Here a 32-byte load holds 4 code bytes of each of 8 rows, one vpmaddubsw
// against a broadcast activation dword advances all 8, and a super-block's factors are made
// once per 8 rows and shared by the tokens of a pass.
//
// Arithmetic: per row, token and super-block, the operations of the AVX-512 packed kernels
// (kernels_avx512_packed_kquants.cpp) in their order: each sub-block's (Q6_K: each 16
// elements') integer sum exactly, fs += float(sum) * (d * sc) in sub-block order, the mins'
// integer sum mi, r = (fs - mi * dmin) * d_y, then acc += r over the super-blocks. So these
// tables and the AVX-512 ones give a row the same bits (KernelConformance.PackedSameBitsInEveryTable).
//
// Exact int16 steps (without AVX-VNNI): the codes are unsigned (Q4_K < 16, Q5_K < 32, Q6_K < 64) against
// activations in -127..127, so a vpmaddubsw pair sum stays below 2 * 63 * 127 = 16002 and never
// saturates, and kI16Chunks pair vectors add in int16 below 2^15 (Q4_K 8 x 3810, Q5_K 4 x 7874,
// Q6_K 2 x 16002) before vpmaddwd widens them.
#pragma once

#include "engine/backend/cpu/kernels_avx2_common.h"

#if defined(__AVXVNNI__)
#define KVFS_KQUANTS_YMM_VNNI 1
#else
#define KVFS_KQUANTS_YMM_VNNI 0
#endif

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

constexpr int kRows = 8;
constexpr int64_t kQ8KBytes = 292, kQ8KQs = 4, kQ8KSums = 260;  // float d, int8 qs[256], int16 bsums[16]

// Layout of a group (rows 8g .. 8g + 7; rows past the matrix are zero), super-block by
// super-block, kSbBytes<F> each, read in address order. Q4_K and Q5_K:
//   d[8], dmin[8]        f16, as stored                                      at 0, 16
//   sc[8][8], m[8][8]    the 6-bit scales and mins, one byte each             at 32, 96
//   codes[4][8][8][4]    pair c (sub-blocks 2c, 2c + 1), chunk k, row i: bytes 4k..4k+3 of the
//                        row's 32 code bytes of pair c (low nibbles: elements 4k..4k+3 of
//                        sub-block 2c, high nibbles: of 2c + 1)                at 160
//   qh[8][8][4]          Q5_K only: chunk k, row i: the row's qh bytes 4k..4k+3, whose bit s
//                        is the fifth bit of element 4k.. of sub-block s      at 1184
// Q6_K (sub-block s = elements 32s..32s+31, half h = s / 4, q = s % 4):
//   d[8]                 f16, then 16 bytes of padding                        at 0
//   sc[16][8]            the int8 scales of 16 elements each                  at 32
//   ql[2][2][8][8][4]    half h, q % 2, chunk k, row i: ql bytes 64h + 32(q % 2) + 4k .. + 3
//                        (low nibbles for q < 2, high for q >= 2)              at 160
//   qh[2][8][8][4]       half h, chunk k, row i: qh bytes 32h + 4k .. + 3 (bits 2q, 2q + 1)
//                                                                             at 1184
// Every piece is a multiple of 32 bytes, so the kernels' loads are aligned (the backend
// allocates packed matrices 64-byte aligned). Sizes: the rows' bytes (8 x 144, 176, 210) plus
// 32 bytes a super-block, 16 for Q6_K.
constexpr int64_t kScOffset = 32, kMinOffset = 96, kCodesOffset = 160, kQhOffset = 1184;
constexpr int64_t kQ6ScOffset = 32, kQ6QlOffset = 160, kQ6QhOffset = 1184;
template <KFmt F>
constexpr int64_t kSbBytes = F == KFmt::kQ4K ? 1184 : F == KFmt::kQ5K ? 1440 : 1696;
static_assert(kSbBytes<KFmt::kQ4K> % 32 == 0 && kSbBytes<KFmt::kQ5K> % 32 == 0 && kSbBytes<KFmt::kQ6K> % 32 == 0);
template <KFmt F>
constexpr int kI16Chunks = F == KFmt::kQ4K ? 8 : F == KFmt::kQ5K ? 4 : 2;

// Tokens one sweep serves (each group's weights are read from DRAM once a sweep, by its first
// pass; a group's row is at most ~70 KB, in L2 for the other passes) and tokens a pass (the 16
// ymm registers hold 4 tokens' int16 and int32 sums with the codes; the float sums spill).
constexpr int64_t kSweepTokens = 16;
constexpr int kPassTokens = 4;

template <KFmt F>
int64_t PackedBytes(int64_t n_rows, int64_t n_in) {
  return (n_rows + kRows - 1) / kRows * (n_in / kQK_K) * kSbBytes<F>;
}

template <KFmt F>
void PackRows(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, int64_t n_in, uint8_t* dst) {
  const int64_t nsb = n_in / kQK_K, groups = (n_rows + kRows - 1) / kRows;
  std::memset(dst, 0, static_cast<size_t>(PackedBytes<F>(n_rows, n_in)));
  for (int64_t g = 0; g < groups; ++g) {
    for (int i = 0; i < kRows && kRows * g + i < n_rows; ++i) {
      const uint8_t* row = w_rows + (kRows * g + i) * w_row_bytes;
      for (int64_t sb = 0; sb < nsb; ++sb) {
        const uint8_t* b = row + sb * kBlockBytes<F>;
        uint8_t* out = dst + (g * nsb + sb) * kSbBytes<F>;
        if constexpr (F == KFmt::kQ6K) {
          std::memcpy(out + 2 * i, b + 208, 2);
          for (int t = 0; t < 16; ++t) out[kQ6ScOffset + 8 * t + i] = b[192 + t];
          for (int h = 0; h < 2; ++h) {
            for (int k = 0; k < 8; ++k) {
              for (int q2 = 0; q2 < 2; ++q2) {
                std::memcpy(out + kQ6QlOffset + 32 * ((2 * h + q2) * 8 + k) + 4 * i, b + 64 * h + 32 * q2 + 4 * k, 4);
              }
              std::memcpy(out + kQ6QhOffset + 32 * (8 * h + k) + 4 * i, b + 128 + 32 * h + 4 * k, 4);
            }
          }
        } else {
          constexpr int kQs = F == KFmt::kQ4K ? 16 : 48;
          std::memcpy(out + 2 * i, b, 2);
          std::memcpy(out + 16 + 2 * i, b + 2, 2);
          uint8_t sc[8], m[8];
          UnpackScalesMins(b + 4, sc, m);
          for (int s = 0; s < 8; ++s) {
            out[kScOffset + 8 * s + i] = sc[s];
            out[kMinOffset + 8 * s + i] = m[s];
          }
          for (int c = 0; c < 4; ++c) {
            for (int k = 0; k < 8; ++k) std::memcpy(out + kCodesOffset + 256 * c + 32 * k + 4 * i, b + kQs + 32 * c + 4 * k, 4);
          }
          if constexpr (F == KFmt::kQ5K) {
            for (int k = 0; k < 8; ++k) std::memcpy(out + kQhOffset + 32 * k + 4 * i, b + 16 + 4 * k, 4);
          }
        }
      }
    }
  }
}

inline __m256i Load(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i LoadBytes8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i Broadcast32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

// Dword k (elements 4k..4k+3) of sub-block s of the group's 8 rows: unsigned codes.
template <KFmt F>
inline __m256i SubBlockCodes(const uint8_t* sbp, int s, int k) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (F == KFmt::kQ6K) {
    const int h = s / 4, q = s % 4;
    const __m256i l = Load(sbp + kQ6QlOffset + 32 * ((2 * h + q % 2) * 8 + k));
    const __m256i hq = Load(sbp + kQ6QhOffset + 32 * (8 * h + k));
    const __m256i nib = q < 2 ? _mm256_and_si256(l, low4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), low4);
    // Bits 2q, 2q + 1 of each qh byte to bits 4, 5 (16-bit shifts: the bits that cross into the
    // next byte are masked away).
    const __m256i hb = q == 0 ? _mm256_slli_epi16(hq, 4) : q == 1 ? _mm256_slli_epi16(hq, 2) : q == 2 ? hq : _mm256_srli_epi16(hq, 2);
    return _mm256_or_si256(nib, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
  } else {
    const __m256i v = Load(sbp + kCodesOffset + 256 * (s / 2) + 32 * k);
    __m256i codes = s % 2 == 0 ? _mm256_and_si256(v, low4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    if constexpr (F == KFmt::kQ5K) {
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << s));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(Load(sbp + kQhOffset + 32 * k), bit), bit);
      codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return codes;
  }
}

// A super-block's per-row factors, shared by the tokens of a pass: the AVX-512 packed
// kernels' values.
struct alignas(32) Factors {
  float scale[16][kRows];   // d * sc: per sub-block (Q6_K: per 16 elements)
  int32_t pairs[8][kRows];  // words against the activations' bsums dword i: (m[i], m[i]); Q6_K (32 sc[2i], 32 sc[2i + 1])
  float dmin[kRows];        // the float scale of that sum (Q6_K: d)
};

template <KFmt F>
inline void LoadFactors(const uint8_t* sbp, Factors& f) {
  const __m256 d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sbp)));
  if constexpr (F == KFmt::kQ6K) {
    _mm256_store_ps(f.dmin, d);
    __m256i sc[16];
    for (int t = 0; t < 16; ++t) {
      sc[t] = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sbp + kQ6ScOffset + 8 * t)));
      _mm256_store_ps(f.scale[t], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc[t])));
    }
    for (int s = 0; s < 8; ++s) {
      const __m256i lo = _mm256_and_si256(_mm256_slli_epi32(sc[2 * s], 5), _mm256_set1_epi32(0xFFFF));
      _mm256_store_si256(reinterpret_cast<__m256i*>(f.pairs[s]), _mm256_or_si256(lo, _mm256_slli_epi32(sc[2 * s + 1], 21)));
    }
  } else {
    _mm256_store_ps(f.dmin, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sbp + 16))));
    for (int s = 0; s < 8; ++s) {
      _mm256_store_ps(f.scale[s], _mm256_mul_ps(d, _mm256_cvtepi32_ps(LoadBytes8(sbp + kScOffset + 8 * s))));
      const __m256i m = LoadBytes8(sbp + kMinOffset + 8 * s);
      _mm256_store_si256(reinterpret_cast<__m256i*>(f.pairs[s]), _mm256_or_si256(m, _mm256_slli_epi32(m, 16)));
    }
  }
}

// One group (`rows` <= 8 of its rows) over all nsb super-blocks against NT tokens (x: token
// 0's Q8_K row): y[t * y_stride + i] = row i . token t.
template <KFmt F, int NT>
void GroupTokens(const uint8_t* group, int64_t nsb, const uint8_t* x, int64_t x_row_bytes, bool prefetch, float* y,
                 int64_t y_stride, int64_t rows) {
  constexpr int64_t kSb = kSbBytes<F>;
  constexpr int kParts = F == KFmt::kQ6K ? 2 : 1, kPartChunks = 8 / kParts;
  [[maybe_unused]] constexpr int kI16 = kI16Chunks<F>;          // (the int16 steps')
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NT];
  Factors f;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* sbp = group + sb * kSb;
    if (prefetch) {
      // The lines two super-blocks ahead (the stream the hardware prefetcher would start on
      // only after some misses); a prefetch never faults.
      for (int i = 0; i < (kSb + 63) / 64; ++i) asm volatile("prefetcht0 %0" ::"m"(*(sbp + 2 * kSb + 64 * i)));
    }
    LoadFactors<F>(sbp, f);
    const uint8_t* xb = x + sb * kQ8KBytes;
    __m256 fs[NT];
    for (int t = 0; t < NT; ++t) fs[t] = _mm256_setzero_ps();
    for (int s = 0; s < 8; ++s) {
      for (int part = 0; part < kParts; ++part) {
        __m256i isum[NT];  // the int32 sum (with AVX-VNNI: its even chunks' vpdpbusd chain)
#if KVFS_KQUANTS_YMM_VNNI
        __m256i odd[NT];  // the odd chunks' chain
#else
        __m256i s16[NT];  // int16 pair sums
#endif
        // Unrolled, so that the chains' choices by j are made at compile time (GCC 12 left this
        // loop rolled with AVX-VNNI, branching on j: 8 tokens 1.7x slower than AVX2's).
#pragma GCC unroll 8
        for (int j = 0; j < kPartChunks; ++j) {
          const int k = part * kPartChunks + j;
          const __m256i codes = SubBlockCodes<F>(sbp, s, k);
          for (int t = 0; t < NT; ++t) {
            const __m256i act = Broadcast32(xb + t * x_row_bytes + kQ8KQs + 32 * s + 4 * k);
#if KVFS_KQUANTS_YMM_VNNI
            // Two chains, the even chunks' and the odd ones', joined after the last chunk.
            if (j % 2 == 0) {
              isum[t] = _mm256_dpbusd_avx_epi32(j == 0 ? _mm256_setzero_si256() : isum[t], codes, act);
            } else {
              odd[t] = _mm256_dpbusd_avx_epi32(j == 1 ? _mm256_setzero_si256() : odd[t], codes, act);
            }
            if (j == kPartChunks - 1) isum[t] = _mm256_add_epi32(isum[t], odd[t]);
#else
            const __m256i p = _mm256_maddubs_epi16(codes, act);
            s16[t] = j % kI16 == 0 ? p : _mm256_add_epi16(s16[t], p);
            if (j % kI16 == kI16 - 1) {
              const __m256i wide = _mm256_madd_epi16(s16[t], ones);
              isum[t] = j < kI16 ? wide : _mm256_add_epi32(isum[t], wide);
            }
#endif
          }
        }
        const __m256 scale = _mm256_load_ps(f.scale[kParts * s + part]);
        for (int t = 0; t < NT; ++t) fs[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scale, fs[t]);
      }
    }
    const __m256 dmin = _mm256_load_ps(f.dmin);
    for (int t = 0; t < NT; ++t) {
      const uint8_t* xt = xb + t * x_row_bytes;
      __m256i mi = _mm256_setzero_si256();
      for (int i = 0; i < 8; ++i) {
        const __m256i words = _mm256_load_si256(reinterpret_cast<const __m256i*>(f.pairs[i]));
        mi = _mm256_add_epi32(mi, _mm256_madd_epi16(words, Broadcast32(xt + kQ8KSums + 4 * i)));
      }
      const __m256 r = _mm256_mul_ps(_mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi), dmin, fs[t]), _mm256_set1_ps(LoadF32(xt)));
      acc[t] = sb == 0 ? r : _mm256_add_ps(r, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    if (rows == kRows) {
      _mm256_storeu_ps(y + t * y_stride, acc[t]);
    } else {
      alignas(32) float part[kRows];
      _mm256_store_ps(part, acc[t]);
      std::memcpy(y + t * y_stride, part, sizeof(float) * static_cast<size_t>(rows));
    }
  }
}

// Rows [r0, r0 + n_rows) of the packed matrix (r0 a multiple of 8) x n_tokens: sweeps of
// kSweepTokens, each group in passes of kPassTokens; only a sweep's first pass over a group
// prefetches (the others find its weights in cache). A token's results do not depend on the
// sweep or pass it is in.
template <KFmt F>
void MatMulPacked(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                  int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  const int64_t nsb = n_in / kQK_K, group_bytes = nsb * kSbBytes<F>;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kSweepTokens) {
    const int64_t t_end = n_tokens - t0 < kSweepTokens ? n_tokens : t0 + kSweepTokens;
    for (int64_t r = 0; r < n_rows; r += kRows) {
      const uint8_t* group = packed + (r0 + r) / kRows * group_bytes;
      const int64_t rows = n_rows - r < kRows ? n_rows - r : kRows;
      for (int64_t t = t0; t < t_end; t += kPassTokens) {
        const uint8_t* xt = x_quant + t * x_row_bytes;
        float* yt = y + t * y_stride + r;
        switch (t_end - t < kPassTokens ? t_end - t : kPassTokens) {
          case 4: GroupTokens<F, 4>(group, nsb, xt, x_row_bytes, t == t0, yt, y_stride, rows); break;
          case 3: GroupTokens<F, 3>(group, nsb, xt, x_row_bytes, t == t0, yt, y_stride, rows); break;
          case 2: GroupTokens<F, 2>(group, nsb, xt, x_row_bytes, t == t0, yt, y_stride, rows); break;
          default: GroupTokens<F, 1>(group, nsb, xt, x_row_bytes, t == t0, yt, y_stride, rows); break;
        }
      }
    }
  }
}

// The table entry of format F, for either ymm table.
template <KFmt F>
constexpr PackedKernels kPackedKQuant{&PackedBytes<F>, &PackRows<F>, &MatMulPacked<F>};

}  // namespace
}  // namespace kvfs::cpu
