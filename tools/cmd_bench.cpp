// kvfs bench: prompt processing (pp) and generation (tg) speed after DEPTH tokens of context,
// like the reference's llama-bench, plus decode bandwidth against the machine's read bandwidth
// measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_features.h"
#include "engine/backend/cpu/kernel_select.h"
#include "engine/backend/vulkan_tuning.h"
#include "engine/core/thread_pool.h"
#include "tools/args.h"
#include "tools/backend_choice.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

constexpr const char* kBenchUsage =
    "usage: kvfs bench -m MODEL [-p 512] [-n 128] [-d DEPTH] [-t THREADS] [-r 3] [--kv f16|q8|q4|q4k] [--kv-rotate on|off]\n"
    "                  [--backend cpu|vulkan] [--device N] [--profile] [--phases] [--separate-ops] [--gguf-rows]\n"
    "                  [--attn-split N] [--separate-softmax] [--separate-swiglu] [--separate-matrices]\n"
    "                  [--untiled-attention] [--copy-kv-rows] [--contract-floats]\n"
    "                  [--matvec-group N] [--matvec-lanes N] [--matvec-min-groups N] [--matvec-rows N]\n"
    "                  [--matvec-ahead N] [--matvec-norm-group N]\n"
    "                  [--shared-trees] [--prefetch MIB] [--tuning FILE] [--plain-weights] [--json]\n"
    "  pp = prompt tokens/s for -p tokens in one batch, tg = generated tokens/s for -n tokens,\n"
    "  both after -d tokens already in the context; median and range over -r repetitions.\n"
    "  With --backend vulkan, the decode figures compare with nothing measured here (the CPU's\n"
    "  read bandwidth says nothing about the device's).\n"
    "  --kv A,B,...: compare KV formats interleaved: each format's context is filled once, then\n"
    "  every repetition runs pp for each format back to back, then tg, so that all see the same\n"
    "  machine (memory bandwidth on shared hosts moves within minutes); each format's rate is\n"
    "  also given relative to the first's, as the median of per-repetition ratios (no load,\n"
    "  memory or bandwidth lines: those are for one format).\n"
    "  --profile (vulkan): times every dispatch and prints, on stderr, where the device time of\n"
    "  the last repetition's pp and tg went, per shader and matrix shape, then per pipeline\n"
    "  (shader and specialization constants) with the compiler's statistics of each (registers,\n"
    "  spills) where the driver reports them (VK_KHR_pipeline_executable_properties).\n"
    "  --phases (vulkan, implies --profile): the decode path's short shaders (kv_store, attention,\n"
    "  quantize_act, matvec_quant) run variants that read the device's clocks at marks inside\n"
    "  them (VK_KHR_shader_clock); the profile then gives, per pipeline, the span of a dispatch\n"
    "  and how long its workgroups took from mark to mark (median, p90, max).\n"
    "  --plain-weights (cpu): every matrix from the model file's own rows, none repacked at load\n"
    "  into the kernel table's row-interleaved layout, to measure what repacking saves.\n"
    "  --separate-ops (vulkan): one dispatch per op, none fused, to measure what fusing saves.\n"
    "  --gguf-rows (vulkan): Q4_0, Q8_0 and Q6_K weights on the device as the GGUF file stores\n"
    "  them, not with their codes moved to 16-byte boundaries, to measure what the aligned rows save.\n"
    "  --attn-split N (vulkan): decode attention's positions per workgroup (default 128; the\n"
    "  earlier default was 512).\n"
    "  --separate-softmax (vulkan): decode attention runs its softmax as its own dispatch instead\n"
    "  of inside the weighted sum, to measure what fusing it saves.\n"
    "  --separate-swiglu (vulkan): decode quantizes SwiGLU for the down matrix in a dispatch of\n"
    "  its own instead of in the gate|up matrix's shader, to measure what fusing it saves.\n"
    "  --separate-matrices (vulkan): a dispatch for each of q, k, v and of gate, up, instead of one\n"
    "  for each stack, to measure what stacking them saves.\n"
    "  --copy-kv-rows (vulkan): the new K/V rows copied into the host's write-back buffer at the\n"
    "  end of each pass (a copy per sequence, layer and plane) instead of written there by\n"
    "  kv_store as it stores them, to measure what that saves.\n"
    "  --contract-floats (vulkan): the device may fuse a float multiply and add into one rounding\n"
    "  (default: each rounds as on the CPU, so the pass gives the CPU's bits), to measure what\n"
    "  that costs.\n"
    "  --untiled-attention (vulkan): one query (token, head) per attention workgroup instead of\n"
    "  several tokens and a KV head's query heads, each key and value read once for all of them,\n"
    "  to measure what the tiles save (prefill at depth above all; the same values).\n"
    "  --matvec-group N, --matvec-lanes N, --matvec-min-groups N, --matvec-rows N (vulkan): the\n"
    "  matrix-vector shaders' workgroup size (default 64), invocations per row at most (the\n"
    "  group), workgroups below which rows per slot stop growing (1024) and rows per slot at most\n"
    "  (8), for sweeps on a GPU (groups of 512 or more need fewer rows: the partial sums take\n"
    "  rows x 4 x group floats of shared memory). --matvec-ahead N: quantized units an invocation\n"
    "  loads before using any (default 1; 1 to 8): more bytes in flight for more registers.\n"
    "  --matvec-norm-group N (vulkan): decode's q|k|v, gate|up and output matrices make their\n"
    "  input's RMSNorm themselves, each workgroup of N invocations again (a power of two from\n"
    "  32 and the lanes of a row to the device's workgroup size), instead of a norm dispatch\n"
    "  and a barrier before them (default 0: off; the same values).\n"
    "  --shared-trees (vulkan): reduction trees (matrix-vector sums, RMSNorm, activation\n"
    "  quantization) entirely in shared memory, not their last steps by subgroup shuffles where\n"
    "  the device has them (the same values), to measure what the shuffles save.\n"
    "  --prefetch MIB (vulkan): decode reads up to MIB of the next weight matrices ahead into the\n"
    "  device's cache beside attention and the norms, while memory would idle (default 0: off;\n"
    "  pays where the last-level cache holds that much, as on large GPUs).\n"
    "  --tuning FILE (vulkan): the settings kvfs tune found (instead of the options above that\n"
    "  set the same things).\n";

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Stats {
  double median = 0, min = 0, max = 0;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  if (v.empty()) return s;
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

// Sums a range of 64-bit words with 8 independent accumulators; compiled once per ISA so the
// probe reads with the widest loads the CPU has (the weight kernels do; a narrower probe would
// understate the machine and flatter the decode fraction).
template <int kUnused>
inline uint64_t SumWords(const uint64_t* p, int64_t n) {
  uint64_t s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) s[k] += p[i + k];
  }
  for (; i < n; ++i) s[0] += p[i];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}
