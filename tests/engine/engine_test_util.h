// Shared by the engine tests: running a turn synchronously, reading an agent's manifest, and a
// fixture on the real stories260K model whose Reference() is an uncached greedy run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/generate.h"
#include "engine/store/manifest.h"
#include "tests/test_support.h"

namespace kvfs::testing {

namespace fs = std::filesystem;

// Three turns of a story (the first is a prompt the tiny model continues well).
inline const char* const kTurns[] = {"Once upon a time, there was a little girl named Lily.",
                                     " She liked to play outside.", " One day, she saw a big dog in the park."};

struct TurnOutcome {
  std::string reply;
  Result<TurnStats> stats = Status(StatusCode::kInternal, "not finished");
};

inline TurnOutcome RunTurn(AgentEngine& engine, const std::string& agent, const std::string& text) {
  TurnOutcome out;
  std::promise<void> done;
  TurnRequest r;
  r.agent = agent;
  r.text = text;
  r.on_text = [&](std::string_view s) { out.reply += s; };
  r.on_done = [&](const Result<TurnStats>& s) {
    out.stats = s;
    done.set_value();
  };
  Status submitted = engine.SubmitTurn(std::move(r));
  EXPECT_TRUE(submitted.ok()) << submitted.message();
  if (submitted.ok()) done.get_future().wait();
  return out;
}

// The files under a store's blocks/ directory.
inline size_t BlockFiles(const fs::path& store) {
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(store / "blocks")) n += e.is_regular_file();
  return n;
}

