// Pre-tokenizer selection (tokenizer.ggml.pre) and the byte-level word encoding.
// Stage lists follow llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp), in order.
#include "engine/model/pretokenizer.h"

#include <array>
#include <span>

#include "engine/core/message_text.h"
#include "engine/model/pretokenizer_split.h"
#include "engine/model/unicode.h"

namespace kvfs {
namespace {

using pretok::Stage;

constexpr Stage M(pretok::Matcher m) { return Stage{m, nullptr}; }
constexpr Stage S(pretok::Scanner s) { return Stage{nullptr, s}; }

constexpr std::array kDefaultStages = {M(pretok::MatchPunctDefault), S(pretok::ScanGpt2),
                                       M(pretok::MatchNumbers), M(pretok::MatchThreeDigits)};
constexpr std::array kGpt2Stages = {S(pretok::ScanGpt2)};
constexpr std::array kLlama3Stages = {S(pretok::ScanLlama3)};
constexpr std::array kQwen2Stages = {S(pretok::ScanQwen2)};
constexpr std::array kDeepseekLlmStages = {
    M(pretok::MatchNewline),         M(pretok::MatchDeepseekLetters), M(pretok::MatchDeepseekPunct),
    S(pretok::ScanTrailingSpace),    M(pretok::MatchCjk),             M(pretok::MatchNumbers)};
constexpr std::array kDeepseekCoderStages = {M(pretok::MatchNewline), M(pretok::MatchSpaceLetters),
                                             M(pretok::MatchSpacePunct), M(pretok::MatchCjk),
                                             M(pretok::MatchNumber)};
constexpr std::array kFalconStages = {M(pretok::MatchPunctFalcon), S(pretok::ScanGpt2),
                                      M(pretok::MatchThreeDigits)};
constexpr std::array kStarcoderStages = {M(pretok::MatchNumber), S(pretok::ScanGpt2)};
constexpr std::array kPoroStages = {M(pretok::MatchPoroWord)};
constexpr std::array kVikingStages = {M(pretok::MatchPoroWord), M(pretok::MatchNumber)};

std::span<const Stage> StagesOf(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kDefault: return kDefaultStages;
    case PreTokenizerKind::kGpt2: return kGpt2Stages;
    case PreTokenizerKind::kLlama3: return kLlama3Stages;
    case PreTokenizerKind::kQwen2: return kQwen2Stages;
    case PreTokenizerKind::kDeepseekLlm: return kDeepseekLlmStages;
    case PreTokenizerKind::kDeepseekCoder: return kDeepseekCoderStages;
    case PreTokenizerKind::kFalcon: return kFalconStages;
    case PreTokenizerKind::kStarcoder: return kStarcoderStages;
    case PreTokenizerKind::kPoro: return kPoroStages;
    case PreTokenizerKind::kViking: return kVikingStages;
  }
  return kDefaultStages;
}

struct NamedPre {
  std::string_view name;
  PreTokenizerConfig config;
};

constexpr PreTokenizerConfig Plain(PreTokenizerKind kind) { return {kind, false, false}; }
// llama.cpp turns on ignore_merges and add_bos for the Llama-3 family of names.
constexpr PreTokenizerConfig Llama3Like() { return {PreTokenizerKind::kLlama3, true, true}; }

// Only names whose llama.cpp handling is fully covered here (no add_sep, no normaliser
// changes, no special BOS rules) are accepted.
constexpr NamedPre kNames[] = {
    {"default", Plain(PreTokenizerKind::kDefault)},
    {"gpt-2", Plain(PreTokenizerKind::kGpt2)},
    {"phi-2", Plain(PreTokenizerKind::kGpt2)},
    {"mpt", Plain(PreTokenizerKind::kGpt2)},
    {"olmo", Plain(PreTokenizerKind::kGpt2)},
    {"jais", Plain(PreTokenizerKind::kGpt2)},
    {"gigachat", Plain(PreTokenizerKind::kGpt2)},
    {"jina-es", Plain(PreTokenizerKind::kGpt2)},
    {"jina-de", Plain(PreTokenizerKind::kGpt2)},
    {"jina-v2-es", Plain(PreTokenizerKind::kGpt2)},
    {"jina-v2-de", Plain(PreTokenizerKind::kGpt2)},
    {"exaone4", Plain(PreTokenizerKind::kGpt2)},
    {"trillion", Plain(PreTokenizerKind::kGpt2)},
    {"llama3", Llama3Like()},
    {"llama-v3", Llama3Like()},
    {"llama-bpe", Llama3Like()},
    {"falcon3", Llama3Like()},
    {"falcon-h1", Llama3Like()},
    {"pixtral", Llama3Like()},
    {"dbrx", Plain(PreTokenizerKind::kLlama3)},
    {"smaug-bpe", Plain(PreTokenizerKind::kLlama3)},
    {"qwen2", Plain(PreTokenizerKind::kQwen2)},
    {"deepseek-r1-qwen", Plain(PreTokenizerKind::kQwen2)},
    {"megrez", Plain(PreTokenizerKind::kQwen2)},
    {"stablelm2", Plain(PreTokenizerKind::kQwen2)},
    {"hunyuan", Plain(PreTokenizerKind::kQwen2)},
    {"deepseek-llm", Plain(PreTokenizerKind::kDeepseekLlm)},
    {"deepseek-coder", Plain(PreTokenizerKind::kDeepseekCoder)},
    {"falcon", Plain(PreTokenizerKind::kFalcon)},
    {"starcoder", Plain(PreTokenizerKind::kStarcoder)},
    {"refact", Plain(PreTokenizerKind::kStarcoder)},
    {"command-r", Plain(PreTokenizerKind::kStarcoder)},
    {"smollm", Plain(PreTokenizerKind::kStarcoder)},
    {"codeshell", Plain(PreTokenizerKind::kStarcoder)},
    {"exaone", Plain(PreTokenizerKind::kStarcoder)},
    {"minerva-7b", Plain(PreTokenizerKind::kStarcoder)},
    {"poro-chat", Plain(PreTokenizerKind::kPoro)},
    {"bloom", Plain(PreTokenizerKind::kPoro)},
    {"gpt3-finnish", Plain(PreTokenizerKind::kPoro)},
    {"viking", Plain(PreTokenizerKind::kViking)},
};

}  // namespace

