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
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/backend/backend.h"
#include "engine/backend/fallback_backend.h"
#include "engine/backend/vulkan_tuning.h"
#include "engine/backend/cpu/ops.h"
#include "engine/backend/vulkan/device_kv.h"
#include "engine/backend/vulkan/device_weights.h"
#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_transfer.h"

namespace kvfs {
namespace {

using vk::Buffer;
using vk::MemoryKind;

constexpr int64_t kMaxUbatch = 512;
constexpr int64_t kStagingBytes = int64_t{64} << 20;
constexpr int64_t kCounterBytes = vk::Ops::kCounterWords * 4;

class VulkanBackend final : public Backend {
 public:
  explicit VulkanBackend(const Model& model) : model_(model), hp_(model.hparams()) {}
  // The pieces of an abandoned pass (a later piece failed to go) may still run: they must
  // finish before the buffers they use are freed (members go before rec_).
  ~VulkanBackend() override {
    if (rec_ != nullptr) (void)rec_->Drain();
  }
  Status Init(const VulkanOptions& options);

  const char* name() const override { return "vulkan"; }
  Status Forward(std::span<const SequenceStep> steps, Logits& out) override;
  bool Fits(std::span<const SequenceStep> steps) const override { return kv_->Fits(steps); }
  bool Lost() const override { return ctx_->lost(); }
  bool KeepsBlockCopies() const override { return true; }
  bool ReadsModelMatrices() const override { return false; }  // uploaded when made
  Status ForgetBlocks(std::span<const uint64_t> serials) override {
    if (serials.empty()) return Status::Ok();
    KVFS_RETURN_IF_ERROR(rec_->Begin());
    kv_->Forget(*rec_, serials);
    return rec_->SubmitAndWait();
  }
  int64_t BlockCopies() const override { return kv_->copies(); }
  bool CompilesOnFirstUse() const override { return true; }
  int64_t KernelsMade() const override { return pipelines_->size(); }
  std::string TakeProfileReport() override { return rec_->TakeProfileReport(pipelines_.get()); }
  Status SetVulkanTuning(const VulkanTuning& tuning) override;
  // Test hooks (backend.h).
  Result<std::vector<uint8_t>> ReadBlockCopy(uint64_t serial) { return kv_->ReadCopy(*rec_, serial); }
  void LoseAtSubmission(int64_t n) { ctx_->LoseAtSubmission(n); }
  Result<std::vector<uint8_t>> ForgetAndReadSlot(uint64_t serial) {
    KVFS_ASSIGN_OR_RETURN(auto where, kv_->SlotOf(serial));
    const uint64_t one[1] = {serial};
    KVFS_RETURN_IF_ERROR(ForgetBlocks(one));
    return kv_->ReadSlot(*rec_, *where.first, where.second);
  }

