// The CPU forward pass over a batch of sequences (llama and qwen2 architectures).
// All new tokens of all sequences form one activation matrix of T rows, so every weight matrix
// is read once per pass; attention runs per sequence over its own KV blocks.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>

#include <spdlog/fmt/fmt.h>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/kernel_select.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/ops.h"
#include "engine/backend/cpu/packed_weights.h"
#include "engine/core/thread_pool.h"
#include "engine/model/quants.h"

namespace kvfs {
namespace {

// Activations quantized for one weight type's dot product. Matrices that share an input and a
// type (q/k/v, gate/up) quantize it once: the caller says when the input is unchanged.
struct QuantizedInput {
  bool valid = false;
  GgmlType vec_dot_type = GgmlType::kF32;
  int64_t rows = 0;
  int64_t row_bytes = 0;
  std::vector<uint8_t> data;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, const CpuOptions& options)
      : model_(model), hp_(model.hparams()), kernels_(options.kernels != nullptr ? *options.kernels : cpu::DefaultKernelTable()),
        attn_(cpu::AttentionKernelsFor(kernels_.name)),
        pool_(options.n_threads),
        packed_(model.weights(), kernels_, pool_, options.pack_weights, &model.gguf()) {}

  const char* name() const override { return "cpu"; }
  Status Forward(std::span<const SequenceStep> steps, Logits& out) override;

 private:
  // y[t][r] = W.row(r) . x[t] for t < T, r < W.n_out. same_input: x is the input of the
  // previous MatMul, unchanged, so its quantized form can be reused if the type matches.
  // prepare(t), when given, first computes input row t (a norm, a residual add, SwiGLU): it runs
  // on the thread that then quantizes that row, so the per-token element work is spread over the
  // threads instead of running on the caller while the others wait.
  using RowFn = std::function<void(int64_t t)>;
  void MatMul(const Matrix& w, const float* x, int64_t T, float* y, bool same_input = false,
              const RowFn* prepare = nullptr);
  const QuantizedInput& Quantize(const Matrix& w, const float* x, int64_t T, bool same_input, const RowFn* prepare);
  void Attention(int64_t layer, std::span<const SequenceStep> steps, int64_t T);
  // q4k: quantizes the K chunks of `layer` that this pass completed and stages the rows of the
  // chunk left incomplete (see PassKeys).
  void FlushKeyChunks(int64_t layer, std::span<const SequenceStep> steps);

  const Model& model_;
  const HParams& hp_;
  const cpu::KernelTable& kernels_;
  const cpu::AttentionKernels& attn_;
  ThreadPool pool_;
  PackedWeights packed_;  // after pool_: packing runs on its threads

