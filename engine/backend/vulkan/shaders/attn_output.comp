#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(KVFS_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#if defined(KVFS_PHASE_CLOCK)
#extension GL_EXT_shader_realtime_clock : require
#extension GL_ARB_shader_clock : require
#endif
// Attention output of one sequence's query tokens: out(t, h) = sum_p w[t][h][p] * V(p, h/group)
// over the visible positions, V read in the stored KV format from the device plane of the
// layer (dequantized here). One workgroup per (token, HEADS query heads of one KV head, split):
// invocation (lane, d) sums the split's positions p = lane (mod lanes) for dimension d, each
// value read once for all HEADS heads (grouped-query attention; also on the q4 int8-weight path,
// whose weight codes are made per tile into shared memory first), and the lanes are added in
// shared memory. With one split the result is rotated back
// by the Walsh-Hadamard transform when the format rotates (H is its own inverse) and written
// out; with several (decode: few tokens, long contexts, so the positions are spread over more
// workgroups) each split writes its partial sum and attn_reduce adds them up and rotates.
// FUSED (decode): the weights are the raw scores' softmax, made here instead of by softmax.comp:
// the row's max M and sum L come from attn_scores' per-workgroup (max, sum) stats, in the same
// order in every workgroup, and the split's weights exp(scale * s - M) / L (f16-rounded when
// asked) are made once into shared memory. That saves softmax.comp's dispatch and its one
// workgroup per (token, head) walking the whole context. The weights can differ from its in
// the last bits of L (a sum of the workgroups' sums, each scaled by exp(m_g - M)).
// ONE_PASS (several splits): the split workgroup that finishes last for its (token, heads) adds
// the splits' partial sums itself, as attn_reduce would (same order, same bits), counted by an
// atomic per (token, heads) that it then resets to 0: no attn_reduce dispatch and barrier.
// KIND (not 3): the workgroup that writes the output also quantizes it for the o matrix
// (quantize_heads.glsl), which then needs no quantize_act dispatch.
// QT (prefill: one split, weights from softmax.comp): a workgroup sums QT consecutive tokens,
// each value read once for all of them (so once per tile of tokens, not per token), each
// token's sums in the order of a workgroup of that token alone.
// JOBS: the workgroups of several calls (sequences of a pass sharing the V plane) run as one
// dispatch (jobs.glsl): a decode step of n agents records one attn_output a layer, not n.

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  // >= HD
layout(constant_id = 1) const uint KV_TYPE = 1;
layout(constant_id = 2) const uint KV_GROUP = 64;
layout(constant_id = 3) const uint HD = 64;
layout(constant_id = 4) const uint ROTATE = 0;
layout(constant_id = 5) const uint HEADS = 1;  // query heads per workgroup, all of one KV head
layout(constant_id = 6) const uint FUSED = 0;
layout(constant_id = 7) const uint SPLIT_CAP = 128;  // FUSED: the most positions a split has
layout(constant_id = 8) const uint KIND = 3;  // the output's codes: vk::ActKind (3, float: none)
layout(constant_id = 9) const uint ONE_PASS = 0;
layout(constant_id = 10) const uint QT = 1;  // query tokens per workgroup (1 with FUSED or splits)
layout(constant_id = 11) const uint JOBS = 0;  // 1: the calls of `jobs` (jobs.glsl)

struct Params {
  uint pos0;          // position of query token 0
  uint n_head;
  uint group;         // query heads per KV head
  uint score_stride;  // floats per weight row
  uint block_tokens;  // positions per KV block
  uint row_stride;    // bytes between device KV rows
  uint table0;        // this sequence's first entry in block_table
  uint out_stride;    // floats between token rows of out
  uint out_row0;      // out row of query token 0
  float hadamard_scale;
  uint split_positions;  // positions per split
  uint n_splits;
  float scale;            // FUSED: 1 / sqrt(head_dim)
  uint round_f16;         // FUSED: weights rounded to f16 (an f16 cache, as softmax.comp)
  uint stats_stride;      // FUSED: entries per (token, head) row of stats
  uint stats_positions;   // FUSED: positions per stats entry (attn_scores' workgroup)
  // Where this call's rows start in the scratch buffers (shared by several sequences' attention
  // in a pass): floats of w and partials, entries of stats.
  uint score0;
  uint partial0;
  uint stats0;
  uint counter0;  // ONE_PASS: this call's first counter
  uint n_tokens;  // query tokens of this call
};

