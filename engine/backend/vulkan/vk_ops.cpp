#include "engine/backend/vulkan/vk_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <spdlog/fmt/fmt.h>

namespace kvfs::vk {

namespace {

// Push-constant blocks, field for field the `Params` of each shader.
struct EmbedParams {
  uint32_t n, row_bytes, row0, n_rows, n_tokens;
};
struct RmsNormParams {
  uint32_t n, x_stride, y_stride, gather;
  float eps;
};
struct QuantizeParams {
  uint32_t n, n_rows, x_stride, y_stride;
  float eps;
  uint32_t blocks_per_group;
};
struct MatQuantParams {
  uint32_t n_units, row_bytes, n_rows, row_begin, n_tokens, y_stride, y_col0, flags, seg1, seg2, y1_stride, y2_stride;
};
struct MatFloatParams {
  uint32_t n_in, row_bytes, n_rows, row_begin, n_tokens, x_stride, y_stride, y_col0, flags, seg1, seg2, y1_stride,
      y2_stride;
};
struct RopeParams {
  uint32_t n_heads, head_dim, n_rot, x_stride, n_tokens;
};
struct SwiGluParams {
  uint32_t n;
};
struct KvStoreParams {
  uint32_t n_tokens, pos0, src_stride, src_row0, block_tokens, table0;
  float hadamard_scale;
  uint32_t n_rot;
};
struct ScoresParams {
  uint32_t pos0, n_head, group, q_stride, q_row0, score_stride, block_tokens, row_stride, table0;
  float hadamard_scale;
  uint32_t slot_words, n_channels, key_row0, key_pos0;
  float scale;
  uint32_t stats_stride, score0, stats0, n_rot;
};
struct KStageParams {
  uint32_t n_tokens, row_words, src_stride, src_row0, dst_row0;
};
struct KChunksParams {
  uint32_t n_channels, chunk0, n_chunks, key_row0, key_pos0, block_tokens, table0, slot_words;
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
  uint32_t round_f16, stats_stride, stats_positions, score0, partial0, stats0;
};
struct ReduceParams {
  uint32_t n_head, n_splits, out_stride, out_row0;
  float hadamard_scale;
  uint32_t partial0;
};

constexpr ShaderInterface kEmbed{"embed", 3, sizeof(EmbedParams)};
constexpr ShaderInterface kRmsNorm{"rms_norm", 4, sizeof(RmsNormParams)};
constexpr ShaderInterface kRmsNormSg{"rms_norm_sg", 4, sizeof(RmsNormParams)};
constexpr ShaderInterface kQuantize{"quantize_act", 5, sizeof(QuantizeParams)};
constexpr ShaderInterface kQuantizeSg{"quantize_act_sg", 5, sizeof(QuantizeParams)};
constexpr ShaderInterface kMatvecQuant{"matvec_quant", 7, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatmulQuant{"matmul_quant", 7, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatvecQuantIdot{"matvec_quant_idot", 7, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatvecQuantSg{"matvec_quant_sg", 7, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatvecQuantIdotSg{"matvec_quant_idot_sg", 7, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatmulQuantIdot{"matmul_quant_idot", 7, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatvecFloat{"matvec_float", 6, sizeof(MatFloatParams)};
constexpr ShaderInterface kMatvecFloatSg{"matvec_float_sg", 6, sizeof(MatFloatParams)};
constexpr ShaderInterface kMatmulFloat{"matmul_float", 6, sizeof(MatFloatParams)};
constexpr ShaderInterface kMatmulF32{"matmul_f32", 6, sizeof(MatFloatParams)};
constexpr ShaderInterface kRope{"rope", 2, sizeof(RopeParams)};
constexpr ShaderInterface kSwiGlu{"swiglu", 3, sizeof(SwiGluParams)};
constexpr ShaderInterface kKvStore{"kv_store", 6, sizeof(KvStoreParams)};
constexpr ShaderInterface kScores{"attn_scores", 7, sizeof(ScoresParams)};
constexpr ShaderInterface kKStage{"k_stage", 2, sizeof(KStageParams)};
constexpr ShaderInterface kKChunks{"k_chunks", 3, sizeof(KChunksParams)};
constexpr ShaderInterface kSoftmax{"softmax", 1, sizeof(SoftmaxParams)};
constexpr ShaderInterface kOutput{"attn_output", 8, sizeof(OutputParams)};
constexpr ShaderInterface kOutputSg{"attn_output_sg", 8, sizeof(OutputParams)};
constexpr ShaderInterface kReduce{"attn_reduce", 4, sizeof(ReduceParams)};
constexpr ShaderInterface kReduceSg{"attn_reduce_sg", 4, sizeof(ReduceParams)};
// The most storage buffers a shader binds (Vulkan only guarantees 4 per stage).
constexpr uint32_t kMostBuffers = std::max(kMatvecQuant.n_buffers, kOutput.n_buffers);

// Workgroup sizes. Small batches go to the matrix-vector shaders, larger ones to the tiled
// matrix-matrix shaders (which stage operands in shared memory).
constexpr uint32_t kElementwiseGroup = 64;
constexpr uint32_t kRowGroup = 256;      // rms_norm, softmax, attn_output, quantize_act
// quantize_act with the norm: about this many workgroups in all (each reads its row whole).
constexpr int64_t kQuantizeSpreadGroups = 128;
constexpr int64_t kMatvecMaxTokens = 8;  // beyond this, matmul_* shaders
constexpr uint32_t kTileRows = 64;
// Attention of a few tokens (decode) spreads each (token, head) over workgroups of about
// Ops::attention_split_positions() positions, at most kMaxSplits of them.
constexpr int64_t kSplitTokens = 4;
constexpr int64_t kMaxSplits = 256;
// attn_output takes all the query heads of a KV head in one workgroup (each value read once for
// all of them) when there are at most this many. Its shared memory, 4 * heads * (kRowGroup +
// head_dim) bytes, then stays within about the 16 KiB every device has (head_dim <= kRowGroup;
// 20 bytes over at 8 heads of 256, CheckAttentionShape says so), plus the quantizer's 5 KiB
// where it quantizes its output (QuantizesAttentionOutput checks the device's limit).
constexpr int64_t kMaxOutputHeads = 8;
// The fused softmax folds the stats with 32 invocations per head of a workgroup.
static_assert(kMaxOutputHeads * 32 <= kRowGroup);
// attn_output's fused softmax keeps a split's weights in shared memory (in its array of
// kRowGroup floats per head): splits of at most this many positions (the default split) take
// it, longer ones run softmax.comp first.
constexpr int64_t kFusedSplitCap = Ops::kDefaultAttentionSplit;
static_assert(kFusedSplitCap <= kRowGroup);

uint32_t U32(int64_t v) { return static_cast<uint32_t>(v); }

// 1 / sqrt(head_dim): the orthonormal Walsh-Hadamard transform's scale, and the softmax's scale
// of the scores.
float InvSqrtHeadDim(int64_t head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

// Query heads per attn_output workgroup: all those of a KV head, when few enough.
int64_t OutputHeads(const AttentionShape& shape) {
  const int64_t group = shape.n_head / shape.n_head_kv;
  return group <= kMaxOutputHeads ? group : 1;
}

// attn_reduce's workgroup: a power of two in [64, kRowGroup] covering its heads' values.
uint32_t ReduceGroup(int64_t values) {
  uint32_t wg = 64;
  while (wg < kRowGroup && wg < values) wg *= 2;
  return wg;
}

// The quantizer's shared arrays (quantize_block.glsl): 5 words per invocation when quantizing.
int64_t QuantizerSharedBytes(uint32_t group, const OutputCodes* codes) {
  return codes != nullptr ? int64_t{20} * group : 20;
}

// The spec constant ROPE of kv_store and attn_scores: 0 none, 1 pairs (2i, 2i+1), 2 NeoX pairs.
uint32_t RopeMode(const Ops::RopeTable* rope) {
  return rope == nullptr ? 0u : (rope->style == RopeStyle::kNeox ? 2u : 1u);
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

// Invocations per row of the matrix-vector shaders: enough for the row's work items (32-value
// units, or groups of 8 float values), a power of two in [4, max_lanes]; short rows share a
// workgroup instead of leaving invocations idle. At least 4: lane t writes token t.
uint32_t MatvecLanes(int64_t work_items, uint32_t max_lanes) {
  uint32_t lanes = 4;
  while (lanes < max_lanes && lanes < work_items) lanes *= 2;
  return lanes;
}
uint32_t CeilDiv(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

// Stats entries per (token, head) row of decode attention's fused softmax: one per attn_scores
// workgroup over the context.
int64_t StatsPerRow(const KvFormat& format, int64_t n_ctx) {
  return CeilDiv(n_ctx, Ops::ScoreGroupPositions(format));
}

// Rows per slot of matvec_quant: each activation unit it loads serves that many rows, as many
// as leave at least shape.min_groups workgroups (enough to keep a large GPU's cores busy).
uint32_t MatvecRowsPerSlot(int64_t n_rows, uint32_t slots_per_group, const MatvecShape& shape) {
  uint32_t rows = 1;
  while (rows < shape.max_rows && n_rows / (int64_t{slots_per_group} * rows * 2) >= shape.min_groups) rows *= 2;
  return rows;
}
// The most tokens a matrix-vector dispatch takes (its TOKENS).
constexpr uint32_t kMatvecTokens = 4;

int64_t KvRowWords(const KvView& kv) { return kv.row_stride / 4; }

// Heads per kv_store workgroup: the fewest that hold whole groups and end at a word boundary,
// so a decode step's row spreads over several workgroups; the whole row for q4k (row-wide
// units) and for groups that span heads.
int64_t KvSegmentHeads(const KvFormat& f, const AttentionShape& shape) {
  if (f.type == KvType::kQ4K || shape.head_dim % f.group != 0) return shape.n_head_kv;
  const int64_t head_bytes = f.RowBytes(shape.head_dim);
  for (int64_t h = 1; h < shape.n_head_kv; ++h) {
    if (shape.n_head_kv % h == 0 && h * head_bytes % 4 == 0) return h;
  }
  return shape.n_head_kv;
}

}  // namespace

ActKind ActKindFor(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0: return ActKind::kQ8_0;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1: return ActKind::kQ8_1;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return ActKind::kQ8_K;
    default: return ActKind::kFloat;
  }
}

bool SupportedWeightType(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return true;
    default: return false;
  }
}

Result<std::unique_ptr<Ops>> Ops::Create(Context& ctx, PipelineCache& pipelines) {
  // The row and tile shaders use workgroups of 256 invocations and up to ~12 KiB of shared
  // memory (Vulkan only guarantees 128 and 16 KiB).
  if (ctx.limits().max_group_invocations < 256 || ctx.limits().max_group_size_x < 256 ||
      ctx.limits().max_shared_bytes < 16384) {
    return Unsupported(fmt::format("Vulkan device {} allows {} invocations and {} bytes of shared memory per "
                                   "workgroup; the shaders need 256 and 16384",
                                   ctx.info().name,
                                   std::min(ctx.limits().max_group_invocations, ctx.limits().max_group_size_x),
                                   ctx.limits().max_shared_bytes));
  }
  if (ctx.limits().max_storage_buffers < kMostBuffers) {
    return Unsupported(fmt::format("Vulkan device {} lets a shader bind {} storage buffers; the shaders need {}",
                                   ctx.info().name, ctx.limits().max_storage_buffers, kMostBuffers));
  }
  std::unique_ptr<Ops> ops(new Ops(ctx, pipelines));
  KVFS_ASSIGN_OR_RETURN(ops->unused_, ctx.CreateBuffer(16, MemoryKind::kDevice));
  return ops;
}

Status Ops::set_matvec_shape(const MatvecShape& shape) {
  auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
  if (!pow2(shape.group) || !pow2(shape.max_lanes) || !pow2(shape.max_rows) || shape.min_groups < 1) {
    return InvalidArgument("the matrix-vector group, lanes and rows must be powers of two, min groups at least 1");
  }
  const uint32_t device_group = std::min(ctx_.limits().max_group_invocations, ctx_.limits().max_group_size_x);
  if (shape.max_lanes < 4 || shape.max_lanes > shape.group || shape.group > device_group) {
    return InvalidArgument(fmt::format("matrix-vector lanes must lie in [4, group] and the group within the device's "
                                       "{} invocations (lanes {}, group {})",
                                       device_group, shape.max_lanes, shape.group));
  }
  // matvec_quant's partial sums: rows x tokens floats per invocation.
  const int64_t shared = int64_t{shape.max_rows} * kMatvecTokens * shape.group * 4;
  if (shared > ctx_.limits().max_shared_bytes) {
    return InvalidArgument(fmt::format("{} rows per slot in workgroups of {} need {} bytes of shared memory; the "
                                       "device has {}",
                                       shape.max_rows, shape.group, shared, ctx_.limits().max_shared_bytes));
  }
  matvec_ = shape;
  return Status::Ok();
}

Status Ops::Embed(Recorder& rec, const DeviceMatrix& table, const Buffer& tokens, int64_t n_tokens, const Buffer& x) {
  const uint32_t spec[] = {kElementwiseGroup, static_cast<uint32_t>(table.type), static_cast<uint32_t>(table.layout)};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kEmbed, spec));
  for (const DeviceMatrixPart& part : table.parts) {
    const EmbedParams params{U32(table.n_in), U32(table.row_bytes), U32(part.row0), U32(part.n_rows), U32(n_tokens)};
    KVFS_RETURN_IF_ERROR(rec.Dispatch(*p, {&part.buffer, &tokens, &x}, &params,
                                      CeilDiv(CeilDiv(table.n_in, 32), kElementwiseGroup), U32(n_tokens)));
  }
  return Status::Ok();
}

Status Ops::RmsNorm(Recorder& rec, const Buffer& x, int64_t x_stride, const Buffer& w, int64_t n, float eps,
                    const Buffer& y, int64_t y_stride, int64_t n_rows, const Buffer* row_ids) {
  const uint32_t spec[] = {kRowGroup};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(subgroup_trees() ? kRmsNormSg : kRmsNorm, spec));
  const RmsNormParams params{U32(n), U32(x_stride), U32(y_stride), row_ids != nullptr ? 1u : 0u, eps};
  return rec.Dispatch(*p, {&x, &w, &y, row_ids != nullptr ? row_ids : &unused_}, &params, U32(n_rows));
}

Status Ops::QuantizeActs(Recorder& rec, ActKind kind, const Buffer& x, int64_t x_stride, int64_t n, int64_t n_rows,
                         const QuantizedActs& out) {
  return Quantize(rec, kind, QuantizeSource::kRows, x, x_stride, nullptr, n, 0.0f, nullptr, 0, n_rows, out);
}

Status Ops::NormQuantizeActs(Recorder& rec, ActKind kind, const Buffer& x, int64_t x_stride, const Buffer& w,
                             int64_t n, float eps, const Buffer& y, int64_t y_stride, int64_t n_rows,
                             const QuantizedActs& out) {
  return Quantize(rec, kind, QuantizeSource::kRmsNorm, x, x_stride, &w, n, eps, &y, y_stride, n_rows, out);
}

Status Ops::SwiGluQuantizeActs(Recorder& rec, ActKind kind, const Buffer& gate, const Buffer& up, int64_t n,
                               int64_t n_rows, const Buffer& y, const QuantizedActs& out) {
  return Quantize(rec, kind, QuantizeSource::kSwiGlu, gate, n, &up, n, 0.0f, &y, n, n_rows, out);
}

Status Ops::Quantize(Recorder& rec, ActKind kind, QuantizeSource source, const Buffer& x, int64_t x_stride,
                     const Buffer* x2, int64_t n, float eps, const Buffer* y, int64_t y_stride, int64_t n_rows,
                     const QuantizedActs& out) {
  if (kind == ActKind::kFloat) return Internal("float activations are not quantized");
  const int64_t block = kind == ActKind::kQ8_K ? 256 : 32;
  if (n % block != 0) return Internal(fmt::format("{} activations cannot be quantized in blocks of {}", n, block));
  // Workgroups of rms_norm's size, so that the norm's tree of partial sums is the same; each
  // takes kRowGroup / 32 blocks a pass, and a row spreads over as many workgroups as that
  // leaves. With the norm every workgroup of a row reads the whole row for its scale, so the
  // rows together take about kQuantizeSpreadGroups workgroups (decode: a few rows, each over
  // many; prefill: fewer per row).
  if (n == 0 || n_rows == 0) return Status::Ok();
  const bool norm = source == QuantizeSource::kRmsNorm;
  const uint32_t spec[] = {kRowGroup, static_cast<uint32_t>(kind), static_cast<uint32_t>(source)};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(subgroup_trees() ? kQuantizeSg : kQuantize, spec));
  const int64_t n_blocks = n / block, pass = kRowGroup / 32;
  const int64_t most_groups = (n_blocks + pass - 1) / pass;
  const int64_t groups_per_row =
      norm ? std::clamp<int64_t>((kQuantizeSpreadGroups + n_rows - 1) / n_rows, 1, most_groups) : most_groups;
  const int64_t blocks_per_group = ((n_blocks + groups_per_row - 1) / groups_per_row + pass - 1) / pass * pass;
  const QuantizeParams params{U32(n), U32(n_rows), U32(x_stride), U32(y_stride), eps, U32(blocks_per_group)};
  return rec.Dispatch(*p, {&x, out.codes, out.aux, x2 != nullptr ? x2 : &unused_, y != nullptr ? y : &unused_},
                      &params, CeilDiv(n_blocks, blocks_per_group), U32(n_rows));
}

Status Ops::MatMul(Recorder& rec, const DeviceMatrix& w, const MatMulArgs& a) {
  const size_t n_seg = w.segment_rows.size();
  if (n_seg > 2 || (n_seg >= 1 && a.y1 == nullptr) || (n_seg == 2 && a.y2 == nullptr)) {
    return Internal(fmt::format("a stack of {} matrices needs as many outputs", n_seg + 1));
  }
  for (const DeviceMatrixPart& part : w.parts) KVFS_RETURN_IF_ERROR(MatMulPart(rec, w, part, a));
  return Status::Ok();
}

Status Ops::MatMulPart(Recorder& rec, const DeviceMatrix& w, const DeviceMatrixPart& part, const MatMulArgs& a) {
  const bool quantized = ActKindFor(w.type) != ActKind::kFloat;
  const bool matvec = a.n_tokens <= kMatvecMaxTokens;
  const uint32_t type = static_cast<uint32_t>(w.type);
  const uint32_t layout = static_cast<uint32_t>(w.layout);
  uint32_t rows_per_group = kTileRows, tokens_per_group = 0;
  const Pipeline* p = nullptr;
  if (w.type == GgmlType::kF32) {  // one invocation per output, in the reference's order
    rows_per_group = kElementwiseGroup;
    tokens_per_group = 1;
    const uint32_t spec[] = {kElementwiseGroup};
    KVFS_ASSIGN_OR_RETURN(p, pipelines_.Get(kMatmulF32, spec));
  } else if (matvec) {
    const bool sg = subgroup_trees();
    const uint32_t lanes = MatvecLanes(quantized ? w.n_in / 32 : w.n_in / 8, matvec_.max_lanes);
    rows_per_group = matvec_.group / lanes;
    tokens_per_group = a.n_tokens == 1 ? 1 : (a.n_tokens == 2 ? 2 : kMatvecTokens);
    if (quantized) {
      const uint32_t rows_per_slot = MatvecRowsPerSlot(part.n_rows, rows_per_group, matvec_);
      rows_per_group *= rows_per_slot;
      const uint32_t spec[] = {matvec_.group, type, lanes, tokens_per_group, rows_per_slot, layout};
      const ShaderInterface& shader = ctx_.integer_dot() ? (sg ? kMatvecQuantIdotSg : kMatvecQuantIdot)
                                                         : (sg ? kMatvecQuantSg : kMatvecQuant);
      KVFS_ASSIGN_OR_RETURN(p, pipelines_.Get(shader, spec));
    } else {
      const uint32_t spec[] = {matvec_.group, type, lanes, tokens_per_group};
      KVFS_ASSIGN_OR_RETURN(p, pipelines_.Get(sg ? kMatvecFloatSg : kMatvecFloat, spec));
    }
  } else {
    tokens_per_group = a.n_tokens <= 16 ? 16 : (a.n_tokens <= 32 ? 32 : 64);
    const uint32_t spec[] = {256, type, kTileRows, tokens_per_group, quantized ? 2u : 16u, layout};
    const ShaderInterface& quant = ctx_.integer_dot() ? kMatmulQuantIdot : kMatmulQuant;
    KVFS_ASSIGN_OR_RETURN(p, pipelines_.Get(quantized ? quant : kMatmulFloat, spec));
  }
  const uint32_t flags = (a.accumulate ? 1u : 0u) | (a.bias != nullptr ? 2u : 0u);
  const Buffer* bias = a.bias != nullptr ? a.bias : &unused_;
  // Stacked matrices: rows from seg1 (seg2) on go to y1 (y2), rows of their own width.
  const std::vector<int64_t>& seg = w.segment_rows;
  const uint32_t none = 0xFFFFFFFFu;
  const uint32_t seg1 = seg.empty() ? none : U32(seg[0]), seg2 = seg.size() < 2 ? none : U32(seg[1]);
  const uint32_t y_stride = U32(seg.empty() ? w.n_out : seg[0]);
  const uint32_t y1_stride = seg.empty() ? 0u : U32((seg.size() < 2 ? w.n_out : seg[1]) - seg[0]);
  const uint32_t y2_stride = seg.size() < 2 ? 0u : U32(w.n_out - seg[1]);
  const Buffer* y1 = a.y1 != nullptr ? a.y1 : &unused_;
  const Buffer* y2 = a.y2 != nullptr ? a.y2 : &unused_;
  const uint32_t group_y = CeilDiv(a.n_tokens, tokens_per_group);
  // The grid's x dimension is limited (65535 groups on many devices): long matrices (output
  // layers of large vocabularies) take several dispatches over consecutive row ranges.
  const int64_t max_groups = ctx_.limits().max_group_count[0];
  for (int64_t r0 = 0; r0 < part.n_rows; r0 += max_groups * rows_per_group) {
    const uint32_t groups = CeilDiv(std::min(part.n_rows - r0, max_groups * rows_per_group), rows_per_group);
    if (quantized) {
      const MatQuantParams params{U32(w.n_in / 32), U32(w.row_bytes), U32(part.n_rows), U32(r0), U32(a.n_tokens),
                                  y_stride, U32(part.row0), flags, seg1, seg2, y1_stride, y2_stride};
      KVFS_RETURN_IF_ERROR(
          rec.Dispatch(*p, {&part.buffer, a.acts.codes, a.acts.aux, a.y, bias, y1, y2}, &params, groups, group_y));
    } else {
      const MatFloatParams params{U32(w.n_in), U32(w.row_bytes), U32(part.n_rows), U32(r0),   U32(a.n_tokens),
                                  U32(a.x_stride), y_stride, U32(part.row0), flags, seg1, seg2, y1_stride,
                                  y2_stride};
      KVFS_RETURN_IF_ERROR(rec.Dispatch(*p, {&part.buffer, a.x, a.y, bias, y1, y2}, &params, groups, group_y));
    }
  }
  return Status::Ok();
}

Status Ops::Rope(Recorder& rec, const Buffer& x, int64_t x_stride, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                 RopeStyle style, const Buffer& cos_sin, int64_t n_tokens) {
  const uint32_t spec[] = {kElementwiseGroup, style == RopeStyle::kNeox ? 1u : 0u};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kRope, spec));
  const RopeParams params{U32(n_heads), U32(head_dim), U32(n_rot), U32(x_stride), U32(n_tokens)};
  return rec.Dispatch(*p, {&x, &cos_sin}, &params, CeilDiv(n_heads * (n_rot / 2), kElementwiseGroup), U32(n_tokens));
}

Status Ops::SwiGlu(Recorder& rec, const Buffer& gate, const Buffer& up, const Buffer& out, int64_t n) {
  const uint32_t spec[] = {kRowGroup};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kSwiGlu, spec));
  const SwiGluParams params{U32(n)};
  // Two-dimensional grid: the shader folds y into the index.
  const uint32_t groups = CeilDiv(n, kRowGroup);
  const uint32_t gx = std::min<uint32_t>(groups, 32768), gy = CeilDiv(groups, gx);
  return rec.Dispatch(*p, {&gate, &up, &out}, &params, gx, gy);
}

