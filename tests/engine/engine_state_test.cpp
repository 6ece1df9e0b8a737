// What the engine keeps of an agent's superseded state: a diverged branch, an earlier tail and a
// failed commit's blocks leave the pool (erasure leaves nothing in memory; a full disk does not
// hold the budget for good), and an edit of an agent's settings keeps its stored tail, so it
// resumes after a restart without recomputing. On the real stories260K model, with the store on
// the fault-injecting file system where a test needs a full disk.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "engine/runtime/engine.h"
#include "engine/store/block_file.h"
#include "engine/store/fault_fs.h"
#include "engine/store/manifest.h"
#include "engine/store/safetensors.h"
#include "tests/engine/engine_test_util.h"

namespace kvfs {
namespace {

using store::FaultInjectingFileSystem;
using testing::ReadManifest;
using testing::RunTurn;
using testing::TurnOutcome;

using EngineStateTest = testing::EngineTestBase;

// Options with the store on a model disk that fails on demand.
EngineOptions OnDisk(EngineOptions o, FaultInjectingFileSystem& disk) {
  o.store_dir = "/s";
  o.file_system = &disk;
  return o;
}

// The agent's committed manifest on the model disk of OnDisk.
Result<store::Manifest> ManifestOn(FaultInjectingFileSystem& disk, const std::string& agent) {
  const std::string path = "/s/agents/" + agent + "/manifest.json";
  KVFS_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, disk.ReadFile(path));
  return store::ParseManifest(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

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
  EngineOptions o = OnDisk(Options(), disk);
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

// The erasure of a cache on a full disk (rm -r unlinks kv.safetensors first) succeeds: its
// block and tail files are zeroed and go before the manifest that no longer names them is
// written in the room they leave. The conversation stays, after a restart too, and the next
// turn rebuilds the cache.
TEST_F(EngineStateTest, CacheErasureOnAFullDiskMakesRoomFirst) {
  FaultInjectingFileSystem disk;
  EngineOptions o = OnDisk(Options(), disk);
  auto cache_files = [&] {
    std::vector<std::string> files;
    for (const std::string& f : disk.ListFilesRecursive("/s"))
      if (f.find("/blocks/") != std::string::npos || f.find(".kvt") != std::string::npos) files.push_back(f);
    return files;
  };
  size_t turns = 0;
  {
    auto engine = CreateEngine(o);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", kStory).stats.ok());
    ASSERT_GE(cache_files().size(), 2u) << "the test needs blocks and a tail";
    turns = (*engine)->Conversation("alice")->size();
    constexpr uint64_t kLarge = uint64_t{1} << 40;
    disk.SetCapacity(kLarge);
    const uint64_t used = kLarge - *disk.FreeBytes("/s");
    disk.SetCapacity(used + 64);  // full: no room for another manifest
    EXPECT_EQ(RunTurn(**engine, "alice", " One day, she saw a big dog.").stats.status().code(), StatusCode::kNoSpace);
    const std::vector<std::string> files_before = cache_files();
    uint64_t bytes_before = 0;
    for (const std::string& f : files_before) bytes_before += *disk.FileSize(f);

    auto erased = (*engine)->EraseCache("alice");
    ASSERT_TRUE(erased.ok()) << erased.status().message();
    EXPECT_GT(erased->blocks_freed, 0u);
    EXPECT_EQ(erased->files_removed, files_before.size());  // (went first, to make room)
    EXPECT_EQ(erased->bytes_freed, bytes_before);
    EXPECT_EQ(cache_files(), std::vector<std::string>{});
    EXPECT_EQ(disk.released_unzeroed(), std::vector<std::string>{});
    EXPECT_EQ((*engine)->GetAgent("alice")->disk_bytes, 0);
  }
  disk.SetCapacity(0);
  auto engine = CreateEngine(o);  // a restart
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  EXPECT_EQ((*engine)->Conversation("alice")->size(), turns);
  TurnOutcome next = RunTurn(**engine, "alice", " The end.");
  ASSERT_TRUE(next.stats.ok()) << next.stats.status().message();
  EXPECT_EQ(next.stats->reused_tokens, 0);
}

// An edit of the system prompt or the settings that cannot be stored (a full disk) is not made:
// the call fails, the agent keeps what it had, in memory and after a restart, and the same edit
// succeeds once there is space.
TEST_F(EngineStateTest, EditsThatCannotBeStoredAreNotMade) {
  FaultInjectingFileSystem disk;
  EngineOptions o = OnDisk(Options(), disk);
  auto system_of = [](AgentEngine& e) {
    auto turns = e.Conversation("alice");
    return turns.ok() && !turns->empty() && turns->front().role == "system" ? turns->front().text : std::string();
  };
  AgentSettings edited;
  {
    auto engine = CreateEngine(o);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    ASSERT_TRUE((*engine)->SetSystem("alice", "Tom had a red car.").ok());
    const AgentSettings stored = (*engine)->GetAgent("alice")->settings;
    edited = stored;
    edited.max_tokens = stored.max_tokens + 7;

    const int64_t updated = (*engine)->GetAgent("alice")->updated_ms;
    disk.FailAt(disk.op_count(), StatusCode::kNoSpace, FaultInjectingFileSystem::kDiskFullOps);
    EXPECT_EQ((*engine)->SetSystem("alice", "Sue had a blue hat.").code(), StatusCode::kNoSpace);
    EXPECT_EQ((*engine)->SetSettings("alice", edited).code(), StatusCode::kNoSpace);
    EXPECT_EQ(system_of(**engine), "Tom had a red car.");
    EXPECT_EQ((*engine)->GetAgent("alice")->settings, stored);
    EXPECT_EQ((*engine)->GetAgent("alice")->updated_ms, updated);  // the files' mtime: no edit was made
    // What the agent has already: nothing to store, so it succeeds on a full disk.
    EXPECT_TRUE((*engine)->SetSystem("alice", "Tom had a red car.").ok());
    EXPECT_TRUE((*engine)->SetSettings("alice", stored).ok());
    EXPECT_EQ((*engine)->GetAgent("alice")->updated_ms, updated);
    disk.ClearFaults();
  }
  {
    auto engine = CreateEngine(o);  // a restart: what is stored
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    EXPECT_EQ(system_of(**engine), "Tom had a red car.");
    EXPECT_NE((*engine)->GetAgent("alice")->settings, edited);
    const int64_t updated = (*engine)->GetAgent("alice")->updated_ms;
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    ASSERT_TRUE((*engine)->SetSystem("alice", "Sue had a blue hat.").ok());
    EXPECT_GT((*engine)->GetAgent("alice")->updated_ms, updated);  // the edit moves the files' mtime
    ASSERT_TRUE((*engine)->SetSettings("alice", edited).ok());
  }
  auto engine = CreateEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  EXPECT_EQ(system_of(**engine), "Sue had a blue hat.");
  EXPECT_EQ((*engine)->GetAgent("alice")->settings, edited);
}

// A cache kept across a restart after its agent's kv setting changed: it is still the agent's
// cache, in the format it was made in, until the next turn rebuilds it in the new one, as without
// the restart. It counts in status, exports whole, and its erasure reports the files it removes.
TEST_F(EngineStateTest, ACacheInTheFormerFormatStaysTheAgentsOverARestart) {
  int64_t cached = 0;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice", "f16");
    ASSERT_TRUE(RunTurn(**engine, "alice", kStory).stats.ok());
    cached = (*engine)->GetAgent("alice")->context_tokens;
    AgentSettings s = (*engine)->GetAgent("alice")->settings;
    s.kv = "q8";
    ASSERT_TRUE((*engine)->SetSettings("alice", s).ok());
  }
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  const AgentInfo info = *(*engine)->GetAgent("alice");
  EXPECT_EQ(info.context_tokens, cached);
  EXPECT_GT(info.disk_bytes, 0);
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  const HParams& hp = model_->hparams();
  const KvFormat f16 = MakeKvFormat("f16", "", hp.n_head_kv, hp.head_dim).value();
  const store::KvGeometry geometry{hp.n_layer, hp.n_head_kv, hp.head_dim, "f16", f16.group, false};
  auto parsed = store::ReadKvSafetensors(*exported, (*engine)->ModelInfo()["fingerprint"].get<std::string>(), geometry,
                                         block_tokens_);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->info.n_cached, cached);

