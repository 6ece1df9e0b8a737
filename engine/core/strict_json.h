// JSON from text that anyone may have written (agent config.json, the daemon's config file,
// manifests and prefix records read back from disk, kv.safetensors headers, tuning files),
// parsed one way everywhere: nesting bounded before the parser runs (the checks and dumps
// that walk a value recurse), duplicate object keys refused (the parser would keep the last
// one silently, so two readers could disagree on what a file says), and optionally a bound on
// the parser's events (a parsed value costs far more memory than its text: `{}` is 2 bytes, a
// map node ~100).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"

namespace kvfs {

struct JsonLimits {
  int max_depth = 64;       // arrays and objects inside each other, the top level counting 1
  int64_t max_events = 0;   // parser events at most; 0: no bound
  // Whether an error message may quote the text near the error (the parser's "last read"): yes
  // for what a user just wrote, no for stored files that hold conversations (their messages go
  // to logs and status.json, which must never show an agent's text).
  bool quote_text = true;
};

// Text from a file or a user, for a message (which may end up in status.json and logs): at
// most `max` bytes, cut at a UTF-8 character boundary ("..." after a cut), control characters
// shown as '?', between `quote` characters unless quote is 0.
std::string ClipForMessage(std::string_view s, size_t max = 48, char quote = 0);

// Whether the text's nesting is at most `limit` (brackets inside strings do not count). Stops
// at the first bracket past the limit.
bool JsonDepthWithin(std::string_view text, int limit);

// The parsed value, or kInvalidArgument with a message that starts with `what`:
//   "<what> is not valid JSON: <the parser's reason>"
//   "<what> is nested deeper than <max_depth>"
//   "<what> has a duplicate key \"<key>\"" (the key clipped by ClipForMessage)
//   "<what> holds more JSON values than a valid one can (<max_events> parser events)"
// Callers that read their own files back map the code to kCorrupt.
Result<nlohmann::json> ParseStrictJson(std::string_view text, std::string_view what, JsonLimits limits = {});

}  // namespace kvfs
