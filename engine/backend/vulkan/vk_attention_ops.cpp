// Ops for attention over the KV planes (attn_scores, softmax, attn_output, attn_reduce), decode
// split over positions, several sequences side by side. Encoding new K/V rows into the stored
// formats is in vk_kv_store_ops.cpp, the rest of Ops in vk_ops.cpp.
#include <algorithm>
#include <bit>
#include <numeric>
#include <tuple>

#include <spdlog/fmt/fmt.h>

#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_ops_common.h"

namespace kvfs::vk {

using namespace ops_detail;

namespace {

// Push-constant blocks, field for field the `Params` of each shader.
struct ScoresParams {
  uint32_t pos0, n_head, group, q_stride, q_row0, score_stride, block_tokens, row_stride, table0;
  float hadamard_scale;
  uint32_t slot_words, n_channels, key_row0, key_pos0;
  float scale;
  uint32_t stats_stride, score0, stats0, n_rot, n_tokens, k_stride;
};
struct SoftmaxParams {
  uint32_t pos0, n_head, score_stride, round_f16;
  float scale;
  uint32_t score0;
};
struct OutputParams {
  uint32_t pos0, n_head, group, score_stride, block_tokens, row_stride, table0, out_stride, out_row0;
  float hadamard_scale;
  uint32_t split_positions, n_splits;
  float scale;
  uint32_t round_f16, stats_stride, stats_positions, score0, partial0, stats0, counter0, n_tokens;
};
struct ReduceParams {
  uint32_t n_head, n_splits, out_stride, out_row0;
  float hadamard_scale;
  uint32_t partial0;
};

// attn_scores, softmax and attn_output push their Params, then jobs.glsl's job0 and groups0.
constexpr uint32_t kJobsPushBytes = 8;
constexpr ShaderInterface kScores{"attn_scores", 9, sizeof(ScoresParams) + kJobsPushBytes};
constexpr ShaderInterface kSoftmax{"softmax", 2, sizeof(SoftmaxParams) + kJobsPushBytes};
constexpr ShaderInterface kOutput{"attn_output", 10, sizeof(OutputParams) + kJobsPushBytes};
constexpr ShaderInterface kOutputSg{"attn_output_sg", 10, sizeof(OutputParams) + kJobsPushBytes};
constexpr ShaderInterface kReduce{"attn_reduce", 4, sizeof(ReduceParams)};
constexpr ShaderInterface kReduceSg{"attn_reduce_sg", 4, sizeof(ReduceParams)};
static_assert(kOutput.n_buffers <= kMostStorageBuffers);

// Attention of a few tokens (decode) spreads each (token, head) over workgroups of about
// Ops::attention_split_positions() positions, at most kMaxSplits of them.
constexpr int64_t kSplitTokens = 4;
constexpr int64_t kMaxSplits = 256;
// attn_output takes all the query heads of a KV head in one workgroup (each value read once for
// all of them) when there are at most this many. Its shared memory, 4 * heads * (kRowGroup +
// head_dim) bytes, then stays within about the 16 KiB every device has (head_dim <= kRowGroup;
// at 8 heads of 256 the quantizer's unused arrays and the block-table window are 276 bytes
// over, which CheckAttentionShape reports), plus the quantizer's 5 KiB where it quantizes its
// output (QuantizesAttentionOutput checks the device's limit) and q4's tile codes (up to 320
// bytes a head, OutputSharedBytes).
constexpr int64_t kMaxOutputHeads = 8;
// The fused softmax folds the stats with 32 invocations per head of a workgroup.
static_assert(kMaxOutputHeads * 32 <= kRowGroup);
// attn_output's fused softmax keeps a split's weights in shared memory (in its array of
// kRowGroup floats per head): splits of at most this many positions (the default split) take
// it, longer ones run softmax.comp first.
constexpr int64_t kFusedSplitCap = Ops::kDefaultAttentionSplit;
static_assert(kFusedSplitCap + 32 <= kRowGroup);  // the shader folds the stats in partial past the weights

// Query heads per attn_output workgroup: all those of a KV head, when few enough.
int64_t OutputHeads(const AttentionShape& shape) {
  const int64_t group = shape.n_head / shape.n_head_kv;
  return group <= kMaxOutputHeads ? group : 1;
}

// attn_output's tokens per workgroup with query tiles (one split, weights from softmax.comp):
// each invocation keeps tokens x heads sums in registers, at most kOutputSums of them.
constexpr int64_t kOutputSums = 32, kMaxOutputTokens = 8;
// attn_scores' queries per workgroup with query tiles (Ops::ScoreQueries): the query heads of a
// KV head (as attn_output takes them) by tokens.
constexpr int64_t kScoreQueries = 16;

// Query tokens a tile is sized for when a call has n_tokens: the power of two at or above it. A
// tile's tokens past the call's are skipped, so 3 tokens run in a tile of 4 with the very values
// of a tile of 3; sizes in powers of two keep the pipelines a daemon needs few (each tile size
// is a pipeline of its own, compiled on first use: backend/warm_up.h makes them all).
int64_t TileTokensFor(int64_t n_tokens) {
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(n_tokens, 1))));
}

