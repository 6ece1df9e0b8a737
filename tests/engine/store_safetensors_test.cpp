// kv.safetensors export/import: round trips per KV type with golden block layouts, the tensor
// layout seen by a generic reader, and rejection of other models/formats and of malformed files
// (each with its error code and a message fragment).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "engine/store/safetensors.h"
#include "tests/engine/store_test_util.h"

namespace kvfs::store {
namespace {

using Json = nlohmann::ordered_json;
using testing::kFingerprint;
using testing::PseudoRandom;

KvGeometry Geometry(const std::string& type) {
  // A row of 16 values: one f16 group of 16, or two q8/q4 groups of 8.
  return KvGeometry{3, 2, 8, type, type == "f16" ? 16 : 8, type != "f16"};
}

int64_t TokenBytes(const KvGeometry& g) { return g.n_layer * 2 * KvRowBytes(g); }

// Random packed chunks of `block` tokens (the last one shorter) covering n tokens.
std::vector<std::vector<uint8_t>> MakeChunks(const KvGeometry& g, int64_t n, int64_t block, uint64_t seed) {
  std::vector<std::vector<uint8_t>> out;
  for (int64_t start = 0; start < n; start += block)
    out.push_back(PseudoRandom(static_cast<size_t>(std::min(block, n - start) * TokenBytes(g)), seed + start));
  return out;
}

std::vector<KvChunk> Spans(const std::vector<std::vector<uint8_t>>& chunks, const KvGeometry& g) {
  std::vector<KvChunk> out;
  for (const auto& c : chunks) out.push_back({c, static_cast<int64_t>(c.size()) / TokenBytes(g)});
  return out;
}

CacheExportInfo Info(const KvGeometry& g, int64_t n_tokens, int64_t n_cached) {
  CacheExportInfo info;
  info.model_fingerprint = kFingerprint;
  info.geometry = g;
  for (int64_t i = 0; i < n_tokens; ++i) info.tokens.push_back(static_cast<int32_t>(i * 7919 % 32000));
  if (n_tokens > 3) info.tokens[3] = 2147483647;  // the largest id survives
  info.n_cached = n_cached;
  info.conversation = {
      {"system", "Be brief."}, {"user", "H\xC3\xA9llo \"q\" \\ \xE2\x82\xAC\n\t\x01"}, {"assistant", ""}};
  return info;
}

// The row of (layer, plane, token) in a list of packed chunks of `block` tokens each.
const uint8_t* RowAt(const std::vector<std::vector<uint8_t>>& chunks, const KvGeometry& g, int64_t block, int64_t layer,
                     int plane, int64_t token) {
  const auto& c = chunks[static_cast<size_t>(token / block)];
  const int64_t n = static_cast<int64_t>(c.size()) / TokenBytes(g), rb = KvRowBytes(g);
  return c.data() + ((layer * 2 + plane) * n + token % block) * rb;
}

struct Split {
  Json header;
  std::string data;
};
Split SplitFile(const std::string& file) {
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  return {Json::parse(file.substr(8, n)), file.substr(8 + n)};
}
std::string Join(const std::string& header_text, const std::string& data) {
  std::string text = header_text;
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}
std::string Join(const Split& s) { return Join(s.header.dump(), s.data); }

TEST(StoreSafetensors, RoundTripGoldenBlocks) {
  struct Case { int64_t tokens, cached, export_block, import_block; };
  const Case cases[] = {{11, 10, 4, 4}, {8, 8, 4, 4}, {5, 0, 4, 4}, {3, 3, 4, 4}, {13, 13, 5, 3}, {9, 9, 2, 256}};
  for (const std::string type : {"f16", "q8", "q4"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(type + " cached=" + std::to_string(c.cached) + " blocks " + std::to_string(c.export_block) + "->" +
                   std::to_string(c.import_block));
      const KvGeometry g = Geometry(type);
      const auto chunks = MakeChunks(g, c.cached, c.export_block, 42);
      const auto info = Info(g, c.tokens, c.cached);
      auto file = WriteKvSafetensors(info, Spans(chunks, g));
      ASSERT_TRUE(file.ok()) << file.status().message();
      EXPECT_EQ(file->size() % 8, 0u);
      auto back = ReadKvSafetensors(*file, kFingerprint, g, c.import_block);
      ASSERT_TRUE(back.ok()) << back.status().message();
      EXPECT_EQ(back->info, info);
      if (c.export_block == c.import_block) {
        EXPECT_EQ(back->chunks, chunks);  // golden: the block layout exactly as it was
      }
      ASSERT_EQ(back->chunks.size(), static_cast<size_t>((c.cached + c.import_block - 1) / c.import_block));
      int64_t sum = 0;
      for (size_t i = 0; i < back->chunks.size(); ++i) {
        EXPECT_EQ(back->chunk_tokens[i], std::min(c.import_block, c.cached - sum));
        EXPECT_EQ(static_cast<int64_t>(back->chunks[i].size()), back->chunk_tokens[i] * TokenBytes(g));
        sum += back->chunk_tokens[i];
      }
      EXPECT_EQ(sum, c.cached);
      for (int64_t layer = 0; layer < g.n_layer; ++layer)
        for (int plane = 0; plane < 2; ++plane)
          for (int64_t t = 0; t < c.cached; ++t)
            ASSERT_EQ(0, std::memcmp(RowAt(back->chunks, g, c.import_block, layer, plane, t),
                                     RowAt(chunks, g, c.export_block, layer, plane, t), KvRowBytes(g)))
                << "layer " << layer << " plane " << plane << " token " << t;
    }
  }
}

// What a generic safetensors reader sees: metadata strings, and each field of each group at
// the position its shape says.
// q4k: full blocks and a tail with staged rows survive export and import byte for byte
// (sizes from the packed-chunk layout: per layer n/C K chunks of nv * (4 + C/2) bytes and n V
// rows, then n % C staged rows of nv halfs per layer); every truncation is refused; a file for
// another chunk size is another format.
TEST(StoreSafetensors, Q4kRoundTripWithStagedRows) {
  const KvGeometry g{3, 2, 8, "q4k", 8, true, 4};
  const int64_t nv = 16, v_row = 4 + 5 + nv / 2;  // one quad of two sub-blocks of 8
  auto bytes = [&](int64_t n) { return 3 * ((n / 4) * nv * (4 + 2) + n * v_row + (n % 4) * nv * 2); };
  ASSERT_EQ(KvPayloadOf(g).bytes(11), bytes(11));
  std::vector<std::vector<uint8_t>> chunks = {PseudoRandom(static_cast<size_t>(bytes(8)), 1),
                                              PseudoRandom(static_cast<size_t>(bytes(3)), 2)};
  const std::vector<KvChunk> spans = {{chunks[0], 8}, {chunks[1], 3}};
  auto file = WriteKvSafetensors(Info(g, 13, 11), spans);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto back = ReadKvSafetensors(*file, kFingerprint, g, 8);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->chunks, chunks);
  EXPECT_EQ(back->chunk_tokens, (std::vector<int64_t>{8, 3}));
  // A non-last chunk that ends inside a K chunk cannot be exported.
  const std::vector<KvChunk> bad = {{chunks[1], 3}, {chunks[0], 8}};
  EXPECT_EQ(WriteKvSafetensors(Info(g, 13, 11), bad).status().code(), StatusCode::kInvalidArgument);
  KvGeometry other = g;
  other.chunk = 8;
  EXPECT_EQ(ReadKvSafetensors(*file, kFingerprint, other, 8).status().code(), StatusCode::kInvalidArgument);
  for (size_t cut = 0; cut < file->size(); cut += 97)
    EXPECT_FALSE(ReadKvSafetensors(std::string_view(*file).substr(0, cut), kFingerprint, g, 8).ok()) << cut;
  // Shorter than one K chunk: the K chunk tensors are empty, only staged rows.
  const std::vector<uint8_t> short_chunk = PseudoRandom(static_cast<size_t>(bytes(3)), 3);
  const std::vector<KvChunk> one = {{short_chunk, 3}};
  auto small = WriteKvSafetensors(Info(g, 5, 3), one);
  ASSERT_TRUE(small.ok()) << small.status().message();
  auto small_back = ReadKvSafetensors(*small, kFingerprint, g, 8);
  ASSERT_TRUE(small_back.ok()) << small_back.status().message();
  EXPECT_EQ(small_back->chunks, (std::vector<std::vector<uint8_t>>{short_chunk}));
}

// KvSafetensorsBytes (what `ls -l` shows before a file is made) is the size of the file
// WriteKvSafetensors makes, for every type, token count (none, inside a q4k chunk, over several
// chunks), the text (escapes, control bytes, multi-byte UTF-8) and with or without the context
// text; it refuses what the writer refuses.
TEST(StoreSafetensors, SizeWithoutTheDataIsTheFilesSize) {
  const std::vector<KvGeometry> geometries = {Geometry("f16"), Geometry("q8"), Geometry("q4"),
                                              KvGeometry{3, 2, 8, "q4k", 8, true, 4}};
  const std::string pieces[] = {"a", "\"", "\\", "\n", "\x01", "\x1f", "\x7f", "\xC3\xA9", "\xE2\x82\xAC", " "};
  uint64_t seed = 1;
  for (const KvGeometry& g : geometries) {
    for (int64_t n : {0, 1, 3, 4, 9, 16}) {
      SCOPED_TRACE(g.kv_type + " " + std::to_string(n));
      CacheExportInfo info = Info(g, n + 2, n);
      std::string text;
      for (int i = 0; i < 50 + 13 * n; ++i) text += pieces[PseudoRandom(1, seed++)[0] % 10];
      info.conversation.push_back({"user", text});
      info.context_text = n % 2 ? text : std::string();
      const int64_t block = g.kv_type == "q4k" ? 8 : 4;
      std::vector<std::vector<uint8_t>> chunks;
      for (int64_t start = 0; start < n; start += block)
        chunks.push_back(PseudoRandom(static_cast<size_t>(KvPayloadOf(g).bytes(std::min(block, n - start))), seed++));
      std::vector<KvChunk> spans;
      for (int64_t start = 0, c = 0; start < n; start += block, ++c)
        spans.push_back({chunks[static_cast<size_t>(c)], std::min(block, n - start)});
      auto file = WriteKvSafetensors(info, spans);
      ASSERT_TRUE(file.ok()) << file.status().message();
      auto size = KvSafetensorsBytes(info);
      ASSERT_TRUE(size.ok()) << size.status().message();
      EXPECT_EQ(*size, file->size());
    }
  }
  CacheExportInfo bad = Info(geometries[0], 2, 3);  // more cached than tokens
  EXPECT_EQ(KvSafetensorsBytes(bad).status().code(), StatusCode::kInvalidArgument);
  bad = Info(geometries[0], 2, 2);
  bad.context_text = "\xff";  // not UTF-8
  EXPECT_EQ(KvSafetensorsBytes(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(StoreSafetensors, TensorLayout) {
  const KvGeometry g = Geometry("q4");
  const auto chunks = MakeChunks(g, 10, 4, 7);
  auto file = WriteKvSafetensors(Info(g, 11, 10), Spans(chunks, g));
  ASSERT_TRUE(file.ok());
  const Split s = SplitFile(*file);
  const Json& meta = s.header["__metadata__"];
  EXPECT_EQ(meta["format"], "kvfs-kv");
  EXPECT_EQ(meta["kv_format"], "q4");
  EXPECT_EQ(meta["group_size"], "8");
  EXPECT_EQ(meta["rotation"], "on");
  EXPECT_EQ(meta["n_cached"], "10");
  EXPECT_EQ(Json::parse(meta["token_ids"].get<std::string>()).size(), 11u);
  EXPECT_EQ(s.header.size(), 1u + 3 * 2 * 3);
  const Json& scales = s.header["layers.1.v.scales"];
  EXPECT_EQ(scales["dtype"], "F16");
  EXPECT_EQ(scales["shape"], Json::parse("[10, 2]"));
  const Json& codes = s.header["layers.2.k.codes"];
  EXPECT_EQ(codes["dtype"], "U8");
  EXPECT_EQ(codes["shape"], Json::parse("[10, 2, 4]"));
  const int64_t sb = scales["data_offsets"][0], cb = codes["data_offsets"][0],
                mb = s.header["layers.0.v.mins"]["data_offsets"][0];
  for (int64_t t = 0; t < 10; ++t) {
    for (int64_t grp = 0; grp < 2; ++grp) {
      const uint8_t* v_row = RowAt(chunks, g, 4, 1, 1, t) + grp * 8;  // q4 group of 8: d, m, 4 bytes
      EXPECT_EQ(0, std::memcmp(s.data.data() + sb + (t * 2 + grp) * 2, v_row, 2));
      EXPECT_EQ(0, std::memcmp(s.data.data() + mb + (t * 2 + grp) * 2, RowAt(chunks, g, 4, 0, 1, t) + grp * 8 + 2, 2));
      EXPECT_EQ(0, std::memcmp(s.data.data() + cb + (t * 2 + grp) * 4, RowAt(chunks, g, 4, 2, 0, t) + grp * 8 + 4, 4));
    }
  }
}

TEST(StoreSafetensors, ExportRejectsBadInput) {
  const KvGeometry g = Geometry("q4");
  const auto chunks = MakeChunks(g, 10, 4, 1);
  auto expect_bad = [&](const CacheExportInfo& info, std::vector<KvChunk> spans, const std::string& fragment) {
    auto r = WriteKvSafetensors(info, spans);
    ASSERT_FALSE(r.ok()) << fragment;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
  };
  const CacheExportInfo good = Info(g, 11, 10);
  auto spans = Spans(chunks, g);
  ASSERT_TRUE(WriteKvSafetensors(good, spans).ok());
  CacheExportInfo info = good;
  info.model_fingerprint = "xyz";
  expect_bad(info, spans, "fingerprint");
  info = good;
  info.n_cached = 12;
  expect_bad(info, spans, "n_cached 12");
  info = good;
  info.n_cached = 9;
  expect_bad(info, spans, "past n_cached");
  info = good;
  info.conversation[1].text = "bad \xFF";
  expect_bad(info, spans, "conversation[1].text");
  info = good;
  info.tokens[2] = -1;
  expect_bad(info, spans, "token_ids[2]");
  info = good;
  info.geometry.group = 3;
  expect_bad(info, spans, "group 3");
  auto short_spans = spans;
  short_spans[1].payload = short_spans[1].payload.first(short_spans[1].payload.size() - 1);
  expect_bad(good, short_spans, "chunk 1");
  short_spans = spans;
  short_spans.pop_back();
  expect_bad(good, short_spans, "chunks hold 8 tokens");
}

// context_text: written when known, read back exactly; absent (an older file, or unknown text)
// reads as empty; text that is not UTF-8 is refused at export.
TEST(StoreSafetensors, ContextTextIsOptionalMetadata) {
  const KvGeometry g = Geometry("q4");
  const auto chunks = MakeChunks(g, 10, 4, 3);
  CacheExportInfo info = Info(g, 10, 10);
  auto plain = WriteKvSafetensors(info, Spans(chunks, g));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(SplitFile(*plain).header["__metadata__"].contains("context_text"));
  EXPECT_EQ(ReadKvSafetensors(*plain, kFingerprint, g, 4)->info.context_text, "");
  info.context_text = "<|user|>\nCaf\xC3\xA9 \"quoted\"\n<|assistant|>\n";
  auto with_text = WriteKvSafetensors(info, Spans(chunks, g));
  ASSERT_TRUE(with_text.ok());
  EXPECT_EQ(SplitFile(*with_text).header["__metadata__"]["context_text"], info.context_text);
  auto back = ReadKvSafetensors(*with_text, kFingerprint, g, 4);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->info, info);
  info.context_text = "cut \xE2\x82";
  auto bad = WriteKvSafetensors(info, Spans(chunks, g));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("context_text"), std::string::npos) << bad.status().message();
}

// token_ends: with the text, one integer per token id (-1 allowed), read back exactly; a file
// whose list is malformed or does not count the tokens is refused as corrupt.
TEST(StoreSafetensors, TokenEndsAreOptionalMetadata) {
  const KvGeometry g = Geometry("q4");
  const auto chunks = MakeChunks(g, 10, 4, 3);
  CacheExportInfo info = Info(g, 10, 10);
  info.context_text = "0123456789abcdefghij";
  info.token_end_deltas = {2, 2, 2, 2, 2, 2, 2, 2, 4, -1};
  auto file = WriteKvSafetensors(info, Spans(chunks, g));
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(SplitFile(*file).header["__metadata__"]["token_ends"], "[2,2,2,2,2,2,2,2,4,-1]");
  auto back = ReadKvSafetensors(*file, kFingerprint, g, 4);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->info, info);
  for (const auto& [list, why] : std::vector<std::pair<std::string, std::string>>{
           {"[2,2]", "has 2 entries for 10 token ids"},
           {"[2,2,2,2,2,2,2,2,4,-2]", "element 9: below -1"},
           {"[2,2,2,2,2,2,2,2,4,1.5]", "element 9: not an integer"},
           {"[2,2,2,2,2,2,2,2,4,99999999999]", "out of int32 range"},
           {"{}", "token_ends: not a JSON array"}}) {
    Split split = SplitFile(*file);
    split.header["__metadata__"]["token_ends"] = list;
    auto edited = ReadKvSafetensors(Join(split), kFingerprint, g, 4);
    ASSERT_FALSE(edited.ok()) << list;
    EXPECT_EQ(edited.status().code(), StatusCode::kCorrupt) << list;
    EXPECT_NE(edited.status().message().find(why), std::string::npos) << edited.status().message();
  }
  // The writer refuses ends without the text or of another count.
  CacheExportInfo no_text = info;
  no_text.context_text.clear();
  EXPECT_FALSE(WriteKvSafetensors(no_text, Spans(chunks, g)).ok());
  CacheExportInfo short_list = info;
  short_list.token_end_deltas.pop_back();
  EXPECT_FALSE(WriteKvSafetensors(short_list, Spans(chunks, g)).ok());
}

// Files written by another implementation (fuzz/make_safetensors_seeds.py, Python's json and
// struct) are read, including one whose tensors lie in the buffer in reverse order.
TEST(StoreSafetensors, ReadsFilesWrittenByPython) {
  const std::filesystem::path dir = std::filesystem::path(KVFS_SOURCE_DIR) / "fuzz" / "corpus" / "safetensors";
  int n_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string file = ss.str(), name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const std::string type = name.substr(0, name.find_first_of("._"));
    const KvGeometry g{2, 2, 4, type == "empty" ? "q4" : type, type == "f16" ? 8 : 4, type != "f16", type == "q4k" ? 2 : 0};
    auto r = ReadKvSafetensors(file, "0123456789abcdef0123456789abcdef", g, 2);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ++n_files;
    if (name != "q4.safetensors") continue;
    // The seed's tensor bytes are (tensor offset + 13 i) mod 251; layers.0.k.codes is first.
    ASSERT_EQ(r->chunk_tokens, (std::vector<int64_t>{2, 1}));
    const uint8_t* row = r->chunks[0].data();  // layer 0, k, token 0: groups of d, m, 2 code bytes
    EXPECT_EQ(row[4], 0);
    EXPECT_EQ(row[5], 13);
    EXPECT_EQ(row[6 + 4], 26);  // group 1 (groups are 6 bytes)
    EXPECT_EQ(r->info.tokens, (std::vector<int32_t>{1, 2, 2147483647}));
    EXPECT_EQ(r->info.conversation[0].text, "Hi \xC3\xA9");
  }
  EXPECT_EQ(n_files, 6);
}

