// kvfs devices: the Vulkan devices the backend can run on (the index is what --device takes).
#include <cstdio>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "engine/backend/backend.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace kvfs::cli {

int Devices(int argc, char** argv) {
  Args args(argc, argv, {}, {"--json", "-h", "--help"});
  if (args.has("-h") || args.has("--help")) {
    std::fputs("usage: kvfs devices [--json]\n  lists the Vulkan devices; --device N of run and bench picks one\n",
               stdout);
    return 0;
  }
  if (!args.error().empty()) {
    std::fprintf(stderr, "kvfs devices: %s\n", args.error().c_str());
    return 2;
  }
  auto devices = ListVulkanDevices();
  if (!devices.ok()) {
    std::fprintf(stderr, "kvfs devices: %s\n", devices.status().message().c_str());
    // Scripts that read the list get one, empty, where there is no device (still exit 1).
    if (args.has("--json") && devices.status().code() == StatusCode::kNotFound) std::printf("[]\n");
    return 1;
  }
  if (args.has("--json")) {
    nlohmann::json j = nlohmann::json::array();
    for (const VulkanDeviceInfo& d : *devices) {
      j.push_back({{"index", d.index}, {"name", d.name}, {"type", d.type}, {"vulkan", d.api_version},
                   {"memory_bytes", d.memory_bytes}, {"max_binding_bytes", d.max_binding_bytes},
                   {"shared_memory_bytes", d.shared_memory_bytes}, {"subgroup_size", d.subgroup_size},
                   {"subgroup_shuffle", d.subgroup_shuffle}, {"portability", d.portability},
                   {"default", d.is_default}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  for (const VulkanDeviceInfo& d : *devices) {
    fmt::print("{}  {}  ({}, Vulkan {}, {:.1f} GiB, bindings up to {:.0f} MiB, subgroup {}{}{}){}\n", d.index,
               d.name, d.type, d.api_version, d.memory_bytes / 1073741824.0, d.max_binding_bytes / 1048576.0,
               d.subgroup_size, d.subgroup_shuffle ? " with shuffles" : "", d.portability ? ", portability driver" : "",
               d.is_default ? "  [default]" : "");
  }
  return 0;
}

}  // namespace kvfs::cli
