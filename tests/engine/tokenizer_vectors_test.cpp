// Tokenizers against reference data: llama.cpp's vocabulary test vectors
// (shared/models/vocab/*.gguf.inp/.out), decode round trips, and the golden tokenizations
// of the reference implementation (shared/golden/*.json).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/model/gguf.h"
#include "engine/model/tokenizer.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

using testing::FileExists;
using testing::ReadFile;
using testing::SharedDir;

std::string VocabDir() { return SharedDir() + "/models/vocab"; }

struct Loaded {
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<Tokenizer> tok;
};

Loaded Load(const std::string& path) {
  Loaded l;
  auto gguf = GgufFile::Open(path);
  EXPECT_TRUE(gguf.ok()) << path << ": " << gguf.status().message();
  if (!gguf.ok()) return l;
  l.gguf = std::move(gguf).value();
  auto tok = Tokenizer::FromGguf(*l.gguf);
  EXPECT_TRUE(tok.ok()) << path << ": " << tok.status().message();
  if (tok.ok()) l.tok = std::move(tok).value();
  return l;
}

// .inp: the test strings, each followed by a line "__ggml_vocab_test__".
std::vector<std::string> ReadInputs(const std::string& path) {
  const std::string all = ReadFile(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at = all.find(sep); at != std::string::npos; at = all.find(sep, start)) {
    out.push_back(all.substr(start, at - start));
    start = at + sep.size();
  }
  EXPECT_EQ(start, all.size()) << path << ": text after the last separator";
  return out;
}

// .out: one line per string, the ids separated by spaces (an empty line for no tokens).
std::vector<std::vector<TokenId>> ReadOutputs(const std::string& path) {
  std::vector<std::vector<TokenId>> out;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<TokenId> ids;
    for (long id; ls >> id;) ids.push_back(static_cast<TokenId>(id));
    out.push_back(std::move(ids));
  }
  return out;
}

std::string Decode(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) s += tok.TokenToPiece(id);
  return s;
}

std::string Show(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

class VocabVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabVectors, MatchReference) {
  const std::string base = VocabDir() + "/ggml-vocab-" + GetParam() + ".gguf";
  KVFS_REQUIRE_DATA(base);
  KVFS_REQUIRE_DATA(base + ".inp");
  const auto inputs = ReadInputs(base + ".inp");
  const auto expected = ReadOutputs(base + ".out");
  ASSERT_EQ(inputs.size(), expected.size());
  ASSERT_GT(inputs.size(), 0u);

  Loaded l = Load(base);
  ASSERT_NE(l.tok, nullptr);
  int passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto got = l.tok->Encode(inputs[i], /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(got, expected[i]) << GetParam() << " case " << i << " '" << inputs[i]
                                << "'\n got:" << Show(got) << "\nwant:" << Show(expected[i]);
    passed += got == expected[i];
  }
  std::printf("[ vectors  ] %s: %d/%zu cases match\n", GetParam().c_str(), passed, inputs.size());
}

TEST_P(VocabVectors, DecodeRoundTrip) {
  const std::string base = VocabDir() + "/ggml-vocab-" + GetParam() + ".gguf";
  KVFS_REQUIRE_DATA(base + ".inp");
  Loaded l = Load(base);
  ASSERT_NE(l.tok, nullptr);
  const bool spm = l.gguf->GetString("tokenizer.ggml.model") == "llama";
  for (const std::string& text : ReadInputs(base + ".inp")) {
    std::string decoded = Decode(*l.tok, l.tok->Encode(text, false, false));
    // SentencePiece adds one space in front of the text.
    if (spm && !text.empty()) {
      ASSERT_FALSE(decoded.empty());
      EXPECT_EQ(decoded[0], ' ');
      decoded.erase(0, 1);
    }
    EXPECT_EQ(decoded, text) << GetParam();
  }
}

