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
// sum). rms_norm.comp, quantize_act.comp (SOURCE 2) and matvec_quant.comp's norm prologue share
// it, so a fused norm gives the very values of the separate one: the pairs are not associative,
// so the tree is always RMS_LANES (256, rms_norm's workgroup) wide whatever WG is. A workgroup
// of fewer invocations plays RMS_LANES / WG lanes in each and adds the tree's upper levels
// within the invocation; a larger one leaves its invocations from RMS_LANES on out. Needs
// common.glsl, the buffer `x` and `shared float partial[WG]`, WG a power of two >= 32 (or 1).

#include "pair_sums.glsl"

// The includer may size it 1 where RmsScale is never called (matvec_quant without its norm).
#ifndef RMS_LO_SIZE
#define RMS_LO_SIZE WG
#endif
shared float partial_lo[RMS_LO_SIZE];  // the lo halves of the tree's pairs

const uint RMS_LANES = 256u;
const uint RMS_PER_INVOCATION = WG < RMS_LANES ? RMS_LANES / WG : 1u;  // lanes an invocation plays
const uint RMS_TREE = WG < RMS_LANES ? WG : RMS_LANES;  // the lanes left once an invocation's are added

float RmsScale(uint x0, uint n, float eps, uint tid, uint subgroup) {
  // Lane tid + m * WG sums values lane, lane + RMS_LANES, ... in order.
  vec2 sum = vec2(0.0);
  if (RMS_PER_INVOCATION == 1u) {
    const bool plays = WG <= RMS_LANES || tid < RMS_LANES;  // (constant for WG <= RMS_LANES)
    for (uint i = tid; plays && i < n; i += RMS_LANES) {
      const float sq = x[x0 + i] * x[x0 + i];
      sum = AddPairs(sum, vec2(sq, 0.0));
    }
  } else {
    vec2 lanes[RMS_PER_INVOCATION];
    for (uint m = 0u; m < RMS_PER_INVOCATION; ++m) {
      lanes[m] = vec2(0.0);
      for (uint i = tid + m * WG; i < n; i += RMS_LANES) {
        const float sq = x[x0 + i] * x[x0 + i];
        lanes[m] = AddPairs(lanes[m], vec2(sq, 0.0));
      }
    }
    // The tree's steps s = RMS_LANES / 2 .. WG, whose lanes i and i + s are the same invocation's.
    for (uint s = RMS_LANES / 2u; s >= WG; s >>= 1) {
      for (uint m = 0u; m < s / WG; ++m) lanes[m] = AddPairs(lanes[m], lanes[m + s / WG]);
    }
    sum = lanes[0];
  }
  const uint width = min(RMS_TREE, subgroup);
  if (RMS_TREE > width) {
    partial[tid] = sum.x;
    partial_lo[tid] = sum.y;
    barrier();
    for (uint s = RMS_TREE / 2u; s >= width; s >>= 1) {
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
