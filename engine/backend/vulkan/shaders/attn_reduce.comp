#version 450
#extension GL_GOOGLE_include_directive : require
// The last step of attention split over positions (attn_output with several splits): adds the
// splits' partial sums in order and rotates the result back by the Walsh-Hadamard transform
// when the format rotates. One workgroup per (token, head).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint HD = 64;  // head_dim
layout(constant_id = 2) const uint ROTATE = 0;

layout(push_constant) uniform Params {
  uint n_head;
  uint n_splits;
  uint out_stride;  // floats between token rows of out
  uint out_row0;    // out row of query token 0
  float hadamard_scale;
  uint partial0;    // this call's first float of partials
} p;

layout(binding = 0) readonly buffer Partials { float partials[]; };  // from partial0: [n_tokens][n_head][n_splits][HD]
layout(binding = 1) writeonly buffer Output { float o[]; };          // [..][out_stride]

shared float hvec[HD];

#include "hadamard.glsl"

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
  const uint base = p.partial0 + (t * p.n_head + h) * p.n_splits * HD;
  for (uint d = tid; d < HD; d += WG) {
    float sum = 0.0;
    for (uint s = 0u; s < p.n_splits; ++s) sum += partials[base + s * HD + d];
    hvec[d] = sum;
  }
  barrier();
  if (ROTATE != 0u) HadamardShared(1u, HD, p.hadamard_scale, tid, WG);
  for (uint d = tid; d < HD; d += WG) o[(p.out_row0 + t) * p.out_stride + h * HD + d] = hvec[d];
}
