// FallbackBackend's recovery policy over a scripted device (no Vulkan needed): a lost device is
// made again once the wait is over, in a pass or between passes (Maintain); the wait doubles
// after a failed try and after a loss soon after the last recovery, and resets after a long
// healthy run; a remade device gets the tuning set before, and is kept if it refuses it. Every
// pass advances its sequence exactly once, wherever it ran: the logits must equal, bit for bit,
// those of the CPU backend over the same tokens.
#include <optional>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/fallback_backend.h"
#include "tests/engine/scripted_device.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

using testing::ScriptedDevice;

class FallbackRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf";
    KVFS_REQUIRE_DATA(path);
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status().message();
    model_ = std::move(*model);
    reference_ = MakeCpuBackend(*model_, CpuOptions{1, &cpu::ScalarKernels()});
    layout_ = KvLayoutFor(model_->hparams(), *MakeKvFormat("q8", "", model_->hparams().n_head_kv,
                                                           model_->hparams().head_dim),
                          16);
    seq_ = std::make_unique<SequenceKv>(layout_, 256);
    ref_seq_ = std::make_unique<SequenceKv>(layout_, 256);
  }

  std::unique_ptr<FallbackBackend> Make() {
    DeviceRecovery recovery;
    recovery.now_ms = [this] { return now_ms_; };
    recovery.first_delay_ms = 1000;
    recovery.max_delay_ms = 8000;
    recovery.make = [this]() -> Result<std::unique_ptr<Backend>> {
      ++make_calls_;
      if (fail_makes_ > 0) {
        --fail_makes_;
        return Unavailable("no Vulkan device 0 (scripted)");
      }
      tunings_.emplace_back();
      return std::unique_ptr<Backend>(std::make_unique<ScriptedDevice>(*model_, Scalar(), &tunings_.back(), refuse_tuning_));
    };
    tunings_.reserve(16);  // ScriptedDevice keeps a pointer into it
    tunings_.emplace_back();
    return std::make_unique<FallbackBackend>(*model_, std::make_unique<ScriptedDevice>(*model_, Scalar(), &tunings_.back()),
                                             CpuOptions{1, &cpu::ScalarKernels()}, std::move(recovery));
  }
  static CpuOptions Scalar() { return CpuOptions{1, &cpu::ScalarKernels()}; }
  ScriptedDevice* Device(FallbackBackend& fb) { return static_cast<ScriptedDevice*>(fb.device()); }

  // One decode step of token t on the fallback and on the reference; their logits must match.
  void Step(FallbackBackend& fb, TokenId t) {
    const SequenceStep got_step{seq_.get(), std::span<const TokenId>(&t, 1), false};
    const SequenceStep want_step{ref_seq_.get(), std::span<const TokenId>(&t, 1), false};
    Logits got, want;
    const Status st = fb.Forward(std::span<const SequenceStep>(&got_step, 1), got);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(reference_->Forward(std::span<const SequenceStep>(&want_step, 1), want).ok());
    EXPECT_EQ(got.data, want.data) << "token " << t << " at " << now_ms_ << " ms";
    EXPECT_EQ(seq_->n_tokens(), ref_seq_->n_tokens());
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Backend> reference_;
  KvLayout layout_;
  std::unique_ptr<SequenceKv> seq_, ref_seq_;
  std::vector<std::vector<VulkanTuning>> tunings_;  // what each device made was told, in order
  int64_t now_ms_ = 0;
  int make_calls_ = 0;
  int fail_makes_ = 0;
  bool refuse_tuning_ = false;  // devices made from now on refuse SetVulkanTuning
};

