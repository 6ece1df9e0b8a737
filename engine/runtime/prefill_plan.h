// How one scheduler step's prefill tokens are shared among the turns that are prefilling
// (Engine::Step), as a pure function so the policy is tested on its own.
//
// Order: shortest remaining prompt first, not a rotation. Round-robin between two long prompts
// only delays the earlier one: with two 4096-token prompts arriving 2 s apart (tinyllama Q4_0,
// `kvfs bench agents --agents 2 --ctx 4096 --cold --stagger-ms 2000`), alternating chunks took
// the first agent's TTFT from 10.7 s (alone) to 18.7 s, and gave the second nothing: it still
// had to wait for the same total work. The least remaining first finishes each prompt as early
// as the work before it allows, and a short prompt never waits behind a long one. So that a
// long prompt is not starved by a stream of shorter ones, a turn passed over kMaxPrefillWait
// steps in a row goes first (the longest waiting first): no turn waits more than
// kMaxPrefillWait steps plus one per other prefilling turn.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "engine/backend/step_order.h"

namespace kvfs::engine_internal {

struct PrefillWant {
  size_t left = 0;    // prompt tokens it still has to run
  size_t waited = 0;  // prefill steps in a row in which it had tokens left and got none
};

// Remainders this short (the new turn of a cached agent: tens of tokens) are prefilled whole,
// beyond the step's budget but within its short budget, so agents that arrive together start
// decoding together.
constexpr size_t kShortPrefill = 64;
// The shortest piece of a prompt cut in several, and the shortest rest it leaves: one token more
// than a backend's short steps (kShortStepTokens), which may take other kernels, whose sums
// come out in other bits. Cut so, a prompt's tokens take the same kernels however it is cut,
// alone or beside other agents. A prompt of at most kShortStepTokens tokens is never cut.
constexpr size_t kMinPrefillPiece = static_cast<size_t>(kShortStepTokens) + 1;
// Steps in a row a prefilling turn may be passed over before it goes first.
constexpr size_t kMaxPrefillWait = 8;

// Tokens for each of `wants` this step (same order), at most its `left`. Turns are served in
// order: those passed over kMaxPrefillWait steps or more (the longest waiting first), then the
// least left first (ties: the given order, which is arrival order). A short remainder
// (<= kShortPrefill) that fits what is left of `short_budget` is taken whole; any other turn
// takes what is left of `budget` (a partial piece at least kMinPrefillPiece, leaving as much or
// taking the whole when it cannot). Once a turn's prompt ends in the step, the turns after it
// join only if they end in it too (several agents' turns arriving together still start
// decoding together), never with a partial chunk: in the staggered case the first prompt's
// last token shared a pass with 511 tokens of the second's, which put ~1 s on the first agent's
// TTFT. Whole remainders use up `budget` too.
std::vector<size_t> PlanPrefill(std::span<const PrefillWant> wants, size_t budget, size_t short_budget);

}  // namespace kvfs::engine_internal
