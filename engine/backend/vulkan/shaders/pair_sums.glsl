// Sums kept as (hi, lo) pairs of floats, for the few places where the CPU adds in double
// (RMSNorm's squares, the softmax's chunk sums) and the GPU must round its result the same way:
// lo keeps the rounding errors of hi's additions (TwoSum, exact with every operation rounded as
// written: spirv_no_contraction.h), about 48 bits where a double keeps 53, so the float rounded
// from a pair is the double's except where the exact value lies within about 2^-40 of a
// rounding boundary. Needs common.glsl (Div, TwoProduct).
#ifndef KVFS_PAIR_SUMS_GLSL
#define KVFS_PAIR_SUMS_GLSL

// a + b as s + e exactly (Knuth's TwoSum).
vec2 TwoSum(float a, float b) {
  const float s = a + b;
  const float bb = s - a;
  const float e = (a - (s - bb)) + (b - bb);
  return vec2(s, e);
}

// The sum of two (hi, lo) pairs, renormalized (|lo| at most half an ulp of hi). Symmetric in its
// arguments: the errors TwoSum returns are exact, whichever operand comes first.
vec2 AddPairs(vec2 a, vec2 b) {
  const vec2 t = TwoSum(a.x, b.x);
  const float lo = a.y + b.y;
  return TwoSum(t.x, t.y + lo);
}

// q, the float nearest the quotient num / (hi + lo) or one of its two neighbours, moved to the
// nearest: rem is num - q * (hi + lo), and q steps where rem / d passes half a step.
float RoundQuotient(float q, float rem, float d) {
  const float above = uintBitsToFloat(floatBitsToUint(q) + 1u) - q;  // spacings (exact)
  const float below = q - uintBitsToFloat(floatBitsToUint(q) - 1u);
  if (2.0 * rem > d * above) return q + above;
  if (2.0 * rem < -(d * below)) return q - below;
  return q;
}

// (hi + lo) / n rounded to float, n a positive integer below 2^24, hi positive and well inside
// the normal range.
float PairMean(vec2 s, float n) {
  const float q = Div(s.x, n);
  // What is left of the pair once q * n (exactly p.x + p.y) is taken: hi - p.x is exact (they
  // are that close).
  const vec2 p = TwoProduct(q, n);
  return RoundQuotient(q, ((s.x - p.x) - p.y) + s.y, n);
}

// 1 / (hi + lo) rounded to float, as the CPU's (float)(1.0 / sum) of a double sum; hi in [1,
// 2^60]. 1 - q * hi is exact from Dekker's product (1 - p.x by Sterbenz's lemma); q * lo, at
// most an ulp of 1, rounds far below the half step the decision needs.
float PairReciprocal(vec2 s) {
  const float q = Div(1.0, s.x);
  const vec2 p = TwoProduct(q, s.x);
  return RoundQuotient(q, ((1.0 - p.x) - p.y) - q * s.y, s.x);
}

#endif  // KVFS_PAIR_SUMS_GLSL
