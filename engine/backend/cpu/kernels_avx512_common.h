// Shared pieces of the AVX-512 kernel files (kernels_avx512*.cpp). Include ONLY from files
// compiled with the AVX-512 flags (engine/CMakeLists.txt): every helper here has internal
// linkage (anonymous namespace), so no AVX-512 copy of an inline function can be chosen by the
// linker for a caller in a portable file. For the same reason these files call no std::
// function templates at run time (std::array, std::max...): plain arrays and builtins only.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/backend/cpu/kernels.h"
#include "engine/model/quant_blocks.h"

// Entry points defined in one AVX-512 file and put into the table by kernels_avx512.cpp.
namespace kvfs::cpu::avx512 {

void QuantizeQ8_0(const float* x, void* dst, int64_t n);
void QuantizeQ8_1(const float* x, void* dst, int64_t n);
void QuantizeQ8_K(const float* x, void* dst, int64_t n);

float VecDotQ4_0(const void* w, const void* a, int64_t n);
float VecDotQ4_1(const void* w, const void* a, int64_t n);
float VecDotQ5_0(const void* w, const void* a, int64_t n);
float VecDotQ5_1(const void* w, const void* a, int64_t n);
float VecDotQ8_0(const void* w, const void* a, int64_t n);
float VecDotQ4_K(const void* w, const void* a, int64_t n);
float VecDotQ5_K(const void* w, const void* a, int64_t n);
float VecDotQ6_K(const void* w, const void* a, int64_t n);

// Prefill tiles: bound to template instantiations in the ISA's own files (function pointers,
// so no AVX-compiled symbol with vague linkage is ever shared with portable code).
extern const MatMulTileFn TileQ4_0, TileQ4_1, TileQ5_0, TileQ5_1, TileQ8_0, TileQ4_K, TileQ5_K, TileQ6_K;
// Row-interleaved weights (kernels_avx512_packed.cpp, kernels_avx512_packed_kquants.cpp).
extern const PackedKernels PackedQ4_0, PackedQ4_1, PackedQ5_0, PackedQ5_1, PackedQ8_0, PackedQ4_K, PackedQ5_K, PackedQ6_K;

}  // namespace kvfs::cpu::avx512

namespace kvfs::cpu {
namespace {  // NOLINT: internal linkage on purpose (see the top of the file)

// Below these many tokens a tile runs the row kernels (weights unpacked in registers, applied
// to up to 8 tokens per pass, so a batched decode step of up to 8 sequences streams the weights
// from DRAM once); from there on the panel kernels (weights unpacked once into a cache-resident
// transposed panel, reused by many tokens) are faster. On cache-resident weights (128 x 2048)
// the panels win from 5-6 tokens (Q6_K, costlier to unpack into a panel, from 12), but from
// DRAM (5632 x 2048, `bench_kernels decode_tile_*tok`) 8 tokens take 0.8 ms through the rows
// and 1.2 ms through the panels on one thread: the row kernels run up to 8.
constexpr int64_t kPanelMinTokens = 9;
// The row kernels take their token count as a template argument: runs them over n_tokens tokens
// in passes of at most per_pass (<= 8), calling pass.template operator()<NT>(first_token).
template <class Pass>
inline void ForTokenPasses(int64_t n_tokens, int64_t per_pass, Pass&& pass) {
  for (int64_t t = 0; t < n_tokens; t += per_pass) {
    switch (n_tokens - t < per_pass ? n_tokens - t : per_pass) {
      case 8: pass.template operator()<8>(t); break;
      case 7: pass.template operator()<7>(t); break;
      case 6: pass.template operator()<6>(t); break;
      case 5: pass.template operator()<5>(t); break;
      case 4: pass.template operator()<4>(t); break;
      case 3: pass.template operator()<3>(t); break;
      case 2: pass.template operator()<2>(t); break;
      case 1: pass.template operator()<1>(t); break;
      default: break;
    }
  }
}
constexpr int64_t kPanelMinTokensK = 9;
constexpr int64_t kPanelMinTokensQ6K = 12;

inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// A 64-byte constant (permutation indices, masks) built at compile time.
struct alignas(64) Vec64 {
  uint8_t b[64];
};
inline __m512i Load(const Vec64& v) { return _mm512_load_si512(v.b); }

// --------------------------------------------------------------------------------------------
// Eight consecutive blocks of kStride bytes ("a step"), loaded as whole zmm without reading a
// byte past the step (the last load ends exactly at its end, overlapping the previous one): the
// row may end at the end of a mapping. Fields are then picked out with byte/word permutes whose
// indices are computed at compile time.
template <int kStride>
struct Step8 {
  static constexpr int kBytes = 8 * kStride;
  static constexpr int kLoads = (kBytes + 63) / 64;
  static_assert(kBytes >= 64 && kLoads <= 5);
  static constexpr int Off(int i) { return i + 1 < kLoads ? 64 * i : kBytes - 64; }

