// The Vulkan backend's class, shared by vulkan_backend.cpp (making it, the matrices, a pass
// split into micro-batches) and vulkan_forward.cpp (one micro-batch: the layers, attention).
// Internal to the backend: the engine sees only backend.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/backend/backend.h"
#include "engine/backend/fallback_backend.h"
#include "engine/backend/step_order.h"
#include "engine/backend/vulkan_tuning.h"
#include "engine/backend/cpu/ops.h"
#include "engine/backend/vulkan/device_kv.h"
#include "engine/backend/vulkan/device_weights.h"
#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_transfer.h"


namespace kvfs::vulkan_internal {


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
  // Forward of steps in the order given (Forward puts the short ones first when batch-invariant).
  Status ForwardSteps(std::span<const SequenceStep> steps, Logits& out);
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
  // Rows [0, matvec_rows) go to the matrix-vector shader, the rest to the tiled one (-1: by T;
  // vk::Ops::MatMulArgs::matvec_tokens).
  Status MatMul(const vk::DeviceMatrix& w, const Buffer& x, int64_t x_stride, int64_t T, int64_t matvec_rows,
                const Buffer& y, const vk::DeviceVector* bias, bool accumulate, bool same_input, const Buffer* y1 = nullptr,
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
  bool batch_invariant_ = true;  // VulkanOptions::batch_invariant
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

}  // namespace kvfs::vulkan_internal
