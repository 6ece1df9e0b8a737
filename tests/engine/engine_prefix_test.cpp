// Shared prefixes in the Engine on the real stories260K model: they persist across restarts
// (blocks loaded from the store, or prefilled again when it lacks them), a rewrite keeps the old
// one until the new one is stored, and a damaged record can be erased or written anew.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "tests/engine/engine_test_util.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

namespace fs = std::filesystem;
using testing::BlockFiles;
using testing::kTurns;
using testing::ReadManifest;
using testing::RunTurn;
using testing::TurnOutcome;

using EngineTest = testing::EngineTestBase;

// .prefixes/ entries persist: a restarted engine lists them with their text and owner, loads
// their blocks from the store (no prefill), and an agent of any uid reuses them; a prefix whose
// blocks are gone is prefilled again; removing one erases its record and its blocks.
TEST_F(EngineTest, PrefixesPersistAcrossRestart) {
  const std::string prefix = std::string(kTurns[0]) + kTurns[1] + kTurns[2];  // > 32 tokens: 2+ blocks of 16
  const fs::path store = dir_ / "store";
  size_t prefix_blocks = 0;
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->AddPrefix("story.txt", prefix, 1000).ok());
    EXPECT_EQ((*engine)->AddPrefix("story.txt", "again", 1000).code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE((*engine)->AddPrefix(".hidden", "x", 1000).ok());
    ASSERT_TRUE(fs::exists(store / "prefixes" / "story.txt.prefix"));
    prefix_blocks = BlockFiles(store);
    EXPECT_GE(prefix_blocks, 2u);
  }
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "restart" : "restart with the blocks gone");
    if (round == 1) {
      for (auto& e : fs::recursive_directory_iterator(store / "blocks"))
        if (e.is_regular_file()) fs::remove(e.path());
    }
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    EXPECT_EQ((*engine)->ListPrefixes(), std::vector<std::string>{"story.txt"});
    auto text = (*engine)->PrefixText("story.txt");
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, prefix);
    EXPECT_EQ((*engine)->PrefixOwner("story.txt"), 1000u);
    const EngineStatus st = (*engine)->Stats();
    if (round == 0) {
      EXPECT_GT(st.reload_bytes, 0u);  // loaded from the store, not prefilled
    } else {
      EXPECT_EQ(st.reload_bytes, 0u);  // nothing to load: prefilled, and stored again
      EXPECT_EQ(BlockFiles(store), prefix_blocks);
    }
    // An agent of another uid whose context starts with the prefix reuses its blocks, and
    // replies as an uncached run does.
    const std::string agent = "a" + std::to_string(round);
    ASSERT_TRUE((*engine)->CreateAgent(agent, 2000 + round).ok());
    Greedy(**engine, agent);
    TurnOutcome out = RunTurn(**engine, agent, prefix + " The dog ran away.");
    ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
    EXPECT_GE(out.stats->reused_tokens, static_cast<int64_t>(16 * prefix_blocks));
    EXPECT_EQ(out.reply, Reference(ReadManifest(Options().store_dir, agent), *out.stats, 20));
    ASSERT_TRUE((*engine)->EraseAgent(agent).ok());
    EXPECT_EQ(BlockFiles(store), prefix_blocks);  // the prefix still holds its blocks
  }
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    auto removed = (*engine)->RemovePrefix("story.txt");
    ASSERT_TRUE(removed.ok()) << removed.status().message();
    EXPECT_GE(removed->blocks_freed, prefix_blocks);
    EXPECT_FALSE(fs::exists(store / "prefixes" / "story.txt.prefix"));
    EXPECT_EQ(BlockFiles(store), 0u);
    EXPECT_TRUE((*engine)->ListPrefixes().empty());
    EXPECT_EQ((*engine)->Stats().memory_used_bytes, 0);
  }
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  EXPECT_TRUE((*engine)->ListPrefixes().empty());
}

