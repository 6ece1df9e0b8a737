// Tokenizer::FromGguf: reads and validates tokenizer.ggml.* and derives what llama.cpp
// derives from it (defaults, special-token attributes, end-of-generation set). Also the
// StreamDecoder.
#include "engine/model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include <spdlog/fmt/fmt.h>

#include "engine/core/message_text.h"
#include "engine/model/tokenizer_internal.h"

namespace kvfs {
namespace {

using tok::VocabData;

constexpr int64_t kNoneId = 0xFFFFFFFF;  // how converters spell "no such token" in a u32

// Token texts llama.cpp recognises regardless of the ids in the metadata. A token found by
// one of these lists is also treated as a control token (never produced from plain text
// unless parse_special, rendered only on request), as llama.cpp does.
constexpr std::string_view kEotTexts[] = {
    // Ends of a chat turn, in preference order. llama.cpp also takes document ends such as
    // <|endoftext|> here; we keep those out of eot() (they stay end-of-generation tokens).
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<EOT>", "_<EOT>", "[EOT]",
    "<end_of_utterance>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPreTexts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                             "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                                             "<|code_prefix|>"};
constexpr std::string_view kFimSufTexts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                             "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                                             "<|code_suffix|>"};
constexpr std::string_view kFimMidTexts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                             "<｜fim▁end｜>", "<MID>", "▁<MID>",
                                             "<|code_middle|>"};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                             "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
// End-of-generation markers (llama.cpp's list, minus those of vocabularies with tokenizer
// models this build does not support).
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>",
    "<eos>", "<｜end▁of▁sentence｜>"};

struct Ids {
  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken;
  TokenId fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken;
  TokenId fim_pad = kNoToken, fim_rep = kNoToken, fim_sep = kNoToken;
};

// Reads an optional token-id key into `id`. A default that is out of range is dropped, as
// llama.cpp does; a value in the file must be in range or say "none".
Status ReadId(const GgufFile& gguf, std::string_view key, int32_t n_vocab, TokenId& id) {
  if (id >= n_vocab) id = kNoToken;
  if (gguf.Find(key) == nullptr) return Status::Ok();
  const std::optional<int64_t> v = gguf.GetInt(key);
  if (!v) return Corrupt(fmt::format("{} is not an integer", key));
  if (*v == kNoneId || *v == -1) {
    id = kNoToken;
  } else if (*v < 0 || *v >= n_vocab) {
    return Corrupt(fmt::format("{} = {} is outside the vocabulary of {} tokens", key, *v, n_vocab));
  } else {
    id = static_cast<TokenId>(*v);
  }
  return Status::Ok();
}

Status ReadBool(const GgufFile& gguf, std::string_view key, bool& out) {
  if (gguf.Find(key) == nullptr) return Status::Ok();
  const std::optional<bool> v = gguf.GetBool(key);
  if (!v) return Corrupt(fmt::format("{} is not a bool", key));
  out = *v;
  return Status::Ok();
}

// An optional array that, when present, must have one element per token.
Result<const GgufArray*> PerTokenArray(const GgufFile& gguf, std::string_view key,
                                       uint64_t n_tokens, bool want_float) {
  if (gguf.Find(key) == nullptr) return static_cast<const GgufArray*>(nullptr);
  const GgufArray* arr = gguf.GetArray(key);
  if (arr == nullptr || !(arr->is_integer() || (want_float && arr->is_float()))) {
    return Corrupt(fmt::format("{} is not an array of {}", key, want_float ? "numbers" : "integers"));
  }
  if (arr->size() < n_tokens) {
    return Corrupt(fmt::format("{} has {} entries for {} tokens", key, arr->size(), n_tokens));
  }
  return arr;
}

TokenAttr AttrFromType(int64_t type) {
  switch (type) {
    case 1: return TokenAttr::kNormal;
    case 2: return TokenAttr::kUnknown;
    case 3: return TokenAttr::kControl;
    case 4: return TokenAttr::kUserDefined;
    case 5: return TokenAttr::kUnused;
    case 6: return TokenAttr::kByte;
    default: return TokenAttr::kUndefined;
  }
}

