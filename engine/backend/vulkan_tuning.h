// Per-device tuning of the Vulkan backend (kvfs tune): which VulkanTuning decodes fastest on a
// given device and model, found by measuring, and the file that records it for kvfsd, kvfs run
// and kvfs bench (--tuning FILE).
//
// Why measure: the best matrix-vector shape, attention split and fusions depend on the device
// (subgroup size, cache sizes, how much a barrier or an atomic costs). A fused epilogue that
// saves a dispatch on a discrete GPU can cost more than it saves elsewhere (on lavapipe the
// SwiGLU epilogue halves gate|up's speed), so no one default is best everywhere.
//
// The search is coordinate descent over a fixed list of knobs, each tried at a few values
// against the current best. Every comparison interleaves the two settings for several rounds
// and takes the median of the per-round time ratios, so a drift of the machine during the
// search (shared hosts, clocks) does not pick a setting; a value is taken only when it wins by
// at least `min_gain`. A final comparison against the starting setting decides whether the
// result is kept at all.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/status.h"

namespace kvfs {

// The file's identity and version ("format" and "version" keys).
inline constexpr std::string_view kTuningFormat = "kvfs-vulkan-tuning";
inline constexpr int kTuningVersion = 1;

// What a tuning file holds.
struct TuningRecord {
  std::string device;        // VulkanDeviceInfo::name of the device measured
  std::string api_version;   // its Vulkan version then (for the reader; not matched)
  std::string model;         // TuningModelKey of the model measured
  std::string kv;            // KV format of the measured context (for the reader)
  int64_t depth = 0;         // context tokens before the measured decode steps
  VulkanTuning tuning;       // the settings found
  double default_step_ms = 0;  // decode step with the starting settings, as measured
  double tuned_step_ms = 0;    // and with `tuning`
  bool operator==(const TuningRecord&) const = default;
};

// The model's shape and weight types, which is what a tuning depends on: e.g.
// "llama L32 E4096 F14336 H32/8x128 V128256 q4_0".
std::string TuningModelKey(const Model& model);

std::string TuningToJson(const TuningRecord& record);
// Strict: unknown keys, missing keys, wrong types and out-of-range values are refused.
Result<TuningRecord> ParseTuningJson(std::string_view text);
// Decode attention's positions per workgroup: 0 (the default) or a power of two from 8 to 65536.
Status CheckAttentionSplit(int64_t split);
Result<TuningRecord> ReadTuningFile(const std::string& path);
// Crash-safe (write temp, fsync, rename, fsync the directory).
Status WriteTuningFile(const std::string& path, const TuningRecord& record);

// The tuning to use for `device_name` and `model`: the file's when it was made for both, else
// nullopt with *why saying what differs.
std::optional<VulkanTuning> TuningFor(const TuningRecord& record, const std::string& device_name, const Model& model,
                                      std::string* why);

// 0s replaced by the defaults they stand for on a device of `device_type` (VulkanDeviceInfo::
// type; so the search never measures a value twice). GPUs split decode attention finer than
// CPUs (VulkanTuning::kGpuAttentionSplit).
VulkanTuning ResolvedTuning(const VulkanTuning& tuning, std::string_view device_type = "cpu");

struct TuningSearchOptions {
  int rounds = 5;          // paired measurements per comparison (median of their ratios)
  double min_gain = 0.02;  // a value must be this much faster (fraction) to be taken
  int passes = 2;          // sweeps over the knobs, fewer when a sweep changes nothing
  std::vector<std::string> skip;  // knob names not to try (e.g. "subgroup_trees" without shuffles)
  std::string device_type = "cpu";  // VulkanDeviceInfo::type: what the 0s of a tuning stand for
};

// One comparison of the search.
struct TuningTrial {
  std::string knob;
  int64_t value = 0;     // bools as 0/1; for matvec_lanes 0 means "as many as the group"
  double ratio = 0;      // median over rounds of time(candidate) / time(current best); 0 if refused
  bool taken = false;
  std::string refused;   // why the backend or the measurement refused the setting
};

struct TuningOutcome {
  VulkanTuning start;            // ResolvedTuning of the start
  VulkanTuning best;             // start when nothing won, or the final check did not confirm it
  std::vector<TuningTrial> trials;
  double start_seconds = 0;      // medians of the final comparison
  double best_seconds = 0;
  double final_ratio = 1;        // median ratio best/start in the final comparison
};

// Seconds per decode step with `tuning` applied; an error means the setting cannot run (it is
// skipped). The search calls it alternately for the two settings it compares.
using TuningMeasure = std::function<Result<double>(const VulkanTuning& tuning)>;

// Knob names, in the order the search tries them.
std::vector<std::string> TuningKnobNames();

// Fails only when the starting setting itself cannot be measured.
Result<TuningOutcome> SearchVulkanTuning(const VulkanTuning& start, const TuningSearchOptions& options,
                                         const TuningMeasure& measure);

}  // namespace kvfs