Result<PreTokenizerConfig> PreTokenizerFromName(std::string_view name) {
  // A BPE vocabulary without tokenizer.ggml.pre gets llama.cpp's "default" pre-tokenizer.
  if (name.empty()) return Plain(PreTokenizerKind::kDefault);
  for (const auto& entry : kNames) {
    if (entry.name == name) return entry.config;
  }
  return Unsupported("unsupported pre-tokenizer " + QuoteForMessage(name) + " (tokenizer.ggml.pre)");
}

void PreTokenize(PreTokenizerKind kind, std::string_view text, std::vector<std::string>& out) {
  out.clear();
  pretok::CodePoints t;
  t.cp = unicode::DecodeUtf8Lossy(text);
  if (t.cp.empty()) return;
  t.flags.resize(t.cp.size());
  for (size_t i = 0; i < t.cp.size(); ++i) t.flags[i] = unicode::Flags(t.cp[i]);

  pretok::Pieces pieces{t.cp.size()};
  for (const Stage& stage : StagesOf(kind)) pieces = pretok::ApplyStage(t, pieces, stage);

  // Each word's UTF-8 bytes, every byte spelt as its byte-level alphabet code point.
  out.reserve(pieces.size());
  std::string utf8;
  size_t begin = 0;
  for (size_t len : pieces) {
    utf8.clear();
    for (size_t i = begin; i < begin + len; ++i) unicode::AppendUtf8(utf8, t.cp[i]);
    std::string& word = out.emplace_back();
    word.reserve(utf8.size() * 2);
    for (char c : utf8) unicode::AppendUtf8(word, unicode::ByteToUnicode(static_cast<uint8_t>(c)));
    begin += len;
  }
}

}  // namespace kvfs
