// kv.safetensors through the Engine on the real stories260K model: exports (cold agents read
// from the store, sizes as promised, racing erasures), imports (round trips, format changes,
// text that the tokens must spell, metadata no export would have).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "engine/kv/block_pool.h"
#include "engine/runtime/engine.h"
#include "engine/store/manifest.h"
#include "engine/store/safetensors.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

namespace fs = std::filesystem;
using testing::BlockFiles;
using testing::FileExists;
using testing::ReadManifest;
using testing::RunTurn;
using testing::TurnOutcome;
using testing::kTurns;

using EngineExportTest = testing::EngineTestBase;

// A kv.safetensors file's header (JSON).
nlohmann::json HeaderOf(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return nlohmann::json::parse(file.substr(8, n));
}

// An export of a cold agent reads its blocks from the store without loading them into the KV
// pool (a backup of every agent must not evict the ones at work, and a full pool must not make
// an export short). A block found damaged by that read is dropped: the export then holds the
// blocks before it, as stat says from then on, not EIO until the next turn.
TEST_F(EngineExportTest, ExportOfAColdAgentLoadsNothingAndEndsBeforeALostBlock) {
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
  EXPECT_EQ((*engine)->ExportSize("alice").value(), before.size());  // not known to be damaged yet
  // The read finds the block damaged and the store drops it: the export holds what is left, the
  // first block, and says so; the next turn recomputes from there. Its size is what stat says now.
  auto file = (*engine)->ExportCache("alice");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_LT(file->size(), before.size());
  EXPECT_EQ((*engine)->ExportSize("alice").value(), file->size());
  auto header = HeaderOf(*file);
  EXPECT_EQ(header["__metadata__"]["n_cached"], std::to_string(block_tokens_)) << header.dump();
  EXPECT_EQ((*engine)->ExportCache("alice").value(), *file);
}

// A tail file that is gone at a start (a manifest put back from manifest.prev.json names the tail
// that the commit after it removed) or found damaged by an export: the agent exports its full
// blocks, as stat says, and its next turn recomputes the last tokens from their ids.
TEST_F(EngineExportTest, AnAgentWhoseTailIsLostExportsItsFullBlocks) {
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  }
  const store::Manifest m = ReadManifest(Options().store_dir, "alice");
  ASSERT_TRUE(m.tail.has_value());
  ASSERT_GE(m.blocks.size(), 1u);
  for (const bool damaged : {false, true}) {
    SCOPED_TRACE(damaged ? "a damaged tail" : "a missing tail");
    const fs::path tail = dir_ / "store" / "agents" / "alice" / m.tail->file;
    const std::string kept = testing::ReadFile(tail.string());
    if (damaged) {
      std::fstream f(tail, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(kept.size() / 2));
      f.put(static_cast<char>(kept[kept.size() / 2] ^ 0x5a));
    } else {
      fs::remove(tail);
    }
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    const uint64_t size = (*engine)->ExportSize("alice").value();
    auto file = (*engine)->ExportCache("alice");
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_EQ(HeaderOf(*file)["__metadata__"]["n_cached"], std::to_string(m.blocks.size() * block_tokens_));
    if (!damaged) {
      EXPECT_EQ(file->size(), size);  // known at the start
    }
    EXPECT_EQ((*engine)->ExportSize("alice").value(), file->size());
    std::ofstream(tail, std::ios::binary | std::ios::trunc) << kept;  // for the next case
  }
}

// The file with its header edited (the tensors' bytes unchanged; the header padded with spaces
// to 8 bytes, as the format allows).

template <typename Edit>
std::string WithHeader(const std::string& file, Edit edit) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  nlohmann::json header = HeaderOf(file);
  edit(header["__metadata__"]);
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t m = text.size();
  return std::string(reinterpret_cast<const char*>(&m), 8) + text + file.substr(8 + n);
}

// One metadata entry replaced, or removed (an export from before that entry existed).
std::string WithMetadata(const std::string& file, const std::string& key, const std::string& value) {
  return WithHeader(file, [&](nlohmann::json& meta) { meta[key] = value; });
}
std::string WithoutMetadata(const std::string& file, const std::string& key) {
  return WithHeader(file, [&](nlohmann::json& meta) { meta.erase(key); });
}

