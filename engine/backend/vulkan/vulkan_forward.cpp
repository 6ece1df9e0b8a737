// One micro-batch of the Vulkan forward pass (vulkan_backend_impl.h): its inputs, each
// layer's dispatches and barriers, attention over the sequences' device KV blocks, the logits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "engine/backend/step_order.h"
#include "engine/backend/vulkan/vulkan_backend_impl.h"

namespace kvfs::vulkan_internal {

static_assert(kShortStepTokens == vk::Ops::kMatvecMaxTokens, "short steps are the matrix-vector shaders' rows");

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
  // Batch-invariant, the short steps' rows (first: Forward) take the matrix-vector shaders and
  // the long steps' the tiled ones, in this micro-batch as in any other (step_order.h); the
  // fusions that need every row on the matrix-vector shader apply when they all are.
  int64_t mv_rows = -1, mv_logit_rows = -1;
  if (batch_invariant_) {
    mv_rows = 0;
    for (const Piece& pc : pieces) {
      if (!IsShortStep(steps[pc.step])) continue;
      if (pc.row0 != mv_rows) return Internal("a short step after a long one in a micro-batch");
      mv_rows += pc.n;
    }
    mv_logit_rows = std::count_if(logit_rows.begin(), logit_rows.end(), [&](int64_t r) { return r < mv_rows; });
  }
  const bool rows_fuse = mv_rows < 0 || mv_rows == T;

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
    const std::optional<vk::Ops::NormInput> attn_norm =
        rows_fuse ? NormInMatvec(l.attn_norm, T, qkv_in) : std::nullopt;
    const vk::Ops::NormInput* qkv_norm = attn_norm ? &*attn_norm : nullptr;
    if (!attn_norm) {
      KVFS_RETURN_IF_ERROR(PrefetchWeights(T, qkv_in).status());
      KVFS_RETURN_IF_ERROR(NormFor(l.attn_norm, T, qkv_stacked ? l.wqkv : l.wq));
    }
    if (qkv_stacked) {
      KVFS_RETURN_IF_ERROR(MatMul(l.wqkv, xb_, n_embd, T, mv_rows, q_, &l.bqkv, false, true, &k_, &v_, nullptr, qkv_norm));
    } else {
      KVFS_RETURN_IF_ERROR(MatMul(l.wq, xb_, n_embd, T, mv_rows, q_, &l.bq, false, true, nullptr, nullptr, nullptr, qkv_norm));
      KVFS_RETURN_IF_ERROR(MatMul(l.wk, xb_, n_embd, T, mv_rows, k_, &l.bk, false, true, nullptr, nullptr, nullptr, qkv_norm));
      KVFS_RETURN_IF_ERROR(MatMul(l.wv, xb_, n_embd, T, mv_rows, v_, &l.bv, false, true, nullptr, nullptr, nullptr, qkv_norm));
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
    KVFS_RETURN_IF_ERROR(MatMul(l.wo, att_, n_q, T, mv_rows, x_, nullptr, true, true));  // codes from Attention, if any
    rec.Barrier();

    // Fusing, a stacked gate|up hands the down matrix SwiGLU's codes itself (decode).
    const vk::Ops::SwiGluCodes swiglu{vk::ActKindFor(l.w_down.type), {&swiglu_codes_, &swiglu_aux_}, &counters_,
                                      counters_.bytes() / 4};
    const bool swiglu_in_matvec =
        swiglu_in_matvec_ && rows_fuse && gate_up_stacked && ops_->FusesSwiGlu(l.w_gate_up, T, swiglu.kind, swiglu.counter_words);
    const vk::Ops::SwiGluCodes* glu = swiglu_in_matvec ? &swiglu : nullptr;
    const std::optional<vk::Ops::NormInput> ffn_norm =
        !rows_fuse ? std::nullopt : NormInMatvec(l.ffn_norm, T, std::span(ffn + 1, gate_up_stacked ? 1 : 2), glu);
    const vk::Ops::NormInput* gate_up_norm = ffn_norm ? &*ffn_norm : nullptr;
    if (!ffn_norm) {
      // On from where the read-ahead beside attention stopped (o has been read by now).
      KVFS_RETURN_IF_ERROR(PrefetchWeights(T, o_gate_up, std::max(ahead, l.wo.n_out * l.wo.row_bytes)).status());
      KVFS_RETURN_IF_ERROR(NormFor(l.ffn_norm, T, gate_up_stacked ? l.w_gate_up : l.w_gate));
    }
    if (gate_up_stacked) {
      KVFS_RETURN_IF_ERROR(
          MatMul(l.w_gate_up, xb_, n_embd, T, mv_rows, gate_, nullptr, false, true, &up_, nullptr, glu, gate_up_norm));
    } else {
      KVFS_RETURN_IF_ERROR(MatMul(l.w_gate, xb_, n_embd, T, mv_rows, gate_, nullptr, false, true, nullptr, nullptr, nullptr,
                                  gate_up_norm));
      KVFS_RETURN_IF_ERROR(
          MatMul(l.w_up, xb_, n_embd, T, mv_rows, up_, nullptr, false, true, nullptr, nullptr, nullptr, gate_up_norm));
    }
    rec.Barrier();
    if (swiglu_in_matvec) {
      quantized_kind_ = swiglu.kind;
      quantized_acts_ = swiglu.acts;
    } else {
      KVFS_RETURN_IF_ERROR(SwiGluFor(T, l.w_down));
    }
    KVFS_RETURN_IF_ERROR(MatMul(l.w_down, hidden_, n_ff, T, mv_rows, x_, nullptr, true, true));
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
        consecutive && (mv_logit_rows < 0 || mv_logit_rows == R) ? NormInMatvec(w.output_norm, R, std::span(&w.output, 1), nullptr, logit_rows[0]) : std::nullopt;
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
    KVFS_RETURN_IF_ERROR(MatMul(*w.output, xn_, n_embd, R, mv_logit_rows, logits_, nullptr, false, /*same_input=*/true, nullptr,
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

}  // namespace kvfs::vulkan_internal
