// kvfs bench batched: the forward pass over several sequences at once, like the reference's
// llama-batched-bench (-npp, -ntg, -npl): per batch size, every sequence gets a prompt of --npp
// tokens (prefilled together, timed), then --ntg decode steps each decode one token of every
// sequence in one pass (timed). Runs the backend directly, without the engine's scheduler, so
// it measures the forward pass alone; `kvfs bench agents` measures the whole engine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "engine/backend/backend.h"
#include "engine/kv/sequence_kv.h"
#include "tools/args.h"
#include "tools/backend_choice.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

constexpr const char* kUsage =
    "usage: kvfs bench batched -m MODEL [--npp 1024] [--ntg 64] [--npl 1,4,8] [--kv q4] [-t 2] [-r 1]\n"
    "                          [--backend cpu|vulkan] [--device N] [--profile] [--serial-attention]\n"
    "                          [--dispatch-per-sequence] [--copy-kv-rows] [--batch-variant] [--no-warmup] [--json]\n"
    "  per batch size (--npl): prefill --npp tokens into each sequence (all together), then\n"
    "  --ntg steps decoding one token of every sequence per forward pass; tokens/s of all\n"
    "  sequences, decode speed-up over one sequence (\"-\" without --npl 1), medians over -r\n"
    "  repetitions. Batch sizes run in ascending order.\n"
    "  --profile (vulkan): times every dispatch and prints, on stderr, where the device time of\n"
    "  each batch size's last decode steps went.\n"
    "  Vulkan compiles a shader variant when a pass first needs it (some only at a depth the\n"
    "  decode reaches: a completed q4k chunk, a second split), so each batch size first runs once\n"
    "  untimed; --no-warmup skips that.\n"
    "  --serial-attention (vulkan): each sequence's attention after the previous one's, with its\n"
    "  own barriers, instead of all side by side, to measure what batching it saves.\n"
    "  --dispatch-per-sequence (vulkan): a kv_store, attn_scores, softmax and attn_output dispatch\n"
    "  per sequence and layer, side by side, instead of one for all the sequences of a KV layout\n"
    "  (softmax: of all layouts), to measure what merging them saves.\n"
    "  --copy-kv-rows (vulkan): the new K/V rows copied into the host's write-back buffer at the\n"
    "  end of each pass (a copy per sequence, layer and plane) instead of written there by\n"
    "  kv_store, to measure what that saves.\n"
    "  --batch-variant (vulkan): a pass of more than 8 rows multiplies them all with the tiled\n"
    "  matrix shaders (weights read once per 64 rows) instead of each sequence's rows with the\n"
    "  shader its own length picks (decode rows: the matrix-vector shaders, weights read once per\n"
    "  16 rows), to measure what batch invariance costs (a sequence's logits then depend on what\n"
    "  shares its pass).\n";

using Clock = std::chrono::steady_clock;

