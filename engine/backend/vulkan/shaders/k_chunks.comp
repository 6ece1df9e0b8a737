#version 450
#extension GL_GOOGLE_include_directive : require
// q4k keys (engine/kv/kv_format.h): encodes complete chunks of CHUNK tokens from the pass's f16
// key rows into the K plane of their KV blocks, one channel record (f16 d, f16 m, CHUNK / 2
// bytes of nibbles) per invocation, with the arithmetic of the q4 groups (Q4CodingOf, as
// KvQuantizeKChunk does), so the device chunks equal the CPU's bytes.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint CHUNK = 64;

layout(push_constant) uniform Params {
  uint n_channels;    // values per key row
  uint chunk0;        // first chunk to encode (positions chunk0 * CHUNK ..)
  uint n_chunks;
  uint key_row0;      // key row of position key_pos0
  uint key_pos0;
  uint block_tokens;  // positions per KV block
  uint table0;        // this sequence's first entry in block_table
  uint slot_words;    // words of one slot's K plane (block_tokens / CHUNK chunks)
} p;

layout(binding = 0) readonly buffer Keys { uint keys[]; };             // [rows][n_channels / 2]: f16 pairs
layout(binding = 1) writeonly buffer Plane { uint kv_words[]; };       // K planes of this layer
layout(binding = 2) readonly buffer BlockTable { uint block_table[]; };

#include "common.glsl"

float Key(uint row, uint ch) {
  const uint w = keys[row * (p.n_channels / 2u) + ch / 2u];
  return F16BitsToF32((ch & 1u) != 0u ? (w >> 16) : (w & 0xFFFFu));
}

void main() {
  const uint ch = gl_GlobalInvocationID.x, c = p.chunk0 + gl_GlobalInvocationID.y;
  if (ch >= p.n_channels || gl_GlobalInvocationID.y >= p.n_chunks) return;
  const uint row0 = p.key_row0 + c * CHUNK - p.key_pos0;
  float lo = Key(row0, ch), hi = lo;
  for (uint t = 1u; t < CHUNK; ++t) {
    lo = min(lo, Key(row0 + t, ch));
    hi = max(hi, Key(row0 + t, ch));
  }
  const Q4Coding q4 = Q4CodingOf(lo, hi);
  const uint record_words = (4u + CHUNK / 2u) / 4u;
  const uint pos = c * CHUNK;
  const uint slot = block_table[p.table0 + pos / p.block_tokens];
  const uint at = slot * p.slot_words + (pos % p.block_tokens) / CHUNK * p.n_channels * record_words + ch * record_words;
  kv_words[at] = q4.dh | (q4.mh << 16);
  for (uint k = 0u; k < CHUNK / 8u; ++k) {
    uint word = 0u;
    for (uint j = 0u; j < 8u; ++j) word |= Q4Code(Key(row0 + 8u * k + j, ch), q4) << (4u * j);
    kv_words[at + 1u + k] = word;
  }
}
