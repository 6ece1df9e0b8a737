// Quantized weights in units of 32 consecutive elements of a row (a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0
// block, or a sub-block of a Q4_K/Q5_K/Q6_K super-block), unpacked from the ggml block layouts
// of engine/model/quant_blocks.h, or from split rows (below). Needs WEIGHT_TYPE (a
// specialization constant holding the ggml type id), WEIGHT_LAYOUT (vk::WeightLayout) and
// weight_bytes.glsl, with the weights at binding 0.
//
// A unit's 32 codes are kept as 8 words of 4 bytes (element 4i+j in byte j of q[i]): unsigned
// codes for every type but Q8_0 (signed bytes). Offsets such as Q4_0's "q - 8" are applied to
// the integer dot product through the activation's code sums, so every sum stays exact.

// The weights again as 16-byte words, for code bytes that start at a multiple of 16: split rows,
// and the Q4_K/Q5_K super-blocks (144 and 176 bytes, so rows and their code arrays are aligned).
// NVIDIA's memory pipeline moves a 128-bit load per invocation for the cost of a 32-bit one.
layout(binding = 0) readonly buffer WeightVec4s { uvec4 weight_vec4[]; };
// And as 8-byte words: split Q6_K rows' high bits, 8 bytes a unit.
layout(binding = 0) readonly buffer WeightVec2s { uvec2 weight_vec2[]; };

// WEIGHT_LAYOUT values (vk::WeightLayout).
const uint kLayoutGguf = 0u;
// Q4_0, Q8_0 and Q6_K only (engine/backend/vulkan/weight_layout.h): a row holds its units' f16
// scales, zero padding to a multiple of 16 bytes, then each unit's 16 or 32 code bytes; Q6_K
// rows hold their super-blocks' d, the units' scales, high bits and low nibbles.
const uint kLayoutSplitRows = 1u;

struct WeightUnit {
  uint q[8];  // 32 codes, 4 per word
  vec2 s;     // Q4_0/Q5_0/Q8_0: (d, -); Q4_1/Q5_1: (d, m); Q4_K/Q5_K: (d*sc, dmin*m);
              // Q6_K: (d*sc of elements 0..15, d*sc of elements 16..31)
};

