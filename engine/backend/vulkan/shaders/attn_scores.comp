#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_PHASE_CLOCK)
#extension GL_EXT_shader_realtime_clock : require
#extension GL_ARB_shader_clock : require
#endif
// Attention scores of one sequence's query tokens against its K rows, read in the stored KV
// format straight from the device KV plane of the layer (dequantized here, never expanded):
//   scores[t][h][p] = q(t, h) . K(p, h / group)   for p <= pos0 + t (causal)
// The query is rotated by the Walsh-Hadamard transform when the format rotates (so Q.K is that
// of the unrotated vectors) and rounded to f16 for an f16 cache, as the CPU backend does; for
// q4 keys it is quantized to int8 blocks (below), as the CPU backend does too.
// Workgroup = WG positions of QT query tokens by QH query heads (all of one KV head): each
// invocation is one position and loads its key once for all QT x QH queries, then scores them
// one after another, each with the arithmetic (and so the bits) of a workgroup of one query.
// Prefill takes several tokens a workgroup: every key row is read once per tile of queries
// instead of once per query, and there are QT x QH times fewer workgroups, each of which
// prepares its queries once. The block table maps position p to the device slot of its KV block.
// With STATS, each workgroup also writes its share of the row's softmax for attn_output's fused
// path: the max m of scale * s over its visible positions and the sum of exp(scale * s - m)
// (ExpPoly, as softmax.comp), so no pass over the whole row is needed before the weighted sum.
// With ROPE, the query is rotated by RoPE first, with the arithmetic of rope.comp (its cos/sin
// table, whose rows are q's rows): the queries need no rope dispatch of their own.
// With NEW_KEYS (decode: at most NEW_KEYS query tokens, f16 keys or q4k's staged ones), the keys
// of the call's own tokens (positions pos0 ..) come from the q|k|v matrix's K rows (rows = q's
// rows), made here as kv_store stores them (RoPE, then f16), not from the cache: kv_store then
// runs beside this dispatch, with no barrier between.
// JOBS: the workgroups of several calls (sequences of a pass sharing the K plane) run as one
// dispatch (jobs.glsl): a decode step of n agents records one attn_scores a layer, not n.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint KV_TYPE = 1;
layout(constant_id = 2) const uint KV_GROUP = 64;
layout(constant_id = 3) const uint HD = 64;  // head_dim
layout(constant_id = 4) const uint ROTATE = 0;
layout(constant_id = 5) const uint CHUNK = 64;  // q4k: tokens per K chunk (= WG for q4k)
layout(constant_id = 6) const uint STATS = 0;   // 1: write the workgroup's softmax share (above)
layout(constant_id = 7) const uint ROPE = 0;    // 0: q as it is, 1 RoPE pairs (2i, 2i+1), 2 NeoX pairs (i, i + n_rot/2)
layout(constant_id = 8) const uint QT = 1;      // query tokens per workgroup
layout(constant_id = 9) const uint QH = 1;      // query heads per workgroup, of one KV head (QH divides group)
layout(constant_id = 10) const uint NEW_KEYS = 0;  // see above; 0: every key from the cache
layout(constant_id = 11) const uint JOBS = 0;      // 1: the calls of `jobs` (jobs.glsl)
const uint NQ = QT * QH;                        // queries per workgroup: query i is token i / QH, head i % QH

struct Params {
  uint pos0;          // position of query token 0
  uint n_head;
  uint group;         // query heads per KV head
  uint q_stride;      // floats between token rows of q
  uint q_row0;        // q row of query token 0
  uint score_stride;  // floats per score row (>= positions the last token sees)
  uint block_tokens;  // positions per KV block
  uint row_stride;    // bytes between device KV rows
  uint table0;        // this sequence's first entry in block_table
  float hadamard_scale;
  // q4k: complete chunks are read from the K plane (slot_words per slot), the keys of a query's
  // incomplete chunk from the pass's f16 key rows (row key_row0 holds position key_pos0).
  uint slot_words;
  uint n_channels;    // values per key row
  uint key_row0;
  uint key_pos0;
  float scale;        // STATS: the softmax's 1 / sqrt(head_dim)
  uint stats_stride;  // STATS: entries per (token, head) row of stats
  // Where this call's rows start in the scratch buffers (several sequences' attention share
  // them within one pass): floats of scores, entries of stats.
  uint score0;
  uint stats0;
  uint n_rot;         // ROPE: dimensions rotated per head
  uint n_tokens;      // query tokens of this call
  uint k_stride;      // NEW_KEYS: floats between rows of k_new
};

