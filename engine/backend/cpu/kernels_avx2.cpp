// The AVX2 kernel table (AVX2 + FMA + F16C): activation quantizers, float dot products and the
// table. Quantized formats are in kernels_avx2_quants.cpp.
//
// The quantizers reproduce the scalar ones exactly (same float operations, rounding to nearest
// even, same clamping); F32 dot products keep the scalar reference's summation order.
#include "engine/backend/cpu/kernels_avx2_common.h"

namespace kvfs::cpu {
namespace {

// fmax(-127, fmin(127, v)) (a NaN gives 127: vminps/vmaxps return their second operand when
// one is a NaN), then round to nearest even and convert.
inline __m256i RoundClamp127(__m256 v) {
  const __m256 c = _mm256_max_ps(_mm256_min_ps(v, _mm256_set1_ps(127.0f)), _mm256_set1_ps(-127.0f));
  return _mm256_cvtps_epi32(_mm256_round_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline __m256 Abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
// max(|x|) skipping NaNs, like std::max(amax, fabs(x)).
inline __m256 AbsMaxAcc(__m256 v, __m256 acc) { return _mm256_max_ps(Abs(v), acc); }
inline float HMax8(__m256 v) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline uint16_t FloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 32 int32 codes (4 vectors, element order) -> 32 int8 in element order.
inline __m256i PackCodes(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
  const __m256i p = _mm256_packs_epi16(p01, p23);  // 128-bit lanes interleave the inputs
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <bool kWithSum>
void QuantizeQ8Blocks(const float* x, uint8_t* out, int64_t n) {
  constexpr int kBytes = kWithSum ? 36 : 34;
  for (int64_t i = 0; i < n / 32; ++i) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + 32 * i + 8 * j);
      m = AbsMaxAcc(v[j], m);
    }
    const float amax = HMax8(m);
    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = RoundClamp127(_mm256_mul_ps(v[j], id));
    uint8_t* b = out + i * kBytes;
    const uint16_t dh = FloatToHalf(d);
    std::memcpy(b, &dh, 2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + kBytes - 32), PackCodes(q[0], q[1], q[2], q[3]));
    if constexpr (kWithSum) {
      const int sum = HSumI32x8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
      const uint16_t sh = FloatToHalf(static_cast<float>(sum) * d);
      std::memcpy(b + 2, &sh, 2);
    }
  }
}

void QuantizeQ8_KImpl(const float* x, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* xb = x + i * kQK_K;
    uint8_t* b = out + i * 292;
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k) m = AbsMaxAcc(_mm256_loadu_ps(xb + 8 * k), m);
    const float amax = HMax8(m);
    if (amax == 0.0f) {
      std::memset(b, 0, 292);
      continue;
    }
    float max = 0.0f;  // the first element of largest magnitude sets the scale's sign
    const __m256 va = _mm256_set1_ps(amax);
    for (int k = 0; k < 32; ++k) {
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(Abs(_mm256_loadu_ps(xb + 8 * k)), va, _CMP_EQ_OQ));
      if (hit != 0) {
        max = xb[8 * k + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 vs = _mm256_set1_ps(iscale);
    for (int k = 0; k < 8; ++k) {  // 32 elements at a time
      __m256i q[4];
      for (int j = 0; j < 4; ++j) q[j] = RoundClamp127(_mm256_mul_ps(vs, _mm256_loadu_ps(xb + 32 * k + 8 * j)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + 4 + 32 * k), PackCodes(q[0], q[1], q[2], q[3]));
      const int16_t s0 = static_cast<int16_t>(HSumI32x8(_mm256_add_epi32(q[0], q[1])));
      const int16_t s1 = static_cast<int16_t>(HSumI32x8(_mm256_add_epi32(q[2], q[3])));
      std::memcpy(b + 260 + 4 * k, &s0, 2);
      std::memcpy(b + 262 + 4 * k, &s1, 2);
    }
    const float d = 1.0f / iscale;
    std::memcpy(b, &d, 4);
  }
}

void QuantizeF32(const float* x, void* dst, int64_t n) { std::memcpy(dst, x, static_cast<size_t>(n) * 4); }

void QuantizeF16(const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

// Round to nearest even on the dropped 16 bits; NaN: truncated with the quiet bit set.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void QuantizeBf16(const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i v = _mm256_blendv_epi8(r, quiet, nan);  // 16-bit values in 32-bit lanes
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), packed);
  }
  for (; i < n; ++i) {
    const uint16_t h = FloatToBf16(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

// ------------------------------------------------------------------------------------------
// Float dot products.

enum class FloatFmt { kF32, kF16, kBF16 };
template <FloatFmt F>
constexpr int kElemBytes = F == FloatFmt::kF32 ? 4 : 2;

template <FloatFmt F>
inline __m256 Load8(const uint8_t* p) {
  if constexpr (F == FloatFmt::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else {
    const __m128i h = LoadU128(p);
    if constexpr (F == FloatFmt::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}
template <FloatFmt F>
inline float Load1(const uint8_t* p) {
  if constexpr (F == FloatFmt::kF32) return LoadF32(p);
  if constexpr (F == FloatFmt::kF16) return HalfToFloat(p);
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// F32 rows whose length is not a multiple of 16, in the scalar reference's order: four 16-lane
// accumulators over 64-element steps (two ymm each), combined 0+2, 1+3, then the two, the
// pairwise lane tree, and the rest as float multiply-adds, each rounded (not fused).
float F32DotOddLength(const uint8_t* w, const uint8_t* a, int64_t n) {
  __m256 acc[4][2];
  for (auto& j : acc) j[0] = j[1] = _mm256_setzero_ps();
  const int64_t n64 = n / 64 * 64;
  for (int64_t i = 0; i < n64; i += 64) {
    for (int j = 0; j < 4; ++j) {
      for (int h = 0; h < 2; ++h) {
        const int64_t e = i + 16 * j + 8 * h;
        acc[j][h] = _mm256_fmadd_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(w + 4 * e)),
                                    _mm256_loadu_ps(reinterpret_cast<const float*>(a + 4 * e)), acc[j][h]);
      }
    }
  }
  __m256 lanes[2];
  for (int h = 0; h < 2; ++h) lanes[h] = _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[2][h]), _mm256_add_ps(acc[1][h], acc[3][h]));
  float sum = HSum8(_mm256_add_ps(lanes[0], lanes[1]));
  for (int64_t i = n64; i < n; ++i) sum += LoadF32(w + 4 * i) * LoadF32(a + 4 * i);
  return sum;
}

// R rows x NT tokens. Each (row, token) has one 16-lane accumulator (two ymm), which for F32
// rows of a multiple of 16 is exactly the scalar order; F16/BF16 add a scalar tail.
template <FloatFmt F, int R, int NT>
void FloatBlock(const uint8_t* w, int64_t w_row_bytes, const uint8_t* x, int64_t x_row_bytes, int64_t n, float* y,
                int64_t y_stride) {
  __m256 acc[R][NT][2];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
  }
  const int64_t n16 = n / 16 * 16;
  for (int64_t i = 0; i < n16; i += 16) {
    for (int h = 0; h < 2; ++h) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = Load8<F>(w + r * w_row_bytes + (i + 8 * h) * kElemBytes<F>);
      for (int t = 0; t < NT; ++t) {
        const __m256 xv = Load8<F>(x + t * x_row_bytes + (i + 8 * h) * kElemBytes<F>);
        for (int r = 0; r < R; ++r) acc[r][t][h] = _mm256_fmadd_ps(wv[r], xv, acc[r][t][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < NT; ++t) {
      float s = HSum8(_mm256_add_ps(acc[r][t][0], acc[r][t][1]));
      for (int64_t i = n16; i < n; ++i) {
        s += Load1<F>(w + r * w_row_bytes + i * kElemBytes<F>) * Load1<F>(x + t * x_row_bytes + i * kElemBytes<F>);
      }
      y[t * y_stride + r] = s;
    }
  }
}

template <FloatFmt F>
float FloatVecDot(const void* w, const void* a, int64_t n) {
  if (F == FloatFmt::kF32 && n % 16 != 0) {
    return F32DotOddLength(static_cast<const uint8_t*>(w), static_cast<const uint8_t*>(a), n);
  }
  float y;
  FloatBlock<F, 1, 1>(static_cast<const uint8_t*>(w), 0, static_cast<const uint8_t*>(a), 0, n, &y, 1);
  return y;
}

// Rows in pairs x tokens [t_begin, t_end) in pairs (16 ymm registers: 8 accumulators, loads
// and converts).
template <FloatFmt F>
void FloatTileBlock(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant,
                    int64_t x_row_bytes, int64_t t_begin, int64_t t_end, int64_t n_in, float* y, int64_t y_stride) {
  // Decode (a token or two) streams one row at a time: rows in lockstep are separate DRAM
  // streams a row apart, measured slower (see kernels_avx512.cpp).
  const int64_t row_step = t_end - t_begin > 2 ? 2 : 1;
  for (int64_t r = 0; r < n_rows; r += row_step) {
    const uint8_t* w = w_rows + r * w_row_bytes;
    for (int64_t t = t_begin; t < t_end; t += 2) {
      const uint8_t* x = x_quant + t * x_row_bytes;
      float* yt = y + t * y_stride + r;
      const bool two_rows = row_step == 2 && r + 1 < n_rows, two_tokens = t + 1 < t_end;
      if (two_rows && two_tokens) {
        FloatBlock<F, 2, 2>(w, w_row_bytes, x, x_row_bytes, n_in, yt, y_stride);
      } else if (two_rows) {
        FloatBlock<F, 2, 1>(w, w_row_bytes, x, x_row_bytes, n_in, yt, y_stride);
      } else if (two_tokens) {
        FloatBlock<F, 1, 2>(w, w_row_bytes, x, x_row_bytes, n_in, yt, y_stride);
      } else {
        FloatBlock<F, 1, 1>(w, w_row_bytes, x, x_row_bytes, n_in, yt, y_stride);
      }
    }
  }
}

template <FloatFmt F>
void FloatTile(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows, const uint8_t* x_quant,
               int64_t x_row_bytes, int64_t n_tokens, int64_t n_in, float* y, int64_t y_stride) {
  if (F == FloatFmt::kF32 && n_in % 16 != 0) {
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int64_t t = 0; t < n_tokens; ++t) {
        y[t * y_stride + r] = F32DotOddLength(w_rows + r * w_row_bytes, x_quant + t * x_row_bytes, n_in);
      }
    }
    return;
  }
  // Tokens in blocks whose activations stay in L2 while every row pair passes over them.
  const int64_t block = n_in * kElemBytes<F> > 8192 ? 16 : 64;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += block) {
    const int64_t t_end = n_tokens - t0 < block ? n_tokens : t0 + block;
    FloatTileBlock<F>(w_rows, w_row_bytes, n_rows, x_quant, x_row_bytes, t0, t_end, n_in, y, y_stride);
  }
}

