// Manifests: round trip, the checksum, and strict parsing (every malformation is kCorrupt naming
// the field).
#include <cstdio>

#include <gtest/gtest.h>
#include <xxhash.h>

#include "engine/store/manifest.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

Manifest Sample() {
  Manifest m;
  m.name = "alice_01-x";
  m.model_fingerprint = testing::kFingerprint;
  m.kv_format = "q4";
  m.block_size = 4;
  m.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  m.conversation = {{"system", "You are terse."}, {"user", "Hi \xC3\xA9\xE2\x82\xAC \"quoted\"\n"}, {"assistant", ""}};
  m.blocks = {BlockHash{1, 2}, BlockHash{0xffffffffffffffffull, 0}};
  m.tail = TailRef{"tail.3.kvt", 2};
  m.config = {{"temperature", 0.5}, {"stop", {"\n\n"}}, {"nested", {{"a", nullptr}}}};
  m.created_ms = 1700000000000;
  m.updated_ms = 1700000005000;
  m.turn = 3;
  return m;
}

TEST(StoreManifest, RoundTrip) {
  for (bool with_tail : {true, false}) {
    Manifest m = Sample();
    if (!with_tail) m.tail.reset();
    auto text = SerializeManifest(m);
    ASSERT_TRUE(text.ok()) << text.status().message();
    auto back = ParseManifest(*text, "m.json");
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(*back, m);
    EXPECT_EQ(*SerializeManifest(*back), *text);  // stable
  }
}

TEST(StoreManifest, SerializeRejectsInvalid) {
  Manifest m = Sample();
  m.conversation[1].text = "bad \xFF utf8";
  auto r = SerializeManifest(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("conversation[1].text"), std::string::npos) << r.status().message();
  m = Sample();
  m.name = ".hidden";
  EXPECT_NE(SerializeManifest(m).status().message().find("\"name\""), std::string::npos);
  m = Sample();
  m.tokens.resize(9);  // 2 blocks of 4 + tail of 2 = 10 > 9
  EXPECT_NE(SerializeManifest(m).status().message().find("\"blocks\""), std::string::npos);
  m = Sample();
  m.tail->n_tokens = 4;  // a full block is not a tail
  EXPECT_NE(SerializeManifest(m).status().message().find("tail.n_tokens"), std::string::npos);
}

// Version 1 of the same manifest: no checksum.
std::string AsVersion1(nlohmann::json j) {
  j.erase("checksum");
  j["version"] = 1;
  return j.dump();
}

TEST(StoreManifest, ChecksumIsTheDocumentedHashOfTheRestOfTheText) {
  const std::string text = *SerializeManifest(Sample());
  EXPECT_EQ(text, testing::Stamped(nlohmann::ordered_json::parse(text)));
  EXPECT_EQ(nlohmann::json::parse(text)["version"], 2);
  EXPECT_TRUE(ParseManifest(testing::Stamped(nlohmann::json::parse(text)), "m").ok());  // any key order
}

// Every single-bit flip anywhere in the file is refused: inside a string or a number the JSON
// still parses, and only the checksum tells.
TEST(StoreManifest, EveryBitFlipIsDetected) {
  const std::string good = *SerializeManifest(Sample());
  const size_t by_checksum =
      testing::ExpectEveryBitFlipRefused(good, [](const std::string& text) { return ParseManifest(text, "m.json"); });
  EXPECT_GT(by_checksum, good.size());  // most flips leave valid JSON behind
}

TEST(StoreManifest, Version1WithoutChecksumIsStillRead) {
  const Manifest m = Sample();
  const nlohmann::json j = nlohmann::json::parse(*SerializeManifest(m));
  auto v1 = ParseManifest(AsVersion1(j), "m");
  ASSERT_TRUE(v1.ok()) << v1.status().message();
  EXPECT_EQ(*v1, m);
  nlohmann::json with_checksum = j;
  with_checksum["version"] = 1;
  auto r = ParseManifest(with_checksum.dump(), "m");
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  nlohmann::json without = j;
  without.erase("checksum");
  r = ParseManifest(without.dump(), "m");
  EXPECT_NE(r.status().message().find("\"checksum\": missing"), std::string::npos) << r.status().message();
  // Valid JSON, right hash, but laid out differently (re-indented by hand): refused, not guessed.
  r = ParseManifest(nlohmann::ordered_json::parse(*SerializeManifest(m)).dump(1), "m");
  EXPECT_NE(r.status().message().find("not the last field"), std::string::npos) << r.status().message();
}