layout(binding = 0) readonly buffer Queries { float q[]; };             // [..][q_stride]
layout(binding = 1) readonly buffer Plane { uint kv_words[]; };         // K rows of this layer
layout(binding = 1) readonly buffer PlaneVec4 { uvec4 kv_vec4[]; };     // the same, 16 bytes a load
layout(binding = 2) readonly buffer BlockTable { uint block_table[]; };
layout(binding = 3) writeonly buffer Scores { float scores[]; };        // from score0: [n_tokens][n_head][score_stride]
layout(binding = 4) readonly buffer Keys { uint key_words[]; };         // q4k: [rows][n_channels / 2] f16 pairs
layout(binding = 4) readonly buffer KeysVec4 { uvec4 key_vec4[]; };     // the same, 16 bytes a load
layout(binding = 5) writeonly buffer Stats { vec2 stats[]; };           // STATS, from stats0: [n_tokens][n_head][stats_stride] (m, sum)
layout(binding = 6) readonly buffer CosSin { vec2 cs[]; };              // ROPE: [q rows][n_rot / 2] (cos, sin)
layout(binding = 7) readonly buffer NewKeys { float k_new[]; };         // NEW_KEYS: [q rows][k_stride], before RoPE
const uint kJobsBinding = 8;
const uint kJobsFlatDim = 0;  // a call's workgroups along x and z are numbered along x
#include "jobs.glsl"

#include "common.glsl"
#include "kv_rows.glsl"
#include "rope_pair.glsl"
#include "phase_clock.glsl"

// The queries (query i at hvec[i * HD]), prepared as the format asks: RoPE, rotation, f16.
shared float hvec[NQ * HD];
// STATS: the queries' trees of maxima and sums, query i's at [i * WG] (WG is a power of two).
shared float stat_max[WG * STATS * NQ + 1u], stat_sum[WG * STATS * NQ + 1u];

#include "hadamard.glsl"

// Query i's token, head and visible positions. The queries of a part tile (tokens past the
// call's last) repeat its last token: they are computed like the others and never written.
uint QueryToken(uint i) { return min(group_id.z * QT + i / QH, p.n_tokens - 1u); }
bool QueryReal(uint i) { return group_id.z * QT + i / QH < p.n_tokens; }
uint QueryHead(uint i) { return group_id.y * QH + i % QH; }
uint QueryVisible(uint i) { return p.pos0 + QueryToken(i) + 1u; }

// q4 keys take the int8-query path of the CPU backend (engine/backend/cpu/attention.h), with
// the same arithmetic: the query cut into blocks of 32, each quantized with a power-of-two scale
// (exact: every implementation gets the same codes), integer sums against the centred key
// codes, then t_b = fma(m + 8d, qsum_b, float(isum_b) * (d * sq_b)), added left to right.
// (A product, not &&: glslang turns && of specialization constants into branches, which
// spirv-val rejects once the flag is read outside main.)
const bool kInt8Queries = uint(KV_TYPE == kKvQ4) * uint(HD % 32u == 0u) * uint(KV_GROUP % 32u == 0u) != 0u;
const uint kBlocks = HD / 32u + 1u;  // per query: + 1, never an empty array
// Query i's codes, 4 signed bytes a word (element 4w + k in byte k of word w) at [i * HD / 4]:
// a position's 32 products of a block take 8 shared loads a query, not 32.
shared uint qcode4[NQ * (HD / 4u) * uint(kInt8Queries) + 1u];
shared float qscale[NQ * kBlocks], qsum[NQ * kBlocks];  // query i's block b at [i * kBlocks + b]
shared int qcode_sum[NQ * kBlocks];

