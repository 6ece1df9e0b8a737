// The Vulkan device the backend runs on: instance, logical device, one compute queue, memory
// and buffers. Plain Vulkan 1.1 C API; no extension or optional feature is required (the
// shaders address every tensor as 32-bit words). One is used where the device has it: the
// packed integer dot product (integer_dot()).
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/status.h"

namespace kvfs::vk {

// Where a buffer's memory lives.
enum class MemoryKind {
  kDevice,    // device-local: weights, activations, KV planes (on a unified-memory device, host
              // memory once device-local memory is full: MemoryTypeOrder)
  kUpload,    // host-visible, coherent, mapped: inputs the host writes each pass, staging
  // As kUpload, in device-local memory where the device has host-visible such memory (a GPU's
  // PCIe BAR): small tables the host writes each pass and every workgroup reads (block tables,
  // the calls of merged dispatches), which then need not cross the bus. Falls back to kUpload.
  kDeviceUpload,
  kReadback,  // host-visible, mapped, cached where possible: results the host reads
};

class Context;

// The memory types a buffer of `kind` may take (of `allowed_types`, a VkMemoryRequirements
// mask), best first: CreateBuffer takes the next one when an allocation finds its heap full.
// Types with every preferred property come first, then those with only the required ones, each
// group in the driver's order (which the spec has best first). kDevice prefers device-local
// memory; on a unified-memory device (an integrated GPU, or a driver on the CPU) it then takes
// host memory, the same RAM there (an APU's device-local heap is a small carve-out, so a model
// larger than it would not load otherwise). A discrete GPU would read host memory over the bus,
// slower than the CPU backend reads RAM, so its kDevice buffers stay device-local and a model
// that does not fit runs on the CPU (MakeRequestedBackend).
std::vector<uint32_t> MemoryTypeOrder(const VkPhysicalDeviceMemoryProperties& memory, uint32_t allowed_types,
                                      MemoryKind kind, bool unified_memory);

// A VkBuffer with its own memory allocation (move-only). Sizes are rounded up to whole words,
// so shaders may read the last partial word of a tensor.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  VkBuffer handle() const { return buffer_; }
  int64_t bytes() const { return bytes_; }
  uint8_t* mapped() const { return mapped_; }  // null unless host-visible
  bool empty() const { return buffer_ == VK_NULL_HANDLE; }

 private:
  friend class Context;
  void Reset();

  VkDevice device_ = VK_NULL_HANDLE;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  int64_t bytes_ = 0;
  uint8_t* mapped_ = nullptr;
  uint64_t* destroyed_ = nullptr;  // the context's count of destroyed buffers (see buffer_epoch)
  int64_t* local_total_ = nullptr;  // a device buffer in device-local memory: the context's count
  int64_t local_bytes_ = 0;         // of such bytes in use, and this buffer's share of it
};

struct DeviceLimits {
  int64_t max_binding_bytes = 0;      // largest buffer one binding may cover (storage-buffer
                                      // range, and allocation size: a buffer is an allocation)
  int64_t max_shared_bytes = 0;       // shared memory per workgroup
  uint32_t max_group_count[3] = {};   // workgroups per dispatch, per dimension
  uint32_t max_group_invocations = 0;
  uint32_t max_group_size_x = 0;      // invocations along x (the shaders' only dimension)
  uint32_t max_storage_buffers = 0;   // storage buffers one shader may bind
  float timestamp_period_ns = 0;      // nanoseconds per timestamp tick; 0: the queue has no timestamps
};

