#include "tools/bench_util.h"

#include <algorithm>
#include <future>
#include <system_error>
#include <sstream>
#include <vector>

#include <unistd.h>

#include <spdlog/fmt/fmt.h>

namespace kvfs::cli {

Result<ScratchDir> MakeScratchDir(const std::optional<std::string>& given, const std::string& name) {
  namespace fs = std::filesystem;
  ScratchDir out;
  out.path = given ? fs::path(*given) : fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(out.path, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st) || !fs::is_empty(out.path, ec) || ec) {
      return InvalidArgument(fmt::format("{} exists and is not an empty directory: the benchmark deletes what it "
                                         "puts there, so it takes a new or an empty directory",
                                         out.path.string()));
    }
  } else if (!fs::create_directory(out.path, ec) || ec) {
    // Only the directory named: missing parents are a mistyped path, not a tree to leave behind.
    return IoError(fmt::format("cannot create {}: {}", out.path.string(), ec ? ec.message() : "unknown error"));
  }
  out.created = !fs::exists(st);
  return out;
}

void ClearScratchDir(const ScratchDir& dir, bool remove_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (remove_dir && dir.created) {
    fs::remove_all(dir.path, ec);
    return;
  }
  for (const fs::directory_entry& e : fs::directory_iterator(dir.path, ec)) fs::remove_all(e.path(), ec);
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

Result<std::vector<int64_t>> ParseIntList(const std::string& text, const std::string& option, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (const std::string& item : SplitList(text)) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < lo || v > hi) {
      return InvalidArgument(option + " takes a comma-separated list of numbers in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "]");
    }
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgument(option + " needs at least one number");
  return out;
}

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
