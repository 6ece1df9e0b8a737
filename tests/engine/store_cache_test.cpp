// CacheStore: round trips, sharing, corruption handling, fingerprints, erasure, concurrency.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "engine/store/cache_store.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

using testing::AgentState;
using testing::Commit;
using testing::ExpectedFiles;
using testing::LoadedIs;
using testing::ListTree;
using testing::SimAgent;
using testing::kFingerprint;
using testing::FixedClock;
using testing::OpenOk;
using testing::Range;
using testing::StoryPrefix;

// The engine stamps an agent when it makes it; the first commit must keep that time, not the
// store's own clock at the commit (a restart would otherwise move created_ms).
TEST(StoreCache, FirstCommitKeepsTheCallersCreationTime) {
  testing::TempDir tmp;
  PosixFileSystem fs;
  const std::string dir = tmp.path() + "/store";
  SimAgent bob("bob");
  AgentState t1 = bob.Extend(Range(100, 10), "hello");
  t1.manifest.created_ms = 1600000000123;  // before the store's fixed clock (1700000000000 on)
  AgentState t2 = bob.Extend(Range(200, 7), "more");
  t2.manifest.created_ms = 1650000000000;  // a later turn cannot move it
  SimAgent carol("carol");
  AgentState c1 = carol.Extend(Range(300, 3), "hi");  // no time given: the store's clock
  auto store = OpenOk(dir, fs);
  auto r1 = Commit(*store, t1);
  ASSERT_TRUE(r1.ok()) << r1.status().message();
  EXPECT_EQ(r1->manifest.created_ms, 1600000000123);
  EXPECT_GE(r1->manifest.updated_ms, 1700000000000);
  auto r2 = Commit(*store, t2);
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  EXPECT_EQ(r2->manifest.created_ms, 1600000000123);
  auto c = Commit(*store, c1);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_GE(c->manifest.created_ms, 1700000000000);
  auto reopened = OpenOk(dir, fs);
  auto loaded = reopened->LoadAgent("bob", kFingerprint);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->manifest.created_ms, 1600000000123);
}

TEST(StoreCache, RoundTripOnDisk) {
  testing::TempDir tmp;
  PosixFileSystem fs;
  const std::string dir = tmp.path() + "/store";
  SimAgent alice("alice");
  AgentState t1 = alice.Extend(Range(100, 10), "hello");
  AgentState t2 = alice.Extend(Range(200, 7), "more");
  {
    auto store = OpenOk(dir, fs);
    auto r1 = Commit(*store, t1);
    ASSERT_TRUE(r1.ok()) << r1.status().message();
    EXPECT_EQ(r1->blocks_written, 2u);
    EXPECT_EQ(r1->manifest.turn, 1u);
    EXPECT_EQ(r1->manifest.tail->file, "tail.1.kvt");
    auto r2 = Commit(*store, t2);
    ASSERT_TRUE(r2.ok()) << r2.status().message();
    EXPECT_EQ(r2->blocks_written, 2u);          // only the new ones
    EXPECT_EQ(r2->blocks_already_present, 2u);
    EXPECT_EQ(r2->manifest.turn, 2u);
    EXPECT_EQ(r2->manifest.created_ms, r1->manifest.created_ms);
    EXPECT_GT(r2->manifest.updated_ms, r1->manifest.updated_ms);
    auto loaded = store->LoadAgent("alice", kFingerprint);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    EXPECT_TRUE(LoadedIs(*loaded, t2));
    EXPECT_EQ(loaded->cached_tokens(), 17u);
    EXPECT_EQ(loaded->kv_format_id, testing::kKvFormatId);
  }
  // Reopen: same state, the old tail is gone, no garbage.
  auto store = OpenOk(dir, fs);
  EXPECT_EQ(store->open_report().temp_files_removed + store->open_report().orphan_blocks_removed +
                store->open_report().orphan_tails_removed,
            0u);
  auto loaded = store->LoadAgent("alice", kFingerprint);
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(LoadedIs(*loaded, t2));
  EXPECT_EQ(loaded->manifest.turn, 2u);
  std::set<std::string> files;
  for (const std::string& f : ListTree(dir))
    if (f.back() != '/') files.insert(dir + f);
  EXPECT_EQ(files, ExpectedFiles(dir, {loaded->manifest}));
  EXPECT_EQ(store->ListAgents(), std::vector<std::string>{"alice"});
  EXPECT_EQ(store->Stats().blocks, 4u);
  for (size_t i = 0; i < t2.blocks.size(); ++i) {
    EXPECT_EQ(*store->ReadBlock(t2.manifest.blocks[i]), t2.blocks[i]);
    std::vector<uint8_t> into(t2.blocks[i].size());
    ASSERT_TRUE(store->ReadBlockInto(t2.manifest.blocks[i], into).ok());
    EXPECT_EQ(into, t2.blocks[i]);
    std::vector<uint8_t> wrong(into.size() + 1);
    EXPECT_EQ(store->ReadBlockInto(t2.manifest.blocks[i], wrong).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(store->ReadBlock(BlockHash{5, 5}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->LoadAgent("nobody", kFingerprint).status().code(), StatusCode::kNotFound);
}

TEST(StoreCache, CommitRejectsInconsistentInput) {
  FaultInjectingFileSystem fs;
  auto store = OpenOk("/store", fs);
  SimAgent a("a");
  AgentState s = a.Extend(Range(1, 9), "x");
  std::vector<NewBlock> blocks = testing::AllBlocks(s);
  // A block the manifest names but nobody supplies.
  EXPECT_EQ(store->CommitTurn("a", s.manifest, std::span(blocks).first(1), testing::TailOf(s)).status().code(),
            StatusCode::kInvalidArgument);
  // A block of the wrong size, a name mismatch, an invalid name.
  std::vector<NewBlock> wrong = blocks;
  wrong[0].n_tokens = 3;
  EXPECT_FALSE(store->CommitTurn("a", s.manifest, wrong, testing::TailOf(s)).ok());
  EXPECT_FALSE(store->CommitTurn("b", s.manifest, blocks, testing::TailOf(s)).ok());
  EXPECT_FALSE(store->CommitTurn("../x", s.manifest, blocks, testing::TailOf(s)).ok());
  EXPECT_TRUE(store->ListAgents().empty());
  EXPECT_TRUE(fs.ListFilesRecursive("/store").empty());
}

TEST(StoreCache, SharedPrefixBlocksAreWrittenOnce) {
  FaultInjectingFileSystem fs;
  auto store = OpenOk("/store", fs);
  SimAgent a("a"), b("b");
  AgentState sa = a.Extend(Range(1, 12), "shared prefix then a");
  AgentState sb = b.Extend(Range(1, 8), "shared");
  sb = b.Extend(Range(50, 6), "then b");
  ASSERT_TRUE(Commit(*store, sa).ok());
  auto rb = Commit(*store, sb);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->blocks_already_present, 2u);
  EXPECT_EQ(rb->blocks_written, 1u);
  EXPECT_EQ(store->Stats().blocks, 4u);
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), sa));
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("b", kFingerprint), sb));
}

