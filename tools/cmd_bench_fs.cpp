// kvfs bench fs: what the filesystem costs. (1) The median time of a turn written to `prompt` and
// read back from `response` through a mount, against the same turn through the engine API, on
// one engine with the same prompts (greedy, so the same work): the difference is the per-turn
// overhead of the mount. (2) `ls -l` of a directory of many agents. (3) `cat` of a large
// kv.safetensors export. The mounts are served in this process (AgentStore + FuseServer) and
// driven with real syscalls and real tools (ls, cat).
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/runtime/engine.h"
#include "fs/agent_store.h"
#include "fs/fuse_server.h"
#include "tools/args.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: kvfs bench fs -m MODEL [--turns 20] [--tokens 16] [--agents 10000] [--export-tokens 1500]\n"
    "                     [-t THREADS] [--dir DIR] [--with-store] [--json]\n"
    "  turn overhead: per turn, the time through the mount (write prompt, read response) minus that of\n"
    "  the same turn through the engine API just before it, median of those pairs (same engine, same\n"
    "  prompts, greedy, --tokens reply tokens);\n"
    "  ls -l of --agents agents; cat of the kv.safetensors export of an agent with --export-tokens of\n"
    "  context (MB/s). Targets: <= 2 ms, <= 0.5 s, >= 1 GB/s. The engine runs without a store unless\n"
    "  --with-store (then every turn's commit, fsyncs included, is in both timings).\n"
    "  --dir DIR: where the mounts and the store go (default: a new directory under the temporary\n"
    "  one); it must not exist yet or be empty; what the benchmark puts there is deleted when done.\n";

int Fail(const std::string& m) {
  std::fprintf(stderr, "kvfs bench fs: %s\n", m.c_str());
  return 2;
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

Result<TurnStats> DirectTurn(AgentEngine& engine, const std::string& agent, const std::string& text) {
  std::promise<Result<TurnStats>> done;
  auto future = done.get_future();
  std::string reply;
  TurnRequest r;
  r.agent = agent;
  r.text = text;
  r.on_text = [&reply](std::string_view piece) { reply.append(piece); };  // as the mount does
  r.on_done = [&done](const Result<TurnStats>& s) { done.set_value(s); };
  KVFS_RETURN_IF_ERROR(engine.SubmitTurn(std::move(r)));
  return future.get();
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return IoError("cannot open " + path);
  size_t n = std::fwrite(text.data(), 1, text.size(), f);
  bool closed = std::fclose(f) == 0;
  if (n != text.size() || !closed) return IoError("cannot write " + path);
  return Status::Ok();
}

Result<size_t> ReadFileSize(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return IoError("cannot open " + path + ": " + std::strerror(errno));
  std::vector<char> buf(1 << 20);
  size_t total = 0;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), f)) total += n;
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return IoError("cannot read " + path);
  return total;
}

// A mount of `engine` served by threads of this process.
class InProcessMount {
 public:
  static Result<std::unique_ptr<InProcessMount>> Start(AgentEngine& engine, const std::string& dir) {
    auto m = std::unique_ptr<InProcessMount>(new InProcessMount());
    stdfs::create_directories(dir);
    KVFS_ASSIGN_OR_RETURN(m->store_, fs::AgentStore::Create(engine, fs::StoreConfig{}));
    fs::FuseServerOptions options;
    options.mountpoint = dir;
    options.allow_other = false;
    KVFS_ASSIGN_OR_RETURN(m->server_, fs::FuseServer::Mount(*m->store_, options));
    m->loop_ = std::thread([s = m->server_.get()] { (void)s->Run(); });
    return m;
  }
  ~InProcessMount() {
    store_->BeginShutdown();
    server_->RequestExit();
    loop_.join();
    server_.reset();
  }

 private:
  InProcessMount() = default;
  std::unique_ptr<fs::AgentStore> store_;
  std::unique_ptr<fs::FuseServer> server_;
  std::thread loop_;
};

}  // namespace

