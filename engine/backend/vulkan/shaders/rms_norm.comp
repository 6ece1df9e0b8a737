#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, one workgroup per row (the scale: rms_scale.glsl).
// quantize_act.comp fuses the same norm with the activation quantization. With gather set,
// output row i normalizes input row row_ids[i] (the final norm runs only over the rows whose
// logits are wanted).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  // a power of two

layout(push_constant) uniform Params {
  uint n;         // values per row
  uint x_stride;  // floats between rows of x
  uint y_stride;  // floats between rows of y
  uint gather;    // 1: input row = row_ids[output row]
  float eps;
} p;

layout(binding = 0) readonly buffer Input { float x[]; };
layout(binding = 1) readonly buffer Weight { float w[]; };  // [n]
layout(binding = 2) writeonly buffer Output { float y[]; };
layout(binding = 3) readonly buffer RowIds { int row_ids[]; };

shared float partial[WG];

#include "common.glsl"
#include "subgroup_tree.glsl"
#include "rms_scale.glsl"

void main() {
  const uint subgroup = TreeSubgroupSize();
  const uint tid = TreeTid(subgroup);
  const uint out_row = gl_WorkGroupID.x;
  const uint in_row = p.gather != 0u ? uint(row_ids[out_row]) : out_row;
  const uint x0 = in_row * p.x_stride, y0 = out_row * p.y_stride;
  const float scale = RmsScale(x0, p.n, p.eps, tid, subgroup);
  for (uint i = tid; i < p.n; i += WG) {
    precise float v = (x[x0 + i] * scale) * w[i];
    y[y0 + i] = v;
  }
}