// attn_output's int8-weight path (q4 values) keeps each round's tile codes in shared memory: an
// entry of 32 int8 codes, a scale and a base per (lane, token, head, value group of the head),
// and the (d, m) pairs of the round's 32 positions per (lane, value group of the head).
constexpr int64_t kTileEntryBytes = 40, kTileScaleBytes = 32 * 4;
int64_t OutputTileCodeBytes(const KvFormat& f, const AttentionShape& shape, int64_t heads, int64_t tokens) {
  const int64_t hd = shape.head_dim, g = f.group;
  if (f.type != KvType::kQ4 || hd % 32 != 0 || g % 32 != 0) return kTileEntryBytes + 4;  // the arrays' unused entries
  const int64_t head_groups = hd % g == 0 ? hd / g : (g % hd == 0 ? 1 : hd / g + 2);  // as the shader's
  const int64_t lane_groups = (kRowGroup / hd) * head_groups;
  return kTileEntryBytes * lane_groups * tokens * heads + kTileScaleBytes * lane_groups;
}

// attn_output's shared memory: the lanes' sums and the heads' values, the block-table window,
// the quantizer's arrays (unused unless it quantizes its output), and the tile codes.
constexpr int64_t kOutputTableWindowBytes = 4 * 64;  // attn_output.comp's kTableWindow entries
int64_t OutputSharedBytes(const AttentionShape& shape, int64_t heads, bool quantizes, int64_t tile_code_bytes) {
  return 4 * heads * (kRowGroup + shape.head_dim) + kOutputTableWindowBytes +
         QuantizerSharedBytes(kRowGroup, quantizes) + tile_code_bytes;
}

// The most tile-code bytes any q4 format needs at one token a workgroup, for the checks made
// before a format is known: lanes x a head's groups is at most 8 for groups of 32 or more
// values (256 / group where groups divide head_dim; else at most 2 lanes x 3 groups, or 4 x 2).
int64_t OutputTileCodeBytesAtMost(int64_t heads) { return (kTileEntryBytes * heads + kTileScaleBytes) * 8; }

// attn_reduce's workgroup: a power of two in [64, kRowGroup] covering its heads' values.
uint32_t ReduceGroup(int64_t values) {
  uint32_t wg = 64;
  while (wg < kRowGroup && wg < values) wg *= 2;
  return wg;
}

// The spec constant KIND of the attention output shaders: the codes' kind, 3 (float) for none.
uint32_t CodesKind(const OutputCodes* codes) {
  return static_cast<uint32_t>(codes != nullptr ? codes->kind : ActKind::kFloat);
}

// Positions per split: a whole number of attn_output's 32-position tiles (its int8-weight path
// quantizes per tile from each KV block's start, as the CPU backend does), so every split starts
// at a tile start; enough for n_splits to cover n_ctx.
int64_t SplitPositions(int64_t n_ctx, int64_t n_splits, int64_t block_tokens) {
  const bool tiles_align = block_tokens % 32 == 0 || 32 % block_tokens == 0;
  const int64_t unit = tiles_align ? 32 : std::lcm<int64_t>(32, block_tokens);
  return ((n_ctx + n_splits - 1) / n_splits + unit - 1) / unit * unit;
}

// Stats entries per (token, head) row of decode attention's fused softmax: one per attn_scores
// workgroup over the context.
int64_t StatsPerRow(const KvFormat& format, int64_t n_ctx) {
  return CeilDiv(n_ctx, Ops::ScoreGroupPositions(format));
}

}  // namespace

Status Ops::CheckAttentionShape(const AttentionShape& shape) const {
  const int64_t hd = shape.head_dim, row_values = shape.n_head_kv * hd;
  if (hd > kRowGroup) {
    return Unsupported(fmt::format("the Vulkan attention handles head_dim up to {}, the model has {}", kRowGroup, hd));
  }
  // kv_store keeps a row's values and its encoding (at most 2 bytes a value) in shared memory
  // (q4k rows more: KvStorePipeline checks them).
  const int64_t kv_store_shared = row_values * 4 + (row_values * 2 + 3) / 4 * 4;
  if (kv_store_shared > ctx_.limits().max_shared_bytes) {
    return Unsupported(fmt::format("a KV row of {} values needs {} bytes of shared memory; the device has {}",
                                   row_values, kv_store_shared, ctx_.limits().max_shared_bytes));
  }
  const int64_t output_shared =
      OutputSharedBytes(shape, OutputHeads(shape), false, OutputTileCodeBytesAtMost(OutputHeads(shape)));
  if (output_shared > ctx_.limits().max_shared_bytes) {
    return Unsupported(fmt::format("attention over {} query heads per KV head of {} values needs {} bytes of shared "
                                   "memory; the device has {}",
                                   OutputHeads(shape), hd, output_shared, ctx_.limits().max_shared_bytes));
  }
  return Status::Ok();
}

