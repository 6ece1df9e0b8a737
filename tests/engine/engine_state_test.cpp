// What the engine keeps of an agent's superseded state: a diverged branch, an earlier tail and a
// failed commit's blocks leave the pool (erasure leaves nothing in memory; a full disk does not
// hold the budget for good), and an edit of an agent's settings keeps its stored tail, so it
// resumes after a restart without recomputing. On the real stories260K model, with the store on
// the fault-injecting file system where a test needs a full disk.
#include <gtest/gtest.h>

#include "engine/runtime/engine.h"
#include "engine/store/fault_fs.h"
#include "tests/engine/engine_test_util.h"

namespace kvfs {
namespace {

using store::FaultInjectingFileSystem;
using testing::ReadManifest;
using testing::RunTurn;
using testing::TurnOutcome;

using EngineStateTest = testing::EngineTestBase;

const char* kStory = "Once upon a time, there was a little girl named Lily. She liked to play outside.";

// An agent whose second turn diverged from its first (a system change between them): the
// blocks of the first branch are superseded.
std::unique_ptr<AgentEngine> EngineWithADivergedAgent(const EngineOptions& options) {
  auto engine = CreateEngine(options);
  EXPECT_TRUE(engine.ok());
  if (!engine.ok()) return nullptr;
  EXPECT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  AgentSettings s;
  s.sampling.temperature = 0;
  s.max_tokens = 20;
  s.kv = "f16";
  EXPECT_TRUE((*engine)->SetSettings("alice", s).ok());
  EXPECT_TRUE(RunTurn(**engine, "alice", kStory).stats.ok());
  EXPECT_TRUE((*engine)->SetSystem("alice", "Tom had a red car.").ok());
  TurnOutcome out = RunTurn(**engine, "alice", " One day, she saw a big dog.");
  EXPECT_TRUE(out.stats.ok() && out.stats->match == "diverge");
  EXPECT_GT((*engine)->Stats().memory_used_bytes, 0);
  return std::move(*engine);
}

// After the erasure of the only agent, no memory is in use.
TEST_F(EngineStateTest, ErasureLeavesNoSupersededBlocksInMemory) {
  std::unique_ptr<AgentEngine> engine = EngineWithADivergedAgent(Options());
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->EraseAgent("alice").ok());
  EXPECT_EQ(engine->Stats().memory_used_bytes, 0);
}

// The same for the erasure of the cache alone (rm kv.safetensors): the agent stays, its memory
// goes, the old branch's blocks included.
TEST_F(EngineStateTest, CacheErasureLeavesNoSupersededBlocksInMemory) {
  std::unique_ptr<AgentEngine> engine = EngineWithADivergedAgent(Options());
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->EraseCache("alice").ok());
  EXPECT_EQ(engine->Stats().memory_used_bytes, 0);
  EXPECT_TRUE(engine->GetAgent("alice").ok());
}

// A commit that fails on a full disk leaves the agent at its previous turn, and the blocks the
// failed turn named (never persisted, so never evictable) leave the pool: memory in use is what
// it was before that turn. Once space is back, the next turn commits and extends the first.
TEST_F(EngineStateTest, FailedCommitGivesItsBlocksBack) {
  FaultInjectingFileSystem disk;
  EngineOptions o = Options();
  o.store_dir = "/s";
  o.file_system = &disk;
  auto engine = CreateEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  TurnOutcome first = RunTurn(**engine, "alice", kStory);
  ASSERT_TRUE(first.stats.ok());
  const int64_t used_after_first = (*engine)->Stats().memory_used_bytes;
  const int64_t tokens_after_first = (*engine)->GetAgent("alice")->context_tokens;

  disk.FailAt(disk.op_count(), StatusCode::kNoSpace, FaultInjectingFileSystem::kDiskFullOps);
  // 20 more tokens of reply and 8 of prompt: more than one new 16-token block.
  TurnOutcome failed = RunTurn(**engine, "alice", " One day, she saw a big dog.");
  EXPECT_EQ(failed.stats.status().code(), StatusCode::kNoSpace) << failed.stats.status().message();
  EXPECT_EQ((*engine)->GetAgent("alice")->context_tokens, tokens_after_first);
  EXPECT_LE((*engine)->Stats().memory_used_bytes, used_after_first);

  disk.ClearFaults();
  TurnOutcome next = RunTurn(**engine, "alice", " The end.");
  ASSERT_TRUE(next.stats.ok()) << next.stats.status().message();
  EXPECT_EQ(next.stats->match, "extend");
  EXPECT_EQ(next.stats->reused_tokens, tokens_after_first);
}

// An edit of the settings (config.json) keeps the stored tail: after a restart the next turn
// reuses every cached token, as it does without the edit.
TEST_F(EngineStateTest, SettingsEditKeepsTheStoredTail) {
  int64_t cached = 0;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", kStory).stats.ok());
    cached = (*engine)->GetAgent("alice")->context_tokens;
    ASSERT_NE(cached % block_tokens_, 0) << "the test needs a partial last block";
    AgentSettings s = (*engine)->GetAgent("alice")->settings;
    s.max_tokens = 12;
    ASSERT_TRUE((*engine)->SetSettings("alice", s).ok());
  }
  const store::Manifest m = ReadManifest(Options().store_dir, "alice");
  ASSERT_TRUE(m.tail.has_value());
  EXPECT_EQ(m.blocks.size() * m.block_size + m.tail->n_tokens, m.tokens.size());
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->GetAgent("alice")->context_tokens, cached);
  TurnOutcome next = RunTurn(**engine, "alice", " The end.");
  ASSERT_TRUE(next.stats.ok());
  EXPECT_EQ(next.stats->match, "extend");
  EXPECT_EQ(next.stats->reused_tokens, cached);
}

}  // namespace
}  // namespace kvfs
