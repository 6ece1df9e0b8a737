#include "daemon/config.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "engine/core/read_file.h"
#include "engine/core/strict_json.h"

namespace kvfs::daemon {

namespace {

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Result<int64_t> ParseInteger(std::string_view text, std::string_view what, int64_t lo, int64_t hi) {
  std::string s(text);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || *end != '\0' || v < lo || v > hi) {
    return InvalidArgument(fmt::format("{} must be an integer in [{}, {}], got '{}'", what, lo, hi, s));
  }
  return static_cast<int64_t>(v);
}

Status CheckKv(const std::string& kv, std::string_view what) {
  if (kv != "f16" && kv != "q8" && kv != "q4" && kv != "q4k")
    return InvalidArgument(fmt::format("{} must be f16, q8, q4 or q4k, got '{}'", what, kv));
  return Status::Ok();
}

Status CheckLogLevel(const std::string& level, std::string_view what) {
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (!kLevels.count(level)) {
    return InvalidArgument(fmt::format("{} must be one of trace, debug, info, warn, error, critical, off; got '{}'", what, level));
  }
  return Status::Ok();
}

// A setting given as a string (command line) or JSON (config file), applied by key. `key` is
// the config-file name; `what` names it in messages (the option or the key).
struct Setter {
  enum class Type { kString, kInt, kBytes, kBool } type;
  int64_t lo = 0, hi = 0;
};

const std::map<std::string, Setter>& Settings() {
  static const std::map<std::string, Setter> kSettings = {
      {"model", {Setter::Type::kString}},
      {"mount", {Setter::Type::kString}},
      {"store", {Setter::Type::kString}},
      {"threads", {Setter::Type::kInt, 0, 1024}},
      {"kv", {Setter::Type::kString}},
      {"kv_budget", {Setter::Type::kBytes, 0, INT64_MAX}},
      {"context", {Setter::Type::kInt, 0, 1 << 20}},
      {"block_tokens", {Setter::Type::kInt, 16, 4096}},
      {"max_queued_turns", {Setter::Type::kInt, 1, 1024}},
      {"max_prompt_bytes", {Setter::Type::kBytes, 1, int64_t{1} << 30}},
      {"fuse_threads", {Setter::Type::kInt, 2, 4096}},
      {"backend", {Setter::Type::kString}},
      {"device", {Setter::Type::kInt, 0, 1 << 16}},
      {"kv_device_budget", {Setter::Type::kBytes, 0, INT64_MAX}},
      {"vulkan_tuning", {Setter::Type::kString}},
      {"foreground", {Setter::Type::kBool}},
      {"log_level", {Setter::Type::kString}},
      {"log_file", {Setter::Type::kString}},
  };
  return kSettings;
}

// Applies one setting, already converted to the right type.
Status Apply(const std::string& key, const std::string& text, int64_t number, bool flag, std::string_view what,
             DaemonConfig& c) {
  if (key == "model") c.model_path = text;
  else if (key == "mount") c.mountpoint = text;
  else if (key == "store") c.store_dir = text;
  else if (key == "threads") c.threads = static_cast<int>(number);
  else if (key == "kv") {
    KVFS_RETURN_IF_ERROR(CheckKv(text, what));
    c.kv = text;
  } else if (key == "kv_budget") c.kv_budget_bytes = number;
  else if (key == "context") c.context_tokens = number;
  else if (key == "block_tokens") c.block_tokens = number;
  else if (key == "max_queued_turns") c.max_queued_turns = number;
  else if (key == "max_prompt_bytes") c.max_prompt_bytes = number;
  else if (key == "fuse_threads") c.fuse_threads = static_cast<int>(number);
  else if (key == "backend") {
    if (text != "cpu" && text != "vulkan") return InvalidArgument(fmt::format("{} must be cpu or vulkan, not '{}'", what, text));
    c.backend = text;
  } else if (key == "device") c.device = static_cast<int>(number);
  else if (key == "kv_device_budget") c.kv_device_budget_bytes = number;
  else if (key == "vulkan_tuning") c.vulkan_tuning = text;
  else if (key == "foreground") c.foreground = flag;
  else if (key == "log_level") {
    KVFS_RETURN_IF_ERROR(CheckLogLevel(text, what));
    c.log_level = text;
  } else if (key == "log_file") c.log_file = text;
  else return InvalidArgument(fmt::format("unknown setting '{}'", what));
  return Status::Ok();
}

Status ApplyText(const std::string& key, const std::string& value, std::string_view what, DaemonConfig& c) {
  const Setter& s = Settings().at(key);
  switch (s.type) {
    case Setter::Type::kString:
      if (value.empty()) return InvalidArgument(fmt::format("{} must not be empty", what));
      return Apply(key, value, 0, false, what, c);
    case Setter::Type::kInt: {
      KVFS_ASSIGN_OR_RETURN(int64_t v, ParseInteger(value, what, s.lo, s.hi));
      return Apply(key, value, v, false, what, c);
    }
    case Setter::Type::kBytes: {
      Result<int64_t> v = ParseByteSize(value);
      if (!v.ok()) {
        return InvalidArgument(fmt::format("{} must be a size in bytes (e.g. 1048576, 512M, 1.5G, 2GiB), got '{}'", what, value));
      }
      if (*v < s.lo || *v > s.hi) {
        return InvalidArgument(s.hi == INT64_MAX ? fmt::format("{} must be at least {} bytes, got '{}'", what, s.lo, value)
                                                 : fmt::format("{} must be from {} to {} bytes, got '{}'", what, s.lo, s.hi, value));
      }
      return Apply(key, value, *v, false, what, c);
    }
    case Setter::Type::kBool:
      return Apply(key, value, 0, true, what, c);
  }
  return Internal("unreachable");
}

// Command-line options: name -> (config key, takes a value).
const std::map<std::string, std::pair<std::string, bool>>& Options() {
  static const std::map<std::string, std::pair<std::string, bool>> kOptions = {
      {"-m", {"model", true}},         {"--model", {"model", true}},
      {"--mount", {"mount", true}},    {"--store", {"store", true}},
      {"-t", {"threads", true}},       {"--threads", {"threads", true}},
      {"--kv", {"kv", true}},          {"--kv-budget", {"kv_budget", true}},
      {"-c", {"context", true}},       {"--context", {"context", true}},
      {"--block-tokens", {"block_tokens", true}},
      {"--max-queued-turns", {"max_queued_turns", true}},
      {"--max-prompt-bytes", {"max_prompt_bytes", true}},
      {"--fuse-threads", {"fuse_threads", true}},
      {"--backend", {"backend", true}},  {"--device", {"device", true}},
      {"--vulkan-tuning", {"vulkan_tuning", true}},
      {"--kv-device-budget", {"kv_device_budget", true}},
      {"-f", {"foreground", false}},   {"--foreground", {"foreground", false}},
      {"--log-level", {"log_level", true}},
      {"--log-file", {"log_file", true}},
  };
  return kOptions;
}

}  // namespace