// Agents whose KV format is not the daemon's share a prefix too: the first one whose context
// starts with it computes it (reusing nothing), copies of its blocks are pinned as the prefix's
// in that format, and the next agent, of another uid, reuses them; both reply as an uncached run
// in that format does.
// Erasing the agents leaves on disk only the prefix's own blocks; removing the prefix unpins it
// in every format, leaving no memory in use.
TEST_F(EngineTest, AgentsInAnotherKvFormatSharePrefixes) {
  const std::string prefix = std::string(kTurns[0]) + kTurns[1] + kTurns[2];  // 2+ blocks of 16
  const fs::path store = dir_ / "store";
  auto engine = CreateEngine(Options());  // the daemon's format: f16
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->AddPrefix("story.txt", prefix, 1000).ok());
  const size_t prefix_blocks = BlockFiles(store);
  ASSERT_GE(prefix_blocks, 2u);
  int64_t reused[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const std::string agent = i == 0 ? "bob" : "carol";
    ASSERT_TRUE((*engine)->CreateAgent(agent, 2000 + i).ok());
    Greedy(**engine, agent, "q8");
    TurnOutcome out = RunTurn(**engine, agent, prefix + " The dog ran away.");
    ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
    reused[i] = out.stats->reused_tokens;
    kv_ = "q8";  // the reference runs in the agents' format
    EXPECT_EQ(out.reply, Reference(ReadManifest(Options().store_dir, agent), *out.stats, 20)) << agent;
    kv_ = "f16";
  }
  EXPECT_EQ(reused[0], 0);
  EXPECT_GE(reused[1], static_cast<int64_t>(16 * prefix_blocks));
  ASSERT_TRUE((*engine)->EraseAgent("bob").ok());
  ASSERT_TRUE((*engine)->EraseAgent("carol").ok());
  EXPECT_EQ(BlockFiles(store), prefix_blocks);
  auto removed = (*engine)->RemovePrefix("story.txt");
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_GE(removed->blocks_freed, 2 * prefix_blocks);  // f16 and q8
  EXPECT_EQ(BlockFiles(store), 0u);
  EXPECT_EQ((*engine)->Stats().memory_used_bytes, 0);
}

// Rewriting a prefix puts the new text in place only once it is stored: a text that cannot be
// added (longer than the context) leaves the old prefix, its record and its blocks as they were;
// a good one replaces the record, erases the blocks only the old text had, and is what a
// restarted engine finds.
TEST_F(EngineTest, ReplacingAPrefixKeepsTheOldOneUntilTheNewOneIsStored) {
  const std::string old_text = std::string(kTurns[0]) + kTurns[1] + kTurns[2];  // 2+ blocks of 16
  const std::string new_text = "Long ago, a small boy named Tom lived by the sea with his old grey cat.";
  const fs::path store = dir_ / "store";
  const fs::path record = store / "prefixes" / "story.txt.prefix";
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->AddPrefix("story.txt", old_text, 1000).ok());
    const std::string old_record = testing::ReadFile(record);
    const size_t old_blocks = BlockFiles(store);
    ASSERT_GE(old_blocks, 2u);
    std::string too_long;
    while (too_long.size() < 100000) too_long += " dog";
    auto failed = (*engine)->ReplacePrefix("story.txt", too_long, 1001);
    EXPECT_EQ(failed.status().code(), StatusCode::kOutOfRange) << failed.status().message();
    EXPECT_EQ(*(*engine)->PrefixText("story.txt"), old_text);
    EXPECT_EQ((*engine)->PrefixOwner("story.txt"), 1000u);
    EXPECT_EQ(testing::ReadFile(record), old_record);
    EXPECT_EQ(BlockFiles(store), old_blocks);
    EXPECT_EQ((*engine)->ReplacePrefix("other.txt", new_text, 1000).status().code(), StatusCode::kNotFound);

    auto replaced = (*engine)->ReplacePrefix("story.txt", new_text, 1001);
    ASSERT_TRUE(replaced.ok()) << replaced.status().message();
    EXPECT_EQ(*(*engine)->PrefixText("story.txt"), new_text);
    EXPECT_EQ((*engine)->PrefixOwner("story.txt"), 1001u);
    EXPECT_NE(testing::ReadFile(record).find(new_text), std::string::npos);
    // The texts differ from their first token: every old block is erased, in memory and on
    // disk, and the new text's blocks are stored.
    EXPECT_EQ(replaced->blocks_freed, old_blocks);
    EXPECT_EQ(replaced->files_removed, old_blocks);
    EXPECT_GE(BlockFiles(store), 1u);
  }
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->ListPrefixes(), std::vector<std::string>{"story.txt"});
  EXPECT_EQ(*(*engine)->PrefixText("story.txt"), new_text);
  EXPECT_EQ((*engine)->PrefixOwner("story.txt"), 1001u);
  ASSERT_TRUE((*engine)->RemovePrefix("story.txt").ok());
  EXPECT_EQ(BlockFiles(store), 0u);
}