inline store::Manifest ReadManifest(const std::string& store_dir, const std::string& agent) {
  const std::string path = store_dir + "/agents/" + agent + "/manifest.json";
  auto m = store::ParseManifest(ReadFile(path), path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? *m : store::Manifest{};
}

// What the counters must show after the turns of an uncached-equivalence test: mode 1 (a
// restart between turns) reloaded blocks from disk; mode 2 (a budget too small for two agents)
// evicted and reloaded blocks and stayed within the budget.
inline void ExpectReloadsShown(const EngineStatus& st, int mode, int64_t budget) {
  if (mode == 1) {
    EXPECT_GT(st.reload_bytes, 0u);
  }
  if (mode == 2) {
    EXPECT_GT(st.evictions, 0u);
    EXPECT_GT(st.reload_bytes, 0u);
    EXPECT_LE(st.memory_used_bytes, budget);
  }
}

class EngineTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    model_path_ = SharedDir() + "/models/stories260K.gguf";
    KVFS_REQUIRE_DATA(model_path_);
    dir_ = fs::temp_directory_path() / ("kvfs_engine_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto model = Model::Load(model_path_);
    ASSERT_TRUE(model.ok());
    model_ = std::move(*model);
    backend_ = MakeCpuBackend(*model_, CpuOptions{1, nullptr});
  }
  void TearDown() override { fs::remove_all(dir_); }

  EngineOptions Options(int64_t budget = 0) const {
    EngineOptions o;
    o.model_path = model_path_;
    o.store_dir = (dir_ / "store").string();
    o.n_threads = 1;
    o.kv = kv_;
    o.block_tokens = block_tokens_;
    o.kv_budget_bytes = budget;
    return o;
  }

  KvFormat Format(const std::string& kv) const {
    const HParams& hp = model_->hparams();
    return MakeKvFormat(kv, "", hp.n_head_kv, hp.head_dim).value();
  }

  // The reference: an uncached greedy run over the turn's prompt tokens, which are the
  // committed tokens minus the fed-back reply tokens (all generated but the last), with the
  // fixture's KV format.
  std::string Reference(const store::Manifest& m, const TurnStats& stats, int max_tokens) {
    const size_t fed = static_cast<size_t>(std::max<int64_t>(0, stats.generated_tokens - 1));
    std::vector<TokenId> prompt(m.tokens.begin(), m.tokens.end() - static_cast<std::ptrdiff_t>(fed));
    SequenceKv kv(KvLayoutFor(model_->hparams(), Format(kv_)), 512);
    GenerateOptions g;
    g.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    auto r = Generate(*backend_, *model_, kv, prompt, g);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->text : std::string();
  }

  // Greedy 20-token replies, KV in `kv` (default: the fixture's format).
  void Greedy(AgentEngine& e, const std::string& agent, const std::string& kv = "", int max_tokens = 20) {
    AgentSettings s;
    s.sampling.temperature = 0;
    s.max_tokens = max_tokens;
    s.kv = kv.empty() ? kv_ : kv;
    ASSERT_TRUE(e.SetSettings(agent, s).ok());
  }

  // Until the engine's backend warm-up (EngineOptions::warm_up) has ended.
  static void WaitForWarmUp(AgentEngine& e) {
    for (int i = 0; i < 18000 && e.Stats().backend_warming_up; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_FALSE(e.Stats().backend_warming_up) << "the warm-up did not end within 3 minutes";
  }

  // On the Vulkan backend (skips without a device, as KVFS_REQUIRE_VULKAN says): an agent's
  // greedy replies to three turns equal a CPU agent's; the last turn runs after a restart,
  // resumed from the store (`before_last_turn` may check the stored state first); erasure then
  // leaves no device copies and no memory in use.
  void ExpectVulkanRepliesAsTheCpu(const char* const (&turns)[3], const std::function<void()>& before_last_turn = {}) {
    KVFS_REQUIRE_VULKAN(ListVulkanDevices().status());
    std::vector<std::string> cpu_replies;
    {
      EngineOptions on_cpu = Options();
      on_cpu.store_dir.clear();  // not in the store: its blocks would be shared with the GPU agent's
      auto cpu = CreateEngine(on_cpu);
      ASSERT_TRUE(cpu.ok());
      ASSERT_TRUE((*cpu)->CreateAgent("cpu", 0).ok());
      Greedy(**cpu, "cpu");
      for (const char* t : turns) cpu_replies.push_back(RunTurn(**cpu, "cpu", t).reply);
    }
    EngineOptions o = Options();
    o.backend = "vulkan";
    o.warm_up = false;  // its scratch sequences hold device copies of their own (vulkan_warm_up_test)
    {
      auto e = CreateEngine(o);
      ASSERT_TRUE(e.ok()) << e.status().message();
      EXPECT_EQ((*e)->ModelInfo()["backend"].get<std::string>().rfind("vulkan", 0), 0u) << (*e)->ModelInfo().dump();
      ASSERT_TRUE((*e)->CreateAgent("gpu", 0).ok());
      Greedy(**e, "gpu");
      for (int i = 0; i < 2; ++i) {
        TurnOutcome out = RunTurn(**e, "gpu", turns[i]);
        ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
        EXPECT_EQ(out.reply, cpu_replies[i]) << "turn " << i;
      }
      EXPECT_GT((*e)->Stats().device_block_copies, 0);
    }
    if (before_last_turn) before_last_turn();
    auto e = CreateEngine(o);  // restart: the third turn resumes from the stored cache
    ASSERT_TRUE(e.ok());
    TurnOutcome out = RunTurn(**e, "gpu", turns[2]);
    ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
    EXPECT_GT(out.stats->reused_tokens, 0);
    EXPECT_EQ(out.reply, cpu_replies[2]);
    EXPECT_GT((*e)->Stats().device_block_copies, 0);
    ASSERT_TRUE((*e)->EraseAgent("gpu").ok());
    EXPECT_EQ((*e)->Stats().device_block_copies, 0);
    EXPECT_EQ((*e)->Stats().memory_used_bytes, 0);
  }

  std::string kv_ = "f16";      // the agents' KV format
  int64_t block_tokens_ = 16;
  std::string model_path_;
  fs::path dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace kvfs::testing
