// Block and tail files: encoding, compression choice, and every kind of damage detected.
#include <cstring>

#include <gtest/gtest.h>

#include "engine/store/block_file.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

using testing::PseudoRandom;

const BlockHash kHash{0x0123456789abcdefull, 0xfedcba9876543210ull};

TEST(StoreBlockHash, HexRoundTrip) {
  EXPECT_EQ(ToHex(kHash), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(BlockHashFromHex(ToHex(kHash)), kHash);
  EXPECT_EQ(BlockHashFromHex("0123456789ABCDEFFEDCBA9876543210"), kHash);
  EXPECT_FALSE(BlockHashFromHex("0123").has_value());
  EXPECT_FALSE(BlockHashFromHex("0123456789abcdeffedcba987654321g").has_value());
}

TEST(StoreBlockFile, RoundTripRawAndCompressed) {
  const std::vector<uint8_t> random = PseudoRandom(10000, 1);
  std::vector<uint8_t> compressible(10000);
  for (size_t i = 0; i < compressible.size(); ++i) compressible[i] = static_cast<uint8_t>(i % 13);

  auto raw = EncodeBlockFile(BlockKind::kBlock, kHash, 3, 256, random);
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  auto d1 = DecodeBlockFile(*raw, "raw");
  ASSERT_TRUE(d1.ok()) << d1.status().message();
  EXPECT_FALSE(d1->header.compressed());  // random bytes do not compress: stored raw
  EXPECT_EQ(raw->size(), kBlockHeaderBytes + random.size());
  EXPECT_EQ(d1->payload, random);
  EXPECT_EQ(d1->header.kv_format, 3u);
  EXPECT_EQ(d1->header.n_tokens, 256u);
  EXPECT_EQ(d1->header.hash, kHash);
  EXPECT_EQ(d1->header.kind, BlockKind::kBlock);

  auto comp = EncodeBlockFile(BlockKind::kBlock, kHash, 3, 256, compressible);
  ASSERT_TRUE(comp.ok());
  auto d2 = DecodeBlockFile(*comp, "comp");
  ASSERT_TRUE(d2.ok()) << d2.status().message();
  EXPECT_TRUE(d2->header.compressed());
  EXPECT_LT(comp->size(), compressible.size() / 4);
  EXPECT_EQ(d2->payload, compressible);
  EXPECT_EQ(d2->header.raw_bytes, compressible.size());

  BlockEncodeOptions no_zstd;
  no_zstd.allow_compression = false;
  auto forced = EncodeBlockFile(BlockKind::kBlock, kHash, 3, 256, compressible, no_zstd);
  ASSERT_TRUE(forced.ok());
  EXPECT_FALSE(DecodeBlockFile(*forced, "forced")->header.compressed());

  // A tail: no hash, its own magic; empty payloads are fine.
  auto tail = EncodeBlockFile(BlockKind::kTail, kHash, 3, 5, {});
  ASSERT_TRUE(tail.ok());
  auto d3 = DecodeBlockFile(*tail, "tail");
  ASSERT_TRUE(d3.ok()) << d3.status().message();
  EXPECT_EQ(d3->header.kind, BlockKind::kTail);
  EXPECT_EQ(d3->header.hash, BlockHash{});
  EXPECT_TRUE(d3->payload.empty());
}

TEST(StoreBlockFile, CompressionKeptOnlyWhenItPays) {
  auto compressed = [](const std::vector<uint8_t>& p, double min_saving) {
    BlockEncodeOptions o;
    o.min_saving = min_saving;
    return DecodeBlockFile(*EncodeBlockFile(BlockKind::kBlock, kHash, 0, 1, p, o), "x")->header.compressed();
  };
  std::vector<uint8_t> half_zero = PseudoRandom(100000, 2);  // saves ~50%
  for (size_t i = 0; i < half_zero.size() / 2; ++i) half_zero[i] = 0;
  std::vector<uint8_t> seven_bit = PseudoRandom(100000, 3);  // saves ~11%, like q4 KV
  for (auto& b : seven_bit) b &= 0x7F;
  EXPECT_TRUE(compressed(half_zero, kMinCompressionSaving));
  EXPECT_FALSE(compressed(half_zero, 0.6));
  EXPECT_FALSE(compressed(seven_bit, kMinCompressionSaving));
  EXPECT_TRUE(compressed(seven_bit, 0.03));
  EXPECT_FALSE(compressed(PseudoRandom(100000, 4), 0.0));  // random: zstd output is larger
}

// Every single-byte change anywhere in the file is detected (header checksum, payload
// checksum, or a structural check), and the message names the file.
TEST(StoreBlockFile, EveryByteFlipIsDetected) {
  std::vector<uint8_t> compressible(3000);
  for (size_t i = 0; i < compressible.size(); ++i) compressible[i] = static_cast<uint8_t>(i % 11);
  for (const auto& payload : {PseudoRandom(600, 3), compressible}) {
    auto image = EncodeBlockFile(BlockKind::kBlock, kHash, 9, 4, payload);
    ASSERT_TRUE(image.ok());
    for (size_t i = 0; i < image->size(); ++i) {
      std::vector<uint8_t> bad = *image;
      bad[i] ^= 0x10;
      auto d = DecodeBlockFile(bad, "blocks/01/x.kvb");
      ASSERT_FALSE(d.ok()) << "flip at byte " << i << " undetected";
      EXPECT_NE(d.status().message().find("blocks/01/x.kvb"), std::string::npos) << d.status().message();
    }
  }
}

TEST(StoreBlockFile, TruncationAndGarbage) {
  auto image = EncodeBlockFile(BlockKind::kBlock, kHash, 9, 4, PseudoRandom(500, 4));
  ASSERT_TRUE(image.ok());
  for (size_t len : {size_t{0}, size_t{10}, size_t{kBlockHeaderBytes - 1}, size_t{kBlockHeaderBytes},
                     image->size() - 1}) {
    std::vector<uint8_t> cut(image->begin(), image->begin() + static_cast<ptrdiff_t>(len));
    auto d = DecodeBlockFile(cut, "f");
    ASSERT_FALSE(d.ok()) << len;
    EXPECT_EQ(d.status().code(), StatusCode::kCorrupt) << len;
  }
  std::vector<uint8_t> longer = *image;
  longer.push_back(0);
  EXPECT_EQ(DecodeBlockFile(longer, "f").status().code(), StatusCode::kCorrupt);
  EXPECT_NE(DecodeBlockFile(PseudoRandom(200, 5), "f").status().message().find("bad magic"), std::string::npos);
}

TEST(StoreBlockFile, NewerVersionIsUnsupported) {
  auto image = EncodeBlockFile(BlockKind::kBlock, kHash, 9, 4, PseudoRandom(50, 6));
  ASSERT_TRUE(image.ok());
  uint16_t v = kBlockFormatVersion + 1;
  std::memcpy(image->data() + kOffVersion, &v, 2);
  // Fix the header checksum so that only the version is "wrong".
  uint64_t sum = XXH3_64bits(image->data(), kOffHeaderChecksum);
  std::memcpy(image->data() + kOffHeaderChecksum, &sum, 8);
  EXPECT_EQ(DecodeBlockFile(*image, "f").status().code(), StatusCode::kUnsupported);
}

TEST(StoreBlockFile, ReadChecksKindAndHash) {
  FaultInjectingFileSystem fs;
  ASSERT_TRUE(fs.MakeDir("/d").ok());
  auto tail = EncodeBlockFile(BlockKind::kTail, {}, 1, 3, PseudoRandom(40, 7));
  auto block = EncodeBlockFile(BlockKind::kBlock, kHash, 1, 4, PseudoRandom(40, 8));
  ASSERT_TRUE(WriteFileAtomic(fs, "/d", "t.kvt", *tail).ok());
  ASSERT_TRUE(WriteFileAtomic(fs, "/d", "b.kvb", *block).ok());
  EXPECT_TRUE(ReadBlockFile(fs, "/d/t.kvt", BlockKind::kTail, std::nullopt).ok());
  EXPECT_TRUE(ReadBlockFile(fs, "/d/b.kvb", BlockKind::kBlock, kHash).ok());
  auto wrong_kind = ReadBlockFile(fs, "/d/t.kvt", BlockKind::kBlock, std::nullopt);
  EXPECT_EQ(wrong_kind.status().code(), StatusCode::kCorrupt);
  auto wrong_hash = ReadBlockFile(fs, "/d/b.kvb", BlockKind::kBlock, BlockHash{1, 2});
  EXPECT_EQ(wrong_hash.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(wrong_hash.status().message().find("/d/b.kvb"), std::string::npos);
  EXPECT_EQ(ReadBlockFile(fs, "/d/none.kvb", BlockKind::kBlock, std::nullopt).status().code(), StatusCode::kNotFound);
}

// Decoding straight into caller memory (e.g. the block pool) checks the destination size.
TEST(StoreBlockFile, DecodeIntoCallerMemory) {
  const std::vector<uint8_t> payload(4096, 0x5A);
  auto image = EncodeBlockFile(BlockKind::kBlock, kHash, 1, 4, payload);
  auto header = ParseBlockHeader(*image, "f");
  ASSERT_TRUE(header.ok());
  std::vector<uint8_t> dst(payload.size());
  auto stored = std::span<const uint8_t>(*image).subspan(kBlockHeaderBytes);
  ASSERT_TRUE(DecodeBlockPayloadInto(*header, stored, dst, "f").ok());
  EXPECT_EQ(dst, payload);
  std::vector<uint8_t> small(10);
  EXPECT_EQ(DecodeBlockPayloadInto(*header, stored, small, "f").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvfs::store
