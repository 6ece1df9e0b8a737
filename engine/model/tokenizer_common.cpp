// The part of Encode/TokenToPiece that does not depend on the algorithm: cutting special
// tokens out of the text before tokenizing, and rendering control, user-defined and byte
// tokens.
#include <algorithm>
#include <array>

#include "engine/model/tokenizer_internal.h"

namespace kvfs::tok {
namespace {

// C isspace() in the "C" locale, which llama.cpp uses when stripping around special tokens.
bool IsCSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

VocabTokenizer::VocabTokenizer(VocabData& data) {
  tokens_ = std::move(data.tokens);
  attrs_ = std::move(data.attrs);
  attr_bits_ = std::move(data.attr_bits);
  bos_ = data.bos;
  eos_ = data.eos;
  eot_ = data.eot;
  unk_ = data.unk;
  add_bos_ = data.add_bos;
  add_eos_ = data.add_eos;
  eog_ = std::move(data.eog);
  BuildIndex();

  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (attr_bits_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      special_.push_back(static_cast<TokenId>(i));
    }
  }
  // Longest first, so that a special token containing another wins; ties by id keep the
  // order deterministic (llama.cpp leaves it to std::sort).
  std::stable_sort(special_.begin(), special_.end(), [&](TokenId a, TokenId b) {
    return tokens_[a].size() > tokens_[b].size();
  });
}

std::vector<VocabTokenizer::Fragment> VocabTokenizer::Partition(std::string_view text,
                                                                SpecialParsing parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({text, kNoToken});

  // Most special tokens cannot occur at all; skip those whose first byte is absent.
  std::array<bool, 256> present{};
  for (char c : text) present[static_cast<uint8_t>(c)] = true;

  // Whether an occurrence of a control token at text[at, at + size) may become the token.
  const std::span<const TextSpan> literal = parse_special.literal;
  auto outside_literal = [&](size_t at, size_t size) {
    // Spans are sorted: those ending after `at` and beginning before its end overlap it (empty
    // ones overlap nothing).
    auto it = std::upper_bound(literal.begin(), literal.end(), at,
                               [](size_t pos, const TextSpan& s) { return pos < s.end; });
    for (; it != literal.end() && it->begin < at + size; ++it)
      if (it->begin < it->end) return false;
    return true;
  };

  std::vector<Fragment> next;
  for (TokenId id : special_) {
    const uint16_t attr = attr_bits_[id];
    // Text inside the literal spans: control and unknown tokens, and the template's markers.
    const bool control = (attr & (kAttrControl | kAttrUnknown)) != 0 ||
                         std::find(parse_special.markers.begin(), parse_special.markers.end(), id) !=
                             parse_special.markers.end();
    if (!parse_special.parse && (attr & (kAttrControl | kAttrUnknown))) continue;
    const std::string_view tok = tokens_[id];
    if (!present[static_cast<uint8_t>(tok[0])]) continue;

    next.clear();
    bool found = false;
    for (const Fragment& frag : frags) {
      if (frag.token != kNoToken) {
        next.push_back(frag);
        continue;
      }
      std::string_view rest = frag.text;
      for (size_t at = rest.find(tok); at != std::string_view::npos; at = rest.find(tok, at)) {
        const size_t offset = static_cast<size_t>(rest.data() - text.data()) + at;
        if (control && !literal.empty() && !outside_literal(offset, tok.size())) {
          ++at;  // text here: look further on in the same fragment
          continue;
        }
        found = true;
        std::string_view left = rest.substr(0, at);
        if (attr & kAttrLstrip) {
          while (!left.empty() && IsCSpace(left.back())) left.remove_suffix(1);
        }
        if (!left.empty()) next.push_back({left, kNoToken});
        next.push_back({rest.substr(at, tok.size()), id});
        rest = rest.substr(at + tok.size());
        if (attr & kAttrRstrip) {
          while (!rest.empty() && IsCSpace(rest.front())) rest.remove_prefix(1);
        }
        at = 0;
      }
      if (!rest.empty()) next.push_back({rest, kNoToken});
    }
    if (found) frags.swap(next);
  }
  return frags;
}

std::string VocabTokenizer::TokenToPiece(TokenId id, bool render_special) const {
  if (id < 0 || id >= n_vocab()) return {};
  const uint16_t attr = attr_bits_[id];
  if (attr & (kAttrControl | kAttrUnknown)) return render_special ? tokens_[id] : std::string();
  if (attr & kAttrUserDefined) return tokens_[id];
  if (attr & kAttrNormal) return NormalPiece(id);
  if (attr & kAttrByte) {
    const int byte = ParseByteToken(tokens_[id]);
    return byte < 0 ? std::string() : std::string(1, static_cast<char>(byte));
  }
  return {};  // undefined and unused tokens render as nothing, as in llama.cpp
}

}  // namespace kvfs::tok
