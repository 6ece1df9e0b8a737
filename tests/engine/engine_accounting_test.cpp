// What the engine reports of its agents and turns, on the real stories260K model: an erased
// agent's record goes once its erasure returns (agent churn leaves no memory behind), turns
// cancelled in the queue are counted so that every turn taken adds up, and an agent whose turn
// runs is counted as generating, with the memory its turn holds.
#include <atomic>
#include <future>
#include <string>

#include <gtest/gtest.h>

#include "engine/runtime/engine.h"
#include "tests/engine/engine_test_util.h"

namespace kvfs {
namespace {

using testing::RunTurn;
using testing::kTurns;

using EngineAccountingTest = testing::EngineTestBase;

TEST_F(EngineAccountingTest, ErasedAgentsLeaveNoRecordBehind) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  AgentEngine& e = **engine;
  ASSERT_TRUE(e.CreateAgent("keeper", 0).ok());
  Greedy(e, "keeper");
  for (int i = 0; i < 12; ++i) {
    // One name over and over (a record's address may come back with it) and new ones.
    const std::string name = i % 2 == 0 ? "same" : "agent" + std::to_string(i);
    ASSERT_TRUE(e.CreateAgent(name, 0).ok());
    Greedy(e, name);
    if (i % 3 == 1) {
      ASSERT_TRUE(RunTurn(e, name, kTurns[0]).stats.ok());
    }
    if (i % 3 == 2) {
      // Erased while its turn runs or its commit is queued: both refer to the record.
      TurnRequest r;
      r.agent = name;
      r.text = kTurns[0];
      ASSERT_TRUE(e.SubmitTurn(std::move(r)).ok());
    }
    ASSERT_TRUE(e.EraseAgent(name).ok());
    EXPECT_EQ(e.Stats().agent_records, 1u) << "after erasure " << i;
  }
  // The agent that stays is whole.
  ASSERT_TRUE(RunTurn(e, "keeper", kTurns[0]).stats.ok());
  EXPECT_EQ(e.Stats().agent_records, 1u);
}

// A turn's first text: `started` is set and the engine thread waits (inside on_text) until `go`
// is, so the test reads the engine's status while that turn is generating, every count still.
struct HeldTurn {
  std::promise<void> started, go;
  std::shared_future<void> go_future = go.get_future().share();
  std::atomic<bool> signalled{false};
  std::promise<Result<TurnStats>> done;

  TurnRequest Request(const std::string& agent, const std::string& text) {
    TurnRequest r;
    r.agent = agent;
    r.text = text;
    r.on_text = [this](std::string_view) {
      if (signalled.exchange(true)) return;
      started.set_value();
      go_future.wait();
    };
    r.on_done = [this](const Result<TurnStats>& s) {
      if (!signalled.exchange(true)) started.set_value();  // no text: the test fails, not hangs
      done.set_value(s);
    };
    return r;
  }
};

TEST_F(EngineAccountingTest, AGeneratingAgentIsCountedAsSuchWithItsTurnsMemory) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  AgentEngine& e = **engine;
  ASSERT_TRUE(e.CreateAgent("alice", 0).ok());
  Greedy(e, "alice", "", /*max_tokens=*/60);
  HeldTurn turn;
  ASSERT_TRUE(e.SubmitTurn(turn.Request("alice", kTurns[0])).ok());
  turn.started.get_future().wait();
  {
    // Its first turn: no block of it is committed yet, all are the running turn's.
    const EngineStatus st = e.Stats();
    const AgentInfo info = e.GetAgent("alice").value();
    EXPECT_EQ(info.state, AgentState::kGenerating);
    EXPECT_EQ(st.agents_generating, 1u);
    EXPECT_EQ(st.agents_hot + st.agents_warm + st.agents_cold + st.agents_queued + st.agents_error, 0u);
    EXPECT_GT(st.memory_used_bytes, 0);
    EXPECT_EQ(info.memory_bytes, st.memory_used_bytes);
    ASSERT_EQ(st.top_entries.size(), 1u);
    EXPECT_EQ(st.top_entries[0].memory_bytes, st.memory_used_bytes);
  }
  turn.go.set_value();
  ASSERT_TRUE(turn.done.get_future().get().ok());
  // Its blocks, now committed, are its cache: idle and all in memory, with the same bytes.
  const EngineStatus st = e.Stats();
  EXPECT_EQ(st.agents_hot, 1u);
  EXPECT_EQ(st.agents_generating, 0u);
  EXPECT_EQ(e.GetAgent("alice")->memory_bytes, st.memory_used_bytes);
}

TEST_F(EngineAccountingTest, TurnsCancelledInTheQueueAddUp) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  AgentEngine& e = **engine;
  ASSERT_TRUE(e.CreateAgent("alice", 0).ok());
  Greedy(e, "alice", "", /*max_tokens=*/200);
  HeldTurn first;
  ASSERT_TRUE(e.SubmitTurn(first.Request("alice", kTurns[0])).ok());
  std::promise<Result<TurnStats>> second, third;
  for (auto* done : {&second, &third}) {
    TurnRequest r;
    r.agent = "alice";
    r.text = kTurns[1];
    r.on_done = [done](const Result<TurnStats>& s) { done->set_value(s); };
    ASSERT_TRUE(e.SubmitTurn(std::move(r)).ok());
  }
  first.started.get_future().wait();
  EXPECT_EQ(e.Stats().turns_in_flight, 3u);  // one running, two queued
  EXPECT_EQ(e.Stats().agents_generating, 1u);
  first.go.set_value();
  ASSERT_TRUE(e.EraseAgent("alice").ok());
  // Every turn has ended, and is counted once: the queued ones, which never ran, as cancelled.
  EXPECT_FALSE(third.get_future().get().ok());
  (void)second.get_future().get();
  (void)first.done.get_future().get();
  const EngineStatus st = e.Stats();
  EXPECT_EQ(st.turns_completed + st.turns_failed + st.turns_cancelled, 3u);
  EXPECT_GE(st.turns_cancelled, 1u);
  EXPECT_EQ(st.turns_in_flight, 0u);
}

}  // namespace
}  // namespace kvfs