Status Ops::CheckAttentionShape(const AttentionShape& shape) const {
  const int64_t hd = shape.head_dim, row_values = shape.n_head_kv * hd;
  if (hd > kRowGroup) {
    return Unsupported(fmt::format("the Vulkan attention handles head_dim up to {}, the model has {}", kRowGroup, hd));
  }
  // kv_store keeps a row's values and its encoding (at most 2 bytes a value) in shared memory.
  const int64_t kv_store_shared = row_values * 4 + (row_values * 2 + 3) / 4 * 4;
  if (kv_store_shared > ctx_.limits().max_shared_bytes) {
    return Unsupported(fmt::format("a KV row of {} values needs {} bytes of shared memory; the device has {}",
                                   row_values, kv_store_shared, ctx_.limits().max_shared_bytes));
  }
  // attn_output: the lanes' sums and the heads' values, and the quantizer's (unused) arrays.
  const int64_t output_shared = 4 * OutputHeads(shape) * (kRowGroup + hd) + QuantizerSharedBytes(kRowGroup, nullptr);
  if (output_shared > ctx_.limits().max_shared_bytes) {
    return Unsupported(fmt::format("attention over {} query heads per KV head of {} values needs {} bytes of shared "
                                   "memory; the device has {}",
                                   OutputHeads(shape), hd, output_shared, ctx_.limits().max_shared_bytes));
  }
  return Status::Ok();
}

