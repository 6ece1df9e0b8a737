// The Engine with q4k agents (keys per channel in chunks of 64 tokens, the incomplete chunk's
// keys staged in f16 with the tail block): every turn's greedy reply equals an uncached q4k run
// of the same tokens, hot, across restarts (tail file reloaded, staged rows included), under a
// budget that forces evictions, after a DIVERGE that cuts a complete chunk, for agents that
// share blocks, for mixed formats decoded in one batch, and after export/import. Tail sizes are
// checked against the layout computed here from the model's dimensions.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/model/quants.h"
#include "engine/runtime/engine.h"
#include "engine/store/safetensors.h"
#include "tests/engine/engine_test_util.h"

namespace kvfs {
namespace {

namespace fs = std::filesystem;
using testing::ReadManifest;
using testing::RunTurn;
using testing::TurnOutcome;
using testing::ExpectReloadsShown;

constexpr int64_t kChunk = 64;  // q4k's K chunk

class EngineQ4kTest : public testing::EngineTestBase {
 protected:
  EngineQ4kTest() {
    kv_ = "q4k";
    block_tokens_ = 128;  // two K chunks per block
  }

  // Bytes of a q4k tail of n tokens on disk, from the format's description (kv_format.h,
  // kv_payload_layout.h): per layer n/64 K chunks of nv records (f16 scale, f16 min, 32 bytes)
  // and n V rows (D, M, a 5-byte field group per 4 sub-blocks, nv/2 bytes of nibbles), then
  // per layer n % 64 staged f16 K rows.
  int64_t TailBytes(int64_t n) const {
    const HParams& hp = model_->hparams();
    const int64_t nv = hp.n_head_kv * hp.head_dim, S = Format("q4k").group;
    const int64_t v_row = 4 + 5 * ((nv / S + 3) / 4) + nv / 2;
    return hp.n_layer * ((n / kChunk) * nv * (4 + kChunk / 2) + n * v_row + (n % kChunk) * nv * 2);
  }

  // The raw payload size in a tail file's header (block_format.h: offset 32, little-endian).
  static uint64_t TailFilePayload(const fs::path& file) {
    std::ifstream f(file, std::ios::binary);
    char h[40] = {};
    f.read(h, sizeof h);
    uint64_t raw = 0;
    std::memcpy(&raw, h + 32, 8);
    return raw;
  }
};

// A long first turn (several chunks), then short turns: conversation lengths that are not
// multiples of 64, so every commit parks and persists a tail with staged K rows.
const char* kTurns[] = {
    "Once upon a time, there was a little girl named Lily. She liked to play outside in the park with her "
    "friends. One day, she saw a big dog near the swings and she was a little scared of it.",
    " The dog wagged its tail.", " Lily smiled and said hello to the dog."};

// Text of well over one 128-token block.
std::string LongText() {
  return std::string(kTurns[0]) +
         " Her mom told her that the dog was friendly and that she could pet it if she was gentle. Lily walked up "
         "to the dog slowly and held out her hand. The dog sniffed it and licked her fingers, and Lily laughed. "
         "From that day on, Lily and the dog played together in the park every afternoon until the sun went down.";
}

TEST_F(EngineQ4kTest, TurnsMatchUncachedRunsAcrossRestartAndEviction) {
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode == 0 ? "hot" : mode == 1 ? "restart between turns" : "tiny budget");
    fs::remove_all(dir_ / "store");
    // A few 128-token q4k blocks (~25 KiB each for stories260K): alice's idle blocks must go.
    const int64_t budget = mode == 2 ? 4 * 26 * 1024 : 0;
    auto engine = CreateEngine(Options(budget));
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    ASSERT_TRUE((*engine)->CreateAgent("alice", 1000).ok());
    Greedy(**engine, "alice");
    if (mode == 2) {
      ASSERT_TRUE((*engine)->CreateAgent("bob", 1000).ok());
      Greedy(**engine, "bob");
    }
    bool staged_at_commit = false;
    size_t committed = 0;  // tokens of the previous commit
    for (int t = 0; t < 3; ++t) {
      SCOPED_TRACE(t);
      if (mode == 1 && t > 0) {
        engine->reset();
        engine = CreateEngine(Options());
        ASSERT_TRUE(engine.ok());
      }
      TurnOutcome out = RunTurn(**engine, "alice", kTurns[t]);
      ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
      if (t > 0) {
        // EXTEND keeps the whole previous context: complete chunks and staged rows alike.
        EXPECT_EQ(out.stats->match, "extend");
        EXPECT_EQ(out.stats->reused_tokens, static_cast<int64_t>(committed));
      }
      const store::Manifest m = ReadManifest(Options().store_dir, "alice");
      committed = m.tokens.size();
      EXPECT_EQ(out.reply, Reference(m, *out.stats, 20));
      // The tail on disk holds its staged rows: the file's payload is the full packed size.
      const int64_t n_tail = static_cast<int64_t>(m.tokens.size()) % block_tokens_;
      if (n_tail > 0) {
        ASSERT_TRUE(m.tail.has_value());
        EXPECT_EQ(m.tail->n_tokens, n_tail);
        EXPECT_EQ(TailFilePayload(dir_ / "store" / "agents" / "alice" / m.tail->file), static_cast<uint64_t>(TailBytes(n_tail)));
        staged_at_commit = staged_at_commit || n_tail % kChunk != 0;
      }
      if (mode == 2) {
        ASSERT_TRUE(RunTurn(**engine, "bob", "A cat and a dog played in the sun all day long, and then they slept.").stats.ok());
      }
    }
    EXPECT_TRUE(staged_at_commit) << "no commit left staged rows: the test does not cover them";
    ExpectReloadsShown((*engine)->Stats(), mode, budget);
  }
}

