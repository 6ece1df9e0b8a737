#include "fs/render.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "fs/agent_record.h"
#include "fs/errno_map.h"

namespace kvfs::fs {

void FsMetrics::ObserveTtft(double ms) {
  double seconds = ms / 1000.0;
  for (size_t i = 0; i < kTtftBucketsSeconds.size(); ++i) {
    if (seconds <= kTtftBucketsSeconds[i]) ++ttft_bucket_counts[i];
  }
  ++ttft_count;
  ttft_sum_seconds += seconds;
}

std::string RenderTranscriptEntry(const std::string& role, const std::string& text) {
  // A system prompt's one trailing newline (echo's) is not part of it (the model never sees it).
  const bool echoed = role == "system" && !text.empty() && text.back() == '\n';
  return "[" + role + "]\n" + text.substr(0, text.size() - (echoed ? 1 : 0)) + "\n\n";
}

std::string HumanBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(v) >= 1024.0 && unit < 4) v /= 1024.0, ++unit;
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, kUnits[unit]);
}

nlohmann::json AgentStatusJson(const AgentInfo& info, const Status& failure, const RefusedWrite* refused) {
  nlohmann::json j = {
      {"name", info.name},
      {"owner_uid", info.owner_uid},
      {"state", std::string(AgentStateName(info.state))},
      {"tokens", info.context_tokens},
      {"memory_bytes", info.memory_bytes},
      {"disk_bytes", info.disk_bytes},
      {"turns", info.turns},
      {"queued_turns", info.queued_turns},
      {"created_ms", info.created_ms},
      {"updated_ms", info.updated_ms},
      {"last_turn", nullptr},
      {"last_error", info.last_error},
      {"last_error_code", nullptr},
      {"last_refused_write", nullptr},
  };
  if (refused != nullptr) {
    j["last_refused_write"] = {{"file", refused->file},
                               {"error", refused->status.message()},
                               {"code", ErrnoName(ErrnoFromStatus(refused->status))},
                               {"time_ms", refused->time_ms}};
  }
  if (info.last_turn) j["last_turn"] = TurnStatsToJson(*info.last_turn);
  if (!failure.ok()) {
    if (info.last_error.empty()) j["last_error"] = failure.message();
    j["last_error_code"] = ErrnoName(ErrnoFromStatus(failure));
  }
  return j;
}

namespace {

double HitRate(const EngineStatus& s) {
  uint64_t total = s.block_hits + s.block_misses;
  return total == 0 ? 0.0 : static_cast<double>(s.block_hits) / static_cast<double>(total);
}

double Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

}  // namespace

nlohmann::json EngineStatusJson(const EngineStatus& s, const FsMetrics& fs) {
  nlohmann::json top = nlohmann::json::array();
  for (const CacheEntryStatus& e : s.top_entries) {
    top.push_back({{"agent", e.agent}, {"memory_bytes", e.memory_bytes}, {"disk_bytes", e.disk_bytes}, {"hits", e.hits}});
  }
  return {{"memory_used_bytes", s.memory_used_bytes},
          {"memory_budget_bytes", s.memory_budget_bytes},
          {"agents",
           {{"hot", s.agents_hot},
            {"warm", s.agents_warm},
            {"cold", s.agents_cold},
            {"queued", s.agents_queued},
            {"generating", s.agents_generating},
            {"error", s.agents_error}}},
          {"block_hits", s.block_hits},
          {"block_misses", s.block_misses},
          {"hit_rate", HitRate(s)},
          {"tokens_reused", s.tokens_reused},
          {"tokens_computed", s.tokens_computed},
          {"turns_completed", s.turns_completed},
          {"turns_failed", s.turns_failed},
          {"turns_cancelled", s.turns_cancelled},
          {"turns_in_flight", s.turns_in_flight},
          {"tokens_generated", s.tokens_generated},
          {"evictions", s.evictions},
          {"reload_bytes", s.reload_bytes},
          {"erasures", fs.Erasures()},
          {"erasures_by_kind", {{"agent", fs.agents_erased}, {"cache", fs.caches_erased}, {"prefix", fs.prefixes_erased}}},
          {"cpu_fallback_steps", s.cpu_fallback_steps},
          {"device_lost", s.device_lost},
          {"device_losses", s.device_losses},
          {"device_remakes", s.device_remakes},
          {"device_remake_failures", s.device_remake_failures},
          {"backend_warming_up", s.backend_warming_up},
          {"top_entries", top}};
}