void QuantizeQueryBlocks(uint tid) {
  for (uint x = tid; x < NQ * kBlocks; x += WG) {
    const uint i = x / kBlocks, b = x % kBlocks;
    if (b >= HD / 32u) continue;
    const uint v = i * HD + 32u * b;
    precise float amax = 0.0, sum = 0.0;
    for (uint j = 0u; j < 32u; ++j) {
      amax = max(amax, abs(hvec[v + j]));
      sum += hvec[v + j];
    }
    const int e = Int8ScaleExponent(amax);
    int code_sum = 0;
    uint word = 0u;
    for (uint j = 0u; j < 32u; ++j) {
      const int code = Int8Code(hvec[v + j], amax, e);
      word |= (uint(code) & 0xFFu) << (8u * (j & 3u));
      if ((j & 3u) == 3u) {
        qcode4[(v + j) / 4u] = word;
        word = 0u;
      }
      code_sum += code;
    }
    qscale[x] = Int8Scale(amax, e);
    qsum[x] = sum;
    qcode_sum[x] = code_sum;
  }
}

// q4k keys (engine/backend/cpu/attention.h, DotChunks): a workgroup is one chunk. A chunk the
// query sees whole is scored from its records as the CPU's integer path does: per chunk the
// query times the channel scales, a_c = q_c d_c, quantized to int8 per block of 32 channels,
// base = sum_c fma(q_c, m_c + 8 d_c) in 16 lanes reduced pairwise, then per token
// score = base, score = fma(float(isum_b), sa_b, score) for each block. (Head sizes that are not
// a multiple of 32 dot the decoded keys in float.) Keys of the query's incomplete chunk are the
// pass's f16 rows.
const bool kChunksInt8 = uint(KV_TYPE == kKvQ4K) * uint(HD % 32u == 0u) != 0u;
shared float chunk_d[HD], chunk_m[HD];
shared int chunk_code[NQ * HD * uint(kChunksInt8) + 1u];  // int8 codes of a_c, query i's at [i * HD]
shared float chunk_scale[NQ * kBlocks];
shared float chunk_base[NQ];

uint ChunkRecord(uint chunk, uint ch) {  // byte offset of channel ch's record
  const uint pos = chunk * CHUNK, record = 4u + CHUNK / 2u;
  const uint slot = block_table[p.table0 + pos / p.block_tokens];
  return slot * p.slot_words * 4u + ((pos % p.block_tokens) / CHUNK * p.n_channels + ch) * record;
}

uint ChunkCode(uint record, uint t) {
  const uint b = KvU8(record + 4u + t / 2u);
  return (t & 1u) != 0u ? (b >> 4) : (b & 15u);
}

// Whether query i sees chunk `chunk` whole (else its keys there are the staged f16 rows).
bool ChunkWhole(uint chunk, uint i) { return (chunk + 1u) * CHUNK <= QueryVisible(i) / CHUNK * CHUNK; }

// The chunk's query codes are made in two steps spread over the workgroup (one invocation per
// query and block walked 32 channels twice, and one per query all HD channels for the base: a
// serial chain in every chunk workgroup): first each part of 8 channels its largest |a_c| and
// each of a query's 16 base lanes its sum, then each part its codes from its block's 4 parts'
// maximum (a maximum is the same whatever the order) and each query its base from its lanes,
// pairwise as before. Every value is computed as the CPU computes it, so the bits are too.
const uint kPartValues = 8u;  // channels per part (a block of 32 has 4)
shared float chunk_part_amax[NQ * (HD / kPartValues) * uint(kChunksInt8) + 1u];  // query i's part x at i * HD / 8 + x
shared float chunk_base_lane[NQ * 16u * uint(kChunksInt8) + 1u];                 // query i's lane l at i * 16 + l

