#include "engine/model/hparams.h"

#include <cmath>

#include <spdlog/fmt/fmt.h>

#include "engine/core/message_text.h"

namespace kvfs {

std::string_view ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama: return "llama";
    case Architecture::kQwen2: return "qwen2";
  }
  return "?";
}

namespace {

// Bounds are generous but keep every derived size far from overflow.
constexpr int64_t kMaxDim = 1 << 20;

Result<int64_t> RequireInt(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  if (f.Find(key) == nullptr) return Corrupt(fmt::format("missing metadata key {}", key));
  auto v = f.GetInt(key);
  if (!v) return Corrupt(fmt::format("metadata key {} is not an integer", key));
  if (*v < lo || *v > hi) {
    return Corrupt(fmt::format("metadata key {} = {} is out of range [{}, {}]", key, *v, lo, hi));
  }
  return *v;
}

Result<int64_t> OptionalInt(const GgufFile& f, const std::string& key, int64_t fallback, int64_t lo,
                            int64_t hi) {
  if (f.Find(key) == nullptr) return fallback;
  return RequireInt(f, key, lo, hi);
}

Result<float> OptionalFloat(const GgufFile& f, const std::string& key, float fallback) {
  if (f.Find(key) == nullptr) return fallback;
  auto v = f.GetFloat(key);
  if (!v || !std::isfinite(*v)) return Corrupt(fmt::format("metadata key {} is not a finite number", key));
  return static_cast<float>(*v);
}

}  // namespace

Result<HParams> ReadHParams(const GgufFile& f) {
  HParams hp;
  auto arch_name = f.GetString("general.architecture");
  if (!arch_name) return Corrupt("missing metadata key general.architecture");
  const std::string arch(*arch_name);
  if (arch == "llama") {
    hp.arch = Architecture::kLlama;
    hp.rope_style = RopeStyle::kNormal;
  } else if (arch == "qwen2") {
    hp.arch = Architecture::kQwen2;
    hp.rope_style = RopeStyle::kNeox;
    hp.has_qkv_bias = true;
  } else {
    return Unsupported(fmt::format("unsupported architecture {} (supported: llama, qwen2)", QuoteForMessage(arch)));
  }

  KVFS_ASSIGN_OR_RETURN(hp.n_embd, RequireInt(f, arch + ".embedding_length", 1, kMaxDim));
  KVFS_ASSIGN_OR_RETURN(hp.n_layer, RequireInt(f, arch + ".block_count", 1, 4096));
  KVFS_ASSIGN_OR_RETURN(hp.n_head, RequireInt(f, arch + ".attention.head_count", 1, 4096));
  KVFS_ASSIGN_OR_RETURN(hp.n_head_kv,
                        OptionalInt(f, arch + ".attention.head_count_kv", hp.n_head, 1, hp.n_head));
  KVFS_ASSIGN_OR_RETURN(hp.n_ff, RequireInt(f, arch + ".feed_forward_length", 1, kMaxDim * 4));
  KVFS_ASSIGN_OR_RETURN(hp.n_ctx_train, OptionalInt(f, arch + ".context_length", 2048, 1, 1 << 24));
  if (hp.n_head % hp.n_head_kv != 0) {
    return Corrupt(fmt::format("head_count {} is not a multiple of head_count_kv {}", hp.n_head, hp.n_head_kv));
  }
  const int64_t default_head_dim = hp.n_embd / hp.n_head;
  // Without key_length, head_dim is embedding_length / head_count, which must then divide.
  if (f.Find(arch + ".attention.key_length") == nullptr && hp.n_embd % hp.n_head != 0) {
    return Corrupt(fmt::format("embedding_length {} is not a multiple of head_count {} (and there is no "
                               "attention.key_length)",
                               hp.n_embd, hp.n_head));
  }
  KVFS_ASSIGN_OR_RETURN(hp.head_dim, OptionalInt(f, arch + ".attention.key_length", default_head_dim, 1, 4096));
  KVFS_ASSIGN_OR_RETURN(int64_t v_dim, OptionalInt(f, arch + ".attention.value_length", hp.head_dim, 1, 4096));
  if (v_dim != hp.head_dim) {
    return Unsupported(fmt::format("key_length {} != value_length {} is not supported", hp.head_dim, v_dim));
  }
  KVFS_ASSIGN_OR_RETURN(hp.n_rot, OptionalInt(f, arch + ".rope.dimension_count", hp.head_dim, 2, hp.head_dim));
  if (hp.n_rot % 2 != 0) return Corrupt(fmt::format("rope.dimension_count {} is odd", hp.n_rot));

  KVFS_ASSIGN_OR_RETURN(hp.rms_eps, OptionalFloat(f, arch + ".attention.layer_norm_rms_epsilon", 1e-5f));
  if (!(hp.rms_eps > 0.0f)) return Corrupt("layer_norm_rms_epsilon must be positive");
  KVFS_ASSIGN_OR_RETURN(hp.rope_freq_base, OptionalFloat(f, arch + ".rope.freq_base", 10000.0f));
  if (!(hp.rope_freq_base > 0.0f)) return Corrupt("rope.freq_base must be positive");

  // RoPE scaling: "none" and "linear" (positions scaled by 1/factor). Llama-3 style scaling is
  // expressed by the rope_freqs tensor instead, which the weights loader picks up.
  std::string scaling = "none";
  if (auto s = f.GetString(arch + ".rope.scaling.type")) scaling = std::string(*s);
  KVFS_ASSIGN_OR_RETURN(float factor, OptionalFloat(f, arch + ".rope.scaling.factor", 0.0f));
  if (auto legacy = f.GetFloat(arch + ".rope.scale_linear"); legacy && scaling == "none") {
    scaling = "linear";
    factor = static_cast<float>(*legacy);
  }
  if (scaling == "linear") {
    if (!(factor > 0.0f)) return Corrupt("rope scaling is linear but its factor is not positive");
    hp.rope_freq_scale = 1.0f / factor;
  } else if (scaling != "none" && !(scaling == "yarn" && factor <= 1.0f)) {
    return Unsupported(fmt::format("rope scaling type {} is not supported (none, linear)", QuoteForMessage(scaling)));
  }
  return hp;
}

}  // namespace kvfs
