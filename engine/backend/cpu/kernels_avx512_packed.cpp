// The 32-value block formats' weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) repacked at load into groups
// of 16 interleaved rows (PackedKernels in kernels.h).
//
// Why: with the plain layout a decode step of NT tokens unpacks each weight row once and then
// loads, for every (row, token), that token's activation codes and scales again: at 8 tokens
// the loads and the per-block float work (convert, scale, accumulate per 4 blocks) bound the
// kernel, not DRAM. Here one zmm lane is one row: a 64-byte load holds 4 code bytes of each of
// 16 rows, one vpdpbusd against a broadcast activation dword advances 16 rows, and the block's
// float work (convert, scale, accumulate) is one set of ops per 16 rows.
//
// Layout: packed_nibble_layout.h with 16 rows per group (Q4_0: pairs of blocks in 576 bytes;
// the minimums and fifth bits of the others follow the scales), packed_q8_0_layout.h.
//
// Arithmetic: per (row, block) the exact int32 sum of codes times activation codes, minus
// 8 (Q5_0: 16) times the sum of the activation codes (the codes' offset), then acc += isum *
// (d_w * d_a) in float, and for Q4_1 and Q5_1 acc += m_w * s_a, blocks in order: the panels'
// operations in their order, per row.
#include "engine/backend/cpu/kernels_avx512_legacy_panel.h"
#include "engine/backend/cpu/packed_nibbles_avx512.h"
#include "engine/backend/cpu/packed_q8_0_layout.h"

