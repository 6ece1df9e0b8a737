#include "engine/model/weights.h"

#include <charconv>

#include <spdlog/fmt/fmt.h>

#include "engine/core/message_text.h"

namespace kvfs {

namespace {

class Binder {
 public:
  Binder(const GgufFile& gguf) : gguf_(gguf) {}

  Status BindMatrix(const std::string& name, int64_t n_in, int64_t n_out, Matrix& out,
                    bool optional = false) {
    const GgufTensor* t = gguf_.FindTensor(name);
    if (t == nullptr) {
      if (optional) return Status::Ok();
      return Corrupt(fmt::format("missing tensor {}", name));
    }
    const GgmlTypeTraits* traits = GgmlTypeInfo(static_cast<uint32_t>(t->type));
    if (!traits->supported) {
      return Unsupported(fmt::format("tensor {} has type {}, which kvfs does not support", name, traits->name));
    }
    if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out) {
      return Corrupt(fmt::format("tensor {} has shape [{}, {}, {}, {}] ({} dims), expected [{}, {}]", name,
                                 t->ne[0], t->ne[1], t->ne[2], t->ne[3], t->n_dims, n_in, n_out));
    }
    out.type = t->type;
    out.n_in = n_in;
    out.n_out = n_out;
    out.row_bytes = static_cast<int64_t>(t->n_bytes) / n_out;
    out.data = t->data;
    total_ += t->n_bytes;
    return Status::Ok();
  }

  Status BindVector(const std::string& name, int64_t n, Vector& out, bool optional = false) {
    const GgufTensor* t = gguf_.FindTensor(name);
    if (t == nullptr) {
      if (optional) return Status::Ok();
      return Corrupt(fmt::format("missing tensor {}", name));
    }
    if (t->type != GgmlType::kF32) {
      return Unsupported(fmt::format("tensor {} must be F32", name));
    }
    if (t->n_elements() != n) {
      return Corrupt(fmt::format("tensor {} has {} elements, expected {}", name, t->n_elements(), n));
    }
    out.n = n;
    out.data = reinterpret_cast<const float*>(t->data);
    total_ += t->n_bytes;
    return Status::Ok();
  }

  uint64_t total() const { return total_; }

 private:
  const GgufFile& gguf_;
  uint64_t total_ = 0;
};

}  // namespace

Result<ModelWeights> BindWeights(const GgufFile& gguf, const HParams& hp) {
  ModelWeights w;
  Binder b(gguf);
  const GgufTensor* embd = gguf.FindTensor("token_embd.weight");
  if (embd == nullptr) return Corrupt("missing tensor token_embd.weight");
  if (embd->ne[1] != hp.n_vocab) {
    return Corrupt(fmt::format("token_embd.weight has {} rows but the vocabulary has {} tokens",
                               embd->ne[1], hp.n_vocab));
  }
  KVFS_RETURN_IF_ERROR(b.BindMatrix("token_embd.weight", hp.n_embd, hp.n_vocab, w.token_embd));
  KVFS_RETURN_IF_ERROR(b.BindVector("output_norm.weight", hp.n_embd, w.output_norm));
  KVFS_RETURN_IF_ERROR(b.BindMatrix("output.weight", hp.n_embd, hp.n_vocab, w.output, /*optional=*/true));
  if (w.output.empty()) {
    w.output = w.token_embd;
    w.tied_output = true;
  }
  KVFS_RETURN_IF_ERROR(b.BindVector("rope_freqs.weight", hp.n_rot / 2, w.rope_freqs, /*optional=*/true));

  w.layers.resize(hp.n_layer);
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = fmt::format("blk.{}.", i);
    KVFS_RETURN_IF_ERROR(b.BindVector(p + "attn_norm.weight", hp.n_embd, l.attn_norm));
    KVFS_RETURN_IF_ERROR(b.BindMatrix(p + "attn_q.weight", hp.n_embd, hp.n_embd_q(), l.wq));
    KVFS_RETURN_IF_ERROR(b.BindMatrix(p + "attn_k.weight", hp.n_embd, hp.n_embd_kv(), l.wk));
    KVFS_RETURN_IF_ERROR(b.BindMatrix(p + "attn_v.weight", hp.n_embd, hp.n_embd_kv(), l.wv));
    KVFS_RETURN_IF_ERROR(b.BindMatrix(p + "attn_output.weight", hp.n_embd_q(), hp.n_embd, l.wo));
    KVFS_RETURN_IF_ERROR(b.BindVector(p + "ffn_norm.weight", hp.n_embd, l.ffn_norm));
    KVFS_RETURN_IF_ERROR(b.BindMatrix(p + "ffn_gate.weight", hp.n_embd, hp.n_ff, l.w_gate));
    KVFS_RETURN_IF_ERROR(b.BindMatrix(p + "ffn_up.weight", hp.n_embd, hp.n_ff, l.w_up));
    KVFS_RETURN_IF_ERROR(b.BindMatrix(p + "ffn_down.weight", hp.n_ff, hp.n_embd, l.w_down));
    // Biases: required for qwen2, accepted (optional) for llama variants that carry them.
    const bool need_bias = hp.has_qkv_bias;
    KVFS_RETURN_IF_ERROR(b.BindVector(p + "attn_q.bias", hp.n_embd_q(), l.bq, !need_bias));
    KVFS_RETURN_IF_ERROR(b.BindVector(p + "attn_k.bias", hp.n_embd_kv(), l.bk, !need_bias));
    KVFS_RETURN_IF_ERROR(b.BindVector(p + "attn_v.bias", hp.n_embd_kv(), l.bv, !need_bias));
  }
  // Layers past block_count would be silently dropped (a model that runs, wrongly): a file whose
  // metadata and tensors disagree is corrupt.
  for (const GgufTensor& t : gguf.tensors()) {
    if (!t.name.starts_with("blk.")) continue;
    const size_t dot = t.name.find('.', 4);
    int64_t layer = 0;
    const char* first = t.name.data() + 4;
    const char* last = t.name.data() + (dot == std::string::npos ? t.name.size() : dot);
    if (std::from_chars(first, last, layer).ptr == last && layer >= hp.n_layer) {
      return Corrupt(fmt::format("tensor {} is of layer {}, but the metadata's block_count is {}",
                                 QuoteForMessage(t.name), layer, hp.n_layer));
    }
  }
  w.total_bytes = b.total();
  return w;
}

}  // namespace kvfs