// Arbitrary bytes (invalid UTF-8, fragments of special tokens) never crash and give ids in
// range, with and without parse_special.
TEST_P(VocabVectors, ArbitraryBytesAreSafe) {
  const std::string path = VocabDir() + "/ggml-vocab-" + GetParam() + ".gguf";
  KVFS_REQUIRE_DATA(path);
  Loaded l = Load(path);
  ASSERT_NE(l.tok, nullptr);
  const std::string alphabet = "<|>_endoftxim s\n\t'0123456789\xE2\x96\x81\xC3\xA4\xF0\x9F";
  std::mt19937 rng(3);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) {
      c = (rng() % 2) ? alphabet[rng() % alphabet.size()] : static_cast<char>(rng() % 256);
    }
    for (bool special : {false, true}) {
      for (TokenId id : l.tok->Encode(s, special, special)) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, l.tok->n_vocab());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, VocabVectors,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "starcoder",
                                           "deepseek-llm", "deepseek-coder", "falcon", "mpt",
                                           "refact"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = (c == '-') ? '_' : c;
                           return n;
                         });

// bert-bge's vectors are not run: WordPiece (BERT) tokenizers are out of scope, and loading
// one must say so clearly.
TEST(VocabVectors, BertIsReportedUnsupported) {
  const std::string path = VocabDir() + "/ggml-vocab-bert-bge.gguf";
  KVFS_REQUIRE_DATA(path);
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok());
  auto tok = Tokenizer::FromGguf(**gguf);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(tok.status().message().find("bert"), std::string::npos) << tok.status().message();
}

// Vocabularies shipped without vectors must still load and round-trip plain text.
TEST(VocabVectors, LoadsVocabsWithoutVectors) {
  for (const char* name : {"baichuan", "gpt-neox"}) {
    const std::string path = VocabDir() + "/ggml-vocab-" + name + ".gguf";
    KVFS_REQUIRE_DATA(path);
    Loaded l = Load(path);
    ASSERT_NE(l.tok, nullptr) << name;
    const std::string text = "Hello world, 123 tokens!";
    std::string decoded = Decode(*l.tok, l.tok->Encode(text, false, false));
    if (!decoded.empty() && decoded[0] == ' ' && text[0] != ' ') decoded.erase(0, 1);
    EXPECT_EQ(decoded, text) << name;
  }
}

// shared/golden: add_special=true, parse_special=false tokenizations by the reference.
TEST(TokenizerGolden, MatchesReference) {
  const std::string golden = SharedDir() + "/golden";
  KVFS_REQUIRE_DATA(golden);
  int checked = 0;
  for (const auto& e : std::filesystem::directory_iterator(golden)) {
    if (e.path().extension() != ".json") continue;
    const auto j = nlohmann::json::parse(ReadFile(e.path().string()));
    const std::string file = j["model"]["file"];
    const std::string model = file == "stories260K.gguf"
                                  ? SharedDir() + "/models/" + file
                                  : testing::TestModelsDir() + "/" + file;
    KVFS_REQUIRE_DATA(model);
    Loaded l = Load(model);
    ASSERT_NE(l.tok, nullptr) << model;
    const std::string text = j["prompt"]["text"];
    const auto want = j["tokenization"]["tokens"].get<std::vector<TokenId>>();
    EXPECT_EQ(l.tok->Encode(text, /*add_special=*/true, /*parse_special=*/false), want)
        << e.path().filename();
    EXPECT_EQ(l.tok->add_bos(), j["tokenization"]["add_bos"].get<bool>()) << e.path().filename();
    EXPECT_EQ(l.tok->bos(), j["tokenization"]["bos_id"].get<TokenId>());
    EXPECT_EQ(l.tok->eos(), j["tokenization"]["eos_id"].get<TokenId>());
    ++checked;
  }
  EXPECT_GT(checked, 0);
  std::printf("[ golden   ] %d reference tokenizations checked\n", checked);
}

// Long text round-trips (speed is measured by bench/bench_tokenizer, not here).
TEST(TokenizerLongText, HundredKilobytesRoundTrip) {
  const std::string corpus = SharedDir() + "/corpus/wiki.test.head256k.txt";
  KVFS_REQUIRE_DATA(corpus);
  const std::string text = ReadFile(corpus).substr(0, 100 * 1024);
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm", "mpt"}) {
    const std::string path = VocabDir() + "/ggml-vocab-" + name + ".gguf";
    KVFS_REQUIRE_DATA(path);
    Loaded l = Load(path);
    ASSERT_NE(l.tok, nullptr);
    const auto ids = l.tok->Encode(text, false, false);
    EXPECT_GT(ids.size(), text.size() / 8) << name;
    EXPECT_EQ(Decode(*l.tok, ids).size(), text.size() + (std::string(name) == "llama-spm"));
  }
}

}  // namespace
}  // namespace kvfs