class StoreSafetensorsReject : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = WriteKvSafetensors(Info(g_, 11, 10), Spans(MakeChunks(g_, 10, 4, 3), g_));
    ASSERT_TRUE(f.ok());
    file_ = *f;
    ASSERT_TRUE(ReadKvSafetensors(file_, kFingerprint, g_, 4).ok());
  }
  void Expect(const std::string& file, StatusCode code, const std::string& fragment,
              const KvGeometry* expected = nullptr, const std::string& fp = kFingerprint) {
    auto r = ReadKvSafetensors(file, fp, expected ? *expected : g_, 4);
    ASSERT_FALSE(r.ok()) << "accepted; wanted: " << fragment;
    EXPECT_EQ(r.status().code(), code) << r.status().message();
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("kv.safetensors: ", 0), 0u) << r.status().message();
  }
  // The file with one header edit applied.
  template <typename F>
  std::string Edit(F&& f) const {
    Split s = SplitFile(file_);
    f(s.header);
    return Join(s);
  }
  std::string WithMeta(const std::string& key, const Json& value) const {
    return Edit([&](Json& h) { h["__metadata__"][key] = value; });
  }
  const KvGeometry g_ = Geometry("q4");
  std::string file_;
};

TEST_F(StoreSafetensorsReject, OtherModelOrFormat) {
  Expect(file_, StatusCode::kInvalidArgument, "made for model", nullptr, "ffffffffffffffffffffffffffffffff");
  KvGeometry other = g_;
  other.kv_type = "q8";
  Expect(file_, StatusCode::kInvalidArgument, "kv_format \"q4\" != expected \"q8\"", &other);
  other = g_;
  other.group = 4;
  Expect(file_, StatusCode::kInvalidArgument, "group_size 8 != expected 4", &other);
  other = g_;
  other.rotate = false;
  Expect(file_, StatusCode::kInvalidArgument, "rotation on != expected off", &other);
  other = g_;
  other.n_layer = 2;
  Expect(file_, StatusCode::kInvalidArgument, "geometry", &other);
  other = g_;
  other.head_dim = 16;
  Expect(file_, StatusCode::kInvalidArgument, "geometry", &other);
  Expect(WithMeta("format_version", "3"), StatusCode::kInvalidArgument, "format_version \"3\"");
  Expect(WithMeta("format", "pt"), StatusCode::kInvalidArgument, "format \"pt\"");
}

