// Engine: the AgentEngine that runs the model. It owns the model, the backend, the KV block
// pool and the cache store; one engine thread runs every forward pass (turns of all agents,
// batched), a store thread writes committed blocks and manifests, and a loader thread reads
// cold agents' blocks back into the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/core/status.h"
#include "engine/runtime/agent_engine.h"

namespace kvfs {

namespace store {
class FileSystem;
}  // namespace store
class Backend;
class Model;

struct EngineOptions {
  std::string model_path;
  std::string store_dir;          // empty: nothing persisted (tests, benchmarks)
  int n_threads = 2;
  std::string kv = "q4k";          // KV format of new agents: f16 | q8 | q4 | q4k
  std::string kv_rotate;          // "" (format default) | "on" | "off"
  int64_t kv_budget_bytes = 0;    // memory for KV blocks; 0: a quarter of the machine's RAM
  // Zeroed, pre-faulted memory for KV blocks of the default format, made ready in the
  // background at start (the pool's free list, inside the budget), so the first reloads and
  // prefills do not fault page by page; at most one full context (n_ctx tokens) of blocks.
  // -1: min(budget / 16, 64 MiB); 0: none.
  int64_t kv_reserve_bytes = -1;
  int64_t block_tokens = 256;     // tokens per KV block
  int64_t n_ctx = 0;              // context length per agent; 0: the model's, at most 32768
  size_t max_queued_turns = 8;    // per agent, the running one included
  std::string backend = "cpu";    // where forward passes run: cpu | vulkan (falls back to the
                                  // CPU with a warning when there is no Vulkan device)
  int device = -1;                // Vulkan device index (kvfs devices); -1: the default one
  int64_t kv_device_bytes = 0;    // Vulkan: device memory for copies of KV blocks; 0: a quarter
                                  // of the device's (steps over it run on the CPU)
  std::string vulkan_tuning;      // Vulkan: a file of kvfs tune's (used when made for this device
                                  // and model); empty: the default settings
  // Run the backend over scratch sequences of the shapes turns start with, in the default KV
  // format and in those of the restored agents, when it makes kernels on first use (Vulkan:
  // backend/warm_up.h), so that turns do not wait for the driver's compiler. Pass by pass while
  // the engine has no turn to run: turns go first.
  bool warm_up = true;
  // The file system under store_dir; null: the real one. Tests pass a fault-injecting one
  // (store/fault_fs.h); it must outlive the engine.
  store::FileSystem* file_system = nullptr;
  // Makes the backend; empty: the one `backend` and `device` name. Tests pass their own (a
  // scripted device behind a FallbackBackend).
  std::function<Result<std::unique_ptr<Backend>>(const Model&)> make_backend;
};

// Loads the model, opens (and repairs) the store and restores its agents, starts the threads.
Result<std::unique_ptr<AgentEngine>> CreateEngine(const EngineOptions& options);

}  // namespace kvfs
