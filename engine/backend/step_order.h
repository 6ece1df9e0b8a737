// Short steps first: how a backend whose kernels add a matrix row's products in an order that
// depends on the kernel keeps every sequence's bits independent of what shares its pass.
//
// The Vulkan backend multiplies a few rows with the matrix-vector shaders (each row's products
// split over lanes, then added as a tree) and many with the tiled ones (added in row order), so
// a decode token's logits moved in the last bits (and, through the 8-bit requantization of
// each matrix's input, sometimes in a greedy token) with the number of agents decoding beside
// it. Instead, each step's rows take the kernel its own length picks: a step of at most
// kShortStepTokens tokens the matrix-vector one, a longer step the tiled one, in every pass.
// With the short steps first, a pass's rows are [short steps' | long steps'], two ranges.
// (The engine's prompt pieces keep a prompt on one side: PlanPrefill.)
// What this does not make equal: a turn whose reused cache leaves at most 8 new tokens runs
// them as a short step, where recomputing the whole prompt would not; and a pass the device
// cannot run goes to the CPU (FallbackBackend), whose bits are its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend/backend.h"

namespace kvfs {

// The most tokens of a step that a kernel-choosing backend treats as short (the Vulkan
// matrix-vector shaders' rows: vk::Ops::kMatvecMaxTokens).
constexpr int64_t kShortStepTokens = 8;

inline bool IsShortStep(const SequenceStep& s) { return static_cast<int64_t>(s.tokens.size()) <= kShortStepTokens; }

// The order to run `steps` in: the short ones first, otherwise as given. Empty when that is the
// given order already.
std::vector<size_t> ShortStepsFirst(std::span<const SequenceStep> steps);

// `out` holds the logits of steps run in `order` (first_row[k] for the k-th step run, rows in
// that order): puts them back in the given order (first_row[i] for steps[i]).
void RestoreStepOrder(std::span<const size_t> order, Logits& out);

}  // namespace kvfs
