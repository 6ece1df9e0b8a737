#version 450
#extension GL_GOOGLE_include_directive : require
// Quantizes f32 activation rows to 8-bit units for the integer dot products of matvec_quant
// and matmul_quant, with exactly the arithmetic of the CPU's activation quantizers
// (kernels_scalar.cpp: QuantizeQ8_0 / Q8_1 / Q8_K), so both backends dot the same codes.
// One invocation per block (32 values, or 256 for Q8_K), a sequential loop inside it as on the
// CPU (ties of the Q8_K maximum go to the first element).
//
// The rows are x itself (SOURCE 0) or, fused with the op that makes them, silu(x) * x2 (SOURCE
// 1: SwiGLU of gate x and up x2, the arithmetic of swiglu.comp) or RMSNorm(x) * x2 (SOURCE 2:
// weight x2, the arithmetic of rms_norm.comp; one workgroup per row). Fused, the f32 rows are
// also written to y, for float weights and for matrices of another activation kind. Fusing
// saves a dispatch and the barrier between them: on a GPU, decode is many small dispatches.
//
// Output per row of n values: n/4 code words (4 signed bytes each, element 4i+j in byte j of
// word i) and n/32 aux vec4 per 32-value unit: (scale d, Q8_1 sum term s, code sum of the
// unit's first 16 values, code sum of its last 16). Q8_0 and Q8_1 round d (and s) to f16 as
// their block format does; Q8_K keeps d as f32 and repeats it in its 8 units.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;   // a power of two (SOURCE 2: the norm's tree)
layout(constant_id = 1) const uint KIND = 0;  // 0: Q8_0, 1: Q8_1, 2: Q8_K
layout(constant_id = 2) const uint SOURCE = 0;

layout(push_constant) uniform Params {
  uint n;         // values per row: a multiple of 32 (of 256 for Q8_K)
  uint n_rows;
  uint x_stride;  // floats between rows of x (and of x2 for SOURCE 1)
  uint y_stride;  // floats between rows of y
  float eps;      // SOURCE 2
} p;

layout(binding = 0) readonly buffer Input { float x[]; };
layout(binding = 1) writeonly buffer Codes { uint codes[]; };  // [n_rows][n / 4]
layout(binding = 2) writeonly buffer Aux { vec4 aux[]; };      // [n_rows][n / 32]
layout(binding = 3) readonly buffer Second { float x2[]; };    // SOURCE 1: up rows; 2: weight [n]
layout(binding = 4) writeonly buffer Output { float y[]; };    // SOURCE 1, 2: the f32 rows

#include "common.glsl"

shared float partial[WG];
#include "rms_scale.glsl"

// Rounds and clamps as the CPU's NearestInt8 (clamp to +-127, then to nearest, ties to even).
int NearestInt8(float v) { return int(roundEven(clamp(v, -127.0, 127.0))); }

// Value i of row r (norm_scale: SOURCE 2's RMSNorm scale of the row).
float Value(uint r, uint i, float norm_scale) {
  const float a = x[r * p.x_stride + i];
  if (SOURCE == 1u) {
    precise float v = a / (1.0 + ExpPoly(-a)) * x2[r * p.x_stride + i];
    return v;
  }
  if (SOURCE == 2u) {
    precise float v = (a * norm_scale) * x2[i];
    return v;
  }
  return a;
}

void QuantizeBlock(uint r, uint b, float norm_scale) {
  const uint block_values = KIND == 2u ? 256u : 32u;
  const uint v0 = b * block_values;
  const uint code0 = r * (p.n / 4u) + b * (block_values / 4u);
  const uint aux0 = r * (p.n / 32u) + b * (block_values / 32u);

  float amax = 0.0;
  float vmax = 0.0;  // the value of largest magnitude, first on ties (Q8_K's sign)
  for (uint j = 0u; j < block_values; ++j) {
    const float v = Value(r, v0 + j, norm_scale);
    if (SOURCE != 0u) y[r * p.y_stride + v0 + j] = v;
    if (abs(v) > amax) {
      amax = abs(v);
      vmax = v;
    }
  }
  precise float d;
  precise float id;
  if (KIND == 2u) {
    id = amax != 0.0 ? -127.0 / vmax : 0.0;  // codes = round(id * x), so vmax maps to -127
    d = amax != 0.0 ? 1.0 / id : 0.0;
  } else {
    d = amax / 127.0;
    id = amax != 0.0 ? 127.0 / amax : 0.0;
  }
  for (uint unit = 0u; unit < block_values / 32u; ++unit) {
    int sums[2] = int[2](0, 0);
    for (uint i = 0u; i < 8u; ++i) {
      uint word = 0u;
      for (uint j = 0u; j < 4u; ++j) {
        const float v = Value(r, v0 + 32u * unit + 4u * i + j, norm_scale);  // as above: same value
        precise float scaled = KIND == 2u ? id * v : v * id;
        const int q = NearestInt8(scaled);
        sums[i / 4u] += q;
        word |= (uint(q) & 0xFFu) << (8u * j);
      }
      codes[code0 + 8u * unit + i] = word;
    }
    if (KIND == 2u) {
      aux[aux0 + unit] = vec4(d, 0.0, float(sums[0]), float(sums[1]));
    } else {
      precise float s = float(sums[0] + sums[1]) * d;  // Q8_1: from the unrounded d, as ggml
      aux[aux0 + unit] = vec4(RoundF16(d), KIND == 1u ? RoundF16(s) : 0.0, float(sums[0]), float(sums[1]));
    }
  }
}

void main() {
  const uint n_blocks = p.n / (KIND == 2u ? 256u : 32u);
  if (SOURCE == 2u) {  // one workgroup per row: the norm's scale first
    const uint tid = gl_LocalInvocationID.x, r = gl_WorkGroupID.y;
    const float scale = RmsScale(r * p.x_stride, p.n, p.eps, tid);
    for (uint b = tid; b < n_blocks; b += WG) QuantizeBlock(r, b, scale);
    return;
  }
  const uint b = gl_GlobalInvocationID.x;
  const uint r = gl_GlobalInvocationID.y;
  if (b >= n_blocks || r >= p.n_rows) return;
  QuantizeBlock(r, b, 0.0);
}
