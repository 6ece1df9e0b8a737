// The RMSNorm scale 1 / sqrt(mean(x^2) + eps) of the n values of x from x0, computed by the
// whole workgroup (every invocation must call it, numbered by TreeTid; every one gets the
// result): a tree of f32 partial sums (the CPU sums in double; the difference is far below the
// tolerances), its last steps by subgroup shuffles in the *_sg variants (subgroup_tree.glsl:
// the same sum). rms_norm.comp and quantize_act.comp (SOURCE 2) share it, so a fused norm
// gives the very values of the separate one. Needs common.glsl, the buffer `x` and `shared float
// partial[WG]`, WG a power of two.
float RmsScale(uint x0, uint n, float eps, uint tid, uint subgroup) {
  float sum = 0.0;
  for (uint i = tid; i < n; i += WG) {
    precise float sq = x[x0 + i] * x[x0 + i];
    sum += sq;
  }
  const uint width = min(WG, subgroup);
  if (WG > width) {
    partial[tid] = sum;
    barrier();
    for (uint s = WG / 2u; s >= width; s >>= 1) {
      if (tid < s) partial[tid] += partial[tid + s];
      barrier();
    }
    sum = partial[tid];
  }
  if (width > 1u) {
    // Invocation 0 holds the tree's sum (the others' shuffles added in other orders).
    sum = SubgroupTreeSteps(sum, width);
    if (tid == 0u) partial[0] = sum;
    barrier();
  }
  const float mean = Div(partial[0], float(n));
  return Div(1.0, SqrtRounded(mean + eps));
}
