// Batch invariance (engine/backend/step_order.h): a sequence's logits are the same bits alone and
// beside any other sequences in a pass, however many, short or long, in whatever order, and
// across micro-batches, on the CPU backend and on the Vulkan one. Without it, on Vulkan, the
// rows of a pass of more than 8 tokens took the tiled matrix shaders, which add a row's products
// in another order than the matrix-vector ones: a decode token's logits then moved with the
// number of agents decoding beside it. The Vulkan cases run on lavapipe in CI and skip without
// a Vulkan device.
#include <cstring>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/step_order.h"
#include "engine/model/model.h"
#include "tests/engine/vulkan_backend_fixture.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

struct Sequence {
  const char* kv;
  std::vector<TokenId> prompt;
};

// What each sequence's logits are, one step after another: the prompt's last row, then one row
// per decode step (the tokens fed are fixed, not sampled, so every run feeds the same).
using Rows = std::vector<std::vector<float>>;

constexpr TokenId kDecodeTokens[3] = {42, 1000, 7};

class BatchInvarianceTest : public testing::TinyLlamaTest {
 protected:
  // A Vulkan backend as the tests of the Vulkan backend make it: decode attention split as on a
  // CPU device unless `options` says otherwise (vulkan_backend_fixture.h).
  Result<std::unique_ptr<Backend>> Vulkan(VulkanOptions options, const Model* model = nullptr) const {
    if (options.tuning.attention_split == 0) options.tuning.attention_split = VulkanTuning::kDefaultAttentionSplit;
    return MakeVulkanBackend(model != nullptr ? *model : *model_, options);
  }

  std::vector<Sequence> Sequences() const {
    EXPECT_GT(prompt_.size(), 16u);  // a long step, in more than one 16-token micro-batch
    std::vector<TokenId> longer = prompt_;
    while (longer.size() < 70) longer.insert(longer.end(), prompt_.begin() + 1, prompt_.end());
    return {
        {"q4k", prompt_},                       // a long prompt (tiled rows), then decode
        {"f16", {1, 450, 4996, 17354, 1701}},   // a short one (matrix-vector rows)
        {"q8", longer},                         // longer than a 16-token micro-batch
        {"q4", {1, 15043}},
    };
  }

  // Each sequence alone: its prompt, then the decode tokens, one pass each.
  Rows Alone(Backend& backend, const Sequence& s) {
    SequenceKv kv(Layout(s.kv, 64), 256);
    Rows rows{Step(backend, kv, s.prompt)};
    for (TokenId t : kDecodeTokens) rows.push_back(Step(backend, kv, std::span<const TokenId>(&t, 1)));
    return rows;
  }

