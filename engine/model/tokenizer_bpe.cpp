// Byte-level BPE tokenizer ("gpt2" vocabularies), following llama.cpp's llm_tokenizer_bpe:
// the pre-tokenizer splits the text into words spelt in GPT-2's byte alphabet, and within
// each word adjacent symbols are merged by merge rank (lowest first) until no ranked pair
// is left.
#include <queue>
#include <unordered_map>

#include "engine/model/tokenizer_internal.h"
#include "engine/model/unicode.h"

namespace kvfs::tok {
namespace {

class BpeTokenizer final : public VocabTokenizer {
 public:
  explicit BpeTokenizer(VocabData& data) : VocabTokenizer(data), pre_(data.pre) {
    id_ranks_.reserve(data.merges.size());
    for (size_t rank = 0; rank < data.merges.size(); ++rank) {
      const auto& [left, right] = data.merges[rank];
      const TokenId a = Find(left);
      const TokenId b = Find(right);
      // emplace keeps the first (best) rank of a pair listed twice, as llama.cpp does.
      if (a != kNoToken && b != kNoToken) {
        id_ranks_.emplace(PairKey(a, b), static_cast<int32_t>(rank));
      } else {
        // Rare: a merge whose halves are not vocabulary entries. Kept by text.
        str_ranks_.emplace(TextKey(left, right), static_cast<int32_t>(rank));
      }
    }
  }

  std::vector<TokenId> Encode(std::string_view text, bool add_special,
                              SpecialParsing parse_special) const override {
    std::vector<TokenId> out;
    if (add_special && add_bos_) out.push_back(bos_);
    std::vector<std::string> words;
    for (const Fragment& frag : Partition(text, parse_special)) {
      if (frag.token != kNoToken) {
        out.push_back(frag.token);
        continue;
      }
      PreTokenize(pre_.kind, frag.text, words);
      for (const std::string& word : words) EncodeWord(word, out);
    }
    if (add_special && add_eos_) out.push_back(eos_);
    return out;
  }

 protected:
  // Token text is in the byte alphabet; map each code point back to its byte.
  std::string NormalPiece(TokenId id) const override {
    std::string out;
    for (uint32_t cp : unicode::DecodeUtf8Lossy(tokens_[id])) {
      const int byte = unicode::UnicodeToByte(cp);
      if (byte >= 0) {
        out.push_back(static_cast<char>(byte));
      } else {
        unicode::AppendUtf8(out, cp);  // not from the alphabet: keep the character itself
      }
    }
    return out;
  }

 private:
  struct Symbol {
    size_t start, len;  // bytes of the word; len 0 once merged into the left neighbour
    TokenId id;         // vocabulary entry for the symbol's text, or kNoToken
    int prev, next;
  };
  struct Bigram {
    int left, right;
    int32_t rank;
    size_t len;  // left.len + right.len when queued; a mismatch later means it is stale
  };
  struct Worse {
    // Lowest rank first; on ties the leftmost pair.
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };

  static uint64_t PairKey(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Length-prefixed so that no two different pairs share a key.
  static std::string TextKey(std::string_view a, std::string_view b) {
    return std::to_string(a.size()) + ':' + std::string(a) + std::string(b);
  }

  int32_t Rank(std::string_view word, const Symbol& a, const Symbol& b) const {
    if (a.id != kNoToken && b.id != kNoToken) {
      auto it = id_ranks_.find(PairKey(a.id, b.id));
      return it == id_ranks_.end() ? -1 : it->second;
    }
    if (str_ranks_.empty()) return -1;
    auto it = str_ranks_.find(TextKey(word.substr(a.start, a.len), word.substr(b.start, b.len)));
    return it == str_ranks_.end() ? -1 : it->second;
  }

  void EncodeWord(std::string_view word, std::vector<TokenId>& out) const {
    if (pre_.ignore_merges) {
      if (TokenId id = Find(word); id != kNoToken) {
        out.push_back(id);
        return;
      }
    }
    std::vector<Symbol> syms;
    syms.reserve(word.size());
    for (size_t off = 0; off < word.size();) {
      const size_t len =
          std::min(unicode::Utf8SeqLen(static_cast<uint8_t>(word[off])), word.size() - off);
      const int idx = static_cast<int>(syms.size());
      syms.push_back({off, len, Find(word.substr(off, len)), idx - 1,
                      off + len == word.size() ? -1 : idx + 1});
      off += len;
    }

    std::priority_queue<Bigram, std::vector<Bigram>, Worse> queue;
    auto try_pair = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const int32_t rank = Rank(word, syms[left], syms[right]);
      if (rank < 0) return;
      queue.push({left, right, rank, syms[left].len + syms[right].len});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_pair(i - 1, i);

    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& left = syms[b.left];
      Symbol& right = syms[b.right];
      if (left.len == 0 || right.len == 0 || left.len + right.len != b.len) continue;
      left.len += right.len;
      left.id = Find(word.substr(left.start, left.len));
      right.len = 0;
      left.next = right.next;
      if (right.next >= 0) syms[right.next].prev = b.left;
      try_pair(left.prev, b.left);
      try_pair(b.left, left.next);
    }

    for (int i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) {
      if (syms[i].id != kNoToken) {
        out.push_back(syms[i].id);
        continue;
      }
      // No entry for the symbol: fall back to one-byte entries; bytes without one are
      // dropped, as llama.cpp does.
      for (char c : word.substr(syms[i].start, syms[i].len)) {
        if (TokenId id = Find(std::string_view(&c, 1)); id != kNoToken) out.push_back(id);
      }
    }
  }

  PreTokenizerConfig pre_;
  std::unordered_map<uint64_t, int32_t> id_ranks_;
  std::unordered_map<std::string, int32_t> str_ranks_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(VocabData data) {
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(data));
}

}  // namespace kvfs::tok