 private:
  // A run of consecutive tokens of one step inside a micro-batch.
  struct Piece {
    int32_t step;
    int64_t row0;  // first row of the micro-batch
    int64_t n;
    int64_t pos0;  // position of its first token
  };
  Status RunUbatch(std::span<const SequenceStep> steps, std::span<const Piece> pieces, int64_t T,
                   std::span<const int64_t> logit_rows, bool last, Logits& out);
  // Fused, batched and merging sequences, once the micro-batch's recording has begun: writes
  // its kv_store entries into tables of the pass (Recorder::PassTable), one per group of pieces
  // that share a KV arena, so that each layer stores a group's rows with one dispatch
  // (Ops::KvStoreBatch). Else (or without table space) no groups: a kv_store per piece.
  Status PlanKvStores(std::span<const Piece> pieces);
  // y (+)= W x, quantizing x first when W's type needs it (reused while same_input).
  // Stacked matrices (q|k|v, gate|up) write their second and third parts to y1 and y2.
  // With `swiglu`, gate|up also hands on SwiGLU(y, y1)'s codes for the down matrix. With
  // `norm`, W's input is that norm of its x, made by the shader (x unused; Ops::FusesNorm).
  Status MatMul(const vk::DeviceMatrix& w, const Buffer& x, int64_t x_stride, int64_t T, const Buffer& y,
                const vk::DeviceVector* bias, bool accumulate, bool same_input, const Buffer* y1 = nullptr,
                const Buffer* y2 = nullptr, const vk::Ops::SwiGluCodes* swiglu = nullptr,
                const vk::Ops::NormInput* norm = nullptr);
  // Fusing, the norm x_ -> RMSNorm(x_) * w of T rows from row0 that the matrices `next` read,
  // when every one of them can make it itself (Ops::FusesNorm; gate|up with `swiglu`'s codes):
  // else null.
  std::optional<vk::Ops::NormInput> NormInMatvec(const vk::DeviceVector& w, int64_t T,
                                                 std::span<const vk::DeviceMatrix* const> next,
                                                 const vk::Ops::SwiGluCodes* swiglu = nullptr, int64_t row0 = 0) const;
  // xb_ = RMSNorm(x_) * w for T rows, ready for `next` (the first matrix to read it): quantized
  // in the same dispatch when fusing and next takes quantized activations.
  Status NormFor(const vk::DeviceVector& w, int64_t T, const vk::DeviceMatrix& next);
  // hidden_ = SwiGLU(gate_, up_) for T rows, ready for `next` in the same way.
  Status SwiGluFor(int64_t T, const vk::DeviceMatrix& next);
  // Stores the new K/V rows and runs attention into att_ (q_ and k_ as the matrix left them:
  // fusing, kv_store rotates the keys and the scores the queries; else both were rotated in
  // place); fusing, it also quantizes att_ for `next` (the o matrix) where the output shaders can.
  Status Attention(int64_t layer, std::span<const Piece> pieces, const vk::DeviceMatrix& next);
  // Decode (T up to the matrix-vector shaders' tokens) with VulkanTuning::prefetch_mib set:
  // reads ahead up to that budget of the matrices' rows, taken one after another from byte
  // `skip` on, beside the short dispatches of the phase being recorded (Ops::Prefetch).
  // Returns the bytes covered (0 when it reads nothing).
  Result<int64_t> PrefetchWeights(int64_t T, std::span<const vk::DeviceMatrix* const> matrices, int64_t skip = 0);
  // act_codes_ now holds codes of `kind` (kFloat: none) of the next matrices' input.
  void HoldCodes(vk::ActKind kind) {
    quantized_kind_ = kind;
    quantized_acts_ = {&act_codes_, &act_aux_};
  }
  // Makes logits_ and logits_out_ hold at least `rows` rows (at most max_ubatch_).
  Status ReserveLogitRows(int64_t rows);

  const Model& model_;
  const HParams& hp_;
  std::unique_ptr<vk::Context> ctx_;
  std::unique_ptr<vk::PipelineCache> pipelines_;
  std::unique_ptr<vk::Recorder> rec_;
  std::unique_ptr<vk::Uploader> uploader_;
  std::unique_ptr<vk::Ops> ops_;
  std::unique_ptr<vk::DeviceWeights> weights_;
  std::unique_ptr<vk::DeviceKvCache> kv_;
  std::vector<vk::StepKv> step_kv_;  // per step of the current pass
  std::vector<vk::Ops::AttentionJob> attention_jobs_;  // Attention()'s, reused layer after layer
  // The micro-batch's kv_store dispatches (PlanKvStores): entries [entry0, entry0 + n) of the
  // pass's tables, of steps sharing the arena of step `step`; mirror: the write-back buffer.
  struct KvStoreGroup {
    int32_t step;
    int64_t entry0;
    int64_t n;
    const Buffer* mirror;
  };
  std::vector<KvStoreGroup> kv_store_groups_;
  std::vector<vk::Ops::KvStoreEntry> kv_store_entries_;  // PlanKvStores' group being written
  int64_t max_ubatch_ = kMaxUbatch;
  bool fuse_ops_ = true;
  bool swiglu_in_matvec_ = true;  // VulkanOptions::swiglu_in_matvec (and fuse_ops)
  bool batch_attention_ = true;
  bool merge_sequences_ = true;  // VulkanOptions::merge_sequences
  bool kv_rows_by_kv_store_ = true;  // VulkanOptions::kv_rows_by_kv_store (and fuse_ops)
  int64_t prefetch_bytes_ = 0;       // VulkanTuning::prefetch_mib, in bytes
  // The codes of the input the next matrix reads (kFloat: none): act_codes_ / act_aux_, or
  // swiglu_codes_ / swiglu_aux_ when gate|up made them.
  vk::ActKind quantized_kind_ = vk::ActKind::kFloat;
  vk::QuantizedActs quantized_acts_;

