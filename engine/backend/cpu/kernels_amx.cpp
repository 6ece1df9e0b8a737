// The "amx" kernel table: the avx512 table, with prompt-sized products (32 tokens or more) of
// the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; row-interleaved as the CPU backend
// packs them, or as the GGUF file stores them where it does not) on the AMX tile unit. Compiled
// with the AVX-512 flags plus AMX-TILE and AMX-INT8 (engine/CMakeLists.txt); reached only after
// kernel_select.cpp has seen AMX in cpuid and the kernel granted this process the tile state
// (cpu_features.cpp, AmxTilesGranted).
//
// Why: prefill is bound by the int8 products. vpdpbusd does 64 multiply-adds an instruction;
// one TDPBSSD does 16 x 16 x 32 (a block of 32 inputs for 16 tokens and 16 weight rows).
//
// Arithmetic, the same as the avx512 panels and row kernels, so the same bits: per (token, row,
// block) the exact int32 sum of the activation codes times the weight codes less their offset
// (Q4_0 8, Q5_0 16), here made by the tile unit from signed codes (q - offset, so no separate
// offset term); then, per block in order, acc += float(sum) * (d_w * d_a) by one fma, and for
// the formats with a minimum acc += m_w * s_a by another. Blocks cannot share an int32 sum
// (each has its own two scales), so every block's 16 x 16 sums go through memory to that fma,
// and the vector unit's convert, multiply and fma per token and block, not the tile unit, set
// the pace: four accumulator tiles keep the unit multiplying ahead while the fmas scale.
//
// The tiles and their pipeline: kernels_amx_tiles.h. The K-quants keep the avx512 kernels: a
// version on tiles (per sub-block sums from the unit, the minimums' part too) gave the same bits
// but no speed (docs/performance.md, "AMX tiles for prompts").
#include "engine/backend/cpu/kernels_amx_tiles.h"
#include "engine/backend/cpu/kernels_avx512_legacy_panel.h"
#include "engine/backend/cpu/packed_nibbles_avx512.h"
#include "engine/backend/cpu/packed_q8_0_layout.h"

namespace kvfs::cpu {
namespace {

// 16 weight rows' blocks [b0, b0 + nb) made ready for the tile unit.
struct alignas(64) GroupFill {
  int8_t codes[kChunkBlocks][8][64];   // [block][input quad k][row * 4 + byte]: tile B, signed codes
  float dw[kChunkBlocks][kGroupRows];  // block scale d of each row (0 for rows past the matrix)
  float mw[kChunkBlocks][kGroupRows];  // block minimum m (formats with one)
};

// A packed group of a nibble format (packed_nibble_layout.h): chunk k of a block is 4 bytes of
// each row, inputs 4k..4k+3 and 16+4k..16+4k+3, i.e. B's rows k and 4 + k; the codes less the
// format's offset (F::kOffset: Q4_0 8, Q5_0 16, else 0), the minimums where F has them.
template <class F, class Layout>
void FillPackedNibbles(const uint8_t* group, int64_t b0, int nb, GroupFill& f) {
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(F::kOffset));
  for (int g = 0; g < nb; ++g) {
    __m512i lo[4], hi[4];
    NibbleChunks<Layout>(group, b0 + g, lo, hi);
    for (int k = 0; k < 4; ++k) {
      _mm512_store_si512(f.codes[g][k], _mm512_sub_epi8(lo[k], offset));
      _mm512_store_si512(f.codes[g][4 + k], _mm512_sub_epi8(hi[k], offset));
    }
    _mm512_store_ps(f.dw[g], HalvesToFloats(Layout::ScalesOf(group, b0 + g)));
    if constexpr (F::kMin) _mm512_store_ps(f.mw[g], HalvesToFloats(Layout::MinsOf(group, b0 + g)));
  }
}

// A packed Q8_0 group (packed_q8_0_layout.h): chunk j of a block is B's row j, its codes
// stored unsigned (xor 0x80 gives them back).
void FillPackedQ8_0(const uint8_t* group, int64_t b0, int nb, GroupFill& f) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int g = 0; g < nb; ++g) {
    const uint8_t* codes = PackedQ8_0Layout::CodesOf(group, b0 + g);
    for (int j = 0; j < 8; ++j) _mm512_store_si512(f.codes[g][j], _mm512_xor_si512(_mm512_load_si512(codes + 64 * j), sign));
    _mm512_store_ps(f.dw[g], _mm512_cvtph_ps(_mm256_load_si256(
                                 reinterpret_cast<const __m256i*>(PackedQ8_0Layout::ScalesOf(group, b0 + g)))));
  }
}

