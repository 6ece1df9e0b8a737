// Sampler properties checked against expectations computed independently here (plain double
// softmax and full sorts, not the sampler's code path), and StopChecker behaviour.
#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace kvfs {
namespace {

std::vector<float> RandomLogits(size_t n, uint64_t seed, float scale = 4.0f) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  // Distribution quality is irrelevant here; only the test's own reproducibility matters.
  for (float& x : v) x = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale;
  return v;
}

TokenId ReferenceArgmax(const std::vector<float>& logits) {
  TokenId best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<TokenId>(i);
  }
  return best;
}

// Softmax of logits / temperature over `ids`, in double.
std::vector<double> ReferenceProbs(const std::vector<float>& logits, const std::vector<TokenId>& ids, double temp) {
  double mx = -std::numeric_limits<double>::infinity();
  for (TokenId id : ids) mx = std::max(mx, static_cast<double>(logits[static_cast<size_t>(id)]));
  std::vector<double> p;
  for (TokenId id : ids) p.push_back(std::exp((logits[static_cast<size_t>(id)] - mx) / temp));
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= z;
  return p;
}

// Ids sorted by logit descending, ties by id.
std::vector<TokenId> SortedIds(const std::vector<float>& logits) {
  std::vector<TokenId> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  return ids;
}

// The documented pipeline (llama.cpp's default chain) written naively: top-k, then top-p's
// prefix and min-p over softmax at temperature 1; the temperature only shapes the draw among
// those (FrequenciesMatchSoftmax). Fails the
// test if a top-p or min-p boundary is too close to call (the sampler keeps weights in
// float), so the expected set is unambiguous.
std::set<TokenId> ReferenceAllowed(const std::vector<float>& logits, const SamplerParams& sp) {
  std::vector<TokenId> ids = SortedIds(logits);
  if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < ids.size()) ids.resize(static_cast<size_t>(sp.top_k));
  std::vector<double> p = ReferenceProbs(logits, ids, 1.0);
  size_t keep = ids.size();
  if (sp.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += p[i];
      EXPECT_GT(std::abs(cum - sp.top_p), 1e-5) << "ambiguous top-p boundary; pick other logits";
      if (cum >= sp.top_p) { keep = i + 1; break; }
    }
  }
  std::set<TokenId> allowed;
  for (size_t i = 0; i < keep; ++i) {
    const double ratio = p[i] / p[0];
    if (sp.min_p > 0.0f) {
      EXPECT_GT(std::abs(ratio - sp.min_p), 1e-5) << "ambiguous min-p boundary";
    }
    if (sp.min_p <= 0.0f || ratio >= sp.min_p) allowed.insert(ids[i]);
  }
  // A sampler must return something: when min_p > 1 rules out even the top token, it stays.
  if (allowed.empty()) allowed.insert(ids[0]);
  return allowed;
}

SamplerParams Params(float temp, int top_k, float top_p, float min_p, uint64_t seed = 1) {
  SamplerParams sp;
  sp.temperature = temp;
  sp.top_k = top_k;
  sp.top_p = top_p;
  sp.min_p = min_p;
  sp.seed = seed;
  return sp;
}

TEST(Sampler, GreedyPicksArgmax) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<float> logits = RandomLogits(5000, seed);
    Sampler s(Params(0.0f, 40, 0.9f, 0.05f));
    EXPECT_EQ(s.Sample(logits, {}), ReferenceArgmax(logits));
    Sampler neg(Params(-1.0f, 0, 1.0f, 0.0f));
    EXPECT_EQ(neg.Sample(logits, {}), ReferenceArgmax(logits));
  }
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  std::vector<float> logits = {1.0f, 5.0f, 2.0f, 5.0f, 5.0f};
  Sampler s(Params(0.0f, 0, 1.0f, 0.0f));
  EXPECT_EQ(s.Sample(logits, {}), 1);
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
  for (float temp : {0.1f, 1.0f, 10.0f, 100.0f}) {
    Sampler s(Params(temp, 1, 0.95f, 0.0f, 7));
    for (uint64_t seed = 0; seed < 50; ++seed) {
      std::vector<float> logits = RandomLogits(1000, seed);
      ASSERT_EQ(s.Sample(logits, {}), ReferenceArgmax(logits)) << "temp " << temp;
    }
    std::vector<float> tied = {0.0f, 3.0f, 3.0f};
    EXPECT_EQ(s.Sample(tied, {}), 1);
  }
}

