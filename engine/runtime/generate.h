// Single-sequence generation on a backend: prefill a prompt, then sample token by token with
// stop conditions, streaming text as complete UTF-8 characters. Used by the CLI; the
// scheduler batches many of these.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/runtime/sampler.h"

namespace kvfs {

struct GenerateOptions {
  int max_tokens = 128;
  SamplerParams sampling;
  std::vector<std::string> stop_strings;
  bool stop_at_eog = true;         // end-of-generation tokens end the reply
  bool prompt_all_logits = false;  // keep logits of every prompt position
  int prefill_chunk = 512;         // tokens per forward pass during prefill
};

struct GenerateResult {
  std::vector<TokenId> generated;   // every sampled token (an eog token included)
  std::string text;                 // the emitted text
  StopReason reason = StopReason::kNone;
  std::vector<float> prompt_logits; // n_prompt x n_vocab when prompt_all_logits
  double prefill_seconds = 0.0, decode_seconds = 0.0;
};

// Appends `prompt` to kv (which may already hold earlier tokens) and generates. on_text
// receives text as it becomes final. Stops also when the context is full (kContextFull).
Result<GenerateResult> Generate(Backend& backend, const Model& model, SequenceKv& kv,
                                std::span<const TokenId> prompt, const GenerateOptions& options,
                                const std::function<void(std::string_view)>& on_text = {});

}  // namespace kvfs
