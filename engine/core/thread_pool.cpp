#include "engine/core/thread_pool.h"

namespace kvfs {

namespace {

// Polling: pause-spin for ~10 us, then yield (so that, with more threads than cores, a
// descheduled thread gets the core), then, for workers, sleep.
constexpr int kPauseIterations = 2000;
constexpr int kSpinIterations = 4000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  task_ = &fn;
  pending_.store(n_threads_ - 1);
  generation_.fetch_add(1);  // seq_cst: publishes task_ and pending_
  if (sleepers_.load() > 0) generation_.notify_all();
  fn(0, n_threads_);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kPauseIterations) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  task_ = nullptr;
}

void ThreadPool::WorkerLoop(int ith) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen;
    int spins = 0;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kPauseIterations) {
        CpuRelax();
        continue;
      }
      if (spins < kSpinIterations) {
        std::this_thread::yield();
        continue;
      }
      // A sleeper registers before re-checking, and Run() bumps the generation before
      // reading sleepers_, so either Run() sees the sleeper or the sleeper sees the bump.
      sleepers_.fetch_add(1);
      generation_.wait(seen);
      sleepers_.fetch_sub(1);
      spins = 0;
    }
    seen = gen;
    if (stop_.load()) return;
    (*task_)(ith, n_threads_);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace kvfs