// DIVERGE inside a complete chunk: a long system prompt changed at its end. The cache is kept
// only up to the chunk boundary below the first differing token (a cut inside a chunk would
// re-quantize its keys), and the reply matches an uncached run.
TEST_F(EngineQ4kTest, DivergeInsideACompleteChunkResumesAtItsStart) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  const std::string system = LongText();
  ASSERT_TRUE((*engine)->SetSystem("alice", system).ok());
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[1]).stats.ok());
  const store::Manifest first = ReadManifest(Options().store_dir, "alice");
  ASSERT_GT(first.tokens.size(), static_cast<size_t>(2 * kChunk));
  std::string changed = system;
  changed.replace(changed.find("every afternoon"), 15, "every morning");
  ASSERT_TRUE((*engine)->SetSystem("alice", changed).ok());
  TurnOutcome out = RunTurn(**engine, "alice", kTurns[2]);
  ASSERT_TRUE(out.stats.ok());
  EXPECT_EQ(out.stats->match, "diverge");
  const store::Manifest m = ReadManifest(Options().store_dir, "alice");
  size_t common = 0;
  while (common < first.tokens.size() && common < m.tokens.size() && first.tokens[common] == m.tokens[common]) ++common;
  ASSERT_GT(common % kChunk, 0u) << "the divergence should fall inside a chunk: " << common << " of " << first.tokens.size();
  EXPECT_EQ(out.stats->reused_tokens, static_cast<int64_t>(common / kChunk * kChunk));
  EXPECT_EQ(out.reply, Reference(m, *out.stats, 20));
}

TEST_F(EngineQ4kTest, AgentsOfOneUidShareBlocks) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE((*engine)->CreateAgent(name, 1000).ok());
    Greedy(**engine, name);
  }
  const std::string text = LongText();
  TurnOutcome a = RunTurn(**engine, "a", text);
  TurnOutcome b = RunTurn(**engine, "b", text);
  ASSERT_TRUE(a.stats.ok() && b.stats.ok());
  EXPECT_EQ(a.reply, b.reply);
  EXPECT_EQ(a.stats->reused_tokens, 0);
  EXPECT_GE(b.stats->reused_tokens, block_tokens_);  // b found a's full block
  const store::Manifest ma = ReadManifest(Options().store_dir, "a"), mb = ReadManifest(Options().store_dir, "b");
  ASSERT_GE(ma.blocks.size(), 1u);
  EXPECT_EQ(ma.blocks[0], mb.blocks[0]);
  EXPECT_EQ(b.reply, Reference(mb, *b.stats, 20));
}

