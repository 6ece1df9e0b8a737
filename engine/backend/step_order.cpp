#include "engine/backend/step_order.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace kvfs {

std::vector<size_t> ShortStepsFirst(std::span<const SequenceStep> steps) {
  std::vector<size_t> order(steps.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return IsShortStep(steps[i]); });
  if (std::is_sorted(order.begin(), order.end())) return {};
  return order;
}

void RestoreStepOrder(std::span<const size_t> order, Logits& out) {
  if (order.empty()) return;
  const size_t n = order.size();
  const int64_t V = out.n_vocab;
  const int64_t total = V > 0 ? static_cast<int64_t>(out.data.size()) / V : 0;
  std::vector<int64_t> rows(n);  // rows of the k-th step run
  for (size_t k = 0; k < n; ++k) rows[k] = (k + 1 < n ? out.first_row[k + 1] : total) - out.first_row[k];
  std::vector<size_t> position(n);  // where steps[i] ran
  for (size_t k = 0; k < n; ++k) position[order[k]] = k;
  std::vector<float> data(out.data.size());
  std::vector<int64_t> first_row(n);
  int64_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t k = position[i];
    first_row[i] = at;
    std::memcpy(data.data() + at * V, out.data.data() + out.first_row[k] * V,
                static_cast<size_t>(rows[k] * V) * sizeof(float));
    at += rows[k];
  }
  out.data = std::move(data);
  out.first_row = std::move(first_row);
}

}  // namespace kvfs
