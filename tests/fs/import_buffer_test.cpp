// ImportBuffer: a kv.safetensors being written stays in memory under the shared budget, moves
// into an unnamed file past spill_bytes under a disk budget, reads back exactly what was written
// (gaps as zeros), reserves memory for the import at close, and leaves zeros in the file's
// written blocks when it goes.
#include "fs/import_buffer.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kvfs::fs {
namespace {

class ImportBufferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kvfs_import_buffer_" + std::to_string(::getpid());
    ::mkdir(dir_.c_str(), 0700);
  }
  void TearDown() override { ::rmdir(dir_.c_str()); }
  ImportBufferOptions Options(uint64_t memory_limit, uint64_t spill_bytes, bool spill = true,
                              uint64_t disk_limit = uint64_t{1} << 40) {
    return ImportBufferOptions{.memory_total = total_, .memory_limit = memory_limit,
                               .spill_dir = spill ? dir_ : std::string(), .spill_bytes = spill_bytes,
                               .disk_total = disk_, .disk_limit = disk_limit};
  }
  // Names in the spill directory: an import's file never has one there.
  int Entries() const {
    int n = 0;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) n += std::string(e->d_name) != "." && std::string(e->d_name) != "..";
      ::closedir(d);
    }
    return n;
  }
  static std::string Pattern(size_t n, char seed) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i % 23);
    return s;
  }

  std::string dir_;
  std::shared_ptr<std::atomic<uint64_t>> total_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> disk_ = std::make_shared<std::atomic<uint64_t>>(0);
};

TEST_F(ImportBufferTest, StaysInMemoryUnderTheBudgetWithoutASpillDirectory) {
  ImportBuffer a(Options(1000, 100, false)), b(Options(1000, 100, false));
  ASSERT_TRUE(a.Write(0, Pattern(600, 'a')).ok());
  EXPECT_EQ(total_->load(), 600u);
  EXPECT_EQ(b.Write(0, Pattern(500, 'b')).code(), StatusCode::kNoSpace);
  EXPECT_EQ(b.Write(2000, "x").code(), StatusCode::kNoSpace);  // the gap counts
  ASSERT_TRUE(b.Write(0, Pattern(400, 'b')).ok());
  EXPECT_FALSE(a.spilled() || b.spilled());
  ASSERT_TRUE(a.Resize(100).ok());  // shrinking gives memory back
  EXPECT_EQ(total_->load(), 500u);
  a.Clear();
  EXPECT_EQ(total_->load(), 400u);
}

TEST_F(ImportBufferTest, MovesIntoAnUnnamedFileAndReadsBackWhatWasWritten) {
  ImportBuffer buffer(Options(10000, 100));
  std::string want = Pattern(60, 'a');
  ASSERT_TRUE(buffer.Write(0, want).ok());
  EXPECT_FALSE(buffer.spilled());
  EXPECT_EQ(total_->load(), 60u);
  // Past 100 bytes, with a gap: into the file, the memory given back.
  ASSERT_TRUE(buffer.Write(90, Pattern(30, 'b')).ok());
  ASSERT_TRUE(buffer.spilled());
  EXPECT_EQ(total_->load(), 0u);
  EXPECT_EQ(Entries(), 0);
  want += std::string(30, '\0') + Pattern(30, 'b');
  // Out of order, overwriting; a 0-byte write past the end changes nothing.
  ASSERT_TRUE(buffer.Write(3000, Pattern(2000, 'c')).ok());
  ASSERT_TRUE(buffer.Write(9000, "").ok());
  ASSERT_TRUE(buffer.Write(10, Pattern(5, 'd')).ok());
  want.resize(3000, '\0');
  want += Pattern(2000, 'c');
  want.replace(10, 5, Pattern(5, 'd'));
  EXPECT_EQ(buffer.size(), want.size());
  EXPECT_EQ(disk_->load(), want.size());
  EXPECT_EQ(*buffer.Read(0, 1 << 20), want);
  EXPECT_EQ(*buffer.Read(95, 10), want.substr(95, 10));
  EXPECT_EQ(*buffer.Read(want.size(), 10), "");
  // Shrinking and growing again: the cut bytes come back as zeros.
  ASSERT_TRUE(buffer.Resize(100).ok());
  ASSERT_TRUE(buffer.Resize(200).ok());
  want.resize(100);
  want.resize(200, '\0');
  EXPECT_EQ(*buffer.Read(0, 1000), want);
  std::string seen;
  uint64_t memory_while_importing = 0;
  ASSERT_TRUE(buffer.Consume([&](std::string_view bytes) {
                      seen = std::string(bytes);
                      memory_while_importing = total_->load();  // the importer copies the file
                      return Status::Ok();
                    })
                  .ok());
  EXPECT_EQ(seen, want);
  EXPECT_EQ(memory_while_importing, want.size());
  EXPECT_FALSE(buffer.spilled());
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_EQ(total_->load(), 0u);
  EXPECT_EQ(disk_->load(), 0u);
  EXPECT_EQ(Entries(), 0);
}