layout(binding = 0) readonly buffer Weights { float w[]; };             // from score0: [n_tokens][n_head][score_stride] (FUSED: raw scores)
layout(binding = 1) readonly buffer Plane { uint kv_words[]; };         // V rows of this layer
layout(binding = 2) readonly buffer BlockTable { uint block_table[]; };
layout(binding = 3) writeonly buffer Output { float o[]; };             // [..][out_stride]
layout(binding = 4) coherent buffer Partials { float partials[]; };     // from partial0: [n_tokens][n_head][n_splits][HD]
layout(binding = 5) readonly buffer Stats { vec2 stats[]; };            // FUSED: attn_scores' (max, sum) entries
layout(binding = 6) writeonly buffer Codes { uint codes[]; };           // KIND: [..][n_head * HD / 4]
layout(binding = 7) writeonly buffer Aux { vec4 aux[]; };               // KIND: [..][n_head * HD / 32]
layout(binding = 8) coherent buffer Counters { uint counters[]; };      // ONE_PASS, from counter0: [n_tokens][n_head / HEADS]
const uint kJobsBinding = 9;
const uint kJobsFlatDim = 1;  // a call's workgroups along y and z are numbered along y
#include "jobs.glsl"

#include "common.glsl"
#include "kv_rows.glsl"

shared float partial[HEADS * WG];
shared float hvec[HEADS * HD];
// FUSED keeps its data in the arrays above while they are free, so it needs no more shared
// memory than the separate path: the split's weights in partial (head i's weight of split
// position k at i * SPLIT_CAP + k; SPLIT_CAP + 32 <= WG, FoldAt) until the sums are taken, and
// each head's M and 1 / L in hvec[i] and hvec[HEADS + i] until the lanes are added.
uint WeightAt(uint i, uint k) { return i * SPLIT_CAP + k; }
uint RowMaxAt(uint i) { return i; }
uint RowInvAt(uint i) { return HEADS + i; }

// Head h0 + i's weight of position pos (in split s0 ..): from shared memory when FUSED.
float Weight(uint wrow0, uint i, uint s0, uint pos) {
  if (FUSED != 0u) return partial[WeightAt(i, pos - s0)];
  return w[wrow0 + i * p.score_stride + pos];
}

#include "hadamard.glsl"
#include "split_sums.glsl"
#include "subgroup_tree.glsl"
const uint QUANT_SHARED = KIND == 3u ? 1u : WG;
#include "quantize_block.glsl"
#include "quantize_heads.glsl"
#include "phase_clock.glsl"

// q4 values take the int8-weight path of the CPU backend (engine/backend/cpu/attention.h), with
// the same codes: per tile (kQueryBlock positions from each KV block's start, cut at the last
// visible one) the weights times the group scales a_p = w_p d_p are quantized with a
// power-of-two scale, summed as integers against the centred codes, and the weights meet the
// groups' m + 8d unquantized. (The float additions run in another order than the CPU's.)
// (A product, not &&: glslang turns && of specialization constants into branches outside any
// function, which spirv-val rejects.)
const bool kInt8Weights = uint(KV_TYPE == kKvQ4) * uint(HD % 32u == 0u) * uint(KV_GROUP % 32u == 0u) != 0u;

// A tile's codes depend on its (token, head, value group), not on the value: they are made once
// per round of kLanes tiles into shared memory (an entry per tile, token, head and group of the
// head's values), then every invocation (lane, d) sums its tile's codes against its values'
// nibbles, each nibble read once for all tokens and heads. (Made per value, as the CPU's loop
// order suggests, they cost HD / KV_GROUP x HEADS x QT times the work.)
const uint kLanes = WG / HD;  // invocations per value: (lane, d) = (tid / HD, tid % HD)
// The non-int8 paths' positions per round of loads (an invocation's: kLanes apart), and the
// block-table window that spares them a dependent load a round (main). Decode (one token a
// workgroup: few workgroups, each a chain of rounds) takes rounds of 32 positions where head_dim
// is 32 to 128; prefill's tiles of tokens keep 4 (their sums already hold the registers, and
// there are workgroups enough to hide the latency).
const uint kBatch = QT > 1u ? 4u : (kLanes <= 2u ? 16u : (kLanes == 4u ? 8u : 4u));
const uint kTableWindow = 64u;  // entries (vk_attention_ops.cpp counts its bytes: kOutputTableWindowBytes)
shared uint table_window[kTableWindow];

