// The RMSNorm scale 1 / sqrt(mean(x^2) + eps) of the n values of x from x0, computed by the
// whole workgroup (every invocation must call it, numbered by TreeTid; every one gets the
// result), with the CPU's bits (cpu::RmsNorm: float squares summed in double, the mean rounded
// to float, then 1 / std::sqrt). The squares are summed as (hi, lo) pairs whose lo keeps the
// rounding errors of hi's sums (TwoSum, exact with every operation rounded as written), about
// 48 bits where the CPU's double sum keeps 53: the two sums round to the same float mean except
// where the exact mean lies within about 2^-40 of a rounding boundary. (A tree of plain f32
// sums, before, gave another last bit in some rows: NMSE 3.8e-15 against the CPU on the ops
// test, on lavapipe and an H200 alike.) The mean is hi / n corrected by the remainder, as the
// division of the pair would round; the square root is rounded as IEEE does (SqrtRounded).
// The tree's last steps go by subgroup shuffles in the *_sg variants (subgroup_tree.glsl: the
// same pairs, and the pair sum is symmetric, so the same sum). rms_norm.comp and
// quantize_act.comp (SOURCE 2) share it, so a fused norm gives the very values of the separate
// one. Needs common.glsl, the buffer `x` and `shared float partial[WG]`, WG a power of two.

shared float partial_lo[WG];  // the lo halves of the tree's pairs

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

// (hi + lo) / n rounded to float, n a positive integer below 2^24, hi positive and well inside
// the normal range.
float PairMean(vec2 s, float n) {
  float q = Div(s.x, n);
  // What is left of the pair once q * n (exactly p.x + p.y) is taken: hi - p.x is exact (they
  // are that close).
  const vec2 p = TwoProduct(q, n);
  const float rem = ((s.x - p.x) - p.y) + s.y;
  // q moves by a step where the rest of the quotient, rem / n, passes half of it.
  const float above = uintBitsToFloat(floatBitsToUint(q) + 1u) - q;
  const float below = q - uintBitsToFloat(floatBitsToUint(q) - 1u);
  if (2.0 * rem > n * above) {
    q += above;
  } else if (2.0 * rem < -(n * below)) {
    q -= below;
  }
  return q;
}

float RmsScale(uint x0, uint n, float eps, uint tid, uint subgroup) {
  vec2 sum = vec2(0.0);
  for (uint i = tid; i < n; i += WG) {
    const float sq = x[x0 + i] * x[x0 + i];
    sum = AddPairs(sum, vec2(sq, 0.0));
  }
  const uint width = min(WG, subgroup);
  if (WG > width) {
    partial[tid] = sum.x;
    partial_lo[tid] = sum.y;
    barrier();
    for (uint s = WG / 2u; s >= width; s >>= 1) {
      if (tid < s) {
        const vec2 r = AddPairs(vec2(partial[tid], partial_lo[tid]), vec2(partial[tid + s], partial_lo[tid + s]));
        partial[tid] = r.x;
        partial_lo[tid] = r.y;
      }
      barrier();
    }
    sum = vec2(partial[tid], partial_lo[tid]);
  }
#if defined(KVFS_SUBGROUP)
  if (width > 1u) {
    // Invocation 0 holds the tree's sum (the others' shuffles added in other orders).
    for (uint s = width / 2u; s > 0u; s >>= 1) {
      sum = AddPairs(sum, vec2(subgroupShuffleXor(sum.x, s), subgroupShuffleXor(sum.y, s)));
    }
  }
#endif
  if (width > 1u || WG == 1u) {
    if (tid == 0u) {
      partial[0] = sum.x;
      partial_lo[0] = sum.y;
    }
    barrier();
  }
  const vec2 total = vec2(partial[0], partial_lo[0]);
  // Sums below 2^-67 or from 2^73 up (where the split products could leave the normal range):
  // the plain quotient of hi (no activations come near).
  const uint e = (floatBitsToUint(total.x) >> 23) & 0xFFu;
  const float mean = e < 60u || e > 200u ? Div(total.x, float(n)) : PairMean(total, float(n));
  return Div(1.0, SqrtRounded(mean + eps));
}
