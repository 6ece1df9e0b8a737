// The scalar reference kernel table. Written for clarity, not speed: the SIMD tables are
// checked against these functions.
//
// Activation quantizers follow ggml's quantize_row_*_ref; dot products follow ggml's
// ggml_vec_dot_*_generic: exact integer sums of code products per block (or per sub-block
// times its integer scale), then one float multiply by the product of the two block scales,
// accumulated in a float.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/backend/cpu/kernels.h"
#include "engine/model/quant_block_access.h"
#include "engine/model/quant_blocks.h"
#include "engine/model/quants.h"

namespace kvfs::cpu {
namespace {

// ------------------------------------------------------------------------------------------
// Activation quantizers (dst has no alignment guarantee).

void QuantizeF32(const float* x, void* dst, int64_t n) {
  std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
}

void QuantizeF16(const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = Fp32ToFp16(x[i]);
    std::memcpy(out + 2 * i, &h, sizeof(h));
  }
}

void QuantizeBf16(const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = Fp32ToBf16(x[i]);
    std::memcpy(out + 2 * i, &b, sizeof(b));
  }
}

// Round to nearest, ties to even (ggml's nearest_int) and clamp to -127..127. For finite input
// |v| <= 127 (up to rounding) already; the clamp only keeps non-finite input defined.
int8_t NearestInt8(float v) {
  return static_cast<int8_t>(std::nearbyint(std::fmax(-127.0f, std::fmin(127.0f, v))));
}

// Q8_0 and Q8_1 share the scale: d = amax / 127, codes x * (127 / amax) rounded half to even:
// the reference engine's x86 (AVX) quantizer, which every kernel table here reproduces so all
// tables give identical codes and match the golden data made on this machine kind.
struct Q8Scale {
  float d;
  float id;
};
Q8Scale Q8BlockScale(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  return {d, amax != 0.0f ? 127.0f / amax : 0.0f};
}

void QuantizeQ8_0(const float* x, void* dst, int64_t n) {
  const int64_t nb = n / kQK8_0;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK8_0;
    const Q8Scale sc = Q8BlockScale(xb);
    BlockQ8_0 b;
    b.d = Fp32ToFp16(sc.d);
    for (int j = 0; j < kQK8_0; ++j) b.qs[j] = NearestInt8(xb[j] * sc.id);
    StoreBlock(dst, i, b);
  }
}

void QuantizeQ8_1(const float* x, void* dst, int64_t n) {
  const int64_t nb = n / kQK8_1;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK8_1;
    const Q8Scale sc = Q8BlockScale(xb);
    BlockQ8_1 b;
    b.d = Fp32ToFp16(sc.d);
    int sum = 0;
    for (int j = 0; j < kQK8_1; ++j) {
      b.qs[j] = NearestInt8(xb[j] * sc.id);
      sum += b.qs[j];
    }
    b.s = Fp32ToFp16(static_cast<float>(sum) * sc.d);  // unrounded d, as ggml
    StoreBlock(dst, i, b);
  }
}

void QuantizeQ8_K(const float* x, void* dst, int64_t n) {
  const int64_t nb = n / kQK_K;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK_K;
    BlockQ8_K b{};
    // The element of largest magnitude (the first one on ties) fixes the sign of the scale:
    // it maps to code -127, so every code lies in -127..127.
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax != 0.0f) {
      const float iscale = -127.0f / max;  // current ggml (was -128/max before IQ2_XXS)
      for (int j = 0; j < kQK_K; ++j) {
        b.qs[j] = NearestInt8(iscale * xb[j]);
      }
      for (int g = 0; g < kQK_K / 16; ++g) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += b.qs[16 * g + j];
        b.bsums[g] = static_cast<int16_t>(sum);
      }
      b.d = 1.0f / iscale;
    }  // else: all zero (d = 0, codes and sums 0)
    StoreBlock(dst, i, b);
  }
}

// ------------------------------------------------------------------------------------------
// Dot products: weight row (type t) with an activation row (type VecDotType(t)).

float LoadF16(const void* row, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(row) + 2 * i, sizeof(h));
  return Fp16ToFp32(h);
}

float LoadBf16(const void* row, int64_t i) {
  uint16_t b;
  std::memcpy(&b, static_cast<const uint8_t*>(row) + 2 * i, sizeof(b));
  return Bf16ToFp32(b);
}