// Agents of every format decode together (one forward pass per step); each gets the reply it
// gets alone.
TEST_F(EngineQ4kTest, MixedFormatsBatchedMatchAlone) {
  const std::vector<std::string> prompts = {
      "Once upon a time", "The little dog ran to the park and saw a big red ball.", "Tom",
      "One day, a girl named Sue went to the shop with her mom to buy some bread and milk for dinner.",
      "The sun was hot.", "Ben and Mia played", "A bird sat on a tree and sang a happy song all day.", "Lily"};
  const char* formats[] = {"q4k", "f16", "q8", "q4"};
  auto settings = [&](size_t i) {
    AgentSettings s;
    s.sampling.temperature = 0;
    s.max_tokens = 24;
    s.kv = formats[i % 4];
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
      ASSERT_TRUE((*e)->SetSettings(name, settings(i)).ok());
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
    ASSERT_TRUE((*e)->SetSettings(name, settings(i)).ok());
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
    if (i % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  for (auto& d : done) d.get_future().wait();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outs[i].stats.ok()) << outs[i].stats.status().message();
    EXPECT_EQ(outs[i].reply, alone[i]) << "agent " << i << " (" << formats[i % 4] << ")";
  }
  const EngineStatus st = (*e)->Stats();
  EXPECT_GT(*std::max_element(st.batch_sizes.begin(), st.batch_sizes.end()), 1u);
}

// The raw bytes of one tensor of a kv.safetensors file (read here from the container format).
std::string TensorBytes(const std::string& file, const std::string& name) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const auto header = nlohmann::json::parse(file.substr(8, n));
  if (!header.contains(name)) return {};
  const auto& off = header[name]["data_offsets"];
  return file.substr(8 + n + off[0].get<size_t>(), off[1].get<size_t>() - off[0].get<size_t>());
}

// Export (with staged rows), erase, import into the agent and into another: the next turns
// reuse the imported cache and match uncached runs. The exported staged rows are the f16 keys
// that an uncached forward pass over the same tokens computes.
TEST_F(EngineQ4kTest, ExportImportCarriesStagedRows) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", std::string(kTurns[0]) + kTurns[1]).stats.ok());
  const store::Manifest before = ReadManifest(Options().store_dir, "alice");
  const int64_t n = static_cast<int64_t>(before.tokens.size());
  ASSERT_NE(n % kChunk, 0);
  // Restart: the tail comes back from its file, staged rows included.
  engine->reset();
  engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  auto exported = (*engine)->ExportCache("alice");
  ASSERT_TRUE(exported.ok()) << exported.status().message();

  const HParams& hp = model_->hparams();
  const KvFormat f = Format("q4k");
  const store::KvGeometry geometry{hp.n_layer, hp.n_head_kv, hp.head_dim, "q4k", f.group, f.rotate, f.chunk};
  const std::string fp = (*engine)->ModelInfo()["fingerprint"];
  auto parsed = store::ReadKvSafetensors(*exported, fp, geometry, block_tokens_);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->info.n_cached, n);

  // Independent expectation: the keys of an uncached pass over the same tokens.
  SequenceKv ref(KvLayoutFor(hp, f, block_tokens_), 512);
  std::vector<TokenId> tokens(before.tokens.begin(), before.tokens.end());
  SequenceStep step{&ref, tokens, false};
  Logits logits;
  ASSERT_TRUE(backend_->Forward(std::span<const SequenceStep>(&step, 1), logits).ok());
  const int64_t staged = n % kChunk, nv = hp.n_head_kv * hp.head_dim;
  for (int64_t layer = 0; layer < hp.n_layer; ++layer) {
    const std::string got = TensorBytes(*exported, "layers." + std::to_string(layer) + ".k.staged");
    ASSERT_EQ(got.size(), static_cast<size_t>(staged * nv * 2));
    EXPECT_EQ(std::memcmp(got.data(), ref.k_staging(layer, n - staged), got.size()), 0) << "layer " << layer;
  }

  auto erased = (*engine)->EraseCache("alice");
  ASSERT_TRUE(erased.ok());
  ASSERT_TRUE((*engine)->ImportCache("alice", *exported).ok());
  EXPECT_EQ(ReadManifest(Options().store_dir, "alice").blocks, before.blocks);
  TurnOutcome out = RunTurn(**engine, "alice", kTurns[2]);
  ASSERT_TRUE(out.stats.ok());
  EXPECT_EQ(out.stats->reused_tokens, n);
  EXPECT_EQ(out.reply, Reference(ReadManifest(Options().store_dir, "alice"), *out.stats, 20));

  // Another agent (a q4k one) imports it too: its first turn matches on tokens.
  ASSERT_TRUE((*engine)->CreateAgent("bob", 0).ok());
  Greedy(**engine, "bob");
  ASSERT_TRUE((*engine)->ImportCache("bob", *exported).ok());
  TurnOutcome bob = RunTurn(**engine, "bob", kTurns[2]);
  ASSERT_TRUE(bob.stats.ok());
  EXPECT_EQ(bob.stats->reused_tokens, n);
  EXPECT_EQ(bob.reply, out.reply);

  // A q4 agent refuses a q4k file.
  ASSERT_TRUE((*engine)->CreateAgent("carol", 0).ok());
  AgentSettings s;
  s.kv = "q4";
  ASSERT_TRUE((*engine)->SetSettings("carol", s).ok());
  EXPECT_EQ((*engine)->ImportCache("carol", *exported).code(), StatusCode::kInvalidArgument);
}

