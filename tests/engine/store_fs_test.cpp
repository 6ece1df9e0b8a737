// The file-system seam: the POSIX implementation, and the crash/fault model of the
// fault-injecting one (what survives which kind of crash).
#include <gtest/gtest.h>

#include "engine/store/fault_fs.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

using Mode = FaultInjectingFileSystem::CrashMode;

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

void ExerciseBasics(FileSystem& fs, const std::string& root) {
  const std::string d = JoinPath(root, "d");
  ASSERT_TRUE(fs.MakeDir(d).ok());
  ASSERT_TRUE(fs.MakeDir(d).ok());  // exists: fine
  ASSERT_TRUE(fs.WriteFile(d + "/a", Bytes("hello world")).ok());
  ASSERT_TRUE(fs.SyncFile(d + "/a").ok());
  EXPECT_EQ(*fs.FileSize(d + "/a"), 11u);
  EXPECT_EQ(*fs.ReadFile(d + "/a"), Bytes("hello world"));
  std::vector<uint8_t> five(5);
  ASSERT_TRUE(fs.ReadAt(d + "/a", 6, five).ok());
  EXPECT_EQ(five, Bytes("world"));
  EXPECT_EQ(fs.ReadAt(d + "/a", 8, five).code(), StatusCode::kCorrupt);
  ASSERT_TRUE(WriteFileAtomic(fs, d, "b", Bytes("bee")).ok());
  ASSERT_TRUE(fs.Rename(d + "/b", d + "/a").ok());
  EXPECT_EQ(*fs.ReadFile(d + "/a"), Bytes("bee"));
  ASSERT_TRUE(fs.Link(d + "/a", d + "/c").ok());
  EXPECT_TRUE(*fs.SameFile(d + "/a", d + "/c"));
  EXPECT_FALSE(fs.Link(d + "/a", d + "/c").ok());  // exists
  EXPECT_EQ(fs.Link(d + "/zz", d + "/y").code(), StatusCode::kNotFound);
  ASSERT_TRUE(fs.Rename(d + "/c", d + "/a").ok());  // names of one file: POSIX keeps both
  ASSERT_TRUE(fs.OverwriteWithZeros(d + "/a").ok());
  EXPECT_EQ(*fs.ReadFile(d + "/a"), std::vector<uint8_t>(3, 0));
  EXPECT_EQ(*fs.ReadFile(d + "/c"), std::vector<uint8_t>(3, 0));  // one file, two names
  ASSERT_TRUE(fs.Unlink(d + "/c").ok());
  ASSERT_TRUE(WriteFileAtomic(fs, d, "e", Bytes("e")).ok());
  EXPECT_FALSE(*fs.SameFile(d + "/a", d + "/e"));
  EXPECT_EQ(fs.SameFile(d + "/a", d + "/zz").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(fs.Unlink(d + "/e").ok());
  auto list = fs.ListDir(d);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "a");
  EXPECT_FALSE((*list)[0].is_dir);
  EXPECT_TRUE(*fs.IsDir(d));
  EXPECT_EQ(fs.IsDir(d + "/zz").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(fs.ReadFile(d + "/zz").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(fs.RemoveDir(d).ok());  // not empty
  ASSERT_TRUE(fs.Unlink(d + "/a").ok());
  ASSERT_TRUE(fs.SyncDir(d).ok());
  ASSERT_TRUE(fs.RemoveDir(d).ok());
  EXPECT_GT(*fs.FreeBytes(root), 0u);
}

TEST(StoreFileSystem, PosixBasics) {
  testing::TempDir tmp;
  PosixFileSystem fs;
  ExerciseBasics(fs, tmp.path());
}

TEST(StoreFileSystem, FaultInjectingBasics) {
  FaultInjectingFileSystem fs;
  ExerciseBasics(fs, "/");
}

// The erasure audit of the model: bytes given back to the free space while not zero on the
// medium (or in the page cache) are recorded; zeroed and synced ones, and a name of a file that
// keeps another, are not.
TEST(StoreFileSystem, FaultInjectingRecordsBytesFreedWithoutZeros) {
  FaultInjectingFileSystem fs;
  ASSERT_TRUE(fs.MakeDir("/d").ok());
  auto write = [&](const std::string& p) { ASSERT_TRUE(fs.WriteFile(p, Bytes("secret")).ok()); ASSERT_TRUE(fs.SyncFile(p).ok()); };
  write("/d/shredded");
  ASSERT_TRUE(fs.OverwriteWithZeros("/d/shredded").ok());
  ASSERT_TRUE(fs.SyncFile("/d/shredded").ok());
  ASSERT_TRUE(fs.Unlink("/d/shredded").ok());
  write("/d/linked");
  ASSERT_TRUE(fs.Link("/d/linked", "/d/second").ok());
  ASSERT_TRUE(fs.Unlink("/d/linked").ok());  // "second" still holds the bytes
  EXPECT_TRUE(fs.released_unzeroed().empty());
  ASSERT_TRUE(fs.WriteFile("/d/new", Bytes("x")).ok());
  ASSERT_TRUE(fs.Rename("/d/new", "/d/second").ok());
  write("/d/unsynced");
  ASSERT_TRUE(fs.OverwriteWithZeros("/d/unsynced").ok());  // the zeros never reached the disk
  ASSERT_TRUE(fs.Unlink("/d/unsynced").ok());
  write("/d/rewritten");
  ASSERT_TRUE(fs.WriteFile("/d/rewritten", Bytes("other")).ok());
  EXPECT_EQ(fs.released_unzeroed(), (std::vector<std::string>{"rename over: /d/second", "unlink: /d/unsynced",
                                                               "truncate: /d/rewritten"}));
  fs.SetHardLinks(false);
  EXPECT_EQ(fs.Link("/d/rewritten", "/d/x").code(), StatusCode::kUnsupported);
}

TEST(StoreFileSystem, PowerLossKeepsOnlyWhatWasSynced) {
  FaultInjectingFileSystem fs;
  ASSERT_TRUE(fs.MakeDir("/d").ok());
  ASSERT_TRUE(fs.SyncDir("/").ok());
  ASSERT_TRUE(fs.WriteFile("/d/synced", Bytes("one")).ok());
  ASSERT_TRUE(fs.SyncFile("/d/synced").ok());
  ASSERT_TRUE(fs.WriteFile("/d/data-only", Bytes("two")).ok());  // entry never synced
  ASSERT_TRUE(fs.SyncDir("/d").ok());
  ASSERT_TRUE(fs.WriteFile("/d/late", Bytes("three")).ok());     // nothing synced
  ASSERT_TRUE(fs.WriteFile("/d/synced", Bytes("ONE!")).ok());    // new data not synced
  ASSERT_TRUE(fs.Rename("/d/data-only", "/d/renamed").ok());     // rename not synced
  fs.Reboot(Mode::kPowerLoss);
  EXPECT_EQ(fs.ListFilesRecursive("/"), (std::vector<std::string>{"/d/data-only", "/d/synced"}));
  EXPECT_EQ(*fs.ReadFile("/d/synced"), Bytes("one"));
  EXPECT_TRUE(fs.ReadFile("/d/data-only")->empty());  // entry durable, data never synced
}

TEST(StoreFileSystem, MetadataJournaledKeepsNamesNotData) {
  FaultInjectingFileSystem fs;
  ASSERT_TRUE(fs.MakeDir("/d").ok());
  ASSERT_TRUE(fs.WriteFile("/d/x.tmp", Bytes("new")).ok());
  ASSERT_TRUE(fs.Rename("/d/x.tmp", "/d/x").ok());  // no fsync of the data: the classic bug
  fs.Reboot(Mode::kMetadataJournaled);
  EXPECT_EQ(fs.ListFilesRecursive("/"), (std::vector<std::string>{"/d/x"}));
  EXPECT_TRUE(fs.ReadFile("/d/x")->empty());
}

TEST(StoreFileSystem, ProcessKillKeepsEverything) {
  FaultInjectingFileSystem fs;
  ASSERT_TRUE(fs.MakeDir("/d").ok());
  ASSERT_TRUE(fs.WriteFile("/d/x", Bytes("new")).ok());
  fs.CrashAt(fs.op_count());
  EXPECT_FALSE(fs.WriteFile("/d/y", Bytes("y")).ok());
  EXPECT_TRUE(fs.crashed());
  EXPECT_FALSE(fs.ReadFile("/d/x").ok());  // a dead process reads nothing
  fs.Reboot(Mode::kProcessKill);
  EXPECT_EQ(fs.ListFilesRecursive("/"), (std::vector<std::string>{"/d/x"}));
  EXPECT_EQ(*fs.ReadFile("/d/x"), Bytes("new"));
}

TEST(StoreFileSystem, FailAtNthOpAndSticky) {
  FaultInjectingFileSystem fs;
  ASSERT_TRUE(fs.MakeDir("/d").ok());
  fs.ResetOpCount();
  fs.FailAt(1, StatusCode::kNoSpace, FaultInjectingFileSystem::kDiskFullOps);
  EXPECT_TRUE(fs.WriteFile("/d/a", Bytes("aaaa")).ok());  // op 0
  Status st = fs.WriteFile("/d/b", Bytes("bbbb"));        // op 1: fails part-way
  EXPECT_EQ(st.code(), StatusCode::kNoSpace);
  EXPECT_EQ(*fs.ReadFile("/d/b"), Bytes("bb"));
  EXPECT_TRUE(fs.fault_fired());
  EXPECT_EQ(fs.WriteFile("/d/c", Bytes("c")).code(), StatusCode::kNoSpace);  // still full
  EXPECT_TRUE(fs.Unlink("/d/b").ok());                                        // deleting works
  EXPECT_TRUE(fs.SyncDir("/d").ok());
  fs.ClearFaults();
  EXPECT_TRUE(fs.WriteFile("/d/c", Bytes("c")).ok());
  fs.FailAt(fs.op_count(), StatusCode::kIoError);
  EXPECT_EQ(fs.SyncFile("/d/c").code(), StatusCode::kIoError);
  EXPECT_TRUE(fs.SyncFile("/d/c").ok());  // one-shot
}

TEST(StoreFileSystem, WriteFileAtomicLeavesOldOrNew) {
  for (uint64_t k = 0;; ++k) {
    FaultInjectingFileSystem fs;
    ASSERT_TRUE(fs.MakeDir("/d").ok());
    ASSERT_TRUE(WriteFileAtomic(fs, "/d", "f", Bytes("old")).ok());
    ASSERT_TRUE(fs.SyncDir("/").ok());
    fs.ResetOpCount();
    fs.CrashAt(k);
    Status st = WriteFileAtomic(fs, "/d", "f", Bytes("new"));
    if (!fs.fault_fired()) {
      EXPECT_TRUE(st.ok());
      EXPECT_GE(k, 4u);
      break;
    }
    fs.Reboot(Mode::kPowerLoss);
    auto got = fs.ReadFile("/d/f");
    ASSERT_TRUE(got.ok()) << k;
    EXPECT_TRUE(*got == Bytes("old") || *got == Bytes("new")) << k;
  }
}

// A write that fails part way (full disk, failed fsync or rename) leaves no temp file, and the
// bytes it got onto the disk are overwritten with zeros and synced before the unlink: they may be
// KV data that an erasure must not find later.
TEST(StoreFileSystem, WriteFileAtomicZeroesAFailedTempFileBeforeUnlinking) {
  for (const char* failing : {"write ", "fsync ", "rename "}) {
    FaultInjectingFileSystem fs;
    ASSERT_TRUE(fs.MakeDir("/d").ok());
    fs.ResetOpCount();
    const uint64_t at = std::string(failing) == "write " ? 0 : (std::string(failing) == "fsync " ? 1 : 2);
    fs.FailAt(at, StatusCode::kResourceExhausted);
    EXPECT_FALSE(WriteFileAtomic(fs, "/d", "f", Bytes("secret attention state")).ok()) << failing;
    const std::vector<std::string> log = fs.op_log();
    ASSERT_GE(log.size(), at + 1) << failing;
    EXPECT_EQ(log[at].rfind(failing, 0), 0u) << log[at];
    const std::vector<std::string> after(log.begin() + static_cast<std::ptrdiff_t>(at) + 1, log.end());
    const std::vector<std::string> want = {"overwrite /d/f.tmp", "fsync /d/f.tmp", "unlink /d/f.tmp"};
    EXPECT_EQ(after, want) << failing;
    EXPECT_TRUE(fs.ListFilesRecursive("/d").empty()) << failing;
  }
}

}  // namespace
}  // namespace kvfs::store
