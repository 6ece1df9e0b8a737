// context_text.h: matching a rendered context against the text behind a cache, by characters.
#include "engine/runtime/context_text.h"

#include <gtest/gtest.h>

#include "tests/engine/engine_test_util.h"

namespace kvfs {
namespace {

TEST(ContextText, CommonPrefixStopsAtTheStartOfACharacter) {
  EXPECT_EQ(CommonTextPrefix("abcdef", "abcxyz"), 3u);
  EXPECT_EQ(CommonTextPrefix("abc", "abcdef"), 3u);
  EXPECT_EQ(CommonTextPrefix("", "abc"), 0u);
  // é (C3 A9) and è (C3 A8) share their first byte: the common part ends before both.
  EXPECT_EQ(CommonTextPrefix("caf\xC3\xA9", "caf\xC3\xA8"), 3u);
  EXPECT_EQ(CommonTextPrefix("\xF0\x9F\x98\x80!", "\xF0\x9F\x98\x81!"), 0u);
}

TEST(ContextText, TokensWithinCountsWholeRunsAndKnownEnds) {
  // A run of 3 tokens encoded from 10 bytes, then generated tokens, then one past the text.
  const std::vector<uint32_t> ends = {10, 10, 10, 12, 12, 15, kNoTextEnd};
  EXPECT_EQ(TokensWithin(ends, 0), 0u);
  EXPECT_EQ(TokensWithin(ends, 9), 0u);   // inside the run: none of it
  EXPECT_EQ(TokensWithin(ends, 10), 3u);
  EXPECT_EQ(TokensWithin(ends, 12), 5u);  // a control token adds no text: it goes with the one before
  EXPECT_EQ(TokensWithin(ends, 14), 5u);
  EXPECT_EQ(TokensWithin(ends, 1000), 6u);
}

TEST(ContextText, EndsSurviveTheirJsonAndBadOnesAreRefused) {
  const std::vector<uint32_t> ends = {10, 10, 10, 12, 12, 15, kNoTextEnd};
  const nlohmann::json j = TokenEndsToJson(ends);
  EXPECT_EQ(j.dump(), "[10,0,0,2,0,3,-1]");
  EXPECT_EQ(TokenEndsFromJson(j, ends.size(), 15), ends);
  EXPECT_EQ(TokenEndsFromJson(j, ends.size(), 16), ends);  // the text may go on past a known end
  EXPECT_EQ(TokenEndsFromJson(j, ends.size() + 1, 15), std::nullopt);  // not one per token
  EXPECT_EQ(TokenEndsFromJson(j, ends.size(), 14), std::nullopt);      // past the text
  EXPECT_EQ(TokenEndsFromJson(nlohmann::json::parse("[3,-1,2]"), 3, 10), std::nullopt);  // known after unknown
  EXPECT_EQ(TokenEndsFromJson(nlohmann::json::parse("[3,-2]"), 2, 10), std::nullopt);
  EXPECT_EQ(TokenEndsFromJson(nlohmann::json::parse("[3,4]"), 2, 10), std::nullopt);  // the text not covered
  EXPECT_EQ(TokenEndsFromJson(nlohmann::json::parse("{}"), 0, 0), std::nullopt);
  EXPECT_EQ(TokenEndsFromJson(nlohmann::json::parse("[3,7]"), 2, 10), (std::vector<uint32_t>{3, 10}));
}

// The engine tests' fixture: stories260K's tokenizer (an SPM vocabulary with a space prefix).
class ContextMatchTest : public testing::EngineTestBase {
 protected:
  const Tokenizer& tok() const { return model_->tokenizer(); }
};

// A cache made as a turn makes it: the prompt encoded as one run, then generated tokens with
// their own ends. Contexts that change inside it keep the cache up to the change.
TEST_F(ContextMatchTest, KeepsTheCacheUpToTheFirstDifference) {
  const std::string prompt = "Once upon a time";
  std::vector<TokenId> tokens = tok().Encode(prompt, true, true);
  std::vector<uint32_t> ends = OneRunEnds(tokens.size(), prompt.size());
  // "Generated": the tokens the whole sentence encodes to past the prompt's, each with its end.
  const std::vector<TokenId> whole = tok().Encode("Once upon a time there was a dog.", true, true);
  ASSERT_TRUE(std::equal(tokens.begin(), tokens.end(), whole.begin()));
  std::string text = prompt;
  for (size_t i = tokens.size(); i < whole.size(); ++i) {
    text += tok().TokenToPiece(whole[i], false);
    ends.push_back(static_cast<uint32_t>(text.size()));
  }
  tokens = whole;
  ASSERT_EQ(text, "Once upon a time there was a dog.");
  ASSERT_EQ(tok().TokenToPiece(tokens.back(), false), ".");

  ContextMatch same = MatchContext(tok(), text, {}, tokens, text, ends);
  EXPECT_STREQ(same.match, "exact");
  EXPECT_EQ(same.tokens, tokens);

  ContextMatch more = MatchContext(tok(), text + " The end.", {}, tokens, text, ends);
  EXPECT_STREQ(more.match, "extend");
  EXPECT_EQ(more.kept, tokens.size());
  EXPECT_EQ(more.ends.back(), text.size() + 9);

  // The reply shows "... a dog" (the "." was a stop string's first token): all but the "." kept.
  const std::string cut = "Once upon a time there was a dog! Hi";
  ContextMatch diverged = MatchContext(tok(), cut, {}, tokens, text, ends);
  EXPECT_STREQ(diverged.match, "diverge");
  EXPECT_EQ(diverged.kept, tokens.size() - 1);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end() - 1, diverged.tokens.begin()));
  std::string rebuilt;
  for (size_t i = 1; i < diverged.tokens.size(); ++i) rebuilt += tok().TokenToPiece(diverged.tokens[i], false);
  EXPECT_EQ(rebuilt, " Once upon a time there was a dog! Hi");  // " Once": SPM's space prefix, as encoded whole
  EXPECT_EQ(diverged.ends.size(), diverged.tokens.size());
  EXPECT_EQ(diverged.ends.back(), cut.size());