std::string EngineStatusText(const EngineStatus& s, const FsMetrics& fs) {
  std::string out = "kvfs cache status\n";
  out += fmt::format("memory     {} used of {} budget ({:.1f}%)\n", HumanBytes(s.memory_used_bytes),
                     HumanBytes(s.memory_budget_bytes),
                     s.memory_budget_bytes > 0 ? 100.0 * static_cast<double>(s.memory_used_bytes) /
                                                     static_cast<double>(s.memory_budget_bytes)
                                               : 0.0);
  out += fmt::format("agents     {} hot, {} warm, {} cold, {} queued, {} generating, {} error\n", s.agents_hot,
                     s.agents_warm, s.agents_cold, s.agents_queued, s.agents_generating, s.agents_error);
  out += fmt::format("hit rate   {:.1f}% ({} block hits, {} misses)\n", 100.0 * HitRate(s), s.block_hits,
                     s.block_misses);
  out += fmt::format("tokens     {} reused, {} computed ({:.1f}% reused), {} generated\n", s.tokens_reused,
                     s.tokens_computed, Percent(s.tokens_reused, s.tokens_reused + s.tokens_computed),
                     s.tokens_generated);
  out += fmt::format("turns      {} completed, {} failed, {} cancelled, {} queued or running\n", s.turns_completed,
                     s.turns_failed, s.turns_cancelled, s.turns_in_flight);
  out += fmt::format("evictions  {} blocks; reloaded {} from disk; {} erasures ({} agents, {} caches, {} prefixes)\n",
                     s.evictions, HumanBytes(static_cast<int64_t>(s.reload_bytes)), fs.Erasures(), fs.agents_erased,
                     fs.caches_erased, fs.prefixes_erased);
  if (s.device_lost || s.device_losses > 0 || s.cpu_fallback_steps > 0) {
    std::string losses;
    if (s.device_losses > 0) {
      const std::string failed =
          s.device_remake_failures > 0
              ? fmt::format(", {} failed tr{} to make it again", s.device_remake_failures,
                            s.device_remake_failures == 1 ? "y" : "ies")
              : "";
      losses = fmt::format("{} ({} loss{}{}); ", s.device_lost ? "lost, every pass runs on the CPU" : "made again",
                           s.device_losses, s.device_losses == 1 ? "" : "es", failed);
    }
    out += fmt::format("device     {}{} steps ran on the CPU instead\n", losses, s.cpu_fallback_steps);
  }
  if (!s.top_entries.empty()) {
    out += fmt::format("\n{:<24} {:>12} {:>12} {:>10}\n", "top entries", "memory", "disk", "hits");
    for (const CacheEntryStatus& e : s.top_entries) {
      out += fmt::format("{:<24} {:>12} {:>12} {:>10}\n", e.agent, HumanBytes(e.memory_bytes), HumanBytes(e.disk_bytes),
                         e.hits);
    }
  }
  return out;
}