  __m512i r[kLoads];
  void Load(const uint8_t* p) {
    // Two 32-byte loads per zmm: a 64-byte load at an address that is not 64-aligned spans
    // two cache lines, and streaming from DRAM that way measured about half as fast on Zen 5
    // (Q4_0 vec_dot on one thread: ~13 vs ~26 GB/s).
    for (int i = 0; i < kLoads; ++i) {
      r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + Off(i)))),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + Off(i) + 32)), 1);
    }
  }
};

// Which byte of the step output byte j (0..63) of unit p comes from. Pair kinds fill a zmm
// from blocks 2p, 2p+1 (32 bytes each); quad kinds from blocks 4p..4p+3 (16 bytes each).
enum class Pick {
  kNatural,  // 32 bytes at kOff of each block: block 2p then 2p+1 (Q8 codes)
  kDupQs,    // 16 bytes at kOff of each block, twice: [qs, qs] per block (nibbles unpacked later)
  kQhBytes,  // byte (e / 8) of the 4 bytes at kOff, for element e of each block (5th bits)
  kQuadLo,   // bytes 0..15 at kOff of blocks 4p..4p+3 (nibbles: elements 0..15 and 16..31)
  kQuadQhLo, // for element e < 16 of each of 4 blocks: byte e / 8 of its 4 bytes of 5th bits
  kQuadQhHi, // the same for element 16 + e: byte 2 + e / 8
};
constexpr int PickSource(Pick pick, int stride, int off, int p, int j) {
  const int block = 2 * p + j / 32, e = j % 32;
  const int qblock = 4 * p + j / 16, qe = j % 16;
  switch (pick) {
    case Pick::kNatural: return block * stride + off + e;
    case Pick::kDupQs: return block * stride + off + (e % 16);
    case Pick::kQhBytes: return block * stride + off + e / 8;
    case Pick::kQuadLo: return qblock * stride + off + qe;
    case Pick::kQuadQhLo: return qblock * stride + off + qe / 8;
    case Pick::kQuadQhHi: return qblock * stride + off + 2 + qe / 8;
  }
  return 0;
}

// vpermt2b indices for one block pair: sources are loads `first` and first + 1.
struct PairIdx {
  Vec64 idx;
  int first;
  bool single;  // all bytes in load `first`
  bool ok;
};
template <int kStride>
constexpr PairIdx MakePairIdx(Pick pick, int off, int p) {
  using S = Step8<kStride>;
  PairIdx t{};
  int lo = PickSource(pick, kStride, off, p, 0);
  for (int j = 1; j < 64; ++j) {
    const int s = PickSource(pick, kStride, off, p, j);
    if (s < lo) lo = s;
  }
  t.first = 0;
  while (t.first + 1 < S::kLoads && S::Off(t.first + 1) <= lo) ++t.first;
  t.ok = true;
  t.single = true;
  for (int j = 0; j < 64; ++j) {
    const int s = PickSource(pick, kStride, off, p, j);
    if (s >= S::Off(t.first) && s < S::Off(t.first) + 64) {
      t.idx.b[j] = static_cast<uint8_t>(s - S::Off(t.first));
    } else if (t.first + 1 < S::kLoads && s >= S::Off(t.first + 1) && s < S::Off(t.first + 1) + 64) {
      t.idx.b[j] = static_cast<uint8_t>(64 + s - S::Off(t.first + 1));
      t.single = false;
    } else {
      t.ok = false;
    }
  }
  return t;
}

template <int kStride, Pick kPick, int kOff, int kPair>
struct PairTable {
  static constexpr PairIdx value = MakePairIdx<kStride>(kPick, kOff, kPair);
  static_assert(value.ok, "block pair does not fit in two consecutive loads");
};

template <int kStride, Pick kPick, int kOff, int kPair>
inline __m512i PickPair(const Step8<kStride>& s) {
  constexpr const PairIdx& t = PairTable<kStride, kPick, kOff, kPair>::value;
  if constexpr (t.single) {
    return _mm512_permutexvar_epi8(Load(t.idx), s.r[t.first]);
  } else {
    return _mm512_permutex2var_epi8(s.r[t.first], Load(t.idx), s.r[t.first + 1]);
  }
}

