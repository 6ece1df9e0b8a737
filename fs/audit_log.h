// The audit log (.audit.log): one JSON line per erasure, export, import and configuration
// change. It records who did what to which agent and how many bytes and blocks it touched,
// never any prompt or reply text. Lines are appended and fsynced to a file in the store
// directory so the trail survives restarts; without a path (tests) it is kept in memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/store/cache_store.h"
#include "engine/store/fs.h"

namespace kvfs::fs {

struct AuditEvent {
  int64_t time_ms = 0;
  uint32_t uid = 0;
  std::string agent;   // or the prefix name for prefix actions
  std::string action;  // erase | erase_cache | export | import | config | system | prefix_add | prefix_remove
  std::optional<store::EraseReport> erased = std::nullopt;
  std::optional<uint64_t> bytes = std::nullopt;  // export / import / system / prefix sizes
  // The erasure was interrupted by a crash (kill -9, power loss) and its line is written by the
  // next start, which found it done (or finished it); its counts are not known then.
  bool completed_at_start = false;
  // Erasures: whose agent it was (uid is who erased it: root may erase anyone's).
  std::optional<uint32_t> owner_uid = std::nullopt;
};

// An erasure about to start, on disk until its line is written (AuditLog::Intend).
struct AuditIntent {
  std::string id;
  AuditEvent event;
};

std::string FormatAuditLine(const AuditEvent& event);  // one JSON object and '\n'

class AuditLog {
 public:
  // Opens (creating if needed) `path` for appending; empty path: in memory. `sync` makes the
  // appended lines durable (fsync; tests inject its failures).
  using SyncFunction = int (*)(int fd);
  static Result<std::unique_ptr<AuditLog>> Open(const std::string& path, SyncFunction sync = ::fsync);

  // Appends and fsyncs one line. A failure is returned (and logged by the caller); the
  // operation it records has already happened, so the line is kept and written before the next
  // one that can be (a full disk freed), or at the close (up to kMaxPendingBytes of such lines).
  Status Append(const AuditEvent& event);
  // Appends and fsyncs one line for an operation that has not happened yet (an export's first
  // read): on a failure the line is not kept, and the caller refuses the operation. Not kept
  // in the file either: a line written whose fsync failed is cut off again, so that the retry
  // that follows does not leave two lines for one export.
  Status AppendBefore(const AuditEvent& event);
  static constexpr size_t kMaxPendingBytes = size_t{1} << 20;
  // Erasures are logged in two steps, so that a crash between an erasure and its line cannot
  // leave it off the log: an intent, written and fsynced before the erasure starts, and the
  // line, whose Complete drops the intent (Drop: the erasure did not happen). Intents left by a
  // crash are listed by LeftIntents after Open; the caller writes the line of each erasure that
  // happened (completed_at_start) and drops them all. Intents live in `path`.intents/.
  Result<std::string> Intend(const AuditEvent& event);
  Status Complete(const std::string& intent_id, const AuditEvent& event);
  void Drop(const std::string& intent_id);
  const std::vector<AuditIntent>& LeftIntents() const { return left_intents_; }
  // Whether the log has the line of an intent (a crash came between the line and the intent's
  // removal): a line of the same agent, action and uid since the intent was made.
  bool HasLineOf(const AuditIntent& intent) const;

  // Bytes [offset, offset + size) of the log.
  Result<std::string> Read(uint64_t offset, size_t size) const;
  uint64_t Size() const;
  ~AuditLog();

 private:
  AuditLog(int fd, std::string intents_dir) : fd_(fd), intents_dir_(std::move(intents_dir)) {}
  Status LoadIntents();
  // Append's and AppendBefore's work: `keep` keeps a line that could not be written for later.
  Status AppendLine(const std::string& line, bool keep);
  // Overwrites an intent file with zeros, then unlinks it: whether the unlink succeeded.
  bool ZeroAndUnlink(const std::string& path);
  // Writes and fsyncs `text` (whole lines) at the end of the file; on a failed write leaves none
  // of it (size_ unchanged) where it can; a failed fsync leaves it written (mu_).
  Status WriteLines(const std::string& text);
  mutable std::mutex mu_;
  std::string pending_;   // lines whose append failed, oldest first (mu_)
  int fd_ = -1;           // -1: in memory
  SyncFunction sync_ = ::fsync;
  std::string memory_;
  uint64_t size_ = 0;
  std::string intents_dir_;                        // empty: in memory
  store::PosixFileSystem fs_;                      // for the intents
  std::map<std::string, AuditEvent> memory_intents_;
  uint64_t next_intent_ = 0;
  std::vector<AuditIntent> left_intents_;          // found at Open
};

}  // namespace kvfs::fs