TEST_F(StoreSafetensorsReject, EveryTruncationFailsCleanly) {
  for (size_t n = 0; n < file_.size(); ++n) {
    auto r = ReadKvSafetensors(std::string_view(file_).substr(0, n), kFingerprint, g_, 4);
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes accepted";
    ASSERT_EQ(r.status().code(), StatusCode::kCorrupt) << n << ": " << r.status().message();
  }
  Expect(file_.substr(0, 5), StatusCode::kCorrupt, "shorter than its 8-byte header length");
  Expect(file_.substr(0, file_.size() - 1), StatusCode::kCorrupt, "data buffer is");
  Expect(file_ + "x", StatusCode::kCorrupt, "data buffer is");
}

TEST_F(StoreSafetensorsReject, HeaderLengthAndJson) {
  std::string f = file_;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(f.data(), &huge, 8);
  Expect(f, StatusCode::kCorrupt, "larger than the file");
  const uint64_t over = file_.size() - 7;
  std::memcpy(f.data(), &over, 8);
  Expect(f, StatusCode::kCorrupt, "larger than the file");
  uint64_t n;
  std::memcpy(&n, file_.data(), 8);
  f = file_;
  for (size_t i = 8; i < 8 + n; ++i) f[i] = static_cast<char>("garbage!"[i % 8]);
  Expect(f, StatusCode::kCorrupt, "header is not valid JSON");
  Expect(Join("[1, 2]", SplitFile(file_).data), StatusCode::kCorrupt, "not a JSON object");
  Expect(Join("{\"a\": [[[[1]]]]}", ""), StatusCode::kCorrupt, "nested deeper");
  std::string text = SplitFile(file_).header.dump();
  const std::string fmt = "\"format\":\"kvfs-kv\"";
  text.replace(text.find(fmt), fmt.size(), fmt + "," + fmt);
  Expect(Join(text, SplitFile(file_).data), StatusCode::kCorrupt, "duplicate key \"format\"");
  // Raw invalid UTF-8 inside the conversation text breaks the header JSON itself.
  text = SplitFile(file_).header.dump();
  text.replace(text.find("Be brief."), 2, "\xFF\xFE");
  Expect(Join(text, SplitFile(file_).data), StatusCode::kCorrupt, "header is not valid JSON");
}