Status Ops::KvStore(Recorder& rec, const KvView& kv, const Buffer& plane, const AttentionShape& shape,
                    const Buffer& src, int64_t src_stride, int64_t src_row0, int64_t n_tokens, int64_t pos0) {
  const KvStoreRows rows[] = {{&src, &plane}};
  return KvStoreRowsOf(rec, kv, shape, rows, src_stride, src_row0, n_tokens, pos0, nullptr);
}

Status Ops::KvStoreBoth(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& k_src,
                        const Buffer& v_src, int64_t src_stride, int64_t src_row0, int64_t n_tokens, int64_t pos0,
                        const RopeTable* k_rope) {
  if (kv.format.KeysByChannel()) return Internal("q4k keys are stored in chunks, not by kv_store");
  const KvStoreRows rows[] = {{&k_src, kv.k_plane}, {&v_src, kv.v_plane}};
  return KvStoreRowsOf(rec, kv, shape, rows, src_stride, src_row0, n_tokens, pos0, k_rope);
}

Status Ops::KvStoreRowsOf(Recorder& rec, const KvView& kv, const AttentionShape& shape,
                          std::span<const KvStoreRows> rows, int64_t src_stride, int64_t src_row0, int64_t n_tokens,
                          int64_t pos0, const RopeTable* rope) {
  const int64_t row_values = shape.n_head_kv * shape.head_dim;
  const int64_t seg_heads = KvSegmentHeads(kv.format, shape);
  const uint32_t rope_mode = RopeMode(rope);
  const uint32_t spec[] = {kElementwiseGroup,
                           static_cast<uint32_t>(kv.format.type),
                           U32(kv.format.group),
                           U32(shape.head_dim),
                           kv.format.rotate ? 1u : 0u,
                           U32(row_values),
                           U32(KvRowWords(kv)),
                           U32(seg_heads),
                           rope_mode};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kKvStore, spec));
  const KvStoreParams params{U32(n_tokens),
                             U32(pos0),
                             U32(src_stride),
                             U32(src_row0),
                             U32(kv.block_tokens),
                             kv.table0,
                             InvSqrtHeadDim(shape.head_dim),
                             rope != nullptr ? U32(rope->n_rot) : 0u};
  const KvStoreRows& second = rows.size() > 1 ? rows[1] : rows[0];
  return rec.Dispatch(*p,
                      {rows[0].src, rows[0].plane, kv.block_table, second.src, second.plane,
                       rope != nullptr ? rope->cos_sin : &unused_},
                      &params, U32(n_tokens), U32(shape.n_head_kv / seg_heads), U32(rows.size()));
}