__attribute__((target("avx512f"))) uint64_t SumWordsAvx512(const uint64_t* p, int64_t n) { return SumWords<512>(p, n); }
__attribute__((target("avx2"))) uint64_t SumWordsAvx2(const uint64_t* p, int64_t n) { return SumWords<256>(p, n); }
uint64_t SumWordsBaseline(const uint64_t* p, int64_t n) { return SumWords<128>(p, n); }

// Read bandwidth of this machine with the pool's threads: each thread sums its share of a
// buffer much larger than the caches; best of several passes (GB/s).
double MeasureReadBandwidth(ThreadPool& pool) {
  const size_t bytes = size_t{1} << 30;
  std::vector<uint64_t> buf(bytes / 8);
  pool.Run([&](int ith, int nth) {
    auto [b, e] = SplitRange(static_cast<int64_t>(buf.size()), ith, nth);
    for (int64_t i = b; i < e; ++i) buf[i] = static_cast<uint64_t>(i);
  });
  const cpu::CpuFeatures& cpu = cpu::HostCpuFeatures();
  uint64_t (*sum)(const uint64_t*, int64_t) =
      cpu.avx512_core ? SumWordsAvx512 : cpu.avx2_fma_f16c ? SumWordsAvx2 : SumWordsBaseline;
  double best = 0;
  std::vector<uint64_t> sums(pool.size());
  for (int pass = 0; pass < 5; ++pass) {
    auto t0 = Clock::now();
    pool.Run([&](int ith, int nth) {
      auto [b, e] = SplitRange(static_cast<int64_t>(buf.size()), ith, nth);
      sums[ith] = sum(buf.data() + b, e - b);
    });
    best = std::max(best, bytes / Seconds(t0, Clock::now()) / 1e9);
  }
  volatile uint64_t sink = sums[0];
  (void)sink;
  return best;
}

