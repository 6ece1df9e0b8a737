// Rendering of the generated files: an agent's status.json, the root's .status (text),
// .status.json and .metrics (Prometheus text exposition), and transcript entries.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/runtime/agent_engine.h"
#include "fs/agent_record.h"

namespace kvfs::fs {

// Counters the filesystem keeps itself (the engine's are in EngineStatus).
struct FsMetrics {
  static constexpr std::array<double, 11> kTtftBucketsSeconds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                                 0.5,   1.0,  2.5,   5.0,  10.0};
  uint64_t turns_submitted = 0;
  uint64_t turns_ok = 0;
  uint64_t turns_failed = 0;
  uint64_t turns_rejected_queue_full = 0;
  uint64_t prompts_refused = 0;  // not UTF-8 or over the size limit
  uint64_t exports = 0, export_bytes = 0;
  uint64_t imports = 0, import_bytes = 0, imports_refused = 0;
  uint64_t agents_erased = 0, caches_erased = 0, prefixes_erased = 0;  // as .audit.log's erase, erase_cache, prefix_remove
  uint64_t Erasures() const { return agents_erased + caches_erased + prefixes_erased; }
  // Cumulative TTFT histogram of the turns finished through this mount.
  std::array<uint64_t, kTtftBucketsSeconds.size()> ttft_bucket_counts{};
  uint64_t ttft_count = 0;
  double ttft_sum_seconds = 0;
  void ObserveTtft(double ms);
};

// status.json. `failure` is the filesystem's record of the latest failed turn (its errno name
// is shown as last_error_code); `refused`, when not null, the latest refused write.
nlohmann::json AgentStatusJson(const AgentInfo& info, const Status& failure, const RefusedWrite* refused = nullptr);

// .status.json and .status; their erasures are the filesystem's, by kind (the lines of .audit.log).
nlohmann::json EngineStatusJson(const EngineStatus& status, const FsMetrics& fs);
std::string EngineStatusText(const EngineStatus& status, const FsMetrics& fs);
std::string MetricsText(const EngineStatus& status, const FsMetrics& fs, size_t agents);

std::string HumanBytes(int64_t bytes);

// A generated JSON file's text: indented, newline-terminated. Strings that are not UTF-8 (an
// error message quoting the bytes of a damaged file or a refused write) have their bad bytes
// replaced by U+FFFD, so the file stays readable: a strict dump would throw, and the read EIO.
std::string JsonFileText(const nlohmann::json& j);

}  // namespace kvfs::fs
