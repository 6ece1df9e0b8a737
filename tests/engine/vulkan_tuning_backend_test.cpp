// Vulkan tuning on a live backend (Backend::SetVulkanTuning, which kvfs tune switches between
// measurements) and through a tuning file (BackendRequest::tuning_file): a setting changed on a
// running backend computes exactly what a backend made with it computes, a setting the device
// refuses changes nothing, and a file applies only to the device and model it was made for.
// Runs on lavapipe in CI; skips without a Vulkan device.
#include <cstring>
#include <map>

#include "engine/backend/backend.h"
#include "engine/backend/vulkan_tuning.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

class VulkanTuningBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf";
    KVFS_REQUIRE_DATA(path);
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status().message();
    model_ = std::move(*model);
    auto backend = MakeVulkanBackend(*model_, Profiled(VulkanTuning{}));
    KVFS_REQUIRE_VULKAN(backend.status());
    live_ = std::move(*backend);
    // Long enough (over 64 positions) that decode attention's splits differ between settings.
    prompt_ = model_->tokenizer().Encode(
        "Once upon a time, in a house by the sea, there lived a cat who liked boats. Every morning the cat "
        "walked down to the harbour, sat on the warm stones and watched the fishermen mend their nets, "
        "count their catch and argue about the weather, the price of bread and the names of the gulls.",
        true, false);
  }
  // The logits of the prompt (every row) and of four decode steps after it, on a fresh cache.
  std::vector<float> Run(Backend& backend) {
    const HParams& hp = model_->hparams();
    SequenceKv kv(KvLayoutFor(hp, *MakeKvFormat("q4k", "", hp.n_head_kv, hp.head_dim), 64), 256);
    std::vector<float> all;
    Logits lg;
    SequenceStep s{&kv, prompt_, true};
    EXPECT_TRUE(backend.Forward(std::span<const SequenceStep>(&s, 1), lg).ok());
    all = lg.data;
    for (TokenId tok : {11, 400, 7, 31999}) {
      SequenceStep one{&kv, std::span<const TokenId>(&tok, 1), false};
      const Status st = backend.Forward(std::span<const SequenceStep>(&one, 1), lg);
      EXPECT_TRUE(st.ok()) << st.message();
      all.insert(all.end(), lg.data.begin(), lg.data.end());
    }
    return all;
  }
  // Profiling (timestamps only) shows what was recorded: dispatches per shader and grid width.
  static VulkanOptions Profiled(const VulkanTuning& tuning) {
    VulkanOptions options;
    options.profile = true;
    options.tuning = tuning;
    return options;
  }
  static bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Backend> live_;
  std::vector<TokenId> prompt_;
};

TEST_F(VulkanTuningBackendTest, ALiveChangeComputesWhatConstructionWithItComputes) {
  const std::vector<float> by_default = Run(*live_);
  const std::map<std::string, int> default_dispatches = testing::ProfileDispatches(live_->TakeProfileReport());
  ASSERT_FALSE(default_dispatches.empty());
  VulkanTuning narrow;  // short rows per slot, long splits, nothing fused in decode
  narrow.matvec = {.group = 32, .lanes = 16, .min_groups = 0, .rows = 16};
  narrow.attention_split = 256;
  narrow.swiglu_in_matvec = false;
  narrow.fuse_softmax = false;
  VulkanTuning wide;  // wide workgroups, few rows, short splits, shared-memory trees
  wide.matvec = {.group = 128, .lanes = 0, .min_groups = 256, .rows = 2};
  wide.attention_split = 32;
  wide.subgroup_trees = false;
  for (const VulkanTuning& t : {narrow, wide}) {
    ASSERT_TRUE(live_->SetVulkanTuning(t).ok());
    const std::vector<float> live = Run(*live_);
    const std::map<std::string, int> live_dispatches = testing::ProfileDispatches(live_->TakeProfileReport());
    auto made = MakeVulkanBackend(*model_, Profiled(t));
    ASSERT_TRUE(made.ok()) << made.status().message();
    // The same values (every setting computes them; the tiny model's rows are too short for
    // the matrix-vector shape to reorder a sum, and the splits add in the same order)...
    EXPECT_TRUE(BitwiseEqual(live, Run(**made))) << "matvec group " << t.matvec.group;
    EXPECT_TRUE(BitwiseEqual(live, by_default)) << "matvec group " << t.matvec.group;
    // ...recorded as the setting says: its shaders, grid widths and dispatch counts.
    EXPECT_EQ(live_dispatches, testing::ProfileDispatches((*made)->TakeProfileReport()))
        << "matvec group " << t.matvec.group;
    EXPECT_NE(live_dispatches, default_dispatches) << "matvec group " << t.matvec.group;
  }
  // Without the fusions, each decode step's layers (2) run softmax and quantize_act (for the
  // down matrix) as dispatches of their own; the prompt's pass runs them either way.
  ASSERT_TRUE(live_->SetVulkanTuning(narrow).ok());
  Run(*live_);
  std::map<std::string, int> narrow_dispatches = testing::ProfileDispatches(live_->TakeProfileReport());
  std::map<std::string, int> fused = default_dispatches;
  EXPECT_EQ(narrow_dispatches["softmax"], fused["softmax"] + 4 * 2);
  EXPECT_EQ(narrow_dispatches["quantize_act_sg"], fused["quantize_act_sg"] + 4 * 2);
  // And back to the defaults.
  ASSERT_TRUE(live_->SetVulkanTuning(VulkanTuning{}).ok());
  EXPECT_TRUE(BitwiseEqual(by_default, Run(*live_)));
  EXPECT_EQ(testing::ProfileDispatches(live_->TakeProfileReport()), default_dispatches);
}

