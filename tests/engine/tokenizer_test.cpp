// Tokenizer behaviour on small hand-made vocabularies (built as in-memory GGUF images):
// merges, byte fallback, special tokens, metadata defaults and validation, StreamDecoder.
#include "engine/model/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>

#include "engine/model/gguf.h"
#include "tests/gguf_builder.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

using testing::GgufBuilder;

// Keeps the image alive as long as the parsed file (GgufFile::Parse does not copy).
struct Built {
  std::vector<uint8_t> bytes;
  std::unique_ptr<GgufFile> gguf;
};

Built Parse(const GgufBuilder& w) {
  Built b;
  b.bytes = w.Bytes();
  auto f = GgufFile::Parse(b.bytes);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (f.ok()) b.gguf = std::move(f).value();
  return b;
}

Result<std::unique_ptr<Tokenizer>> Build(const GgufBuilder& w, Built& keep) {
  keep = Parse(w);
  if (!keep.gguf) return Internal("test image did not parse");
  return Tokenizer::FromGguf(*keep.gguf);
}

// A SentencePiece vocabulary: specials, all 256 byte tokens, a few pieces.
struct SpmVocab {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  SpmVocab() {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      Add(name, 0, 6);
    }
    Add("\xE2\x96\x81", -1);            // ▁
    Add("a", -1);
    Add("b", -1);
    Add("\xE2\x96\x81" "a", -0.5f);     // ▁a
    Add("ab", -0.4f);
    Add("\xE2\x96\x81" "ab", -0.1f);    // ▁ab
    Add("<tool>", 0, 4);                // user-defined
  }
  void Add(std::string text, float score, int32_t type = 1) {
    tokens.push_back(std::move(text));
    scores.push_back(score);
    types.push_back(type);
  }
  TokenId Id(std::string_view text) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == text) return static_cast<TokenId>(i);
    }
    return kNoToken;
  }
  // GGUF keys must be unique: a test that sets an id itself leaves it out here.
  GgufBuilder Writer(std::optional<uint32_t> bos = 1, std::optional<uint32_t> eos = 2) const {
    GgufBuilder w;
    w.Str("tokenizer.ggml.model", "llama")
        .StrArray("tokenizer.ggml.tokens", tokens)
        .F32Array("tokenizer.ggml.scores", scores)
        .I32Array("tokenizer.ggml.token_type", types)
        .U32("tokenizer.ggml.unknown_token_id", 0);
    if (bos) w.U32("tokenizer.ggml.bos_token_id", *bos);
    if (eos) w.U32("tokenizer.ggml.eos_token_id", *eos);
    return w;
  }
};

TEST(SpmTokenizer, MergesByScoreAndFallsBackToBytes) {
  SpmVocab v;
  Built keep;
  auto tok = Build(v.Writer(), keep);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const Tokenizer& t = **tok;
  const TokenId sp_ab = v.Id("\xE2\x96\x81" "ab");
  // "▁ab▁ab": "ab" (-0.4) beats "▁a" (-0.5), then "▁ab" (-0.1) forms.
  EXPECT_EQ(t.Encode("ab ab", false, false), (std::vector<TokenId>{sp_ab, sp_ab}));
  // 'x' is not a piece: its byte token stands in.
  EXPECT_EQ(t.Encode("x", false, false), (std::vector<TokenId>{v.Id("\xE2\x96\x81"), v.Id("<0x78>")}));
  // Defaults of a llama vocabulary: BOS yes, EOS no.
  EXPECT_TRUE(t.add_bos());
  EXPECT_FALSE(t.add_eos());
  EXPECT_EQ(t.Encode("ab", true, false), (std::vector<TokenId>{1, sp_ab}));
  EXPECT_EQ(t.Encode("", true, false), (std::vector<TokenId>{1}));
  EXPECT_TRUE(t.Encode("", false, false).empty());
}

