// Helpers shared by the compute shaders: exact IEEE half and bfloat16 conversions and the exp
// polynomial of the CPU backend (engine/backend/cpu/ops.cpp), so the GPU rounds the way the
// CPU reference does wherever that is cheap to guarantee.
//
// Every buffer is declared as 32-bit words: quantized blocks and KV rows are byte-packed at
// offsets with no 4-byte alignment, and plain words need no 8/16-bit storage features, so the
// shaders run on any Vulkan 1.1 device.

// v rounded to the nearest integer, ties to even, from exact operations (floor, the fraction
// v - floor(v), compares). roundEven is exact by the Vulkan spec, but lavapipe built for 16
// lanes on an AVX2 host rounded ties away from zero in some shaders; the codes must be the
// CPU's on every device.
float RoundHalfEven(float v) {
  const float f = floor(v);
  precise float fraction = v - f;
  const bool odd = floor(f * 0.5) * 2.0 != f;
  return fraction > 0.5 || (fraction == 0.5 && odd) ? f + 1.0 : f;
}

// f32 -> IEEE binary16 bits, rounding to nearest even (packHalf2x16 leaves rounding to the
// implementation). Overflow gives infinity, NaN stays NaN, subnormal halfs are exact.
uint F32ToF16Bits(float f) {
  const uint x = floatBitsToUint(f);
  const uint sign = (x >> 16) & 0x8000u;
  const uint ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return sign | (ax > 0x7F800000u ? 0x7E00u : 0x7C00u);
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // rounds to 65536 or more: infinity
  if (ax < 0x38800000u) {
    // Below the smallest normal half (2^-14): the half is round(|f| * 2^24) units of 2^-24;
    // scaling by a power of two is exact, RoundHalfEven rounds ties to even.
    return sign | uint(RoundHalfEven(uintBitsToFloat(ax) * 16777216.0));
  }
  uint h = (ax - 0x38000000u) >> 13;  // rebias the exponent (127 -> 15), keep 10 mantissa bits
  const uint rest = ax & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) h += 1u;  // may carry into the exponent
  return sign | h;
}

// a / b as IEEE division rounds it (to nearest, ties to even), on any device. Vulkan lets a
// shader's division be off by up to 2.5 ulp (GPUs and lavapipe multiply by a reciprocal),
// and the quantizers must pick the CPU's codes, and the softmax's 1 / sum, RMSNorm's scale and
// SiLU must round as the CPU's do (an H200's 1 / x was an ulp off in some softmax rows, enough
// to move f16-rounded weights). So the significands' quotient Q = floor(ma * 2^24 / mb) (24
// significand bits and a round bit) is found as an integer: the device's division of the two
// significands gives it to within a few units, the exact remainder R = ma * 2^24 - Q * mb then
// corrects it (DivQuotient), and R is the sticky bit. Zeros, infinities, NaN, subnormal operands
// and results out of the normal range fall back to the device's division (a subnormal operand,
// which a device may flush to 0 anyway, can then differ from the CPU: a q4k sub-block whose
// minimum is below 2^-126, SiLU of a gate that small; never seen in a model).
// (It was 25 steps of shift and subtract, some 150 instructions at every call once unrolled:
// the largest part of kv_store and of the attention shaders' code, which a decode step runs in
// a few workgroups each. DivQuotientTwin and DivTwin in tests/engine/vulkan_div_test.cpp are
// these functions' C++ twins, checked against the host's division with the estimate off by up to
// 16 units either way.)

// (Q, R) for significands ma in [mb, 2 mb), mb in [2^23, 2^24), from an estimate q of Q within
// 2^6 units: R fits an int (|R| <= 2^6 * 2^24 + mb < 2^31), so its low 32 bits, which uint
// arithmetic gives exactly, are R. One step by R's own quotient, then a unit either way where
// that step's floor was off by one, leaves 0 <= R < mb.
uvec2 DivQuotient(uint ma, uint mb, uint q) {
  int r = int((ma << 24) - q * mb);
  const int step = int(floor(float(r) / float(mb)));  // |step| <= 2^6 + 1: step * mb fits too
  q = uint(int(q) + step);
  r -= step * int(mb);
  if (r < 0) {
    q -= 1u;
    r += int(mb);
  } else if (r >= int(mb)) {
    q += 1u;
    r -= int(mb);
  }
  return uvec2(q, uint(r));
}

