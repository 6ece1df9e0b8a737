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
  c.tuning_file = args.get("--tuning").value_or("");
  // As kvfsd's --vulkan-tuning: settings of a device, which a CPU run would silently ignore.
  if (!c.tuning_file.empty() && !c.vulkan) args.set_error("--tuning is for --backend vulkan");
  if (args.has("--device") && !c.vulkan) args.set_error("--device is for --backend vulkan");
  return c;
}

void RefuseVulkanOnlyOptions(Args& args, const BackendChoice& choice, std::initializer_list<const char*> names) {
  if (choice.vulkan) return;
  for (const char* name : names)
    if (args.has(name)) return args.set_error(fmt::format("{} is for --backend vulkan", name));
}

Result<std::unique_ptr<Backend>> MakeChosenBackend(const Model& model, const BackendChoice& choice,
                                                   const std::string& command, std::string* used) {
  KVFS_ASSIGN_OR_RETURN(ChosenBackend chosen, MakeRequestedBackend(model, choice));
  if (!chosen.warning.empty()) std::fprintf(stderr, "kvfs %s: warning: %s\n", command.c_str(), chosen.warning.c_str());
  *used = chosen.name;
  return std::move(chosen.backend);
}

}  // namespace kvfs::cli
