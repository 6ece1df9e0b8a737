// The Engine end to end on the real stories260K model: turns through the scheduler give the
// same greedy text as an uncached Generate() over the same tokens (f16 KV: token-exact), also
// after a restart (cache reloaded from disk), under a budget small enough to force evictions,
// and with two agents sharing prefix blocks. Erasure removes the agent from memory and disk.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <future>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/runtime/engine.h"
#include "engine/runtime/generate.h"
#include "engine/store/manifest.h"
#include "engine/store/safetensors.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

namespace fs = std::filesystem;
using testing::FileExists;
using testing::ReadManifest;
using testing::RunTurn;
using testing::TurnOutcome;
using testing::ExpectReloadsShown;
using testing::kTurns;

using EngineTest = testing::EngineTestBase;


TEST_F(EngineTest, TurnsMatchUncachedRunsAcrossRestartAndEviction) {
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode == 0 ? "hot" : mode == 1 ? "restart between turns" : "tiny budget");
    fs::remove_all(dir_ / "store");
    // A budget of a few 16-token f16 blocks (5 layers x 2 x 16 x 32 x 2 bytes = 10 KiB each).
    const int64_t budget = mode == 2 ? 8 * 10240 : 0;
    auto engine = CreateEngine(Options(budget));
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    ASSERT_TRUE((*engine)->CreateAgent("alice", 1000).ok());
    Greedy(**engine, "alice");
    if (mode == 2) {
      // Another agent fills the budget in between, so alice's idle blocks are evicted.
      ASSERT_TRUE((*engine)->CreateAgent("bob", 1000).ok());
      Greedy(**engine, "bob");
    }
    for (int t = 0; t < 3; ++t) {
      SCOPED_TRACE(t);
      if (mode == 1 && t > 0) {
        engine->reset();
        engine = CreateEngine(Options());
        ASSERT_TRUE(engine.ok());
      }
      TurnOutcome out = RunTurn(**engine, "alice", kTurns[t]);
      ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
      EXPECT_GT(out.stats->generated_tokens, 0);
      if (t > 0) {
        EXPECT_EQ(out.stats->match, "extend");
        EXPECT_GT(out.stats->reused_tokens, 16);
      }
      const store::Manifest m = ReadManifest(Options().store_dir, "alice");
      EXPECT_EQ(out.reply, Reference(m, *out.stats, 20));
      ASSERT_EQ(m.conversation.size(), static_cast<size_t>(2 * (t + 1)));
      EXPECT_EQ(m.conversation.back().text, out.reply);
      if (mode == 2) {
        ASSERT_TRUE(RunTurn(**engine, "bob", "A cat and a dog played in the sun all day long.").stats.ok());
      }
    }
    ExpectReloadsShown((*engine)->Stats(), mode, budget);
  }
}

// Turns that arrive together under a budget for one of them at a time: the one that waits for
// memory finds its blocks and tail evicted by the other, and the budget held by the other's
// blocks until the store has written them. It waits for that and reads its cache back, so both
// resume from their caches ("extend", every cached token reused) instead of recomputing.
TEST_F(EngineTest, ATurnThatWaitedForMemoryReloadsWhatWasEvicted) {
  const int64_t budget = 4 * 10240;  // 4 blocks: a running turn evicts the other agent's
  auto engine = CreateEngine(Options(budget));
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  std::map<std::string, int64_t> cached;
  for (const char* name : {"carol", "dave"}) {
    ASSERT_TRUE((*engine)->CreateAgent(name, 0).ok());
    Greedy(**engine, name, "", 8);
    ASSERT_TRUE(RunTurn(**engine, name, std::string(kTurns[0]) + " " + name).stats.ok());
    cached[name] = (*engine)->GetAgent(name)->context_tokens;
    ASSERT_GT(cached[name] % 16, 0) << "the test wants a tail";
  }
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    std::map<std::string, std::promise<Result<TurnStats>>> done;
    for (const char* name : {"carol", "dave"}) done[name];  // (no insertion once turns run)
    for (const char* name : {"carol", "dave"}) {
      TurnRequest r;
      r.agent = name;
      r.text = " And then?";
      auto* p = &done[name];
      r.on_done = [p](const Result<TurnStats>& st) { p->set_value(st); };
      ASSERT_TRUE((*engine)->SubmitTurn(std::move(r)).ok());
    }
    for (const char* name : {"carol", "dave"}) {
      Result<TurnStats> st = done[name].get_future().get();
      ASSERT_TRUE(st.ok()) << name << ": " << st.status().message();
      EXPECT_EQ(st->match, "extend") << name;
      EXPECT_EQ(st->reused_tokens, cached[name]) << name;
      cached[name] = (*engine)->GetAgent(name)->context_tokens;
    }
  }
  EXPECT_GT((*engine)->Stats().evictions, 0u);
}