KernelTable MakeAvx2Table() {
  KernelTable t{};
  t.name = "avx2";
  auto set = [&t](GgmlType type, QuantizeRowFn q, VecDotFn dot, MatMulTileFn tile) {
    t.quantize_row[static_cast<uint32_t>(type)] = q;
    t.vec_dot[static_cast<uint32_t>(type)] = dot;
    t.matmul_tile[static_cast<uint32_t>(type)] = tile;
  };
  set(GgmlType::kF32, QuantizeF32, FloatVecDot<FloatFmt::kF32>, FloatTile<FloatFmt::kF32>);
  set(GgmlType::kF16, QuantizeF16, FloatVecDot<FloatFmt::kF16>, FloatTile<FloatFmt::kF16>);
  set(GgmlType::kBF16, QuantizeBf16, FloatVecDot<FloatFmt::kBF16>, FloatTile<FloatFmt::kBF16>);
  set(GgmlType::kQ4_0, avx2::QuantizeQ8_0, avx2::VecDotQ4_0, avx2::TileQ4_0);
  set(GgmlType::kQ4_1, avx2::QuantizeQ8_1, avx2::VecDotQ4_1, avx2::TileQ4_1);
  set(GgmlType::kQ5_0, avx2::QuantizeQ8_0, avx2::VecDotQ5_0, avx2::TileQ5_0);
  set(GgmlType::kQ5_1, avx2::QuantizeQ8_1, avx2::VecDotQ5_1, avx2::TileQ5_1);
  set(GgmlType::kQ8_0, avx2::QuantizeQ8_0, avx2::VecDotQ8_0, avx2::TileQ8_0);
  set(GgmlType::kQ4_K, avx2::QuantizeQ8_K, avx2::VecDotQ4_K, avx2::TileQ4_K);
  set(GgmlType::kQ5_K, avx2::QuantizeQ8_K, avx2::VecDotQ5_K, avx2::TileQ5_K);
  set(GgmlType::kQ6_K, avx2::QuantizeQ8_K, avx2::VecDotQ6_K, avx2::TileQ6_K);
  t.packed[static_cast<uint32_t>(GgmlType::kQ4_0)] = avx2::PackedQ4_0;
  t.packed[static_cast<uint32_t>(GgmlType::kQ4_1)] = avx2::PackedQ4_1;
  t.packed[static_cast<uint32_t>(GgmlType::kQ5_0)] = avx2::PackedQ5_0;
  t.packed[static_cast<uint32_t>(GgmlType::kQ5_1)] = avx2::PackedQ5_1;
  t.packed[static_cast<uint32_t>(GgmlType::kQ8_0)] = avx2::PackedQ8_0;
  t.packed[static_cast<uint32_t>(GgmlType::kQ4_K)] = avx2::PackedQ4_K;
  t.packed[static_cast<uint32_t>(GgmlType::kQ5_K)] = avx2::PackedQ5_K;
  t.packed[static_cast<uint32_t>(GgmlType::kQ6_K)] = avx2::PackedQ6_K;
  return t;
}

}  // namespace

namespace avx2 {
void QuantizeQ8_0(const float* x, void* dst, int64_t n) { QuantizeQ8Blocks<false>(x, static_cast<uint8_t*>(dst), n); }
void QuantizeQ8_1(const float* x, void* dst, int64_t n) { QuantizeQ8Blocks<true>(x, static_cast<uint8_t*>(dst), n); }
void QuantizeQ8_K(const float* x, void* dst, int64_t n) { QuantizeQ8_KImpl(x, static_cast<uint8_t*>(dst), n); }
}  // namespace avx2

// Only reached after kernel_select.cpp has seen AVX2, FMA and F16C in cpuid.
const KernelTable& Avx2Kernels() {
  static const KernelTable kTable = MakeAvx2Table();
  return kTable;
}

}  // namespace kvfs::cpu