int64_t Ops::ScoreGroupPositions(const KvFormat& format) {
  return format.KeysByChannel() ? format.chunk : kElementwiseGroup;  // q4k: a workgroup is one K chunk
}

Status Ops::AttnScores(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                       int64_t q_row0, int64_t n_tokens, int64_t pos0, const Buffer& scores, const Buffer* stats,
                       const ScratchOffsets& at, const RopeTable* q_rope) {
  const bool q4k = kv.format.KeysByChannel();
  const uint32_t wg = U32(ScoreGroupPositions(kv.format));  // one stats entry per workgroup
  const uint32_t spec[] = {wg,
                           static_cast<uint32_t>(kv.format.type),
                           U32(kv.format.group),
                           U32(shape.head_dim),
                           kv.format.RotatesK() ? 1u : 0u,
                           q4k ? U32(kv.format.chunk) : 64u,
                           stats != nullptr ? 1u : 0u,
                           RopeMode(q_rope)};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kScores, spec));
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
                            q_rope != nullptr ? U32(q_rope->n_rot) : 0u};
  const Buffer* keys = kv.keys != nullptr ? kv.keys : &unused_;
  return rec.Dispatch(*p,
                      {&q, kv.k_plane, kv.block_table, &scores, keys, stats != nullptr ? stats : &unused_,
                       q_rope != nullptr ? q_rope->cos_sin : &unused_},
                      &params, CeilDiv(n_ctx, wg), U32(shape.n_head), U32(n_tokens));
}