// The window of blocks wb .. (at most kTableWindow of them, up to block_end) of this sequence.
void LoadTableWindow(uint wb, uint block_end, uint tid) {
  for (uint j = tid; j < kTableWindow && wb + j < block_end; j += WG) table_window[j] = block_table[p.table0 + wb + j];
}

// Value groups a head's values can span (groups need not start at a head's first value).
const uint kHeadGroups = HD % KV_GROUP == 0u ? HD / KV_GROUP : (KV_GROUP % HD == 0u ? 1u : HD / KV_GROUP + 2u);
const uint kEntries = kInt8Weights ? kLanes * QT * HEADS * kHeadGroups : 1u;
// entry (lane l, token k, head i, group g: the head's first group + g) at
// ((l * QT + k) * HEADS + i) * kHeadGroups + g
shared uint tile_codes[kEntries * 8u];           // 32 int8 codes of a_p (p - tile start), 4 a word
shared float tile_scale[kEntries], tile_base[kEntries];  // 2^e, and sum_p w_p (m + 8d) in order
// The round's groups' (d, m) f16 pairs, loaded by the whole workgroup at once before the entries
// are made (an entry's invocation walking its tile's 32 positions would wait for a load at
// each, twice): (lane l's tile, head group g, position t0 + j) at (l * kHeadGroups + g) * 32 + j,
// d in the low half.
const uint kTileScales = kInt8Weights ? kLanes * kHeadGroups * 32u : 1u;
shared uint tile_dm[kTileScales];

// The end of the positions token t0q + k of the tile sees in the split ending at split_end.
uint TokenVisibleEnd(uint t0q, uint k, uint split_end) { return min(p.pos0 + t0q + k + 1u, split_end); }

uint TileEnd(uint pos) {  // the end of the tile holding pos
  const uint block_end = (pos / p.block_tokens + 1u) * p.block_tokens;
  return min(pos - (pos % p.block_tokens) % 32u + 32u, block_end);
}

// The row of position pos's KV block slot minus the block's first position, for the tile
// starting at t0 (a tile lies in one KV block, so its table entry is read once): adding a
// position of the block gives its row (uint arithmetic wraps, so the difference may).
uint TileRow0(uint t0) {
  const uint block = t0 / p.block_tokens;
  return block_table[p.table0 + block] * p.block_tokens - block * p.block_tokens;
}

// The round's tile_dm (every invocation calls it; a barrier before the entries read it): tile
// l's positions up to n_visible (a position past them, or a group past the head's, loads
// nothing; no entry reads it).
void LoadTileScales(uint a, uint n_visible, uint first, uint tid) {
  for (uint x = tid; x < kTileScales; x += WG) {
    const uint j = x % 32u, g = (x / 32u) % kHeadGroups, l = x / (32u * kHeadGroups);
    uint t0 = a;
    for (uint y = 0u; y < l; ++y) t0 = t0 < n_visible ? TileEnd(t0) : t0;
    const uint group = first / KV_GROUP + g;
    if (t0 >= n_visible || t0 + j >= min(TileEnd(t0), n_visible) || group > (first + HD - 1u) / KV_GROUP) continue;
    const uint at = (TileRow0(t0) + t0 + j) * p.row_stride + group * KvGroupBytes();
    tile_dm[x] = KvU16(at) | (KvU16(at + 2u) << 16);
  }
}