bool Ops::ScoresReadNewKeys(const KvFormat& format, int64_t n_tokens, int64_t pos0) {
  if (n_tokens < 1 || n_tokens > kNewKeyTokens) return false;
  if (format.type == KvType::kF16) return !format.RotatesK();
  // q4k: the new keys must stay staged rows, in a chunk this pass does not complete.
  return format.KeysByChannel() && (pos0 + n_tokens) / format.chunk == pos0 / format.chunk;
}

int64_t Ops::ScoreGroupPositions(const KvFormat& format) {
  return format.KeysByChannel() ? format.chunk : kElementwiseGroup;  // q4k: a workgroup is one K chunk
}

Ops::ScoreTile Ops::ScoreQueries(const KvFormat& format, const AttentionShape& shape, int64_t n_tokens,
                                  bool stats) const {
  ScoreTile tile;
  if (!query_tiles_) return tile;
  tile.heads = OutputHeads(shape);
  tile.tokens = std::clamp<int64_t>(kScoreQueries / tile.heads, 1, TileTokensFor(n_tokens));
  // attn_scores' shared memory (its arrays, in words) must fit the device: fewer tokens, then
  // fewer heads, until it does (one query is what CheckAttentionShape allows for).
  const int64_t hd = shape.head_dim, blocks = hd / 32 + 1, wg = ScoreGroupPositions(format);
  const bool int8_queries = format.type == KvType::kQ4 && hd % 32 == 0 && format.group % 32 == 0;
  const bool int8_chunks = format.type == KvType::kQ4K && hd % 32 == 0;
  // (In the shader's order: queries, stats trees, query codes and their blocks' figures, the
  // chunk's scales, codes, parts and lanes, its blocks' figures, the new keys.)
  const int64_t new_key_words = (n_tokens <= kNewKeyTokens ? kNewKeyTokens * hd : 0) + 1;
  auto shared_bytes = [&](int64_t nq) {
    const int64_t words = nq * hd + 2 * (stats ? wg * nq + 1 : 1) + (int8_queries ? nq * hd / 4 : 0) + 1 +
                          3 * nq * blocks + 2 * hd + (int8_chunks ? nq * hd + nq * hd / 8 + nq * 16 : 0) + 3 +
                          nq * blocks + nq + new_key_words;
    return 4 * words;
  };
  while (tile.tokens * tile.heads > 1 && shared_bytes(tile.tokens * tile.heads) > ctx_.limits().max_shared_bytes) {
    if (tile.tokens > 1) {
      tile.tokens = (tile.tokens + 1) / 2;
    } else {
      tile.heads = 1;
    }
  }
  return tile;
}

Status Ops::AttnScores(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                       int64_t q_row0, int64_t n_tokens, int64_t pos0, const Buffer& scores, const Buffer* stats,
                       const ScratchOffsets& at, const RopeTable* q_rope, const NewKeys* new_keys) {
  KVFS_ASSIGN_OR_RETURN(const AttnCall call,
                        PlanScores(kv, shape, q, q_stride, q_row0, n_tokens, pos0, scores, stats, at, q_rope, new_keys));
  return RecordCall(rec, call);
}

