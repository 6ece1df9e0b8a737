// AgentSettings <-> config.json, and TurnStats <-> the manifest's record of the last turn. The parser is strict so that a typo in a user's config.json
// fails loudly (EINVAL naming the key) instead of silently keeping a default.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

#include <spdlog/fmt/fmt.h>

#include "engine/core/strict_json.h"
#include "engine/runtime/agent_engine.h"

namespace kvfs {

namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr int64_t kMaxReplyTokens = 1 << 20;

Status BadValue(std::string_view key, std::string_view what) {
  return InvalidArgument(fmt::format("config.json: \"{}\" {}", key, what));
}

Result<double> NumberIn(const nlohmann::json& v, std::string_view key, double lo, double hi) {
  if (!v.is_number()) return BadValue(key, "must be a number");
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) return BadValue(key, fmt::format("must be in [{}, {}]", lo, hi));
  return x + 0.0;  // -0 is 0 (config.json would show it as -0.0)
}

Result<int64_t> IntegerIn(const nlohmann::json& v, std::string_view key, int64_t lo, int64_t hi) {
  if (v.is_number_float()) {
    // 48.0 is 48 (JSON has one number type; Python's json and JavaScript write integral floats
    // so); 48.5 is not an integer.
    const double x = v.get<double>();
    if (!std::isfinite(x) || x != std::floor(x)) return BadValue(key, "must be an integer");
    if (x < static_cast<double>(lo) || x > static_cast<double>(hi)) {
      return BadValue(key, fmt::format("must be in [{}, {}]", lo, hi));
    }
    return static_cast<int64_t>(x);
  }
  if (!v.is_number_integer()) return BadValue(key, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return BadValue(key, fmt::format("must be in [{}, {}]", lo, hi));
  }
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return BadValue(key, fmt::format("must be in [{}, {}]", lo, hi));
  return x;
}

Status ApplyKey(const std::string& key, const nlohmann::json& v, AgentSettings& s) {
  SamplerParams& p = s.sampling;
  if (key == "temperature") {
    KVFS_ASSIGN_OR_RETURN(double x, NumberIn(v, key, 0.0, 100.0));
    p.temperature = static_cast<float>(x);
  } else if (key == "top_k") {
    KVFS_ASSIGN_OR_RETURN(int64_t x, IntegerIn(v, key, 0, 1 << 20));
    p.top_k = static_cast<int>(x);
  } else if (key == "top_p") {
    KVFS_ASSIGN_OR_RETURN(double x, NumberIn(v, key, 0.0, 1.0));
    p.top_p = static_cast<float>(x);
  } else if (key == "min_p") {
    KVFS_ASSIGN_OR_RETURN(double x, NumberIn(v, key, 0.0, 1.0));
    p.min_p = static_cast<float>(x);
  } else if (key == "repeat_penalty") {
    KVFS_ASSIGN_OR_RETURN(double x, NumberIn(v, key, 0.01, 100.0));
    p.repeat_penalty = static_cast<float>(x);
  } else if (key == "repeat_last_n") {
    KVFS_ASSIGN_OR_RETURN(int64_t x, IntegerIn(v, key, -1, 1 << 20));
    p.repeat_last_n = static_cast<int>(x);
  } else if (key == "seed") {
    if (v.is_number_float()) {
      // 7.0 is 7, as for the other integers; up to the largest double below 2^64.
      const double x = v.get<double>();
      if (!std::isfinite(x) || x != std::floor(x) || x < 0.0 || x >= 18446744073709551616.0)
        return BadValue(key, "must be a non-negative integer");
      p.seed = static_cast<uint64_t>(x);
    } else {
      if (!v.is_number_unsigned()) return BadValue(key, "must be a non-negative integer");
      p.seed = v.get<uint64_t>();
    }
  } else if (key == "max_tokens") {
    KVFS_ASSIGN_OR_RETURN(int64_t x, IntegerIn(v, key, 1, kMaxReplyTokens));
    s.max_tokens = static_cast<int>(x);
  } else if (key == "stop") {
    if (!v.is_array()) return BadValue(key, "must be an array of strings");
    if (v.size() > kMaxStopStrings) return BadValue(key, fmt::format("holds at most {} strings", kMaxStopStrings));
    std::vector<std::string> stop;
    for (const auto& item : v) {
      if (!item.is_string()) return BadValue(key, "must be an array of strings");
      std::string text = item.get<std::string>();
      if (text.empty() || text.size() > kMaxStopStringBytes) {
        return BadValue(key, fmt::format("strings must be 1 to {} bytes long", kMaxStopStringBytes));
      }
      stop.push_back(std::move(text));
    }
    s.stop = std::move(stop);
  } else if (key == "kv") {
    static const std::set<std::string> kFormats = {"f16", "q8", "q4", "q4k"};
    if (!v.is_string() || !kFormats.count(v.get<std::string>()))
      return BadValue(key, "must be \"f16\", \"q8\", \"q4\" or \"q4k\"");
    s.kv = v.get<std::string>();
  } else {
    return InvalidArgument(fmt::format("config.json: unknown key \"{}\"", key));
  }
  return Status::Ok();
}

