// kvfs bench agents: many agents at once. For each agent count, every agent first gets a
// context of --ctx tokens (not timed, unless --cold; all counts' agents before any timed turn),
// then all submit a new turn at once (or --stagger-ms apart) and generate -n tokens; reported:
// system throughput (all generated tokens / wall time), per-agent decode rate and TTFT (median,
// max), and the same workload run one agent after another for comparison.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/kv/kv_format.h"
#include "engine/model/model.h"
#include "engine/runtime/engine.h"
#include "tools/args.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace kvfs::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: kvfs bench agents -m MODEL [--agents 1,2,4,8] [--ctx 1024] [-n 64] [--kv q4] [--stagger-ms 0]\n"
    "                          [--cold] [-t THREADS] [--repeat R] [--json]\n"
    "  each agent holds a --ctx-token context (cached first; with --cold it is the new turn's prompt),\n"
    "  then all agents run a turn generating -n tokens, together and then one after another.\n"
    "  all contexts are set up first, then the timed turns run back to back (together for every count,\n"
    "  then one after another), so the runs a ratio compares are seconds apart.\n"
    "  --repeat R runs the whole --agents list R times, interleaved, and ends with the medians: each\n"
    "  vs_1 is taken against the one-agent run of its own repetition (the host's memory bandwidth\n"
    "  drifts by tens of percent between minutes, and every ratio with it); the counts run in increasing\n"
    "  order, and without 1 among them vs_1 is \"-\" (null in --json).\n";

int Fail(const std::string& m) {
  std::fprintf(stderr, "kvfs bench agents: %s\n", m.c_str());
  return 2;
}

struct RunResult {
  double wall_s = 0;
  int64_t generated = 0;
  std::vector<double> ttft_ms, decode_tps;
  // Per agent, seconds from the start of the run: submission, end of the turn, and each piece
  // of streamed text (one per generated token, but for pieces held back mid-character).
  std::vector<double> submit_s, done_s;
  std::vector<std::vector<double>> text_s;
  // The engine's forward passes during the run: count, decoded and prefilled tokens, time.
  uint64_t passes = 0, decode_tokens = 0, prefill_tokens = 0;
  double forward_ms = 0;
};

// Runs one turn per agent; together (all submitted, stagger_ms apart) or one after another.
Result<RunResult> RunTurns(AgentEngine& e, const std::vector<std::string>& agents, const std::vector<std::string>& texts,
                           bool together, int64_t stagger_ms) {
  RunResult r;
  const size_t n = agents.size();
  std::vector<Result<TurnStats>> stats(n, Status(StatusCode::kInternal, "not run"));
  r.submit_s.assign(n, 0);
  r.done_s.assign(n, 0);
  r.text_s.assign(n, {});
  std::mutex mu;  // the callbacks run on the engine thread; the vectors are read after all are done
  const EngineStatus before = e.Stats();
  const auto t0 = Clock::now();
  auto since = [t0] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::vector<std::promise<void>> done(n);
  auto submit = [&](size_t i) -> Status {
    TurnRequest req;
    req.agent = agents[i];
    req.text = texts[i];
    req.on_text = [&, i](std::string_view) {
      std::lock_guard lock(mu);
      r.text_s[i].push_back(since());
    };
    req.on_done = [&, i](const Result<TurnStats>& s) {
      {
        std::lock_guard lock(mu);
        stats[i] = s;
        r.done_s[i] = since();
      }
      done[i].set_value();
    };
    r.submit_s[i] = since();
    return e.SubmitTurn(std::move(req));
  };
  for (size_t i = 0; i < n; ++i) {
    if (together && i > 0 && stagger_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stagger_ms));
    KVFS_RETURN_IF_ERROR(submit(i));
    if (!together) done[i].get_future().wait();
  }
  if (together) {
    for (auto& d : done) d.get_future().wait();
  }
  r.wall_s = since();
  const EngineStatus after = e.Stats();
  r.passes = after.forward_passes - before.forward_passes;
  r.decode_tokens = after.decode_tokens - before.decode_tokens;
  r.prefill_tokens = after.prefill_tokens - before.prefill_tokens;
  r.forward_ms = after.forward_ms - before.forward_ms;
  std::lock_guard lock(mu);
  for (auto& s : stats) {
    if (!s.ok()) return s.status();
    r.generated += s->generated_tokens;
    r.ttft_ms.push_back(s->ttft_ms);
    r.decode_tps.push_back(s->decode_tokens_per_s);
  }
  return r;
}

