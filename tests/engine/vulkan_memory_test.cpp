// Where the Vulkan backend's buffers live, and what happens when the device's memory is full:
// the memory types a buffer tries in order (against the tables of real kinds of device), the
// device-local bytes in use, and a model larger than the device, which runs on the CPU.
#if defined(KVFS_VULKAN)

#include <string>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/vulkan/vk_context.h"
#include "engine/model/model.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

constexpr VkMemoryPropertyFlags kLocal = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
constexpr VkMemoryPropertyFlags kHost = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
constexpr VkMemoryPropertyFlags kCached = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;

VkPhysicalDeviceMemoryProperties Table(std::initializer_list<VkMemoryPropertyFlags> types) {
  VkPhysicalDeviceMemoryProperties m{};
  m.memoryHeapCount = 2;
  m.memoryHeaps[0] = {512ull << 20, VK_MEMORY_HEAP_DEVICE_LOCAL_BIT};
  m.memoryHeaps[1] = {16ull << 30, 0};
  for (VkMemoryPropertyFlags flags : types) {
    m.memoryTypes[m.memoryTypeCount++] = {flags, (flags & kLocal) != 0 ? 0u : 1u};
  }
  return m;
}

using Order = std::vector<uint32_t>;
using vk::MemoryKind;
using vk::MemoryTypeOrder;

// An AMD APU as RADV lists it: a small device-local carve-out (plain, and host-visible) and the
// host's memory (uncached and cached). Unified: device buffers go to host memory once the
// carve-out is full; as a discrete GPU's they would not.
TEST(VulkanMemoryTypes, UnifiedMemoryTakesHostMemoryWhenDeviceLocalIsFull) {
  const auto apu = Table({kLocal, kHost, kLocal | kHost, kHost | kCached});
  EXPECT_EQ(MemoryTypeOrder(apu, 0xF, MemoryKind::kDevice, true), (Order{0, 2, 1, 3}));
  EXPECT_EQ(MemoryTypeOrder(apu, 0xF, MemoryKind::kDevice, false), (Order{0, 2}));
  EXPECT_EQ(MemoryTypeOrder(apu, 0xF, MemoryKind::kDeviceUpload, true), (Order{2, 1, 3}));
  EXPECT_EQ(MemoryTypeOrder(apu, 0xF, MemoryKind::kUpload, true), (Order{1, 2, 3}));
  EXPECT_EQ(MemoryTypeOrder(apu, 0xF, MemoryKind::kReadback, true), (Order{3, 1, 2}));
  // Only the types the buffer allows (VkMemoryRequirements::memoryTypeBits).
  EXPECT_EQ(MemoryTypeOrder(apu, 0b0101, MemoryKind::kDevice, true), (Order{0, 2}));
  EXPECT_EQ(MemoryTypeOrder(apu, 0b0011, MemoryKind::kDevice, true), (Order{0, 1}));
}

// A discrete GPU: VRAM, host memory, and a 256 MiB BAR (device-local and host-visible). Device
// buffers never leave VRAM; host-written tables try the BAR first, then host memory; a buffer
// that cannot be device-local at all takes what it can, as before.
TEST(VulkanMemoryTypes, DiscreteGpuKeepsDeviceBuffersInItsMemory) {
  const auto gpu = Table({kLocal, kHost, kHost | kCached, kLocal | kHost});
  EXPECT_EQ(MemoryTypeOrder(gpu, 0xF, MemoryKind::kDevice, false), (Order{0, 3}));
  EXPECT_EQ(MemoryTypeOrder(gpu, 0xF, MemoryKind::kDeviceUpload, false), (Order{3, 1, 2}));
  EXPECT_EQ(MemoryTypeOrder(gpu, 0xF, MemoryKind::kReadback, false), (Order{2, 1, 3}));
  EXPECT_EQ(MemoryTypeOrder(gpu, 0b0110, MemoryKind::kDevice, false), (Order{1, 2}));
  // No host-visible type allowed: nothing for the host's buffers (CreateBuffer says so).
  EXPECT_TRUE(MemoryTypeOrder(gpu, 0b0001, MemoryKind::kUpload, false).empty());
}

// Whether device buffers on `c` have a host memory type to go to once device-local memory is
// full (a unified-memory device with such a type).
bool DeviceBuffersCanTakeHostMemory(const vk::Context& c) {
  for (uint32_t t : MemoryTypeOrder(c.memory_properties(), ~0u, MemoryKind::kDevice, c.unified_memory())) {
    if ((c.memory_properties().memoryTypes[t].propertyFlags & kLocal) == 0) return true;
  }
  return false;
}

