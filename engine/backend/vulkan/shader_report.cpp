// kvfs shaders (engine/backend/vulkan_shaders.h): plans the matrix products of a model as the
// backend would record them (device_weights.h's stacking and layouts, Ops::PlanMatMul's
// pipelines), its attention steps (Ops::PlanAttentionStep) and its norms (Ops::PlanNorm), and
// asks the driver for each pipeline's compiler statistics. No buffer is made and nothing is
// submitted, so a device that can only compile (RADV's null device) will do.
#include <map>
#include <tuple>

#include <spdlog/fmt/fmt.h>

#include "engine/backend/vulkan/device_weights.h"
#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan_shaders.h"
#include "engine/backend/vulkan_tuning.h"
#include "engine/kv/kv_format.h"
#include "engine/kv/sequence_kv.h"
#include "engine/model/ggml_types.h"
#include "engine/model/model.h"

namespace kvfs {

namespace {

// A planned device matrix and what it is, before the layers with the same one are counted.
struct PlannedMatrix {
  std::string matrices;
  vk::DeviceMatrix matrix;  // without buffers
  GgmlType down_type = GgmlType::kF32;  // gate|up: the down matrix's (its SwiGLU codes' kind)
  int64_t norm = -1;  // the norm of its input (NormId); -1: none (o, down)
};

// PlannedMatrix::norm of a layer's attention (0) or feed-forward (1) norm; layer n_layer's
// attention norm stands for the output norm.
int64_t NormId(size_t layer, int which) { return 2 * static_cast<int64_t>(layer) + which; }

std::string TypeName(GgmlType t) {
  const GgmlTypeTraits* info = GgmlTypeInfo(static_cast<uint32_t>(t));
  return info != nullptr ? std::string(info->name) : std::to_string(static_cast<uint32_t>(t));
}

// The device matrices of every layer, and the output, as UploadWeights makes them.
Result<std::vector<PlannedMatrix>> PlanMatrices(const ModelWeights& w, const vk::WeightUploadOptions& upload) {
  std::vector<PlannedMatrix> out;
  int64_t norm = -1;  // the norm of the matrices planned next
  auto plan = [&](const std::string& what, std::initializer_list<const Matrix*> ms, GgmlType down) -> Status {
    KVFS_ASSIGN_OR_RETURN(vk::DeviceMatrix d, vk::PlanStacked(std::span<const Matrix* const>(ms.begin(), ms.size()),
                                                              upload));
    out.push_back({what, std::move(d), down, norm});
    return Status::Ok();
  };
  for (size_t il = 0; il < w.layers.size(); ++il) {
    const LayerWeights& l = w.layers[il];
    norm = NormId(il, 0);
    if (vk::StacksQkv(l, upload)) {
      KVFS_RETURN_IF_ERROR(plan("q|k|v", {&l.wq, &l.wk, &l.wv}, GgmlType::kF32));
    } else {
      KVFS_RETURN_IF_ERROR(plan("q", {&l.wq}, GgmlType::kF32));
      KVFS_RETURN_IF_ERROR(plan("k", {&l.wk}, GgmlType::kF32));
      KVFS_RETURN_IF_ERROR(plan("v", {&l.wv}, GgmlType::kF32));
    }
    norm = -1;
    KVFS_RETURN_IF_ERROR(plan("o", {&l.wo}, GgmlType::kF32));
    norm = NormId(il, 1);
    if (vk::StacksGateUp(l, upload)) {
      KVFS_RETURN_IF_ERROR(plan("gate|up", {&l.w_gate, &l.w_up}, l.w_down.type));
    } else {
      KVFS_RETURN_IF_ERROR(plan("gate", {&l.w_gate}, GgmlType::kF32));
      KVFS_RETURN_IF_ERROR(plan("up", {&l.w_up}, GgmlType::kF32));
    }
    norm = -1;
    KVFS_RETURN_IF_ERROR(plan("down", {&l.w_down}, GgmlType::kF32));
  }
  norm = NormId(w.layers.size(), 0);
  KVFS_RETURN_IF_ERROR(plan("output", {&w.output}, GgmlType::kF32));
  return out;
}

Result<std::vector<ShaderStatistic>> StatisticsOf(const vk::PipelineCache& pipelines, const vk::Pipeline& p,
                                                   bool captured) {
  std::vector<ShaderStatistic> out;
  if (!captured) return out;
  KVFS_ASSIGN_OR_RETURN(std::vector<vk::PipelineStatistic> stats, pipelines.Statistics(p));
  for (const vk::PipelineStatistic& s : stats) out.push_back({s.name, s.value});
  return out;
}

// The attention steps of one sequence per KV format and token count, as a fused pass plans them
// (Ops::PlanAttentionStep).
Status ReportAttention(const Model& model, const ShaderReportOptions& options, const VulkanTuning& tuning,
                       vk::Context& ctx, vk::Ops& ops, const vk::PipelineCache& pipelines, ShaderReport& report) {
  const HParams& hp = model.hparams();
  ops.set_attention_split_positions(tuning.attention_split);
  ops.set_fuse_softmax(tuning.fuse_softmax);
  const vk::AttentionShape shape{hp.n_head, hp.n_head_kv, hp.head_dim};
  KVFS_RETURN_IF_ERROR(ops.CheckAttentionShape(shape));
  // The output's codes for the first layer's o matrix (a model whose o matrices differ in type
  // has more variants than listed).
  const vk::ActKind o_kind = vk::ActKindFor(model.weights().layers.front().wo.type);
  for (const std::string& kv_name : options.kv) {
    KVFS_ASSIGN_OR_RETURN(const KvFormat format, MakeKvFormat(kv_name, "", hp.n_head_kv, hp.head_dim));
    if (format.KeysByChannel() && options.block_tokens % format.chunk != 0) {
      return InvalidArgument(fmt::format("q4k blocks hold whole chunks of {} tokens; --block {} does not",
                                         format.chunk, options.block_tokens));
    }
    const KvLayout layout = KvLayoutFor(hp, format, options.block_tokens);
    vk::KvView view;  // no buffers: planning binds nothing
    view.format = format;
    view.block_tokens = layout.block_tokens;
    view.row_stride = (layout.row_bytes() + 3) / 4 * 4;
    if (format.KeysByChannel()) view.k_slot_bytes = layout.k_plane_bytes();
    for (const int64_t tokens : options.tokens) {
      KVFS_ASSIGN_OR_RETURN(const vk::Ops::StepPipelines step,
                            ops.PlanAttentionStep(view, shape, tokens, options.depth, ctx.limits().max_binding_bytes,
                                                  hp.rope_style, hp.n_rot, o_kind));
      auto add = [&](const char* what, const vk::Pipeline* p, bool merged) -> Status {
        if (p == nullptr) return Status::Ok();
        AttentionShader line{kv_name, tokens, options.depth, what, merged, std::string(p->name), p->constants, {}};
        KVFS_ASSIGN_OR_RETURN(line.statistics, StatisticsOf(pipelines, *p, report.statistics));
        report.attention.push_back(std::move(line));
        return Status::Ok();
      };
      KVFS_RETURN_IF_ERROR(add("kv_store", step.kv_store, true));
      KVFS_RETURN_IF_ERROR(add("scores", step.scores[0], false));
      KVFS_RETURN_IF_ERROR(add("scores", step.scores[1], true));
      KVFS_RETURN_IF_ERROR(add("softmax", step.softmax[0], false));
      KVFS_RETURN_IF_ERROR(add("softmax", step.softmax[1], true));
      KVFS_RETURN_IF_ERROR(add("output", step.output[0], false));
      KVFS_RETURN_IF_ERROR(add("output", step.output[1], true));
      KVFS_RETURN_IF_ERROR(add("reduce", step.reduce, false));
    }
  }
  return Status::Ok();
}

// The SwiGLU codes gate|up hands on where the backend would have it do so (decode), else null.
const vk::Ops::SwiGluCodes* GluOf(const PlannedMatrix& pm, int64_t tokens, const VulkanTuning& tuning, const vk::Ops& ops,
                                  vk::Ops::SwiGluCodes& codes) {
  codes.kind = vk::ActKindFor(pm.down_type);
  codes.counter_words = vk::Ops::kCounterWords;
  const bool glu = pm.matrices == "gate|up" && tuning.swiglu_in_matvec &&
                   ops.FusesSwiGlu(pm.matrix, tokens, codes.kind, codes.counter_words);
  return glu ? &codes : nullptr;
}

// Whether norm `norm` (PlannedMatrix::norm) of `tokens` rows is made by its matrices, as the
// backend decides (NormInMatvec): every matrix it feeds can.
bool NormInMatrices(std::span<const PlannedMatrix> planned, int64_t norm, int64_t tokens, const VulkanTuning& tuning,
                    const vk::Ops& ops) {
  if (norm < 0) return false;
  for (const PlannedMatrix& pm : planned) {
    vk::Ops::SwiGluCodes codes;
    if (pm.norm == norm && !ops.FusesNorm(pm.matrix, tokens, GluOf(pm, tokens, tuning, ops, codes))) return false;
  }
  return true;
}

// The norms of the first layer and the output, as a fused decode step records them: those the
// matrices make (VulkanMatvecShape::norm_group) have no pipeline of their own.
Status ReportNorms(const Model& model, std::span<const PlannedMatrix> planned, const VulkanTuning& tuning, vk::Ops& ops,
                   const vk::PipelineCache& pipelines, ShaderReport& report) {
  const ModelWeights& w = model.weights();
  const LayerWeights& l = w.layers.front();
  const std::tuple<const char*, GgmlType, int64_t> norms[] = {{"attention", l.wq.type, NormId(0, 0)},
                                                               {"feed-forward", l.w_gate.type, NormId(0, 1)},
                                                               {"output", w.output.type, NormId(w.layers.size(), 0)}};
  for (const auto& [what, type, norm] : norms) {
    if (NormInMatrices(planned, norm, 1, tuning, ops)) continue;
    const vk::ActKind kind = vk::ActKindFor(type);
    KVFS_ASSIGN_OR_RETURN(const vk::Pipeline* p, ops.PlanNorm(kind));
    static constexpr const char* kActs[] = {"q8_0", "q8_1", "q8_k", "f32"};
    NormShader line{what, kActs[static_cast<uint32_t>(kind)], std::string(p->name), p->constants, {}};
    KVFS_ASSIGN_OR_RETURN(line.statistics, StatisticsOf(pipelines, *p, report.statistics));
    report.norms.push_back(std::move(line));
  }
  return Status::Ok();
}

}  // namespace

Result<ShaderReport> VulkanShaderReport(const Model& model, const ShaderReportOptions& options) {
  KVFS_RETURN_IF_ERROR(vk::CheckWeightTypes(model.weights()));
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<vk::Context> ctx,
                        vk::Context::Create(options.device, /*integer_dot=*/true, /*capture_statistics=*/true));
  vk::PipelineCache pipelines(ctx->device(), ctx->captures_statistics());
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<vk::Ops> ops, vk::Ops::CreateForPlanning(*ctx, pipelines));
  const VulkanTuning tuning = ResolvedTuning(options.tuning, ctx->info().type);
  KVFS_RETURN_IF_ERROR(ops->set_matvec_shape(vk::MatvecShapeFor(tuning)));
  ops->set_subgroup_trees(tuning.subgroup_trees);

  const vk::WeightUploadOptions upload{.max_binding_bytes = ctx->limits().max_binding_bytes,
                                       .split_rows = options.split_weight_rows,
                                       .stack_matrices = options.stack_matrices};
  KVFS_ASSIGN_OR_RETURN(std::vector<PlannedMatrix> planned, PlanMatrices(model.weights(), upload));

  ShaderReport report;
  report.device = ctx->info();
  report.statistics = ctx->captures_statistics();
  // One line per (matrix kind, type, shape, tokens, norm inside), counting the layers that have it.
  using Key = std::tuple<std::string, GgmlType, int64_t, int64_t, int64_t, bool>;
  std::map<Key, size_t> line_of;
  for (const PlannedMatrix& pm : planned) {
    const vk::DeviceMatrix& m = pm.matrix;
    for (const int64_t tokens : options.tokens) {
      // gate|up hands on SwiGLU's codes, and the matrices make their norm, where the backend
      // would have them do so (decode).
      const bool norm = NormInMatrices(planned, pm.norm, tokens, tuning, *ops);
      const Key key{pm.matrices, m.type, m.n_in, m.n_out, tokens, norm};
      if (auto it = line_of.find(key); it != line_of.end()) {
        ++report.shaders[it->second].layers;
        continue;
      }
      vk::Ops::SwiGluCodes swiglu;
      const vk::Ops::SwiGluCodes* glu = GluOf(pm, tokens, tuning, *ops, swiglu);
      const bool short_steps = options.short_steps && tokens > vk::Ops::kMatvecMaxTokens;
      // A prompt's logits are its last row's, on the tiled shader as its other rows (a step's
      // rows keep to the shader its length picks: step_order.h).
      const bool prompt_output = pm.matrices == "output" && tokens > vk::Ops::kMatvecMaxTokens && !short_steps;
      const std::optional<bool> matvec =
          short_steps ? std::optional<bool>(true) : prompt_output ? std::optional<bool>(false) : std::nullopt;
      KVFS_ASSIGN_OR_RETURN(const vk::Ops::MatMulPlan plan,
                            ops->PlanMatMul(m, m.parts.front().n_rows, prompt_output ? 1 : tokens, glu, norm, matvec));
      MatrixShader line;
      line.matrices = pm.matrices;
      line.type = TypeName(m.type);
      line.n_in = m.n_in;
      line.n_out = m.n_out;
      line.layers = 1;
      line.tokens = tokens;
      line.shader = std::string(plan.pipeline->name);
      line.constants = plan.pipeline->constants;
      line.rows_per_group = plan.rows_per_group;
      line.tokens_per_group = plan.tokens_per_group;
      line.norm = norm;
      line.short_steps = short_steps;
      if (report.statistics) {
        KVFS_ASSIGN_OR_RETURN(std::vector<vk::PipelineStatistic> stats, pipelines.Statistics(*plan.pipeline));
        for (const vk::PipelineStatistic& s : stats) line.statistics.push_back({s.name, s.value});
      }
      line_of.emplace(key, report.shaders.size());
      report.shaders.push_back(std::move(line));
    }
  }
  KVFS_RETURN_IF_ERROR(ReportAttention(model, options, tuning, *ctx, *ops, pipelines, report));
  KVFS_RETURN_IF_ERROR(ReportNorms(model, planned, tuning, *ops, pipelines, report));
  return report;
}

}  // namespace kvfs
