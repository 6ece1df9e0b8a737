// kvfs tune: measures which Vulkan settings decode fastest on this device with this model
// (engine/backend/vulkan_tuning.h has the search) and writes them to a file that kvfsd
// (--vulkan-tuning), kvfs run and kvfs bench (--tuning) read.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/backend/backend.h"
#include "engine/backend/vulkan_tuning.h"
#include "engine/kv/sequence_kv.h"
#include "engine/core/read_file.h"
#include "tools/args.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace kvfs::cli {
namespace {

constexpr const char* kTuneUsage =
    "usage: kvfs tune -m MODEL [--device N] [--kv q4k] [-d 1024] [-n 16] [-r 5] [--min-gain 0.02]\n"
    "                 [--passes 2] [--skip KNOB,...] [-o FILE] [--json]\n"
    "  Finds the Vulkan settings under which this device decodes fastest with this model:\n"
    "  the matrix-vector shape, the attention split and which ops are fused. Each value is\n"
    "  compared with the best so far by timing -n decode steps after -d tokens of context,\n"
    "  alternating the two settings -r times and taking the median of the time ratios; it\n"
    "  is kept when it is --min-gain faster. -o writes the result for kvfsd --vulkan-tuning\n"
    "  and kvfs run/bench --tuning. The settings change speed; all but attention's split\n"
    "  compute the same values (the split changes the order of its sums: last bits).\n"
    "  --skip: knobs not to try, of: matvec_group, matvec_lanes, matvec_rows, matvec_ahead,\n"
    "  matvec_norm_group, matvec_min_groups, swiglu_in_matvec, fuse_softmax, subgroup_trees,\n"
    "  attention_split, prefetch_mib.\n";

using Clock = std::chrono::steady_clock;

int Fail(int code, const std::string& m) {
  std::fprintf(stderr, "kvfs tune: %s\n", m.c_str());
  return code;
}

std::string KnobValue(const TuningTrial& t) {
  if (t.knob == "swiglu_in_matvec" || t.knob == "fuse_softmax" || t.knob == "subgroup_trees") {
    return t.value != 0 ? "on" : "off";
  }
  if (t.knob == "matvec_lanes" && t.value == 0) return "group";
  if (t.knob == "matvec_norm_group" && t.value == 0) return "off";
  return std::to_string(t.value);
}

std::string Describe(const VulkanTuning& t) {
  return fmt::format("matvec group {} lanes {} rows {} min-groups {} ahead {} norm group {}, attention split {}, swiglu "
                     "in matvec {}, fused softmax {}, subgroup trees {}, prefetch {} MiB",
                     t.matvec.group, t.matvec.lanes == 0 ? std::string("group") : std::to_string(t.matvec.lanes),
                     t.matvec.rows, t.matvec.min_groups, t.matvec.ahead,
                     t.matvec.norm_group == 0 ? std::string("off") : std::to_string(t.matvec.norm_group),
                     t.attention_split, t.swiglu_in_matvec ? "on" : "off",
                     t.fuse_softmax ? "on" : "off", t.subgroup_trees ? "on" : "off", t.prefetch_mib);
}

}  // namespace

