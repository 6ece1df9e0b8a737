// The Vulkan forward pass over a batch of sequences (llama and qwen2), the same computation as
// the CPU backend (cpu_backend.cpp) op for op, with the shaders of shaders/:
//   embed -> per layer: rms_norm, q/k/v matmuls (+bias; one dispatch of the three stacked),
//   rope, kv_store (K and V encoded into the KV format on the device, rotated when the format
//   rotates; q4k keys: k_stage, then k_chunks for the chunks the tokens complete), attention
//   (scores, softmax, weighted V, reading the encoded rows of the sequence's device KV blocks),
//   wo matmul (+residual), rms_norm, gate/up matmuls (stacked likewise), swiglu, down matmul
//   (+residual) -> final rms_norm of the rows whose logits are wanted -> output matmul.
// Quantized weights are multiplied with activations quantized like the CPU's (quantize_act),
// so both backends compute the same integer dot products.
// Decode is hundreds of small dispatches, each followed by a barrier, so ops that follow each
// other are fused (VulkanOptions::fuse_ops): each rms_norm and the swiglu quantize their output
// in the same dispatch, and one kv_store stores K and V (q4k: stages the keys as f16 rows),
// applying the keys' RoPE on the way, while the scores apply the queries'. The values are
// those of the separate ops, bit for bit (vulkan_backend_test checks it). Tuned so
// (VulkanTuning::prefetch_mib), decode also reads the next matrices' first bytes ahead beside
// the short dispatches (the norms, kv_store and the scores) while memory would idle.
//
// The sequences of a pass record each attention step side by side (Ops::AttentionBatch): a
// decode step of many agents waits at three barriers a layer for attention, not three per agent.
// Those that share a KV arena (format and block size) also share the dispatches: one kv_store
// (a table of rows; fused) a layer, and one attn_scores and one attn_output for those whose
// calls are specialized alike (decode: all the scores; the weighted sums split over positions,
// and those not), and one softmax for all the prompts, not one per agent
// (VulkanOptions::merge_sequences).
// The batch's tokens are processed in micro-batches of at most max_ubatch_ tokens (a
// sequence's later tokens attend to the K/V its earlier ones wrote on the device), which bounds
// every activation buffer below the device's storage-binding size. Each micro-batch is one
// command buffer, submitted and waited for. The new K/V rows reach the host blocks through a
// host-visible buffer that kv_store writes as it stores them (fused; the separate ops copy them
// there at the end of the last micro-batch); device_kv.h has the design of the device KV copies.
#include "engine/backend/vulkan/vulkan_backend_impl.h"

#include <spdlog/spdlog.h>

#include "engine/backend/fallback_backend.h"
#include "engine/backend/step_order.h"

