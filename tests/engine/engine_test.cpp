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

// An export of a cold agent reads its blocks from the store without loading them into the KV
// pool (a backup of every agent must not evict the ones at work, and a full pool must not make
// an export short); a block that cannot be read fails the export instead of shortening it.
TEST_F(EngineTest, ExportOfAColdAgentLoadsNothingAndNeverComesOutShort) {
  std::string before;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", std::string(kTurns[0]) + kTurns[1] + kTurns[2]).stats.ok());
    before = (*engine)->ExportCache("alice").value();
  }
  const store::Manifest m = ReadManifest(Options().store_dir, "alice");
  ASSERT_GE(m.blocks.size(), 2u);
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    auto file = (*engine)->ExportCache("alice");
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_EQ(*file, before);
    EXPECT_EQ((*engine)->GetAgent("alice")->memory_bytes, 0);
    EXPECT_EQ((*engine)->GetAgent("alice")->state, AgentState::kCold);
  }
  const std::string hex = store::ToHex(m.blocks[1]);
  {
    std::fstream f(dir_ / "store" / "blocks" / hex.substr(0, 2) / (hex + ".kvb"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->ExportSize("alice").value(), before.size());
  auto file = (*engine)->ExportCache("alice");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("exporting agent alice: block 1"), std::string::npos) << file.status().message();
  // Dropped as corrupt by that read, the block is missing now: still no short file.
  file = (*engine)->ExportCache("alice");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kIoError) << file.status().message();
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

// The file with one metadata entry of its header replaced (the tensors' bytes unchanged; the
// header padded with spaces to 8 bytes, as the format allows).
std::string WithMetadata(const std::string& file, const std::string& key, const std::string& value) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  nlohmann::json header = nlohmann::json::parse(file.substr(8, n));
  header["__metadata__"][key] = value;
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t m = text.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  return out + text + file.substr(8 + n);
}

// The file with one metadata entry removed (an export from before that entry existed).
std::string WithoutMetadata(const std::string& file, const std::string& key) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  nlohmann::json header = nlohmann::json::parse(file.substr(8, n));
  header["__metadata__"].erase(key);
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t m = text.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  return out + text + file.substr(8 + n);
}

// An import whose text says something its tokens do not (a file edited to show one story over
// the attention state of another) is refused, naming the first token that differs; without
// token_ends (an older export) the text is not believed, and the next turn keeps only the
// tokens that the conversation the agent shows encodes to.
TEST_F(EngineTest, ImportRefusesTextItsTokensDoNotStandFor) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  TurnOutcome first = RunTurn(**engine, "alice", kTurns[0]);
  ASSERT_TRUE(first.stats.ok());
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[1]).stats.ok());
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  uint64_t n = 0;
  std::memcpy(&n, exported->data(), 8);
  const nlohmann::json meta = nlohmann::json::parse(exported->substr(8, n))["__metadata__"];
  const std::string text = meta["context_text"].get<std::string>();
  ASSERT_NE(text.find("Lily"), std::string::npos);
  ASSERT_TRUE(meta.contains("token_ends"));
  ASSERT_TRUE((*engine)->CreateAgent("bob", 0).ok());
  Greedy(**engine, "bob");
  ASSERT_TRUE((*engine)->ImportCache("bob", *exported).ok());  // the file as exported

  // Another name over the same tokens, in the text and the conversation alike.
  std::string other = text;
  other.replace(other.find("Lily"), 4, "Anna");
  nlohmann::json conversation = nlohmann::json::parse(meta["conversation"].get<std::string>());
  std::string said = conversation[0]["text"].get<std::string>();
  said.replace(said.find("Lily"), 4, "Anna");
  conversation[0]["text"] = said;
  const std::string forged = WithMetadata(WithMetadata(*exported, "context_text", other), "conversation", conversation.dump());
  Status s = (*engine)->ImportCache("bob", forged);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("do not stand for context_text"), std::string::npos) << s.message();
  // One token changed under the same text.
  nlohmann::json ids = nlohmann::json::parse(meta["token_ids"].get<std::string>());
  ids[ids.size() - 2] = ids[ids.size() - 2].get<int>() == 5 ? 6 : 5;
  s = (*engine)->ImportCache("bob", WithMetadata(*exported, "token_ids", ids.dump()));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token " + std::to_string(ids.size() - 2) + " "), std::string::npos) << s.message();
  EXPECT_EQ((*engine)->ExportCache("bob").value(), *exported);  // bob unchanged

  // Without token_ends the forged text is dropped: the next turn renders the conversation bob
  // shows ("Anna") and keeps no token past where its encoding parts from the file's tokens.
  ASSERT_TRUE((*engine)->ImportCache("bob", WithoutMetadata(forged, "token_ends")).ok());
  TurnOutcome next = RunTurn(**engine, "bob", kTurns[2]);
  ASSERT_TRUE(next.stats.ok());
  const std::vector<TokenId> encoded = model_->tokenizer().Encode(text.substr(0, text.find("Lily")), true, true);
  EXPECT_LE(next.stats->reused_tokens, static_cast<int64_t>(encoded.size()));
  EXPECT_GT(next.stats->prefilled_tokens, first.stats->generated_tokens);
}