// An import believes the text behind its tokens only where the tokens spell it: a file edited to
// show one story over the attention state of another (its text and conversation changed, or one
// token changed under the same text), or one without token_ends (an older export), imports
// without its text, and the next turn keeps only the tokens that the conversation the agent shows
// encodes to. The file as exported keeps everything.
TEST_F(EngineExportTest, ImportBelievesTheTextOnlyWhereItsTokensSpellIt) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[1]).stats.ok());
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  const nlohmann::json meta = HeaderOf(*exported)["__metadata__"];
  const std::string text = meta["context_text"].get<std::string>();
  const size_t n_tokens = nlohmann::json::parse(meta["token_ids"].get<std::string>()).size();
  ASSERT_NE(text.find("Lily"), std::string::npos);
  ASSERT_TRUE(meta.contains("token_ends"));
  // Tokens up to the name: all a forged file's next turn may keep.
  const int64_t before_name =
      static_cast<int64_t>(model_->tokenizer().Encode(text.substr(0, text.find("Lily")), true, true).size());

  // Another name over the same tokens, in the text and the conversation alike.
  std::string other = text;
  other.replace(other.find("Lily"), 4, "Anna");
  nlohmann::json conversation = nlohmann::json::parse(meta["conversation"].get<std::string>());
  std::string said = conversation[0]["text"].get<std::string>();
  said.replace(said.find("Lily"), 4, "Anna");
  conversation[0]["text"] = said;
  const std::string forged = WithMetadata(WithMetadata(*exported, "context_text", other), "conversation", conversation.dump());
  // One token changed under the same text.
  nlohmann::json ids = nlohmann::json::parse(meta["token_ids"].get<std::string>());
  ids[ids.size() - 2] = ids[ids.size() - 2].get<int>() == 5 ? 6 : 5;
  const std::string swapped = WithMetadata(*exported, "token_ids", ids.dump());

  // (Each importer of its own uid: no blocks shared with the others' turns.)
  struct Case {
    const char* agent;
    std::string file;
    bool believed;
    uint32_t uid;
  };
  for (const Case& c : {Case{"bob", *exported, true, 1001}, Case{"carol", forged, false, 1002},
                        Case{"dave", WithoutMetadata(forged, "token_ends"), false, 1003}}) {
    SCOPED_TRACE(c.agent);
    ASSERT_TRUE((*engine)->CreateAgent(c.agent, c.uid).ok());
    Greedy(**engine, c.agent);
    const Status imported = (*engine)->ImportCache(c.agent, c.file);
    ASSERT_TRUE(imported.ok()) << imported.message();
    TurnOutcome next = RunTurn(**engine, c.agent, kTurns[2]);
    ASSERT_TRUE(next.stats.ok());
    if (c.believed) {
      EXPECT_EQ(next.stats->match, "extend");
      EXPECT_EQ(next.stats->reused_tokens, static_cast<int64_t>(n_tokens));
    } else {
      EXPECT_LE(next.stats->reused_tokens, before_name);
    }
    EXPECT_EQ(next.reply, Reference(ReadManifest(Options().store_dir, c.agent), *next.stats, 20));
  }
  // The swapped token: the text is dropped, and the next turn keeps nothing past that token.
  ASSERT_TRUE((*engine)->CreateAgent("erin", 1004).ok());
  Greedy(**engine, "erin");
  ASSERT_TRUE((*engine)->ImportCache("erin", swapped).ok());
  TurnOutcome next = RunTurn(**engine, "erin", kTurns[2]);
  ASSERT_TRUE(next.stats.ok());
  EXPECT_LE(next.stats->reused_tokens, static_cast<int64_t>(n_tokens) - 2);
  EXPECT_EQ(next.reply, Reference(ReadManifest(Options().store_dir, "erin"), *next.stats, 20));
}

// The data buffer of a kv.safetensors file (after its header).
std::string DataOf(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return file.substr(8 + n);
}

// The same file with its data buffer's first half inverted and the checksum made to match: K/V
// rows that no forward pass over its token ids gave, in a file the import cannot tell from a
// genuine one.
std::string WithForgedData(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::string forged = file;
  for (size_t i = 8 + n; i < 8 + n + (file.size() - 8 - n) / 2; ++i) forged[i] = static_cast<char>(~forged[i]);
  const std::string data = DataOf(forged);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(data.data(), data.size())));
  return WithMetadata(forged, "payload_xxh3_64", hex);
}