TEST_F(StoreSafetensorsReject, Tensors) {
  Expect(Edit([](Json& h) { h["layers.0.k.codes"]["dtype"] = "I8"; }), StatusCode::kCorrupt,
         "tensor layers.0.k.codes: dtype \"I8\" != expected \"U8\"");
  Expect(Edit([](Json& h) { h["layers.2.v.scales"]["shape"] = {10, 4}; }), StatusCode::kCorrupt,
         "tensor layers.2.v.scales: shape [10,4] != expected [10, 2]");
  Expect(Edit([](Json& h) { h["layers.2.v.codes"]["shape"] = {10, 2, -4}; }), StatusCode::kCorrupt, "shape");
  Expect(Edit([](Json& h) { h["layers.1.k.mins"]["data_offsets"] = h["layers.1.k.scales"]["data_offsets"]; }),
         StatusCode::kCorrupt, "overlaps");
  Expect(Edit([](Json& h) {
           auto& o = h["layers.2.v.mins"]["data_offsets"];
           o = {o[0].get<int64_t>() + 8, o[1].get<int64_t>() + 8};
         }),
         StatusCode::kCorrupt, "out of range");
  Expect(Edit([](Json& h) {
           h["layers.0.k.codes"]["data_offsets"] = {2, 82};
         }),
         StatusCode::kCorrupt, "not contiguous");
  Expect(Edit([](Json& h) { h["layers.0.k.codes"]["data_offsets"] = {0, 8}; }), StatusCode::kCorrupt, "hold 8 bytes");
  Expect(Edit([](Json& h) { h["layers.0.k.codes"]["data_offsets"] = {8, 0}; }), StatusCode::kCorrupt, "begin <= end");
  Expect(Edit([](Json& h) {
           h["layers.0.k.codes"]["data_offsets"] = {0, 1e30};
         }),
         StatusCode::kCorrupt, "data_offsets");
  Expect(Edit([](Json& h) { h["layers.0.k.codes"]["data_offsets"] = {0}; }), StatusCode::kCorrupt, "data_offsets");
  Expect(Edit([](Json& h) { h["layers.0.k.codes"]["extra"] = 1; }), StatusCode::kCorrupt, "unknown field \"extra\"");
  Expect(Edit([](Json& h) { h["layers.0.k.codes"].erase("shape"); }), StatusCode::kCorrupt, "needs dtype");
  Expect(Edit([](Json& h) { h["layers.0.k.codes"] = 5; }), StatusCode::kCorrupt, "not an object");
  Expect(Edit([](Json& h) { h.erase("layers.2.v.mins"); }), StatusCode::kCorrupt, "missing tensor layers.2.v.mins");
  Expect(Edit([](Json& h) { h["layers.3.k.codes"] = h["layers.2.k.codes"]; }), StatusCode::kCorrupt, "unknown tensor");
}

