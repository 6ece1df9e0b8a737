// Sampling and stop conditions.
//
// Cost per token, n = n_vocab: one O(n) pass to copy/penalise the logits and one to compute
// softmax weights; top-k is a bounded-heap scan (O(n log k), nearly O(n)) plus a sort of the k
// survivors; min-p is an O(n) filter; top-p finds the nucleus boundary with a weight
// histogram and a quickselect inside one bucket (expected O(n)) or, after top-k, a scan of
// the sorted k. No step sorts the vocabulary.
//
// Determinism: the candidate order that the draw walks is always fully determined (either id
// order or sorted by (logit desc, id asc), a strict total order), and the uniform number is
// built from the raw 64-bit mt19937_64 output, which the standard fixes exactly; so the same
// seed and logits give the same tokens with any standard library.
#include "engine/runtime/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

namespace kvfs {
namespace {

using Candidate = std::pair<float, TokenId>;

// Higher logit first; equal logits by lower id, so every ordering we produce is unique.
bool Better(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// NaN would break the comparator's strict weak ordering (undefined behaviour in the sorts),
// and +inf would make softmax produce inf - inf; a broken logit must not take the process down.
float Sanitize(float logit) {
  if (std::isnan(logit)) return -std::numeric_limits<float>::infinity();
  if (logit == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
  return logit;
}

// Uniform in [0, 1) from the top 53 bits: exactly representable, and unlike
// std::uniform_real_distribution the same on every standard library.
double UniformDouble(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Applies llama.cpp's repetition penalty to each distinct token of the last `last_n` history
// entries once: positive logits are divided (less likely), negative multiplied (also less
// likely). last_n < 0 means the whole history. A penalty <= 0 (or NaN) is ignored: dividing
// by it would turn logits into infinities.
// The distinct tokens (sorted) that the penalty applies to: those of the last `last_n` history
// entries, or none when the penalty is off.
void PenalisedTokens(std::span<const TokenId> history, float penalty, int last_n, std::vector<TokenId>& out) {
  out.clear();
  if (!(penalty > 0.0f) || penalty == 1.0f || last_n == 0 || history.empty()) return;
  size_t n = last_n < 0 ? history.size() : std::min(history.size(), static_cast<size_t>(last_n));
  out.assign(history.end() - static_cast<ptrdiff_t>(n), history.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

// The penalised value of a logit: positive ones divided, negative ones multiplied.
float Penalise(float logit, float penalty) { return logit <= 0.0f ? logit * penalty : logit / penalty; }

void ApplyRepeatPenalty(std::vector<Candidate>& cands, std::span<const TokenId> history,
                        float penalty, int last_n, std::vector<TokenId>& scratch) {
  PenalisedTokens(history, penalty, last_n, scratch);
  for (TokenId id : scratch) {
    if (id < 0 || static_cast<size_t>(id) >= cands.size()) continue;  // not in this vocab
    float& logit = cands[static_cast<size_t>(id)].first;  // cands is still in id order here
    logit = Penalise(logit, penalty);
  }
}

// Weighted quickselect: the element of `work` at which the cumulative weight, in Better
// order, first reaches `need` (the last element if rounding leaves it short). Expected O(n).
Candidate WeightedSelect(std::vector<Candidate>& work, double need) {
  // Invariant: everything before lo is better than [lo, hi) and its weight has already been
  // taken off `need`; the answer lies in [lo, hi).
  size_t lo = 0, hi = work.size();
  while (hi - lo > 32) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(work.begin() + static_cast<ptrdiff_t>(lo), work.begin() + static_cast<ptrdiff_t>(mid),
                     work.begin() + static_cast<ptrdiff_t>(hi), Better);
    double half = 0.0;
    for (size_t i = lo; i < mid; ++i) half += static_cast<double>(work[i].first);
    if (half >= need) {
      hi = mid;
    } else {
      need -= half;
      lo = mid;
    }
  }
  std::sort(work.begin() + static_cast<ptrdiff_t>(lo), work.begin() + static_cast<ptrdiff_t>(hi), Better);
  double cum = 0.0;
  for (size_t i = lo; i < hi; ++i) {
    cum += static_cast<double>(work[i].first);
    if (cum >= need) return work[i];
  }
  return work[hi - 1];
}

// Non-negative floats order like their bit patterns, so the top bits make a monotone bucket
// index: 8 exponent bits and 3 mantissa bits, i.e. 8 buckets per factor of two.
constexpr int kBucketShift = 20;
constexpr size_t kBuckets = size_t{1} << (32 - kBucketShift);
size_t WeightBucket(float w) { return std::bit_cast<uint32_t>(w) >> kBucketShift; }

// The last token of the top-p nucleus: the smallest prefix, in Better order, of `cands` with
// cumulative weight >= target. Sorting the nucleus would cost O(m log m), and for a flat
// distribution m is tens of thousands of tokens; instead a histogram of the weights finds the
// bucket holding the boundary in one pass, and only that bucket's tokens are searched.
Candidate NucleusBoundary(const std::vector<Candidate>& cands, double target, std::vector<Candidate>& work) {
  std::array<double, kBuckets> mass{};
  for (const Candidate& c : cands) mass[WeightBucket(c.first)] += static_cast<double>(c.first);
  double need = target;
  size_t bucket = kBuckets;
  size_t lowest_nonempty = kBuckets;
  for (size_t b = kBuckets; b-- > 0;) {
    if (mass[b] == 0.0) continue;
    lowest_nonempty = b;
    if (mass[b] >= need) { bucket = b; break; }
    need -= mass[b];
  }
  if (bucket == kBuckets) {
    // Rounding left the total a hair short of the target: the boundary is the last token.
    bucket = lowest_nonempty;
    need = mass[bucket];
  }
  work.clear();
  for (const Candidate& c : cands) {
    if (WeightBucket(c.first) == bucket) work.push_back(c);
  }
  return WeightedSelect(work, need);
}

}  // namespace

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {}

// Greedy decoding without the candidate list (it runs once per agent per decode step, on the
// engine thread while the workers wait): the argmax of the sanitized, penalised logits, a strict
// comparison in id order keeping the lowest id among ties, exactly as the candidate path ranks.
TokenId Sampler::Greedy(std::span<const float> logits, std::span<const TokenId> history) {
  const size_t n = logits.size();
  PenalisedTokens(history, params_.repeat_penalty, params_.repeat_last_n, recent_);  // met in id order below
  auto next_penalised = std::lower_bound(recent_.begin(), recent_.end(), TokenId{0});
  if (next_penalised == recent_.end()) {
    // No penalty: eight running maxima (one chain would wait on every comparison's latency),
    // then the first id holding the maximum. A NaN never wins a > comparison and never equals
    // (Sanitize's -inf); +inf is clamped to the largest float, as Sanitize does.
    constexpr float kMax = std::numeric_limits<float>::max();
    auto clamped = [&](size_t i) { return std::min(logits[i], kMax); };
    std::array<float, 8> tops;
    tops.fill(-std::numeric_limits<float>::infinity());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (size_t k = 0; k < 8; ++k) tops[k] = clamped(i + k) > tops[k] ? clamped(i + k) : tops[k];
    }
    for (; i < n; ++i) tops[0] = clamped(i) > tops[0] ? clamped(i) : tops[0];
    float top = tops[0];
    for (float t : tops) top = t > top ? t : top;
    if (top == -std::numeric_limits<float>::infinity()) return 0;  // every logit NaN or -inf
    for (size_t j = 0; j < n; ++j) {
      if (clamped(j) == top) return static_cast<TokenId>(j);
    }
    return 0;  // not reached: top is one of the clamped logits
  }
  size_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) {
    float v = Sanitize(logits[i]);
    if (next_penalised != recent_.end() && static_cast<size_t>(*next_penalised) == i) {
      v = Penalise(v, params_.repeat_penalty);
      ++next_penalised;
    }
    if (v > best_value || i == 0) {
      best = i;
      best_value = v;
    }
  }
  return static_cast<TokenId>(best);
}

TokenId Sampler::Sample(std::span<const float> logits, std::span<const TokenId> history) {
  const size_t n = logits.size();
  if (n == 0) return kNoToken;
  if (params_.temperature <= 0.0f) return Greedy(logits, history);
  candidates_.resize(n);
  for (size_t i = 0; i < n; ++i) candidates_[i] = {Sanitize(logits[i]), static_cast<TokenId>(i)};
  ApplyRepeatPenalty(candidates_, history, params_.repeat_penalty, params_.repeat_last_n, recent_);

  // Top-k by a bounded heap whose front is the worst kept candidate: one comparison rejects
  // almost every token, so this is O(n) in practice and O(n log k) at worst, several times
  // faster than nth_element over the whole vocabulary. The survivors are then sorted, so the
  // draw order does not depend on how the heap happened to arrange them.
  bool sorted = false;  // candidates_ in Better order (else in id order)
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    const auto k = static_cast<ptrdiff_t>(params_.top_k);
    const auto heap_end = candidates_.begin() + k;
    std::make_heap(candidates_.begin(), heap_end, Better);
    for (size_t i = static_cast<size_t>(k); i < n; ++i) {
      if (!Better(candidates_[i], candidates_.front())) continue;
      std::pop_heap(candidates_.begin(), heap_end, Better);
      *(heap_end - 1) = candidates_[i];  // slot i was read; only slots < k are written
      std::push_heap(candidates_.begin(), heap_end, Better);
    }
    candidates_.resize(static_cast<size_t>(k));
    std::sort(candidates_.begin(), candidates_.end(), Better);
    sorted = true;
  }

  // Softmax, stabilised by subtracting the maximum. The weights stay unnormalised (the maximum
  // has weight exactly 1) and are overwritten into the logit slot: from here on
  // candidates_[i].first is a weight and Better compares weights. exp is monotone, so that is
  // the logit order, except that logits which round to the same weight then rank by id.
  // top_p and min_p judge the probabilities before the temperature, as llama.cpp's default
  // chain does (top_k, top_p, min_p, temperature); without them the weights are made at the
  // temperature at once.
  const bool filters = params_.min_p > 0.0f || params_.top_p < 1.0f;
  float max_logit = -std::numeric_limits<float>::infinity();
  for (const Candidate& c : candidates_) max_logit = std::max(max_logit, c.first);
  // Float exp: the weights are stored as float anyway, and it is several times cheaper than
  // double over a whole vocabulary; the sum is kept in double.
  const float inv_temp = 1.0f / params_.temperature;
  const float scale = filters ? 1.0f : inv_temp;
  double total = 0.0;
  for (Candidate& c : candidates_) {
    // Equal to the maximum -> weight 1 exactly; this also covers an all -inf row, which then
    // samples uniformly instead of dividing 0 by 0.
    c.first = c.first == max_logit ? 1.0f : std::exp((c.first - max_logit) * scale);
    total += static_cast<double>(c.first);
  }

  // Top-p then min-p, as documented, but computed in the cheaper order: both keep a prefix of
  // the probability-sorted list, min-p's test p >= min_p * p_max is a ratio that
  // renormalising after top-p does not change, and top-p's threshold is taken against the
  // full mass `total` — so filtering by min-p first and then cutting the top-p prefix gives
  // exactly the documented set, and the O(n) min-p filter usually leaves top-p little to do.
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p;  // p_max has weight 1
    if (threshold > 1.0f) {
      // The formula would keep nothing; keep the most likely token instead.
      const Candidate best = *std::min_element(candidates_.begin(), candidates_.end(), Better);
      candidates_.assign(1, best);
    } else {
      // erase_if keeps the survivors in their order (sorted or id order), allocation-free.
      std::erase_if(candidates_, [threshold](const Candidate& c) { return c.first < threshold; });
    }
  }

