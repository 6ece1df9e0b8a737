// kvfs shaders' report (engine/backend/vulkan_shaders.h) plans the matrix products a pass
// records: its pipelines and grids must be those of a real prompt pass and decode step (the
// profile's "shader [groups]" dispatch counts, and its pipelines' specialization constants),
// for stacked and unstacked layers and under a tuning with another matrix-vector shape. Runs on
// lavapipe in CI; skips without a device.
#include <map>

#include "engine/backend/backend.h"
#include "engine/backend/vulkan_shaders.h"
#include "engine/kv/sequence_kv.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

// Dispatch counts the report's lines predict for one pass: each matrix's dispatch per layer,
// under the profile's label (matrix shaders by grid width). `tokens` picks the lines; the
// output matrix multiplies only the rows whose logits are wanted (output_tokens).
std::map<std::string, int> Predicted(const ShaderReport& report, int64_t tokens, int64_t output_tokens) {
  std::map<std::string, int> out;
  for (const MatrixShader& s : report.shaders) {
    if (s.tokens != (s.matrices == "output" ? output_tokens : tokens)) continue;
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
std::map<std::string, int> PredictedPipelines(const ShaderReport& report, int64_t tokens, int64_t output_tokens) {
  std::map<std::string, int> out;
  for (const MatrixShader& s : report.shaders) {
    if (s.tokens != (s.matrices == "output" ? output_tokens : tokens)) continue;
    std::string constants;
    for (const uint32_t c : s.constants) constants += (constants.empty() ? "" : ",") + std::to_string(c);
    out[s.shader + " [" + constants + "]"] += static_cast<int>(s.layers);
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
  EXPECT_EQ(MatrixDispatches(prompt_profile), Predicted(*report, kPrompt, 1));
  EXPECT_EQ(MatrixPipelines(prompt_profile), PredictedPipelines(*report, kPrompt, 1));
  const TokenId next = 42;
  SequenceStep decode{&kv, std::span<const TokenId>(&next, 1), false};
  ASSERT_TRUE((*backend)->Forward(std::span<const SequenceStep>(&decode, 1), logits).ok());
  const std::string decode_profile = (*backend)->TakeProfileReport();
  EXPECT_EQ(MatrixDispatches(decode_profile), Predicted(*report, 1, 1));
  EXPECT_EQ(MatrixPipelines(decode_profile), PredictedPipelines(*report, 1, 1));
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
}

}  // namespace
}  // namespace kvfs