// Parsed JSON costs far more memory than its text: a header or conversation with more values
// than a valid one can have is refused while parsing.
TEST_F(StoreSafetensorsReject, JsonValueCountIsBounded) {
  std::string many = "{";
  for (int i = 0; i < 20000; ++i) many += "\"t" + std::to_string(i) + "\":{},";
  many += "\"x\":1}";
  Expect(Join(many, ""), StatusCode::kCorrupt, "header holds more JSON values than a valid one can");
  std::string turns = "[";
  for (int i = 0; i < 1100; ++i) turns += "{\"role\":\"u\",\"text\":\"\"},";
  turns += "{\"role\":\"u\",\"text\":\"\"}]";
  Expect(WithMeta("conversation", turns), StatusCode::kCorrupt, "conversation holds more JSON values");
  // 1024 turns beyond the token count are within bounds.
  turns = "[";
  for (int i = 0; i < 1000; ++i) turns += "{\"role\":\"u\",\"text\":\"\"},";
  turns += "{\"role\":\"u\",\"text\":\"\"}]";
  auto r = ReadKvSafetensors(WithMeta("conversation", turns), kFingerprint, g_, 4);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->info.conversation.size(), 1001u);
}

// Tensors may come in any order in the buffer: the reader follows the offsets.
TEST_F(StoreSafetensorsReject, SwappedOffsetsAreFollowed) {
  const std::string f =
      Edit([](Json& h) { std::swap(h["layers.1.k.mins"]["data_offsets"], h["layers.1.k.scales"]["data_offsets"]); });
  auto r = ReadKvSafetensors(f, kFingerprint, g_, 4);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto orig = ReadKvSafetensors(file_, kFingerprint, g_, 4);
  const int64_t rb = KvRowBytes(g_);
  const uint8_t* a = RowAt(r->chunks, g_, 4, 1, 0, 5);
  const uint8_t* b = RowAt(orig->chunks, g_, 4, 1, 0, 5);
  for (int64_t grp = 0; grp < rb / 8; ++grp) {  // scale and minimum trade places
    EXPECT_EQ(0, std::memcmp(a + grp * 8, b + grp * 8 + 2, 2));
    EXPECT_EQ(0, std::memcmp(a + grp * 8 + 2, b + grp * 8, 2));
    EXPECT_EQ(0, std::memcmp(a + grp * 8 + 4, b + grp * 8 + 4, 4));
  }
}

