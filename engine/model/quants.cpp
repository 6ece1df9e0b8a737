// Element conversions and dequantization of the ggml weight formats. Each dequantizer computes
// every element with the same float expression, in the same order of operations, as ggml's
// dequantize_row_* so the results are bit-identical to the reference engine.
#include "engine/model/quants.h"

#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>

#include "engine/model/quant_block_access.h"
#include "engine/model/quant_blocks.h"

namespace kvfs {

// ------------------------------------------------------------------------------------------
// fp16 / bf16

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 (exact in float: mant < 2^10, result >= 2^-24 is normal).
    const float magnitude = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exp == 31) {
    // Infinity (mant == 0) or NaN (payload kept in the top mantissa bits).
    return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  }
  // Normal: rebias the exponent from 15 to 127, widen the mantissa from 10 to 23 bits.
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t Fp32ToFp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;

  if (abs > 0x7F800000u) {
    // NaN: keep the top 10 payload bits and force the quiet bit (as F16C hardware does).
    return static_cast<uint16_t>(sign | 0x7C00u | 0x0200u | ((abs >> 13) & 0x3FFu));
  }
  if (abs == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // infinity

  const int exp = static_cast<int>(abs >> 23) - 127;  // unbiased; -127 for zero/subnormal
  const uint32_t mant = abs & 0x7FFFFFu;

  if (exp > 15) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 2^16: overflow to inf
  if (exp >= -14) {
    // Half normal range. Keep the top 10 mantissa bits, round the 13 dropped bits to nearest
    // even. A carry out of the mantissa correctly bumps the exponent (and 65520.. -> inf).
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal (2^-25): rounds to zero
  // Half subnormal: value = full * 2^(exp - 23) with the implicit bit; in units of 2^-24 that
  // is full >> shift with shift = -1 - exp (14..24). Round the shifted-out bits to even.
  const uint32_t full = mant | 0x800000u;
  const int shift = -1 - exp;
  uint32_t h = full >> shift;
  const uint32_t rest = full & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;  // may carry into 0x400 (normal)
  return static_cast<uint16_t>(sign | h);
}

float Bf16ToFp32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t Fp32ToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: truncate, force quiet bit
  }
  // Round to nearest even on the 16 dropped bits; overflow carries into infinity.
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// ------------------------------------------------------------------------------------------
// Row geometry

int64_t RowBytes(GgmlType t, int64_t n) {
  const GgmlTypeTraits* info = GgmlTypeInfo(static_cast<uint32_t>(t));
  assert(info != nullptr);
  assert(n % info->block_elems == 0);
  return n / info->block_elems * info->block_bytes;
}

// ------------------------------------------------------------------------------------------
// Dequantization

namespace {

float LoadF16(const void* src, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(src) + 2 * i, sizeof(h));
  return Fp16ToFp32(h);
}

float LoadBf16(const void* src, int64_t i) {
  uint16_t b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + 2 * i, sizeof(b));
  return Bf16ToFp32(b);
}

void DequantQ4_0(const void* src, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ4_0 b = LoadBlock<BlockQ4_0>(src, i);
    const float d = Fp16ToFp32(b.d);
    for (int e = 0; e < 32; ++e) dst[i * 32 + e] = static_cast<float>(LowBitsOf32(b.qs, e) - 8) * d;
  }
}

void DequantQ4_1(const void* src, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ4_1 b = LoadBlock<BlockQ4_1>(src, i);
    const float d = Fp16ToFp32(b.d);
    const float m = Fp16ToFp32(b.m);
    for (int e = 0; e < 32; ++e) dst[i * 32 + e] = static_cast<float>(LowBitsOf32(b.qs, e)) * d + m;
  }
}

void DequantQ5_0(const void* src, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ5_0 b = LoadBlock<BlockQ5_0>(src, i);
    const float d = Fp16ToFp32(b.d);
    for (int e = 0; e < 32; ++e) {
      const int q = LowBitsOf32(b.qs, e) | HighBitOf32(b.qh, e);
      dst[i * 32 + e] = static_cast<float>(q - 16) * d;
    }
  }
}