// Entry e of the round whose first tile starts at a: head h0 + i's weights (token k's row
// wrow0 + k * token_rows) against value group first / KV_GROUP + g, over positions [t0, t1) of
// tile l (none when the token sees no position of it, or the head no value of the group).
void MakeTileEntry(uint e, uint a, uint wrow0, uint token_rows, uint s0, uint split_end, uint n_valid, uint t0q,
                   uint first) {
  const uint g = e % kHeadGroups, i = (e / kHeadGroups) % HEADS, k = (e / (kHeadGroups * HEADS)) % QT;
  const uint l = e / (kHeadGroups * HEADS * QT);
  uint t0 = a;
  for (uint j = 0u; j < l; ++j) t0 = TileEnd(t0);
  const uint visible = TokenVisibleEnd(t0q, k, split_end);
  for (uint c = 0u; c < 8u; ++c) tile_codes[e * 8u + c] = 0u;
  tile_scale[e] = 0.0;
  tile_base[e] = 0.0;
  const uint group = first / KV_GROUP + g;
  if (k >= n_valid || t0 >= visible || group > (first + HD - 1u) / KV_GROUP) return;
  const uint t1 = min(TileEnd(t0), visible);
  const uint wrow = wrow0 + k * token_rows;
  const uint dm0 = (l * kHeadGroups + g) * 32u - t0;  // position pos's (d, m) at tile_dm[dm0 + pos]
  precise float amax = 0.0;
  for (uint pos = t0; pos < t1; ++pos) {
    precise float a_p = Weight(wrow, i, s0, pos) * F16BitsToF32(tile_dm[dm0 + pos] & 0xFFFFu);
    amax = max(amax, abs(a_p));
  }
  const int ex = Int8ScaleExponent(amax);
  precise float base = 0.0;
  uint word = 0u;
  for (uint pos = t0; pos < t1; ++pos) {
    const uint dm = tile_dm[dm0 + pos];
    const float d = F16BitsToF32(dm & 0xFFFFu), m = F16BitsToF32(dm >> 16);
    const float wp = Weight(wrow, i, s0, pos);
    precise float a_p = wp * d;
    const uint j = pos - t0;
    word |= (uint(Int8Code(a_p, amax, ex)) & 0xFFu) << (8u * (j & 3u));
    if ((j & 3u) == 3u || pos + 1u == t1) {
      tile_codes[e * 8u + j / 4u] = word;
      word = 0u;
    }
    precise float m8 = m + 8.0 * d;
    base = fma(wp, m8, base);
  }
  tile_scale[e] = Int8Scale(amax, ex);
  tile_base[e] = base;
}

// Each invocation's sums, token k, head i at k * HEADS + i (private; a global because glslang
// found no overload of Int8WeightSums taking it as an inout parameter).
float acc[QT * HEADS];

// The int8-weight path's sums: acc[k * HEADS + i] += each tile's fma(isum, 2^e, base), tile by
// tile, lane l taking tiles l, l + kLanes, ... of the split (which starts at a tile start), in
// rounds of kLanes tiles. Every invocation runs it (barriers).
void Int8WeightSums(uint tid, uint lane, uint d, uint wrow0, uint token_rows, uint s0, uint split_end,
                    uint n_visible, uint n_valid, uint t0q, uint first) {
  const uint v = first + d, at = v % KV_GROUP, g = v / KV_GROUP - first / KV_GROUP;  // g < kHeadGroups
  const uint group_off = (v / KV_GROUP) * KvGroupBytes();
  for (uint a = s0; a < n_visible;) {  // a: the round's first tile (the same in every invocation)
    LoadTileScales(a, n_visible, first, tid);
    barrier();
    for (uint e = tid; e < kEntries; e += WG) MakeTileEntry(e, a, wrow0, token_rows, s0, split_end, n_valid, t0q, first);
    barrier();
    uint t0 = a;
    for (uint j = 0u; j < kLanes; ++j) {  // t0: this lane's tile; a: the next round's
      if (j == lane) t0 = a;
      if (a < n_visible) a = TileEnd(a);
    }
    if (lane < kLanes && t0 < n_visible) {
      const uint t1 = min(TileEnd(t0), n_visible), block_row0 = TileRow0(t0);
      int isum[QT * HEADS];
      for (uint x = 0u; x < QT * HEADS; ++x) isum[x] = 0;
      // The tile's bytes of this value, 16 positions loaded before any is used (two memory
      // latencies a tile, not one per 4 positions; 32 at once held 36 more registers); positions
      // past t1 load t1 - 1's again and are not used.
      uint value_bytes[16];
      for (uint w = 0u; w < 8u && t0 + 4u * w < t1; ++w) {  // 4 positions a code word
        if ((w & 3u) == 0u) {
          for (uint j = 0u; j < 16u; ++j) {
            value_bytes[j] = KvU8((block_row0 + min(t0 + 4u * w + j, t1 - 1u)) * p.row_stride + group_off + 4u + at / 2u);
          }
        }
        int q[4];  // the nibbles of positions t0 + 4w + c, centred (0 past t1: the codes are 0 there too)
        for (uint c = 0u; c < 4u; ++c) {
          const uint byte_value = value_bytes[4u * (w & 3u) + c];
          q[c] = t0 + 4u * w + c < t1 ? int((at & 1u) != 0u ? (byte_value >> 4) : (byte_value & 15u)) - 8 : 0;
        }
        for (uint x = 0u; x < QT * HEADS; ++x) {
          const int codes = int(tile_codes[((lane * QT * HEADS + x) * kHeadGroups + g) * 8u + w]);
          for (uint c = 0u; c < 4u; ++c) isum[x] += bitfieldExtract(codes, int(8u * c), 8) * q[c];
        }
      }
      for (uint x = 0u; x < QT * HEADS; ++x) {
        const uint k = x / HEADS;
        if (k >= n_valid || t0 >= TokenVisibleEnd(t0q, k, split_end)) continue;  // token sees none of it
        const uint e = (lane * QT * HEADS + x) * kHeadGroups + g;
        precise float sum = fma(float(isum[x]), tile_scale[e], tile_base[e]);
        acc[x] += sum;
      }
    }
    barrier();
  }
}

