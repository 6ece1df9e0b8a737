// kvfs shaders: the matrix and attention shaders a model runs on a Vulkan device and what the
// device's compiler makes of them (engine/backend/vulkan_shaders.h). Compiles, runs nothing.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "engine/backend/vulkan_shaders.h"
#include "engine/backend/vulkan_tuning.h"
#include "engine/kv/kv_format.h"
#include "engine/model/model.h"
#include "tools/args.h"
#include "tools/bench_util.h"
#include "tools/commands.h"

namespace kvfs::cli {
namespace {

constexpr const char* kShadersUsage =
    "usage: kvfs shaders -m MODEL [--device N] [-t 1,512] [--kv f16,q4k] [-d 4096] [--block N]\n"
    "                    [--tuning FILE] [--stat NAME,...] [--short-steps] [--json]\n"
    "  For each distinct weight matrix of the model (type and shape, stacked as the Vulkan\n"
    "  backend stacks them), the pipeline that multiplies it by -t activation rows (1: decode,\n"
    "  512: a prompt) and the device compiler's statistics of that pipeline: registers,\n"
    "  spills, shared memory, occupancy, in the driver's words. Then, per KV format (--kv;\n"
    "  'none': skip), the pipelines of one sequence's attention step of -t tokens after -d cached\n"
    "  positions in blocks of --block (default 256): kv_store, the scores, softmax, the\n"
    "  weighted sums and their reduction where the pass has them; the scores, softmax and sums\n"
    "  both alone and merged with other sequences' calls (a batched step). Then the RMSNorms before\n"
    "  the first layer's attention and feed-forward and before the output matrix, fused with the\n"
    "  quantization of their outputs as a pass records them. Nothing runs, so Mesa's AMD driver\n"
    "  can report on a machine without a GPU:\n"
    "    RADV_FORCE_FAMILY=gfx1100 VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/radeon_icd.x86_64.json \\\n"
    "    RADV_DEBUG=nocache kvfs shaders -m MODEL\n"
    "  --stat: the statistics to print (default all); --tuning: plan with the settings kvfs\n"
    "  tune found; --short-steps: -t counts over 8 are the rows of as many short steps (a decode\n"
    "  step of that many agents, on the matrix-vector shaders), not one prompt's.\n";

int Fail(int code, const std::string& m) {
  std::fprintf(stderr, "kvfs shaders: %s\n", m.c_str());
  return code;
}

std::string Constants(const std::vector<uint32_t>& c) {
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(c[i]);
  }
  return out;
}

bool Wanted(const std::vector<std::string>& stats, const std::string& name) {
  return stats.empty() || std::ranges::find(stats, name) != stats.end();
}

// A pipeline's statistics that `wanted` names (all when empty), as JSON and as text.
nlohmann::json StatisticsJson(const std::vector<ShaderStatistic>& all, const std::vector<std::string>& wanted) {
  nlohmann::json out = nlohmann::json::object();
  for (const ShaderStatistic& st : all) {
    if (Wanted(wanted, st.name)) out[st.name] = st.value;
  }
  return out;
}
std::string StatisticsText(const std::vector<ShaderStatistic>& all, const std::vector<std::string>& wanted) {
  std::string out;
  for (const ShaderStatistic& st : all) {
    if (Wanted(wanted, st.name)) out += fmt::format("; {} {}", st.name, st.value);
  }
  return out;
}

}  // namespace