float Div(float a, float b) {
  const uint ua = floatBitsToUint(a), ub = floatBitsToUint(b);
  const uint ea = (ua >> 23) & 0xFFu, eb = (ub >> 23) & 0xFFu;
  if (ea == 0u || ea == 0xFFu || eb == 0u || eb == 0xFFu) return a / b;
  uint ma = (ua & 0x7FFFFFu) | 0x800000u;  // significands in [2^23, 2^24)
  const uint mb = (ub & 0x7FFFFFu) | 0x800000u;
  int e = int(ea) - int(eb) + 127;  // the quotient's biased exponent once ma / mb is in [1, 2)
  if (ma < mb) {
    ma <<= 1;
    e -= 1;
  }
  // The estimate: both significands are exact floats and the device's quotient is within 2.5 ulp
  // (5 units of Q; up to 10 if a device reads its ulp at a result of 2), a multiple of 2^-24 in
  // [0.5, 2], so scaling by 2^24 and the conversion are exact.
  const uvec2 qr = DivQuotient(ma, mb, uint(float(ma) / float(mb) * 16777216.0));
  uint q = qr.x;
  const bool round_bit = (q & 1u) != 0u;
  q >>= 1;
  if (round_bit && (qr.y != 0u || (q & 1u) != 0u)) q += 1u;
  if (q == 0x1000000u) {  // rounded up to 2
    q >>= 1;
    e += 1;
  }
  if (e <= 0 || e >= 255) return a / b;
  return uintBitsToFloat(((ua ^ ub) & 0x80000000u) | (uint(e) << 23) | (q & 0x7FFFFFu));
}

// sqrt(v) as IEEE rounds it (to nearest), on any device: Vulkan lets a shader's square root be
// off by ulps (lavapipe's is exact, an H200's need not be), and RMSNorm's scale must round as
// the CPU's std::sqrt. The device's root s is corrected to its neighbour while the remainder
// r = v - s^2 puts v beyond the square of the midpoint to that neighbour: v > (s + u/2)^2 =
// s^2 + s u + u^2/4 holds iff r > s u, as r and s u are multiples of a step above u^2/4
// (likewise below, with the spacing below s). r is v - s^2 rounded once, from Dekker's exact
// square (s split into halves of 12 bits) and plain operations, each rounded as written
// (spirv_no_contraction.h): the same r as fma(-s, s, v) without trusting the device's fma to be
// fused (Vulkan lets it round twice; lavapipe's results suggest it does). v below 2^-95 (where
// s u can underflow) or from 2^126 up (where s^2 can overflow), zero, negative, infinite and
// NaN keep the device's root. Checked off the device against std::sqrt from starts up to 3
// ulps off: 23.2 million roots in that range, every one exact, each r equal to the fma's.
// a * b as p + e exactly (Dekker's product: each factor split into halves of 12 bits, every
// partial product and sum exact), from plain operations rounded as written; a, b and a * b
// well inside the normal range.
vec2 TwoProduct(float a, float b) {
  const float ca = 4097.0 * a, cb = 4097.0 * b;  // 2^12 + 1
  const float a_hi = ca - (ca - a), a_lo = a - a_hi;
  const float b_hi = cb - (cb - b), b_lo = b - b_hi;
  const float p = a * b;
  return vec2(p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo);
}

float SqrtRemainder(float v, float s) {
  const vec2 square = TwoProduct(s, s);
  return (v - square.x) - square.y;
}

float SqrtRounded(float v) {
  float s = sqrt(v);
  const uint e = (floatBitsToUint(v) >> 23) & 0xFFu;
  if (!(v > 0.0) || e < 32u || e > 252u) return s;
  for (int i = 0; i < 4; ++i) {  // (a device's root is within a few ulps: one step, seldom two)
    const float r = SqrtRemainder(v, s);
    const float above = uintBitsToFloat(floatBitsToUint(s) + 1u) - s;  // spacings (exact)
    const float below = s - uintBitsToFloat(floatBitsToUint(s) - 1u);
    if (r > s * above) {
      s += above;
    } else if (r <= -(s * below)) {
      s -= below;
    } else {
      break;
    }
  }
  return s;
}