// The summation order follows the reference engine's f32 paths, because stories260K (F32
// weights) is checked against it to 0.02 over 536 positions and order matters at that level:
// rows whose length is a multiple of 16 go through its tiled GEMM (one 16-lane FMA
// accumulator, then a pairwise tree); other lengths through its dot product (four 16-lane
// accumulators over 64-element steps, combined pairwise, then a tail of float multiply-adds
// rounded one operation at a time: its accumulator there is a float, and a double tail moved
// stories260K p3 rows 446-447 by 0.025).
float VecDotF32(const void* w, const void* a, int64_t n) {
  auto load = [](const void* p, int64_t i) {
    float v;
    std::memcpy(&v, static_cast<const uint8_t*>(p) + 4 * i, sizeof(v));
    return v;
  };
  auto tree = [](float* lanes) {
    for (int width = 8; width >= 1; width /= 2) {
      for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    return lanes[0];
  };
  if (n % 16 == 0) {
    float lanes[16] = {};
    for (int64_t i = 0; i < n; i += 16) {
      for (int l = 0; l < 16; ++l) lanes[l] = std::fma(load(w, i + l), load(a, i + l), lanes[l]);
    }
    return tree(lanes);
  }
  float acc[4][16] = {};
  const int64_t n64 = n / 64 * 64;
  for (int64_t i = 0; i < n64; i += 64) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 16; ++l) acc[j][l] = std::fma(load(w, i + 16 * j + l), load(a, i + 16 * j + l), acc[j][l]);
    }
  }
  for (int l = 0; l < 16; ++l) {
    acc[0][l] += acc[2][l];
    acc[1][l] += acc[3][l];
  }
  for (int l = 0; l < 16; ++l) acc[0][l] += acc[1][l];
  float sum = tree(acc[0]);
  for (int64_t i = n64; i < n; ++i) sum += load(w, i) * load(a, i);  // not fused: -ffp-contract=off
  return sum;
}

float VecDotF16(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += LoadF16(w, i) * LoadF16(a, i);
  return sum;
}

float VecDotBf16(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += LoadBf16(w, i) * LoadBf16(a, i);
  return sum;
}

float VecDotQ4_0(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const BlockQ4_0 x = LoadBlock<BlockQ4_0>(w, i);
    const BlockQ8_0 y = LoadBlock<BlockQ8_0>(a, i);
    int sumi = 0;
    for (int e = 0; e < 32; ++e) sumi += (LowBitsOf32(x.qs, e) - 8) * y.qs[e];
    sum += (Fp16ToFp32(x.d) * Fp16ToFp32(y.d)) * static_cast<float>(sumi);
  }
  return sum;
}

// x = d*q + m against y = dy*qy: sum = d*dy*sum(q*qy) + m*(dy*sum(qy)) = ... + m*s.
float VecDotQ4_1(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK4_1; ++i) {
    const BlockQ4_1 x = LoadBlock<BlockQ4_1>(w, i);
    const BlockQ8_1 y = LoadBlock<BlockQ8_1>(a, i);
    int sumi = 0;
    for (int e = 0; e < 32; ++e) sumi += LowBitsOf32(x.qs, e) * y.qs[e];
    sum += (Fp16ToFp32(x.d) * Fp16ToFp32(y.d)) * static_cast<float>(sumi) +
           Fp16ToFp32(x.m) * Fp16ToFp32(y.s);
  }
  return sum;
}

float VecDotQ5_0(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK5_0; ++i) {
    const BlockQ5_0 x = LoadBlock<BlockQ5_0>(w, i);
    const BlockQ8_0 y = LoadBlock<BlockQ8_0>(a, i);
    int sumi = 0;
    for (int e = 0; e < 32; ++e) {
      const int q = LowBitsOf32(x.qs, e) | HighBitOf32(x.qh, e);
      sumi += (q - 16) * y.qs[e];
    }
    sum += (Fp16ToFp32(x.d) * Fp16ToFp32(y.d)) * static_cast<float>(sumi);
  }
  return sum;
}

float VecDotQ5_1(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK5_1; ++i) {
    const BlockQ5_1 x = LoadBlock<BlockQ5_1>(w, i);
    const BlockQ8_1 y = LoadBlock<BlockQ8_1>(a, i);
    int sumi = 0;
    for (int e = 0; e < 32; ++e) {
      const int q = LowBitsOf32(x.qs, e) | HighBitOf32(x.qh, e);
      sumi += q * y.qs[e];
    }
    sum += (Fp16ToFp32(x.d) * Fp16ToFp32(y.d)) * static_cast<float>(sumi) +
           Fp16ToFp32(x.m) * Fp16ToFp32(y.s);
  }
  return sum;
}

float VecDotQ8_0(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const BlockQ8_0 x = LoadBlock<BlockQ8_0>(w, i);
    const BlockQ8_0 y = LoadBlock<BlockQ8_0>(a, i);
    int sumi = 0;
    for (int e = 0; e < 32; ++e) sumi += x.qs[e] * y.qs[e];
    sum += (Fp16ToFp32(x.d) * Fp16ToFp32(y.d)) * static_cast<float>(sumi);
  }
  return sum;
}

