// ParseStrictJson: the one parser of JSON that users or files supply (config.json, the daemon's
// config, manifests, prefix records, kv.safetensors headers, tuning files).
#include <gtest/gtest.h>

#include <string>

#include "engine/core/strict_json.h"

namespace kvfs {
namespace {

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

Status ErrorOf(std::string_view text, JsonLimits limits = {}) {
  Result<nlohmann::json> j = ParseStrictJson(text, "the text", limits);
  return j.ok() ? Status::Ok() : j.status();
}

TEST(StrictJson, ParsesWhatTheParserParses) {
  const std::string text = R"({"a": [1, 2.5, "x\"]y", {"b": null}], "c": {"d": true}})";
  Result<nlohmann::json> j = ParseStrictJson(text, "the text");
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ(*j, nlohmann::json::parse(text));
  // Equal keys in different objects are not duplicates, nor a key equal to a string value.
  EXPECT_TRUE(ErrorOf(R"({"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}], "c": "a"})").ok());
}

TEST(StrictJson, NestingIsBoundedBeforeParsing) {
  EXPECT_TRUE(ErrorOf(Nested(64)).ok());
  const Status deep = ErrorOf(Nested(65));
  EXPECT_EQ(deep.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.message(), "the text is nested deeper than 64");
  EXPECT_TRUE(ErrorOf(Nested(3), JsonLimits{3}).ok());
  EXPECT_FALSE(ErrorOf(Nested(4), JsonLimits{3}).ok());
  // Brackets inside strings, escaped quotes included, do not count; a million unclosed
  // brackets stop at the bound without the parser seeing them.
  EXPECT_TRUE(ErrorOf(R"(["[[[[\"[[[[", "{{{{"])", JsonLimits{1}).ok());
  EXPECT_NE(ErrorOf(std::string(1 << 20, '[')).message().find("nested deeper"), std::string::npos);
  EXPECT_TRUE(JsonDepthWithin("{}[]{}[]", 1));
  EXPECT_FALSE(JsonDepthWithin("[{}]", 1));
}

TEST(StrictJson, DuplicateKeysAreRefusedAtAnyDepth) {
  EXPECT_EQ(ErrorOf(R"({"k": 1, "k": 1})").message(), "the text has a duplicate key \"k\"");
  EXPECT_EQ(ErrorOf(R"([{"x": {"y": 1, "z": 2, "y": 3}}])").message(), "the text has a duplicate key \"y\"");
  // Escapes name the same key: "\u0061" is "a".
  EXPECT_EQ(ErrorOf(R"({"a": 1, "\u0061": 2})").message(), "the text has a duplicate key \"a\"");
  // A hostile key is clipped and its control characters hidden in the message.
  const std::string long_key = std::string(100, 'k') + "\\n";
  const std::string message = ErrorOf("{\"" + long_key + "\": 1, \"" + long_key + "\": 2}").message();
  EXPECT_EQ(message, "the text has a duplicate key \"" + std::string(48, 'k') + "\"...");
}

TEST(StrictJson, ParserEventsCanBeBounded) {
  std::string many = "[";
  for (int i = 0; i < 1000; ++i) many += i ? ",0" : "0";
  many += "]";
  EXPECT_TRUE(ErrorOf(many).ok());                    // no bound by default
  EXPECT_TRUE(ErrorOf(many, JsonLimits{64, 2000}).ok());  // 1000 values and the array's two events
  const Status bounded = ErrorOf(many, JsonLimits{64, 500});
  EXPECT_EQ(bounded.message(), "the text holds more JSON values than a valid one can (500 parser events)");
}

TEST(StrictJson, InvalidTextSaysWhy) {
  using namespace std::string_view_literals;
  for (std::string_view bad : {""sv, "{"sv, "{\"a\": }"sv, "[1,]"sv, "\xff\xfe"sv, "{\"a\": 1} x"sv, "nan"sv, "{'a': 1}"sv,
                               "{\"a\": 1}\0{\"b\": garbage"sv, "{\"a\": \"x\0y\"}"sv}) {
    const Status s = ErrorOf(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message().rfind("the text is not valid JSON: ", 0), 0u) << s.message();
  }
}

// A stored file's error never quotes its text (a manifest holds a conversation); a user's own
// text may be quoted back to them.
TEST(StrictJson, StoredTextIsNotQuotedInErrors) {
  const std::string bad = "{\"conversation\": [{\"text\": \"my password is hunter2\xff\"}]}";
  auto quoted = ParseStrictJson(bad, "config.json");
  ASSERT_FALSE(quoted.ok());
  EXPECT_NE(quoted.status().message().find("hunter2"), std::string::npos) << quoted.status().message();
  auto stored = ParseStrictJson(bad, "the manifest", JsonLimits{.quote_text = false});
  ASSERT_FALSE(stored.ok());
  EXPECT_EQ(stored.status().message().find("hunter2"), std::string::npos) << stored.status().message();
  EXPECT_NE(stored.status().message().find("the manifest is not valid JSON: "), std::string::npos);
}

TEST(StrictJson, ClipForMessage) {
  EXPECT_EQ(ClipForMessage("abc"), "abc");
  EXPECT_EQ(ClipForMessage("abc", 48, '"'), "\"abc\"");
  EXPECT_EQ(ClipForMessage("a\tb\x01"), "a?b?");
  EXPECT_EQ(ClipForMessage("abcdef", 3), "abc...");
  // A cut never splits a UTF-8 character: "é" is 2 bytes, so 3 bytes of "aéé" keep "aé".
  EXPECT_EQ(ClipForMessage("a\xc3\xa9\xc3\xa9", 2), "a\xc3\xa9...");
  EXPECT_EQ(ClipForMessage("a\xc3\xa9\xc3\xa9", 3), "a\xc3\xa9...");
}

}  // namespace
}  // namespace kvfs
