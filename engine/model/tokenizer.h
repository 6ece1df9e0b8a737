// Tokenizers built from GGUF metadata (tokenizer.ggml.*): SentencePiece-style ("llama") and
// byte-level BPE ("gpt2") with the pre-tokenizer named by tokenizer.ggml.pre.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/gguf.h"

namespace kvfs {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type); do not renumber.
enum class TokenAttr : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

// A byte range [begin, end) of a text.
struct TextSpan {
  size_t begin = 0, end = 0;
  friend bool operator==(const TextSpan&, const TextSpan&) = default;
};

// Where text spelling a control token becomes that token: nowhere (false), everywhere (true), or
// everywhere but inside the `literal` spans (sorted, of the text being encoded). A rendered chat
// is encoded the third way: its template's markup is parsed, and the messages' contents, which a
// user wrote (or the model generated as text), stay text, so a prompt spelling "</s>" or
// "<|im_start|>" cannot end a turn or forge one. Implicit from bool: most callers want one of
// the first two.
struct SpecialParsing {
  SpecialParsing(bool parse) : parse(parse) {}  // NOLINT(google-explicit-constructor)
  // `markers`: user-defined tokens (which are parsed even without parse_special) that are a chat
  // template's markup, so text too inside the spans (some GGUFs type <start_of_turn> so).
  explicit SpecialParsing(std::span<const TextSpan> literal, std::span<const TokenId> markers = {})
      : parse(true), literal(literal), markers(markers) {}
  SpecialParsing(const void*) = delete;  // a pointer would convert to bool: "parse everywhere"
  bool parse = false;
  std::span<const TextSpan> literal;
  std::span<const TokenId> markers;
};

class Tokenizer {
 public:
  // Errors: missing or inconsistent tokenizer metadata, unsupported model or pre-tokenizer.
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  virtual ~Tokenizer() = default;

  // add_special: prepend BOS / append EOS as the metadata says (add_bos_token/add_eos_token,
  // with the llama.cpp defaults when absent). parse_special: where text spelling a control
  // token becomes that token instead of being split (user-defined tokens always do).
  virtual std::vector<TokenId> Encode(std::string_view text, bool add_special,
                                      SpecialParsing parse_special) const = 0;

  // The tokens of `text` continuing a context whose last token is `previous` (kNoToken: none):
  // no BOS, and SPM's space prefix only where an encoding of the whole context puts one (at its
  // start and after a special token), so that a context encoded in pieces gives its text.
  virtual std::vector<TokenId> EncodeContinuation(std::string_view text, TokenId previous,
                                                  SpecialParsing parse_special) const {
    (void)previous;
    return Encode(text, /*add_special=*/false, parse_special);
  }

  // The bytes a token stands for (SPM: '▁' -> ' ', <0xNN> -> that byte; BPE: the byte-level
  // alphabet mapped back to bytes). Control tokens give "" unless render_special.
  virtual std::string TokenToPiece(TokenId id, bool render_special = false) const = 0;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  std::string_view token_text(TokenId id) const { return tokens_[id]; }
  TokenAttr token_attr(TokenId id) const { return attrs_[id]; }
  // Token id for an exact vocabulary entry, or kNoToken.
  TokenId Find(std::string_view text) const;

  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }  // end-of-turn, if the vocab has one (else kNoToken)
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // End-of-generation tokens: eos, eot and the other stop tokens the vocab defines.
  const std::vector<TokenId>& eog_tokens() const { return eog_; }
  bool IsEog(TokenId id) const;

 protected:
  std::vector<std::string> tokens_;
  std::vector<TokenAttr> attrs_;
  TokenId bos_ = kNoToken, eos_ = kNoToken, eot_ = kNoToken;
  bool add_bos_ = false, add_eos_ = false;
  std::vector<TokenId> eog_;
  std::unordered_map<std::string_view, TokenId> index_;  // token text -> id (views into tokens_)
  // Fills index_ from tokens_; call once tokens_ is final. Duplicates keep the lowest id.
  void BuildIndex();
  // Implementations add their own state (merges, scores).
};

// `bytes` as StreamDecoder shows them: whole characters as they are, each invalid sequence as one
// U+FFFD; an unfinished character at the end is left out unless `final` (then U+FFFD too).
// `unit_ends`, when given, receives the end of each unit (character or replaced sequence) in
// `bytes` and in the result, in order.
std::string ShowAsText(std::string_view bytes, bool final,
                       std::vector<std::pair<size_t, size_t>>* unit_ends = nullptr);

// Decodes a token stream incrementally without ever emitting half a UTF-8 character: bytes of
// an incomplete sequence are held back until it completes (or Flush()).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string Push(TokenId id);  // complete characters now available
  std::string Flush();           // whatever is held back (invalid tails become U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace kvfs