// User-defined tokens are cut out of any text, but one that is a chat template's markup
// (SpecialParsing's markers) stays text inside the literal spans, as control tokens do.
TEST(SpmTokenizer, MarkerTokensStayTextInsideLiteralSpans) {
  SpmVocab v;
  Built keep;
  auto tok = Build(v.Writer(), keep);
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  const TokenId tool = v.Id("<tool>");
  const std::string text = "ab<tool>ab<tool>";  // occurrences at [2, 8) and [10, 16)
  const std::vector<TextSpan> first{{0, 9}};
  const std::vector<TokenId> markers{tool};
  auto count = [&](SpecialParsing special) {
    const std::vector<TokenId> ids = t.Encode(text, false, special);
    return std::count(ids.begin(), ids.end(), tool);
  };
  EXPECT_EQ(count(false), 2);                            // user-defined: cut without parse_special too
  EXPECT_EQ(count(SpecialParsing(first)), 2);            // not a marker: cut inside the span as well
  EXPECT_EQ(count(SpecialParsing(first, markers)), 1);   // a marker: text inside the span only
  EXPECT_EQ(count(SpecialParsing(std::vector<TextSpan>{{0, 16}}, markers)), 0);
}

TEST(SpmTokenizer, SpecialTokensAndSpacePrefix) {
  SpmVocab v;
  Built keep;
  auto tok = Build(v.Writer(), keep);
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  const TokenId sp_ab = v.Id("\xE2\x96\x81" "ab");
  // Control tokens only with parse_special; the text after a special token gets the prefix.
  EXPECT_EQ(t.Encode("<s>ab", false, true), (std::vector<TokenId>{1, sp_ab}));
  const auto plain = t.Encode("<s>ab", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  // User-defined tokens are cut out even without parse_special (and, like any special
  // token, give the following text a space prefix, as llama.cpp does).
  EXPECT_EQ(t.Encode("ab<tool>ab", false, false),
            (std::vector<TokenId>{sp_ab, v.Id("<tool>"), sp_ab}));
  EXPECT_EQ(t.Encode("ab<tool> ab", false, false),
            (std::vector<TokenId>{sp_ab, v.Id("<tool>"), v.Id("\xE2\x96\x81"), sp_ab}));

  SpmVocab v2;
  GgufBuilder w = v2.Writer();
  w.Bool("tokenizer.ggml.add_space_prefix", false);
  Built keep2;
  auto no_prefix = Build(w, keep2);
  ASSERT_TRUE(no_prefix.ok());
  EXPECT_EQ((*no_prefix)->Encode("ab", false, false), (std::vector<TokenId>{v.Id("ab")}));
}

TEST(SpmTokenizer, Pieces) {
  SpmVocab v;
  Built keep;
  auto tok = Build(v.Writer(), keep);
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.TokenToPiece(v.Id("\xE2\x96\x81" "ab")), " ab");
  EXPECT_EQ(t.TokenToPiece(v.Id("<0x78>")), "x");
  EXPECT_EQ(t.TokenToPiece(1), "");
  EXPECT_EQ(t.TokenToPiece(1, /*render_special=*/true), "<s>");
  EXPECT_EQ(t.TokenToPiece(v.Id("<tool>")), "<tool>");
  EXPECT_EQ(t.TokenToPiece(-1), "");
  EXPECT_EQ(t.TokenToPiece(t.n_vocab()), "");
  EXPECT_EQ(t.token_attr(v.Id("<0x78>")), TokenAttr::kByte);
  EXPECT_EQ(t.Find("ab"), v.Id("ab"));
  EXPECT_TRUE(t.IsEog(2));  // </s> is the EOS
}