Environment Environment::FromProcess() {
  Environment env;
  env.uid = ::geteuid();
  auto get = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  env.home = get("HOME");
  env.xdg_data_home = get("XDG_DATA_HOME");
  env.kvfs_model = get("KVFS_MODEL");
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) env.exe_path.assign(buf, static_cast<size_t>(n));
  return env;
}

Result<int64_t> ParseByteSize(std::string_view text) {
  // Digits, an optional fraction, then an optional binary unit: K, M, G or T, alone or as KiB,
  // KB (every unit is a power of 1024, as in --kv-budget's examples) and B.
  std::string s(text);
  if (s.empty()) return InvalidArgument("empty size");
  size_t unit = s.find_first_not_of("0123456789.");
  std::string number = s.substr(0, unit), suffix = unit == std::string::npos ? "" : s.substr(unit);
  for (char& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  int shift = -1;
  for (const auto& [name, bits] : std::initializer_list<std::pair<const char*, int>>{
           {"", 0}, {"B", 0}, {"K", 10}, {"KB", 10}, {"KIB", 10}, {"M", 20}, {"MB", 20}, {"MIB", 20},
           {"G", 30}, {"GB", 30}, {"GIB", 30}, {"T", 40}, {"TB", 40}, {"TIB", 40}}) {
    if (suffix == name) shift = bits;
  }
  const size_t dot = number.find('.');
  if (shift < 0 || number.empty() || number == "." || number.find('.', dot == std::string::npos ? 0 : dot + 1) != std::string::npos) {
    return InvalidArgument(fmt::format("'{}' is not a size (digits with an optional fraction, then K, M, G or T)", text));
  }
  const std::string whole = number.substr(0, dot), fraction = dot == std::string::npos ? "" : number.substr(dot + 1);
  KVFS_ASSIGN_OR_RETURN(int64_t v, ParseInteger(whole.empty() ? "0" : whole, "size", 0, INT64_MAX >> shift));
  int64_t bytes = v << shift;
  // The fraction of the unit, exactly for up to 18 digits: round down to a whole byte.
  if (!fraction.empty()) {
    const std::string digits = fraction.substr(0, 18);
    int64_t num = 0, den = 1;
    for (char ch : digits) {
      num = num * 10 + (ch - '0');
      den *= 10;
    }
    const __int128 part = (static_cast<__int128>(num) << shift) / den;
    if (part > INT64_MAX - bytes) return InvalidArgument(fmt::format("'{}' is too large", text));
    bytes += static_cast<int64_t>(part);
  }
  return bytes;
}

Status ApplyConfigJson(std::string_view json_text, DaemonConfig& config) {
  KVFS_ASSIGN_OR_RETURN(nlohmann::json doc, ParseStrictJson(json_text, "config file"));
  if (!doc.is_object()) return InvalidArgument("config file: must be a JSON object");
  DaemonConfig updated = config;
  for (const auto& [key, value] : doc.items()) {
    std::string what = "config key \"" + key + "\"";
    auto it = Settings().find(key);
    if (it == Settings().end()) return InvalidArgument("config file: unknown key \"" + key + "\"");
    const Setter& s = it->second;
    switch (s.type) {
      case Setter::Type::kString:
        if (!value.is_string()) return InvalidArgument(what + " must be a string");
        KVFS_RETURN_IF_ERROR(ApplyText(key, value.get<std::string>(), what, updated));
        break;
      case Setter::Type::kInt:
        if (!value.is_number_integer()) return InvalidArgument(what + " must be an integer");
        KVFS_RETURN_IF_ERROR(ApplyText(key, std::to_string(value.get<int64_t>()), what, updated));
        break;
      case Setter::Type::kBytes:
        if (value.is_number_integer()) {
          KVFS_RETURN_IF_ERROR(ApplyText(key, std::to_string(value.get<int64_t>()), what, updated));
        } else if (value.is_string()) {
          KVFS_RETURN_IF_ERROR(ApplyText(key, value.get<std::string>(), what, updated));
        } else {
          return InvalidArgument(what + " must be a size: an integer or a string like \"2G\"");
        }
        break;
      case Setter::Type::kBool:
        if (!value.is_boolean()) return InvalidArgument(what + " must be true or false");
        updated.foreground = value.get<bool>();
        break;
    }
  }
  config = std::move(updated);
  return Status::Ok();
}

Result<DaemonConfig> ParseDaemonArgs(const std::vector<std::string>& args) {
  DaemonConfig config;
  std::vector<std::pair<std::string, std::string>> given;  // (option, value) in order
  std::string config_file;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      config.help = true;
      return config;
    }
    if (a == "--config") {
      if (i + 1 >= args.size()) return InvalidArgument("option --config needs a value");
      config_file = args[++i];
      continue;
    }
    auto it = Options().find(a);
    if (it == Options().end()) return InvalidArgument("unknown option '" + a + "' (kvfsd --help lists them)");
    if (!it->second.second) {
      given.emplace_back(a, "");
      continue;
    }
    if (i + 1 >= args.size()) return InvalidArgument("option " + a + " needs a value");
    given.emplace_back(a, args[++i]);
  }
  if (!config_file.empty()) {
    Result<std::string> text = ReadWholeFile(config_file);
    if (!text.ok()) return InvalidArgument("config file: " + text.status().message());
    Status s = ApplyConfigJson(*text, config);
    if (!s.ok()) return s.WithContext(config_file);
  }
  // The command line overrides the config file.
  std::set<std::string> on_command_line;
  for (const auto& [option, value] : given) {
    const std::string& key = Options().at(option).first;
    KVFS_RETURN_IF_ERROR(ApplyText(key, value, "option " + option, config));
    on_command_line.insert(key);
  }
  // `--backend cpu` on the command line (a GPU problem being looked into) overrides the config
  // file's backend with its Vulkan settings, which the command line did not give again.
  if (on_command_line.count("backend") && config.backend != "vulkan" && !config_file.empty()) {
    const DaemonConfig defaults;
    if (!on_command_line.count("device")) config.device = defaults.device;
    if (!on_command_line.count("vulkan_tuning")) config.vulkan_tuning = defaults.vulkan_tuning;
    if (!on_command_line.count("kv_device_budget")) config.kv_device_budget_bytes = defaults.kv_device_budget_bytes;
  }
  if (config.mountpoint.empty()) return InvalidArgument("--mount DIR is required (or \"mount\" in the config file)");
  return config;
}