float F16BitsToF32(uint h) { return unpackHalf2x16(h & 0xFFFFu).x; }

// f32 rounded to the nearest half and back.
float RoundF16(float f) { return F16BitsToF32(F32ToF16Bits(f)); }

// f32 rounded to the nearest bfloat16 (ties to even) and back; NaN stays NaN.
float RoundBf16(float f) {
  const uint u = floatBitsToUint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uintBitsToFloat((u & 0xFFFF0000u) | 0x00400000u);
  return uintBitsToFloat(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
}

// exp(x): range reduction to 2^n * e^b and a degree-5 polynomial, the same operations as the
// CPU's ExpPoly (ops.cpp), so softmax and SiLU agree with it closely.
float ExpPoly(float x) {
  const float shift = 12582912.0;  // 0x1.8p23: adding it rounds to an integer
  precise float z = fma(x, 1.4426950216293335, shift);
  precise float n = z - shift;
  precise float b = fma(-n, 1.428606765330187e-06, fma(-n, 0.693145751953125, x));
  precise float u = b * b;
  precise float j = fma(fma(fma(0.008247390389442444, b, 0.04189976677298546), u,
                            fma(0.16668395698070526, b, 0.4999912679195404)),
                        u, fma(0.9999994039535522, b, 1.0));
  const float nc = clamp(n, -192.0, 192.0);
  const int n1 = int(nc) / 2;
  const int n2 = int(nc) - n1;
  precise float r = j * uintBitsToFloat(uint(n1 + 127) << 23) * uintBitsToFloat(uint(n2 + 127) << 23);
  return n < -192.0 ? 0.0 : (n > 192.0 ? uintBitsToFloat(0x7F800000u) : r);
}

// SwiGLU of one value: silu(gate) * up with ExpPoly, as the CPU computes it. swiglu.comp,
// quantize_act.comp (SOURCE 1) and matvec_quant.comp's epilogue all call it, so they agree
// bit for bit.
float SwiGluOf(float gate, float up) {
  precise float v = Div(gate, 1.0 + ExpPoly(-gate)) * up;
  return v;
}

// Int8 blocks with a power-of-two scale, as the CPU backend's integer attention paths make them
// (engine/backend/cpu/attention.h: BlockScaleFor, QuantizeInt8Block): for a block whose largest
// magnitude is amax, the scale is 2^e (0 for an all-zero block) and x's code is x / 2^e rounded
// half to even, clamped to [-127, 127]. Exact arithmetic, so every implementation agrees.
int Int8ScaleExponent(float amax) {
  int e = 0;
  if (amax > 0.0) {
    frexp(amax, e);
    e -= 7;
  }
  return e;
}
float Int8Scale(float amax, int e) { return amax > 0.0 ? ldexp(1.0, e) : 0.0; }
int Int8Code(float x, float amax, int e) {
  if (!(amax > 0.0)) return 0;
  const float inv = -e <= 126 ? ldexp(1.0, -e) : 0.0;
  precise float scaled = inv != 0.0 ? x * inv : ldexp(x, -e);
  return int(clamp(RoundHalfEven(scaled), -127.0, 127.0));
}

// A q4 group's coding (engine/kv/kv_format.h) with the CPU's arithmetic (QuantizeGroupQ4): the
// f16 minimum and scale from the group's extremes, codes against the rounded values that
// decoding uses, half to even, clamped to 0..15. (kv_store's q4 rows and k_chunks' q4k key
// chunks.)
struct Q4Coding {
  uint dh, mh;  // f16 bits of the scale and the minimum
  float m, id;  // the decoded minimum and 1 / scale (0 for a constant group)
};
Q4Coding Q4CodingOf(float lo, float hi) {
  Q4Coding c;
  c.mh = F32ToF16Bits(lo);
  c.m = F16BitsToF32(c.mh);
  precise float range = Div(hi - c.m, 15.0);
  c.dh = F32ToF16Bits(range);
  const float d = F16BitsToF32(c.dh);
  c.id = d > 0.0 ? Div(1.0, d) : 0.0;
  return c;
}
uint Q4Code(float x, Q4Coding c) {
  precise float scaled = (x - c.m) * c.id;
  return uint(clamp(RoundHalfEven(scaled), 0.0, 15.0));
}
