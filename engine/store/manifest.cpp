#include "engine/store/manifest.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <spdlog/fmt/fmt.h>

#include "engine/core/strict_json.h"
#include "engine/store/json_checksum.h"

namespace kvfs::store {
namespace {

using Json = nlohmann::json;

// JSON nesting we accept. The manifest itself needs 3 levels; the opaque config gets the rest.
// Bounded so that recursive consumers (dump, validation) stay shallow on hostile input.
constexpr int kMaxJsonDepth = 64;

constexpr std::array<std::string_view, 15> kFields = {
    "format", "version", "name", "model_fingerprint", "kv_format", "block_size", "tokens",
    "conversation", "blocks", "tail", "config", "created_ms", "updated_ms", "turn", kJsonChecksumKey};

}  // namespace

bool ValidUtf8(std::string_view s) { return ValidUtf8Prefix(s) == s.size(); }

size_t ValidUtf8Prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return i;
    if (i + len > s.size()) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return i;
}

namespace {

// The opaque config must survive a write and a read unchanged: bounded nesting (the recursive
// dump stays shallow) and finite numbers (JSON has no inf/nan; they would come back as null).
bool ConfigStorable(const Json& j, int depth_left) {
  if (j.is_number_float()) return std::isfinite(j.get<double>());
  if (!j.is_object() && !j.is_array()) return true;
  if (depth_left <= 0) return false;
  for (const auto& child : j)
    if (!ConfigStorable(child, depth_left - 1)) return false;
  return true;
}

// Field access with errors that name the field.
class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}
  Status Err(const std::string& field, const std::string& what) const {
    return Corrupt(std::string(source_) + ": field \"" + field + "\": " + what);
  }
  Result<const Json*> Field(const Json& obj, const std::string& field) const {
    auto it = obj.find(field);
    if (it == obj.end()) return Err(field, "missing");
    return &*it;
  }
  Result<std::string> String(const Json& obj, const std::string& field) const {
    KVFS_ASSIGN_OR_RETURN(const Json* v, Field(obj, field));
    if (!v->is_string()) return Err(field, std::string("expected a string, got ") + v->type_name());
    return v->get<std::string>();
  }
  Result<int64_t> Int(const Json& v, const std::string& field, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) return Err(field, std::string("expected an integer, got ") + v.type_name());
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return Err(field, "integer out of range");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return Err(field, "value " + std::to_string(x) + " out of range [" + std::to_string(lo) + ", " +
                                                std::to_string(hi) + "]");
    return x;
  }
  Result<int64_t> IntField(const Json& obj, const std::string& field, int64_t lo, int64_t hi) const {
    KVFS_ASSIGN_OR_RETURN(const Json* v, Field(obj, field));
    return Int(*v, field, lo, hi);
  }

 private:
  std::string_view source_;
};

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

}  // namespace

