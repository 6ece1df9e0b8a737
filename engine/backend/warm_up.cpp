#include "engine/backend/warm_up.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include <fmt/format.h>

namespace kvfs {

namespace {

// One warm-up pass: new tokens for some of the scratch sequences (0 for the others).
struct WarmUpPass {
  const char* what;
  std::array<int64_t, 4> new_tokens;
};

// The passes, in order, over four scratch sequences. What varies between the kernels a pass
// needs (Vulkan's specialization constants) is mostly the number of tokens: a prompt's matrix
// products take tiles of 16, 32 or 64 tokens, decode's take 1, 2 or 4 rows a workgroup;
// attention takes query tiles of 1, 2, 4, ... tokens, makes the new keys itself for up to 4,
// merges the calls of sequences in one pass, splits decode past 128 positions, and q4k
// encodes key chunks of 64 positions when a step completes one. The passes below cover those
// for prompts alone and together, decode alone, in twos and fours, and beside a prompt.
constexpr WarmUpPass kPasses[] = {
    {"a 140-token prompt", {140, 0, 0, 0}},  // tiles of 64; sequence 0 is deep enough to split
    {"a 24-token prompt", {0, 24, 0, 0}},
    {"a 12-token prompt", {0, 0, 12, 0}},
    {"a 3-token prompt", {0, 0, 0, 3}},
    {"a 2-token prompt after a turn", {0, 0, 0, 2}},
    {"decoding one sequence", {0, 0, 0, 1}},
    {"a prompt up to a full key chunk", {0, 0, 0, 57}},  // sequence 3: 6 -> 63 tokens
    {"decoding one sequence into a new chunk", {0, 0, 0, 1}},
    {"decoding one sequence past a split", {1, 0, 0, 0}},
    {"decoding two sequences", {0, 1, 1, 0}},
    {"decoding four sequences", {1, 1, 1, 1}},
    {"two 2-token prompts", {0, 2, 2, 0}},
    {"two 3-token prompts", {0, 3, 3, 0}},
    {"two 6-token prompts", {0, 6, 6, 0}},
    {"four 12-token prompts", {12, 12, 12, 12}},
    {"a 6-token prompt", {0, 6, 0, 0}},
    {"a 50-token prompt", {0, 0, 0, 50}},  // sequence 3: 77 -> 127 tokens
    {"decoding four sequences, one into a new chunk", {1, 1, 1, 1}},
    // A prompt beside decoding sequences: their rows on the matrix-vector shaders (1, 2 and 4 a
    // workgroup) without the fusions a pass of short steps alone has (step_order.h).
    {"a prompt beside one sequence decoding", {1, 0, 12, 0}},
    {"a prompt beside two sequences decoding", {1, 1, 12, 0}},
    {"a prompt beside three sequences decoding", {1, 1, 12, 1}},
};

// Token ids spread over the vocabulary (any ids do: only the shapes of the passes matter).
std::vector<TokenId> ScratchTokens(int64_t n, int64_t first, int64_t n_vocab) {
  std::vector<TokenId> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<TokenId>((first + i) * 7919 % n_vocab);
  return tokens;
}

}  // namespace

BackendWarmUp::BackendWarmUp(Backend& backend, const KvLayout& layout, int64_t n_vocab)
    : backend_(backend), n_vocab_(n_vocab) {
  std::array<int64_t, 4> total{};
  for (const WarmUpPass& pass : kPasses) {
    for (size_t i = 0; i < total.size(); ++i) total[i] += pass.new_tokens[i];
  }
  for (int64_t n : total) {
    kv_.push_back(std::make_unique<SequenceKv>(layout, n));
    kv_.back()->pool().TrackFreed();  // q4k replaces blocks as they fill: their copies go too
  }
}

BackendWarmUp::~BackendWarmUp() {
  if (!done_) (void)Finish();
}

Status BackendWarmUp::RunNextPass() {
  if (done_) return Status::Ok();
  if (n_vocab_ <= 0) {
    (void)Finish();
    return InvalidArgument("warm-up: the model has no vocabulary");
  }
  const WarmUpPass& pass = kPasses[next_++];
  std::vector<std::vector<TokenId>> tokens;
  std::vector<SequenceStep> steps;
  for (size_t i = 0; i < kv_.size(); ++i) {
    const int64_t n = pass.new_tokens[i];
    if (n > 0) tokens.push_back(ScratchTokens(n, kv_[i]->n_tokens() + 31 * static_cast<int64_t>(i), n_vocab_));
  }
  for (size_t i = 0, k = 0; i < kv_.size(); ++i) {
    if (pass.new_tokens[i] > 0) steps.push_back({kv_[i].get(), tokens[k++], false});
  }
  // A pass the device would not run (a lost device; KV over the device's budget) would run on
  // the CPU behind it (FallbackBackend), making nothing: skipped.
  if (!backend_.MakesKernelsFor(steps)) {
    ++report_.skipped;
    return next_ == std::size(kPasses) ? Finish() : Status::Ok();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t kernels0 = backend_.KernelsMade();
  Logits logits;
  Status status = backend_.ForwardOnDevice(steps, logits);
  // (A device dropped meanwhile counts no kernels at all.)
  report_.kernels_made += std::max<int64_t>(0, backend_.KernelsMade() - kernels0);
  report_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (status.ok()) {
    ++report_.passes;
  } else if (status.code() == StatusCode::kUnavailable) {
    // The device cannot run it (its memory is full, or it was lost): nor the rest, most likely.
    report_.skipped += static_cast<int64_t>(std::size(kPasses) - next_) + 1;
    next_ = std::size(kPasses);
    status = Status::Ok();
  } else {
    status = status.WithContext(fmt::format("warm-up pass: {}", pass.what));
  }
  if (!status.ok() || next_ == std::size(kPasses)) {
    const Status forgot = Finish();
    if (status.ok()) status = forgot;
  }
  return status;
}

Status BackendWarmUp::Finish() {
  done_ = true;
  std::vector<uint64_t> serials;
  for (const auto& s : kv_) {
    for (int64_t b = 0; b < s->n_blocks(); ++b) serials.push_back(s->block(b)->serial);
    const std::vector<uint64_t> freed = s->pool().TakeFreed();
    serials.insert(serials.end(), freed.begin(), freed.end());
  }
  kv_.clear();
  // No device copy may outlive its host block, whether or not the passes succeeded.
  if (!backend_.KeepsBlockCopies()) return Status::Ok();
  return backend_.ForgetBlocks(serials).WithContext("warm-up: dropping the device copies of the scratch blocks");
}

Result<WarmUpReport> WarmUpBackend(Backend& backend, const KvLayout& layout, int64_t n_vocab) {
  BackendWarmUp warm_up(backend, layout, n_vocab);
  while (!warm_up.done()) KVFS_RETURN_IF_ERROR(warm_up.RunNextPass());
  return warm_up.report();
}

}  // namespace kvfs