TEST(StoreCache, DivergedTurnFreesUnreferencedBlocks) {
  FaultInjectingFileSystem fs;
  auto store = OpenOk("/store", fs);
  SimAgent a("a");
  ASSERT_TRUE(Commit(*store, a.Extend(Range(1, 16), "four blocks")).ok());
  AgentState s2 = a.Diverge(8, Range(90, 5), "rewrote the end");
  auto r = Commit(*store, s2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(store->Stats().blocks, 3u);  // 2 kept + 1 new; the 2 old ones removed
  std::vector<Manifest> ms = {r->manifest};
  auto files = fs.ListFilesRecursive("/store");
  EXPECT_EQ(std::set<std::string>(files.begin(), files.end()), ExpectedFiles("/store", ms));
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), s2));
}

TEST(StoreCache, CorruptBlockIsDroppedAndRebuildIndexReported) {
  FaultInjectingFileSystem fs;
  SimAgent a("a"), b("b");
  AgentState sa = a.Extend(Range(1, 18), "a");  // 4 blocks + tail of 2
  AgentState sb = b.Extend(Range(500, 5), "b");
  auto store = OpenOk("/store", fs);
  ASSERT_TRUE(Commit(*store, sa).ok());
  ASSERT_TRUE(Commit(*store, sb).ok());
  const std::string hex = ToHex(sa.manifest.blocks[2]);
  const std::string path = "/store/blocks/" + hex.substr(0, 2) + "/" + hex + ".kvb";
  ASSERT_TRUE(fs.FlipByte(path, kBlockHeaderBytes + 10).ok());

  auto loaded = store->LoadAgent("a", kFingerprint);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  ASSERT_TRUE(loaded->rebuild_from_block.has_value());
  EXPECT_EQ(*loaded->rebuild_from_block, 2u);
  EXPECT_EQ(loaded->blocks.size(), 2u);
  EXPECT_FALSE(loaded->tail.has_value());
  EXPECT_EQ(loaded->cached_tokens(), 8u);
  ASSERT_EQ(loaded->problems.size(), 1u);
  EXPECT_NE(loaded->problems[0].find(path), std::string::npos) << loaded->problems[0];
  EXPECT_NE(loaded->problems[0].find("checksum"), std::string::npos) << loaded->problems[0];
  EXPECT_EQ(fs.FileSize(path).status().code(), StatusCode::kNotFound);  // dropped
  EXPECT_FALSE(store->HasBlock(sa.manifest.blocks[2]));
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("b", kFingerprint), sb));  // other agents unaffected

  // The caller recomputes from block 2 and commits; the same hash is written again.
  auto again = store->LoadAgent("a", kFingerprint);
  EXPECT_EQ(*again->rebuild_from_block, 2u);  // missing now, still reported
  std::vector<NewBlock> redo = {{sa.manifest.blocks[2], testing::kKvFormatId, 4, sa.blocks[2]}};
  ASSERT_TRUE(store->CommitTurn("a", sa.manifest, redo, testing::TailOf(sa)).ok());
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), sa));
}