// Each case edits the valid JSON (re-stamping its checksum) and expects the named field in the
// error.
TEST(StoreManifest, StrictParseNamesTheField) {
  const nlohmann::json good = nlohmann::json::parse(*SerializeManifest(Sample()));
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"missing name", [](auto& j) { j.erase("name"); }, "\"name\": missing"},
      {"name type", [](auto& j) { j["name"] = 5; }, "\"name\": expected a string"},
      {"bad name", [](auto& j) { j["name"] = "a/b"; }, "\"name\""},
      {"format", [](auto& j) { j["format"] = "other"; }, "\"format\""},
      {"fingerprint", [](auto& j) { j["model_fingerprint"] = "XYZ"; }, "\"model_fingerprint\""},
      {"block size 0", [](auto& j) { j["block_size"] = 0; }, "\"block_size\""},
      {"block size float", [](auto& j) { j["block_size"] = 4.5; }, "\"block_size\": expected an integer"},
      {"tokens type", [](auto& j) { j["tokens"] = "1 2 3"; }, "\"tokens\""},
      {"negative token", [](auto& j) { j["tokens"][3] = -1; }, "\"tokens[3]\""},
      {"huge token", [](auto& j) { j["tokens"][0] = 1ull << 40; }, "\"tokens[0]\""},
      {"conversation entry", [](auto& j) { j["conversation"][1] = "hi"; }, "conversation[1]"},
      {"conversation role", [](auto& j) { j["conversation"][0]["role"] = 1; }, "\"role\""},
      {"conversation extra", [](auto& j) { j["conversation"][0]["x"] = 1; }, "conversation[0]"},
      {"block hex", [](auto& j) { j["blocks"][1] = "00"; }, "\"blocks[1]\""},
      {"tail type", [](auto& j) { j["tail"] = 3; }, "\"tail\""},
      {"tail file", [](auto& j) { j["tail"]["file"] = "../x"; }, "tail.file"},
      {"tail missing field", [](auto& j) { j["tail"].erase("n_tokens"); }, "\"tail\""},
      {"config type", [](auto& j) { j["config"] = nlohmann::json::array(); }, "\"config\""},
      {"timestamp", [](auto& j) { j["updated_ms"] = -5; }, "\"updated_ms\""},
      {"turn", [](auto& j) { j["turn"] = "3"; }, "\"turn\""},
      {"unknown field", [](auto& j) { j["extra"] = 1; }, "unknown field \"extra\""},
      {"too many blocks", [](auto& j) { j["tokens"] = {1, 2, 3}; }, "\"blocks\""},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.edit(j);
    auto r = ParseManifest(testing::Stamped(j), "agents/a/manifest.json");
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << c.what;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.what << ": " << r.status().message();
    EXPECT_NE(r.status().message().find("agents/a/manifest.json"), std::string::npos) << c.what;
  }
}

TEST(StoreManifest, MalformedJson) {
  const std::string good = *SerializeManifest(Sample());
  for (const std::string& bad : {std::string(""), std::string("{"), std::string("[]"), std::string("null"),
                                 good.substr(0, good.size() / 2), good + "x", std::string(100000, '['),
                                 std::string("{\"name\":\"a\",\"name\":\"b\"}"), std::string("{\"a\":\"\xFF\"}")}) {
    auto r = ParseManifest(bad, "m.json");
    ASSERT_FALSE(r.ok()) << bad.substr(0, 40);
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_EQ(r.status().message().rfind("m.json", 0), 0u) << r.status().message();
  }
  nlohmann::json v = nlohmann::json::parse(good);
  v["version"] = 3;
  EXPECT_EQ(ParseManifest(testing::Stamped(v), "m").status().code(), StatusCode::kUnsupported);
}

TEST(StoreManifest, Names) {
  EXPECT_TRUE(IsValidAgentName("a"));
  EXPECT_TRUE(IsValidAgentName(std::string(64, 'z')));
  EXPECT_FALSE(IsValidAgentName(std::string(65, 'z')));
  EXPECT_FALSE(IsValidAgentName(""));
  EXPECT_FALSE(IsValidAgentName(".x"));
  EXPECT_FALSE(IsValidAgentName("a b"));
  EXPECT_TRUE(IsTailFileName(TailFileName(12)));
  EXPECT_FALSE(IsTailFileName("tail..kvt"));
  EXPECT_FALSE(IsTailFileName("tail.1.kvt.tmp"));
}

}  // namespace
}  // namespace kvfs::store
