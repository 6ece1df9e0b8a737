#include "engine/backend/vulkan/vk_commands.h"

#include <spdlog/fmt/fmt.h>

namespace kvfs::vk {

namespace {
constexpr uint32_t kSetsPerPool = 1024;
}  // namespace

Recorder::~Recorder() {
  VkDevice dev = ctx_.device();
  if (fence_ != VK_NULL_HANDLE) vkDestroyFence(dev, fence_, nullptr);
  for (VkDescriptorPool p : descriptor_pools_) vkDestroyDescriptorPool(dev, p, nullptr);
  if (pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(dev, pool_, nullptr);
}

Status Recorder::Begin() {
  VkDevice dev = ctx_.device();
  if (pool_ == VK_NULL_HANDLE) {
    VkCommandPoolCreateInfo info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    info.queueFamilyIndex = ctx_.queue_family();
    VkResult r = vkCreateCommandPool(dev, &info, nullptr, &pool_);
    if (r != VK_SUCCESS) return VkError("vkCreateCommandPool", r);
    VkCommandBufferAllocateInfo alloc{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    alloc.commandPool = pool_;
    alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    alloc.commandBufferCount = 1;
    r = vkAllocateCommandBuffers(dev, &alloc, &cmd_);
    if (r != VK_SUCCESS) return VkError("vkAllocateCommandBuffers", r);
    VkFenceCreateInfo fence_info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    r = vkCreateFence(dev, &fence_info, nullptr, &fence_);
    if (r != VK_SUCCESS) return VkError("vkCreateFence", r);
  }
  if (sets_epoch_ != ctx_.buffer_epoch()) {
    for (VkDescriptorPool p : descriptor_pools_) vkResetDescriptorPool(dev, p, 0);
    current_pool_ = 0;
    sets_.clear();
    sets_epoch_ = ctx_.buffer_epoch();
  }
  vkResetCommandBuffer(cmd_, 0);
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  const VkResult r = vkBeginCommandBuffer(cmd_, &begin);
  if (r != VK_SUCCESS) return VkError("vkBeginCommandBuffer", r);
  recording_ = true;
  return Status::Ok();
}

Result<VkDescriptorSet> Recorder::AllocateSet(VkDescriptorSetLayout layout) {
  VkDevice dev = ctx_.device();
  while (true) {
    if (current_pool_ == descriptor_pools_.size()) {
      const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBuffers};
      VkDescriptorPoolCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
      info.maxSets = kSetsPerPool;
      info.poolSizeCount = 1;
      info.pPoolSizes = &size;
      VkDescriptorPool p;
      const VkResult r = vkCreateDescriptorPool(dev, &info, nullptr, &p);
      if (r != VK_SUCCESS) return VkError("vkCreateDescriptorPool", r);
      descriptor_pools_.push_back(p);
    }
    VkDescriptorSetAllocateInfo alloc{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    alloc.descriptorPool = descriptor_pools_[current_pool_];
    alloc.descriptorSetCount = 1;
    alloc.pSetLayouts = &layout;
    VkDescriptorSet set;
    const VkResult r = vkAllocateDescriptorSets(dev, &alloc, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) return VkError("vkAllocateDescriptorSets", r);
    ++current_pool_;  // this pool is full: the next one (made on demand)
  }
}

Status Recorder::Dispatch(const Pipeline& pipeline, std::initializer_list<const Buffer*> buffers, const void* push,
                          uint32_t x, uint32_t y, uint32_t z) {
  if (buffers.size() != pipeline.n_buffers) {
    return Internal(fmt::format("dispatch binds {} buffers, the pipeline has {}", buffers.size(), pipeline.n_buffers));
  }
  if (x == 0 || y == 0 || z == 0) return Status::Ok();
  if (sets_epoch_ != ctx_.buffer_epoch()) {
    return Internal("a buffer was destroyed while a pass was being recorded");
  }
  SetKey key{pipeline.set_layout, {}};
  size_t n = 0;
  for (const Buffer* b : buffers) key.second[n++] = b->handle();
  auto it = sets_.find(key);
  if (it == sets_.end()) {
    KVFS_ASSIGN_OR_RETURN(VkDescriptorSet set, AllocateSet(pipeline.set_layout));
    VkDescriptorBufferInfo infos[kMaxBuffers];
    VkWriteDescriptorSet writes[kMaxBuffers];
    for (uint32_t i = 0; i < n; ++i) {
      infos[i] = {key.second[i], 0, VK_WHOLE_SIZE};
      writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
      writes[i].dstSet = set;
      writes[i].dstBinding = i;
      writes[i].descriptorCount = 1;
      writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      writes[i].pBufferInfo = &infos[i];
    }
    vkUpdateDescriptorSets(ctx_.device(), static_cast<uint32_t>(n), writes, 0, nullptr);
    it = sets_.emplace(key, set).first;
  }
  const VkDescriptorSet set = it->second;
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline);
  vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, 1, &set, 0, nullptr);
  if (pipeline.push_bytes > 0) {
    vkCmdPushConstants(cmd_, pipeline.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pipeline.push_bytes, push);
  }
  vkCmdDispatch(cmd_, x, y, z);
  return Status::Ok();
}

void Recorder::Barrier() {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                          VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(cmd_, stages, stages, 0, 1, &barrier, 0, nullptr, 0, nullptr);
}

void Recorder::Copy(const Buffer& src, int64_t src_offset, const Buffer& dst, int64_t dst_offset, int64_t bytes) {
  if (bytes <= 0) return;
  const VkBufferCopy region{static_cast<VkDeviceSize>(src_offset), static_cast<VkDeviceSize>(dst_offset),
                            static_cast<VkDeviceSize>(bytes)};
  vkCmdCopyBuffer(cmd_, src.handle(), dst.handle(), 1, &region);
}

void Recorder::Zero(const Buffer& dst, int64_t offset, int64_t bytes) {
  if (bytes <= 0) return;
  vkCmdFillBuffer(cmd_, dst.handle(), static_cast<VkDeviceSize>(offset), static_cast<VkDeviceSize>(bytes), 0u);
}

Status Recorder::SubmitAndWait() {
  if (!recording_) return Internal("SubmitAndWait without Begin");
  recording_ = false;
  // Device writes become visible to host reads after the fence.
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier, 0, nullptr, 0, nullptr);
  VkResult r = vkEndCommandBuffer(cmd_);
  if (r != VK_SUCCESS) return VkError("vkEndCommandBuffer", r);
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &cmd_;
  r = vkQueueSubmit(ctx_.queue(), 1, &submit, fence_);
  if (r != VK_SUCCESS) return VkError("vkQueueSubmit", r);
  r = vkWaitForFences(ctx_.device(), 1, &fence_, VK_TRUE, UINT64_MAX);
  if (r != VK_SUCCESS) return VkError("vkWaitForFences", r);
  vkResetFences(ctx_.device(), 1, &fence_);
  return Status::Ok();
}

}  // namespace kvfs::vk
