// Helpers shared by the engine-level benchmarks (bench resume, bench agents).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/median.h"  // Median, for the benchmarks
#include "engine/model/tokenizer.h"
#include "engine/runtime/agent_engine.h"

namespace kvfs::cli {

// Parses "1,2,4" into numbers in [lo, hi]; an error message naming `option` otherwise.
Result<std::vector<int64_t>> ParseIntList(const std::string& text, const std::string& option, int64_t lo, int64_t hi);

// Splits "f16,q4k" at commas (empty items kept: the caller's parser rejects them).
std::vector<std::string> SplitList(const std::string& text);

// Runs one turn and waits for it.
Result<TurnStats> RunTurnSync(AgentEngine& engine, const std::string& agent, const std::string& text);

// Text of exactly n tokens of the model's vocabulary (pseudo-random words; `salt` picks the
// sequence, so different salts share no prefix).
std::string TextOfTokens(const Tokenizer& tok, int64_t n, int salt);

// The scratch directory of a benchmark that deletes what it puts there (bench resume's store,
// bench fs's mounts): `given` (an option's value) or a new one under the temporary directory
// named `name`-PID. A given path must not exist yet, or be an empty directory (a mount point
// say), so that the benchmark never deletes anything it did not make.
struct ScratchDir {
  std::filesystem::path path;
  bool created = false;  // made here: removed at the end, not only emptied
};
Result<ScratchDir> MakeScratchDir(const std::optional<std::string>& given, const std::string& name);
// Removes what is in the directory (best effort), and the directory itself when `remove_dir`.
void ClearScratchDir(const ScratchDir& dir, bool remove_dir);
// Clears the scratch directory (removing it when made here) when it goes out of scope, so that a
// benchmark that fails half-way leaves nothing behind. Declare it before the mounts and engines
// that use the directory: it then runs after them.
class ScratchDirCleanup {
 public:
  explicit ScratchDirCleanup(const ScratchDir& dir) : dir_(dir) {}
  ScratchDirCleanup(const ScratchDirCleanup&) = delete;
  ScratchDirCleanup& operator=(const ScratchDirCleanup&) = delete;
  ~ScratchDirCleanup() { ClearScratchDir(dir_, /*remove_dir=*/true); }

 private:
  const ScratchDir& dir_;
};

}  // namespace kvfs::cli
