#include "engine/backend/vulkan/vk_ops.h"

#include "engine/backend/vulkan/vk_ops_common.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <spdlog/fmt/fmt.h>

namespace kvfs::vk {

using namespace ops_detail;

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
  uint32_t x_stride, x_row0;  // matvec_quant with its norm (NORM_UNITS): x's rows and the norm's epsilon
  float eps;
  uint32_t t_begin;  // first activation row of the dispatch
};
struct MatFloatParams {
  uint32_t n_in, row_bytes, n_rows, row_begin, n_tokens, x_stride, y_stride, y_col0, flags, seg1, seg2, y1_stride,
      y2_stride, t_begin;
};
struct RopeParams {
  uint32_t n_heads, head_dim, n_rot, x_stride, n_tokens;
};
struct SwiGluParams {
  uint32_t n;
};
struct PrefetchParams {
  uint32_t first, count;  // 16-byte words
};
constexpr ShaderInterface kEmbed{"embed", 3, sizeof(EmbedParams)};
constexpr ShaderInterface kRmsNorm{"rms_norm", 4, sizeof(RmsNormParams)};
constexpr ShaderInterface kRmsNormSg{"rms_norm_sg", 4, sizeof(RmsNormParams)};
constexpr ShaderInterface kQuantize{"quantize_act", 5, sizeof(QuantizeParams)};
constexpr ShaderInterface kQuantizeSg{"quantize_act_sg", 5, sizeof(QuantizeParams)};
constexpr ShaderInterface kMatvecQuant{"matvec_quant", 10, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatmulQuant{"matmul_quant", 7, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatvecQuantIdot{"matvec_quant_idot", 10, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatvecQuantSg{"matvec_quant_sg", 10, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatvecQuantIdotSg{"matvec_quant_idot_sg", 10, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatmulQuantIdot{"matmul_quant_idot", 7, sizeof(MatQuantParams)};
constexpr ShaderInterface kMatvecFloat{"matvec_float", 6, sizeof(MatFloatParams)};
constexpr ShaderInterface kMatvecFloatSg{"matvec_float_sg", 6, sizeof(MatFloatParams)};
constexpr ShaderInterface kMatmulFloat{"matmul_float", 6, sizeof(MatFloatParams)};
constexpr ShaderInterface kMatmulF32{"matmul_f32", 6, sizeof(MatFloatParams)};
constexpr ShaderInterface kRope{"rope", 2, sizeof(RopeParams)};
constexpr ShaderInterface kSwiGlu{"swiglu", 3, sizeof(SwiGluParams)};
constexpr ShaderInterface kPrefetch{"prefetch", 2, sizeof(PrefetchParams)};
static_assert(kMatvecQuant.n_buffers <= kMostStorageBuffers);

// quantize_act with the norm: about this many workgroups in all (each reads its row whole).
constexpr int64_t kQuantizeSpreadGroups = 128;
// Small batches (up to Ops::kMatvecMaxTokens rows) go to the matrix-vector shaders, larger
// ones to the tiled matrix-matrix shaders (which stage operands in shared memory).
constexpr uint32_t kTileRows = 64;

// Invocations per row of the matrix-vector shaders: enough for the row's work items (32-value
// units, or groups of 8 float values), a power of two in [4, max_lanes]; short rows share a
// workgroup instead of leaving invocations idle. At least 4: lane t writes token t.
uint32_t MatvecLanes(int64_t work_items, uint32_t max_lanes) {
  uint32_t lanes = 4;
  while (lanes < max_lanes && lanes < work_items) lanes *= 2;
  return lanes;
}

// Rows per slot of matvec_quant: each activation unit it loads serves that many rows, as many
// as leave at least shape.min_groups workgroups (enough to keep a large GPU's cores busy).
uint32_t MatvecRowsPerSlot(int64_t n_rows, uint32_t slots_per_group, const MatvecShape& shape) {
  uint32_t rows = 1;
  while (rows < shape.max_rows && n_rows / (int64_t{slots_per_group} * rows * 2) >= shape.min_groups) rows *= 2;
  return rows;
}
// The most tokens a matrix-vector dispatch takes (its TOKENS), and what it takes for n_tokens.
constexpr uint32_t kMatvecTokens = 4;
// The most a dispatch of many rows on the matrix-vector shader takes (loaded as used there).
constexpr int64_t kMatvecWideTokens = 16;
uint32_t MatvecTokensPerGroup(int64_t n_tokens) { return n_tokens == 1 ? 1 : (n_tokens == 2 ? 2 : kMatvecTokens); }
// matvec_quant's KIND when it has no SwiGLU epilogue.
constexpr uint32_t kNoSwiGlu = 3;
// The shared memory matvec_quant declares: the partial sums (rows x tokens floats per
// invocation), the quantizer's arrays and the list of finished blocks (of a workgroup's slots x
// rows), both one-element without the SwiGLU epilogue; with the norm (norm_units > 0), the
// tree's lo halves (a float per invocation) and each token's codes (32 bytes a unit) and aux
// (16 bytes a unit), else one element of each; and 16 bytes for each vec4 array's alignment.
int64_t MatvecQuantSharedBytes(int64_t rows, int64_t tokens, uint32_t group, int64_t slots, bool swiglu,
                               int64_t norm_units = 0) {
  const int64_t finished = swiglu ? 2 * (slots * rows / 32 + 2) + 1 : 1;
  const int64_t norm = (norm_units > 0 ? int64_t{group} * 4 + tokens * norm_units * 48 : 4 + 16 + 16) + 2 * 16;
  return rows * tokens * group * 4 + QuantizerSharedBytes(group, swiglu) + 4 * finished + norm;
}

}  // namespace

MatvecShape MatvecShapeFor(const VulkanTuning& t) {
  auto narrow = [](int64_t v) { return static_cast<uint32_t>(std::min<int64_t>(v, 1 << 16)); };
  return {.group = narrow(t.matvec.group),
          .max_lanes = narrow(t.matvec.lanes > 0 ? t.matvec.lanes : t.matvec.group),
          .min_groups = t.matvec.min_groups,
          .max_rows = narrow(t.matvec.rows),
          .ahead = narrow(t.matvec.ahead),
          .norm_group = narrow(t.matvec.norm_group)};
}

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
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<Ops> ops, CreateForPlanning(ctx, pipelines));
  KVFS_ASSIGN_OR_RETURN(ops->unused_, ctx.CreateBuffer(16, MemoryKind::kDevice));
  return ops;
}

Result<std::unique_ptr<Ops>> Ops::CreateForPlanning(Context& ctx, PipelineCache& pipelines) {
  // The row and tile shaders use workgroups of 256 invocations and up to about 16 KiB of shared
  // memory (attn_output; 21 KiB where it quantizes its output, if the device has it: Vulkan only
  // guarantees 128 invocations and 16 KiB). Shaders bind up to 10 storage buffers
  // (matvec_quant, attn_output; Vulkan guarantees 4, real devices dozens or more).
  if (ctx.limits().max_group_invocations < 256 || ctx.limits().max_group_size_x < 256 ||
      ctx.limits().max_shared_bytes < 16384) {
    return Unsupported(fmt::format("Vulkan device {} allows {} invocations and {} bytes of shared memory per "
                                   "workgroup; the shaders need 256 and 16384",
                                   ctx.info().name,
                                   std::min(ctx.limits().max_group_invocations, ctx.limits().max_group_size_x),
                                   ctx.limits().max_shared_bytes));
  }
  if (ctx.limits().max_storage_buffers < kMostStorageBuffers) {
    return Unsupported(fmt::format("Vulkan device {} lets a shader bind {} storage buffers; the shaders need {}",
                                   ctx.info().name, ctx.limits().max_storage_buffers, kMostStorageBuffers));
  }
  return std::unique_ptr<Ops>(new Ops(ctx, pipelines));
}

Status Ops::set_matvec_shape(const MatvecShape& shape) {
  auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
  if (!pow2(shape.group) || !pow2(shape.max_lanes) || !pow2(shape.max_rows) || shape.min_groups < 1) {
    return InvalidArgument("the matrix-vector group, lanes and rows must be powers of two, min groups at least 1");
  }
  if (shape.ahead < 1 || shape.ahead > 8) return InvalidArgument("the matrix-vector units ahead must lie in [1, 8]");
  const uint32_t device_group = std::min(ctx_.limits().max_group_invocations, ctx_.limits().max_group_size_x);
  // The norm's workgroups hold whole slots of the lanes the others have, so that a row's sum
  // is added in the same order with the norm or without.
  if (shape.norm_group != 0 && (!pow2(shape.norm_group) || shape.norm_group < std::max<uint32_t>(32, shape.max_lanes) ||
                                shape.norm_group > device_group)) {
    return InvalidArgument(fmt::format("the matrix-vector norm's workgroups must be 0 (none) or a power of two in "
                                       "[max(32, lanes {}), {}] (the device's), not {}",
                                       shape.max_lanes, device_group, shape.norm_group));
  }
  if (shape.max_lanes < 4 || shape.max_lanes > shape.group || shape.group > device_group) {
    return InvalidArgument(fmt::format("matrix-vector lanes must lie in [4, group] and the group within the device's "
                                       "{} invocations (lanes {}, group {})",
                                       device_group, shape.max_lanes, shape.group));
  }
  // matvec_quant without the SwiGLU epilogue (FusesSwiGlu checks that one).
  const int64_t shared = MatvecQuantSharedBytes(shape.max_rows, kMatvecTokens, shape.group, 1, false);
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

Result<const Pipeline*> Ops::RmsNormPipeline() {
  const uint32_t spec[] = {kRowGroup};
  return pipelines_.Get(subgroup_trees() ? kRmsNormSg : kRmsNorm, spec);
}

Result<const Pipeline*> Ops::QuantizePipeline(ActKind kind, QuantizeSource source) {
  const uint32_t spec[] = {kRowGroup, static_cast<uint32_t>(kind), static_cast<uint32_t>(source)};
  return pipelines_.Get(subgroup_trees() ? kQuantizeSg : kQuantize, spec);
}

Status Ops::RmsNorm(Recorder& rec, const Buffer& x, int64_t x_stride, const Buffer& w, int64_t n, float eps,
                    const Buffer& y, int64_t y_stride, int64_t n_rows, const Buffer* row_ids) {
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, RmsNormPipeline());
  const RmsNormParams params{U32(n), U32(x_stride), U32(y_stride), row_ids != nullptr ? 1u : 0u, eps};
  return rec.Dispatch(*p, {&x, &w, &y, row_ids != nullptr ? row_ids : &unused_}, &params, U32(n_rows));
}

Result<const Pipeline*> Ops::PlanNorm(ActKind kind) {
  return kind == ActKind::kFloat ? RmsNormPipeline() : QuantizePipeline(kind, QuantizeSource::kRmsNorm);
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
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, QuantizePipeline(kind, source));
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
  if (a.swiglu != nullptr && !FusesSwiGlu(w, a.n_tokens, a.swiglu->kind, a.swiglu->counter_words)) {
    return Internal("this matrix product cannot hand on SwiGLU codes");
  }
  if (a.norm != nullptr && !FusesNorm(w, a.n_tokens, a.swiglu)) {
    return Internal("this matrix product cannot make its input's norm");
  }
  // Rows [0, mv) on the matrix-vector shader, [mv, n_tokens) on the tiled one (F32 weights have
  // one shader, whose order is the reference's, for any number of rows).
  const int64_t mv = w.type == GgmlType::kF32 ? a.n_tokens
                     : a.matvec_tokens < 0    ? (a.n_tokens <= kMatvecMaxTokens ? a.n_tokens : 0)
                                              : std::min(a.matvec_tokens, a.n_tokens);
  if ((a.swiglu != nullptr || a.norm != nullptr) && (mv != a.n_tokens || a.n_tokens > kMatvecMaxTokens)) {
    return Internal("a matrix product's SwiGLU codes or norm need all its rows on the matrix-vector shader");
  }
  for (const DeviceMatrixPart& part : w.parts) {
    if (mv > 0) KVFS_RETURN_IF_ERROR(MatMulPart(rec, w, part, a, 0, mv, true));
    if (mv < a.n_tokens) KVFS_RETURN_IF_ERROR(MatMulPart(rec, w, part, a, mv, a.n_tokens, false));
  }
  return Status::Ok();
}

bool Ops::FusesSwiGlu(const DeviceMatrix& w, int64_t n_tokens, ActKind kind, int64_t counter_words) const {
  if (kind == ActKind::kFloat || ActKindFor(w.type) == ActKind::kFloat) return false;
  if (w.segment_rows.size() != 1 || 2 * w.segment_rows[0] != w.n_out) return false;
  if (n_tokens < 1 || n_tokens > kMatvecMaxTokens || matvec_.group < 32) return false;
  const int64_t n = w.segment_rows[0], block = kind == ActKind::kQ8_K ? 256 : 32;
  if (n % block != 0) return false;
  // Counters: a word per block and group of tokens (matvec_quant's grid rows).
  if (CeilDiv(n_tokens, MatvecTokensPerGroup(n_tokens)) * (n / block) > counter_words) return false;
  // Shared memory, for each part's shape.
  for (const DeviceMatrixPart& part : w.parts) {
    const QuantShape q = MatvecQuantShape(w, part.n_rows, false);
    const int64_t shared = MatvecQuantSharedBytes(q.rows, MatvecTokensPerGroup(n_tokens), q.group, q.group / q.lanes, true);
    if (shared > ctx_.limits().max_shared_bytes) return false;
  }
  return true;
}

bool Ops::FusesNorm(const DeviceMatrix& w, int64_t n_tokens, const SwiGluCodes* swiglu) const {
  const ActKind kind = ActKindFor(w.type);
  if (matvec_.norm_group == 0 || (kind != ActKind::kQ8_0 && kind != ActKind::kQ8_1)) return false;
  if (n_tokens < 1 || n_tokens > kMatvecMaxTokens || w.n_in % 32 != 0) return false;
  if (swiglu != nullptr && !FusesSwiGlu(w, n_tokens, swiglu->kind, swiglu->counter_words)) return false;
  for (const DeviceMatrixPart& part : w.parts) {
    const QuantShape q = MatvecQuantShape(w, part.n_rows, true);
    const int64_t shared = MatvecQuantSharedBytes(q.rows, MatvecTokensPerGroup(n_tokens), q.group, q.group / q.lanes,
                                                  swiglu != nullptr, w.n_in / 32);
    if (shared > ctx_.limits().max_shared_bytes) return false;
  }
  return true;
}

Ops::QuantShape Ops::MatvecQuantShape(const DeviceMatrix& w, int64_t part_rows, bool norm) const {
  const uint32_t group = norm ? matvec_.norm_group : matvec_.group;
  const uint32_t lanes = MatvecLanes(w.n_in / 32, matvec_.max_lanes);  // (norm_group >= max_lanes)
  // With the norm, which every workgroup makes again, as many rows a slot as the shape allows.
  const uint32_t rows = norm ? matvec_.max_rows : MatvecRowsPerSlot(part_rows, group / lanes, matvec_);
  return {group, lanes, rows};
}

Result<Ops::MatMulPlan> Ops::PlanMatMul(const DeviceMatrix& w, int64_t part_rows, int64_t n_tokens,
                                        const SwiGluCodes* swiglu, bool norm, std::optional<bool> matvec_shader) {
  const bool quantized = ActKindFor(w.type) != ActKind::kFloat;
  const bool matvec = matvec_shader.value_or(n_tokens <= kMatvecMaxTokens);
  const uint32_t type = static_cast<uint32_t>(w.type);
  const uint32_t layout = static_cast<uint32_t>(w.layout);
  MatMulPlan plan;
  plan.rows_per_group = kTileRows;
  if (w.type == GgmlType::kF32) {  // one invocation per output, in the reference's order
    plan.rows_per_group = kElementwiseGroup;
    plan.tokens_per_group = 1;
    const uint32_t spec[] = {kElementwiseGroup};
    KVFS_ASSIGN_OR_RETURN(plan.pipeline, pipelines_.Get(kMatmulF32, spec));
  } else if (matvec) {
    const bool sg = subgroup_trees();
    plan.tokens_per_group = MatvecTokensPerGroup(std::min(n_tokens, kMatvecMaxTokens));
    if (quantized) {
      const QuantShape q = MatvecQuantShape(w, part_rows, norm);
      plan.rows_per_group = q.group / q.lanes * q.rows;
      // Many rows (a busy step's decode rows, batch-invariant): up to 16 a workgroup, their
      // activation units loaded as used, so that the weights are read once per 16 rows, not 4;
      // at most 64 sums an invocation, and the shared memory of their tree within the device's.
      for (int64_t wide = std::min<int64_t>(64 / q.rows, kMatvecWideTokens);
           n_tokens > kMatvecMaxTokens && swiglu == nullptr && !norm && wide > kMatvecTokens; wide /= 2) {
        if (MatvecQuantSharedBytes(q.rows, wide, q.group, q.group / q.lanes, false) <= ctx_.limits().max_shared_bytes) {
          plan.tokens_per_group = static_cast<uint32_t>(wide);
          break;
        }
      }
      const uint32_t glu = swiglu != nullptr ? static_cast<uint32_t>(swiglu->kind) : kNoSwiGlu;
      const uint32_t norm_units = norm ? static_cast<uint32_t>(w.n_in / 32) : 0u;
      const uint32_t spec[] = {q.group, type,  q.lanes,       plan.tokens_per_group, q.rows, layout, glu, matvec_.ahead,
                               norm_units, static_cast<uint32_t>(ActKindFor(w.type))};
      const ShaderInterface& shader = ctx_.integer_dot() ? (sg ? kMatvecQuantIdotSg : kMatvecQuantIdot)
                                                         : (sg ? kMatvecQuantSg : kMatvecQuant);
      KVFS_ASSIGN_OR_RETURN(plan.pipeline, pipelines_.Get(shader, spec));
    } else {
      const uint32_t lanes = MatvecLanes(w.n_in / 8, matvec_.max_lanes);
      plan.rows_per_group = matvec_.group / lanes;
      const uint32_t spec[] = {matvec_.group, type, lanes, plan.tokens_per_group};
      KVFS_ASSIGN_OR_RETURN(plan.pipeline, pipelines_.Get(sg ? kMatvecFloatSg : kMatvecFloat, spec));
    }
  } else {
    plan.tokens_per_group = n_tokens <= 16 ? 16 : (n_tokens <= 32 ? 32 : 64);
    const uint32_t spec[] = {256, type, kTileRows, plan.tokens_per_group, quantized ? 2u : 16u, layout};
    const ShaderInterface& quant = ctx_.integer_dot() ? kMatmulQuantIdot : kMatmulQuant;
    KVFS_ASSIGN_OR_RETURN(plan.pipeline, pipelines_.Get(quantized ? quant : kMatmulFloat, spec));
  }
  return plan;
}

Status Ops::MatMulPart(Recorder& rec, const DeviceMatrix& w, const DeviceMatrixPart& part, const MatMulArgs& a,
                       int64_t t_begin, int64_t t_end, bool matvec) {
  const bool quantized = ActKindFor(w.type) != ActKind::kFloat;
  const int64_t n_tokens = t_end - t_begin;
  KVFS_ASSIGN_OR_RETURN(const MatMulPlan plan,
                        PlanMatMul(w, part.n_rows, n_tokens, a.swiglu, a.norm != nullptr, matvec));
  const Pipeline* p = plan.pipeline;
  const uint32_t rows_per_group = plan.rows_per_group, tokens_per_group = plan.tokens_per_group;
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
  const uint32_t group_y = CeilDiv(n_tokens, tokens_per_group);
  // The grid's x dimension is limited (65535 groups on many devices): long matrices (output
  // layers of large vocabularies) take several dispatches over consecutive row ranges.
  const int64_t max_groups = ctx_.limits().max_group_count[0];
  for (int64_t r0 = 0; r0 < part.n_rows; r0 += max_groups * rows_per_group) {
    const uint32_t groups = CeilDiv(std::min(part.n_rows - r0, max_groups * rows_per_group), rows_per_group);
    const MatQuantParams params{U32(w.n_in / 32),
                                U32(w.row_bytes),
                                U32(part.n_rows),
                                U32(r0),
                                U32(t_end),
                                y_stride,
                                U32(part.row0),
                                flags,
                                seg1,
                                seg2,
                                y1_stride,
                                y2_stride,
                                a.norm != nullptr ? U32(a.norm->x_stride) : 0u,
                                a.norm != nullptr ? U32(a.norm->row0) : 0u,
                                a.norm != nullptr ? a.norm->eps : 0.0f,
                                U32(t_begin)};
    if (quantized && matvec) {
      const SwiGluCodes* g = a.swiglu;
      // With the norm, bindings 1 and 2 take its input rows and weight (matvec_quant.comp).
      const Buffer* in1 = a.norm != nullptr ? a.norm->x : a.acts.codes;
      const Buffer* in2 = a.norm != nullptr ? a.norm->weight : a.acts.aux;
      KVFS_RETURN_IF_ERROR(rec.Dispatch(*p,
                                        {&part.buffer, in1, in2, a.y, bias, y1, y2,
                                         g != nullptr ? g->acts.codes : &unused_, g != nullptr ? g->acts.aux : &unused_,
                                         g != nullptr ? g->counters : &unused_},
                                        &params, groups, group_y));
    } else if (quantized) {
      KVFS_RETURN_IF_ERROR(
          rec.Dispatch(*p, {&part.buffer, a.acts.codes, a.acts.aux, a.y, bias, y1, y2}, &params, groups, group_y));
    } else {
      const MatFloatParams params{U32(w.n_in), U32(w.row_bytes), U32(part.n_rows), U32(r0),   U32(t_end),
                                  U32(a.x_stride), y_stride, U32(part.row0), flags, seg1, seg2, y1_stride,
                                  y2_stride, U32(t_begin)};
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

Status Ops::PrefetchBytes(Recorder& rec, const Buffer& data, int64_t offset, int64_t bytes, const Buffer& sink) {
  if (offset < 0 || offset % 16 != 0 || bytes < 0 || bytes % 16 != 0 || offset + bytes > data.bytes()) {
    return InvalidArgument(fmt::format("prefetch of bytes [{}, {}) of a buffer of {}: not whole 16-byte words in it",
                                       offset, offset + bytes, data.bytes()));
  }
  const int64_t words = bytes / 16;
  if (words == 0) return Status::Ok();
  // The shader's word indices stay below 2^32 even one grid round past the range's end.
  const int64_t round = int64_t{kPrefetchGroups} * kPrefetchGroupSize * kPrefetchLoads;
  if (offset / 16 + words + round > int64_t{UINT32_MAX}) return InvalidArgument("prefetch: a range past 2^32 words");
  const uint32_t spec[] = {kPrefetchGroupSize, kPrefetchLoads};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kPrefetch, spec));
  const PrefetchParams params{U32(offset / 16), U32(words)};
  const uint32_t groups = std::min(kPrefetchGroups, CeilDiv(words, int64_t{kPrefetchGroupSize} * kPrefetchLoads));
  return rec.Dispatch(*p, {&data, &sink}, &params, groups);
}

Result<int64_t> Ops::Prefetch(Recorder& rec, const DeviceMatrix& m, int64_t offset, int64_t bytes, const Buffer& sink) {
  const int64_t end = offset + std::max<int64_t>(bytes, 0);
  int64_t covered = 0;
  for (const DeviceMatrixPart& part : m.parts) {
    const int64_t start = part.row0 * m.row_bytes, part_bytes = part.n_rows * m.row_bytes;
    const int64_t lo = std::max(offset, start) - start, hi = std::min(end, start + part_bytes) - start;
    if (lo >= hi) continue;
    covered += hi - lo;
    // Whole 16-byte words from a word boundary: a few bytes at either end may go unread.
    const int64_t first = (lo + 15) / 16 * 16;
    if (hi - first >= 16) KVFS_RETURN_IF_ERROR(PrefetchBytes(rec, part.buffer, first, (hi - first) / 16 * 16, sink));
  }
  return covered;
}

}  // namespace kvfs::vk