// Draws many tokens and checks each is in the independently computed allowed set.
void ExpectOnlyAllowed(const SamplerParams& sp, size_t n_vocab, uint64_t logit_seed, float scale) {
  std::vector<float> logits = RandomLogits(n_vocab, logit_seed, scale);
  std::set<TokenId> allowed = ReferenceAllowed(logits, sp);
  ASSERT_FALSE(allowed.empty());
  Sampler s(sp);
  std::set<TokenId> seen;
  for (int i = 0; i < 3000; ++i) {
    TokenId t = s.Sample(logits, {});
    ASSERT_TRUE(allowed.count(t)) << "token " << t << " outside the allowed set of " << allowed.size();
    seen.insert(t);
  }
  // Not vacuous: with few allowed tokens, more than one of them shows up.
  if (allowed.size() > 1) {
    EXPECT_GT(seen.size(), 1u);
  }
}

TEST(Sampler, TopPNeverLeavesTheNucleus) {
  ExpectOnlyAllowed(Params(1.0f, 0, 0.5f, 0.0f), 2000, 11, 8.0f);
  ExpectOnlyAllowed(Params(0.7f, 0, 0.9f, 0.0f), 2000, 12, 8.0f);
  ExpectOnlyAllowed(Params(1.0f, 0, 0.9f, 0.0f), 300, 13, 1.0f);  // flat: nucleus needs > 64 sorted
  ExpectOnlyAllowed(Params(1.0f, 0, 0.0f, 0.0f), 500, 14, 4.0f);  // p = 0 keeps the top token
  // Nearly flat: thousands of tokens with almost the same weight around the boundary.
  ExpectOnlyAllowed(Params(1.0f, 0, 0.6f, 0.0f), 5000, 16, 0.05f);
}

TEST(Sampler, TopPTiesKeepTheLowestIds) {
  // 1000 equal logits, p = 0.25 (exact in binary): the nucleus is exactly 250 tokens, and
  // ties are broken towards low ids as in greedy, so it is ids 0..249.
  std::vector<float> logits(1000, 0.0f);
  Sampler s(Params(1.0f, 0, 0.25f, 0.0f, 3));
  std::set<TokenId> seen;
  for (int i = 0; i < 5000; ++i) {
    TokenId t = s.Sample(logits, {});
    ASSERT_LT(t, 250);
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 200u);
}

TEST(Sampler, MinPNeverKeepsUnlikelyTokens) {
  ExpectOnlyAllowed(Params(1.0f, 0, 1.0f, 0.05f), 2000, 21, 8.0f);
  ExpectOnlyAllowed(Params(1.5f, 0, 1.0f, 0.2f), 2000, 22, 8.0f);
  ExpectOnlyAllowed(Params(1.0f, 0, 1.0f, 2.0f), 100, 23, 4.0f);  // min_p > 1 keeps the top token
}

TEST(Sampler, CombinedFiltersMatchTheDocumentedOrder) {
  ExpectOnlyAllowed(Params(0.8f, 40, 0.95f, 0.05f), 32000, 31, 6.0f);
  ExpectOnlyAllowed(Params(1.2f, 100, 0.7f, 0.02f), 32000, 32, 6.0f);
  ExpectOnlyAllowed(Params(2.0f, 0, 0.8f, 0.01f), 5000, 36, 6.0f);
}

// Chi-square goodness of fit of empirical frequencies against the expected distribution.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

