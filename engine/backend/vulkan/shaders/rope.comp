#version 450
#extension GL_GOOGLE_include_directive : require
// RoPE: rotates the first n_rot dimensions of every head of every token row in place, with
// the per-token cos/sin table made on the host by the CPU's RopeAngles (frequency base, linear
// freq_scale and Llama-3 rope_freqs divisors included): the host computes the angles in the
// reference's float order with libm's sin/cos, which GPU sin/cos (unspecified accuracy for
// large arguments) could not match at long positions.
// NEOX = 0 pairs (x[2i], x[2i+1]) (llama); NEOX = 1 pairs (x[i], x[i + n_rot/2]) (qwen2).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NEOX = 0;

layout(push_constant) uniform Params {
  uint n_heads;
  uint head_dim;
  uint n_rot;
  uint x_stride;  // floats between token rows of x
  uint n_tokens;
} p;

layout(binding = 0) buffer Rows { float x[]; };                // [n_tokens][x_stride]
layout(binding = 1) readonly buffer CosSin { vec2 cs[]; };     // [n_tokens][n_rot / 2]: (cos, sin)

#include "rope_pair.glsl"

void main() {
  const uint half_rot = p.n_rot / 2u;
  const uint i = gl_GlobalInvocationID.x % half_rot;
  const uint h = gl_GlobalInvocationID.x / half_rot;
  const uint t = gl_GlobalInvocationID.y;
  if (h >= p.n_heads || t >= p.n_tokens) return;
  const uint base = t * p.x_stride + h * p.head_dim;
  const uvec2 dims = RopePairDims(i, half_rot, NEOX != 0u);
  const uint a = base + dims.x, b = base + dims.y;
  const vec2 c = cs[t * half_rot + i];
  const float x0 = x[a], x1 = x[b];
  const vec2 r = RopePair(x0, x1, c);
  x[a] = r.x;
  x[b] = r.y;
}