TEST(StoreCache, TruncatedTailAndBlockFiles) {
  FaultInjectingFileSystem fs;
  SimAgent a("a");
  AgentState sa = a.Extend(Range(1, 10), "a");
  auto store = OpenOk("/store", fs);
  auto r = Commit(*store, sa);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(fs.Truncate("/store/agents/a/" + r->manifest.tail->file, 30).ok());
  auto loaded = store->LoadAgent("a", kFingerprint);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->rebuild_from_block, std::optional<size_t>(2));  // only the tail is bad
  EXPECT_EQ(loaded->blocks.size(), 2u);
  EXPECT_NE(loaded->problems[0].find("truncated"), std::string::npos) << loaded->problems[0];

  const std::string hex = ToHex(sa.manifest.blocks[0]);
  ASSERT_TRUE(fs.Truncate("/store/blocks/" + hex.substr(0, 2) + "/" + hex + ".kvb", kBlockHeaderBytes + 5).ok());
  loaded = store->LoadAgent("a", kFingerprint);
  EXPECT_EQ(loaded->rebuild_from_block, std::optional<size_t>(0));
  EXPECT_TRUE(loaded->blocks.empty());
  EXPECT_EQ(store->ReadBlock(sa.manifest.blocks[0]).status().code(), StatusCode::kNotFound);  // dropped
}

// Block files replaced by symbolic links (a restore gone wrong), one dangling, one to a file
// outside the store: the store opens, lists the links among the files it leaves alone, never
// writes through them (the outside file keeps its bytes, even when nothing names that block and
// orphan collection runs), and the agent is rebuilt from the first missing block.
TEST(StoreCache, LinksInPlaceOfBlocksAreMissingBlocksAndNeverFollowed) {
  testing::TempDir tmp;
  PosixFileSystem fs;
  const std::string dir = tmp.path() + "/store";
  SimAgent a("a");
  AgentState sa = a.Extend(Range(1, 18), "a");  // 4 blocks + tail of 2
  {
    auto store = OpenOk(dir, fs);
    ASSERT_TRUE(Commit(*store, sa).ok());
  }
  auto block_path = [&](const BlockHash& h) {
    const std::string hex = ToHex(h);
    return dir + "/blocks/" + hex.substr(0, 2) + "/" + hex + ".kvb";
  };
  const std::string dangling = block_path(sa.manifest.blocks[1]);
  ASSERT_EQ(::unlink(dangling.c_str()), 0);
  ASSERT_EQ(::symlink((tmp.path() + "/nowhere.kvb").c_str(), dangling.c_str()), 0);
  const std::string outside = tmp.path() + "/outside.txt";
  ASSERT_TRUE(fs.WriteFile(outside, std::vector<uint8_t>{'k', 'e', 'e', 'p'}).ok());
  const std::string linked = block_path(sa.manifest.blocks[2]);
  ASSERT_EQ(::unlink(linked.c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), linked.c_str()), 0);
  const std::string orphan = block_path(BlockHash{7, 7});  // a block no agent names
  ASSERT_TRUE(fs.MakeDir(orphan.substr(0, orphan.rfind('/'))).ok());
  ASSERT_EQ(::symlink(outside.c_str(), orphan.c_str()), 0);

  auto store = OpenOk(dir, fs);
  ASSERT_NE(store, nullptr);
  const std::vector<std::string>& unknown = store->open_report().unknown_files;
  for (const std::string& link : {dangling, linked, orphan}) {
    EXPECT_NE(std::find(unknown.begin(), unknown.end(), link), unknown.end()) << link;
  }
  EXPECT_EQ(*fs.ReadFile(outside), (std::vector<uint8_t>{'k', 'e', 'e', 'p'}));
  EXPECT_FALSE(store->HasBlock(sa.manifest.blocks[1]));
  EXPECT_FALSE(store->HasBlock(sa.manifest.blocks[2]));
  auto loaded = store->LoadAgent("a", kFingerprint);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->rebuild_from_block, std::optional<size_t>(1));
  EXPECT_EQ(loaded->blocks.size(), 1u);
  ASSERT_TRUE(store->EraseAgent("a").ok());
  EXPECT_EQ(*fs.ReadFile(outside), (std::vector<uint8_t>{'k', 'e', 'e', 'p'}));
}

TEST(StoreCache, GarbageManifestIsAClearErrorAndOthersAreUnaffected) {
  FaultInjectingFileSystem fs;
  SimAgent a("a"), b("b");
  AgentState sa = a.Extend(Range(1, 10), "a");
  AgentState sb = b.Extend(Range(1, 4), "b");
  sb = b.Extend(Range(70, 5), "shares one block with a");
  {
    auto store = OpenOk("/store", fs);
    ASSERT_TRUE(Commit(*store, sa).ok());
    ASSERT_TRUE(Commit(*store, sb).ok());
  }
  ASSERT_TRUE(fs.WriteFile("/store/agents/a/manifest.json", std::vector<uint8_t>{'{', '"', 'x'}).ok());
  auto store = OpenOk("/store", fs);
  ASSERT_EQ(store->open_report().broken_agents.size(), 1u);
  EXPECT_NE(store->open_report().broken_agents[0].find("not valid JSON"), std::string::npos);
  EXPECT_TRUE(store->open_report().orphan_collection_skipped);
  EXPECT_EQ(store->ListAgents(), (std::vector<std::string>{"a", "b"}));
  auto la = store->LoadAgent("a", kFingerprint);
  EXPECT_EQ(la.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(la.status().message().find("/store/agents/a/manifest.json"), std::string::npos) << la.status().message();
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("b", kFingerprint), sb));
  // a's blocks are still there (the broken manifest may name them) until a is erased.
  for (const BlockHash& h : sa.manifest.blocks) EXPECT_TRUE(store->HasBlock(h));
  auto erased = store->EraseAgent("a");
  ASSERT_TRUE(erased.ok()) << erased.status().message();
  EXPECT_EQ(erased->blocks_freed, 1u);  // a's unshared block, collected once no manifest is broken
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("b", kFingerprint), sb));
  auto files = fs.ListFilesRecursive("/store");
  EXPECT_EQ(std::set<std::string>(files.begin(), files.end()),
            ExpectedFiles("/store", {store->LoadAgent("b", kFingerprint)->manifest}));
}