Result<Ops::AttnCall> Ops::PlanScores(const KvView& kv, const AttentionShape& shape, const Buffer& q,
                                      int64_t q_stride, int64_t q_row0, int64_t n_tokens, int64_t pos0,
                                      const Buffer& scores, const Buffer* stats, const ScratchOffsets& at,
                                      const RopeTable* q_rope, const NewKeys* new_keys) {
  if (new_keys != nullptr && (q_rope == nullptr || !ScoresReadNewKeys(kv.format, n_tokens, pos0))) {
    return Internal("attn_scores takes new keys from K rows for f16 and staged q4k keys, with RoPE, in decode");
  }
  const bool q4k = kv.format.KeysByChannel();
  const uint32_t wg = U32(ScoreGroupPositions(kv.format));  // one stats entry per workgroup
  const ScoreTile tile = ScoreQueries(kv.format, shape, n_tokens, stats != nullptr);
  const uint32_t spec[] = {wg,
                           static_cast<uint32_t>(kv.format.type),
                           U32(kv.format.group),
                           U32(shape.head_dim),
                           kv.format.RotatesK() ? 1u : 0u,
                           q4k ? U32(kv.format.chunk) : 64u,
                           stats != nullptr ? 1u : 0u,
                           RopeMode(q_rope),
                           U32(tile.tokens),
                           U32(tile.heads),
                           new_keys != nullptr ? U32(kNewKeyTokens) : 0u};
  const int64_t n_ctx = pos0 + n_tokens;
  const ScoresParams params{U32(pos0),
                            U32(shape.n_head),
                            U32(shape.n_head / shape.n_head_kv),
                            U32(q_stride),
                            U32(q_row0),
                            U32(n_ctx),
                            U32(kv.block_tokens),
                            U32(kv.row_stride),
                            kv.table0,
                            InvSqrtHeadDim(shape.head_dim),
                            U32(kv.k_slot_bytes / 4),
                            U32(shape.n_head_kv * shape.head_dim),
                            U32(kv.key_row0),
                            U32(kv.key_pos0),
                            InvSqrtHeadDim(shape.head_dim),
                            U32(StatsPerRow(kv.format, n_ctx)),
                            U32(at.score0),
                            U32(at.stats0),
                            q_rope != nullptr ? U32(q_rope->n_rot) : 0u,
                            U32(n_tokens),
                            new_keys != nullptr ? U32(new_keys->k_stride) : 0u};
  const Buffer* keys = kv.keys != nullptr ? kv.keys : &unused_;
  const Buffer* const buffers[] = {&q,   kv.k_plane,
                                   kv.block_table, &scores,
                                   keys, stats != nullptr ? stats : &unused_,
                                   q_rope != nullptr ? q_rope->cos_sin : &unused_,
                                   new_keys != nullptr ? new_keys->k : &unused_};
  AttnCall call;
  call.shader = &kScores;
  FillCall(spec, params, buffers, &unused_, call);
  call.grid = {CeilDiv(n_ctx, wg), U32(shape.n_head / tile.heads), CeilDiv(n_tokens, tile.tokens)};
  call.flat_dim = 0;  // the calls of a step share the heads (y)
  return call;
}

Ops::AttnCall Ops::PlanSoftmax(const Buffer& scores, int64_t n_head, int64_t n_tokens, int64_t pos0,
                               int64_t score_stride, float scale, bool round_f16, int64_t score0) const {
  const uint32_t spec[] = {kRowGroup};
  const SoftmaxParams params{U32(pos0), U32(n_head), U32(score_stride), round_f16 ? 1u : 0u, scale, U32(score0)};
  const Buffer* const buffers[] = {&scores};
  AttnCall call;
  call.shader = &kSoftmax;
  FillCall(spec, params, buffers, &unused_, call);
  call.grid = {U32(n_head), U32(n_tokens), 1u};
  call.flat_dim = 1;  // the calls share the heads (x)
  return call;
}

Status Ops::Softmax(Recorder& rec, const Buffer& scores, int64_t n_head, int64_t n_tokens, int64_t pos0,
                    int64_t score_stride, float scale, bool round_f16, int64_t score0) {
  return RecordCall(rec, PlanSoftmax(scores, n_head, n_tokens, pos0, score_stride, scale, round_f16, score0));
}

Ops::AttnCall Ops::SoftmaxCall(const PlannedJob& p, const AttentionShape& shape, const AttentionScratch& scratch) const {
  const AttentionJob& j = *p.job;
  return PlanSoftmax(*scratch.scores, shape.n_head, j.n_tokens, j.pos0, j.pos0 + j.n_tokens,
                     InvSqrtHeadDim(shape.head_dim), j.kv.format.type == KvType::kF16, p.at.score0);
}

Status Ops::AttnOutput(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& scores,
                       int64_t n_tokens, int64_t pos0, const Buffer& out, int64_t out_stride, int64_t out_row0,
                       int64_t n_splits, const Buffer* partials, const Buffer* stats, const ScratchOffsets& at,
                       const OutputCodes* codes, const Buffer* counters) {
  KVFS_ASSIGN_OR_RETURN(const AttnCall call, PlanOutput(kv, shape, scores, n_tokens, pos0, out, out_stride, out_row0,
                                                        n_splits, partials, stats, at, codes, counters));
  return RecordCall(rec, call);
}