// Floats print as the short decimal a user wrote (0.8, not 0.800000011920929).
double ShortDecimal(float x) { return std::strtod(fmt::format("{:.6g}", x).c_str(), nullptr); }

}  // namespace

Result<AgentSettings> ParseAgentSettings(std::string_view json_text, const AgentSettings& base) {
  KVFS_ASSIGN_OR_RETURN(nlohmann::json doc, ParseStrictJson(json_text, "config.json"));
  if (!doc.is_object()) return InvalidArgument("config.json: must be a JSON object");
  AgentSettings settings = base;
  for (const auto& [key, value] : doc.items()) KVFS_RETURN_IF_ERROR(ApplyKey(key, value, settings));
  return settings;
}

nlohmann::json AgentSettingsToJson(const AgentSettings& s) {
  const SamplerParams& p = s.sampling;
  nlohmann::json j = nlohmann::json::object();
  j["temperature"] = ShortDecimal(p.temperature);
  j["top_k"] = p.top_k;
  j["top_p"] = ShortDecimal(p.top_p);
  j["min_p"] = ShortDecimal(p.min_p);
  j["repeat_penalty"] = ShortDecimal(p.repeat_penalty);
  j["repeat_last_n"] = p.repeat_last_n;
  j["seed"] = p.seed;
  j["max_tokens"] = s.max_tokens;
  j["stop"] = s.stop;
  j["kv"] = s.kv;
  return j;
}

nlohmann::json TurnStatsToJson(const TurnStats& t) {
  return {{"match", t.match},
          {"reused_tokens", t.reused_tokens},
          {"new_tokens", t.prefilled_tokens},
          {"generated_tokens", t.generated_tokens},
          {"ttft_ms", t.ttft_ms},
          {"tokens_per_s", t.decode_tokens_per_s},
          {"stop_reason", t.stop_reason}};
}

std::optional<TurnStats> TurnStatsFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  auto text = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto count = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0 ? it->get<int64_t>() : int64_t{0};
  };
  auto real = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() && std::isfinite(it->get<double>()) ? it->get<double>() : 0.0;
  };
  TurnStats t;
  t.match = text("match");
  t.reused_tokens = count("reused_tokens");
  t.prefilled_tokens = count("new_tokens");
  t.generated_tokens = count("generated_tokens");
  t.ttft_ms = real("ttft_ms");
  t.decode_tokens_per_s = real("tokens_per_s");
  t.stop_reason = text("stop_reason");
  return t;
}

void EngineStatus::CountAgent(AgentState state) {
  switch (state) {
    case AgentState::kHot: ++agents_hot; break;
    case AgentState::kWarm: ++agents_warm; break;
    case AgentState::kCold: ++agents_cold; break;
    case AgentState::kQueued: ++agents_queued; break;
    case AgentState::kGenerating: ++agents_generating; break;
    case AgentState::kError: ++agents_error; break;
  }
}

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

}  // namespace kvfs
