// An in-memory FileSystem that models what a crash keeps and loses, and that fails or "crashes"
// at a chosen mutating operation. Tests run the store on it, crash at every operation index in
// turn, Reboot() and reopen the store on whatever survived.
//
// Model (POSIX durability, the way ext4 may lose data):
//   - every file has its current bytes and its durable bytes (those at its last SyncFile; empty
//     for a file never synced);
//   - every directory has its current entries and its durable entries (at its last SyncDir);
//     creates, renames, unlinks and mkdirs change only the current entries;
//   - Reboot(kPowerLoss): directories revert to their durable entries and files to their durable
//     bytes; Reboot(kMetadataJournaled): all namespace changes survive (as a journal may commit
//     them) but file bytes revert to the durable ones (the "zero-length file after rename"
//     failure); Reboot(kProcessKill): everything survives (kill -9: the page cache is intact).
// Faults: FailAt(n) makes the n-th mutating operation (0-based, counted since construction or
// ResetOpCount) fail with the given code; a failed WriteFile leaves the file created with the
// first half of its bytes, like a write that ran out of space. With `sticky_ops` the fault is a
// lasting condition of those kinds of operation (a disk that stays full): the first operation of
// those kinds at or after index n fails, and so does every later one. CrashAt(n): the n-th mutating
// operation does not happen and every operation after it, reads included, fails with kIoError
// ("the process is dead") until Reboot().
//
// Thread-safe: one mutex around the whole model.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/store/fs.h"

namespace kvfs::store {

class FaultInjectingFileSystem final : public FileSystem {
 public:
  // Kinds of mutating operations, as bits for sticky failures.
  enum OpKind : uint32_t {
    kOpWrite = 1u << 0,
    kOpOverwrite = 1u << 1,
    kOpSyncFile = 1u << 2,
    kOpRename = 1u << 3,
    kOpUnlink = 1u << 4,
    kOpMkdir = 1u << 5,
    kOpRmdir = 1u << 6,
    kOpSyncDir = 1u << 7,
    kOpLink = 1u << 8,
  };
  // Operations a full disk refuses: those that allocate space (data, new entries).
  static constexpr uint32_t kDiskFullOps = kOpWrite | kOpMkdir | kOpRename | kOpLink;

  enum class CrashMode { kPowerLoss, kMetadataJournaled, kProcessKill };

  FaultInjectingFileSystem();

  void FailAt(uint64_t op_index, StatusCode code, uint32_t sticky_ops = 0);
  void CrashAt(uint64_t op_index);
  void ClearFaults();
  void ResetOpCount();
  uint64_t op_count() const;
  bool crashed() const;
  // True once an armed fault has fired (a failure or a crash).
  bool fault_fired() const;
  // Applies a crash under `mode` (see above), clears faults and the crashed state.
  void Reboot(CrashMode mode);
  // Every file (not directory) under `dir`, recursively, as full paths; sorted.
  std::vector<std::string> ListFilesRecursive(const std::string& dir);
  // Test hooks that bypass fault injection and durability (they change current and durable
  // bytes alike, like a bit flip on the medium).
  Status FlipByte(const std::string& path, uint64_t offset, uint8_t mask = 0x01);
  Status Truncate(const std::string& path, uint64_t length);
  // What FreeBytes reports (default 1 TiB); it does not limit writes (FailAt does that).
  void SetFreeBytes(uint64_t bytes);
  // A disk of `bytes` (file contents only): FreeBytes reports what the named files leave of it,
  // and a write that would not fit fails with kNoSpace, leaving the file with what fit. Space
  // comes back as files lose their last name. Overrides SetFreeBytes.
  void SetCapacity(uint64_t bytes);
  // Off: Link answers kUnsupported, as on vfat and some FUSE and network file systems.
  void SetHardLinks(bool supported);
  // The next `times` reads (ReadFile, ReadAt) of files whose path contains `part` fail with
  // kIoError, as a flaky medium's would; reads are not counted ops, so FailAt cannot reach them.
  void FailReads(const std::string& part, uint32_t times);
  // Reads of files whose path contains `part` wait `delay` first (outside this file system's
  // lock), as a slow medium's would, so that tests can order other threads' work between reads.
  // How many such reads have begun: SlowReadsBegun.
  void SlowReads(const std::string& part, std::chrono::milliseconds delay);
  uint64_t SlowReadsBegun() const;
  // The log of mutating operations so far ("write /s/x.tmp", ...), for test failure messages.
  std::vector<std::string> op_log() const;
  // Files whose bytes an operation gave back to the free space while any of them (current or
  // durable) was not zero: the last name unlinked or renamed over, or the file truncated by a
  // rewrite. On a real disk those bytes stay readable in free blocks, so erasure must zero
  // first. One "op: path" line each, since construction; reboots are not counted.
  std::vector<std::string> released_unzeroed() const;