// A prefix whose saved record is damaged is listed, owned by root, refuses to be read, and can be
// erased (its blocks go with it) or written anew.
TEST_F(EngineTest, UnreadablePrefixIsListedAndCanBeErasedOrRewritten) {
  const std::string prefix = std::string(kTurns[0]) + kTurns[1] + kTurns[2];  // > 32 tokens: 2+ blocks of 16
  const fs::path store = dir_ / "store";
  const fs::path record = store / "prefixes" / "story.txt.prefix";
  for (const bool rewrite : {false, true}) {
    SCOPED_TRACE(rewrite ? "written anew" : "erased");
    {
      auto engine = CreateEngine(Options());
      ASSERT_TRUE(engine.ok());
      ASSERT_TRUE((*engine)->AddPrefix("story.txt", prefix, 1000).ok());
    }
    ASSERT_GE(BlockFiles(store), 2u);
    std::string bytes = testing::ReadFile(record);
    const size_t at = bytes.find("\"text\":\"") + 8;
    bytes[at] = bytes[at] == 'x' ? 'y' : 'x';  // one letter of the text: valid JSON, wrong checksum
    std::ofstream(record, std::ios::binary | std::ios::trunc) << bytes;

    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    EXPECT_EQ((*engine)->ListPrefixes(), std::vector<std::string>{"story.txt"});
    const auto text = (*engine)->PrefixText("story.txt");
    EXPECT_EQ(text.status().code(), StatusCode::kIoError);
    EXPECT_NE(text.status().message().find("checksum"), std::string::npos) << text.status().message();
    EXPECT_EQ((*engine)->PrefixOwner("story.txt"), 0u);
    EXPECT_EQ(testing::ReadFile(record), bytes);  // left as it was until the user acts
    auto removed = (*engine)->RemovePrefix("story.txt");
    ASSERT_TRUE(removed.ok()) << removed.status().message();
    EXPECT_FALSE(fs::exists(record));
    EXPECT_EQ(BlockFiles(store), 0u);  // the blocks only the damaged record named are collected
    if (rewrite) {
      ASSERT_TRUE((*engine)->AddPrefix("story.txt", prefix, 1000).ok());
      EXPECT_EQ(*(*engine)->PrefixText("story.txt"), prefix);
      EXPECT_GE(BlockFiles(store), 2u);
      ASSERT_TRUE((*engine)->RemovePrefix("story.txt").ok());
    }
    EXPECT_TRUE((*engine)->ListPrefixes().empty());
  }
}

// A prefix a restarted daemon cannot hold (longer than its smaller context) is not dropped: it is
// listed with its text and owner, its record stays, no agent shares it, and a daemon that can
// hold it uses it again. Only rm erases it.
TEST_F(EngineTest, APrefixTheDaemonCannotHoldIsKeptUntilOneCan) {
  const std::string prefix = std::string(kTurns[0]) + kTurns[1] + kTurns[2];  // > 32 tokens: 2+ blocks of 16
  const fs::path record = dir_ / "store" / "prefixes" / "story.txt.prefix";
  {
    auto engine = CreateEngine(Options());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->AddPrefix("story.txt", prefix, 1000).ok());
  }
  const std::string saved = testing::ReadFile(record);
  {
    EngineOptions small = Options();
    small.n_ctx = 16;
    auto engine = CreateEngine(small);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    EXPECT_EQ((*engine)->ListPrefixes(), std::vector<std::string>{"story.txt"});
    EXPECT_EQ(*(*engine)->PrefixText("story.txt"), prefix);
    EXPECT_EQ((*engine)->PrefixOwner("story.txt"), 1000u);
    EXPECT_EQ((*engine)->Stats().memory_used_bytes, 0);  // nothing pinned
  }
  EXPECT_EQ(testing::ReadFile(record), saved);
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  EXPECT_GT((*engine)->Stats().reload_bytes, 0u);  // its blocks, loaded from the store
  ASSERT_TRUE((*engine)->CreateAgent("a", 2000).ok());
  Greedy(**engine, "a");
  TurnOutcome out = RunTurn(**engine, "a", prefix + " The dog ran away.");
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
  EXPECT_GE(out.stats->reused_tokens, 32);
  ASSERT_TRUE((*engine)->RemovePrefix("story.txt").ok());
  EXPECT_FALSE(fs::exists(record));
}

