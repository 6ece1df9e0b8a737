// logit_stats checked against values computed independently here (closed forms and plain
// double loops over explicit probabilities), including logits large enough to overflow a naive
// exp.
#include "engine/runtime/logit_stats.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace kvfs {
namespace {

std::vector<float> RandomLogits(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// log-probabilities by the definition, in long double.
std::vector<long double> RefLogProbs(const std::vector<float>& x) {
  long double z = 0;
  for (float v : x) z += std::exp(static_cast<long double>(v));
  std::vector<long double> lp;
  for (float v : x) lp.push_back(static_cast<long double>(v) - std::log(z));
  return lp;
}

TEST(LogitStats, LogSumExpMatchesDefinitionAndIsStable) {
  auto x = RandomLogits(1000, 1, 3.0f);
  long double z = 0;
  for (float v : x) z += std::exp(static_cast<long double>(v));
  EXPECT_NEAR(LogSumExp(x.data(), 1000), static_cast<double>(std::log(z)), 1e-12);
  // Shifted by 1000: exp would overflow; the result shifts exactly.
  std::vector<float> big(x);
  for (float& v : big) v += 1000.0f;
  double shifted = 0.0;
  for (size_t i = 0; i < x.size(); ++i) shifted += std::exp(static_cast<double>(big[i]) - 1000.0);
  EXPECT_NEAR(LogSumExp(big.data(), 1000), 1000.0 + std::log(shifted), 1e-9);
  // Uniform logits: log(n) above the common value.
  std::vector<float> flat(512, -7.0f);
  EXPECT_NEAR(LogSumExp(flat.data(), 512), -7.0 + std::log(512.0), 1e-12);
}

TEST(LogitStats, NllAndPerplexity) {
  // Uniform over n: every NLL is log(n), PPL = n exactly, no spread.
  std::vector<float> flat(64, 0.5f);
  NllAccumulator acc;
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(acc.Add(flat.data(), 64, i), std::log(64.0), 1e-12);
  EXPECT_EQ(acc.count(), 10);
  EXPECT_NEAR(acc.Perplexity().value, 64.0, 1e-9);
  // E[x^2] - E[x]^2 (the reference's variance) cancels to rounding noise, not exactly 0.
  EXPECT_NEAR(acc.Perplexity().uncertainty, 0.0, 1e-5);

  // Random rows: mean and standard error by their definitions.
  NllAccumulator r;
  std::vector<double> nll;
  for (int i = 0; i < 50; ++i) {
    auto x = RandomLogits(100, 10 + i, 2.0f);
    nll.push_back(static_cast<double>(-RefLogProbs(x)[i]));
    EXPECT_NEAR(r.Add(x.data(), 100, i), nll.back(), 1e-9);
  }
  double mean = 0, m2 = 0;
  for (double v : nll) mean += v / 50;
  for (double v : nll) m2 += (v - mean) * (v - mean) / 50;
  const double se = std::sqrt(m2 / 49);
  EXPECT_NEAR(r.MeanNll().value, mean, 1e-9);
  EXPECT_NEAR(r.MeanNll().uncertainty, se, 1e-9);
  EXPECT_NEAR(r.Perplexity().value, std::exp(mean), 1e-9);
  EXPECT_NEAR(r.Perplexity().uncertainty, std::exp(mean) * se, 1e-9);
}

TEST(LogitStats, KlDivergence) {
  // Identical rows: KL 0, same top-1, equal perplexities, zero ratio.
  KlAccumulator same;
  for (int i = 0; i < 20; ++i) {
    auto x = RandomLogits(300, 100 + i, 4.0f);
    EXPECT_EQ(same.Add(x.data(), x.data(), 300, i), 0.0);
  }
  EXPECT_EQ(same.MeanKl().value, 0.0);
  EXPECT_EQ(same.SameTop1().value, 1.0);
  EXPECT_EQ(same.BasePerplexity().value, same.TestPerplexity().value);
  EXPECT_NEAR(same.LogPerplexityRatio().value, 0.0, 1e-15);
  EXPECT_NEAR(same.LogPerplexityRatio().uncertainty, 0.0, 1e-7);

  // Two-outcome closed form: p = (0.75, 0.25) from logits (log 3, 0); q = (0.5, 0.5).
  const float p2[2] = {static_cast<float>(std::log(3.0)), 0.0f}, q2[2] = {1.0f, 1.0f};
  KlAccumulator two;
  const double want = 0.75 * std::log(0.75 / 0.5) + 0.25 * std::log(0.25 / 0.5);
  EXPECT_NEAR(two.Add(p2, q2, 2, 1), want, 1e-7);
  EXPECT_NEAR(two.BasePerplexity().value, 4.0, 1e-6);  // -log 0.25
  EXPECT_NEAR(two.TestPerplexity().value, 2.0, 1e-6);  // -log 0.5
  EXPECT_EQ(two.SameTop1().value, 1.0);               // ties go to the lower id: both pick 0

  // Random rows against the definition; a perturbed copy changes the top token sometimes.
  KlAccumulator r;
  double sum = 0;
  int same_top = 0;
  for (int i = 0; i < 40; ++i) {
    auto p = RandomLogits(200, 1000 + i, 3.0f);
    auto q = p;
    auto noise = RandomLogits(200, 5000 + i, 1.0f);
    for (size_t k = 0; k < q.size(); ++k) q[k] += noise[k];
    auto lp = RefLogProbs(p), lq = RefLogProbs(q);
    long double kl = 0;
    for (size_t k = 0; k < p.size(); ++k) kl += std::exp(lp[k]) * (lp[k] - lq[k]);
    EXPECT_NEAR(r.Add(p.data(), q.data(), 200, i), static_cast<double>(kl), 1e-9);
    EXPECT_GT(kl, 0.0L);
    sum += static_cast<double>(kl);
    same_top += std::max_element(p.begin(), p.end()) - p.begin() == std::max_element(q.begin(), q.end()) - q.begin();
  }
  EXPECT_NEAR(r.MeanKl().value, sum / 40, 1e-9);
  EXPECT_NEAR(r.SameTop1().value, same_top / 40.0, 1e-12);
  EXPECT_LT(same_top, 40);
  const double ratio = std::log(r.TestPerplexity().value / r.BasePerplexity().value);
  EXPECT_NEAR(r.LogPerplexityRatio().value, ratio, 1e-9);
}

}  // namespace
}  // namespace kvfs
