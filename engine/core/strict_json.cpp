#include "engine/core/strict_json.h"

#include <set>
#include <string>
#include <vector>

namespace kvfs {

std::string ClipForMessage(std::string_view s, size_t max, char quote) {
  std::string out;
  if (quote) out += quote;
  size_t i = 0;
  for (; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (i >= max && (c & 0xC0) != 0x80) break;
    out += c < 0x20 ? '?' : static_cast<char>(c);
  }
  if (quote) out += quote;
  if (i < s.size()) out += "...";
  return out;
}

bool JsonDepthWithin(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

namespace {
struct TooManyEvents {};
}  // namespace

Result<nlohmann::json> ParseStrictJson(std::string_view text, std::string_view what_view, JsonLimits limits) {
  const std::string what(what_view);
  // The parser takes a NUL byte for the end of the text: what follows one would go unread. No
  // valid JSON holds one (a string escapes it as \u0000).
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return InvalidArgument(what + " is not valid JSON: a NUL byte at byte " + std::to_string(nul));
  }
  if (!JsonDepthWithin(text, limits.max_depth)) {
    return InvalidArgument(what + " is nested deeper than " + std::to_string(limits.max_depth));
  }
  std::string duplicate;
  std::vector<std::set<std::string>> keys;  // the open objects' keys so far
  int64_t events = 0;
  nlohmann::json::parser_callback_t cb = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (limits.max_events > 0 && ++events > limits.max_events) throw TooManyEvents{};
    if (event == nlohmann::json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == nlohmann::json::parse_event_t::object_end && !keys.empty()) {
      keys.pop_back();
    } else if (event == nlohmann::json::parse_event_t::key && !keys.empty() && duplicate.empty() &&
               !keys.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), cb);
    if (!duplicate.empty()) return InvalidArgument(what + " has a duplicate key " + ClipForMessage(duplicate, 48, '"'));
    return j;
  } catch (const nlohmann::json::exception& e) {
    std::string why = e.what();
    // The library's own tag ("[json.exception.parse_error.101] ") says nothing to a user.
    if (why.starts_with("[json.exception.")) {
      if (const size_t end = why.find("] "); end != std::string::npos) why.erase(0, end + 2);
    }
    if (!limits.quote_text) {
      if (const size_t at = why.find("; last read:"); at != std::string::npos) why.resize(at);
    }
    return InvalidArgument(what + " is not valid JSON: " + why);
  } catch (const TooManyEvents&) {
    return InvalidArgument(what + " holds more JSON values than a valid one can (" +
                           std::to_string(limits.max_events) + " parser events)");
  }
}

}  // namespace kvfs
