// The packed matmuls of the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) without VNNI,
// written once over a vector width and a format: the AVX2 table (kernels_avx2_packed.cpp: ymm, 8 rows per group) and the AVX-512BW
// table (kernels_avx512bw_packed.cpp: zmm, 16 rows per group) instantiate it with their own Isa
// traits, each compiled with its own flags. The AVX-512 table has VNNI and its own kernels
// (kernels_avx512_packed.cpp).
//
// Why: the plain AVX2 tile takes one row at a time against up to 4 tokens, so every (row, block,
// token) pays a load of the token's 32 codes, two sign ops, the int16->int32 step and a float
// convert, scale and FMA. It ran at ~15 MACs per ns on a 2-core Skylake-SP (pp128 15.6 tokens/s
// on TinyLlama Q4_0, a tenth of the two cores' vpmaddubsw rate), and one-token decode at 5.5
// GB/s, a third of the memory bandwidth. Here one dword lane is one row: a vector load holds 4
// code bytes of each of kRows rows, one vpmaddubsw against a broadcast activation dword
// advances kRows rows, and the block's float work is one set of ops per kRows rows.
//
// Layouts: packed_nibble_layout.h and packed_q8_0_layout.h (signed codes) with Isa::kRows rows per
// group.
//
// Arithmetic, exact in integers (NibbleRows, Q8_0Rows below): each block's int32 sum of weight
// codes times activation codes per row, then acc += isum * (d_w * d_a) in float (and acc += m_w *
// s_a for the formats with a minimum), blocks in order: per row the same operations as the
// AVX-512 (VNNI) packed kernels, so every table gives a row the same result.
//
// Include only from the ISA kernel files, like their common headers: internal linkage.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/backend/cpu/activation_code_sum.h"
#include "engine/backend/cpu/kernels_avx2_common.h"
#include "engine/backend/cpu/packed_nibble_layout.h"
#include "engine/backend/cpu/packed_q8_0_layout.h"

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

// An Isa provides: kRows (rows per group = int32 lanes), kPassTokens, vector types I and F,
// kDotBytes (whether it has vpdpbusd: then DotBytes(acc, u8, s8) adds each dword's 4 byte
// products to acc's int32 lane at once, and the int16 steps below are skipped), and
//   I Load(p)                  aligned load of kRows * 4 code bytes
//   I LowNibbles(v), HighNibbles(v)
//   I Broadcast32(p)           the 4 bytes at p in every dword lane
//   I MulAddPairs(codes, act)  vpmaddubsw
//   I Add16(a, b); void KeepChain(I&): a barrier, or nothing (see NibbleRows)
//   I BlockSums(sum16, init)   vpmaddwd with ones, + init in every lane
//   I Abs8(w), SignOf(a, w)    |w| per byte; a negated where w < 0 (vpabsb, vpsignb)
//   I Widen(p)                 vpmaddwd with ones; I Add32(a, b); I Set32(v) v in every lane
//   I ShiftRight32(v, n), ShiftLeft32(v, n)   dword shifts by a constant
//   I WithBit4(codes, bits)    codes | (bits & 0x10) per byte
//   F Scales(p)                kRows f16 scales to float
//   F FmaScaled(isum, dw, da, acc) = acc + float(isum) * (dw * da)
//   F FmaBroadcast(w, s, acc) = acc + w * s (one fma)
//   F LoadF(p), void StoreF(p, v), StoreFU(p, v)   aligned / unaligned kRows floats
//
// The formats. A Fmt provides Layout<kRows> (Bytes, Pack, CodesOf, ScalesOf, MinsOf, kChunkBytes,
// kPairBytes), kOffset (the weight codes' offset: a block's int32 sums start from -kOffset *
// sum(activation codes)), kMin (x = d * q + m: Q8_1 activations, acc += m_w * s_a after the
// product) and BlockSums<Isa, NT>(group, b, a, x_stride, init, sum): per row and token, init +
// block b's exact sum of weight codes times activation codes (a: token 0's 32 codes, the next
// token's x_stride bytes on).

// The nibble formats (packed_nibble_layout.h): Q4_0 and Q4_1 unsigned nibbles (0..15) against
// int8 activations, so vpmaddubsw cannot saturate, and a block's 8 int16 pair sums added in int16
// stay below 8 * 2 * 15 * 128 = 30720 < 2^15 (in any order) before vpmaddwd widens them. Q5_0
// and Q5_1 add the fifth bit (chunk k's by one dword shift each): codes 0..31, a pair sum at most
// 2 * 31 * 127 = 7874, so two chunks' products (at most 31496) add in int16 before each widening.
// The offset: Q4_0 8, Q5_0 16; Q4_1 and Q5_1 have a minimum instead.
template <bool kFifthBits, bool kMins>
struct NibbleRows {
  template <int kRows>
  using Layout = PackedNibbleLayout<kRows, kFifthBits, kMins>;
  static constexpr int32_t kOffset = kMins ? 0 : kFifthBits ? 16 : 8;
  static constexpr bool kMin = kMins;