  // Per-token bookkeeping for the current pass.
  std::vector<int64_t> token_pos_;   // [T] position of each token in its sequence
  std::vector<int32_t> token_seq_;   // [T] index of its step
  // Activations, row-major [T][width].
  std::vector<float> x_, xb_, q_, k_, v_, att_, gate_, up_, hidden_;
  std::vector<float> rope_cos_, rope_sin_;  // [T][n_rot/2]
  QuantizedInput qin_;
  struct AttentionScratch {
    std::vector<float> q, out, scores;  // [nq][hd], [nq][hd], [nq][n_ctx] for one work item
    // q4 keys: the queries as int8 blocks (cpu::Int8Queries): [nq][hd], then [nq][hd/32] each.
    std::vector<int8_t> q8_codes;
    std::vector<float> q8_scales, q8_sums;
    std::vector<int32_t> q8_code_sums;
    std::vector<cpu::KvRows> v_blocks;  // the item's V blocks in position order
  };
  // Attention work item: (step, KV head, tile of consecutive new tokens of that step).
  struct AttentionItem {
    int32_t step;
    int32_t kv_head;
    int64_t t0, n;  // first token index into the batch, and count
  };
  std::vector<AttentionItem> attn_items_;
  std::vector<AttentionScratch> scratch_;  // one per thread
  // q4k (keys per channel over chunks of C tokens), per step of the pass: the f16 K rows of
  // the current layer for positions [start, end), where start = the first position of the
  // chunk holding the step's first new token and end = after its last: the sequence's staged
  // rows followed by the new tokens' keys. A query at position p reads keys of positions below
  // (p + 1) / C * C from complete chunks and the rest, up to p, from these rows: exactly what
  // it would read had the tokens come one per pass (staged rows are f16 too), so batching and
  // prefill change nothing, and no quantization parameter depends on a later token.
  struct PassKeys {
    int64_t start = 0, end = 0;
    std::vector<uint16_t> rows;  // [end - start][n_embd_kv]
  };
  std::vector<PassKeys> pass_keys_;
};

const QuantizedInput& CpuBackend::Quantize(const Matrix& w, const float* x, int64_t T, bool same_input,
                                           const RowFn* prepare) {
  const GgmlType vdt = cpu::VecDotType(w.type);
  if (same_input && qin_.valid && qin_.vec_dot_type == vdt && qin_.rows == T && prepare == nullptr) return qin_;
  qin_.valid = true;
  qin_.vec_dot_type = vdt;
  qin_.rows = T;
  qin_.row_bytes = cpu::QuantizedActivationRowBytes(w.type, w.n_in);
  qin_.data.resize(static_cast<size_t>(qin_.row_bytes * T));
  const cpu::QuantizeRowFn quantize = kernels_.quantize_row[static_cast<int>(w.type)];
  pool_.Run([&](int ith, int nth) {
    auto [t0, t1] = SplitRange(T, ith, nth);
    for (int64_t t = t0; t < t1; ++t) {
      if (prepare != nullptr) (*prepare)(t);
      quantize(x + t * w.n_in, qin_.data.data() + t * qin_.row_bytes, w.n_in);
    }
  });
  return qin_;
}

void CpuBackend::MatMul(const Matrix& w, const float* x, int64_t T, float* y, bool same_input, const RowFn* prepare) {
  const QuantizedInput& in = Quantize(w, x, T, same_input, prepare);
  const cpu::MatMulTileFn tile = kernels_.matmul_tile[static_cast<int>(w.type)];
  const PackedWeights::Entry* packed = packed_.Find(w);
  // Threads take whole 32-row units (the SIMD tiles' panel height, a multiple of the packed
  // row groups) and all T tokens; the tile blocks rows, K and tokens itself so each unpacked
  // weight block is reused across tokens.
  // Units are claimed in chunks (a quarter of a thread's share) from a shared counter rather
  // than split in advance: a thread that the host slows down (steal time on a shared VM, a
  // busy sibling) then costs the step its share of one chunk, not of the whole matrix. A row's
  // result does not depend on which thread or chunk computes it.
  constexpr int64_t kRowUnit = 32;
  const int64_t units = (w.n_out + kRowUnit - 1) / kRowUnit;
  const int64_t chunk = std::max<int64_t>(1, units / (4 * pool_.size()));
  std::atomic<int64_t> next_unit{0};
  pool_.Run([&](int, int) {
    for (int64_t u0; (u0 = next_unit.fetch_add(chunk, std::memory_order_relaxed)) < units;) {
      const int64_t r0 = u0 * kRowUnit, r1 = std::min((u0 + chunk) * kRowUnit, w.n_out);
      if (packed != nullptr) {
        packed->kernels->matmul(packed->data, r0, r1 - r0, in.data.data(), in.row_bytes, T, w.n_in, y + r0, w.n_out);
      } else {
        tile(w.row(r0), w.row_bytes, r1 - r0, in.data.data(), in.row_bytes, T, w.n_in, y + r0, w.n_out);
      }
    }
  });
}

void CpuBackend::Attention(int64_t layer, std::span<const SequenceStep> steps, int64_t T) {
  const int64_t hd = hp_.head_dim, n_head_kv = hp_.n_head_kv, group = hp_.n_head / hp_.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Work items: (step, KV head, tile of up to kTile consecutive new tokens). Each K/V row
  // slice is decoded once per item and used by every query of the tile and of the head group.
  constexpr int64_t kTile = 16;
  std::vector<AttentionItem>& items = attn_items_;
  items.clear();
  for (int64_t t = 0; t < T;) {
    const int32_t si = token_seq_[t];
    int64_t end = t;
    while (end < T && token_seq_[end] == si) ++end;
    const KvFormat& fmt = steps[si].kv->layout().format;
    for (int64_t t0 = t; t0 < end;) {
      int64_t n = std::min(kTile, end - t0);
      if (fmt.KeysByChannel()) {
        // q4k: the queries of a tile share (p + 1) / C, so they read the same complete chunks
        // and the same f16 rows; cut before the first position p with a larger (p + 1) / C.
        const int64_t p0 = token_pos_[t0], C = fmt.chunk;
        n = std::min(n, ((p0 + 1) / C + 1) * C - 1 - p0);
      }
      for (int32_t h = 0; h < n_head_kv; ++h) items.push_back({si, h, t0, n});
      t0 += n;
    }
    t = end;
  }
  // Items are claimed one at a time (each is a whole context's rows for a head and a tile of
  // queries), for the same reason as the matmul's chunks.
  std::atomic<int64_t> next_item{0};
  const auto n_items = static_cast<int64_t>(items.size());
  pool_.Run([&](int ith, int) {
    AttentionScratch& sc = scratch_[ith];
    for (int64_t it; (it = next_item.fetch_add(1, std::memory_order_relaxed)) < n_items;) {
      const AttentionItem& item = items[it];
      const SequenceKv& kv = *steps[item.step].kv;
      const KvFormat& fmt = kv.layout().format;
      const int64_t nq = item.n * group;
      const int64_t n_ctx = token_pos_[item.t0 + item.n - 1] + 1;  // the last query sees the most
      sc.q.resize(nq * hd);
      sc.out.assign(nq * hd, 0.0f);
      sc.scores.resize(nq * n_ctx);  // no zeroing: dot_rows writes every score, softmax every weight
      for (int64_t j = 0; j < item.n; ++j) {
        for (int64_t g = 0; g < group; ++g) {
          float* qd = sc.q.data() + (j * group + g) * hd;
          const float* qs = q_.data() + (item.t0 + j) * hp_.n_embd_q() + (item.kv_head * group + g) * hd;
          std::copy(qs, qs + hd, qd);
          if (fmt.RotatesK()) attn_.hadamard(qd, hd);
          // With an f16 cache, Q is rounded to f16 as the reference's f16 path does.
          if (fmt.type == KvType::kF16) attn_.round_f16(qd, hd);
        }
      }
      // K and V are walked block by block: rows of one block are contiguous.
      const int64_t B = kv.layout().block_tokens, row_bytes = kv.layout().row_bytes();
      auto for_each_block = [&](auto&& row_of, auto&& fn) {
        for (int64_t p0 = 0; p0 < n_ctx; p0 += B - p0 % B) {
          fn(p0, cpu::KvRows{row_of(p0), row_bytes, std::min(B - p0 % B, n_ctx - p0), item.kv_head, hd});
        }
      };
      if (fmt.KeysByChannel()) {
        // q4k: complete chunks up to q_end (whole blocks' K planes at a time), then the f16 rows.
        const int64_t C = fmt.chunk, q_end = n_ctx / C * C, chunk_bytes = kv.layout().chunk_bytes();
        for (int64_t p0 = 0; p0 < q_end; p0 += B - p0 % B) {
          const cpu::KvChunks chunks{kv.k_chunk(layer, p0 / C), chunk_bytes, std::min(B - p0 % B, q_end - p0),
                                     item.kv_head, hd};
          attn_.dot_chunks(fmt, chunks, sc.q.data(), nq, sc.scores.data() + p0, n_ctx);
        }
        if (n_ctx > q_end) {
          const PassKeys& pk = pass_keys_[item.step];
          const int64_t n_kv = kv.layout().row_values();
          const cpu::KvRows rows{reinterpret_cast<const uint8_t*>(pk.rows.data() + (q_end - pk.start) * n_kv),
                                 2 * n_kv, n_ctx - q_end, item.kv_head, hd};
          attn_.dot_rows(fmt.StagingFormat(), rows, sc.q.data(), nq, sc.scores.data() + q_end, n_ctx);
        }
      } else if (cpu::KeysUseInt8Queries(fmt, hd)) {
        // Quantized once per item, then read by every K block.
        sc.q8_codes.resize(nq * hd);
        sc.q8_scales.resize(nq * hd / cpu::kQueryBlock);
        sc.q8_sums.resize(nq * hd / cpu::kQueryBlock);
        sc.q8_code_sums.resize(nq * hd / cpu::kQueryBlock);
        attn_.quantize_queries(sc.q.data(), nq, hd, sc.q8_codes.data(), sc.q8_scales.data(), sc.q8_sums.data(),
                             sc.q8_code_sums.data());
        const cpu::Int8Queries q8{sc.q8_codes.data(), sc.q8_scales.data(), sc.q8_sums.data(), sc.q8_code_sums.data()};
        for_each_block([&](int64_t p) { return kv.k_row(layer, p); }, [&](int64_t p0, const cpu::KvRows& rows) {
          attn_.dot_rows_q8(fmt, rows, q8, nq, sc.scores.data() + p0, n_ctx);
        });
      } else {
        for_each_block([&](int64_t p) { return kv.k_row(layer, p); }, [&](int64_t p0, const cpu::KvRows& rows) {
          attn_.dot_rows(fmt, rows, sc.q.data(), nq, sc.scores.data() + p0, n_ctx);
        });
      }
      // Causal softmax per query: query j of the tile sees positions 0..pos(j).
      for (int64_t j = 0; j < item.n; ++j) {
        const int64_t visible = token_pos_[item.t0 + j] + 1;
        for (int64_t g = 0; g < group; ++g) {
          // The reference's f16 path rounds the weights to f16 before multiplying V.
          attn_.softmax(sc.scores.data() + (j * group + g) * n_ctx, visible, n_ctx, scale, fmt.type == KvType::kF16);
        }
      }
      // V block by block, summed as one (attention.h: axpy_blocks).
      sc.v_blocks.clear();
      for_each_block([&](int64_t p) { return kv.v_row(layer, p); },
                     [&](int64_t, const cpu::KvRows& rows) { sc.v_blocks.push_back(rows); });
      attn_.axpy_blocks(fmt, sc.v_blocks, sc.scores.data(), nq, n_ctx, sc.out.data());
      for (int64_t j = 0; j < item.n; ++j) {
        for (int64_t g = 0; g < group; ++g) {
          float* o = sc.out.data() + (j * group + g) * hd;
          if (fmt.RotatesV()) attn_.hadamard(o, hd);  // H is its own inverse
          std::copy(o, o + hd, att_.data() + (item.t0 + j) * hp_.n_embd_q() + (item.kv_head * group + g) * hd);
        }
      }
    }
  });
}

void CpuBackend::FlushKeyChunks(int64_t layer, std::span<const SequenceStep> steps) {
  std::vector<float> x;
  for (size_t si = 0; si < steps.size(); ++si) {
    SequenceKv& kv = *steps[si].kv;
    const KvFormat& fmt = kv.layout().format;
    if (!fmt.KeysByChannel()) continue;
    const PassKeys& pk = pass_keys_[si];
    const int64_t C = fmt.chunk, n_kv = kv.layout().row_values();
    x.resize(static_cast<size_t>(C * n_kv));
    for (int64_t c = pk.start / C; (c + 1) * C <= pk.end; ++c) {
      const uint16_t* src = pk.rows.data() + (c * C - pk.start) * n_kv;
      for (int64_t i = 0; i < C * n_kv; ++i) x[i] = Fp16ToFp32(src[i]);
      KvQuantizeKChunk(fmt, x.data(), n_kv, kv.k_chunk(layer, c), n_kv);
    }
    const int64_t left = pk.end / C * C;  // the incomplete chunk, staged for the next pass
    if (pk.end > left) {
      std::copy(pk.rows.data() + (left - pk.start) * n_kv, pk.rows.data() + (pk.end - pk.start) * n_kv,
                kv.k_staging(layer, left));
    }
  }
}

Status CpuBackend::Forward(std::span<const SequenceStep> steps, Logits& out) {
  const ModelWeights& w = model_.weights();
  const int64_t n_embd = hp_.n_embd, n_q = hp_.n_embd_q(), n_kv = hp_.n_embd_kv();

  // Validate and reserve every sequence first so a failure leaves all of them untouched.
  int64_t T = 0;
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
    T += static_cast<int64_t>(s.tokens.size());
  }
  token_pos_.resize(T);
  token_seq_.resize(T);
  std::vector<int64_t> out_rows;  // token index of each logits row
  out.first_row.clear();
  {
    int64_t t = 0;
    for (size_t si = 0; si < steps.size(); ++si) {
      const SequenceStep& s = steps[si];
      out.first_row.push_back(static_cast<int64_t>(out_rows.size()));
      for (size_t j = 0; j < s.tokens.size(); ++j, ++t) {
        token_pos_[t] = s.kv->n_tokens() + static_cast<int64_t>(j);
        token_seq_[t] = static_cast<int32_t>(si);
        if (s.all_logits || j + 1 == s.tokens.size()) out_rows.push_back(t);
      }
    }
  }

