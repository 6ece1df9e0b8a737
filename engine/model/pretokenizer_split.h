// Internal to the pre-tokenizers: the split patterns as hand-written matchers over code
// points. Each function documents the regular expression it stands for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvfs::pretok {

// The text being split: code points and their unicode::Flags().
struct CodePoints {
  std::vector<uint32_t> cp;
  std::vector<uint16_t> flags;
};

// Piece lengths in code points, in order; they sum to the text length.
using Pieces = std::vector<size_t>;

// A regex-style stage: the length of the pattern's match starting exactly at `pos` (the
// piece ends at `end`), or 0 when it does not match there. None of the patterns can match
// the empty string, so 0 is unambiguous.
using Matcher = size_t (*)(const CodePoints& t, size_t pos, size_t end);
// A stage that cuts a whole piece [begin, end) itself, appending the lengths to `out`.
using Scanner = void (*)(const CodePoints& t, size_t begin, size_t end, Pieces& out);

struct Stage {
  Matcher match = nullptr;  // exactly one of the two is set
  Scanner scan = nullptr;
};

// Applies one stage to every piece: matches and the gaps between them become pieces
// (std::regex_iterator semantics, as llama.cpp's unicode_regex_split uses).
Pieces ApplyStage(const CodePoints& t, const Pieces& in, const Stage& stage);

// --- scanners (llama.cpp implements these patterns by hand too; we follow its code paths)
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void ScanGpt2(const CodePoints& t, size_t begin, size_t end, Pieces& out);
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
void ScanLlama3(const CodePoints& t, size_t begin, size_t end, Pieces& out);
// The same with \p{N} instead of \p{N}{1,3} (qwen2).
void ScanQwen2(const CodePoints& t, size_t begin, size_t end, Pieces& out);
// \s+$ : the whitespace run that ends the piece.
void ScanTrailingSpace(const CodePoints& t, size_t begin, size_t end, Pieces& out);

// --- matchers
size_t MatchNewline(const CodePoints& t, size_t pos, size_t end);         // [\r\n]
size_t MatchNumber(const CodePoints& t, size_t pos, size_t end);          // \p{N}
size_t MatchNumbers(const CodePoints& t, size_t pos, size_t end);         // \p{N}+
size_t MatchThreeDigits(const CodePoints& t, size_t pos, size_t end);     // [0-9][0-9][0-9]
size_t MatchSpaceLetters(const CodePoints& t, size_t pos, size_t end);    // \s?\p{L}+
size_t MatchSpacePunct(const CodePoints& t, size_t pos, size_t end);      // \s?\p{P}+
size_t MatchPunctDefault(const CodePoints& t, size_t pos, size_t end);    // [\p{P}\$\+<=>\^~\|]+
size_t MatchPunctFalcon(const CodePoints& t, size_t pos, size_t end);     // [\p{P}\$\+<=>\^~\|`]+
size_t MatchCjk(const CodePoints& t, size_t pos, size_t end);             // [一-龥ࠀ-一가-퟿]+
size_t MatchDeepseekLetters(const CodePoints& t, size_t pos, size_t end); // \s?[A-Za-zµÀ-Ö...]+
size_t MatchDeepseekPunct(const CodePoints& t, size_t pos, size_t end);   // \s?[!-/:-~！-／...]+
size_t MatchPoroWord(const CodePoints& t, size_t pos, size_t end);        // ?[^(\s|.,!?…。，、।۔،)]+

}  // namespace kvfs::pretok
