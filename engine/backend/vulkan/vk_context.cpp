#include "engine/backend/vulkan/vk_context.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

namespace kvfs::vk {

namespace {

constexpr uint32_t kMinApiVersion = VK_API_VERSION_1_1;

// Owns a VkInstance for the span of a scope (device listing, or until Context takes it).
struct ScopedInstance {
  VkInstance instance = VK_NULL_HANDLE;
  bool portability_enumeration = false;  // portability drivers are listed too
  ~ScopedInstance() {
    if (instance != VK_NULL_HANDLE) vkDestroyInstance(instance, nullptr);
  }
  VkInstance Release() { return std::exchange(instance, VK_NULL_HANDLE); }
};

// Portability drivers (MoltenVK: Vulkan over Apple's Metal) are listed by loaders since 1.3.216
// only to instances that enable VK_KHR_portability_enumeration and set its flag; a loader that
// lists the extension has it, and every other driver is listed as before.
constexpr const char* kPortabilityEnumeration = "VK_KHR_portability_enumeration";
// A portability driver's device extension: it must be enabled wherever the device lists it.
constexpr const char* kPortabilitySubset = "VK_KHR_portability_subset";

// Whether `enumerate` (a vkEnumerate*ExtensionProperties call: count, then properties) lists `name`.
template <typename Enumerate>
bool ListsExtension(Enumerate enumerate, const char* name) {
  uint32_t n = 0;
  if (enumerate(&n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkExtensionProperties> extensions(n);
  if (enumerate(&n, extensions.data()) != VK_SUCCESS) return false;
  for (uint32_t i = 0; i < n; ++i) {
    if (std::strcmp(extensions[i].extensionName, name) == 0) return true;
  }
  return false;
}

bool HasInstanceExtension(const char* name) {
  auto enumerate = [](uint32_t* n, VkExtensionProperties* p) {
    return vkEnumerateInstanceExtensionProperties(nullptr, n, p);
  };
  return ListsExtension(enumerate, name);
}

Status CreateInstance(ScopedInstance& out) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "kvfs";
  app.apiVersion = kMinApiVersion;
  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.pApplicationInfo = &app;
  out.portability_enumeration = HasInstanceExtension(kPortabilityEnumeration);
  if (out.portability_enumeration) {
    info.flags |= VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
    info.enabledExtensionCount = 1;
    info.ppEnabledExtensionNames = &kPortabilityEnumeration;
  }
  const VkResult r = vkCreateInstance(&info, nullptr, &out.instance);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED) {
    return NotFound("no Vulkan driver found (install a Vulkan ICD, e.g. mesa-vulkan-drivers)");
  }
  if (r != VK_SUCCESS) return VkError("vkCreateInstance", r);
  return Status::Ok();
}

Result<std::vector<VkPhysicalDevice>> PhysicalDevices(VkInstance instance) {
  uint32_t n = 0;
  VkResult r = vkEnumeratePhysicalDevices(instance, &n, nullptr);
  // The drivers installed found no hardware of theirs (e.g. Mesa's radeon driver without an
  // AMD GPU): as no device at all.
  if (r == VK_ERROR_INITIALIZATION_FAILED)
    return NotFound("no Vulkan device: the installed Vulkan drivers found no device of theirs "
                    "(vkEnumeratePhysicalDevices: VK_ERROR_INITIALIZATION_FAILED)");
  if (r != VK_SUCCESS) return VkError("vkEnumeratePhysicalDevices", r);
  std::vector<VkPhysicalDevice> devices(n);
  r = vkEnumeratePhysicalDevices(instance, &n, devices.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return VkError("vkEnumeratePhysicalDevices", r);
  devices.resize(n);
  if (devices.empty()) return NotFound("the Vulkan driver reports no device");
  return devices;
}

const char* TypeName(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

// Lower is preferred as the default device: real GPUs before software rasterizers.
int TypeRank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

bool HasDeviceExtension(VkPhysicalDevice device, const char* name) {
  auto enumerate = [device](uint32_t* n, VkExtensionProperties* p) {
    return vkEnumerateDeviceExtensionProperties(device, nullptr, n, p);
  };
  return ListsExtension(enumerate, name);
}

VulkanDeviceInfo Describe(VkPhysicalDevice device, int index) {
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &subgroup;
  vkGetPhysicalDeviceProperties2(device, &props);
  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(device, &memory);
  VulkanDeviceInfo info;
  info.index = index;
  info.name = props.properties.deviceName;
  info.type = TypeName(props.properties.deviceType);
  const uint32_t v = props.properties.apiVersion;
  info.api_version = fmt::format("{}.{}.{}", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v), VK_API_VERSION_PATCH(v));
  for (uint32_t i = 0; i < memory.memoryHeapCount; ++i) {
    if (memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      info.memory_bytes = std::max(info.memory_bytes, static_cast<int64_t>(memory.memoryHeaps[i].size));
    }
  }
  info.portability = HasDeviceExtension(device, kPortabilitySubset);
  info.max_binding_bytes = props.properties.limits.maxStorageBufferRange;
  info.shared_memory_bytes = props.properties.limits.maxComputeSharedMemorySize;
  info.subgroup_size = subgroup.subgroupSize;
  const VkSubgroupFeatureFlags shuffle = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_BIT;
  info.subgroup_shuffle = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                          (subgroup.supportedOperations & shuffle) == shuffle;
  return info;
}

// Index of the default device: the best-ranked type, first on ties, among Vulkan 1.1 devices.
int DefaultIndex(const std::vector<VkPhysicalDevice>& devices) {
  int best = -1, best_rank = 1 << 30;
  for (size_t i = 0; i < devices.size(); ++i) {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(devices[i], &props);
    if (props.apiVersion < kMinApiVersion) continue;
    if (TypeRank(props.deviceType) < best_rank) {
      best_rank = TypeRank(props.deviceType);
      best = static_cast<int>(i);
    }
  }
  return best;
}

Result<std::vector<VulkanDeviceInfo>> ListVulkanDevicesImpl() {
  ScopedInstance instance;
  KVFS_RETURN_IF_ERROR(CreateInstance(instance));
  KVFS_ASSIGN_OR_RETURN(std::vector<VkPhysicalDevice> devices, PhysicalDevices(instance.instance));
  const int default_index = DefaultIndex(devices);
  std::vector<VulkanDeviceInfo> out;
  for (size_t i = 0; i < devices.size(); ++i) {
    out.push_back(Describe(devices[i], static_cast<int>(i)));
    out.back().is_default = static_cast<int>(i) == default_index;
  }
  return out;
}

const char* VkResultName(VkResult result) {
  switch (result) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    default: return "VkResult";
  }
}
}  // namespace

// Device memory and a lost device are kUnavailable: the host state is the authoritative copy, so
// the pass can run on the CPU instead (FallbackBackend).
Status VkError(const std::string& what, VkResult result) {
  StatusCode code = StatusCode::kInternal;
  if (result == VK_ERROR_OUT_OF_DEVICE_MEMORY || result == VK_ERROR_DEVICE_LOST) code = StatusCode::kUnavailable;
  if (result == VK_ERROR_OUT_OF_HOST_MEMORY) code = StatusCode::kResourceExhausted;
  return Status(code, fmt::format("{} failed: {} ({})", what, VkResultName(result), static_cast<int>(result)));
}

Status Context::Submit(const VkSubmitInfo& submit, VkFence fence) {
  if (lost_) return VkError("vkQueueSubmit", VK_ERROR_DEVICE_LOST);
  if (lose_at_submission_ > 0 && --lose_at_submission_ == 0) {
    lost_ = true;
    return VkError("vkQueueSubmit (injected fault)", VK_ERROR_DEVICE_LOST);
  }
  submitted_ = true;
  return Check("vkQueueSubmit", vkQueueSubmit(queue_, 1, &submit, fence));
}

Status Context::Check(const char* what, VkResult result) {
  if (result == VK_SUCCESS) return Status::Ok();
  if (result == VK_ERROR_DEVICE_LOST) lost_ = true;
  return VkError(what, result);
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = std::exchange(other.device_, VK_NULL_HANDLE);
    buffer_ = std::exchange(other.buffer_, VK_NULL_HANDLE);
    memory_ = std::exchange(other.memory_, VK_NULL_HANDLE);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_ = std::exchange(other.mapped_, nullptr);
    destroyed_ = std::exchange(other.destroyed_, nullptr);
    local_total_ = std::exchange(other.local_total_, nullptr);
    local_bytes_ = std::exchange(other.local_bytes_, 0);
  }
  return *this;
}