uint16_t BitsFromAttr(TokenAttr attr) {
  switch (attr) {
    case TokenAttr::kNormal: return tok::kAttrNormal;
    case TokenAttr::kUnknown: return tok::kAttrUnknown;
    case TokenAttr::kControl: return tok::kAttrControl;
    case TokenAttr::kUserDefined: return tok::kAttrUserDefined;
    case TokenAttr::kUnused: return tok::kAttrUnused;
    case TokenAttr::kByte: return tok::kAttrByte;
    case TokenAttr::kUndefined: return 0;
  }
  return 0;
}

// Lookups over the raw token list (the tokenizer's index does not exist yet).
class TextIndex {
 public:
  explicit TextIndex(const std::vector<std::string>& tokens) {
    map_.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) map_.emplace(tokens[i], static_cast<TokenId>(i));
  }
  TokenId Find(std::string_view text) const {
    auto it = map_.find(text);
    return it == map_.end() ? kNoToken : it->second;
  }

 private:
  std::unordered_map<std::string_view, TokenId> map_;
};

void MarkControl(VocabData& v, TokenId id) {
  v.attr_bits[id] |= tok::kAttrControl;
  v.attrs[id] = TokenAttr::kControl;
}

// Fills `id` from the first of `texts` present in the vocabulary when the metadata left it
// unset, and marks that token as control.
template <size_t N>
void Detect(VocabData& v, const TextIndex& index, const std::string_view (&texts)[N], TokenId& id) {
  if (id != kNoToken) return;
  for (std::string_view text : texts) {
    if (TokenId found = index.Find(text); found != kNoToken) {
      id = found;
      MarkControl(v, found);
      return;
    }
  }
}

Status ReadTokens(const GgufFile& gguf, VocabData& v) {
  const GgufArray* tokens = gguf.GetArray("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->elem_type() != GgufValueType::kString) {
    return Corrupt("tokenizer.ggml.tokens is missing or not an array of strings");
  }
  const uint64_t n = tokens->size();
  if (n == 0 || n > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return Corrupt(fmt::format("tokenizer.ggml.tokens has {} entries", n));
  }
  KVFS_ASSIGN_OR_RETURN(const GgufArray* scores,
                        PerTokenArray(gguf, "tokenizer.ggml.scores", n, /*want_float=*/true));
  KVFS_ASSIGN_OR_RETURN(const GgufArray* types,
                        PerTokenArray(gguf, "tokenizer.ggml.token_type", n, /*want_float=*/false));
  v.tokens.resize(n);
  v.attrs.resize(n);
  v.attr_bits.resize(n);
  v.scores.assign(n, 0.0f);
  for (uint64_t i = 0; i < n; ++i) {
    v.tokens[i] = std::string(tokens->string_at(i));
    // An empty entry would match everywhere; llama.cpp renames it the same way.
    if (v.tokens[i].empty()) v.tokens[i] = fmt::format("[EMPTY_{}]", i);
    if (scores != nullptr) v.scores[i] = static_cast<float>(scores->float_at(i));
    v.attrs[i] = types != nullptr ? AttrFromType(types->int_at(i)) : TokenAttr::kNormal;
    v.attr_bits[i] = BitsFromAttr(v.attrs[i]);
  }
  return Status::Ok();
}

Status ReadMerges(const GgufFile& gguf, VocabData& v) {
  const GgufArray* merges = gguf.GetArray("tokenizer.ggml.merges");
  if (merges == nullptr || merges->elem_type() != GgufValueType::kString) {
    return Corrupt("tokenizer.ggml.merges is missing or not an array of strings");
  }
  v.merges.reserve(merges->size());
  for (uint64_t i = 0; i < merges->size(); ++i) {
    const std::string_view m = merges->string_at(i);
    // "left right"; the separator is searched from the second byte, as in llama.cpp.
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (sp == std::string_view::npos) {
      v.merges.emplace_back();  // keeps the ranks of later merges; matches nothing
      continue;
    }
    v.merges.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
  }
  return Status::Ok();
}

