// kvfs bench resume: how fast an agent comes back. Per context length, the time to first token
// of a new turn when the agent is cold (nothing cached: full prefill), hot (cache in memory),
// warm from the page cache (fresh engine, cache files cached by the kernel) and warm from disk
// (fresh engine, the files dropped from the page cache with posix_fadvise), plus the cache's
// size and the reload rate against a plain sequential read of a file of the same size.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/kv/sequence_kv.h"
#include "engine/model/model.h"
#include "engine/runtime/engine.h"
#include "tools/args.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: kvfs bench resume -m MODEL [--ctx 1024,2048,4096] [--kv q4] [--new 32] [-t THREADS] [--store DIR] [--json]\n"
    "  per context length: TTFT of a new turn of --new tokens when the agent is cold (full prefill),\n"
    "  hot (in memory), warm from the page cache and warm from disk (fresh engine each), cache bytes per\n"
    "  token in memory and on disk, and the reload rate against a sequential read of a same-size file.\n"
    "  --store DIR: where the agents' caches go (default: a new directory under the temporary one);\n"
    "  it must not exist yet or be empty; what the benchmark puts there is deleted when done.\n";

int Fail(const std::string& m) {
  std::fprintf(stderr, "kvfs bench resume: %s\n", m.c_str());
  return 2;
}

// Drops a directory tree's files from the page cache (so the next read comes from the disk).
void DropFromPageCache(const fs::path& dir) {
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

uint64_t TreeBytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

// Sequential read of a file of `bytes` (written, synced, dropped from the page cache first when
// `from_disk`); returns bytes/s.
double SequentialReadRate(const fs::path& path, uint64_t bytes, bool from_disk) {
  {
    std::vector<char> chunk(1 << 20, 'x');
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    for (uint64_t w = 0; w < bytes; w += chunk.size()) f.write(chunk.data(), static_cast<std::streamsize>(std::min<uint64_t>(chunk.size(), bytes - w)));
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  ::fdatasync(fd);
  if (from_disk) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  else {
    std::vector<char> warm(1 << 20);
    while (::read(fd, warm.data(), warm.size()) > 0) {
    }
    ::lseek(fd, 0, SEEK_SET);
  }
  std::vector<char> buf(1 << 20);
  const auto t0 = Clock::now();
  uint64_t got = 0;
  for (ssize_t r; (r = ::read(fd, buf.data(), buf.size())) > 0;) got += static_cast<uint64_t>(r);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fd);
  fs::remove(path);
  return s > 0 ? static_cast<double>(got) / s : 0;
}

}  // namespace