TEST_F(FallbackRecoveryTest, ALostDeviceIsMadeAgainAfterAWaitThatDoubles) {
  auto fb = Make();
  VulkanTuning tuning;
  tuning.attention_split = 96;
  ASSERT_TRUE(fb->SetVulkanTuning(tuning).ok());
  Step(*fb, 1);
  EXPECT_EQ(Device(*fb)->passes.load(), 1);

  // Lost in a pass: that pass and the next ones run on the CPU until the first try, 1 s later.
  Device(*fb)->lost = true;
  Step(*fb, 2);
  EXPECT_EQ(fb->device(), nullptr);
  EXPECT_TRUE(fb->Health().device_lost);
  EXPECT_EQ(fb->Health().device_losses, 1);
  EXPECT_EQ(fb->SetVulkanTuning(tuning).code(), StatusCode::kUnsupported);  // no device to take it
  now_ms_ = 999;
  Step(*fb, 3);
  EXPECT_EQ(make_calls_, 0);

  // The first try fails: the next comes 2 s later.
  fail_makes_ = 1;
  now_ms_ = 1000;
  Step(*fb, 4);
  EXPECT_EQ(make_calls_, 1);
  EXPECT_EQ(fb->stats().remake_failures, 1);
  EXPECT_EQ(fb->device(), nullptr);
  now_ms_ = 2999;
  Step(*fb, 5);
  EXPECT_EQ(make_calls_, 1);
  EXPECT_EQ(fb->stats().cpu_passes, 4);

  // Made again: this pass runs on the new device, which was given the tuning set before.
  now_ms_ = 3000;
  Step(*fb, 6);
  EXPECT_EQ(make_calls_, 2);
  ASSERT_NE(fb->device(), nullptr);
  EXPECT_EQ(Device(*fb)->passes.load(), 1);
  EXPECT_FALSE(fb->Health().device_lost);
  EXPECT_EQ(fb->Health().device_losses, 1);
  EXPECT_EQ(fb->Health().cpu_fallback_steps, 4);
  EXPECT_EQ(fb->stats().device_remakes, 1);
  ASSERT_EQ(tunings_.size(), 2u);
  EXPECT_EQ(tunings_[1], std::vector<VulkanTuning>{tuning});
  EXPECT_STREQ(fb->name(), "scripted");

  // Lost again 1 s after it came back: the wait doubles from the last one (2 s) to 4 s.
  now_ms_ = 4000;
  Device(*fb)->lost = true;
  Step(*fb, 7);
  EXPECT_EQ(fb->Health().device_losses, 2);
  now_ms_ = 7999;
  Step(*fb, 8);
  EXPECT_EQ(make_calls_, 2);
  now_ms_ = 8000;
  Step(*fb, 9);
  EXPECT_EQ(make_calls_, 3);
  ASSERT_NE(fb->device(), nullptr);

  // After a healthy run longer than the longest wait, a loss waits 1 s again. The device made
  // then refuses the tuning: it is kept, with the tuning it was made with.
  refuse_tuning_ = true;
  now_ms_ = 8000 + 8000;
  Device(*fb)->lost = true;
  Step(*fb, 10);
  now_ms_ = 16999;
  Step(*fb, 11);
  EXPECT_EQ(make_calls_, 3);
  now_ms_ = 17000;
  Step(*fb, 12);
  EXPECT_EQ(make_calls_, 4);
  ASSERT_NE(fb->device(), nullptr);
  EXPECT_EQ(Device(*fb)->passes.load(), 1);
  EXPECT_TRUE(tunings_.back().empty());
  EXPECT_EQ(fb->stats().remake_failures, 1);
  EXPECT_EQ(fb->Health().device_remakes, 3);
  EXPECT_EQ(fb->stats().device_passes, 1 + 1 + 1 + 1);  // tokens 1, 6, 9, 12
  EXPECT_EQ(fb->stats().cpu_passes, 8);
  EXPECT_EQ(seq_->n_tokens(), 12);
}

// Failed tries double the wait up to its cap, and a device that never comes back costs one try
// per cap-long wait.
TEST_F(FallbackRecoveryTest, FailedTriesBackOffToTheLongestWait) {
  auto fb = Make();
  Device(*fb)->lost = true;
  fail_makes_ = 1000;
  Step(*fb, 1);  // lost at 0: tries at 1, 3, 7, 15 s, then every 8 s
  std::vector<int64_t> tries;
  for (now_ms_ = 0; now_ms_ <= 40000; now_ms_ += 500) {
    const int before = make_calls_;
    Step(*fb, 2);
    if (make_calls_ != before) tries.push_back(now_ms_);
  }
  EXPECT_EQ(tries, (std::vector<int64_t>{1000, 3000, 7000, 15000, 23000, 31000, 39000}));
  EXPECT_EQ(fb->device(), nullptr);
  EXPECT_TRUE(fb->Health().device_lost);
}

