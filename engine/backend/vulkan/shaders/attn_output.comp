#version 450
#extension GL_GOOGLE_include_directive : require
// Attention output of one sequence's query tokens: out(t, h) = sum_p w[t][h][p] * V(p, h/group)
// over the visible positions, V read in the stored KV format from the device plane of the
// layer (dequantized here). One workgroup per (token, head, split): invocation (lane, d) sums
// the split's positions p = lane (mod lanes) for dimension d and the lanes are added in shared
// memory. With one split the result is rotated back by the Walsh-Hadamard transform when the
// format rotates (H is its own inverse) and written out; with several (decode: few tokens, long
// contexts, so the positions are spread over more workgroups) each split writes its partial sum
// and attn_reduce adds them up and rotates.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  // >= HD
layout(constant_id = 1) const uint KV_TYPE = 1;
layout(constant_id = 2) const uint KV_GROUP = 64;
layout(constant_id = 3) const uint HD = 64;
layout(constant_id = 4) const uint ROTATE = 0;

layout(push_constant) uniform Params {
  uint pos0;          // position of query token 0
  uint n_head;
  uint group;         // query heads per KV head
  uint score_stride;  // floats per weight row
  uint block_tokens;  // positions per KV block
  uint row_stride;    // bytes between device KV rows
  uint table0;        // this sequence's first entry in block_table
  uint out_stride;    // floats between token rows of out
  uint out_row0;      // out row of query token 0
  float hadamard_scale;
  uint split_positions;  // positions per split
  uint n_splits;
} p;

layout(binding = 0) readonly buffer Weights { float w[]; };             // [n_tokens][n_head][score_stride]
layout(binding = 1) readonly buffer Plane { uint kv_words[]; };         // V rows of this layer
layout(binding = 2) readonly buffer BlockTable { uint block_table[]; };
layout(binding = 3) writeonly buffer Output { float o[]; };             // [..][out_stride]
layout(binding = 4) writeonly buffer Partials { float partials[]; };    // [n_tokens][n_head][n_splits][HD]

#include "common.glsl"
#include "kv_rows.glsl"

shared float partial[WG];
shared float hvec[HD];

#include "hadamard.glsl"

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, split = gl_WorkGroupID.z;
  const uint n_visible = min(p.pos0 + t + 1u, (split + 1u) * p.split_positions);
  const uint lanes = WG / HD;
  const uint d = tid % HD, lane = tid / HD;
  const uint first = (h / p.group) * HD;
  const uint wrow = (t * p.n_head + h) * p.score_stride;
  float acc = 0.0;
  if (lane < lanes) {
    for (uint pos = split * p.split_positions + lane; pos < n_visible; pos += lanes) {
      const uint slot = block_table[p.table0 + pos / p.block_tokens];
      const uint row = (slot * p.block_tokens + pos % p.block_tokens) * p.row_stride;
      acc = fma(w[wrow + pos], KvValue(row, first + d), acc);
    }
  }
  partial[tid] = acc;
  barrier();
  if (tid < HD) {
    float sum = 0.0;
    for (uint l = 0u; l < lanes; ++l) sum += partial[l * HD + tid];
    hvec[tid] = sum;
  }
  barrier();
  if (p.n_splits > 1u) {
    for (uint i = tid; i < HD; i += WG) partials[((t * p.n_head + h) * p.n_splits + split) * HD + i] = hvec[i];
    return;
  }
  if (ROTATE != 0u) HadamardShared(1u, HD, p.hadamard_scale, tid, WG);
  for (uint i = tid; i < HD; i += WG) o[(p.out_row0 + t) * p.out_stride + h * HD + i] = hvec[i];
}