std::string DefaultStoreDir(const Environment& env) {
  if (env.uid == 0) return "/var/lib/kvfs";
  if (!env.xdg_data_home.empty()) return env.xdg_data_home + "/kvfs";
  if (!env.home.empty()) return env.home + "/.local/share/kvfs";
  return "/var/lib/kvfs";
}

std::optional<std::string> FindDefaultModel(const Environment& env, const std::string& store_dir) {
  if (!env.kvfs_model.empty()) return env.kvfs_model;
  if (!env.exe_path.empty()) {
    std::string dir = DirName(env.exe_path);
    for (int up = 0; up <= 3; ++up) {
      std::string candidate = dir + "/models/default.gguf";
      if (IsFile(candidate)) return candidate;
      if (dir == "/") break;
      dir = DirName(dir);
    }
  }
  std::string in_store = store_dir + "/models/default.gguf";
  if (IsFile(in_store)) return in_store;
  return std::nullopt;
}

Status ResolveDefaults(DaemonConfig& config, const Environment& env) {
  // (0: the model's own context.) Below this no turn of any template fits.
  constexpr int64_t kMinContext = 16;
  if (config.context_tokens > 0 && config.context_tokens < kMinContext)
    return InvalidArgument(fmt::format("context {}: too small for any turn (at least {}; 0 takes the model's)",
                                       config.context_tokens, kMinContext));
  if (config.store_dir.empty()) config.store_dir = DefaultStoreDir(env);
  if (config.model_path.empty()) {
    std::optional<std::string> found = FindDefaultModel(env, config.store_dir);
    if (!found) {
      return InvalidArgument(
          "no model given (-m MODEL) and no default model found: run scripts/setup.sh (it links "
          "models/default.gguf in the checkout), set KVFS_MODEL, or put one at " +
          config.store_dir + "/models/default.gguf");
    }
    config.model_path = *found;
  }
  if (std::error_code ec; std::filesystem::is_directory(config.model_path, ec)) {
    return InvalidArgument("the model " + config.model_path + " is a directory, not a GGUF file");
  }
  if (!IsFile(config.model_path)) return InvalidArgument("model not found: " + config.model_path);
  if (!config.vulkan_tuning.empty() && config.backend != "vulkan") {
    return InvalidArgument("--vulkan-tuning (vulkan_tuning) applies to --backend vulkan only");
  }
  if (config.kv_device_budget_bytes > 0 && config.backend != "vulkan") {
    return InvalidArgument("--kv-device-budget (kv_device_budget) applies to --backend vulkan only");
  }
  if (config.device >= 0 && config.backend != "vulkan")
    return InvalidArgument("--device (device) applies to --backend vulkan only");
  if (config.log_file.empty()) config.log_file = config.store_dir + "/kvfsd.log";
  return Status::Ok();
}

