// The text behind an agent's cached tokens, and how much of the cache a new context can keep.
//
// A turn's context is rendered as text (the chat template over the conversation) and matched
// against the text the cache holds, by characters, not by re-encoding: generated tokens are
// rarely what the tokenizer would make of their text. Every cached token carries the end, in the
// cached text, of the text it stands for:
//   - a generated token its own end (its piece as the reply shows it; a control token adds none);
//   - the tokens encoded from one piece of rendered text all the end of that piece (encoding is
//     not piecewise, so such a run is kept whole or not at all);
//   - a token past the text known (bytes that form no UTF-8: the text stops before them)
//     kNoTextEnd.
// When the new context differs inside the cached text, the cache is kept up to the last token
// that ends before the first difference and only the rest is encoded and computed again.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model/tokenizer.h"

namespace kvfs {

inline constexpr uint32_t kNoTextEnd = UINT32_MAX;

// Bytes that a and b share at their start, moved back to the start of a UTF-8 character.
size_t CommonTextPrefix(std::string_view a, std::string_view b);

// How many leading tokens end at or before byte `chars` (ends never decrease).
size_t TokensWithin(std::span<const uint32_t> ends, size_t chars);

// The tokens of a turn's context and the end of each in `rendered` (the turn's rendered prompt).
struct ContextMatch {
  const char* match = "new";     // new | exact | extend | diverge (TurnStats::match)
  std::vector<TokenId> tokens;
  std::vector<uint32_t> ends;
  size_t kept = 0;               // leading tokens taken from the cache as they are
};

// Matches `rendered` against a cache of `tokens` (with `ends`) over `text`. An empty `text`
// with tokens is a cache whose text is unknown (an imported one): the whole prompt is encoded,
// and the caller keeps the tokens it shares with the cache. `special`: how `rendered` is
// encoded (with the spans of its messages' contents, ChatTemplate::Format's).
ContextMatch MatchContext(const Tokenizer& tokenizer, const std::string& rendered, SpecialParsing special,
                          std::span<const TokenId> tokens, std::string_view text, std::span<const uint32_t> ends);

// The spans of `literal` (of a text) that lie past `from`, as spans of the text's rest from there.
std::vector<TextSpan> SpansFrom(std::span<const TextSpan> literal, size_t from);

// Persisted form of the ends (the manifest's "token_ends"): differences from the previous end,
// -1 for kNoTextEnd. FromJson checks them against the tokens and the text: nullopt when they do
// not fit (the caller then takes the whole text as one encoded run).
nlohmann::json TokenEndsToJson(std::span<const uint32_t> ends);
std::optional<std::vector<uint32_t>> TokenEndsFromJson(const nlohmann::json& j, size_t n_tokens, size_t text_bytes);

// The same as plain differences (kv.safetensors' token_ends), and back with the same checks.
std::vector<int64_t> TokenEndDeltas(std::span<const uint32_t> ends);
std::optional<std::vector<uint32_t>> TokenEndsFromDeltas(std::span<const int64_t> deltas, size_t n_tokens,
                                                         size_t text_bytes);

// Whether `tokens` stand for `text` as `ends` say (an imported cache's claim, checked before it is
// believed): each run of tokens with the same end must be what the tokenizer makes of its piece
// of text (as MatchContext encodes it, control tokens that add no text allowed after it), or
// their pieces (TokenToPiece) must spell it, as generated tokens do. Tokens without a known end
// are not checked: no text stands for them, and a turn never keeps them. Returns the first token
// that fails, or nullopt.
std::optional<size_t> FirstTokenNotSpellingText(const Tokenizer& tokenizer, std::span<const TokenId> tokens,
                                                std::string_view text, std::span<const uint32_t> ends);

// A turn's context text (its rendered prompt and the bytes of the tokens it generated) as the
// next turn renders it, with the reply as the reply shows it: bytes that form no UTF-8 as
// U+FFFD (ShowAsText), so that the next turn finds the text and extends the cache over them
// rather than diverging there. Each token's end moves onto that text: one inside a replaced
// sequence or a character goes to its end (the tokens are kept or dropped together). An
// unfinished character at the end (the turn's last, unfed token would have completed it) is
// left out, and its tokens get kNoTextEnd. Valid text is left as it is.
void ShowContextAsRendered(std::string& text, std::vector<uint32_t>& ends);

// Ends for `n` tokens encoded from a text of `text_bytes` bytes as one run.
std::vector<uint32_t> OneRunEnds(size_t n, size_t text_bytes);

}  // namespace kvfs
