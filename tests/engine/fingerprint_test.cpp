// Model fingerprint: stable for the same bytes, different for any change in metadata, the
// tensor table or a sampled region; fast because only sampled bytes are read.
#include "engine/model/fingerprint.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

#include "tests/engine/store_test_util.h"
#include "tests/gguf_builder.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

constexpr size_t kBig = 1 << 20;  // bytes of the big tensor: 3 x 64 KiB sampled of 1 MiB

std::vector<uint8_t> Model() {
  testing::GgufBuilder b;
  b.Str("general.architecture", "llama");
  b.U32("llama.block_count", 2);
  b.F32("llama.rope.freq_base", 10000.0f);
  b.StrArray("tokenizer.ggml.tokens", {"<s>", "a", "b"});
  b.Tensor("small", 0, {8}, store::testing::PseudoRandom(32, 1));
  b.Tensor("big", 0, {kBig / 4}, store::testing::PseudoRandom(kBig, 2));
  b.Tensor("mid", 1, {100000}, store::testing::PseudoRandom(200000, 3));
  return b.Bytes();
}

std::string Fp(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::Parse(bytes);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? ModelFingerprint(**f) : "";
}

uint64_t TensorOffset(const std::vector<uint8_t>& bytes, const std::string& name) {
  auto f = GgufFile::Parse(bytes);
  return (*f)->FindTensor(name)->file_offset;
}

TEST(Fingerprint, StableAndHex) {
  const auto a = Model();
  const auto b = Model();
  const std::string fa = Fp(a);
  EXPECT_EQ(fa, Fp(b));
  EXPECT_EQ(fa, Fp(a));
  EXPECT_TRUE(store::IsHex128(fa)) << fa;
}

TEST(Fingerprint, MetadataChangeChangesIt) {
  const auto base = Model();
  const std::string f0 = Fp(base);
  auto m = base;
  const std::string key = "llama";
  auto it = std::search(m.begin(), m.end(), key.begin(), key.end());
  ASSERT_NE(it, m.end());
  // The architecture value: the second "llama" in the file (the first is in a key name)...
  // either way it is metadata, and any byte of it must change the fingerprint.
  *it = 'L';
  EXPECT_NE(Fp(m), f0);
  // A one-bit change in a float metadata value.
  m = base;
  const std::string fb = "llama.rope.freq_base";
  it = std::search(m.begin(), m.end(), fb.begin(), fb.end());
  ASSERT_NE(it, m.end());
  *(it + static_cast<ptrdiff_t>(fb.size()) + 4) ^= 1;  // after the 4-byte type id: the value's low byte
  EXPECT_NE(Fp(m), f0);
}

TEST(Fingerprint, SampledTensorBytesChangeIt) {
  const auto base = Model();
  const std::string f0 = Fp(base);
  const uint64_t big = TensorOffset(base, "big");
  const uint64_t sample = 64 * 1024;
  const uint64_t middle = (kBig - sample) / 2;
  for (uint64_t at : {uint64_t{0}, sample - 1, middle, middle + sample - 1, kBig - sample, kBig - 1}) {
    auto m = base;
    m[big + at] ^= 0x80;
    EXPECT_NE(Fp(m), f0) << "byte " << at << " of the big tensor";
  }
  // Tensors no larger than three samples are hashed whole.
  const uint64_t small = TensorOffset(base, "small");
  for (uint64_t at = 0; at < 32; ++at) {
    auto m = base;
    m[small + at] ^= 1;
    EXPECT_NE(Fp(m), f0) << "byte " << at << " of the small tensor";
  }
  const uint64_t mid = TensorOffset(base, "mid");
  auto m = base;
  m[mid + 100000] ^= 1;
  EXPECT_NE(Fp(m), f0);
  // By design, a byte outside the samples of a large tensor is not read.
  m = base;
  m[big + sample + 1000] ^= 1;
  EXPECT_EQ(Fp(m), f0);
}

// Real models: deterministic, and distinct models get distinct fingerprints. (Speed is
// measured by bench/store_bench, not here.)
TEST(Fingerprint, RealModelsAreStableAndDistinct) {
  const std::string stories = testing::SharedDir() + "/models/stories260K.gguf";
  KVFS_REQUIRE_DATA(stories);
  std::vector<std::string> paths = {stories};
  for (const char* name : {"tiny-llama-Q4_0.gguf", "tiny-llama-F16.gguf", "tiny-qwen2-Q8_0.gguf"}) {
    const std::string path = testing::TestModelsDir() + "/" + name;
    KVFS_REQUIRE_DATA(path);
    paths.push_back(path);
  }
  std::set<std::string> seen;
  for (const std::string& path : paths) {
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    const std::string fp = ModelFingerprint(**f);
    EXPECT_EQ(fp.size(), 32u);
    EXPECT_EQ(ModelFingerprint(**f), fp);
    EXPECT_TRUE(seen.insert(fp).second) << path << " has the fingerprint of another model";
  }
}

}  // namespace
}  // namespace kvfs