TEST(Sampler, FrequenciesMatchSoftmax) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -2.0f};
  std::vector<TokenId> all(logits.size());
  std::iota(all.begin(), all.end(), 0);
  const int n = 200000;
  {
    // Plain temperature sampling: softmax(logits / 0.7) over all 8 tokens.
    Sampler s(Params(0.7f, 0, 1.0f, 0.0f, 42));
    std::vector<int> counts(logits.size());
    for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(s.Sample(logits, {}))];
    // 7 degrees of freedom: P(chi2 > 24.32) = 0.001. The seed is fixed, so this is not flaky;
    // a biased sampler lands far above it (one token 1% off already gives chi2 ~ 30+).
    EXPECT_LT(ChiSquare(counts, ReferenceProbs(logits, all, 0.7), n), 24.32);
  }
  {
    // top-k = 4: renormalised softmax over the 4 best.
    Sampler s(Params(1.3f, 4, 1.0f, 0.0f, 43));
    std::vector<int> counts(4);
    for (int i = 0; i < n; ++i) {
      TokenId t = s.Sample(logits, {});
      ASSERT_LT(t, 4);
      ++counts[static_cast<size_t>(t)];
    }
    // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
    EXPECT_LT(ChiSquare(counts, ReferenceProbs(logits, {0, 1, 2, 3}, 1.3), n), 16.27);
  }
  // top-p (and min-p) without top-k: renormalised softmax over the independently computed
  // set. At T = 1, p = 0.8 the nucleus is tokens 0..3 (cumulative 0.795 after three, 0.885
  // after four); min-p 0.1 then drops nothing more, min-p 0.3 drops token 3 (0.223 of the max).
  for (float min_p : {0.0f, 0.1f, 0.3f}) {
    SamplerParams sp = Params(1.0f, 0, 0.8f, min_p, 44);
    std::set<TokenId> allowed = ReferenceAllowed(logits, sp);
    ASSERT_EQ(allowed.size(), min_p < 0.2f ? 4u : 3u);
    std::vector<TokenId> ids(allowed.begin(), allowed.end());
    Sampler s(sp);
    std::vector<int> counts(ids.size());
    for (int i = 0; i < n; ++i) {
      TokenId t = s.Sample(logits, {});
      auto it = std::find(ids.begin(), ids.end(), t);
      ASSERT_NE(it, ids.end()) << t;
      ++counts[static_cast<size_t>(it - ids.begin())];
    }
    // 3 or 2 degrees of freedom: P(chi2 > 16.27 / 13.82) = 0.001.
    EXPECT_LT(ChiSquare(counts, ReferenceProbs(logits, ids, 1.0), n), ids.size() == 4 ? 16.27 : 13.82);
  }
  // At another temperature top-p keeps the same set (judged at temperature 1, as llama.cpp's
  // chain does), and the draw among it is softmax(logits / T) renormalised over it.
  for (float temp : {0.5f, 2.0f}) {
    SamplerParams sp = Params(temp, 0, 0.8f, 0.0f, 45);
    std::set<TokenId> allowed = ReferenceAllowed(logits, sp);
    ASSERT_EQ(allowed.size(), 4u);
    std::vector<TokenId> ids(allowed.begin(), allowed.end());
    Sampler s(sp);
    std::vector<int> counts(ids.size());
    for (int i = 0; i < n; ++i) {
      TokenId t = s.Sample(logits, {});
      auto it = std::find(ids.begin(), ids.end(), t);
      ASSERT_NE(it, ids.end()) << "temp " << temp << ": token " << t << " outside the nucleus at temperature 1";
      ++counts[static_cast<size_t>(it - ids.begin())];
    }
    EXPECT_LT(ChiSquare(counts, ReferenceProbs(logits, ids, temp), n), 16.27) << "temp " << temp;
  }
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits = RandomLogits(32000, 5, 3.0f);
  auto run = [&](uint64_t seed) {
    Sampler s(Params(1.0f, 50, 0.95f, 0.01f, seed));
    std::vector<TokenId> out;
    std::vector<TokenId> history;
    for (int i = 0; i < 200; ++i) {
      out.push_back(s.Sample(logits, history));
      history.push_back(out.back());
    }
    return out;
  };
  EXPECT_EQ(run(123), run(123));
  EXPECT_NE(run(123), run(124));
}

