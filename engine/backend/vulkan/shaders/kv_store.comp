#version 450
#extension GL_GOOGLE_include_directive : require
// Encodes new K (or V) rows into the sequence's KV format, in place in the device KV plane of
// one layer: per token, the row of n_head_kv heads is rotated head by head with the
// Walsh-Hadamard transform when the format rotates, then quantized group by group with the
// exact arithmetic of KvQuantizeRow (kv_format.cpp), so the device rows equal the CPU's
// encoding and can be copied back into the host blocks as they are.
// One workgroup per token; one invocation per group; the encoded row is assembled in shared
// memory (groups need not start at word boundaries) and written as whole words.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint KV_TYPE = 1;
layout(constant_id = 2) const uint KV_GROUP = 64;
layout(constant_id = 3) const uint HD = 64;          // head_dim
layout(constant_id = 4) const uint ROTATE = 0;
layout(constant_id = 5) const uint ROW_VALUES = 128; // n_head_kv * head_dim
layout(constant_id = 6) const uint ROW_WORDS = 64;   // words per device row (row bytes rounded up)

layout(push_constant) uniform Params {
  uint n_tokens;
  uint pos0;          // position of the first token
  uint src_stride;    // floats between token rows of src
  uint src_row0;      // src row of the first token
  uint block_tokens;  // positions per KV block
  uint table0;        // this sequence's first entry in block_table
  float hadamard_scale;
} p;

layout(binding = 0) readonly buffer Source { float src[]; };       // [..][src_stride] after RoPE
layout(binding = 1) buffer Plane { uint kv_words[]; };             // [slots * block_tokens][ROW_WORDS]
layout(binding = 2) readonly buffer BlockTable { uint block_table[]; };  // block -> device slot

#include "common.glsl"
#include "kv_rows.glsl"

shared float hvec[ROW_VALUES];
shared uint row_words[ROW_WORDS];

#include "hadamard.glsl"

void PutByte(uint byte_offset, uint value) { atomicOr(row_words[byte_offset >> 2], (value & 0xFFu) << ((byte_offset & 3u) * 8u)); }
void PutU16(uint byte_offset, uint value) { atomicOr(row_words[byte_offset >> 2], (value & 0xFFFFu) << ((byte_offset & 2u) * 8u)); }

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint t = gl_WorkGroupID.x;
  for (uint i = tid; i < ROW_VALUES; i += WG) hvec[i] = src[(p.src_row0 + t) * p.src_stride + i];
  for (uint i = tid; i < ROW_WORDS; i += WG) row_words[i] = 0u;
  barrier();
  if (ROTATE != 0u) HadamardShared(ROW_VALUES / HD, HD, p.hadamard_scale, tid, WG);

  const uint group_bytes = KvGroupBytes();
  for (uint g = tid; g < ROW_VALUES / KV_GROUP; g += WG) {
    const uint v0 = g * KV_GROUP, at = g * group_bytes;
    if (KV_TYPE == kKvF16) {
      for (uint i = 0u; i < KV_GROUP; ++i) PutU16(at + 2u * i, F32ToF16Bits(hvec[v0 + i]));
    } else if (KV_TYPE == kKvQ8) {
      float amax = 0.0;
      for (uint i = 0u; i < KV_GROUP; ++i) amax = max(amax, abs(hvec[v0 + i]));
      const uint dh = F32ToF16Bits(amax / 127.0);
      const float d = F16BitsToF32(dh);
      const float id = d > 0.0 ? 1.0 / d : 0.0;
      PutU16(at, dh);
      for (uint i = 0u; i < KV_GROUP; ++i) {
        precise float scaled = hvec[v0 + i] * id;
        PutByte(at + 2u + i, uint(int(clamp(roundEven(scaled), -127.0, 127.0))));
      }
    } else {
      float lo = hvec[v0], hi = hvec[v0];
      for (uint i = 1u; i < KV_GROUP; ++i) {
        lo = min(lo, hvec[v0 + i]);
        hi = max(hi, hvec[v0 + i]);
      }
      // Codes against the f16-rounded scale and minimum that decoding uses.
      const uint mh = F32ToF16Bits(lo);
      const float m = F16BitsToF32(mh);
      precise float range = (hi - m) / 15.0;
      const uint dh = F32ToF16Bits(range);
      const float d = F16BitsToF32(dh);
      const float id = d > 0.0 ? 1.0 / d : 0.0;
      PutU16(at, dh);
      PutU16(at + 2u, mh);
      for (uint i = 0u; i < KV_GROUP; i += 2u) {
        precise float s0 = (hvec[v0 + i] - m) * id;
        precise float s1 = (hvec[v0 + i + 1u] - m) * id;
        const uint q0 = uint(clamp(roundEven(s0), 0.0, 15.0));
        const uint q1 = uint(clamp(roundEven(s1), 0.0, 15.0));
        PutByte(at + 4u + i / 2u, q0 | (q1 << 4));
      }
    }
  }
  barrier();
  const uint pos = p.pos0 + t;
  const uint slot = block_table[p.table0 + pos / p.block_tokens];
  const uint row0 = (slot * p.block_tokens + pos % p.block_tokens) * ROW_WORDS;
  for (uint i = tid; i < ROW_WORDS; i += WG) kv_words[row0 + i] = row_words[i];
}
