#include "tools/backend_choice.h"

#include <cstdio>

#include <spdlog/fmt/fmt.h>

namespace kvfs::cli {

BackendChoice ReadBackendChoice(Args& args, int n_threads) {
  BackendChoice c;
  c.cpu.n_threads = n_threads;
  const std::string backend = args.get("--backend").value_or("cpu");
  if (backend == "vulkan") {
    c.vulkan = true;
  } else if (backend != "cpu") {
    args.set_error(fmt::format("--backend must be cpu or vulkan, not '{}'", backend));
  }
  c.device = static_cast<int>(args.get_int("--device", -1, 0, 1 << 16));
  return c;
}

Result<std::unique_ptr<Backend>> MakeChosenBackend(const Model& model, const BackendChoice& choice,
                                                   const std::string& command, std::string* used) {
  if (choice.vulkan) {
    auto devices = ListVulkanDevices();
    if (!devices.ok()) {
      std::fprintf(stderr, "kvfs %s: warning: %s; running on the CPU\n", command.c_str(),
                   devices.status().message().c_str());
    } else {
      if (choice.device >= static_cast<int>(devices->size())) {
        return InvalidArgument(fmt::format("no Vulkan device {} (there are {}; see kvfs devices)", choice.device,
                                           devices->size()));
      }
      KVFS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeVulkanBackend(model, VulkanOptions{choice.device}));
      for (const VulkanDeviceInfo& d : *devices) {
        if (choice.device >= 0 ? d.index == choice.device : d.is_default) *used = "vulkan: " + d.name;
      }
      return backend;
    }
  }
  *used = "cpu";
  return MakeCpuBackend(model, choice.cpu);
}

}  // namespace kvfs::cli
