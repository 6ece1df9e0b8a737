// The pre-tokenizer split patterns, written out as matchers over code points.
//
// How llama.cpp evaluates the original patterns decides what the classes mean here:
//  * Patterns with \p{..} run through std::regex over a "collapsed" string in which each
//    non-ASCII code point is one byte standing for its category (\v for whitespace) and the
//    \p{..} classes are that byte plus the category's ASCII members. For \p{L}, \p{N}, \p{P}
//    and \s this is exactly a test of the code point's flags, because no code point is both
//    whitespace and a letter, number or punctuation.
//  * Patterns without \p{..} run through std::wregex over the code points, with non-ASCII
//    whitespace replaced by \v first. So an explicit range such as 。 (U+3000-U+3002) does
//    not match U+3000, which is whitespace: only \s does. WideValue() applies that mapping.
//  * ECMAScript alternation takes the first alternative that matches (not the longest), and
//    quantifiers backtrack; each matcher below spells out the outcome of that search.
#include "engine/model/pretokenizer_split.h"

#include <algorithm>
#include <iterator>

#include "engine/model/unicode.h"

namespace kvfs::pretok {
namespace {

using unicode::kLetter;
using unicode::kNumber;
using unicode::kPunctuation;
using unicode::kWhitespace;

constexpr uint32_t kOutside = 0xFFFFFFFF;  // "no code point": past the end of the piece

struct CpRange {
  uint32_t lo, hi;
};

template <size_t N>
bool InRanges(uint32_t v, const CpRange (&ranges)[N]) {
  // Ranges are sorted and disjoint: find the last one starting at or below v.
  const auto* it = std::upper_bound(std::begin(ranges), std::end(ranges), v,
                                    [](uint32_t x, const CpRange& r) { return x < r.lo; });
  return it != std::begin(ranges) && v <= (it - 1)->hi;
}

bool Ws(const CodePoints& t, size_t i) { return (t.flags[i] & kWhitespace) != 0; }
bool Has(const CodePoints& t, size_t i, uint16_t flag) { return (t.flags[i] & flag) != 0; }

// The value std::wregex sees (see the file comment).
uint32_t WideValue(const CodePoints& t, size_t i) {
  return (t.cp[i] > 0x7F && Ws(t, i)) ? 0x0B : t.cp[i];
}

// A piece [begin, end) seen by the scanners: reads past the end give "nothing" (flags 0),
// as llama.cpp's hand-written splitters do.
struct Piece {
  const CodePoints& t;
  size_t end;
  uint32_t cp(size_t i) const { return i < end ? t.cp[i] : kOutside; }
  uint16_t fl(size_t i) const { return i < end ? t.flags[i] : 0; }
};

// 's|'t|'re|'ve|'m|'ll|'d at pos: its length, or 0. `fold` makes it case-insensitive.
size_t Contraction(const Piece& p, size_t pos, bool fold) {
  if (p.cp(pos) != '\'' || pos + 1 >= p.end) return 0;
  auto at = [&](size_t i) { return fold ? unicode::ToLower(p.cp(i)) : p.cp(i); };
  const uint32_t a = at(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 < p.end) {
    const uint32_t b = at(pos + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

constexpr uint16_t kWordish = kWhitespace | kLetter | kNumber;

// \s?X+ where X never matches whitespace: an optional leading whitespace is kept only when
// X follows it (otherwise the regex backtracks and X+ must start at pos, which it cannot).
template <typename Pred>
size_t OptionalSpaceThenRun(const CodePoints& t, size_t pos, size_t end, Pred x) {
  size_t q = pos;
  if (Ws(t, q)) {
    if (q + 1 >= end || !x(q + 1)) return 0;
    ++q;
  } else if (!x(q)) {
    return 0;
  }
  while (q < end && x(q)) ++q;
  return q - pos;
}

template <typename Pred>
size_t Run(size_t pos, size_t end, Pred x) {
  size_t q = pos;
  while (q < end && x(q)) ++q;
  return q - pos;
}

bool DefaultSymbol(uint32_t c) {
  return c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' ||
         c == '|';
}

void ScanLlama3Family(const CodePoints& t, size_t begin, size_t end, size_t max_digits,
                      Pieces& out) {
  const Piece p{t, end};
  size_t pos = begin;
  auto emit = [&](size_t to) {
    out.push_back(to - pos);
    pos = to;
  };
  while (pos < end) {
    if (size_t n = Contraction(p, pos, /*fold=*/true)) {
      emit(pos + n);
      continue;
    }
    const uint32_t c = p.cp(pos);
    const uint16_t f = p.fl(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c != '\r' && c != '\n' && !(f & kNumber) && ((f & kLetter) || (p.fl(pos + 1) & kLetter))) {
      size_t q = pos + 1;
      while (p.fl(q) & kLetter) ++q;
      emit(q);
      continue;
    }
    // \p{N}{1,max_digits}: a long number becomes several pieces, left to right.
    if (f & kNumber) {
      size_t q = pos;
      while ((p.fl(q) & kNumber) && q - pos < max_digits) ++q;
      emit(q);
      continue;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    const size_t s = pos + (c == ' ');
    if (!(p.fl(s) & kWordish) && f != 0) {
      size_t q = s;
      while (p.fl(q) != 0 && !(p.fl(q) & kWordish)) ++q;
      while (p.cp(q) == '\r' || p.cp(q) == '\n') ++q;
      emit(q);
      continue;
    }
    size_t n_ws = 0, after_last_newline = 0;
    while (p.fl(pos + n_ws) & kWhitespace) {
      const uint32_t w = p.cp(pos + n_ws);
      if (w == '\r' || w == '\n') after_last_newline = pos + n_ws + 1;
      ++n_ws;
    }
    if (after_last_newline > 0) {  // \s*[\r\n]+ (the \s* backtracks to the last newline)
      emit(after_last_newline);
    } else if (n_ws > 1 && pos + n_ws < end) {  // \s+(?!\S): leave one space for the next word
      emit(pos + n_ws - 1);
    } else if (n_ws > 0) {  // \s+
      emit(pos + n_ws);
    } else {
      emit(pos + 1);
    }
  }
}

// [一-龥ࠀ-一가-퟿]
constexpr CpRange kCjk[] = {{0x0800, 0x9FA5}, {0xAC00, 0xD7FF}};

// The letter class of deepseek-llm's pattern: the cased letters (Lu, Ll, Lt) as the original
// tokenizer listed them. (Some members are canonical singletons, e.g. U+1FBE and U+212A,
// which text normalisation would turn into other code points; they are spelt in hex here.)
constexpr CpRange kDeepseekLetters[] = {
    {0x0041, 0x005A}, {0x0061, 0x007A}, {0x00B5, 0x00B5}, {0x00C0, 0x00D6}, {0x00D8, 0x00F6},
    {0x00F8, 0x01BA}, {0x01BC, 0x01BF}, {0x01C4, 0x0293}, {0x0295, 0x02AF}, {0x0370, 0x0373},
    {0x0376, 0x0377}, {0x037B, 0x037D}, {0x037F, 0x037F}, {0x0386, 0x0386}, {0x0388, 0x038A},
    {0x038C, 0x038C}, {0x038E, 0x03A1}, {0x03A3, 0x03F5}, {0x03F7, 0x0481}, {0x048A, 0x052F},
    {0x0531, 0x0556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F},
    {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3},
    {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943},
};

// [!-/:-~！-／：-～‘-‟　-。] (note :-~ spans the ASCII letters too)
constexpr CpRange kDeepseekPunct[] = {
    {0x0021, 0x002F}, {0x003A, 0x007E}, {0x2018, 0x201F},
    {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};

// The members of [^(\s|.,!?…。，、।۔،)] that are excluded, besides \s.
constexpr uint32_t kPoroStops[] = {'(', ')', '|', '.', ',', '!', '?', 0x2026,
                                   0x3002, 0xFF0C, 0x3001, 0x0964, 0x06D4, 0x060C};

}  // namespace

Pieces ApplyStage(const CodePoints& t, const Pieces& in, const Stage& stage) {
  Pieces out;
  out.reserve(in.size() * 2);
  size_t begin = 0;
  for (size_t len : in) {
    const size_t end = begin + len;
    if (stage.scan != nullptr) {
      stage.scan(t, begin, end, out);
    } else {
      // regex_iterator: search for the leftmost match, keep the unmatched gap before it as
      // a piece of its own, continue after the match.
      size_t gap = begin;
      size_t pos = begin;
      while (pos < end) {
        const size_t n = stage.match(t, pos, end);
        if (n == 0) {
          ++pos;
          continue;
        }
        if (pos > gap) out.push_back(pos - gap);
        out.push_back(n);
        pos += n;
        gap = pos;
      }
      if (gap < end) out.push_back(end - gap);
    }
    begin = end;
  }
  return out;
}

void ScanGpt2(const CodePoints& t, size_t begin, size_t end, Pieces& out) {
  const Piece p{t, end};
  size_t pos = begin;
  auto emit = [&](size_t to) {
    out.push_back(to - pos);
    pos = to;
  };
  while (pos < end) {
    if (size_t n = Contraction(p, pos, /*fold=*/false)) {
      emit(pos + n);
      continue;
    }
    // ' ?' then one of \p{L}+, \p{N}+, [^\s\p{L}\p{N}]+ (a code point past the end has no
    // flags and matches none of them).
    const size_t s = pos + (p.cp(pos) == ' ');
    const uint16_t f = p.fl(s);
    uint16_t want = 0;
    if (f & kLetter) {
      want = kLetter;
    } else if (f & kNumber) {
      want = kNumber;
    }
    if (want != 0) {
      size_t q = s;
      while (p.fl(q) & want) ++q;
      emit(q);
      continue;
    }
    if (f != 0 && !(f & kWordish)) {
      size_t q = s;
      while (p.fl(q) != 0 && !(p.fl(q) & kWordish)) ++q;
      emit(q);
      continue;
    }
    size_t n_ws = 0;
    while (p.fl(pos + n_ws) & kWhitespace) ++n_ws;
    if (n_ws > 1 && pos + n_ws < end) {  // \s+(?!\S): the last space goes with the next word
      emit(pos + n_ws - 1);
    } else if (n_ws > 0) {
      emit(pos + n_ws);
    } else {
      emit(pos + 1);
    }
  }
}

void ScanLlama3(const CodePoints& t, size_t begin, size_t end, Pieces& out) {
  ScanLlama3Family(t, begin, end, 3, out);
}

void ScanQwen2(const CodePoints& t, size_t begin, size_t end, Pieces& out) {
  ScanLlama3Family(t, begin, end, 1, out);
}

void ScanTrailingSpace(const CodePoints& t, size_t begin, size_t end, Pieces& out) {
  size_t s = end;
  while (s > begin && Ws(t, s - 1)) --s;
  if (s > begin) out.push_back(s - begin);
  if (s < end) out.push_back(end - s);
}

size_t MatchNewline(const CodePoints& t, size_t pos, size_t) {
  return (t.cp[pos] == '\r' || t.cp[pos] == '\n') ? 1 : 0;
}

size_t MatchNumber(const CodePoints& t, size_t pos, size_t) { return Has(t, pos, kNumber) ? 1 : 0; }

size_t MatchNumbers(const CodePoints& t, size_t pos, size_t end) {
  return Run(pos, end, [&](size_t i) { return Has(t, i, kNumber); });
}

size_t MatchThreeDigits(const CodePoints& t, size_t pos, size_t end) {
  if (end - pos < 3) return 0;
  for (size_t i = pos; i < pos + 3; ++i) {
    if (t.cp[i] < '0' || t.cp[i] > '9') return 0;
  }
  return 3;
}

size_t MatchSpaceLetters(const CodePoints& t, size_t pos, size_t end) {
  return OptionalSpaceThenRun(t, pos, end, [&](size_t i) { return Has(t, i, kLetter); });
}

size_t MatchSpacePunct(const CodePoints& t, size_t pos, size_t end) {
  return OptionalSpaceThenRun(t, pos, end, [&](size_t i) { return Has(t, i, kPunctuation); });
}

size_t MatchPunctDefault(const CodePoints& t, size_t pos, size_t end) {
  return Run(pos, end,
             [&](size_t i) { return Has(t, i, kPunctuation) || DefaultSymbol(t.cp[i]); });
}

size_t MatchPunctFalcon(const CodePoints& t, size_t pos, size_t end) {
  return Run(pos, end, [&](size_t i) {
    return Has(t, i, kPunctuation) || DefaultSymbol(t.cp[i]) || t.cp[i] == '`';
  });
}

size_t MatchCjk(const CodePoints& t, size_t pos, size_t end) {
  return Run(pos, end, [&](size_t i) { return InRanges(WideValue(t, i), kCjk); });
}

size_t MatchDeepseekLetters(const CodePoints& t, size_t pos, size_t end) {
  return OptionalSpaceThenRun(
      t, pos, end, [&](size_t i) { return InRanges(WideValue(t, i), kDeepseekLetters); });
}

size_t MatchDeepseekPunct(const CodePoints& t, size_t pos, size_t end) {
  return OptionalSpaceThenRun(
      t, pos, end, [&](size_t i) { return InRanges(WideValue(t, i), kDeepseekPunct); });
}

size_t MatchPoroWord(const CodePoints& t, size_t pos, size_t end) {
  auto word = [&](size_t i) {
    if (Ws(t, i)) return false;
    const uint32_t v = WideValue(t, i);
    return std::find(std::begin(kPoroStops), std::end(kPoroStops), v) == std::end(kPoroStops);
  };
  size_t q = pos;
  if (t.cp[q] == ' ') {
    if (q + 1 >= end || !word(q + 1)) return 0;
    ++q;
  } else if (!word(q)) {
    return 0;
  }
  return q - pos + Run(q, end, word);
}

}  // namespace kvfs::pretok
