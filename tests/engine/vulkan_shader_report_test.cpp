// kvfs shaders' report (engine/backend/vulkan_shaders.h) plans the matrix products a pass
// records: its pipelines and grids must be those of a real prompt pass and decode step (the
// profile's "shader [groups]" dispatch counts, and its pipelines' specialization constants),
// for stacked and unstacked layers and under a tuning with another matrix-vector shape. Runs on
// lavapipe in CI; skips without a device.
#include <map>
#include <memory>
#include <set>

#include "engine/backend/backend.h"
#include "engine/backend/vulkan_shaders.h"
#include "engine/kv/sequence_kv.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

// Specialization constants as the profile prints them: "256,0,2".
std::string Joined(const std::vector<uint32_t>& constants) {
  std::string out;
  for (const uint32_t c : constants) {
    if (!out.empty()) out += ',';
    out += std::to_string(c);
  }
  return out;
}

// Dispatch counts the report's lines predict for one pass: each matrix's dispatch per layer,
// under the profile's label (matrix shaders by grid width). `tokens` picks the lines (a
// prompt's output line is its last row's, as the pass multiplies it).
std::map<std::string, int> Predicted(const ShaderReport& report, int64_t tokens) {
  std::map<std::string, int> out;
  for (const MatrixShader& s : report.shaders) {
    if (s.tokens != tokens) continue;
    const int64_t groups = (s.n_out + s.rows_per_group - 1) / s.rows_per_group;
    out[s.shader + " [" + std::to_string(groups) + "]"] += static_cast<int>(s.layers);
  }
  return out;
}

std::map<std::string, int> MatrixDispatches(const std::string& profile) {
  std::map<std::string, int> out;
  for (const auto& [label, n] : testing::ProfileDispatches(profile)) {
    if (label.rfind("mat", 0) == 0) out[label] = n;
  }
  return out;
}

// The same per pipeline: the report's shader and specialization constants.
std::map<std::string, int> PredictedPipelines(const ShaderReport& report, int64_t tokens) {
  std::map<std::string, int> out;
  for (const MatrixShader& s : report.shaders) {
    if (s.tokens != tokens) continue;
    out[s.shader + " [" + Joined(s.constants) + "]"] += static_cast<int>(s.layers);
  }
  return out;
}

// The profile's matrix pipelines; and its per-pipeline lines must add up, shader by shader, to
// its per-shader lines (every dispatch is in both).
std::map<std::string, int> MatrixPipelines(const std::string& profile) {
  std::map<std::string, int> by_shader, pipelines_by_shader, out;
  for (const auto& [label, n] : testing::ProfileDispatches(profile)) by_shader[label.substr(0, label.find(' '))] += n;
  for (const auto& [label, n] : testing::ProfilePipelineDispatches(profile)) {
    pipelines_by_shader[label.substr(0, label.find(' '))] += n;
    if (label.rfind("mat", 0) == 0) out[label] = n;
  }
  EXPECT_EQ(pipelines_by_shader, by_shader) << profile;
  EXPECT_GT(by_shader.size(), 4u);  // attention, norms and the rest besides the matrices
  return out;
}

// The profile's norm pipelines: rms_norm, and quantize_act with the norm as its source (its
// third constant 2; a pass also quantizes plain rows for a matrix of another kind, and SwiGLU
// where the gate|up matrix does not).
std::set<std::string> NormPipelines(const std::string& profile) {
  std::set<std::string> out;
  for (const auto& [label, n] : testing::ProfilePipelineDispatches(profile)) {
    const bool norm_source = label.size() > 3 && label.compare(label.size() - 3, 3, ",2]") == 0;
    if ((label.rfind("quantize_act", 0) == 0 && norm_source) || label.rfind("rms_norm", 0) == 0) out.insert(label);
  }
  return out;
}

std::set<std::string> PlannedNorms(const ShaderReport& report) {
  std::set<std::string> out;
  for (const NormShader& s : report.norms) out.insert(s.shader + " [" + Joined(s.constants) + "]");
  return out;
}