// Barriers in uniform control flow only: every invocation runs them, `whole` says whether there
// is a chunk to prepare (some query sees it whole).
void PrepareChunk(uint chunk, uint first, uint tid, bool whole) {
  for (uint c = tid; whole && c < HD; c += WG) {
    const uint record = ChunkRecord(chunk, first + c);
    chunk_d[c] = F16BitsToF32(KvU16(record));
    chunk_m[c] = F16BitsToF32(KvU16(record + 2u));
  }
  barrier();
  if (whole && kChunksInt8) {
    for (uint x = tid; x < NQ * (HD / kPartValues); x += WG) {
      const uint v = x * kPartValues, c0 = v % HD;  // query v / HD's channels c0 .. c0 + 7
      float amax = 0.0;
      for (uint j = 0u; j < kPartValues; ++j) {
        precise float a = hvec[v + j] * chunk_d[c0 + j];
        amax = max(amax, abs(a));
      }
      chunk_part_amax[x] = amax;
    }
    for (uint x = tid; x < NQ * 16u; x += WG) {  // lane l of query i: channels l, l + 16, ... in order
      const uint i = x / 16u, l = x % 16u;
      precise float lane = 0.0;
      for (uint c = l; c < HD; c += 16u) {
        precise float m8 = chunk_m[c] + 8.0 * chunk_d[c];
        lane = fma(hvec[i * HD + c], m8, lane);
      }
      chunk_base_lane[x] = lane;
    }
  }
  barrier();
  if (whole && kChunksInt8) {
    for (uint x = tid; x < NQ * (HD / kPartValues); x += WG) {
      const uint v = x * kPartValues, c0 = v % HD, part0 = x & ~3u;  // the block's first part
      const float amax = max(max(chunk_part_amax[part0], chunk_part_amax[part0 + 1u]),
                             max(chunk_part_amax[part0 + 2u], chunk_part_amax[part0 + 3u]));
      const int e = Int8ScaleExponent(amax);
      for (uint j = 0u; j < kPartValues; ++j) {
        precise float a = hvec[v + j] * chunk_d[c0 + j];
        chunk_code[v + j] = Int8Code(a, amax, e);
      }
      if (x == part0) chunk_scale[(v / HD) * kBlocks + c0 / 32u] = Int8Scale(amax, e);
    }
    for (uint i = tid; i < NQ; i += WG) {  // a query's base: its lanes reduced pairwise, in the CPU's order
      precise float lanes[16];
      for (uint l = 0u; l < 16u; ++l) lanes[l] = chunk_base_lane[i * 16u + l];
      for (uint w = 8u; w >= 1u; w /= 2u) {
        for (uint l = 0u; l < w; ++l) lanes[l] += lanes[l + w];
      }
      chunk_base[i] = lanes[0];
    }
  }
  barrier();
}

// Query `at` (its offset in hvec) against the staged f16 key of position pos.
float StagedKeyScore(uint pos, uint first, uint at) {
  const uint row = p.key_row0 + pos - p.key_pos0;
  precise float s = 0.0;
  for (uint d = 0u; d < HD; ++d) {
    const uint ch = first + d, w = key_words[row * (p.n_channels / 2u) + ch / 2u];
    s += hvec[at + d] * F16BitsToF32((ch & 1u) != 0u ? (w >> 16) : (w & 0xFFFFu));
  }
  return s;
}

// Every query's score against the staged f16 key of position pos, the key read once for all of
// them, 8 values a load (head_dim a multiple of 8: rows and head slices start at 16-byte
// boundaries), each sum in StagedKeyScore's order. Decode's keys past the last whole chunk take
// this path: read per query, one word a value, they made the last workgroup of a head the
// slowest of the dispatch.
void StagedKeyScores(uint pos, uint first, out float t[NQ]) {
  const uint at = ((p.key_row0 + pos - p.key_pos0) * (p.n_channels / 2u) + first / 2u) >> 2;
  precise float sums[NQ];
  for (uint i = 0u; i < NQ; ++i) sums[i] = 0.0;
  for (uint j = 0u; j < HD / 8u; ++j) {
    const uvec4 w = key_vec4[at + j];
    for (uint k = 0u; k < 8u; ++k) {
      const uint word = w[k >> 1];
      const float key = F16BitsToF32((k & 1u) != 0u ? (word >> 16) : (word & 0xFFFFu));
      for (uint i = 0u; i < NQ; ++i) sums[i] += hvec[i * HD + 8u * j + k] * key;
    }
  }
  for (uint i = 0u; i < NQ; ++i) t[i] = sums[i];
}

