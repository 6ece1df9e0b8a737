#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#if defined(KVFS_PHASE_CLOCK)
#extension GL_EXT_shader_realtime_clock : require
#extension GL_ARB_shader_clock : require
#endif
// Quantizes f32 activation rows to 8-bit units for the integer dot products of matvec_quant
// and matmul_quant, with exactly the arithmetic of the CPU's activation quantizers
// (kernels_scalar.cpp: QuantizeQ8_0 / Q8_1 / Q8_K), so both backends dot the same codes.
//
// The block step (quantize_block.glsl) spreads each block over 32 invocations; a workgroup
// quantizes WG / 32 blocks a pass, over the blocks [group x * blocks_per_group, +
// blocks_per_group) of row y.
//
// The rows are x itself (SOURCE 0) or, fused with the op that makes them, silu(x) * x2 (SOURCE
// 1: SwiGLU of gate x and up x2, the arithmetic of swiglu.comp) or RMSNorm(x) * x2 (SOURCE 2:
// weight x2, the arithmetic of rms_norm.comp; every workgroup of a row computes the row's
// scale with rms_norm's tree, so they all get its bits). Fused, the f32 rows are also written
// to y, for float weights and for matrices of another activation kind. Fusing saves a dispatch
// and the barrier between them: on a GPU, decode is many small dispatches.
//
// Output: codes and aux per row as quantize_block.glsl describes.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  // a power of two >= 32 (SOURCE 2: rms_norm's)
layout(constant_id = 1) const uint KIND = 0;  // 0: Q8_0, 1: Q8_1, 2: Q8_K
layout(constant_id = 2) const uint SOURCE = 0;

layout(push_constant) uniform Params {
  uint n;                 // values per row: a multiple of 32 (of 256 for Q8_K)
  uint n_rows;
  uint x_stride;          // floats between rows of x (and of x2 for SOURCE 1)
  uint y_stride;          // floats between rows of y
  float eps;              // SOURCE 2
  uint blocks_per_group;  // blocks of a row per workgroup
} p;

layout(binding = 0) readonly buffer Input { float x[]; };
layout(binding = 1) writeonly buffer Codes { uint codes[]; };  // [n_rows][n / 4]
layout(binding = 2) writeonly buffer Aux { vec4 aux[]; };      // [n_rows][n / 32]
layout(binding = 3) readonly buffer Second { float x2[]; };    // SOURCE 1: up rows; 2: weight [n]
layout(binding = 4) writeonly buffer Output { float y[]; };    // SOURCE 1, 2: the f32 rows

#include "common.glsl"

shared float partial[WG];
#include "subgroup_tree.glsl"
#include "rms_scale.glsl"

const uint QUANT_SHARED = WG;
#include "quantize_block.glsl"
#include "phase_clock.glsl"

// Value i of row r (norm_scale: SOURCE 2's RMSNorm scale of the row).
float Value(uint r, uint i, float norm_scale) {
  const float a = x[r * p.x_stride + i];
  if (SOURCE == 1u) return SwiGluOf(a, x2[r * p.x_stride + i]);
  if (SOURCE == 2u) {
    precise float v = (a * norm_scale) * x2[i];
    return v;
  }
  return a;
}

void main() {
  MarkPhase(0u);
  const uint subgroup = TreeSubgroupSize();
  const uint tid = TreeTid(subgroup), r = gl_WorkGroupID.y;
  const uint n_blocks = p.n / BLOCK;
  const uint begin = gl_WorkGroupID.x * p.blocks_per_group;
  const uint end = min(n_blocks, begin + p.blocks_per_group);
  float scale = 0.0;
  if (SOURCE == 2u) scale = RmsScale(r * p.x_stride, p.n, p.eps, tid, subgroup);
  MarkPhase(1u);
  for (uint b0 = begin; b0 < end; b0 += WG / 32u) {
    const uint b = b0 + tid / 32u;
    const bool live = b < end;
    const uint v0 = b * BLOCK + (tid % 32u) * PER_LANE;
    float v[PER_LANE];
    for (uint i = 0u; i < PER_LANE; ++i) {
      v[i] = live ? Value(r, v0 + i, scale) : 0.0;
      if (live && SOURCE != 0u) y[r * p.y_stride + v0 + i] = v[i];
    }
    QuantizeBlock(v, r * (p.n / 4u) + b * (BLOCK / 4u), r * (p.n / 32u) + b * (BLOCK / 32u), live, tid,
                  min(32u, subgroup));
  }
  MarkPhase(2u);
}
