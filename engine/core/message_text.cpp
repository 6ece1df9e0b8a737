#include "engine/core/message_text.h"

#include <cstdint>

namespace kvfs {
namespace {

// Length of the well-formed UTF-8 sequence of two or more bytes at s[i] (RFC 3629: no
// overlong forms, no surrogates, nothing past U+10FFFF), or 0.
size_t Utf8SequenceAt(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  }
  if (n == 0 || i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  // U+0080..U+009F (C1 controls, e.g. U+009B, a terminal's CSI) are not printable either.
  if (n == 2 && c == 0xC2 && b(i + 1) <= 0x9F) return 0;
  return n;
}

void AppendHex(std::string& out, uint8_t c) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 15];
}

}  // namespace

std::string QuoteForMessage(std::string_view s, size_t max_bytes) {
  std::string out = "'";
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    const size_t n = c < 0x80 ? 1 : Utf8SequenceAt(s, i);
    const size_t take = n == 0 ? 1 : n;
    if (i + take > max_bytes) break;
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else if (n >= 2) {
      out.append(s.substr(i, n));
    } else {
      AppendHex(out, c);  // a control byte, DEL, or a byte of no well-formed character
    }
    i += take;
  }
  out += '\'';
  if (i < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace kvfs