  // All the sequences together, with `fillers` more sequences of 3-token prompts spread among
  // them (short steps before and after the long ones), then decode passes of every one.
  std::vector<Rows> Together(Backend& backend, const std::vector<Sequence>& seqs, int fillers) {
    std::vector<std::unique_ptr<SequenceKv>> kvs;
    std::vector<int> which;  // per step: the sequence, or -1 for a filler
    const std::vector<TokenId> filler_prompt = {1, 29871, 13};
    for (size_t i = 0; i < seqs.size(); ++i) {
      for (int f = 0; f < fillers / static_cast<int>(seqs.size()) + (i == 0 ? fillers % static_cast<int>(seqs.size()) : 0); ++f) {
        kvs.push_back(std::make_unique<SequenceKv>(Layout("q4k", 64), 256));
        which.push_back(-1);
      }
      kvs.push_back(std::make_unique<SequenceKv>(Layout(seqs[i].kv, 64), 256));
      which.push_back(static_cast<int>(i));
    }
    std::vector<Rows> rows(seqs.size());
    std::vector<SequenceStep> steps;
    for (size_t k = 0; k < kvs.size(); ++k) {
      const std::vector<TokenId>& p = which[k] < 0 ? filler_prompt : seqs[static_cast<size_t>(which[k])].prompt;
      steps.push_back({kvs[k].get(), p, false});
    }
    auto take = [&](const Logits& lg) {
      for (size_t k = 0; k < kvs.size(); ++k) {
        if (which[k] < 0) continue;
        const float* r = lg.row(lg.first_row[k]);
        rows[static_cast<size_t>(which[k])].emplace_back(r, r + hp().n_vocab);
      }
    };
    Logits lg;
    Status st = backend.Forward(steps, lg);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) return {};
    take(lg);
    for (const TokenId& t : kDecodeTokens) {
      for (SequenceStep& s : steps) s.tokens = std::span<const TokenId>(&t, 1);
      st = backend.Forward(steps, lg);
      EXPECT_TRUE(st.ok()) << st.message();
      if (!st.ok()) return {};
      take(lg);
    }
    return rows;
  }

  // Whether every row is the same bits as alone; reports the first difference.
  static bool SameBits(const Rows& got, const Rows& want, const std::string& what) {
    if (got.size() != want.size()) {
      ADD_FAILURE() << what << ": " << got.size() << " rows, not " << want.size();
      return false;
    }
    for (size_t r = 0; r < got.size(); ++r) {
      if (got[r].size() != want[r].size() ||
          std::memcmp(got[r].data(), want[r].data(), got[r].size() * sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
  }

  // Every row must be the same bits as alone on `alone_on` (the same backend, or one that
  // differs only in what should not matter).
  void Check(Backend& backend, Backend& alone_on, const std::vector<int>& fillers, const std::string& what) {
    const std::vector<Sequence> seqs = Sequences();
    std::vector<Rows> alone;
    for (const Sequence& s : seqs) alone.push_back(Alone(alone_on, s));
    for (int n : fillers) {
      const std::vector<Rows> together = Together(backend, seqs, n);
      ASSERT_EQ(together.size(), seqs.size());
      for (size_t i = 0; i < seqs.size(); ++i) {
        EXPECT_TRUE(SameBits(together[i], alone[i], "")) << what << ": sequence " << i << " (" << seqs[i].kv << ", "
                                                          << seqs[i].prompt.size() << "-token prompt) with " << n
                                                          << " others";
      }
    }
  }

};

// The CPU backend's kernel tables add a row's products in the same order for any number of rows.
TEST_F(BatchInvarianceTest, CpuBackend) {
  auto cpu = MakeCpuBackend(*model_, CpuOptions{2});
  Check(*cpu, *cpu, {0, 12, 29, 70}, "cpu");
}

TEST_F(BatchInvarianceTest, VulkanBackend) {
  auto vulkan = Vulkan({});
  KVFS_REQUIRE_VULKAN(vulkan.status());
  // 0 fillers: 4 decode rows (matrix-vector either way); 12: 16 decode rows and a prompt pass of
  // 45 short rows and 2 long prompts, the long ones given among the short ones; 29: 33 rows.
  Check(**vulkan, **vulkan, {0, 12, 29}, "Q4_0");
  // Micro-batches of 16 tokens (2 MiB bindings: 32000 logits a row): the long prompts span
  // several, one of them beginning with the short steps' rows.
  auto split = Vulkan({.max_binding_bytes = 2 << 20});
  ASSERT_TRUE(split.ok()) << split.status().message();
  Check(**split, **vulkan, {12}, "Q4_0, micro-batches of 16 tokens");
  // Decode attention in splits of 32 positions (a GPU's default): the 83-token prompt's decode
  // adds 3 splits' sums, alone and among others.
  VulkanOptions fine;
  fine.tuning.attention_split = 32;
  auto fine_splits = Vulkan(fine);
  ASSERT_TRUE(fine_splits.ok()) << fine_splits.status().message();
  Check(**fine_splits, **fine_splits, {12}, "Q4_0, attention splits of 32");
  // F16 weights: the float matrix shaders (matvec_float, matmul_float).
  auto f16 = Model::Load(testing::TestModelsDir() + "/tiny-llama-F16.gguf");
  ASSERT_TRUE(f16.ok()) << f16.status().message();
  auto on_f16 = Vulkan({}, f16->get());
  ASSERT_TRUE(on_f16.ok()) << on_f16.status().message();
  Check(**on_f16, **on_f16, {12}, "F16");
}

// The comparison above can fail: without batch invariance, 16 decode rows take the tiled
// shaders, and some sequence's logits come out in other bits than alone.
TEST_F(BatchInvarianceTest, WithoutItABusyVulkanPassChangesTheBits) {
  auto variant = Vulkan({.batch_invariant = false});
  KVFS_REQUIRE_VULKAN(variant.status());
  const std::vector<Sequence> seqs = Sequences();
  int differ = 0;
  const std::vector<Rows> together = Together(**variant, seqs, 12);
  ASSERT_EQ(together.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) differ += SameBits(together[i], Alone(**variant, seqs[i]), "") ? 0 : 1;
  EXPECT_GT(differ, 0);
}

// The order a kernel-choosing backend runs steps in, and the logits put back.
TEST(StepOrder, ShortStepsFirstAndLogitsBackInTheGivenOrder) {
  const std::vector<TokenId> one = {5}, nine(9, 3), eight(8, 2);
  std::vector<SequenceStep> steps = {{nullptr, nine, true}, {nullptr, one, false}, {nullptr, eight, false},
                                     {nullptr, nine, false}, {nullptr, one, true}};
  const std::vector<size_t> order = ShortStepsFirst(steps);
  EXPECT_EQ(order, (std::vector<size_t>{1, 2, 4, 0, 3}));
  std::vector<SequenceStep> sorted = {steps[1], steps[2], steps[4], steps[0], steps[3]};
  EXPECT_TRUE(ShortStepsFirst(sorted).empty());  // already in order: nothing to do
  // Logits as run: rows 1, 1, 1, 9, 1 (all_logits for the 9-token step and the last 1-token one),
  // each row's values naming its step and row.
  Logits out;
  out.n_vocab = 2;
  const std::vector<int64_t> rows_of = {9, 1, 1, 1, 1};  // per given step
  for (size_t k = 0; k < order.size(); ++k) {
    out.first_row.push_back(static_cast<int64_t>(out.data.size()) / 2);
    for (int64_t r = 0; r < rows_of[order[k]]; ++r) {
      out.data.push_back(static_cast<float>(order[k]));
      out.data.push_back(static_cast<float>(r));
    }
  }
  RestoreStepOrder(order, out);
  ASSERT_EQ(out.first_row, (std::vector<int64_t>{0, 9, 10, 11, 12}));
  ASSERT_EQ(out.data.size(), 26u);
  for (size_t i = 0; i < steps.size(); ++i) {
    for (int64_t r = 0; r < rows_of[i]; ++r) {
      EXPECT_EQ(out.row(out.first_row[i] + r)[0], static_cast<float>(i));
      EXPECT_EQ(out.row(out.first_row[i] + r)[1], static_cast<float>(r));
    }
  }
}

}  // namespace
}  // namespace kvfs