  template <typename Isa, int NT>
  static void BlockSums(const uint8_t* group, int64_t b, const uint8_t* a, int64_t x_stride, const int32_t* init,
                        typename Isa::I (&sum)[NT]) {
    using I = typename Isa::I;
    using L = Layout<Isa::kRows>;
    constexpr int kChunksPerWidening = kFifthBits ? 2 : 4;
    const uint8_t* codes = L::CodesOf(group, b);
    I bits{};
    if constexpr (kFifthBits) bits = Isa::Load(L::BitsOf(group, b));
    I sum16[NT], high[NT];  // the int16 sums; with vpdpbusd, the high nibbles' int32 chain
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const I v = Isa::Load(codes + L::kChunkBytes * k);
      I lo = Isa::LowNibbles(v), hi = Isa::HighNibbles(v);
      if constexpr (kFifthBits) {
        lo = Isa::WithBit4(lo, Isa::ShiftRight32(bits, k));
        hi = Isa::WithBit4(hi, Isa::ShiftLeft32(bits, 4 - k));
      }
      for (int t = 0; t < NT; ++t) {
        const uint8_t* at = a + t * x_stride;
        if constexpr (Isa::kDotBytes) {
          // Two chains (low and high nibbles) of four vpdpbusd, joined after the last chunk: the
          // same exact int32 sums as the int16 steps.
          sum[t] = Isa::DotBytes(k == 0 ? Isa::Set32(init[t]) : sum[t], lo, Isa::Broadcast32(at + 4 * k));
          high[t] = Isa::DotBytes(k == 0 ? Isa::Set32(0) : high[t], hi, Isa::Broadcast32(at + 16 + 4 * k));
          if (k == 3) sum[t] = Isa::Add32(sum[t], high[t]);
          continue;
        }
        const I p = Isa::Add16(Isa::MulAddPairs(lo, Isa::Broadcast32(at + 4 * k)),
                               Isa::MulAddPairs(hi, Isa::Broadcast32(at + 16 + 4 * k)));
        sum16[t] = k % kChunksPerWidening == 0 ? p : Isa::Add16(sum16[t], p);
        // The Isa may keep each sum a chain in this order: GCC otherwise reassociates the
        // integer adds into a tree whose products (4 tokens: 32) are all live at once, which
        // the AVX2 loop's 16 ymm registers could not hold (48 stack accesses per block, GCC 12
        // -O3). The sums are exact either way.
        Isa::KeepChain(sum16[t]);
        if (k == kChunksPerWidening - 1) sum[t] = Isa::BlockSums(sum16[t], init[t]);
        if constexpr (kFifthBits) {
          if (k == 3) sum[t] = Isa::Add32(sum[t], Isa::Widen(sum16[t]));
        }
      }
    }
  }
};
using Q4_0Rows = NibbleRows<false, false>;
using Q4_1Rows = NibbleRows<false, true>;
using Q5_0Rows = NibbleRows<true, false>;
using Q5_1Rows = NibbleRows<true, true>;

// Q8_0: signed codes, so each product goes through vpmaddubsw as |w| times a with w's sign: a
// pair sum is at most 2 * 128 * 127 = 32512 < 2^15 (|w| <= 128, |a| <= 127), and each chunk's
// pairs widen to int32 at once.
struct Q8_0Rows {
  template <int kRows>
  using Layout = PackedQ8_0LayoutOf<kRows, 0>;
  static constexpr int32_t kOffset = 0;
  static constexpr bool kMin = false;