namespace kvfs::cpu {
namespace {

#include "engine/backend/cpu/dpbusd_broadcast.h"

constexpr int kGroupRows = 16;
constexpr int64_t kQ8Bytes = 34;  // Q8_0 activation block: f16 d, 32 int8 codes

// Per (block, token) of the activations, prepared once per call: the block scale, the codes'
// offset term -offset * sum(codes) (the initial value of the block's int32 sums) and, for the
// formats with a minimum, Q8_1's s = d * sum(codes).
struct ActTerms {
  float da;
  int32_t init;
  float sa;
};
constexpr int64_t kTermBlocks = 512;  // blocks per K chunk (16384 inputs): 48 KiB at 8 tokens

template <int NT, class F>
void PrepareTerms(const uint8_t* x0, int64_t x_stride, int64_t b0, int64_t b1, ActTerms* terms) {
  for (int64_t b = b0; b < b1; ++b) {
    for (int t = 0; t < NT; ++t) {
      const uint8_t* blk = x0 + t * x_stride + b * F::kA;
      ActTerms& term = terms[(b - b0) * NT + t];
      term.da = HalfToFloat(blk);
      term.init = F::kMin ? 0 : static_cast<int32_t>(-F::kOffset * SumCodes32(blk + F::kAQs));
      term.sa = F::kMin ? HalfToFloat(blk + F::kAS) : 0.0f;
    }
  }
}

// Software prefetch distance. With the kernel's work between loads the hardware prefetcher
// alone streamed this layout at ~20 GB/s on one thread; 4 KiB ahead reaches DRAM speed for one
// token (`bench_kernels packed_decode_tile*`: 1, 4, 8, 16 KiB measured; 4-8 best). A pass of
// several tokens computes longer per line, so the loads the out-of-order window issues itself
// reach less far: 8 KiB took 4 tokens from 0.102 to 0.091 ms (5632 x 2048, 2 threads, when one
// token streams at ~70 GB/s; distances alternated per call, 400 calls each, medians of two
// runs), one token unchanged (0.072-0.076 vs 0.068-0.073 ms); 12 KiB measured as 8.
constexpr int64_t kPrefetchBytes = 8192;
// In whole decode steps (tinyllama Q4_0, q4 KV, ~1.2k-token contexts, the distance alternated step
// by step in one process, medians of 200 steps), 4 tokens with 6 KiB against 8: 2.4-3.2% faster in
// three runs where the host's memory was slow (19-21 ms steps), 0.1-0.6% slower in two where it
// was fast (14 ms); 4 KiB was 7.6% slower in a fast run; 8 tokens unchanged.
constexpr int64_t kPrefetchBytesBatch = 6144;
// One group of 16 rows over blocks [b0, b1) against NT tokens: acc[t] lane i += row i . x[t].
// F: the format (FmtQ4_0 ...), L: its packed layout.
template <class F, class L, int NT>
inline void GroupRows(const uint8_t* group, int64_t b0, int64_t b1, const uint8_t* x0, int64_t x_stride,
                      const ActTerms* terms, __m512 (&acc)[NT]) {
  for (int64_t b = b0; b < b1; ++b) {
    if ((b & 1) == 0) {
      // The lines of this block pair, kPrefetchBytes ahead (a prefetch never faults, so
      // running past the end of the matrix is harmless). Inline asm: GCC 12 dropped the
      // prefetch builtins from these kernels.
      const uint8_t* ahead = L::ScalesOf(group, b) + (NT >= 4 ? kPrefetchBytesBatch : kPrefetchBytes);
      for (int i = 0; i < L::kPairBytes / 64; ++i) asm volatile("prefetcht0 %0" ::"m"(*(ahead + 64 * i)));
    }
    const __m512 dw = HalvesToFloats(L::ScalesOf(group, b));
    // The minimums once per block. (Loaded inside the token loop instead, GCC 12's -O2 build with
    // ASan and UBSan computed zeros for 2-token passes: the same source gave the right values
    // at -O2 and -O3 without them, and with any one of several UBSan checks left out.)
    const __m512 mw = F::kMin ? HalvesToFloats(L::MinsOf(group, b)) : _mm512_setzero_ps();
    __m512i lo[4], hi[4];
    NibbleChunks<L>(group, b, lo, hi);
    const ActTerms* tb = terms + (b - b0) * NT;
    for (int t = 0; t < NT; ++t) {
      // The token's 32 codes as two 16-byte halves repeated in every 128-bit lane; vpshufd
      // then makes the broadcast dword of a step in registers. Dwords broadcast from memory
      // (DpbusdBroadcast) and the shuffles each slow the vpdpbusd stream alone: with several
      // tokens half of the steps take each (L2-hot 512 x 2048, one thread, 4 tokens: 1.92 ->
      // 1.64 ns per block and token, 8: 1.73 -> 1.50, with separate broadcasts); one token,
      // bound by DRAM, keeps the shuffles.
      const uint8_t* a = x0 + t * x_stride + b * F::kA + F::kAQs;
      const __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
      const __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16)));
      // Two chains (low and high nibbles) halve the dependent vpdpbusd latency.
      __m512i s0 = _mm512_set1_epi32(tb[t].init), s1 = _mm512_setzero_si512();
      s0 = _mm512_dpbusd_epi32(s0, lo[0], _mm512_shuffle_epi32(alo, _MM_PERM_AAAA));
      s1 = _mm512_dpbusd_epi32(s1, hi[0], _mm512_shuffle_epi32(ahi, _MM_PERM_AAAA));
      s0 = _mm512_dpbusd_epi32(s0, lo[1], _mm512_shuffle_epi32(alo, _MM_PERM_BBBB));
      s1 = _mm512_dpbusd_epi32(s1, hi[1], _mm512_shuffle_epi32(ahi, _MM_PERM_BBBB));
      if constexpr (NT == 1) {
        s0 = _mm512_dpbusd_epi32(s0, lo[2], _mm512_shuffle_epi32(alo, _MM_PERM_CCCC));
        s1 = _mm512_dpbusd_epi32(s1, hi[2], _mm512_shuffle_epi32(ahi, _MM_PERM_CCCC));
        s0 = _mm512_dpbusd_epi32(s0, lo[3], _mm512_shuffle_epi32(alo, _MM_PERM_DDDD));
        s1 = _mm512_dpbusd_epi32(s1, hi[3], _mm512_shuffle_epi32(ahi, _MM_PERM_DDDD));
      } else {
        // Steps 2 and 3's dwords from memory when several tokens share the pass, the broadcast
        // embedded (dpbusd_broadcast.h). In whole decode steps (tinyllama Q4_0, q4 KV,
        // 1024-token contexts, old and new alternated step by step in one process, medians of
        // 150 steps): 8 agents 0.5-1.6% faster in four runs, 4 agents 0.3-0.9% in two.
        // (Embedding all 8 steps' broadcasts, the shuffles' too, was 2.4% slower.)
        s0 = DpbusdBroadcast(s0, lo[2], a + 8);
        s1 = DpbusdBroadcast(s1, hi[2], a + 24);
        s0 = DpbusdBroadcast(s0, lo[3], a + 12);
        s1 = DpbusdBroadcast(s1, hi[3], a + 28);
      }
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(tb[t].da));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[t]);
      if constexpr (F::kMin) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(tb[t].sa), acc[t]);
    }
  }
}

