#version 450
#extension GL_GOOGLE_include_directive : require
// y = W x with F32 weights, one invocation per output, in the summation order of the CPU's
// VecDotF32 (kernels_scalar.cpp), which is the reference engine's: rows whose length is a
// multiple of 16 use one 16-lane FMA accumulator and a pairwise tree; other lengths four
// 16-lane accumulators over 64-value steps, combined pairwise, plus the tail of float
// multiply-adds, unfused. stories260K (F32) is held to the reference within 0.02 over 536
// positions, where the order of the sums shows. F32 models are small: no tiling.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

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

layout(binding = 0) readonly buffer Weights { float w[]; };   // n_rows rows of n_in floats
layout(binding = 1) readonly buffer Input { float x[]; };     // [n_tokens][x_stride]
layout(binding = 2) buffer Output { float y[]; };             // [n_tokens][y_stride]
layout(binding = 3) readonly buffer Bias { float bias[]; };   // [y_stride] when flags & 2
layout(binding = 4) buffer Output1 { float y1[]; };                     // [n_tokens][y1_stride]: rows from seg1
layout(binding = 5) buffer Output2 { float y2[]; };                     // [n_tokens][y2_stride]: rows from seg2

// Pairwise sum of 16 lanes: width 8, 4, 2, 1.
float Tree16(float lanes[16]) {
  for (uint width = 8u; width >= 1u; width /= 2u) {
    for (uint l = 0u; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

#include "matrix_store.glsl"

void main() {
  const uint r = p.row_begin + gl_GlobalInvocationID.x;
  const uint t = p.t_begin + gl_GlobalInvocationID.y;
  if (r >= p.n_rows || t >= p.n_tokens) return;
  const uint wr = r * (p.row_bytes / 4u), xr = t * p.x_stride;
  const uint n = p.n_in;
  float v;
  if (n % 16u == 0u) {
    precise float lanes[16];
    for (uint l = 0u; l < 16u; ++l) lanes[l] = 0.0;
    for (uint i = 0u; i < n; i += 16u) {
      for (uint l = 0u; l < 16u; ++l) lanes[l] = fma(w[wr + i + l], x[xr + i + l], lanes[l]);
    }
    v = Tree16(lanes);
  } else {
    precise float acc[4][16];
    for (uint j = 0u; j < 4u; ++j) {
      for (uint l = 0u; l < 16u; ++l) acc[j][l] = 0.0;
    }
    const uint n64 = n / 64u * 64u;
    for (uint i = 0u; i < n64; i += 64u) {
      for (uint j = 0u; j < 4u; ++j) {
        for (uint l = 0u; l < 16u; ++l) {
          acc[j][l] = fma(w[wr + i + 16u * j + l], x[xr + i + 16u * j + l], acc[j][l]);
        }
      }
    }
    precise float lanes[16];
    for (uint l = 0u; l < 16u; ++l) {
      acc[0][l] += acc[2][l];
      acc[1][l] += acc[3][l];
      lanes[l] = acc[0][l] + acc[1][l];
    }
    // The tail as float multiply-adds, each rounded (the reference's accumulator there is a
    // float; a double tail moved stories260K p3 rows 446-447 by 0.025).
    precise float sum = Tree16(lanes);
    for (uint i = n64; i < n; ++i) {
      precise float prod = w[wr + i] * x[xr + i];
      sum = sum + prod;
    }
    v = sum;
  }
  StoreOutput(t, r, v);
}
