// Q4_0 weights repacked at load into groups of 8 interleaved rows, for CPUs whose best table is
// AVX2 (PackedKernels in kernels.h; the AVX-512 table has its own, 16 rows per group).
//
// Why: the plain AVX2 tile takes one row at a time against up to 4 tokens, so every (row, block,
// token) pays a load of the token's 32 codes, two sign ops, the int16->int32 step and a float
// convert, scale and FMA. It ran at ~15 MACs per ns on a 2-core Skylake-SP (pp128 15.6 tokens/s
// on TinyLlama Q4_0, a tenth of the two cores' vpmaddubsw rate), and one-token decode at 5.5
// GB/s, a third of the memory bandwidth. Here one ymm dword lane is one row: a 32-byte load
// holds 4 code bytes of each of 8 rows, one vpmaddubsw against a broadcast activation dword
// advances 8 rows, and the block's float work is one set of ops per 8 rows.
//
// Layout: packed_q4_0_layout.h with 8 rows per group (pairs of blocks in 288 bytes).
//
// Arithmetic, exact in integers: codes are unsigned nibbles (0..15), activations int8, so
// vpmaddubsw cannot saturate, and the 8 int16 pair sums of a block added in int16 stay below
// 8 * 2 * 15 * 128 = 30720 < 2^15. vpmaddwd with ones then gives the block's int32 sum per
// row, minus 8 * sum(activation codes) (the Q4_0 offset); acc += isum * (d_w * d_a) in float,
// blocks in order: per row the same operations as the AVX-512 packed kernel.
#include "engine/backend/cpu/kernels_avx2_common.h"
#include "engine/backend/cpu/packed_q4_0_layout.h"

namespace kvfs::cpu {
namespace {

constexpr int kGroupRows = 8;
using Layout = PackedQ4_0Layout<kGroupRows>;
constexpr int64_t kQ8Bytes = 34;  // Q8_0 activation block: f16 d, 32 int8 codes
constexpr auto GroupBytes = Layout::GroupBytes;
constexpr auto CodesOf = Layout::CodesOf;
constexpr auto ScalesOf = Layout::ScalesOf;

inline int32_t LoadI32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Sum of 32 signed activation codes: sad of (a xor 0x80) = sum(a + 128), minus 32 * 128.
inline int32_t SumCodes32(const uint8_t* codes) {
  const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(LoadU256(codes), _mm256_set1_epi8(static_cast<char>(0x80))),
                                    _mm256_setzero_si256());
  const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return static_cast<int32_t>(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 32 * 128);
}

// Per (block, token) of the activations, prepared once per K chunk: the block scale and the
// Q4_0 offset term -8 * sum(codes), the initial value of the block's int32 sums.
struct ActTerms {
  float da;
  int32_t init;
};
// Tokens one sweep over the rows serves, and blocks per K chunk (8192 inputs): a group's chunk
// of weights (36 KiB) is read from DRAM once and from cache by the sweep's other passes; the
// chunk's activations (16 tokens: 139 KiB) and terms (32 KiB) stay in L2.
constexpr int64_t kSweepTokens = 16;
constexpr int64_t kTermBlocks = 256;
// Tokens per pass over a group: the 16 ymm registers hold 4 tokens' int16 sums and float
// accumulators with the codes; 5 or more spill (8 tokens in one pass measured 3.04 ms against
// 2 x 1.20 for two passes of 4, `bench_kernels packed_decode_tile*`, 5632 x 2048, one thread).
constexpr int kPassTokens = 4;

// Terms in pass order: the pass of tokens [p, p + n) (p a multiple of kPassTokens) has its
// own run at terms + p * kTermBlocks, (b - b0) * n + (t - p) within it.
void PrepareTerms(const uint8_t* x0, int64_t x_stride, int64_t n_tokens, int64_t b0, int64_t b1, ActTerms* terms) {
  for (int64_t p = 0; p < n_tokens; p += kPassTokens) {
    const int64_t n = n_tokens - p < kPassTokens ? n_tokens - p : kPassTokens;
    ActTerms* run = terms + p * kTermBlocks;
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t t = 0; t < n; ++t) {
        const uint8_t* blk = x0 + (p + t) * x_stride + b * kQ8Bytes;
        run[(b - b0) * n + t] = ActTerms{HalfToFloat(blk), -8 * SumCodes32(blk + 2)};
      }
    }
  }
}

// Software prefetch distance, as for the AVX-512 packed kernel (which measured 4-8 KiB best).
constexpr int64_t kPrefetchBytes = 6144;