TEST_F(EngineTest, AgentsOfOneUidShareBlocks) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE((*engine)->CreateAgent(name, 1000).ok());
    Greedy(**engine, name);
  }
  const std::string text = std::string(kTurns[0]) + kTurns[1] + kTurns[2];
  TurnOutcome a = RunTurn(**engine, "a", text);
  TurnOutcome b = RunTurn(**engine, "b", text);
  ASSERT_TRUE(a.stats.ok() && b.stats.ok());
  EXPECT_EQ(a.reply, b.reply);
  EXPECT_EQ(a.stats->reused_tokens, 0);
  EXPECT_GE(b.stats->reused_tokens, 32);  // b found a's full blocks
  const store::Manifest ma = ReadManifest(Options().store_dir, "a"), mb = ReadManifest(Options().store_dir, "b");
  ASSERT_GE(ma.blocks.size(), 2u);
  EXPECT_EQ(ma.blocks[0], mb.blocks[0]);
  // Another uid does not share.
  ASSERT_TRUE((*engine)->CreateAgent("c", 2000).ok());
  Greedy(**engine, "c");
  TurnOutcome c = RunTurn(**engine, "c", text);
  ASSERT_TRUE(c.stats.ok());
  EXPECT_EQ(c.stats->reused_tokens, 0);
  EXPECT_EQ(c.reply, a.reply);
}

// Issue 6: agents decoding together (one forward pass per step, prefill chunks interleaved,
// agents joining while others run) give each the greedy reply it gets alone.
TEST_F(EngineTest, BatchedTurnsMatchAlone) {
  const std::vector<std::string> prompts = {
      "Once upon a time", "The little dog ran to the park and saw a big red ball.", "Tom",
      "One day, a girl named Sue went to the shop with her mom to buy some bread and milk for dinner.",
      "The sun was hot.", "Ben and Mia played", "A bird sat on a tree and sang a happy song all day.", "Lily"};
  for (const char* kv : {"f16", "q8", "q4"}) {
    SCOPED_TRACE(kv);
    auto settings = [&] {
      AgentSettings s;
      s.sampling.temperature = 0;
      s.max_tokens = 24;
      s.kv = kv;
      return s;
    };
    EngineOptions o = Options();
    o.store_dir.clear();
    std::vector<std::string> alone;
    {
      auto e = CreateEngine(o);
      ASSERT_TRUE(e.ok());
      for (size_t i = 0; i < prompts.size(); ++i) {
        const std::string name = "solo" + std::to_string(i);
        ASSERT_TRUE((*e)->CreateAgent(name, 0).ok());
        ASSERT_TRUE((*e)->SetSettings(name, settings()).ok());
        TurnOutcome out = RunTurn(**e, name, prompts[i]);
        ASSERT_TRUE(out.stats.ok());
        alone.push_back(out.reply);
      }
    }
    auto e = CreateEngine(o);
    ASSERT_TRUE(e.ok());
    std::vector<TurnOutcome> outs(prompts.size());
    std::vector<std::promise<void>> done(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string name = "agent" + std::to_string(i);
      ASSERT_TRUE((*e)->CreateAgent(name, 0).ok());
      ASSERT_TRUE((*e)->SetSettings(name, settings()).ok());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      TurnRequest r;
      r.agent = "agent" + std::to_string(i);
      r.text = prompts[i];
      r.on_text = [&outs, i](std::string_view s) { outs[i].reply += s; };
      r.on_done = [&outs, &done, i](const Result<TurnStats>& s) {
        outs[i].stats = s;
        done[i].set_value();
      };
      ASSERT_TRUE((*e)->SubmitTurn(std::move(r)).ok());
      // Later agents join a batch that is already running.
      if (i % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    for (auto& d : done) d.get_future().wait();
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(outs[i].stats.ok()) << outs[i].stats.status().message();
      EXPECT_EQ(outs[i].reply, alone[i]) << "agent " << i;
    }
    const EngineStatus st = (*e)->Stats();
    EXPECT_GT(*std::max_element(st.batch_sizes.begin(), st.batch_sizes.end()), 1u);
  }
}

// DIVERGE: a new system prompt changes the start of the context; the next turn recomputes
// from there and still matches an uncached run.
TEST_F(EngineTest, SystemChangeDivergesAndMatchesUncachedRun) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", std::string(kTurns[0]) + kTurns[1]).stats.ok());
  ASSERT_TRUE((*engine)->SetSystem("alice", "Tom had a red car.").ok());
  TurnOutcome out = RunTurn(**engine, "alice", kTurns[2]);
  ASSERT_TRUE(out.stats.ok());
  EXPECT_EQ(out.stats->match, "diverge");
  EXPECT_EQ(out.reply, Reference(ReadManifest(Options().store_dir, "alice"), *out.stats, 20));
  // Same text again after a restart: EXTEND over the reloaded cache.
  engine->reset();
  engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  auto info = (*engine)->GetAgent("alice");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->system, "Tom had a red car.");
  // The transcript's source: the system prompt first, then the turns (2 before and 2 after it).
  auto conversation = (*engine)->Conversation("alice");
  ASSERT_TRUE(conversation.ok());
  ASSERT_EQ(conversation->size(), 5u);
  EXPECT_EQ((*conversation)[0], (store::ConversationTurn{"system", "Tom had a red car."}));
  EXPECT_EQ((*conversation)[1].role, "user");
  EXPECT_EQ((*conversation)[4].role, "assistant");
  EXPECT_EQ((*conversation)[4].text, out.reply);
  EXPECT_EQ(info->state, AgentState::kCold);
  EXPECT_EQ(info->memory_bytes, 0);
  EXPECT_GT(info->disk_bytes, 0);
  EXPECT_EQ(info->settings.max_tokens, 20);
  // Prefetch (what opening a cold agent's file does) brings the whole cache into memory.
  (*engine)->Prefetch("alice");
  for (int i = 0; i < 500 && (*engine)->GetAgent("alice")->state != AgentState::kHot; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  info = (*engine)->GetAgent("alice");
  EXPECT_EQ(info->state, AgentState::kHot);
  EXPECT_GT(info->memory_bytes, 0);
  TurnOutcome again = RunTurn(**engine, "alice", " The end.");
  ASSERT_TRUE(again.stats.ok());
  EXPECT_EQ(again.stats->match, "extend");
  EXPECT_EQ((*engine)->Stats().block_misses, 0u);
}