// Nothing ties an imported file's K/V to the token ids it claims, so its blocks must never stand
// in for the ones the engine computes for those tokens: not for a new agent of the same uid
// whose context starts with them (it computes its own, and replies as an uncached run), not for
// a later import of other bytes for the same tokens (it keeps its own bytes), and not after a
// restart. The same file imported twice still shares its blocks.
TEST_F(EngineExportTest, AnImportsBlocksNeverStandInForComputedOnes) {
  std::string genuine, forged;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    TurnOutcome alice = RunTurn(**engine, "alice", kTurns[0]);
    ASSERT_TRUE(alice.stats.ok());
    auto exported = (*engine)->ExportCache("alice");
    ASSERT_TRUE(exported.ok()) << exported.status().message();
    genuine = *exported;
    forged = WithForgedData(genuine);
    ASSERT_TRUE(DataOf(forged) != DataOf(genuine));
    // alice's own blocks would win over the file's by name; the case is a uid whose computed
    // blocks are gone (erased, or never made on this machine).
    ASSERT_TRUE((*engine)->EraseAgent("alice").ok());
    ASSERT_TRUE((*engine)->CreateAgent("mallory", 0).ok());
    Greedy(**engine, "mallory");
    ASSERT_TRUE((*engine)->ImportCache("mallory", forged).ok());
    ASSERT_TRUE((*engine)->CreateAgent("victim", 0).ok());
    Greedy(**engine, "victim");
    TurnOutcome victim = RunTurn(**engine, "victim", kTurns[0]);
    ASSERT_TRUE(victim.stats.ok());
    EXPECT_EQ(victim.stats->reused_tokens, 0);
    EXPECT_EQ(victim.reply, alice.reply);
    EXPECT_EQ(victim.reply, Reference(ReadManifest(Options().store_dir, "victim"), *victim.stats, 20));
    ASSERT_TRUE((*engine)->EraseAgent("victim").ok());
    // A genuine backup of the same tokens keeps its bytes.
    ASSERT_TRUE((*engine)->CreateAgent("restore", 0).ok());
    ASSERT_TRUE((*engine)->ImportCache("restore", genuine).ok());
    auto restored = (*engine)->ExportCache("restore");
    ASSERT_TRUE(restored.ok());
    EXPECT_TRUE(DataOf(*restored) == DataOf(genuine)) << "the restored cache holds other K/V than the backup";
    // The forged file imported again is the same file: its blocks are shared, not stored twice.
    const size_t blocks_before = BlockFiles(Options().store_dir);
    ASSERT_GT(blocks_before, 0u);
    ASSERT_TRUE((*engine)->CreateAgent("mallory2", 0).ok());
    ASSERT_TRUE((*engine)->ImportCache("mallory2", forged).ok());
    EXPECT_EQ(BlockFiles(Options().store_dir), blocks_before);
  }
  // After a restart: the same.
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("victim2", 0).ok());
  Greedy(**engine, "victim2");
  TurnOutcome victim2 = RunTurn(**engine, "victim2", kTurns[0]);
  ASSERT_TRUE(victim2.stats.ok());
  EXPECT_EQ(victim2.stats->reused_tokens, 0);
  EXPECT_EQ(victim2.reply, Reference(ReadManifest(Options().store_dir, "victim2"), *victim2.stats, 20));
  auto restored = (*engine)->ExportCache("restore");
  ASSERT_TRUE(restored.ok());
  EXPECT_TRUE(DataOf(*restored) == DataOf(genuine)) << "the restored cache holds other K/V than the backup";
}

