#include "tools/bench_util.h"

#include <future>
#include <vector>

namespace kvfs::cli {

Result<TurnStats> RunTurnSync(AgentEngine& e, const std::string& agent, const std::string& text) {
  std::promise<Result<TurnStats>> done;
  auto future = done.get_future();
  TurnRequest r;
  r.agent = agent;
  r.text = text;
  r.on_done = [&done](const Result<TurnStats>& s) { done.set_value(s); };
  KVFS_RETURN_IF_ERROR(e.SubmitTurn(std::move(r)));
  return future.get();
}

// Text of about n tokens: the corpus-like filler repeated, cut by the model's tokenizer.
std::string TextOfTokens(const Tokenizer& tok, int64_t n, int salt) {
  static const char* kWords[] = {"the", "river", "carried", "small", "boats", "past", "old", "stone", "houses",
                                 "while", "children", "watched", "from", "bridges", "and", "counted", "sails"};
  std::string text;
  uint64_t x = 88172645463325252ull + static_cast<uint64_t>(salt);
  while (static_cast<int64_t>(tok.Encode(text, false, false).size()) < n) {
    for (int i = 0; i < 64; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      text += ' ';
      text += kWords[x % (sizeof kWords / sizeof *kWords)];
    }
  }
  // Trim to n tokens by decoding the first n.
  std::vector<TokenId> ids = tok.Encode(text, false, false);
  ids.resize(static_cast<size_t>(n));
  std::string out;
  for (TokenId id : ids) out += tok.TokenToPiece(id);
  return out;
}


}  // namespace kvfs::cli
