#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_INTEGER_DOT)
#extension GL_EXT_spirv_intrinsics : require
#endif
#if defined(KVFS_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// y = W x for a few activation rows (decode and small batches) with quantized weights:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (WEIGHT_TYPE) against activations
// quantized by quantize_act. A workgroup has WG / LANES slots of LANES invocations; a slot
// computes ROWS_PER_SLOT consecutive weight rows for TOKENS activation rows. Its invocations
// stride over the 32-value units: each loads a unit of the activations once and uses it for
// all of the slot's rows (activation units outweigh weight units about 3 to 1 in bytes, so
// reloading them per row costs more cache bandwidth than the weights' memory bandwidth), and
// decodes each weight unit once for all TOKENS tokens. Partial sums are added up as a tree
// (subgroup_tree.glsl). LANES follows the row length (short rows: several slots per
// workgroup, no idle invocations); the host picks ROWS_PER_SLOT so that large matrices still
// fill the device.
//
// Epilogue (flags): y = [y_old +] (W x [+ bias]), the residual add and the qwen2 bias fused.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;       // invocations, a power of two
layout(constant_id = 1) const uint WEIGHT_TYPE = 2;
layout(constant_id = 2) const uint LANES = 64;    // invocations per slot, a power of two <= WG
layout(constant_id = 3) const uint TOKENS = 1;
layout(constant_id = 4) const uint ROWS_PER_SLOT = 1;
layout(constant_id = 5) const uint WEIGHT_LAYOUT = 0;  // vk::WeightLayout

layout(push_constant) uniform Params {
  uint n_units;    // 32-value units per row (n_in / 32)
  uint row_bytes;  // bytes per weight row
  uint n_rows;     // rows in this part of the matrix
  uint row_begin;  // first row (within the part) of this dispatch
  uint n_tokens;   // activation rows
  uint y_stride;   // floats between rows of y (the matrix's n_out, or seg1 with several outputs)
  uint y_col0;     // column of y (and index of bias) of the part's row 0
  uint flags;      // 1: add to y's old value; 2: add bias
  // Concatenated matrices (matrix_store.glsl): first rows of the second and third output
  // (0xFFFFFFFF: none), and those outputs' row strides.
  uint seg1;
  uint seg2;
  uint y1_stride;
  uint y2_stride;
} p;

layout(binding = 0) readonly buffer Weights { uint weight_words[]; };  // n_rows rows of row_bytes
layout(binding = 1) readonly buffer ActCodes { uvec4 act_code4[]; };   // [n_tokens][n_units * 2]: 32 codes a unit
layout(binding = 2) readonly buffer ActAux { vec4 act_aux[]; };        // [n_tokens][n_units]
layout(binding = 3) buffer Output { float y[]; };                      // [n_tokens][y_stride]
layout(binding = 4) readonly buffer Bias { float bias[]; };            // [y_stride] when flags & 2
layout(binding = 5) buffer Output1 { float y1[]; };                     // [n_tokens][y1_stride]: rows from seg1
layout(binding = 6) buffer Output2 { float y2[]; };                     // [n_tokens][y2_stride]: rows from seg2

#include "common.glsl"
#include "weight_bytes.glsl"
#include "weight_units.glsl"

const uint SLOTS = WG / LANES;
const uint OUTPUTS = ROWS_PER_SLOT * TOKENS;  // per slot: output k * TOKENS + t is row k, token t

shared float partial[OUTPUTS * WG];

#include "matrix_store.glsl"
#include "subgroup_tree.glsl"

void main() {
  const uint subgroup = TreeSubgroupSize();
  const uint tid = TreeTid(subgroup);
  const uint lane = tid % LANES, slot = tid / LANES;
  const uint r0 = p.row_begin + (gl_WorkGroupID.x * SLOTS + slot) * ROWS_PER_SLOT;
  const uint t0 = gl_WorkGroupID.y * TOKENS;
  float acc[OUTPUTS];
  for (uint o = 0u; o < OUTPUTS; ++o) acc[o] = 0.0;

  if (r0 < p.n_rows) {
    for (uint u = lane; u < p.n_units; u += LANES) {
      uint a[TOKENS * 8u];
      vec4 aux[TOKENS];
      for (uint t = 0u; t < TOKENS; ++t) {
        const uint tt = min(t0 + t, p.n_tokens - 1u);  // past the last token: a copy, not stored
        const uvec4 lo = act_code4[(tt * p.n_units + u) * 2u], hi = act_code4[(tt * p.n_units + u) * 2u + 1u];
        for (uint i = 0u; i < 4u; ++i) {
          a[t * 8u + i] = lo[i];
          a[t * 8u + 4u + i] = hi[i];
        }
        aux[t] = act_aux[tt * p.n_units + u];
      }
      for (uint k = 0u; k < ROWS_PER_SLOT; ++k) {
        if (r0 + k >= p.n_rows) break;
        const WeightUnit wu = LoadUnit((r0 + k) * p.row_bytes, u, p.n_units);
        for (uint t = 0u; t < TOKENS; ++t) {
          uint at[8];
          for (uint i = 0u; i < 8u; ++i) at[i] = a[t * 8u + i];
          acc[k * TOKENS + t] += UnitDot(wu, at, aux[t]);
        }
      }
    }
  }

  // The tree: the steps from LANES / 2 down to the subgroup size in shared memory, the rest
  // by shuffles (lane 0 of the slot holds the sums; subgroup_tree.glsl).
  if (LANES > subgroup) {
    for (uint o = 0u; o < OUTPUTS; ++o) partial[o * WG + tid] = acc[o];
    barrier();
    for (uint s = LANES / 2u; s >= subgroup; s >>= 1) {
      if (lane < s) {
        for (uint o = 0u; o < OUTPUTS; ++o) partial[o * WG + tid] += partial[o * WG + tid + s];
      }
      barrier();
    }
    for (uint o = 0u; o < OUTPUTS; ++o) acc[o] = partial[o * WG + tid];
  }
  for (uint o = 0u; o < OUTPUTS; ++o) acc[o] = SubgroupTreeSteps(acc[o], min(LANES, subgroup));
  if (lane != 0u) return;
  for (uint o = 0u; o < OUTPUTS; ++o) {
    const uint r = r0 + o / TOKENS, t = t0 + o % TOKENS;
    if (r >= p.n_rows || t >= p.n_tokens) continue;
    StoreOutput(t, r, acc[o]);
  }
}