// Up to 16 rows (w: the first's block b0) of a plain row-major matrix; rows past `rows` zero.
// The codes signed: the panels' unsigned codes less the format's offset (Q8_0's were made
// unsigned by adding 128: the byte subtraction wraps back to the stored code).
template <class L>
void FillPlain(const uint8_t* w, int64_t w_row_bytes, int64_t rows, int nb, GroupFill& f) {
  for (int g = 0; g < nb; ++g) {
    __m256i r[kGroupRows];
    LoadBlockRows<L>(w + g * L::kW, w_row_bytes, rows, r, f.dw[g], f.mw[g]);
    if constexpr (L::kOffset != 0) {
      for (__m256i& codes : r) codes = _mm256_sub_epi8(codes, _mm256_set1_epi8(static_cast<char>(L::kOffset)));
    }
    TransposeStore16x8<64>(r, reinterpret_cast<uint8_t*>(f.codes[g][0]));
  }
}

// Per token and block of a pass: the activation scale d_a and, for formats with a minimum,
// Q8_1's s_a (0 for tokens past the pass).
struct alignas(64) PassScales {
  float da[kPassTokens][kChunkBlocks];
  float sa[kPassTokens][kChunkBlocks];
};

// acc[i] += float(c[i]) * (dw * da[i][g]) (then + mw * sa[i][g]) for the 16 tokens of a tile.
template <bool kMin>
struct BlockEpilogue {
  struct In {
    const GroupFill* f;
    const float (*da)[kChunkBlocks];  // from the tile's first token on
    const float (*sa)[kChunkBlocks];
  };
  [[gnu::always_inline]] static void Apply(const int32_t (&c)[kTileTokens][kGroupRows], int g, const In& in, Acc& acc) {
    Scale(c, g, in, acc, kTokenIndex);
  }
  template <size_t... I>
  [[gnu::always_inline]] static void Scale(const int32_t (&c)[kTileTokens][kGroupRows], int g, const In& in, Acc& acc,
                                           std::index_sequence<I...>) {
    const __m512 w = _mm512_load_ps(in.f->dw[g]);
    ((acc[I] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[I])),
                               _mm512_mul_ps(w, _mm512_set1_ps(in.da[I][g])), acc[I])),
     ...);
    if constexpr (kMin) {
      const __m512 m = _mm512_load_ps(in.f->mw[g]);
      ((acc[I] = _mm512_fmadd_ps(m, _mm512_set1_ps(in.sa[I][g]), acc[I])), ...);
    }
  }
};

// y[t * y_stride + r] = row r . token t for n_rows rows and n_tokens tokens (x_quant: rows of
// L's activation blocks): K in chunks of kChunkBlocks, tokens in passes of kPassTokens, rows in
// groups of 16 filled by fill(r, b0, ng, GroupFill&) (rows r.., blocks b0..b0+ng), then every
// tile of the pass through the group.
// Not inlined into its callers: they take the avx512 kernels below kAmxMinTokens, and these
// buffers (some 180 KiB) would then be reserved on every decode call too.
template <class L, class Fill>
[[gnu::noinline]] void AmxPasses(int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes, int64_t n_tokens,
                                 int64_t nb, float* y, int64_t y_stride, Fill&& fill) {
  static const TileConfig kConfig = MakeConfig();
  // (GCC's ldtilecfg tells the compiler it reads 8 of the 64 bytes: the barrier keeps all of
  // them written first, should the configuration ever be made here.)
  OperandsWritten();
  _tile_loadconfig(&kConfig);
  GroupFill group;
  PassCodes codes;
  PassScales scales;
  for (int64_t b0 = 0; b0 < nb; b0 += kChunkBlocks) {
    const int ng = static_cast<int>(nb - b0 < kChunkBlocks ? nb - b0 : kChunkBlocks);
    const bool accumulate = b0 > 0;  // a later K chunk continues the sums the earlier ones stored
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kPassTokens) {
      const int64_t nt = n_tokens - t0 < kPassTokens ? n_tokens - t0 : kPassTokens;
      const int64_t tiles = (nt + kTileTokens - 1) / kTileTokens;
      const uint8_t* xc = x_quant + t0 * x_row_bytes + b0 * L::kA;
      codes.Fill(nt, ng, [&](int64_t t, int g) { return xc + t * x_row_bytes + g * L::kA + L::kAQs; });
      // The last tile's tokens past the pass have zero codes and scales: zero sums, not stored.
      for (int64_t t = 0; t < tiles * kTileTokens; ++t) {
        for (int g = 0; g < ng; ++g) {
          scales.da[t][g] = scales.sa[t][g] = 0.0f;
          if (t >= nt) continue;
          const uint8_t* blk = xc + t * x_row_bytes + g * L::kA;
          scales.da[t][g] = HalfToFloat(blk);
          if constexpr (L::kMin) scales.sa[t][g] = HalfToFloat(blk + L::kAS);
        }
      }
      for (int64_t r = 0; r < n_rows; r += kGroupRows) {
        fill(r, b0, ng, group);
        OperandsWritten();
        const int64_t left = n_rows - r;
        const __mmask16 m = RowMask(left, 0);
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t t = tile * kTileTokens, n = nt - t < kTileTokens ? nt - t : kTileTokens;
          float* yt = y + (t0 + t) * y_stride + r;
          Acc acc;
          LoadAcc(yt, y_stride, n, m, accumulate, acc, kTokenIndex);
          TileBlocks<BlockEpilogue<L::kMin>>(codes.codes[tile], group.codes, ng, {&group, scales.da + t, scales.sa + t},
                                            acc);
          StoreAcc(yt, y_stride, n, m, acc, kTokenIndex);
        }
      }
    }
  }
  _tile_release();
}

