// PlanPrefill (engine/runtime/prefill_plan.h): how a step's prefill tokens are shared.
#include "engine/runtime/prefill_plan.h"

#include <algorithm>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace kvfs::engine_internal {
namespace {

std::vector<size_t> Plan(std::vector<PrefillWant> wants, size_t budget, size_t short_budget = 512) {
  return PlanPrefill(wants, budget, short_budget);
}

// The staggered-arrival case: the first prompt, part done, keeps the budget whichever order the
// turns are given in; the second gets what is left.
TEST(PrefillPlan, LeastLeftFirst) {
  EXPECT_EQ(Plan({{3300, 0}, {4096, 0}}, 512), (std::vector<size_t>{512, 0}));
  EXPECT_EQ(Plan({{4096, 0}, {3300, 0}}, 512), (std::vector<size_t>{0, 512}));
  EXPECT_EQ(Plan({{4096, 0}, {1000, 0}, {600, 0}}, 512), (std::vector<size_t>{0, 0, 512}));
  // Once a prompt ends in the step, others join only if they end too: no partial chunk
  // lengthens the pass that gives its first token.
  EXPECT_EQ(Plan({{4096, 0}, {300, 0}, {1000, 0}}, 512), (std::vector<size_t>{0, 300, 0}));
  EXPECT_EQ(Plan({{1, 0}, {4000, 0}}, 512), (std::vector<size_t>{1, 0}));
  EXPECT_EQ(Plan({{200, 0}, {250, 0}, {100, 0}, {300, 0}}, 512), (std::vector<size_t>{200, 0, 100, 0}));
  std::vector<PrefillWant> together(8, PrefillWant{100, 0});  // agents arriving together
  EXPECT_EQ(Plan(together, 512), (std::vector<size_t>{100, 100, 100, 100, 100, 0, 0, 0}));
  // The same for a short remainder taken whole; other short remainders still join whole (the
  // new turns of agents arriving together).
  EXPECT_EQ(Plan({{17, 0}, {4000, 0}}, 512), (std::vector<size_t>{17, 0}));
  EXPECT_EQ(Plan({{17, 0}, {4000, 0}, {30, 0}}, 512), (std::vector<size_t>{17, 0, 30}));
  // Ties keep the given (arrival) order.
  EXPECT_EQ(Plan({{700, 0}, {700, 0}}, 512), (std::vector<size_t>{512, 0}));
  EXPECT_EQ(Plan({{4, 0}, {9, 0}}, 5, 0), (std::vector<size_t>{4, 0}));
  EXPECT_EQ(Plan({{40, 0}, {52, 0}}, 20, 0), (std::vector<size_t>{20, 0}));
}

// A prompt cut in pieces is cut where both sides are longer than a backend's short steps
// (step_order.h): its tokens then take the same kernels however the budget falls. A prompt of
// at most kShortStepTokens is never cut, nor a piece left that short.
TEST(PrefillPlan, PiecesLongerThanShortSteps) {
  static_assert(kMinPrefillPiece == kShortStepTokens + 1);
  EXPECT_EQ(Plan({{9, 0}, {12, 0}}, 5, 0), (std::vector<size_t>{9, 0}));     // 5 + 4 would be two short steps
  EXPECT_EQ(Plan({{17, 0}}, 8, 0), (std::vector<size_t>{17}));              // 9 + 8 would leave a short one
  EXPECT_EQ(Plan({{18, 0}}, 8, 0), (std::vector<size_t>{9}));               // 9 + 9
  EXPECT_EQ(Plan({{100, 0}}, 95, 0), (std::vector<size_t>{91}));            // not 95 + 5
  EXPECT_EQ(Plan({{100, 0}}, 3, 0), (std::vector<size_t>{9}));              // not 3 + 97
  EXPECT_EQ(Plan({{6, 0}}, 2, 0), (std::vector<size_t>{6}));                // never cut
  EXPECT_EQ(Plan({{300, 0}, {400, 0}}, 295, 0), (std::vector<size_t>{291, 0}));  // no crumbs of 4 for the second
  EXPECT_EQ(Plan({{300, 0}, {400, 0}}, 320, 0), (std::vector<size_t>{300, 0}));  // (one prompt ends: no partial)
  EXPECT_EQ(Plan({{30, 0}, {400, 0}}, 45, 0), (std::vector<size_t>{30, 0}));
}

// Cached agents' new turns (tens of tokens) are taken whole beyond the budget, within the short
// budget; once that is used up they share the budget like any other turn.
TEST(PrefillPlan, ShortRemaindersWhole) {
  EXPECT_EQ(Plan({{4000, 0}, {17, 0}, {17, 0}}, 5), (std::vector<size_t>{0, 17, 17}));
  EXPECT_EQ(Plan({{64, 0}, {65, 0}}, 8), (std::vector<size_t>{64, 0}));
  EXPECT_EQ(Plan({{65, 0}}, 8), (std::vector<size_t>{kMinPrefillPiece}));
  std::vector<PrefillWant> many(10, PrefillWant{60, 0});
  const std::vector<size_t> plan = Plan(many, 100, 512);
  // 8 x 60 = 480 whole within 512; the 9th does not fit whole and the budget is used up.
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(plan[i], 60u) << i;
  EXPECT_EQ(plan[8], 0u);
  EXPECT_EQ(plan[9], 0u);
}

// A turn passed over kMaxPrefillWait steps goes first, the longest waiting first.
TEST(PrefillPlan, LongWaitGoesFirst) {
  EXPECT_EQ(Plan({{100, 0}, {5000, kMaxPrefillWait - 1}}, 512), (std::vector<size_t>{100, 0}));
  EXPECT_EQ(Plan({{600, kMaxPrefillWait}, {5000, kMaxPrefillWait + 1}}, 512), (std::vector<size_t>{0, 512}));
  EXPECT_EQ(Plan({{600, 0}, {5000, kMaxPrefillWait - 1}}, 512), (std::vector<size_t>{512, 0}));
  EXPECT_EQ(Plan({{600, 0}, {5000, kMaxPrefillWait}}, 512), (std::vector<size_t>{0, 512}));
  EXPECT_EQ(Plan({{600, 0}, {5000, kMaxPrefillWait}, {7000, kMaxPrefillWait + 3}}, 512),
            (std::vector<size_t>{0, 0, 512}));
}

// Properties over random steps: no turn gets more than it has left; the non-whole turns share
// at most the budget; whole ones fit the short budget; and, simulating steps with a stream of
// new prompts arriving (the way Engine::Step keeps the counters), a turn with tokens left waits
// at most kMaxPrefillWait steps plus one per other turn passed over as long (served one per
// step, the longest waiting first), however crowded.
TEST(PrefillPlan, BoundsAndNoStarvation) {
  std::mt19937 rng(5);
  struct Turn {
    PrefillWant want;
    size_t since_last = 0;  // steps since it last got tokens
  };
  constexpr size_t kMaxTurns = 12;
  std::vector<Turn> turns;
  size_t checked_waits = 0;
  for (int step = 0; step < 20000; ++step) {
    // Arrivals: mostly short and medium prompts, sometimes a long one; up to kMaxTurns at once.
    if (turns.size() < kMaxTurns && rng() % 3 == 0) {
      const size_t kind = rng() % 10;
      const size_t left = kind < 5 ? 1 + rng() % 64 : kind < 9 ? 65 + rng() % 900 : 2000 + rng() % 6000;
      turns.push_back({{left, 0}, 0});
    }
    const size_t budget = rng() % 2 == 0 ? 512 : 1 + rng() % 16;
    const size_t short_budget = 512;
    std::vector<PrefillWant> wants;
    for (const Turn& t : turns) wants.push_back(t.want);
    const std::vector<size_t> plan = PlanPrefill(wants, budget, short_budget);
    ASSERT_EQ(plan.size(), wants.size());
    size_t shared = 0, whole = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      ASSERT_LE(plan[i], wants[i].left);
      if (plan[i] > 0 && plan[i] < wants[i].left) {  // a cut: both sides longer than short steps
        ASSERT_GE(plan[i], kMinPrefillPiece);
        ASSERT_GE(wants[i].left - plan[i], kMinPrefillPiece);
      }
      if (plan[i] == wants[i].left && wants[i].left <= kShortPrefill) {
        whole += plan[i];
      } else {
        shared += plan[i];
      }
    }
    // (over only for the first turn, by less than two short pieces: a cut's sides are at least
    // kMinPrefillPiece long)
    ASSERT_LE(shared, std::max(budget, 2 * kMinPrefillPiece - 1));
    ASSERT_LE(whole, short_budget);
    for (size_t i = 0; i < turns.size(); ++i) {
      Turn& t = turns[i];
      t.want.left -= plan[i];
      t.want.waited = plan[i] > 0 ? 0 : t.want.waited + 1;
      t.since_last = plan[i] > 0 ? 0 : t.since_last + 1;
      ASSERT_LE(t.since_last, kMaxPrefillWait + kMaxTurns - 1) << "a turn was passed over too long at step " << step;
      checked_waits += t.since_last > kMaxPrefillWait ? 1 : 0;
    }
    std::erase_if(turns, [](const Turn& t) { return t.want.left == 0; });
  }
  // The crowded steps did make turns wait past kMaxPrefillWait (else the rule went untested).
  EXPECT_GT(checked_waits, 0u);
}

}  // namespace
}  // namespace kvfs::engine_internal