Status Ops::KStage(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& src, int64_t src_stride,
                   int64_t src_row0, int64_t n_tokens, int64_t pos0) {
  const uint32_t spec[] = {kElementwiseGroup};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kKStage, spec));
  const int64_t row_words = shape.n_head_kv * shape.head_dim / 2;
  const KStageParams params{U32(n_tokens), U32(row_words), U32(src_stride), U32(src_row0),
                            U32(kv.key_row0 + pos0 - kv.key_pos0)};
  return rec.Dispatch(*p, {&src, kv.keys}, &params, CeilDiv(n_tokens * row_words, kElementwiseGroup));
}

Status Ops::KChunks(Recorder& rec, const KvView& kv, const AttentionShape& shape, int64_t chunk0, int64_t n_chunks) {
  if (n_chunks <= 0) return Status::Ok();
  const uint32_t spec[] = {kElementwiseGroup, U32(kv.format.chunk)};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kKChunks, spec));
  const int64_t n_channels = shape.n_head_kv * shape.head_dim;
  const KChunksParams params{U32(n_channels),       U32(chunk0),  U32(n_chunks),
                             U32(kv.key_row0),      U32(kv.key_pos0), U32(kv.block_tokens),
                             kv.table0,             U32(kv.k_slot_bytes / 4)};
  return rec.Dispatch(*p, {kv.keys, kv.k_plane, kv.block_table}, &params, CeilDiv(n_channels, kElementwiseGroup),
                      U32(n_chunks));
}

