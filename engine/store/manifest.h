// The per-agent manifest: everything needed to resume an agent (its text, token ids, the
// ordered list of its KV blocks and its tail) in one JSON document. Publishing a new manifest
// (write-temp, fsync, rename, fsync of the directory; see CacheStore::CommitTurn) is the commit
// point of a turn.
//
// JSON form (all fields required; unknown fields are rejected so that a newer writer's file is
// never half-understood; "version" says which fields exist):
//   {"format": "kvfs-manifest", "version": 2, "name": "alice",
//    "model_fingerprint": "<32 hex>", "kv_format": "q4", "block_size": 256,
//    "tokens": [1, 15043, ...], "conversation": [{"role": "user", "text": "..."}, ...],
//    "blocks": ["<32 hex>", ...], "tail": null | {"file": "tail.7.kvt", "n_tokens": 17},
//    "config": {...}, "created_ms": 1700000000000, "updated_ms": 1700000001000, "turn": 7,
//    "checksum": "<16 hex>"}
// "checksum" (version 2) is XXH3-64 of the file's exact bytes without it: the text before
// `,"checksum":` followed by the closing `}`. It is always the last field, so checking it needs
// no canonical JSON form; it catches a flipped bit inside a string or a number, which would
// otherwise still parse. Version 1 (the same without "checksum") is still read.
// Invariant: blocks * block_size + tail tokens <= tokens (the cache may lag the token list by
// the last sampled token, never lead it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/store/block_file.h"

namespace kvfs::store {

struct ConversationTurn {
  std::string role;
  std::string text;
  // In memory only (never stored): the TurnRequest::tag of the turn that added the entry, so a
  // caller that shows turns as they stream can tell which of them a snapshot already holds.
  // 0 for entries read back from disk or imported.
  uint64_t tag = 0;
  friend bool operator==(const ConversationTurn& a, const ConversationTurn& b) {
    return a.role == b.role && a.text == b.text;
  }
};

struct TailRef {
  std::string file;  // "tail.<turn>.kvt", in the agent's directory
  uint32_t n_tokens = 0;
  friend bool operator==(const TailRef&, const TailRef&) = default;
};

struct Manifest {
  std::string name;
  std::string model_fingerprint;  // 32 lowercase hex digits
  std::string kv_format;          // the KV layer's name for its format ("f16", "q4", ...)
  uint32_t block_size = 256;
  std::vector<int32_t> tokens;
  std::vector<ConversationTurn> conversation;
  std::vector<BlockHash> blocks;  // full blocks, in order
  std::optional<TailRef> tail;    // the partial last block, if any
  nlohmann::json config = nlohmann::json::object();  // opaque to the store
  int64_t created_ms = 0;         // unix time, milliseconds
  int64_t updated_ms = 0;
  uint64_t turn = 0;              // number of committed turns
  friend bool operator==(const Manifest&, const Manifest&) = default;
};

// `[A-Za-z0-9_-]{1,64}`: the agent names the filesystem accepts (a leading '.' is reserved).
bool IsValidAgentName(std::string_view name);
// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool ValidUtf8(std::string_view s);
// Bytes of the longest prefix of `s` that is well-formed UTF-8.
size_t ValidUtf8Prefix(std::string_view s);
// True when every character is a lowercase hex digit.
bool IsLowerHex(std::string_view s);
// True for exactly 32 lowercase hex digits.
bool IsHex128(std::string_view s);
// "tail.<decimal>.kvt".
bool IsTailFileName(std::string_view name);
std::string TailFileName(uint64_t turn);

// Checks the invariants above; kInvalidArgument naming the field.
Status ValidateManifest(const Manifest& m);

// Validates, then serializes (UTF-8 JSON, one line).
Result<std::string> SerializeManifest(const Manifest& m);

// Strict parse: malformed JSON, a missing, unknown or mistyped field, a checksum mismatch or a
// broken invariant -> kCorrupt whose message names `source` (the file) and the field.
Result<Manifest> ParseManifest(std::string_view json, std::string_view source);

}  // namespace kvfs::store
