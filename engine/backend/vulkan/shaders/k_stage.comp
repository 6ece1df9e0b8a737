#version 450
#extension GL_GOOGLE_include_directive : require
// q4k keys (engine/kv/kv_format.h) of new tokens, as f16 rows (keys are not rotated), into the
// pass's key rows of one layer: the rows of the chunk still being filled, which attention reads
// as f16 and k_chunks.comp quantizes once the chunk is complete (what the CPU backend's
// PassKeys hold). One invocation per word (two values).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(push_constant) uniform Params {
  uint n_tokens;
  uint row_words;   // words per key row: row values / 2
  uint src_stride;  // floats between token rows of src
  uint src_row0;    // src row of the first token
  uint dst_row0;    // key row of the first token
} p;

layout(binding = 0) readonly buffer Source { float src[]; };  // K after RoPE
layout(binding = 1) writeonly buffer Keys { uint keys[]; };   // [rows][row_words]: f16 pairs

#include "common.glsl"

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n_tokens * p.row_words) return;
  const uint t = i / p.row_words, w = i % p.row_words;
  const uint s = (p.src_row0 + t) * p.src_stride + 2u * w;
  keys[(p.dst_row0 + t) * p.row_words + w] = F32ToF16Bits(src[s]) | (F32ToF16Bits(src[s + 1u]) << 16);
}