Status Ops::Softmax(Recorder& rec, const Buffer& scores, int64_t n_head, int64_t n_tokens, int64_t pos0,
                    int64_t score_stride, float scale, bool round_f16, int64_t score0) {
  const uint32_t spec[] = {kRowGroup};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kSoftmax, spec));
  const SoftmaxParams params{U32(pos0), U32(n_head), U32(score_stride), round_f16 ? 1u : 0u, scale, U32(score0)};
  return rec.Dispatch(*p, {&scores}, &params, U32(n_head), U32(n_tokens));
}

Status Ops::AttnOutput(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& scores,
                       int64_t n_tokens, int64_t pos0, const Buffer& out, int64_t out_stride, int64_t out_row0,
                       int64_t n_splits, const Buffer* partials, const Buffer* stats, const ScratchOffsets& at,
                       const OutputCodes* codes) {
  const int64_t heads = OutputHeads(shape);
  if (codes != nullptr && !QuantizesAttentionOutput(shape, codes->kind)) {
    return Internal("attn_output cannot quantize its output for this shape (QuantizesAttentionOutput)");
  }
  const int64_t n_ctx = pos0 + n_tokens;
  const int64_t split_positions = SplitPositions(n_ctx, n_splits, kv.block_tokens);
  if (stats != nullptr && split_positions > kFusedSplitCap) {
    return Internal("attn_output's fused softmax takes splits of at most 128 positions (FusesSoftmax)");
  }
  const uint32_t spec[] = {kRowGroup,
                           static_cast<uint32_t>(kv.format.type),
                           U32(kv.format.group),
                           U32(shape.head_dim),
                           kv.format.RotatesV() ? 1u : 0u,
                           U32(heads),
                           stats != nullptr ? 1u : 0u,
                           U32(kFusedSplitCap),
                           CodesKind(codes)};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(subgroup_trees() ? kOutputSg : kOutput, spec));
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
                            U32(at.stats0)};
  return rec.Dispatch(*p,
                      {&scores, kv.v_plane, kv.block_table, &out, partials != nullptr ? partials : &unused_,
                       stats != nullptr ? stats : &unused_, codes != nullptr ? codes->acts.codes : &unused_,
                       codes != nullptr ? codes->acts.aux : &unused_},
                      &params, U32(shape.n_head / heads), U32(n_tokens), U32(n_splits));
}