// f16 keys with head_dim < 64 and not a multiple of 16: the reference engine (and the CPU
// backend's scalar attention) adds the exact products of f16 query and key values in double and
// rounds once. Float TwoSum (error-free) accumulation gives that sum's rounding too but in rare
// near-ties. The order of these sums decides stories260K p3's most sensitive rows (446-447) to
// 0.02.
const bool kExactF16Dot = uint(KV_TYPE == kKvF16) * uint(HD % 16u != 0u) * uint(HD < 64u) != 0u;

float ExactF16Dot(uint row, uint first, uint at) {
  precise float hi = 0.0, lo = 0.0;
  for (uint d = 0u; d < HD; ++d) {
    precise float prod = hvec[at + d] * KvValue(row, first + d);  // exact: two f16 values
    precise float s = hi + prod;
    precise float bb = s - hi;
    lo += (hi - (s - bb)) + (prod - bb);
    hi = s;
  }
  precise float sum = hi + lo;
  return sum;
}

// NEW_KEYS: the call's new keys of this workgroup's KV head, new token j's at [j * HD].
shared float new_key[NEW_KEYS * HD + 1u];

// Stages new_key from k_new as kv_store would store the keys (its RoPE arithmetic, then f16).
void StageNewKeys(uint tid, uint first) {
  const uint half_rot = p.n_rot / 2u;
  for (uint x = tid; x < min(p.n_tokens, NEW_KEYS) * HD; x += WG) {
    const uint j = x / HD, d = x % HD, row = (p.q_row0 + j) * p.k_stride + first;
    float v = k_new[row + d];
    if (d < p.n_rot) {
      const uint i = ROPE == 2u ? d % half_rot : d / 2u;
      const uvec2 dims = RopePairDims(i, half_rot, ROPE == 2u);
      const vec2 c = cs[(p.q_row0 + j) * half_rot + i];
      const vec2 r = RopePair(k_new[row + dims.x], k_new[row + dims.y], c);
      v = d == dims.x ? r.x : r.y;
    }
    new_key[x] = F16BitsToF32(F32ToF16Bits(v));
  }
}

// Query `at` against new key j, summed as the cached (or staged) key would be.
float NewKeyScore(uint j, uint at) {
  precise float hi = 0.0, lo = 0.0;
  for (uint d = 0u; d < HD; ++d) {
    precise float prod = hvec[at + d] * new_key[j * HD + d];
    if (kExactF16Dot) {  // as ExactF16Dot
      precise float s = hi + prod;
      precise float bb = s - hi;
      lo += (hi - (s - bb)) + (prod - bb);
      hi = s;
    } else {
      hi += prod;
    }
  }
  precise float sum = hi + lo;
  return kExactF16Dot ? sum : hi;
}

// The queries in hvec rotated by RoPE, as rope.comp rotates each in place (table row = q row).
void RopeQueries(uint tid) {
  const uint half_rot = p.n_rot / 2u;
  for (uint x = tid; x < NQ * half_rot; x += WG) {
    const uint i = x / half_rot, k = x % half_rot;
    const uvec2 dims = RopePairDims(k, half_rot, ROPE == 2u);
    const uint a = i * HD + dims.x, b = i * HD + dims.y;
    const vec2 c = cs[(p.q_row0 + QueryToken(i)) * half_rot + k];
    const float x0 = hvec[a], x1 = hvec[b];
    const vec2 r = RopePair(x0, x1, c);
    hvec[a] = r.x;
    hvec[b] = r.y;
  }
}

