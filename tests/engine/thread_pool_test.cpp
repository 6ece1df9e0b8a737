#include "engine/core/thread_pool.h"

#include <atomic>

#include <gtest/gtest.h>

namespace kvfs {
namespace {

TEST(ThreadPool, EveryThreadRunsOncePerRun) {
  for (int n : {1, 2, 4}) {
    ThreadPool pool(n);
    for (int iter = 0; iter < 200; ++iter) {
      std::vector<std::atomic<int>> hits(n);
      pool.Run([&](int ith, int nth) {
        ASSERT_EQ(nth, n);
        hits[ith].fetch_add(1);
      });
      for (int i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "thread " << i << " iter " << iter;
    }
  }
}

TEST(ThreadPool, SplitRangeCoversExactlyOnce) {
  for (int64_t n : {0, 1, 7, 64, 1000}) {
    for (int nth : {1, 2, 3, 8}) {
      int64_t expect_begin = 0;
      for (int i = 0; i < nth; ++i) {
        auto [b, e] = SplitRange(n, i, nth);
        EXPECT_EQ(b, expect_begin);
        EXPECT_GE(e, b);
        EXPECT_LE(e - b, n / nth + 1);
        expect_begin = e;
      }
      EXPECT_EQ(expect_begin, n);
    }
  }
}

TEST(ThreadPool, ParallelSumMatchesSerial) {
  ThreadPool pool(3);
  std::vector<int64_t> v(10007);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i * i % 97);
  std::vector<int64_t> partial(3);
  pool.Run([&](int ith, int nth) {
    auto [b, e] = SplitRange(static_cast<int64_t>(v.size()), ith, nth);
    for (int64_t i = b; i < e; ++i) partial[ith] += v[i];
  });
  int64_t serial = 0;
  for (int64_t x : v) serial += x;
  EXPECT_EQ(partial[0] + partial[1] + partial[2], serial);
}

}  // namespace
}  // namespace kvfs
