// The "amx" table's products of Q4_K and Q5_K weights with Q8_K activations, 32 tokens or more
// (fewer: the avx512 table's). A super-block of 256 inputs is 8 sub-blocks of 32, each with its
// own 6-bit scale and minimum: the tile unit makes each sub-block's exact int32 sums for 16
// tokens x 16 rows (codes 0..15 or 0..31 as signed bytes), the vector unit adds them into one
// float sum per super-block, times d * scale, then takes the minimums' part (from the
// activations' block sums) and d_a, exactly as the avx512 panels (kernels_avx512_kquants.cpp,
// KPanelTokens) do, operation for operation: the same bits. Q6_K (a scale per 16 inputs) keeps
// the avx512 kernels.
#include "engine/backend/cpu/kernels_amx_tiles.h"
#include "engine/backend/cpu/kernels_avx512_kquant_blocks.h"

namespace kvfs::cpu {
namespace {

constexpr int kSuperBlocks = kChunkBlocks / 8;  // super-blocks per K chunk

// 16 weight rows' super-blocks [sb0, sb0 + nsb) made ready for the tile unit; rows past the
// matrix are zero.
struct alignas(64) KGroupFill {
  int8_t codes[kChunkBlocks][8][64];               // [sub-block][input quad][row * 4 + byte]: tile B
  float scale[kChunkBlocks][kGroupRows];           // d * sub-block scale
  int32_t pairs[kSuperBlocks][8][kGroupRows];      // (m, m) words against the bsums' dword i
  float dmin[kSuperBlocks][kGroupRows];            // the minimums' scale
};

template <KFmt F>
void FillK(const uint8_t* w, int64_t w_row_bytes, int64_t rows, int nsb, KGroupFill& f) {
  for (int sb = 0; sb < nsb; ++sb) {
    for (int i = 0; i < kGroupRows; ++i) {
      if (i < rows) {
        const uint8_t* b = w + i * w_row_bytes + sb * kBlockBytes<F>;
        const float d = HalfToFloat(b);
        alignas(16) uint8_t scm[16];  // scales, then minimums
        _mm_store_si128(reinterpret_cast<__m128i*>(scm), UnpackScalesMins(b + 4));
        for (int s = 0; s < 8; ++s) {
          f.scale[8 * sb + s][i] = d * static_cast<float>(scm[s]);
          f.pairs[sb][s][i] = static_cast<int32_t>(scm[8 + s] | (static_cast<uint32_t>(scm[8 + s]) << 16));
        }
        f.dmin[sb][i] = HalfToFloat(b + 2);
      } else {
        for (int s = 0; s < 8; ++s) {
          f.scale[8 * sb + s][i] = 0.0f;
          f.pairs[sb][s][i] = 0;
        }
        f.dmin[sb][i] = 0.0f;
      }
    }
    for (int s = 0; s < 8; ++s) {
      __m256i r[kGroupRows];
      for (int i = 0; i < kGroupRows; ++i) {
        r[i] = i < rows ? KGroupCodes<F>(w + i * w_row_bytes + sb * kBlockBytes<F>, s) : _mm256_setzero_si256();
      }
      TransposeStore16x8<64>(r, reinterpret_cast<uint8_t*>(f.codes[8 * sb + s][0]));
    }
  }
}

// Sub-block g's sums into the tokens' super-block sums (acc); after a super-block's last
// sub-block, its result into y and acc back to zero.
struct KEpilogue {
  struct In {
    const KGroupFill* f;
    const uint8_t* x;  // the tile's first token's Q8_K block of the chunk's first super-block
    int64_t x_row_bytes;
    float* y;  // the tile's first token's row, at the group's first weight row
    int64_t y_stride;
    int64_t n;  // tokens of the tile that exist
    __mmask16 m;  // weight rows of the group that exist
    bool accumulate;  // y holds the earlier chunks' sums
  };
  [[gnu::always_inline]] static void Apply(const int32_t (&c)[kTileTokens][kGroupRows], int g, const In& in, Acc& acc) {
    Add(c, g, in, acc, kTokenIndex);
    if (g % 8 == 7) Finish(g / 8, in, acc, kTokenIndex);
  }
  template <size_t... I>
  [[gnu::always_inline]] static void Add(const int32_t (&c)[kTileTokens][kGroupRows], int g, const In& in, Acc& acc,
                                         std::index_sequence<I...>) {
    const __m512 sc = _mm512_load_ps(in.f->scale[g]);
    ((acc[I] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[I])), sc, acc[I])), ...);
  }
  // KPanelTokens' end of a super-block: (sum - mins * dmin) * d_a, added to y.
  [[gnu::always_inline]] static void FinishToken(int sb, int64_t i, const In& in, __m512& acc) {
    if (i < in.n) {
      const uint8_t* xt = in.x + i * in.x_row_bytes + sb * kQ8KBytes;
      __m512i mi = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        const __m512i bs = _mm512_set1_epi32(static_cast<int>(LoadU32(xt + kQ8KSums + 4 * j)));
        mi = _mm512_dpwssd_epi32(mi, _mm512_load_si512(in.f->pairs[sb][j]), bs);
      }
      const __m512 dmin = _mm512_load_ps(in.f->dmin[sb]);
      const __m512 r = _mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi), dmin, acc), _mm512_set1_ps(LoadF32(xt)));
      StoreRows(in.y + i * in.y_stride, r, in.m, in.accumulate || sb > 0);
    }
    acc = _mm512_setzero_ps();
  }
  template <size_t... I>
  [[gnu::always_inline]] static void Finish(int sb, const In& in, Acc& acc, std::index_sequence<I...>) {
    (FinishToken(sb, static_cast<int64_t>(I), in, acc[I]), ...);
  }
};

