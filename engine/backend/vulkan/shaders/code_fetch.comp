#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// What a device charges for the size of a shader's code (kvfs bench dispatch): one workgroup
// runs a chain of STEPS dependent multiply-adds, as straight-line code (UNROLLED 1: about 2 x
// STEPS instructions to fetch) or as a loop of a few instructions (UNROLLED 0: the same chain).
// Both wait on the same arithmetic latencies, so the difference is what fetching the straight
// code costs. A decode step runs its short shaders (kv_store, attention, the norms: thousands
// of instructions each) in a few workgroups, each on a multiprocessor whose instruction cache
// last held another pipeline's code; SALT makes pipelines of the same length with different
// code, so that a pass can cycle through several, as a step does.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 32;
layout(constant_id = 1) const uint STEPS = 1024;
layout(constant_id = 2) const uint UNROLLED = 1;
layout(constant_id = 3) const uint SALT = 0;

layout(push_constant) uniform Params {
  float a;  // the chain's factor (push constants: nothing folds at compile time)
  float b;  // a value the chain never reaches: the store below never happens but stays
} p;

layout(binding = 0) writeonly buffer Sink { float sink[]; };

void main() {
  float x = float(gl_LocalInvocationID.x);
  const float salt = float(SALT);
  if (UNROLLED != 0u) {
    [[unroll]] for (uint i = 0u; i < STEPS; ++i) x = x * p.a + (float(i) + salt);
  } else {
    [[dont_unroll]] for (uint i = 0u; i < STEPS; ++i) x = x * p.a + (float(i) + salt);
  }
  if (x == p.b) sink[gl_LocalInvocationID.x] = x;
}