  x_.resize(T * n_embd);
  xb_.resize(T * std::max(n_embd, n_q));
  q_.resize(T * n_q);
  k_.resize(T * n_kv);
  v_.resize(T * n_kv);
  att_.resize(T * n_q);
  gate_.resize(T * hp_.n_ff);
  up_.resize(T * hp_.n_ff);
  hidden_.resize(T * hp_.n_ff);
  scratch_.resize(pool_.size());

  // Token embeddings: dequantize the rows.
  {
    int64_t t = 0;
    for (const SequenceStep& s : steps) {
      for (TokenId id : s.tokens) DequantizeRow(w.token_embd.type, w.token_embd.row(id), &x_[t++ * n_embd], n_embd);
    }
  }

  // q4k: the span of f16 key rows each step's attention reads (see PassKeys).
  pass_keys_.resize(steps.size());
  for (size_t si = 0; si < steps.size(); ++si) {
    const SequenceStep& s = steps[si];
    const KvFormat& fmt = s.kv->layout().format;
    PassKeys& pk = pass_keys_[si];
    pk.start = pk.end = 0;
    if (!fmt.KeysByChannel()) continue;
    const int64_t n0 = s.kv->n_tokens();
    pk.start = n0 / fmt.chunk * fmt.chunk;
    pk.end = n0 + static_cast<int64_t>(s.tokens.size());
    pk.rows.resize(static_cast<size_t>((pk.end - pk.start) * n_kv));
  }