template <KFmt F>
void KTile(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant, int64_t x_row_bytes,
           int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  if (n_tokens < kAmxMinTokens) {
    (F == KFmt::kQ4K ? avx512::TileQ4_K : avx512::TileQ5_K)(w_rows, w_row_bytes, n_rows, x_quant, x_row_bytes,
                                                             n_tokens, n_in, y, y_stride);
    return;
  }
  static const TileConfig kConfig = MakeConfig();
  _tile_loadconfig(&kConfig);
  const int64_t nsb_total = n_in / kQK_K;
  KGroupFill group;
  PassCodes codes;
  for (int64_t sb0 = 0; sb0 < nsb_total; sb0 += kSuperBlocks) {
    const int nsb = static_cast<int>(nsb_total - sb0 < kSuperBlocks ? nsb_total - sb0 : kSuperBlocks);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kPassTokens) {
      const int64_t nt = n_tokens - t0 < kPassTokens ? n_tokens - t0 : kPassTokens;
      const int64_t tiles = (nt + kTileTokens - 1) / kTileTokens;
      const uint8_t* xc = x_quant + t0 * x_row_bytes + sb0 * kQ8KBytes;
      codes.Fill(nt, 8 * nsb, [&](int64_t t, int g) {
        return xc + t * x_row_bytes + g / 8 * kQ8KBytes + kQ8KQs + 32 * (g % 8);
      });
      for (int64_t r = 0; r < n_rows; r += kGroupRows) {
        FillK<F>(w_rows + r * w_row_bytes + sb0 * kBlockBytes<F>, w_row_bytes, n_rows - r, nsb, group);
        OperandsWritten();
        const int64_t left = n_rows - r;
        const __mmask16 m = left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << left) - 1);
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t t = tile * kTileTokens, n = nt - t < kTileTokens ? nt - t : kTileTokens;
          Acc acc;
          ZeroAcc(acc, kTokenIndex);
          const KEpilogue::In in{&group, xc + t * x_row_bytes, x_row_bytes, y + (t0 + t) * y_stride + r,
                                 y_stride, n, m, sb0 > 0};
          TileBlocks<KEpilogue>(codes.codes[tile], group.codes, 8 * nsb, in, acc);
        }
      }
    }
  }
  _tile_release();
}

}  // namespace

namespace amx {
const MatMulTileFn TileQ4_K = &KTile<KFmt::kQ4K>;
const MatMulTileFn TileQ5_K = &KTile<KFmt::kQ5K>;
}  // namespace amx
}  // namespace kvfs::cpu
