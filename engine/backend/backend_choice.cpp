// The backend a user asked for, with the CPU as the fallback when there is no Vulkan device.
#include <spdlog/fmt/fmt.h>

#include "engine/backend/backend.h"

namespace kvfs {

Result<ChosenBackend> MakeRequestedBackend(const Model& model, const BackendRequest& request) {
  ChosenBackend out;
  if (request.vulkan) {
    auto devices = ListVulkanDevices();
    if (!devices.ok()) {
      out.warning = devices.status().message() + "; running on the CPU";
    } else {
      if (request.device >= static_cast<int>(devices->size())) {
        return InvalidArgument(fmt::format("no Vulkan device {} (there are {}; see kvfs devices)", request.device,
                                           devices->size()));
      }
      const VulkanOptions options{.device = request.device,
                                  .profile = request.profile,
                                  .fuse_ops = request.fuse_ops,
                                  .split_weight_rows = request.split_weight_rows,
                                  .attention_split = request.attention_split,
                                  .fuse_softmax = request.fuse_softmax,
                                  .swiglu_in_matvec = request.swiglu_in_matvec,
                                  .stack_matrices = request.stack_matrices,
                                  .batch_attention = request.batch_attention,
                                  .subgroup_trees = request.subgroup_trees,
                                  .matvec = request.matvec};
      KVFS_ASSIGN_OR_RETURN(out.backend, MakeVulkanBackend(model, options));
      for (const VulkanDeviceInfo& d : *devices) {
        if (request.device >= 0 ? d.index == request.device : d.is_default) out.name = "vulkan: " + d.name;
      }
      return out;
    }
  }
  out.backend = MakeCpuBackend(model, request.cpu);
  out.name = "cpu";
  return out;
}

}  // namespace kvfs
