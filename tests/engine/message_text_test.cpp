#include "engine/core/message_text.h"

#include <gtest/gtest.h>

#include <string>

namespace kvfs {
namespace {

TEST(QuoteForMessage, PrintableTextStaysAndTheRestIsEscaped) {
  EXPECT_EQ(QuoteForMessage("blk.0.attn_q.weight"), "'blk.0.attn_q.weight'");
  EXPECT_EQ(QuoteForMessage(""), "''");
  EXPECT_EQ(QuoteForMessage(std::string("a\0b\x01\n\x7f", 6)), "'a\\x00b\\x01\\x0a\\x7f'");
  EXPECT_EQ(QuoteForMessage("it's a\\b"), "'it\\'s a\\\\b'");
  // Well-formed UTF-8 of printable characters stays (é, €, U+1F600).
  const std::string utf8 = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";
  EXPECT_EQ(QuoteForMessage(utf8), "'" + utf8 + "'");
  // C1 controls (U+009B: a terminal's CSI), a cut character, a lone continuation byte, an
  // overlong form, a surrogate and bytes that are never UTF-8 are escaped byte by byte.
  EXPECT_EQ(QuoteForMessage("\xC2\x9B"), "'\\xc2\\x9b'");
  EXPECT_EQ(QuoteForMessage("\xE2\x82"), "'\\xe2\\x82'");
  EXPECT_EQ(QuoteForMessage("\x80"), "'\\x80'");
  EXPECT_EQ(QuoteForMessage("\xC0\xAF"), "'\\xc0\\xaf'");
  EXPECT_EQ(QuoteForMessage("\xED\xA0\x80"), "'\\xed\\xa0\\x80'");
  EXPECT_EQ(QuoteForMessage("\xFE\xFF"), "'\\xfe\\xff'");
}

TEST(QuoteForMessage, LongTextIsClippedBetweenCharacters) {
  const std::string a70(70, 'a');
  EXPECT_EQ(QuoteForMessage(a70), "'" + std::string(64, 'a') + "'... (70 bytes)");
  EXPECT_EQ(QuoteForMessage(a70, 70), "'" + a70 + "'");
  // A two-byte character that would end past the limit is left out whole.
  EXPECT_EQ(QuoteForMessage(std::string(63, 'a') + "\xC3\xA9", 64), "'" + std::string(63, 'a') + "'... (65 bytes)");
  EXPECT_EQ(QuoteForMessage("ab", 0), "''... (2 bytes)");
}

}  // namespace
}  // namespace kvfs
