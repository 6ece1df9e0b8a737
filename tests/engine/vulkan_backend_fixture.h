// The fixtures of the backend tests on tiny-llama Q4_0: TinyLlamaTest (the model, a prompt, KV
// layouts, one step through a backend; batch_invariance_test.cpp) and VulkanBackendTest (that on
// the default Vulkan device; vulkan_backend_test.cpp, vulkan_write_back_test.cpp and others).
// Skip without the model or a device (fail under CI=true).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/backend.h"
#include "engine/kv/kv_format.h"
#include "engine/kv/sequence_kv.h"
#include "engine/model/model.h"
#include "tests/test_support.h"

namespace kvfs::testing {

inline double Nmse(const float* got, const float* want, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? num / den : num;
}

// tiny-llama Q4_0, a 42-token prompt, KV layouts and one step through any backend.
class TinyLlamaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf";
    KVFS_REQUIRE_DATA(path);
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status().message();
    model_ = std::move(*model);
    prompt_ = model_->tokenizer().Encode(
        "The quick brown fox jumps over the lazy dog, twice, and then it sleeps under the old oak tree "
        "until the farmer comes home with a basket of apples for the children.",
        true, false);
  }
  const HParams& hp() const { return model_->hparams(); }
  KvLayout Layout(const char* type, int64_t block_tokens = 16) const {
    return KvLayoutFor(hp(), *MakeKvFormat(type, "", hp().n_head_kv, hp().head_dim), block_tokens);
  }
  // Runs tokens through `backend` on kv; returns the last row's logits.
  static std::vector<float> Step(Backend& backend, SequenceKv& kv, std::span<const TokenId> tokens) {
    Logits lg;
    SequenceStep s{&kv, tokens, false};
    const Status st = backend.Forward(std::span<const SequenceStep>(&s, 1), lg);
    EXPECT_TRUE(st.ok()) << st.message();
    return lg.data;
  }

  std::unique_ptr<Model> model_;
  std::vector<TokenId> prompt_;
};

// The same with a Vulkan backend on the default device.
class VulkanBackendTest : public TinyLlamaTest {
 protected:
  void SetUp() override {
    TinyLlamaTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    // Decode attention split as on a CPU device (128 positions a workgroup, more than these
    // tests' contexts) on every device: a GPU's default splits them finer, and a split adds its
    // partial sums in another order than the CPU's (VulkanAttentionTest checks splits), which
    // the tests' bit-for-bit comparisons with the CPU backend would see.
    VulkanOptions options;
    options.tuning.attention_split = VulkanTuning::kDefaultAttentionSplit;
    auto backend = MakeVulkanBackend(*model_, options);
    KVFS_REQUIRE_VULKAN(backend.status());
    vulkan_ = std::move(*backend);
  }

  std::unique_ptr<Backend> vulkan_;
};

}  // namespace kvfs::testing