TEST(Sampler, RepetitionPenaltyChangesTheWinner) {
  SamplerParams sp = Params(0.0f, 0, 1.0f, 0.0f);
  sp.repeat_penalty = 1.5f;
  sp.repeat_last_n = 64;
  // Positive logit divided: 3.0 / 1.5 = 2.0 < 2.5.
  const std::vector<float> pos = {3.0f, 2.5f, 0.0f};
  EXPECT_EQ(Sampler(Params(0.0f, 0, 1.0f, 0.0f)).Sample(pos, std::vector<TokenId>{0}), 0);
  EXPECT_EQ(Sampler(sp).Sample(pos, std::vector<TokenId>{0}), 1);
  // Negative logit multiplied: -1.0 * 1.5 = -1.5 < -1.2.
  const std::vector<float> neg = {-1.0f, -1.2f};
  EXPECT_EQ(Sampler(sp).Sample(neg, std::vector<TokenId>{0}), 1);
  // Each distinct token once: 3.0 / 1.5 = 2.0 > 1.9 (three times would give 0.89).
  const std::vector<float> once = {3.0f, 1.9f};
  EXPECT_EQ(Sampler(sp).Sample(once, std::vector<TokenId>{0, 0, 0}), 0);
  // Only the last repeat_last_n tokens count: token 0 is outside the window of 2.
  sp.repeat_last_n = 2;
  EXPECT_EQ(Sampler(sp).Sample(pos, std::vector<TokenId>{0, 2, 2}), 0);
  EXPECT_EQ(Sampler(sp).Sample(pos, std::vector<TokenId>{2, 0}), 1);
  // Out-of-vocab history ids are ignored.
  EXPECT_EQ(Sampler(sp).Sample(pos, std::vector<TokenId>{-5, 99}), 0);
  // A non-positive penalty would divide by zero; it is ignored.
  sp.repeat_penalty = 0.0f;
  EXPECT_EQ(Sampler(sp).Sample(pos, std::vector<TokenId>{0}), 0);
}

// Greedy decoding has its own argmax (no candidate list); top-k 1 at temperature 1 ranks through
// the candidate path. Both must pick the same token with penalties, NaN, infinities and ties.
TEST(Sampler, GreedyMatchesTheCandidatePath) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::vector<float>& degenerate : std::vector<std::vector<float>>{
           {nan, nan, nan}, {nan, -inf, -inf}, {-inf, nan}, {nan, inf, 3.0f, inf}, {-inf, -inf, 2.0f}}) {
    for (float penalty : {1.0f, 1.3f}) {
      SamplerParams greedy = Params(0.0f, 0, 1.0f, 0.0f), top1 = Params(1.0f, 1, 1.0f, 0.0f);
      greedy.repeat_penalty = top1.repeat_penalty = penalty;
      const std::vector<TokenId> history = {1};
      EXPECT_EQ(Sampler(greedy).Sample(degenerate, history), Sampler(top1).Sample(degenerate, history));
    }
  }
  std::mt19937 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits = RandomLogits(300, static_cast<uint64_t>(trial));
    for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;  // many ties
    if (trial % 4 == 1) logits[rng() % 300] = nan;
    if (trial % 4 == 2) logits[rng() % 300] = inf;
    if (trial % 4 == 3) logits[0] = nan;
    std::vector<TokenId> history;
    for (int i = 0; i < 40; ++i) history.push_back(static_cast<TokenId>(static_cast<int>(rng() % 330) - 10));
    SamplerParams greedy = Params(0.0f, 0, 1.0f, 0.0f), top1 = Params(1.0f, 1, 1.0f, 0.0f);
    greedy.repeat_penalty = top1.repeat_penalty = trial % 3 == 0 ? 1.0f : 1.3f;
    greedy.repeat_last_n = top1.repeat_last_n = trial % 5 == 0 ? -1 : 16;
    EXPECT_EQ(Sampler(greedy).Sample(logits, history), Sampler(top1).Sample(logits, history)) << "trial " << trial;
  }
}