// The fp16 at byte kOff of each of the 8 blocks, as 8 floats. Words are gathered with vpermt2w
// over load pairs (0,1), (2,3), (4), merged by mask.
struct WordIdx {
  Vec64 idx[3];
  uint32_t mask[3];  // which of the 8 output words come from load pair g
};
template <int kStride>
constexpr WordIdx MakeWordIdx(int off) {
  using S = Step8<kStride>;
  WordIdx t{};
  for (int b = 0; b < 8; ++b) {
    const int s = b * kStride + off;  // even: every stride and offset used is even
    for (int g = 0; 2 * g < S::kLoads; ++g) {
      const int l0 = 2 * g, l1 = 2 * g + 1;
      int word = -1;
      if (s >= S::Off(l0) && s + 2 <= S::Off(l0) + 64) {
        word = (s - S::Off(l0)) / 2;
      } else if (l1 < S::kLoads && s >= S::Off(l1) && s + 2 <= S::Off(l1) + 64) {
        word = 32 + (s - S::Off(l1)) / 2;
      }
      if (word >= 0) {
        t.idx[g].b[2 * b] = static_cast<uint8_t>(word);  // 16-bit indices, little-endian
        t.idx[g].b[2 * b + 1] = 0;
        t.mask[g] |= 1u << b;
        break;
      }
    }
  }
  return t;
}
template <int kStride, int kOff>
struct WordTable {
  static constexpr WordIdx value = MakeWordIdx<kStride>(kOff);
  static_assert((value.mask[0] | value.mask[1] | value.mask[2]) == 0xFF);
};

template <int kStride, int kOff>
inline __m256 PickHalves(const Step8<kStride>& s) {
  using S = Step8<kStride>;
  constexpr const WordIdx& t = WordTable<kStride, kOff>::value;
  __m512i w = S::kLoads > 1 ? _mm512_permutex2var_epi16(s.r[0], Load(t.idx[0]), s.r[1])
                            : _mm512_permutexvar_epi16(Load(t.idx[0]), s.r[0]);
  if constexpr (S::kLoads > 2 && t.mask[1] != 0) {
    const __m512i w1 = S::kLoads > 3 ? _mm512_permutex2var_epi16(s.r[2], Load(t.idx[1]), s.r[S::kLoads > 3 ? 3 : 2])
                                     : _mm512_permutexvar_epi16(Load(t.idx[1]), s.r[2]);
    w = _mm512_mask_blend_epi16(t.mask[1], w, w1);
  }
  if constexpr (S::kLoads > 4 && t.mask[2] != 0) {
    const __m512i w2 = _mm512_permutexvar_epi16(Load(t.idx[2]), s.r[S::kLoads - 1]);
    w = _mm512_mask_blend_epi16(t.mask[2], w, w2);
  }
  return _mm256_cvtph_ps(_mm512_castsi512_si128(w));
}

// --------------------------------------------------------------------------------------------
// Constants for unpacking nibbles laid out by Pick::kDupQs: the second 16 bytes of each block's
// 32 are shifted right by 4 (high nibbles = elements 16..31).
constexpr Vec64 MakeDupShift() {
  Vec64 v{};
  for (int w = 0; w < 32; ++w) v.b[2 * w] = ((w / 8) % 2) ? 4 : 0;  // 16-bit shift counts
  return v;
}
constexpr Vec64 kDupShift = MakeDupShift();
// Bit (e % 8) of each element e, to test the 5th bits picked by Pick::kQhBytes.
constexpr Vec64 MakeQhBit() {
  Vec64 v{};
  for (int j = 0; j < 64; ++j) v.b[j] = static_cast<uint8_t>(1u << (j % 8));
  return v;
}
constexpr Vec64 kQhBit = MakeQhBit();

inline __m512i UnpackDupNibbles(__m512i dup) {
  return _mm512_and_si512(_mm512_srlv_epi16(dup, Load(kDupShift)), _mm512_set1_epi8(0x0F));
}

// Float lanes 4l..4l+3 = scale of block 4q + l, from 8 per-block scales (quad layout).
template <int kQuad>
inline __m512 SpreadQuad(__m256 s8) {
  const __m512i idx = _mm512_add_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2),
                                       _mm512_set1_epi32(4 * kQuad));
  return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(s8));
}

// Float lanes 0..7 = scale of block 2p, 8..15 = block 2p+1, from 8 per-block scales.
template <int kPair>
inline __m512 SpreadPair(__m256 s8) {
  const __m512i idx = _mm512_set_epi32(2 * kPair + 1, 2 * kPair + 1, 2 * kPair + 1, 2 * kPair + 1, 2 * kPair + 1,
                                       2 * kPair + 1, 2 * kPair + 1, 2 * kPair + 1, 2 * kPair, 2 * kPair, 2 * kPair,
                                       2 * kPair, 2 * kPair, 2 * kPair, 2 * kPair, 2 * kPair);
  return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(s8));
}