namespace {

void Metric(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

std::string Quantile(std::vector<size_t> values, double q) {
  if (values.empty()) return "NaN";
  std::sort(values.begin(), values.end());
  size_t i = static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  return std::to_string(values[std::min(i, values.size() - 1)]);
}

}  // namespace

std::string MetricsText(const EngineStatus& s, const FsMetrics& fs, size_t agents) {
  std::string out;
  Metric(out, "kvfs_agents", "gauge", "Agents, by the state their status.json shows.");
  out += fmt::format("kvfs_agents{{state=\"hot\"}} {}\nkvfs_agents{{state=\"warm\"}} {}\nkvfs_agents{{state=\"cold\"}} {}\n",
                     s.agents_hot, s.agents_warm, s.agents_cold);
  out += fmt::format("kvfs_agents{{state=\"queued\"}} {}\nkvfs_agents{{state=\"generating\"}} {}\n"
                     "kvfs_agents{{state=\"error\"}} {}\n",
                     s.agents_queued, s.agents_generating, s.agents_error);
  Metric(out, "kvfs_agents_listed", "gauge", "Agents shown in the mount.");
  out += fmt::format("kvfs_agents_listed {}\n", agents);
  // Every turn taken ends as one of these, so that the turns submitted through the mount are
  // ok + failed + cancelled + kvfs_turns_in_flight (cancelled: dropped from the queue unstarted).
  Metric(out, "kvfs_turns_total", "counter", "Turns finished by the engine, by result (cancelled: never started).");
  out += fmt::format("kvfs_turns_total{{result=\"ok\"}} {}\nkvfs_turns_total{{result=\"failed\"}} {}\n",
                     s.turns_completed, s.turns_failed);
  out += fmt::format("kvfs_turns_total{{result=\"cancelled\"}} {}\n", s.turns_cancelled);
  Metric(out, "kvfs_turns_in_flight", "gauge", "Turns submitted and not finished: queued or running.");
  out += fmt::format("kvfs_turns_in_flight {}\n", s.turns_in_flight);
  Metric(out, "kvfs_cpu_fallback_steps_total", "counter",
         "Forward steps meant for the Vulkan device that ran on the CPU (KV over the device budget, device lost).");
  out += fmt::format("kvfs_cpu_fallback_steps_total {}\n", s.cpu_fallback_steps);
  Metric(out, "kvfs_device_losses_total", "counter",
         "Times the Vulkan device was lost (passes then run on the CPU until it is made again).");
  out += fmt::format("kvfs_device_losses_total {}\n", s.device_losses);
  Metric(out, "kvfs_device_remakes_total", "counter", "Times a lost Vulkan device was made again, by result.");
  out += fmt::format("kvfs_device_remakes_total{{result=\"ok\"}} {}\nkvfs_device_remakes_total{{result=\"failed\"}} {}\n",
                     s.device_remakes, s.device_remake_failures);
  Metric(out, "kvfs_fs_turns_submitted_total", "counter", "Turns submitted through prompt files.");
  out += fmt::format("kvfs_fs_turns_submitted_total {}\n", fs.turns_submitted);
  Metric(out, "kvfs_fs_turns_rejected_total", "counter", "Prompts refused at close, by reason.");
  out += fmt::format("kvfs_fs_turns_rejected_total{{reason=\"queue_full\"}} {}\n", fs.turns_rejected_queue_full);
  out += fmt::format("kvfs_fs_turns_rejected_total{{reason=\"bad_prompt\"}} {}\n", fs.prompts_refused);
  Metric(out, "kvfs_tokens_total", "counter", "Tokens, by kind: context reused from the cache, computed, generated.");
  out += fmt::format("kvfs_tokens_total{{kind=\"reused\"}} {}\nkvfs_tokens_total{{kind=\"computed\"}} {}\n",
                     s.tokens_reused, s.tokens_computed);
  out += fmt::format("kvfs_tokens_total{{kind=\"generated\"}} {}\n", s.tokens_generated);
  Metric(out, "kvfs_ttft_seconds", "histogram", "Time to first token of the turns submitted through the mount.");
  for (size_t i = 0; i < FsMetrics::kTtftBucketsSeconds.size(); ++i) {
    out += fmt::format("kvfs_ttft_seconds_bucket{{le=\"{}\"}} {}\n", FsMetrics::kTtftBucketsSeconds[i],
                       fs.ttft_bucket_counts[i]);
  }
  out += fmt::format("kvfs_ttft_seconds_bucket{{le=\"+Inf\"}} {}\nkvfs_ttft_seconds_sum {}\nkvfs_ttft_seconds_count {}\n",
                     fs.ttft_count, fs.ttft_sum_seconds, fs.ttft_count);
  Metric(out, "kvfs_cache_block_lookups_total", "counter", "KV block lookups, by result.");
  out += fmt::format("kvfs_cache_block_lookups_total{{result=\"hit\"}} {}\nkvfs_cache_block_lookups_total{{result=\"miss\"}} {}\n",
                     s.block_hits, s.block_misses);
  Metric(out, "kvfs_cache_evictions_total", "counter", "KV blocks dropped from memory under the budget.");
  out += fmt::format("kvfs_cache_evictions_total {}\n", s.evictions);
  Metric(out, "kvfs_cache_reload_bytes_total", "counter", "KV bytes read back from disk.");
  out += fmt::format("kvfs_cache_reload_bytes_total {}\n", s.reload_bytes);
  Metric(out, "kvfs_cache_memory_bytes", "gauge", "KV memory in use and the budget.");
  out += fmt::format("kvfs_cache_memory_bytes{{kind=\"used\"}} {}\nkvfs_cache_memory_bytes{{kind=\"budget\"}} {}\n",
                     s.memory_used_bytes, s.memory_budget_bytes);
  Metric(out, "kvfs_erasures_total", "counter", "Erasures, by what was erased.");
  out += fmt::format("kvfs_erasures_total{{what=\"engine\"}} {}\nkvfs_erasures_total{{what=\"agent\"}} {}\n",
                     s.erasures, fs.agents_erased);
  out += fmt::format("kvfs_erasures_total{{what=\"cache\"}} {}\nkvfs_erasures_total{{what=\"prefix\"}} {}\n",
                     fs.caches_erased, fs.prefixes_erased);
  Metric(out, "kvfs_cache_transfers_total", "counter", "kv.safetensors exports and imports.");
  out += fmt::format("kvfs_cache_transfers_total{{kind=\"export\"}} {}\nkvfs_cache_transfers_total{{kind=\"import\"}} {}\n",
                     fs.exports, fs.imports);
  out += fmt::format("kvfs_cache_transfers_total{{kind=\"import_refused\"}} {}\n", fs.imports_refused);
  Metric(out, "kvfs_cache_transfer_bytes_total", "counter", "Bytes of kv.safetensors exported and imported.");
  out += fmt::format("kvfs_cache_transfer_bytes_total{{kind=\"export\"}} {}\nkvfs_cache_transfer_bytes_total{{kind=\"import\"}} {}\n",
                     fs.export_bytes, fs.import_bytes);
  Metric(out, "kvfs_batch_size", "summary", "Sequences per forward pass over the engine's recent window.");
  for (double q : {0.5, 0.9, 1.0}) out += fmt::format("kvfs_batch_size{{quantile=\"{}\"}} {}\n", q, Quantile(s.batch_sizes, q));
  size_t batch_sum = 0;
  for (size_t b : s.batch_sizes) batch_sum += b;
  out += fmt::format("kvfs_batch_size_sum {}\nkvfs_batch_size_count {}\n", batch_sum, s.batch_sizes.size());
  return out;
}

std::string JsonFileText(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace kvfs::fs
