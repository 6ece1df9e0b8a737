// What a Vulkan device charges for the shape of a decode step (kvfs bench dispatch): a step is
// some 9 dispatches a layer, each behind a barrier, most of them short (norms, attention at
// small depth), so a few microseconds of launch and drain per dispatch can be a third of it.
// Measured here without any model: minimal dispatches (one workgroup reading one word) with a
// barrier after each (as a decode step records them) and without, and the rate at which the
// read-ahead shader
// (vk::Ops::Prefetch) reads memory, which says how many bytes it can read beside a short
// dispatch without making it wait. And what the size of a shader's code costs a dispatch of one
// workgroup: the short shaders are thousands of instructions each, run by a few workgroups on
// multiprocessors whose instruction caches last held other code.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace kvfs {

struct DispatchCostOptions {
  int device = -1;              // as VulkanOptions::device
  int64_t dispatches = 512;     // per measured pass
  int repetitions = 5;          // passes per figure (medians)
  int64_t read_bytes = 64 << 20;  // bytes each read-ahead dispatch reads
  // Code size (shaders/code_fetch.comp): chains of these many dependent multiply-adds, as
  // straight-line code and as a loop, each from one pipeline and cycling through
  // code_pipelines pipelines of the same length (empty: not measured).
  std::vector<int64_t> code_steps = {256, 1024, 4096};
  int code_pipelines = 8;
};

// One workgroup's chain of `steps` multiply-adds: microseconds per dispatch and its barrier.
struct CodeFetchCost {
  int64_t steps = 0;
  double straight_us = 0;          // straight-line code (about 2 x steps instructions), one pipeline
  double loop_us = 0;              // the same chain as a loop, one pipeline
  double straight_cycling_us = 0;  // straight-line, code_pipelines pipelines in turn
  double loop_cycling_us = 0;      // the loop, as many pipelines in turn
  // The driver compiler's statistics of the two pipelines (of the first of the cycled ones),
  // "name value" pairs as it reports them (empty where it reports none): whether the straight
  // code was unrolled, and how long it is.
  std::vector<std::pair<std::string, double>> straight_statistics, loop_statistics;
};

// Microseconds per dispatch, medians.
struct DispatchCost {
  std::string device;
  double barrier_us = 0;         // a minimal dispatch and the barrier after it: wall time (the
                                 // pass is submitted in pieces as it is recorded, as decode is)
  double barrier_record_us = 0;  // of which the host spent recording (overlapping the device)
  double no_barrier_us = 0;      // a minimal dispatch, none separated by barriers: wall time
                                 // after recording (such a pass is submitted only at its end)
  double no_barrier_record_us = 0;
  double read_us = 0;            // one read-ahead dispatch of read_bytes and its barrier
  double read_gbps = 0;          // read_bytes / (read_us - barrier_us), GB/s
  int64_t read_bytes = 0;        // per dispatch, alternating between two such regions
  std::vector<CodeFetchCost> code;  // per code_steps
};

// Unsupported without the Vulkan backend; the device's errors otherwise.
Result<DispatchCost> MeasureVulkanDispatchCost(const DispatchCostOptions& options);

}  // namespace kvfs