// Staggered arrivals (issue 6): how the second agent's arrival affects both. The second agent's
// TTFT from its arrival, against what it would be if it were served after the first finished
// (the serial run's times: it waits for the first agent's whole turn, then runs alone); the
// first agent's decode rate while the second prefills, against its rate alone.
nlohmann::json StaggerFigures(const RunResult& together, const RunResult& serial, double stagger_s) {
  const double queued_ttft_ms =
      1000.0 * std::max(0.0, (serial.done_s[0] - serial.submit_s[0]) - stagger_s) + serial.ttft_ms[1];
  nlohmann::json j = {{"second_ttft_ms", together.ttft_ms[1]},
                      {"second_ttft_if_served_after_first_ms", queued_ttft_ms},
                      {"second_ttft_alone_ms", serial.ttft_ms[1]},
                      // What the second's arrival cost the first: its TTFT here and alone.
                      {"first_ttft_ms", together.ttft_ms[0]},
                      {"first_ttft_alone_ms", serial.ttft_ms[0]},
                      {"first_decode_tokens_per_s_alone", serial.decode_tps[0]}};
  // Window: the first agent is decoding and the second has arrived but not yet produced text.
  const std::vector<double>& first = together.text_s[0];
  const double w0 = std::max(first.empty() ? 0.0 : first.front(), together.submit_s[1]);
  const double w1 = together.text_s[1].empty() ? together.done_s[1] : together.text_s[1].front();
  const double end = std::min(w1, first.empty() ? 0.0 : first.back());
  int64_t tokens = 0;
  for (double t : first) tokens += (t > w0 && t <= end) ? 1 : 0;
  if (end - w0 > 0.05 && tokens >= 2) {
    j["first_decode_tokens_per_s_while_second_prefills"] = static_cast<double>(tokens) / (end - w0);
    j["overlap_s"] = end - w0;
  } else {
    j["first_decode_tokens_per_s_while_second_prefills"] = nullptr;  // no overlap: the first never waited
    j["overlap_s"] = 0.0;
  }
  return j;
}

// The timed turn's text for a new agent: with `cold`, its whole --ctx-token context; else the
// context is prefilled now (a one-token turn, untimed) and the turn adds kTurnTokens more.
constexpr int64_t kTurnTokens = 16;
Result<std::string> SetUpAgent(AgentEngine& e, const Tokenizer& tok, const std::string& name,
                               const AgentSettings& settings, int64_t ctx, bool cold, int seed) {
  const std::string context = TextOfTokens(tok, ctx, seed);
  if (cold) return context;
  AgentSettings quick = settings;
  quick.max_tokens = 1;
  KVFS_RETURN_IF_ERROR(e.SetSettings(name, quick));
  KVFS_RETURN_IF_ERROR(RunTurnSync(e, name, context).status());
  KVFS_RETURN_IF_ERROR(e.SetSettings(name, settings));
  return TextOfTokens(tok, kTurnTokens, seed + 500);
}

}  // namespace