// Damage a crash cannot cause (a flipped bit, a deleted file) costs the agent its latest turn,
// not everything: Open puts the manifest of the turn before back.
TEST(StoreCache, DamagedManifestGoesBackOneTurn) {
  for (const bool deleted : {false, true}) {
    SCOPED_TRACE(deleted ? "manifest deleted" : "one letter of its text changed");
    FaultInjectingFileSystem fs;
    SimAgent a("a"), b("b");
    const AgentState s1 = a.Extend(Range(1, 10), "turn one");
    const AgentState s2 = a.Extend(Range(100, 7), "turn two");             // 4 blocks + 1
    const AgentState s3 = a.Diverge(8, Range(500, 6), "turn three diverges");  // keeps 2 blocks
    const AgentState sb = b.Extend(Range(1, 4), "b");
    {
      auto store = OpenOk("/store", fs);
      for (const AgentState* st : {&s1, &s2, &s3, &sb}) ASSERT_TRUE(Commit(*store, *st).ok());
    }
    const std::string path = "/store/agents/a/manifest.json";
    if (deleted) {
      ASSERT_TRUE(fs.Unlink(path).ok());
    } else {
      std::vector<uint8_t> bytes = *fs.ReadFile(path);
      const std::string text(bytes.begin(), bytes.end());
      const size_t at = text.find("turn three");
      ASSERT_NE(at, std::string::npos);
      bytes[at] = 'T';  // still valid JSON
      ASSERT_TRUE(fs.WriteFile(path, bytes).ok());
    }
    auto store = OpenOk("/store", fs);
    const OpenReport& r = store->open_report();
    ASSERT_EQ(r.recovered_agents.size(), 1u);
    EXPECT_EQ(r.recovered_agents[0].name, "a");
    EXPECT_EQ(r.recovered_agents[0].turn, 2u);
    EXPECT_NE(r.recovered_agents[0].reason.find(deleted ? "missing" : "\"checksum\""), std::string::npos)
        << r.recovered_agents[0].reason;
    EXPECT_TRUE(r.broken_agents.empty());
    EXPECT_FALSE(r.orphan_collection_skipped);
    EXPECT_EQ(*fs.ReadFile(path), *fs.ReadFile("/store/agents/a/manifest.prev.json"));  // published again

    // Turn two's text and tokens; its blocks 2-3 and its tail went when turn three committed.
    auto la = store->LoadAgent("a", kFingerprint);
    ASSERT_TRUE(la.ok()) << la.status().message();
    EXPECT_EQ(la->manifest.conversation, s2.manifest.conversation);
    EXPECT_EQ(la->manifest.tokens, s2.manifest.tokens);
    EXPECT_EQ(la->rebuild_from_block, std::optional<size_t>(2));
    EXPECT_EQ(la->blocks, std::vector<std::vector<uint8_t>>(s2.blocks.begin(), s2.blocks.begin() + 2));
    EXPECT_TRUE(LoadedIs(*store->LoadAgent("b", kFingerprint), sb));
    // Turn three's own block and tail were collected at Open; the agent goes on from here.
    auto files = fs.ListFilesRecursive("/store");
    std::set<std::string> expect = ExpectedFiles("/store", {la->manifest, store->LoadAgent("b", kFingerprint)->manifest});
    for (size_t i = 2; i < s2.manifest.blocks.size(); ++i) {  // missing, to be rebuilt
      const std::string hex = ToHex(s2.manifest.blocks[i]);
      expect.erase("/store/blocks/" + hex.substr(0, 2) + "/" + hex + ".kvb");
    }
    expect.erase("/store/agents/a/" + la->manifest.tail->file);
    EXPECT_EQ(std::set<std::string>(files.begin(), files.end()), expect);
    auto again = Commit(*store, s3);
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(again->manifest.turn, 3u);
    store.reset();
    store = OpenOk("/store", fs);
    EXPECT_TRUE(store->open_report().recovered_agents.empty());
    EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), s3));
  }
}