// Q4_K / Q5_K against Q8_K. Per super-block, with sub-block s (32 elements) and y = dy*qy:
//   sum_e (d*sc[s]*q_e - dmin*m[s]) * dy*qy_e
//     = (d*dy) * sum_s sc[s] * sum_{e in s} q_e*qy_e  -  (dmin*dy) * sum_s m[s] * sum_{e in s} qy_e
// where sum_{e in s} qy_e is the sum of the two 16-element bsums of the sub-block.
// All sums are exact in int32 (|isum| <= 63 * 31 * 127 * 256 < 2^26).
template <typename Block, int (*Code)(const Block&, int)>
float VecDotKQuantWithMin(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const Block x = LoadBlock<Block>(w, i);
    const BlockQ8_K y = LoadBlock<BlockQ8_K>(a, i);
    int isum = 0;
    int summins = 0;
    for (int s = 0; s < 8; ++s) {
      const KScaleMin sm = UnpackKScaleMin(x.scales, s);
      int dot = 0;
      for (int l = 0; l < 32; ++l) dot += Code(x, 32 * s + l) * y.qs[32 * s + l];
      isum += sm.scale * dot;
      summins += sm.min * (y.bsums[2 * s] + y.bsums[2 * s + 1]);
    }
    const float d = Fp16ToFp32(x.d) * y.d;
    const float dmin = Fp16ToFp32(x.dmin) * y.d;
    sum += d * static_cast<float>(isum) - dmin * static_cast<float>(summins);
  }
  return sum;
}

int Q4KCode(const BlockQ4_K& b, int e) { return KLowBits(b.qs, e); }
int Q5KCode(const BlockQ5_K& b, int e) {
  return KLowBits(b.qs, e) | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
}

float VecDotQ4_K(const void* w, const void* a, int64_t n) {
  return VecDotKQuantWithMin<BlockQ4_K, Q4KCode>(w, a, n);
}

float VecDotQ5_K(const void* w, const void* a, int64_t n) {
  return VecDotKQuantWithMin<BlockQ5_K, Q5KCode>(w, a, n);
}

// Q6_K against Q8_K: (d*dy) * sum_i scales[i] * sum_{e in sub-block i} (q_e - 32) * qy_e.
float VecDotQ6_K(const void* w, const void* a, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const BlockQ6_K x = LoadBlock<BlockQ6_K>(w, i);
    const BlockQ8_K y = LoadBlock<BlockQ8_K>(a, i);
    int isum = 0;
    for (int sb = 0; sb < 16; ++sb) {
      int dot = 0;
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * sb + l;
        dot += (Q6KCode(x, e) - 32) * y.qs[e];
      }
      isum += x.scales[sb] * dot;
    }
    sum += (Fp16ToFp32(x.d) * y.d) * static_cast<float>(isum);
  }
  return sum;
}

// ------------------------------------------------------------------------------------------
// Multi-row, multi-token products: the reference is one vec_dot per (row, token).

template <VecDotFn kDot>
void MatMulTileByVecDot(const uint8_t* w_rows, int64_t w_row_bytes, int64_t n_rows,
                        const uint8_t* x_quant, int64_t x_row_bytes, int64_t n_tokens,
                        int64_t n_in, float* y, int64_t y_stride) {
  for (int64_t r = 0; r < n_rows; ++r) {  // row outer: it stays in cache across tokens
    for (int64_t t = 0; t < n_tokens; ++t) {
      y[t * y_stride + r] = kDot(w_rows + r * w_row_bytes, x_quant + t * x_row_bytes, n_in);
    }
  }
}

// ------------------------------------------------------------------------------------------

KernelTable MakeScalarTable() {
  KernelTable t{};
  t.name = "scalar";
  auto set = [&t](GgmlType type, QuantizeRowFn q, VecDotFn dot, MatMulTileFn tile) {
    t.quantize_row[static_cast<uint32_t>(type)] = q;
    t.vec_dot[static_cast<uint32_t>(type)] = dot;
    t.matmul_tile[static_cast<uint32_t>(type)] = tile;
  };
  set(GgmlType::kF32, QuantizeF32, VecDotF32, MatMulTileByVecDot<VecDotF32>);
  set(GgmlType::kF16, QuantizeF16, VecDotF16, MatMulTileByVecDot<VecDotF16>);
  set(GgmlType::kBF16, QuantizeBf16, VecDotBf16, MatMulTileByVecDot<VecDotBf16>);
  set(GgmlType::kQ4_0, QuantizeQ8_0, VecDotQ4_0, MatMulTileByVecDot<VecDotQ4_0>);
  set(GgmlType::kQ4_1, QuantizeQ8_1, VecDotQ4_1, MatMulTileByVecDot<VecDotQ4_1>);
  set(GgmlType::kQ5_0, QuantizeQ8_0, VecDotQ5_0, MatMulTileByVecDot<VecDotQ5_0>);
  set(GgmlType::kQ5_1, QuantizeQ8_1, VecDotQ5_1, MatMulTileByVecDot<VecDotQ5_1>);
  set(GgmlType::kQ8_0, QuantizeQ8_0, VecDotQ8_0, MatMulTileByVecDot<VecDotQ8_0>);
  set(GgmlType::kQ4_K, QuantizeQ8_K, VecDotQ4_K, MatMulTileByVecDot<VecDotQ4_K>);
  set(GgmlType::kQ5_K, QuantizeQ8_K, VecDotQ5_K, MatMulTileByVecDot<VecDotQ5_K>);
  set(GgmlType::kQ6_K, QuantizeQ8_K, VecDotQ6_K, MatMulTileByVecDot<VecDotQ6_K>);
  return t;
}

}  // namespace

const KernelTable& ScalarKernels() {
  static const KernelTable kTable = MakeScalarTable();
  return kTable;
}

}  // namespace kvfs::cpu