// The norms made inside the q|k|v, gate|up and output matrices (norm_group): the values of the
// norm's own dispatch, bit for bit, in workgroups of each size tried; and per decode step, the
// fused norm dispatches of both norms of each layer (2) and the final norm's are gone.
TEST_F(VulkanTuningBackendTest, NormsInsideTheMatricesComputeTheSeparateNormsValues) {
  const std::vector<float> by_default = Run(*live_);
  std::map<std::string, int> separate = testing::ProfileDispatches(live_->TakeProfileReport());
  const int64_t n_layer = model_->hparams().n_layer;
  for (const int64_t norm_group : {64, 256}) {
    VulkanTuning t;
    t.matvec.norm_group = norm_group;
    ASSERT_TRUE(live_->SetVulkanTuning(t).ok());
    EXPECT_TRUE(BitwiseEqual(by_default, Run(*live_))) << "norm group " << norm_group;
    std::map<std::string, int> fused = testing::ProfileDispatches(live_->TakeProfileReport());
    EXPECT_EQ(fused["quantize_act_sg"], separate["quantize_act_sg"] - 4 * (2 * n_layer + 1))
        << "norm group " << norm_group;
    auto made = MakeVulkanBackend(*model_, Profiled(t));
    ASSERT_TRUE(made.ok()) << made.status().message();
    EXPECT_TRUE(BitwiseEqual(by_default, Run(**made))) << "norm group " << norm_group;
  }
  VulkanTuning odd;
  odd.matvec.norm_group = 32;  // below a slot's 64 lanes (lavapipe's default)
  EXPECT_EQ(live_->SetVulkanTuning(odd).code(), StatusCode::kInvalidArgument);
}

TEST_F(VulkanTuningBackendTest, ARefusedSettingChangesNothing) {
  const std::vector<float> by_default = Run(*live_);
  VulkanTuning too_big;  // 64 rows per slot of 1024 invocations: far beyond any shared memory
  too_big.matvec = {.group = 1024, .lanes = 0, .min_groups = 0, .rows = 64};
  too_big.attention_split = 512;
  too_big.swiglu_in_matvec = false;
  const std::map<std::string, int> default_dispatches = testing::ProfileDispatches(live_->TakeProfileReport());
  Status st = live_->SetVulkanTuning(too_big);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  VulkanTuning odd;
  odd.matvec.group = 96;  // not a power of two
  odd.fuse_softmax = false;
  EXPECT_EQ(live_->SetVulkanTuning(odd).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(BitwiseEqual(by_default, Run(*live_)));
  EXPECT_EQ(testing::ProfileDispatches(live_->TakeProfileReport()), default_dispatches);

  auto cpu = MakeCpuBackend(*model_, CpuOptions{});
  EXPECT_EQ(cpu->SetVulkanTuning(VulkanTuning{}).code(), StatusCode::kUnsupported);
}

TEST_F(VulkanTuningBackendTest, ATuningFileAppliesToItsDeviceAndModelOnly) {
  auto devices = ListVulkanDevices();
  ASSERT_TRUE(devices.ok());
  const VulkanDeviceInfo* device = ChosenVulkanDevice(*devices, -1);
  ASSERT_NE(device, nullptr);
  const std::string device_name = device->name;
  TuningRecord record;
  record.device = device_name;
  record.model = TuningModelKey(*model_);
  record.kv = "q4k";
  record.tuning.matvec = {.group = 32, .lanes = 16, .min_groups = 0, .rows = 16};
  const testing::TempDir dir;
  const std::string path = dir / "tuning.json";
  ASSERT_TRUE(WriteTuningFile(path, record).ok());

  BackendRequest request;
  request.vulkan = true;
  request.tuning_file = path;
  auto chosen = MakeRequestedBackend(*model_, request);
  ASSERT_TRUE(chosen.ok()) << chosen.status().message();
  EXPECT_TRUE(chosen->tuned);
  EXPECT_EQ(chosen->warning, "");
  request.profile = true;
  auto profiled = MakeRequestedBackend(*model_, request);
  ASSERT_TRUE(profiled.ok()) << profiled.status().message();
  auto made = MakeVulkanBackend(*model_, Profiled(record.tuning));
  ASSERT_TRUE(made.ok());
  Run(*profiled->backend);
  Run(**made);
  EXPECT_EQ(testing::ProfileDispatches(profiled->backend->TakeProfileReport()),
            testing::ProfileDispatches((*made)->TakeProfileReport()));

  record.device = "Some Other GPU";
  ASSERT_TRUE(WriteTuningFile(path, record).ok());
  auto other = MakeRequestedBackend(*model_, request);
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_FALSE(other->tuned);
  EXPECT_NE(other->warning.find("measured on \"Some Other GPU\""), std::string::npos) << other->warning;
  live_->TakeProfileReport();  // drops what earlier runs recorded
  Run(*other->backend);
  Run(*live_);
  EXPECT_EQ(testing::ProfileDispatches(other->backend->TakeProfileReport()),
            testing::ProfileDispatches(live_->TakeProfileReport()));  // the defaults

  request.tuning_file = path + ".absent";
  EXPECT_EQ(MakeRequestedBackend(*model_, request).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvfs
