// Unicode tables and pre-tokenizer splits. The vocabulary vectors cover the pre-tokenizers
// that have a shipped vocabulary; the others (llama3, qwen2, poro, viking) are checked here
// against splits worked out by hand from their regular expressions.
#include "engine/model/pretokenizer.h"

#include <gtest/gtest.h>

#include "engine/model/unicode.h"

namespace kvfs {
namespace {

using unicode::Flags;

// Pre-tokenizes and maps the byte-level words back to plain UTF-8.
std::vector<std::string> Split(PreTokenizerKind kind, std::string_view text) {
  std::vector<std::string> words;
  PreTokenize(kind, text, words);
  for (std::string& w : words) {
    std::string plain;
    for (uint32_t cp : unicode::DecodeUtf8Lossy(w)) {
      const int b = unicode::UnicodeToByte(cp);
      EXPECT_GE(b, 0) << "word not in the byte alphabet";
      plain.push_back(static_cast<char>(b));
    }
    w = plain;
  }
  return words;
}

using Words = std::vector<std::string>;

TEST(Unicode, CategoryFlags) {
  EXPECT_TRUE(Flags('a') & unicode::kLetter);
  EXPECT_TRUE(Flags('7') & unicode::kNumber);
  EXPECT_TRUE(Flags('!') & unicode::kPunctuation);
  EXPECT_TRUE(Flags('$') & unicode::kSymbol);
  EXPECT_TRUE(Flags('~') & unicode::kSymbol);
  EXPECT_TRUE(Flags(' ') & unicode::kWhitespace);
  EXPECT_TRUE(Flags('\n') & unicode::kWhitespace);
  EXPECT_FALSE(Flags(0x1C) & unicode::kWhitespace);  // not White_Space, unlike str.isspace()
  EXPECT_TRUE(Flags(0x85) & unicode::kWhitespace);
  EXPECT_TRUE(Flags(0x3000) & unicode::kWhitespace);
  EXPECT_TRUE(Flags(0x3000) & unicode::kSeparator);
  EXPECT_FALSE(Flags(0x200B) & unicode::kWhitespace);  // zero width space is a format char
  EXPECT_TRUE(Flags(0x00E9) & unicode::kLetter);
  EXPECT_TRUE(Flags(0x4E00) & unicode::kLetter);       // CJK (a First/Last range)
  EXPECT_TRUE(Flags(0xAC01) & unicode::kLetter);       // Hangul (a First/Last range)
  EXPECT_TRUE(Flags(0x0301) & unicode::kMark);
  EXPECT_TRUE(Flags(0x0661) & unicode::kNumber);       // Arabic-Indic one
  EXPECT_TRUE(Flags(0x1F999) & unicode::kSymbol);      // 🦙
  EXPECT_TRUE(Flags(0xE000) & unicode::kControl);      // private use
  EXPECT_TRUE(Flags(0x0378) & unicode::kUndefined);    // unassigned
  EXPECT_TRUE(Flags(0x110000) & unicode::kUndefined);
}

TEST(Unicode, LowerCase) {
  EXPECT_EQ(unicode::ToLower('A'), uint32_t{'a'});
  EXPECT_EQ(unicode::ToLower('a'), uint32_t{'a'});
  EXPECT_EQ(unicode::ToLower(0x00C4), 0x00E4u);  // Ä
  EXPECT_EQ(unicode::ToLower(0x212A), uint32_t{'k'});  // Kelvin sign
  EXPECT_EQ(unicode::ToLower('7'), uint32_t{'7'});
}

TEST(Unicode, Utf8) {
  EXPECT_EQ(unicode::DecodeUtf8Lossy("a\xC3\xA4\xE6\x97\xA5\xF0\x9F\xA6\x99"),
            (std::vector<uint32_t>{'a', 0xE4, 0x65E5, 0x1F999}));
  // Each byte that does not start a complete sequence becomes one U+FFFD.
  EXPECT_EQ(unicode::DecodeUtf8Lossy("\xE6\x97" "a\xFF"),
            (std::vector<uint32_t>{0xFFFD, 0xFFFD, 'a', 0xFFFD}));
  std::string s;
  for (uint32_t cp : {0x24u, 0xA2u, 0x20ACu, 0x10348u}) unicode::AppendUtf8(s, cp);
  EXPECT_EQ(s, "$\xC2\xA2\xE2\x82\xAC\xF0\x90\x8D\x88");
}

TEST(Unicode, ByteAlphabet) {
  EXPECT_EQ(unicode::ByteToUnicode(' '), 0x120u);   // Ġ
  EXPECT_EQ(unicode::ByteToUnicode('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(unicode::ByteToUnicode('a'), uint32_t{'a'});
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(unicode::UnicodeToByte(unicode::ByteToUnicode(static_cast<uint8_t>(b))), b);
  }
  EXPECT_EQ(unicode::UnicodeToByte(0x20), -1);  // a space is spelt Ġ
  EXPECT_EQ(unicode::UnicodeToByte(0x144), -1);
}

TEST(PreTokenizer, Names) {
  EXPECT_EQ(PreTokenizerFromName("")->kind, PreTokenizerKind::kDefault);
  EXPECT_EQ(PreTokenizerFromName("gpt-2")->kind, PreTokenizerKind::kGpt2);
  const auto llama3 = PreTokenizerFromName("llama-bpe");
  ASSERT_TRUE(llama3.ok());
  EXPECT_EQ(llama3->kind, PreTokenizerKind::kLlama3);
  EXPECT_TRUE(llama3->ignore_merges);
  EXPECT_TRUE(llama3->default_add_bos);
  EXPECT_EQ(PreTokenizerFromName("qwen2")->kind, PreTokenizerKind::kQwen2);
  const auto bad = PreTokenizerFromName("tekken");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(bad.status().message().find("tekken"), std::string::npos);
}

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "Hello  world's 123!!\n"),
            (Words{"Hello", " ", " world", "'s", " 123", "!!", "\n"}));
  // Contractions are case-sensitive in GPT-2's pattern.
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "I'VE"), (Words{"I", "'", "VE"}));
  // Whitespace at the end of the text is one word.
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "a   "), (Words{"a", "   "}));
  EXPECT_TRUE(Split(PreTokenizerKind::kGpt2, "").empty());
}