int BenchFs(int argc, char** argv) {
  Args args(argc, argv, {"-m", "--turns", "--tokens", "--agents", "--export-tokens", "-t", "--dir"},
            {"--json", "--with-store", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(args.error() + " (see kvfs bench fs --help)");
  if (!args.has("-m")) return Fail("missing -m MODEL");
  const int turns = static_cast<int>(args.get_int("--turns", 20, 1, 10000));
  const int tokens = static_cast<int>(args.get_int("--tokens", 16, 1, 4096));
  const int agents = static_cast<int>(args.get_int("--agents", 10000, 0, 1000000));
  const int64_t export_tokens = args.get_int("--export-tokens", 1500, 0, 1 << 20);
  const int threads = static_cast<int>(args.get_int("-t", std::max(1u, std::thread::hardware_concurrency()), 1, 1024));
  if (!args.error().empty()) return Fail(args.error());
  spdlog::set_level(spdlog::level::warn);

  auto scratch = MakeScratchDir(args.get("--dir"), "kvfs-bench-fs");
  if (!scratch.ok()) return Fail(scratch.status().message());
  const ScratchDirCleanup cleanup(*scratch);
  const std::string base = scratch->path.string();
  nlohmann::json result = {{"model", *args.get("-m")}, {"turns", turns}, {"reply_tokens", tokens}};

  EngineOptions options;
  options.model_path = *args.get("-m");
  // No store by default: a commit's fsyncs (tens of ms, varying by as much) would drown the
  // difference measured; --with-store measures with them.
  if (args.has("--with-store")) options.store_dir = base + "/store";
  options.n_threads = threads;
  auto engine = CreateEngine(options);
  if (!engine.ok()) return Fail(engine.status().message());
  AgentEngine& e = **engine;

  // (1) Per-turn overhead: alternate direct and mounted turns with the same prompts.
  {
    AgentSettings settings;
    settings.sampling.temperature = 0;
    settings.max_tokens = tokens;
    for (const char* name : {"direct", "viafs"}) {
      if (Status s = e.CreateAgent(name, ::geteuid()); !s.ok()) return Fail(s.message());
      if (Status s = e.SetSettings(name, settings); !s.ok()) return Fail(s.message());
    }
    auto mount = InProcessMount::Start(e, base + "/mnt");  // after the agents: it lists them at start
    if (!mount.ok()) return Fail(mount.status().message());
    std::vector<double> direct_ms, fs_ms;
    for (int i = 0; i < turns; ++i) {
      std::string prompt = fmt::format("Once upon a time, in turn {}, a little bird", i);
      auto direct = [&]() -> Status {
        auto t0 = Clock::now();
        Result<TurnStats> stats = DirectTurn(e, "direct", prompt);
        if (!stats.ok()) return stats.status().WithContext("direct turn");
        direct_ms.push_back(Ms(Clock::now() - t0));
        return Status::Ok();
      };
      auto through_mount = [&]() -> Status {
        auto t0 = Clock::now();
        KVFS_RETURN_IF_ERROR(WriteFile(base + "/mnt/viafs/prompt", prompt));
        Result<size_t> reply = ReadFileSize(base + "/mnt/viafs/response");
        if (!reply.ok()) return reply.status().WithContext("turn through the mount");
        fs_ms.push_back(Ms(Clock::now() - t0));
        return Status::Ok();
      };
      // Alternate which path goes first, so neither always runs right after the other.
      Status first = i % 2 == 0 ? direct() : through_mount();
      Status second = first.ok() ? (i % 2 == 0 ? through_mount() : direct()) : first;
      if (!second.ok()) return Fail(second.message());
    }
    // The overhead is the median of the paired differences: each pair ran back to back, so the
    // machine's load drifts out of it.
    std::vector<double> diff;
    for (size_t i = 0; i < fs_ms.size(); ++i) diff.push_back(fs_ms[i] - direct_ms[i]);
    result["turn_direct_ms"] = Median(direct_ms);
    result["turn_fs_ms"] = Median(fs_ms);
    result["turn_overhead_ms"] = Median(diff);
  }

  // (2) ls -l of many agents, (3) cat of a large export: a second, in-memory engine.
  {
    EngineOptions big = options;
    big.store_dir.clear();
    auto engine2 = CreateEngine(big);
    if (!engine2.ok()) return Fail(engine2.status().message());
    AgentEngine& e2 = **engine2;
    for (int i = 0; i < agents; ++i) {
      if (Status s = e2.CreateAgent(fmt::format("agent{:05d}", i), ::geteuid()); !s.ok()) return Fail(s.message());
    }
    std::string exporter = "exporter";
    std::string export_note;
    if (export_tokens > 0) {
      if (Status s = e2.CreateAgent(exporter, ::geteuid()); !s.ok()) return Fail(s.message());
      AgentSettings settings;
      settings.sampling.temperature = 0;
      settings.max_tokens = 1;
      (void)e2.SetSettings(exporter, settings);
      std::string text;
      for (int64_t i = 0; static_cast<int64_t>(text.size()) < export_tokens * 3; ++i) text += "the cat sat on the mat. ";
      Result<TurnStats> filled = DirectTurn(e2, exporter, text);
      if (!filled.ok()) export_note = filled.status().message();
    }
    auto mount = InProcessMount::Start(e2, base + "/mnt2");
    if (!mount.ok()) return Fail(mount.status().message());
    std::vector<double> ls_ms;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = Clock::now();
      int rc = std::system(fmt::format("ls -l {}/mnt2 > /dev/null", base).c_str());
      ls_ms.push_back(Ms(Clock::now() - t0));
      if (rc != 0) return Fail("ls -l failed");
    }
    result["ls_agents"] = agents;
    result["ls_first_s"] = ls_ms.front() / 1000.0;
    result["ls_median_s"] = Median(ls_ms) / 1000.0;
    if (export_tokens > 0 && export_note.empty()) {
      std::string path = base + "/mnt2/" + exporter + "/kv.safetensors";
      std::vector<double> mbps;
      size_t bytes = 0;
      for (int rep = 0; rep < 3 && export_note.empty(); ++rep) {
        auto t0 = Clock::now();
        Result<size_t> n = ReadFileSize(path);
        double s = Ms(Clock::now() - t0) / 1000.0;
        if (!n.ok()) {
          export_note = "export: " + n.status().message();
          break;
        }
        bytes = *n;
        mbps.push_back(static_cast<double>(bytes) / 1e6 / s);
      }
      if (!mbps.empty()) {
        result["export_bytes"] = bytes;
        result["export_mb_per_s"] = Median(mbps);
      }
    }
    if (!export_note.empty()) result["export_note"] = export_note;
    mount = Status(StatusCode::kInternal, "unmounted");  // unmount before the engine goes
    e2.Shutdown();
  }
  e.Shutdown();

  if (args.has("--json")) {
    std::printf("%s\n", result.dump(2).c_str());
    return 0;
  }
  std::printf("turn through the mount   %8.3f ms median (engine API %8.3f ms): overhead %.3f ms, median of pairs (target <= 2 ms)\n",
              result["turn_fs_ms"].get<double>(), result["turn_direct_ms"].get<double>(),
              result["turn_overhead_ms"].get<double>());
  std::printf("ls -l of %d agents     %8.3f s first, %.3f s median of 3 (target <= 0.5 s)\n", agents,
              result["ls_first_s"].get<double>(), result["ls_median_s"].get<double>());
  if (result.contains("export_mb_per_s")) {
    std::printf("cat kv.safetensors       %8.1f MB/s for %zu bytes (target >= 1000 MB/s)\n",
                result["export_mb_per_s"].get<double>(), result["export_bytes"].get<size_t>());
  } else {
    std::printf("cat kv.safetensors       not measured: %s\n", result.value("export_note", "disabled").c_str());
  }
  return 0;
}

}  // namespace kvfs::cli