namespace kvfs {
namespace vulkan_internal {

Status VulkanBackend::Init(const VulkanOptions& options) {
  KVFS_RETURN_IF_ERROR(vk::CheckWeightTypes(model_.weights()));
  // Profiling: the compiler's statistics of the pipelines too, where the device reports them.
  KVFS_ASSIGN_OR_RETURN(ctx_, vk::Context::Create(options.device, options.integer_dot,
                                                  /*capture_statistics=*/options.profile, options.phase_clock));
  ctx_->LimitDeviceLocalBytes(options.device_local_limit);
  fuse_ops_ = options.fuse_ops;
  batch_invariant_ = options.batch_invariant;
  batch_attention_ = options.batch_attention;
  merge_sequences_ = options.merge_sequences;
  kv_rows_by_kv_store_ = options.kv_rows_by_kv_store && options.fuse_ops;
  int64_t max_binding = ctx_->limits().max_binding_bytes;
  if (options.max_binding_bytes > 0) max_binding = std::min(max_binding, options.max_binding_bytes);
  const bool clocks = vk::PhaseClock::Usable(*ctx_);
  pipelines_ = std::make_unique<vk::PipelineCache>(ctx_->device(), ctx_->captures_statistics(), options.contract_floats,
                                                   clocks);
  rec_ = std::make_unique<vk::Recorder>(*ctx_);
  if (options.profile) KVFS_RETURN_IF_ERROR(rec_->EnableProfiling());
  if (clocks) {
    KVFS_RETURN_IF_ERROR(rec_->EnablePhaseClock(*pipelines_));
  } else if (options.phase_clock) {
    spdlog::warn("vulkan: {} has no shader clocks (VK_KHR_shader_clock) or no storage buffer to spare for them: no "
                 "phases to time", ctx_->info().name);
  }
  KVFS_ASSIGN_OR_RETURN(uploader_, vk::Uploader::Create(*ctx_, kStagingBytes));
  KVFS_ASSIGN_OR_RETURN(ops_, vk::Ops::Create(*ctx_, *pipelines_));
  ops_->set_query_tiles(options.query_tiles);
  ops_->set_merge_jobs(options.merge_sequences);
  KVFS_RETURN_IF_ERROR(SetVulkanTuning(options.tuning));
  KVFS_RETURN_IF_ERROR(ops_->CheckAttentionShape({hp_.n_head, hp_.n_head_kv, hp_.head_dim}));
  const vk::WeightUploadOptions upload{.max_binding_bytes = max_binding,
                                       .split_rows = options.split_weight_rows,
                                       .stack_matrices = options.stack_matrices};
  Result<std::unique_ptr<vk::DeviceWeights>> uploaded = vk::UploadWeights(*ctx_, *uploader_, model_.weights(), upload);
  if (!uploaded.ok() && IsOutOfDeviceMemory(uploaded.status())) {
    return Unavailable(fmt::format("the model's weights ({:.2f} GiB) do not fit in the memory of {} ({:.2f} GiB): {}",
                                   model_.weights().total_bytes / 1073741824.0, ctx_->info().name,
                                   ctx_->info().memory_bytes / 1073741824.0, uploaded.status().message()));
  }
  KVFS_ASSIGN_OR_RETURN(weights_, std::move(uploaded));
  const int64_t kv_budget = options.kv_device_bytes > 0 ? options.kv_device_bytes : ctx_->info().memory_bytes / 4;
  kv_ = std::make_unique<vk::DeviceKvCache>(*ctx_, *uploader_, kv_budget, max_binding);

  // The widest activation row bounds the micro-batch: every buffer stays within one binding.
  const int64_t n_in_max = std::max({hp_.n_embd, hp_.n_embd_q(), hp_.n_ff});
  const int64_t widest = std::max({hp_.n_vocab, n_in_max});
  max_ubatch_ = std::clamp<int64_t>(max_binding / (4 * widest), 1, kMaxUbatch);
  const int64_t U = max_ubatch_;
  auto device = [&](Buffer& b, int64_t floats) -> Status {
    KVFS_ASSIGN_OR_RETURN(b, ctx_->CreateBuffer(U * floats * 4, MemoryKind::kDevice));
    return Status::Ok();
  };
  KVFS_RETURN_IF_ERROR(device(x_, hp_.n_embd));
  KVFS_RETURN_IF_ERROR(device(xb_, std::max(hp_.n_embd, hp_.n_embd_q())));
  KVFS_RETURN_IF_ERROR(device(q_, hp_.n_embd_q()));
  KVFS_RETURN_IF_ERROR(device(k_, hp_.n_embd_kv()));
  KVFS_RETURN_IF_ERROR(device(v_, hp_.n_embd_kv()));
  KVFS_RETURN_IF_ERROR(device(att_, hp_.n_embd_q()));
  KVFS_RETURN_IF_ERROR(device(gate_, hp_.n_ff));
  KVFS_RETURN_IF_ERROR(device(up_, hp_.n_ff));
  KVFS_RETURN_IF_ERROR(device(hidden_, hp_.n_ff));
  KVFS_RETURN_IF_ERROR(device(xn_, hp_.n_embd));
  KVFS_RETURN_IF_ERROR(device(act_codes_, n_in_max / 4));
  KVFS_RETURN_IF_ERROR(device(act_aux_, n_in_max / 32 * 4));
  const int64_t swiglu_rows = vk::Ops::kMatvecMaxTokens;
  KVFS_ASSIGN_OR_RETURN(swiglu_codes_, ctx_->CreateBuffer(swiglu_rows * hp_.n_ff, MemoryKind::kDevice));
  KVFS_ASSIGN_OR_RETURN(swiglu_aux_, ctx_->CreateBuffer(swiglu_rows * hp_.n_ff / 32 * 16, MemoryKind::kDevice));
  // (kvfs shaders plans with it too)
  const vk::Ops::ScratchBytes scratch = vk::Ops::BackendScratch(max_binding, ctx_->info().memory_bytes);
  KVFS_ASSIGN_OR_RETURN(scores_, ctx_->CreateBuffer(scratch.scores, MemoryKind::kDevice));
  KVFS_ASSIGN_OR_RETURN(partials_, ctx_->CreateBuffer(scratch.partials, MemoryKind::kDevice));
  KVFS_ASSIGN_OR_RETURN(stats_, ctx_->CreateBuffer(scratch.stats, MemoryKind::kDevice));
  KVFS_ASSIGN_OR_RETURN(counters_, ctx_->CreateBuffer(kCounterBytes, MemoryKind::kDevice));
  KVFS_ASSIGN_OR_RETURN(prefetch_sink_, ctx_->CreateBuffer(16, MemoryKind::kDevice));
  KVFS_RETURN_IF_ERROR(rec_->Begin());  // the counters start at 0; the shaders leave them so
  rec_->Zero(counters_, 0, kCounterBytes);
  KVFS_RETURN_IF_ERROR(rec_->SubmitAndWait());
  KVFS_ASSIGN_OR_RETURN(tokens_, ctx_->CreateBuffer(U * 4, MemoryKind::kUpload));
  KVFS_ASSIGN_OR_RETURN(rope_, ctx_->CreateBuffer(U * std::max<int64_t>(1, hp_.n_rot / 2) * 8, MemoryKind::kDeviceUpload));
  KVFS_ASSIGN_OR_RETURN(row_ids_, ctx_->CreateBuffer(U * 4, MemoryKind::kUpload));
  spdlog::info("vulkan: {} ({}), {:.1f} MiB of weights, micro-batch {} tokens, KV budget {} bytes ({:.1f} MiB), {}",
               ctx_->info().name, ctx_->info().type, weights_->bytes / 1048576.0, max_ubatch_, kv_budget,
               kv_budget / 1048576.0, ops_->subgroup_trees() ? "subgroup trees" : "shared-memory trees");
  // A budget past what the device has left is not refused (the blocks that do not fit run on
  // the CPU, as for a full device), but it is not what the user meant either.
  const int64_t room = ctx_->info().memory_bytes - weights_->bytes;
  if (options.kv_device_bytes > 0 && options.kv_device_bytes > room)
    spdlog::warn("vulkan: the KV budget of {} bytes is more than the {} bytes {} has beside the weights: KV blocks "
                 "that find no room there run on the CPU",
                 options.kv_device_bytes, std::max<int64_t>(0, room), ctx_->info().name);
  return Status::Ok();
}

Status VulkanBackend::SetVulkanTuning(const VulkanTuning& tuning) {
  // The matrix-vector shape is the one setting the device may refuse: checked first, so that a
  // refused tuning changes nothing.
  KVFS_RETURN_IF_ERROR(CheckAttentionSplit(tuning.attention_split));
  const VulkanTuning t = ResolvedTuning(tuning, ctx_->info().type);  // 0s as the defaults they stand for
  KVFS_RETURN_IF_ERROR(ops_->set_matvec_shape(vk::MatvecShapeFor(t)));
  swiglu_in_matvec_ = fuse_ops_ && t.swiglu_in_matvec;
  ops_->set_attention_split_positions(t.attention_split);
  ops_->set_fuse_softmax(t.fuse_softmax && fuse_ops_);
  ops_->set_subgroup_trees(t.subgroup_trees);
  prefetch_bytes_ = std::clamp<int64_t>(t.prefetch_mib, 0, int64_t{1} << 20) << 20;
  return Status::Ok();
}

Result<int64_t> VulkanBackend::PrefetchWeights(int64_t T, std::span<const vk::DeviceMatrix* const> matrices,
                                               int64_t skip) {
  if (prefetch_bytes_ <= 0 || T > vk::Ops::kMatvecMaxTokens) return int64_t{0};
  int64_t covered = 0;
  for (const vk::DeviceMatrix* m : matrices) {
    const int64_t bytes = m->n_out * m->row_bytes;
    if (skip >= bytes) {
      skip -= bytes;
      continue;
    }
    if (covered >= prefetch_bytes_) break;
    KVFS_ASSIGN_OR_RETURN(const int64_t n, ops_->Prefetch(*rec_, *m, skip, prefetch_bytes_ - covered, prefetch_sink_));
    covered += n;
    skip = 0;
  }
  return covered;
}

Status VulkanBackend::ReserveLogitRows(int64_t rows) {
  if (rows <= logit_rows_) return Status::Ok();
  const int64_t n = std::min(max_ubatch_, std::max(rows, 2 * logit_rows_));
  KVFS_ASSIGN_OR_RETURN(logits_, ctx_->CreateBuffer(n * hp_.n_vocab * 4, MemoryKind::kDevice));
  KVFS_ASSIGN_OR_RETURN(logits_out_, ctx_->CreateBuffer(n * hp_.n_vocab * 4, MemoryKind::kReadback));
  logit_rows_ = n;
  return Status::Ok();
}

Status VulkanBackend::MatMul(const vk::DeviceMatrix& w, const Buffer& x, int64_t x_stride, int64_t T,
                             int64_t matvec_rows, const Buffer& y, const vk::DeviceVector* bias, bool accumulate, bool same_input, const Buffer* y1,
                             const Buffer* y2, const vk::Ops::SwiGluCodes* swiglu,
                             const vk::Ops::NormInput* norm) {
  const vk::ActKind kind = vk::ActKindFor(w.type);
  if (norm != nullptr) {
    HoldCodes(vk::ActKind::kFloat);  // the shader makes the codes: act_codes_ holds none of this input
  } else if (kind != vk::ActKind::kFloat && !(same_input && quantized_kind_ == kind)) {
    rec_->Barrier();  // earlier matmuls may still read the previous codes
    KVFS_RETURN_IF_ERROR(ops_->QuantizeActs(*rec_, kind, x, x_stride, w.n_in, T, {&act_codes_, &act_aux_}));
    rec_->Barrier();
    HoldCodes(kind);
  }
  vk::Ops::MatMulArgs a;
  a.x = &x;
  a.x_stride = x_stride;
  a.acts = quantized_acts_;
  a.n_tokens = T;
  a.matvec_tokens = matvec_rows;
  a.y = &y;
  a.y1 = y1;
  a.y2 = y2;
  a.bias = bias != nullptr && !bias->empty() ? &bias->buffer : nullptr;
  a.accumulate = accumulate;
  a.swiglu = swiglu;
  a.norm = norm;
  return ops_->MatMul(*rec_, w, a);
}

std::optional<vk::Ops::NormInput> VulkanBackend::NormInMatvec(const vk::DeviceVector& w, int64_t T,
                                                              std::span<const vk::DeviceMatrix* const> next,
                                                              const vk::Ops::SwiGluCodes* swiglu, int64_t row0) const {
  if (!fuse_ops_) return std::nullopt;
  for (const vk::DeviceMatrix* m : next) {
    if (!ops_->FusesNorm(*m, T, swiglu)) return std::nullopt;
  }
  return vk::Ops::NormInput{&x_, hp_.n_embd, &w.buffer, hp_.rms_eps, row0};
}

Status VulkanBackend::NormFor(const vk::DeviceVector& w, int64_t T, const vk::DeviceMatrix& next) {
  const int64_t n = hp_.n_embd;
  const vk::ActKind kind = vk::ActKindFor(next.type);
  if (fuse_ops_ && kind != vk::ActKind::kFloat) {
    KVFS_RETURN_IF_ERROR(
        ops_->NormQuantizeActs(*rec_, kind, x_, n, w.buffer, n, hp_.rms_eps, xb_, n, T, {&act_codes_, &act_aux_}));
    HoldCodes(kind);
  } else {
    KVFS_RETURN_IF_ERROR(ops_->RmsNorm(*rec_, x_, n, w.buffer, n, hp_.rms_eps, xb_, n, T, nullptr));
    HoldCodes(vk::ActKind::kFloat);  // act_codes_ no longer holds xb_'s codes
  }
  rec_->Barrier();
  return Status::Ok();
}

Status VulkanBackend::SwiGluFor(int64_t T, const vk::DeviceMatrix& next) {
  const vk::ActKind kind = vk::ActKindFor(next.type);
  if (fuse_ops_ && kind != vk::ActKind::kFloat) {
    KVFS_RETURN_IF_ERROR(ops_->SwiGluQuantizeActs(*rec_, kind, gate_, up_, hp_.n_ff, T, hidden_, {&act_codes_, &act_aux_}));
    HoldCodes(kind);
  } else {
    KVFS_RETURN_IF_ERROR(ops_->SwiGlu(*rec_, gate_, up_, hidden_, T * hp_.n_ff));
    HoldCodes(vk::ActKind::kFloat);
  }
  rec_->Barrier();
  return Status::Ok();
}

Status VulkanBackend::Forward(std::span<const SequenceStep> steps, Logits& out) {
  const std::vector<size_t> order = batch_invariant_ ? ShortStepsFirst(steps) : std::vector<size_t>{};
  if (order.empty()) return ForwardSteps(steps, out);
  std::vector<SequenceStep> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back(steps[i]);
  KVFS_RETURN_IF_ERROR(ForwardSteps(sorted, out));
  RestoreStepOrder(order, out);
  return Status::Ok();
}

Status VulkanBackend::ForwardSteps(std::span<const SequenceStep> steps, Logits& out) {
  // A pass abandoned after an error may still run pieces that use the buffers Prepare and
  // PlanWriteBack may replace (they grow): they finish first.
  KVFS_RETURN_IF_ERROR(rec_->Drain());
  // Validate and reserve every sequence first so a failure leaves all of them untouched.
  int64_t total = 0;
  for (const SequenceStep& s : steps) {
    if (s.kv == nullptr || s.tokens.empty()) return InvalidArgument("empty step in a batch");
    const KvLayout& kl = s.kv->layout();
    if (kl.n_layer != hp_.n_layer || kl.n_head_kv != hp_.n_head_kv || kl.head_dim != hp_.head_dim) {
      return InvalidArgument("KV layout does not match the model");
    }
    for (TokenId id : s.tokens) {
      if (id < 0 || id >= hp_.n_vocab) return InvalidArgument(fmt::format("token id {} out of range", id));
    }
    KVFS_RETURN_IF_ERROR(s.kv->Reserve(s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size())));
    total += static_cast<int64_t>(s.tokens.size());
  }
  KVFS_RETURN_IF_ERROR(kv_->Prepare(steps, step_kv_));
  // Fused, kv_store writes the new rows for the host as it stores them (the separate ops, and
  // --copy-kv-rows, copy them at the end of the pass).
  KVFS_RETURN_IF_ERROR(kv_->PlanWriteBack(step_kv_, kv_rows_by_kv_store_));

