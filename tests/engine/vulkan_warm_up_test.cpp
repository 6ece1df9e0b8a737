// The warm-up of a backend that compiles its kernels on first use (backend/warm_up.h): after it,
// the passes an agent's first turns run make no Vulkan pipeline, its scratch sequences leave no
// device copy and change no result, and the engine runs it before the first turn. Runs on
// lavapipe in CI; skips without a Vulkan device.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/fallback_backend.h"
#include "engine/backend/warm_up.h"
#include "engine/runtime/engine.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/scripted_device.h"
#include "tests/engine/vulkan_backend_fixture.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

using testing::VulkanBackendTest;

// A pass: new tokens per sequence (0: not in the pass).
using Pass = std::vector<int64_t>;

// What agents' first turns run: a prompt then decode steps, follow-ups of a few tokens, two
// agents' prompts together, a prompt beside another agent's decode, three agents decoding, a
// long prompt decoded past attention's first split, and q4k key chunks completed by a decode
// step alone (pass 14) and among four (the last). Returns the kernels each pass made.
std::vector<int64_t> RunFirstTurns(Backend& backend, const KvLayout& layout, int64_t n_vocab) {
  const std::vector<Pass> passes = {
      {41, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}, {5, 0, 0, 0},  {1, 0, 0, 0}, {9, 0, 0, 0}, {1, 0, 0, 0},
      {0, 7, 11, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}, {0, 1, 4, 0},  {1, 1, 1, 0}, {0, 0, 0, 190}, {0, 0, 0, 1},
      {0, 0, 0, 1},  {2, 0, 0, 0}, {1, 0, 0, 0}, {0, 3, 0, 1},  {1, 1, 1, 1},
  };
  std::vector<std::unique_ptr<SequenceKv>> kv;
  for (int i = 0; i < 4; ++i) {
    kv.push_back(std::make_unique<SequenceKv>(layout, 512));
    kv.back()->pool().TrackFreed();
  }
  std::vector<int64_t> made;
  Logits logits;
  for (const Pass& pass : passes) {
    std::vector<std::vector<TokenId>> tokens;
    for (size_t i = 0; i < pass.size(); ++i) {
      tokens.emplace_back(static_cast<size_t>(pass[i]));
      for (int64_t t = 0; t < pass[i]; ++t) tokens.back()[t] = static_cast<TokenId>((i * 1000 + t * 13 + 5) % n_vocab);
    }
    std::vector<SequenceStep> steps;
    for (size_t i = 0; i < pass.size(); ++i) {
      if (pass[i] > 0) steps.push_back({kv[i].get(), tokens[i], false});
    }
    const int64_t before = backend.KernelsMade();
    logits.data.clear();
    logits.first_row.clear();
    const Status st = backend.Forward(steps, logits);
    EXPECT_TRUE(st.ok()) << st.message();
    made.push_back(backend.KernelsMade() - before);
  }
  std::vector<uint64_t> serials;  // the device copies go with the sequences
  for (const auto& s : kv) {
    for (int64_t b = 0; b < s->n_blocks(); ++b) serials.push_back(s->block(b)->serial);
    const std::vector<uint64_t> freed = s->pool().TakeFreed();
    serials.insert(serials.end(), freed.begin(), freed.end());
  }
  EXPECT_TRUE(backend.ForgetBlocks(serials).ok());
  EXPECT_EQ(backend.BlockCopies(), 0);
  return made;
}

TEST_F(VulkanBackendTest, WarmUpLeavesTheFirstTurnsNothingToCompile) {
  ASSERT_TRUE(vulkan_->CompilesOnFirstUse());
  for (const int64_t block_tokens : {256, 64}) {
    const KvLayout layout = Layout("q4k", block_tokens);
    auto report = WarmUpBackend(*vulkan_, layout, hp().n_vocab);
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->passes, 21);
    if (block_tokens == 256) {  // a fresh backend: the warm-up made every kernel it has
      EXPECT_GT(report->kernels_made, 20);
      EXPECT_EQ(vulkan_->KernelsMade(), report->kernels_made);
    }
    EXPECT_EQ(vulkan_->BlockCopies(), 0) << "the scratch sequences' device copies are dropped";
    const std::vector<int64_t> made = RunFirstTurns(*vulkan_, layout, hp().n_vocab);
    for (size_t i = 0; i < made.size(); ++i) EXPECT_EQ(made[i], 0) << "pass " << i << ", blocks of " << block_tokens;
  }
  // Without the warm-up the same turns make kernels (what the check above would catch).
  auto fresh = MakeVulkanBackend(*model_, VulkanOptions{});
  ASSERT_TRUE(fresh.ok());
  const std::vector<int64_t> made = RunFirstTurns(**fresh, Layout("q4k", 256), hp().n_vocab);
  EXPECT_GT(made[0], 0);
}