// An import whose token ids or conversation no export of this model would have is refused,
// naming the entry, and the agent keeps its cache (its export is unchanged).
TEST_F(EngineTest, ImportRefusesTokensOutsideTheVocabularyAndUnknownRoles) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  // The unchanged file through the same rewrite still imports: the edits below are the cause.
  uint64_t n = 0;
  std::memcpy(&n, exported->data(), 8);
  const nlohmann::json meta = nlohmann::json::parse(exported->substr(8, n))["__metadata__"];
  ASSERT_TRUE((*engine)->ImportCache("alice", WithMetadata(*exported, "conversation", meta["conversation"])).ok());

  nlohmann::json ids = nlohmann::json::parse(meta["token_ids"].get<std::string>());
  ASSERT_GT(ids.size(), 3u);
  ids[3] = model_->hparams().n_vocab;  // one past the last token
  Status s = (*engine)->ImportCache("alice", WithMetadata(*exported, "token_ids", ids.dump()));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("position 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("vocabulary"), std::string::npos) << s.message();

  nlohmann::json conversation = nlohmann::json::parse(meta["conversation"].get<std::string>());
  ASSERT_FALSE(conversation.empty());
  conversation[0]["role"] = "hacker";
  s = (*engine)->ImportCache("alice", WithMetadata(*exported, "conversation", conversation.dump()));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hacker"), std::string::npos) << s.message();
  EXPECT_EQ((*engine)->ExportCache("alice").value(), *exported);
}

// kv.safetensors: export, erase the cache, import it back: the next turn reuses the imported
// KV and still matches an uncached run. Bad files change nothing.
TEST_F(EngineTest, ExportImportRoundTrip) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", std::string(kTurns[0]) + kTurns[1]).stats.ok());
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  const HParams& hp = model_->hparams();
  const KvFormat f16 = MakeKvFormat("f16", "", hp.n_head_kv, hp.head_dim).value();
  const store::KvGeometry geometry{hp.n_layer, hp.n_head_kv, hp.head_dim, "f16", f16.group, false};
  const std::string fp = (*engine)->ModelInfo()["fingerprint"];
  auto parsed = store::ReadKvSafetensors(*exported, fp, geometry, 16);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const store::Manifest before = ReadManifest(Options().store_dir, "alice");
  EXPECT_EQ(parsed->info.n_cached, static_cast<int64_t>(before.tokens.size()));
  EXPECT_EQ(parsed->info.conversation, before.conversation);

  // Garbage and truncated files: refused, nothing changes.
  EXPECT_FALSE((*engine)->ImportCache("alice", "not a safetensors file").ok());
  EXPECT_FALSE((*engine)->ImportCache("alice", std::string_view(*exported).substr(0, exported->size() / 2)).ok());
  EXPECT_EQ((*engine)->ExportCache("alice").value(), *exported);

  auto erased = (*engine)->EraseCache("alice");
  ASSERT_TRUE(erased.ok());
  EXPECT_GT(erased->blocks_freed, 0u);
  EXPECT_EQ((*engine)->Conversation("alice")->size(), 2u);  // the transcript stays
  EXPECT_TRUE(ReadManifest(Options().store_dir, "alice").blocks.empty());

  ASSERT_TRUE((*engine)->ImportCache("alice", *exported).ok());
  EXPECT_EQ(ReadManifest(Options().store_dir, "alice").blocks, before.blocks);
  TurnOutcome out = RunTurn(**engine, "alice", kTurns[2]);
  ASSERT_TRUE(out.stats.ok());
  EXPECT_GE(out.stats->reused_tokens, 32);
  EXPECT_EQ(out.reply, Reference(ReadManifest(Options().store_dir, "alice"), *out.stats, 20));

  // Another model's engine refuses the file.
  const std::string other = testing::TestModelsDir() + "/tiny-llama-F16.gguf";
  if (FileExists(other)) {
    EngineOptions o = Options();
    o.model_path = other;
    o.store_dir = (dir_ / "other").string();
    auto e2 = CreateEngine(o);
    ASSERT_TRUE(e2.ok());
    ASSERT_TRUE((*e2)->CreateAgent("x", 0).ok());
    Greedy(**e2, "x");
    Status s = (*e2)->ImportCache("x", *exported);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  }
}

