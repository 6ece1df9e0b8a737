// Recording and running compute work: one command buffer that is filled, submitted and waited
// for (the forward pass is synchronous, like the CPU backend's). Each dispatch gets a
// descriptor set from pools that are reset when recording begins again.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <initializer_list>
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
  // Ends, submits and waits; host reads of readback buffers are valid afterwards.
  Status SubmitAndWait();

 private:
  Result<VkDescriptorSet> AllocateSet(VkDescriptorSetLayout layout);

  Context& ctx_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  std::vector<VkDescriptorPool> descriptor_pools_;
  size_t current_pool_ = 0;
  bool recording_ = false;
};

}  // namespace kvfs::vk
