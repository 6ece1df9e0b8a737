// The Vulkan entry points of a build configured with -DKVFS_VULKAN=OFF.
#include "engine/backend/backend.h"
#include "engine/backend/vulkan_dispatch_cost.h"
#include "engine/backend/vulkan_shaders.h"

namespace kvfs {

namespace {
Status NoVulkan() { return Unsupported("this kvfs was built without the Vulkan backend (-DKVFS_VULKAN=OFF)"); }
}  // namespace

Result<std::vector<VulkanDeviceInfo>> ListVulkanDevices() { return NoVulkan(); }

Result<std::unique_ptr<Backend>> MakeVulkanBackend(const Model&, const VulkanOptions&) { return NoVulkan(); }
Result<std::vector<uint8_t>> VulkanReadBlockCopy(Backend&, uint64_t) { return NoVulkan(); }
Result<std::vector<uint8_t>> VulkanForgetAndReadSlot(Backend&, uint64_t) { return NoVulkan(); }
Status VulkanLoseDevice(Backend&, int64_t) { return NoVulkan(); }
Result<ShaderReport> VulkanShaderReport(const Model&, const ShaderReportOptions&) { return NoVulkan(); }
Result<DispatchCost> MeasureVulkanDispatchCost(const DispatchCostOptions&) { return NoVulkan(); }

}  // namespace kvfs