// Prefill: a Panel (32 rows = 2 groups, K chunk of kGroups blocks) filled from the packed
// groups, which are already row-interleaved: unpacking is an and / shift per 64 bytes (Q5_0 and
// Q5_1: and the fifth bits').
template <class L>
void FillPanelPacked(const uint8_t* packed, int64_t group0, int64_t n_groups_left, int64_t nb, int64_t g0, int ng,
                     Panel& p) {
  for (int half = 0; half < 2; ++half) {
    const bool present = half < n_groups_left;
    const uint8_t* group = packed + (group0 + half) * L::GroupBytes(nb);
    for (int g = 0; g < ng; ++g) {
      if (!present) {
        for (int j = 0; j < 8; ++j) _mm512_store_si512(p.codes[g][j] + 64 * half, _mm512_setzero_si512());
        _mm512_store_ps(p.dw[g] + 16 * half, _mm512_setzero_ps());
        if constexpr (L::kHasMins) _mm512_store_ps(p.mw[g] + 16 * half, _mm512_setzero_ps());
        continue;
      }
      if constexpr (L::kHasMins) _mm512_store_ps(p.mw[g] + 16 * half, HalvesToFloats(L::MinsOf(group, g0 + g)));
      __m512i lo[4], hi[4];
      NibbleChunks<L>(group, g0 + g, lo, hi);
      for (int k = 0; k < 4; ++k) {
        _mm512_store_si512(p.codes[g][k] + 64 * half, lo[k]);
        _mm512_store_si512(p.codes[g][4 + k] + 64 * half, hi[k]);
      }
      _mm512_store_ps(p.dw[g] + 16 * half, HalvesToFloats(L::ScalesOf(group, g0 + g)));
    }
  }
}

// From DRAM (5632 x 2048, 2 threads, `bench_kernels packed_decode_tile_*tok`), rows in passes
// of 8 tokens against the panels: 16 tokens 0.35 vs 0.65 ms, 32: 0.62 vs 0.89, 48: 0.95 vs
// 1.01, 64: 1.24 vs 1.22, 128: 2.46 vs 2.16. Rows below 64 tokens.
constexpr int64_t kPackedPanelMinTokens = 64;

// ------------------------------------------------------------------------------------------
// Packed Q8_0: the same idea. With the plain layout decode ran at 55-63% of the memory's speed on
// Emerald Rapids (a row's 32 codes against one token per pass, then a horizontal sum).
// Layout: packed_q8_0_layout.h.
using LayoutQ8 = PackedQ8_0Layout;
constexpr auto GroupBytesQ8 = LayoutQ8::GroupBytes;
constexpr auto CodesOfQ8 = LayoutQ8::CodesOf;
constexpr auto ScalesOfQ8 = LayoutQ8::ScalesOf;
constexpr int64_t kQ8PairBytes = LayoutQ8::kPairBytes;