  // A change inside the prompt's run keeps nothing: the whole context is encoded anew.
  ContextMatch early = MatchContext(tok(), "Once upon a day", {}, tokens, text, ends);
  EXPECT_STREQ(early.match, "diverge");
  EXPECT_EQ(early.kept, 0u);
  EXPECT_EQ(early.tokens, tok().Encode("Once upon a day", true, true));

  // Tokens past the text known (bytes that formed no UTF-8) are never kept, even when the new
  // context extends the text.
  std::vector<uint32_t> unknown_tail = ends;
  unknown_tail.back() = kNoTextEnd;
  const std::string known = text.substr(0, text.size() - 1);
  ContextMatch past = MatchContext(tok(), known + "\xEF\xBF\xBD Hi", {}, tokens, known, unknown_tail);
  EXPECT_STREQ(past.match, "diverge");
  EXPECT_EQ(past.kept, tokens.size() - 1);

  // A cache whose text is unknown (an import) is matched by the caller on tokens.
  ContextMatch imported = MatchContext(tok(), text, {}, tokens, "", {});
  EXPECT_EQ(imported.kept, 0u);
  EXPECT_EQ(imported.tokens, tok().Encode(text, true, true));
}

// The check an import's text goes through: the runs MatchContext makes (encoded pieces, generated
// tokens, a control token after either) pass; tokens that stand for other text do not, and the
// first of them is named.
TEST_F(ContextMatchTest, TokensMustSpellTheTextTheirEndsClaim) {
  // A turn's prompt (one run), a reply of generated tokens with a control token inside it, then
  // the next turn's prompt encoded as a continuation, as MatchContext's EXTEND does.
  const std::string prompt = "Once upon a time";
  std::vector<TokenId> tokens = tok().Encode(prompt, true, true);
  std::vector<uint32_t> ends = OneRunEnds(tokens.size(), prompt.size());
  std::string text = prompt;
  const std::vector<TokenId> reply = tok().Encode(" there was a dog.", false, false);
  for (size_t i = 0; i < reply.size(); ++i) {
    tokens.push_back(reply[i]);
    text += tok().TokenToPiece(reply[i], false);
    ends.push_back(static_cast<uint32_t>(text.size()));
    if (i == 2) {  // a control token adds no text
      tokens.push_back(tok().bos());
      ends.push_back(static_cast<uint32_t>(text.size()));
    }
  }
  const std::string next = " The end.";
  const std::vector<TokenId> cont = tok().EncodeContinuation(next, tokens.back(), true);
  text += next;
  tokens.insert(tokens.end(), cont.begin(), cont.end());
  ends.resize(tokens.size(), static_cast<uint32_t>(text.size()));
  EXPECT_EQ(FirstTokenNotSpellingText(tok(), tokens, text, ends), std::nullopt);
  // As a continuation, the next prompt must not get a BOS or a second space prefix; the first
  // prompt's run must be encoded as a start (BOS).
  EXPECT_EQ(MatchContext(tok(), text, {}, tokens, text, ends).kept, tokens.size());

  // The same tokens claiming other text: a word changed in the reply, in the first prompt, in the
  // last; a token changed under the same text; the text shorter than the ends.
  const size_t reply_at = tok().Encode(prompt, true, true).size();
  std::string other = text;
  other.replace(other.find("dog"), 3, "cat");
  EXPECT_TRUE(FirstTokenNotSpellingText(tok(), tokens, other, ends).has_value());
  other = text;
  other.replace(0, 4, "Nice");
  EXPECT_EQ(FirstTokenNotSpellingText(tok(), tokens, other, ends), std::optional<size_t>(0));
  other = text;
  other.replace(other.find("end"), 3, "dne");
  EXPECT_EQ(FirstTokenNotSpellingText(tok(), tokens, other, ends), std::optional<size_t>(tokens.size() - cont.size()));
  std::vector<TokenId> swapped = tokens;
  swapped[reply_at + 1] = tok().Encode(" cat", false, false).front();
  EXPECT_EQ(FirstTokenNotSpellingText(tok(), swapped, text, ends), std::optional<size_t>(reply_at + 1));
  EXPECT_TRUE(FirstTokenNotSpellingText(tok(), tokens, text.substr(0, 10), ends).has_value());
  // Tokens past the known text are not checked (a turn never keeps them).
  std::vector<uint32_t> unknown_tail = ends;
  for (size_t i = tokens.size() - cont.size(); i < tokens.size(); ++i) unknown_tail[i] = kNoTextEnd;
  EXPECT_EQ(FirstTokenNotSpellingText(tok(), tokens, text.substr(0, text.size() - next.size()),
                                      unknown_tail),
            std::nullopt);
}

}  // namespace
}  // namespace kvfs