// One group of 8 rows over blocks [b0, b1) against NT tokens: acc[t] lane i += row i . x[t],
// with the terms of token t and block b at terms[(b - b0) * NT + t].
template <int NT>
inline void GroupRows(const uint8_t* group, int64_t b0, int64_t b1, const uint8_t* x0, int64_t x_stride,
                      const ActTerms* terms, bool prefetch, __m256 (&acc)[NT]) {
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t b = b0; b < b1; ++b) {
    if (prefetch && (b & 1) == 0) {
      // The 4.5 lines of this block pair, kPrefetchBytes ahead (a prefetch never faults).
      const uint8_t* ahead = ScalesOf(group, b) + kPrefetchBytes;
      for (int i = 0; i < 5; ++i) asm volatile("prefetcht0 %0" ::"m"(*(ahead + 64 * i)));
    }
    const uint8_t* codes = CodesOf(group, b);
    const uint8_t* a = x0 + b * kQ8Bytes + 2;
    __m256i sum[NT];
    for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 32 * k));
      const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      for (int t = 0; t < NT; ++t) {
        const uint8_t* at = a + t * x_stride;
        sum[t] = _mm256_add_epi16(sum[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(LoadI32(at + 4 * k))));
        sum[t] = _mm256_add_epi16(sum[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(LoadI32(at + 16 + 4 * k))));
        // Keeps each sum a chain in this order: GCC otherwise reassociates the 8 integer adds
        // into a tree whose 32 products (at 4 tokens) are all live at once, and the loop made
        // 48 stack accesses per block (GCC 12 -O3).
        asm("" : "+x"(sum[t]));
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(ScalesOf(group, b))));
    const ActTerms* tb = terms + (b - b0) * NT;
    for (int t = 0; t < NT; ++t) {
      const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(sum[t], ones), _mm256_set1_epi32(tb[t].init));
      const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(tb[t].da));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[t]);
    }
  }
}

// Rows [r, r + rows) of one group (rows <= 8) x NT tokens over blocks [b0, b1); a later K chunk
// continues the sums the earlier ones stored in y: one chain of fmas over the blocks in order.
template <int NT>
void GroupPass(const uint8_t* group, int64_t rows, int64_t b0, int64_t b1, const uint8_t* x, int64_t x_stride,
               const ActTerms* terms, bool prefetch, float* y, int64_t y_stride) {
  alignas(32) float part[NT][kGroupRows] = {};
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) {
    if (b0 > 0) std::memcpy(part[t], y + t * y_stride, sizeof(float) * static_cast<size_t>(rows));
    acc[t] = _mm256_load_ps(part[t]);
  }
  GroupRows<NT>(group, b0, b1, x, x_stride, terms, prefetch, acc);
  for (int t = 0; t < NT; ++t) {
    if (rows == kGroupRows) {
      _mm256_storeu_ps(y + t * y_stride, acc[t]);
    } else {
      _mm256_store_ps(part[t], acc[t]);
      std::memcpy(y + t * y_stride, part[t], sizeof(float) * static_cast<size_t>(rows));
    }
  }
}

// Rows [r0, r0 + n_rows) x n_tokens (<= kSweepTokens): per K chunk, per group, passes of up to
// kPassTokens tokens. Only the first pass over a group's chunk prefetches: the others find it
// in cache.
void Sweep(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
           int64_t n_tokens, int64_t nb, float* y, int64_t y_stride) {
  alignas(32) ActTerms terms[kTermBlocks * kSweepTokens];
  for (int64_t b0 = 0; b0 < nb; b0 += kTermBlocks) {
    const int64_t b1 = nb - b0 < kTermBlocks ? nb : b0 + kTermBlocks;
    PrepareTerms(x_quant, x_row_bytes, n_tokens, b0, b1, terms);
    for (int64_t r = 0; r < n_rows; r += kGroupRows) {
      const uint8_t* group = packed + (r0 + r) / kGroupRows * GroupBytes(nb);
      const int64_t rows = n_rows - r < kGroupRows ? n_rows - r : kGroupRows;
      for (int64_t t = 0; t < n_tokens; t += kPassTokens) {
        const uint8_t* xt = x_quant + t * x_row_bytes;
        float* yt = y + t * y_stride + r;
        const ActTerms* tt = terms + t * kTermBlocks;
        const bool first = t == 0;
        switch (n_tokens - t >= kPassTokens ? kPassTokens : n_tokens - t) {
          case 4: GroupPass<4>(group, rows, b0, b1, xt, x_row_bytes, tt, first, yt, y_stride); break;
          case 3: GroupPass<3>(group, rows, b0, b1, xt, x_row_bytes, tt, first, yt, y_stride); break;
          case 2: GroupPass<2>(group, rows, b0, b1, xt, x_row_bytes, tt, first, yt, y_stride); break;
          default: GroupPass<1>(group, rows, b0, b1, xt, x_row_bytes, tt, first, yt, y_stride); break;
        }
      }
    }
  }
}

// Every token count, in sweeps of up to kSweepTokens. A token's results do not depend on the
// sweep or pass it is in (the same operations per token and row).
void MatMulPackedQ4_0(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                      int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  for (int64_t t = 0; t < n_tokens; t += kSweepTokens) {
    const int64_t n = n_tokens - t < kSweepTokens ? n_tokens - t : kSweepTokens;
    Sweep(packed, r0, n_rows, x_quant + t * x_row_bytes, x_row_bytes, n, n_in / 32, y + t * y_stride, y_stride);
  }
}

}  // namespace

namespace avx2 {
const PackedKernels PackedQ4_0{&Layout::Bytes, &Layout::Pack, &MatMulPackedQ4_0};
}  // namespace avx2
}  // namespace kvfs::cpu
