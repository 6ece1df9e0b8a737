// Statistics over logits rows for quality measurements (kvfs perplexity): negative
// log-likelihood of the true next token, perplexity, and the comparison of a test distribution
// (e.g. logits computed over a quantized KV cache) against a base one (f16 KV) at the same
// positions: KL divergence, same top-1 token, the perplexity ratio. The estimates and their
// uncertainties follow the reference's llama-perplexity, so figures are comparable; everything is
// computed in double from float logits, and nothing allocates per position.
#pragma once

#include <cstdint>

namespace kvfs {

// A mean over samples with the standard error of that mean.
struct Estimate {
  double value = 0.0;
  double uncertainty = 0.0;
};

// log(sum_i exp(x_i)), in double, with the maximum subtracted first so that logits of any
// magnitude neither overflow nor lose the small terms. n >= 1.
double LogSumExp(const float* x, int64_t n);

// Running sums of samples x: mean and standard error sqrt(var / (count - 1)) with the
// population variance var = E[x^2] - E[x]^2 (the reference's formula). Uncertainty is 0 with
// fewer than two samples or a non-positive variance estimate.
class MeanAccumulator {
 public:
  void Add(double x) {
    sum_ += x;
    sum2_ += x * x;
    ++count_;
  }
  int64_t count() const { return count_; }
  double sum() const { return sum_; }
  Estimate Mean() const;

 private:
  double sum_ = 0.0, sum2_ = 0.0;
  int64_t count_ = 0;
};

// Negative log-likelihood of scored positions; perplexity = exp(mean NLL).
class NllAccumulator {
 public:
  // One position: its logits row and the token that actually came next. Returns the NLL.
  double Add(const float* logits, int64_t n_vocab, int32_t target);
  int64_t count() const { return nll_.count(); }
  Estimate MeanNll() const { return nll_.Mean(); }
  // exp(mean NLL) +/- exp(mean NLL) * standard error of the mean NLL (first-order propagation).
  Estimate Perplexity() const;

 private:
  MeanAccumulator nll_;
};

// A test distribution against a base distribution, position by position.
class KlAccumulator {
 public:
  // base and test: the two logits rows of one position; target: the true next token.
  // Returns KL(p_base || p_test) of this position.
  double Add(const float* base, const float* test, int64_t n_vocab, int32_t target);

  int64_t count() const { return kl_.count(); }
  Estimate BasePerplexity() const;
  Estimate TestPerplexity() const;
  // ln(PPL_test / PPL_base) with its uncertainty, which accounts for the correlation of the two
  // NLL series (they score the same tokens), so it is far tighter than either perplexity's.
  Estimate LogPerplexityRatio() const;
  Estimate MeanKl() const { return kl_.Mean(); }
  double MaxKl() const { return max_kl_; }
  // Fraction (0..1) of positions whose most likely token is the same under both.
  Estimate SameTop1() const;

 private:
  MeanAccumulator nll_base_, nll_test_, kl_;
  double sum_nll_cross_ = 0.0;  // sum of nll_base * nll_test, for the covariance
  double max_kl_ = 0.0;
  int64_t same_top1_ = 0;
};

}  // namespace kvfs
