// What a kv.safetensors being written holds until close, when it is imported (private to fs/).
//
// A file starts in memory, drawing on a budget shared by every import being written (a
// MemoryShare). Past `spill_bytes`, or when that budget is full, and when a spill directory is
// set, its bytes move into an
// unnamed file there (O_TMPFILE, else a temporary name unlinked at once), drawing on a second
// shared budget, of disk; many slow or idle writers then hold disk, not memory. The import at
// close reads the file through a read-only mapping and copies the cache into memory, so it
// reserves the file's size from the memory budget for that while (ENOSPC at close when it is
// not there). The bytes are KV data: a spilled file's written ranges are overwritten with zeros
// and synced before it is closed, as the store does with its own temporary files, so that
// erasing the agent later leaves no copy in freed disk blocks (on file systems that overwrite in
// place; copy-on-write ones write the zeros elsewhere).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "engine/core/status.h"

namespace kvfs::fs {

// A share of a byte budget that several holders draw from (the memory of all import buffers),
// given back when the holder goes.
class MemoryShare {
 public:
  MemoryShare() = default;
  MemoryShare(const MemoryShare&) = delete;
  MemoryShare& operator=(const MemoryShare&) = delete;
  ~MemoryShare() {
    if (total_) total_->fetch_sub(held_);
  }
  void Attach(std::shared_ptr<std::atomic<uint64_t>> total) { total_ = std::move(total); }
  uint64_t held() const { return held_; }
  // Holds `bytes` from now on; false, holding what it held, when the total would pass `limit`.
  bool Resize(uint64_t bytes, uint64_t limit);

 private:
  std::shared_ptr<std::atomic<uint64_t>> total_;
  uint64_t held_ = 0;
};

struct ImportBufferOptions {
  std::shared_ptr<std::atomic<uint64_t>> memory_total;  // every import's memory together
  uint64_t memory_limit = 0;                            // ... may not pass this
  std::string spill_dir;    // where a large import goes; empty: it stays in memory
  uint64_t spill_bytes = 0; // sizes past this spill (when spill_dir is set)
  std::shared_ptr<std::atomic<uint64_t>> disk_total;    // every spilled import's size together
  uint64_t disk_limit = 0;                              // ... may not pass this
};

class ImportBuffer {
 public:
  explicit ImportBuffer(ImportBufferOptions options);
  ~ImportBuffer();  // wipes a spilled file
  ImportBuffer(const ImportBuffer&) = delete;
  ImportBuffer& operator=(const ImportBuffer&) = delete;

  uint64_t size() const { return size_; }
  bool spilled() const { return fd_ >= 0; }
  // Writes bytes at offset (a gap before it reads as zeros). kNoSpace when memory's budget or
  // the spill directory's disk is full: nothing is lost, the write can be tried again.
  Status Write(uint64_t offset, std::string_view bytes);
  // Makes the file `bytes` long (zeros when it grows).
  Status Resize(uint64_t bytes);
  // Up to size bytes from offset (a read through a descriptor opened for reading and writing).
  Result<std::string> Read(uint64_t offset, size_t size) const;
  // Calls f with the whole content (mapped when spilled, with its size reserved from the memory
  // budget while f runs), then drops it: memory back to the budget, a spilled file wiped and
  // closed.
  Status Consume(const std::function<Status(std::string_view)>& f);
  // Drops the content as Consume does, unread.
  void Clear();

  // Test hook: the spilled file's descriptor (-1 in memory).
  int fd_for_test() const { return fd_; }

 private:
  // Whether growing to new_size moves the content to disk: past spill_bytes, or when the memory
  // budget cannot take it (when it can, it is taken here).
  bool ShouldSpill(uint64_t new_size);
  Status Spill(uint64_t new_size);  // moves the memory content into a new unnamed file
  Status NoMemory(uint64_t bytes) const;
  void Wipe();                      // zeros over the spilled file's bytes, synced; then closed

  Status NoDisk(uint64_t bytes) const;

  ImportBufferOptions options_;
  MemoryShare memory_;
  MemoryShare disk_;       // a spilled file's size, out of the disk budget
  bool poisoned_ = false;  // a truncation failed after zeroing: the content is not what was written
  std::string data_;  // in memory
  int fd_ = -1;       // spilled
  uint64_t size_ = 0;
};

}  // namespace kvfs::fs
