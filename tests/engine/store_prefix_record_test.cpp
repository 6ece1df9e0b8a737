// Prefix records (.prefixes/ on disk): round trip, the checksum of version 2, version 1 still
// read, and strict parsing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/store/prefix_record.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

PrefixRecord Sample() {
  PrefixRecord p;
  p.name = "story.v2.txt";
  p.owner_uid = 1000;
  p.text = "Once upon a time \xC3\xA9\xE2\x82\xAC \"quoted\"\n";
  p.model_fingerprint = testing::kFingerprint;
  p.kv_format = "q4";
  p.block_size = 16;
  p.blocks = {BlockHash{1, 2}, BlockHash{0xffffffffffffffffull, 0}};
  return p;
}

TEST(StorePrefixRecord, RoundTripEndsWithTheDocumentedChecksum) {
  const auto text = SerializePrefix(Sample());
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, testing::Stamped(nlohmann::ordered_json::parse(*text)));
  EXPECT_EQ(nlohmann::json::parse(*text)["version"], 2);
  const auto back = ParsePrefix(*text, "p");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, Sample());
}

// Every single-bit flip anywhere in the record is refused; most leave valid JSON, which only the
// checksum catches (before version 2 a flip in the text or a block hash went unnoticed).
TEST(StorePrefixRecord, EveryBitFlipIsDetected) {
  const std::string good = *SerializePrefix(Sample());
  const size_t by_checksum =
      testing::ExpectEveryBitFlipRefused(good, [](const std::string& text) { return ParsePrefix(text, "p"); });
  EXPECT_GT(by_checksum, good.size());
}

TEST(StorePrefixRecord, Version1WithoutChecksumIsStillRead) {
  nlohmann::json j = nlohmann::json::parse(*SerializePrefix(Sample()));
  j.erase("checksum");
  j["version"] = 1;
  auto v1 = ParsePrefix(j.dump(), "p");
  ASSERT_TRUE(v1.ok()) << v1.status().message();
  EXPECT_EQ(*v1, Sample());
  // Version 1 has no checksum field, version 2 must have one.
  nlohmann::json v1_with = j;
  v1_with["checksum"] = "0000000000000000";
  EXPECT_EQ(ParsePrefix(v1_with.dump(), "p").status().code(), StatusCode::kCorrupt);
  nlohmann::json v2_without = j;
  v2_without["version"] = 2;
  EXPECT_EQ(ParsePrefix(v2_without.dump(), "p").status().code(), StatusCode::kCorrupt);
}

TEST(StorePrefixRecord, NewerVersionIsUnsupportedNotCorrupt) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(*SerializePrefix(Sample()));
  j["version"] = 3;
  const auto r = ParsePrefix(testing::Stamped(j), "p");
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported) << r.status().message();
  EXPECT_NE(r.status().message().find("version 3"), std::string::npos) << r.status().message();
}

TEST(StorePrefixRecord, MalformedFieldsAreNamed) {
  const nlohmann::ordered_json good = nlohmann::ordered_json::parse(*SerializePrefix(Sample()));
  struct Case {
    const char* field;
    nlohmann::ordered_json value;
  };
  const Case cases[] = {{"name", ".hidden"},          {"owner_uid", -1},
                        {"text", 5},                  {"model_fingerprint", "ABC"},
                        {"block_size", 0},            {"blocks", nlohmann::ordered_json::array({"xyz"})},
                        {"format", "kvfs-manifest"}};
  for (const Case& c : cases) {
    nlohmann::ordered_json j = good;
    j[c.field] = c.value;
    const auto r = ParsePrefix(testing::Stamped(j), "p");  // a valid checksum: the field check must catch it
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << c.field;
    EXPECT_NE(r.status().message().find(std::string("\"") + c.field + "\""), std::string::npos) << r.status().message();
  }
  nlohmann::ordered_json extra = good;
  extra["surprise"] = 1;
  EXPECT_NE(ParsePrefix(testing::Stamped(extra), "p").status().message().find("\"surprise\""), std::string::npos);
  EXPECT_EQ(ParsePrefix("", "p").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(ParsePrefix("[1]", "p").status().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace kvfs::store