int Fail(const std::string& m, int exit_code = 2) {
  std::fprintf(stderr, "kvfs bench batched: %s\n", m.c_str());
  return exit_code;
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

int BenchBatched(int argc, char** argv) {
  Args args(argc, argv, {"-m", "--npp", "--ntg", "--npl", "--kv", "--kv-rotate", "-t", "-r", "--backend", "--device", "--tuning"},
            {"--json", "--profile", "--serial-attention", "--dispatch-per-sequence", "--copy-kv-rows", "--batch-variant", "--no-warmup",
             "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kUsage, stdout);
    std::fputs(kBackendUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(args.error());
  if (!args.has("-m")) return Fail("-m MODEL is required");
  const int64_t n_pp = args.get_int("--npp", 1024, 1, 1 << 20);
  const int64_t n_tg = args.get_int("--ntg", 64, 1, 1 << 20);
  const int threads = static_cast<int>(args.get_int("-t", 2, 1, 1024));
  const int reps = static_cast<int>(args.get_int("-r", 1, 1, 1000));
  BackendChoice choice = ReadBackendChoice(args, threads);
  RefuseVulkanOnlyOptions(args, choice,
                          {"--profile", "--serial-attention", "--dispatch-per-sequence", "--copy-kv-rows", "--batch-variant"});
  choice.cpu_fallback = false;  // the figures are the device's or an error, never the CPU's
  choice.profile = args.has("--profile");
  choice.batch_attention = !args.has("--serial-attention");
  choice.kv_rows_by_kv_store = !args.has("--copy-kv-rows");
  choice.merge_sequences = !args.has("--dispatch-per-sequence");
  choice.batch_invariant = !args.has("--batch-variant");
  if (!args.error().empty()) return Fail(args.error());
  auto npl_list = ParseIntList(args.get("--npl").value_or("1,4,8"), "--npl", 1, 256);
  if (!npl_list.ok()) return Fail(npl_list.status().message());
  // Ascending and once each, so the one-sequence run (when asked for) comes first and every
  // larger batch's speed-up is against it.
  std::sort(npl_list->begin(), npl_list->end());
  npl_list->erase(std::unique(npl_list->begin(), npl_list->end()), npl_list->end());
  const std::string kv_type = args.get("--kv").value_or("q4");
  spdlog::set_level(spdlog::level::warn);

  auto model_or = Model::Load(*args.get("-m"));
  if (!model_or.ok()) return Fail(model_or.status().message());
  const Model& model = **model_or;
  const HParams& hp = model.hparams();
  std::string used;
  auto backend_or = MakeChosenBackend(model, choice, "bench batched", &used);
  // No device to time (exit 1, as kvfs tune, shaders and devices) is not a bad option (exit 2).
  if (!backend_or.ok())
    return Fail(backend_or.status().message(), backend_or.status().code() == StatusCode::kUnavailable ? 1 : 2);
  Backend& backend = **backend_or;
  auto fmt = MakeKvFormat(kv_type, args.get("--kv-rotate").value_or(""), hp.n_head_kv, hp.head_dim);
  if (!fmt.ok()) return Fail(fmt.status().message());
  const KvLayout layout = KvLayoutFor(hp, *fmt);

  std::mt19937 rng(4321);
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<TokenId>(rng() % hp.n_vocab);
    return t;
  };

  nlohmann::json rows = nlohmann::json::array();
  const bool json = args.has("--json");
  if (!json) {
    std::printf("model %s, backend %s, kv %s, %d threads, npp %lld, ntg %lld\n", args.get("-m")->c_str(), used.c_str(),
                fmt->Name().c_str(), threads, static_cast<long long>(n_pp), static_cast<long long>(n_tg));
    std::printf("%5s %12s %12s %12s %10s\n", "npl", "pp_t/s", "tg_t/s", "step_ms", "tg_vs_1");
  }
  const bool warmup = choice.vulkan && !args.has("--no-warmup");
  double tg_one = 0;
  for (int64_t npl : *npl_list) {
    std::vector<double> pp_rates, tg_rates;
    for (int r = warmup ? -1 : 0; r < reps; ++r) {  // r -1: the untimed warm-up
      std::vector<std::unique_ptr<SequenceKv>> kvs;
      for (int64_t i = 0; i < npl; ++i) kvs.push_back(std::make_unique<SequenceKv>(layout, n_pp + n_tg + 1));
      Logits logits;
      // Prefill: chunks of up to 512 tokens per sequence, all sequences in each pass.
      std::vector<std::vector<TokenId>> prompts;
      for (int64_t i = 0; i < npl; ++i) prompts.push_back(random_tokens(n_pp));
      const auto t0 = Clock::now();
      for (int64_t at = 0; at < n_pp; at += 512) {
        const int64_t n = std::min<int64_t>(512, n_pp - at);
        std::vector<SequenceStep> steps;
        for (int64_t i = 0; i < npl; ++i) {
          steps.push_back(SequenceStep{kvs[i].get(), std::span<const TokenId>(prompts[i].data() + at, n), false});
        }
        if (Status s = backend.Forward(steps, logits); !s.ok()) return Fail(s.message());
      }
      const auto t1 = Clock::now();
      backend.TakeProfileReport();  // --profile: the decode steps alone
      std::vector<TokenId> next = random_tokens(npl);
      for (int64_t k = 0; k < n_tg; ++k) {
        std::vector<SequenceStep> steps;
        for (int64_t i = 0; i < npl; ++i) steps.push_back(SequenceStep{kvs[i].get(), std::span<const TokenId>(&next[i], 1), false});
        if (Status s = backend.Forward(steps, logits); !s.ok()) return Fail(s.message());
        next = random_tokens(npl);
      }
      const auto t2 = Clock::now();
      if (r < 0) continue;
      if (const std::string profile = backend.TakeProfileReport(); !profile.empty() && r + 1 == reps) {
        std::fprintf(stderr, "== profile: npl %lld, %lld decode steps\n%s", static_cast<long long>(npl),
                     static_cast<long long>(n_tg), profile.c_str());
      }
      pp_rates.push_back(static_cast<double>(npl * n_pp) / Seconds(t0, t1));
      tg_rates.push_back(static_cast<double>(npl * n_tg) / Seconds(t1, t2));
    }
    const double pp = Median(pp_rates), tg = Median(tg_rates);
    if (npl == 1) tg_one = tg;
    const double step_ms = 1000.0 * static_cast<double>(npl) / tg;
    // Without a one-sequence run there is nothing to compare with: null and "-".
    const nlohmann::json vs_one = tg_one > 0 ? nlohmann::json(tg / tg_one) : nlohmann::json(nullptr);
    rows.push_back({{"npl", npl}, {"pp_tokens_per_s", pp}, {"tg_tokens_per_s", tg}, {"step_ms", step_ms},
                    {"tg_vs_one", vs_one}, {"pp_runs", pp_rates}, {"tg_runs", tg_rates}});
    if (!json) {
      const std::string vs_one_text = tg_one > 0 ? fmt::format("{:.2f}", tg / tg_one) : "-";
      std::printf("%5lld %12.1f %12.2f %12.2f %10s\n", static_cast<long long>(npl), pp, tg, step_ms,
                  vs_one_text.c_str());
      std::fflush(stdout);
    }
  }
  if (json) {
    std::printf("%s\n", nlohmann::json{{"model", *args.get("-m")}, {"backend", used}, {"kv", fmt->Name()}, {"threads", threads},
                                       {"npp", n_pp}, {"ntg", n_tg}, {"results", rows}}
                            .dump(2)
                            .c_str());
  }
  return 0;
}

}  // namespace kvfs::cli