  // RoPE angles per token (shared by every layer).
  const int64_t half = hp_.n_rot / 2;
  cpu::RopeParams rope{hp_.n_rot, hp_.head_dim, hp_.rope_freq_base, hp_.rope_freq_scale, hp_.rope_style,
                       w.rope_freqs.empty() ? nullptr : w.rope_freqs.data};
  rope_cos_.resize(T * half);
  rope_sin_.resize(T * half);
  for (int64_t t = 0; t < T; ++t) cpu::RopeAngles(rope, token_pos_[t], &rope_cos_[t * half], &rope_sin_[t * half]);

  // Residual adds, norms and SwiGLU run per token inside the next matrix's quantize pass
  // (MatMul's prepare): x += xb (the previous projection's output), then xb = norm(x).
  auto add_residual = [&](int64_t t) {
    for (int64_t i = t * n_embd; i < (t + 1) * n_embd; ++i) x_[i] += xb_[i];
  };
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    const LayerWeights& l = w.layers[il];
    const RowFn attn_input = [&](int64_t t) {
      if (il > 0) add_residual(t);  // the previous layer's FFN output
      cpu::RmsNorm(&x_[t * n_embd], l.attn_norm.data, &xb_[t * n_embd], n_embd, hp_.rms_eps);
    };
    MatMul(l.wq, xb_.data(), T, q_.data(), false, &attn_input);
    MatMul(l.wk, xb_.data(), T, k_.data(), /*same_input=*/true);
    MatMul(l.wv, xb_.data(), T, v_.data(), /*same_input=*/true);
    // q4k: each step's f16 key rows start with the sequence's staged rows of this layer.
    for (size_t si = 0; si < steps.size(); ++si) {
      PassKeys& pk = pass_keys_[si];
      const SequenceKv& kv = *steps[si].kv;
      if (kv.layout().format.KeysByChannel()) {
        const int64_t staged = kv.n_tokens() - pk.start;
        if (staged > 0) std::copy(kv.k_staging(il, pk.start), kv.k_staging(il, pk.start) + staged * n_kv, pk.rows.data());
      }
    }
    // Biases, RoPE and the KV write, token by token (each writes only its own rows), spread over
    // the threads: a quantized format's encoder is not free (q4k's V search, above all).
    auto prepare_token = [&](int64_t t) {
      if (!l.bq.empty()) {
        for (int64_t i = 0; i < n_q; ++i) q_[t * n_q + i] += l.bq.data[i];
        for (int64_t i = 0; i < n_kv; ++i) k_[t * n_kv + i] += l.bk.data[i];
        for (int64_t i = 0; i < n_kv; ++i) v_[t * n_kv + i] += l.bv.data[i];
      }
      cpu::RopeApply(rope, &rope_cos_[t * half], &rope_sin_[t * half], &q_[t * n_q], hp_.n_head);
      cpu::RopeApply(rope, &rope_cos_[t * half], &rope_sin_[t * half], &k_[t * n_kv], hp_.n_head_kv);
      // Encode K and V into the sequence's format at the token's position before attention
      // reads them (rotated per head first when the format rotates).
      SequenceKv& kv = *steps[token_seq_[t]].kv;
      const KvFormat& fmt = kv.layout().format;
      float* kt = &k_[t * n_kv];
      float* vt = &v_[t * n_kv];
      for (int64_t h = 0; h < hp_.n_head_kv; ++h) {
        if (fmt.RotatesK()) attn_.hadamard(kt + h * hp_.head_dim, hp_.head_dim);
        if (fmt.RotatesV()) attn_.hadamard(vt + h * hp_.head_dim, hp_.head_dim);
      }
      if (fmt.KeysByChannel()) {
        PassKeys& pk = pass_keys_[token_seq_[t]];
        uint16_t* dst = pk.rows.data() + (token_pos_[t] - pk.start) * n_kv;
        for (int64_t i = 0; i < n_kv; ++i) dst[i] = Fp32ToFp16(kt[i]);
      } else {
        KvQuantizeRow(fmt, kt, kv.k_row(il, token_pos_[t]), n_kv);
      }
      KvQuantizeRow(fmt, vt, kv.v_row(il, token_pos_[t]), n_kv);
    };
    if (T == 1) {
      prepare_token(0);
    } else {
      pool_.Run([&](int ith, int nth) {
        auto [t0, t1] = SplitRange(T, ith, nth);
        for (int64_t t = t0; t < t1; ++t) prepare_token(t);
      });
    }
    FlushKeyChunks(il, steps);
    Attention(il, steps, T);
    MatMul(l.wo, att_.data(), T, xb_.data());

