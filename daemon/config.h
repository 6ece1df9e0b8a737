// kvfsd's settings: defaults, then a JSON config file (--config), then the command line.
// Unknown keys or options and bad values are refused with a message naming them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace kvfs::daemon {

struct DaemonConfig {
  std::string model_path;        // empty: the default model (FindDefaultModel)
  std::string mountpoint;        // required
  std::string store_dir;         // empty: DefaultStoreDir()
  int threads = 0;               // engine threads; 0: all hardware threads
  std::string kv;                // KV format of new agents: f16 | q8 | q4 | q4k; "": q4k (q4 on
                                 // vulkan or with blocks that are not a multiple of 64 tokens)
  int64_t kv_budget_bytes = 0;   // memory for KV blocks; 0: the engine's default (a quarter of RAM)
  int64_t context_tokens = 0;    // per agent; 0: the model's (at most 32768)
  int64_t block_tokens = 256;
  int64_t max_queued_turns = 8;  // per agent; more: EAGAIN at the prompt's close
  int64_t max_prompt_bytes = 1 << 20;
  int fuse_threads = 64;         // most FUSE requests served at once (blocked readers hold one each)
  std::string backend = "cpu";   // cpu | vulkan (CPU fallback with a warning without a device)
  int device = -1;               // Vulkan device index; -1: the default one
  int64_t kv_device_budget_bytes = 0;  // Vulkan: device memory for KV copies; 0: a quarter of the device's
  std::string vulkan_tuning;     // kvfs tune's file for this device and model; empty: defaults
  bool foreground = false;
  std::string log_level = "info";
  std::string log_file;          // background mode; empty: <store>/kvfsd.log
  bool help = false;
};

// What the defaults depend on.
struct Environment {
  uint32_t uid = 0;
  std::string home;           // $HOME
  std::string xdg_data_home;  // $XDG_DATA_HOME
  std::string kvfs_model;     // $KVFS_MODEL
  std::string exe_path;       // this executable (/proc/self/exe)
  static Environment FromProcess();
};

// Parses argv (argv[0] is the program). Reads the --config file when given.
Result<DaemonConfig> ParseDaemonArgs(const std::vector<std::string>& args);
// Applies a config file's JSON on top of `config` (strict).
Status ApplyConfigJson(std::string_view json_text, DaemonConfig& config);
// "1048576", "512K", "64M", "2G", "1T" (powers of 1024).
Result<int64_t> ParseByteSize(std::string_view text);

// $XDG_DATA_HOME/kvfs, else $HOME/.local/share/kvfs; /var/lib/kvfs for root.
std::string DefaultStoreDir(const Environment& env);
// -m absent: $KVFS_MODEL, else models/default.gguf in the executable's directory or one of its
// three parents (a build tree inside the checkout that scripts/setup.sh set up), else
// <store>/models/default.gguf.
std::optional<std::string> FindDefaultModel(const Environment& env, const std::string& store_dir);
// Fills model_path and store_dir defaults; checks the model exists.
Status ResolveDefaults(DaemonConfig& config, const Environment& env);

std::string DaemonUsage();

}  // namespace kvfs::daemon
