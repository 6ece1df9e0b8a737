// kvfs bench dispatch: what a Vulkan device charges per dispatch and barrier, and how fast the
// read-ahead shader reads (engine/backend/vulkan_dispatch_cost.h). No model needed.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "engine/backend/vulkan_dispatch_cost.h"
#include "tools/args.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

constexpr const char* kUsage =
    "usage: kvfs bench dispatch [--device N] [-n 512] [-r 5] [--read-mib 64] [--code-steps 256,1024,4096]\n"
    "                           [--code-pipelines 8] [--json]\n"
    "  The Vulkan device's cost of the shape of a decode step, without a model: per dispatch,\n"
    "  the wall time of -n minimal dispatches (one workgroup reading one word) with a barrier\n"
    "  after each, as a decode step records its ops (submitted in pieces while recording goes\n"
    "  on; the recording time is shown beside it), the same without barriers (submitted at the\n"
    "  end: the time after recording), and a read-ahead dispatch (kvfs bench --prefetch) of\n"
    "  --read-mib MiB with its barrier, whose rate says how much it can read beside a short\n"
    "  dispatch without making it wait. Then what code size costs: one workgroup's chain of\n"
    "  --code-steps dependent multiply-adds as straight-line code and as a loop (the same\n"
    "  latencies; the difference is fetching the straight code), from one pipeline and from\n"
    "  --code-pipelines pipelines of the same length in turn (as a decode step cycles through its\n"
    "  shaders); 'none' skips it. Medians of -r passes after one that warms up.\n";

int Fail(int code, const std::string& m) {
  std::fprintf(stderr, "kvfs bench dispatch: %s\n", m.c_str());
  return code;
}

}  // namespace

int BenchDispatch(int argc, char** argv) {
  Args args(argc, argv, {"--device", "-n", "-r", "--read-mib", "--code-steps", "--code-pipelines"},
            {"--json", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(2, args.error() + " (see kvfs bench dispatch --help)");
  DispatchCostOptions options;
  options.device = static_cast<int>(args.get_int("--device", -1, -1, 1 << 16));
  options.dispatches = args.get_int("-n", 512, 1, 1 << 20);
  options.repetitions = static_cast<int>(args.get_int("-r", 5, 1, 1000));
  options.read_bytes = args.get_int("--read-mib", 64, 1, 1 << 16) << 20;
  options.code_pipelines = static_cast<int>(args.get_int("--code-pipelines", 8, 1, 64));
  if (!args.error().empty()) return Fail(2, args.error());
  if (const auto steps = args.get("--code-steps"); steps == "none") {
    options.code_steps.clear();
  } else if (steps) {
    auto list = ParseIntList(*steps, "--code-steps", 1, 65536);
    if (!list.ok()) return Fail(2, list.status().message() + " (or none)");
    options.code_steps = *list;
  }
  auto cost = MeasureVulkanDispatchCost(options);
  if (!cost.ok()) return Fail(1, cost.status().message());
  if (args.has("--json")) {
    nlohmann::json j = {{"device", cost->device},
                              {"dispatches", options.dispatches},
                              {"repetitions", options.repetitions},
                              {"dispatch_with_barrier_us", cost->barrier_us},
                              {"dispatch_with_barrier_recording_us", cost->barrier_record_us},
                              {"dispatch_without_barrier_us", cost->no_barrier_us},
                              {"dispatch_without_barrier_recording_us", cost->no_barrier_record_us},
                              {"read_bytes", cost->read_bytes},
                              {"read_dispatch_us", cost->read_us},
                              {"read_gb_per_s", cost->read_gbps},
                              {"code_pipelines", options.code_pipelines},
                              {"code", nlohmann::json::array()}};
    for (const CodeFetchCost& c : cost->code) {
      nlohmann::json straight_stats = nlohmann::json::object(), loop_stats = nlohmann::json::object();
      for (const auto& [name, value] : c.straight_statistics) straight_stats[name] = value;
      for (const auto& [name, value] : c.loop_statistics) loop_stats[name] = value;
      j["code"].push_back({{"steps", c.steps},
                           {"straight_us", c.straight_us},
                           {"loop_us", c.loop_us},
                           {"straight_cycling_us", c.straight_cycling_us},
                           {"loop_cycling_us", c.loop_cycling_us},
                           {"straight_statistics", straight_stats},
                           {"loop_statistics", loop_stats}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  fmt::print("device: {}\n", cost->device);
  fmt::print("per dispatch, medians of {} passes of {}:\n", options.repetitions, options.dispatches);
  fmt::print("  minimal dispatch + barrier:      {:8.2f} us  (recording {:.2f} us of it, overlapped)\n",
             cost->barrier_us, cost->barrier_record_us);
  fmt::print("  minimal dispatch, no barriers:   {:8.2f} us  (after {:.2f} us of recording)\n", cost->no_barrier_us,
             cost->no_barrier_record_us);
  fmt::print("  read-ahead of {:.0f} MiB + barrier: {:8.2f} us  ({:.1f} GB/s beyond a minimal dispatch)\n",
             cost->read_bytes / 1048576.0, cost->read_us, cost->read_gbps);
  if (!cost->code.empty()) {
    fmt::print("one workgroup's chain of dependent multiply-adds + barrier (us): one pipeline | {} in turn\n",
               options.code_pipelines);
    fmt::print("  {:>6}  {:>10} {:>10}  | {:>10} {:>10}\n", "steps", "straight", "loop", "straight", "loop");
    for (const CodeFetchCost& c : cost->code) {
      fmt::print("  {:>6}  {:10.2f} {:10.2f}  | {:10.2f} {:10.2f}\n", c.steps, c.straight_us, c.loop_us,
                 c.straight_cycling_us, c.loop_cycling_us);
    }
    // What the driver's compiler made of them (whether the straight code was unrolled at all).
    for (const CodeFetchCost& c : cost->code) {
      for (const auto* stats : {&c.straight_statistics, &c.loop_statistics}) {
        if (stats->empty()) continue;
        std::string line;
        for (const auto& [name, value] : *stats) line += fmt::format("{}{} {:g}", line.empty() ? "" : "; ", name, value);
        fmt::print("  {} steps, {}: {}\n", c.steps, stats == &c.straight_statistics ? "straight" : "loop", line);
      }
    }
  }
  return 0;
}

}  // namespace kvfs::cli