// Blocks computed for a prefix live on in the agents that used it, but once the prefix is removed
// they are shared no more: an agent of another uid with the same text computes its own.
// A prefix spelled with the BOS token's text in front, as a chat template's markup starts, is
// the prefix the context gets (the tokenizer adds BOS to contexts): shared across uids.
TEST_F(EngineTest, APrefixSpelledWithItsBosTextIsShared) {
  const std::string prefix = std::string(kTurns[0]) + kTurns[1] + kTurns[2];
  const Tokenizer& tok = model_->tokenizer();
  ASSERT_TRUE(tok.add_bos());
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->AddPrefix("story.txt", std::string(tok.token_text(tok.bos())) + prefix, 0).ok());
  ASSERT_TRUE((*engine)->CreateAgent("user", 2000).ok());
  Greedy(**engine, "user");
  TurnOutcome used = RunTurn(**engine, "user", prefix + " The dog ran away.");
  ASSERT_TRUE(used.stats.ok()) << used.stats.status().message();
  EXPECT_GE(used.stats->reused_tokens, 32);
  EXPECT_EQ(used.reply, Reference(ReadManifest(Options().store_dir, "user"), *used.stats, 20));
}

// Prefixes pin their blocks: they may take at most half the KV budget (ENOSPC past it), so that
// turns always have room; the turn that cannot fit says what the prefixes pin.
TEST_F(EngineTest, PrefixesPinAtMostHalfTheKvBudget) {
  const std::string prefix = std::string(kTurns[0]) + kTurns[1] + kTurns[2];  // 2+ blocks of 16
  const int64_t block_bytes = KvLayoutFor(model_->hparams(), Format(kv_), block_tokens_).block_bytes();
  const int64_t blocks = static_cast<int64_t>(model_->tokenizer().Encode(prefix, true, true).size()) / block_tokens_;
  ASSERT_GE(blocks, 2);
  {
    auto engine = CreateEngine(Options(2 * blocks * block_bytes - 1));  // half is one byte short
    ASSERT_TRUE(engine.ok());
    const Status refused = (*engine)->AddPrefix("story.txt", prefix, 0);
    EXPECT_EQ(refused.code(), StatusCode::kNoSpace) << refused.message();
    EXPECT_NE(refused.message().find("at most half"), std::string::npos) << refused.message();
    EXPECT_TRUE((*engine)->ListPrefixes().empty());
  }
  auto engine = CreateEngine(Options(2 * blocks * block_bytes));
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->AddPrefix("story.txt", prefix, 0).ok());
  // Replacing it counts the new text only (not the old one besides); a second prefix as large
  // does not fit.
  const auto replaced = (*engine)->ReplacePrefix("story.txt", prefix, 0);
  ASSERT_TRUE(replaced.ok()) << replaced.status().message();
  EXPECT_EQ((*engine)->AddPrefix("again.txt", prefix, 0).code(), StatusCode::kNoSpace);
  ASSERT_TRUE((*engine)->CreateAgent("user", 0).ok());
  Greedy(**engine, "user");
  // A turn longer than what the prefix leaves fails, saying what the prefix pins.
  TurnOutcome too_long = RunTurn(**engine, "user", prefix + " The dog ran away to the park and played.");
  ASSERT_FALSE(too_long.stats.ok());
  EXPECT_NE(too_long.stats.status().message().find("besides the " + std::to_string(blocks * block_bytes) +
                                                   " bytes .prefixes/ pins"),
            std::string::npos)
      << too_long.stats.status().message();
}