void CheckPlan(const std::string& model_file, const VulkanTuning& tuning) {
  SCOPED_TRACE(model_file);
  const std::string path = testing::TestModelsDir() + "/" + model_file;
  KVFS_REQUIRE_DATA(path);
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  VulkanOptions options;
  options.profile = true;
  options.tuning = tuning;
  auto backend = MakeVulkanBackend(**model, options);
  KVFS_REQUIRE_VULKAN(backend.status());
  ASSERT_TRUE(backend.ok()) << backend.status().message();

  constexpr int64_t kPrompt = 16;
  auto report = VulkanShaderReport(**model, {.tokens = {1, kPrompt}, .tuning = tuning});
  ASSERT_TRUE(report.ok()) << report.status().message();
  // Every layer's matrices are counted once per kind (and type and shape).
  std::map<std::string, int64_t> layers;
  for (const MatrixShader& s : report->shaders) {
    if (s.tokens == 1) layers[s.matrices] += s.layers;
    if (!report->statistics) {
      EXPECT_TRUE(s.statistics.empty());
    }
  }
  const int64_t n_layer = (*model)->hparams().n_layer;
  EXPECT_EQ(layers["o"], n_layer);
  EXPECT_EQ(layers["down"], n_layer);
  EXPECT_EQ(layers["q|k|v"] + layers["q"], n_layer);
  EXPECT_EQ(layers["q|k|v"] + layers["v"], n_layer);
  EXPECT_EQ(layers["gate|up"] + layers["gate"], n_layer);
  EXPECT_EQ(layers["output"], 1);

  const HParams& hp = (*model)->hparams();
  SequenceKv kv(KvLayoutFor(hp, *MakeKvFormat("f16", "", hp.n_head_kv, hp.head_dim), 64), 64);
  std::vector<TokenId> prompt;
  for (int64_t i = 0; i < kPrompt; ++i) prompt.push_back(static_cast<TokenId>(100 + 7 * i));
  Logits logits;
  SequenceStep step{&kv, prompt, false};
  ASSERT_TRUE((*backend)->Forward(std::span<const SequenceStep>(&step, 1), logits).ok());
  const std::string prompt_profile = (*backend)->TakeProfileReport();
  EXPECT_EQ(MatrixDispatches(prompt_profile), Predicted(*report, kPrompt));
  EXPECT_EQ(MatrixPipelines(prompt_profile), PredictedPipelines(*report, kPrompt));
  const TokenId next = 42;
  SequenceStep decode{&kv, std::span<const TokenId>(&next, 1), false};
  ASSERT_TRUE((*backend)->Forward(std::span<const SequenceStep>(&decode, 1), logits).ok());
  const std::string decode_profile = (*backend)->TakeProfileReport();
  EXPECT_EQ(MatrixDispatches(decode_profile), Predicted(*report, 1));
  EXPECT_EQ(MatrixPipelines(decode_profile), PredictedPipelines(*report, 1));
  // A decode step's norms are the report's (the attention, feed-forward and output norms), but
  // for those its matrices make (all, in these Q4_0 models, with a norm group).
  EXPECT_EQ(report->norms.size(), tuning.matvec.norm_group != 0 ? 0u : 3u);
  int64_t norm_lines = 0;
  for (const MatrixShader& s : report->shaders) norm_lines += s.norm;
  EXPECT_EQ(norm_lines > 0, tuning.matvec.norm_group != 0);
  EXPECT_EQ(NormPipelines(decode_profile), PlannedNorms(*report));

  // A decode step of 12 agents (--short-steps): their rows on the matrix-vector shader's wide
  // groups, the output's too.
  constexpr int64_t kAgents = 12;
  auto busy = VulkanShaderReport(**model, {.tokens = {kAgents}, .tuning = tuning, .kv = {}, .short_steps = true});
  ASSERT_TRUE(busy.ok()) << busy.status().message();
  std::vector<std::unique_ptr<SequenceKv>> kvs;
  std::vector<SequenceStep> steps;
  for (int64_t i = 0; i < kAgents; ++i) {
    kvs.push_back(std::make_unique<SequenceKv>(kv.layout(), 64));
    steps.push_back({kvs.back().get(), std::span<const TokenId>(&next, 1), false});
  }
  ASSERT_TRUE((*backend)->Forward(steps, logits).ok());
  const std::string busy_profile = (*backend)->TakeProfileReport();
  EXPECT_EQ(MatrixDispatches(busy_profile), Predicted(*busy, kAgents));
  EXPECT_EQ(MatrixPipelines(busy_profile), PredictedPipelines(*busy, kAgents));
  for (const MatrixShader& s : busy->shaders) {
    EXPECT_TRUE(s.short_steps && s.shader.rfind("matvec", 0) == 0) << s.matrices << " " << s.shader;
    // (wide groups where the slots' sums leave room: not at FollowsATuning's 16 rows a slot)
    if (tuning == VulkanTuning{}) EXPECT_GT(s.tokens_per_group, 4u) << s.matrices;
  }
}