// An imported cache's rows that kvfsd could not check (here all of them: the agent that made
// them is erased, and a cache shorter than a block is only a tail) taint the blocks the agent
// computes over them: those are named apart from the uid's computed names, after a restart too,
// until the cache keeps none of those rows (rm kv.safetensors: then the rebuilt blocks take the
// computed names again, which the expected names below must match).
TEST_F(EngineExportTest, AnUncheckedImportsRowsTaintTheBlocksComputedAfterThem) {
  block_tokens_ = 64;
  const std::string fp = [&] {
    auto e = CreateEngine(Options());
    return e.ok() ? (*e)->ModelInfo()["fingerprint"].get<std::string>() : std::string();
  }();
  const KvFormat format = Format(kv_);
  // The names the uid's agents compute for a manifest's tokens.
  auto computed_names = [&](const store::Manifest& m) {
    std::vector<BlockHash> names;
    for (size_t i = 0; i + 64 <= m.tokens.size(); i += 64)
      names.push_back(ChainHash(names.empty() ? BlockHash{} : names.back(),
                                std::span<const TokenId>(m.tokens.data() + i, 64), fp, format, "uid:0"));
    return names;
  };
  std::string file;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
    Greedy(**engine, "alice");
    ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
    file = (*engine)->ExportCache("alice").value();
    ASSERT_LT(ReadManifest(Options().store_dir, "alice").tokens.size(), 64u);  // a tail only
    ASSERT_TRUE((*engine)->EraseAgent("alice").ok());
    ASSERT_TRUE((*engine)->CreateAgent("mallory", 0).ok());
    Greedy(**engine, "mallory");
    ASSERT_TRUE((*engine)->ImportCache("mallory", file).ok());
    TurnOutcome next = RunTurn(**engine, "mallory", std::string(kTurns[1]) + kTurns[2]);
    ASSERT_TRUE(next.stats.ok()) << next.stats.status().message();
    EXPECT_EQ(next.stats->match, "extend");
    const store::Manifest m = ReadManifest(Options().store_dir, "mallory");
    ASSERT_GE(m.blocks.size(), 1u);
    const std::vector<BlockHash> names = computed_names(m);
    for (size_t i = 0; i < m.blocks.size(); ++i) EXPECT_NE(m.blocks[i], names[i]) << "block " << i;
  }
  // After a restart: still apart.
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  TurnOutcome again = RunTurn(**engine, "mallory", " The end.");
  ASSERT_TRUE(again.stats.ok()) << again.stats.status().message();
  store::Manifest m = ReadManifest(Options().store_dir, "mallory");
  std::vector<BlockHash> names = computed_names(m);
  for (size_t i = 0; i < m.blocks.size(); ++i) EXPECT_NE(m.blocks[i], names[i]) << "block " << i;
  // The cache dropped and rebuilt from its tokens: computed rows, computed names.
  ASSERT_TRUE((*engine)->EraseCache("mallory").ok());
  TurnOutcome rebuilt = RunTurn(**engine, "mallory", " Bye.");
  ASSERT_TRUE(rebuilt.stats.ok()) << rebuilt.stats.status().message();
  m = ReadManifest(Options().store_dir, "mallory");
  names = computed_names(m);
  ASSERT_GE(m.blocks.size(), 1u);
  for (size_t i = 0; i < m.blocks.size(); ++i) EXPECT_EQ(m.blocks[i], names[i]) << "block " << i;
}

// An import whose token ids or conversation no export of this model would have is refused,
// naming the entry, and the agent keeps its cache (its export is unchanged).
TEST_F(EngineExportTest, ImportRefusesTokensOutsideTheVocabularyAndUnknownRoles) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();
  // The unchanged file through the same rewrite still imports: the edits below are the cause.
  const nlohmann::json meta = HeaderOf(*exported)["__metadata__"];
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
  // A conversation no context holds (no later turn could run): refused, whether its bytes alone
  // say so or its tokens do.
  const int64_t n_ctx = (*engine)->ModelInfo()["n_ctx"].get<int64_t>();
  std::string many_tokens;
  for (int64_t i = 0; i < n_ctx; ++i) many_tokens += " Lily ran";
  for (const std::string& text : {std::string(5000000, 'a'), many_tokens}) {
    conversation = nlohmann::json::parse(meta["conversation"].get<std::string>());
    conversation[0]["text"] = text;
    s = (*engine)->ImportCache("alice", WithMetadata(*exported, "conversation", conversation.dump()));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("no turn could follow it"), std::string::npos) << s.message();
  }
  EXPECT_TRUE((*engine)->ExportCache("alice").value() == *exported);
}

// kv.safetensors: export, erase the cache, import it back: the next turn reuses the imported
// KV and still matches an uncached run. Bad files change nothing.
TEST_F(EngineExportTest, ExportImportRoundTrip) {
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
  // The erased blocks are gone, so nothing vouches for the file's: they are named apart from
  // the computed ones (AnImportsBlocksNeverStandInForComputedOnes), as many as before.
  const std::vector<BlockHash> imported = ReadManifest(Options().store_dir, "alice").blocks;
  EXPECT_EQ(imported.size(), before.blocks.size());
  for (size_t i = 0; i < std::min(imported.size(), before.blocks.size()); ++i) EXPECT_NE(imported[i], before.blocks[i]);
  EXPECT_TRUE((*engine)->ExportCache("alice").value() == *exported);
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
TEST_F(EngineExportTest, ExportSizeIsTheSizeOfTheExport) {
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
TEST_F(EngineExportTest, ExportSizeIsTheSizeOfTheExportDuringATurn) {
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
TEST_F(EngineExportTest, ImportIntoAnotherAgentExtendsTheImportedText) {
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
  // A clone of a cache the engine holds shares its blocks (byte for byte the same).
  EXPECT_EQ(ReadManifest(Options().store_dir, "bob").blocks, ReadManifest(Options().store_dir, "alice").blocks);
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
TEST_F(EngineExportTest, ExportImportRoundTripAfterAFormatChange) {
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

// An export running while its agent is erased holds the agent's blocks for a moment, so the
// erasure cannot drop them then; they must still be gone from memory once both are done.
TEST_F(EngineExportTest, ExportRacingAnErasureLeavesNoBlockInMemory) {
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