// Byte fallback keeps any byte string, valid UTF-8 or not. (Spaces are left out: like
// llama.cpp, a stray lead byte swallows the first byte of the following escaped space.)
TEST(SpmTokenizer, ArbitraryBytesRoundTrip) {
  SpmVocab v;
  Built keep;
  auto tok = Build(v.Writer(), keep);
  ASSERT_TRUE(tok.ok());
  std::mt19937 rng(7);
  for (int iter = 0; iter < 500; ++iter) {
    std::string s(rng() % 24, '\0');
    for (char& c : s) c = static_cast<char>(1 + rng() % 255);
    std::replace(s.begin(), s.end(), ' ', 'x');
    std::string decoded;
    for (TokenId id : (*tok)->Encode(s, false, false)) decoded += (*tok)->TokenToPiece(id);
    EXPECT_EQ(decoded, s.empty() ? s : " " + s);
  }
}

// A byte-level BPE vocabulary ("Ġ" is the space of GPT-2's byte alphabet).
GgufBuilder BpeWriter(const std::vector<std::string>& tokens, const std::vector<int32_t>& types,
                     const std::vector<std::string>& merges, std::string_view pre = "gpt-2") {
  GgufBuilder w;
  w.Str("tokenizer.ggml.model", "gpt2")
      .Str("tokenizer.ggml.pre", pre)
      .StrArray("tokenizer.ggml.tokens", tokens)
      .I32Array("tokenizer.ggml.token_type", types)
      .StrArray("tokenizer.ggml.merges", merges);
  return w;
}

const std::vector<std::string> kBpeTokens = {"H", "i", "\xC4\xA0", "Hi", "\xC4\xA0Hi",
                                             "<|endoftext|>", "<|im_end|>", "<tool>", "!"};
const std::vector<int32_t> kBpeTypes = {1, 1, 1, 1, 1, 3, 1, 4, 1};
const std::vector<std::string> kBpeMerges = {"H i", "\xC4\xA0 Hi"};

TEST(BpeTokenizer, MergesByRank) {
  GgufBuilder w = BpeWriter(kBpeTokens, kBpeTypes, kBpeMerges);
  w.U32("tokenizer.ggml.eos_token_id", 5).U32("tokenizer.ggml.bos_token_id", 5);
  Built keep;
  auto tok = Build(w, keep);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.Encode("Hi Hi!", false, false), (std::vector<TokenId>{3, 4, 8}));
  EXPECT_FALSE(t.add_bos());  // byte-level BPE default
  EXPECT_EQ(t.Encode("Hi", true, false), (std::vector<TokenId>{3}));
  EXPECT_EQ(t.TokenToPiece(4), " Hi");
  // User-defined tokens are cut out of plain text, control tokens only with parse_special.
  EXPECT_EQ(t.Encode("Hi<tool>Hi", false, false), (std::vector<TokenId>{3, 7, 3}));
  EXPECT_EQ(t.Encode("Hi<|endoftext|>", false, true), (std::vector<TokenId>{3, 5}));
  const auto plain = t.Encode("Hi<|endoftext|>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 5), 0);
}

TEST(BpeTokenizer, EndOfGenerationSet) {
  GgufBuilder w = BpeWriter(kBpeTokens, kBpeTypes, kBpeMerges);
  w.U32("tokenizer.ggml.eos_token_id", 5).U32("tokenizer.ggml.bos_token_id", 5);
  Built keep;
  auto tok = Build(w, keep);
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.eos(), 5);
  EXPECT_EQ(t.eot(), 6);  // <|im_end|> found by its text
  EXPECT_TRUE(t.IsEog(5));
  EXPECT_TRUE(t.IsEog(6));
  EXPECT_FALSE(t.IsEog(3));
  // An end marker typed normal is treated as control, as in llama.cpp.
  EXPECT_EQ(t.token_attr(6), TokenAttr::kControl);
  EXPECT_EQ(t.TokenToPiece(6), "");
  EXPECT_EQ(t.eog_tokens(), (std::vector<TokenId>{5, 6}));
}