// A block that fails its checksum is dropped and the cache is recomputed from there.
TEST_F(EngineTest, CorruptBlockIsRebuiltFromText) {
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", std::string(kTurns[0]) + kTurns[1] + kTurns[2]).stats.ok());
  }
  const store::Manifest m = ReadManifest(Options().store_dir, "alice");
  ASSERT_GE(m.blocks.size(), 2u);
  const std::string hex = store::ToHex(m.blocks[1]);
  const fs::path block = dir_ / "store" / "blocks" / hex.substr(0, 2) / (hex + ".kvb");
  ASSERT_TRUE(fs::exists(block));
  {
    std::fstream f(block, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  TurnOutcome out = RunTurn(**engine, "alice", " The end.");
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_EQ(out.stats->match, "rebuild");
  EXPECT_EQ(out.stats->reused_tokens, 16);  // block 0 only
  EXPECT_EQ(out.reply, Reference(ReadManifest(Options().store_dir, "alice"), *out.stats, 20));
}

// A damaged manifest (one letter of the text changed on disk: the checksum tells) costs the
// agent its latest turn, not its history: it comes back at the turn before, says so in its
// status, and goes on from there.
TEST_F(EngineTest, DamagedManifestResumesFromThePreviousTurn) {
  std::vector<ConversationTurn> after_first;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
    after_first = *(*engine)->Conversation("alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[1]).stats.ok());
    ASSERT_GT((*engine)->Conversation("alice")->size(), after_first.size());
  }
  const fs::path manifest = dir_ / "store" / "agents" / "alice" / "manifest.json";
  std::string text = testing::ReadFile(manifest.string());
  const size_t at = text.find("liked to play");
  ASSERT_NE(at, std::string::npos);
  text[at] = 'L';
  {
    std::ofstream f(manifest, std::ios::binary | std::ios::trunc);
    f << text;
  }
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ(*(*engine)->Conversation("alice"), after_first);
  auto info = (*engine)->GetAgent("alice");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, AgentState::kError);
  EXPECT_NE(info->last_error.find("restored from its previous saved turn"), std::string::npos) << info->last_error;
  EXPECT_NE(info->last_error.find("checksum"), std::string::npos) << info->last_error;
  TurnOutcome out = RunTurn(**engine, "alice", kTurns[2]);
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_EQ(out.reply, Reference(ReadManifest(Options().store_dir, "alice"), *out.stats, 20));
  EXPECT_TRUE((*engine)->GetAgent("alice")->last_error.empty());
  EXPECT_EQ((*engine)->Conversation("alice")->size(), after_first.size() + 2);
}

