// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded RNG;
// and stop conditions (end-of-generation tokens, max tokens, stop strings).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/tokenizer.h"

namespace kvfs {

struct SamplerParams {
  float temperature = 0.8f;     // <= 0: greedy (argmax, ties -> lowest id)
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off. Applied to tokens in the last repeat_last_n
  int repeat_last_n = 64;       // 0: off; < 0: the whole history
  uint64_t seed = 0;
  // AgentSettings' defaulted == needs it (without it that operator is silently deleted).
  friend bool operator==(const SamplerParams&, const SamplerParams&) = default;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);
  // Picks the next token from logits (n_vocab). history = tokens so far (for the penalty).
  // Order: repetition penalty, then greedy or top-k -> temperature -> softmax -> top-p -> min-p.
  // Each filter keeps at least one token. Empty logits give kNoToken.
  TokenId Sample(std::span<const float> logits, std::span<const TokenId> history);
  const SamplerParams& params() const { return params_; }

 private:
  TokenId Greedy(std::span<const float> logits, std::span<const TokenId> history);

  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, TokenId>> candidates_;  // scratch
  std::vector<std::pair<float, TokenId>> selection_;   // scratch for the top-p boundary search
  std::vector<TokenId> recent_;                        // scratch: distinct recent tokens (penalty)
};

// kContextFull: the sequence reached its context length before any other reason (set by the
// generation loop, never by StopChecker).
enum class StopReason { kNone, kEndOfGeneration, kMaxTokens, kStopString, kContextFull };
std::string_view StopReasonName(StopReason reason);

// Tracks the generated text and decides when to stop. Text matching a stop string is held
// back from the output until it is known not to be a stop string. max_tokens <= 0: no limit.
// n_generated counts the tokens pushed up to and including the one that stopped it (eog too).
class StopChecker {
 public:
  StopChecker(std::vector<TokenId> eog_tokens, int max_tokens, std::vector<std::string> stop_strings);
  // Feeds one generated token and its decoded text (complete UTF-8 characters). Returns the
  // text that may be emitted now; reason() becomes non-kNone when generation must stop (the
  // stop string itself and any eog token are not emitted). When it stops for an eog token or
  // max tokens, the held-back text is returned with it. After the stop, Push returns "".
  std::string Push(TokenId token, std::string_view text);
  // Text still held back, to emit when generation ends for another reason.
  std::string Flush();
  StopReason reason() const { return reason_; }
  int n_generated() const { return n_generated_; }

 private:
  std::vector<TokenId> eog_;
  int max_tokens_;
  std::vector<std::string> stops_;
  std::string held_;
  int n_generated_ = 0;
  StopReason reason_ = StopReason::kNone;
};

}  // namespace kvfs
