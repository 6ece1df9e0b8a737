// A long prompt is prefilled alone in pieces of about a second at the measured cost, so that
// an erasure of its agent (or a shutdown), which waits for the running piece, waits about a
// second and not the 512 tokens of a large model on a CPU (15 s for 8B on two cores). A backend
// that takes a fixed time per token stands in for that model: its passes' sizes are what the
// engine chose, and a slower machine only makes them smaller.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include "tests/engine/engine_test_util.h"

namespace kvfs {
namespace {

using testing::RunTurn;

// The CPU backend behind a pass that takes kMsPerToken for each new token.
class SlowBackend final : public Backend {
 public:
  static constexpr int kMsPerToken = 5;
  explicit SlowBackend(const Model& model) : cpu_(MakeCpuBackend(model, CpuOptions{1, nullptr})) {}
  const char* name() const override { return "slow"; }
  Status Forward(std::span<const SequenceStep> steps, Logits& out) override {
    size_t tokens = 0;
    for (const SequenceStep& s : steps) tokens += s.tokens.size();
    {
      std::lock_guard lock(mu_);
      pass_tokens_.push_back(tokens);
    }
    const int pass = passes_started.fetch_add(1);
    // The held pass waits for the test's erasure to be on its way: a stalled test thread cannot
    // let the prompt run to its end first.
    for (int waited = 0; pass == hold_pass.load() && !released.load() && waited < 20000; ++waited)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(kMsPerToken * static_cast<int64_t>(tokens)));
    return cpu_->Forward(steps, out);
  }
  std::vector<size_t> PassTokens() {
    std::lock_guard lock(mu_);
    return pass_tokens_;
  }
  std::atomic<int> passes_started{0};
  std::atomic<int> hold_pass{-1};  // this pass (0-based) waits for `released`
  std::atomic<bool> released{false};

 private:
  std::unique_ptr<Backend> cpu_;
  std::mutex mu_;
  std::vector<size_t> pass_tokens_;  // new tokens of each pass, in order
};

class EnginePrefillPieceTest : public testing::EngineTestBase {
 protected:
  EngineOptions SlowOptions() {
    EngineOptions o = Options();
    o.make_backend = [this](const Model& model) -> Result<std::unique_ptr<Backend>> {
      auto b = std::make_unique<SlowBackend>(model);
      backend_seen_ = b.get();
      return std::unique_ptr<Backend>(std::move(b));
    };
    return o;
  }
  // `words` space-separated words: stories260K gives a token or two to each.
  static std::string Words(int words) {
    static const char* const kWords[] = {"the", "cat", "sat", "on", "a", "mat", "and", "looked", "at", "sun"};
    std::string s;
    for (int i = 0; i < words; ++i) s += std::string(i == 0 ? "" : " ") + kWords[i % 10];
    return s;
  }
  SlowBackend* backend_seen_ = nullptr;
};

TEST_F(EnginePrefillPieceTest, ALongPromptRunsInPiecesOfAboutASecondAndItsErasureWaitsForOne) {
  auto engine = CreateEngine(SlowOptions());
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  ASSERT_NE(backend_seen_, nullptr);
  for (const char* name : {"alice", "bob"}) {
    ASSERT_TRUE((*engine)->CreateAgent(name, 0).ok());
    Greedy(**engine, name, "", 1);
  }
  // alice's prompt (~85 tokens, prefilled alone in one pass) gives the engine its cost per token.
  const testing::TurnOutcome first = RunTurn(**engine, "alice", Words(50));
  ASSERT_TRUE(first.stats.ok()) << first.stats.status().message();
  const size_t measured_passes = backend_seen_->PassTokens().size();
  ASSERT_GE(backend_seen_->PassTokens().front(), 32u) << "alice's prompt must be long enough to be measured";

  // bob's ~510 tokens would have been one pass before; a second's worth is 200 at 5 ms a token.
  std::promise<Result<TurnStats>> done;
  TurnRequest r;
  r.agent = "bob";
  r.text = Words(300);
  r.on_done = [&](const Result<TurnStats>& s) { done.set_value(s); };
  const int before = backend_seen_->passes_started.load();
  backend_seen_->hold_pass = before;  // bob's first piece
  ASSERT_TRUE((*engine)->SubmitTurn(std::move(r)).ok());
  while (backend_seen_->passes_started.load() < before + 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int at_erase = backend_seen_->passes_started.load();
  backend_seen_->released = true;  // (the piece still takes ~0.6 s: the erasure comes within it)
  auto erased = (*engine)->EraseAgent("bob");
  const int after_erase = backend_seen_->passes_started.load();
  ASSERT_TRUE(erased.ok()) << erased.status().message();
  // The pass running when the erasure came, and at most one that had started on its way in.
  EXPECT_LE(after_erase - at_erase, 1);
  const Result<TurnStats> outcome = done.get_future().get();
  EXPECT_FALSE(outcome.ok()) << "the erased agent's turn must not complete";

  const std::vector<size_t> passes = backend_seen_->PassTokens();
  ASSERT_GE(passes.size(), measured_passes + 1);
  size_t bob_tokens = 0;
  for (size_t k = measured_passes; k < passes.size(); ++k) {
    EXPECT_LE(passes[k], 1000u / SlowBackend::kMsPerToken) << "pass " << k;
    EXPECT_GE(passes[k], 128u) << "pass " << k << ": pieces stay as large as the CPU's matrix passes";
    bob_tokens += passes[k];
  }
  EXPECT_LT(bob_tokens, 450u) << "the erasure stopped bob's prefill before its end";
}

}  // namespace
}  // namespace kvfs