TEST(VulkanShaderReport, PlansThePipelinesAPassRecords) {
  CheckPlan("tiny-llama-Q4_0.gguf", {});  // stacked q|k|v and gate|up, split rows
  CheckPlan("tiny-llama-Q4_K_M.gguf", {});  // some layers' q, k, v not stacked (Q6_K v)
  CheckPlan("tiny-qwen2-Q8_0.gguf", {});    // biases
}

TEST(VulkanShaderReport, FollowsATuning) {
  VulkanTuning tuning;
  tuning.matvec = {.group = 128, .lanes = 32, .min_groups = 4, .rows = 4};
  tuning.swiglu_in_matvec = false;
  CheckPlan("tiny-llama-Q4_0.gguf", tuning);
  // The norms inside the q|k|v, gate|up (with SwiGLU's codes) and output matrices.
  VulkanTuning norms;
  norms.matvec.norm_group = 128;
  CheckPlan("tiny-llama-Q4_0.gguf", norms);
}

// The report's attention lines are the pipelines a pass records for one sequence's attention
// step, alone (one sequence) and merged (two sequences of a KV layout in one pass): the
// profile's attention pipelines (kv_store, attn_scores, softmax, attn_output, attn_reduce) of a
// prompt pass and decode passes, for f16 and q4k.
TEST(VulkanShaderReport, PlansTheAttentionPipelinesAPassRecords) {
  const std::string path = testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf";
  KVFS_REQUIRE_DATA(path);
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  VulkanOptions options;
  options.profile = true;
  auto backend = MakeVulkanBackend(**model, options);
  KVFS_REQUIRE_VULKAN(backend.status());
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  const HParams& hp = (*model)->hparams();
  constexpr int64_t kPrompt = 16, kBlock = 64;
  auto is_attention = [](const std::string& label) {
    for (const char* s : {"kv_store ", "attn_scores ", "softmax ", "attn_output", "attn_reduce"}) {
      if (label.rfind(s, 0) == 0) return true;
    }
    return false;
  };
  // The pass's attention pipelines, from its profile.
  auto recorded = [&]() {
    std::set<std::string> out;
    for (const auto& [label, n] : testing::ProfilePipelineDispatches((*backend)->TakeProfileReport())) {
      if (is_attention(label)) out.insert(label);
    }
    return out;
  };
  // The report's lines for one step, alone or merged (kv_store has only its row table's).
  auto planned = [&](const char* kv, int64_t tokens, int64_t depth, bool merged) {
    std::set<std::string> out;
    auto report = VulkanShaderReport(**model, {.tokens = {tokens}, .tuning = {}, .kv = {kv}, .depth = depth, .block_tokens = kBlock});
    EXPECT_TRUE(report.ok()) << report.status().message();
    if (!report.ok()) return out;
    for (const AttentionShader& s : report->attention) {
      if (s.merged != merged && s.step != "kv_store" && s.step != "reduce") continue;
      out.insert(s.shader + " [" + Joined(s.constants) + "]");
    }
    return out;
  };
  for (const char* kv : {"f16", "q4k"}) {
    SCOPED_TRACE(kv);
    const KvLayout layout = KvLayoutFor(hp, *MakeKvFormat(kv, "", hp.n_head_kv, hp.head_dim), kBlock);
    SequenceKv a(layout, 256), b(layout, 256);
    std::vector<TokenId> prompt;
    for (int64_t i = 0; i < kPrompt; ++i) prompt.push_back(static_cast<TokenId>(100 + 7 * i));
    Logits logits;
    SequenceStep both[] = {{&a, prompt, false}, {&b, prompt, false}};
    ASSERT_TRUE((*backend)->Forward(both, logits).ok());
    EXPECT_EQ(recorded(), planned(kv, kPrompt, 0, true)) << "two prompts";
    const TokenId next = 42;
    for (SequenceStep& s : both) s.tokens = std::span<const TokenId>(&next, 1);
    ASSERT_TRUE((*backend)->Forward(both, logits).ok());
    EXPECT_EQ(recorded(), planned(kv, 1, kPrompt, true)) << "two decode steps";
    ASSERT_TRUE((*backend)->Forward(std::span<const SequenceStep>(both, 1), logits).ok());
    EXPECT_EQ(recorded(), planned(kv, 1, kPrompt + 1, false)) << "one decode step";
  }
}

}  // namespace
}  // namespace kvfs