void DequantQ5_1(const void* src, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ5_1 b = LoadBlock<BlockQ5_1>(src, i);
    const float d = Fp16ToFp32(b.d);
    const float m = Fp16ToFp32(b.m);
    for (int e = 0; e < 32; ++e) {
      const int q = LowBitsOf32(b.qs, e) | HighBitOf32(b.qh, e);
      dst[i * 32 + e] = static_cast<float>(q) * d + m;
    }
  }
}

void DequantQ8_0(const void* src, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ8_0 b = LoadBlock<BlockQ8_0>(src, i);
    const float d = Fp16ToFp32(b.d);
    for (int e = 0; e < 32; ++e) dst[i * 32 + e] = static_cast<float>(b.qs[e]) * d;
  }
}

void DequantQ4_K(const void* src, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ4_K b = LoadBlock<BlockQ4_K>(src, i);
    const float d = Fp16ToFp32(b.d);
    const float dmin = Fp16ToFp32(b.dmin);
    for (int s = 0; s < 8; ++s) {
      const KScaleMin sm = UnpackKScaleMin(b.scales, s);
      const float scale = d * static_cast<float>(sm.scale);
      const float offset = dmin * static_cast<float>(sm.min);
      for (int l = 0; l < 32; ++l) {
        const int e = 32 * s + l;
        dst[i * kQK_K + e] = scale * static_cast<float>(KLowBits(b.qs, e)) - offset;
      }
    }
  }
}

void DequantQ5_K(const void* src, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ5_K b = LoadBlock<BlockQ5_K>(src, i);
    const float d = Fp16ToFp32(b.d);
    const float dmin = Fp16ToFp32(b.dmin);
    for (int s = 0; s < 8; ++s) {
      const KScaleMin sm = UnpackKScaleMin(b.scales, s);
      const float scale = d * static_cast<float>(sm.scale);
      const float offset = dmin * static_cast<float>(sm.min);
      for (int l = 0; l < 32; ++l) {
        const int e = 32 * s + l;
        const int q = KLowBits(b.qs, e) | (((b.qh[l] >> s) & 1) << 4);
        dst[i * kQK_K + e] = scale * static_cast<float>(q) - offset;
      }
    }
  }
}

void DequantQ6_K(const void* src, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_K b = LoadBlock<BlockQ6_K>(src, i);
    const float d = Fp16ToFp32(b.d);
    for (int e = 0; e < kQK_K; ++e) {
      const float scale = d * static_cast<float>(b.scales[e / 16]);
      dst[i * kQK_K + e] = scale * static_cast<float>(Q6KCode(b, e) - 32);
    }
  }
}

}  // namespace

void DequantizeRow(GgmlType t, const void* src, float* dst, int64_t n) {
  const GgmlTypeTraits* info = GgmlTypeInfo(static_cast<uint32_t>(t));
  assert(info != nullptr && info->supported);
  assert(n % info->block_elems == 0);
  const int64_t nb = n / info->block_elems;
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadF16(src, i);
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadBf16(src, i);
      return;
    case GgmlType::kQ4_0: DequantQ4_0(src, dst, nb); return;
    case GgmlType::kQ4_1: DequantQ4_1(src, dst, nb); return;
    case GgmlType::kQ5_0: DequantQ5_0(src, dst, nb); return;
    case GgmlType::kQ5_1: DequantQ5_1(src, dst, nb); return;
    case GgmlType::kQ8_0: DequantQ8_0(src, dst, nb); return;
    case GgmlType::kQ4_K: DequantQ4_K(src, dst, nb); return;
    case GgmlType::kQ5_K: DequantQ5_K(src, dst, nb); return;
    case GgmlType::kQ6_K: DequantQ6_K(src, dst, nb); return;
    default:
      assert(false && "DequantizeRow: unsupported type");
      return;
  }
}

}  // namespace kvfs
