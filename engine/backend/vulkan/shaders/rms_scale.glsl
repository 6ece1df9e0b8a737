// The RMSNorm scale 1 / sqrt(mean(x^2) + eps) of the n values of x from x0, computed by the
// whole workgroup (every invocation must call it, numbered by TreeTid; every one gets the
// result), with the CPU's bits (cpu::RmsNorm: float squares summed in double, the mean rounded
// to float, then 1 / std::sqrt). The squares are summed as (hi, lo) pairs (pair_sums.glsl),
// which round to the CPU's float mean except where the exact mean lies within about 2^-40 of a
// rounding boundary. (A tree of plain f32 sums, before, gave another last bit in some rows: NMSE
// 3.8e-15 against the CPU on the ops test, on lavapipe and an H200 alike.) The mean is hi / n
// corrected by the remainder, as the division of the pair would round; the square root is
// rounded as IEEE does (SqrtRounded). The tree's last steps go by subgroup shuffles in the *_sg
// variants (subgroup_tree.glsl: the same pairs, and the pair sum is symmetric, so the same
// sum). rms_norm.comp and quantize_act.comp (SOURCE 2) share it, so a fused norm gives the very
// values of the separate one. Needs common.glsl, the buffer `x` and `shared float
// partial[WG]`, WG a power of two.

#include "pair_sums.glsl"

// The includer may size it 1 where RmsScale is never called (matvec_quant without its norm).
#ifndef RMS_LO_SIZE
#define RMS_LO_SIZE WG
#endif
shared float partial_lo[RMS_LO_SIZE];  // the lo halves of the tree's pairs

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
