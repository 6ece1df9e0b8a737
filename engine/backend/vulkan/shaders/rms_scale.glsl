// The RMSNorm scale 1 / sqrt(mean(x^2) + eps) of the n values of x from x0, computed by the
// whole workgroup (every invocation must call it; every one gets the result): a tree of f32
// partial sums over `partial` (the CPU sums in double; the difference is far below the
// tolerances). rms_norm.comp and quantize_act.comp (SOURCE 2) share it, so a fused norm gives
// the very values of the separate one. Needs the buffer `x` and `shared float partial[WG]`, WG
// a power of two.
float RmsScale(uint x0, uint n, float eps, uint tid) {
  float sum = 0.0;
  for (uint i = tid; i < n; i += WG) {
    precise float sq = x[x0 + i] * x[x0 + i];
    sum += sq;
  }
  partial[tid] = sum;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  const float mean = partial[0] / float(n);
  return 1.0 / sqrt(mean + eps);
}