// When the previous manifest is damaged too, the agent is broken as before; a first turn has no
// previous manifest at all.
TEST(StoreCache, BothManifestsDamagedIsBroken) {
  FaultInjectingFileSystem fs;
  SimAgent a("a"), c("c");
  {
    auto store = OpenOk("/store", fs);
    ASSERT_TRUE(Commit(*store, a.Extend(Range(1, 10), "one")).ok());
    ASSERT_TRUE(Commit(*store, a.Extend(Range(20, 3), "two")).ok());
    ASSERT_TRUE(Commit(*store, c.Extend(Range(1, 3), "only turn")).ok());
  }
  EXPECT_FALSE(fs.FileSize("/store/agents/c/manifest.prev.json").ok());
  const std::vector<uint8_t> junk = {'{', '}'};
  for (const char* f : {"/store/agents/a/manifest.json", "/store/agents/a/manifest.prev.json",
                        "/store/agents/c/manifest.json"})
    ASSERT_TRUE(fs.WriteFile(f, junk).ok());
  auto store = OpenOk("/store", fs);
  const OpenReport& r = store->open_report();
  EXPECT_TRUE(r.recovered_agents.empty());
  ASSERT_EQ(r.broken_agents.size(), 2u);
  EXPECT_NE(r.broken_agents[0].find("manifest.prev.json"), std::string::npos) << r.broken_agents[0];
  EXPECT_EQ(store->LoadAgent("a", kFingerprint).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(store->LoadAgent("c", kFingerprint).status().code(), StatusCode::kCorrupt);
  // A new agent of the same name replaces the broken one, its copy included. The damaged
  // manifest's bytes take the copy's name until they are zeroed (here by the next Open), so the
  // publish frees none of them.
  SimAgent a2("a");
  const AgentState fresh = a2.Extend(Range(300, 5), "a new a");
  const size_t freed_before = fs.released_unzeroed().size();  // the junk written above
  auto committed = Commit(*store, fresh);
  ASSERT_TRUE(committed.ok()) << committed.status().message();
  EXPECT_EQ(fs.released_unzeroed().size(), freed_before) << testing::Join(fs.released_unzeroed());
  EXPECT_EQ(*fs.ReadFile("/store/agents/a/manifest.prev.json"), junk);
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), fresh));
  store.reset();
  store = OpenOk("/store", fs);
  EXPECT_FALSE(fs.FileSize("/store/agents/a/manifest.prev.json").ok());
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), fresh));
  EXPECT_EQ(fs.released_unzeroed().size(), freed_before) << testing::Join(fs.released_unzeroed());
}

// Two agents with unreadable records: the first erasure cannot tell which unnamed blocks were its
// own, keeps them and says how many (the audit line carries it); the last frees them all.
TEST(StoreCache, ErasingOneOfTwoUnreadableAgentsCountsTheBlocksItMustKeep) {
  testing::QuietLogs quiet;
  FaultInjectingFileSystem fs;
  SimAgent a("a"), c("c"), ok("ok");
  const AgentState ok_state = ok.Extend(Range(200, 4), "one block");
  {
    auto store = OpenOk("/store", fs);
    ASSERT_TRUE(Commit(*store, a.Extend(Range(1, 8), "two blocks")).ok());
    ASSERT_TRUE(Commit(*store, c.Extend(Range(100, 12), "three blocks")).ok());
    ASSERT_TRUE(Commit(*store, ok_state).ok());
  }
  for (const char* f : {"/store/agents/a/manifest.json", "/store/agents/c/manifest.json"})
    ASSERT_TRUE(fs.WriteFile(f, std::vector<uint8_t>{'{', '}'}).ok());
  auto store = OpenOk("/store", fs);
  ASSERT_EQ(store->open_report().broken_agents.size(), 2u);
  auto first = store->EraseAgent("a");
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->blocks_freed, 0u);
  EXPECT_EQ(first->blocks_kept_unattributed, 5u);  // a's 2 and c's 3; ok's is named
  auto last = store->EraseAgent("c");
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->blocks_freed, 5u);
  EXPECT_EQ(last->blocks_kept_unattributed, 0u);
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("ok", kFingerprint), ok_state));  // untouched
}

// A manifest this build cannot read because a newer kvfs wrote it is not damage: it must not be
// replaced by the older copy (that would lose the newer turn for good after a downgrade).
TEST(StoreCache, NewerManifestIsNotReplacedByTheOlderCopy) {
  FaultInjectingFileSystem fs;
  SimAgent a("a");
  {
    auto store = OpenOk("/store", fs);
    ASSERT_TRUE(Commit(*store, a.Extend(Range(1, 10), "one")).ok());
    ASSERT_TRUE(Commit(*store, a.Extend(Range(20, 3), "two")).ok());
  }
  const std::string path = "/store/agents/a/manifest.json";
  std::vector<uint8_t> bytes = *fs.ReadFile(path);
  std::string text(bytes.begin(), bytes.end());
  text.replace(text.find("\"version\":2"), 11, "\"version\":9");
  const std::vector<uint8_t> newer(text.begin(), text.end());
  ASSERT_TRUE(fs.WriteFile(path, newer).ok());
  auto store = OpenOk("/store", fs);
  EXPECT_TRUE(store->open_report().recovered_agents.empty());
  ASSERT_EQ(store->open_report().broken_agents.size(), 1u);
  EXPECT_NE(store->open_report().broken_agents[0].find("version 9 is not supported"), std::string::npos)
      << store->open_report().broken_agents[0];
  EXPECT_EQ(*fs.ReadFile(path), newer);
  EXPECT_TRUE(fs.FileSize("/store/agents/a/manifest.prev.json").ok());
}

