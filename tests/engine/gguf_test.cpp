#include "engine/model/gguf.h"

#include <algorithm>
#include <random>

#include "tests/gguf_builder.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

using testing::GgufBuilder;

std::vector<uint8_t> F32Data(std::initializer_list<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

GgufBuilder SmallValid() {
  GgufBuilder b;
  b.Str("general.architecture", "llama");
  b.U32("llama.block_count", 2);
  b.F32("llama.eps", 1e-5f);
  b.Bool("flag", true);
  b.StrArray("tokenizer.ggml.tokens", {"a", "bc", ""});
  b.I32Array("ints", {-1, 2, 3});
  b.Tensor("w", 0, {2, 2}, F32Data({1, 2, 3, 4}));
  b.Tensor("v", 1, {4}, std::vector<uint8_t>(8, 0));
  return b;
}

TEST(GgufReader, ParsesMetadataAndTensors) {
  auto bytes = SmallValid().Bytes();
  auto f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetInt("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(static_cast<float>(*(*f)->GetFloat("llama.eps")), 1e-5f);
  EXPECT_EQ(*(*f)->GetBool("flag"), true);
  EXPECT_FALSE((*f)->GetInt("flag").has_value());  // a bool is not an integer
  EXPECT_FALSE((*f)->GetString("llama.block_count").has_value());
  const GgufArray* toks = (*f)->GetArray("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  ASSERT_EQ(toks->size(), 3u);
  EXPECT_EQ(toks->string_at(1), "bc");
  EXPECT_EQ(toks->string_at(2), "");
  const GgufArray* ints = (*f)->GetArray("ints");
  ASSERT_NE(ints, nullptr);
  EXPECT_EQ(ints->int_at(0), -1);
  const GgufTensor* w = (*f)->FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->n_bytes, 16u);
  EXPECT_EQ(w->ne[0], 2);
  EXPECT_EQ(w->ne[1], 2);
  float x;
  std::memcpy(&x, w->data + 12, 4);
  EXPECT_EQ(x, 4.0f);
  EXPECT_EQ((*f)->FindTensor("v")->n_bytes, 8u);
  EXPECT_EQ(w->file_offset % 32, 0u);
}

TEST(GgufReader, Version2IsAccepted) {
  GgufBuilder b(2);
  b.U32("x", 1);
  auto bytes = b.Bytes();
  EXPECT_TRUE(GgufFile::Parse(bytes).ok());
}

// Each malformation must give an error whose message names the problem.
struct BadCase {
  const char* name;
  std::vector<uint8_t> bytes;
  const char* expect_in_message;
};

void Poke32(std::vector<uint8_t>& b, size_t at, uint32_t v) { std::memcpy(&b[at], &v, 4); }
void Poke64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(&b[at], &v, 8); }

TEST(GgufReader, RejectsMalformedHeaders) {
  std::vector<BadCase> cases;
  auto good = SmallValid().Bytes();
  { auto b = good; b[0] = 'X'; cases.push_back({"bad magic", b, "magic"}); }
  { auto b = good; Poke32(b, 4, 1); cases.push_back({"version 1", b, "version 1"}); }
  { auto b = good; Poke32(b, 4, 4); cases.push_back({"version 4", b, "version 4"}); }
  { auto b = good; Poke64(b, 8, 1ull << 40); cases.push_back({"huge tensor count", b, "tensor count"}); }
  { auto b = good; Poke64(b, 16, 1ull << 40); cases.push_back({"huge kv count", b, "metadata count"}); }
  { auto b = good; Poke64(b, 24, 1ull << 50); cases.push_back({"huge key length", b, "length"}); }
  { auto b = good; b.resize(30); cases.push_back({"truncated header", b, "cannot fit"}); }
  { auto b = good; b.resize(b.size() - 40); cases.push_back({"truncated data", b, "outside"}); }
  {
    GgufBuilder g; g.Tensor("w", 2, {33, 1}, std::vector<uint8_t>(18, 0));  // Q4_0 needs rows of 32k
    cases.push_back({"row not multiple of block", g.Bytes(), "multiple"});
  }
  { GgufBuilder g; g.Tensor("w", 99, {4}, std::vector<uint8_t>(16, 0)); cases.push_back({"unknown type", g.Bytes(), "unknown ggml type"}); }
  { GgufBuilder g; g.Tensor("w", 0, {4, 0}, {}); cases.push_back({"zero dim", g.Bytes(), "dimension"}); }
  { GgufBuilder g; g.Tensor("w", 0, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4, 0)); cases.push_back({"5 dims", g.Bytes(), "dimensions"}); }
  { GgufBuilder g; g.Tensor("w", 0, {1ull << 39, 1ull << 39}, {}); cases.push_back({"overflow", g.Bytes(), "overflow"}); }
  {
    GgufBuilder g; g.Tensor("w", 0, {4}, std::vector<uint8_t>(16, 0)); g.Tensor("w", 0, {4}, std::vector<uint8_t>(16, 0));
    cases.push_back({"duplicate tensor", g.Bytes(), "twice"});
  }
  { GgufBuilder g; g.U32("k", 1); g.U32("k", 2); cases.push_back({"duplicate key", g.Bytes(), "twice"}); }
  { GgufBuilder g; g.U32("general.alignment", 3); cases.push_back({"bad alignment", g.Bytes(), "power of two"}); }
  { GgufBuilder g; g.Bool("b", true); auto b = g.Bytes(); b[24 + 8 + 1 + 4] = 7; cases.push_back({"bad bool", b, "bool"}); }
  {
    GgufBuilder g; g.U32("k", 1); auto b = g.Bytes();
    Poke32(b, 24 + 8 + 1, 77);  // the value type of "k"
    cases.push_back({"unknown value type", b, "unknown value type"});
  }
  {
    // Tensor offset not aligned: patch the offset field of the only tensor.
    GgufBuilder g; g.Tensor("w", 0, {4}, std::vector<uint8_t>(16, 0)); auto b = g.Bytes();
    Poke64(b, 24 + 8 + 1 + 4 + 8 + 4, 4);
    cases.push_back({"unaligned offset", b, "alignment"});
  }
  for (const BadCase& c : cases) {
    auto f = GgufFile::Parse(c.bytes);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_NE(f.status().message().find(c.expect_in_message), std::string::npos)
        << c.name << ": " << f.status().message();
  }
}