int BenchAgents(int argc, char** argv) {
  Args args(argc, argv, {"-m", "--agents", "--ctx", "-n", "--kv", "--stagger-ms", "-t", "--repeat"},
            {"--json", "--cold", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(args.error());
  if (!args.has("-m")) return Fail("-m MODEL is required");
  auto counts_list = ParseIntList(args.get("--agents").value_or("1,2,4,8"), "--agents", 1, 256);
  if (!counts_list.ok()) return Fail(counts_list.status().message());
  std::vector<int64_t> counts = *counts_list;
  // In increasing order: the ratios (vs_1) are taken against the one-agent run of each
  // repetition, which then comes first. Without 1 in the list there is no ratio ("-", null).
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  const bool has_one = counts.front() == 1;
  const int64_t ctx = args.get_int("--ctx", 1024, 1, 131072);
  const int64_t n_gen = args.get_int("-n", 64, 1, 65536);
  const int64_t stagger = args.get_int("--stagger-ms", 0, 0, 600000);
  const int threads = static_cast<int>(args.get_int("-t", 2, 1, 256));
  const int64_t repeats = args.get_int("--repeat", 1, 1, 100);
  if (!args.error().empty()) return Fail(args.error());
  const bool cold = args.has("--cold");
  const std::string kv = args.get("--kv").value_or("q4");
  spdlog::set_level(spdlog::level::warn);

  auto model = Model::Load(*args.get("-m"));
  if (!model.ok()) return Fail(model.status().message());
  {  // a bad --kv is reported before any output
    const HParams& hp = (*model)->hparams();
    auto format = MakeKvFormat(kv, "", hp.n_head_kv, hp.head_dim);
    if (!format.ok()) return Fail(format.status().message());
  }
  const Tokenizer& tok = (*model)->tokenizer();
  EngineOptions o;
  o.model_path = *args.get("-m");
  o.n_threads = threads;
  o.kv = kv;
  o.n_ctx = ctx + n_gen + 64;
  o.max_queued_turns = 8;
  AgentSettings settings;
  settings.sampling.temperature = 0;
  settings.max_tokens = static_cast<int>(n_gen);
  settings.kv = kv;

  nlohmann::json rows = nlohmann::json::array();
  double one_agent_throughput = 0;
  if (!args.has("--json")) {
    std::printf("model %s, kv %s, %d threads, ctx %lld%s, %lld new tokens per agent, stagger %lld ms\n",
                o.model_path.c_str(), kv.c_str(), threads, static_cast<long long>(ctx), cold ? " (cold)" : " (cached)",
                static_cast<long long>(n_gen), static_cast<long long>(stagger));
    std::printf("%7s %12s %8s %14s %14s %13s %13s %12s %10s %8s %10s %9s\n", "agents", "system_t/s", "vs_1", "agent_t/s_med",
                "ttft_med_ms", "ttft_max_ms", "serial_t/s", "serial_ttft", "vs_serial", "passes", "ms/pass", "fwd_share");
  }
  for (int64_t rep = 0; rep < repeats; ++rep) {
    one_agent_throughput = 0;
    auto engine = CreateEngine(o);
    if (!engine.ok()) return Fail(engine.status().message());
    // Every agent of the repetition is set up first (a cached context takes seconds to
    // prefill), then the timed turns run back to back: together for each count, then one after
    // another. The runs a ratio compares are seconds apart, not a setup's minute: the host's
    // memory bandwidth, and every decode rate with it, drifts between fast and slow phases.
    struct Group {
      std::vector<std::string> agents, texts;
    };
    std::vector<std::array<Group, 2>> groups(counts.size());  // [count][together, serial]
    for (size_t ci = 0; ci < counts.size(); ++ci) {
      for (int pass = 0; pass < 2; ++pass) {
        Group& g = groups[ci][pass];
        for (int64_t i = 0; i < counts[ci]; ++i) {
          const std::string name = fmt::format("n{}p{}a{}", counts[ci], pass, i);
          if (!(*engine)->CreateAgent(name, 0).ok() || !(*engine)->SetSettings(name, settings).ok()) {
            return Fail("agent setup failed");
          }
          g.agents.push_back(name);
          auto text = SetUpAgent(**engine, tok, name, settings, ctx, cold, static_cast<int>(pass * 1000 + i));
          if (!text.ok()) return Fail(text.status().message());
          g.texts.push_back(*text);
        }
      }
    }
    std::vector<RunResult> together_runs(counts.size()), serial_runs(counts.size());
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t ci = 0; ci < counts.size(); ++ci) {
        auto r = RunTurns(**engine, groups[ci][pass].agents, groups[ci][pass].texts, pass == 0, stagger);
        if (!r.ok()) return Fail(r.status().message());
        (pass == 0 ? together_runs : serial_runs)[ci] = *r;
      }
    }
    for (size_t ci = 0; ci < counts.size(); ++ci) {
      const int64_t n = counts[ci];
      const RunResult& together = together_runs[ci];
      const RunResult& serial = serial_runs[ci];
      const double tput = together.generated / together.wall_s, serial_tput = serial.generated / serial.wall_s;
      if (n == counts.front() && n == 1) one_agent_throughput = tput;
      const double vs1 = one_agent_throughput > 0 ? tput / one_agent_throughput : 0;
      const nlohmann::json vs1_json = has_one ? nlohmann::json(vs1) : nlohmann::json(nullptr);
      const std::string vs1_text = has_one ? fmt::format("{:8.2f}", vs1) : fmt::format("{:>8}", "-");
      const double ttft_max = *std::max_element(together.ttft_ms.begin(), together.ttft_ms.end());
      nlohmann::json row = {{"agents", n},
                            {"repetition", rep},
                            {"system_tokens_per_s", tput},
                            {"vs_one_agent", vs1_json},
                            {"agent_tokens_per_s_median", Median(together.decode_tps)},
                            {"ttft_ms_median", Median(together.ttft_ms)},
                            {"ttft_ms_max", ttft_max},
                            {"ttft_ms", together.ttft_ms},
                            {"serial_tokens_per_s", serial_tput},
                            {"serial_ttft_ms", serial.ttft_ms},
                            {"speedup_vs_serial", tput / serial_tput},
                            {"wall_s", together.wall_s},
                            // Where the wall time went: forward passes (count, mean decode batch,
                            // ms per pass) and their share of the wall time; the rest is scheduling,
                            // sampling, streaming and commits.
                            {"forward_passes", together.passes},
                            {"decode_tokens", together.decode_tokens},
                            {"prefill_tokens", together.prefill_tokens},
                            {"forward_ms_per_pass", together.passes ? together.forward_ms / together.passes : 0.0},
                            {"forward_share", together.forward_ms / (1000.0 * together.wall_s)},
                            {"serial_wall_s", serial.wall_s}};
      nlohmann::json stagger_figures;
      if (n >= 2 && stagger > 0) {
        stagger_figures = StaggerFigures(together, serial, static_cast<double>(stagger) / 1000.0);
        row["stagger"] = stagger_figures;
      }
      rows.push_back(row);
      if (!args.has("--json")) {
        std::printf("%7lld %12.2f %s %14.2f %14.1f %13.1f %13.2f %12.1f %10.2f %8llu %10.1f %9.2f\n", static_cast<long long>(n),
                    tput, vs1_text.c_str(), Median(together.decode_tps), Median(together.ttft_ms), ttft_max, serial_tput, Median(serial.ttft_ms),
                    tput / serial_tput, static_cast<unsigned long long>(together.passes),
                    together.passes ? together.forward_ms / together.passes : 0.0, together.forward_ms / (1000.0 * together.wall_s));
        if (!stagger_figures.is_null()) std::printf("        staggered arrivals: %s\n", stagger_figures.dump().c_str());
        std::fflush(stdout);
      }
    }
  }  // repetitions
  // Medians over the repetitions, per agent count.
  nlohmann::json summary = nlohmann::json::array();
  if (repeats > 1) {
    if (!args.has("--json")) {
      std::printf("medians of %lld repetitions:\n%7s %12s %8s %18s\n", static_cast<long long>(repeats), "agents",
                  "system_t/s", "vs_1", "vs_1 min..max");
    }
    for (int64_t n : counts) {
      std::vector<double> tput, vs1;
      for (const auto& row : rows) {
        if (row["agents"].get<int64_t>() != n) continue;
        tput.push_back(row["system_tokens_per_s"].get<double>());
        if (has_one) vs1.push_back(row["vs_one_agent"].get<double>());
      }
      nlohmann::json entry = {{"agents", n}, {"system_tokens_per_s_median", Median(tput)}};
      if (has_one) {
        const auto [lo, hi] = std::minmax_element(vs1.begin(), vs1.end());
        entry["vs_one_agent_median"] = Median(vs1);
        entry["vs_one_agent_min"] = *lo;
        entry["vs_one_agent_max"] = *hi;
        if (!args.has("--json"))
          std::printf("%7lld %12.2f %8.2f %8.2f..%-8.2f\n", static_cast<long long>(n), Median(tput), Median(vs1), *lo, *hi);
      } else if (!args.has("--json")) {
        std::printf("%7lld %12.2f %8s %18s\n", static_cast<long long>(n), Median(tput), "-", "-");
      }
      // Staggered arrivals: each criterion's median over the repetitions (one run's margins are
      // smaller than the bandwidth noise between the together and serial runs).
      std::vector<double> ttft_margin, decode_ratio, first_delay;
      for (const auto& row : rows) {
        if (row["agents"].get<int64_t>() != n || !row.contains("stagger")) continue;
        const nlohmann::json& st = row["stagger"];
        ttft_margin.push_back(st["second_ttft_if_served_after_first_ms"].get<double>() - st["second_ttft_ms"].get<double>());
        first_delay.push_back(st["first_ttft_ms"].get<double>() - st["first_ttft_alone_ms"].get<double>());
        if (!st["first_decode_tokens_per_s_while_second_prefills"].is_null()) {
          decode_ratio.push_back(st["first_decode_tokens_per_s_while_second_prefills"].get<double>() /
                                 st["first_decode_tokens_per_s_alone"].get<double>());
        }
      }
      if (!ttft_margin.empty()) {
        entry["stagger_ttft_margin_ms_median"] = Median(ttft_margin);
        entry["stagger_first_ttft_delay_ms_median"] = Median(first_delay);
        if (!decode_ratio.empty()) entry["stagger_first_decode_ratio_median"] = Median(decode_ratio);
        if (!args.has("--json")) {
          const std::string ratio =
              decode_ratio.empty() ? std::string("(no overlap)") : fmt::format("{:.2f}x its rate alone", Median(decode_ratio));
          const double margin = Median(ttft_margin);  // > 0: the second agent's TTFT is the lower
          std::printf("        staggered arrivals, medians: second agent's TTFT %.1f ms %s being served after the "
                      "first; first agent's decode while the second prefills %s; first agent's TTFT %.1f ms "
                      "%s its TTFT alone\n",
                      std::fabs(margin), margin > 0 ? "below" : "above", ratio.c_str(), std::fabs(Median(first_delay)),
                      Median(first_delay) > 0 ? "above" : "below");
        }
      }
      summary.push_back(entry);
    }
  }
  if (args.has("--json")) {
    std::printf("%s\n", nlohmann::json{{"model", o.model_path}, {"kv", kv}, {"ctx", ctx}, {"cold", cold}, {"new_tokens", n_gen},
                                       {"stagger_ms", stagger}, {"threads", threads}, {"repeat", repeats}, {"results", rows},
                                       {"summary", summary}}
                            .dump(2)
                            .c_str());
  }
  return 0;
}

}  // namespace kvfs::cli