TEST(StoreCache, OtherFingerprintIsNeverLoaded) {
  FaultInjectingFileSystem fs;
  SimAgent a("a");
  AgentState sa = a.Extend(Range(1, 10), "a");
  auto store = OpenOk("/store", fs);
  ASSERT_TRUE(Commit(*store, sa).ok());
  auto loaded = store->LoadAgent("a", "ffffffffffffffffffffffffffffffff");
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(loaded->fingerprint_mismatch);
  EXPECT_EQ(loaded->rebuild_from_block, std::optional<size_t>(0));
  EXPECT_TRUE(loaded->blocks.empty());
  EXPECT_FALSE(loaded->tail.has_value());
  EXPECT_EQ(loaded->manifest.conversation, sa.manifest.conversation);  // the text, for the rebuild
  EXPECT_EQ(store->Stats().blocks, 2u);                                // nothing dropped
}

TEST(StoreCache, OpenRemovesCrashLeftovers) {
  FaultInjectingFileSystem fs;
  SimAgent a("a");
  AgentState sa = a.Extend(Range(1, 10), "a");
  {
    auto store = OpenOk("/store", fs);
    ASSERT_TRUE(Commit(*store, sa).ok());
  }
  std::vector<uint8_t> junk(100, 1);
  ASSERT_TRUE(fs.WriteFile("/store/agents/a/manifest.json.tmp", junk).ok());
  ASSERT_TRUE(fs.WriteFile("/store/agents/a/tail.9.kvt", junk).ok());
  ASSERT_TRUE(fs.MakeDir("/store/blocks/ab").ok());
  ASSERT_TRUE(fs.WriteFile("/store/blocks/ab/" + std::string(32, 'a').replace(0, 2, "ab") + ".kvb", junk).ok());
  ASSERT_TRUE(fs.WriteFile("/store/blocks/ab/x.kvb.tmp", junk).ok());
  ASSERT_TRUE(fs.MakeDir("/store/blocks/cd").ok());  // emptied by an erasure, then a crash
  ASSERT_TRUE(fs.MakeDir("/store/agents/ghost").ok());  // first turn never committed
  ASSERT_TRUE(fs.WriteFile("/store/agents/ghost/tail.1.kvt", junk).ok());
  ASSERT_TRUE(fs.MakeDir("/store/agents/.erase.old").ok());  // erasure interrupted
  ASSERT_TRUE(fs.WriteFile("/store/agents/.erase.old/manifest.json", junk).ok());
  ASSERT_TRUE(fs.WriteFile("/store/agents/README", junk).ok());
  auto store = OpenOk("/store", fs);
  const OpenReport& r = store->open_report();
  EXPECT_EQ(r.temp_files_removed, 2u);
  EXPECT_EQ(r.orphan_tails_removed, 1u);
  EXPECT_EQ(r.orphan_blocks_removed, 1u);
  EXPECT_EQ(r.incomplete_agents_removed, 1u);
  EXPECT_EQ(r.erasures_completed, 1u);
  EXPECT_EQ(r.bytes_removed, 600u);
  EXPECT_EQ(r.unknown_files, std::vector<std::string>{"/store/agents/README"});
  auto files = fs.ListFilesRecursive("/store");
  std::set<std::string> expect = ExpectedFiles("/store", {store->LoadAgent("a", kFingerprint)->manifest});
  expect.insert("/store/agents/README");
  EXPECT_EQ(std::set<std::string>(files.begin(), files.end()), expect);
  for (const char* emptied : {"/store/blocks/cd", "/store/blocks/ab"}) {  // (ab: its orphan and temp file went)
    auto is_dir = fs.IsDir(emptied);
    EXPECT_EQ(is_dir.status().code(), StatusCode::kNotFound) << emptied;
  }
}

TEST(StoreCache, ErasureKeepsSharedBlocksAndLeavesNothingOfTheAgent) {
  testing::TempDir tmp;
  PosixFileSystem fs;
  const std::string dir = tmp.path() + "/store";
  SimAgent alice("alice"), bob("bob");
  AgentState sa = alice.Extend(Range(1, 8), "shared");
  sa = alice.Extend(Range(300, 14), "alice's own");  // blocks: 2 shared + 3 own, tail of 2
  AgentState sb = bob.Extend(Range(1, 9), "bob");    // blocks: 2 shared, tail of 1
  auto store = OpenOk(dir, fs);
  ASSERT_TRUE(Commit(*store, sa).ok());
  ASSERT_TRUE(Commit(*store, sb).ok());
  const std::set<std::string> before = ListTree(dir);
  uint64_t alice_bytes = 0;
  size_t alice_files = 0;
  std::set<std::string> alice_only;
  for (const std::string& f : before) {
    const bool own_block =
        std::any_of(sa.manifest.blocks.begin() + 2, sa.manifest.blocks.end(),
                    [&](const BlockHash& h) { return f.find(ToHex(h)) != std::string::npos; });
    if (f.back() != '/' && (f.starts_with("/agents/alice/") || own_block)) {
      alice_bytes += std::filesystem::file_size(dir + f);
      ++alice_files;
      alice_only.insert(f);
    }
  }
  ASSERT_EQ(alice_files, 5u);  // manifest, tail, 3 own blocks

  auto report = store->EraseAgent("alice");
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->blocks_freed, 3u);
  EXPECT_EQ(report->blocks_kept_shared, 2u);
  EXPECT_EQ(report->files_removed, alice_files);
  EXPECT_EQ(report->bytes_freed, alice_bytes);

  const std::set<std::string> after = ListTree(dir);
  for (const std::string& f : after) {
    EXPECT_EQ(f.find("alice"), std::string::npos) << f;
    EXPECT_EQ(f.find(".erase"), std::string::npos) << f;
    EXPECT_EQ(alice_only.count(f), 0u) << f;
  }
  // Everything else stays, but for the block directories that held only alice's blocks: no
  // empty directory tells which first bytes her blocks' hashes had.
  auto only_alice_inside = [&](const std::string& d) {
    bool any = false;
    for (const std::string& f : before) {
      if (!f.starts_with(d) || f == d) continue;
      if (!alice_only.count(f)) return false;
      any = true;
    }
    return any;
  };
  size_t dirs_removed = 0;
  for (const std::string& f : before) {
    if (alice_only.count(f) || f == "/agents/alice/") continue;
    const bool gone = f.starts_with("/blocks/") && f.back() == '/' && only_alice_inside(f);
    dirs_removed += gone;
    EXPECT_EQ(after.count(f), gone ? 0u : 1u) << f;
  }
  EXPECT_GE(dirs_removed, 1u);  // 3 own blocks, 2 of bob's: some directory held only hers
  EXPECT_EQ(store->ListAgents(), std::vector<std::string>{"bob"});
  EXPECT_EQ(store->LoadAgent("alice", kFingerprint).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(LoadedIs(*store->LoadAgent("bob", kFingerprint), sb));
  EXPECT_EQ(store->EraseAgent("alice").status().code(), StatusCode::kNotFound);
  // Reopened, bob's blocks are still referenced and nothing is collected.
  store.reset();
  store = OpenOk(dir, fs);
  EXPECT_EQ(store->open_report().orphan_blocks_removed, 0u);
  EXPECT_EQ(ListTree(dir), after);
}

