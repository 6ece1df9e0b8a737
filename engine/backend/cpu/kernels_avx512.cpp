// The AVX-512 kernel table (F, BW, VL, DQ, VNNI, VBMI, BF16): activation quantizers, float
// dot products (F32, F16, BF16) and the table itself. The quantized formats are in
// kernels_avx512_legacy.cpp and kernels_avx512_kquants.cpp.
//
// The quantizers reproduce the scalar ones exactly (same float operations, same rounding to
// nearest even, same clamping), so every table feeds the dot products the same codes.
#include "engine/backend/cpu/kernels_avx512_common.h"

namespace kvfs::cpu {
namespace {

// Clamp as fmax(-127, fmin(127, v)): vminps/vmaxps return their second operand when one is a
// NaN, which gives 127 for a NaN as the scalar code does.
// Then round to nearest even (nearbyint) and convert.
inline __m512i RoundClamp127(__m512 v) {
  const __m512 c = _mm512_max_ps(_mm512_min_ps(v, _mm512_set1_ps(127.0f)), _mm512_set1_ps(-127.0f));
  return _mm512_cvtps_epi32(_mm512_roundscale_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// max(|x|) over the lanes, skipping NaNs like std::max(amax, fabs(x)) does.
inline __m512 AbsMaxAcc(__m512 v, __m512 acc) { return _mm512_max_ps(_mm512_abs_ps(v), acc); }

inline uint16_t FloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <bool kWithSum>
void QuantizeQ8Blocks(const float* x, uint8_t* out, int64_t n) {
  constexpr int kBytes = kWithSum ? 36 : 34;
  for (int64_t i = 0; i < n / 32; ++i) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * i), v1 = _mm512_loadu_ps(x + 32 * i + 16);
    const float amax = HMax(AbsMaxAcc(v1, AbsMaxAcc(v0, _mm512_setzero_ps())));
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m512i q0 = RoundClamp127(_mm512_mul_ps(v0, id));
    const __m512i q1 = RoundClamp127(_mm512_mul_ps(v1, id));
    uint8_t* b = out + i * kBytes;
    const uint16_t dh = FloatToHalf(d);
    std::memcpy(b, &dh, 2);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + kBytes - 32), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + kBytes - 16), _mm512_cvtepi32_epi8(q1));
    if constexpr (kWithSum) {
      const int sum = HSumI32(_mm512_add_epi32(q0, q1));
      const uint16_t sh = FloatToHalf(static_cast<float>(sum) * d);
      std::memcpy(b + 2, &sh, 2);
    }
  }
}

void QuantizeQ8_KImpl(const float* x, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* xb = x + i * kQK_K;
    uint8_t* b = out + i * 292;
    __m512 m = _mm512_setzero_ps();
    for (int k = 0; k < 16; ++k) m = AbsMaxAcc(_mm512_loadu_ps(xb + 16 * k), m);
    const float amax = HMax(m);
    if (amax == 0.0f) {
      std::memset(b, 0, 292);
      continue;
    }
    // The first element of largest magnitude sets the scale's sign (as the scalar loop does).
    float max = 0.0f;
    const __m512 va = _mm512_set1_ps(amax);
    for (int k = 0; k < 16; ++k) {
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * k)), va, _CMP_EQ_OQ);
      if (hit != 0) {
        max = xb[16 * k + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 vs = _mm512_set1_ps(iscale);
    for (int k = 0; k < 16; ++k) {
      const __m512i q = RoundClamp127(_mm512_mul_ps(vs, _mm512_loadu_ps(xb + 16 * k)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b + 4 + 16 * k), _mm512_cvtepi32_epi8(q));
      const int16_t sum = static_cast<int16_t>(HSumI32(q));
      std::memcpy(b + 260 + 2 * k, &sum, 2);
    }
    const float d = 1.0f / iscale;
    std::memcpy(b, &d, 4);
  }
}

void QuantizeF32(const float* x, void* dst, int64_t n) { std::memcpy(dst, x, static_cast<size_t>(n) * 4); }

void QuantizeF16(const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), h);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(out + 2 * i, m, h);
  }
}

// Round to nearest even on the 16 dropped bits (integer arithmetic, exact for subnormals,
// which vcvtneps2bf16 would flush); NaN: truncated with the quiet bit set.
inline __m256i FloatToBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                              _mm512_set1_epi32(0x7F800000), _MM_CMPINT_NLE);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