// FUSED: M and 1 / L of the HEADS heads from the stats of the whole row (pos0 + t + 1
// positions), then the split's weights into partial. Every workgroup of the row reduces the same
// entries in the same order, so all splits use the same M and L. The split's raw scores are
// loaded first, before the stats and without waiting for them (a decode layer's attention waits
// on this chain), and parked in partial where their weights go; the fold's scratch lies past
// them (WeightAt's HEADS * SPLIT_CAP floats, then FoldAt's HEADS * kFold: SPLIT_CAP + kFold <= WG).
const uint kFold = 32u;  // invocations per head folding the entries (HEADS * kFold <= WG)
const uint kRawPerInvocation = (HEADS * SPLIT_CAP + WG - 1u) / WG;
uint FoldAt(uint i, uint lane) { return HEADS * SPLIT_CAP + i * kFold + lane; }

void FusedWeights(uint tid, uint t, uint h0, uint wrow0, uint s0, uint n_visible) {
  float raw[kRawPerInvocation];  // x = tid + j * WG: head x / split_positions, position s0 + x % split_positions
  for (uint j = 0u; j < kRawPerInvocation; ++j) {
    const uint x = tid + j * WG;
    const uint head = x / p.split_positions, pos = s0 + x % p.split_positions;
    raw[j] = x < HEADS * p.split_positions && pos < n_visible ? w[wrow0 + head * p.score_stride + pos] : 0.0;
  }
  const uint n_stats = (p.pos0 + t + 1u + p.stats_positions - 1u) / p.stats_positions;
  const uint base = p.stats0 + (t * p.n_head + h0) * p.stats_stride;  // head h0 + i: base + i * stats_stride
  // kFold invocations per head fold the entries (a strided pass each), then one invocation per
  // head finishes in order: few barriers, and the same order in every workgroup.
  const uint i = tid / kFold, lane = tid % kFold;
  const bool folds = i < HEADS;
  if (folds) {
    float m = uintBitsToFloat(0xFF800000u);
    for (uint g = lane; g < n_stats; g += kFold) m = max(m, stats[base + i * p.stats_stride + g].x);
    partial[FoldAt(i, lane)] = m;
  }
  for (uint j = 0u; j < kRawPerInvocation; ++j) {
    const uint x = tid + j * WG;
    if (x < HEADS * p.split_positions) partial[WeightAt(x / p.split_positions, x % p.split_positions)] = raw[j];
  }
  barrier();
  MarkPhase(2u);
  if (tid < HEADS) {
    float m = partial[FoldAt(tid, 0u)];
    for (uint l = 1u; l < kFold; ++l) m = max(m, partial[FoldAt(tid, l)]);
    hvec[RowMaxAt(tid)] = m;
  }
  barrier();
  MarkPhase(3u);
  if (folds) {  // (the entries again: the fold above just read them)
    float l = 0.0;
    for (uint g = lane; g < n_stats; g += kFold) {
      const vec2 st = stats[base + i * p.stats_stride + g];
      l += st.y * ExpPoly(st.x - hvec[RowMaxAt(i)]);
    }
    partial[FoldAt(i, lane)] = l;
  }
  barrier();
  MarkPhase(4u);
  if (tid < HEADS) {
    float l = partial[FoldAt(tid, 0u)];
    for (uint k = 1u; k < kFold; ++k) l += partial[FoldAt(tid, k)];
    // 1 / L correctly rounded; L itself is a sum of the workgroups' sums (each scaled by
    // exp(m_g - M)), not softmax.comp's chunks of 16: decode's weights can differ from a
    // separate softmax's in L's last bits (the header above).
    hvec[RowInvAt(tid)] = Div(1.0, l);
  }
  barrier();
  MarkPhase(5u);
  // softmax.comp's arithmetic per weight: e = ExpPoly(scale * s - M), w = e * (1 / L), in place.
  for (uint x = tid; x < HEADS * p.split_positions; x += WG) {
    const uint head = x / p.split_positions, pos = s0 + x % p.split_positions;
    if (pos >= n_visible) continue;
    precise float v = partial[WeightAt(head, pos - s0)] * p.scale;
    const float wt = ExpPoly(v - hvec[RowMaxAt(head)]) * hvec[RowInvAt(head)];
    partial[WeightAt(head, pos - s0)] = p.round_f16 != 0u ? RoundF16(wt) : wt;
  }
  barrier();
}