TEST(PreTokenizer, Llama3) {
  EXPECT_EQ(Split(PreTokenizerKind::kLlama3, "I've 12345 apples\n\n  x"),
            (Words{"I", "'ve", " ", "123", "45", " apples", "\n\n", " ", " x"}));
  EXPECT_EQ(Split(PreTokenizerKind::kLlama3, "I'VE (ok)?\r\n"),
            (Words{"I", "'VE", " (", "ok", ")?\r\n"}));
  EXPECT_EQ(Split(PreTokenizerKind::kLlama3, "\tfoo  \n bar"),
            (Words{"\tfoo", "  \n", " bar"}));
}

TEST(PreTokenizer, Qwen2SplitsDigitsOneByOne) {
  EXPECT_EQ(Split(PreTokenizerKind::kQwen2, "in 2024, x"),
            (Words{"in", " ", "2", "0", "2", "4", ",", " x"}));
}

TEST(PreTokenizer, PoroAndViking) {
  EXPECT_EQ(Split(PreTokenizerKind::kPoro, "Hello, world! 12"),
            (Words{"Hello", ",", " world", "!", " 12"}));
  EXPECT_EQ(Split(PreTokenizerKind::kViking, "Hello, world! 12"),
            (Words{"Hello", ",", " world", "!", " ", "1", "2"}));
}

TEST(PreTokenizer, DefaultAndFalconSplitPunctuationFirst) {
  EXPECT_EQ(Split(PreTokenizerKind::kDefault, "a+=b 12345"),
            (Words{"a", "+=", "b", " ", "123", "45"}));
  EXPECT_EQ(Split(PreTokenizerKind::kFalcon, "x`y 12345"),
            (Words{"x", "`", "y", " ", "123", "45"}));
}

TEST(PreTokenizer, InvalidUtf8BecomesReplacementCharacter) {
  EXPECT_EQ(Split(PreTokenizerKind::kGpt2, "a\xFF"), (Words{"a", "\xEF\xBF\xBD"}));
}

}  // namespace
}  // namespace kvfs