int Tune(int argc, char** argv) {
  Args args(argc, argv, {"-m", "--device", "--kv", "-d", "-n", "-r", "--min-gain", "--passes", "--skip", "-o"},
            {"--json", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kTuneUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(2, args.error() + " (see kvfs tune --help)");
  if (!args.has("-m")) return Fail(2, "missing -m MODEL");
  const int device = static_cast<int>(args.get_int("--device", -1, 0, 1 << 16));
  const int64_t depth = args.get_int("-d", 1024, 0, 1 << 20);
  const int64_t n_steps = args.get_int("-n", 16, 1, 1 << 16);
  TuningSearchOptions search;
  search.rounds = static_cast<int>(args.get_int("-r", 5, 1, 1000));
  search.min_gain = args.get_double("--min-gain", 0.02, 0.0, 0.5);
  search.passes = static_cast<int>(args.get_int("--passes", 2, 1, 10));
  const std::vector<std::string> knobs = TuningKnobNames();
  if (auto skip = args.get("--skip")) {
    for (std::string& name : SplitList(*skip)) {
      if (std::find(knobs.begin(), knobs.end(), name) == knobs.end()) {
        args.set_error(fmt::format("--skip: no knob '{}' (see kvfs tune --help)", name));
      }
      search.skip.push_back(std::move(name));
    }
  }
  const std::string kv_type = args.get("--kv").value_or("q4k");
  if (!args.error().empty()) return Fail(2, args.error());
  if (auto out = args.get("-o")) {
    if (SameFile(*out, *args.get("-m"))) return Fail(2, "-o " + *out + " is the model file");
    // Checked before the search (minutes of it), not after: a file it cannot write loses it all.
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(*out).parent_path();
    if (std::filesystem::is_directory(*out, ec)) return Fail(2, "-o " + *out + " is a directory");
    if (std::filesystem::exists(*out, ec) && ::access(out->c_str(), W_OK) != 0)
      return Fail(2, fmt::format("-o {}: cannot write it: {}", *out, std::strerror(errno)));
    if (::access(parent.empty() ? "." : parent.c_str(), W_OK) != 0)
      return Fail(2, fmt::format("-o {}: cannot write in {}: {}", *out, parent.empty() ? "." : parent.string(),
                                 std::strerror(errno)));
  }
  spdlog::set_level(spdlog::level::warn);

  auto devices = ListVulkanDevices();
  if (!devices.ok()) return Fail(1, devices.status().message() + " (kvfs tune needs a Vulkan device)");
  const VulkanDeviceInfo* info = ChosenVulkanDevice(*devices, device);
  if (info == nullptr)
    return Fail(2, fmt::format("no Vulkan device {} (there are {}; see kvfs devices)", device, devices->size()));
  if (!info->subgroup_shuffle) search.skip.push_back("subgroup_trees");
  search.device_type = info->type;  // the same shaders either way

  auto model_or = Model::Load(*args.get("-m"));
  if (!model_or.ok()) return Fail(2, model_or.status().message());
  const Model& model = **model_or;
  const HParams& hp = model.hparams();
  auto format = MakeKvFormat(kv_type, "", hp.n_head_kv, hp.head_dim);
  if (!format.ok()) return Fail(2, format.status().message());
  const KvLayout layout = KvLayoutFor(hp, *format);
  auto backend_or = MakeVulkanBackend(model, VulkanOptions{.device = info->index, .tuning = VulkanTuning{}});
  if (!backend_or.ok()) return Fail(1, backend_or.status().message());
  Backend& backend = **backend_or;

  std::mt19937 rng(2468);
  SequenceKv kv(layout, depth + n_steps + 2);
  Logits logits;
  auto step = [&](std::span<const TokenId> tokens) {
    SequenceStep s{&kv, tokens, false};
    return backend.Forward(std::span<const SequenceStep>(&s, 1), logits);
  };
  for (int64_t at = 0; at < depth; at += 512) {
    std::vector<TokenId> toks(static_cast<size_t>(std::min<int64_t>(512, depth - at)));
    for (TokenId& t : toks) t = static_cast<TokenId>(rng() % hp.n_vocab);
    if (Status s = step(toks); !s.ok()) return Fail(1, s.message());
  }
  // Seconds per decode step under `tuning`: one untimed step first (it compiles the setting's
  // pipelines the first time), then n_steps timed; the context goes back to `depth` after.
  auto measure = [&](const VulkanTuning& tuning) -> Result<double> {
    KVFS_RETURN_IF_ERROR(backend.SetVulkanTuning(tuning));
    Status status = Status::Ok();
    double seconds = 0;
    for (int64_t i = -1; i < n_steps && status.ok(); ++i) {
      const TokenId tok = static_cast<TokenId>(rng() % hp.n_vocab);
      const auto t0 = Clock::now();
      status = step(std::span<const TokenId>(&tok, 1));
      if (i >= 0) seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    kv.Truncate(depth);
    KVFS_RETURN_IF_ERROR(status);
    return seconds / static_cast<double>(n_steps);
  };
  const bool json = args.has("--json");
  if (!json) {
    fmt::print("kvfs tune: {} on {} ({}), kv {}, {} decode steps after {} tokens, {} rounds per comparison\n",
               model.path(), info->name, info->api_version, format->Name(), n_steps, depth, search.rounds);
  }
  auto outcome = SearchVulkanTuning(VulkanTuning{}, search, measure);
  if (!outcome.ok()) return Fail(1, outcome.status().message());

  TuningRecord record{.device = info->name,
                      .api_version = info->api_version,
                      .model = TuningModelKey(model),
                      .kv = format->Name(),
                      .depth = depth,
                      .tuning = outcome->best,
                      .default_step_ms = outcome->start_seconds * 1e3,
                      .tuned_step_ms = outcome->best_seconds * 1e3};
  if (auto out = args.get("-o")) {
    if (Status s = WriteTuningFile(*out, record); !s.ok()) return Fail(1, s.message());
  }
  if (json) {
    nlohmann::json trials = nlohmann::json::array();
    for (const TuningTrial& t : outcome->trials) {
      nlohmann::json j = {{"knob", t.knob}, {"value", t.value}, {"taken", t.taken}};
      if (t.refused.empty()) j["ratio"] = t.ratio;
      else j["refused"] = t.refused;
      trials.push_back(j);
    }
    nlohmann::json j = nlohmann::json::parse(TuningToJson(record));
    j["trials"] = trials;
    j["final_ratio"] = outcome->final_ratio;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  fmt::print("| knob | value | time vs best so far | taken |\n|---|---|---|---|\n");
  for (const TuningTrial& t : outcome->trials) {
    const std::string ratio = t.refused.empty() ? fmt::format("{:.3f}", t.ratio) : "refused: " + t.refused;
    fmt::print("| {} | {} | {} | {} |\n", t.knob, KnobValue(t), ratio, t.taken ? "yes" : "");
  }
  fmt::print("default: {}\n", Describe(outcome->start));
  fmt::print("tuned:   {}\n", Describe(outcome->best));
  if (outcome->best == outcome->start && outcome->final_ratio != 1) {
    // The search's best lost the final comparison: the defaults are kept, and so is their time.
    fmt::print("decode step {:.3f} ms default; the search's best took {:.3f}x that in the final comparison: not "
               "confirmed, default kept\n",
               record.default_step_ms, outcome->final_ratio);
  } else {
    fmt::print("decode step {:.3f} ms default, {:.3f} ms tuned ({:.3f}x the default's time)\n", record.default_step_ms,
               record.tuned_step_ms, outcome->final_ratio);
  }
  if (auto out = args.get("-o")) fmt::print("wrote {}\n", *out);
  return 0;
}

}  // namespace kvfs::cli
