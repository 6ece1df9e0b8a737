// CacheStore commits that meet a full disk, a failing disk or a block lost since: what a turn
// asks for, what a failure leaves, and what an edit keeps.
#include <algorithm>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "engine/store/block_file.h"
#include "engine/store/cache_store.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

using testing::AgentState;
using testing::Commit;
using testing::LoadedIs;
using testing::SimAgent;
using testing::kFingerprint;
using testing::OpenOk;
using testing::Range;

TEST(StoreCache, TurnThatCannotFitFailsBeforeWriting) {
  FaultInjectingFileSystem fs;
  auto store = OpenOk("/store", fs);
  SimAgent a("a");
  AgentState s1 = a.Extend(Range(1, 10), "a");
  ASSERT_TRUE(Commit(*store, s1).ok());
  fs.SetFreeBytes(1000);
  fs.ResetOpCount();
  auto r = Commit(*store, a.Extend(Range(20, 10), "b"));
  EXPECT_EQ(r.status().code(), StatusCode::kNoSpace);
  EXPECT_EQ(fs.op_count(), 0u);  // nothing was touched
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), s1));
}

// The space a turn asks for is what it writes (its new files in whole allocation units), not a
// bound that grows with the conversation: a long agent's turn that fits with room to spare is
// not refused. (The bound was 64 bytes a token and four a character of text: 2-4 times what a
// turn wrote, so long conversations lost their turns first on a nearly full disk.)
TEST(StoreCache, ATurnThatFitsIsNotRefusedForSpace) {
  FaultInjectingFileSystem fs;
  constexpr uint64_t kLarge = uint64_t{1} << 40;
  fs.SetCapacity(kLarge);
  auto store = OpenOk("/store", fs);
  SimAgent a("a", /*block_size=*/64);
  ASSERT_TRUE(Commit(*store, a.Extend(Range(1, 3000), std::string(20000, 'x'))).ok());
  const uint64_t used = kLarge - *fs.FreeBytes("/store");
  const AgentState next = a.Extend(Range(5000, 10), "a short turn");
  // At most a block and a tail, and a manifest of 47 block names, 3010 tokens and the text: some
  // 50 KB in all, which the old bound put at about 480 KB.
  const uint64_t writes = 128 * 1024;
  fs.SetCapacity(used + writes);
  auto r = Commit(*store, next);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), next));
}

// An edit (config.json, system: a manifest and no KV data) of an agent whose stored block was
// dropped since (it failed its checksum) is stored, naming the blocks before it; the tokens stay
// for the next turn to recompute from. (It was refused, "manifest names block ..., which is
// neither stored nor new", for every edit until a turn rebuilt the cache.)
TEST(StoreCache, AnEditAfterADroppedBlockIsStored) {
  testing::QuietLogs quiet;
  FaultInjectingFileSystem fs;
  auto store = OpenOk("/store", fs);
  SimAgent a("a");
  const AgentState s = a.Extend(Range(1, 14), "three blocks and a tail");
  ASSERT_TRUE(Commit(*store, s).ok());
  ASSERT_EQ(s.manifest.blocks.size(), 3u);
  std::string block_file;
  for (const std::string& f : fs.ListFilesRecursive("/store"))
    if (f.find(ToHex(s.manifest.blocks[1])) != std::string::npos) block_file = f;
  ASSERT_FALSE(block_file.empty());
  ASSERT_TRUE(fs.WriteFile(block_file, std::vector<uint8_t>(64, 7)).ok());
  EXPECT_EQ(store->ReadBlock(s.manifest.blocks[1]).status().code(), StatusCode::kCorrupt);  // dropped
  Manifest edited = s.manifest;
  edited.conversation.push_back({"system", "an edit"});
  auto r = store->CommitTurn("a", edited, {}, std::nullopt, /*keep_tail=*/true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto loaded = store->LoadAgent("a", kFingerprint);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->manifest.blocks, std::vector<BlockHash>{s.manifest.blocks[0]});
  EXPECT_FALSE(loaded->manifest.tail.has_value());
  EXPECT_EQ(loaded->manifest.tokens, s.manifest.tokens);
  EXPECT_EQ(loaded->manifest.conversation, edited.conversation);
}

// A commit that fails at any step leaves no block file that no manifest names (they hold an
// agent's attention state, and an erasure finds only what a manifest names): after each failure
// the stored blocks are exactly the previous turn's, and an erasure leaves no block at all.
TEST(StoreCache, FailedCommitLeavesNoBlockBehind) {
  testing::QuietLogs quiet;
  for (uint64_t k = 0;; ++k) {
    FaultInjectingFileSystem fs;
    auto store = OpenOk("/store", fs);
    SimAgent a("a");
    const AgentState s1 = a.Extend(Range(1, 6), "one block and a tail");
    ASSERT_TRUE(Commit(*store, s1).ok());
    fs.FailAt(fs.op_count() + k, StatusCode::kNoSpace);
    if (Commit(*store, a.Extend(Range(20, 13), "three more blocks")).ok()) {
      ASSERT_GT(k, 8u) << "the commit should take more operations than that";
      break;
    }
    std::set<std::string> expected;
    for (const BlockHash& h : s1.manifest.blocks) expected.insert(ToHex(h));
    std::set<std::string> stored;
    for (const std::string& f : fs.ListFilesRecursive("/store/blocks"))
      stored.insert(f.substr(f.rfind('/') + 1, 32));
    EXPECT_EQ(stored, expected) << "failing operation " << k;
    EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), s1)) << "failing operation " << k;
    ASSERT_TRUE(store->EraseAgent("a").ok());
    EXPECT_TRUE(fs.ListFilesRecursive("/store/blocks").empty()) << "failing operation " << k;
  }
}

// keep_tail (an edit of the agent's settings): the stored tail stays while the tokens still end
// with it; otherwise the agent has no tail, as without keep_tail.
TEST(StoreCache, EditKeepsTheTailWhileTheTokensEndWithIt) {
  FaultInjectingFileSystem fs;
  auto store = OpenOk("/store", fs);
  SimAgent a("a");
  AgentState s1 = a.Extend(Range(1, 6), "one block and a tail");
  ASSERT_TRUE(Commit(*store, s1).ok());
  Manifest edited = s1.manifest;
  edited.config["max_tokens"] = 12;
  auto r = store->CommitTurn("a", edited, {}, std::nullopt, /*keep_tail=*/true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->manifest.tail.has_value());
  EXPECT_EQ(r->manifest.tail->n_tokens, 2u);
  auto loaded = store->LoadAgent("a", kFingerprint);
  ASSERT_TRUE(loaded.ok());
  EXPECT_FALSE(loaded->rebuild_from_block.has_value());
  ASSERT_TRUE(loaded->tail.has_value());
  EXPECT_EQ(*loaded->tail, s1.tail);
  EXPECT_EQ(loaded->manifest.config["max_tokens"], 12);
  // After a reopen too (the kept file is not collected as an orphan).
  store.reset();
  store = OpenOk("/store", fs);
  EXPECT_TRUE(store->LoadAgent("a", kFingerprint)->tail.has_value());
  // Tokens that no longer end with the tail: it goes.
  Manifest shorter = s1.manifest;
  shorter.tokens.pop_back();
  r = store->CommitTurn("a", shorter, {}, std::nullopt, /*keep_tail=*/true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->manifest.tail.has_value());
  for (const std::string& f : fs.ListFilesRecursive("/store/agents/a")) EXPECT_EQ(f.find("tail"), std::string::npos) << f;
}

}  // namespace
}  // namespace kvfs::store