int BenchResume(int argc, char** argv) {
  Args args(argc, argv, {"-m", "--ctx", "--kv", "--new", "-t", "--store"}, {"--json", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(args.error());
  if (!args.has("-m")) return Fail("-m MODEL is required");
  auto ctxs_list = ParseIntList(args.get("--ctx").value_or("1024,2048,4096"), "--ctx", 16, 131072);
  if (!ctxs_list.ok()) return Fail(ctxs_list.status().message());
  const std::vector<int64_t> ctxs = *ctxs_list;
  const int64_t n_new = args.get_int("--new", 32, 1, 4096);
  const int threads = static_cast<int>(args.get_int("-t", 2, 1, 256));
  if (!args.error().empty()) return Fail(args.error());
  const std::string kv = args.get("--kv").value_or("q4");
  spdlog::set_level(spdlog::level::warn);

  auto model = Model::Load(*args.get("-m"));
  if (!model.ok()) return Fail(model.status().message());
  {  // a bad --kv is reported before any output
    const HParams& hp = (*model)->hparams();
    auto format = MakeKvFormat(kv, "", hp.n_head_kv, hp.head_dim);
    if (!format.ok()) return Fail(format.status().message());
  }
  auto scratch = MakeScratchDir(args.get("--store"), "kvfs-bench-resume");
  if (!scratch.ok()) return Fail(scratch.status().message());
  const ScratchDirCleanup cleanup(*scratch);
  const fs::path store = scratch->path;
  const Tokenizer& tok = (*model)->tokenizer();

  EngineOptions o;
  o.model_path = *args.get("-m");
  o.store_dir = store.string();
  o.n_threads = threads;
  o.kv = kv;
  o.n_ctx = *std::max_element(ctxs.begin(), ctxs.end()) + n_new + 256;
  AgentSettings settings;
  settings.sampling.temperature = 0;
  settings.max_tokens = 1;
  settings.kv = kv;

  nlohmann::json rows = nlohmann::json::array();
  int warmups = 0;
  if (!args.has("--json")) {
    std::printf("model %s, kv %s, %d threads, new turn of %lld tokens\n", o.model_path.c_str(), kv.c_str(), threads,
                static_cast<long long>(n_new));
    std::printf("%6s %10s %9s %12s %11s %9s %10s %10s %10s %12s %12s %12s\n", "ctx", "cold_ms", "hot_ms", "warm_pc_ms",
                "warm_disk_ms", "cold/warm", "mem_B/tok", "disk_B/tok", "reload_ms", "reload_MB/s", "seqread_MB/s",
                "pcread_MB/s");
  }
  for (int64_t ctx : ctxs) {
    ClearScratchDir(*scratch, /*remove_dir=*/false);
    const std::string base = TextOfTokens(tok, ctx, 1);
    std::vector<std::string> news;
    for (int i = 0; i < 4; ++i) news.push_back(TextOfTokens(tok, n_new, 100 + i));
    auto engine = CreateEngine(o);
    if (!engine.ok()) return Fail(engine.status().message());
    // "fresh" belongs to another uid: it must not find the agent's blocks (same text) to share.
    for (const char* name : {"agent", "fresh"}) {
      const uint32_t uid = std::string(name) == "fresh" ? 1 : 0;
      if (!(*engine)->CreateAgent(name, uid).ok() || !(*engine)->SetSettings(name, settings).ok()) return Fail("agent setup failed");
    }
    // Set-up turn: the agent's context.
    auto setup = RunTurnSync(**engine, "agent", base);
    if (!setup.ok()) return Fail(setup.status().message());
    // Cold: a fresh agent runs the whole context plus the new turn.
    auto cold = RunTurnSync(**engine, "fresh", base + news[0]);
    if (!cold.ok()) return Fail(cold.status().message());
    (void)(*engine)->EraseAgent("fresh");
    // Hot.
    auto hot = RunTurnSync(**engine, "agent", news[1]);
    if (!hot.ok()) return Fail(hot.status().message());
    const auto info = (*engine)->GetAgent("agent");
    const int64_t tokens = info.ok() ? info->context_tokens : ctx;
    const int64_t mem = info.ok() ? info->memory_bytes : 0;
    engine->reset();
    const uint64_t disk = TreeBytes(store / "blocks") + TreeBytes(store / "agents");
    // A fresh engine, as after a restart, that has already served something (so the model's
    // pages are mapped and its threads are up): what is timed below is the agent's cache alone.
    auto fresh_engine = [&]() -> Result<std::unique_ptr<AgentEngine>> {
      KVFS_ASSIGN_OR_RETURN(auto e, CreateEngine(o));
      const std::string warmup = fmt::format("warmup{}", ++warmups);
      KVFS_RETURN_IF_ERROR(e->CreateAgent(warmup, 2));
      KVFS_RETURN_IF_ERROR(e->SetSettings(warmup, settings));
      KVFS_RETURN_IF_ERROR(RunTurnSync(*e, warmup, news[0]).status());
      (void)e->EraseAgent(warmup);
      return e;
    };
    // Reload alone, from the page cache: a prefetch until the agent is hot.
    engine = fresh_engine();
    if (!engine.ok()) return Fail(engine.status().message());
    const auto r0 = std::chrono::steady_clock::now();
    (*engine)->Prefetch("agent");
    while ((*engine)->GetAgent("agent")->state != AgentState::kHot) std::this_thread::sleep_for(std::chrono::microseconds(100));
    const double reload_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r0).count();
    const uint64_t reloaded = (*engine)->Stats().reload_bytes;
    engine->reset();
    // Warm from the page cache: fresh engine, files still cached.
    engine = fresh_engine();
    if (!engine.ok()) return Fail(engine.status().message());
    auto warm_pc = RunTurnSync(**engine, "agent", news[2]);
    if (!warm_pc.ok()) return Fail(warm_pc.status().message());
    engine->reset();
    // Warm from disk.
    DropFromPageCache(store);
    engine = fresh_engine();
    if (!engine.ok()) return Fail(engine.status().message());
    auto warm_disk = RunTurnSync(**engine, "agent", news[3]);
    if (!warm_disk.ok()) return Fail(warm_disk.status().message());
    engine->reset();
    const double disk_rate = SequentialReadRate(store / "seqread.tmp", reloaded, true);
    const double pc_rate = SequentialReadRate(store / "seqread.tmp", reloaded, false);
    const double reload_rate = reload_ms > 0 ? reloaded / (reload_ms / 1000.0) : 0;
    nlohmann::json row = {{"ctx", ctx},
                          {"tokens", tokens},
                          {"cold_ttft_ms", cold->ttft_ms},
                          {"hot_ttft_ms", hot->ttft_ms},
                          {"warm_page_cache_ttft_ms", warm_pc->ttft_ms},
                          {"warm_disk_ttft_ms", warm_disk->ttft_ms},
                          {"cold_over_warm", cold->ttft_ms / warm_disk->ttft_ms},
                          {"memory_bytes_per_token", tokens > 0 ? static_cast<double>(mem) / tokens : 0},
                          {"disk_bytes_per_token", tokens > 0 ? static_cast<double>(disk) / tokens : 0},
                          {"reload_bytes", reloaded},
                          {"reload_ms_page_cache", reload_ms},
                          {"reload_bytes_per_s", reload_rate},
                          {"sequential_read_disk_bytes_per_s", disk_rate},
                          {"sequential_read_page_cache_bytes_per_s", pc_rate},
                          {"warm_disk_bound_ms", hot->ttft_ms + (disk_rate > 0 ? reloaded / disk_rate * 1000 : 0) + 20},
                          {"reused_tokens_warm", warm_disk->reused_tokens}};
    rows.push_back(row);
    if (!args.has("--json")) {
      std::printf("%6lld %10.1f %9.1f %12.1f %11.1f %9.1f %10.1f %10.1f %10.2f %12.0f %12.0f %12.0f\n",
                  static_cast<long long>(ctx), cold->ttft_ms, hot->ttft_ms, warm_pc->ttft_ms, warm_disk->ttft_ms,
                  cold->ttft_ms / warm_disk->ttft_ms, row["memory_bytes_per_token"].get<double>(),
                  row["disk_bytes_per_token"].get<double>(), reload_ms, reload_rate / 1e6, disk_rate / 1e6, pc_rate / 1e6);
      std::fflush(stdout);
    }
  }
  ClearScratchDir(*scratch, /*remove_dir=*/true);
  // Memory: how many agents of each context length fit a 2 GiB KV budget (whole blocks).
  nlohmann::json capacity = nlohmann::json::array();
  {
    const HParams& hp = (*model)->hparams();
    auto fmt = MakeKvFormat(kv, "", hp.n_head_kv, hp.head_dim);
    auto f16 = MakeKvFormat("f16", "", hp.n_head_kv, hp.head_dim);
    if (fmt.ok() && f16.ok()) {
      const int64_t budget = int64_t{2} << 30;
      for (int64_t ctx : ctxs) {
        const int64_t blocks = (ctx + o.block_tokens - 1) / o.block_tokens;
        const int64_t a = budget / (blocks * KvLayoutFor(hp, *fmt, o.block_tokens).block_bytes());
        const int64_t b = budget / (blocks * KvLayoutFor(hp, *f16, o.block_tokens).block_bytes());
        capacity.push_back({{"ctx", ctx}, {"agents_in_2GiB", a}, {"agents_in_2GiB_f16", b}, {"ratio", b > 0 ? double(a) / b : 0}});
        if (!args.has("--json"))
          std::printf("agents of %lld tokens in a 2 GiB budget: %s %lld, f16 %lld (%.2fx); bytes/token %s/f16 = %.3f\n",
                      static_cast<long long>(ctx), kv.c_str(), static_cast<long long>(a), static_cast<long long>(b),
                      b > 0 ? double(a) / b : 0, kv.c_str(),
                      // Whole blocks: a q4k row is only its V row (keys are in chunks).
                      double(KvLayoutFor(hp, *fmt).block_bytes()) / double(KvLayoutFor(hp, *f16).block_bytes()));
      }
    }
  }
  if (args.has("--json")) std::printf("%s\n", nlohmann::json{{"model", o.model_path}, {"kv", kv}, {"new", n_new}, {"threads", threads}, {"results", rows}, {"capacity", capacity}}.dump(2).c_str());
  return 0;
}

}  // namespace kvfs::cli