int64_t ResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

int Fail(const std::string& m, int exit_code = 2) {
  std::fprintf(stderr, "kvfs bench: %s\n", m.c_str());
  return exit_code;
}

// --kv A,B,...: the formats measured interleaved (see the usage). Caches are filled once and
// truncated back to the depth after every test.
template <class Fill, class RandomTokens>
int BenchInterleaved(bool json, const Model& model, const std::vector<KvLayout>& layouts,
                     const std::vector<std::string>& names, int64_t depth, int64_t n_pp, int64_t n_tg, int reps,
                     int n_threads, const char* table_name, Fill& fill, RandomTokens& random_tokens, Backend& backend) {
  const size_t n_kv = layouts.size();
  const int64_t n_ctx = depth + std::max(n_pp, n_tg) + 1;
  std::vector<std::unique_ptr<SequenceKv>> caches;
  for (const KvLayout& l : layouts) {
    caches.push_back(std::make_unique<SequenceKv>(l, n_ctx));
    if (Status s = fill(*caches.back()); !s.ok()) return Fail(s.message());
  }
  std::vector<std::vector<double>> pp(n_kv), tg(n_kv);
  Logits logits;
  for (int r = 0; r < reps; ++r) {
    for (size_t k = 0; k < n_kv && n_pp > 0; ++k) {
      auto toks = random_tokens(n_pp);
      SequenceStep step{caches[k].get(), toks, false};
      auto t0 = Clock::now();
      if (Status s = backend.Forward(std::span<const SequenceStep>(&step, 1), logits); !s.ok()) return Fail(s.message());
      pp[k].push_back(n_pp / Seconds(t0, Clock::now()));
      caches[k]->Truncate(depth);
    }
    for (size_t k = 0; k < n_kv && n_tg > 0; ++k) {
      TokenId tok = static_cast<TokenId>(random_tokens(1)[0]);
      auto t0 = Clock::now();
      for (int64_t i = 0; i < n_tg; ++i) {
        SequenceStep step{caches[k].get(), std::span<const TokenId>(&tok, 1), false};
        if (Status s = backend.Forward(std::span<const SequenceStep>(&step, 1), logits); !s.ok()) return Fail(s.message());
        tok = random_tokens(1)[0];
      }
      tg[k].push_back(n_tg / Seconds(t0, Clock::now()));
      caches[k]->Truncate(depth);
    }
  }
  // Per-repetition ratios to the first format, then their median.
  auto ratio = [&](const std::vector<std::vector<double>>& v, size_t k) {
    std::vector<double> q;
    for (size_t r = 0; r < v[k].size(); ++r) q.push_back(v[k][r] / v[0][r]);
    return Summarize(q);
  };
  const std::string at = depth > 0 ? fmt::format(" @ d{}", depth) : "";
  if (json) {
    nlohmann::json runs = nlohmann::json::array();
    for (size_t k = 0; k < n_kv; ++k) {
      nlohmann::json j = {{"kv", names[k]},
                          {"kv_bytes_per_token", static_cast<double>(layouts[k].block_bytes()) / layouts[k].block_tokens}};
      if (n_pp > 0) {
        const Stats s = Summarize(pp[k]), q = ratio(pp, k);
        j["pp"] = {{"tokens", n_pp}, {"median", s.median}, {"min", s.min}, {"max", s.max}, {"rates", pp[k]},
                   {"ratio_to_first", {{"median", q.median}, {"min", q.min}, {"max", q.max}}}};
      }
      if (n_tg > 0) {
        const Stats s = Summarize(tg[k]), q = ratio(tg, k);
        j["tg"] = {{"tokens", n_tg}, {"median", s.median}, {"min", s.min}, {"max", s.max}, {"rates", tg[k]},
                   {"ratio_to_first", {{"median", q.median}, {"min", q.min}, {"max", q.max}}}};
      }
      runs.push_back(j);
    }
    nlohmann::json j = {{"model", model.path()}, {"threads", n_threads}, {"kernels", table_name},
                        {"depth", depth}, {"reps", reps}, {"interleaved", true}, {"runs", runs}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  fmt::print("model {}  kernels {}  threads {}  kv {} (interleaved)\n", model.path(), table_name, n_threads,
             fmt::join(names, ","));
  fmt::print("| test | kv | t/s median | min | max | vs {} (median of per-rep ratios) |\n|---|---|---|---|---|---|\n",
             names[0]);
  for (int test = 0; test < 2; ++test) {
    const auto& v = test == 0 ? pp : tg;
    const int64_t n = test == 0 ? n_pp : n_tg;
    if (n <= 0) continue;
    for (size_t k = 0; k < n_kv; ++k) {
      const Stats s = Summarize(v[k]), q = ratio(v, k);
      fmt::print("| {}{}{} | {} | {:.2f} | {:.2f} | {:.2f} | {:.3f}x ({:.3f}-{:.3f}) |\n", test == 0 ? "pp" : "tg", n, at,
                 names[k], s.median, s.min, s.max, q.median, q.min, q.max);
    }
  }
  return 0;
}

}  // namespace

int Bench(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "resume") return BenchResume(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "fs") return BenchFs(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "agents") return BenchAgents(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "batched") return BenchBatched(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "dispatch") return BenchDispatch(argc - 1, argv + 1);
  Args args(argc, argv,
            {"-m", "-p", "-n", "-d", "-t", "-r", "--kv", "--kv-rotate", "--backend", "--device", "--tuning", "--attn-split",
             "--matvec-group", "--matvec-lanes", "--matvec-min-groups", "--matvec-rows", "--matvec-ahead", "--matvec-norm-group", "--prefetch"},
            {"--json", "--profile", "--phases", "--separate-ops", "--gguf-rows", "--separate-softmax", "--separate-swiglu", "--separate-matrices", "--copy-kv-rows", "--contract-floats",
             "--shared-trees", "--untiled-attention", "--plain-weights", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(args.error() + " (see kvfs bench --help)");
  if (!args.has("-m")) return Fail("missing -m MODEL");
  const int64_t n_pp = args.get_int("-p", 512, 0, 1 << 20);
  const int64_t n_tg = args.get_int("-n", 128, 0, 1 << 20);
  const int64_t depth = args.get_int("-d", 0, 0, 1 << 24);
  const int n_threads = static_cast<int>(args.get_int("-t", std::max(1u, std::thread::hardware_concurrency()), 1, 1024));
  const int reps = static_cast<int>(args.get_int("-r", 3, 1, 1000));
  const std::string kv_type = args.get("--kv").value_or("f16");
  const BackendChoice backend_choice = ReadBackendChoice(args, n_threads);
  RefuseVulkanOnlyOptions(args, backend_choice,
                          {"--profile", "--attn-split", "--matvec-group", "--matvec-lanes", "--matvec-min-groups", "--matvec-rows",
                           "--matvec-ahead", "--matvec-norm-group", "--prefetch", "--phases", "--separate-ops",
                           "--gguf-rows", "--separate-softmax", "--separate-swiglu", "--separate-matrices",
                           "--copy-kv-rows", "--contract-floats", "--shared-trees", "--untiled-attention"});
  if (n_pp == 0 && n_tg == 0) args.set_error("-p 0 and -n 0: nothing to measure");
  const std::vector<std::string> kv_types = SplitList(kv_type);
  const int64_t attention_split = args.get_int("--attn-split", 0, 0, 1 << 20);
  if (Status s = CheckAttentionSplit(attention_split); !s.ok()) return Fail("--attn-split: " + s.message());
  const VulkanMatvecShape matvec{.group = args.get_int("--matvec-group", 0, 0, 1024),
                                 .lanes = args.get_int("--matvec-lanes", 0, 0, 1024),
                                 .min_groups = args.get_int("--matvec-min-groups", 0, 0, 1 << 24),
                                 .rows = args.get_int("--matvec-rows", 0, 0, 64),
                                 .ahead = args.get_int("--matvec-ahead", 0, 0, 8),
                                 .norm_group = args.get_int("--matvec-norm-group", 0, 0, 1024)};
  const int64_t prefetch_mib = args.get_int("--prefetch", 0, 0, 1 << 16);
  if (!args.error().empty()) return Fail(args.error());

  spdlog::set_level(spdlog::level::warn);
  const int64_t rss0 = ResidentBytes();
  auto t_load = Clock::now();
  auto model_or = Model::Load(*args.get("-m"));
  if (!model_or.ok()) return Fail(model_or.status().message());
  const Model& model = **model_or;
  const double load_seconds = Seconds(t_load, Clock::now());
  const HParams& hp = model.hparams();
  const int64_t n_ctx = depth + std::max(n_pp, n_tg) + 1;
  const cpu::KernelTable& table = cpu::DefaultKernelTable();
  BackendChoice choice = backend_choice;
  choice.cpu_fallback = false;  // the figures are the device's or an error, never the CPU's
  choice.cpu.kernels = &table;
  choice.cpu.pack_weights = !args.has("--plain-weights");
  choice.phase_clock = args.has("--phases");
  choice.profile = args.has("--profile") || choice.phase_clock;
  choice.fuse_ops = !args.has("--separate-ops");
  choice.split_weight_rows = !args.has("--gguf-rows");
  choice.tuning.attention_split = attention_split;
  choice.tuning.fuse_softmax = !args.has("--separate-softmax");
  choice.tuning.swiglu_in_matvec = !args.has("--separate-swiglu");
  choice.stack_matrices = !args.has("--separate-matrices");
  choice.query_tiles = !args.has("--untiled-attention");
  choice.kv_rows_by_kv_store = !args.has("--copy-kv-rows");
  choice.contract_floats = args.has("--contract-floats");
  choice.tuning.matvec = matvec;
  choice.tuning.subgroup_trees = !args.has("--shared-trees");
  choice.tuning.prefetch_mib = prefetch_mib;
  if (!choice.tuning_file.empty() && !(choice.tuning == VulkanTuning{})) {
    return Fail("--tuning and the options it sets (--attn-split, --separate-softmax, --separate-swiglu, "
                "--shared-trees, --prefetch, --matvec-*) exclude each other");
  }
  std::string backend_used;
  const auto t_backend = Clock::now();
  auto backend_or = MakeChosenBackend(model, choice, "bench", &backend_used);
  const double backend_seconds = Seconds(t_backend, Clock::now());  // Vulkan: weight upload, pipelines
  // No device to time (exit 1, as kvfs tune, shaders and devices) is not a bad option (exit 2).
  if (!backend_or.ok())
    return Fail(backend_or.status().message(), backend_or.status().code() == StatusCode::kUnavailable ? 1 : 2);
  std::unique_ptr<Backend> backend = std::move(*backend_or);
  const bool on_cpu = backend_used == "cpu";
  const std::string kernels = on_cpu ? table.name : backend_used;
  if (choice.profile && on_cpu) std::fputs("kvfs bench: --profile times Vulkan dispatches; the CPU backend has none\n", stderr);
  std::vector<KvLayout> layouts;
  for (const std::string& t : kv_types) {
    auto kv_format = MakeKvFormat(t, args.get("--kv-rotate").value_or(""), hp.n_head_kv, hp.head_dim);
    if (!kv_format.ok()) return Fail(kv_format.status().message());
    layouts.push_back(KvLayoutFor(hp, *kv_format));
  }
  const KvLayout& layout = layouts[0];

  std::mt19937 rng(1234);
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> t(n);
    for (auto& x : t) x = static_cast<TokenId>(rng() % hp.n_vocab);
    return t;
  };
  // Fills the context to `depth` (untimed), in chunks of 512 like a real prefill.
  auto fill = [&](SequenceKv& kv) -> Status {
    Logits logits;
    for (int64_t at = 0; at < depth; at += 512) {
      auto toks = random_tokens(std::min<int64_t>(512, depth - at));
      SequenceStep s{&kv, toks, false};
      KVFS_RETURN_IF_ERROR(backend->Forward(std::span<const SequenceStep>(&s, 1), logits));
    }
    return Status::Ok();
  };

  // Untimed warm-up on the Vulkan backend, per KV format: a prompt batch and decode steps make
  // the pipelines of every shader variant the timed runs use (compiled on first use), and the
  // decode steps go on for a second: an H200 timed the first of two tg128 runs at depth 0, right
  // after the model's load, up to 3x slower than the second (its clocks rising, or first uses not
  // told apart), where after the fill of depth 3500 they were 0.1-17% apart.
  Logits logits;
  auto warm_up = [&](const KvLayout& l) -> Status {
    constexpr int kMaxWarmSteps = 1024;
    constexpr double kWarmSeconds = 1.0;
    SequenceKv kv(l, std::max<int64_t>(n_pp, 1) + kMaxWarmSteps);
    auto toks = random_tokens(std::max<int64_t>(n_pp, 1));
    SequenceStep step{&kv, toks, false};
    KVFS_RETURN_IF_ERROR(backend->Forward(std::span<const SequenceStep>(&step, 1), logits));
    const auto warm_start = Clock::now();
    for (int i = 0; i < kMaxWarmSteps && (i < 2 || Seconds(warm_start, Clock::now()) < kWarmSeconds); ++i) {
      TokenId tok = static_cast<TokenId>(rng() % hp.n_vocab);
      SequenceStep one{&kv, std::span<const TokenId>(&tok, 1), false};
      KVFS_RETURN_IF_ERROR(backend->Forward(std::span<const SequenceStep>(&one, 1), logits));
    }
    return Status::Ok();
  };
  if (!on_cpu) {
    for (const KvLayout& l : layouts)
      if (Status s = warm_up(l); !s.ok()) return Fail(s.message());
  }
  if (layouts.size() > 1) return BenchInterleaved(args.has("--json"), model, layouts, kv_types, depth, n_pp, n_tg, reps,
                                                  n_threads, kernels.c_str(), fill, random_tokens, *backend);

  std::vector<double> pp_rates, tg_rates;
  // --profile: the last repetition's pp and tg, each without the fill before it.
  std::string pp_profile, tg_profile;
  for (int r = 0; r < reps; ++r) {
    if (n_pp > 0) {
      SequenceKv kv(layout, n_ctx);
      if (Status s = fill(kv); !s.ok()) return Fail(s.message());
      auto toks = random_tokens(n_pp);
      SequenceStep step{&kv, toks, false};
      backend->TakeProfileReport();
      auto t0 = Clock::now();
      if (Status s = backend->Forward(std::span<const SequenceStep>(&step, 1), logits); !s.ok()) return Fail(s.message());
      pp_rates.push_back(n_pp / Seconds(t0, Clock::now()));
      pp_profile = backend->TakeProfileReport();
    }
    if (n_tg > 0) {
      SequenceKv kv(layout, n_ctx);
      if (Status s = fill(kv); !s.ok()) return Fail(s.message());
      TokenId tok = static_cast<TokenId>(rng() % hp.n_vocab);
      backend->TakeProfileReport();
      auto t0 = Clock::now();
      for (int64_t i = 0; i < n_tg; ++i) {
        SequenceStep step{&kv, std::span<const TokenId>(&tok, 1), false};
        if (Status s = backend->Forward(std::span<const SequenceStep>(&step, 1), logits); !s.ok()) return Fail(s.message());
        tok = static_cast<TokenId>(rng() % hp.n_vocab);
      }
      tg_rates.push_back(n_tg / Seconds(t0, Clock::now()));
      tg_profile = backend->TakeProfileReport();
    }
  }
  if (!pp_profile.empty()) fmt::print(stderr, "profile of pp{} at depth {}:\n{}", n_pp, depth, pp_profile);
  if (!tg_profile.empty()) fmt::print(stderr, "profile of tg{} at depth {}:\n{}", n_tg, depth, tg_profile);
  const int64_t rss = ResidentBytes();

  // The host's read bandwidth is the yardstick of CPU decoding only.
  double read_gbs = 0.0;
  if (on_cpu) {
    ThreadPool bw_pool(n_threads);
    read_gbs = MeasureReadBandwidth(bw_pool);
  }
  // Bytes read per generated token: every weight except the embedding table (one row is read)
  // and, at the mean depth of the tg run, the encoded K and V rows of every layer.
  const ModelWeights& w = model.weights();
  const double embd_bytes = static_cast<double>(w.token_embd.row_bytes * w.token_embd.n_out);
  const double weight_bytes = w.total_bytes - (w.tied_output ? 0.0 : embd_bytes);
  const double kv_bytes = static_cast<double>(layout.block_bytes()) / layout.block_tokens * (depth + n_tg / 2.0);
  const Stats pp = Summarize(pp_rates), tg = Summarize(tg_rates);
  const double decode_gbs = (weight_bytes + kv_bytes) * tg.median / 1e9;

  if (args.has("--json")) {
    nlohmann::json j = {{"model", model.path()}, {"model_bytes", w.total_bytes}, {"threads", n_threads},
                        {"backend", on_cpu ? "cpu" : "vulkan"}, {"kernels", kernels}, {"kv", kv_type}, {"depth", depth}, {"reps", reps},
                        {"load_seconds", load_seconds}, {"backend_seconds", backend_seconds}, {"resident_bytes", rss}, {"resident_bytes_before_load", rss0},
                        {"pp", {{"tokens", n_pp}, {"median", pp.median}, {"min", pp.min}, {"max", pp.max}}},
                        {"tg", {{"tokens", n_tg}, {"median", tg.median}, {"min", tg.min}, {"max", tg.max}}},
                        {"decode_bytes_per_token", weight_bytes + kv_bytes}, {"decode_gbs", decode_gbs},
                        // (the host's read bandwidth is not measured for a device run: null)
                        {"read_bandwidth_gbs", on_cpu ? nlohmann::json(read_gbs) : nlohmann::json()},
                        {"decode_bandwidth_fraction", on_cpu ? nlohmann::json(decode_gbs / read_gbs) : nlohmann::json()}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  fmt::print("model {}  {:.1f} MiB weights  load {:.2f} s  resident {:.1f} MiB  kernels {}  threads {}  kv {}\n",
             model.path(), w.total_bytes / 1048576.0, load_seconds, rss / 1048576.0, kernels, n_threads, kv_type);
  fmt::print("| test | t/s median | min | max |\n|---|---|---|---|\n");
  const std::string at = depth > 0 ? fmt::format(" @ d{}", depth) : "";
  if (n_pp > 0) fmt::print("| pp{}{} | {:.2f} | {:.2f} | {:.2f} |\n", n_pp, at, pp.median, pp.min, pp.max);
  if (n_tg > 0) fmt::print("| tg{}{} | {:.2f} | {:.2f} | {:.2f} |\n", n_tg, at, tg.median, tg.min, tg.max);
  if (n_tg > 0 && on_cpu) {
    fmt::print("decode reads {:.1f} MB/token -> {:.1f} GB/s = {:.0f}% of the measured read bandwidth {:.1f} GB/s\n",
               (weight_bytes + kv_bytes) / 1e6, decode_gbs, 100.0 * decode_gbs / read_gbs, read_gbs);
  } else if (n_tg > 0) {
    fmt::print("decode reads {:.1f} MB/token -> {:.1f} GB/s of device memory\n", (weight_bytes + kv_bytes) / 1e6,
               decode_gbs);
  }
  return 0;
}

}  // namespace kvfs::cli