// Every prefix of a valid file and random byte flips: errors or success, never a crash
// (ASan/UBSan builds make out-of-bounds reads fatal).
TEST(GgufReader, SurvivesTruncationAndCorruption) {
  auto good = SmallValid().Bytes();
  // Every prefix that cuts into the header or any tensor's data must be refused (only the
  // alignment padding after the last tensor may be missing).
  uint64_t data_end = 0;
  auto parsed = GgufFile::Parse(good);
  ASSERT_TRUE(parsed.ok());
  for (const GgufTensor& t : (*parsed)->tensors()) data_end = std::max(data_end, t.file_offset + t.n_bytes);
  for (size_t n = 0; n < data_end; ++n) {
    std::vector<uint8_t> prefix(good.begin(), good.begin() + n);
    EXPECT_FALSE(GgufFile::Parse(prefix).ok()) << "prefix of " << n << " bytes parsed";
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    auto b = good;
    for (int k = 0; k < 3; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    auto f = GgufFile::Parse(b);
    if (f.ok()) {
      for (const GgufTensor& t : (*f)->tensors()) {
        ASSERT_LE(t.file_offset + t.n_bytes, b.size());
      }
    }
  }
}

// True when `s` holds a byte a terminal or a C string would not show as text.
bool HasControlBytes(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

// A bit flip in a tensor name's length (one too long) makes the name take the next byte, the
// 0x01 of its dimension count, which then reads as 0. The message quotes the name with that
// byte escaped, and the reason follows it.
TEST(GgufReader, DamagedNameIsEscapedAndTheReasonFollows) {
  GgufBuilder g;
  g.Tensor("blk.0.ffn_norm.weight", 0, {256}, std::vector<uint8_t>(1024, 0));
  g.Tensor("blk.1.ffn_norm.weight", 0, {256}, std::vector<uint8_t>(1024, 0));
  auto b = g.Bytes();
  // The second entry: after the 24-byte file header and the first entry (name length, 21
  // bytes of name, dimension count, one dimension, type, offset).
  const size_t at = 24 + 8 + 21 + 4 + 8 + 4 + 8;
  ASSERT_EQ(std::string(b.begin() + at + 8, b.begin() + at + 8 + 21), "blk.1.ffn_norm.weight");
  Poke64(b, at, 22);
  auto f = GgufFile::Parse(b);
  ASSERT_FALSE(f.ok());
  const std::string& m = f.status().message();
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(m, "tensor 'blk.1.ffn_norm.weight\\x01' at byte " + std::to_string(at) + ": 0 dimensions (1..4 allowed)");
  EXPECT_FALSE(HasControlBytes(m)) << m;
}

// A name of 300 bytes holding NULs and other control bytes (what a larger bit flip in a length
// makes of the bytes that follow): the message shows its first 64 bytes escaped, says how long
// it is, and ends with the reason.
TEST(GgufReader, LongBinaryNameIsClippedInMessages) {
  std::string key;
  for (int i = 0; i < 300; ++i) key += static_cast<char>(i % 40);  // 0x00..0x27: controls, then text
  GgufBuilder g;
  g.U32(key, 1);
  g.U32(key, 2);
  auto f = GgufFile::Parse(g.Bytes());
  ASSERT_FALSE(f.ok());
  const std::string& m = f.status().message();
  EXPECT_FALSE(HasControlBytes(m)) << m;
  EXPECT_EQ(m.rfind("metadata key '\\x00\\x01\\x02", 0), 0u) << m;
  EXPECT_NE(m.find("'... (300 bytes) at byte "), std::string::npos) << m;
  EXPECT_TRUE(m.ends_with(" appears twice")) << m;
  EXPECT_LT(m.size(), 64u * 4 + 80) << m;  // 64 bytes shown, each at most 4 characters escaped
}

TEST(GgufReader, OpenReportsMissingFileAndGarbage) {
  auto missing = GgufFile::Open("/nonexistent/model.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
  EXPECT_EQ(GgufFile::Open("/nonexistent/model.gguf", GgufLoad::kPrivateCopy).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(GgufFile::Open("/proc/self/status", GgufLoad::kPrivateCopy).ok());  // not a file with a size
}

TEST(GgufReader, OpensStories260K) {
  std::string path = testing::SharedDir() + "/models/stories260K.gguf";
  KVFS_REQUIRE_DATA(path);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->tensors().size(), 48u);
  EXPECT_EQ(*(*f)->GetInt("llama.block_count"), 5);
  EXPECT_EQ((*f)->GetArray("tokenizer.ggml.tokens")->size(), 512u);
  EXPECT_FALSE((*f)->private_copy());
  // A private copy holds the same bytes, parsed the same, at other addresses.
  auto copy = GgufFile::Open(path, GgufLoad::kPrivateCopy);
  ASSERT_TRUE(copy.ok()) << copy.status().message();
  EXPECT_TRUE((*copy)->private_copy());
  EXPECT_NE((*copy)->bytes().data(), (*f)->bytes().data());
  ASSERT_EQ((*copy)->bytes().size(), (*f)->bytes().size());
  EXPECT_TRUE(std::equal((*copy)->bytes().begin(), (*copy)->bytes().end(), (*f)->bytes().begin()));
  ASSERT_EQ((*copy)->tensors().size(), (*f)->tensors().size());
  for (size_t i = 0; i < (*f)->tensors().size(); ++i) {
    EXPECT_EQ((*copy)->tensors()[i].name, (*f)->tensors()[i].name);
    EXPECT_EQ((*copy)->tensors()[i].data - (*copy)->bytes().data(), (*f)->tensors()[i].data - (*f)->bytes().data());
  }
}

}  // namespace
}  // namespace kvfs