Result<Ops::AttnCall> Ops::PlanOutput(const KvView& kv, const AttentionShape& shape, const Buffer& scores,
                                      int64_t n_tokens, int64_t pos0, const Buffer& out, int64_t out_stride,
                                      int64_t out_row0, int64_t n_splits, const Buffer* partials, const Buffer* stats,
                                      const ScratchOffsets& at, const OutputCodes* codes, const Buffer* counters) {
  const int64_t heads = OutputHeads(shape);
  const bool one_pass = counters != nullptr && n_splits > 1;
  if (codes != nullptr && n_splits > 1 && !one_pass) {
    return Internal("attn_output's partial sums are quantized by attn_reduce, or in one pass with counters");
  }
  if (codes != nullptr && !QuantizesAttentionOutput(shape, codes->kind)) {
    return Internal("attn_output cannot quantize its output for this shape (QuantizesAttentionOutput)");
  }
  const int64_t n_ctx = pos0 + n_tokens;
  const int64_t split_positions = SplitPositions(n_ctx, n_splits, kv.block_tokens);
  if (stats != nullptr && split_positions > kFusedSplitCap) {
    return Internal("attn_output's fused softmax takes splits of at most 128 positions (FusesSoftmax)");
  }
  // Several tokens a workgroup where each token's weights are a row of their own in `scores`
  // (q4: fewer where the tiles' codes would not fit the device's shared memory).
  int64_t tokens = query_tiles_ && stats == nullptr && n_splits == 1
                       ? std::clamp<int64_t>(std::min(kOutputSums / heads, TileTokensFor(n_tokens)), 1,
                                             kMaxOutputTokens)
                       : 1;
  const auto shared_bytes = [&](int64_t t) {
    return OutputSharedBytes(shape, heads, codes != nullptr, OutputTileCodeBytes(kv.format, shape, heads, t));
  };
  while (tokens > 1 && shared_bytes(tokens) > ctx_.limits().max_shared_bytes) tokens /= 2;
  if (shared_bytes(tokens) > ctx_.limits().max_shared_bytes) {
    return Unsupported(fmt::format("attn_output over {} query heads of {} values needs {} bytes of shared memory; the "
                                   "device has {}",
                                   heads, shape.head_dim, shared_bytes(tokens), ctx_.limits().max_shared_bytes));
  }
  const uint32_t spec[] = {kRowGroup,
                           static_cast<uint32_t>(kv.format.type),
                           U32(kv.format.group),
                           U32(shape.head_dim),
                           kv.format.RotatesV() ? 1u : 0u,
                           U32(heads),
                           stats != nullptr ? 1u : 0u,
                           U32(kFusedSplitCap),
                           CodesKind(codes),
                           one_pass ? 1u : 0u,
                           U32(tokens)};
  const OutputParams params{U32(pos0),
                            U32(shape.n_head),
                            U32(shape.n_head / shape.n_head_kv),
                            U32(n_ctx),
                            U32(kv.block_tokens),
                            U32(kv.row_stride),
                            kv.table0,
                            U32(out_stride),
                            U32(out_row0),
                            InvSqrtHeadDim(shape.head_dim),
                            U32(split_positions),
                            U32(n_splits),
                            InvSqrtHeadDim(shape.head_dim),
                            kv.format.type == KvType::kF16 ? 1u : 0u,
                            U32(StatsPerRow(kv.format, n_ctx)),
                            U32(ScoreGroupPositions(kv.format)),
                            U32(at.score0),
                            U32(at.partial0),
                            U32(at.stats0),
                            U32(at.counter0),
                            U32(n_tokens)};
  const Buffer* const buffers[] = {&scores,
                                   kv.v_plane,
                                   kv.block_table,
                                   &out,
                                   partials != nullptr ? partials : &unused_,
                                   stats != nullptr ? stats : &unused_,
                                   codes != nullptr ? codes->acts.codes : &unused_,
                                   codes != nullptr ? codes->acts.aux : &unused_,
                                   one_pass ? counters : &unused_};
  AttnCall call;
  call.shader = subgroup_trees() ? &kOutputSg : &kOutput;
  FillCall(spec, params, buffers, &unused_, call);
  call.grid = {U32(shape.n_head / heads), CeilDiv(n_tokens, tokens), U32(n_splits)};
  call.flat_dim = 1;  // the calls of a step share the head groups (x)
  return call;
}

int64_t Ops::SplitCounters(const AttentionShape& shape, int64_t n_tokens) {
  return n_tokens * (shape.n_head / OutputHeads(shape));
}

Result<const Pipeline*> Ops::ReducePipeline(const KvView& kv, const AttentionShape& shape, const OutputCodes* codes) {
  const int64_t heads = OutputHeads(shape);
  const uint32_t spec[] = {ReduceGroup(heads * shape.head_dim), U32(shape.head_dim), kv.format.RotatesV() ? 1u : 0u,
                           U32(heads), CodesKind(codes)};
  return pipelines_.Get(subgroup_trees() ? kReduceSg : kReduce, spec);
}