void main() {
  MarkPhase(0u);
  LoadCall();
  MarkPhase(1u);
  const uint tid = gl_LocalInvocationID.x;
  const uint h0 = group_id.x * HEADS, t0 = group_id.y * QT, split = group_id.z;
  const uint n_valid = min(QT, p.n_tokens - t0);  // tokens of this tile: t0 .. t0 + n_valid - 1
  const uint s0 = split * p.split_positions, split_end = s0 + p.split_positions;
  const uint n_visible = min(p.pos0 + t0 + n_valid, split_end);  // the most a token of the tile sees
  const uint d = tid % HD, lane = tid / HD;
  const uint first = (h0 / p.group) * HD;
  // Token t0 + k's weight rows: head h0 + i at wrow0 + k * n_head * score_stride + i * score_stride.
  const uint wrow0 = p.score0 + (t0 * p.n_head + h0) * p.score_stride, token_rows = p.n_head * p.score_stride;
  // The split's block-table entries go to shared memory a window of kTableWindow blocks at a
  // time, the first with the loads of FusedWeights (before its barriers; else a barrier of its
  // own): the value loads then depend on no load in flight. (Decode's splits are one window; a
  // prompt's single split takes a window per 64 blocks.)
  const uint block0 = s0 / p.block_tokens, block_end = n_visible > s0 ? (n_visible - 1u) / p.block_tokens + 1u : block0;
  if (!kInt8Weights) LoadTableWindow(block0, block_end, tid);
  if (FUSED != 0u) {
    FusedWeights(tid, t0, h0, wrow0, s0, n_visible);
  } else if (!kInt8Weights) {
    barrier();
  }
  MarkPhase(6u);
  for (uint x = 0u; x < QT * HEADS; ++x) acc[x] = 0.0;
  if (kInt8Weights) {
    Int8WeightSums(tid, lane, d, wrow0, token_rows, s0, split_end, n_visible, n_valid, t0, first);
  } else {
    // kBatch positions at a time: their values are loaded before any is used, so an invocation
    // waits one memory latency per kBatch positions, not per position: a split's positions are
    // walked one after another by few invocations, so decode attention is latency-bound
    // (decode's default split of 128 takes 4 rounds where head_dim is 32 to 128). Positions past
    // the window's end load its last one again and are not added. Each lane takes its positions
    // s0 + lane, s0 + lane + kLanes, ... in order, window after window: the sums are taken in
    // position order, as one at a time.
    uint pos = s0 + lane;  // this lane's next position
    for (uint wb = block0; wb < block_end; wb += kTableWindow) {  // (uniform: barriers)
      if (wb > block0) {
        barrier();  // every lane is done with the previous window
        LoadTableWindow(wb, block_end, tid);
        barrier();
      }
      const uint w_end = min(n_visible, (wb + kTableWindow) * p.block_tokens);  // the window's positions end
      while (lane < kLanes && pos < w_end) {
        const uint n = min(kBatch, (w_end - pos + kLanes - 1u) / kLanes);  // this round's positions
        uint at[kBatch];
        for (uint b = 0u; b < kBatch; ++b) at[b] = min(pos + b * kLanes, w_end - 1u);
        float v[kBatch];  // read once for every head of the group and every token of the tile
        for (uint b = 0u; b < kBatch; ++b) {
          const uint slot = table_window[at[b] / p.block_tokens - wb];
          v[b] = KvValue((slot * p.block_tokens + at[b] % p.block_tokens) * p.row_stride, first + d);
        }
        for (uint b = 0u; b < kBatch; ++b) {
          if (b >= n) break;  // after the loads: they stay in flight together
          const uint at_b = pos + b * kLanes;
          for (uint k = 0u; k < QT; ++k) {
            if (k >= n_valid || at_b >= TokenVisibleEnd(t0, k, split_end)) continue;  // token t0 + k sees at_b?
            for (uint i = 0u; i < HEADS; ++i) {
              acc[k * HEADS + i] = fma(Weight(wrow0 + k * token_rows, i, s0, at_b), v[b], acc[k * HEADS + i]);
            }
          }
        }
        pos += n * kLanes;
      }
    }
  }
  MarkPhase(7u);
  if (FUSED != 0u) barrier();  // every invocation is done reading the weights in partial
  for (uint k = 0u; k < QT; ++k) {  // token by token through the shared arrays
    if (k >= n_valid) break;  // the same for the whole workgroup: barriers stay uniform
    const uint t = t0 + k;
    if (k > 0u) barrier();  // the previous token is done with partial and hvec
    for (uint i = 0u; i < HEADS; ++i) {
      float a = 0.0;  // acc[k * HEADS + i] without indexing registers by a variable
      for (uint j = 0u; j < QT; ++j) a = j == k ? acc[j * HEADS + i] : a;
      partial[i * WG + tid] = a;
    }
    barrier();
    for (uint x = tid; x < HEADS * HD; x += WG) {
      const uint i = x / HD;
      float sum = 0.0;
      for (uint l = 0u; l < kLanes; ++l) sum += partial[i * WG + l * HD + x % HD];
      hvec[x] = sum;
    }
    barrier();
    MarkPhase(8u);
    if (p.n_splits > 1u) {  // QT == 1
      for (uint x = tid; x < HEADS * HD; x += WG) {
        partials[p.partial0 + ((t * p.n_head + h0 + x / HD) * p.n_splits + split) * HD + x % HD] = hvec[x];
      }
      if (ONE_PASS == 0u) return;
      // Every invocation's partial sums are out (device-wide) before the count says so; the
      // count's last one reads all splits' sums after it.
      // (The CUDA threadfence-reduction idiom: every invocation's fence, the workgroup barrier, then
      // the counting invocation's own fences around the atomic.) Whether this workgroup finishes
      // goes through partial[0], free once the lanes' sums are in hvec: no shared memory of its own.
      memoryBarrierBuffer();
      barrier();
      if (tid == 0u) {
        const uint counter = p.counter0 + t * (p.n_head / HEADS) + group_id.x;
        memoryBarrierBuffer();
        const bool last = atomicAdd(counters[counter], 1u) == p.n_splits - 1u;
        if (last) atomicExchange(counters[counter], 0u);  // every split has counted: ready for the next use
        memoryBarrierBuffer();
        partial[0] = last ? 1.0 : 0.0;
      }
      barrier();
      MarkPhase(9u);
      if (partial[0] == 0.0) return;
      memoryBarrierBuffer();
      SumSplits(t, h0, tid);  // attn_reduce's sums
      MarkPhase(10u);
    }
    if (ROTATE != 0u) HadamardShared(HEADS, HD, p.hadamard_scale, tid, WG);
    MarkPhase(11u);
    for (uint x = tid; x < HEADS * HD; x += WG) o[(p.out_row0 + t) * p.out_stride + h0 * HD + x] = hvec[x];
    if (KIND != 3u) QuantizeHeads(p.out_row0 + t, h0, p.n_head);
  }
  MarkPhase(12u);
}
