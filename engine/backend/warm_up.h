// A backend's first passes of each shape, run on scratch sequences before any agent's: a
// backend that makes its kernels on first use (Backend::CompilesOnFirstUse: Vulkan compiles a
// pipeline per shader variant) would otherwise spend the first turns compiling, seconds each on
// a cold driver cache. The engine runs it pass by pass while it has no turn to run.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/sequence_kv.h"

namespace kvfs {

struct WarmUpReport {
  int64_t passes = 0;        // forward passes run
  int64_t skipped = 0;       // passes the device would not run (or after one it failed with
                             // kUnavailable): never run on a CPU behind it
  int64_t kernels_made = 0;  // kernels the backend made during them (Backend::KernelsMade)
  double seconds = 0;        // in the passes
};

// The passes (warm_up.cpp lists them: prompts of several sizes, alone and together, a prompt
// after a turn, decode steps of 1, 2 and 4 sequences, at depths that split attention and
// complete q4k key chunks), over sequences of its own in KV `layout` (pools of their own: no
// budget of the caller's is touched) with token ids below n_vocab. Every device copy of the
// scratch KV blocks is dropped when it finishes, fails or is destroyed (Backend::ForgetBlocks),
// so the backend must outlive it. The caller's sequences are untouched.
class BackendWarmUp {
 public:
  BackendWarmUp(Backend& backend, const KvLayout& layout, int64_t n_vocab);
  ~BackendWarmUp();
  BackendWarmUp(const BackendWarmUp&) = delete;
  BackendWarmUp& operator=(const BackendWarmUp&) = delete;

  bool done() const { return done_; }
  // Runs the next pass; after the last (or an error, which says which pass failed) done() is
  // true and the scratch sequences are gone.
  Status RunNextPass();
  const WarmUpReport& report() const { return report_; }

 private:
  Status Finish();

  Backend& backend_;
  int64_t n_vocab_;
  std::vector<std::unique_ptr<SequenceKv>> kv_;
  size_t next_ = 0;
  bool done_ = false;
  WarmUpReport report_;
};

// All the passes at once.
Result<WarmUpReport> WarmUpBackend(Backend& backend, const KvLayout& layout, int64_t n_vocab);

}  // namespace kvfs