  out.n_vocab = hp_.n_vocab;
  out.data.clear();
  out.first_row.clear();
  int64_t rows = 0;
  for (const SequenceStep& s : steps) {
    out.first_row.push_back(rows);
    rows += s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
  }
  out.data.reserve(static_cast<size_t>(rows * hp_.n_vocab));

  // Micro-batches over the concatenated tokens of all steps.
  size_t si = 0;
  int64_t j = 0;  // next token of step si
  while (si < steps.size()) {
    std::vector<Piece> pieces;
    std::vector<int64_t> logit_rows;
    int64_t T = 0;
    while (si < steps.size() && T < max_ubatch_) {
      const SequenceStep& s = steps[si];
      const int64_t n_step = static_cast<int64_t>(s.tokens.size());
      const int64_t n = std::min(n_step - j, max_ubatch_ - T);
      pieces.push_back({static_cast<int32_t>(si), T, n, step_kv_[si].n_old + j});
      for (int64_t k = 0; k < n; ++k) {
        if (s.all_logits || j + k == n_step - 1) logit_rows.push_back(T + k);
      }
      T += n;
      j += n;
      if (j == n_step) {
        ++si;
        j = 0;
      }
    }
    KVFS_RETURN_IF_ERROR(RunUbatch(steps, pieces, T, logit_rows, si == steps.size(), out));
  }
  kv_->FinishWriteBack(steps, step_kv_);
  for (const SequenceStep& s : steps) s.kv->SetTokens(s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size()));
  return Status::Ok();
}

}  // namespace vulkan_internal