  if (params_.top_p < 1.0f) {
    const double target = static_cast<double>(params_.top_p) * total;
    double kept_mass = 0.0;
    for (const Candidate& c : candidates_) kept_mass += static_cast<double>(c.first);
    // If min-p left less than the nucleus mass, it already cut deeper than top-p would.
    if (kept_mass >= target) {
      if (sorted) {
        size_t cut = candidates_.size();
        double cum = 0.0;
        for (size_t i = 0; i < candidates_.size(); ++i) {
          cum += static_cast<double>(candidates_[i].first);
          if (cum >= target) { cut = i + 1; break; }
        }
        candidates_.resize(cut);
      } else {
        const Candidate last = NucleusBoundary(candidates_, target, selection_);
        std::erase_if(candidates_, [&last](const Candidate& c) { return Better(last, c); });
      }
    }
  }

  // The survivors' weights at the temperature: exp((l - max) / T) = w^(1/T), in the same order.
  if (filters && inv_temp != 1.0f)
    for (Candidate& c : candidates_)
      if (c.first != 1.0f) c.first = std::pow(c.first, inv_temp);

  // Draw. The kept weights need no explicit renormalisation: scaling u by their sum does it.
  double kept_total = 0.0;
  for (const Candidate& c : candidates_) kept_total += static_cast<double>(c.first);
  const double u = UniformDouble(rng_) * kept_total;
  double cum = 0.0;
  for (const Candidate& c : candidates_) {
    cum += static_cast<double>(c.first);
    if (u < cum) return c.second;
  }
  return candidates_.back().second;  // u rounded up to the total
}

std::string_view StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kNone: return "none";
    case StopReason::kEndOfGeneration: return "end_of_generation";
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kContextFull: return "context_full";  // as a daemon turn's stop_reason
  }
  return "unknown";
}

