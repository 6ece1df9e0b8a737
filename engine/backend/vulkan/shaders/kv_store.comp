#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_PHASE_CLOCK)
#extension GL_EXT_shader_realtime_clock : require
#extension GL_ARB_shader_clock : require
#endif
// Encodes new K and V rows into the sequence's KV format, in place in the device KV planes of
// one layer: per token, the row of n_head_kv heads is rotated head by head with the
// Walsh-Hadamard transform when the format rotates, then quantized group by group with the
// exact arithmetic of KvQuantizeRow (kv_format.cpp), so the device rows equal the CPU's
// encoding and can be copied back into the host blocks as they are.
// Grid: (token, segment, plane). A plane is K or V (binding pairs 0/1 and 3/4: one dispatch
// stores both). A segment is SEG_HEADS heads: the whole row, or fewer heads when their groups
// and bytes start at word boundaries, so that a decode step's few rows still spread over many
// workgroups. Invocations take a group each (f16: a word each); the encoded segment is
// assembled in shared memory (groups need not start at word boundaries) and written as whole
// words. With ROPE set, plane 0 (K) is rotated by RoPE first, with the arithmetic of rope.comp
// (its cos/sin table): the keys need no separate rope dispatch and barrier.
// q4k (KV_TYPE 4) encodes V rows here (QuantizeRowQ4k: row-wide units D and M, then per
// sub-block of KV_GROUP values the best of 16 (minimum, scale) candidates by squared error).
// Its keys are stored per channel in chunks by k_chunks.comp, not as rows: plane 0 then stages
// them, after RoPE, as the f16 rows of the pass's key rows that k_stage.comp writes (not
// rotated by the Hadamard transform), so a fused step needs no rope or k_stage dispatch.
// Mirror (push constant `mirror`, bit i for plane i): each word stored into plane i is also
// written to the host-visible write-back buffer, the row of position pos at word
// mirror_word0[i] + (pos - mirror_pos0[i]) * (words a row) for pos >= mirror_pos0[i], where the
// engine's write-back reads it after the pass: no copy command per sequence, layer and plane
// at the end of every pass (on a GPU, hundreds of small copies that wait for the last layer).
// Row table (ROW_TABLE = 1): the rows of several sequences that share a KV arena (planes,
// format, block size) in one dispatch, workgroup x taking entry entry0 + x of `rows`: its source
// row, position, block table start, key row and mirror words come from there instead of the push
// constants (a batched decode step of n agents: one kv_store a layer instead of n).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint KV_TYPE = 1;
layout(constant_id = 2) const uint KV_GROUP = 64;
layout(constant_id = 3) const uint HD = 64;          // head_dim
layout(constant_id = 4) const uint ROTATE = 0;
layout(constant_id = 5) const uint ROW_VALUES = 128; // n_head_kv * head_dim
layout(constant_id = 6) const uint ROW_WORDS = 64;   // words per device row (row bytes rounded up)
layout(constant_id = 7) const uint SEG_HEADS = 2;    // heads per workgroup (q4k: all of them)
layout(constant_id = 8) const uint ROPE = 0;         // plane 0: 0 as it is, 1 RoPE pairs (2i, 2i+1), 2 NeoX pairs (i, i + n_rot/2)
layout(constant_id = 9) const uint ROW_TABLE = 0;    // 1: each workgroup's row from `rows`

layout(push_constant) uniform Params {
  uint n_tokens;
  uint pos0;          // position of the first token
  uint src_stride;    // floats between token rows of src
  uint src_row0;      // src row of the first token (and its row of the cos/sin table)
  uint block_tokens;  // positions per KV block
  uint table0;        // this sequence's first entry in block_table
  float hadamard_scale;
  uint n_rot;         // ROPE: dimensions rotated per head
  uint stage_keys;    // q4k, 1: plane 0 is the pass's f16 key rows (else the V rows, as plane 1)
  uint key_row0;      // stage_keys: the key row of the first token
  uint mirror;        // bit i: plane i's rows also go to `mirror_words`
  uint mirror_word0[2];
  uint mirror_pos0[2];
  uint entry0;        // ROW_TABLE: the dispatch's first entry of `rows`
  uint layer;         // ROW_TABLE: the layer (an entry's mirror words are layer 0's)
} p;