  template <typename Isa, int NT>
  static void BlockSums(const uint8_t* group, int64_t b, const uint8_t* a, int64_t x_stride, const int32_t* init,
                        typename Isa::I (&sum)[NT]) {
    using I = typename Isa::I;
    constexpr int64_t kChunk = Layout<Isa::kRows>::kChunkBytes;
    const uint8_t* codes = Layout<Isa::kRows>::CodesOf(group, b);
    I odd[NT];  // with vpdpbusd: the odd chunks' chain, joined at the end
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const I w = Isa::Load(codes + kChunk * k);
      const I magnitude = Isa::Abs8(w);
      for (int t = 0; t < NT; ++t) {
        const I signed_act = Isa::SignOf(Isa::Broadcast32(a + t * x_stride + 4 * k), w);
        if constexpr (Isa::kDotBytes) {
          if (k % 2 == 0) {
            sum[t] = Isa::DotBytes(k == 0 ? Isa::Set32(init[t]) : sum[t], magnitude, signed_act);
          } else {
            odd[t] = Isa::DotBytes(k == 1 ? Isa::Set32(0) : odd[t], magnitude, signed_act);
          }
        } else {
          const I p = Isa::Widen(Isa::MulAddPairs(magnitude, signed_act));
          sum[t] = k == 0 ? Isa::Add32(p, Isa::Set32(init[t])) : Isa::Add32(sum[t], p);
        }
      }
    }
    if constexpr (Isa::kDotBytes) {
      for (int t = 0; t < NT; ++t) sum[t] = Isa::Add32(sum[t], odd[t]);
    }
  }
};

template <typename Isa, typename Fmt>
struct PackedRowsKernel {
  static constexpr int kRows = Isa::kRows;
  using Layout = typename Fmt::template Layout<kRows>;
  using I = typename Isa::I;
  using F = typename Isa::F;
  // The activation block: Q8_0 (f16 d, 32 int8 codes) or, for formats with a minimum, Q8_1
  // (f16 d, f16 s = d * sum(codes), the codes).
  static constexpr int64_t kActBytes = Fmt::kMin ? 36 : 34, kActCodes = Fmt::kMin ? 4 : 2;

  // Per (block, token) of the activations, prepared once per K chunk: the block scale, the
  // offset term -kOffset * sum(codes) (the initial value of the block's int32 sums) and Q8_1's s.
  struct ActTerms {
    float da;
    int32_t init;
    float sa;
  };
  // Tokens one sweep over the rows serves, and blocks per K chunk (8192 inputs): a group's chunk
  // of weights (Q4_0: 36 KiB at 8 rows, 72 at 16; Q8_0 twice that) is read from DRAM once and
  // from cache by the sweep's other passes; the chunk's activations (16 tokens: 139 KiB) and
  // terms (48 KiB) stay in L2.
  static constexpr int64_t kSweepTokens = 16;
  static constexpr int64_t kTermBlocks = 256;
  static constexpr int kPassTokens = Isa::kPassTokens;
  static_assert(kSweepTokens % kPassTokens == 0);
  // Software prefetch distance, as for the AVX-512 packed kernel (which measured 4-8 KiB best).
  static constexpr int64_t kPrefetchBytes = 6144;
  static constexpr int kPairLines = static_cast<int>((Layout::kPairBytes + 63) / 64);

  // Terms in pass order: the pass of tokens [p, p + n) (p a multiple of kPassTokens) has its
  // own run at terms + p * kTermBlocks, (b - b0) * n + (t - p) within it.
  static void PrepareTerms(const uint8_t* x0, int64_t x_stride, int64_t n_tokens, int64_t b0, int64_t b1,
                           ActTerms* terms) {
    for (int64_t p = 0; p < n_tokens; p += kPassTokens) {
      const int64_t n = n_tokens - p < kPassTokens ? n_tokens - p : kPassTokens;
      ActTerms* run = terms + p * kTermBlocks;
      for (int64_t b = b0; b < b1; ++b) {
        for (int64_t t = 0; t < n; ++t) {
          const uint8_t* blk = x0 + (p + t) * x_stride + b * kActBytes;
          run[(b - b0) * n + t] = ActTerms{HalfToFloat(blk), Fmt::kOffset == 0 ? 0 : -Fmt::kOffset * SumCodes32(blk + kActCodes),
                                           Fmt::kMin ? HalfToFloat(blk + 2) : 0.0f};
        }
      }
    }
  }

  // One group over blocks [b0, b1) against NT tokens: acc[t] lane i += row i . x[t], with the
  // terms of token t and block b at terms[(b - b0) * NT + t].
  template <int NT>
  static void GroupRows(const uint8_t* group, int64_t b0, int64_t b1, const uint8_t* x0, int64_t x_stride,
                        const ActTerms* terms, bool prefetch, F (&acc)[NT]) {
    for (int64_t b = b0; b < b1; ++b) {
      if (prefetch && (b & 1) == 0) {
        // The lines of this block pair, kPrefetchBytes ahead (a prefetch never faults).
        const uint8_t* ahead = Layout::ScalesOf(group, b) + kPrefetchBytes;
        for (int i = 0; i < kPairLines; ++i) asm volatile("prefetcht0 %0" ::"m"(*(ahead + 64 * i)));
      }
      const ActTerms* tb = terms + (b - b0) * NT;
      int32_t init[NT];
      for (int t = 0; t < NT; ++t) init[t] = tb[t].init;
      I sum[NT];
      Fmt::template BlockSums<Isa, NT>(group, b, x0 + b * kActBytes + kActCodes, x_stride, init, sum);
      const F dw = Isa::Scales(Layout::ScalesOf(group, b));
      for (int t = 0; t < NT; ++t) acc[t] = Isa::FmaScaled(sum[t], dw, tb[t].da, acc[t]);
      if constexpr (Fmt::kMin) {
        const F mw = Isa::Scales(Layout::MinsOf(group, b));
        for (int t = 0; t < NT; ++t) acc[t] = Isa::FmaBroadcast(mw, tb[t].sa, acc[t]);
      }
    }
  }