// Every export carries XXH3-64 of its data buffer (checked here against the library directly): a
// flipped bit anywhere in the data is refused.
TEST_F(StoreSafetensorsReject, DamagedDataFailsItsChecksum) {
  const Split s = SplitFile(file_);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(s.data.data(), s.data.size())));
  EXPECT_EQ(s.header["__metadata__"]["payload_xxh3_64"], hex);
  for (size_t at : {size_t{0}, s.data.size() / 2, s.data.size() - 1}) {
    std::string damaged = file_;
    damaged[damaged.size() - s.data.size() + at] ^= 0x10;
    Expect(damaged, StatusCode::kCorrupt, "does not match its checksum");
  }
  Expect(WithMeta("payload_xxh3_64", "0123456789ABCDEF"), StatusCode::kCorrupt, "16 lowercase hex digits");
  Expect(WithMeta("payload_xxh3_64", "0"), StatusCode::kCorrupt, "16 lowercase hex digits");
}

// Exports are of format_version 2, which requires the checksum: a file whose key was deleted is
// refused (EINVAL at the import's close), its data damaged or not, instead of importing whatever
// the data holds. Version 1 files (exports before 2026-12-01, without the key before 2026-11-29;
// also the Python-written seeds of ReadsFilesWrittenByPython) import without it, and are
// checked when they have it.
TEST_F(StoreSafetensorsReject, ChecksumIsRequiredFromVersion2) {
  EXPECT_EQ(SplitFile(file_).header["__metadata__"]["format_version"], "2");
  auto without_checksum = [&](const std::string& version, bool damaged) {
    std::string f = Edit([&](Json& h) {
      h["__metadata__"].erase("payload_xxh3_64");
      h["__metadata__"]["format_version"] = version;
    });
    if (damaged) f.back() = static_cast<char>(f.back() ^ 0x10);
    return f;
  };
  for (bool damaged : {false, true}) {
    SCOPED_TRACE(damaged ? "damaged" : "intact");
    Expect(without_checksum("2", damaged), StatusCode::kCorrupt,
           "__metadata__ is missing \"payload_xxh3_64\", the checksum of the data, which format_version 2 requires");
  }
  auto legacy = ReadKvSafetensors(without_checksum("1", false), kFingerprint, g_, 4);
  ASSERT_TRUE(legacy.ok()) << legacy.status().message();
  auto current = ReadKvSafetensors(file_, kFingerprint, g_, 4);
  ASSERT_TRUE(current.ok());
  EXPECT_EQ(legacy->chunks, current->chunks);
  std::string damaged_v1 = WithMeta("format_version", "1");
  damaged_v1.back() = static_cast<char>(damaged_v1.back() ^ 0x10);
  Expect(damaged_v1, StatusCode::kCorrupt, "does not match its checksum");
}

