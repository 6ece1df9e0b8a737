// The backend a user asked for, with the CPU as the fallback when there is no Vulkan device.
#include <spdlog/fmt/fmt.h>

#include "engine/backend/backend.h"
#include "engine/backend/fallback_backend.h"
#include "engine/backend/vulkan_tuning.h"

namespace kvfs {

bool IsOutOfDeviceMemory(const Status& status) {
  return status.code() == StatusCode::kUnavailable &&
         status.message().find("VK_ERROR_OUT_OF_DEVICE_MEMORY") != std::string::npos;
}

Status Backend::SetVulkanTuning(const VulkanTuning&) {
  return Unsupported(fmt::format("the {} backend has no Vulkan tuning", name()));
}

const VulkanDeviceInfo* SameVulkanDevice(const std::vector<VulkanDeviceInfo>& devices, int index,
                                         const std::string& name) {
  const VulkanDeviceInfo* same = nullptr;
  for (const VulkanDeviceInfo& d : devices) {
    if (d.name == name && (same == nullptr || d.index == index)) same = &d;
  }
  return same;
}

const VulkanDeviceInfo* ChosenVulkanDevice(const std::vector<VulkanDeviceInfo>& devices, int device) {
  for (const VulkanDeviceInfo& d : devices) {
    if (device >= 0 ? d.index == device : d.is_default) return &d;
  }
  return nullptr;
}

namespace {

// The device lost, made again: found by its name, at its old index if that still has it.
// Indices may shift, and the default may now be another device (a GPU that fell off the bus
// leaves an integrated GPU or lavapipe, slower than the CPU backend): those are failed tries.
Result<std::unique_ptr<Backend>> MakeSameVulkanDevice(const Model& model, VulkanOptions options, int index,
                                                      const std::string& name) {
  if (!name.empty()) {
    KVFS_ASSIGN_OR_RETURN(std::vector<VulkanDeviceInfo> devices, ListVulkanDevices());
    const VulkanDeviceInfo* same = SameVulkanDevice(devices, index, name);
    if (same == nullptr) return Unavailable(fmt::format("the Vulkan device {} is no longer listed", name));
    options.device = same->index;
  }
  return MakeVulkanBackend(model, options);
}

}  // namespace

Result<ChosenBackend> MakeRequestedBackend(const Model& model, const BackendRequest& request) {
  ChosenBackend out;
  if (request.vulkan) {
    // A bad tuning file is an error even when no device would use it: the user named it.
    std::optional<TuningRecord> tuning_record;
    if (!request.tuning_file.empty()) {
      KVFS_ASSIGN_OR_RETURN(tuning_record, ReadTuningFile(request.tuning_file));
    }
    auto devices = ListVulkanDevices();
    if (!devices.ok()) {
      // Without cpu_fallback (benchmarks) the CPU would give figures that are not the device's.
      if (!request.cpu_fallback) return Unavailable(devices.status().message());
      // A device named by its index is no fallback case: it does not exist.
      if (request.device >= 0)
        return InvalidArgument(fmt::format("no Vulkan device {} ({}; see kvfs devices)", request.device,
                                           devices.status().message()));
      out.warning = devices.status().message() + "; running on the CPU";
    } else {
      if (request.device >= static_cast<int>(devices->size())) {
        return InvalidArgument(fmt::format("no Vulkan device {} (there are {}; see kvfs devices)", request.device,
                                           devices->size()));
      }
      const VulkanDeviceInfo* chosen = ChosenVulkanDevice(*devices, request.device);
      VulkanTuning tuning = request.tuning;
      if (tuning_record.has_value()) {
        std::string why;
        const std::string device_name = chosen != nullptr ? chosen->name : "";
        if (std::optional<VulkanTuning> t = TuningFor(*tuning_record, device_name, model, &why)) {
          tuning = *t;
          out.tuned = true;
        } else {
          out.warning = fmt::format("tuning file {} not used: {}; run kvfs tune for this device and model",
                                    request.tuning_file, why);
        }
      }
      const VulkanOptions options{.device = request.device,
                                  .kv_device_bytes = request.kv_device_bytes,
                                  .profile = request.profile,
                                  .phase_clock = request.phase_clock,
                                  .fuse_ops = request.fuse_ops,
                                  .split_weight_rows = request.split_weight_rows,
                                  .stack_matrices = request.stack_matrices,
                                  .batch_attention = request.batch_attention,
                                  .query_tiles = request.query_tiles,
                                  .merge_sequences = request.merge_sequences,
                                  .kv_rows_by_kv_store = request.kv_rows_by_kv_store,
                                  .contract_floats = request.contract_floats,
                                  .batch_invariant = request.batch_invariant,
                                  .tuning = tuning,
                                  .device_local_limit = request.device_local_limit};
      Result<std::unique_ptr<Backend>> made = MakeVulkanBackend(model, options);
      // A model larger than the device's memory runs on the CPU, where passes may fall back (a
      // device lost while being made stays an error: the device itself needs looking at).
      if (!made.ok() && IsOutOfDeviceMemory(made.status()) && request.cpu_fallback) {
        out.warning = (out.warning.empty() ? "" : out.warning + "; ") + made.status().message() + "; running on the CPU";
        out.backend = MakeCpuBackend(model, request.cpu);
        out.name = "cpu";
        out.tuned = false;
        return out;
      }
      // A setting the device cannot run, from a tuning file: the file is what to fix.
      if (!made.ok() && out.tuned &&
          (made.status().code() == StatusCode::kUnsupported || made.status().code() == StatusCode::kInvalidArgument))
        return made.status().WithContext("tuning file " + request.tuning_file);
      KVFS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> device, std::move(made));
      // What the device cannot run (KV over its budget, a full or lost device) runs on the CPU.
      // A lost device is made again (the same device and options) once the wait is over.
      if (request.cpu_fallback) {
        DeviceRecovery recovery;
        recovery.make = [&model, options, index = chosen != nullptr ? chosen->index : request.device,
                         name = chosen != nullptr ? chosen->name : std::string()]() -> Result<std::unique_ptr<Backend>> {
          return MakeSameVulkanDevice(model, options, index, name);
        };
        out.backend = std::make_unique<FallbackBackend>(model, std::move(device), request.cpu, std::move(recovery));
      } else {
        out.backend = std::move(device);
      }
      if (chosen != nullptr) out.name = "vulkan: " + chosen->name;
      return out;
    }
  }
  out.backend = MakeCpuBackend(model, request.cpu);
  out.name = "cpu";
  return out;
}

}  // namespace kvfs