    const RowFn ffn_input = [&](int64_t t) {
      add_residual(t);  // the attention output
      cpu::RmsNorm(&x_[t * n_embd], l.ffn_norm.data, &xb_[t * n_embd], n_embd, hp_.rms_eps);
    };
    MatMul(l.w_gate, xb_.data(), T, gate_.data(), false, &ffn_input);
    MatMul(l.w_up, xb_.data(), T, up_.data(), /*same_input=*/true);
    const RowFn swiglu = [&](int64_t t) {
      cpu::SwiGlu(&gate_[t * hp_.n_ff], &up_[t * hp_.n_ff], &hidden_[t * hp_.n_ff], hp_.n_ff);
    };
    MatMul(l.w_down, hidden_.data(), T, xb_.data(), false, &swiglu);
  }
  if (hp_.n_layer > 0) {
    for (int64_t t = 0; t < T; ++t) add_residual(t);  // the last layer's FFN output
  }

  // Final norm and output projection, only for the rows whose logits are wanted.
  const int64_t R = static_cast<int64_t>(out_rows.size());
  std::vector<float> xn(R * n_embd);
  for (int64_t r = 0; r < R; ++r) cpu::RmsNorm(&x_[out_rows[r] * n_embd], w.output_norm.data, &xn[r * n_embd], n_embd, hp_.rms_eps);
  out.n_vocab = hp_.n_vocab;
  out.data.resize(R * hp_.n_vocab);
  MatMul(w.output, xn.data(), R, out.data.data());

  for (const SequenceStep& s : steps) s.kv->SetTokens(s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size()));
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const Model& model, const CpuOptions& options) {
  return std::make_unique<CpuBackend>(model, options);
}

}  // namespace kvfs
