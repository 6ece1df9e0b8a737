#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_INTEGER_DOT)
#extension GL_EXT_spirv_intrinsics : require
#endif
// Y = X W^T for many activation rows (prefill, large batches) with quantized weights (the
// types of matvec_quant). A workgroup of 16 x 16 invocations computes a tile of BM weight rows
// by BN tokens: per step it decodes BK 32-value units of BM rows and loads the same units of
// BN quantized activation rows into shared memory, and each invocation accumulates a
// (BM/16) x (BN/16) block of the tile (rows ty + 16i, tokens tx + 16j: neighbours in a warp
// read neighbouring shared words). Each weight unit is decoded once per tile, not per token.

layout(local_size_x = 256) in;
layout(constant_id = 1) const uint WEIGHT_TYPE = 2;
layout(constant_id = 2) const uint BM = 64;  // weight rows per tile, a multiple of 16
layout(constant_id = 3) const uint BN = 64;  // tokens per tile, a multiple of 16
layout(constant_id = 4) const uint BK = 2;   // units per step
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
  uint x_stride;  // (matvec_quant's norm: unused here)
  uint x_row0;
  float eps;
  uint t_begin;   // first activation row of this dispatch (rows [t_begin, n_tokens)): a pass's
                  // short steps and its long ones take different shaders (Ops::MatMulArgs)
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

const uint TM = BM / 16u;
const uint TN = BN / 16u;

shared uint w_codes[BK * BM * 8];  // [k][row][8]: decoded weight units
shared vec2 w_scales[BK * BM];     // [k][row]
shared uint a_codes[BK * BN * 8];  // [k][token][8]
shared vec4 a_aux[BK * BN];        // [k][token]

#include "matrix_store.glsl"

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint tx = tid % 16u, ty = tid / 16u;
  const uint tile_r = p.row_begin + gl_WorkGroupID.x * BM;
  const uint tile_t = p.t_begin + gl_WorkGroupID.y * BN;
  float acc[TM * TN];
  for (uint i = 0u; i < TM * TN; ++i) acc[i] = 0.0;

  for (uint u0 = 0u; u0 < p.n_units; u0 += BK) {
    for (uint slot = tid; slot < BK * BM; slot += 256u) {
      const uint k = slot / BM, m = slot % BM;
      const uint r = tile_r + m, u = u0 + k;
      if (r < p.n_rows && u < p.n_units) {
        const WeightUnit wu = LoadUnit(r * p.row_bytes, u, p.n_units);
        for (uint i = 0u; i < 8u; ++i) w_codes[slot * 8u + i] = wu.q[i];
        w_scales[slot] = wu.s;
      } else {
        for (uint i = 0u; i < 8u; ++i) w_codes[slot * 8u + i] = 0u;
        w_scales[slot] = vec2(0.0);
      }
    }
    for (uint slot = tid; slot < BK * BN; slot += 256u) {
      const uint k = slot / BN, n = slot % BN;
      const uint t = tile_t + n, u = u0 + k;
      if (t < p.n_tokens && u < p.n_units) {
        const uvec4 lo = act_code4[(t * p.n_units + u) * 2u], hi = act_code4[(t * p.n_units + u) * 2u + 1u];
        for (uint i = 0u; i < 4u; ++i) {
          a_codes[slot * 8u + i] = lo[i];
          a_codes[slot * 8u + 4u + i] = hi[i];
        }
        a_aux[slot] = act_aux[t * p.n_units + u];
      } else {
        for (uint i = 0u; i < 8u; ++i) a_codes[slot * 8u + i] = 0u;
        a_aux[slot] = vec4(0.0);
      }
    }
    barrier();
    for (uint k = 0u; k < BK; ++k) {
      for (uint i = 0u; i < TM; ++i) {
        const uint ws = k * BM + ty + 16u * i;
        WeightUnit wu;
        for (uint w = 0u; w < 8u; ++w) wu.q[w] = w_codes[ws * 8u + w];
        wu.s = w_scales[ws];
        for (uint j = 0u; j < TN; ++j) {
          const uint as = k * BN + tx + 16u * j;
          uint a[8];
          for (uint w = 0u; w < 8u; ++w) a[w] = a_codes[as * 8u + w];
          acc[i * TN + j] += UnitDot(wu, a, a_aux[as]);
        }
      }
    }
    barrier();
  }

  for (uint i = 0u; i < TM; ++i) {
    const uint r = tile_r + ty + 16u * i;
    if (r >= p.n_rows) continue;
    for (uint j = 0u; j < TN; ++j) {
      const uint t = tile_t + tx + 16u * j;
      if (t >= p.n_tokens) continue;
      StoreOutput(t, r, acc[i * TN + j]);
    }
  }
}
