// A fixed set of worker threads created once. Run() executes one task on every thread (the
// caller is thread 0) and returns when all have finished: a fork-join barrier per op.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvfs {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(ith, nth) runs once on each of the nth threads.
  void Run(const std::function<void(int ith, int nth)>& fn);

 private:
  void WorkerLoop(int ith);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int, int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// Splits [0, n) into nth near-equal contiguous ranges; returns thread ith's [begin, end).
inline std::pair<int64_t, int64_t> SplitRange(int64_t n, int ith, int nth) {
  const int64_t per = n / nth, extra = n % nth;
  const int64_t begin = ith * per + std::min<int64_t>(ith, extra);
  return {begin, begin + per + (ith < extra ? 1 : 0)};
}

}  // namespace kvfs