  // The next turn rebuilds it as q8.
  TurnOutcome next = RunTurn(**engine, "alice", " The end.");
  ASSERT_TRUE(next.stats.ok()) << next.stats.status().message();
  EXPECT_EQ(next.stats->reused_tokens, 0);
  EXPECT_EQ(ReadManifest(Options().store_dir, "alice").kv_format, "q8");
  auto erased = (*engine)->EraseCache("alice");
  ASSERT_TRUE(erased.ok());
  EXPECT_GT(erased->files_removed, 0u);
  EXPECT_GT(erased->bytes_freed, 0u);
}

// rm kv.safetensors during a turn cancels that turn only: the turns queued behind it wait for the
// erasure, then run on a cache rebuilt from the token ids, and reply as an agent with the same
// conversation that was never erased does.
TEST_F(EngineStateTest, CacheErasureCancelsTheRunningTurnAndKeepsTheQueuedOnes) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  for (const char* name : {"alice", "bob"}) {
    ASSERT_TRUE((*engine)->CreateAgent(name, 0).ok());
    Greedy(**engine, name, "", 200);
    ASSERT_TRUE(RunTurn(**engine, name, kStory).stats.ok());
  }
  // alice: a slow turn (its text callback sleeps), and two more queued behind it.
  std::promise<void> first_text;
  std::atomic<bool> texted{false};
  std::vector<std::promise<Result<TurnStats>>> done(3);
  std::vector<std::string> replies(3);
  const char* texts[3] = {" One day", " Then she saw a dog.", " The end."};
  for (int i = 0; i < 3; ++i) {
    TurnRequest r;
    r.agent = "alice";
    r.text = texts[i];
    r.on_text = [&, i](std::string_view s) {
      replies[i] += s;
      if (i == 0) {
        if (!texted.exchange(true)) first_text.set_value();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    };
    r.on_done = [&, i](const Result<TurnStats>& st) { done[i].set_value(st); };
    ASSERT_TRUE((*engine)->SubmitTurn(std::move(r)).ok());
  }
  ASSERT_EQ(first_text.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_TRUE((*engine)->EraseCache("alice").ok());
  Result<TurnStats> first = done[0].get_future().get();
  EXPECT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kNotFound) << first.status().message();
  Result<TurnStats> second = done[1].get_future().get();
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(second->match, "rebuild");
  Result<TurnStats> third = done[2].get_future().get();
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_EQ(third->match, "extend");
  // bob has the same conversation, without the cancelled turn and the erasure.
  TurnOutcome bob2 = RunTurn(**engine, "bob", texts[1]);
  TurnOutcome bob3 = RunTurn(**engine, "bob", texts[2]);
  EXPECT_EQ(replies[1], bob2.reply);
  EXPECT_EQ(replies[2], bob3.reply);
  EXPECT_EQ(*(*engine)->Conversation("alice"), *(*engine)->Conversation("bob"));
}

// Calls that reach the engine after its shutdown fail instead of waiting for threads that have
// ended (an edit in flight while the daemon stops).
TEST_F(EngineStateTest, EditsAfterShutdownFailAndDoNotHang) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  (*engine)->Shutdown();
  auto edit = std::async(std::launch::async, [&] { return (*engine)->SetSystem("alice", "Tom had a red car."); });
  ASSERT_EQ(edit.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "SetSystem hangs after Shutdown";
  EXPECT_FALSE(edit.get().ok());
  auto erase = std::async(std::launch::async, [&] { return (*engine)->EraseCache("alice").status(); });
  ASSERT_EQ(erase.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "EraseCache hangs after Shutdown";
}

// The same for an agent with a cache on disk, and for an import and an erasure, which wait for
// the loader and for the commit's report on the engine thread (`rm -r` or `cp x
// agent/kv.safetensors` while the daemon stopped hung it for good: the FUSE thread never
// returned, and kill -9 left a zombie).
TEST_F(EngineStateTest, ImportsAndErasuresAfterShutdownReturn) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  for (const char* name : {"alice", "bob"}) {
    ASSERT_TRUE((*engine)->CreateAgent(name, 0).ok());
    Greedy(**engine, name);
    ASSERT_TRUE(RunTurn(**engine, name, kStory).stats.ok());
  }
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  (*engine)->Shutdown();
  auto import = std::async(std::launch::async, [&] { return (*engine)->ImportCache("bob", *exported); });
  ASSERT_EQ(import.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "ImportCache hangs after Shutdown";
  EXPECT_FALSE(import.get().ok());  // nothing is stored any more
  auto erase_cache = std::async(std::launch::async, [&] { return (*engine)->EraseCache("bob").status(); });
  ASSERT_EQ(erase_cache.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "EraseCache hangs after Shutdown";
  auto erase = std::async(std::launch::async, [&] { return (*engine)->EraseAgent("alice").status(); });
  ASSERT_EQ(erase.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "EraseAgent hangs after Shutdown";
}

// A cache that a restart with another block size drops keeps its files until the next commit:
// they are counted as the agent's, and rm kv.safetensors erases them and says so (the audit
// at start tells an erasure that happened from one that did not by them).
TEST_F(EngineStateTest, ADroppedCachesFilesAreTheAgentsUntilErased) {
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice", "f16", 60);
    ASSERT_TRUE(RunTurn(**engine, "alice", kStory).stats.ok());
  }
  block_tokens_ *= 2;
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  const AgentInfo dropped = *(*engine)->GetAgent("alice");
  EXPECT_EQ(dropped.context_tokens, 0);
  EXPECT_TRUE(dropped.stored_cache);
  EXPECT_GT(dropped.disk_bytes, 0);
  auto erased = (*engine)->EraseCache("alice");
  ASSERT_TRUE(erased.ok()) << erased.status().message();
  EXPECT_GT(erased->blocks_freed, 0u);
  EXPECT_GT(erased->bytes_freed, 0u);
  EXPECT_FALSE((*engine)->GetAgent("alice")->stored_cache);
  EXPECT_TRUE(ReadManifest(Options().store_dir, "alice").blocks.empty());
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

// A turn that cannot fit in the context fails with a message that says what to do: a prompt too
// long alone, or a conversation that has filled the context (a reply that stopped as
// context_full); kvfs never cuts an agent's memory on its own. A new agent goes on.
TEST_F(EngineStateTest, ATurnThatCannotFitFailsSayingWhatToDo) {
  EngineOptions o = Options();
  o.n_ctx = 64;
  auto engine = CreateEngine(o);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  std::string big;
  for (int i = 0; i < 40; ++i) big += " the little dog";
  TurnOutcome out = RunTurn(**engine, "alice", big);
  ASSERT_FALSE(out.stats.ok());
  EXPECT_EQ(out.stats.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(out.stats.status().message().find("write a shorter one"), std::string::npos) << out.stats.status().message();
  auto info = (*engine)->GetAgent("alice");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, AgentState::kError);
  EXPECT_EQ(info->turns, 0u);

  AgentSettings s = (*engine)->GetAgent("alice")->settings;
  s.max_tokens = 200;  // more than the context has room for
  s.sampling.temperature = 0;
  ASSERT_TRUE((*engine)->SetSettings("alice", s).ok());
  out = RunTurn(**engine, "alice", "Once upon a time");
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_EQ(out.stats->stop_reason, "context_full");
  // A prompt too long on its own says so, not that the conversation is full.
  out = RunTurn(**engine, "alice", big);
  EXPECT_EQ(out.stats.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(out.stats.status().message().find("this prompt alone needs"), std::string::npos) << out.stats.status().message();
  out = RunTurn(**engine, "alice", "And then?");
  EXPECT_EQ(out.stats.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(out.stats.status().message().find("when the conversation itself is full"), std::string::npos)
      << out.stats.status().message();
  ASSERT_TRUE((*engine)->CreateAgent("bob", 0).ok());
  ASSERT_TRUE((*engine)->SetSettings("bob", s).ok());
  EXPECT_TRUE(RunTurn(**engine, "bob", "And then?").stats.ok());
  // A system prompt that takes the room: the message says so, and emptying it frees it.
  ASSERT_TRUE((*engine)->CreateAgent("carol", 0).ok());
  ASSERT_TRUE((*engine)->SetSystem("carol", big).ok());
  out = RunTurn(**engine, "carol", "Once upon a time");
  EXPECT_EQ(out.stats.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(out.stats.status().message().find("the system prompt takes"), std::string::npos) << out.stats.status().message();
  ASSERT_TRUE((*engine)->SetSystem("carol", "").ok());
  EXPECT_TRUE(RunTurn(**engine, "carol", "Once upon a time").stats.ok());
  // A prompt of exactly the context's size still gets the reply's first token; one more fails.
  const Tokenizer& tok = model_->tokenizer();
  std::string exact = "Once";
  while (static_cast<int64_t>(tok.Encode(exact, true, false).size()) < o.n_ctx) exact += " a";
  ASSERT_EQ(static_cast<int64_t>(tok.Encode(exact, true, false).size()), o.n_ctx);
  ASSERT_TRUE((*engine)->CreateAgent("dora", 0).ok());
  ASSERT_TRUE((*engine)->SetSettings("dora", s).ok());
  out = RunTurn(**engine, "dora", exact);
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_EQ(out.stats->generated_tokens, 1);
  EXPECT_EQ(out.stats->stop_reason, "context_full");
  ASSERT_TRUE((*engine)->CreateAgent("eve", 0).ok());
  out = RunTurn(**engine, "eve", exact + " a");
  EXPECT_EQ(out.stats.status().code(), StatusCode::kOutOfRange);
}

// A cached block that cannot be had when a turn starts (here a read that fails twice: the
// loader's and the turn's own) ends the reuse before it; the turn goes on and replies as an
// engine whose disk never failed. The turn used to take that block on a later try as the one
// holding the end of the reused prefix, claim the positions after it, and abort at its commit
// (BlockPool::Name of a named block).
TEST_F(EngineStateTest, ACachedBlockThatCannotBeReadWhenATurnStartsEndsTheReuseThere) {
  std::string replies[2];
  for (int flaky = 0; flaky < 2; ++flaky) {
    SCOPED_TRACE(flaky ? "a flaky block" : "a sound disk");
    FaultInjectingFileSystem disk;
    EngineOptions o = OnDisk(Options(), disk);
    {
      auto engine = CreateEngine(o);
      ASSERT_TRUE(engine.ok()) << engine.status().message();
      ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
      Greedy(**engine, "alice");
      ASSERT_TRUE(RunTurn(**engine, "alice", kStory).stats.ok());
      ASSERT_TRUE(RunTurn(**engine, "alice", " Then they played in the park all day.").stats.ok());
    }
    Result<store::Manifest> m = ManifestOn(disk, "alice");
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_GE(m->blocks.size(), 3u) << "the test needs a block after the one that fails";
    if (flaky) disk.FailReads(store::ToHex(m->blocks[1]), 2);
    auto engine = CreateEngine(o);  // a restart: the blocks are on disk only
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    TurnOutcome next = RunTurn(**engine, "alice", " One day, she saw a big dog.");
    ASSERT_TRUE(next.stats.ok()) << next.stats.status().message();
    replies[flaky] = next.reply;
  }
  EXPECT_EQ(replies[1], replies[0]);
}

// An export reads the blocks it holds only on disk after its snapshot, and a commit of the agent
// may shred them meanwhile (a turn that diverged, an erasure of the cache). The export is then
// of the cache as that commit left it, not EIO. Here the first block's read is slow, the cache
// is erased (rm kv.safetensors) during it, and the second block's read fails as a shredded
// block's would (the store's lock lets the erasure wait for the reads: a failure injected).
TEST_F(EngineStateTest, AnExportRacingTheAgentsOwnCommitExportsTheCacheAfterIt) {
  FaultInjectingFileSystem disk;
  EngineOptions o = OnDisk(Options(), disk);
  {
    auto engine = CreateEngine(o);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", kStory).stats.ok());
  }
  Result<store::Manifest> m = ManifestOn(disk, "alice");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_GE(m->blocks.size(), 2u);
  auto engine = CreateEngine(o);  // a restart: the blocks are on disk only
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  disk.SlowReads(store::ToHex(m->blocks[0]), std::chrono::milliseconds(500));
  disk.FailReads(store::ToHex(m->blocks[1]), 1);
  auto exported = std::async(std::launch::async, [&] { return (*engine)->ExportCache("alice"); });
  for (int i = 0; i < 5000 && disk.SlowReadsBegun() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(disk.SlowReadsBegun(), 1u) << "the export did not read the first block from disk";
  auto erased = (*engine)->EraseCache("alice");
  ASSERT_TRUE(erased.ok()) << erased.status().message();
  EXPECT_GT(erased->blocks_freed, 0u);
  auto file = exported.get();
  ASSERT_TRUE(file.ok()) << file.status().message();
  // Of the cache after the erasure: what an export now gives, byte for byte (no K/V rows).
  auto now = (*engine)->ExportCache("alice");
  ASSERT_TRUE(now.ok()) << now.status().message();
  EXPECT_EQ(*file, *now);
}

}  // namespace
}  // namespace kvfs