// Every file erasure removes is overwritten with zeros and fsynced before its unlink.
TEST(StoreCache, ErasureOverwritesBeforeUnlink) {
  FaultInjectingFileSystem fs;
  SimAgent a("a");
  auto store = OpenOk("/store", fs);
  ASSERT_TRUE(Commit(*store, a.Extend(Range(1, 10), "a")).ok());
  fs.ResetOpCount();
  auto report = store->EraseAgent("a");
  ASSERT_TRUE(report.ok());
  const std::vector<std::string> log = fs.op_log();
  size_t unlinks = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    if (!log[i].starts_with("unlink ")) continue;
    ++unlinks;
    const std::string path = log[i].substr(7);
    ASSERT_GE(i, 2u);
    EXPECT_EQ(log[i - 2], "overwrite " + path);
    EXPECT_EQ(log[i - 1], "fsync " + path);
  }
  EXPECT_EQ(unlinks, report->files_removed);
  EXPECT_EQ(unlinks, 4u);  // manifest, tail, 2 blocks
  EXPECT_TRUE(fs.ListFilesRecursive("/store").empty());
  auto block_dirs = fs.ListDir("/store/blocks");  // nor an empty blocks/<hh> directory
  ASSERT_TRUE(block_dirs.ok());
  EXPECT_TRUE(block_dirs->empty());
}

// A commit replaces manifest.prev.json by a rename, which unlinks the file it replaces: that
// holds the conversation of two turns back, so it is overwritten with zeros and fsynced first,
// as erasure does for what it unlinks. (manifest.json itself is renamed over as it is: a crash
// must never leave it unreadable; its bytes live on in manifest.prev.json.)
// Concurrent turns of different agents with loads, reads and listings (run under TSan too).
// .prefixes/ records: published with their blocks, listed after a reopen, their blocks kept by
// orphan collection; erasure removes the record and the blocks only it named.
TEST(StoreCache, PrefixRecordsPersistAndHoldTheirBlocks) {
  testing::TempDir tmp;
  PosixFileSystem fs;
  const std::string dir = tmp.path() + "/store";
  const std::vector<uint8_t> p1(100, 1), p2(100, 2);
  const PrefixRecord r = StoryPrefix();
  const std::vector<NewBlock> blocks = {{r.blocks[0], testing::kKvFormatId, 16, p1},
                                        {r.blocks[1], testing::kKvFormatId, 16, p2}};
  {
    auto store = OpenOk(dir, fs);
    PrefixRecord missing = r;
    missing.name = "missing";
    EXPECT_EQ(store->CommitPrefix(missing, {}).code(), StatusCode::kInvalidArgument);  // names unstored blocks
    PrefixRecord bad = r;
    bad.name = ".hidden";
    EXPECT_EQ(store->CommitPrefix(bad, blocks).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(store->CommitPrefix(r, blocks).ok());
    EXPECT_EQ(store->Stats().blocks, 2u);
  }
  {
    auto store = OpenOk(dir, fs);
    EXPECT_EQ(store->open_report().orphan_blocks_removed, 0u);
    EXPECT_EQ(store->ListPrefixes(), std::vector<PrefixRecord>{r});
    auto b = store->ReadBlock(r.blocks[1]);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, p2);
    // Replacing the record with one of a single block erases the block only the old one named.
    PrefixRecord shorter = r;
    shorter.blocks.pop_back();
    ASSERT_TRUE(store->CommitPrefix(shorter, {}).ok());
    EXPECT_EQ(store->Stats().blocks, 1u);
    auto erased = store->ErasePrefix("story.txt");
    ASSERT_TRUE(erased.ok()) << erased.status().message();
    EXPECT_EQ(erased->blocks_freed, 1u);
    EXPECT_EQ(erased->files_removed, 2u);  // the record and the block
    EXPECT_EQ(store->Stats().blocks, 0u);
    EXPECT_EQ(store->ErasePrefix("story.txt").status().code(), StatusCode::kNotFound);
  }
  auto store = OpenOk(dir, fs);
  EXPECT_TRUE(store->ListPrefixes().empty());
  EXPECT_TRUE(ListTree(dir + "/prefixes").empty());
}

