// SentencePiece-style tokenizer ("llama" vocabularies), following llama.cpp's
// llm_tokenizer_spm: spaces become U+2581, the text is split into UTF-8 characters, and
// adjacent symbols are merged greedily, highest vocabulary score first, as long as the
// merged text is a vocabulary entry. Pieces that are not entries fall back to byte tokens.
#include <algorithm>
#include <array>
#include <queue>

#include "engine/model/tokenizer_internal.h"
#include "engine/model/unicode.h"

namespace kvfs::tok {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

std::string EscapeSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ') {
      out += kSpaceMark;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(VocabData& data)
      : VocabTokenizer(data), scores_(std::move(data.scores)),
        add_space_prefix_(data.add_space_prefix) {
    // Byte fallback: <0xNN>, else the byte as a one-character token (llama.cpp's
    // byte_to_token), else the unknown token.
    for (int b = 0; b < 256; ++b) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      const char name[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      TokenId id = Find(std::string_view(name, 6));
      const char raw = static_cast<char>(b);
      if (id == kNoToken) id = Find(std::string_view(&raw, 1));
      byte_tokens_[b] = id != kNoToken ? id : unk_;
    }
  }

  std::vector<TokenId> Encode(std::string_view text, bool add_special,
                              SpecialParsing parse_special) const override {
    std::vector<TokenId> out;
    if (add_special && add_bos_) out.push_back(bos_);
    EncodeInto(text, /*after_special=*/true, parse_special, out);
    if (add_special && add_eos_) out.push_back(eos_);
    return out;
  }

  std::vector<TokenId> EncodeContinuation(std::string_view text, TokenId previous,
                                          SpecialParsing parse_special) const override {
    const bool after_special = previous == kNoToken || token_attr(previous) == TokenAttr::kControl ||
                               token_attr(previous) == TokenAttr::kUserDefined;
    std::vector<TokenId> out;
    EncodeInto(text, after_special, parse_special, out);
    return out;
  }

 private:
  // The space prefix goes before the text and after every special token, as in llama.cpp
  // (SentencePiece adds it at the start of each piece it is given).
  void EncodeInto(std::string_view text, bool after_special, SpecialParsing parse_special,
                  std::vector<TokenId>& out) const {
    for (const Fragment& frag : Partition(text, parse_special)) {
      if (frag.token != kNoToken) {
        out.push_back(frag.token);
        after_special = true;
        continue;
      }
      std::string escaped;
      if (add_space_prefix_ && after_special) escaped = kSpaceMark;
      escaped += EscapeSpaces(frag.text);
      EncodeFragment(escaped, out);
      after_special = false;
    }
  }

 protected:
  std::string NormalPiece(TokenId id) const override {
    const std::string& text = tokens_[id];
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
        out.push_back(' ');
        i += kSpaceMark.size();
      } else {
        out.push_back(text[i++]);
      }
    }
    return out;
  }

 private:
  struct Symbol {
    size_t start;  // byte offset into the fragment
    size_t len;    // 0 once merged into the symbol on its left
    int prev, next;
  };
  struct Bigram {
    int left, right;
    float score;
    size_t len;  // left.len + right.len when queued; a mismatch later means it is stale
  };
  struct Lower {
    // Highest score first; on ties the leftmost pair.
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };
  using Queue = std::priority_queue<Bigram, std::vector<Bigram>, Lower>;

  void EncodeFragment(std::string_view text, std::vector<TokenId>& out) const {
    std::vector<Symbol> syms;
    syms.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
      const size_t len =
          std::min(unicode::Utf8SeqLen(static_cast<uint8_t>(text[off])), text.size() - off);
      const int idx = static_cast<int>(syms.size());
      syms.push_back({off, len, idx - 1, off + len == text.size() ? -1 : idx + 1});
      off += len;
    }
    if (syms.empty()) return;

    Queue queue;
    auto try_pair = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const size_t len = syms[left].len + syms[right].len;
      const TokenId id = Find(text.substr(syms[left].start, len));
      if (id == kNoToken) return;
      queue.push({left, right, scores_[id], len});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_pair(i - 1, i);

    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& left = syms[b.left];
      Symbol& right = syms[b.right];
      if (left.len == 0 || right.len == 0 || left.len + right.len != b.len) continue;
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (right.next >= 0) syms[right.next].prev = b.left;
      try_pair(left.prev, b.left);
      try_pair(b.left, left.next);
    }

    // Every merged symbol is a vocabulary entry by construction, so only single characters
    // can be missing; those are spelt as byte tokens.
    for (int i = 0; i != -1; i = syms[i].next) {
      const std::string_view piece = text.substr(syms[i].start, syms[i].len);
      const TokenId id = Find(piece);
      if (id != kNoToken) {
        out.push_back(id);
        continue;
      }
      for (char c : piece) {
        const TokenId byte = byte_tokens_[static_cast<uint8_t>(c)];
        if (byte != kNoToken) out.push_back(byte);
      }
    }
  }

  std::vector<float> scores_;
  bool add_space_prefix_;
  std::array<TokenId, 256> byte_tokens_{};
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(VocabData data) {
  if (data.scores.size() != data.tokens.size()) {
    return Internal("SPM tokenizer: scores and tokens differ in length");
  }
  return std::unique_ptr<Tokenizer>(new SpmTokenizer(data));
}

}  // namespace kvfs::tok