void main() {
  MarkPhase(0u);
  LoadCall();
  MarkPhase(1u);
  const uint tid = gl_LocalInvocationID.x;
  const uint n_visible = QueryVisible(NQ - 1u);  // the most any query sees (tokens ascend with i)
  if (group_id.x * WG >= n_visible) return;  // the whole workgroup: barriers stay uniform
  for (uint x = tid; x < NQ * HD; x += WG) {
    const uint i = x / HD;
    hvec[x] = q[(p.q_row0 + QueryToken(i)) * p.q_stride + QueryHead(i) * HD + x % HD];
  }
  barrier();
  MarkPhase(2u);
  if (ROPE != 0u) {
    RopeQueries(tid);
    barrier();
  }
  if (ROTATE != 0u) HadamardShared(NQ, HD, p.hadamard_scale, tid, WG);
  if (KV_TYPE == kKvF16) {
    for (uint x = tid; x < NQ * HD; x += WG) hvec[x] = RoundF16(hvec[x]);
    barrier();
  }
  if (kInt8Queries) {
    QuantizeQueryBlocks(tid);
    barrier();
  }
  MarkPhase(3u);
  const uint first = (QueryHead(0u) / p.group) * HD;
  if (NEW_KEYS > 0u && (group_id.x + 1u) * WG > p.pos0) {  // (uniform) a workgroup with new positions
    StageNewKeys(tid, first);
    barrier();
  }
  MarkPhase(4u);
  // Each query's score is summed as a workgroup of that query alone sums it; the key is read
  // once for all. Positions no query sees compute nothing but stay for the stats' barriers.
  const uint pos = group_id.x * WG + tid;
  const bool visible = pos < n_visible;
  const bool is_new = NEW_KEYS > 0u && pos >= p.pos0;  // not in the cache yet (kv_store runs beside)
  precise float s[NQ];
  for (uint i = 0u; i < NQ; ++i) s[i] = 0.0;
  if (KV_TYPE == kKvQ4K) {  // WG == CHUNK: this workgroup is chunk group_id.x
    const uint chunk = group_id.x;
    const bool whole = ChunkWhole(chunk, NQ - 1u);
    PrepareChunk(chunk, first, tid, whole);
    MarkPhase(5u);
    if (visible && whole) {
      const uint base = ChunkRecord(chunk, first), record = 4u + CHUNK / 2u;  // channels' records are contiguous
      if (kChunksInt8) {
        for (uint i = 0u; i < NQ; ++i) s[i] = chunk_base[i];
        for (uint b = 0u; b < HD / 32u; ++b) {
          int isum[NQ];
          for (uint i = 0u; i < NQ; ++i) isum[i] = 0;
          for (uint c = 32u * b; c < 32u * b + 32u; ++c) {
            const int code = int(ChunkCode(base + c * record, tid)) - 8;
            for (uint i = 0u; i < NQ; ++i) isum[i] += chunk_code[i * HD + c] * code;
          }
          for (uint i = 0u; i < NQ; ++i) s[i] = fma(float(isum[i]), chunk_scale[i * kBlocks + b], s[i]);
        }
      } else {
        for (uint c = 0u; c < HD; ++c) {
          precise float key = chunk_m[c] + chunk_d[c] * float(ChunkCode(base + c * record, tid));
          for (uint i = 0u; i < NQ; ++i) s[i] += hvec[i * HD + c] * key;
        }
      }
    }
    // Staged keys: read once for all queries where the head slices are 16-byte aligned.
    bool staged = false;
    for (uint i = 0u; i < NQ; ++i) staged = staged || (!ChunkWhole(chunk, i) && pos < QueryVisible(i));
    float staged_s[NQ];
    for (uint i = 0u; i < NQ; ++i) staged_s[i] = 0.0;
    if (HD % 8u == 0u && visible && !is_new && staged) StagedKeyScores(pos, first, staged_s);
    for (uint i = 0u; visible && i < NQ; ++i) {
      if (ChunkWhole(chunk, i) || pos >= QueryVisible(i)) continue;
      if (is_new) {
        s[i] = NewKeyScore(pos - p.pos0, i * HD);
      } else {
        s[i] = HD % 8u == 0u ? staged_s[i] : StagedKeyScore(pos, first, i * HD);
      }
    }
  } else if (visible && is_new) {
    for (uint i = 0u; i < NQ; ++i) s[i] = NewKeyScore(pos - p.pos0, i * HD);
  } else if (visible) {
    const uint slot = block_table[p.table0 + pos / p.block_tokens];
    const uint row = (slot * p.block_tokens + pos % p.block_tokens) * p.row_stride;
    if (kInt8Queries) {
      for (uint b = 0u; b < HD / 32u; ++b) {
        const uint v0 = first + 32u * b;
        const uint group = row + (v0 / KV_GROUP) * KvGroupBytes();
        const float d = F16BitsToF32(KvU16(group)), m = F16BitsToF32(KvU16(group + 2u));
        int isum[NQ];
        for (uint i = 0u; i < NQ; ++i) isum[i] = -8 * qcode_sum[i * kBlocks + b];
        // The block's 32 nibbles are 16 bytes at a word boundary (KV_GROUP % 32 == 0): 4 loads.
        const uint codes_at = (group + 4u + (v0 % KV_GROUP) / 2u) >> 2;
        for (uint w = 0u; w < 8u; ++w) {  // elements 4w .. 4w + 3: bytes 2w, 2w + 1 of the block
          const uint half_word = (kv_words[codes_at + w / 2u] >> (16u * (w & 1u))) & 0xFFFFu;
          for (uint i = 0u; i < NQ; ++i) {
            const int qw = int(qcode4[i * (HD / 4u) + 8u * b + w]);
            int dot = 0;
            for (uint k = 0u; k < 4u; ++k) {  // element 4w + k: nibble k of the half word
              dot += bitfieldExtract(qw, int(8u * k), 8) * int((half_word >> (4u * k)) & 15u);
            }
            isum[i] += dot;
          }
        }
        precise float m8 = m + 8.0 * d;
        for (uint i = 0u; i < NQ; ++i) {
          precise float t = fma(m8, qsum[i * kBlocks + b], float(isum[i]) * (d * qscale[i * kBlocks + b]));
          s[i] = b == 0u ? t : s[i] + t;
        }
      }
    } else if (kExactF16Dot) {
      for (uint i = 0u; i < NQ; ++i) s[i] = ExactF16Dot(row, first, i * HD);
    } else if (KV_TYPE == kKvF16 && HD % 8u == 0u && (p.row_stride & 15u) == 0u) {
      // f16 rows whose head slices start at 16-byte boundaries: 8 values a load instead of one
      // word per value (an invocation reads a whole row of its own), summed in the same order.
      const uint at = (row + 2u * first) >> 4;
      for (uint j = 0u; j < HD / 8u; ++j) {
        const uvec4 w = kv_vec4[at + j];
        for (uint k = 0u; k < 8u; ++k) {
          const uint word = w[k >> 1];
          const float key = F16BitsToF32((k & 1u) != 0u ? (word >> 16) : (word & 0xFFFFu));
          for (uint i = 0u; i < NQ; ++i) s[i] += hvec[i * HD + 8u * j + k] * key;
        }
      }
    } else {
      for (uint d = 0u; d < HD; ++d) {
        const float key = KvValue(row, first + d);
        for (uint i = 0u; i < NQ; ++i) s[i] += hvec[i * HD + d] * key;
      }
    }
  }
  MarkPhase(6u);
  for (uint i = 0u; i < NQ; ++i) {
    if (QueryReal(i) && pos < QueryVisible(i)) {
      scores[p.score0 + (QueryToken(i) * p.n_head + QueryHead(i)) * p.score_stride + pos] = s[i];
    }
  }
  MarkPhase(7u);
  if (STATS == 0u) return;
  // The workgroup's (max, sum) of each query's softmax, over the positions it sees.
  for (uint i = 0u; i < NQ; ++i) {
    precise float v = s[i] * p.scale;  // precise: the same rounding as softmax.comp and attn_output
    stat_max[i * WG + tid] = pos < QueryVisible(i) ? v : uintBitsToFloat(0xFF800000u);
  }
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    for (uint i = 0u; tid < k && i < NQ; ++i) stat_max[i * WG + tid] = max(stat_max[i * WG + tid], stat_max[i * WG + tid + k]);
    barrier();
  }
  MarkPhase(8u);
  for (uint i = 0u; i < NQ; ++i) {
    precise float v = s[i] * p.scale;
    stat_sum[i * WG + tid] = pos < QueryVisible(i) ? ExpPoly(v - stat_max[i * WG]) : 0.0;
  }
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    for (uint i = 0u; tid < k && i < NQ; ++i) stat_sum[i * WG + tid] += stat_sum[i * WG + tid + k];
    barrier();
  }
  MarkPhase(9u);
  for (uint i = 0u; tid == 0u && i < NQ; ++i) {
    if (QueryReal(i)) {
      stats[p.stats0 + (QueryToken(i) * p.n_head + QueryHead(i)) * p.stats_stride + group_id.x] =
          vec2(stat_max[i * WG], stat_sum[i * WG]);
    }
  }
  MarkPhase(10u);
}
