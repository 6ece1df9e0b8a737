#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// The last step of attention split over positions (attn_output with several splits): adds the
// splits' partial sums in order and rotates the result back by the Walsh-Hadamard transform
// when the format rotates. One workgroup per (token, HEADS consecutive heads): attn_output's
// grouping, so that KIND (not 3) quantizes the same values for the o matrix as attn_output
// does with one split (quantize_heads.glsl).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // a power of two >= 32
layout(constant_id = 1) const uint HD = 64;  // head_dim
layout(constant_id = 2) const uint ROTATE = 0;
layout(constant_id = 3) const uint HEADS = 1;
layout(constant_id = 4) const uint KIND = 3;  // the output's codes: vk::ActKind (3, float: none)

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
layout(binding = 2) writeonly buffer Codes { uint codes[]; };        // KIND: [..][n_head * HD / 4]
layout(binding = 3) writeonly buffer Aux { vec4 aux[]; };            // KIND: [..][n_head * HD / 32]

#include "common.glsl"

shared float hvec[HEADS * HD];

#include "hadamard.glsl"
#include "split_sums.glsl"
#include "subgroup_tree.glsl"
const uint QUANT_SHARED = KIND == 3u ? 1u : WG;
#include "quantize_block.glsl"
#include "quantize_heads.glsl"

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint h0 = gl_WorkGroupID.x * HEADS, t = gl_WorkGroupID.y;
  SumSplits(t, h0, tid);
  if (ROTATE != 0u) HadamardShared(HEADS, HD, p.hadamard_scale, tid, WG);
  for (uint x = tid; x < HEADS * HD; x += WG) o[(p.out_row0 + t) * p.out_stride + h0 * HD + x] = hvec[x];
  if (KIND != 3u) QuantizeHeads(p.out_row0 + t, h0, p.n_head);
}
