#version 450
#extension GL_GOOGLE_include_directive : require
// Quantizes f32 activation rows to 8-bit units for the integer dot products of matvec_quant
// and matmul_quant, with exactly the arithmetic of the CPU's activation quantizers
// (kernels_scalar.cpp: QuantizeQ8_0 / Q8_1 / Q8_K), so both backends dot the same codes.
// One invocation per block (32 values, or 256 for Q8_K), a sequential loop inside it as on the
// CPU (ties of the Q8_K maximum go to the first element).
//
// Output per row of n values: n/4 code words (4 signed bytes each, element 4i+j in byte j of
// word i) and n/32 aux vec4 per 32-value unit: (scale d, Q8_1 sum term s, code sum of the
// unit's first 16 values, code sum of its last 16). Q8_0 and Q8_1 round d (and s) to f16 as
// their block format does; Q8_K keeps d as f32 and repeats it in its 8 units.

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint KIND = 0;  // 0: Q8_0, 1: Q8_1, 2: Q8_K

layout(push_constant) uniform Params {
  uint n;         // values per row: a multiple of 32 (of 256 for Q8_K)
  uint n_rows;
  uint x_stride;  // floats between rows of x
} p;

layout(binding = 0) readonly buffer Input { float x[]; };
layout(binding = 1) writeonly buffer Codes { uint codes[]; };  // [n_rows][n / 4]
layout(binding = 2) writeonly buffer Aux { vec4 aux[]; };      // [n_rows][n / 32]

#include "common.glsl"

// Rounds and clamps as the CPU's NearestInt8 (clamp to +-127, then to nearest, ties to even).
int NearestInt8(float v) { return int(roundEven(clamp(v, -127.0, 127.0))); }

void main() {
  const uint block_values = KIND == 2u ? 256u : 32u;
  const uint b = gl_GlobalInvocationID.x;
  const uint r = gl_GlobalInvocationID.y;
  if (b >= p.n / block_values || r >= p.n_rows) return;
  const uint x0 = r * p.x_stride + b * block_values;
  const uint code0 = r * (p.n / 4u) + b * (block_values / 4u);
  const uint aux0 = r * (p.n / 32u) + b * (block_values / 32u);

  float amax = 0.0;
  float vmax = 0.0;  // the value of largest magnitude, first on ties (Q8_K's sign)
  for (uint j = 0u; j < block_values; ++j) {
    const float v = x[x0 + j];
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
        precise float scaled = KIND == 2u ? id * x[x0 + 32u * unit + 4u * i + j] : x[x0 + 32u * unit + 4u * i + j] * id;
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