TEST(BpeTokenizer, InvalidUtf8DoesNotCrash) {
  GgufBuilder w = BpeWriter(kBpeTokens, kBpeTypes, kBpeMerges);
  Built keep;
  auto tok = Build(w, keep);
  ASSERT_TRUE(tok.ok());
  std::mt19937 rng(11);
  for (int iter = 0; iter < 500; ++iter) {
    std::string s(rng() % 24, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    for (TokenId id : (*tok)->Encode(s, true, true)) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, (*tok)->n_vocab());
    }
  }
}

// --- metadata validation: every malformed input is an error value, never a crash.

Status FromGgufStatus(const GgufBuilder& w) {
  Built keep;
  auto tok = Build(w, keep);
  return tok.ok() ? Status::Ok() : tok.status();
}

TEST(TokenizerMetadata, Defaults) {
  GgufBuilder w = BpeWriter(kBpeTokens, kBpeTypes, kBpeMerges);
  Built keep;
  auto tok = Build(w, keep);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // llama.cpp's BPE defaults are id 11 for BOS and EOS; out of range here, so none.
  EXPECT_EQ((*tok)->bos(), kNoToken);
  EXPECT_EQ((*tok)->eos(), kNoToken);

  SpmVocab v;
  GgufBuilder s = v.Writer(1, 0xFFFFFFFF);
  s.Bool("tokenizer.ggml.add_bos_token", false);
  Built keep2;
  auto spm = Build(s, keep2);
  ASSERT_TRUE(spm.ok()) << spm.status().message();
  EXPECT_EQ((*spm)->eos(), kNoToken);
  EXPECT_FALSE((*spm)->add_bos());
}

TEST(TokenizerMetadata, MalformedIsAnError) {
  SpmVocab v;
  struct Case {
    const char* what;
    GgufBuilder writer;
    StatusCode code;
    const char* message_part;
  };
  std::vector<Case> cases;

  auto short_types = v.types;
  short_types.pop_back();
  cases.push_back({"token_type shorter than tokens",
                   GgufBuilder()
                       .Str("tokenizer.ggml.model", "llama")
                       .StrArray("tokenizer.ggml.tokens", v.tokens)
                       .I32Array("tokenizer.ggml.token_type", short_types),
                   StatusCode::kCorrupt, "token_type"});
  auto short_scores = v.scores;
  short_scores.resize(3);
  cases.push_back({"scores shorter than tokens",
                   GgufBuilder()
                       .Str("tokenizer.ggml.model", "llama")
                       .StrArray("tokenizer.ggml.tokens", v.tokens)
                       .F32Array("tokenizer.ggml.scores", short_scores),
                   StatusCode::kCorrupt, "scores"});
  cases.push_back({"BOS id out of range",
                   v.Writer(100000), StatusCode::kCorrupt,
                   "bos_token_id"});
  cases.push_back({"padding id out of range",
                   v.Writer().U32("tokenizer.ggml.padding_token_id", 4000), StatusCode::kCorrupt,
                   "padding_token_id"});
  cases.push_back({"EOS id of the wrong type",
                   v.Writer(1, std::nullopt).Str("tokenizer.ggml.eos_token_id", "2"), StatusCode::kCorrupt,
                   "eos_token_id"});
  cases.push_back({"add_bos without a BOS",
                   v.Writer(0xFFFFFFFF), StatusCode::kCorrupt,
                   "BOS"});
  cases.push_back({"unsupported model",
                   GgufBuilder()
                       .Str("tokenizer.ggml.model", "bert")
                       .StrArray("tokenizer.ggml.tokens", v.tokens),
                   StatusCode::kUnsupported, "unsupported tokenizer model 'bert'"});
  cases.push_back({"no model", GgufBuilder().StrArray("tokenizer.ggml.tokens", v.tokens),
                   StatusCode::kCorrupt, "tokenizer.ggml.model"});
  cases.push_back({"no tokens", GgufBuilder().Str("tokenizer.ggml.model", "llama"),
                   StatusCode::kCorrupt, "tokenizer.ggml.tokens"});
  cases.push_back({"tokens not strings",
                   GgufBuilder()
                       .Str("tokenizer.ggml.model", "llama")
                       .I32Array("tokenizer.ggml.tokens", {1, 2, 3}),
                   StatusCode::kCorrupt, "tokenizer.ggml.tokens"});
  cases.push_back({"token_type not integers",
                   GgufBuilder()
                       .Str("tokenizer.ggml.model", "llama")
                       .StrArray("tokenizer.ggml.tokens", v.tokens)
                       .F32Array("tokenizer.ggml.token_type", v.scores),
                   StatusCode::kCorrupt, "token_type"});
  cases.push_back({"unknown pre-tokenizer",
                   BpeWriter(kBpeTokens, kBpeTypes, kBpeMerges, "klingon"),
                   StatusCode::kUnsupported, "klingon"});
  cases.push_back({"BPE without merges",
                   GgufBuilder()
                       .Str("tokenizer.ggml.model", "gpt2")
                       .StrArray("tokenizer.ggml.tokens", kBpeTokens),
                   StatusCode::kCorrupt, "merges"});

  for (const Case& c : cases) {
    const Status st = FromGgufStatus(c.writer);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st.message();
    EXPECT_NE(st.message().find(c.message_part), std::string::npos) << c.what << ": " << st.message();
  }
}

