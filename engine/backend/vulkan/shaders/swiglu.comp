#version 450
#extension GL_GOOGLE_include_directive : require
// SwiGLU: out = silu(gate) * up = gate / (1 + exp(-gate)) * up, element-wise, with the CPU's
// exp polynomial (it uses the same one for all but a row's last n mod 16 values).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(push_constant) uniform Params {
  uint n;  // values (rows * n_ff)
} p;

layout(binding = 0) readonly buffer Gate { float gate[]; };
layout(binding = 1) readonly buffer Up { float up[]; };
layout(binding = 2) writeonly buffer Output { float y[]; };

#include "common.glsl"

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * WG;
  if (i >= p.n) return;
  y[i] = SwiGluOf(gate[i], up[i]);
}
