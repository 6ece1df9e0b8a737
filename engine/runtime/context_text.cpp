#include "engine/runtime/context_text.h"

#include <algorithm>

namespace kvfs {

size_t CommonTextPrefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t p = static_cast<size_t>(std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()).first -
                                 a.begin());
  // Inside a character that both start alike (é and è share their first byte): back to its start.
  if (p < n)
    while (p > 0 && (static_cast<uint8_t>(a[p]) & 0xC0) == 0x80) --p;
  return p;
}

size_t TokensWithin(std::span<const uint32_t> ends, size_t chars) {
  return static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), chars,
                                              [](size_t c, uint32_t end) { return c < end; }) -
                             ends.begin());
}

std::vector<uint32_t> OneRunEnds(size_t n, size_t text_bytes) {
  return std::vector<uint32_t>(n, static_cast<uint32_t>(text_bytes));
}

std::vector<TextSpan> SpansFrom(std::span<const TextSpan> literal, size_t from) {
  std::vector<TextSpan> out;
  for (const TextSpan& s : literal)
    if (s.end > from) out.push_back({std::max(s.begin, from) - from, s.end - from});
  return out;
}

ContextMatch MatchContext(const Tokenizer& tokenizer, const std::string& rendered, std::span<const TextSpan> literal,
                          std::span<const TokenId> tokens, std::string_view text, std::span<const uint32_t> ends) {
  ContextMatch m;
  // The tokens of cache[0, kept) and then the encoding of rendered[from, end) as one run.
  auto build = [&](const char* match, size_t kept, size_t from) {
    m.match = match;
    m.kept = kept;
    m.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(kept));
    m.ends.assign(ends.begin(), ends.begin() + static_cast<std::ptrdiff_t>(kept));
    if (from < rendered.size() || kept == 0) {
      // Encoded as it continues the kept tokens: the text the model sees is the rendered text.
      const std::string_view rest = std::string_view(rendered).substr(from);
      const std::vector<TextSpan> rest_literal = SpansFrom(literal, from);
      const SpecialParsing special(rest_literal);
      const std::vector<TokenId> more = kept == 0 ? tokenizer.Encode(rest, /*add_special=*/true, special)
                                                  : tokenizer.EncodeContinuation(rest, tokens[kept - 1], special);
      m.tokens.insert(m.tokens.end(), more.begin(), more.end());
      m.ends.resize(m.tokens.size(), static_cast<uint32_t>(rendered.size()));
    }
    return m;
  };
  if (tokens.empty()) return build("new", 0, 0);
  if (text.empty() || ends.size() != tokens.size()) return build("diverge", 0, 0);
  const bool every_end_known = ends.back() == text.size();
  if (every_end_known && rendered == text) return build("exact", tokens.size(), rendered.size());
  if (every_end_known && rendered.size() > text.size() && rendered.compare(0, text.size(), text) == 0)
    return build("extend", tokens.size(), text.size());
  const size_t kept = TokensWithin(ends, CommonTextPrefix(rendered, text));
  return build("diverge", kept, kept == 0 ? 0 : ends[kept - 1]);
}

std::optional<size_t> FirstTokenNotSpellingText(const Tokenizer& tokenizer, std::span<const TokenId> tokens,
                                                std::string_view text, std::span<const uint32_t> ends) {
  if (ends.size() != tokens.size()) return 0;
  size_t start = 0;  // of the current run's text
  for (size_t i = 0; i < tokens.size();) {
    if (ends[i] == kNoTextEnd) break;  // (and so are all after it)
    if (ends[i] < start || ends[i] > text.size()) return i;
    size_t j = i;
    while (j < tokens.size() && ends[j] == ends[i]) ++j;
    const std::string_view piece = text.substr(start, ends[i] - start);
    const std::span<const TokenId> run = tokens.subspan(i, j - i);
    std::string spelled;
    for (TokenId t : run) spelled += tokenizer.TokenToPiece(t, /*render_special=*/false);
    if (spelled != piece) {
      const std::vector<TokenId> encoded = i == 0 ? tokenizer.Encode(piece, /*add_special=*/true, /*parse_special=*/true)
                                                  : tokenizer.EncodeContinuation(piece, tokens[i - 1], true);
      if (encoded.size() > run.size() || !std::equal(encoded.begin(), encoded.end(), run.begin())) return i;
      for (size_t k = encoded.size(); k < run.size(); ++k)
        if (!tokenizer.TokenToPiece(run[k], false).empty()) return i + k;
    }
    start = ends[i];
    i = j;
  }
  return std::nullopt;
}

std::vector<int64_t> TokenEndDeltas(std::span<const uint32_t> ends) {
  std::vector<int64_t> out;
  out.reserve(ends.size());
  uint32_t previous = 0;
  for (uint32_t end : ends) {
    if (end == kNoTextEnd) {
      out.push_back(-1);
    } else {
      out.push_back(end - previous);
      previous = end;
    }
  }
  return out;
}

std::optional<std::vector<uint32_t>> TokenEndsFromDeltas(std::span<const int64_t> deltas, size_t n_tokens,
                                                         size_t text_bytes) {
  if (deltas.size() != n_tokens) return std::nullopt;
  std::vector<uint32_t> ends;
  ends.reserve(n_tokens);
  uint64_t end = 0;
  bool unknown = false;
  for (int64_t delta : deltas) {
    if (delta == -1) {
      unknown = true;
      ends.push_back(kNoTextEnd);
      continue;
    }
    if (delta < 0 || unknown) return std::nullopt;  // ends never decrease; none known after an unknown one
    end += static_cast<uint64_t>(delta);
    if (end > text_bytes) return std::nullopt;
    ends.push_back(static_cast<uint32_t>(end));
  }
  // Without unknown ones the tokens cover the whole text.
  if (!unknown && n_tokens > 0 && end != text_bytes) return std::nullopt;
  return ends;
}

nlohmann::json TokenEndsToJson(std::span<const uint32_t> ends) { return TokenEndDeltas(ends); }

std::optional<std::vector<uint32_t>> TokenEndsFromJson(const nlohmann::json& j, size_t n_tokens, size_t text_bytes) {
  if (!j.is_array() || j.size() != n_tokens) return std::nullopt;
  std::vector<int64_t> deltas;
  deltas.reserve(n_tokens);
  for (const nlohmann::json& d : j) {
    if (!d.is_number_integer()) return std::nullopt;
    deltas.push_back(d.get<int64_t>());
  }
  return TokenEndsFromDeltas(deltas, n_tokens, text_bytes);
}

}  // namespace kvfs