// max_tokens <= 0 means no limit. Empty stop strings are dropped: they would match at once.
StopChecker::StopChecker(std::vector<TokenId> eog_tokens, int max_tokens, std::vector<std::string> stop_strings)
    : eog_(std::move(eog_tokens)), max_tokens_(max_tokens), stops_(std::move(stop_strings)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopChecker::Push(TokenId token, std::string_view text) {
  if (reason_ != StopReason::kNone) return {};
  ++n_generated_;
  if (std::find(eog_.begin(), eog_.end(), token) != eog_.end()) {
    // The eog token itself is not output, but what was held back was real text: release it
    // here so a caller that never calls Flush() loses nothing.
    reason_ = StopReason::kEndOfGeneration;
    return Flush();
  }

  held_.append(text);
  // A complete stop string: output what precedes the earliest one, drop it and the rest.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    reason_ = StopReason::kStopString;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }

  if (max_tokens_ > 0 && n_generated_ >= max_tokens_) {
    reason_ = StopReason::kMaxTokens;
    return Flush();
  }

  // Hold back the longest tail that could still grow into a stop string. Such a tail starts
  // with a stop string's first byte, which is never a UTF-8 continuation byte, so the text
  // released before it always ends on a character boundary.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) { hold = len; break; }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopChecker::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace kvfs