TEST_F(VulkanBackendTest, WarmUpChangesNoResult) {
  // The same steps on a warmed-up backend and on a fresh one: the same logits, bit for bit (a
  // warm-up must leave no state behind: split counters, staged keys, device copies).
  const KvLayout layout = Layout("q4k", 64);
  ASSERT_TRUE(WarmUpBackend(*vulkan_, layout, hp().n_vocab).ok());
  auto fresh = MakeVulkanBackend(*model_, VulkanOptions{});
  ASSERT_TRUE(fresh.ok());
  SequenceKv a(layout, 512), b(layout, 512);
  std::vector<float> got = Step(*vulkan_, a, prompt_), want = Step(**fresh, b, prompt_);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got, want);
  for (TokenId t : {TokenId{17}, TokenId{300}, TokenId{4000}}) {
    got = Step(*vulkan_, a, std::span<const TokenId>(&t, 1));
    want = Step(**fresh, b, std::span<const TokenId>(&t, 1));
    EXPECT_EQ(got, want) << "decoding token " << t;
  }
}

TEST_F(VulkanBackendTest, QueryTilesInPowersOfTwoGiveTheBitsOfExactTiles) {
  // Attention's query tiles are sized in powers of two (fewer pipelines to warm up): prompts of
  // 3, 5, 6 and 7 tokens run in tiles of 4 and 8 whose last tokens are skipped. Their logits
  // equal, bit for bit, those of one query a workgroup (query tiles off), at depth 0 and after
  // an earlier prompt.
  VulkanOptions untiled;
  untiled.query_tiles = false;
  auto plain = MakeVulkanBackend(*model_, untiled);
  ASSERT_TRUE(plain.ok());
  for (const char* kv : {"f16", "q4k"}) {
    for (const int64_t n : {3, 5, 6, 7}) {
      for (const int64_t depth : {0, 9}) {
        SequenceKv a(Layout(kv, 64), 64), b(Layout(kv, 64), 64);
        const std::span<const TokenId> tokens(prompt_);
        if (depth > 0) {
          EXPECT_EQ(Step(*vulkan_, a, tokens.first(depth)), Step(**plain, b, tokens.first(depth)));
        }
        EXPECT_EQ(Step(*vulkan_, a, tokens.subspan(depth, n)), Step(**plain, b, tokens.subspan(depth, n)))
            << kv << ", a prompt of " << n << " tokens after " << depth;
      }
    }
  }
}

class VulkanEngineWarmUpTest : public testing::EngineTestBase {
 protected:
  // Kernels a warm-up in KV `kv` (blocks of 64) makes on a fresh Vulkan backend.
  int64_t FreshWarmUpKernels(const char* kv) {
    auto fresh = MakeVulkanBackend(*model_, VulkanOptions{});
    EXPECT_TRUE(fresh.ok()) << fresh.status().message();
    if (!fresh.ok()) return -1;
    auto report = WarmUpBackend(**fresh, KvLayoutFor(model_->hparams(), Format(kv), 64), model_->hparams().n_vocab);
    EXPECT_TRUE(report.ok()) << report.status().message();
    return report.ok() ? report->kernels_made : -1;
  }
  // An EngineOptions::make_backend for a Vulkan backend that leaves it in *device as well.
  static std::function<Result<std::unique_ptr<Backend>>(const Model&)> VulkanInto(Backend** device) {
    return [device](const Model& m) -> Result<std::unique_ptr<Backend>> {
      auto b = MakeVulkanBackend(m, VulkanOptions{});
      if (b.ok()) *device = b->get();
      return b;
    };
  }
};

TEST_F(VulkanEngineWarmUpTest, TheEngineWarmsUpBeforeTheFirstTurn) {
  KVFS_REQUIRE_VULKAN(ListVulkanDevices().status());
  kv_ = "q4k";
  block_tokens_ = 64;
  // What a warm-up makes on a fresh backend, in the engine's default KV format.
  const int64_t warm_up_kernels = FreshWarmUpKernels("q4k");
  ASSERT_GT(warm_up_kernels, 0);
  for (const bool warm_up : {true, false}) {
    Backend* device = nullptr;
    EngineOptions o = Options();
    o.warm_up = warm_up;
    o.make_backend = VulkanInto(&device);
    auto e = CreateEngine(o);
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_EQ((*e)->Stats().backend_warming_up, warm_up);
    WaitForWarmUp(**e);
    const std::string agent = warm_up ? "warm" : "cold";
    ASSERT_TRUE((*e)->CreateAgent(agent, 0).ok());
    Greedy(**e, agent);
    const testing::TurnOutcome out = testing::RunTurn(**e, agent, "Once upon a time, a little fox found a red ball.");
    ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
    ASSERT_NE(device, nullptr);
    if (warm_up) {
      EXPECT_EQ(device->KernelsMade(), warm_up_kernels) << "the turn made kernels the warm-up had not";
    } else {
      EXPECT_GT(device->KernelsMade(), 0);
      EXPECT_LT(device->KernelsMade(), warm_up_kernels);
    }
  }
}

TEST_F(VulkanEngineWarmUpTest, RestoredAgentsFormatsAreWarmedUpToo) {
  // An agent stored with f16 KV (new agents get q4k): after a restart the warm-up covers f16 as
  // well, so the agent's next turn makes no pipeline.
  KVFS_REQUIRE_VULKAN(ListVulkanDevices().status());
  kv_ = "q4k";
  block_tokens_ = 64;
  EngineOptions o = Options();
  o.warm_up = false;
  {
    auto e = CreateEngine(o);
    ASSERT_TRUE(e.ok()) << e.status().message();
    ASSERT_TRUE((*e)->CreateAgent("f16", 0).ok());
    Greedy(**e, "f16", "f16");
    ASSERT_TRUE(testing::RunTurn(**e, "f16", "Once upon a time there was a cat.").stats.ok());
  }
  const int64_t q4k_only = FreshWarmUpKernels("q4k");  // a warm-up in the default format alone
  ASSERT_GT(q4k_only, 0);
  Backend* device = nullptr;
  o.warm_up = true;
  o.make_backend = VulkanInto(&device);
  auto e = CreateEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  WaitForWarmUp(**e);
  ASSERT_NE(device, nullptr);
  const int64_t warmed = device->KernelsMade();
  EXPECT_GT(warmed, q4k_only) << "f16's kernels were made too";
  const testing::TurnOutcome out = testing::RunTurn(**e, "f16", "And then the cat slept.");
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_GT(out.stats->reused_tokens, 0);
  EXPECT_EQ(device->KernelsMade(), warmed) << "the f16 agent's turn made pipelines the warm-up had not";
}

// Forwards to a backend and notes, pass by pass, whether an agent's sequence took part: the
// engine gives an agent's KV the whole context (n_ctx positions), the warm-up's scratch
// sequences far fewer.
class RecordingBackend final : public Backend {
 public:
  RecordingBackend(std::unique_ptr<Backend> inner, int64_t n_ctx, std::vector<bool>* agent_passes)
      : inner_(std::move(inner)), n_ctx_(n_ctx), agent_passes_(agent_passes) {}
  const char* name() const override { return inner_->name(); }
  Status Forward(std::span<const SequenceStep> steps, Logits& out) override {
    bool agent = false;
    for (const SequenceStep& s : steps) agent = agent || s.kv->max_tokens() == n_ctx_;
    agent_passes_->push_back(agent);  // the engine thread only, as every Forward
    return inner_->Forward(steps, out);
  }
  bool Fits(std::span<const SequenceStep> steps) const override { return inner_->Fits(steps); }
  bool Lost() const override { return inner_->Lost(); }
  bool KeepsBlockCopies() const override { return inner_->KeepsBlockCopies(); }
  Status ForgetBlocks(std::span<const uint64_t> serials) override { return inner_->ForgetBlocks(serials); }
  int64_t BlockCopies() const override { return inner_->BlockCopies(); }
  bool CompilesOnFirstUse() const override { return inner_->CompilesOnFirstUse(); }
  int64_t KernelsMade() const override { return inner_->KernelsMade(); }

 private:
  std::unique_ptr<Backend> inner_;
  int64_t n_ctx_;
  std::vector<bool>* agent_passes_;
};

