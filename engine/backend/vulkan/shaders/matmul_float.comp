#version 450
#extension GL_GOOGLE_include_directive : require
// Y = X W^T for many activation rows with float weights (F32, F16, BF16: WEIGHT_TYPE). A
// workgroup of 16 x 16 invocations computes a tile of BM weight rows by BN tokens, staging BK
// columns of both operands in shared memory per step (weights widened to f32, activations
// rounded to the weight's type as in matvec_float); each invocation accumulates a
// (BM/16) x (BN/16) block (rows ty + 16i, tokens tx + 16j).

layout(local_size_x = 256) in;
layout(constant_id = 1) const uint WEIGHT_TYPE = 1;
layout(constant_id = 2) const uint BM = 64;  // weight rows per tile, a multiple of 16
layout(constant_id = 3) const uint BN = 64;  // tokens per tile, a multiple of 16
layout(constant_id = 4) const uint BK = 16;  // values per step

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

const uint TM = BM / 16u;
const uint TN = BN / 16u;

shared float w_tile[BK * BM];  // [k][row]
shared float a_tile[BK * BN];  // [k][token]

#include "matrix_store.glsl"

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint tx = tid % 16u, ty = tid / 16u;
  const uint tile_r = p.row_begin + gl_WorkGroupID.x * BM;
  const uint tile_t = p.t_begin + gl_WorkGroupID.y * BN;
  float acc[TM * TN];
  for (uint i = 0u; i < TM * TN; ++i) acc[i] = 0.0;

  for (uint e0 = 0u; e0 < p.n_in; e0 += BK) {
    for (uint slot = tid; slot < BK * BM; slot += 256u) {
      const uint m = slot / BK, k = slot % BK;  // consecutive invocations read along a row
      const uint r = tile_r + m, e = e0 + k;
      w_tile[k * BM + m] = r < p.n_rows && e < p.n_in ? WeightValue(r * p.row_bytes, e) : 0.0;
    }
    for (uint slot = tid; slot < BK * BN; slot += 256u) {
      const uint n = slot / BK, k = slot % BK;
      const uint t = tile_t + n, e = e0 + k;
      a_tile[k * BN + n] = t < p.n_tokens && e < p.n_in ? ActivationValue(x[t * p.x_stride + e]) : 0.0;
    }
    barrier();
    for (uint k = 0u; k < BK; ++k) {
      float a[TN];
      for (uint j = 0u; j < TN; ++j) a[j] = a_tile[k * BN + tx + 16u * j];
      for (uint i = 0u; i < TM; ++i) {
        const float w = w_tile[k * BM + ty + 16u * i];
        for (uint j = 0u; j < TN; ++j) acc[i * TN + j] = fma(w, a[j], acc[i * TN + j]);
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