bool IsValidAgentName(std::string_view name) {
  if (name.empty() || name.size() > kMaxAgentNameLen) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool IsHex128(std::string_view s) { return s.size() == 32 && IsLowerHex(s); }

bool IsTailFileName(std::string_view name) {
  if (!name.starts_with(kTailPrefix) || !name.ends_with(kTailSuffix)) return false;
  std::string_view digits = name.substr(kTailPrefix.size(), name.size() - kTailPrefix.size() - kTailSuffix.size());
  return !digits.empty() && digits.size() <= 20 &&
         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string TailFileName(uint64_t turn) {
  return std::string(kTailPrefix) + std::to_string(turn) + std::string(kTailSuffix);
}

Status ValidateManifest(const Manifest& m) {
  auto bad = [](const std::string& field, const std::string& what) {
    return InvalidArgument("manifest field \"" + field + "\": " + what);
  };
  if (!IsValidAgentName(m.name)) return bad("name", "not a valid agent name ([A-Za-z0-9_-]{1,64})");
  if (!IsHex128(m.model_fingerprint)) return bad("model_fingerprint", "not 32 lowercase hex digits");
  if (m.kv_format.empty() || m.kv_format.size() > 64 || !ValidUtf8(m.kv_format))
    return bad("kv_format", "must be 1 to 64 bytes of UTF-8");
  if (m.block_size == 0 || m.block_size > kMaxBlockSize) return bad("block_size", "out of range");
  for (size_t i = 0; i < m.tokens.size(); ++i)
    if (m.tokens[i] < 0) return bad("tokens[" + std::to_string(i) + "]", "negative token id");
  for (size_t i = 0; i < m.conversation.size(); ++i) {
    const std::string f = "conversation[" + std::to_string(i) + "]";
    if (m.conversation[i].role.empty() || !ValidUtf8(m.conversation[i].role)) return bad(f + ".role", "empty or not UTF-8");
    if (!ValidUtf8(m.conversation[i].text)) return bad(f + ".text", "not valid UTF-8");
  }
  uint64_t cached = static_cast<uint64_t>(m.blocks.size()) * m.block_size;
  if (m.tail) {
    if (!IsTailFileName(m.tail->file)) return bad("tail.file", "not of the form tail.<n>.kvt");
    if (m.tail->n_tokens == 0 || m.tail->n_tokens >= m.block_size)
      return bad("tail.n_tokens", "must be in [1, block_size)");
    cached += m.tail->n_tokens;
  }
  if (cached > m.tokens.size())
    return bad("blocks", "cache covers " + std::to_string(cached) + " tokens but only " +
                             std::to_string(m.tokens.size()) + " token ids are listed");
  if (!m.config.is_object()) return bad("config", "must be a JSON object");
  if (!ConfigStorable(m.config, kMaxJsonDepth - 2)) return bad("config", "nested too deeply or holds a non-finite number");
  if (m.created_ms < 0 || m.updated_ms < 0) return bad("created_ms", "negative timestamp");
  if (m.turn > static_cast<uint64_t>(kI64Max)) return bad("turn", "out of range");
  return Status::Ok();
}

Result<std::string> SerializeManifest(const Manifest& m) {
  KVFS_RETURN_IF_ERROR(ValidateManifest(m));
  nlohmann::ordered_json j;  // field order as documented, for people reading the file
  j["format"] = kManifestFormat;
  j["version"] = kManifestVersion;
  j["name"] = m.name;
  j["model_fingerprint"] = m.model_fingerprint;
  j["kv_format"] = m.kv_format;
  j["block_size"] = m.block_size;
  j["tokens"] = m.tokens;
  auto conv = nlohmann::ordered_json::array();
  for (const auto& t : m.conversation) conv.push_back({{"role", t.role}, {"text", t.text}});
  j["conversation"] = std::move(conv);
  auto blocks = nlohmann::ordered_json::array();
  for (const auto& h : m.blocks) blocks.push_back(ToHex(h));
  j["blocks"] = std::move(blocks);
  if (m.tail) j["tail"] = {{"file", m.tail->file}, {"n_tokens", m.tail->n_tokens}};
  else j["tail"] = nullptr;
  try {
    j["config"] = nlohmann::ordered_json::parse(m.config.dump());
    j["created_ms"] = m.created_ms;
    j["updated_ms"] = m.updated_ms;
    j["turn"] = m.turn;
    return AppendJsonChecksum(j.dump());  // strict: throws on invalid UTF-8 (e.g. inside config strings)
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("manifest cannot be serialized: ") + e.what());
  }
}

Result<Manifest> ParseManifest(std::string_view text, std::string_view source) {
  const std::string src(source);
  if (text.size() > kMaxManifestBytes) return Corrupt(src + ": manifest larger than the limit");
  Result<Json> parsed = ParseStrictJson(text, src + ": the manifest", JsonLimits{.max_depth = kMaxJsonDepth, .quote_text = false});
  if (!parsed.ok()) return Corrupt(parsed.status().message());
  const Json& j = *parsed;
  if (!j.is_object()) return Corrupt(src + ": top level is not a JSON object");
  for (const auto& [key, value] : j.items())
    if (std::find(kFields.begin(), kFields.end(), key) == kFields.end())
      return Corrupt(src + ": unknown field \"" + key + "\"");

  Reader r(source);
  Manifest m;
  KVFS_ASSIGN_OR_RETURN(std::string format, r.String(j, "format"));
  if (format != kManifestFormat) return r.Err("format", "is \"" + format + "\", expected \"kvfs-manifest\"");
  KVFS_ASSIGN_OR_RETURN(int64_t version, r.IntField(j, "version", 1, kI64Max));
  KVFS_RETURN_IF_ERROR(
      CheckVersionAndChecksum(text, j, version, kOldestManifestVersion, kManifestVersion, "manifest", source));
  KVFS_ASSIGN_OR_RETURN(m.name, r.String(j, "name"));
  if (!IsValidAgentName(m.name)) return r.Err("name", "not a valid agent name");
  KVFS_ASSIGN_OR_RETURN(m.model_fingerprint, r.String(j, "model_fingerprint"));
  if (!IsHex128(m.model_fingerprint)) return r.Err("model_fingerprint", "not 32 lowercase hex digits");
  KVFS_ASSIGN_OR_RETURN(m.kv_format, r.String(j, "kv_format"));
  KVFS_ASSIGN_OR_RETURN(int64_t block_size, r.IntField(j, "block_size", 1, kMaxBlockSize));
  m.block_size = static_cast<uint32_t>(block_size);

  KVFS_ASSIGN_OR_RETURN(const Json* tokens, r.Field(j, "tokens"));
  if (!tokens->is_array()) return r.Err("tokens", "expected an array");
  m.tokens.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    KVFS_ASSIGN_OR_RETURN(int64_t t, r.Int((*tokens)[i], "tokens[" + std::to_string(i) + "]", 0,
                                           std::numeric_limits<int32_t>::max()));
    m.tokens.push_back(static_cast<int32_t>(t));
  }

  KVFS_ASSIGN_OR_RETURN(const Json* conv, r.Field(j, "conversation"));
  if (!conv->is_array()) return r.Err("conversation", "expected an array");
  for (size_t i = 0; i < conv->size(); ++i) {
    const std::string f = "conversation[" + std::to_string(i) + "]";
    const Json& turn = (*conv)[i];
    if (!turn.is_object() || turn.size() != 2) return r.Err(f, "expected an object with exactly \"role\" and \"text\"");
    ConversationTurn t;
    KVFS_ASSIGN_OR_RETURN(t.role, r.String(turn, "role"));
    KVFS_ASSIGN_OR_RETURN(t.text, r.String(turn, "text"));
    m.conversation.push_back(std::move(t));
  }

  KVFS_ASSIGN_OR_RETURN(const Json* blocks, r.Field(j, "blocks"));
  if (!blocks->is_array()) return r.Err("blocks", "expected an array");
  for (size_t i = 0; i < blocks->size(); ++i) {
    const Json& b = (*blocks)[i];
    if (!b.is_string() || !IsHex128(b.get_ref<const std::string&>()))
      return r.Err("blocks[" + std::to_string(i) + "]", "expected 32 lowercase hex digits");
    m.blocks.push_back(*BlockHashFromHex(b.get_ref<const std::string&>()));
  }

  KVFS_ASSIGN_OR_RETURN(const Json* tail, r.Field(j, "tail"));
  if (!tail->is_null()) {
    if (!tail->is_object() || tail->size() != 2) return r.Err("tail", "expected null or {\"file\", \"n_tokens\"}");
    TailRef t;
    KVFS_ASSIGN_OR_RETURN(t.file, r.String(*tail, "file"));
    KVFS_ASSIGN_OR_RETURN(int64_t n, r.IntField(*tail, "n_tokens", 1, kMaxBlockSize));
    t.n_tokens = static_cast<uint32_t>(n);
    m.tail = std::move(t);
  }

  KVFS_ASSIGN_OR_RETURN(const Json* config, r.Field(j, "config"));
  if (!config->is_object()) return r.Err("config", std::string("expected an object, got ") + config->type_name());
  m.config = *config;
  KVFS_ASSIGN_OR_RETURN(m.created_ms, r.IntField(j, "created_ms", 0, kI64Max));
  KVFS_ASSIGN_OR_RETURN(m.updated_ms, r.IntField(j, "updated_ms", 0, kI64Max));
  KVFS_ASSIGN_OR_RETURN(int64_t turn, r.IntField(j, "turn", 0, kI64Max));
  m.turn = static_cast<uint64_t>(turn);

  // Cross-field invariants (the same checks a writer must pass), reported as corruption.
  Status valid = ValidateManifest(m);
  if (!valid.ok()) return Corrupt(src + ": " + valid.message());
  return m;
}

}  // namespace kvfs::store