// A row of a ROW_TABLE dispatch (Ops::KvStoreEntry): its mirror words are those of layer 0
// (kNotMirrored: not mirrored); layer l's lie l * mirror_layer_words further.
struct KvStoreEntry {
  uint src_row;  // src row (and cos/sin row)
  uint pos;      // position in its sequence
  uint table0;   // its sequence's first block table entry
  uint key_row;  // stage_keys: its key row
  uint mirror_word[2];
  uint mirror_layer_words;
};
const uint kNotMirrored = 0xFFFFFFFFu;  // a mirror word: the row is not mirrored

layout(binding = 0) readonly buffer Source0 { float src0[]; };     // [..][src_stride] (K)
layout(binding = 1) buffer Plane0 { uint kv_words[]; };            // [slots * block_tokens][ROW_WORDS]; stage_keys: [key rows][ROW_VALUES / 2]
layout(binding = 2) readonly buffer BlockTable { uint block_table[]; };  // block -> device slot
layout(binding = 3) readonly buffer Source1 { float src1[]; };     // (V) as plane 0
layout(binding = 4) buffer Plane1 { uint plane1[]; };
layout(binding = 5) readonly buffer CosSin { vec2 cs[]; };         // ROPE: [rows][n_rot / 2] (cos, sin)
layout(binding = 6) writeonly buffer Mirror { uint mirror_words[]; };  // host-visible: rows as in the planes
layout(binding = 7) readonly buffer Rows { KvStoreEntry rows[]; };      // ROW_TABLE: the dispatch's rows
#include "common.glsl"
#include "kv_rows.glsl"
#include "rope_pair.glsl"
#include "phase_clock.glsl"

shared float hvec[ROW_VALUES];
shared uint row_words[ROW_WORDS];

#include "hadamard.glsl"

void PutByte(uint byte_offset, uint value) { atomicOr(row_words[byte_offset >> 2], (value & 0xFFu) << ((byte_offset & 3u) * 8u)); }
void PutU16(uint byte_offset, uint value) { atomicOr(row_words[byte_offset >> 2], (value & 0xFFFFu) << ((byte_offset & 2u) * 8u)); }

const uint kSubBlocks = ROW_VALUES / KV_GROUP;
shared float sub_lo[kSubBlocks], sub_hi[kSubBlocks];

// q4k V rows (engine/kv/kv_format.h): byte offsets of sub-block j's quad of fields and codes.
uint Q4kFieldsOffset(uint j) { return 4u + (j / 4u) * (5u + 2u * KV_GROUP); }
uint Q4kCodesOffset(uint j) { return Q4kFieldsOffset(j) + 5u + (j % 4u) * (KV_GROUP / 2u); }

// The smallest f16 value >= x (x >= 0), as F16AtLeast in kv_format.cpp.
float F16AtLeast(float x) {
  uint h = F32ToF16Bits(x);
  if (F16BitsToF32(h) < x) ++h;
  return F16BitsToF32(h);
}

int Q4kCodedMin(float lo, float M) { return M > 0.0 ? clamp(int(floor(Div(lo, M))), -15, 15) : 0; }

// Q4kCode of kv_format.cpp: the squared error of sub-block values hvec[v0 ..] coded as m + d*q,
// summed in 4 lanes (value i into lane i % 4) and reduced as (0 + 2) + (1 + 3); q rounds half up.
float Q4kError(uint v0, float m, float d) {
  const float id = d > 0.0 ? Div(1.0, d) : 0.0;
  precise float lanes[4] = float[4](0.0, 0.0, 0.0, 0.0);
  for (uint i = 0u; i < KV_GROUP; ++i) {
    precise float t = min(max((hvec[v0 + i] - m) * id, 0.0), 15.0);
    precise float q = float(int(t + 0.5));
    precise float e = hvec[v0 + i] - (m + d * q);
    lanes[i % 4u] += e * e;
  }
  precise float err = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
  return err;
}