// kv.safetensors's size in `ls -l` (ExportSize) is the size of the file an export makes, in
// every state its cache goes through: none yet, after turns (a tail, then more blocks), in
// another agent after an import, erased, after a change of KV format with and without a cache,
// and cold after a restart. An unknown agent has none.
TEST_F(EngineTest, ExportSizeIsTheSizeOfTheExport) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  auto expect_sizes_agree = [&](const std::string& agent, const char* when) {
    auto file = (*engine)->ExportCache(agent);
    auto size = (*engine)->ExportSize(agent);
    ASSERT_TRUE(file.ok() && size.ok()) << when;
    EXPECT_EQ(*size, file->size()) << agent << " " << when;
  };
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  expect_sizes_agree("alice", "new");
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  expect_sizes_agree("alice", "after a turn");
  const uint64_t after_one = (*engine)->ExportSize("alice").value();
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[1]).stats.ok());
  expect_sizes_agree("alice", "after two turns");
  EXPECT_GT((*engine)->ExportSize("alice").value(), after_one);
  ASSERT_TRUE((*engine)->CreateAgent("bob", 0).ok());
  Greedy(**engine, "bob");
  ASSERT_TRUE((*engine)->ImportCache("bob", *(*engine)->ExportCache("alice")).ok());
  expect_sizes_agree("bob", "imported");
  Greedy(**engine, "bob", "q8");
  expect_sizes_agree("bob", "q8 settings, f16 cache");
  ASSERT_TRUE((*engine)->EraseCache("bob").ok());
  expect_sizes_agree("bob", "erased, q8 settings");
  ASSERT_TRUE(RunTurn(**engine, "bob", kTurns[2]).stats.ok());
  expect_sizes_agree("bob", "a q8 turn");
  EXPECT_EQ((*engine)->ExportSize("carol").status().code(), StatusCode::kNotFound);
  // No cache: the file's tensors are in the format of the settings, whose change alone changes
  // its size (ExportSize keeps its answer until what it depends on changes).
  ASSERT_TRUE((*engine)->CreateAgent("dave", 0).ok());
  Greedy(**engine, "dave", "f16");
  expect_sizes_agree("dave", "f16 settings, no cache");
  Greedy(**engine, "dave", "q4");
  expect_sizes_agree("dave", "q4 settings, no cache");
  const uint64_t alice_size = (*engine)->ExportSize("alice").value();
  (*engine)->Shutdown();
  engine->reset();
  engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->ExportSize("alice").value(), alice_size);  // cold: nothing loaded yet
  expect_sizes_agree("alice", "after a restart");
  expect_sizes_agree("bob", "after a restart");
}

