// kvfs bench dispatch (vulkan_dispatch_cost.h): passes of minimal dispatches, with and without
// barriers, of read-ahead dispatches, and of one-workgroup dispatches of long and short code
// (code_fetch.comp), timed by the host's clock (what a synchronous decode step waits for), with
// the time spent recording measured apart.
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
// Read-ahead dispatches per measured pass: enough to spread the submission and the wait for
// the fence thin, few enough that lavapipe reads its 64 MiB each in well under a second.
constexpr int64_t kReadDispatches = 32;
using Clock = std::chrono::steady_clock;
double Us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
}  // namespace

Result<DispatchCost> MeasureVulkanDispatchCost(const DispatchCostOptions& options) {
  if (options.dispatches < 1 || options.repetitions < 1 || options.read_bytes < 16) {
    return InvalidArgument("dispatch cost: dispatches and repetitions must be at least 1, read bytes at least 16");
  }
  if (options.code_pipelines < 1 || options.code_pipelines > 64) {
    return InvalidArgument("dispatch cost: 1 to 64 code pipelines");
  }
  for (const int64_t steps : options.code_steps) {
    if (steps < 1 || steps > 65536) return InvalidArgument("dispatch cost: code steps from 1 to 65536");
  }
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<vk::Context> ctx,
                        vk::Context::Create(options.device, /*integer_dot=*/true, /*capture_statistics=*/true));
  vk::PipelineCache pipelines(ctx->device(), ctx->captures_statistics());
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<vk::Ops> ops, vk::Ops::Create(*ctx, pipelines));
  // Two regions read in turn, each as large as asked (within a binding): a cache that held one
  // would still miss on the other.
  const int64_t read_bytes = std::min(options.read_bytes, ctx->limits().max_binding_bytes) / 16 * 16;
  vk::Buffer data[2];
  for (vk::Buffer& d : data) {
    KVFS_ASSIGN_OR_RETURN(d, ctx->CreateBuffer(read_bytes, vk::MemoryKind::kDevice));
  }
  KVFS_ASSIGN_OR_RETURN(vk::Buffer sink, ctx->CreateBuffer(16, vk::MemoryKind::kDevice));
  vk::Recorder rec(*ctx);  // after the buffers: destroyed first, it waits for what it submitted
  KVFS_RETURN_IF_ERROR(rec.Begin());
  for (vk::Buffer& d : data) rec.Zero(d, 0, read_bytes);  // defined contents (what is read is never looked at)
  KVFS_RETURN_IF_ERROR(rec.SubmitAndWait());

  // One pass of n dispatches, dispatch(i) recording the i-th, with a barrier after each or
  // none. Microseconds in all and spent recording (a pass with barriers submits pieces as it
  // records, so the device overlaps that; one without submits everything at the end).
  struct Pass {
    double total_us = 0, record_us = 0;
  };
  auto pass = [&](int64_t n, bool barriers, const auto& dispatch) -> Result<Pass> {
    const auto t0 = Clock::now();
    KVFS_RETURN_IF_ERROR(rec.Begin());
    for (int64_t i = 0; i < n; ++i) {
      KVFS_RETURN_IF_ERROR(dispatch(i));
      if (barriers) rec.Barrier();
    }
    const auto t1 = Clock::now();
    KVFS_RETURN_IF_ERROR(rec.SubmitAndWait());
    return Pass{Us(t0, Clock::now()), Us(t0, t1)};
  };
  // Per dispatch, medians over the repetitions after one pass that warms up (pipelines,
  // descriptor sets, command buffers are made on first use).
  auto measure = [&](int64_t n, bool barriers, const auto& dispatch) -> Result<Pass> {
    KVFS_RETURN_IF_ERROR(pass(n, barriers, dispatch).status());
    std::vector<double> total, record;
    for (int r = 0; r < options.repetitions; ++r) {
      KVFS_ASSIGN_OR_RETURN(const Pass p, pass(n, barriers, dispatch));
      total.push_back(p.total_us / static_cast<double>(n));
      record.push_back(p.record_us / static_cast<double>(n));
    }
    return Pass{Median(total), Median(record)};
  };
  // Read-ahead dispatches of `bytes` each (16: one word, a minimal dispatch of one workgroup).
  auto reads = [&](int64_t bytes) {
    return [&, bytes](int64_t i) { return ops->PrefetchBytes(rec, data[i % 2], 0, bytes, sink); };
  };
  // Code size: one workgroup of 32 per dispatch, from n_pipelines pipelines of the same code
  // length in turn (SALT 0, 1, ...).
  struct CodeFetchParams {
    float a, b;
  };
  const vk::ShaderInterface code_fetch{"code_fetch", 1, sizeof(CodeFetchParams)};
  const CodeFetchParams fetch_params{0.999f, -1.0f};  // x shrinks towards a fixed point > 0: never -1
  auto code_measure = [&](int64_t steps, bool unrolled, int n_pipelines) -> Result<double> {
    std::vector<const vk::Pipeline*> ps;
    for (int s = 0; s < n_pipelines; ++s) {
      const uint32_t spec[] = {32, static_cast<uint32_t>(steps), unrolled ? 1u : 0u, static_cast<uint32_t>(s)};
      KVFS_ASSIGN_OR_RETURN(const vk::Pipeline* p, pipelines.Get(code_fetch, spec));
      ps.push_back(p);
    }
    KVFS_ASSIGN_OR_RETURN(const Pass p, measure(options.dispatches, true, [&](int64_t i) {
                            return rec.Dispatch(*ps[i % n_pipelines], {&sink}, &fetch_params, 1);
                          }));
    return p.total_us;
  };
  // The compiler's statistics of the first of those pipelines (made by code_measure).
  auto code_statistics = [&](int64_t steps, bool unrolled) -> Result<std::vector<std::pair<std::string, double>>> {
    std::vector<std::pair<std::string, double>> out;
    if (!pipelines.captures_statistics()) return out;
    const uint32_t spec[] = {32, static_cast<uint32_t>(steps), unrolled ? 1u : 0u, 0u};
    KVFS_ASSIGN_OR_RETURN(const vk::Pipeline* p, pipelines.Get(code_fetch, spec));
    KVFS_ASSIGN_OR_RETURN(std::vector<vk::PipelineStatistic> stats, pipelines.Statistics(*p));
    for (const vk::PipelineStatistic& st : stats) out.emplace_back(st.name, st.value);
    return out;
  };

  DispatchCost cost;
  cost.device = ctx->info().name;
  cost.read_bytes = read_bytes;
  KVFS_ASSIGN_OR_RETURN(const Pass with, measure(options.dispatches, true, reads(16)));
  KVFS_ASSIGN_OR_RETURN(const Pass without, measure(options.dispatches, false, reads(16)));
  KVFS_ASSIGN_OR_RETURN(const Pass read, measure(kReadDispatches, true, reads(read_bytes)));
  cost.barrier_us = with.total_us;
  cost.barrier_record_us = with.record_us;
  cost.no_barrier_us = std::max(without.total_us - without.record_us, 0.0);  // recording was not overlapped
  cost.no_barrier_record_us = without.record_us;
  cost.read_us = read.total_us;
  const double read_only_us = cost.read_us - cost.barrier_us;
  cost.read_gbps = read_only_us > 0 ? static_cast<double>(read_bytes) / read_only_us * 1e-3 : 0.0;
  for (const int64_t steps : options.code_steps) {
    CodeFetchCost c;
    c.steps = steps;
    KVFS_ASSIGN_OR_RETURN(c.straight_us, code_measure(steps, true, 1));
    KVFS_ASSIGN_OR_RETURN(c.loop_us, code_measure(steps, false, 1));
    KVFS_ASSIGN_OR_RETURN(c.straight_cycling_us, code_measure(steps, true, options.code_pipelines));
    KVFS_ASSIGN_OR_RETURN(c.loop_cycling_us, code_measure(steps, false, options.code_pipelines));
    KVFS_ASSIGN_OR_RETURN(c.straight_statistics, code_statistics(steps, true));
    KVFS_ASSIGN_OR_RETURN(c.loop_statistics, code_statistics(steps, false));
    cost.code.push_back(c);
  }
  return cost;
}

}  // namespace kvfs
