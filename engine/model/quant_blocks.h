// Block layouts of the ggml quantized formats, byte for byte as GGUF files store them (and as
// ggml's ggml-common.h defines them). Constants and plain structs only; the code that reads
// them is in quants.cpp (dequantization) and backend/cpu/kernels_scalar.cpp (dot products).
//
// Conventions used in the comments below:
//  * "fp16" fields hold IEEE binary16 bits (see Fp16ToFp32 in quants.h); "element e" is the
//    e-th value of the block after dequantization, 0-based, in row order.
//  * All multi-byte fields are little-endian. Blocks are packed back to back in a row with no
//    padding, and GGUF only aligns the start of a tensor, so a block carries no alignment
//    guarantee: copy it out with memcpy (see quant_block_access.h), never cast the pointer.
//  * A "nibble" is 4 bits; "low nibble" = bits 0..3 of a byte, "high nibble" = bits 4..7.
#pragma once

#include <cstdint>

#include "engine/model/ggml_types.h"

namespace kvfs {

// Bytes of the packed 6-bit scale/min array of Q4_K and Q5_K.
inline constexpr int kKScaleBytes = 12;

// ---------------------------------------------------------------------------------------------
// Q4_0: 32 elements, x = d * (q - 8), q in 0..15.
struct BlockQ4_0 {
  uint16_t d;               // fp16 scale
  uint8_t qs[kQK4_0 / 2];   // qs[j] low nibble = q of element j, high nibble = q of element
                            // j + 16 (j = 0..15): the first half of the block lives in the
                            // low nibbles, the second half in the high nibbles
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_1: 32 elements, x = d * q + m, q in 0..15.
struct BlockQ4_1 {
  uint16_t d;               // fp16 scale
  uint16_t m;               // fp16 offset (the block minimum), added after scaling
  uint8_t qs[kQK4_1 / 2];   // same nibble order as Q4_0: low nibble of qs[j] = element j,
                            // high nibble = element j + 16
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0: 32 elements, x = d * (q - 16), q in 0..31 (5 bits).
struct BlockQ5_0 {
  uint16_t d;               // fp16 scale
  uint8_t qh[4];            // the 5th bits (bit 4 of q): read as one little-endian uint32,
                            // bit e holds bit 4 of element e (e = 0..31)
  uint8_t qs[kQK5_0 / 2];   // low 4 bits of q, nibble order as Q4_0: low nibble of qs[j] =
                            // element j, high nibble = element j + 16
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1: 32 elements, x = d * q + m, q in 0..31.
struct BlockQ5_1 {
  uint16_t d;               // fp16 scale
  uint16_t m;               // fp16 offset (block minimum)
  uint8_t qh[4];            // little-endian uint32, bit e = bit 4 of element e (as Q5_0)
  uint8_t qs[kQK5_1 / 2];   // low 4 bits, nibble order as Q4_0
};
static_assert(sizeof(BlockQ5_1) == 24);

// Q8_0: 32 elements, x = d * q, q in -128..127 (quantizers produce -127..127).
struct BlockQ8_0 {
  uint16_t d;               // fp16 scale
  int8_t qs[kQK8_0];        // qs[e] = q of element e
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q8_1: 32 elements, x = d * q. Only used for activations (dot with Q4_1/Q5_1 weights).
struct BlockQ8_1 {
  uint16_t d;               // fp16 scale
  uint16_t s;               // fp16 of d * sum(qs), with d the unrounded float scale; lets the
                            // dot product apply the weight offset m as m * s
  int8_t qs[kQK8_1];        // qs[e] = q of element e
};
static_assert(sizeof(BlockQ8_1) == 36);

// ---------------------------------------------------------------------------------------------
// K-quants: super-blocks of kQK_K = 256 elements.
//
// Q4_K and Q5_K split the super-block into 8 sub-blocks of 32 elements (sub-block s holds
// elements 32s .. 32s+31). Each sub-block has a 6-bit scale sc[s] and a 6-bit min m[s]:
//   x = (d * sc[s]) * q - (dmin * m[s]).
// The 16 six-bit numbers are packed into scales[12] like this:
//   bytes 0..3  (i = 0..3): bits 0..5 = sc[i],        bits 6..7 = bits 4..5 of sc[i + 4]
//   bytes 4..7  (i = 0..3): bits 0..5 = m[i],         bits 6..7 = bits 4..5 of m[i + 4]
//   bytes 8..11 (i = 0..3): bits 0..3 = bits 0..3 of sc[i + 4],
//                           bits 4..7 = bits 0..3 of m[i + 4]
// so for s < 4:  sc = scales[s] & 63,  m = scales[s + 4] & 63;
//    for s >= 4: sc = (scales[s + 4] & 15) | ((scales[s - 4] >> 6) << 4),
//                m  = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4).

// Q4_K: x = (d * sc[s]) * q - (dmin * m[s]), q in 0..15.
struct BlockQ4_K {
  uint16_t d;                    // fp16 super-block scale of the 6-bit sub-block scales
  uint16_t dmin;                 // fp16 super-block scale of the 6-bit sub-block mins
  uint8_t scales[kKScaleBytes];  // 8 scales + 8 mins, 6 bits each, packed as described above
  uint8_t qs[kQK_K / 2];         // 4 chunks of 32 bytes; chunk c (bytes 32c .. 32c+31) holds
                                 // elements 64c .. 64c+63: low nibble of qs[32c + l] = element
                                 // 64c + l (sub-block 2c), high nibble = element 64c + 32 + l
                                 // (sub-block 2c + 1), l = 0..31
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K: x = (d * sc[s]) * q - (dmin * m[s]), q in 0..31.
struct BlockQ5_K {
  uint16_t d;                    // fp16 super-block scale of the sub-block scales
  uint16_t dmin;                 // fp16 super-block scale of the sub-block mins
  uint8_t scales[kKScaleBytes];  // packed exactly as in Q4_K
  uint8_t qh[kQK_K / 8];         // 5th bits: bit s of qh[l] = bit 4 of element 32s + l
                                 // (sub-block s = 0..7, l = 0..31)
  uint8_t qs[kQK_K / 2];         // low 4 bits of q, in the Q4_K nibble order
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K: 16 sub-blocks of 16 elements; x = (d * scales[e / 16]) * (q - 32), q in 0..63.
// The super-block is two halves of 128 elements; half h (0 or 1) uses ql[64h .. 64h+63] and
// qh[32h .. 32h+31]. With l = 0..31, byte a = ql[64h + l], b = ql[64h + 32 + l], c = qh[32h + l]:
//   element 128h +      l : low 4 bits = low nibble of a,  high 2 bits = bits 0..1 of c
//   element 128h + 32 + l : low 4 bits = low nibble of b,  high 2 bits = bits 2..3 of c
//   element 128h + 64 + l : low 4 bits = high nibble of a, high 2 bits = bits 4..5 of c
//   element 128h + 96 + l : low 4 bits = high nibble of b, high 2 bits = bits 6..7 of c
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];         // low 4 bits of q (layout above)
  uint8_t qh[kQK_K / 4];         // high 2 bits of q (layout above)
  int8_t scales[kQK_K / 16];     // signed 8-bit scale of sub-block i (elements 16i .. 16i+15)
  uint16_t d;                    // fp16 super-block scale (last field!)
};
static_assert(sizeof(BlockQ6_K) == 210);

// Q8_K: activations for the K-quant dot products; x = d * q. Never stored in GGUF files.
struct BlockQ8_K {
  float d;                       // float32 scale (not fp16)
  int8_t qs[kQK_K];              // qs[e] = q of element e
  int16_t bsums[kQK_K / 16];     // bsums[i] = sum of qs[16i .. 16i+15]
};
static_assert(sizeof(BlockQ8_K) == 292);

}  // namespace kvfs
