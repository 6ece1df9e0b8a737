#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// y = W x for a few activation rows with float weights (F32, F16, BF16: WEIGHT_TYPE) and f32
// activations, rounded to the weight's type first as the CPU's dot products do. A workgroup
// computes WG / LANES rows for TOKENS activation rows; the LANES invocations of a row stride
// over its values and their partial sums are added up as a tree (subgroup_tree.glsl).
// Epilogue as in matvec_quant.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // invocations, a power of two
layout(constant_id = 1) const uint WEIGHT_TYPE = 1;
layout(constant_id = 2) const uint LANES = 64;  // invocations per row, a power of two <= WG
layout(constant_id = 3) const uint TOKENS = 1;

layout(push_constant) uniform Params {
  uint n_in;       // values per row
  uint row_bytes;  // bytes per weight row
  uint n_rows;     // rows in this part of the matrix
  uint row_begin;  // first row (within the part) of this dispatch
  uint n_tokens;   // activation rows
  uint x_stride;   // floats between rows of x
  uint y_stride;   // floats between rows of y (the matrix's n_out, or seg1 with several outputs)
  uint y_col0;     // column of y (and index of bias) of the part's row 0
  uint flags;      // 1: add to y's old value; 2: add bias
  // Concatenated matrices (matrix_store.glsl): first rows of the second and third output
  // (0xFFFFFFFF: none), and those outputs' row strides.
  uint seg1;
  uint seg2;
  uint y1_stride;
  uint y2_stride;
  uint t_begin;   // first activation row of this dispatch (rows [t_begin, n_tokens)): a pass's
                  // short steps and its long ones take different shaders (Ops::MatMulArgs)
} p;

layout(binding = 0) readonly buffer Weights { uint weight_words[]; };  // n_rows rows of row_bytes
layout(binding = 1) readonly buffer Input { float x[]; };              // [n_tokens][x_stride]
layout(binding = 2) buffer Output { float y[]; };                      // [n_tokens][y_stride]
layout(binding = 3) readonly buffer Bias { float bias[]; };            // [y_stride] when flags & 2
layout(binding = 4) buffer Output1 { float y1[]; };                     // [n_tokens][y1_stride]: rows from seg1
layout(binding = 5) buffer Output2 { float y2[]; };                     // [n_tokens][y2_stride]: rows from seg2

#include "common.glsl"
#include "weight_bytes.glsl"
#include "weight_values.glsl"

const uint ROWS = WG / LANES;
const uint kBatch = 8u;  // values a lane loads before it adds any

shared float partial[TOKENS * WG];

#include "matrix_store.glsl"
#include "subgroup_tree.glsl"

void main() {
  const uint subgroup = TreeSubgroupSize();
  const uint tid = TreeTid(subgroup);
  const uint lane = tid % LANES;
  const uint r = p.row_begin + gl_WorkGroupID.x * ROWS + tid / LANES;
  const uint t0 = p.t_begin + gl_WorkGroupID.y * TOKENS;
  float acc[TOKENS];
  for (uint t = 0u; t < TOKENS; ++t) acc[t] = 0.0;

  if (r < p.n_rows) {
    // Rounds of kBatch values a lane (e0, e0 + LANES, ...): the round's weights are loaded
    // before any is used, so a lane waits a memory latency a round, not one per value (a row of
    // 4096 values is 128 values a lane of 32); values past the row load its last one again and
    // are not added. Each lane adds its values in order, as one at a time: the same sums.
    for (uint e0 = lane; e0 < p.n_in; e0 += LANES * kBatch) {
      float w[kBatch];
      for (uint b = 0u; b < kBatch; ++b) w[b] = WeightValue(r * p.row_bytes, min(e0 + b * LANES, p.n_in - 1u));
      for (uint b = 0u; b < kBatch; ++b) {
        const uint e = e0 + b * LANES;
        if (e >= p.n_in) break;  // after the loads: they stay in flight together
        for (uint t = 0u; t < TOKENS; ++t) {
          if (t0 + t >= p.n_tokens) break;
          acc[t] = fma(w[b], ActivationValue(x[(t0 + t) * p.x_stride + e]), acc[t]);
        }
      }
    }
  }

  // The tree: shared memory down to the subgroup size, then shuffles (subgroup_tree.glsl).
  if (LANES > subgroup) {
    for (uint t = 0u; t < TOKENS; ++t) partial[t * WG + tid] = acc[t];
    barrier();
    for (uint s = LANES / 2u; s >= subgroup; s >>= 1) {
      if (lane < s) {
        for (uint t = 0u; t < TOKENS; ++t) partial[t * WG + tid] += partial[t * WG + tid + s];
      }
      barrier();
    }
    for (uint t = 0u; t < TOKENS; ++t) acc[t] = partial[t * WG + tid];
  }
  for (uint t = 0u; t < TOKENS; ++t) acc[t] = SubgroupTreeSteps(acc[t], min(LANES, subgroup));
  // Lane 0 of each row holds the sums.
  if (r >= p.n_rows || lane != 0u) return;
  for (uint t = 0u; t < TOKENS; ++t) {
    if (t0 + t < p.n_tokens) StoreOutput(t0 + t, r, acc[t]);
  }
}