class Context {
 public:
  // Opens device `index` of ListVulkanDevices() (-1: the default one). integer_dot: use the
  // packed 4x8-bit integer dot product (VK_KHR_shader_integer_dot_product, core in Vulkan 1.3)
  // where the device has it; false keeps the plain-integer shaders (tests compare both).
  // capture_statistics: enable VK_KHR_pipeline_executable_properties where the device has it,
  // so that pipelines can report their compiler's statistics (kvfs shaders). phase_clock: enable
  // the shaders' clocks (VK_KHR_shader_clock) where the device has them (kvfs bench --phases).
  static Result<std::unique_ptr<Context>> Create(int index, bool integer_dot = true, bool capture_statistics = false,
                                                 bool phase_clock = false);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  VkDevice device() const { return device_; }
  VkQueue queue() const { return queue_; }
  uint32_t queue_family() const { return queue_family_; }
  const DeviceLimits& limits() const { return limits_; }
  const VulkanDeviceInfo& info() const { return info_; }
  // Whether shaders may use OpSDot on packed 4x8-bit vectors (the quantized matrix shaders'
  // *_idot variants): DP4A-class instructions on GPUs, a quarter of the integer work.
  bool integer_dot() const { return integer_dot_; }
  // Whether compute shaders may shuffle values within a subgroup (the *_sg shader variants).
  bool subgroup_shuffle() const { return info_.subgroup_shuffle; }
  // Whether pipelines made on this device can report their statistics (Create's capture_statistics).
  bool captures_statistics() const { return captures_statistics_; }
  // Whether the NAME_clock shader variants can run (Create's phase_clock; phase_clock.h).
  bool phase_clock() const { return phase_clock_; }
  // Whether the instance asked the loader for portability drivers too (VK_KHR_portability_
  // enumeration, wherever the loader has it): MoltenVK's devices are listed only then.
  bool portability_enumeration() const { return portability_enumeration_; }

  Result<Buffer> CreateBuffer(int64_t bytes, MemoryKind kind);
  // Every queue submission goes through here (the destructor then waits for the device).
  Status Submit(const VkSubmitInfo& submit, VkFence fence);
  // A VkResult of a queue or fence call as a Status; VK_ERROR_DEVICE_LOST marks the device lost.
  Status Check(const char* what, VkResult result);
  // The device reported VK_ERROR_DEVICE_LOST: nothing submitted to it runs any more, and every
  // later submission fails at once, as a driver's do.
  bool lost() const { return lost_; }
  // Fault injection (tests): the n-th submission from now reports the device lost.
  void LoseAtSubmission(int64_t n) { lose_at_submission_ = n; }
  // Fault injection (tests): device buffers (kDevice) fail to get device-local memory as on a
  // full device (VK_ERROR_OUT_OF_DEVICE_MEMORY) where they would bring the device-local bytes of
  // the device buffers alive above `bytes`; 0: no limit.
  void LimitDeviceLocalBytes(int64_t bytes) { device_local_limit_ = bytes; }
  // Whether device and host share one memory (an integrated GPU, or a driver on the CPU).
  bool unified_memory() const { return unified_memory_; }
  const VkPhysicalDeviceMemoryProperties& memory_properties() const { return memory_; }
  // Bytes of device-local memory the device buffers (kDevice) alive hold.
  int64_t device_local_bytes() const { return device_local_bytes_; }
  // Buffers of this context destroyed so far: descriptor sets that name buffers stay valid
  // while it does not change (Recorder caches them on that condition).
  uint64_t buffer_epoch() const { return destroyed_buffers_; }

 private:
  Context() = default;
  Status Init(int index, bool integer_dot, bool capture_statistics, bool phase_clock);

  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkPhysicalDeviceMemoryProperties memory_{};
  DeviceLimits limits_;
  VulkanDeviceInfo info_;
  bool integer_dot_ = false;
  bool captures_statistics_ = false;
  bool phase_clock_ = false;
  bool portability_enumeration_ = false;
  bool unified_memory_ = false;
  bool told_host_memory_ = false;  // the log has said that device buffers went to host memory
  int64_t device_local_bytes_ = 0;  // of the device buffers alive
  int64_t device_local_limit_ = 0;  // LimitDeviceLocalBytes; 0: none
  bool submitted_ = false;  // anything was submitted to the queue
  bool lost_ = false;
  int64_t lose_at_submission_ = 0;  // LoseAtSubmission's countdown; 0: none
  uint64_t destroyed_buffers_ = 0;  // the buffer epoch; the engine thread alone makes and frees buffers
};

// "what failed: VK_ERROR_..." as a Status (Internal, or ResourceExhausted for out-of-memory).
Status VkError(const std::string& what, VkResult result);

}  // namespace kvfs::vk
