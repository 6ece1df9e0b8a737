// Model hyper-parameters read from GGUF metadata ({arch}.* keys), validated.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/status.h"
#include "engine/model/gguf.h"

namespace kvfs {

enum class Architecture { kLlama, kQwen2 };
std::string_view ArchitectureName(Architecture arch);

// How RoPE pairs dimensions: kNormal rotates (x[2i], x[2i+1]) (llama: the converter permutes
// Q/K rows for this); kNeox rotates (x[i], x[i + n_rot/2]) (qwen2).
enum class RopeStyle { kNormal, kNeox };

struct HParams {
  Architecture arch = Architecture::kLlama;
  int64_t n_vocab = 0;        // rows of token_embd
  int64_t n_ctx_train = 0;    // context length the model was trained at
  int64_t n_embd = 0;         // model width
  int64_t n_layer = 0;
  int64_t n_head = 0;         // query heads
  int64_t n_head_kv = 0;      // key/value heads (grouped-query attention: n_head % n_head_kv == 0)
  int64_t head_dim = 0;       // per-head width of Q and K (and V)
  int64_t n_ff = 0;           // feed-forward hidden width
  int64_t n_rot = 0;          // dimensions of each head that RoPE rotates (<= head_dim, even)
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // linear scaling: positions are multiplied by this
  RopeStyle rope_style = RopeStyle::kNormal;
  bool has_qkv_bias = false;     // qwen2
  int64_t n_embd_q() const { return n_head * head_dim; }
  int64_t n_embd_kv() const { return n_head_kv * head_dim; }
};

// Reads and checks the hyper-parameters. Unknown architectures give
// Unsupported("unsupported architecture X"); missing or inconsistent keys name the key.
Result<HParams> ReadHParams(const GgufFile& gguf);

}  // namespace kvfs