std::string DaemonUsage() {
  return "usage: kvfsd --mount DIR [-m MODEL] [--store DIR] [--config FILE] [-t THREADS] [--kv f16|q8|q4|q4k]\n"
         "             [--kv-budget BYTES] [-c CONTEXT] [--block-tokens N] [--max-queued-turns N]\n"
         "             [--max-prompt-bytes BYTES] [--fuse-threads N] [--foreground] [--log-level L]\n"
         "             [--log-file FILE] [--backend cpu|vulkan] [--device N] [--vulkan-tuning FILE]\n"
         "             [--kv-device-budget BYTES]\n"
         "Mounts the kvfs filesystem at DIR: every agent is a directory (see README.md).\n"
         "  -m MODEL            GGUF model (default: $KVFS_MODEL, else models/default.gguf next to the\n"
         "                      build tree that scripts/setup.sh set up, else STORE/models/default.gguf)\n"
         "  --store DIR         caches and the audit log (default: $XDG_DATA_HOME/kvfs or\n"
         "                      ~/.local/share/kvfs; /var/lib/kvfs as root)\n"
         "  --config FILE       JSON settings (keys: model, mount, store, threads, kv, kv_budget, context,\n"
         "                      block_tokens, max_queued_turns, max_prompt_bytes, fuse_threads,\n"
         "                      foreground, log_level, log_file, backend, device, vulkan_tuning,\n"
         "                      kv_device_budget); the command line overrides it\n"
         "  --backend B         cpu (default) or vulkan: forward passes on a GPU (kvfs devices lists\n"
         "                      them; --device N picks one); without a device, the CPU, with a warning;\n"
         "                      what the device cannot run (a lost device, KV over its budget) runs\n"
         "                      on the CPU, logged, and no agent's state is lost; a lost device is\n"
         "                      made again 1 s after the loss (while idle, else at the next pass),\n"
         "                      then at doubling waits (at most 5 min; doubled too when lost again\n"
         "                      soon after)\n"
         "  --kv-device-budget BYTES  Vulkan: device memory for copies of KV blocks (default: a quarter\n"
         "                      of the device's); a step whose blocks do not fit runs on the CPU\n"
         "  --vulkan-tuning FILE  the settings kvfs tune found for this device and model (ignored,\n"
         "                      with a warning, when made for another device or model)\n"
         "  -t THREADS          engine threads (default, or 0: all hardware threads)\n"
         "  --kv F              KV format of new agents (default q4k; q4 when --block-tokens is not a\n"
         "                      multiple of 64)\n"
         "  --kv-budget BYTES   KV memory, e.g. 2G (default: a quarter of the machine's memory)\n"
         "  -c CONTEXT          context tokens per agent, at least 16 (default: the model's, at most 32768)\n"
         "  --block-tokens N    tokens per KV block (default 256)\n"
         "  --max-queued-turns N  turns waiting per agent; more: EAGAIN (default 8)\n"
         "  --max-prompt-bytes BYTES  larger prompts: EFBIG (default 1048576)\n"
         "  --fuse-threads N    FUSE requests served at once (default 64; readers waiting on\n"
         "                      `response` hold none)\n"
         "  --foreground, -f    stay in the foreground and log to stderr (systemd: use this)\n"
         "  --log-level L       trace|debug|info|warn|error|critical|off (default info)\n"
         "  --log-file FILE     log of a background kvfsd (default STORE/kvfsd.log; its directory\n"
         "                      must exist, and neither it nor the store may be inside the mount)\n"
         "SIGTERM or SIGINT: cancel running and queued turns (none is committed), flush the store, unmount, exit 0.\n"
         "SIGHUP: in the background, reopen the log file (after logrotate moved it); in the\n"
         "foreground (a terminal hung up), as SIGTERM. SIGUSR1, SIGUSR2, SIGALRM: logged, ignored.\n";
}

}  // namespace kvfs::daemon