// Between passes: the upkeep is due exactly when the next try is, Maintain() makes the device
// again without a pass (and does nothing before its time), and a healthy device has none.
TEST_F(FallbackRecoveryTest, MaintenanceMakesTheDeviceAgainBetweenPasses) {
  auto fb = Make();
  EXPECT_EQ(fb->MaintenanceDueInMs(), std::nullopt);
  Step(*fb, 1);
  Device(*fb)->lost = true;
  now_ms_ = 100;
  Step(*fb, 2);  // lost at 100 ms: the first try is due at 1100 ms
  EXPECT_EQ(fb->MaintenanceDueInMs(), std::optional<int64_t>(1000));
  now_ms_ = 700;
  EXPECT_EQ(fb->MaintenanceDueInMs(), std::optional<int64_t>(400));
  fb->Maintain();  // early: nothing
  EXPECT_EQ(make_calls_, 0);

  fail_makes_ = 1;
  now_ms_ = 1100;
  EXPECT_EQ(fb->MaintenanceDueInMs(), std::optional<int64_t>(0));
  fb->Maintain();  // fails: the next try 2 s later
  EXPECT_EQ(make_calls_, 1);
  EXPECT_EQ(fb->Health().remake_failures, 1);
  EXPECT_EQ(fb->MaintenanceDueInMs(), std::optional<int64_t>(2000));
  now_ms_ = 5000;  // overdue
  EXPECT_EQ(fb->MaintenanceDueInMs(), std::optional<int64_t>(0));
  fb->Maintain();
  EXPECT_EQ(make_calls_, 2);
  ASSERT_NE(fb->device(), nullptr);
  EXPECT_EQ(Device(*fb)->passes.load(), 0);  // made without a pass
  EXPECT_FALSE(fb->Health().device_lost);
  EXPECT_EQ(fb->Health().device_remakes, 1);
  EXPECT_EQ(fb->MaintenanceDueInMs(), std::nullopt);
  fb->Maintain();  // nothing to do
  EXPECT_EQ(make_calls_, 2);
  Step(*fb, 3);
  EXPECT_EQ(Device(*fb)->passes.load(), 1);
  EXPECT_EQ(fb->stats().cpu_passes, 1);  // token 2 only
}

// A lost device is made again only as the same device: found by name, at its old index when two
// share the name, and not at all when it is gone (the default is then another device).
TEST(SameVulkanDevice, FindsTheLostDeviceByNameOrNothing) {
  const auto list = [](std::vector<std::string> names) {
    std::vector<VulkanDeviceInfo> devices;
    for (size_t i = 0; i < names.size(); ++i) {
      VulkanDeviceInfo d;
      d.index = static_cast<int>(i);
      d.name = names[i];
      devices.push_back(d);
    }
    return devices;
  };
  const auto gpu_then_cpu = list({"NVIDIA H100", "llvmpipe"});
  ASSERT_NE(SameVulkanDevice(gpu_then_cpu, 0, "NVIDIA H100"), nullptr);
  EXPECT_EQ(SameVulkanDevice(gpu_then_cpu, 0, "NVIDIA H100")->index, 0);
  EXPECT_EQ(SameVulkanDevice(list({"llvmpipe"}), 0, "NVIDIA H100"), nullptr);  // fell off the bus
  EXPECT_EQ(SameVulkanDevice(list({}), 0, "NVIDIA H100"), nullptr);
  EXPECT_EQ(SameVulkanDevice(list({"llvmpipe", "NVIDIA H100"}), 0, "NVIDIA H100")->index, 1);  // shifted
  const auto twins = list({"NVIDIA H100", "NVIDIA H100"});
  EXPECT_EQ(SameVulkanDevice(twins, 1, "NVIDIA H100")->index, 1);
  EXPECT_EQ(SameVulkanDevice(twins, 0, "NVIDIA H100")->index, 0);
  EXPECT_EQ(SameVulkanDevice(list({"AMD Radeon", "NVIDIA H100"}), 0, "NVIDIA H100")->index, 1);
}

}  // namespace
}  // namespace kvfs
