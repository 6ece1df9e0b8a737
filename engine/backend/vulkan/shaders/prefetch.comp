#version 450
#extension GL_GOOGLE_include_directive : require
// Reads a range of a buffer so that its bytes are in the device's last-level cache when the
// next matrix-vector product streams them (Ops::Prefetch). A decode step alternates dispatches
// that stream weights at full memory bandwidth with short ones (attention, norms) during
// which the memory sits idle; recorded beside those, without a barrier between, this moves the
// next matrices' first bytes while the memory would otherwise wait.
//
// The loads must not be dropped as dead code, so their words are folded by XOR and each
// workgroup XORs its fold into sink[0]: the sink ends up holding the XOR of every word read
// (plus whatever it held), which is also what the test checks. One atomic per workgroup.
// Grid: a fixed number of workgroups (few enough to sit beside the short dispatch on the
// device, not to queue in front of it), each invocation LOADS independent 16-byte loads in
// flight per round, consecutive invocations at consecutive addresses.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint LOADS = 8;  // loads in flight per invocation

layout(push_constant) uniform Params {
  uint first;  // first 16-byte word of the range
  uint count;  // 16-byte words in the range
} p;

layout(binding = 0) readonly buffer Data { uvec4 data[]; };
layout(binding = 1) buffer Sink { uint sink[]; };

shared uint folds[WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint stride = gl_NumWorkGroups.x * WG;  // invocations in the grid
  uint fold = 0u;
  for (uint i0 = gl_WorkGroupID.x * WG + tid; i0 < p.count; i0 += stride * LOADS) {
    uvec4 v[LOADS];
    for (uint k = 0u; k < LOADS; ++k) {
      const uint i = i0 + k * stride;
      v[k] = i < p.count ? data[p.first + i] : uvec4(0u);
    }
    for (uint k = 0u; k < LOADS; ++k) fold ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  folds[tid] = fold;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1) {
    if (tid < s) folds[tid] ^= folds[tid + s];
    barrier();
  }
  if (tid == 0u) atomicXor(sink[0], folds[0]);
}
