#include "engine/store/json_checksum.h"

#include <spdlog/fmt/fmt.h>

#include "engine/core/xxh3_stream.h"
#include "engine/store/manifest.h"

namespace kvfs::store {
namespace {

// `,"checksum":"<hex>"}`: how every checksummed record ends.
std::string ChecksumSuffix(std::string_view hex) { return fmt::format(",\"{}\":\"{}\"}}", kJsonChecksumKey, hex); }

// XXH3-64 of `body` (a JSON object text without its closing brace) followed by '}'.
std::string ChecksumOfBody(std::string_view body) {
  Xxh3Stream state(Xxh3Stream::Width::k64);  // the body is an agent's text: a state kvfs zeros
  state.Update(body.data(), body.size());
  state.Update("}", 1);
  return fmt::format("{:016x}", state.Digest64());
}

}  // namespace

std::string AppendJsonChecksum(std::string object_text) {
  object_text.pop_back();  // the closing brace: the checksum goes before it, last
  const std::string hex = ChecksumOfBody(object_text);
  return object_text + ChecksumSuffix(hex);
}

std::string JsonChecksumProblem(std::string_view text, std::string_view hex) {
  if (hex.size() != 16 || !IsLowerHex(hex)) return "expected 16 lowercase hex digits";
  const std::string suffix = ChecksumSuffix(hex);
  if (!text.ends_with(suffix)) return "is not the last field as kvfs writes it (was the file edited?)";
  const std::string actual = ChecksumOfBody(text.substr(0, text.size() - suffix.size()));
  if (actual != hex) return "the contents hash to " + actual + ", not " + std::string(hex) + ": the file is damaged";
  return {};
}

Status CheckVersionAndChecksum(std::string_view text, const nlohmann::json& j, int64_t version, int oldest,
                               int newest, std::string_view kind, std::string_view source) {
  if (version < oldest || version > newest)
    return Unsupported(fmt::format("{}: {} version {} is not supported (this build reads {} to {})", source, kind,
                                   version, oldest, newest));
  const std::string key(kJsonChecksumKey);
  auto bad = [&](std::string_view why) { return Corrupt(fmt::format("{}: field \"{}\": {}", source, key, why)); };
  if (version == 1) return j.contains(key) ? bad("not part of version 1") : Status::Ok();
  if (!j.contains(key) || !j[key].is_string()) return bad("missing or not a string");
  if (std::string why = JsonChecksumProblem(text, j[key].get<std::string>()); !why.empty()) return bad(why);
  return Status::Ok();
}

}  // namespace kvfs::store