Status Ops::AttnReduce(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& partials,
                       int64_t n_tokens, int64_t n_splits, const Buffer& out, int64_t out_stride, int64_t out_row0,
                       int64_t partial0, const OutputCodes* codes) {
  if (codes != nullptr && !QuantizesAttentionOutput(shape, codes->kind)) {
    return Internal("attn_reduce cannot quantize its output for this shape (QuantizesAttentionOutput)");
  }
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, ReducePipeline(kv, shape, codes));
  const int64_t heads = OutputHeads(shape);
  const ReduceParams params{U32(shape.n_head), U32(n_splits), U32(out_stride), U32(out_row0),
                            InvSqrtHeadDim(shape.head_dim), U32(partial0)};
  return rec.Dispatch(*p,
                      {&partials, &out, codes != nullptr ? codes->acts.codes : &unused_,
                       codes != nullptr ? codes->acts.aux : &unused_},
                      &params, U32(shape.n_head / heads), U32(n_tokens));
}

bool Ops::QuantizesAttentionOutput(const AttentionShape& shape, ActKind kind) const {
  if (kind == ActKind::kFloat) return false;
  const int64_t heads = OutputHeads(shape), values = heads * shape.head_dim;
  if (values % (kind == ActKind::kQ8_K ? 256 : 32) != 0) return false;
  const int64_t output_shared = OutputSharedBytes(shape, heads, true, OutputTileCodeBytesAtMost(heads));
  const int64_t reduce_shared = 4 * values + QuantizerSharedBytes(ReduceGroup(values), true);
  return std::max(output_shared, reduce_shared) <= ctx_.limits().max_shared_bytes;
}

bool Ops::FusesSoftmax(const KvView& kv, const AttentionShape& shape, int64_t n_tokens, int64_t pos0,
                       int64_t n_splits, int64_t stats_floats) const {
  if (!fuse_softmax_ || n_tokens > kSplitTokens) return false;
  const int64_t n_ctx = pos0 + n_tokens;
  if (SplitPositions(n_ctx, n_splits, kv.block_tokens) > kFusedSplitCap) return false;
  return n_tokens * shape.n_head * StatsPerRow(kv.format, n_ctx) * 2 <= stats_floats;
}

int64_t Ops::AttentionSplits(const AttentionShape& shape, int64_t n_tokens, int64_t pos0,
                             int64_t partial_floats) const {
  if (n_tokens > kSplitTokens) return 1;
  const int64_t fit = partial_floats / (n_tokens * shape.n_head * shape.head_dim);
  const int64_t split = split_positions_;
  return std::clamp<int64_t>((pos0 + n_tokens + split - 1) / split, 1, std::max<int64_t>(1, std::min(kMaxSplits, fit)));
}

Status Ops::Attention(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                      int64_t q_row0, int64_t n_tokens, int64_t pos0, const Buffer& scores, const Buffer& partials,
                      int64_t partial_floats, const Buffer& out, int64_t out_stride, int64_t out_row0,
                      const Buffer* stats, int64_t stats_floats) {
  const AttentionJob job{kv, q_row0, n_tokens, pos0, out_row0};
  const AttentionScratch scratch{&scores,       scores.bytes() / 4, &partials, partial_floats, stats,
                                 stats_floats};
  return AttentionBatch(rec, shape, q, q_stride, out, out_stride, std::span<const AttentionJob>(&job, 1), scratch);
}

Result<Ops::PlannedJob> Ops::PlanJob(const AttentionJob& j, const AttentionShape& shape,
                                     const AttentionScratch& scratch, const ScratchOffsets& at) const {
  const int64_t n_ctx = j.pos0 + j.n_tokens;
  const int64_t score_floats = j.n_tokens * shape.n_head * n_ctx;
  if (score_floats > scratch.score_floats) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("attention of {} tokens over a context of {} needs {} floats of scores; the scratch "
                              "holds {}",
                              j.n_tokens, n_ctx, score_floats, scratch.score_floats));
  }
  PlannedJob p{&j, AttentionSplits(shape, j.n_tokens, j.pos0, scratch.partial_floats), false, false, at, {}};
  p.fused = scratch.stats != nullptr && FusesSoftmax(j.kv, shape, j.n_tokens, j.pos0, p.n_splits, scratch.stats_floats);
  // One pass where the counters can take the job even alone (else attn_reduce adds up).
  const int64_t counters = SplitCounters(shape, j.n_tokens);
  p.one_pass = p.n_splits > 1 && scratch.counters != nullptr && counters <= scratch.counter_words;
  p.takes.score0 = score_floats;
  p.takes.partial0 = p.n_splits > 1 ? j.n_tokens * shape.n_head * p.n_splits * shape.head_dim : 0;
  p.takes.stats0 = p.fused ? j.n_tokens * shape.n_head * StatsPerRow(j.kv.format, n_ctx) : 0;
  p.takes.counter0 = p.one_pass ? counters : 0;
  return p;
}

