// kvfs bench dispatch (vulkan_dispatch_cost.h): passes of empty dispatches, with and without
// barriers, and of read-ahead dispatches, timed by the host's clock around each pass (what a
// synchronous decode step waits for: recording, which overlaps the device piece by piece, and
// the device's work).
#include "engine/backend/vulkan_dispatch_cost.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/backend/vulkan/vk_commands.h"
#include "engine/backend/vulkan/vk_context.h"
#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_pipelines.h"
#include "engine/core/median.h"

namespace kvfs {

namespace {
// Read-ahead dispatches per measured pass: enough to hide the submission, few enough that
// lavapipe reads its 64 MiB each in well under a second.
constexpr int64_t kReadDispatches = 16;
}  // namespace

Result<DispatchCost> MeasureVulkanDispatchCost(const DispatchCostOptions& options) {
  if (options.dispatches < 1 || options.repetitions < 1 || options.read_bytes < 16) {
    return InvalidArgument("dispatch cost: dispatches and repetitions must be at least 1, read bytes at least 16");
  }
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<vk::Context> ctx, vk::Context::Create(options.device));
  vk::PipelineCache pipelines(ctx->device());
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<vk::Ops> ops, vk::Ops::Create(*ctx, pipelines));
  vk::Recorder rec(*ctx);
  const int64_t read_bytes = std::min(options.read_bytes, ctx->limits().max_binding_bytes) / 16 * 16;
  KVFS_ASSIGN_OR_RETURN(vk::Buffer data, ctx->CreateBuffer(read_bytes, vk::MemoryKind::kDevice));
  KVFS_ASSIGN_OR_RETURN(vk::Buffer sink, ctx->CreateBuffer(16, vk::MemoryKind::kDevice));
  KVFS_RETURN_IF_ERROR(rec.Begin());
  rec.Zero(data, 0, read_bytes);  // defined contents (the sum read is never looked at)
  KVFS_RETURN_IF_ERROR(rec.SubmitAndWait());

  // Seconds of one pass of n dispatches, each reading `bytes` (16: one word, an empty dispatch).
  auto pass = [&](int64_t n, int64_t bytes, bool barriers) -> Result<double> {
    const auto t0 = std::chrono::steady_clock::now();
    KVFS_RETURN_IF_ERROR(rec.Begin());
    for (int64_t i = 0; i < n; ++i) {
      KVFS_RETURN_IF_ERROR(ops->PrefetchBytes(rec, data, 0, bytes, sink));
      if (barriers) rec.Barrier();
    }
    KVFS_RETURN_IF_ERROR(rec.SubmitAndWait());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Microseconds per dispatch, the median over the repetitions after one pass that warms up
  // (pipelines, descriptor sets, command buffers made on first use).
  auto per_dispatch_us = [&](int64_t n, int64_t bytes, bool barriers) -> Result<double> {
    KVFS_RETURN_IF_ERROR(pass(n, bytes, barriers).status());
    std::vector<double> seconds;
    for (int r = 0; r < options.repetitions; ++r) {
      KVFS_ASSIGN_OR_RETURN(const double s, pass(n, bytes, barriers));
      seconds.push_back(s);
    }
    return Median(seconds) / static_cast<double>(n) * 1e6;
  };
  DispatchCost cost;
  cost.device = ctx->info().name;
  cost.read_bytes = read_bytes;
  KVFS_ASSIGN_OR_RETURN(cost.barrier_us, per_dispatch_us(options.dispatches, 16, true));
  KVFS_ASSIGN_OR_RETURN(cost.no_barrier_us, per_dispatch_us(options.dispatches, 16, false));
  KVFS_ASSIGN_OR_RETURN(cost.read_us, per_dispatch_us(kReadDispatches, read_bytes, true));
  const double read_only_us = cost.read_us - cost.barrier_us;
  cost.read_gbps = read_only_us > 0 ? static_cast<double>(read_bytes) / read_only_us * 1e-3 : 0.0;
  return cost;
}

}  // namespace kvfs