  // Activations on the device, row-major [max_ubatch_][width] f32 unless said otherwise.
  Buffer x_;          // [n_embd] residual stream
  Buffer xb_;         // [max(n_embd, n_embd_q)] normed input / matmul output before the residual add
  Buffer q_;          // [n_embd_q]
  Buffer k_, v_;      // [n_embd_kv] before encoding into the KV format
  Buffer att_;        // [n_embd_q] attention output
  Buffer gate_, up_, hidden_;  // [n_ff]
  Buffer xn_;         // [n_embd] final-normed rows whose logits are wanted
  Buffer logits_;     // [logit_rows_][n_vocab]: grown on demand (decode needs one row)
  Buffer act_codes_;  // quantized activations: [max_ubatch_][max n_in / 4] words
  Buffer act_aux_;    // [max_ubatch_][max n_in / 32] vec4 (see vk_ops.h)
  Buffer swiglu_codes_;  // the down matrix's codes from gate|up (decode): [kMatvecMaxTokens][n_ff / 4] words
  Buffer swiglu_aux_;    // [kMatvecMaxTokens][n_ff / 32] vec4
  Buffer scores_;     // attention weights: [tokens][n_head][context], Ops::BackendScratch
  Buffer partials_;   // attention split over positions: [tokens][n_head][splits][head_dim]
  Buffer stats_;      // decode attention's softmax shares: [tokens][n_head][score workgroups] (max, sum)
  Buffer counters_;   // split attention's counters (uint32, kept 0 between uses): one-pass split sums
  Buffer prefetch_sink_;  // [4] uint32: the word prefetch.comp XORs what it reads into (never read)
  // Host-visible inputs and outputs of a micro-batch.
  Buffer tokens_;     // [max_ubatch_] int32 token ids
  Buffer rope_;       // [max_ubatch_][n_rot / 2] (cos, sin) pairs
  Buffer row_ids_;    // [max_ubatch_] int32: rows whose logits are wanted
  Buffer logits_out_; // [logit_rows_][n_vocab] readback
  int64_t logit_rows_ = 0;
};

Status VulkanBackend::Init(const VulkanOptions& options) {
  KVFS_RETURN_IF_ERROR(vk::CheckWeightTypes(model_.weights()));
  // Profiling: the compiler's statistics of the pipelines too, where the device reports them.
  KVFS_ASSIGN_OR_RETURN(ctx_, vk::Context::Create(options.device, options.integer_dot,
                                                  /*capture_statistics=*/options.profile, options.phase_clock));
  ctx_->LimitDeviceLocalBytes(options.device_local_limit);
  fuse_ops_ = options.fuse_ops;
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

Status VulkanBackend::MatMul(const vk::DeviceMatrix& w, const Buffer& x, int64_t x_stride, int64_t T, const Buffer& y,
                             const vk::DeviceVector* bias, bool accumulate, bool same_input, const Buffer* y1,
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

Status VulkanBackend::Attention(int64_t layer, std::span<const Piece> pieces, const vk::DeviceMatrix& next) {
  const vk::AttentionShape shape{hp_.n_head, hp_.n_head_kv, hp_.head_dim};
  const int64_t n_q = hp_.n_embd_q(), n_kv = hp_.n_embd_kv();
  // New K/V rows first (a query attends to its own position), then attention piece by piece,
  // in chunks of tokens whose scores fit the scores buffer.
  // q4k: keys as f16 rows into the pass's key rows, then the chunks each piece completes.
  // Fusing, a kv_store stores (q4k: stages) K and V, rotating the keys by RoPE on the way: one
  // for all the pieces of a KV arena (PlanKvStores), else one per piece.
  // Attention of every piece, in jobs whose scores fit the scratch (a long prefill piece takes
  // several, of consecutive tokens); batched, the pieces' steps share their barriers.
  const int64_t score_floats = scores_.bytes() / 4;
  std::vector<vk::Ops::AttentionJob>& jobs = attention_jobs_;  // kept between layers: no allocation
  jobs.clear();
  for (const Piece& pc : pieces) {
    const vk::KvView view = kv_->View(step_kv_[pc.step], layer);
    const int64_t n_ctx_last = pc.pos0 + pc.n;  // the most any token of the piece sees
    for (int64_t j = 0, chunk = 0; j < pc.n; j += chunk) {
      chunk = std::clamp<int64_t>(score_floats / (hp_.n_head * n_ctx_last), 1, pc.n - j);
      jobs.push_back({view, pc.row0 + j, chunk, pc.pos0 + j, pc.row0 + j});
    }
  }
  // Fusing, a decode step's scores make the new keys from k_ themselves (Ops::NewKeys) where
  // each piece is one job that can: then no barrier between kv_store and the scores (the
  // weighted sums read V after the scores' barrier).
  bool new_keys_in_scores = fuse_ops_ && jobs.size() == pieces.size();
  for (const vk::Ops::AttentionJob& j : jobs) {
    new_keys_in_scores = new_keys_in_scores && vk::Ops::ScoresReadNewKeys(j.kv.format, j.n_tokens, j.pos0);
  }
  bool chunks = false;
  const vk::Ops::RopeTable k_rope{&rope_, hp_.n_rot, hp_.rope_style};
  for (const KvStoreGroup& g : kv_store_groups_) {  // fused, pieces of an arena together
    const vk::KvView view = kv_->View(step_kv_[g.step], layer);
    KVFS_RETURN_IF_ERROR(ops_->KvStoreBatch(*rec_, view, shape, k_, v_, n_kv, rec_->pass_tables(), g.entry0, g.n, layer,
                                            &k_rope, g.mirror));
  }
  for (const Piece& pc : pieces) {
    const vk::KvView view = kv_->View(step_kv_[pc.step], layer);
    if (view.format.KeysByChannel()) {
      chunks = chunks || (pc.pos0 + pc.n) / view.format.chunk > pc.pos0 / view.format.chunk;
    }
    if (!kv_store_groups_.empty()) continue;  // stored above
    if (fuse_ops_) {
      // The rows also go to the write-back buffer (DeviceKvCache::Mirror): no copies at the end.
      const vk::Ops::KvMirror mirror = kv_->Mirror(step_kv_, static_cast<size_t>(pc.step), layer);
      KVFS_RETURN_IF_ERROR(
          ops_->KvStoreBoth(*rec_, view, shape, k_, v_, n_kv, pc.row0, pc.n, pc.pos0, &k_rope, &mirror));
    } else if (view.format.KeysByChannel()) {
      KVFS_RETURN_IF_ERROR(ops_->KStage(*rec_, view, shape, k_, n_kv, pc.row0, pc.n, pc.pos0));
      KVFS_RETURN_IF_ERROR(ops_->KvStore(*rec_, view, *view.v_plane, shape, v_, n_kv, pc.row0, pc.n, pc.pos0));
    } else {
      KVFS_RETURN_IF_ERROR(ops_->KvStore(*rec_, view, *view.k_plane, shape, k_, n_kv, pc.row0, pc.n, pc.pos0));
      KVFS_RETURN_IF_ERROR(ops_->KvStore(*rec_, view, *view.v_plane, shape, v_, n_kv, pc.row0, pc.n, pc.pos0));
    }
  }
  if (!new_keys_in_scores) rec_->Barrier();
  if (chunks) {  // (ScoresReadNewKeys refuses these pieces: the barrier above came first)
    for (const Piece& pc : pieces) {
      const vk::KvView view = kv_->View(step_kv_[pc.step], layer);
      if (!view.format.KeysByChannel()) continue;
      const int64_t C = view.format.chunk;
      KVFS_RETURN_IF_ERROR(ops_->KChunks(*rec_, view, shape, pc.pos0 / C, (pc.pos0 + pc.n) / C - pc.pos0 / C));
    }
    rec_->Barrier();
  }
  // Fusing, the split sums are added by each row's last split (counters), without attn_reduce.
  const vk::Ops::AttentionScratch scratch{&scores_,
                                          score_floats,
                                          &partials_,
                                          partials_.bytes() / 4,
                                          &stats_,
                                          stats_.bytes() / 4,
                                          fuse_ops_ ? &counters_ : nullptr,
                                          fuse_ops_ ? counters_.bytes() / 4 : 0};
  // The codes of att_ for the o matrix, written by the output shaders (no quantize_act then).
  // act_codes_ is free: the q, k, v matrices that read it ran before the barriers above.
  const vk::OutputCodes codes{vk::ActKindFor(next.type), {&act_codes_, &act_aux_}};
  const vk::Ops::RopeTable q_rope{&rope_, hp_.n_rot, hp_.rope_style};
  const vk::Ops::RopeTable* q_rope_in_scores = fuse_ops_ ? &q_rope : nullptr;
  const bool quantize = fuse_ops_ && ops_->QuantizesAttentionOutput(shape, codes.kind);
  const vk::Ops::NewKeys new_keys{&k_, n_kv};
  const vk::Ops::NewKeys* new_keys_for_scores = new_keys_in_scores ? &new_keys : nullptr;
  HoldCodes(quantize ? codes.kind : vk::ActKind::kFloat);  // act_codes_ no longer holds xb_'s codes
  if (batch_attention_) {
    KVFS_RETURN_IF_ERROR(
        ops_->AttentionBatch(*rec_, shape, q_, n_q, att_, n_q, jobs, scratch, quantize ? &codes : nullptr,
                             q_rope_in_scores, new_keys_for_scores));
    rec_->Barrier();
    return Status::Ok();
  }
  for (const vk::Ops::AttentionJob& job : jobs) {  // one after another (VulkanOptions::batch_attention)
    KVFS_RETURN_IF_ERROR(
        ops_->AttentionBatch(*rec_, shape, q_, n_q, att_, n_q, {&job, 1}, scratch, quantize ? &codes : nullptr,
                             q_rope_in_scores, new_keys_for_scores));
    rec_->Barrier();
  }
  return Status::Ok();
}

Status VulkanBackend::PlanKvStores(std::span<const Piece> pieces) {
  kv_store_groups_.clear();
  if (!fuse_ops_ || !batch_attention_ || !merge_sequences_) return Status::Ok();  // per piece (the separate ops; A/B timing)
  const vk::AttentionShape shape{hp_.n_head, hp_.n_head_kv, hp_.head_dim};
  for (size_t i = 0; i < pieces.size(); ++i) {
    const vk::KvArena* arena = step_kv_[pieces[i].step].arena;
    const bool grouped = std::any_of(kv_store_groups_.begin(), kv_store_groups_.end(),
                                     [&](const KvStoreGroup& g) { return step_kv_[g.step].arena == arena; });
    if (grouped) continue;
    KvStoreGroup group{pieces[i].step, 0, 0, nullptr};
    kv_store_entries_.clear();
    for (size_t j = i; j < pieces.size(); ++j) {
      const Piece& pc = pieces[j];
      if (step_kv_[pc.step].arena != arena) continue;
      // Layer 0's view and mirror: the entries hold what does not change from layer to layer.
      const vk::KvView view = kv_->View(step_kv_[pc.step], 0);
      const vk::Ops::KvMirror mirror = kv_->Mirror(step_kv_, static_cast<size_t>(pc.step), 0);
      if (mirror.buffer != nullptr) group.mirror = mirror.buffer;
      for (int64_t t = 0; t < pc.n; ++t) {
        KVFS_ASSIGN_OR_RETURN(const vk::Ops::KvStoreEntry e,
                              vk::Ops::KvStoreEntryFor(view, shape, pc.row0 + t, pc.pos0 + t, &mirror));
        kv_store_entries_.push_back(e);
      }
    }
    const auto bytes = std::as_bytes(std::span(kv_store_entries_));
    KVFS_ASSIGN_OR_RETURN(group.entry0,
                          rec_->PassTable(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                                          static_cast<int64_t>(sizeof(vk::Ops::KvStoreEntry))));
    if (group.entry0 < 0) {  // no table space (a pass's first tables fit): a kv_store per piece
      kv_store_groups_.clear();
      return Status::Ok();
    }
    group.n = static_cast<int64_t>(kv_store_entries_.size());
    kv_store_groups_.push_back(group);
  }
  return Status::Ok();
}

Status VulkanBackend::RunUbatch(std::span<const SequenceStep> steps, std::span<const Piece> pieces, int64_t T,
                                std::span<const int64_t> logit_rows, bool last, Logits& out) {
  const vk::DeviceWeights& w = *weights_;
  const int64_t n_embd = hp_.n_embd, n_q = hp_.n_embd_q(), n_kv = hp_.n_embd_kv(), n_ff = hp_.n_ff;
  const float eps = hp_.rms_eps;

  // Host inputs: token ids, RoPE angles (the CPU's RopeAngles), rows whose logits are wanted.
  auto* ids = reinterpret_cast<int32_t*>(tokens_.mapped());
  auto* rope = reinterpret_cast<float*>(rope_.mapped());
  const int64_t half = hp_.n_rot / 2;
  const cpu::RopeParams rope_params{hp_.n_rot, hp_.head_dim, hp_.rope_freq_base, hp_.rope_freq_scale, hp_.rope_style,
                                    model_.weights().rope_freqs.empty() ? nullptr : model_.weights().rope_freqs.data};
  std::vector<float> cos_t(half), sin_t(half);
  for (const Piece& pc : pieces) {
    for (int64_t j = 0; j < pc.n; ++j) {
      const SequenceStep& s = steps[pc.step];
      ids[pc.row0 + j] = s.tokens[pc.pos0 + j - step_kv_[pc.step].n_old];
      cpu::RopeAngles(rope_params, pc.pos0 + j, cos_t.data(), sin_t.data());
      for (int64_t i = 0; i < half; ++i) {
        rope[(pc.row0 + j) * 2 * half + 2 * i] = cos_t[i];
        rope[(pc.row0 + j) * 2 * half + 2 * i + 1] = sin_t[i];
      }
    }
  }
  const int64_t R = static_cast<int64_t>(logit_rows.size());
  auto* row_ids = reinterpret_cast<int32_t*>(row_ids_.mapped());
  for (int64_t r = 0; r < R; ++r) row_ids[r] = static_cast<int32_t>(logit_rows[r]);

  KVFS_RETURN_IF_ERROR(ReserveLogitRows(R));  // before recording: it may replace buffers
  vk::Recorder& rec = *rec_;
  KVFS_RETURN_IF_ERROR(rec.Begin());
  KVFS_RETURN_IF_ERROR(PlanKvStores(pieces));
  HoldCodes(vk::ActKind::kFloat);
  KVFS_RETURN_IF_ERROR(ops_->Embed(rec, w.token_embd, tokens_, T, x_));
  rec.Barrier();
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    const vk::DeviceLayer& l = w.layers[il];
    const bool qkv_stacked = !l.wqkv.parts.empty();
    // Decode, when tuned so: q|k|v read ahead beside the norm; o and the first of gate|up
    // beside kv_store and the scores (Attention records nothing before them); more of gate|up
    // beside the feed-forward norm. (A norm the matrices make has no dispatch to read beside.)
    const bool gate_up_stacked = !l.w_gate_up.parts.empty();
    const vk::DeviceMatrix* const qkv[3] = {qkv_stacked ? &l.wqkv : &l.wq, &l.wk, &l.wv};
    const vk::DeviceMatrix* const ffn[3] = {&l.wo, gate_up_stacked ? &l.w_gate_up : &l.w_gate, &l.w_up};
    const std::span<const vk::DeviceMatrix* const> qkv_in(qkv, qkv_stacked ? 1 : 3);
    // Fusing, the matrices make the norm themselves where the shape asks and they can.
    const std::optional<vk::Ops::NormInput> attn_norm = NormInMatvec(l.attn_norm, T, qkv_in);
    const vk::Ops::NormInput* qkv_norm = attn_norm ? &*attn_norm : nullptr;
    if (!attn_norm) {
      KVFS_RETURN_IF_ERROR(PrefetchWeights(T, qkv_in).status());
      KVFS_RETURN_IF_ERROR(NormFor(l.attn_norm, T, qkv_stacked ? l.wqkv : l.wq));
    }
    if (qkv_stacked) {
      KVFS_RETURN_IF_ERROR(MatMul(l.wqkv, xb_, n_embd, T, q_, &l.bqkv, false, true, &k_, &v_, nullptr, qkv_norm));
    } else {
      KVFS_RETURN_IF_ERROR(MatMul(l.wq, xb_, n_embd, T, q_, &l.bq, false, true, nullptr, nullptr, nullptr, qkv_norm));
      KVFS_RETURN_IF_ERROR(MatMul(l.wk, xb_, n_embd, T, k_, &l.bk, false, true, nullptr, nullptr, nullptr, qkv_norm));
      KVFS_RETURN_IF_ERROR(MatMul(l.wv, xb_, n_embd, T, v_, &l.bv, false, true, nullptr, nullptr, nullptr, qkv_norm));
    }
    rec.Barrier();
    // Fusing, kv_store rotates the keys and the scores the queries as they load them (Attention).
    if (!fuse_ops_) {
      KVFS_RETURN_IF_ERROR(ops_->Rope(rec, q_, n_q, hp_.n_head, hp_.head_dim, hp_.n_rot, hp_.rope_style, rope_, T));
      KVFS_RETURN_IF_ERROR(ops_->Rope(rec, k_, n_kv, hp_.n_head_kv, hp_.head_dim, hp_.n_rot, hp_.rope_style, rope_, T));
      rec.Barrier();
    }
    const std::span<const vk::DeviceMatrix* const> o_gate_up(ffn, gate_up_stacked ? 2 : 3);
    KVFS_ASSIGN_OR_RETURN(const int64_t ahead, PrefetchWeights(T, o_gate_up));
    KVFS_RETURN_IF_ERROR(Attention(il, pieces, l.wo));
    KVFS_RETURN_IF_ERROR(MatMul(l.wo, att_, n_q, T, x_, nullptr, true, true));  // codes from Attention, if any
    rec.Barrier();

    // Fusing, a stacked gate|up hands the down matrix SwiGLU's codes itself (decode).
    const vk::Ops::SwiGluCodes swiglu{vk::ActKindFor(l.w_down.type), {&swiglu_codes_, &swiglu_aux_}, &counters_,
                                      counters_.bytes() / 4};
    const bool swiglu_in_matvec =
        swiglu_in_matvec_ && gate_up_stacked && ops_->FusesSwiGlu(l.w_gate_up, T, swiglu.kind, swiglu.counter_words);
    const vk::Ops::SwiGluCodes* glu = swiglu_in_matvec ? &swiglu : nullptr;
    const std::optional<vk::Ops::NormInput> ffn_norm =
        NormInMatvec(l.ffn_norm, T, std::span(ffn + 1, gate_up_stacked ? 1 : 2), glu);
    const vk::Ops::NormInput* gate_up_norm = ffn_norm ? &*ffn_norm : nullptr;
    if (!ffn_norm) {
      // On from where the read-ahead beside attention stopped (o has been read by now).
      KVFS_RETURN_IF_ERROR(PrefetchWeights(T, o_gate_up, std::max(ahead, l.wo.n_out * l.wo.row_bytes)).status());
      KVFS_RETURN_IF_ERROR(NormFor(l.ffn_norm, T, gate_up_stacked ? l.w_gate_up : l.w_gate));
    }
    if (gate_up_stacked) {
      KVFS_RETURN_IF_ERROR(
          MatMul(l.w_gate_up, xb_, n_embd, T, gate_, nullptr, false, true, &up_, nullptr, glu, gate_up_norm));
    } else {
      KVFS_RETURN_IF_ERROR(MatMul(l.w_gate, xb_, n_embd, T, gate_, nullptr, false, true, nullptr, nullptr, nullptr,
                                  gate_up_norm));
      KVFS_RETURN_IF_ERROR(
          MatMul(l.w_up, xb_, n_embd, T, up_, nullptr, false, true, nullptr, nullptr, nullptr, gate_up_norm));
    }
    rec.Barrier();
    if (swiglu_in_matvec) {
      quantized_kind_ = swiglu.kind;
      quantized_acts_ = swiglu.acts;
    } else {
      KVFS_RETURN_IF_ERROR(SwiGluFor(T, l.w_down));
    }
    KVFS_RETURN_IF_ERROR(MatMul(l.w_down, hidden_, n_ff, T, x_, nullptr, true, true));
    rec.Barrier();
  }
  if (R > 0) {
    // Decode (every row wants its logits, in order): the final norm also quantizes its rows for
    // the output matrix, as the layers' norms do; else it gathers the rows wanted first.
    bool every_row = R == T, consecutive = true;
    for (int64_t r = 0; r < R; ++r) {
      every_row = every_row && logit_rows[r] == r;
      consecutive = consecutive && logit_rows[r] == logit_rows[0] + r;
    }
    const vk::ActKind output_kind = vk::ActKindFor(w.output->type);
    // The output matrix makes the norm of consecutive rows itself where it can (a prompt's last).
    const std::optional<vk::Ops::NormInput> out_norm =
        consecutive ? NormInMatvec(w.output_norm, R, std::span(&w.output, 1), nullptr, logit_rows[0]) : std::nullopt;
    if (!out_norm) {
      KVFS_RETURN_IF_ERROR(PrefetchWeights(T, std::span(&w.output, 1)).status());
      if (fuse_ops_ && every_row && output_kind != vk::ActKind::kFloat) {
        KVFS_RETURN_IF_ERROR(ops_->NormQuantizeActs(rec, output_kind, x_, n_embd, w.output_norm.buffer, n_embd, eps,
                                                    xn_, n_embd, R, {&act_codes_, &act_aux_}));
        HoldCodes(output_kind);
      } else {
        KVFS_RETURN_IF_ERROR(
            ops_->RmsNorm(rec, x_, n_embd, w.output_norm.buffer, n_embd, eps, xn_, n_embd, R, &row_ids_));
        HoldCodes(vk::ActKind::kFloat);
      }
      rec.Barrier();
    }
    KVFS_RETURN_IF_ERROR(MatMul(*w.output, xn_, n_embd, R, logits_, nullptr, false, /*same_input=*/true, nullptr,
                                nullptr, nullptr, out_norm ? &*out_norm : nullptr));
    rec.Barrier();
    rec.Copy(logits_, 0, logits_out_, 0, R * hp_.n_vocab * 4);
  }
  if (last) KVFS_RETURN_IF_ERROR(kv_->RecordWriteBack(rec, step_kv_));
  KVFS_RETURN_IF_ERROR(rec.SubmitAndWait());
  if (R == 0) return Status::Ok();  // a micro-batch whose tokens want no logits (none mapped)
  const size_t at = out.data.size();
  out.data.resize(at + static_cast<size_t>(R * hp_.n_vocab));
  std::memcpy(out.data.data() + at, logits_out_.mapped(), static_cast<size_t>(R * hp_.n_vocab * 4));
  return Status::Ok();
}

Status VulkanBackend::Forward(std::span<const SequenceStep> steps, Logits& out) {
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