TEST_F(StoreSafetensorsReject, Metadata) {
  Expect(Edit([](Json& h) { h["__metadata__"].erase("n_cached"); }), StatusCode::kCorrupt, "missing \"n_cached\"");
  Expect(Edit([](Json& h) { h.erase("__metadata__"); }), StatusCode::kCorrupt, "no __metadata__");
  Expect(Edit([](Json& h) { h["__metadata__"] = "x"; }), StatusCode::kCorrupt, "__metadata__ is not an object");
  Expect(WithMeta("group_size", 8), StatusCode::kCorrupt, "\"group_size\" is not a string");
  Expect(WithMeta("note", Json::array()), StatusCode::kCorrupt, "\"note\" is not a string");
  Expect(WithMeta("group_size", "08"), StatusCode::kCorrupt, "not a decimal");
  Expect(WithMeta("n_cached", "ten"), StatusCode::kCorrupt, "not a decimal");
  Expect(WithMeta("n_cached", "12"), StatusCode::kCorrupt, "n_cached 12 > 11 token ids");
  Expect(WithMeta("n_cached", "999999999999999999"), StatusCode::kCorrupt, "n_cached 999999999999999999 > 11");
  Expect(WithMeta("model_fingerprint", "ABC"), StatusCode::kCorrupt, "model_fingerprint is not");
  Expect(WithMeta("rotation", "yes"), StatusCode::kCorrupt, "rotation is neither");
  // Unknown string metadata is annotation and is ignored.
  ASSERT_TRUE(ReadKvSafetensors(WithMeta("author", "me"), kFingerprint, g_, 4).ok());
}

