// SequenceKv's layout per format: per layer a K plane then a V plane in every block; for q4k the
// K plane is block_tokens / C chunks, and the incomplete chunk's keys live in a bounded f16
// staging area (restaged from the 4-bit chunk when a truncation cuts into a complete chunk).
#include "engine/kv/sequence_kv.h"

#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "engine/model/quants.h"

namespace kvfs {
namespace {

KvLayout Tinyllama(const char* type) {
  return KvLayout{22, 4, 64, 256, *MakeKvFormat(type, "", 4, 64)};
}

TEST(SequenceKv, PlanesPerFormat) {
  const KvLayout q4 = Tinyllama("q4"), q4k = Tinyllama("q4k"), f16 = Tinyllama("f16");
  EXPECT_EQ(q4.k_plane_bytes(), q4.plane_bytes());
  EXPECT_EQ(q4.block_bytes(), 22 * 2 * 256 * 144);
  EXPECT_EQ(q4k.chunk_bytes(), 256 * 36);
  EXPECT_EQ(q4k.k_plane_bytes(), 4 * 256 * 36);
  EXPECT_EQ(q4k.plane_bytes(), 256 * 152);
  EXPECT_EQ(q4k.block_bytes(), 22 * (4 * 256 * 36 + 256 * 152));
  // Bytes per token of the whole cache against f16: 0.281x (q4), 0.289x (q4k).
  EXPECT_LE(static_cast<double>(q4k.block_bytes()) / f16.block_bytes(), 0.29);
  EXPECT_NEAR(static_cast<double>(q4.block_bytes()) / f16.block_bytes(), 0.281, 0.001);
}

// Every K chunk and V row of two blocks is a distinct, non-overlapping range inside its block.
TEST(SequenceKv, Q4kChunksAndRowsTileTheBlocks) {
  KvLayout layout{3, 2, 64, 256, *MakeKvFormat("q4k", "", 2, 64)};
  SequenceKv kv(layout, 512);
  ASSERT_TRUE(kv.Reserve(512).ok());
  std::set<std::pair<const uint8_t*, const uint8_t*>> ranges;
  int64_t covered = 0;
  for (int64_t layer = 0; layer < 3; ++layer) {
    for (int64_t c = 0; c < 8; ++c) {
      ranges.insert({kv.k_chunk(layer, c), kv.k_chunk(layer, c) + layout.chunk_bytes()});
      covered += layout.chunk_bytes();
    }
    for (int64_t p = 0; p < 512; ++p) {
      ranges.insert({kv.v_row(layer, p), kv.v_row(layer, p) + layout.row_bytes()});
      covered += layout.row_bytes();
    }
  }
  EXPECT_EQ(covered, 2 * layout.block_bytes());
  const uint8_t* end = nullptr;
  int64_t blocks = 0;
  for (const auto& [b, e] : ranges) {
    if (end != nullptr && b != end) ++blocks;  // a gap: the next block
    EXPECT_TRUE(end == nullptr || b >= end) << "overlap";
    end = e;
  }
  EXPECT_LE(blocks, 1);
  // Chunk c of a layer sits in block c / 4 at chunk (c % 4) of that layer's K plane.
  EXPECT_EQ(kv.k_chunk(1, 5) - kv.k_chunk(1, 4), layout.chunk_bytes());
  EXPECT_EQ(kv.v_row(0, 0) - kv.k_chunk(0, 0), layout.k_plane_bytes());
  EXPECT_EQ(kv.k_chunk(1, 0) - kv.k_chunk(0, 0), layout.k_plane_bytes() + layout.plane_bytes());
}

TEST(SequenceKv, Q4kChunkMustDivideTheBlock) {
  KvLayout layout{1, 1, 64, 96, *MakeKvFormat("q4k", "", 1, 64)};  // 96 % 64 != 0
  SequenceKv kv(layout, 512);
  EXPECT_EQ(kv.Reserve(10).code(), StatusCode::kInvalidArgument);
}

// Truncating into a complete chunk stages its kept tokens, decoded from 4 bits (within a step
// of the originals), when the sequence is next reserved for writing; truncating into the staged
// chunk or to a boundary keeps the staging as is.
TEST(SequenceKv, Q4kTruncateRestagesACompleteChunk) {
  KvLayout layout{2, 1, 64, 256, *MakeKvFormat("q4k", "", 1, 64)};
  const KvFormat& f = layout.format;
  SequenceKv kv(layout, 256);
  ASSERT_TRUE(kv.Reserve(100).ok());
  std::vector<float> x(64 * 64);
  for (int64_t t = 0; t < 64; ++t) {
    for (int64_t c = 0; c < 64; ++c) x[t * 64 + c] = std::sin(0.1f * static_cast<float>(t * 64 + c)) * (1 + c % 3);
  }
  for (int64_t layer = 0; layer < 2; ++layer) KvQuantizeKChunk(f, x.data(), 64, kv.k_chunk(layer, 0), 64);
  for (int64_t layer = 0; layer < 2; ++layer) kv.k_staging(layer, 64)[0] = Fp32ToFp16(42.0f);  // position 64
  kv.SetTokens(100);
  EXPECT_EQ(kv.staged_tokens(), 36);
  kv.Truncate(80);  // inside the staged chunk: nothing to do
  EXPECT_EQ(kv.staged_tokens(), 16);
  EXPECT_EQ(Fp16ToFp32(kv.k_staging(1, 64)[0]), 42.0f);
  kv.Truncate(40);  // inside complete chunk 0: its tokens 0..39 are staged by the next Reserve
  EXPECT_EQ(kv.n_tokens(), 40);
  EXPECT_EQ(kv.staged_tokens(), 40);
  ASSERT_TRUE(kv.Reserve(41).ok());
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t t = 0; t < 40; ++t) {
      for (int64_t c = 0; c < 64; ++c) {
        const float step = 2.0f * (1 + c % 3) / 15.0f;
        ASSERT_NEAR(Fp16ToFp32(kv.k_staging(layer, 0)[t * 64 + c]), x[t * 64 + c], 0.5f * step + 0.01f)
            << layer << " " << t << " " << c;
      }
    }
  }
  kv.Truncate(0);
  EXPECT_EQ(kv.staged_tokens(), 0);
}