// A damaged prefix record is not read as a prefix, but it is reported (not hidden), holds back
// orphan collection (it may name any block) until it is erased or replaced, and then the blocks
// that only it named are collected at once.
TEST(StoreCache, UnreadablePrefixRecordCanBeErasedOrReplaced) {
  for (const bool replace : {false, true}) {
    SCOPED_TRACE(replace ? "replaced" : "erased");
    FaultInjectingFileSystem fs;
    const PrefixRecord r = StoryPrefix();
    const std::vector<uint8_t> payload(100, 1);
    const std::vector<NewBlock> blocks = {{r.blocks[0], testing::kKvFormatId, 16, payload},
                                          {r.blocks[1], testing::kKvFormatId, 16, payload}};
    SimAgent a("a");
    const AgentState sa = a.Extend(Range(1, 10), "agent");
    {
      auto store = OpenOk("/store", fs);
      ASSERT_TRUE(store->CommitPrefix(r, blocks).ok());
      ASSERT_TRUE(Commit(*store, sa).ok());
    }
    const std::string path = "/store/prefixes/story.txt.prefix";
    std::vector<uint8_t> bytes = *fs.ReadFile(path);
    const std::string text(bytes.begin(), bytes.end());
    const size_t at = text.find("upon");
    ASSERT_NE(at, std::string::npos);
    bytes[at] = 'U';  // still valid JSON: only the checksum tells
    ASSERT_TRUE(fs.WriteFile(path, bytes).ok());

    auto store = OpenOk("/store", fs);
    const OpenReport& report = store->open_report();
    ASSERT_EQ(report.broken_prefixes.size(), 1u);
    EXPECT_NE(report.broken_prefixes[0].find("\"checksum\""), std::string::npos) << report.broken_prefixes[0];
    EXPECT_TRUE(report.orphan_collection_skipped);
    EXPECT_TRUE(store->ListPrefixes().empty());
    const auto unreadable = store->UnreadablePrefixes();
    ASSERT_EQ(unreadable.size(), 1u);
    EXPECT_EQ(unreadable.begin()->first, "story.txt");
    const size_t agent_blocks = sa.manifest.blocks.size();
    EXPECT_EQ(store->Stats().blocks, agent_blocks + 2);  // the prefix's two blocks are still there
    if (replace) {
      PrefixRecord shorter = r;
      shorter.blocks = {BlockHash{5, 6}};
      const std::vector<NewBlock> fresh = {{shorter.blocks[0], testing::kKvFormatId, 16, payload}};
      ASSERT_TRUE(store->CommitPrefix(shorter, fresh).ok());
      EXPECT_EQ(store->ListPrefixes(), std::vector<PrefixRecord>{shorter});
      EXPECT_EQ(store->Stats().blocks, agent_blocks + 1);
    } else {
      auto erased = store->ErasePrefix("story.txt");
      ASSERT_TRUE(erased.ok()) << erased.status().message();
      EXPECT_EQ(erased->blocks_freed, 2u);  // collected: nothing names them any more
      EXPECT_FALSE(fs.FileSize(path).ok());
      EXPECT_EQ(store->Stats().blocks, agent_blocks);
      EXPECT_EQ(store->ErasePrefix("story.txt").status().code(), StatusCode::kNotFound);
    }
    EXPECT_TRUE(store->UnreadablePrefixes().empty());
    EXPECT_TRUE(LoadedIs(*store->LoadAgent("a", kFingerprint), sa));  // the agent's blocks were kept
    store.reset();
    store = OpenOk("/store", fs);
    EXPECT_TRUE(store->open_report().broken_prefixes.empty());
    EXPECT_FALSE(store->open_report().orphan_collection_skipped);
    EXPECT_EQ(store->open_report().orphan_blocks_removed, 0u);  // nothing was left behind
  }
}

TEST(StoreCache, ConcurrentAgents) {
  FaultInjectingFileSystem fs;
  auto store = OpenOk("/store", fs);
  constexpr int kAgents = 4, kTurns = 12;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kAgents; ++t) {
    threads.emplace_back([&, t] {
      SimAgent sim("agent" + std::to_string(t));
      for (int turn = 0; turn < kTurns; ++turn) {
        // The first 8 tokens are shared by every agent.
        AgentState s = turn == 0 ? sim.Extend(Range(1, 8), "shared") : sim.Extend(Range(1000 * t + 10 * turn, 3), "x");
        if (!Commit(*store, s).ok()) ++failures;
        auto l = store->LoadAgent(sim.name(), kFingerprint);
        if (!l.ok() || !LoadedIs(*l, s)) ++failures;
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 200; ++i) {
      (void)store->ListAgents();
      (void)store->Stats();
    }
  });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store->ListAgents().size(), static_cast<size_t>(kAgents));
  auto e = store->EraseAgent("agent0");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->blocks_kept_shared, 2u);
}

}  // namespace
}  // namespace kvfs::store
