// A KV budget that holds one running turn but not two: concurrent turns take turns for the
// memory (the later one waits, engine_step_memory.cpp) instead of failing with EAGAIN, and each
// reply is what the agent gets alone with no budget.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "tests/engine/engine_test_util.h"

namespace kvfs {
namespace {

using testing::RunTurn;
using testing::kTurns;

class EngineKvWaitTest : public testing::EngineTestBase {
 protected:
  // Greedy replies of `max_tokens`, so that a turn's context is many 16-token blocks.
  void LongGreedy(AgentEngine& e, const std::string& agent, int max_tokens) {
    AgentSettings s;
    s.sampling.temperature = 0;
    s.max_tokens = max_tokens;
    s.kv = kv_;
    ASSERT_TRUE(e.SetSettings(agent, s).ok());
  }
};

TEST_F(EngineKvWaitTest, TurnsOverTheBudgetTogetherWaitInsteadOfFailing) {
  constexpr int kMaxTokens = 120;
  const std::vector<std::string> agents = {"alice", "bob", "carol"};
  const std::vector<std::string> prompts = {kTurns[0], "A cat and a dog played in the sun all day long.",
                                            "Tom had a red ball."};
  // Alone, without a budget: the replies to expect.
  std::vector<std::string> expected;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    for (size_t i = 0; i < agents.size(); ++i) {
      ASSERT_TRUE((*engine)->CreateAgent(agents[i], 0).ok());
      LongGreedy(**engine, agents[i], kMaxTokens);
      auto out = RunTurn(**engine, agents[i], prompts[i]);
      ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
      expected.push_back(out.reply);
    }
  }
  std::filesystem::remove_all(Options().store_dir);
  // f16, 16 tokens: 5 layers x 2 x 16 x 32 x 2 bytes = 10 KiB a block; a turn of up to ~140
  // tokens takes 9 blocks, so a budget of 12 holds one running turn, not two.
  const int64_t block = 10240;
  auto engine = CreateEngine(Options(12 * block));
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  std::vector<std::promise<Result<TurnStats>>> done(agents.size());
  std::vector<std::string> replies(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    ASSERT_TRUE((*engine)->CreateAgent(agents[i], 0).ok());
    LongGreedy(**engine, agents[i], kMaxTokens);
  }
  for (size_t i = 0; i < agents.size(); ++i) {
    TurnRequest r;
    r.agent = agents[i];
    r.text = prompts[i];
    r.on_text = [&replies, i](std::string_view s) { replies[i] += s; };
    r.on_done = [&done, i](const Result<TurnStats>& s) { done[i].set_value(s); };
    ASSERT_TRUE((*engine)->SubmitTurn(std::move(r)).ok());
  }
  // A turn waiting for memory shows as queued (it once showed the agent idle: cold or hot).
  std::vector<std::future<Result<TurnStats>>> finished;
  for (auto& d : done) finished.push_back(d.get_future());
  bool saw_queued = false;
  for (bool all_done = false; !all_done;) {
    all_done = true;
    for (size_t i = 0; i < agents.size(); ++i) {
      if (finished[i].wait_for(std::chrono::seconds(0)) == std::future_status::ready) continue;
      all_done = false;
      saw_queued |= (*engine)->GetAgent(agents[i])->state == AgentState::kQueued;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(saw_queued);
  for (size_t i = 0; i < agents.size(); ++i) {
    Result<TurnStats> st = finished[i].get();
    ASSERT_TRUE(st.ok()) << agents[i] << ": " << st.status().message();
    EXPECT_EQ(replies[i], expected[i]) << agents[i];
    EXPECT_GT(st->generated_tokens, 100) << agents[i] << ": the turns must outgrow the budget together";
  }
  const EngineStatus stats = (*engine)->Stats();
  EXPECT_LE(stats.memory_used_bytes, 12 * block);
  EXPECT_EQ(stats.turns_failed, 0u);
}

// One turn that cannot fit the budget even alone still fails, with the budget's message.
TEST_F(EngineKvWaitTest, ATurnOverTheBudgetAloneFails) {
  auto engine = CreateEngine(Options(3 * 10240));
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  LongGreedy(**engine, "alice", 120);
  auto out = RunTurn(**engine, "alice", kTurns[0]);
  ASSERT_FALSE(out.stats.ok());
  EXPECT_EQ(out.stats.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(out.stats.status().message().find("KV budget"), std::string::npos) << out.stats.status().message();
  // Said as what it is: no other turn holds memory, so waiting would not help.
  EXPECT_NE(out.stats.status().message().find("this turn alone needs more KV memory than the budget of"), std::string::npos)
      << out.stats.status().message();
}

// A turn held back for memory starts when the turn it waited for fails instead of finishing
// (a failure posts no engine task: the engine must not go to sleep with it held).
TEST_F(EngineKvWaitTest, AHeldTurnStartsWhenTheRunningOneFails) {
  auto engine = CreateEngine(Options(3 * 10240));
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  ASSERT_TRUE((*engine)->CreateAgent("bob", 0).ok());
  LongGreedy(**engine, "alice", 120);  // outgrows the budget alone: fails
  LongGreedy(**engine, "bob", 4);
  std::promise<Result<TurnStats>> alice_done, bob_done;
  TurnRequest a;
  a.agent = "alice";
  a.text = kTurns[0];
  a.on_done = [&](const Result<TurnStats>& s) { alice_done.set_value(s); };
  TurnRequest b;
  b.agent = "bob";
  b.text = kTurns[1];
  b.on_done = [&](const Result<TurnStats>& s) { bob_done.set_value(s); };
  ASSERT_TRUE((*engine)->SubmitTurn(std::move(a)).ok());
  ASSERT_TRUE((*engine)->SubmitTurn(std::move(b)).ok());
  auto alice = alice_done.get_future();
  auto bob = bob_done.get_future();
  ASSERT_EQ(alice.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(alice.get().status().code(), StatusCode::kResourceExhausted);
  ASSERT_EQ(bob.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "bob's turn never started";
  Result<TurnStats> st = bob.get();
  EXPECT_TRUE(st.ok()) << st.status().message();
}

}  // namespace
}  // namespace kvfs