// --- StreamDecoder

TEST(StreamDecoder, HoldsBackIncompleteCharacters) {
  SpmVocab v;
  Built keep;
  auto tok = Build(v.Writer(), keep);
  ASSERT_TRUE(tok.ok());
  StreamDecoder dec(**tok);
  // 日 = E6 97 A5, sent one byte token at a time.
  EXPECT_EQ(dec.Push(v.Id("<0xE6>")), "");
  EXPECT_EQ(dec.Push(v.Id("<0x97>")), "");
  EXPECT_EQ(dec.Push(v.Id("<0xA5>")), "\xE6\x97\xA5");
  EXPECT_EQ(dec.Push(v.Id("ab")), "ab");
  // A byte that can never start a character is replaced at once.
  EXPECT_EQ(dec.Push(v.Id("<0xFF>")), "\xEF\xBF\xBD");
  // An interrupted sequence is replaced when the next character arrives...
  EXPECT_EQ(dec.Push(v.Id("<0xE6>")), "");
  EXPECT_EQ(dec.Push(v.Id("ab")), "\xEF\xBF\xBD" "ab");
  // ...and an unfinished one at the end by Flush.
  EXPECT_EQ(dec.Push(v.Id("<0xF0>")), "");
  EXPECT_EQ(dec.Push(v.Id("<0x9F>")), "");
  EXPECT_EQ(dec.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.Flush(), "");
  // Control tokens add nothing.
  EXPECT_EQ(dec.Push(1), "");
}

bool IsCompleteUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const size_t n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

TEST(StreamDecoder, RealVocabularyNeverEmitsHalfCharacters) {
  const std::string path = testing::SharedDir() + "/models/vocab/ggml-vocab-llama-spm.gguf";
  KVFS_REQUIRE_DATA(path);
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok());
  auto tok = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tok.ok());
  // Emoji and rare CJK are not in the Llama vocabulary: they become byte tokens.
  const std::string text = "Gr\xC3\xBC\xC3\x9F" "e \xF0\x9F\xA6\x99 \xF0\x9F\x9A\x80 \xE9\xBE\x98 ok";
  StreamDecoder dec(**tok);
  std::string all;
  int held = 0;
  for (TokenId id : (*tok)->Encode(text, false, false)) {
    const std::string part = dec.Push(id);
    EXPECT_TRUE(IsCompleteUtf8(part)) << "half a character emitted";
    held += part.empty();
    all += part;
  }
  all += dec.Flush();
  EXPECT_EQ(all, " " + text);
  EXPECT_GT(held, 0);  // some byte tokens had to be held back
}

}  // namespace
}  // namespace kvfs
