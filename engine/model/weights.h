// Views of a model's weight tensors, used in place from the GGUF mapping (no copies).
// Shapes follow ggml: a matrix W with ne = [n_in, n_out] stores n_out rows of n_in
// contiguous elements (in the tensor's block format); y = W x computes one dot per row.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/gguf.h"
#include "engine/model/hparams.h"

namespace kvfs {

struct Matrix {
  GgmlType type = GgmlType::kF32;
  int64_t n_in = 0;              // row length (ne[0]); a multiple of the type's block size
  int64_t n_out = 0;             // number of rows (ne[1])
  int64_t row_bytes = 0;         // bytes per row in the block format
  const uint8_t* data = nullptr; // n_out rows of row_bytes, inside the mapping
  const uint8_t* row(int64_t r) const { return data + r * row_bytes; }
  bool empty() const { return data == nullptr; }
};

// A 1-D F32 vector (norm weights, biases, rope factors).
struct Vector {
  int64_t n = 0;
  const float* data = nullptr;   // n floats; GGUF data is 32-byte aligned so this is aligned
  bool empty() const { return data == nullptr; }
};

struct LayerWeights {
  Vector attn_norm;   // [n_embd]
  Matrix wq;          // [n_embd -> n_head * head_dim]
  Matrix wk;          // [n_embd -> n_head_kv * head_dim]
  Matrix wv;          // [n_embd -> n_head_kv * head_dim]
  Vector bq, bk, bv;  // qwen2 only: [n_head*head_dim], [n_head_kv*head_dim] x2
  Matrix wo;          // [n_head * head_dim -> n_embd]
  Vector ffn_norm;    // [n_embd]
  Matrix w_gate;      // [n_embd -> n_ff]
  Matrix w_up;        // [n_embd -> n_ff]
  Matrix w_down;      // [n_ff -> n_embd]

  // The layer's seven matrices, in the order a forward pass multiplies by them.
  std::array<const Matrix*, 7> Matrices() const { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
  // Their GGUF names inside a layer ("blk.N." + name + ".weight"), in the same order.
  static constexpr std::array<const char*, 7> kMatrixNames = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                              "ffn_gate", "ffn_up", "ffn_down"};
};

struct ModelWeights {
  Matrix token_embd;          // [n_embd] x n_vocab rows: row t is token t's embedding
  Vector output_norm;         // [n_embd]
  Matrix output;              // [n_embd -> n_vocab]; equals token_embd when tied
  bool tied_output = false;
  Vector rope_freqs;          // [n_rot / 2] Llama-3 frequency divisors, empty when absent
  std::vector<LayerWeights> layers;
  uint64_t total_bytes = 0;   // bytes of all weights referenced
};

// Binds and validates every tensor the architecture needs (names, types, shapes).
Result<ModelWeights> BindWeights(const GgufFile& gguf, const HParams& hp);

}  // namespace kvfs
