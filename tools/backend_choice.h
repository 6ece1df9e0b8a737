// --backend cpu|vulkan and --device N, shared by kvfs run, bench and perplexity.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include "engine/backend/backend.h"
#include "tools/args.h"

namespace kvfs::cli {

inline constexpr const char* kBackendUsage =
    "  --backend cpu|vulkan  where the forward pass runs (default cpu); without a Vulkan device,\n"
    "                      run and perplexity fall back to the CPU with a warning, benchmarks fail\n"
    "  --device N          Vulkan device index (see kvfs devices; default: the first GPU)\n"
    "  --tuning FILE       Vulkan: the settings kvfs tune found for this device and model (a\n"
    "                      file made for another device or model is ignored with a warning)\n";

using BackendChoice = BackendRequest;

// Reads --backend, --device and --tuning; a bad value is recorded in args.error().
BackendChoice ReadBackendChoice(Args& args, int n_threads);
// Options that only the Vulkan backend reads: given with --backend cpu, an argument error (the
// run would ignore them, and their values would go unchecked).
void RefuseVulkanOnlyOptions(Args& args, const BackendChoice& choice, std::initializer_list<const char*> names);

// The chosen backend; `used` says which one runs ("cpu", or "vulkan: DEVICE NAME"). Without a
// Vulkan device (or in a build without Vulkan) a vulkan choice warns on stderr and gives the
// CPU backend, unless choice.cpu_fallback is off (benchmarks: then an error); a model the
// Vulkan backend cannot run, or a device index that does not exist, is an error.
Result<std::unique_ptr<Backend>> MakeChosenBackend(const Model& model, const BackendChoice& choice,
                                                   const std::string& command, std::string* used);

}  // namespace kvfs::cli
