#include "engine/store/prefix_record.h"

#include <set>

#include <nlohmann/json.hpp>

#include "engine/core/strict_json.h"
#include "engine/store/block_format.h"
#include "engine/store/json_checksum.h"
#include "engine/store/manifest.h"

namespace kvfs::store {

bool IsValidPrefixName(std::string_view name) {
  if (name.empty() || name.size() > kMaxAgentNameLen || name[0] == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

Result<std::string> SerializePrefix(const PrefixRecord& p) {
  if (!IsValidPrefixName(p.name)) return InvalidArgument("prefix record: invalid name \"" + p.name + "\"");
  if (!IsHex128(p.model_fingerprint)) return InvalidArgument("prefix record: model_fingerprint is not 32 hex digits");
  if (!ValidUtf8(p.text)) return InvalidArgument("prefix record: text is not UTF-8");
  if (p.block_size == 0 || p.block_size > kMaxBlockSize) return InvalidArgument("prefix record: bad block_size");
  nlohmann::json blocks = nlohmann::json::array();
  for (const BlockHash& h : p.blocks) blocks.push_back(ToHex(h));
  const nlohmann::json j = {{"format", kPrefixFormat}, {"version", kPrefixVersion},   {"name", p.name},
                            {"owner_uid", p.owner_uid}, {"text", p.text},              {"model_fingerprint", p.model_fingerprint},
                            {"kv_format", p.kv_format}, {"block_size", p.block_size}, {"blocks", blocks}};
  try {
    return AppendJsonChecksum(j.dump());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("prefix record cannot be serialized: ") + e.what());
  }
}

Result<PrefixRecord> ParsePrefix(std::string_view json, std::string_view source) {
  const std::string where(source);
  auto bad = [&](std::string_view field, std::string_view why) {
    return Corrupt(where + ": field \"" + std::string(field) + "\": " + std::string(why));
  };
  if (json.size() > kMaxManifestBytes) return Corrupt(where + ": larger than the limit");
  Result<nlohmann::json> parsed = ParseStrictJson(json, where + ": the prefix record", JsonLimits{.quote_text = false});
  if (!parsed.ok()) return Corrupt(parsed.status().message());
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return Corrupt(where + ": not a JSON object");
  static const std::set<std::string> kFields = {"format", "version", "name", "owner_uid", "text",
                                                "model_fingerprint", "kv_format", "block_size", "blocks"};
  const std::string checksum_key(kJsonChecksumKey);
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!kFields.count(it.key()) && it.key() != checksum_key) return bad(it.key(), "unknown");
  for (const std::string& f : kFields)
    if (!j.contains(f)) return bad(f, "missing");
  if (!j["format"].is_string() || j["format"].get<std::string>() != kPrefixFormat) return bad("format", "not kvfs-prefix");
  if (!j["version"].is_number_integer()) return bad("version", "not an integer");
  KVFS_RETURN_IF_ERROR(CheckVersionAndChecksum(json, j, j["version"].get<int64_t>(), kOldestPrefixVersion,
                                               kPrefixVersion, "prefix record", source));
  PrefixRecord p;
  if (!j["name"].is_string() || !IsValidPrefixName(p.name = j["name"].get<std::string>())) return bad("name", "invalid");
  if (!j["owner_uid"].is_number_unsigned() || j["owner_uid"].get<uint64_t>() > UINT32_MAX) return bad("owner_uid", "invalid");
  p.owner_uid = j["owner_uid"].get<uint32_t>();
  if (!j["text"].is_string() || !ValidUtf8(p.text = j["text"].get<std::string>())) return bad("text", "not a UTF-8 string");
  if (!j["model_fingerprint"].is_string() || !IsHex128(p.model_fingerprint = j["model_fingerprint"].get<std::string>()))
    return bad("model_fingerprint", "not 32 lowercase hex digits");
  if (!j["kv_format"].is_string()) return bad("kv_format", "not a string");
  p.kv_format = j["kv_format"].get<std::string>();
  if (!j["block_size"].is_number_unsigned() || j["block_size"].get<uint64_t>() == 0 ||
      j["block_size"].get<uint64_t>() > kMaxBlockSize)
    return bad("block_size", "out of range");
  p.block_size = j["block_size"].get<uint32_t>();
  if (!j["blocks"].is_array()) return bad("blocks", "not an array");
  for (const auto& h : j["blocks"]) {
    if (!h.is_string() || !IsHex128(h.get<std::string>())) return bad("blocks", "not 32 lowercase hex digits");
    p.blocks.push_back(*BlockHashFromHex(h.get<std::string>()));
  }
  return p;
}

}  // namespace kvfs::store
