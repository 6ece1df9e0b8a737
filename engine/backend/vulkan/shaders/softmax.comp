#version 450
#extension GL_GOOGLE_include_directive : require
// Causal softmax of attention scores in place, one workgroup per (token, head) row:
//   s[p] = exp(scale * s[p] - max) / sum   for p < n_visible = pos0 + t + 1,
// with the CPU's exp polynomial and its order of summation; with round_f16 the weights are rounded to f16 (an f16 cache:
// the reference multiplies V by f16 weights, and so does the CPU backend). Positions past
// n_visible are not touched (attn_output does not read them).
// JOBS: the rows of several calls (prompts of several sequences in one pass) in one dispatch
// (jobs.glsl).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  // a power of two
layout(constant_id = 1) const uint JOBS = 0;  // 1: the calls of `jobs` (jobs.glsl)

struct Params {
  uint pos0;          // position of token 0
  uint n_head;
  uint score_stride;  // floats per row
  uint round_f16;
  float scale;        // 1 / sqrt(head_dim)
  uint score0;        // this call's first float of s
};

layout(binding = 0) buffer Scores { float s[]; };  // from score0: [n_tokens][n_head][score_stride]
const uint kJobsBinding = 1;
const uint kJobsFlatDim = 1;  // a call's tokens (y) are numbered along y
#include "jobs.glsl"

#include "common.glsl"
#include "pair_sums.glsl"

shared float partial[WG], partial_lo[WG];

void main() {
  LoadCall();
  const uint tid = gl_LocalInvocationID.x;
  const uint h = group_id.x, t = group_id.y;
  const uint n = p.pos0 + t + 1u;
  const uint row = p.score0 + (t * p.n_head + h) * p.score_stride;

  // Each invocation takes the same chunks of 16 positions in every pass, so it reads back only
  // what it wrote itself (no buffer barrier, nor a coherent buffer, between the passes).
  float m = uintBitsToFloat(0xFF800000u);  // -inf
  for (uint c = tid; c * 16u < n; c += WG) {
    for (uint i = c * 16u; i < min(n, c * 16u + 16u); ++i) {
      const float v = s[row + i] * p.scale;
      s[row + i] = v;
      m = max(m, v);
    }
  }
  partial[tid] = m;
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) partial[tid] = max(partial[tid], partial[tid + k]);
    barrier();
  }
  const float row_max = partial[0];
  barrier();

  // The exponentials and their sum in the CPU's order (cpu::Softmax): chunks of 16 positions,
  // each a tree of floats (lane l += lane l + 8, then + 4, + 2, + 1; zeros past n), the chunk
  // sums added as (hi, lo) pairs where the CPU adds them in double, and 1 / sum rounded as its
  // (float)(1.0 / sum). (A plain tree of the WG invocations' sums, before, gave another last bit
  // to 1 / sum in some rows, and so another f16 step to some weights: on an H200 the golden
  // test of stories260K, whose prompt's attention is all softmax.comp, was over its bound.)
  vec2 sum = vec2(0.0);
  for (uint c = tid; c * 16u < n; c += WG) {
    float lanes[16];
    for (uint l = 0u; l < 16u; ++l) {
      const uint i = c * 16u + l;
      lanes[l] = 0.0;
      if (i < n) {
        lanes[l] = ExpPoly(s[row + i] - row_max);
        s[row + i] = lanes[l];
      }
    }
    for (uint width = 8u; width > 0u; width >>= 1) {
      for (uint l = 0u; l < width; ++l) lanes[l] += lanes[l + width];
    }
    sum = AddPairs(sum, vec2(lanes[0], 0.0));
  }
  partial[tid] = sum.x;
  partial_lo[tid] = sum.y;
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) {
      const vec2 r = AddPairs(vec2(partial[tid], partial_lo[tid]), vec2(partial[tid + k], partial_lo[tid + k]));
      partial[tid] = r.x;
      partial_lo[tid] = r.y;
    }
    barrier();
  }
  // PairReciprocal's division is Div (a device's own 1 / x may be off by an ulp: seen on an H200).
  const float inv = PairReciprocal(vec2(partial[0], partial_lo[0]));
  for (uint c = tid; c * 16u < n; c += WG) {
    for (uint i = c * 16u; i < min(n, c * 16u + 16u); ++i) {
      const float w = s[row + i] * inv;
      s[row + i] = p.round_f16 != 0u ? RoundF16(w) : w;
    }
  }
}
