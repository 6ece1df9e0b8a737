// Ops::Prefetch (prefetch.comp): the read-ahead of weight bytes reads exactly the range it is
// given, each 16-byte word once, which the XOR of those words in the sink shows (a range read
// short, twice or shifted leaves another value), over buffers and over a matrix's parts. That
// it changes no result of a pass: vulkan_backend_test.cpp. kvfs bench dispatch's measurement
// (vulkan_dispatch_cost.h) gives each of its figures. Skips without a Vulkan device.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/vulkan_dispatch_cost.h"
#include "tests/test_support.h"

namespace kvfs {
namespace {

// Every figure measured (positive and finite), the read size as asked within the device's
// binding limit; bad options refused before any device work. Not a speed test: the figures
// are whatever this machine gives.
TEST(VulkanDispatchCost, MeasuresEachFigure) {
  auto cost = MeasureVulkanDispatchCost(
      {.dispatches = 8, .repetitions = 1, .read_bytes = 1 << 20, .code_steps = {16, 64}, .code_pipelines = 2});
  KVFS_REQUIRE_VULKAN(cost.status());
  EXPECT_FALSE(cost->device.empty());
  EXPECT_EQ(cost->read_bytes, 1 << 20);
  for (const double v : {cost->barrier_us, cost->barrier_record_us, cost->no_barrier_record_us, cost->read_us}) {
    EXPECT_TRUE(v > 0 && std::isfinite(v)) << v;
  }
  EXPECT_TRUE(cost->no_barrier_us >= 0 && std::isfinite(cost->no_barrier_us)) << cost->no_barrier_us;
  EXPECT_TRUE(cost->read_gbps >= 0 && std::isfinite(cost->read_gbps)) << cost->read_gbps;
  ASSERT_EQ(cost->code.size(), 2u);
  EXPECT_EQ(cost->code[0].steps, 16);
  EXPECT_EQ(cost->code[1].steps, 64);
  for (const CodeFetchCost& c : cost->code) {
    for (const double v : {c.straight_us, c.loop_us, c.straight_cycling_us, c.loop_cycling_us}) {
      EXPECT_TRUE(v > 0 && std::isfinite(v)) << c.steps << ": " << v;
    }
  }
  for (const DispatchCostOptions& bad :
       {DispatchCostOptions{.dispatches = 0}, DispatchCostOptions{.repetitions = 0}, DispatchCostOptions{.read_bytes = 8},
        DispatchCostOptions{.code_pipelines = 0}, DispatchCostOptions{.code_steps = {0}},
        DispatchCostOptions{.code_steps = {1 << 17}}}) {
    EXPECT_EQ(MeasureVulkanDispatchCost(bad).status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace kvfs

#if defined(KVFS_VULKAN)

#include "tests/engine/vulkan_test_util.h"

namespace kvfs::testing {
namespace {

// XOR of the 32-bit words of bytes [begin, end) of `bytes` (begin and end multiples of 4).
uint32_t XorOfWords(const std::vector<uint8_t>& bytes, int64_t begin, int64_t end) {
  uint32_t x = 0;
  for (int64_t i = begin; i < end; i += 4) {
    uint32_t w;
    std::memcpy(&w, bytes.data() + i, 4);
    x ^= w;
  }
  return x;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Ranges of one grid round and less, of exactly one round of every invocation's loads
// (128 x 256 x 8 words), of several rounds with a part round at the end, and at an offset.
TEST_F(VulkanOpsTest, PrefetchReadsEveryWordOfItsRangeOnce) {
  const int64_t round_words =
      int64_t{vk::Ops::kPrefetchGroups} * vk::Ops::kPrefetchGroupSize * vk::Ops::kPrefetchLoads;
  const std::vector<uint8_t> data = RandomBytes(static_cast<size_t>(16 * (3 * round_words + 64)), 11);
  const vk::Buffer in = Input(data);
  struct Range {
    int64_t offset, bytes;
  };
  for (const Range r : {Range{0, 16}, Range{0, 16 * 1000}, Range{0, 16 * round_words},
                        Range{16 * 5, 16 * (2 * round_words + 333)}, Range{16 * 64, 16 * 3 * round_words},
                        Range{0, 0}}) {
    SCOPED_TRACE(::testing::Message() << "bytes [" << r.offset << ", " << r.offset + r.bytes << ")");
    const vk::Buffer sink = Output(16);
    ASSERT_TRUE(Run([&](vk::Recorder& rec) { return ops_->PrefetchBytes(rec, in, r.offset, r.bytes, sink); }).ok());
    EXPECT_EQ(Read<uint32_t>(sink, 1)[0], XorOfWords(data, r.offset, r.offset + r.bytes));
  }
  // Not whole words inside the buffer: refused, nothing recorded.
  const vk::Buffer sink = Output(16);
  for (const Range r :
       {Range{8, 16}, Range{0, 24}, Range{0, static_cast<int64_t>(data.size()) + 16}, Range{-16, 16}}) {
    EXPECT_FALSE(Run([&](vk::Recorder& rec) { return ops_->PrefetchBytes(rec, in, r.offset, r.bytes, sink); }).ok());
  }
}

// A matrix in two parts of 10 rows of 48 bytes: a range is split at the part boundary, each
// piece read from its first whole word to its last, and the bytes covered are counted whole
// (clipped at the matrix's end).
TEST_F(VulkanOpsTest, PrefetchOfAMatrixFollowsItsParts) {
  const int64_t row_bytes = 48, rows = 10;
  const std::vector<uint8_t> p0 = RandomBytes(row_bytes * rows, 1), p1 = RandomBytes(row_bytes * rows, 2);
  vk::DeviceMatrix m;
  m.type = GgmlType::kQ8_0;
  m.row_bytes = row_bytes;
  m.n_out = 2 * rows;
  m.parts.push_back({Input(p0), 0, rows});
  m.parts.push_back({Input(p1), rows, rows});
  struct Case {
    int64_t offset, bytes, covered;
    uint32_t want;
  };
  const Case cases[] = {
      {0, 700, 700, XorOfWords(p0, 0, 480) ^ XorOfWords(p1, 0, 208)},      // 220 bytes of part 1: 13 words
      {100, 10000, 860, XorOfWords(p0, 112, 480) ^ XorOfWords(p1, 0, 480)},  // from the word after byte 100
      {480, 96, 96, XorOfWords(p1, 0, 96)},                                  // part 1 only
      {0, 200, 200, XorOfWords(p0, 0, 192)},                                 // part 0 only, 12 whole words
      {960, 64, 0, 0},                                                       // past the end
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "offset " << c.offset << ", " << c.bytes << " bytes");
    const vk::Buffer sink = Output(16);
    int64_t covered = -1;
    ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                  KVFS_ASSIGN_OR_RETURN(covered, ops_->Prefetch(rec, m, c.offset, c.bytes, sink));
                  return Status::Ok();
                }).ok());
    EXPECT_EQ(covered, c.covered);
    EXPECT_EQ(Read<uint32_t>(sink, 1)[0], c.want);
  }
}

}  // namespace
}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
