#version 450
#extension GL_GOOGLE_include_directive : require
// Causal softmax of attention scores in place, one workgroup per (token, head) row:
//   s[p] = exp(scale * s[p] - max) / sum   for p < n_visible = pos0 + t + 1,
// with the CPU's exp polynomial; with round_f16 the weights are rounded to f16 (an f16 cache:
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

shared float partial[WG];

void main() {
  LoadCall();
  const uint tid = gl_LocalInvocationID.x;
  const uint h = group_id.x, t = group_id.y;
  const uint n = p.pos0 + t + 1u;
  const uint row = p.score0 + (t * p.n_head + h) * p.score_stride;

  float m = uintBitsToFloat(0xFF800000u);  // -inf
  for (uint i = tid; i < n; i += WG) {
    const float v = s[row + i] * p.scale;
    s[row + i] = v;
    m = max(m, v);
  }
  partial[tid] = m;
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) partial[tid] = max(partial[tid], partial[tid + k]);
    barrier();
  }
  const float row_max = partial[0];
  barrier();

  float sum = 0.0;
  for (uint i = tid; i < n; i += WG) {
    const float e = ExpPoly(s[row + i] - row_max);
    s[row + i] = e;
    sum += e;
  }
  partial[tid] = sum;
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) partial[tid] += partial[tid + k];
    barrier();
  }
  // Div: 1 / sum correctly rounded, as the CPU's (a device's own division may be off by an ulp,
  // and an ulp in a row's scale moves its f16-rounded or int8-coded weights: seen on an H200).
  const float inv = Div(1.0, partial[0]);
  for (uint i = tid; i < n; i += WG) {
    const float w = s[row + i] * inv;
    s[row + i] = p.round_f16 != 0u ? RoundF16(w) : w;
  }
}