Status Ops::AttnReduce(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& partials,
                       int64_t n_tokens, int64_t n_splits, const Buffer& out, int64_t out_stride, int64_t out_row0,
                       int64_t partial0, const OutputCodes* codes) {
  if (codes != nullptr && !QuantizesAttentionOutput(shape, codes->kind)) {
    return Internal("attn_reduce cannot quantize its output for this shape (QuantizesAttentionOutput)");
  }
  const int64_t heads = OutputHeads(shape);
  const uint32_t spec[] = {ReduceGroup(heads * shape.head_dim), U32(shape.head_dim), kv.format.RotatesV() ? 1u : 0u,
                           U32(heads), CodesKind(codes)};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(subgroup_trees() ? kReduceSg : kReduce, spec));
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
  const OutputCodes codes{kind, {}};
  const int64_t output_shared = 4 * heads * (kRowGroup + shape.head_dim) + QuantizerSharedBytes(kRowGroup, &codes);
  const int64_t reduce_shared = 4 * values + QuantizerSharedBytes(ReduceGroup(values), &codes);
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

Status Ops::AttentionBatch(Recorder& rec, const AttentionShape& shape, const Buffer& q, int64_t q_stride,
                           const Buffer& out, int64_t out_stride, std::span<const AttentionJob> jobs,
                           const AttentionScratch& scratch, const OutputCodes* codes, const RopeTable* q_rope) {
  if (codes != nullptr && !QuantizesAttentionOutput(shape, codes->kind)) {
    return Internal("the attention output cannot be quantized for this shape (QuantizesAttentionOutput)");
  }
  std::vector<PlannedJob>& round = round_;  // kept between calls: no allocation per layer
  round.clear();
  // Records the steps of the jobs in `round`, a barrier between steps.
  auto record_round = [&]() -> Status {
    for (const PlannedJob& p : round) {
      const AttentionJob& j = *p.job;
      KVFS_RETURN_IF_ERROR(AttnScores(rec, j.kv, shape, q, q_stride, j.q_row0, j.n_tokens, j.pos0, *scratch.scores,
                                      p.fused ? scratch.stats : nullptr, p.at, q_rope));
    }
    rec.Barrier();
    bool softmax = false, reduce = false;
    for (const PlannedJob& p : round) {
      if (p.fused) continue;
      const AttentionJob& j = *p.job;
      KVFS_RETURN_IF_ERROR(Softmax(rec, *scratch.scores, shape.n_head, j.n_tokens, j.pos0, j.pos0 + j.n_tokens,
                                   InvSqrtHeadDim(shape.head_dim), j.kv.format.type == KvType::kF16, p.at.score0));
      softmax = true;
    }
    if (softmax) rec.Barrier();
    for (const PlannedJob& p : round) {
      const AttentionJob& j = *p.job;
      KVFS_RETURN_IF_ERROR(AttnOutput(rec, j.kv, shape, *scratch.scores, j.n_tokens, j.pos0, out, out_stride,
                                      j.out_row0, p.n_splits, p.n_splits > 1 ? scratch.partials : nullptr,
                                      p.fused ? scratch.stats : nullptr, p.at, p.n_splits > 1 ? nullptr : codes));
      reduce = reduce || p.n_splits > 1;
    }
    if (!reduce) return Status::Ok();
    rec.Barrier();
    for (const PlannedJob& p : round) {
      if (p.n_splits == 1) continue;
      const AttentionJob& j = *p.job;
      KVFS_RETURN_IF_ERROR(AttnReduce(rec, j.kv, shape, *scratch.partials, j.n_tokens, p.n_splits, out, out_stride,
                                      j.out_row0, p.at.partial0, codes));
    }
    return Status::Ok();
  };
  ScratchOffsets used;  // what the round takes so far
  for (const AttentionJob& j : jobs) {
    const int64_t n_ctx = j.pos0 + j.n_tokens;
    const int64_t score_floats = j.n_tokens * shape.n_head * n_ctx;
    if (score_floats > scratch.score_floats) {
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("attention of {} tokens over a context of {} needs {} floats of scores; the scratch "
                                "holds {}",
                                j.n_tokens, n_ctx, score_floats, scratch.score_floats));
    }
    const int64_t n_splits = AttentionSplits(shape, j.n_tokens, j.pos0, scratch.partial_floats);
    const bool fused = scratch.stats != nullptr &&
                       FusesSoftmax(j.kv, shape, j.n_tokens, j.pos0, n_splits, scratch.stats_floats);
    const int64_t partial_floats = n_splits > 1 ? j.n_tokens * shape.n_head * n_splits * shape.head_dim : 0;
    const int64_t stats_entries = fused ? j.n_tokens * shape.n_head * StatsPerRow(j.kv.format, n_ctx) : 0;
    const bool fits = used.score0 + score_floats <= scratch.score_floats &&
                      used.partial0 + partial_floats <= scratch.partial_floats &&
                      2 * (used.stats0 + stats_entries) <= scratch.stats_floats;
    if (!fits) {  // the next round reuses the scratch once this one is done with it
      KVFS_RETURN_IF_ERROR(record_round());
      rec.Barrier();
      round.clear();
      used = {};
    }
    round.push_back({&j, n_splits, fused, used});
    used.score0 += score_floats;
    used.partial0 += partial_floats;
    used.stats0 += stats_entries;
  }
  return round.empty() ? Status::Ok() : record_round();
}

}  // namespace kvfs::vk
