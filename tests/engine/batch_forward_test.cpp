// The forward pass over a batch of sequences must give each sequence the logits it gets alone:
// positions, causal masks and KV storage are per sequence.
#include <cmath>

#include "engine/backend/backend.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

double MaxDiff(const float* a, const float* b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

TEST(BatchForward, BatchedEqualsAlone) {
  const std::string path = testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf";
  KVFS_REQUIRE_DATA(path);
  auto model_or = Model::Load(path);
  ASSERT_TRUE(model_or.ok()) << model_or.status().message();
  const Model& model = **model_or;
  const HParams& hp = model.hparams();
  const int64_t V = hp.n_vocab;
  auto backend = MakeCpuBackend(model, CpuOptions{2});
  const Tokenizer& tok = model.tokenizer();

  const std::vector<std::string> texts = {"Once upon a time there was a dragon who liked tea.",
                                          "Hi", "The quick brown fox jumps over the lazy dog, twice, and then sleeps."};
  const std::vector<std::string> kv_types = {"f16", "q8", "q4"};
  std::vector<std::vector<TokenId>> prompts;
  for (const auto& t : texts) prompts.push_back(tok.Encode(t, true, false));

  // Alone: prompt in one pass, then one more token.
  std::vector<std::vector<float>> alone_prompt, alone_next;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceKv kv(KvLayoutFor(hp, *MakeKvFormat(kv_types[i], "", hp.n_head_kv, hp.head_dim)), 256);
    Logits lg;
    SequenceStep s{&kv, prompts[i], true};
    ASSERT_TRUE(backend->Forward(std::span<const SequenceStep>(&s, 1), lg).ok());
    alone_prompt.push_back(lg.data);
    const TokenId next = 42;
    SequenceStep s2{&kv, std::span<const TokenId>(&next, 1), false};
    ASSERT_TRUE(backend->Forward(std::span<const SequenceStep>(&s2, 1), lg).ok());
    alone_next.push_back(lg.data);
  }

  // Batched: all prompts in one pass (all logits for some), then one token each in one pass.
  std::vector<std::unique_ptr<SequenceKv>> kvs;
  std::vector<SequenceStep> steps;
  for (size_t i = 0; i < prompts.size(); ++i) {
    kvs.push_back(std::make_unique<SequenceKv>(KvLayoutFor(hp, *MakeKvFormat(kv_types[i], "", hp.n_head_kv, hp.head_dim)), 256));
    steps.push_back({kvs.back().get(), prompts[i], i != 1});
  }
  Logits lg;
  ASSERT_TRUE(backend->Forward(steps, lg).ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    EXPECT_EQ(kvs[i]->n_tokens(), n);
    if (steps[i].all_logits) {
      EXPECT_LE(MaxDiff(lg.row(lg.first_row[i]), alone_prompt[i].data(), n * V), 1e-4) << "sequence " << i;
    } else {  // only the last row was asked for
      EXPECT_LE(MaxDiff(lg.row(lg.first_row[i]), alone_prompt[i].data() + (n - 1) * V, V), 1e-4) << "sequence " << i;
    }
  }
  const TokenId next = 42;
  std::vector<SequenceStep> decode;
  for (auto& kv : kvs) decode.push_back({kv.get(), std::span<const TokenId>(&next, 1), false});
  ASSERT_TRUE(backend->Forward(decode, lg).ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_LE(MaxDiff(lg.row(lg.first_row[i]), alone_next[i].data(), V), 1e-4) << "decode of sequence " << i;
  }
}

TEST(BatchForward, OverflowLeavesEverySequenceUntouched) {
  const std::string path = testing::SharedDir() + "/models/stories260K.gguf";
  KVFS_REQUIRE_DATA(path);
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok());
  const HParams& hp = (*model)->hparams();
  auto backend = MakeCpuBackend(**model, CpuOptions{1});
  const KvLayout layout = KvLayoutFor(hp, *MakeKvFormat("f16", "", hp.n_head_kv, hp.head_dim));
  SequenceKv fits(layout, 64), too_small(layout, 4);
  std::vector<TokenId> toks = {1, 403, 407, 261, 378, 432};
  std::vector<SequenceStep> steps = {{&fits, toks, false}, {&too_small, toks, false}};
  Logits lg;
  Status s = backend->Forward(steps, lg);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(fits.n_tokens(), 0);
  EXPECT_EQ(too_small.n_tokens(), 0);
}

}  // namespace
}  // namespace kvfs