// status.json's last_turn is the last committed turn's record, also after a restart (it is kept
// in the manifest), after an edit (which commits a manifest of its own), and after the manifest
// is lost (the turn before's record, with its conversation); an import, whose conversation is
// another, has none.
TEST_F(EngineTest, LastTurnRecordSurvivesRestartsAndEdits) {
  auto same = [](const TurnStats& a, const TurnStats& b) {
    EXPECT_EQ(a.match, b.match);
    EXPECT_EQ(a.reused_tokens, b.reused_tokens);
    EXPECT_EQ(a.prefilled_tokens, b.prefilled_tokens);
    EXPECT_EQ(a.generated_tokens, b.generated_tokens);
    EXPECT_EQ(a.ttft_ms, b.ttft_ms);
    EXPECT_EQ(a.decode_tokens_per_s, b.decode_tokens_per_s);
    EXPECT_EQ(a.stop_reason, b.stop_reason);
  };
  TurnStats first, second;
  std::string exported;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    EXPECT_FALSE((*engine)->GetAgent("alice")->last_turn.has_value());
    Greedy(**engine, "alice", "", 12);
    TurnOutcome a = RunTurn(**engine, "alice", kTurns[0]);
    ASSERT_TRUE(a.stats.ok());
    first = *a.stats;
    Greedy(**engine, "alice", "", 7);
    TurnOutcome b = RunTurn(**engine, "alice", kTurns[1]);
    ASSERT_TRUE(b.stats.ok());
    second = *b.stats;
    ASSERT_EQ(second.stop_reason, "max_tokens");
    ASSERT_EQ(second.generated_tokens, 7);
    ASSERT_EQ(second.match, "extend");
    ASSERT_NE(first.generated_tokens, second.generated_tokens);
    ASSERT_TRUE((*engine)->SetSystem("alice", "A story.").ok());  // an edit: a manifest without a turn
    same(*(*engine)->GetAgent("alice")->last_turn, second);
    auto file = (*engine)->ExportCache("alice");
    ASSERT_TRUE(file.ok());
    exported = *file;
  }
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    auto info = (*engine)->GetAgent("alice");
    ASSERT_TRUE(info.ok());
    ASSERT_TRUE(info->last_turn.has_value()) << "not kept across the restart";
    same(*info->last_turn, second);
    ASSERT_TRUE((*engine)->CreateAgent("bob", 0).ok());
    ASSERT_TRUE((*engine)->ImportCache("bob", exported).ok());
    EXPECT_FALSE((*engine)->GetAgent("bob")->last_turn.has_value());
  }
  // The latest manifest lost: the turn before comes back, with its record.
  const fs::path agent_dir = dir_ / "store" / "agents" / "alice";
  fs::remove(agent_dir / "manifest.json");
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  auto info = (*engine)->GetAgent("alice");
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(info->last_turn.has_value());
  same(*info->last_turn, second);  // the turn before the edit is the second turn
  EXPECT_FALSE((*engine)->GetAgent("bob")->last_turn.has_value());
}


