// Erasure on the disk: no byte the store wrote is freed before it is zeroed (the fault-injecting
// file system's audit), with and without hard links.
#include <gtest/gtest.h>

#include "engine/store/cache_store.h"
#include "engine/store/fault_fs.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

using testing::Commit;
using testing::OpenOk;
using testing::Range;
using testing::SimAgent;
using testing::StoryPrefix;
using testing::kFingerprint;

// Erasure's promise on the disk: no byte the store wrote (turn text, tokens, KV) goes back to the
// free space before it is zeroed, through commits that replace manifests, tails and blocks,
// prefix records replaced, a reopen, and erasures. The model records every file freed while not
// zero on the medium (StoreFileSystem.FaultInjectingRecordsBytesFreedWithoutZeros).
TEST(StoreCache, NoStoredByteIsFreedBeforeItIsZeroed) {
  FaultInjectingFileSystem fs;
  SimAgent alice("alice"), bob("bob");
  const std::string adir = "/store/agents/alice";
  PrefixRecord prefix = StoryPrefix();
  const std::vector<uint8_t> p1(100, 1), p2(100, 2);
  {
    auto store = OpenOk("/store", fs);
    ASSERT_TRUE(Commit(*store, bob.Extend(Range(1, 10), "bob's secret")).ok());
    ASSERT_TRUE(Commit(*store, alice.Extend(Range(1, 10), "one")).ok());
    ASSERT_TRUE(Commit(*store, alice.Extend(Range(20, 10), "two")).ok());
    ASSERT_TRUE(Commit(*store, alice.Diverge(9, Range(500, 6), "three drops a block and the tail")).ok());
    // manifest.prev.json holds turn 2, as its own file now that manifest.json is turn 3.
    auto prev = fs.ReadFile(adir + "/manifest.prev.json");
    ASSERT_TRUE(prev.ok());
    auto m = ParseManifest(std::string(prev->begin(), prev->end()), "prev");
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->turn, 2u);
    EXPECT_FALSE(*fs.SameFile(adir + "/manifest.prev.json", adir + "/manifest.json"));
    const std::vector<NewBlock> blocks = {{prefix.blocks[0], testing::kKvFormatId, 16, p1},
                                          {prefix.blocks[1], testing::kKvFormatId, 16, p2}};
    ASSERT_TRUE(store->CommitPrefix(prefix, blocks).ok());
    prefix.text = "Once upon a time, replaced";
    ASSERT_TRUE(store->CommitPrefix(prefix, {}).ok());
    EXPECT_EQ(store->ListPrefixes().at(0).text, prefix.text);
  }
  EXPECT_TRUE(fs.released_unzeroed().empty()) << testing::Join(fs.released_unzeroed());
  {
    auto store = OpenOk("/store", fs);
    ASSERT_TRUE(Commit(*store, alice.Extend(Range(700, 20), "four")).ok());
    auto loaded = store->LoadAgent("alice", kFingerprint);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    EXPECT_EQ(loaded->manifest.turn, 4u);
    ASSERT_TRUE(store->EraseAgent("alice").ok());
    ASSERT_TRUE(store->ErasePrefix(prefix.name).ok());
    ASSERT_TRUE(store->EraseAgent("bob").ok());
  }
  EXPECT_TRUE(fs.released_unzeroed().empty()) << testing::Join(fs.released_unzeroed());
  EXPECT_TRUE(fs.ListFilesRecursive("/store/agents").empty());
}

// Where the file system has no hard links, manifest.prev.json is a copy and turns still commit;
// the manifests that the publishing renames replace are then freed as they are (README, "Erasure").
TEST(StoreCache, WithoutHardLinksThePreviousManifestIsACopy) {
  FaultInjectingFileSystem fs;
  fs.SetHardLinks(false);
  SimAgent a("a");
  auto store = OpenOk("/store", fs);
  for (int turn = 0; turn < 3; ++turn) ASSERT_TRUE(Commit(*store, a.Extend(Range(20 * turn, 10), "turn")).ok());
  auto loaded = store->LoadAgent("a", kFingerprint);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->manifest.turn, 3u);
  auto prev = fs.ReadFile("/store/agents/a/manifest.prev.json");
  ASSERT_TRUE(prev.ok());
  EXPECT_EQ(ParseManifest(std::string(prev->begin(), prev->end()), "prev")->turn, 2u);
  EXPECT_EQ(fs.released_unzeroed(), std::vector<std::string>(2, "rename over: /store/agents/a/manifest.json"));
  ASSERT_TRUE(store->EraseAgent("a").ok());
  EXPECT_EQ(fs.released_unzeroed().size(), 2u);
}

}  // namespace
}  // namespace kvfs::store