// Per sub-block: its coded minimum mn0, span, first scale step sc0 and chosen candidate. The 16
// candidates (a, b), in QuantizeRowQ4k's order (a outer), are tried in waves of kWaveBlocks
// sub-blocks, one candidate an invocation: sub-block j0 + i's candidate c at [i * 16 + c].
const uint kCandidates = 16u;
const uint kWaveBlocks = WG / kCandidates > 0u ? WG / kCandidates : 1u;
const uint kQ4kSubBlocks = KV_TYPE == kKvQ4K ? kSubBlocks : 1u;  // (other formats: no room taken)
const uint kQ4kWave = KV_TYPE == kKvQ4K ? kWaveBlocks : 1u;
shared int sub_mn0[kQ4kSubBlocks], sub_sc0[kQ4kSubBlocks];
shared float sub_span[kQ4kSubBlocks];
shared uint sub_best[kQ4kSubBlocks];
shared float candidate_err[kQ4kWave * kCandidates];

// QuantizeRowQ4k's arithmetic, spread over the workgroup: every step is a sub-block or a
// candidate an invocation (a decode step has one V row a layer, so a row encoded by one
// invocation per sub-block, 16 candidates and three exact divisions one after another, was a
// serial chain: 72 us a dispatch on an H200, a third of a q4k decode step). The row-wide maxima
// do not depend on the order, and each candidate's error and the choice among them are
// computed as before, so the bytes are the same.
void EncodeQ4kRow(uint tid) {
  for (uint j = tid; j < kSubBlocks; j += WG) {
    float lo = hvec[j * KV_GROUP], hi = lo;
    for (uint i = 1u; i < KV_GROUP; ++i) {
      lo = min(lo, hvec[j * KV_GROUP + i]);
      hi = max(hi, hvec[j * KV_GROUP + i]);
    }
    sub_lo[j] = lo;
    sub_hi[j] = hi;
  }
  barrier();
  MarkPhase(4u);
  // Row-wide units (every invocation computes them; maxima do not depend on the order).
  float max_abs_lo = 0.0;
  for (uint j = 0u; j < kSubBlocks; ++j) max_abs_lo = max(max_abs_lo, abs(sub_lo[j]));
  precise float m_unit = Div(max_abs_lo, 15.0);
  const float M = F16AtLeast(m_unit);
  for (uint j = tid; j < kSubBlocks; j += WG) {
    const int mn0 = Q4kCodedMin(sub_lo[j], M);
    precise float span = sub_hi[j] - M * float(mn0);
    sub_mn0[j] = mn0;
    sub_span[j] = span;
  }
  barrier();
  MarkPhase(5u);
  float max_span = 0.0;
  for (uint j = 0u; j < kSubBlocks; ++j) max_span = max(max_span, sub_span[j]);
  precise float d_unit = Div(max_span, 465.0);  // 15 levels x 31 scale steps
  const float D = F16AtLeast(d_unit);
  if (tid == 0u) {
    PutU16(0u, F32ToF16Bits(D));
    PutU16(2u, F32ToF16Bits(M));
  }
  for (uint j = tid; j < kSubBlocks; j += WG) {
    precise float m0 = M * float(sub_mn0[j]);
    precise float steps = Div(sub_hi[j] - m0, 15.0 * D);
    sub_sc0[j] = D > 0.0 ? clamp(int(ceil(steps)), 0, 31) : 0;
  }
  barrier();
  MarkPhase(6u);
  for (uint j0 = 0u; j0 < kSubBlocks; j0 += kWaveBlocks) {  // (the same trip count everywhere)
    const uint n = min(kWaveBlocks, kSubBlocks - j0);
    for (uint x = tid; x < n * kCandidates; x += WG) {
      const uint j = j0 + x / kCandidates, c = x % kCandidates;
      const int mn = min(sub_mn0[j] + int(c / 4u), 15), sc = max(sub_sc0[j] - int(c % 4u), 0);
      precise float m = M * float(mn);
      precise float d = D * float(sc);
      candidate_err[x] = Q4kError(j * KV_GROUP, m, d);
    }
    barrier();
    for (uint i = tid; i < n; i += WG) {
      // The first candidate of least error, as the CPU's loop keeps it.
      uint best_c = 0u;
      float best = candidate_err[i * kCandidates];
      for (uint c = 1u; c < kCandidates; ++c) {
        const float err = candidate_err[i * kCandidates + c];
        if (err < best) {
          best = err;
          best_c = c;
        }
      }
      sub_best[j0 + i] = best_c;
    }
    barrier();
  }
  MarkPhase(7u);
  for (uint j = tid; j < kSubBlocks; j += WG) {
    const uint v0 = j * KV_GROUP, best_c = sub_best[j];
    const int best_mn = min(sub_mn0[j] + int(best_c / 4u), 15), best_sc = max(sub_sc0[j] - int(best_c % 4u), 0);
    const uint k = j % 4u, field = uint(best_sc) | (uint(best_mn + 15) << 5);
    const uint at = Q4kFieldsOffset(j) + (10u * k) / 8u, bits = field << ((10u * k) % 8u);
    PutByte(at, bits);
    PutByte(at + 1u, bits >> 8);
    precise float m = M * float(best_mn);
    precise float d = D * float(best_sc);
    const float id = d > 0.0 ? Div(1.0, d) : 0.0;
    for (uint i = 0u; i < KV_GROUP; i += 2u) {
      precise float t0 = min(max((hvec[v0 + i] - m) * id, 0.0), 15.0);
      precise float t1 = min(max((hvec[v0 + i + 1u] - m) * id, 0.0), 15.0);
      PutByte(Q4kCodesOffset(j) + i / 2u, uint(int(t0 + 0.5)) | (uint(int(t1 + 0.5)) << 4));
    }
  }
}