// Bit e of `bits` (e = 0..3) moved to bit 4 of byte e: the 5th code bit of 4 elements.
uint SpreadBit4(uint bits) {
  return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

// Byte k (0-11) of a Q4_K/Q5_K super-block's 12 packed scale bytes, held as 3 words.
uint KScaleByte(uvec3 packed, uint k) { return (packed[k >> 2] >> (8u * (k & 3u))) & 0xFFu; }

// The 6-bit scale and min of sub-block s of a Q4_K/Q5_K super-block.
uvec2 KScaleMin(uvec3 packed, uint s) {
  if (s < 4u) return uvec2(KScaleByte(packed, s) & 63u, KScaleByte(packed, s + 4u) & 63u);
  const uint sc = (KScaleByte(packed, s + 4u) & 15u) | ((KScaleByte(packed, s - 4u) >> 6) << 4);
  const uint m = (KScaleByte(packed, s + 4u) >> 4) | ((KScaleByte(packed, s) >> 6) << 4);
  return uvec2(sc, m);
}

// Unit u (elements 32u .. 32u+31) of the row of n_units units starting at byte `row`.
WeightUnit LoadUnit(uint row, uint u, uint n_units) {
  WeightUnit wu;
  if (WEIGHT_LAYOUT == kLayoutSplitRows && (WEIGHT_TYPE == kTypeQ4_0 || WEIGHT_TYPE == kTypeQ8_0)) {
    wu.s = vec2(WeightF16(row + 2u * u), 0.0);
    const uint codes = (row + ((2u * n_units + 15u) & ~15u)) >> 4;  // in 16-byte words
    if (WEIGHT_TYPE == kTypeQ4_0) {  // the GGUF block's 16 code bytes, nibbles as there
      const uvec4 w = weight_vec4[codes + u];
      for (uint i = 0u; i < 4u; ++i) {
        wu.q[i] = w[i] & 0x0F0F0F0Fu;
        wu.q[i + 4u] = (w[i] >> 4) & 0x0F0F0F0Fu;
      }
    } else {
      const uvec4 lo = weight_vec4[codes + 2u * u], hi = weight_vec4[codes + 2u * u + 1u];
      for (uint i = 0u; i < 4u; ++i) {
        wu.q[i] = lo[i];
        wu.q[i + 4u] = hi[i];
      }
    }
    return wu;
  }
  if (WEIGHT_LAYOUT == kLayoutSplitRows && WEIGHT_TYPE == kTypeQ6_K) {
    const uint scales = row + ((n_units / 8u * 2u + 15u) & ~15u);
    const uint high = scales + ((n_units * 2u + 15u) & ~15u);  // (a multiple of 16)
    const uvec4 lo = weight_vec4[(high + 8u * n_units) / 16u + u];  // element e: byte e % 16, nibble e / 16
    const uvec2 hi = weight_vec2[high / 8u + u];                    // element e: byte e % 8, pair e / 8
    for (uint i = 0u; i < 4u; ++i) {  // words i and i + 4: elements 4i .. 4i + 3 and 16 + 4i ..
      const uint pairs = hi[i & 1u] >> (2u * (i >> 1));
      wu.q[i] = (lo[i] & 0x0F0F0F0Fu) | ((pairs & 0x03030303u) << 4);
      wu.q[i + 4u] = ((lo[i] >> 4) & 0x0F0F0F0Fu) | (((pairs >> 4) & 0x03030303u) << 4);
    }
    const float d = WeightF16(row + 2u * (u >> 3));
    const uint sc = WeightU16(scales + 2u * u);
    wu.s = vec2(d * float(bitfieldExtract(int(sc), 0, 8)), d * float(bitfieldExtract(int(sc), 8, 8)));
    return wu;
  }
  if (WEIGHT_TYPE == kTypeQ4_0 || WEIGHT_TYPE == kTypeQ4_1) {
    const bool has_min = WEIGHT_TYPE == kTypeQ4_1;
    const uint base = row + u * (has_min ? 20u : 18u);
    wu.s = vec2(WeightF16(base), has_min ? WeightF16(base + 2u) : 0.0);
    const uint qs = base + (has_min ? 4u : 2u);
    for (uint i = 0u; i < 4u; ++i) {
      const uint w = WeightU32(qs + 4u * i);  // bytes 4i..4i+3: elements 4i.. low, 16+4i.. high
      wu.q[i] = w & 0x0F0F0F0Fu;
      wu.q[i + 4u] = (w >> 4) & 0x0F0F0F0Fu;
    }
  } else if (WEIGHT_TYPE == kTypeQ5_0 || WEIGHT_TYPE == kTypeQ5_1) {
    const bool has_min = WEIGHT_TYPE == kTypeQ5_1;
    const uint base = row + u * (has_min ? 24u : 22u);
    wu.s = vec2(WeightF16(base), has_min ? WeightF16(base + 2u) : 0.0);
    const uint qh = WeightU32(base + (has_min ? 4u : 2u));  // bit e = bit 4 of element e
    const uint qs = base + (has_min ? 8u : 6u);
    for (uint i = 0u; i < 4u; ++i) {
      const uint w = WeightU32(qs + 4u * i);
      wu.q[i] = (w & 0x0F0F0F0Fu) | SpreadBit4((qh >> (4u * i)) & 15u);
      wu.q[i + 4u] = ((w >> 4) & 0x0F0F0F0Fu) | SpreadBit4((qh >> (16u + 4u * i)) & 15u);
    }
  } else if (WEIGHT_TYPE == kTypeQ8_0) {
    const uint base = row + u * 34u;
    wu.s = vec2(WeightF16(base), 0.0);
    for (uint i = 0u; i < 8u; ++i) wu.q[i] = WeightU32(base + 2u + 4u * i);
  } else if (WEIGHT_TYPE == kTypeQ4_K || WEIGHT_TYPE == kTypeQ5_K) {
    const bool q5 = WEIGHT_TYPE == kTypeQ5_K;
    const uint s = u & 7u;
    const uint base = row + (u >> 3) * (q5 ? 176u : 144u);
    // The super-block's first 16 bytes in one load (144 and 176 are multiples of 16): d and
    // dmin (f16), then the 12 packed scale bytes.
    const uvec4 head = weight_vec4[base >> 4];
    const uvec2 sm = KScaleMin(head.yzw, s);
    wu.s = vec2(F16BitsToF32(head.x & 0xFFFFu) * float(sm.x), F16BitsToF32(head.x >> 16) * float(sm.y));
    // 32 bytes per pair of sub-blocks: sub-block 2c in the low nibbles, 2c+1 in the high ones.
    const uint qs = (base + (q5 ? 48u : 16u) + 32u * (s >> 1)) >> 4;  // in 16-byte words
    const uint shift = 4u * (s & 1u);
    const uvec4 c[2] = uvec4[2](weight_vec4[qs], weight_vec4[qs + 1u]);
    uvec4 h[2] = uvec4[2](uvec4(0u), uvec4(0u));
    if (q5) h = uvec4[2](weight_vec4[(base + 16u) >> 4], weight_vec4[((base + 16u) >> 4) + 1u]);
    for (uint i = 0u; i < 8u; ++i) {
      uint code = (c[i >> 2][i & 3u] >> shift) & 0x0F0F0F0Fu;
      if (q5) code |= ((h[i >> 2][i & 3u] >> s) & 0x01010101u) << 4;  // bit s of qh[l]
      wu.q[i] = code;
    }
  } else if (WEIGHT_TYPE == kTypeQ6_K) {
    const uint s = u & 7u;
    const uint base = row + (u >> 3) * 210u;
    const uint half_index = s >> 2, quarter = s & 3u;
    const uint ql = base + 64u * half_index + 32u * (quarter & 1u);
    const uint qh = base + 128u + 32u * half_index;
    const uint lo_shift = 4u * (quarter >> 1), hi_shift = 2u * quarter;
    for (uint i = 0u; i < 8u; ++i) {
      wu.q[i] = ((WeightU32(ql + 4u * i) >> lo_shift) & 0x0F0F0F0Fu) |
                (((WeightU32(qh + 4u * i) >> hi_shift) & 0x03030303u) << 4);
    }
    const float d = WeightF16(base + 208u);
    const int sc0 = bitfieldExtract(int(WeightU8(base + 192u + 2u * s)), 0, 8);
    const int sc1 = bitfieldExtract(int(WeightU8(base + 193u + 2u * s)), 0, 8);
    wu.s = vec2(d * float(sc0), d * float(sc1));
  }
  return wu;
}

// Byte j of a code word as an integer: signed for Q8_0, unsigned for every other type.
int WeightCode(uint w, int j) {
  return WEIGHT_TYPE == kTypeQ8_0 ? bitfieldExtract(int(w), 8 * j, 8) : int(bitfieldExtract(w, 8 * j, 8));
}

// Element j (0..31) of a unit, dequantized as engine/model/quants.cpp does.
float UnitValue(WeightUnit wu, uint j) {
  const float q = float(WeightCode(wu.q[j >> 2], int(j & 3u)));
  if (WEIGHT_TYPE == kTypeQ4_0) return (q - 8.0) * wu.s.x;
  if (WEIGHT_TYPE == kTypeQ5_0) return (q - 16.0) * wu.s.x;
  if (WEIGHT_TYPE == kTypeQ8_0) return q * wu.s.x;
  if (WEIGHT_TYPE == kTypeQ4_1 || WEIGHT_TYPE == kTypeQ5_1) return q * wu.s.x + wu.s.y;
  if (WEIGHT_TYPE == kTypeQ6_K) return (j < 16u ? wu.s.x : wu.s.y) * (q - 32.0);
  return wu.s.x * q - wu.s.y;  // Q4_K, Q5_K
}

#if defined(KVFS_INTEGER_DOT)
// OpSDot on two words read as 4 signed bytes each (PackedVectorFormat4x8Bit = literal 0):
// glslang 12 lacks GL_EXT_integer_dot_product, so the instruction is named by its SPIR-V id.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int SDot4x8(uint a, uint b, spirv_literal int packed_vector_format);
#endif

// The dot product of a word of 4 weight codes with a word of 4 signed activation codes. Every
// code but Q8_0's is below 128, so reading them as signed bytes changes nothing.
int CodeDot4(uint w, uint a) {
#if defined(KVFS_INTEGER_DOT)
  return SDot4x8(w, a, 0);
#else
  int s = 0;
  for (int j = 0; j < 4; ++j) s += WeightCode(w, j) * bitfieldExtract(int(a), 8 * j, 8);
  return s;
#endif
}

// Integer dot products of a unit's codes with 32 signed activation codes (a[i] holds elements
// 4i..4i+3): x = elements 0..15, y = elements 16..31.
ivec2 UnitCodeDots(WeightUnit wu, uint a[8]) {
  ivec2 sums = ivec2(0);
  for (uint i = 0u; i < 4u; ++i) sums.x += CodeDot4(wu.q[i], a[i]);
  for (uint i = 4u; i < 8u; ++i) sums.y += CodeDot4(wu.q[i], a[i]);
  return sums;
}

// The unit's contribution to a dot product with a quantized activation unit: codes a and
// aux = (scale d, Q8_1 sum term s, code sum of elements 0..15, code sum of elements 16..31),
// the algebra of the CPU's scalar kernels (kernels_scalar.cpp).
float UnitDot(WeightUnit wu, uint a[8], vec4 aux) {
  const ivec2 dots = UnitCodeDots(wu, a);
  const int asum = int(aux.z) + int(aux.w);
  if (WEIGHT_TYPE == kTypeQ4_0) return (wu.s.x * aux.x) * float(dots.x + dots.y - 8 * asum);
  if (WEIGHT_TYPE == kTypeQ5_0) return (wu.s.x * aux.x) * float(dots.x + dots.y - 16 * asum);
  if (WEIGHT_TYPE == kTypeQ8_0) return (wu.s.x * aux.x) * float(dots.x + dots.y);
  if (WEIGHT_TYPE == kTypeQ4_1 || WEIGHT_TYPE == kTypeQ5_1) {
    return (wu.s.x * aux.x) * float(dots.x + dots.y) + wu.s.y * aux.y;
  }
  if (WEIGHT_TYPE == kTypeQ6_K) {
    return aux.x * (wu.s.x * float(dots.x - 32 * int(aux.z)) + wu.s.y * float(dots.y - 32 * int(aux.w)));
  }
  return aux.x * (wu.s.x * float(dots.x + dots.y) - wu.s.y * float(asum));  // Q4_K, Q5_K
}