  // Rows [r, r + rows) of one group (rows <= kRows) x NT tokens over blocks [b0, b1); a later K
  // chunk continues the sums the earlier ones stored in y: one chain of fmas over the blocks in
  // order.
  template <int NT>
  static void GroupPass(const uint8_t* group, int64_t rows, int64_t b0, int64_t b1, const uint8_t* x,
                        int64_t x_stride, const ActTerms* terms, bool prefetch, float* y, int64_t y_stride) {
    alignas(64) float part[NT][kRows] = {};
    F acc[NT];
    for (int t = 0; t < NT; ++t) {
      if (b0 > 0) std::memcpy(part[t], y + t * y_stride, sizeof(float) * static_cast<size_t>(rows));
      acc[t] = Isa::LoadF(part[t]);
    }
    GroupRows<NT>(group, b0, b1, x, x_stride, terms, prefetch, acc);
    for (int t = 0; t < NT; ++t) {
      if (rows == kRows) {
        Isa::StoreFU(y + t * y_stride, acc[t]);
      } else {
        Isa::StoreF(part[t], acc[t]);
        std::memcpy(y + t * y_stride, part[t], sizeof(float) * static_cast<size_t>(rows));
      }
    }
  }

  // A pass of n (1..kPassTokens) tokens, as a call of the instantiation for n.
  template <int NT = kPassTokens>
  static void PassOf(int64_t n, const uint8_t* group, int64_t rows, int64_t b0, int64_t b1, const uint8_t* x,
                     int64_t x_stride, const ActTerms* terms, bool prefetch, float* y, int64_t y_stride) {
    if constexpr (NT > 1) {
      if (n < NT) return PassOf<NT - 1>(n, group, rows, b0, b1, x, x_stride, terms, prefetch, y, y_stride);
    }
    GroupPass<NT>(group, rows, b0, b1, x, x_stride, terms, prefetch, y, y_stride);
  }

  // Rows [r0, r0 + n_rows) x n_tokens (<= kSweepTokens): per K chunk, per group, passes of up to
  // kPassTokens tokens. Only the first pass over a group's chunk prefetches: the others find it
  // in cache.
  static void Sweep(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                    int64_t n_tokens, int64_t nb, float* y, int64_t y_stride) {
    alignas(64) ActTerms terms[kTermBlocks * kSweepTokens];
    for (int64_t b0 = 0; b0 < nb; b0 += kTermBlocks) {
      const int64_t b1 = nb - b0 < kTermBlocks ? nb : b0 + kTermBlocks;
      PrepareTerms(x_quant, x_row_bytes, n_tokens, b0, b1, terms);
      for (int64_t r = 0; r < n_rows; r += kRows) {
        const uint8_t* group = packed + (r0 + r) / kRows * Layout::GroupBytes(nb);
        const int64_t rows = n_rows - r < kRows ? n_rows - r : kRows;
        for (int64_t t = 0; t < n_tokens; t += kPassTokens) {
          const int64_t n = n_tokens - t < kPassTokens ? n_tokens - t : kPassTokens;
          PassOf(n, group, rows, b0, b1, x_quant + t * x_row_bytes, x_row_bytes, terms + t * kTermBlocks, t == 0,
                 y + t * y_stride + r, y_stride);
        }
      }
    }
  }

  // Every token count, in sweeps of up to kSweepTokens. A token's results do not depend on the
  // sweep or pass it is in (the same operations per token and row).
  static void MatMul(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                     int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
    for (int64_t t = 0; t < n_tokens; t += kSweepTokens) {
      const int64_t n = n_tokens - t < kSweepTokens ? n_tokens - t : kSweepTokens;
      Sweep(packed, r0, n_rows, x_quant + t * x_row_bytes, x_row_bytes, n, n_in / 32, y + t * y_stride, y_stride);
    }
  }

  static constexpr PackedKernels kKernels{&Layout::Bytes, &Layout::Pack, &MatMul};
};

}  // namespace
}  // namespace kvfs::cpu
