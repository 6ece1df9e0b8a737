#include "engine/runtime/generate.h"

#include <chrono>

#include <spdlog/fmt/fmt.h>

namespace kvfs {

namespace {
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Result<GenerateResult> Generate(Backend& backend, const Model& model, SequenceKv& kv,
                                std::span<const TokenId> prompt, const GenerateOptions& options,
                                const std::function<void(std::string_view)>& on_text) {
  GenerateResult result;
  if (prompt.empty()) return InvalidArgument("empty prompt");
  const int64_t needed = kv.n_tokens() + static_cast<int64_t>(prompt.size());
  if (needed > kv.max_tokens()) {
    return OutOfRange(fmt::format("prompt of {} tokens (plus {} already in context) does not fit in "
                                  "the context of {} tokens", prompt.size(), kv.n_tokens(), kv.max_tokens()));
  }
  const int64_t n_vocab = model.hparams().n_vocab;
  std::vector<TokenId> history(prompt.begin(), prompt.end());
  Logits logits;

  // Prefill in chunks; only the last chunk's last row is needed unless all logits are kept.
  auto t0 = std::chrono::steady_clock::now();
  const size_t chunk = static_cast<size_t>(std::max(1, options.prefill_chunk));
  std::vector<float> last_row;
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    const size_t n = std::min(chunk, prompt.size() - at);
    SequenceStep step{&kv, prompt.subspan(at, n), options.prompt_all_logits};
    KVFS_RETURN_IF_ERROR(backend.Forward(std::span<const SequenceStep>(&step, 1), logits));
    if (options.prompt_all_logits) {
      result.prompt_logits.insert(result.prompt_logits.end(), logits.data.begin(), logits.data.end());
    }
  }
  last_row.assign(logits.data.end() - n_vocab, logits.data.end());
  result.prefill_seconds = Since(t0);

  // Decode.
  t0 = std::chrono::steady_clock::now();
  Sampler sampler(options.sampling);
  std::vector<TokenId> eog;
  if (options.stop_at_eog) eog = model.tokenizer().eog_tokens();
  StopChecker stop(eog, options.max_tokens, options.stop_strings);
  StreamDecoder decoder(model.tokenizer());
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    result.text += s;
    if (on_text) on_text(s);
  };
  while (options.max_tokens > 0) {
    const TokenId next = sampler.Sample(last_row, history);
    result.generated.push_back(next);
    history.push_back(next);
    std::string piece = model.tokenizer().IsEog(next) && options.stop_at_eog ? std::string() : decoder.Push(next);
    emit(stop.Push(next, piece));
    if (stop.reason() != StopReason::kNone) break;
    if (kv.n_tokens() + 1 > kv.max_tokens()) {
      result.reason = StopReason::kContextFull;
      break;
    }
    SequenceStep step{&kv, std::span<const TokenId>(&history.back(), 1), false};
    KVFS_RETURN_IF_ERROR(backend.Forward(std::span<const SequenceStep>(&step, 1), logits));
    last_row.assign(logits.data.begin(), logits.data.begin() + n_vocab);
  }
  if (stop.reason() != StopReason::kNone) result.reason = stop.reason();
  if (stop.reason() != StopReason::kStopString) {
    // Held-back text first, then bytes of an unfinished UTF-8 character (shown as U+FFFD).
    emit(stop.Flush());
    emit(decoder.Flush());
  }
  result.decode_seconds = Since(t0);
  return result;
}

}  // namespace kvfs