Result<Ops::AttnCall> Ops::ScoresCall(const PlannedJob& p, const AttentionShape& shape, const Buffer& q,
                                      int64_t q_stride, const AttentionScratch& scratch, const RopeTable* q_rope,
                                      const NewKeys* new_keys) {
  const AttentionJob& j = *p.job;
  return PlanScores(j.kv, shape, q, q_stride, j.q_row0, j.n_tokens, j.pos0, *scratch.scores,
                    p.fused ? scratch.stats : nullptr, p.at, q_rope, new_keys);
}

Result<Ops::AttnCall> Ops::OutputCall(const PlannedJob& p, const AttentionShape& shape, const Buffer& out,
                                      int64_t out_stride, const AttentionScratch& scratch, const OutputCodes* codes) {
  const AttentionJob& j = *p.job;
  return PlanOutput(j.kv, shape, *scratch.scores, j.n_tokens, j.pos0, out, out_stride, j.out_row0, p.n_splits,
                    p.n_splits > 1 ? scratch.partials : nullptr, p.fused ? scratch.stats : nullptr, p.at,
                    p.reduces() ? nullptr : codes, p.one_pass ? scratch.counters : nullptr);
}

Status Ops::AttentionBatch(Recorder& rec, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                           const Buffer& out, int64_t out_stride, std::span<const AttentionJob> jobs,
                           const AttentionScratch& scratch, const OutputCodes* codes, const RopeTable* q_rope,
                           const NewKeys* new_keys) {
  if (codes != nullptr && !QuantizesAttentionOutput(shape, codes->kind)) {
    return Internal("the attention output cannot be quantized for this shape (QuantizesAttentionOutput)");
  }
  std::vector<PlannedJob>& round = round_;  // kept between calls: no allocation per layer
  round.clear();
  // Records the steps of the jobs in `round`, a barrier between steps.
  auto record_round = [&]() -> Status {
    calls_.clear();
    for (const PlannedJob& p : round) {
      KVFS_ASSIGN_OR_RETURN(AttnCall call, ScoresCall(p, shape, q, q_stride, scratch, q_rope, new_keys));
      calls_.push_back(call);
    }
    KVFS_RETURN_IF_ERROR(RecordCalls(rec, calls_));
    rec.Barrier();
    calls_.clear();
    for (const PlannedJob& p : round) {
      if (!p.fused) calls_.push_back(SoftmaxCall(p, shape, scratch));
    }
    KVFS_RETURN_IF_ERROR(RecordCalls(rec, calls_));
    if (!calls_.empty()) rec.Barrier();
    bool reduce = false;
    calls_.clear();
    for (const PlannedJob& p : round) {
      KVFS_ASSIGN_OR_RETURN(AttnCall call, OutputCall(p, shape, out, out_stride, scratch, codes));
      calls_.push_back(call);
      reduce = reduce || p.reduces();
    }
    KVFS_RETURN_IF_ERROR(RecordCalls(rec, calls_));
    if (!reduce) return Status::Ok();
    rec.Barrier();
    for (const PlannedJob& p : round) {
      if (!p.reduces()) continue;
      const AttentionJob& j = *p.job;
      KVFS_RETURN_IF_ERROR(AttnReduce(rec, j.kv, shape, *scratch.partials, j.n_tokens, p.n_splits, out, out_stride,
                                      j.out_row0, p.at.partial0, codes));
    }
    return Status::Ok();
  };
  ScratchOffsets used;  // what the round takes so far
  for (const AttentionJob& j : jobs) {
    KVFS_ASSIGN_OR_RETURN(PlannedJob p, PlanJob(j, shape, scratch, used));
    const bool fits = used.score0 + p.takes.score0 <= scratch.score_floats &&
                      used.partial0 + p.takes.partial0 <= scratch.partial_floats &&
                      2 * (used.stats0 + p.takes.stats0) <= scratch.stats_floats &&
                      used.counter0 + p.takes.counter0 <= scratch.counter_words;
    if (!fits) {  // the next round reuses the scratch once this one is done with it
      KVFS_RETURN_IF_ERROR(record_round());
      rec.Barrier();
      round.clear();
      used = {};
      p.at = used;
    }
    round.push_back(p);
    used.score0 += p.takes.score0;
    used.partial0 += p.takes.partial0;
    used.stats0 += p.takes.stats0;
    used.counter0 += p.takes.counter0;
  }
  return round.empty() ? Status::Ok() : record_round();
}