// Horizontal reductions.
inline float HSum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float HMax(__m512 v) {
  const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline int32_t HSumI32(__m512i v) {
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti32x8_epi32(v, 1));
  __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4E));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1));
  return _mm_cvtsi128_si32(q);
}

// --------------------------------------------------------------------------------------------
// Panels for prefill: 32 weight rows are unpacked to one byte per weight (u8 codes) and
// transposed so that one zmm holds 4 consecutive codes of each of 16 rows: vpdpbusd against a
// broadcast dword of one token's activation codes then accumulates 16 rows at once, and each
// unpacked panel is reused by every token of the block (the unpacking cost is divided by it).
constexpr int kPanelRows = 32;    // two zmm of row lanes
constexpr int kChunkK = 512;      // elements of K unpacked at a time (codes: 16 KiB, in L1)
constexpr int kTokenBlock = 128;  // tokens per pass over a panel (activation info on the stack)
// Tokens of the next pass over a panel when `left` remain: kTokenBlock, but a remainder under
// half of that joins the pass before it, so a panel is not unpacked again for a few tokens
// (tinyllama Q4_0, 8 agents each prefilling a 17-token turn over a 1024-token context: one
// pass of 140 tokens instead of 128 + 12; the two alternated pass by pass in one process,
// medians of 20 passes: 1.8% and 2.8% faster).
constexpr int kMaxTokenBlock = kTokenBlock + kTokenBlock / 2 - 1;
inline int64_t TokensOfPass(int64_t left) { return left <= kMaxTokenBlock ? left : kTokenBlock; }

// Prefetches the bytes [at, at + n) (whole lines), for the next panel's fill: it is a separate
// run of addresses that the hardware prefetcher does not start on by itself.
inline void PrefetchBytes(const uint8_t* at, int64_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(at);
  for (uintptr_t line = a & ~uintptr_t{63}; line < a + static_cast<uintptr_t>(n); line += 64) {
    asm volatile("prefetcht0 %0" ::"m"(*reinterpret_cast<const uint8_t*>(line)));
  }
}
// Share `part` of `parts` of n_rows rows (row i at first + i * row_bytes), each a run of
// run_bytes: what a plain row-major layout's next panel fill reads.
inline void PrefetchRowsShare(const uint8_t* first, int64_t row_bytes, int64_t n_rows, int64_t run_bytes, int64_t part,
                              int64_t parts) {
  for (int64_t i = n_rows * part / parts, end = n_rows * (part + 1) / parts; i < end; ++i) {
    PrefetchBytes(first + i * row_bytes, run_bytes);
  }
}

// 16 rows x 8 dwords (ymm per row, 32 codes of a group) -> 8 zmm, zmm j = dword j of rows
// 0..15 (codes 4j..4j+3 of each row), stored at out + kStride * j (panels: 128, the other 16
// rows of the panel living in the second 64 bytes; the AMX table's B tiles: 64).
template <int kStride = 128>
inline void TransposeStore16x8(const __m256i (&r)[16], uint8_t* out) {
  __m512i z[8];
  for (int i = 0; i < 4; ++i) {
    z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(r[i]), r[i + 4], 1);
    z[4 + i] = _mm512_inserti64x4(_mm512_castsi256_si512(r[8 + i]), r[12 + i], 1);
  }
  __m512i q[2][4];
  for (int h = 0; h < 2; ++h) {
    const __m512i* a = z + 4 * h;
    const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    q[h][0] = _mm512_unpacklo_epi64(t0, t2);
    q[h][1] = _mm512_unpackhi_epi64(t0, t2);
    q[h][2] = _mm512_unpacklo_epi64(t1, t3);
    q[h][3] = _mm512_unpackhi_epi64(t1, t3);
  }
  for (int k = 0; k < 4; ++k) {
    _mm512_store_si512(out + kStride * k, _mm512_shuffle_i32x4(q[0][k], q[1][k], 0x88));
    _mm512_store_si512(out + kStride * (4 + k), _mm512_shuffle_i32x4(q[0][k], q[1][k], 0xDD));
  }
}

// Rows of a panel that exist (the rest are zero-filled so they contribute nothing).
inline __mmask16 RowMask(int64_t rows_left, int half) {
  const int64_t n = rows_left - 16 * half;
  if (n >= 16) return 0xFFFF;
  if (n <= 0) return 0;
  return static_cast<__mmask16>((1u << n) - 1);
}

// y[0..15] (+)= v for the rows in mask m.
inline void StoreRows(float* y, __m512 v, __mmask16 m, bool accumulate) {
  if (m == 0xFFFF) {
    if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(y));
    _mm512_storeu_ps(y, v);
  } else if (m != 0) {
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, y));
    _mm512_mask_storeu_ps(y, m, v);
  }
}

}  // namespace
}  // namespace kvfs::cpu