TEST_F(StoreSafetensorsReject, TokenIds) {
  const std::string ten = "0,1,2,3,4,5,6,7,8,9";
  Expect(WithMeta("token_ids", "[" + ten + ",2147483648]"), StatusCode::kCorrupt,
         "element 10: 2147483648 is out of int32 range");
  Expect(WithMeta("token_ids", "[" + ten + ",99999999999999999999999]"), StatusCode::kCorrupt, "out of int32 range");
  Expect(WithMeta("token_ids", "[" + ten + ",-2]"), StatusCode::kCorrupt, "negative token id");
  Expect(WithMeta("token_ids", "[" + ten + ",1.5]"), StatusCode::kCorrupt, "element 10: not an integer");
  Expect(WithMeta("token_ids", "[" + ten + ",01]"), StatusCode::kCorrupt, "leading zero");
  Expect(WithMeta("token_ids", "[" + ten + ",,1]"), StatusCode::kCorrupt, "not an integer");
  Expect(WithMeta("token_ids", "[" + ten + ",1"), StatusCode::kCorrupt, "expected ',' or ']'");
  Expect(WithMeta("token_ids", "[" + ten + ",\"1\"]"), StatusCode::kCorrupt, "not an integer");
  Expect(WithMeta("token_ids", "[" + ten + ",1] x"), StatusCode::kCorrupt, "trailing");
  Expect(WithMeta("token_ids", ten), StatusCode::kCorrupt, "not a JSON array");
  Expect(WithMeta("token_ids", "[]"), StatusCode::kCorrupt, "n_cached 10 > 0");
  auto ok = ReadKvSafetensors(WithMeta("token_ids", " [ " + ten + " , 2147483647 ] "), kFingerprint, g_, 4);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->info.tokens.back(), 2147483647);
}

TEST_F(StoreSafetensorsReject, Conversation) {
  Expect(WithMeta("conversation", "[{\"role\": \"user\""), StatusCode::kCorrupt, "conversation is not valid JSON");
  Expect(WithMeta("conversation", "[{\"role\": \"user\", \"text\": \"\\ud800\"}]"), StatusCode::kCorrupt,
         "conversation is not valid JSON");
  Expect(WithMeta("conversation", "{}"), StatusCode::kCorrupt, "conversation: not a JSON array");
  Expect(WithMeta("conversation", "[{\"role\": \"user\"}]"), StatusCode::kCorrupt,
         "conversation[0]: expected an object");
  Expect(WithMeta("conversation", "[{\"role\": \"user\", \"text\": 1}]"), StatusCode::kCorrupt, "must be strings");
  Expect(WithMeta("conversation", "[{\"role\": \"\", \"text\": \"\"}]"), StatusCode::kCorrupt, "empty role");
  Expect(WithMeta("conversation", "[[[1]]]"), StatusCode::kCorrupt, "nested deeper");
  Expect(WithMeta("conversation", "[{\"role\": \"a\", \"role\": \"b\", \"text\": \"\"}]"), StatusCode::kCorrupt,
         "duplicate key");
}

}  // namespace
}  // namespace kvfs::store
