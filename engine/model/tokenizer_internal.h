// Internal to the tokenizers: what FromGguf reads from the metadata, the shared base of the
// SentencePiece and BPE implementations (special-token partition, piece rendering), and
// their factories.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/model/pretokenizer.h"
#include "engine/model/tokenizer.h"

namespace kvfs::tok {

// llama.cpp's llama_token_attr bits. Kept next to the public TokenAttr because one token can
// carry several: an end marker typed user-defined is also treated as control, and the
// strip bits only matter while partitioning.
enum AttrBit : uint16_t {
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
  kAttrLstrip = 1 << 6,  // whitespace before the token is dropped when it is matched
  kAttrRstrip = 1 << 7,  // whitespace after the token is dropped when it is matched
};

// Everything FromGguf reads and derives, moved into the concrete tokenizer.
struct VocabData {
  std::vector<std::string> tokens;
  std::vector<TokenAttr> attrs;
  std::vector<uint16_t> attr_bits;
  std::vector<float> scores;                                // SPM only
  std::vector<std::pair<std::string, std::string>> merges;  // BPE only, in rank order
  PreTokenizerConfig pre;                                   // BPE only
  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, unk = kNoToken;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = true;  // SPM only
  std::vector<TokenId> eog;
};

// The parts both algorithms share. Encode() of a subclass partitions the text on special
// tokens first (Partition), then runs its algorithm on each raw fragment.
class VocabTokenizer : public Tokenizer {
 public:
  std::string TokenToPiece(TokenId id, bool render_special) const final;

 protected:
  explicit VocabTokenizer(VocabData& data);

  // One fragment of the input: raw text (token == kNoToken) or a special token found in it.
  struct Fragment {
    std::string_view text;
    TokenId token = kNoToken;
  };
  // llama.cpp's tokenizer_st_partition: every special token, longest first, is cut out of
  // the raw fragments left so far. Without parse_special only user-defined tokens are cut
  // (control and unknown ones stay text), as Hugging Face tokenizers do; nor are control and
  // unknown ones cut where they overlap a literal span.
  std::vector<Fragment> Partition(std::string_view text, SpecialParsing parse_special) const;

  bool HasAttr(TokenId id, uint16_t bits) const { return (attr_bits_[id] & bits) != 0; }
  // The bytes of a normal token (algorithm specific).
  virtual std::string NormalPiece(TokenId id) const = 0;

  std::vector<uint16_t> attr_bits_;
  TokenId unk_ = kNoToken;

 private:
  std::vector<TokenId> special_;  // control, user-defined and unknown tokens, longest first
};

// Factories (tokenizer_spm.cpp, tokenizer_bpe.cpp). Errors: data the algorithm cannot use.
Result<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(VocabData data);
Result<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(VocabData data);

// Parses "<0xNN>" (a byte token's text); -1 when text is not of that form.
int ParseByteToken(std::string_view text);

}  // namespace kvfs::tok