void Buffer::Reset() {
  if (device_ == VK_NULL_HANDLE) return;
  if (mapped_ != nullptr) vkUnmapMemory(device_, memory_);
  if (buffer_ != VK_NULL_HANDLE) vkDestroyBuffer(device_, buffer_, nullptr);
  if (memory_ != VK_NULL_HANDLE) vkFreeMemory(device_, memory_, nullptr);
  if (destroyed_ != nullptr) ++*destroyed_;
  if (local_total_ != nullptr) *local_total_ -= local_bytes_;
  local_total_ = nullptr;
  local_bytes_ = 0;
  device_ = VK_NULL_HANDLE;
  buffer_ = VK_NULL_HANDLE;
  memory_ = VK_NULL_HANDLE;
  bytes_ = 0;
  mapped_ = nullptr;
  destroyed_ = nullptr;
}

Result<std::unique_ptr<Context>> Context::Create(int index, bool integer_dot, bool capture_statistics,
                                                 bool phase_clock) {
  std::unique_ptr<Context> ctx(new Context());
  KVFS_RETURN_IF_ERROR(ctx->Init(index, integer_dot, capture_statistics, phase_clock));
  return ctx;
}

Status Context::Init(int index, bool integer_dot, bool capture_statistics, bool phase_clock) {
  ScopedInstance instance;
  KVFS_RETURN_IF_ERROR(CreateInstance(instance));
  KVFS_ASSIGN_OR_RETURN(std::vector<VkPhysicalDevice> devices, PhysicalDevices(instance.instance));
  if (index < 0) index = DefaultIndex(devices);
  if (index < 0) return NotFound("no Vulkan device supports Vulkan 1.1");
  if (index >= static_cast<int>(devices.size())) {
    return InvalidArgument(fmt::format("no Vulkan device {} (there are {}; see kvfs devices)", index, devices.size()));
  }
  physical_ = devices[index];
  info_ = Describe(physical_, index);
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(physical_, &props);
  unified_memory_ = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ||
                    props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  if (props.apiVersion < kMinApiVersion) {
    return Unsupported(fmt::format("Vulkan device {} ({}) only supports Vulkan {}; 1.1 is needed", index, info_.name,
                                   info_.api_version));
  }
  // One buffer is one allocation here, so a binding is also bounded by the allocation size.
  VkPhysicalDeviceMaintenance3Properties maintenance3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props2.pNext = &maintenance3;
  vkGetPhysicalDeviceProperties2(physical_, &props2);
  limits_.max_binding_bytes = std::min<int64_t>(props.limits.maxStorageBufferRange,
                                                static_cast<int64_t>(maintenance3.maxMemoryAllocationSize));
  limits_.max_shared_bytes = props.limits.maxComputeSharedMemorySize;
  std::copy(std::begin(props.limits.maxComputeWorkGroupCount), std::end(props.limits.maxComputeWorkGroupCount),
            limits_.max_group_count);
  limits_.max_group_invocations = props.limits.maxComputeWorkGroupInvocations;
  limits_.max_group_size_x = props.limits.maxComputeWorkGroupSize[0];
  limits_.max_storage_buffers = props.limits.maxPerStageDescriptorStorageBuffers;
  vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);

  uint32_t n_families = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n_families, nullptr);
  std::vector<VkQueueFamilyProperties> families(n_families);
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n_families, families.data());
  bool found = false;
  for (uint32_t i = 0; i < n_families && !found; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      queue_family_ = i;
      found = true;
    }
  }
  if (!found) return Unsupported(fmt::format("Vulkan device {} ({}) has no compute queue", index, info_.name));
  if (families[queue_family_].timestampValidBits > 0) limits_.timestamp_period_ns = props.limits.timestampPeriod;

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue_info{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue_info.queueFamilyIndex = queue_family_;
  queue_info.queueCount = 1;
  queue_info.pQueuePriorities = &priority;
  VkDeviceCreateInfo device_info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  device_info.queueCreateInfoCount = 1;
  device_info.pQueueCreateInfos = &queue_info;
  // Optional extensions: enabled, with their feature structure chained into device_info, when
  // wanted and the device has the extension and reports `feature` (a member of `features`) on.
  std::vector<const char*> extensions;
  VkBaseOutStructure* chain_tail = nullptr;
  auto enable_if = [&](bool wanted, const char* extension, auto& features, const VkBool32& feature) {
    if (!wanted || !HasDeviceExtension(physical_, extension)) return false;
    VkPhysicalDeviceFeatures2 query{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    query.pNext = &features;
    vkGetPhysicalDeviceFeatures2(physical_, &query);
    if (feature != VK_TRUE) return false;
    extensions.push_back(extension);
    auto* link = reinterpret_cast<VkBaseOutStructure*>(&features);
    link->pNext = nullptr;
    if (chain_tail == nullptr) {
      device_info.pNext = link;
    } else {
      chain_tail->pNext = link;
    }
    chain_tail = link;
    return true;
  };
  // The integer dot product through its extension (the instance asks for Vulkan 1.1, so the
  // 1.3 core feature is reached the same way on every device that lists it).
  VkPhysicalDeviceShaderIntegerDotProductFeatures dot_features{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
  integer_dot_ = enable_if(integer_dot, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME, dot_features,
                           dot_features.shaderIntegerDotProduct);
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR stats_features{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  captures_statistics_ = enable_if(capture_statistics, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME,
                                   stats_features, stats_features.pipelineExecutableInfo);
  // The shaders' clocks: realtime (device scope) and cycles (subgroup scope), both or neither.
  VkPhysicalDeviceShaderClockFeaturesKHR clock_features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR};
  phase_clock_ = enable_if(phase_clock, VK_KHR_SHADER_CLOCK_EXTENSION_NAME, clock_features,
                           clock_features.shaderDeviceClock) &&
                 clock_features.shaderSubgroupClock == VK_TRUE;
  if (info_.portability) extensions.push_back(kPortabilitySubset);  // required where listed
  device_info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  device_info.ppEnabledExtensionNames = extensions.data();
  const VkResult r = vkCreateDevice(physical_, &device_info, nullptr, &device_);
  if (r != VK_SUCCESS) return VkError(fmt::format("vkCreateDevice on {}", info_.name), r);
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  portability_enumeration_ = instance.portability_enumeration;
  instance_ = instance.Release();
  return Status::Ok();
}

Context::~Context() {
  if (device_ != VK_NULL_HANDLE) {
    // Only a device that ran something has anything to wait for; one that never did may be
    // unable to (RADV's null device, which kvfs shaders compiles on, crashes here).
    if (submitted_) vkDeviceWaitIdle(device_);
    vkDestroyDevice(device_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
}

std::vector<uint32_t> MemoryTypeOrder(const VkPhysicalDeviceMemoryProperties& memory, uint32_t allowed_types,
                                      MemoryKind kind, bool unified_memory) {
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  VkMemoryPropertyFlags required = 0, preferred = 0;
  switch (kind) {
    case MemoryKind::kDevice: preferred = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT; break;
    case MemoryKind::kUpload: required = host; break;
    case MemoryKind::kDeviceUpload: required = host; preferred = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT; break;
    case MemoryKind::kReadback: required = host; preferred = VK_MEMORY_PROPERTY_HOST_CACHED_BIT; break;
  }
  std::vector<uint32_t> best, rest;
  for (uint32_t i = 0; i < memory.memoryTypeCount && i < 32; ++i) {
    if (!(allowed_types & (1u << i))) continue;
    const VkMemoryPropertyFlags flags = memory.memoryTypes[i].propertyFlags;
    if ((flags & required) != required) continue;
    ((flags & preferred) == preferred ? best : rest).push_back(i);
  }
  // A discrete GPU's device buffers: device-local memory only, where it has any.
  if (kind == MemoryKind::kDevice && !unified_memory && !best.empty()) rest.clear();
  best.insert(best.end(), rest.begin(), rest.end());
  return best;
}

Result<Buffer> Context::CreateBuffer(int64_t bytes, MemoryKind kind) {
  Buffer b;
  b.device_ = device_;
  b.destroyed_ = &destroyed_buffers_;
  b.bytes_ = std::max<int64_t>(4, (bytes + 3) / 4 * 4);
  VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  info.size = static_cast<VkDeviceSize>(b.bytes_);
  info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkResult r = vkCreateBuffer(device_, &info, nullptr, &b.buffer_);
  if (r != VK_SUCCESS) return VkError(fmt::format("vkCreateBuffer of {} bytes", b.bytes_), r);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, b.buffer_, &req);
  const std::vector<uint32_t> types = MemoryTypeOrder(memory_, req.memoryTypeBits, kind, unified_memory_);
  if (types.empty()) {
    return Unsupported(kind == MemoryKind::kDevice ? "the Vulkan device has no memory type for a storage buffer"
                                                   : "the Vulkan device has no host-visible coherent memory");
  }
  // The next type when a heap is full (a small PCIe BAR, an APU's carve-out); any other error ends it.
  VkMemoryAllocateInfo alloc{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  alloc.allocationSize = req.size;
  r = VK_ERROR_OUT_OF_DEVICE_MEMORY;
  bool local = false;
  for (uint32_t type : types) {
    local = kind == MemoryKind::kDevice &&
            (memory_.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) != 0;
    if (local && device_local_limit_ > 0 &&
        device_local_bytes_ + static_cast<int64_t>(req.size) > device_local_limit_) {
      continue;  // (injected: as if the heap were full)
    }
    alloc.memoryTypeIndex = type;
    r = vkAllocateMemory(device_, &alloc, nullptr, &b.memory_);
    if (r == VK_SUCCESS) break;
    b.memory_ = VK_NULL_HANDLE;  // (undefined after a failure: Reset must not free it)
    if (r != VK_ERROR_OUT_OF_DEVICE_MEMORY) break;
  }
  if (r != VK_SUCCESS) return VkError(fmt::format("allocating {} bytes of device memory", req.size), r);
  if (local) {
    b.local_bytes_ = static_cast<int64_t>(req.size);
    b.local_total_ = &device_local_bytes_;
    device_local_bytes_ += b.local_bytes_;
  } else if (kind == MemoryKind::kDevice && unified_memory_ && !told_host_memory_) {
    told_host_memory_ = true;
    spdlog::info("vulkan: {}'s device-local memory is full: its buffers now go to host memory (unified memory, "
                 "the same RAM)",
                 info_.name);
  }
  r = vkBindBufferMemory(device_, b.buffer_, b.memory_, 0);
  if (r != VK_SUCCESS) return VkError("vkBindBufferMemory", r);
  if (kind != MemoryKind::kDevice) {
    void* p = nullptr;
    r = vkMapMemory(device_, b.memory_, 0, VK_WHOLE_SIZE, 0, &p);
    if (r != VK_SUCCESS) return VkError("vkMapMemory", r);
    b.mapped_ = static_cast<uint8_t*>(p);
  }
  return b;
}

}  // namespace kvfs::vk

namespace kvfs {

Result<std::vector<VulkanDeviceInfo>> ListVulkanDevices() { return vk::ListVulkanDevicesImpl(); }

}  // namespace kvfs