// A prompt or system text spelling the model's control tokens ("</s>", "<s>") is text: the
// model sees the characters, not an end of sequence (a user must not end or forge turns), and
// the next turn extends the cache over it as usual.
TEST_F(EngineTest, SpelledControlTokensInPromptsAreText) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice", "", 4);
  ASSERT_TRUE((*engine)->SetSystem("alice", "Once</s> upon").ok());
  TurnOutcome first = RunTurn(**engine, "alice", " a time<s> there was</s>");
  ASSERT_TRUE(first.stats.ok()) << first.stats.status().message();
  const Tokenizer& tok = model_->tokenizer();
  const store::Manifest m = ReadManifest(Options().store_dir, "alice");
  ASSERT_FALSE(m.tokens.empty());
  EXPECT_EQ(m.tokens.front(), tok.bos());  // the one the encoding adds
  EXPECT_EQ(std::count(m.tokens.begin(), m.tokens.end(), tok.bos()), 1);
  EXPECT_EQ(std::count(m.tokens.begin(), m.tokens.end(), tok.eos()), 0);
  std::string spelled;
  for (size_t i = 0; i < m.tokens.size(); ++i) spelled += tok.TokenToPiece(m.tokens[i]);
  EXPECT_NE(spelled.find("Once</s> upon a time<s> there was</s>"), std::string::npos) << spelled;
  TurnOutcome second = RunTurn(**engine, "alice", " a cat.");
  ASSERT_TRUE(second.stats.ok());
  EXPECT_EQ(second.stats->match, "extend");
}


// With both manifests damaged nothing of the agent can be read. It is still listed (owned by
// root, its owner being unknown), so that it can be erased and is not made anew over what is left
// of it; everything else is refused without touching its files.
TEST_F(EngineTest, UnreadableAgentIsListedAndCanOnlyBeErased) {
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 1000).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", std::string(kTurns[0]) + kTurns[1]).stats.ok());
    ASSERT_TRUE((*engine)->CreateAgent("bob", 1000).ok());
    Greedy(**engine, "bob");
    ASSERT_TRUE(RunTurn(**engine, "bob", kTurns[2]).stats.ok());
  }
  const fs::path agent_dir = dir_ / "store" / "agents" / "alice";
  for (const char* f : {"manifest.json", "manifest.prev.json"}) {
    std::ofstream out(agent_dir / f, std::ios::binary | std::ios::trunc);
    out << "{\"format\": \"kvfs-manifest\", \"trunc";
  }
  auto files_of_alice = [&] {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::directory_iterator(agent_dir)) out[e.path().filename()] = testing::ReadFile(e.path());
    return out;
  };
  const auto before = files_of_alice();
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  auto info = (*engine)->GetAgent("alice");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, AgentState::kError);
  EXPECT_EQ(info->owner_uid, 0u);
  EXPECT_NE(info->last_error.find("can only be erased"), std::string::npos) << info->last_error;
  EXPECT_TRUE((*engine)->Conversation("alice")->empty());
  TurnRequest turn;
  turn.agent = "alice";
  turn.text = "hello";
  EXPECT_EQ((*engine)->SubmitTurn(std::move(turn)).code(), StatusCode::kIoError);
  EXPECT_EQ((*engine)->SetSystem("alice", "x").code(), StatusCode::kIoError);
  AgentSettings settings;
  settings.kv = kv_;
  ASSERT_TRUE((*engine)->CheckSettings(settings).ok());
  EXPECT_EQ((*engine)->SetSettings("alice", settings).code(), StatusCode::kIoError);
  EXPECT_EQ((*engine)->ExportCache("alice").status().code(), StatusCode::kIoError);
  EXPECT_EQ((*engine)->ImportCache("alice", *(*engine)->ExportCache("bob")).code(), StatusCode::kIoError);
  EXPECT_TRUE((*engine)->EraseCache("alice").ok());  // nothing readable to erase: a no-op
  EXPECT_EQ((*engine)->CreateAgent("alice", 1000).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(files_of_alice(), before);  // nothing touched
  // bob is unaffected.
  TurnOutcome out = RunTurn(**engine, "bob", " The end.");
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_EQ(out.reply, Reference(ReadManifest(Options().store_dir, "bob"), *out.stats, 20));
  // Erasure removes it all, and the blocks only alice named are collected with it.
  auto erased = (*engine)->EraseAgent("alice");
  ASSERT_TRUE(erased.ok()) << erased.status().message();
  EXPECT_GT(erased->files_removed, before.size() - 1);
  EXPECT_FALSE(fs::exists(agent_dir));
  EXPECT_FALSE((*engine)->GetAgent("alice").ok());
  std::vector<std::string> left;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "store" / "blocks"))
    if (e.is_regular_file()) left.push_back(e.path().filename().string());
  const store::Manifest bob = ReadManifest(Options().store_dir, "bob");
  EXPECT_EQ(left.size(), bob.blocks.size());
}