Ops::ScratchBytes Ops::BackendScratch(int64_t max_binding_bytes, int64_t device_memory_bytes) {
  // Scores: a prompt whose scores do not fit runs its attention in jobs of consecutive tokens,
  // one after another, and each job's weighted sums have few workgroups (llama3.1-8b, 512
  // tokens at depth 3500: 64 MiB makes four jobs of 130 tokens, 136 workgroups each, about one
  // per multiprocessor of an H200: a latency-bound quarter of the device). A 64th of the
  // device's memory, 64 to 512 MiB: one job there on a GPU of 32 GiB or more.
  // Decode attention's split sums: 16 MiB holds those of 32 sequences at 4096 positions (32
  // heads of 128 values, splits of 128 positions), all recorded side by side; stats: 8 bytes
  // per (token, head, 64 positions), decode of 4 tokens with 32 heads to 256k positions.
  constexpr int64_t kMiB = int64_t{1} << 20;
  const int64_t scores = std::clamp(device_memory_bytes / 64, 64 * kMiB, 512 * kMiB);
  constexpr int64_t kPartials = 16 * kMiB, kStats = 4 * kMiB;
  return {std::min(scores, max_binding_bytes), std::min(kPartials, max_binding_bytes),
          std::min(kStats, max_binding_bytes)};
}

Result<const Pipeline*> Ops::CallPipeline(const AttnCall& call, bool merged) {
  std::array<uint32_t, std::tuple_size_v<decltype(call.spec)>> spec = call.spec;
  spec[call.n_spec - 1] = merged ? 1u : 0u;  // JOBS
  return pipelines_.Get(*call.shader, std::span(spec.data(), call.n_spec));
}

Result<Ops::StepPipelines> Ops::PlanAttentionStep(const KvView& kv, const AttentionShape& shape, int64_t n_tokens,
                                                  int64_t pos0, int64_t max_binding_bytes, RopeStyle rope_style,
                                                  int64_t n_rot, ActKind o_kind) {
  const Buffer none;  // planning binds nothing
  const ScratchBytes bytes = BackendScratch(max_binding_bytes, ctx_.info().memory_bytes);
  const AttentionScratch scratch{&none, bytes.scores / 4, &none, bytes.partials / 4,
                                 &none, bytes.stats / 4,  &none, kCounterWords};
  const RopeTable rope{&none, n_rot, rope_style};
  const NewKeys new_keys{&none, shape.n_head_kv * shape.head_dim};
  const OutputCodes codes{o_kind, {&none, &none}};
  const bool quantizes = QuantizesAttentionOutput(shape, o_kind);
  // A step whose scores exceed the scratch is split into jobs of consecutive tokens, as the
  // backend splits it: the first job's pipelines (the others' differ at most in their last tile).
  const int64_t job_tokens = std::clamp<int64_t>(scratch.score_floats / (shape.n_head * (pos0 + n_tokens)), 1, n_tokens);
  const AttentionJob job{kv, 0, job_tokens, pos0, 0};
  // The scores make the new keys where the step is one job that can (the backend's rule).
  const bool makes_new_keys = job_tokens == n_tokens && ScoresReadNewKeys(kv.format, n_tokens, pos0);
  KVFS_ASSIGN_OR_RETURN(const PlannedJob p, PlanJob(job, shape, scratch, {}));
  StepPipelines out;
  KVFS_ASSIGN_OR_RETURN(out.kv_store, KvStorePipeline(kv, shape, &rope, /*table=*/true));
  KVFS_ASSIGN_OR_RETURN(const AttnCall scores,
                        ScoresCall(p, shape, none, 0, scratch, &rope, makes_new_keys ? &new_keys : nullptr));
  KVFS_ASSIGN_OR_RETURN(const AttnCall output, OutputCall(p, shape, none, 0, scratch, quantizes ? &codes : nullptr));
  for (int merged = 0; merged < 2; ++merged) {
    KVFS_ASSIGN_OR_RETURN(out.scores[merged], CallPipeline(scores, merged == 1));
    KVFS_ASSIGN_OR_RETURN(out.output[merged], CallPipeline(output, merged == 1));
  }
  if (!p.fused) {
    const AttnCall softmax = SoftmaxCall(p, shape, scratch);
    for (int merged = 0; merged < 2; ++merged) {
      KVFS_ASSIGN_OR_RETURN(out.softmax[merged], CallPipeline(softmax, merged == 1));
    }
  }
  if (p.reduces()) {
    KVFS_ASSIGN_OR_RETURN(out.reduce, ReducePipeline(kv, shape, quantizes ? &codes : nullptr));
  }
  return out;
}

}  // namespace kvfs::vk