void QuantizeBf16(const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), FloatToBf16(_mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(out + 2 * i, m, FloatToBf16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// ------------------------------------------------------------------------------------------
// Float dot products: K in lanes, FMA (BF16 tiles: vdpbf16ps, two products per lane and step).

enum class FloatFmt { kF32, kF16, kBF16 };
template <FloatFmt F>
constexpr int kElemBytes = F == FloatFmt::kF32 ? 4 : 2;

// 16 elements starting at p as floats; m masks the valid ones (the rest read as 0).
template <FloatFmt F>
inline __m512 Load16(const uint8_t* p, __mmask16 m) {
  if constexpr (F == FloatFmt::kF32) {
    return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = m == 0xFFFF ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
    if constexpr (F == FloatFmt::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16 -> f32 exactly
  }
}

// acc[r][t] over R rows x NT tokens, 16 elements per step. For F32 with n % 16 == 0 this is
// exactly the scalar reference's order: one 16-lane FMA accumulator, then HSum's pairwise tree.
template <FloatFmt F, int R, int NT>
void FloatBlock(const uint8_t* w, int64_t w_row_bytes, const uint8_t* x, int64_t x_row_bytes, int64_t n, float* y,
                int64_t y_stride) {
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  // Full steps with plain loads (masked loads are slow on some cores), then a masked tail.
  auto step = [&](int64_t i, __mmask16 m) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = Load16<F>(w + r * w_row_bytes + i * kElemBytes<F>, m);
    for (int t = 0; t < NT; ++t) {
      const __m512 xv = Load16<F>(x + t * x_row_bytes + i * kElemBytes<F>, m);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) step(i, 0xFFFF);
  if (i < n) step(i, static_cast<__mmask16>((1u << (n - i)) - 1));
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = HSum(acc[r][t]);
  }
}

// BF16 x BF16 with vdpbf16ps: 32 elements per step (products exact in f32; bf16 subnormal
// inputs are read as zero, which is below any weight or activation magnitude of a model).
template <int R, int NT>
void Bf16Block(const uint8_t* w, int64_t w_row_bytes, const uint8_t* x, int64_t x_row_bytes, int64_t n, float* y,
               int64_t y_stride) {
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  auto step = [&](int64_t i, __mmask32 m, bool full) {
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * w_row_bytes + 2 * i;
      wv[r] = (__m512bh)(full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p));
    }
    for (int t = 0; t < NT; ++t) {
      const uint8_t* p = x + t * x_row_bytes + 2 * i;
      const __m512bh xv = (__m512bh)(full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p));
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  };
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) step(i, 0xFFFFFFFFu, true);
  if (i < n) step(i, static_cast<__mmask32>((1ull << (n - i)) - 1), false);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = HSum(acc[r][t]);
  }
}

// F32 rows whose length is not a multiple of 16, in the scalar reference's order (which is the
// reference engine's dot product): four 16-lane accumulators over 64-element steps, combined
// (0+2, 1+3, then the two), the pairwise lane tree, and the remaining elements as float
// multiply-adds, each rounded (not fused).
float F32DotOddLength(const uint8_t* w, const uint8_t* a, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const int64_t n64 = n / 64 * 64;
  for (int64_t i = 0; i < n64; i += 64) {
    for (int j = 0; j < 4; ++j) {
      acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(w + 4 * (i + 16 * j)), _mm512_loadu_ps(a + 4 * (i + 16 * j)), acc[j]);
    }
  }
  float sum = HSum(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])));
  for (int64_t i = n64; i < n; ++i) sum += LoadF32(w + 4 * i) * LoadF32(a + 4 * i);
  return sum;
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

template <FloatFmt F, int R, int NT>
void FloatBlockDispatch(const uint8_t* w, int64_t w_row_bytes, const uint8_t* x, int64_t x_row_bytes, int64_t n,
                        float* y, int64_t y_stride) {
  if constexpr (F == FloatFmt::kBF16) {
    Bf16Block<R, NT>(w, w_row_bytes, x, x_row_bytes, n, y, y_stride);
  } else {
    FloatBlock<F, R, NT>(w, w_row_bytes, x, x_row_bytes, n, y, y_stride);
  }
}

// Rows in groups of 4 x tokens in groups of 4: each loaded (and converted) weight vector is
// used by 4 tokens, each activation vector by 4 rows.
template <FloatFmt F, int R>
void FloatRows(const uint8_t* w, int64_t w_row_bytes, const uint8_t* x, int64_t x_row_bytes, int64_t n_tokens,
               int64_t n, float* y, int64_t y_stride) {
  int64_t t = 0;
  for (; t + 4 <= n_tokens; t += 4) {
    FloatBlockDispatch<F, R, 4>(w, w_row_bytes, x + t * x_row_bytes, x_row_bytes, n, y + t * y_stride, y_stride);
  }
  const uint8_t* xt = x + t * x_row_bytes;
  float* yt = y + t * y_stride;
  switch (n_tokens - t) {
    case 3: FloatBlockDispatch<F, R, 3>(w, w_row_bytes, xt, x_row_bytes, n, yt, y_stride); break;
    case 2: FloatBlockDispatch<F, R, 2>(w, w_row_bytes, xt, x_row_bytes, n, yt, y_stride); break;
    case 1: FloatBlockDispatch<F, R, 1>(w, w_row_bytes, xt, x_row_bytes, n, yt, y_stride); break;
    default: break;
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
  // Tokens in blocks whose activations stay in L2 while every row group passes over them.
  const int64_t block = n_in * kElemBytes<F> > 8192 ? 16 : 64;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += block) {
    const int64_t nt = n_tokens - t0 < block ? n_tokens - t0 : block;
    const uint8_t* x = x_quant + t0 * x_row_bytes;
    float* yb = y + t0 * y_stride;
    int64_t r = 0;
    // Decode (a token or two) streams one row at a time: 4 rows in lockstep are 4 DRAM streams
    // a row apart (F16 rows of 2048 are exactly a page), measured slower from DRAM.
    if (nt > 2) {
      for (; r + 4 <= n_rows; r += 4) {
        FloatRows<F, 4>(w_rows + r * w_row_bytes, w_row_bytes, x, x_row_bytes, nt, n_in, yb + r, y_stride);
      }
    }
    for (; r < n_rows; ++r) {
      FloatRows<F, 1>(w_rows + r * w_row_bytes, w_row_bytes, x, x_row_bytes, nt, n_in, yb + r, y_stride);
    }
  }
}