// A cache made with another model is never loaded: the conversation is kept and recomputed.
TEST_F(EngineTest, OtherModelsCacheIsNotLoaded) {
  const std::string other = testing::TestModelsDir() + "/tiny-llama-F16.gguf";
  KVFS_REQUIRE_DATA(other);
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  }
  EngineOptions o = Options();
  o.model_path = other;
  auto engine = CreateEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  auto conv = (*engine)->Conversation("alice");
  ASSERT_TRUE(conv.ok());
  EXPECT_EQ(conv->size(), 2u);
  // Its files are still on disk until the next turn: counted at their sizes, and an erasure of
  // the cache reports every one of them (the tail included).
  uint64_t file_bytes = 0;
  size_t files = 0;
  for (const fs::path& d : {dir_ / "store" / "blocks", dir_ / "store" / "agents" / "alice"})
    for (const auto& e : fs::recursive_directory_iterator(d))
      if (e.is_regular_file() && (e.path().extension() == ".kvb" || e.path().extension() == ".kvt"))
        file_bytes += e.file_size(), ++files;
  ASSERT_GE(files, 2u);
  EXPECT_EQ((*engine)->GetAgent("alice")->disk_bytes, static_cast<int64_t>(file_bytes));
  auto erased = (*engine)->EraseCache("alice");
  ASSERT_TRUE(erased.ok()) << erased.status().message();
  EXPECT_EQ(erased->files_removed, files);
  EXPECT_EQ(erased->bytes_freed, file_bytes);
  EXPECT_EQ((*engine)->GetAgent("alice")->disk_bytes, 0);
  TurnOutcome out = RunTurn(**engine, "alice", kTurns[1]);
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_EQ(out.stats->match, "new");
  EXPECT_EQ(out.stats->reused_tokens, 0);
  EXPECT_EQ((*engine)->Stats().reload_bytes, 0u);
}

// A budget too small for one block is refused when the engine starts, not at every turn.
TEST_F(EngineTest, BudgetBelowOneBlockIsRefusedAtStart) {
  auto engine = CreateEngine(Options(1));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("holds no turn"), std::string::npos) << engine.status().message();
}

TEST_F(EngineTest, EraseRemovesAgentFromMemoryAndDisk) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  EXPECT_GT((*engine)->Stats().memory_used_bytes, 0);
  auto report = (*engine)->EraseAgent("alice");
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_GT(report->blocks_freed, 0u);
  EXPECT_EQ((*engine)->Stats().memory_used_bytes, 0);
  EXPECT_FALSE(fs::exists(dir_ / "store" / "agents" / "alice"));
  EXPECT_EQ((*engine)->GetAgent("alice").status().code(), StatusCode::kNotFound);
  size_t block_files = 0;
  for (auto& e : fs::recursive_directory_iterator(dir_ / "store" / "blocks")) block_files += e.is_regular_file();
  EXPECT_EQ(block_files, 0u);
}

// The engine on the Vulkan backend (lavapipe in CI): the same greedy replies as on the CPU
// (stories260K, f16 KV: the golden tests show the two agree to 0.03 in the logits), a resumed
// turn on device copies of blocks the store reloads after a restart, and an erasure that leaves
// no block copy in device memory (the zeroing itself: vulkan_backend_test).
TEST_F(EngineTest, VulkanBackendServesTurnsAndErasureClearsDeviceCopies) { ExpectVulkanRepliesAsTheCpu(kTurns); }

