// kvfs bench agents: many agents at once. For each agent count, every agent first gets a
// context of --ctx tokens (not timed, unless --cold), then all submit a new turn at once (or
// --stagger-ms apart) and generate -n tokens; reported: system throughput (all generated tokens
// / wall time), per-agent decode rate and TTFT (median, max), and the same workload run one agent
// after another for comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

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
    "                          [--cold] [-t THREADS] [--json]\n"
    "  each agent holds a --ctx-token context (cached first; with --cold it is the new turn's prompt),\n"
    "  then all agents run a turn generating -n tokens, together and then one after another.\n";

int Fail(const std::string& m) {
  std::fprintf(stderr, "kvfs bench agents: %s\n", m.c_str());
  return 2;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct RunResult {
  double wall_s = 0;
  int64_t generated = 0;
  std::vector<double> ttft_ms, decode_tps;
};

// Runs one turn per agent; together (all submitted, stagger_ms apart) or one after another.
Result<RunResult> RunTurns(AgentEngine& e, const std::vector<std::string>& agents, const std::vector<std::string>& texts,
                           bool together, int64_t stagger_ms) {
  RunResult r;
  std::vector<Result<TurnStats>> stats(agents.size(), Status(StatusCode::kInternal, "not run"));
  const auto t0 = Clock::now();
  if (together) {
    std::vector<std::promise<void>> done(agents.size());
    for (size_t i = 0; i < agents.size(); ++i) {
      if (i > 0 && stagger_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stagger_ms));
      TurnRequest req;
      req.agent = agents[i];
      req.text = texts[i];
      req.on_done = [&stats, &done, i](const Result<TurnStats>& s) {
        stats[i] = s;
        done[i].set_value();
      };
      KVFS_RETURN_IF_ERROR(e.SubmitTurn(std::move(req)));
    }
    for (auto& d : done) d.get_future().wait();
  } else {
    for (size_t i = 0; i < agents.size(); ++i) stats[i] = RunTurnSync(e, agents[i], texts[i]);
  }
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& s : stats) {
    if (!s.ok()) return s.status();
    r.generated += s->generated_tokens;
    r.ttft_ms.push_back(s->ttft_ms);
    r.decode_tps.push_back(s->decode_tokens_per_s);
  }
  return r;
}

}  // namespace

int BenchAgents(int argc, char** argv) {
  Args args(argc, argv, {"-m", "--agents", "--ctx", "-n", "--kv", "--stagger-ms", "-t"}, {"--json", "--cold", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.error().empty()) return Fail(args.error());
  if (!args.has("-m")) return Fail("-m MODEL is required");
  auto counts_list = ParseIntList(args.get("--agents").value_or("1,2,4,8"), "--agents", 1, 256);
  if (!counts_list.ok()) return Fail(counts_list.status().message());
  const std::vector<int64_t> counts = *counts_list;
  const int64_t ctx = args.get_int("--ctx", 1024, 1, 131072);
  const int64_t n_gen = args.get_int("-n", 64, 1, 65536);
  const int64_t stagger = args.get_int("--stagger-ms", 0, 0, 600000);
  const int threads = static_cast<int>(args.get_int("-t", 2, 1, 256));
  if (!args.error().empty()) return Fail(args.error());
  const bool cold = args.has("--cold");
  const std::string kv = args.get("--kv").value_or("q4");
  spdlog::set_level(spdlog::level::warn);

  auto model = Model::Load(*args.get("-m"));
  if (!model.ok()) return Fail(model.status().message());
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
  const int64_t n_turn = 16;  // tokens of the timed turn's new text when the context is cached

  nlohmann::json rows = nlohmann::json::array();
  double one_agent_throughput = 0;
  if (!args.has("--json")) {
    std::printf("model %s, kv %s, %d threads, ctx %lld%s, %lld new tokens per agent, stagger %lld ms\n",
                o.model_path.c_str(), kv.c_str(), threads, static_cast<long long>(ctx), cold ? " (cold)" : " (cached)",
                static_cast<long long>(n_gen), static_cast<long long>(stagger));
    std::printf("%7s %12s %8s %14s %14s %13s %13s %12s %10s\n", "agents", "system_t/s", "vs_1", "agent_t/s_med",
                "ttft_med_ms", "ttft_max_ms", "serial_t/s", "serial_ttft", "vs_serial");
  }
  for (int64_t n : counts) {
    auto engine = CreateEngine(o);
    if (!engine.ok()) return Fail(engine.status().message());
    RunResult together, serial;
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<std::string> agents, texts;
      for (int64_t i = 0; i < n; ++i) {
        const std::string name = fmt::format("p{}a{}", pass, i);
        if (!(*engine)->CreateAgent(name, 0).ok() || !(*engine)->SetSettings(name, settings).ok()) return Fail("agent setup failed");
        agents.push_back(name);
        const std::string context = TextOfTokens(tok, ctx, static_cast<int>(pass * 1000 + i));
        if (cold) {
          texts.push_back(context);
        } else {
          AgentSettings quick = settings;
          quick.max_tokens = 1;
          (void)(*engine)->SetSettings(name, quick);
          auto setup = RunTurnSync(**engine, name, context);
          if (!setup.ok()) return Fail(setup.status().message());
          (void)(*engine)->SetSettings(name, settings);
          texts.push_back(TextOfTokens(tok, n_turn, static_cast<int>(pass * 1000 + i + 500)));
        }
      }
      auto r = RunTurns(**engine, agents, texts, pass == 0, stagger);
      if (!r.ok()) return Fail(r.status().message());
      (pass == 0 ? together : serial) = *r;
    }
    const double tput = together.generated / together.wall_s, serial_tput = serial.generated / serial.wall_s;
    if (n == counts.front() && n == 1) one_agent_throughput = tput;
    const double vs1 = one_agent_throughput > 0 ? tput / one_agent_throughput : 0;
    const double ttft_max = *std::max_element(together.ttft_ms.begin(), together.ttft_ms.end());
    nlohmann::json row = {{"agents", n},
                          {"system_tokens_per_s", tput},
                          {"vs_one_agent", vs1},
                          {"agent_tokens_per_s_median", Median(together.decode_tps)},
                          {"ttft_ms_median", Median(together.ttft_ms)},
                          {"ttft_ms_max", ttft_max},
                          {"ttft_ms", together.ttft_ms},
                          {"serial_tokens_per_s", serial_tput},
                          {"serial_ttft_ms", serial.ttft_ms},
                          {"speedup_vs_serial", tput / serial_tput},
                          {"wall_s", together.wall_s},
                          {"serial_wall_s", serial.wall_s}};
    rows.push_back(row);
    if (!args.has("--json")) {
      std::printf("%7lld %12.2f %8.2f %14.2f %14.1f %13.1f %13.2f %12.1f %10.2f\n", static_cast<long long>(n), tput, vs1,
                  Median(together.decode_tps), Median(together.ttft_ms), ttft_max, serial_tput, Median(serial.ttft_ms),
                  tput / serial_tput);
      std::fflush(stdout);
    }
  }
  if (args.has("--json")) {
    std::printf("%s\n", nlohmann::json{{"model", o.model_path}, {"kv", kv}, {"ctx", ctx}, {"cold", cold}, {"new_tokens", n_gen},
                                       {"stagger_ms", stagger}, {"threads", threads}, {"results", rows}}
                            .dump(2)
                            .c_str());
  }
  return 0;
}

}  // namespace kvfs::cli