// ------------------------------------------------------------------------------------------

KernelTable MakeAvx512Table() {
  KernelTable t{};
  t.name = "avx512";
  auto set = [&t](GgmlType type, QuantizeRowFn q, VecDotFn dot, MatMulTileFn tile) {
    t.quantize_row[static_cast<uint32_t>(type)] = q;
    t.vec_dot[static_cast<uint32_t>(type)] = dot;
    t.matmul_tile[static_cast<uint32_t>(type)] = tile;
  };
  set(GgmlType::kF32, QuantizeF32, FloatVecDot<FloatFmt::kF32>, FloatTile<FloatFmt::kF32>);
  set(GgmlType::kF16, QuantizeF16, FloatVecDot<FloatFmt::kF16>, FloatTile<FloatFmt::kF16>);
  set(GgmlType::kBF16, QuantizeBf16, FloatVecDot<FloatFmt::kBF16>, FloatTile<FloatFmt::kBF16>);
  set(GgmlType::kQ4_0, avx512::QuantizeQ8_0, avx512::VecDotQ4_0, avx512::TileQ4_0);
  set(GgmlType::kQ4_1, avx512::QuantizeQ8_1, avx512::VecDotQ4_1, avx512::TileQ4_1);
  set(GgmlType::kQ5_0, avx512::QuantizeQ8_0, avx512::VecDotQ5_0, avx512::TileQ5_0);
  set(GgmlType::kQ5_1, avx512::QuantizeQ8_1, avx512::VecDotQ5_1, avx512::TileQ5_1);
  set(GgmlType::kQ8_0, avx512::QuantizeQ8_0, avx512::VecDotQ8_0, avx512::TileQ8_0);
  set(GgmlType::kQ4_K, avx512::QuantizeQ8_K, avx512::VecDotQ4_K, avx512::TileQ4_K);
  set(GgmlType::kQ5_K, avx512::QuantizeQ8_K, avx512::VecDotQ5_K, avx512::TileQ5_K);
  set(GgmlType::kQ6_K, avx512::QuantizeQ8_K, avx512::VecDotQ6_K, avx512::TileQ6_K);
  t.packed[static_cast<uint32_t>(GgmlType::kQ4_0)] = avx512::PackedQ4_0;
  t.packed[static_cast<uint32_t>(GgmlType::kQ4_1)] = avx512::PackedQ4_1;
  t.packed[static_cast<uint32_t>(GgmlType::kQ5_0)] = avx512::PackedQ5_0;
  t.packed[static_cast<uint32_t>(GgmlType::kQ5_1)] = avx512::PackedQ5_1;
  t.packed[static_cast<uint32_t>(GgmlType::kQ8_0)] = avx512::PackedQ8_0;
  t.packed[static_cast<uint32_t>(GgmlType::kQ4_K)] = avx512::PackedQ4_K;
  t.packed[static_cast<uint32_t>(GgmlType::kQ5_K)] = avx512::PackedQ5_K;
  t.packed[static_cast<uint32_t>(GgmlType::kQ6_K)] = avx512::PackedQ6_K;
  return t;
}

}  // namespace

namespace avx512 {
void QuantizeQ8_0(const float* x, void* dst, int64_t n) { QuantizeQ8Blocks<false>(x, static_cast<uint8_t*>(dst), n); }
void QuantizeQ8_1(const float* x, void* dst, int64_t n) { QuantizeQ8Blocks<true>(x, static_cast<uint8_t*>(dst), n); }
void QuantizeQ8_K(const float* x, void* dst, int64_t n) { QuantizeQ8_KImpl(x, static_cast<uint8_t*>(dst), n); }
}  // namespace avx512

// Only reached after kernel_select.cpp has seen the AVX-512 features in cpuid.
const KernelTable& Avx512Kernels() {
  static const KernelTable kTable = MakeAvx512Table();
  return kTable;
}

}  // namespace kvfs::cpu