TEST(Sampler, DegenerateLogits) {
  Sampler s(Params(1.0f, 0, 1.0f, 0.0f));
  EXPECT_EQ(s.Sample({}, {}), kNoToken);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> with_nan = {nan, 1.0f, nan, 2.0f};
  for (int i = 0; i < 200; ++i) {
    TokenId t = s.Sample(with_nan, {});
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  std::vector<float> with_inf = {0.0f, inf, 1.0f};
  EXPECT_EQ(s.Sample(with_inf, {}), 1);
  std::vector<float> all_neg_inf = {-inf, -inf};
  TokenId t = s.Sample(all_neg_inf, {});
  EXPECT_TRUE(t == 0 || t == 1);
}

// --- StopChecker ----------------------------------------------------------------------------

constexpr TokenId kEos = 2;

TEST(StopChecker, StopStringSplitAcrossThreeTokens) {
  StopChecker c({kEos}, 0, {"<|end|>"});
  EXPECT_EQ(c.Push(10, "Hello <|"), "Hello ");  // "<|" might start the stop string
  EXPECT_EQ(c.Push(11, "en"), "");
  EXPECT_EQ(c.reason(), StopReason::kNone);
  EXPECT_EQ(c.Push(12, "d|> ignored"), "");
  EXPECT_EQ(c.reason(), StopReason::kStopString);
  EXPECT_EQ(c.Flush(), "");
  EXPECT_EQ(c.n_generated(), 3);
  // After stopping, further tokens are ignored.
  EXPECT_EQ(c.Push(13, "more"), "");
  EXPECT_EQ(c.n_generated(), 3);
}

TEST(StopChecker, NearMissIsReleased) {
  StopChecker c({kEos}, 0, {"STOP"});
  EXPECT_EQ(c.Push(1, "ok ST"), "ok ");
  EXPECT_EQ(c.Push(1, "O"), "");
  EXPECT_EQ(c.Push(1, "RM"), "STORM");  // not STOP after all
  EXPECT_EQ(c.reason(), StopReason::kNone);
  // Overlapping prefixes: "abab" + "c" must still find "abc".
  StopChecker o({kEos}, 0, {"abc"});
  EXPECT_EQ(o.Push(1, "ab"), "");
  EXPECT_EQ(o.Push(1, "ab"), "ab");
  EXPECT_EQ(o.Push(1, "c!"), "");
  EXPECT_EQ(o.reason(), StopReason::kStopString);
}

TEST(StopChecker, TextBeforeStopStringInSameTokenIsEmitted) {
  StopChecker c({kEos}, 0, {"\n\nUser:", "###"});
  EXPECT_EQ(c.Push(1, "answer.###\n\nUser:"), "answer.");  // earliest stop string wins
  EXPECT_EQ(c.reason(), StopReason::kStopString);
}

TEST(StopChecker, EogTokenStopsAndIsNotEmitted) {
  StopChecker c({7, kEos}, 0, {"<|end|>"});
  EXPECT_EQ(c.Push(1, "x<"), "x");
  EXPECT_EQ(c.Push(kEos, "</s>"), "<");  // held text released, eog text dropped
  EXPECT_EQ(c.reason(), StopReason::kEndOfGeneration);
  EXPECT_EQ(c.Flush(), "");
  StopChecker d({7, kEos}, 0, {});
  EXPECT_EQ(d.Push(7, "<|eot_id|>"), "");
  EXPECT_EQ(d.reason(), StopReason::kEndOfGeneration);
}

TEST(StopChecker, MaxTokens) {
  StopChecker c({kEos}, 3, {"STOP"});
  EXPECT_EQ(c.Push(1, "a"), "a");
  EXPECT_EQ(c.Push(1, "b"), "b");
  EXPECT_EQ(c.reason(), StopReason::kNone);
  EXPECT_EQ(c.Push(1, "cST"), "cST");  // the last token: nothing can complete the stop string
  EXPECT_EQ(c.reason(), StopReason::kMaxTokens);
  EXPECT_EQ(c.n_generated(), 3);
  // A stop string completed by the last allowed token wins over max tokens.
  StopChecker d({kEos}, 2, {"STOP"});
  EXPECT_EQ(d.Push(1, "ST"), "");
  EXPECT_EQ(d.Push(1, "OP"), "");
  EXPECT_EQ(d.reason(), StopReason::kStopString);
}

TEST(StopChecker, FlushReturnsHeldText) {
  StopChecker c({kEos}, 0, {"<|end|>"});
  EXPECT_EQ(c.Push(1, "a<|e"), "a");
  EXPECT_EQ(c.Flush(), "<|e");  // generation ended for another reason (e.g. context full)
  EXPECT_EQ(c.Flush(), "");
}

TEST(StopChecker, MultiByteStopString) {
  StopChecker c({kEos}, 0, {"\xC3\xA9!"});  // "é!"
  EXPECT_EQ(c.Push(1, "caf\xC3\xA9"), "caf");
  EXPECT_EQ(c.Push(1, "?"), "\xC3\xA9?");
  EXPECT_EQ(c.Push(1, "\xC3\xA9!"), "");
  EXPECT_EQ(c.reason(), StopReason::kStopString);
}

TEST(StopChecker, ReasonNames) {
  EXPECT_EQ(StopReasonName(StopReason::kNone), "none");
  EXPECT_EQ(StopReasonName(StopReason::kEndOfGeneration), "end_of_generation");
  EXPECT_EQ(StopReasonName(StopReason::kMaxTokens), "max_tokens");
  EXPECT_EQ(StopReasonName(StopReason::kContextFull), "context_full");
  EXPECT_EQ(StopReasonName(StopReason::kStopString), "stop_string");
}

}  // namespace
}  // namespace kvfs