const uint kSegValues = SEG_HEADS * HD;

void main() {
  // Words of a segment: of the whole row (with its padding), or of whole groups that end at a
  // word boundary (checked on the host).
  MarkPhase(0u);
  const uint tid = gl_LocalInvocationID.x;
  const uint t = gl_WorkGroupID.x, seg = gl_WorkGroupID.y, plane = gl_WorkGroupID.z;
  // This workgroup's row: from the push constants (a run of one sequence's tokens) or its entry.
  uint src_row = p.src_row0 + t, pos = p.pos0 + t, table0 = p.table0, key_row = p.key_row0 + t;
  uint mirror_word = kNotMirrored;  // where the row starts in the mirror
  if (ROW_TABLE != 0u) {
    const KvStoreEntry e = rows[p.entry0 + t];
    src_row = e.src_row;
    pos = e.pos;
    table0 = e.table0;
    key_row = e.key_row;
    if ((p.mirror & (1u << plane)) != 0u && e.mirror_word[plane] != kNotMirrored) {
      mirror_word = e.mirror_word[plane] + p.layer * e.mirror_layer_words;
    }
  }
  const bool stage_keys = KV_TYPE == kKvQ4K && plane == 0u && p.stage_keys != 0u;  // (q4k: one segment a row)
  const uint seg_words = stage_keys                 ? ROW_VALUES / 2u
                         : kSegValues == ROW_VALUES ? ROW_WORDS
                                                    : kSegValues / KV_GROUP * KvGroupBytes() / 4u;
  const uint src0_at = src_row * p.src_stride + seg * kSegValues;
  for (uint i = tid; i < kSegValues; i += WG) hvec[i] = plane == 0u ? src0[src0_at + i] : src1[src0_at + i];
  for (uint i = tid; i < (stage_keys ? 0u : seg_words); i += WG) row_words[i] = 0u;
  barrier();
  MarkPhase(1u);
  if (ROPE != 0u && plane == 0u) {
    const uint half_rot = p.n_rot / 2u;
    for (uint k = tid; k < SEG_HEADS * half_rot; k += WG) {
      const uint i = k % half_rot, at = (k / half_rot) * HD;
      const uvec2 dims = RopePairDims(i, half_rot, ROPE == 2u);
      const uint a = at + dims.x, b = at + dims.y;
      const vec2 c = cs[src_row * half_rot + i];
      const float x0 = hvec[a], x1 = hvec[b];
      const vec2 r = RopePair(x0, x1, c);
      hvec[a] = r.x;
      hvec[b] = r.y;
    }
    barrier();
  }
  MarkPhase(2u);
  // (stage_keys is the same for the whole workgroup, so the barriers below stay uniform.)
  if (ROTATE != 0u && !stage_keys) HadamardShared(SEG_HEADS, HD, p.hadamard_scale, tid, WG);
  MarkPhase(3u);

  if (KV_TYPE == kKvQ4K && !stage_keys) EncodeQ4kRow(tid);
  if (KV_TYPE == kKvF16) {  // a word (two values) per invocation: no shared atomics
    for (uint i = tid; i < kSegValues / 2u; i += WG) {
      row_words[i] = F32ToF16Bits(hvec[2u * i]) | (F32ToF16Bits(hvec[2u * i + 1u]) << 16);
    }
  }
  const uint group_bytes = KvGroupBytes();
  const uint n_groups = KV_TYPE == kKvQ8 || KV_TYPE == kKvQ4 ? kSegValues / KV_GROUP : 0u;
  for (uint g = tid; g < n_groups; g += WG) {
    const uint v0 = g * KV_GROUP, at = g * group_bytes;
    if (KV_TYPE == kKvQ8) {
      float amax = 0.0;
      for (uint i = 0u; i < KV_GROUP; ++i) amax = max(amax, abs(hvec[v0 + i]));
      const uint dh = F32ToF16Bits(Div(amax, 127.0));
      const float d = F16BitsToF32(dh);
      const float id = d > 0.0 ? Div(1.0, d) : 0.0;
      PutU16(at, dh);
      for (uint i = 0u; i < KV_GROUP; ++i) {
        precise float scaled = hvec[v0 + i] * id;
        PutByte(at + 2u + i, uint(int(clamp(RoundHalfEven(scaled), -127.0, 127.0))));
      }
    } else {
      float lo = hvec[v0], hi = hvec[v0];
      for (uint i = 1u; i < KV_GROUP; ++i) {
        lo = min(lo, hvec[v0 + i]);
        hi = max(hi, hvec[v0 + i]);
      }
      const Q4Coding c = Q4CodingOf(lo, hi);
      PutU16(at, c.dh);
      PutU16(at + 2u, c.mh);
      for (uint i = 0u; i < KV_GROUP; i += 2u) {
        PutByte(at + 4u + i / 2u, Q4Code(hvec[v0 + i], c) | (Q4Code(hvec[v0 + i + 1u], c) << 4));
      }
    }
  }
  barrier();
  MarkPhase(8u);
  // Where this position's row starts in the mirror, in words (when mirrored).
  if (ROW_TABLE == 0u && (p.mirror & (1u << plane)) != 0u && pos >= p.mirror_pos0[plane]) {
    const uint mirror_row_words = stage_keys ? seg_words : ROW_WORDS;
    mirror_word = p.mirror_word0[plane] + (pos - p.mirror_pos0[plane]) * mirror_row_words;
  }
  const bool mirrored = mirror_word != kNotMirrored;
  if (stage_keys) {  // straight from hvec: the key row is larger than row_words
    for (uint i = tid; i < seg_words; i += WG) {
      const uint w = F32ToF16Bits(hvec[2u * i]) | (F32ToF16Bits(hvec[2u * i + 1u]) << 16);
      kv_words[key_row * seg_words + i] = w;
      if (mirrored) mirror_words[mirror_word + i] = w;
    }
    MarkPhase(9u);
    return;
  }
  const uint slot = block_table[table0 + pos / p.block_tokens];
  const uint row0 = (slot * p.block_tokens + pos % p.block_tokens) * ROW_WORDS + seg * seg_words;
  for (uint i = tid; i < seg_words; i += WG) {
    if (plane == 0u) {
      kv_words[row0 + i] = row_words[i];
    } else {
      plane1[row0 + i] = row_words[i];
    }
    if (mirrored) mirror_words[mirror_word + seg * seg_words + i] = row_words[i];
  }
  MarkPhase(9u);
}
