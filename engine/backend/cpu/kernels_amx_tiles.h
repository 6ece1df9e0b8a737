// The AMX tile machinery of the "amx" kernel table (kernels_amx.cpp): the tile configuration,
// the 16 accumulators of a tile of tokens, and the pipeline that keeps four blocks' products on
// the tile unit while the vector unit scales the oldest. Include only from files compiled with
// the AVX-512 and AMX flags (engine/CMakeLists.txt); internal linkage, as
// kernels_avx512_common.h explains.
//
// Tiles: C0..C3 (tmm0-3) 16 tokens x 16 weight rows of int32 sums; A0, A1 (tmm4, tmm5) 16
// tokens x 32 int8 activation codes of a block; B0, B1 (tmm6, tmm7) a block of 16 weight rows
// in the VNNI layout: 8 rows of 64 bytes, row k = 4 codes (inputs 4k..4k+3) of each row.
#pragma once

#include <utility>

#include "engine/backend/cpu/kernels_avx512_common.h"

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose

constexpr int kTileTokens = 16;    // tokens per tile (the tile unit's 16 rows)
constexpr int kGroupRows = 16;     // weight rows per tile (16 int32 columns) = a packed group
constexpr int kChunkBlocks = 32;   // blocks of K per fill: a group's codes, 16 KiB, stay in L1
constexpr int kPassTokens = 128;   // tokens per pass over a fill (their codes, 128 KiB, on the stack)
// Below this many tokens the avx512 table's kernels run (rows, 8 tokens a pass). From DRAM
// (5632 x 2048, 2 threads, `bench_kernels packed_decode_tile_*tok`, three alternating runs):
// 16 tokens 0.85-1.44 ms on tiles against 1.13-1.26 ms, 32 tokens 1.62-2.00 against 2.13-2.74.
constexpr int64_t kAmxMinTokens = 32;

// The tile configuration (LDTILECFG's 64-byte operand, palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tmm i
  uint8_t rows[16] = {};    // rows of tmm i
};

TileConfig MakeConfig() {
  TileConfig c;
  for (int t = 0; t < 4; ++t) {  // C0..C3: 16 tokens x 16 int32
    c.rows[t] = kTileTokens;
    c.colsb[t] = 4 * kGroupRows;
  }
  for (int t = 4; t < 6; ++t) {  // A0, A1: 16 tokens x 32 codes
    c.rows[t] = kTileTokens;
    c.colsb[t] = 32;
  }
  for (int t = 6; t < 8; ++t) {  // B0, B1: 8 quads of inputs x 16 rows x 4 codes
    c.rows[t] = 8;
    c.colsb[t] = 4 * kGroupRows;
  }
  return c;
}

// A pass's activation codes as the tile unit loads them: per tile of 16 tokens and block of
// 32, 16 rows of 32 codes in 512 contiguous bytes (a strided load from the activation rows
// touched two lines per row). Tokens past the pass have zero codes.
struct alignas(64) PassCodes {
  int8_t codes[kPassTokens / kTileTokens][kChunkBlocks][kTileTokens][32];

  // nt tokens' blocks [0, nb): block g of token t at at(t, g) (32 codes).
  template <class At>
  void Fill(int64_t nt, int nb, At&& at) {
    const int64_t tiles = (nt + kTileTokens - 1) / kTileTokens;
    for (int64_t t = 0; t < tiles * kTileTokens; ++t) {
      for (int g = 0; g < nb; ++g) {
        int8_t* dst = codes[t / kTileTokens][g][t % kTileTokens];
        if (t < nt) {
          std::memcpy(dst, at(t, g), 32);
        } else {
          std::memset(dst, 0, 32);
        }
      }
    }
  }
};

// The 16 accumulators of a tile, one per token, each 16 weight rows. Every access names its
// register by a constant (fold expressions over kTokenIndex): GCC unrolls loops only after it
// decides which arrays live in registers, so a loop would keep these in memory, loaded and
// stored around every block (and the tile stores' memory clobbers pin them there).
constexpr auto kTokenIndex = std::make_index_sequence<kTileTokens>{};
using Acc = __m512[kTileTokens];

// acc[i] = rows of y for token i (< n), else 0.
template <size_t... I>
[[gnu::always_inline]] inline void LoadAcc(const float* y, int64_t y_stride, int64_t n, __mmask16 m, bool accumulate,
                                           Acc& acc, std::index_sequence<I...>) {
  ((acc[I] = accumulate && static_cast<int64_t>(I) < n ? _mm512_maskz_loadu_ps(m, y + I * y_stride)
                                                       : _mm512_setzero_ps()),
   ...);
}

