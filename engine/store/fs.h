// The file-system seam of the cache store. Every byte the store puts on disk goes through this
// interface, so tests can swap in FaultInjectingFileSystem (fault_fs.h) and fail or "crash" at
// any mutating operation. The interface is path-based and deliberately small: only what the
// store's crash-safe protocol needs (write, fsync, rename, fsync of the directory).
//
// Durability contract (POSIX, as ext4 honours it and as the fault-injecting model enforces):
// file data survives a power loss only after SyncFile; a create, rename, unlink or mkdir survives
// only after SyncDir of the directory holding the entry.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace kvfs::store {

struct DirEntry {
  std::string name;
  bool is_dir = false;
  // A symbolic link (never followed as a directory): the store never made one, so it is not
  // its file, and overwriting "it" would overwrite whatever it points at.
  bool is_symlink = false;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // --- mutating operations (each one is a numbered step for fault injection) ---
  // Creates or truncates `path` and writes `data` in full. Not durable until SyncFile (data)
  // and SyncDir of the parent (the directory entry).
  virtual Status WriteFile(const std::string& path, std::span<const uint8_t> data) = 0;
  // Overwrites the existing file's current contents with zeros in place (same length, no
  // truncation), so that an unlink afterwards does not leave the old bytes in those blocks.
  virtual Status OverwriteWithZeros(const std::string& path) = 0;
  virtual Status SyncFile(const std::string& path) = 0;
  // Atomically replaces `to` (if any) with `from` (same file system).
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Unlink(const std::string& path) = 0;
  // Gives the existing file `from` a second name `to` (a hard link; `to` must not exist). A
  // file system without hard links answers kUnsupported.
  virtual Status Link(const std::string& from, const std::string& to) = 0;
  // Creates a directory; Ok if it already exists as a directory.
  virtual Status MakeDir(const std::string& path) = 0;
  virtual Status RemoveDir(const std::string& path) = 0;  // must be empty
  virtual Status SyncDir(const std::string& path) = 0;

  // --- read-only operations ---
  virtual Result<std::vector<uint8_t>> ReadFile(const std::string& path) = 0;
  // Fills `dst` from `offset` (pread), so a payload can land straight in its final buffer; a
  // file too short for that is kCorrupt.
  virtual Status ReadAt(const std::string& path, uint64_t offset, std::span<uint8_t> dst) = 0;
  virtual Result<std::vector<DirEntry>> ListDir(const std::string& path) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  // kNotFound when absent; other errors are real failures.
  virtual Result<bool> IsDir(const std::string& path) = 0;
  // Bytes available to an unprivileged writer (statvfs f_bavail * f_frsize).
  virtual Result<uint64_t> FreeBytes(const std::string& path) = 0;
  // Whether two existing paths name one file (hard links of each other; links not followed).
  virtual Result<bool> SameFile(const std::string& a, const std::string& b) = 0;
  // How many names the file has (st_nlink; a symbolic link is not followed). Above 1, unlinking
  // this name frees none of its bytes.
  virtual Result<uint64_t> LinkCount(const std::string& path) = 0;
};

// The real thing: open/write/fsync/rename/unlink on the host file system. Stateless, so one
// instance may be shared by any number of threads. EINTR and short writes are retried.
class PosixFileSystem final : public FileSystem {
 public:
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
};

// Maps an errno to a Status naming the operation and path: ENOSPC/EDQUOT -> kNoSpace,
// ENOENT -> kNotFound, everything else -> kIoError.
Status ErrnoStatus(int err, std::string_view op, const std::string& path);

// Writes all n bytes at offset of fd, through short writes and EINTR: 0, or the errno of the
// failure (a write that makes no progress counts as ENOSPC).
int PwriteAll(int fd, const void* p, size_t n, uint64_t offset);

// Joins path components with exactly one '/'.
std::string JoinPath(std::string_view a, std::string_view b);

// Publishes `data` as `dir/name` crash-safely: write `dir/name.tmp`, fsync it, rename over
// `dir/name`, fsync `dir`. After an Ok return the new contents are durable; after an error or a
// crash at any step, `dir/name` is either its old contents or the new ones (a stray `.tmp` may
// be left for the store's Open to remove). On error the temp file is overwritten with zeros,
// synced and unlinked (best effort): what it held may be KV data.
// With `zero_replaced`, an existing `dir/name` is overwritten with zeros and synced before the
// rename drops it, so that its text does not stay in freed disk blocks (a manifest holds the
// conversation; erasure overwrites what it unlinks, and a rename unlinks too). A crash between
// the two then leaves zeros there, not the old contents: only for files the caller can do
// without (a manifest, whose previous turn manifest.prev.json keeps).
Status WriteFileAtomic(FileSystem& fs, const std::string& dir, const std::string& name,
                       std::span<const uint8_t> data, bool zero_replaced = false);
// What zero_replaced does, alone: zeros over `path` and an fsync, if the file exists.
Status ZeroFileBeforeReplacing(FileSystem& fs, const std::string& path);

// Suffix of temp files; any name ending in it is garbage from an interrupted write.
inline constexpr std::string_view kTempSuffix = ".tmp";
// A second name that a replaced file keeps until it is zeroed (CacheStore::ReplaceZeroingOld).
inline constexpr std::string_view kRetiredSuffix = ".retired";

}  // namespace kvfs::store