// On the Vulkan backend: the same replies as on the CPU, turn after turn (the device encodes the
// chunks and stages the keys the host keeps), after a restart (the stored tail's staged rows
// uploaded), and erasure clears the device copies.
TEST_F(EngineQ4kTest, VulkanBackendRepliesAsTheCpu) {
  ExpectVulkanRepliesAsTheCpu(kTurns, [&] {
    const store::Manifest m = ReadManifest(Options().store_dir, "gpu");
    ASSERT_TRUE(m.tail.has_value());
    EXPECT_NE(m.tail->n_tokens % kChunk, 0) << "the stored tail has no staged rows: the restart does not cover them";
  });
}

// Erasure zeroes and frees every block, the tail (with its staging area) included.
TEST_F(EngineQ4kTest, EraseFreesTailAndBlocks) {
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice");
  ASSERT_TRUE(RunTurn(**engine, "alice", kTurns[0]).stats.ok());
  EXPECT_GT((*engine)->Stats().memory_used_bytes, 0);
  ASSERT_TRUE((*engine)->EraseAgent("alice").ok());
  EXPECT_EQ((*engine)->Stats().memory_used_bytes, 0);
  EXPECT_FALSE(fs::exists(dir_ / "store" / "agents" / "alice"));
}

// Settings: q4k is accepted per agent, and refused where blocks cannot hold whole chunks.
TEST_F(EngineQ4kTest, BlocksMustHoldWholeChunks) {
  EngineOptions o = Options();
  o.block_tokens = 96;
  EXPECT_EQ(CreateEngine(o).status().code(), StatusCode::kInvalidArgument);
  o.kv = "q4";
  auto engine = CreateEngine(o);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  AgentSettings s;
  s.kv = "q4k";
  EXPECT_EQ((*engine)->CheckSettings(s).code(), StatusCode::kInvalidArgument);  // what config.json writes ask
  EXPECT_EQ((*engine)->SetSettings("alice", s).code(), StatusCode::kInvalidArgument);
  s.kv = "q8";
  EXPECT_TRUE((*engine)->CheckSettings(s).ok());
  EXPECT_TRUE((*engine)->SetSettings("alice", s).ok());
}

// The start-up check and the turns agree: the smallest KV budget an engine accepts runs turns
// (q4k's writable block carries the staged keys of its open chunk, more than a full block), and
// one below it is refused at start instead of failing every turn.
TEST_F(EngineQ4kTest, TheSmallestBudgetAcceptedAtStartRunsTurns) {
  int64_t refused = 1, accepted = int64_t{64} << 20;
  ASSERT_TRUE(CreateEngine(Options(accepted)).ok());
  ASSERT_FALSE(CreateEngine(Options(refused)).ok());
  while (accepted - refused > 1) {
    const int64_t mid = refused + (accepted - refused) / 2;
    (CreateEngine(Options(mid)).ok() ? accepted : refused) = mid;
  }
  const KvLayout layout = KvLayoutFor(model_->hparams(), Format("q4k"), block_tokens_);
  EXPECT_GT(accepted, layout.block_bytes());
  auto engine = CreateEngine(Options(accepted));
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->CreateAgent("alice", 0).ok());
  Greedy(**engine, "alice", "q4k", 8);
  for (const char* text : {" The dog wagged its tail.", " Lily smiled.", " The end."}) {
    TurnOutcome out = RunTurn(**engine, "alice", text);
    EXPECT_TRUE(out.stats.ok()) << text << ": " << out.stats.status().message();
  }
  // A format whose writable block this budget cannot hold is refused as a setting (config.json:
  // EINVAL), not taken and then failed at every turn.
  ASSERT_GT(KvLayoutFor(model_->hparams(), Format("f16"), block_tokens_).block_bytes(), accepted);
  AgentSettings s = (*engine)->GetAgent("alice")->settings;
  s.kv = "f16";
  EXPECT_EQ((*engine)->SetSettings("alice", s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->GetAgent("alice")->settings.kv, "q4k");
}

}  // namespace
}  // namespace kvfs
