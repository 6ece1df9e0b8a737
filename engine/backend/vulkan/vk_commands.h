// Recording and running compute work: a pass is recorded, submitted and waited for (the forward
// pass is synchronous, like the CPU backend's). Long passes go to the queue in pieces: at a
// barrier after enough dispatches, the command buffer so far is submitted and recording goes
// on in the next one, so the device runs the first layers while the host records the rest (on
// a GPU, recording a decode step takes a good fraction of the time the device needs to run
// it). The queue keeps the pieces in order; each piece starts with a barrier that orders it
// after everything submitted before it. Descriptor sets are made once
// per (shader layout, buffers) and reused by later passes: a decode step binds the same
// buffers as the previous one, so it records dispatches without allocating or writing sets.
// They are all dropped when any buffer of the context has been destroyed since (its handle
// could name a new buffer).
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/vulkan/phase_clock.h"
#include "engine/backend/vulkan/vk_context.h"
#include "engine/backend/vulkan/vk_pipelines.h"
#include "engine/core/status.h"

namespace kvfs::vk {

class Recorder {
 public:
  static constexpr size_t kMaxBuffers = 10;  // the most buffers a dispatch binds (matvec_quant, attn_output); Dispatch checks
  explicit Recorder(Context& ctx) : ctx_(ctx) {}
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Starts a pass (the previous one must have been submitted and waited for, or abandoned: a
  // pass abandoned after an error is waited for here).
  Status Begin();
  // Binds `buffers` (whole) to bindings 0.. and dispatches groups (x, y, z). `push` points at
  // pipeline.push_bytes bytes.
  Status Dispatch(const Pipeline& pipeline, std::span<const Buffer* const> buffers, const void* push, uint32_t x,
                  uint32_t y = 1, uint32_t z = 1);
  Status Dispatch(const Pipeline& pipeline, std::initializer_list<const Buffer*> buffers, const void* push,
                  uint32_t x, uint32_t y = 1, uint32_t z = 1) {
    return Dispatch(pipeline, std::span<const Buffer* const>(buffers.begin(), buffers.size()), push, x, y, z);
  }
  // Makes every earlier shader or transfer write visible to every later shader or transfer
  // (nothing when nothing was recorded since the last one). May submit the pass so far (a
  // failed submission is reported by SubmitAndWait).
  void Barrier();
  void Copy(const Buffer& src, int64_t src_offset, const Buffer& dst, int64_t dst_offset, int64_t bytes);
  // Fills bytes [offset, offset + bytes) of dst with zeros (offset and bytes multiples of 4).
  void Zero(const Buffer& dst, int64_t offset, int64_t bytes);
  // Ends, submits and waits; host reads of readback buffers are valid afterwards.
  Status SubmitAndWait();
  // Waits for the pieces of an abandoned pass that may still run (before freeing what they use
  // or recording the next pass); the wait's error, a lost device's, is for callers that go on.
  Status Drain();

  // Tables the host writes for the pass's shaders to read (the calls a merged dispatch runs),
  // in one host-visible buffer that dispatches bind whole (pass_tables()). Returns the index of
  // the table's first entry (its byte offset is a multiple of entry_bytes), reusing a table of
  // the same bytes among the last 16 the pass wrote (its layers repeat theirs), or -1 when
  // the pass has used up kPassTableBytes: the caller then records without it. The table stays
  // as written until the pass has been waited for.
  static constexpr int64_t kPassTableBytes = int64_t{1} << 20;
  Result<int64_t> PassTable(std::span<const uint8_t> bytes, int64_t entry_bytes);
  const Buffer& pass_tables() const { return pass_tables_; }

  // Profiling (kvfs bench --profile, KVFS_VULKAN_PROFILE=1): a timestamp after every dispatch
  // of the first max_dispatches of each command buffer. A dispatch is charged the device time
  // from the previous timestamp to its own: its run plus the wait at the barrier before it.
  // Costs a little device time; off by default. Unsupported when the queue has no timestamps.
  Status EnableProfiling(uint32_t max_dispatches = 8192);
  // Per shader (matrix shaders per grid width, i.e. per matrix shape): dispatches, device
  // milliseconds, share; then the passes' dispatches, barriers and copy commands, and their
  // device time against the host's time to record and to wait for them; then the same per
  // pipeline (a shader and its specialization constants) with, where `statistics` captures
  // them, the compiler's statistics of each (registers, spills;
  // VK_KHR_pipeline_executable_properties); then starts over. Empty when
  // profiling is off.
  std::string TakeProfileReport(const PipelineCache* statistics = nullptr);
  // Phase clocks (kvfs bench --phases, phase_clock.h): the clocked pipelines of `pipelines`
  // (made with phase_clock on) get their regions, and TakeProfileReport adds their phases.
  Status EnablePhaseClock(PipelineCache& pipelines, const PhaseClock::Options& options = {});

 private:
  // Dispatches after which a barrier submits the piece recorded so far: a short first piece
  // puts the device to work soon, longer later ones keep submissions few.
  static constexpr int64_t kFirstPieceDispatches = 32;
  static constexpr int64_t kPieceDispatches = 128;
  using SetKey = std::pair<VkDescriptorSetLayout, std::array<VkBuffer, kMaxBuffers>>;
  Result<VkDescriptorSet> AllocateSet(VkDescriptorSetLayout layout);
  // Starts recording into the next command buffer of the pass (allocated on first use).
  Status BeginPiece();
  // Ends the current piece and submits it, with `fence` (or none).
  Status SubmitPiece(VkFence fence);
  void RecordBarrier();
  Status CollectProfile(std::chrono::steady_clock::time_point submitted);

  Context& ctx_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  std::vector<VkCommandBuffer> pieces_;  // command buffers of a pass, reused pass after pass
  size_t n_pieces_ = 0;                  // used by the current pass; the last one is cmd_
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  int64_t piece_dispatches_ = 0;         // dispatches recorded into cmd_
  VkPipeline bound_pipeline_ = VK_NULL_HANDLE;  // what cmd_ has bound (not bound again)
  VkDescriptorSet bound_set_ = VK_NULL_HANDLE;
  bool in_flight_ = false;               // pieces submitted that no fence wait has covered
  bool work_since_barrier_ = false;      // commands recorded after the last barrier
  Status deferred_;                      // a piece submission that failed inside Barrier()
  VkFence fence_ = VK_NULL_HANDLE;
  std::vector<VkDescriptorPool> descriptor_pools_;
  size_t current_pool_ = 0;             // the pool new sets come from; earlier ones are full
  std::map<SetKey, VkDescriptorSet> sets_;  // sets made so far, by layout and bound buffers
  uint64_t sets_epoch_ = 0;             // ctx_.buffer_epoch() when sets_ was last valid
  bool recording_ = false;
  Buffer pass_tables_;       // host-visible, kPassTableBytes; made at the first PassTable
  int64_t pass_table_used_ = 0;  // bytes of it this pass has written
  // The last tables written this pass (a host copy: the buffer may be slow for the host to read).
  struct RecentTable {
    int64_t offset = -1;
    int64_t entry_bytes = 0;
    std::vector<uint8_t> bytes;
  };
  std::array<RecentTable, 16> recent_tables_;
  size_t next_recent_ = 0;

  struct ProfileLine {
    int64_t dispatches = 0;
    double device_ms = 0;
  };
  struct Profile {
    VkQueryPool queries = VK_NULL_HANDLE;
    uint32_t capacity = 0;            // timestamps per command buffer (one before the first dispatch)
    // The dispatches timed in the current command buffer: their pipelines and grid widths.
    std::vector<std::pair<const Pipeline*, uint32_t>> timed;
    std::map<std::string, ProfileLine> lines;
    std::map<const Pipeline*, ProfileLine> by_pipeline;
    int64_t passes = 0, pieces = 0, dispatches = 0, barriers = 0, copies = 0;
    double device_ms = 0, record_ms = 0, wait_ms = 0;
    std::chrono::steady_clock::time_point begun;
  };
  std::unique_ptr<Profile> profile_;  // null unless EnableProfiling
  std::unique_ptr<PhaseClock> phase_clock_;  // null unless EnablePhaseClock
};

}  // namespace kvfs::vk
