#include "engine/runtime/prefill_plan.h"

#include <algorithm>
#include <numeric>

namespace kvfs::engine_internal {

std::vector<size_t> PlanPrefill(std::span<const PrefillWant> wants, size_t budget, size_t short_budget) {
  std::vector<size_t> order(wants.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto starved = [&](size_t i) { return wants[i].waited >= kMaxPrefillWait; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (starved(a) != starved(b)) return starved(a);
    if (starved(a)) return wants[a].waited > wants[b].waited;
    return wants[a].left < wants[b].left;
  });
  std::vector<size_t> plan(wants.size(), 0);
  bool one_ends = false;  // some prompt ends in this step
  const size_t full_budget = budget;
  for (size_t i : order) {
    const size_t left = wants[i].left;
    const bool whole = left <= kShortPrefill && left <= short_budget;
    size_t n = whole ? left : std::min(budget, left);
    // A partial piece, and what it leaves, are longer than a backend's short steps, so every
    // token of a prompt takes the same kernels however the prompt is cut (step_order.h). The
    // first turn on the budget may overshoot it by a few tokens for that (a budget below a piece
    // would starve it); later ones get no crumbs.
    if (n > 0 && n < left) {
      const bool first = budget == full_budget;
      if (left < 2 * kMinPrefillPiece) n = first ? left : 0;  // too short to cut
      else if (n < kMinPrefillPiece) n = first ? kMinPrefillPiece : 0;
      else n = std::min(n, left - kMinPrefillPiece);
    }
    // Once a prompt ends in this step, others join only if they end in it too: a chunk of a
    // longer prompt in the same pass would only delay the first tokens.
    if (one_ends && n < left) n = 0;
    if (whole) short_budget -= n;
    budget -= std::min(budget, n);
    plan[i] = n;
    one_ends |= n > 0 && n == left;
  }
  return plan;
}

}  // namespace kvfs::engine_internal
