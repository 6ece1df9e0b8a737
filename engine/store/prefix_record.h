// The persisted record of a shared prefix (.prefixes/<name>): its text and the KV blocks its
// prefill produced, so a restarted daemon shows it again and loads its blocks instead of
// prefilling it. One JSON file per prefix, <store>/prefixes/<name>.prefix, published by
// write-temp, fsync, rename, fsync of the directory; the blocks it names are refcounted by the
// store like an agent manifest's.
//
// JSON form (all fields required, unknown ones rejected):
//   {"format": "kvfs-prefix", "version": 2, "name": "story.txt", "owner_uid": 1000,
//    "text": "...", "model_fingerprint": "<32 hex>", "kv_format": "q4", "block_size": 256,
//    "blocks": ["<32 hex>", ...], "checksum": "<16 hex>"}
// "checksum" (version 2, always the last field) is the manifests' (json_checksum.h): a damaged
// record is refused instead of naming the wrong text or blocks. Version 1 (without it) is read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"
#include "engine/store/block_file.h"

namespace kvfs::store {

struct PrefixRecord {
  std::string name;
  uint32_t owner_uid = 0;
  std::string text;
  std::string model_fingerprint;  // 32 lowercase hex digits
  std::string kv_format;
  uint32_t block_size = 256;
  std::vector<BlockHash> blocks;  // full blocks, in order
  friend bool operator==(const PrefixRecord&, const PrefixRecord&) = default;
};

// The names .prefixes/ accepts: [A-Za-z0-9_.-]{1,64} without a leading '.'.
bool IsValidPrefixName(std::string_view name);

Result<std::string> SerializePrefix(const PrefixRecord& p);
// Strict: kCorrupt naming `source` and the field (a checksum mismatch included); a version this
// build does not know: kUnsupported.
Result<PrefixRecord> ParsePrefix(std::string_view json, std::string_view source);

}  // namespace kvfs::store
