#include "engine/model/model.h"

#include <cstdio>
#include <fstream>

#include "tests/gguf_builder.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

// Writes bytes to a temp file removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::vector<uint8_t>& bytes) {
    char tmpl[] = "/tmp/kvfs_model_test_XXXXXX";
    int fd = mkstemp(tmpl);
    path_ = tmpl;
    FILE* f = fdopen(fd, "wb");
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<uint8_t> Seed(const std::string& name) {
  std::string s = testing::ReadFile(std::string(KVFS_SOURCE_DIR) + "/fuzz/corpus/gguf/" + name);
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(ModelLoad, LoadsTinySeedModels) {
  for (const char* name : {"tiny-llama-spm.gguf", "tiny-qwen2-bpe.gguf"}) {
    TempFile f(Seed(name));
    auto m = Model::Load(f.path());
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().message();
    EXPECT_EQ((*m)->hparams().n_embd, 8);
    EXPECT_EQ((*m)->hparams().n_head_kv, 1);
    EXPECT_EQ((*m)->hparams().head_dim, 4);
  }
}

TEST(ModelLoad, ReadsStoriesHyperParameters) {
  const std::string path = testing::SharedDir() + "/models/stories260K.gguf";
  KVFS_REQUIRE_DATA(path);
  auto m = Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const HParams& hp = (*m)->hparams();
  EXPECT_EQ(hp.arch, Architecture::kLlama);
  EXPECT_EQ(hp.n_vocab, 512);
  EXPECT_EQ(hp.n_embd, 64);
  EXPECT_EQ(hp.n_layer, 5);
  EXPECT_EQ(hp.n_head, 8);
  EXPECT_EQ(hp.n_head_kv, 4);
  EXPECT_EQ(hp.head_dim, 8);
  EXPECT_EQ(hp.n_ff, 172);
  EXPECT_FALSE((*m)->weights().tied_output);
}

TEST(ModelLoad, UnsupportedArchitectureIsNamed) {
  testing::GgufBuilder b;
  b.Str("general.architecture", "mamba");
  TempFile f(b.Bytes());
  auto m = Model::Load(f.path());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(m.status().message().find("unsupported architecture 'mamba'"), std::string::npos) << m.status().message();
}

TEST(ModelLoad, MissingTensorAndBadShapeAreNamed) {
  // Drop a tensor name by renaming it (same length): the loader must name the missing tensor.
  auto bytes = Seed("tiny-llama-spm.gguf");
  std::string s(bytes.begin(), bytes.end());
  size_t at = s.find("blk.0.ffn_up.weight");
  ASSERT_NE(at, std::string::npos);
  s.replace(at, 19, "blk.0.ffn_xx.weight");
  TempFile f(std::vector<uint8_t>(s.begin(), s.end()));
  auto m = Model::Load(f.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("missing tensor blk.0.ffn_up.weight"), std::string::npos) << m.status().message();
}

TEST(ModelLoad, InconsistentHeadCountsAreRejected) {
  auto bytes = Seed("tiny-llama-spm.gguf");
  std::string s(bytes.begin(), bytes.end());
  // head_count_kv = 3 does not divide head_count = 2.
  const std::string key = "llama.attention.head_count_kv";
  size_t at = s.find(key);
  ASSERT_NE(at, std::string::npos);
  uint32_t three = 3;
  std::memcpy(&s[at + key.size() + 4], &three, 4);
  TempFile f(std::vector<uint8_t>(s.begin(), s.end()));
  auto m = Model::Load(f.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("head_count"), std::string::npos) << m.status().message();
}

// The u32 value of metadata key `key` in a GGUF image, changed by `delta` (its bytes follow the
// key's name and its 4-byte type).
std::string WithU32Changed(std::string s, const std::string& key, int32_t delta) {
  const size_t at = s.find(key);
  EXPECT_NE(at, std::string::npos) << key;
  if (at == std::string::npos) return s;
  uint32_t v = 0;
  std::memcpy(&v, &s[at + key.size() + 4], 4);
  v = static_cast<uint32_t>(static_cast<int64_t>(v) + delta);
  std::memcpy(&s[at + key.size() + 4], &v, 4);
  return s;
}

// A block_count below the layers the tensors have would run a model short of its last layer.
TEST(ModelLoad, BlockCountBelowTheTensorsLayersIsRejected) {
  auto bytes = Seed("tiny-llama-spm.gguf");
  const std::string s = WithU32Changed(std::string(bytes.begin(), bytes.end()), "llama.block_count", -1);
  TempFile f(std::vector<uint8_t>(s.begin(), s.end()));
  auto m = Model::Load(f.path());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(m.status().message().find("block_count"), std::string::npos) << m.status().message();
}

TEST(ModelLoad, EmbeddingLengthThatHeadsDoNotDivideIsNamed) {
  auto bytes = Seed("tiny-llama-spm.gguf");
  const std::string s = WithU32Changed(std::string(bytes.begin(), bytes.end()), "llama.embedding_length", -1);
  TempFile f(std::vector<uint8_t>(s.begin(), s.end()));
  auto m = Model::Load(f.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("is not a multiple of head_count"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace kvfs