// While a turn runs, the agent names only the blocks it reuses (none here: a new system prompt
// made the context diverge) and still has its old tokens: the export holds those blocks alone,
// and ExportSize says so (it once counted every token). Sampled while the reply streams, at
// moments when the size is the same before and after the export.
TEST_F(EngineTest, ExportSizeIsTheSizeOfTheExportDuringATurn) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  AgentSettings s;
  s.sampling.temperature = 0;
  s.max_tokens = 300;
  s.kv = "f16";
  ASSERT_TRUE((*engine)->SetSettings("alice", s).ok());
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  const uint64_t committed = (*engine)->ExportSize("alice").value();
  ASSERT_TRUE((*engine)->SetSystem("alice", "Tom had a red car.").ok());
  std::promise<void> finished;
  TurnRequest r;
  r.agent = "alice";
  r.text = kTurns[1];
  r.on_done = [&](const Result<TurnStats>&) { finished.set_value(); };
  ASSERT_TRUE((*engine)->SubmitTurn(std::move(r)).ok());
  auto done = finished.get_future();
  int sampled = 0;
  bool smaller = false;
  while (done.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    if ((*engine)->GetAgent("alice")->state != AgentState::kGenerating) continue;
    auto before = (*engine)->ExportSize("alice");
    auto file = (*engine)->ExportCache("alice");
    auto after = (*engine)->ExportSize("alice");
    if (!before.ok() || !file.ok() || !after.ok() || *before != *after) continue;
    if ((*engine)->GetAgent("alice")->state != AgentState::kGenerating) continue;
    EXPECT_EQ(*before, file->size());
    smaller = smaller || *before < committed;
    ++sampled;
  }
  EXPECT_GT(sampled, 0) << "the turn ended before a sample";
  std::printf("[export size] %d samples during the turn\n", sampled);
  EXPECT_TRUE(smaller) << "the export during the turn holds fewer blocks than the committed one";
}

// Cloning: alice's file imported into a new agent with the same settings. The file carries the
// text behind its tokens, so bob's next turn extends the imported cache by characters (all of it
// reused, where re-encoding the text would not give back the sampled tokens) and replies
// exactly as alice does to the same message.
TEST_F(EngineTest, ImportIntoAnotherAgentExtendsTheImportedText) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[1]).stats.ok());
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  const int64_t n_tokens = (*engine)->GetAgent("alice")->context_tokens;
  ASSERT_TRUE((*engine)->CreateAgent("bob", 0).ok());
  Greedy(**engine, "bob");
  ASSERT_TRUE((*engine)->ImportCache("bob", *exported).ok());
  TurnOutcome bob = RunTurn(**engine, "bob", kTurns[2]);
  ASSERT_TRUE(bob.stats.ok()) << bob.stats.status().message();
  EXPECT_EQ(bob.stats->match, "extend");
  EXPECT_EQ(bob.stats->reused_tokens, n_tokens);
  TurnOutcome alice = RunTurn(**engine, "alice", kTurns[2]);
  ASSERT_TRUE(alice.stats.ok());
  EXPECT_EQ(alice.stats->match, "extend");
  EXPECT_EQ(bob.reply, alice.reply);
  EXPECT_EQ(bob.reply, Reference(ReadManifest(Options().store_dir, "bob"), *bob.stats, 20));
  // Another system prompt renders another text: the import is then matched on tokens.
  ASSERT_TRUE((*engine)->CreateAgent("carol", 0).ok());
  Greedy(**engine, "carol");
  ASSERT_TRUE((*engine)->SetSystem("carol", "Tom had a red car.").ok());
  ASSERT_TRUE((*engine)->ImportCache("carol", *exported).ok());
  TurnOutcome carol = RunTurn(**engine, "carol", kTurns[2]);
  ASSERT_TRUE(carol.stats.ok());
  EXPECT_EQ(carol.stats->match, "diverge");
  EXPECT_EQ(carol.reply, Reference(ReadManifest(Options().store_dir, "carol"), *carol.stats, 20));
}

