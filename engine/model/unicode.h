// Unicode helpers for the tokenizers: code point category flags (tables generated at build
// time from UnicodeData.txt), simple lower-casing, UTF-8 coding with llama.cpp's error
// behaviour, and GPT-2's byte-level alphabet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvfs::unicode {

// Category flags of a code point. Bit values are shared with gen_unicode_tables.py.
enum CpFlag : uint16_t {
  kUndefined = 0x0001,    // unassigned (Cn), or beyond U+10FFFF
  kNumber = 0x0002,       // \p{N}
  kLetter = 0x0004,       // \p{L}
  kSeparator = 0x0008,    // \p{Z}
  kMark = 0x0010,         // \p{M}
  kPunctuation = 0x0020,  // \p{P}
  kSymbol = 0x0040,       // \p{S}
  kControl = 0x0080,      // \p{C}
  kCategoryMask = 0x00FF,
  kWhitespace = 0x0100,   // \s as llama.cpp defines it (PropList White_Space)
};

inline constexpr uint32_t kReplacementChar = 0xFFFD;

uint16_t Flags(uint32_t cp);
inline bool IsWhitespace(uint32_t cp) { return (Flags(cp) & kWhitespace) != 0; }
// Simple (one-to-one) lower-case mapping from UnicodeData.txt; cp itself when it has none.
uint32_t ToLower(uint32_t cp);

// Length of a UTF-8 sequence judged by its lead byte only (llama.cpp's unicode_len_utf8):
// continuation and invalid bytes count as 1. Used where llama.cpp splits text into
// "characters" without validating it (SentencePiece symbols, BPE symbols).
inline size_t Utf8SeqLen(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Decodes UTF-8 the way llama.cpp's pre-tokenizer does: a byte that does not start a
// complete sequence becomes U+FFFD and decoding resumes at the next byte. (Overlong forms
// are accepted, as there; values above U+10FFFF are replaced.)
std::vector<uint32_t> DecodeUtf8Lossy(std::string_view s);
void AppendUtf8(std::string& out, uint32_t cp);

// GPT-2 byte-level BPE alphabet: every byte maps to a printable code point.
uint32_t ByteToUnicode(uint8_t byte);
// Inverse of ByteToUnicode; -1 when cp is not part of the alphabet.
int UnicodeToByte(uint32_t cp);

}  // namespace kvfs::unicode
