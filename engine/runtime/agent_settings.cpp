#include <spdlog/fmt/fmt.h>

#include "engine/runtime/agent_engine.h"

namespace kvfs {

std::string_view AgentStateName(AgentState state) {
  switch (state) {
    case AgentState::kCold: return "cold";
    case AgentState::kWarm: return "warm";
    case AgentState::kHot: return "hot";
    case AgentState::kQueued: return "queued";
    case AgentState::kGenerating: return "generating";
    case AgentState::kError: return "error";
  }
  return "unknown";
}

nlohmann::json AgentSettingsToJson(const AgentSettings& s) {
  return nlohmann::json{{"temperature", s.sampling.temperature},
                        {"top_k", s.sampling.top_k},
                        {"top_p", s.sampling.top_p},
                        {"min_p", s.sampling.min_p},
                        {"repeat_penalty", s.sampling.repeat_penalty},
                        {"repeat_last_n", s.sampling.repeat_last_n},
                        {"seed", s.sampling.seed},
                        {"max_tokens", s.max_tokens},
                        {"stop", s.stop},
                        {"kv", s.kv}};
}

namespace {

Status Bad(const std::string& key, const std::string& why) {
  return InvalidArgument(fmt::format("config key \"{}\": {}", key, why));
}

Result<double> Number(const nlohmann::json& v, const std::string& key, double lo, double hi) {
  if (!v.is_number()) return Bad(key, "must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) return Bad(key, fmt::format("must be in [{}, {}]", lo, hi));
  return x;
}

Result<int64_t> Integer(const nlohmann::json& v, const std::string& key, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return Bad(key, "must be an integer");
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi) return Bad(key, fmt::format("must be in [{}, {}]", lo, hi));
  return x;
}

}  // namespace

Result<AgentSettings> ParseAgentSettings(std::string_view json_text, const AgentSettings& base) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("config is not valid JSON");
  if (!j.is_object()) return InvalidArgument("config must be a JSON object");
  AgentSettings s = base;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    if (k == "temperature") {
      KVFS_ASSIGN_OR_RETURN(double x, Number(v, k, 0, 100));
      s.sampling.temperature = static_cast<float>(x);
    } else if (k == "top_k") {
      KVFS_ASSIGN_OR_RETURN(int64_t x, Integer(v, k, 0, 1 << 20));
      s.sampling.top_k = static_cast<int>(x);
    } else if (k == "top_p") {
      KVFS_ASSIGN_OR_RETURN(double x, Number(v, k, 0, 1));
      s.sampling.top_p = static_cast<float>(x);
    } else if (k == "min_p") {
      KVFS_ASSIGN_OR_RETURN(double x, Number(v, k, 0, 1));
      s.sampling.min_p = static_cast<float>(x);
    } else if (k == "repeat_penalty") {
      KVFS_ASSIGN_OR_RETURN(double x, Number(v, k, 0.01, 100));
      s.sampling.repeat_penalty = static_cast<float>(x);
    } else if (k == "repeat_last_n") {
      KVFS_ASSIGN_OR_RETURN(int64_t x, Integer(v, k, -1, 1 << 20));
      s.sampling.repeat_last_n = static_cast<int>(x);
    } else if (k == "seed") {
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) return Bad(k, "must be a non-negative integer");
      s.sampling.seed = v.get<uint64_t>();
    } else if (k == "max_tokens") {
      KVFS_ASSIGN_OR_RETURN(int64_t x, Integer(v, k, 1, 1 << 20));
      s.max_tokens = static_cast<int>(x);
    } else if (k == "stop") {
      if (!v.is_array() || v.size() > 16) return Bad(k, "must be an array of at most 16 strings");
      std::vector<std::string> stop;
      for (const auto& e : v) {
        if (!e.is_string() || e.get<std::string>().empty() || e.get<std::string>().size() > 256)
          return Bad(k, "entries must be non-empty strings of at most 256 bytes");
        stop.push_back(e.get<std::string>());
      }
      s.stop = std::move(stop);
    } else if (k == "kv") {
      if (!v.is_string() || (v != "f16" && v != "q8" && v != "q4")) return Bad(k, "must be \"f16\", \"q8\" or \"q4\"");
      s.kv = v.get<std::string>();
    } else {
      return Bad(k, "unknown key");
    }
  }
  return s;
}

}  // namespace kvfs
