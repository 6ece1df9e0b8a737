// An open file or directory of AgentStore (private to fs/).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fs/agent_store.h"
#include "fs/utf8.h"

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
  bool Resize(uint64_t bytes, uint64_t limit) {
    if (!total_) return true;
    if (bytes <= held_) {
      total_->fetch_sub(held_ - bytes);
      held_ = bytes;
      return true;
    }
    const uint64_t more = bytes - held_;
    uint64_t now = total_->load();
    do {
      if (now + more > limit) return false;
    } while (!total_->compare_exchange_weak(now, now + more));
    held_ = bytes;
    return true;
  }

 private:
  std::shared_ptr<std::atomic<uint64_t>> total_;
  uint64_t held_ = 0;
};

struct AgentStore::Handle {
  enum class Kind {
    kDirectory,   // a snapshot of the entries
    kPrompt,      // write-only buffer; becomes a turn at close
    kResponse,    // streams the turn current at open
    kTranscript,  // rendered on every read (it grows)
    kAuditLog,    // read live from the log
    kSnapshot,    // read-only content rendered at open (status files, an export, ...)
    kEditable,    // system, config.json, a prefix file: a buffer applied at close
    kImport,      // kv.safetensors written: imported at close
  };

  Kind kind = Kind::kSnapshot;
  InodeId ino = 0;
  Node node;        // copy of the node at open (kind, agent, prefix name)
  uint32_t uid = 0; // who opened it (for the audit log)

  std::mutex mu;      // guards the fields below (writes to one fd may come concurrently)
  std::string data;   // snapshot or write buffer
  MemoryShare import_memory;  // kImport: data's bytes, out of the daemon-wide import budget
  bool dirty = false; // written since the last apply
  bool append = false;
  Utf8Validator utf8;
  Status refused;     // prompt: the first error; this prompt never becomes a turn
  std::shared_ptr<TurnStream> turn;                      // response
  std::shared_ptr<const std::vector<DirEntry>> entries;  // directory
};

}  // namespace kvfs::fs