// After a settings change to another KV format, the cache stays in the old one until the next
// turn: exporting it and importing the file back restores it (the round trip of a backup), a
// file in a third format is refused, and the next turn recomputes in the new format. An agent
// without a cache exports in its settings' format, which imports back.
TEST_F(EngineTest, ExportImportRoundTripAfterAFormatChange) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  auto f16_file = (*engine)->ExportCache("alice");
  ASSERT_TRUE(f16_file.ok());
  ASSERT_TRUE((*engine)->CreateAgent("bob", 0).ok());  // a q4 file, from another agent
  Greedy(**engine, "bob", "q4");
  ASSERT_TRUE(RunTurn(**engine, "bob", kTurns[0]).stats.ok());
  auto q4_file = (*engine)->ExportCache("bob");
  ASSERT_TRUE(q4_file.ok());

  Greedy(**engine, "alice", "q8");
  auto still_f16 = (*engine)->ExportCache("alice");
  ASSERT_TRUE(still_f16.ok());
  EXPECT_EQ(*still_f16, *f16_file);  // the cache is unchanged until the next turn
  const store::Manifest before = ReadManifest(Options().store_dir, "alice");
  Status back = (*engine)->ImportCache("alice", *still_f16);
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ((*engine)->ExportCache("alice").value(), *f16_file);
  EXPECT_EQ(ReadManifest(Options().store_dir, "alice").blocks, before.blocks);
  EXPECT_EQ((*engine)->ImportCache("alice", *q4_file).code(), StatusCode::kInvalidArgument);

  TurnOutcome out = RunTurn(**engine, "alice", kTurns[1]);
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_EQ(out.stats->reused_tokens, 0);  // an f16 cache is no use to a q8 agent
  EXPECT_EQ(ReadManifest(Options().store_dir, "alice").kv_format, "q8");

  // With no cache (erased), the file is in the format of the settings, and comes back too.
  ASSERT_TRUE((*engine)->EraseCache("bob").ok());
  Greedy(**engine, "bob", "q8");
  auto empty = (*engine)->ExportCache("bob");
  ASSERT_TRUE(empty.ok());
  const HParams& hp = model_->hparams();
  const KvFormat q8_format = Format("q8");
  const store::KvGeometry q8_geometry{hp.n_layer, hp.n_head_kv, hp.head_dim, "q8", q8_format.group, q8_format.rotate};
  const std::string fp = (*engine)->ModelInfo()["fingerprint"];
  auto parsed = store::ReadKvSafetensors(*empty, fp, q8_geometry, 16);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->info.n_cached, 0);
  EXPECT_EQ(parsed->info.conversation.size(), 2u);
  Status empty_back = (*engine)->ImportCache("bob", *empty);
  EXPECT_TRUE(empty_back.ok()) << empty_back.message();
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
  }
  auto e = start(store_dir);  // restart: resumes from the store
  ASSERT_NE(e, nullptr);
  TurnOutcome out = RunTurn(*e, "alice", turns[1]);
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  // The text behind the cache stops before the bytes that form no UTF-8: the next turn keeps the
  // cache up to them (in whole 64-token K chunks: q4k) instead of recomputing it all.
  EXPECT_EQ(out.stats->match, "diverge");
  EXPECT_GE(out.stats->reused_tokens, 64) << "kept " << out.stats->reused_tokens;
  EXPECT_EQ(out.reply, unbroken[1]);
}

// An export running while its agent is erased holds the agent's blocks for a moment, so the
// erasure cannot drop them then; they must still be gone from memory once both are done.
TEST_F(EngineTest, ExportRacingAnErasureLeavesNoBlockInMemory) {
  // Without a store the erasure reaches its drops within microseconds, as long as an export
  // takes to copy out a cache of this model: the two overlap often.
  EngineOptions options = Options();
  options.store_dir.clear();
  auto engine = CreateEngine(options);
  ASSERT_TRUE(engine.ok());
  for (int round = 0; round < 40; ++round) {
    const std::string name = "r" + std::to_string(round);
    ASSERT_TRUE((*engine)->CreateAgent(name, 1000).ok());
    Greedy(**engine, name);
    TurnOutcome out = RunTurn(**engine, name, std::string(kTurns[0]) + kTurns[1] + kTurns[2]);
    ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
    std::atomic<bool> erased{false};
    std::atomic<int> exports{0};
    std::thread exporter([&] {
      while (!erased.load()) {
        (void)(*engine)->ExportCache(name);
        ++exports;
      }
    });
    while (exports.load() < 2) std::this_thread::yield();
    const auto removed = (*engine)->EraseAgent(name);
    erased = true;
    exporter.join();
    ASSERT_TRUE(removed.ok()) << removed.status().message();
    EXPECT_EQ((*engine)->Stats().memory_used_bytes, 0) << "round " << round;
  }
}

}  // namespace
}  // namespace kvfs