// Special ids, their defaults, add_bos/add_eos.
Status ReadSpecials(const GgufFile& gguf, bool spm, VocabData& v, Ids& ids) {
  const int32_t n = static_cast<int32_t>(v.tokens.size());
  // llama.cpp's defaults when a key is absent (the BPE ones come from Falcon's vocabulary).
  ids.bos = spm ? 1 : 11;
  ids.eos = spm ? 2 : 11;
  ids.unk = spm ? 0 : kNoToken;
  TokenId sep = kNoToken, pad = kNoToken, mask = kNoToken, cls = kNoToken;
  const std::pair<std::string_view, TokenId*> keys[] = {
      {"tokenizer.ggml.bos_token_id", &ids.bos},
      {"tokenizer.ggml.eos_token_id", &ids.eos},
      {"tokenizer.ggml.eot_token_id", &ids.eot},
      {"tokenizer.ggml.eom_token_id", &ids.eom},
      {"tokenizer.ggml.unknown_token_id", &ids.unk},
      {"tokenizer.ggml.seperator_token_id", &sep},
      {"tokenizer.ggml.padding_token_id", &pad},
      {"tokenizer.ggml.mask_token_id", &mask},
      {"tokenizer.ggml.cls_token_id", &cls},
      {"tokenizer.ggml.fim_pre_token_id", &ids.fim_pre},
      {"tokenizer.ggml.fim_suf_token_id", &ids.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &ids.fim_mid},
      {"tokenizer.ggml.fim_pad_token_id", &ids.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &ids.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", &ids.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &ids.fim_pre},  // deprecated spellings
      {"tokenizer.ggml.suffix_token_id", &ids.fim_suf},
      {"tokenizer.ggml.middle_token_id", &ids.fim_mid},
  };
  for (const auto& [key, id] : keys) KVFS_RETURN_IF_ERROR(ReadId(gguf, key, n, *id));

  KVFS_RETURN_IF_ERROR(ReadBool(gguf, "tokenizer.ggml.add_bos_token", v.add_bos));
  KVFS_RETURN_IF_ERROR(ReadBool(gguf, "tokenizer.ggml.add_eos_token", v.add_eos));
  if (v.add_bos && ids.bos == kNoToken) {
    return Corrupt("tokenizer.ggml.add_bos_token is true but there is no BOS token");
  }
  if (v.add_eos && ids.eos == kNoToken) {
    return Corrupt("tokenizer.ggml.add_eos_token is true but there is no EOS token");
  }
  return Status::Ok();
}

// Text-detected special tokens and the end-of-generation set (llama.cpp's vocab load).
void DeriveSpecials(const GgufFile& gguf, VocabData& v, Ids& ids) {
  const TextIndex index(v.tokens);
  Detect(v, index, kEotTexts, ids.eot);
  Detect(v, index, kEomTexts, ids.eom);
  Detect(v, index, kFimPreTexts, ids.fim_pre);
  Detect(v, index, kFimSufTexts, ids.fim_suf);
  Detect(v, index, kFimMidTexts, ids.fim_mid);
  Detect(v, index, kFimPadTexts, ids.fim_pad);
  Detect(v, index, kFimRepTexts, ids.fim_rep);
  Detect(v, index, kFimSepTexts, ids.fim_sep);

  std::vector<TokenId> eog;
  for (TokenId id : {ids.eos, ids.eot, ids.eom, ids.fim_pad, ids.fim_rep, ids.fim_sep}) {
    if (id != kNoToken) eog.push_back(id);
  }
  for (std::string_view text : kEogTexts) {
    if (TokenId id = index.Find(text); id != kNoToken) {
      eog.push_back(id);
      MarkControl(v, id);
    }
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  v.eog = std::move(eog);
  v.bos = ids.bos;
  v.eos = ids.eos;
  v.eot = ids.eot;
  v.unk = ids.unk;

  // Phi-3's tokenizer strips whitespace after its special tokens (llama.cpp keys this on
  // the model name, for want of per-token strip flags in GGUF).
  std::string name(gguf.GetString("general.name").value_or(""));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (uint16_t& bits : v.attr_bits) {
      if (bits & (tok::kAttrControl | tok::kAttrUserDefined | tok::kAttrUnknown)) {
        bits |= tok::kAttrRstrip;
      }
    }
    if (TokenId id = index.Find("</s>"); id != kNoToken) v.attr_bits[id] |= tok::kAttrRstrip;
    for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (TokenId id = index.Find(text); id != kNoToken) v.attr_bits[id] &= ~tok::kAttrRstrip;
    }
  }
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  const std::optional<std::string_view> model = gguf.GetString("tokenizer.ggml.model");
  if (!model) return Corrupt("tokenizer.ggml.model is missing or not a string");
  const bool spm = *model == "llama";
  if (!spm && *model != "gpt2") {
    return Unsupported(fmt::format("unsupported tokenizer model {}", QuoteForMessage(*model)));
  }

  VocabData v;
  KVFS_RETURN_IF_ERROR(ReadTokens(gguf, v));
  if (spm) {
    // SentencePiece vocabularies: BOS and a leading space unless the metadata says otherwise.
    v.add_bos = true;
    KVFS_RETURN_IF_ERROR(ReadBool(gguf, "tokenizer.ggml.add_space_prefix", v.add_space_prefix));
  } else {
    std::string_view pre;
    if (gguf.Find("tokenizer.ggml.pre") != nullptr) {
      const std::optional<std::string_view> s = gguf.GetString("tokenizer.ggml.pre");
      if (!s) return Corrupt("tokenizer.ggml.pre is not a string");
      pre = *s;
    }
    KVFS_ASSIGN_OR_RETURN(v.pre, PreTokenizerFromName(pre));
    v.add_bos = v.pre.default_add_bos;
    KVFS_RETURN_IF_ERROR(ReadMerges(gguf, v));
  }
  Ids ids;
  KVFS_RETURN_IF_ERROR(ReadSpecials(gguf, spm, v, ids));
  DeriveSpecials(gguf, v, ids);
  return spm ? tok::MakeSpmTokenizer(std::move(v)) : tok::MakeBpeTokenizer(std::move(v));
}