template <size_t... I>
[[gnu::always_inline]] inline void StoreAcc(float* y, int64_t y_stride, int64_t n, __mmask16 m, const Acc& acc,
                                            std::index_sequence<I...>) {
  ((static_cast<int64_t>(I) < n ? StoreRows(y + I * y_stride, acc[I], m, false) : void()), ...);
}

// Block g's operands into the A and B tiles of C kC's parity, then its product into C kC.
// Loading A or B for block g + 2 waits for block g's product to have read them, not for its
// scaling, so the unit multiplies up to three blocks ahead of the vector unit's fmas. Tile
// numbers must be literals (GCC's tile intrinsics paste them into the instruction).
template <int kC>
[[gnu::always_inline]] inline void StartBlock(const int8_t* a, const int8_t* b) {
  if constexpr (kC == 0) {
    _tile_loadd(4, a, 32);
    _tile_loadd(6, b, 64);
    _tile_zero(0);
    _tile_dpbssd(0, 4, 6);
  } else if constexpr (kC == 1) {
    _tile_loadd(5, a, 32);
    _tile_loadd(7, b, 64);
    _tile_zero(1);
    _tile_dpbssd(1, 5, 7);
  } else if constexpr (kC == 2) {
    _tile_loadd(4, a, 32);
    _tile_loadd(6, b, 64);
    _tile_zero(2);
    _tile_dpbssd(2, 4, 6);
  } else {
    _tile_loadd(5, a, 32);
    _tile_loadd(7, b, 64);
    _tile_zero(3);
    _tile_dpbssd(3, 5, 7);
  }
}

template <int kC>
[[gnu::always_inline]] inline void StoreSums(int32_t (&c)[kTileTokens][kGroupRows]) {
  if constexpr (kC == 0) {
    _tile_stored(0, c, 4 * kGroupRows);
  } else if constexpr (kC == 1) {
    _tile_stored(1, c, 4 * kGroupRows);
  } else if constexpr (kC == 2) {
    _tile_stored(2, c, 4 * kGroupRows);
  } else {
    _tile_stored(3, c, 4 * kGroupRows);
  }
}

// The tile of 16 tokens (codes a[g] of block g) against 16 weight rows (b[g]) over nb blocks,
// blocks in order: block g in C(g % 4), its sums stored and handed to
// Epilogue::Apply(sums, g, in, acc) once block g + 4 has taken its place on the unit.
template <class Epilogue, int kC>
[[gnu::always_inline]] inline void FinishBlock(int g, const int8_t (*a)[kTileTokens][32], const int8_t (*b)[8][64],
                                               int nb, const typename Epilogue::In& in,
                                               int32_t (&c)[kTileTokens][kGroupRows], Acc& acc) {
  if (g >= nb) return;
  StoreSums<kC>(c);
  if (g + 4 < nb) StartBlock<kC>(a[g + 4][0], b[g + 4][0]);
  Epilogue::Apply(c, g, in, acc);
}

template <class Epilogue>
[[gnu::always_inline]] inline void TileBlocks(const int8_t (*a)[kTileTokens][32], const int8_t (*b)[8][64], int nb,
                                              const typename Epilogue::In& in, Acc& acc) {
  alignas(64) int32_t c[4][kTileTokens][kGroupRows];
  if (nb > 0) StartBlock<0>(a[0][0], b[0][0]);
  if (nb > 1) StartBlock<1>(a[1][0], b[1][0]);
  if (nb > 2) StartBlock<2>(a[2][0], b[2][0]);
  if (nb > 3) StartBlock<3>(a[3][0], b[3][0]);
  for (int g = 0; g < nb; g += 4) {
    FinishBlock<Epilogue, 0>(g, a, b, nb, in, c[0], acc);
    FinishBlock<Epilogue, 1>(g + 1, a, b, nb, in, c[1], acc);
    FinishBlock<Epilogue, 2>(g + 2, a, b, nb, in, c[2], acc);
    FinishBlock<Epilogue, 3>(g + 3, a, b, nb, in, c[3], acc);
  }
}

// The tile loads read their operands through asm inputs that GCC does not see as memory: a
// barrier after writing operands keeps those stores from moving past the loads.
inline void OperandsWritten() { asm volatile("" ::: "memory"); }

}  // namespace
}  // namespace kvfs::cpu