// One group of 16 rows over blocks [b0, b1) against NT tokens, PanelTokens<FmtQ8_0>'s
// operations per row: acc[t] lane i += row i . x[t].
template <int NT>
inline void GroupRowsQ8(const uint8_t* group, int64_t b0, int64_t b1, const uint8_t* x0, int64_t x_stride,
                        const ActTerms* terms, __m512 (&acc)[NT]) {
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* codes = CodesOfQ8(group, b);
    if ((b & 1) == 0) {
      const uint8_t* ahead = ScalesOfQ8(group, b) + kPrefetchBytes;
      for (int i = 0; i < kQ8PairBytes / 64; ++i) asm volatile("prefetcht0 %0" ::"m"(*(ahead + 64 * i)));
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ScalesOfQ8(group, b))));
    __m512i w[8];
    for (int j = 0; j < 8; ++j) w[j] = _mm512_load_si512(codes + 64 * j);
    const ActTerms* tb = terms + (b - b0) * NT;
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = x0 + t * x_stride + b * kQ8Bytes + 2;
      __m512i s0 = _mm512_set1_epi32(tb[t].init), s1 = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        s0 = DpbusdBroadcast(s0, w[j], a + 4 * j);
        s1 = DpbusdBroadcast(s1, w[j + 1], a + 4 * j + 4);
      }
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(tb[t].da));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[t]);
    }
  }
}

void FillPanelPackedQ8(const uint8_t* packed, int64_t group0, int64_t n_groups_left, int64_t nb, int64_t g0, int ng,
                       Panel& p) {
  for (int half = 0; half < 2; ++half) {
    const bool present = half < n_groups_left;
    const uint8_t* group = packed + (group0 + half) * GroupBytesQ8(nb);
    for (int g = 0; g < ng; ++g) {
      const uint8_t* codes = CodesOfQ8(group, g0 + g);
      for (int j = 0; j < 8; ++j) {
        _mm512_store_si512(p.codes[g][j] + 64 * half, present ? _mm512_load_si512(codes + 64 * j) : _mm512_setzero_si512());
      }
      _mm512_store_ps(p.dw[g] + 16 * half, present ? _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(
                                                         ScalesOfQ8(group, g0 + g))))
                                                   : _mm512_setzero_ps());
    }
  }
}

// The packed formats' parts, for the passes below.
template <class Legacy, class L>
struct PackedNibbleFmt {
  using Fmt = Legacy;
  using Layout = L;
  static constexpr auto GroupBytes = L::GroupBytes;
  static constexpr int64_t kPairLines = L::kPairBytes / 64;
  static constexpr auto Fill = FillPanelPacked<L>;
  template <int NT>
  static void Rows(const uint8_t* group, int64_t b0, int64_t b1, const uint8_t* x0, int64_t x_stride,
                   const ActTerms* terms, __m512 (&acc)[NT]) {
    GroupRows<Legacy, L, NT>(group, b0, b1, x0, x_stride, terms, acc);
  }
};
using PackedQ4_0Fmt = PackedNibbleFmt<FmtQ4_0, PackedQ4_0Layout<kGroupRows>>;
using PackedQ4_1Fmt = PackedNibbleFmt<FmtQ4_1, PackedQ4_1Layout<kGroupRows>>;
using PackedQ5_0Fmt = PackedNibbleFmt<FmtQ5_0, PackedQ5_0Layout<kGroupRows>>;
using PackedQ5_1Fmt = PackedNibbleFmt<FmtQ5_1, PackedQ5_1Layout<kGroupRows>>;
struct PackedQ8_0Fmt {
  using Fmt = FmtQ8_0;
  using Layout = LayoutQ8;
  static constexpr auto GroupBytes = LayoutQ8::GroupBytes;
  static constexpr int64_t kPairLines = kQ8PairBytes / 64;
  static constexpr auto Fill = FillPanelPackedQ8;
  template <int NT>
  static void Rows(const uint8_t* group, int64_t b0, int64_t b1, const uint8_t* x0, int64_t x_stride,
                   const ActTerms* terms, __m512 (&acc)[NT]) {
    GroupRowsQ8<NT>(group, b0, b1, x0, x_stride, terms, acc);
  }
};