// The packed layouts; below kAmxMinTokens the avx512 table's packed kernels (*kSmall).
template <class L, class Layout, void (*kFill)(const uint8_t*, int64_t, int, GroupFill&), const PackedKernels* kSmall>
void MatMulPacked(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                  int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  if (n_tokens < kAmxMinTokens) {
    kSmall->matmul(packed, r0, n_rows, x_quant, x_row_bytes, n_tokens, n_in, y, y_stride);
    return;
  }
  const int64_t nb = n_in / 32;
  AmxPasses<L>(n_rows, x_quant, x_row_bytes, n_tokens, nb, y, y_stride, [&](int64_t r, int64_t b0, int ng, GroupFill& f) {
    kFill(packed + (r0 + r) / kGroupRows * Layout::GroupBytes(nb), b0, ng, f);
  });
}

template <class F, class Layout, const PackedKernels* kSmall>
void MatMulPackedNibbles(const uint8_t* packed, int64_t r0, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
                         int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  MatMulPacked<F, Layout, &FillPackedNibbles<F, Layout>, kSmall>(packed, r0, n_rows, x_quant, x_row_bytes, n_tokens, n_in, y,
                                                                 y_stride);
}

// The plain layout; below kAmxMinTokens the avx512 table's tile (*kSmall).
template <class L, const MatMulTileFn* kSmall>
void Tile(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
          int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  if (n_tokens < kAmxMinTokens) {
    (*kSmall)(w_rows, w_row_bytes, n_rows, x_quant, x_row_bytes, n_tokens, n_in, y, y_stride);
    return;
  }
  AmxPasses<L>(n_rows, x_quant, x_row_bytes, n_tokens, n_in / 32, y, y_stride,
               [&](int64_t r, int64_t b0, int ng, GroupFill& f) {
                 FillPlain<L>(w_rows + r * w_row_bytes + b0 * L::kW, w_row_bytes, n_rows - r, ng, f);
               });
}

KernelTable MakeAmxTable() {
  KernelTable t = Avx512Kernels();
  t.name = "amx";
  auto id = [](GgmlType type) { return static_cast<uint32_t>(type); };
  t.packed[id(GgmlType::kQ4_0)].matmul = &MatMulPackedNibbles<FmtQ4_0, PackedQ4_0Layout<16>, &avx512::PackedQ4_0>;
  t.packed[id(GgmlType::kQ4_1)].matmul = &MatMulPackedNibbles<FmtQ4_1, PackedQ4_1Layout<16>, &avx512::PackedQ4_1>;
  t.packed[id(GgmlType::kQ5_0)].matmul = &MatMulPackedNibbles<FmtQ5_0, PackedQ5_0Layout<16>, &avx512::PackedQ5_0>;
  t.packed[id(GgmlType::kQ5_1)].matmul = &MatMulPackedNibbles<FmtQ5_1, PackedQ5_1Layout<16>, &avx512::PackedQ5_1>;
  t.packed[id(GgmlType::kQ8_0)].matmul = &MatMulPacked<FmtQ8_0, PackedQ8_0Layout, &FillPackedQ8_0, &avx512::PackedQ8_0>;
  t.matmul_tile[id(GgmlType::kQ4_0)] = &Tile<FmtQ4_0, &avx512::TileQ4_0>;
  t.matmul_tile[id(GgmlType::kQ4_1)] = &Tile<FmtQ4_1, &avx512::TileQ4_1>;
  t.matmul_tile[id(GgmlType::kQ5_0)] = &Tile<FmtQ5_0, &avx512::TileQ5_0>;
  t.matmul_tile[id(GgmlType::kQ5_1)] = &Tile<FmtQ5_1, &avx512::TileQ5_1>;
  t.matmul_tile[id(GgmlType::kQ8_0)] = &Tile<FmtQ8_0, &avx512::TileQ8_0>;
  return t;
}

}  // namespace

// Only reached after kernel_select.cpp has seen AMX (and the AVX-512 table's features).
const KernelTable& AmxKernels() {
  static const KernelTable kTable = MakeAmxTable();
  return kTable;
}

}  // namespace kvfs::cpu
