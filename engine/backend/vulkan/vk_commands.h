// Recording and running compute work: one command buffer that is filled, submitted and waited
// for (the forward pass is synchronous, like the CPU backend's). Descriptor sets are made once
// per (shader layout, buffers) and reused by later passes: a decode step binds the same
// buffers as the previous one, so it records dispatches without allocating or writing sets.
// They are all dropped when any buffer of the context has been destroyed since (its handle
// could name a new buffer).
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <vector>

#include "engine/backend/vulkan/vk_context.h"
#include "engine/backend/vulkan/vk_pipelines.h"
#include "engine/core/status.h"

namespace kvfs::vk {

class Recorder {
 public:
  explicit Recorder(Context& ctx) : ctx_(ctx) {}
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Starts a new command buffer (the previous one must have been submitted).
  Status Begin();
  // Binds `buffers` (whole) to bindings 0.. and dispatches groups (x, y, z). `push` points at
  // pipeline.push_bytes bytes.
  Status Dispatch(const Pipeline& pipeline, std::initializer_list<const Buffer*> buffers, const void* push,
                  uint32_t x, uint32_t y = 1, uint32_t z = 1);
  // Makes every earlier shader or transfer write visible to every later shader or transfer.
  void Barrier();
  void Copy(const Buffer& src, int64_t src_offset, const Buffer& dst, int64_t dst_offset, int64_t bytes);
  // Fills bytes [offset, offset + bytes) of dst with zeros (offset and bytes multiples of 4).
  void Zero(const Buffer& dst, int64_t offset, int64_t bytes);
  // Ends, submits and waits; host reads of readback buffers are valid afterwards.
  Status SubmitAndWait();

 private:
  static constexpr size_t kMaxBuffers = 8;  // no shader binds more
  using SetKey = std::pair<VkDescriptorSetLayout, std::array<VkBuffer, kMaxBuffers>>;
  Result<VkDescriptorSet> AllocateSet(VkDescriptorSetLayout layout);

  Context& ctx_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  std::vector<VkDescriptorPool> descriptor_pools_;
  size_t current_pool_ = 0;             // the pool new sets come from; earlier ones are full
  std::map<SetKey, VkDescriptorSet> sets_;  // sets made so far, by layout and bound buffers
  uint64_t sets_epoch_ = 0;             // ctx_.buffer_epoch() when sets_ was last valid
  bool recording_ = false;
};

}  // namespace kvfs::vk