namespace {

// Length of the valid UTF-8 sequence at s[i]: > 0 complete; 0 when the bytes present are a
// valid but unfinished start (more may come); < 0 when invalid, -n meaning the first n bytes
// form the maximal invalid subpart to replace with one U+FFFD.
int Utf8Status(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k < need; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<uint8_t>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -k;
  }
  return need;
}

}  // namespace

std::string ShowAsText(std::string_view bytes, bool final, std::vector<std::pair<size_t, size_t>>* unit_ends) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const int st = Utf8Status(bytes, i);
    if (st > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(st)));
      i += static_cast<size_t>(st);
    } else if (st < 0 || final) {
      out += kReplacement;
      i = st < 0 ? i + static_cast<size_t>(-st) : bytes.size();
    } else {
      break;  // an unfinished character at the end
    }
    if (unit_ends != nullptr) unit_ends->emplace_back(i, out.size());
  }
  return out;
}

namespace {

// Moves the complete characters of `pending` to the result; invalid bytes become U+FFFD.
// An unfinished sequence at the end stays in `pending` unless `final`.
std::string Drain(std::string& pending, bool final) {
  std::vector<std::pair<size_t, size_t>> units;
  std::string out = ShowAsText(pending, final, &units);
  pending.erase(0, units.empty() ? 0 : units.back().first);
  return out;
}

}  // namespace

std::string StreamDecoder::Push(TokenId id) {
  pending_ += tokenizer_.TokenToPiece(id);
  return Drain(pending_, /*final=*/false);
}

std::string StreamDecoder::Flush() { return Drain(pending_, /*final=*/true); }

}  // namespace kvfs