using vulkan_internal::VulkanBackend;

namespace {

// The Vulkan backend itself, or the one inside a FallbackBackend; null for others.
VulkanBackend* AsVulkan(Backend& backend) {
  if (auto* f = dynamic_cast<FallbackBackend*>(&backend)) return f->device() ? AsVulkan(*f->device()) : nullptr;
  return dynamic_cast<VulkanBackend*>(&backend);
}
}  // namespace

Result<std::vector<uint8_t>> VulkanReadBlockCopy(Backend& backend, uint64_t serial) {
  auto* vb = AsVulkan(backend);
  if (vb == nullptr) return Unsupported("not the Vulkan backend");
  return vb->ReadBlockCopy(serial);
}

Result<std::vector<uint8_t>> VulkanForgetAndReadSlot(Backend& backend, uint64_t serial) {
  auto* vb = AsVulkan(backend);
  if (vb == nullptr) return Unsupported("not the Vulkan backend");
  return vb->ForgetAndReadSlot(serial);
}

Status VulkanLoseDevice(Backend& backend, int64_t at_submission) {
  auto* vb = AsVulkan(backend);
  if (vb == nullptr) return Unsupported("not the Vulkan backend");
  vb->LoseAtSubmission(at_submission);
  return Status::Ok();
}

Result<std::unique_ptr<Backend>> MakeVulkanBackend(const Model& model, const VulkanOptions& options) {
  auto backend = std::make_unique<VulkanBackend>(model);
  KVFS_RETURN_IF_ERROR(backend->Init(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace kvfs
