// Phase clocks (kvfs bench --phases): where the time of a short dispatch goes, inside it. A
// dispatch's device time (the --profile timestamps) says how long kv_store or attn_scores took,
// not which step of it: a decode step's short shaders are chains of memory latencies, barriers
// and exact divisions, and only a GPU can say which link is long. The NAME_clock variants of the
// decode path's shaders (phase_clock.glsl) have each workgroup's first invocation write the
// device's realtime clock and its multiprocessor's cycle counter at numbered marks; the Recorder
// gives every clocked dispatch of a pass its own region of one host-visible buffer (a dynamic
// offset of descriptor set 1), and after the pass this class reads the regions into per-pipeline
// tallies: per mark, how long workgroups took from the mark before (median, 90th percentile,
// max), and per dispatch, the span from its first workgroup's start to its last one's end.
// Needs VK_KHR_shader_clock (shaderDeviceClock and shaderSubgroupClock; Context::phase_clock()).
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend/vulkan/vk_context.h"
#include "engine/backend/vulkan/vk_pipelines.h"
#include "engine/core/status.h"

namespace kvfs::vk {

class PhaseClock {
 public:
  static constexpr uint32_t kMarks = 16;      // marks a workgroup (phase_clock.glsl's kPhaseMarks)
  static constexpr int64_t kMarkBytes = 16;   // a mark: realtime lo, hi; cycles lo, hi
  struct Options {
    int64_t max_dispatches = 320;   // clocked dispatches of a pass with a region of their own
                                    // (llama3.1-8b's decode step has about 290); later ones share
                                    // a spare region that is not read
    int64_t max_workgroups = 512;   // workgroups of a dispatch recorded (the first ones)
  };
  // Whether clocked pipelines can run on ctx's device: its shader clocks (Context::phase_clock())
  // and a storage buffer a stage beyond the most a shader binds (the clock's set 1).
  static bool Usable(const Context& ctx);
  // layout: the cache's set-1 layout (PipelineCache::clock_set_layout()).
  static Result<std::unique_ptr<PhaseClock>> Create(Context& ctx, VkDescriptorSetLayout layout, const Options& options);
  ~PhaseClock();
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  VkDescriptorSet set() const { return set_; }
  // The dynamic offset of the next clocked dispatch of the pass, which it notes with its grid.
  uint32_t NextRegion(const Pipeline& pipeline, uint32_t x, uint32_t y, uint32_t z);
  // After the pass has been waited for: its regions into the tallies, then zeroed for the next.
  void Collect();
  // A pass abandoned after an error (after its pieces finished): its regions zeroed, not tallied.
  void Discard();
  // One block per clocked pipeline (shader and constants), marks by name; empty when nothing was
  // clocked. Then starts over.
  std::string TakeReport();
  // The marks' names of a shader (its base name: kv_store, attn_output, ...); empty if it has none.
  static const std::vector<std::string>& MarkNames(std::string_view shader);

 private:
  PhaseClock(Context& ctx, const Options& options) : ctx_(ctx), options_(options) {}

  struct Clocked {  // a dispatch of the current pass
    const Pipeline* pipeline;
    int64_t workgroups;
  };
  struct Tally {  // per pipeline, over every collected pass
    int64_t dispatches = 0, workgroups = 0, recorded = 0;
    std::vector<double> span_ns, skew_ns;                 // per dispatch
    std::array<std::vector<double>, kMarks> interval_ns, interval_cycles;  // [mark]: per workgroup
  };

  Context& ctx_;
  Options options_;
  int64_t region_bytes_ = 0;
  Buffer marks_;  // (max_dispatches + 1) regions; the last one spare
  VkDescriptorPool pool_ = VK_NULL_HANDLE;
  VkDescriptorSet set_ = VK_NULL_HANDLE;
  std::vector<Clocked> pass_;
  std::map<const Pipeline*, Tally> tallies_;
  double cycles_ = 0, ns_ = 0;  // summed over workgroups' lives: the cycle counter's rate
};

}  // namespace kvfs::vk
