// The audit log (.audit.log): one JSON line per erasure, export, import and configuration
// change. It records who did what to which agent and how many bytes and blocks it touched,
// never any prompt or reply text. Lines are appended and fsynced to a file in the store
// directory so the trail survives restarts; without a path (tests) it is kept in memory.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/store/cache_store.h"

namespace kvfs::fs {

struct AuditEvent {
  int64_t time_ms = 0;
  uint32_t uid = 0;
  std::string agent;   // or the prefix name for prefix actions
  std::string action;  // erase | erase_cache | export | import | config | system | prefix_add | prefix_remove
  std::optional<store::EraseReport> erased = std::nullopt;
  std::optional<uint64_t> bytes = std::nullopt;  // export / import / system / prefix sizes
};

std::string FormatAuditLine(const AuditEvent& event);  // one JSON object and '\n'

class AuditLog {
 public:
  // Opens (creating if needed) `path` for appending; empty path: in memory.
  static Result<std::unique_ptr<AuditLog>> Open(const std::string& path);

  // Appends and fsyncs one line. A failure is returned (and logged by the caller); the
  // operation it records has already happened.
  Status Append(const AuditEvent& event);
  // Bytes [offset, offset + size) of the log.
  Result<std::string> Read(uint64_t offset, size_t size) const;
  uint64_t Size() const;
  ~AuditLog();

 private:
  explicit AuditLog(int fd) : fd_(fd) {}
  mutable std::mutex mu_;
  int fd_ = -1;           // -1: in memory
  std::string memory_;
  uint64_t size_ = 0;
};

}  // namespace kvfs::fs