// Byte tokens whose bytes form no UTF-8 (the random-weight tiny-llama emits some within 128
// greedy tokens of this prompt) must not fail the turn: its reply shows U+FFFD, the manifest
// stays JSON, and after a restart the next turn replies as on an engine that never restarted.
// A prompt that is not UTF-8 is refused at submission.
TEST_F(EngineTest, InvalidUtf8FromByteTokensIsCommittedAndResumed) {
  const std::string other = testing::TestModelsDir() + "/tiny-llama-F16.gguf";
  KVFS_REQUIRE_DATA(other);
  auto model = Model::Load(other);
  ASSERT_TRUE(model.ok());
  const char* turns[] = {"Once upon a time, there was a little girl named Lily.", "And then?"};
  auto start = [&](const std::string& store_dir) {
    EngineOptions o = Options();
    o.model_path = other;
    o.store_dir = store_dir;
    o.kv = "q4k";  // the daemon's default, with which this prompt's reply holds such bytes
    o.block_tokens = 64;
    auto e = CreateEngine(o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(*e) : nullptr;
  };
  auto settings = [&](AgentEngine& e) {
    AgentSettings s;
    s.sampling.temperature = 0;
    s.max_tokens = 128;
    s.kv = "q4k";
    ASSERT_TRUE(e.SetSettings("alice", s).ok());
  };
  std::vector<std::string> unbroken;  // both turns on an engine without a store or restart
  {
    auto e = start("");
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->CreateAgent("alice", 0).ok());
    settings(*e);
    for (const char* t : turns) unbroken.push_back(RunTurn(*e, "alice", t).reply);
  }
  const std::string store_dir = (dir_ / "store").string();
  int64_t committed_tokens = 0;
  {
    auto e = start(store_dir);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->CreateAgent("alice", 0).ok());
    settings(*e);
    TurnRequest bad;
    bad.agent = "alice";
    bad.text = "caf\xC3";  // a cut character
    EXPECT_EQ(e->SubmitTurn(std::move(bad)).code(), StatusCode::kInvalidArgument);
    TurnOutcome out = RunTurn(*e, "alice", turns[0]);
    ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
    EXPECT_EQ(out.reply, unbroken[0]);
    EXPECT_TRUE(store::ValidUtf8(out.reply));
    const store::Manifest m = ReadManifest(store_dir, "alice");
    ASSERT_EQ(m.conversation.size(), 2u);
    EXPECT_EQ(m.conversation[1].text, out.reply);
    // What the test is about: the fed-back tokens' own bytes (all generated but the last).
    const size_t fed = static_cast<size_t>(out.stats->generated_tokens - 1);
    ASSERT_LE(fed, m.tokens.size());
    std::string raw;
    for (size_t i = m.tokens.size() - fed; i < m.tokens.size(); ++i) raw += (*model)->tokenizer().TokenToPiece(m.tokens[i], true);
    ASSERT_FALSE(store::ValidUtf8(raw)) << "the model's reply is valid UTF-8 now: this test needs a prompt whose reply is not";
    committed_tokens = static_cast<int64_t>(m.tokens.size());
  }
  auto e = start(store_dir);  // restart: resumes from the store
  ASSERT_NE(e, nullptr);
  TurnOutcome out = RunTurn(*e, "alice", turns[1]);
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  // The text behind the cache shows the bytes that form no UTF-8 as the reply does (U+FFFD), and
  // so does the next turn's rendering of the reply: it extends the cache over every token the
  // model generated and was fed, as after a valid reply.
  EXPECT_EQ(out.stats->match, "extend");
  EXPECT_EQ(out.stats->reused_tokens, committed_tokens);
  EXPECT_EQ(out.reply, unbroken[1]);
}

// kvfsd holds its own copy of the model: a model file truncated or rewritten in place under a
// running engine (cp over it, a download resumed) changes nothing it serves. With the file
// mapped, a truncated file faults (SIGBUS) and a rewritten one changes the weights. The turns
// after each change also check that giving back the bytes the CPU backend packed never takes
// anything a pass still reads.
TEST_F(EngineTest, ServesTheLoadedModelAfterItsFileIsTruncatedOrRewritten) {
  const fs::path copy = dir_ / "model.gguf";
  fs::copy_file(model_path_, copy);
  const auto size = static_cast<size_t>(fs::file_size(copy));
  EngineOptions o = Options();
  o.model_path = copy.string();
  auto engine = CreateEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  const char* const agents[] = {"alice", "bob"};
  for (int change = 0; change < 2; ++change) {
    SCOPED_TRACE(change == 0 ? "truncated to 0 bytes" : "rewritten in place with other bytes");
    if (change == 0) {
      fs::resize_file(copy, 0);
    } else {
      std::FILE* f = std::fopen(copy.c_str(), "r+b");
      ASSERT_NE(f, nullptr);
      const std::string junk(size, '\x5a');
      ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());
      std::fclose(f);
    }
    ASSERT_TRUE((*engine)->CreateAgent(agents[change], 1000).ok());
    Greedy(**engine, agents[change]);
    TurnOutcome out = RunTurn(**engine, agents[change], kTurns[0]);
    ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
    EXPECT_GT(out.stats->generated_tokens, 0);
    EXPECT_EQ(out.reply, Reference(ReadManifest(o.store_dir, agents[change]), *out.stats, 20));
  }
}

}  // namespace
}  // namespace kvfs