  Status WriteFile(const std::string& path, std::span<const uint8_t> data) override;
  Status OverwriteWithZeros(const std::string& path) override;
  Status SyncFile(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Unlink(const std::string& path) override;
  Status Link(const std::string& from, const std::string& to) override;
  Status MakeDir(const std::string& path) override;
  Status RemoveDir(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  Result<std::vector<uint8_t>> ReadFile(const std::string& path) override;
  Status ReadAt(const std::string& path, uint64_t offset, std::span<uint8_t> dst) override;
  Result<std::vector<DirEntry>> ListDir(const std::string& path) override;
  Result<uint64_t> FileSize(const std::string& path) override;
  Result<bool> IsDir(const std::string& path) override;
  Result<uint64_t> FreeBytes(const std::string& path) override;
  Result<bool> SameFile(const std::string& a, const std::string& b) override;
  Result<uint64_t> LinkCount(const std::string& path) override;

 private:
  struct Inode {
    bool is_dir = false;
    std::vector<uint8_t> data, durable_data;
    std::map<std::string, uint64_t> entries, durable_entries;
  };
  enum class Gate { kProceed, kFail, kCrash };
  struct Resolved {
    uint64_t parent = 0;  // directory inode holding the entry
    std::string name;     // last component
    uint64_t ino = 0;     // 0 when the entry does not exist
  };

  // Counts one mutating operation and decides whether it runs, fails or crashes.
  Gate Admit(OpKind kind, const std::string& what, Status* failure);
  Status CheckAlive(const std::string& path) const;
  Status CheckReadable(const std::string& path);  // CheckAlive, then FailReads
  void WaitIfSlow(const std::string& path);       // SlowReads; without the lock
  Result<Resolved> Resolve(const std::string& path) const;
  Result<uint64_t> Lookup(const std::string& path) const;  // existing inode or kNotFound
  uint64_t NewInode(bool is_dir);
  size_t NamesOf(uint64_t ino) const;  // current entries naming `ino`
  uint64_t UsedBytes() const;          // current bytes of the files that have a name
  // Records `what` in released_ when a file that lost a name or its bytes held non-zero data.
  void NoteRelease(uint64_t ino, const std::string& what);

  mutable std::mutex mu_;
  std::map<uint64_t, Inode> inodes_;
  uint64_t next_ino_ = 2;
  static constexpr uint64_t kRoot = 1;
  uint64_t op_count_ = 0;
  std::vector<std::string> log_;
  std::vector<std::string> released_;
  bool crashed_ = false;
  bool fired_ = false;
  std::string failing_reads_part_;  // FailReads
  uint32_t failing_reads_left_ = 0;
  std::string slow_reads_part_;  // SlowReads
  std::chrono::milliseconds slow_reads_delay_{0};
  uint64_t slow_reads_begun_ = 0;
  enum class FaultType { kNone, kFail, kCrash } fault_ = FaultType::kNone;
  uint64_t fault_at_ = 0;
  StatusCode fault_code_ = StatusCode::kIoError;
  uint32_t sticky_ops_ = 0;
  bool sticky_active_ = false;
  uint64_t free_bytes_ = uint64_t{1} << 40;
  uint64_t capacity_ = 0;  // 0: no capacity (free_bytes_ is reported)
  bool hard_links_ = true;
};

}  // namespace kvfs::store