// Below spill_bytes too, a write the memory budget cannot take goes to disk instead of failing.
TEST_F(ImportBufferTest, SpillsWhenTheMemoryBudgetIsFull) {
  ImportBuffer a(Options(1000, 100000)), b(Options(1000, 100000));
  ASSERT_TRUE(a.Write(0, Pattern(600, 'a')).ok());
  ASSERT_TRUE(b.Write(0, Pattern(300, 'b')).ok());
  EXPECT_FALSE(a.spilled() || b.spilled());
  ASSERT_TRUE(b.Write(300, Pattern(300, 'c')).ok());  // 600 + 600 > 1000
  EXPECT_TRUE(b.spilled());
  EXPECT_FALSE(a.spilled());
  EXPECT_EQ(total_->load(), 600u);
  EXPECT_EQ(*b.Read(0, 1000), Pattern(300, 'b') + Pattern(300, 'c'));
  ASSERT_TRUE(a.Resize(2000).ok());  // a truncation that grows past the budget too
  EXPECT_TRUE(a.spilled());
  EXPECT_EQ(total_->load(), 0u);
  EXPECT_EQ(*a.Read(0, 5000), Pattern(600, 'a') + std::string(1400, '\0'));
}

// Spilled files share a disk budget as in-memory ones share memory; the import at close needs
// the file's size in memory, and without it the file is refused with ENOSPC (and dropped).
TEST_F(ImportBufferTest, SpilledFilesShareADiskBudgetAndTheImportReservesMemory) {
  ImportBuffer a(Options(1000, 100, true, 5000)), b(Options(1000, 100, true, 5000));
  ASSERT_TRUE(a.Write(0, Pattern(3000, 'a')).ok());
  ASSERT_TRUE(a.spilled());
  EXPECT_EQ(b.Write(0, Pattern(2500, 'b')).code(), StatusCode::kNoSpace);  // 3000 + 2500 > 5000
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(disk_->load(), 3000u);
  ASSERT_TRUE(b.Write(0, Pattern(2000, 'b')).ok());
  EXPECT_EQ(b.Resize(2001).code(), StatusCode::kNoSpace);
  ASSERT_TRUE(a.Resize(500).ok());  // shrinking gives disk back
  EXPECT_EQ(disk_->load(), 2500u);
  ASSERT_TRUE(b.Write(2000, Pattern(2000, 'b')).ok());
  EXPECT_EQ(total_->load(), 0u);  // spilled: no memory held while writing
  bool called = false;
  const Status s = b.Consume([&](std::string_view) {
    called = true;
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.message();  // 4000 bytes, 1000 of memory
  EXPECT_FALSE(called);
  EXPECT_FALSE(b.spilled());
  EXPECT_EQ(disk_->load(), 500u);
  EXPECT_EQ(total_->load(), 0u);
}

TEST_F(ImportBufferTest, ConsumePassesOnTheImportersError) {
  ImportBuffer buffer(Options(1000, 10));
  ASSERT_TRUE(buffer.Write(0, Pattern(50, 'a')).ok());
  ASSERT_TRUE(buffer.spilled());
  const Status s = buffer.Consume([](std::string_view) { return InvalidArgument("not a kv cache file"); });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(buffer.spilled());
}

// The bytes are KV data: when the buffer goes, zeros are written over them (and synced) before
// the file is closed, so its freed blocks hold nothing of the cache. A second descriptor keeps
// the unnamed file readable after the buffer closed its own.
TEST_F(ImportBufferTest, LeavesZerosInTheFileWhenItGoes) {
  for (const bool consumed : {false, true}) {
    auto buffer = std::make_unique<ImportBuffer>(Options(uint64_t{1} << 30, 10));
    const std::string bytes = Pattern((3 << 20) + 17, 'k');  // several 1 MiB rounds of zeros
    ASSERT_TRUE(buffer->Write(0, bytes).ok());
    ASSERT_TRUE(buffer->spilled());
    const int keep = ::dup(buffer->fd_for_test());
    ASSERT_GE(keep, 0);
    if (consumed) {
      ASSERT_TRUE(buffer->Consume([](std::string_view) { return Status::Ok(); }).ok());
    } else {
      buffer.reset();
    }
    std::string after(bytes.size(), 'x');
    ASSERT_EQ(::pread(keep, after.data(), after.size(), 0), static_cast<ssize_t>(after.size()));
    ::close(keep);
    EXPECT_EQ(after, std::string(bytes.size(), '\0')) << (consumed ? "consumed" : "dropped");
  }
}

// Zeros go over what was written, not over holes: a sparse file keeps its holes (writing zeros
// there would only allocate the blocks, up to the 16 GiB an import may declare).
TEST_F(ImportBufferTest, WipingSkipsHoles) {
  auto buffer = std::make_unique<ImportBuffer>(Options(1000, 10));
  const uint64_t far = uint64_t{1} << 30;
  ASSERT_TRUE(buffer->Write(0, Pattern(4096, 'a')).ok());
  ASSERT_TRUE(buffer->Write(far, Pattern(4096, 'b')).ok());
  const int keep = ::dup(buffer->fd_for_test());
  ASSERT_GE(keep, 0);
  struct stat before {};
  ASSERT_EQ(::fstat(keep, &before), 0);
  buffer.reset();
  struct stat after {};
  ASSERT_EQ(::fstat(keep, &after), 0);
  if (before.st_blocks * 512 < (64 << 20)) {  // the file system made a hole: it must stay one
    EXPECT_LT(after.st_blocks * 512, 64 << 20) << "the wipe filled the hole";
  }
  std::string head(4096, 'x'), tail(4096, 'x');
  ASSERT_EQ(::pread(keep, head.data(), head.size(), 0), 4096);
  ASSERT_EQ(::pread(keep, tail.data(), tail.size(), static_cast<off_t>(far)), 4096);
  ::close(keep);
  EXPECT_EQ(head, std::string(4096, '\0'));
  EXPECT_EQ(tail, std::string(4096, '\0'));
}

TEST_F(ImportBufferTest, AFailedSpillKeepsTheBytesInMemory) {
  ImportBufferOptions options = Options(1000, 100);
  options.spill_dir = dir_ + "/missing";
  ImportBuffer buffer(options);
  ASSERT_TRUE(buffer.Write(0, Pattern(80, 'a')).ok());
  const Status s = buffer.Write(80, Pattern(80, 'b'));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s.message();
  EXPECT_FALSE(buffer.spilled());
  EXPECT_EQ(*buffer.Read(0, 1000), Pattern(80, 'a'));
  EXPECT_EQ(total_->load(), 80u);
}

}  // namespace
}  // namespace kvfs::fs
