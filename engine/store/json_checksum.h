// The checksum that ends the store's JSON records (manifests from version 2, prefix records
// from version 2): `,"checksum":"<16 hex>"}` closes the object, where the hex is XXH3-64 of the
// file's exact bytes without that field (the text before `,"checksum":`, then `}`). Because
// the field is always last, checking it needs no canonical JSON form; it catches a flipped bit
// inside a string or a number, which would otherwise still parse.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/store/block_format.h"

namespace kvfs::store {

// `object_text`: a serialized JSON object (ends with '}'). Returns it with the checksum field
// added as its last member.
std::string AppendJsonChecksum(std::string object_text);

// Empty when `text` ends with the checksum field as AppendJsonChecksum writes it and the
// checksum matches; otherwise why not (for a "field \"checksum\": <why>" message). `hex` is the
// value the parser read from the field.
std::string JsonChecksumProblem(std::string_view text, std::string_view hex);

// The version rules both records share. `version` (read from `j`, the parse of `text`) must lie
// in [oldest, newest], else kUnsupported naming `kind` ("manifest", "prefix record"); version 1
// has no checksum field and later ones end with a matching one, else kCorrupt naming `source`
// and the field.
Status CheckVersionAndChecksum(std::string_view text, const nlohmann::json& j, int64_t version, int oldest,
                               int newest, std::string_view kind, std::string_view source);

}  // namespace kvfs::store