// The memory target, by pool accounting: a tinyllama-shaped q4k sequence of 4096 tokens holds
// 16 full blocks of exactly block_bytes (their staging areas given back once full), at most
// 0.29x what f16 takes; a sequence with a partial tail pays for one staging area only.
TEST(SequenceKv, Q4kPoolBytesPerToken) {
  auto pool_bytes = [](const char* type, int64_t n) {
    BlockPool pool(0);
    SequenceKv kv(Tinyllama(type), 8192, pool);
    EXPECT_TRUE(kv.Reserve(n).ok());
    kv.SetTokens(n);
    return pool.Stats().used_bytes;
  };
  const KvLayout q4k = Tinyllama("q4k");
  EXPECT_EQ(pool_bytes("q4k", 4096), 16 * ((q4k.block_bytes() + 63) / 64 * 64));
  EXPECT_LE(static_cast<double>(pool_bytes("q4k", 4096)) / static_cast<double>(pool_bytes("f16", 4096)), 0.29);
  EXPECT_EQ(pool_bytes("q4k", 4000), 15 * ((q4k.block_bytes() + 63) / 64 * 64) + (q4k.tail_block_bytes() + 63) / 64 * 64);
  EXPECT_EQ(q4k.staging_bytes(), 22 * 64 * 256 * 2);
}

// A named (parked or shared) q4k tail is copied on write with its staged rows; a full block cut
// by a truncation gets a fresh staging area, filled from its chunk on the next Reserve.
TEST(SequenceKv, Q4kCopyOnWriteCarriesStaging) {
  KvLayout layout{2, 1, 64, 128, *MakeKvFormat("q4k", "", 1, 64)};
  BlockPool pool(0);
  SequenceKv a(layout, 512, pool);
  ASSERT_TRUE(a.Reserve(100).ok());
  for (int64_t layer = 0; layer < 2; ++layer)
    for (int64_t i = 0; i < 36 * 64; ++i) a.k_staging(layer, 64)[i] = static_cast<uint16_t>(layer * 7 + i);
  a.SetTokens(100);
  a.NameBlock(0, BlockHash{1, 2});  // parked: named, with its staging area
  PoolBlock* shared = a.block(0);
  pool.Retain(shared);
  SequenceKv b(layout, 512, pool);
  b.SetBlock(0, shared);
  b.SetTokens(100);
  ASSERT_TRUE(b.Reserve(101).ok());
  EXPECT_NE(b.block(0), shared);  // copied, not written in place
  for (int64_t layer = 0; layer < 2; ++layer)
    for (int64_t i = 0; i < 36 * 64; ++i) ASSERT_EQ(b.k_staging(layer, 64)[i], static_cast<uint16_t>(layer * 7 + i));
}

// Shrink keeps the first bytes under a new serial and gives the rest back to the budget.
TEST(BlockPool, ShrinkKeepsThePrefix) {
  BlockPool pool(0);
  PoolBlock* b = *pool.Allocate(1000);
  for (int i = 0; i < 1000; ++i) b->data[i] = static_cast<uint8_t>(i);
  const uint64_t serial = b->serial;
  pool.Shrink(b, 300);
  EXPECT_EQ(b->bytes, 320);
  EXPECT_EQ(pool.Stats().used_bytes, 320);
  EXPECT_NE(b->serial, serial);
  for (int i = 0; i < 300; ++i) ASSERT_EQ(b->data[i], static_cast<uint8_t>(i));
  pool.Release(b);
  EXPECT_EQ(pool.Stats().used_bytes, 0);
}

}  // namespace
}  // namespace kvfs
