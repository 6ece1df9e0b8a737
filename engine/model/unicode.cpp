// Unicode lookups over the build-time generated tables (see unicode/gen_unicode_tables.py).
#include "engine/model/unicode.h"

#include <algorithm>
#include <array>

namespace kvfs::unicode {
namespace tables {

struct Range {
  uint32_t first;
  uint16_t flags;
};
struct CasePair {
  uint32_t from;
  uint32_t to;
};

#include "unicode_tables.inc"

}  // namespace tables

uint16_t Flags(uint32_t cp) {
  if (cp < 256) return tables::kLatin1[cp];
  if (cp >= 0x110000) return kUndefined;
  // Last range whose start is <= cp.
  const auto* end = std::end(tables::kRanges);
  const auto* it = std::upper_bound(std::begin(tables::kRanges), end, cp,
                                    [](uint32_t v, const tables::Range& r) { return v < r.first; });
  return (it - 1)->flags;
}

uint32_t ToLower(uint32_t cp) {
  const auto* end = std::end(tables::kLower);
  const auto* it = std::lower_bound(std::begin(tables::kLower), end, cp,
                                    [](const tables::CasePair& p, uint32_t v) { return p.from < v; });
  return (it != end && it->from == cp) ? it->to : cp;
}

std::vector<uint32_t> DecodeUtf8Lossy(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  auto cont = [&](size_t k) { return i + k < n && (p[i + k] & 0xC0) == 0x80; };
  while (i < n) {
    const uint8_t b = p[i];
    uint32_t cp = kReplacementChar;
    size_t len = 1;
    if (b < 0x80) {
      cp = b;
    } else if ((b & 0xE0) == 0xC0 && cont(1)) {
      cp = ((b & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
      len = 2;
    } else if ((b & 0xF0) == 0xE0 && cont(1) && cont(2)) {
      cp = ((b & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
      len = 3;
    } else if ((b & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
      cp = ((b & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) |
           (p[i + 3] & 0x3Fu);
      len = 4;
      // F5..F7 leads encode values no code point has; keep the output encodable.
      if (cp > 0x10FFFF) {
        cp = kReplacementChar;
        len = 1;
      }
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= 0x10FFFF) {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    AppendUtf8(out, kReplacementChar);
  }
}

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
// bytes are given the code points 256, 257, ... in byte order.
constexpr bool SelfMapped(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

constexpr std::array<uint16_t, 256> MakeByteToUnicode() {
  std::array<uint16_t, 256> map{};
  int next = 256;
  for (int b = 0; b < 256; ++b) map[b] = static_cast<uint16_t>(SelfMapped(b) ? b : next++);
  return map;
}

constexpr std::array<uint16_t, 256> kByteToUnicode = MakeByteToUnicode();

constexpr std::array<uint8_t, 68> MakeShiftedToByte() {
  std::array<uint8_t, 68> map{};
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (!SelfMapped(b)) map[n++] = static_cast<uint8_t>(b);
  }
  return map;
}

constexpr std::array<uint8_t, 68> kShiftedToByte = MakeShiftedToByte();

}  // namespace

uint32_t ByteToUnicode(uint8_t byte) { return kByteToUnicode[byte]; }

int UnicodeToByte(uint32_t cp) {
  if (cp < 256) return SelfMapped(static_cast<int>(cp)) ? static_cast<int>(cp) : -1;
  if (cp < 256 + kShiftedToByte.size()) return kShiftedToByte[cp - 256];
  return -1;
}

}  // namespace kvfs::unicode
