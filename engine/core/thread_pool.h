// A fixed set of worker threads created once. Run() executes one task on every thread (the
// caller is thread 0) and returns when all have finished: a fork-join barrier per op.
// Workers spin briefly between ops (a decode step issues ~10 ops per layer, microseconds
// apart, and a futex wake-up per op would cost more than the op) and then sleep on the
// generation counter, so an idle engine uses no CPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

namespace kvfs {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(ith, nth) runs once on each of the nth threads. Not re-entrant; one caller at a time.
  void Run(const std::function<void(int ith, int nth)>& fn);

 private:
  void WorkerLoop(int ith);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* task_ = nullptr;  // published by generation_
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Splits [0, n) into nth near-equal contiguous ranges; returns thread ith's [begin, end).
inline std::pair<int64_t, int64_t> SplitRange(int64_t n, int ith, int nth) {
  const int64_t per = n / nth, extra = n % nth;
  const int64_t begin = ith * per + (ith < extra ? ith : extra);
  return {begin, begin + per + (ith < extra ? 1 : 0)};
}

}  // namespace kvfs