// The device-local bytes in use go up and down with the buffers; an allocation over the limit
// fails as a full device's would (Unavailable, so a pass runs on the CPU), unless the device is
// unified and has host memory to take instead.
TEST(VulkanMemory, DeviceLocalBytesFollowTheBuffers) {
  auto ctx = vk::Context::Create(-1);
  KVFS_REQUIRE_VULKAN(ctx.status());
  vk::Context& c = **ctx;
  c.LimitDeviceLocalBytes(1 << 20);
  const bool host_instead = DeviceBuffersCanTakeHostMemory(c);
  EXPECT_EQ(c.device_local_bytes(), 0);
  auto a = c.CreateBuffer(768 << 10, MemoryKind::kDevice);
  ASSERT_TRUE(a.ok()) << a.status().message();
  const int64_t a_bytes = c.device_local_bytes();  // (the allocation may be rounded up)
  EXPECT_GE(a_bytes, 768 << 10);
  auto staging = c.CreateBuffer(512 << 10, MemoryKind::kUpload);  // not a device buffer: not counted
  ASSERT_TRUE(staging.ok()) << staging.status().message();
  EXPECT_EQ(c.device_local_bytes(), a_bytes);
  {
    auto b = c.CreateBuffer(512 << 10, MemoryKind::kDevice);
    if (host_instead) {
      EXPECT_TRUE(b.ok()) << b.status().message();
      EXPECT_EQ(c.device_local_bytes(), a_bytes);  // it went to host memory
    } else {
      ASSERT_FALSE(b.ok());
      EXPECT_EQ(b.status().code(), StatusCode::kUnavailable) << b.status().message();
      EXPECT_NE(b.status().message().find("VK_ERROR_OUT_OF_DEVICE_MEMORY"), std::string::npos);
    }
  }
  EXPECT_EQ(c.device_local_bytes(), a_bytes);  // the failed one left nothing counted
  vk::Buffer moved = std::move(*a);  // the count moves with the buffer
  EXPECT_EQ(c.device_local_bytes(), a_bytes);
  moved = vk::Buffer();  // its 768 KiB freed
  EXPECT_EQ(c.device_local_bytes(), 0);
  auto b = c.CreateBuffer(512 << 10, MemoryKind::kDevice);
  EXPECT_TRUE(b.ok()) << b.status().message();
  auto d = c.CreateBuffer(256 << 10, MemoryKind::kDevice);  // 768 KiB in use: within the limit
  EXPECT_TRUE(d.ok()) << d.status().message();
}

// A lost device is Unavailable too, but it is not a model too large for the device: no quiet
// fallback to the CPU for it.
TEST(VulkanMemory, OnlyOutOfDeviceMemoryCountsAsTooLarge) {
  EXPECT_TRUE(IsOutOfDeviceMemory(vk::VkError("allocating 64 bytes of device memory", VK_ERROR_OUT_OF_DEVICE_MEMORY)));
  EXPECT_FALSE(IsOutOfDeviceMemory(vk::VkError("vkQueueSubmit", VK_ERROR_DEVICE_LOST)));
  EXPECT_FALSE(IsOutOfDeviceMemory(vk::VkError("vkAllocateMemory", VK_ERROR_OUT_OF_HOST_MEMORY)));
  EXPECT_FALSE(IsOutOfDeviceMemory(Status::Ok()));
}

// A model whose weights do not fit in the device's memory: MakeVulkanBackend says so
// (Unavailable, with the sizes and the device), and a request that may fall back runs on the
// CPU with that warning; a benchmark's request (no fallback) gets the error.
TEST(VulkanMemory, ModelLargerThanTheDeviceRunsOnTheCpu) {
  const std::string path = testing::TestModelsDir() + "/tiny-llama-Q4_0.gguf";
  KVFS_REQUIRE_DATA(path);
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto ctx = vk::Context::Create(-1);
  KVFS_REQUIRE_VULKAN(ctx.status());
  if (DeviceBuffersCanTakeHostMemory(**ctx)) {
    GTEST_SKIP() << "this unified-memory device has host memory for the weights: they would fit";
  }
  const std::string device_name = (*ctx)->info().name;
  ctx->reset();

  VulkanOptions options;
  options.device_local_limit = 64 << 10;  // far below the weights
  auto made = MakeVulkanBackend(**model, options);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kUnavailable) << made.status().message();
  EXPECT_NE(made.status().message().find("do not fit in the memory of " + device_name), std::string::npos)
      << made.status().message();

  BackendRequest request;
  request.vulkan = true;
  request.device_local_limit = 64 << 10;
  auto chosen = MakeRequestedBackend(**model, request);
  ASSERT_TRUE(chosen.ok()) << chosen.status().message();
  EXPECT_EQ(chosen->name, "cpu");
  EXPECT_NE(chosen->warning.find("do not fit"), std::string::npos) << chosen->warning;
  EXPECT_NE(chosen->warning.find("running on the CPU"), std::string::npos) << chosen->warning;
  EXPECT_STREQ(chosen->backend->name(), MakeCpuBackend(**model, request.cpu)->name());

  request.cpu_fallback = false;
  auto strict = MakeRequestedBackend(**model, request);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.status().code(), StatusCode::kUnavailable);

  request.device_local_limit = 0;  // and with the device's whole memory, the device
  request.cpu_fallback = true;
  auto fits = MakeRequestedBackend(**model, request);
  ASSERT_TRUE(fits.ok()) << fits.status().message();
  EXPECT_EQ(fits->name, "vulkan: " + device_name);
  EXPECT_TRUE(fits->warning.empty()) << fits->warning;
}

}  // namespace
}  // namespace kvfs

#endif  // KVFS_VULKAN