// The half of the budget counts a prefix's copies in other KV formats too: a copy that would
// not fit is not made (agents in that format prefill the prefix themselves). A daemon restarted
// with a smaller budget pins the prefixes that fit in name order and keeps the rest unshared.
TEST_F(EngineTest, PrefixCopiesAndARestartWithASmallerBudgetStayWithinHalfOfIt) {
  const std::string first = std::string(kTurns[0]) + kTurns[1] + kTurns[2];  // 2+ blocks of 16
  const std::string second =
      "Tom had a red ball. He threw it high into the sky and ran after it all day long. At night he put it "
      "under his bed and dreamed of the sky.";
  const int64_t block_bytes = KvLayoutFor(model_->hparams(), Format(kv_), block_tokens_).block_bytes();
  auto blocks_of = [&](const std::string& text) {
    return static_cast<int64_t>(model_->tokenizer().Encode(text, true, true).size()) / block_tokens_;
  };
  ASSERT_GE(blocks_of(first), 2);
  ASSERT_GE(blocks_of(second), 1);
  // "a.txt" takes a third; its q8 copy or "b.txt" besides would take more than half.
  const int64_t budget = 3 * blocks_of(first) * block_bytes;
  const int64_t q8_block_bytes = KvLayoutFor(model_->hparams(), Format("q8"), block_tokens_).block_bytes();
  ASSERT_GT(blocks_of(first) * (block_bytes + q8_block_bytes), budget / 2);
  ASSERT_GT((blocks_of(first) + blocks_of(second)) * block_bytes, budget / 2);
  {
    auto engine = CreateEngine(Options(budget));
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->AddPrefix("a.txt", first, 0).ok());
    EXPECT_EQ((*engine)->Stats().memory_used_bytes, blocks_of(first) * block_bytes);
    for (const char* agent : {"bob", "carol"}) {
      ASSERT_TRUE((*engine)->CreateAgent(agent, agent[0] == 'b' ? 2000 : 2001).ok());  // (uids share no blocks)
      Greedy(**engine, agent, "q8");
      TurnOutcome out = RunTurn(**engine, agent, first + " The dog ran away.");
      ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
      EXPECT_EQ(out.stats->reused_tokens, 0) << agent << ": no q8 copy of the prefix fits beside it";
    }
  }
  {
    auto engine = CreateEngine(Options());  // no budget: both fit
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->AddPrefix("b.txt", second, 0).ok());
  }
  auto engine = CreateEngine(Options(budget));
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->ListPrefixes(), (std::vector<std::string>{"a.txt", "b.txt"}));
  EXPECT_EQ(*(*engine)->PrefixText("b.txt"), second);
  EXPECT_EQ((*engine)->Stats().memory_used_bytes, blocks_of(first) * block_bytes) << "a.txt pinned, b.txt kept";
  // Turns have their half: one as long as b.txt and a bit runs beside a.txt (before, b.txt was
  // pinned too, and it failed for want of room).
  ASSERT_TRUE((*engine)->CreateAgent("dave", 0).ok());
  Greedy(**engine, "dave", "q8");
  TurnOutcome out = RunTurn(**engine, "dave", second + " The end.");
  ASSERT_TRUE(out.stats.ok()) << out.stats.status().message();
}

TEST_F(EngineTest, ARemovedPrefixIsNoLongerSharedAcrossUids) {
  const std::string prefix = std::string(kTurns[0]) + kTurns[1] + kTurns[2];  // > 32 tokens: 2+ blocks of 16
  auto engine = CreateEngine(Options());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->AddPrefix("story.txt", prefix, 0).ok());
  ASSERT_TRUE((*engine)->CreateAgent("user", 2000).ok());
  Greedy(**engine, "user");
  TurnOutcome used = RunTurn(**engine, "user", prefix + " The dog ran away.");
  ASSERT_TRUE(used.stats.ok()) << used.stats.status().message();
  EXPECT_GE(used.stats->reused_tokens, 32);  // shared while the prefix is there
  ASSERT_TRUE((*engine)->RemovePrefix("story.txt").ok());
  ASSERT_TRUE((*engine)->CreateAgent("stranger", 3000).ok());
  Greedy(**engine, "stranger");
  TurnOutcome alone = RunTurn(**engine, "stranger", prefix + " The cat sat down.");
  ASSERT_TRUE(alone.stats.ok()) << alone.stats.status().message();
  EXPECT_EQ(alone.stats->reused_tokens, 0);
  EXPECT_EQ(alone.reply, Reference(ReadManifest(Options().store_dir, "stranger"), *alone.stats, 20));
}

}  // namespace
}  // namespace kvfs