// Rows [r0, r0 + n_rows) x NT tokens (NT <= 8), K in chunks of kTermBlocks.
template <class P, int NT>
void DecodeRows(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                int64_t nb, float* y, int64_t y_stride) {
  alignas(64) ActTerms terms[kTermBlocks * NT];
  for (int64_t b0 = 0; b0 < nb; b0 += kTermBlocks) {
    const int64_t b1 = nb - b0 < kTermBlocks ? nb : b0 + kTermBlocks;
    PrepareTerms<NT, typename P::Fmt>(x_quant, x_row_bytes, b0, b1, terms);
    for (int64_t r = 0; r < n_rows; r += kGroupRows) {
      const uint8_t* group = packed + (r0 + r) / kGroupRows * P::GroupBytes(nb);
      const int64_t left = n_rows - r;
      const __mmask16 m = RowMask(left, 0);
      // A later K chunk continues the sum the earlier ones stored: one chain of fmas over the
      // blocks in order, as the panels make it too.
      __m512 acc[NT];
      for (int t = 0; t < NT; ++t) acc[t] = b0 > 0 ? _mm512_maskz_loadu_ps(m, y + t * y_stride + r) : _mm512_setzero_ps();
      P::template Rows<NT>(group, b0, b1, x_quant, x_row_bytes, terms, acc);
      for (int t = 0; t < NT; ++t) StoreRows(y + t * y_stride + r, acc[t], m, false);
    }
  }
}

// Prompts of kPackedPanelMinTokens or more through the panels, filled from the packed groups;
// fewer tokens in row passes of up to 8.
template <class P>
void MatMulPacked(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                  int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  const int64_t nb = n_in / 32;
  if (n_tokens >= kPackedPanelMinTokens) {
    const auto fill = [&](int64_t r, int64_t g0, int ng, Panel& p) {
      const int64_t rows = n_rows - r;
      P::Fill(packed, (r0 + r) / kGroupRows, (rows + kGroupRows - 1) / kGroupRows, nb, g0, ng, p);
    };
    // The next panel reads blocks [g0, g0 + ng) of its one or two groups: per group
    // (ng + 1) / 2 pairs of kPairLines lines from the pair of g0 on (g0 is even).
    const auto ahead = [&](int64_t r, int64_t g0, int ng, int part, int parts) {
      const int64_t groups = n_rows - r > kGroupRows ? 2 : 1;
      const int64_t per_group = (ng + 1) / 2 * P::kPairLines, lines = groups * per_group;
      const uint8_t* first = packed + (r0 + r) / kGroupRows * P::GroupBytes(nb) + g0 / 2 * P::kPairLines * 64;
      for (int64_t i = lines * part / parts, end = lines * (part + 1) / parts; i < end; ++i) {
        PrefetchBytes(first + (i / per_group) * P::GroupBytes(nb) + 64 * (i % per_group), 64);
      }
    };
    PanelPasses<typename P::Fmt>(n_rows, x_quant, x_row_bytes, n_tokens, nb, y, y_stride, fill, ahead);
    return;
  }
  ForTokenPasses(n_tokens, 8, [&]<int NT>(int64_t t) {
    DecodeRows<P, NT>(packed, r0, n_rows, x_quant + t * x_row_bytes, x_row_bytes, nb, y + t * y_stride, y_stride);
  });
}

}  // namespace

namespace avx512 {
template <class P>
constexpr PackedKernels KernelsOf() {
  using L = typename P::Layout;
  return PackedKernels{&L::Bytes, &L::Pack, &MatMulPacked<P>};
}
const PackedKernels PackedQ4_0 = KernelsOf<PackedQ4_0Fmt>();
const PackedKernels PackedQ4_1 = KernelsOf<PackedQ4_1Fmt>();
const PackedKernels PackedQ5_0 = KernelsOf<PackedQ5_0Fmt>();
const PackedKernels PackedQ5_1 = KernelsOf<PackedQ5_1Fmt>();
const PackedKernels PackedQ8_0 = KernelsOf<PackedQ8_0Fmt>();
}  // namespace avx512
}  // namespace kvfs::cpu