TEST_F(VulkanEngineWarmUpTest, ATurnGoesBeforeTheRestOfTheWarmUp) {
  // A turn written at once is not held up by the warm-up's passes (the engine runs them while it
  // has nothing else to do): its passes come before the warm-up's last ones, it replies as on a
  // backend without warm-up, and the warm-up still ends afterwards.
  KVFS_REQUIRE_VULKAN(ListVulkanDevices().status());
  kv_ = "q4k";
  block_tokens_ = 64;
  std::vector<std::string> replies;
  for (const bool warm_up : {false, true}) {
    std::vector<bool> agent_passes;
    EngineOptions o = Options();
    o.store_dir.clear();
    o.warm_up = warm_up;
    o.n_ctx = 2048;
    o.make_backend = [&](const Model& m) -> Result<std::unique_ptr<Backend>> {
      KVFS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, MakeVulkanBackend(m, VulkanOptions{}));
      return std::unique_ptr<Backend>(std::make_unique<RecordingBackend>(std::move(b), o.n_ctx, &agent_passes));
    };
    auto e = CreateEngine(o);
    ASSERT_TRUE(e.ok()) << e.status().message();
    ASSERT_TRUE((*e)->CreateAgent("a", 0).ok());
    Greedy(**e, "a");
    const testing::TurnOutcome out = testing::RunTurn(**e, "a", "The little fox ran to the river.");
    ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
    replies.push_back(out.reply);
    if (!warm_up) continue;
    WaitForWarmUp(**e);
    ASSERT_TRUE((*e)->EraseAgent("a").ok());
    EXPECT_EQ((*e)->Stats().device_block_copies, 0) << "the scratch sequences leave no device copy";
    e->reset();  // the engine thread is done with agent_passes
    const auto first_agent = std::find(agent_passes.begin(), agent_passes.end(), true);
    ASSERT_NE(first_agent, agent_passes.end());
    const auto warm_up_after = std::find(first_agent, agent_passes.end(), false);
    EXPECT_NE(warm_up_after, agent_passes.end()) << "every warm-up pass ran before the turn's first";
    EXPECT_EQ(std::count(agent_passes.begin(), agent_passes.end(), false), 21);
  }
  EXPECT_EQ(replies[0], replies[1]);
}

TEST_F(VulkanEngineWarmUpTest, PassesTheDeviceWouldNotRunAreSkipped) {
  // A device KV budget too small for any block: every pass would run on the CPU behind the
  // device (compiling nothing), so none runs.
  KVFS_REQUIRE_VULKAN(ListVulkanDevices().status());
  EngineOptions o = Options();
  o.store_dir.clear();
  o.backend = "vulkan";
  o.kv_device_bytes = 1;
  auto e = CreateEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  WaitForWarmUp(**e);
  EXPECT_EQ((*e)->Stats().cpu_fallback_steps, 0);
}

TEST_F(VulkanEngineWarmUpTest, AWarmUpNeverRunsOnTheCpuBehindADevice) {
  // A device known lost, or one that fails a pass with kUnavailable (memory full): the warm-up
  // stops there instead of running its passes on the CPU behind the device (FallbackBackend),
  // where they would make none of the device's kernels. (A scripted device: no Vulkan needed.)
  const KvLayout layout = KvLayoutFor(model_->hparams(), Format("q4k"), 64);
  for (const int full_after : {-2, 0, 3}) {  // -2: lost before the warm-up
    auto device = std::make_unique<testing::ScriptedDevice>(*model_, CpuOptions{1, nullptr});
    testing::ScriptedDevice* scripted = device.get();
    scripted->compiles = true;
    scripted->lost = full_after == -2;
    scripted->full_after = std::max(full_after, -1);
    FallbackBackend backend(*model_, std::move(device), CpuOptions{1, nullptr});
    auto report = WarmUpBackend(backend, layout, model_->hparams().n_vocab);
    ASSERT_TRUE(report.ok()) << report.status().message();
    const int ran = std::max(full_after, 0);
    EXPECT_EQ(report->passes, ran) << "full after " << full_after;
    EXPECT_EQ(report->skipped, 21 - ran) << "full after " << full_after;
    EXPECT_EQ(scripted->passes.load(), ran);
    EXPECT_EQ(backend.stats().cpu_passes, 0) << "full after " << full_after;
  }
}

}  // namespace
}  // namespace kvfs
