#version 450
#extension GL_GOOGLE_include_directive : require
// y = W x for a few activation rows (decode and small batches) with quantized weights:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (WEIGHT_TYPE) against activations
// quantized by quantize_act. A workgroup computes WG / LANES weight rows for TOKENS activation
// rows: the LANES invocations of a row stride over its 32-value units, decode each weight unit
// once for all TOKENS tokens, and their partial sums are added up in shared memory. LANES
// follows the row length (short rows: several rows per workgroup, no idle invocations).
//
// Epilogue (flags): y = [y_old +] (W x [+ bias]), the residual add and the qwen2 bias fused.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;       // invocations, a power of two
layout(constant_id = 1) const uint WEIGHT_TYPE = 2;
layout(constant_id = 2) const uint LANES = 64;    // invocations per row, a power of two <= WG
layout(constant_id = 3) const uint TOKENS = 1;

layout(push_constant) uniform Params {
  uint n_units;    // 32-value units per row (n_in / 32)
  uint row_bytes;  // bytes per weight row
  uint n_rows;     // rows in this part of the matrix
  uint row_begin;  // first row (within the part) of this dispatch
  uint n_tokens;   // activation rows
  uint y_stride;   // floats between rows of y (the matrix's n_out)
  uint y_col0;     // column of y (and index of bias) of the part's row 0
  uint flags;      // 1: add to y's old value; 2: add bias
} p;

layout(binding = 0) readonly buffer Weights { uint weight_words[]; };  // n_rows rows of row_bytes
layout(binding = 1) readonly buffer ActCodes { uint act_codes[]; };    // [n_tokens][n_units * 8]
layout(binding = 2) readonly buffer ActAux { vec4 act_aux[]; };        // [n_tokens][n_units]
layout(binding = 3) buffer Output { float y[]; };                      // [n_tokens][y_stride]
layout(binding = 4) readonly buffer Bias { float bias[]; };            // [y_stride] when flags & 2

#include "common.glsl"
#include "weight_bytes.glsl"
#include "weight_units.glsl"

const uint ROWS = WG / LANES;

shared float partial[TOKENS * WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint lane = tid % LANES;
  const uint r = p.row_begin + gl_WorkGroupID.x * ROWS + tid / LANES;
  const uint t0 = gl_WorkGroupID.y * TOKENS;
  float acc[TOKENS];
  for (uint t = 0u; t < TOKENS; ++t) acc[t] = 0.0;

  if (r < p.n_rows) {
    for (uint u = lane; u < p.n_units; u += LANES) {
      const WeightUnit wu = LoadUnit(r * p.row_bytes, u);
      for (uint t = 0u; t < TOKENS; ++t) {
        if (t0 + t >= p.n_tokens) break;
        const uint a0 = ((t0 + t) * p.n_units + u) * 8u;
        uint a[8];
        for (uint i = 0u; i < 8u; ++i) a[i] = act_codes[a0 + i];
        acc[t] += UnitDot(wu, a, act_aux[(t0 + t) * p.n_units + u]);
      }
    }
  }

  for (uint t = 0u; t < TOKENS; ++t) partial[t * WG + tid] = acc[t];
  barrier();
  for (uint s = LANES / 2u; s > 0u; s >>= 1) {
    if (lane < s) {
      for (uint t = 0u; t < TOKENS; ++t) partial[t * WG + tid] += partial[t * WG + tid + s];
    }
    barrier();
  }
  // Lane t of each row writes token t.
  const uint t = t0 + lane;
  if (r >= p.n_rows || lane >= TOKENS || t >= p.n_tokens) return;
  const uint at = t * p.y_stride + p.y_col0 + r;
  float v = partial[lane * WG + tid - lane];
  if ((p.flags & 2u) != 0u) v += bias[p.y_col0 + r];
  if ((p.flags & 1u) != 0u) v = y[at] + v;
  y[at] = v;
}