int Shaders(int argc, char** argv) {
  Args args(argc, argv, {"-m", "--device", "-t", "--kv", "-d", "--block", "--tuning", "--stat"},
            {"--json", "--short-steps", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs(kShadersUsage, stdout);
    return 0;
  }
  ShaderReportOptions options;
  options.device = static_cast<int>(args.get_int("--device", -1, 0, 1 << 16));
  if (auto t = args.get("-t")) {
    auto tokens = ParseIntList(*t, "-t", 1, 512);
    if (tokens.ok()) {
      options.tokens = *tokens;
    } else {
      args.set_error(tokens.status().message());
    }
  }
  if (auto kv = args.get("--kv")) options.kv = *kv == "none" ? std::vector<std::string>{} : SplitList(*kv);
  options.depth = args.get_int("-d", 4096, 0, 1 << 24);
  options.block_tokens = args.get_int("--block", 256, 1, 1 << 16);
  options.short_steps = args.has("--short-steps");
  const std::vector<std::string> stats =
      args.has("--stat") ? SplitList(*args.get("--stat")) : std::vector<std::string>{};
  if (!args.error().empty()) return Fail(2, args.error() + " (see kvfs shaders --help)");
  if (!args.has("-m")) return Fail(2, "missing -m MODEL");
  if (auto path = args.get("--tuning")) {
    auto record = ReadTuningFile(*path);
    if (!record.ok()) return Fail(2, record.status().message());
    options.tuning = record->tuning;
  }
  auto model_or = Model::Load(*args.get("-m"));
  if (!model_or.ok()) return Fail(2, model_or.status().message());
  for (const std::string& kv : options.kv) {  // a usage error, before any device work
    const HParams& hp = (*model_or)->hparams();
    if (auto f = MakeKvFormat(kv, "", hp.n_head_kv, hp.head_dim); !f.ok()) return Fail(2, f.status().message());
  }
  auto report_or = VulkanShaderReport(**model_or, options);
  if (!report_or.ok()) {  // a device index that does not exist is a usage error, as in every command
    const bool usage = report_or.status().code() == StatusCode::kInvalidArgument;
    return Fail(usage ? 2 : 1, report_or.status().message());
  }
  const ShaderReport& report = *report_or;
  // --stat names come from the driver, so they are checked against what it reported.
  if (!report.statistics && !stats.empty()) {
    std::fputs("kvfs shaders: warning: --stat: this driver reports no pipeline statistics\n", stderr);
  } else if (report.statistics) {
    std::set<std::string> reported;
    auto note = [&](const std::vector<ShaderStatistic>& all) {
      for (const ShaderStatistic& st : all) reported.insert(st.name);
    };
    for (const MatrixShader& sh : report.shaders) note(sh.statistics);
    for (const AttentionShader& sh : report.attention) note(sh.statistics);
    for (const NormShader& sh : report.norms) note(sh.statistics);
    for (const std::string& name : stats)
      if (!reported.count(name))
        std::fprintf(stderr, "kvfs shaders: warning: --stat %s: the driver reports no statistic of that name (it reports: %s)\n",
                     name.c_str(), fmt::format("{}", fmt::join(reported, ", ")).c_str());
  }

  if (args.has("--json")) {
    nlohmann::json lines = nlohmann::json::array();
    for (const MatrixShader& s : report.shaders) {
      lines.push_back({{"matrices", s.matrices},
                       {"type", s.type},
                       {"n_in", s.n_in},
                       {"n_out", s.n_out},
                       {"layers", s.layers},
                       {"tokens", s.tokens},
                       {"shader", s.shader},
                       {"constants", s.constants},
                       {"rows_per_group", s.rows_per_group},
                       {"tokens_per_group", s.tokens_per_group},
                       {"norm", s.norm},
                       {"short_steps", s.short_steps},
                       {"statistics", StatisticsJson(s.statistics, stats)}});
    }
    nlohmann::json attention = nlohmann::json::array();
    for (const AttentionShader& s : report.attention) {
      attention.push_back({{"kv", s.kv},
                           {"tokens", s.tokens},
                           {"depth", s.depth},
                           {"step", s.step},
                           {"merged", s.merged},
                           {"shader", s.shader},
                           {"constants", s.constants},
                           {"statistics", StatisticsJson(s.statistics, stats)}});
    }
    nlohmann::json norms = nlohmann::json::array();
    for (const NormShader& s : report.norms) {
      norms.push_back({{"norm", s.norm},
                       {"acts", s.acts},
                       {"shader", s.shader},
                       {"constants", s.constants},
                       {"statistics", StatisticsJson(s.statistics, stats)}});
    }
    const nlohmann::json out = {{"device", report.device.name},
                                {"api_version", report.device.api_version},
                                {"statistics", report.statistics},
                                {"shaders", lines},
                                {"attention", attention},
                                {"norms", norms}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("device %s (Vulkan %s)%s\n", report.device.name.c_str(), report.device.api_version.c_str(),
              report.statistics ? "" : ": reports no pipeline statistics");
  for (const MatrixShader& s : report.shaders) {
    std::string line = fmt::format("{:<8} {:<5} {:>6} -> {:<7} x{:<3} t{:<4} {} [{}] {}x{} per group{}", s.matrices,
                                   s.type, s.n_in, s.n_out, s.layers, s.tokens, s.shader, Constants(s.constants),
                                   s.rows_per_group, s.tokens_per_group,
                                   s.norm ? ", its norm inside" : (s.short_steps ? ", short steps' rows" : ""));
    std::printf("%s%s\n", line.c_str(), StatisticsText(s.statistics, stats).c_str());
  }
  for (const AttentionShader& s : report.attention) {
    std::string line = fmt::format("attn {:<5} t{:<4} d{:<6} {:<8} {:<6} {} [{}]", s.kv, s.tokens, s.depth, s.step,
                                   s.merged ? "merged" : "alone", s.shader, Constants(s.constants));
    std::printf("%s%s\n", line.c_str(), StatisticsText(s.statistics, stats).c_str());
  }
  for (const NormShader& s : report.norms) {
    std::string line = fmt::format("norm {:<12} {:<5} {} [{}]", s.norm, s.acts, s.shader, Constants(s.constants));
    std::printf("%s%s\n", line.c_str(), StatisticsText(s.statistics, stats).c_str());
  }
  return 0;
}

}  // namespace kvfs::cli
