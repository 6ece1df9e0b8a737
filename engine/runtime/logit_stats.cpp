#include "engine/runtime/logit_stats.h"

#include <algorithm>
#include <cmath>

namespace kvfs {

namespace {

// Index of the first maximum (ties go to the lower id, as an argmax sampler would pick).
int64_t ArgMax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

double LogSumExpAt(const float* x, int64_t n, double mx) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - mx);
  return mx + std::log(s);
}

}  // namespace

double LogSumExp(const float* x, int64_t n) { return LogSumExpAt(x, n, x[ArgMax(x, n)]); }

Estimate MeanAccumulator::Mean() const {
  if (count_ == 0) return {};
  const double mean = sum_ / static_cast<double>(count_);
  const double var = sum2_ / static_cast<double>(count_) - mean * mean;
  const double se = count_ > 1 && var > 0.0 ? std::sqrt(var / static_cast<double>(count_ - 1)) : 0.0;
  return {mean, se};
}

double NllAccumulator::Add(const float* logits, int64_t n_vocab, int32_t target) {
  const double nll = LogSumExp(logits, n_vocab) - static_cast<double>(logits[target]);
  nll_.Add(nll);
  return nll;
}

Estimate NllAccumulator::Perplexity() const {
  const Estimate m = nll_.Mean();
  const double ppl = std::exp(m.value);
  return {ppl, ppl * m.uncertainty};
}

double KlAccumulator::Add(const float* base, const float* test, int64_t n_vocab, int32_t target) {
  const int64_t top_base = ArgMax(base, n_vocab), top_test = ArgMax(test, n_vocab);
  const double lse_base = LogSumExpAt(base, n_vocab, base[top_base]);
  const double lse_test = LogSumExpAt(test, n_vocab, test[top_test]);
  // KL(p||q) = sum_i p_i (log p_i - log q_i), over the whole vocabulary (the reference skips
  // terms with log p_i < -16 because it stores base log-probs in 16 bits; this needs not).
  double kl = 0.0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    const double lp = static_cast<double>(base[i]) - lse_base;
    const double lq = static_cast<double>(test[i]) - lse_test;
    kl += std::exp(lp) * (lp - lq);
  }
  const double nll_base = lse_base - static_cast<double>(base[target]);
  const double nll_test = lse_test - static_cast<double>(test[target]);
  nll_base_.Add(nll_base);
  nll_test_.Add(nll_test);
  sum_nll_cross_ += nll_base * nll_test;
  kl_.Add(kl);
  max_kl_ = std::max(max_kl_, kl);
  if (top_base == top_test) ++same_top1_;
  return kl;
}

Estimate KlAccumulator::BasePerplexity() const {
  const Estimate m = nll_base_.Mean();
  return {std::exp(m.value), std::exp(m.value) * m.uncertainty};
}

Estimate KlAccumulator::TestPerplexity() const {
  const Estimate m = nll_test_.Mean();
  return {std::exp(m.value), std::exp(m.value) * m.uncertainty};
}

Estimate KlAccumulator::LogPerplexityRatio() const {
  const int64_t n = count();
  const Estimate t = nll_test_.Mean(), b = nll_base_.Mean();
  // Covariance of the two sample means: cov(x, y) / (n - 1), as the reference computes it.
  double cov = 0.0;
  if (n > 1) {
    cov = (sum_nll_cross_ / static_cast<double>(n) - t.value * b.value) / static_cast<double>(n - 1);
  }
  const double var = t.uncertainty * t.uncertainty + b.uncertainty * b.uncertainty - 2.0 * cov;
  return {t.value - b.value, var > 0.0 ? std::sqrt(var) : 0.0};
}

Estimate KlAccumulator::SameTop1() const {
  const int64_t n = count();
  if (n == 0) return {};
  const double p = static_cast<double>(same_top1_) / static_cast<double>(n);
  return {p, n > 1 ? std::sqrt(p * (1.0 - p) / static_cast<double>(n - 1)) : 0.0};
}

}  // namespace kvfs
