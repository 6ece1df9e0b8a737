// Block pool: naming and sharing, copy-on-write through SequenceKv, budget accounting and the
// eviction order (LRU with a hit boost; pinned, in-use and unpersisted blocks never dropped),
// the free list of zeroed memory (reuse, zeroed contents, bounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/kv/block_pool.h"
#include "engine/kv/sequence_kv.h"

namespace kvfs {
namespace {

BlockHash Key(uint64_t i) { return BlockHash{i, ~i}; }

TEST(BlockPool, ChainHashCoversEveryField) {
  const KvFormat q4{KvType::kQ4, 64, true}, q4n{KvType::kQ4, 64, false}, q8{KvType::kQ8, 64, true};
  const std::vector<TokenId> t{1, 2, 3}, u{1, 2, 4};
  const BlockHash base = ChainHash({}, t, "fp", q4, "uid:0");
  EXPECT_EQ(base, ChainHash({}, t, "fp", q4, "uid:0"));
  EXPECT_NE(base, ChainHash(Key(1), t, "fp", q4, "uid:0"));
  EXPECT_NE(base, ChainHash({}, u, "fp", q4, "uid:0"));
  EXPECT_NE(base, ChainHash({}, t, "fq", q4, "uid:0"));
  EXPECT_NE(base, ChainHash({}, t, "fp", q4n, "uid:0"));
  EXPECT_NE(base, ChainHash({}, t, "fp", q8, "uid:0"));
  EXPECT_NE(base, ChainHash({}, t, "fp", q4, "uid:1"));
  EXPECT_NE(TailKey("alice", 1), TailKey("alice", 2));
  EXPECT_NE(TailKey("alice", 1), TailKey("bob", 1));
}

// Device copies of blocks are keyed by serial: it must differ for every allocation, in any pool,
// even when freed memory comes back at the same address.
TEST(BlockPool, SerialsAreNeverReused) {
  BlockPool p1(0), p2(0);
  std::vector<uint64_t> seen;
  for (int i = 0; i < 8; ++i) {
    PoolBlock* a = p1.Allocate(64).value();
    PoolBlock* b = p2.Allocate(64).value();
    seen.push_back(a->serial);
    seen.push_back(b->serial);
    p1.Release(a);
    p2.Release(b);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
  EXPECT_NE(seen.front(), 0u);
}

TEST(BlockPool, NamingSharesAndCountsHits) {
  BlockPool pool(0);
  PoolBlock* a = pool.Allocate(64).value();
  PoolBlock* b = pool.Allocate(64).value();
  std::memset(a->data, 7, 64);
  EXPECT_EQ(pool.Name(a, Key(1)), a);
  // The same content computed again: the second copy is given back, the first shared.
  EXPECT_EQ(pool.Name(b, Key(1)), a);
  EXPECT_EQ(a->refs, 2);
  EXPECT_EQ(pool.Stats().blocks, 1);
  EXPECT_EQ(pool.Acquire(Key(1)), a);
  EXPECT_EQ(pool.Acquire(Key(2)), nullptr);
  PoolStats s = pool.Stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  // A reader outside the turns (an export) holds it without counting.
  PoolBlock* held = pool.Hold(Key(1));
  ASSERT_EQ(held, a);
  EXPECT_EQ(held->refs, 4);  // two names, the Acquire, the Hold
  EXPECT_EQ(pool.Hold(Key(2)), nullptr);
  EXPECT_EQ(pool.Stats().hits, 1u);
  EXPECT_EQ(pool.Stats().misses, 1u);
  pool.Release(held);
  for (int i = 0; i < 3; ++i) pool.Release(a);
  // Unreferenced named blocks stay cached.
  EXPECT_TRUE(pool.Contains(Key(1)));
  EXPECT_EQ(pool.Stats().idle_blocks, 1);
  EXPECT_TRUE(pool.Drop(Key(1)));
  EXPECT_EQ(pool.Stats().blocks, 0);
}

TEST(BlockPool, BudgetEvictsLeastValuableIdlePersistedBlocks) {
  BlockPool pool(4 * 64 + 32);
  std::vector<PoolBlock*> named;
  for (uint64_t i = 0; i < 4; ++i) named.push_back(pool.Name(pool.Allocate(64).value(), Key(i)));
  // Full: nothing idle yet.
  EXPECT_EQ(pool.Allocate(64).status().code(), StatusCode::kResourceExhausted);
  for (PoolBlock* b : named) pool.Release(b);
  // Idle but not on disk: still not evictable.
  EXPECT_EQ(pool.Allocate(64).status().code(), StatusCode::kResourceExhausted);
  for (uint64_t i = 0; i < 4; ++i) pool.MarkPersisted(Key(i));
  pool.Pin(Key(0));  // oldest, but pinned
  // Key(1) is hit often: boosted above the newer Key(2) and Key(3).
  for (int i = 0; i < 3; ++i) pool.Release(pool.Acquire(Key(1)));
  PoolBlock* fresh = pool.Allocate(64).value();
  EXPECT_TRUE(pool.Contains(Key(0)));
  EXPECT_TRUE(pool.Contains(Key(1)));
  EXPECT_FALSE(pool.Contains(Key(2)));
  EXPECT_TRUE(pool.Contains(Key(3)));
  EXPECT_EQ(pool.Stats().evictions, 1u);
  EXPECT_LE(pool.Stats().used_bytes, 4 * 64);
  pool.Release(fresh);
  pool.Unpin(Key(0));
}

TEST(BlockPool, TakeWritableOnlyWhenIdle) {
  BlockPool pool(0);
  PoolBlock* t = pool.Name(pool.Allocate(64).value(), TailKey("a", 1));
  EXPECT_EQ(pool.TakeWritable(TailKey("a", 1)), nullptr);  // still held
  pool.Release(t);
  PoolBlock* w = pool.TakeWritable(TailKey("a", 1));
  ASSERT_EQ(w, t);
  EXPECT_TRUE(pool.IsWritable(w));
  EXPECT_FALSE(pool.Contains(TailKey("a", 1)));
  // A turn's lookups of its tail, as Acquire's: the held one and now the gone one missed.
  EXPECT_EQ(pool.TakeWritable(TailKey("a", 1)), nullptr);
  EXPECT_EQ(pool.Stats().hits, 1u);
  EXPECT_EQ(pool.Stats().misses, 2u);
  pool.Release(w);
  EXPECT_EQ(pool.Stats().blocks, 0);
}

bool AllZero(const PoolBlock* b) {
  return std::all_of(b->data, b->data + b->bytes, [](uint8_t x) { return x == 0; });
}

// The free list: freed memory comes back (zeroed, under a new serial) for the next block of its
// size; with and without a mapping of its own (large and small blocks).
TEST(BlockPool, FreeListReusesZeroedMemory) {
  for (int64_t bytes : {int64_t{4096}, int64_t{1} << 20}) {
    SCOPED_TRACE(bytes);
    BlockPool pool(0);
    PoolBlock* a = pool.Allocate(bytes).value();
    EXPECT_TRUE(AllZero(a));
    uint8_t* mem = a->data;
    const uint64_t serial = a->serial;
    std::memset(a->data, 0xA5, static_cast<size_t>(bytes));
    pool.Release(a);
    PoolStats s = pool.Stats();
    EXPECT_EQ(s.used_bytes, 0);
    EXPECT_EQ(s.blocks, 0);
    EXPECT_EQ(s.free_bytes, bytes);
    EXPECT_EQ(s.free_blocks, 1);
    PoolBlock* b = pool.Allocate(bytes).value();
    EXPECT_EQ(b->data, mem);
    EXPECT_NE(b->serial, serial);
    EXPECT_TRUE(AllZero(b)) << "another agent's KV reached a new block";
    s = pool.Stats();
    EXPECT_EQ(s.reuses, 1u);
    EXPECT_EQ(s.free_bytes, 0);
    EXPECT_EQ(s.used_bytes, bytes);
    // A named block dropped by erasure, or evicted, is zeroed on its way to the list too.
    std::memset(b->data, 0x5A, static_cast<size_t>(bytes));
    pool.Release(pool.Name(b, Key(1)));
    EXPECT_EQ(pool.Stats().free_blocks, 0);  // cached, not freed
    EXPECT_TRUE(pool.Drop(Key(1)));
    PoolBlock* c = pool.Allocate(bytes).value();
    EXPECT_EQ(c->data, mem);
    EXPECT_TRUE(AllZero(c));
    // Another size does not take it.
    PoolBlock* d = pool.Allocate(bytes + 64).value();
    EXPECT_NE(d->data, mem);
    pool.Release(c);
    pool.Release(d);
    EXPECT_EQ(pool.Stats().free_blocks, 2);
  }
}

// Live + free never exceeds the budget, the free list never exceeds its cap, and free memory
// is given back before any cached block is evicted.
TEST(BlockPool, FreeListIsBounded) {
  const int64_t kB = 64 << 10;
  {
    BlockPool pool(0, /*max_free_bytes=*/2 * kB);
    std::vector<PoolBlock*> v;
    for (int i = 0; i < 5; ++i) v.push_back(pool.Allocate(kB).value());
    for (PoolBlock* b : v) pool.Release(b);
    EXPECT_EQ(pool.Stats().free_blocks, 2);
    EXPECT_EQ(pool.Stats().free_bytes, 2 * kB);
  }
  {
    BlockPool pool(0, /*max_free_bytes=*/0);  // no free list
    pool.Release(pool.Allocate(kB).value());
    EXPECT_EQ(pool.Stats().free_bytes, 0);
  }
  BlockPool pool(4 * kB);
  auto check = [&] {
    const PoolStats s = pool.Stats();
    EXPECT_LE(s.used_bytes + s.free_bytes, 4 * kB);
  };
  std::vector<PoolBlock*> v;
  for (int i = 0; i < 4; ++i) v.push_back(pool.Allocate(kB).value());
  for (PoolBlock* b : v) pool.Release(b);
  check();
  EXPECT_EQ(pool.Stats().free_blocks, 4);
  // Two cached blocks (persisted, idle) and two free ones; a block of another size needs room:
  // the free memory goes, the cached blocks stay.
  PoolBlock* n1 = pool.Name(pool.Allocate(kB).value(), Key(1));
  PoolBlock* n2 = pool.Name(pool.Allocate(kB).value(), Key(2));
  pool.Release(n1);
  pool.Release(n2);
  pool.MarkPersisted(Key(1));
  pool.MarkPersisted(Key(2));
  check();
  EXPECT_EQ(pool.Stats().free_blocks, 2);
  PoolBlock* big = pool.Allocate(2 * kB).value();
  check();
  EXPECT_EQ(pool.Stats().evictions, 0u);
  EXPECT_TRUE(pool.Contains(Key(1)));
  EXPECT_TRUE(pool.Contains(Key(2)));
  EXPECT_EQ(pool.Stats().free_blocks, 0);
  // Now full of live and cached blocks: an allocation evicts, and what eviction frees does not
  // push live + free over the budget.
  PoolBlock* more = pool.Allocate(kB).value();
  check();
  EXPECT_GE(pool.Stats().evictions, 1u);
  EXPECT_GE(pool.Stats().reuses, 3u);  // the evicted block's memory served `more`
  pool.Release(big);
  pool.Release(more);
  check();
  // Reserve fills the list up to the budget only, with zeroed memory.
  EXPECT_LE(pool.Reserve(kB, 100), 4);
  check();
  PoolBlock* r = pool.Allocate(kB).value();
  EXPECT_TRUE(AllZero(r));
  pool.Release(r);
  check();
}

TEST(BlockPool, ReservePrefaultsZeroedBlocks) {
  for (int64_t bytes : {int64_t{4096}, int64_t{1} << 20}) {
    BlockPool pool(0);
    EXPECT_EQ(pool.Reserve(bytes, 3), 3);
    EXPECT_EQ(pool.Reserve(bytes, 3), 3);  // already there
    EXPECT_EQ(pool.Stats().free_blocks, 3);
    EXPECT_EQ(pool.Stats().used_bytes, 0);
    std::vector<PoolBlock*> v;
    for (int i = 0; i < 3; ++i) {
      v.push_back(pool.Allocate(bytes).value());
      EXPECT_TRUE(AllZero(v.back()));
    }
    EXPECT_EQ(pool.Stats().reuses, 3u);
    for (PoolBlock* b : v) pool.Release(b);
  }
}

// Two sequences share a named block; writing into it (after a truncation) copies it first.
TEST(BlockPool, SequenceCopiesSharedBlockBeforeWriting) {
  KvLayout layout{1, 1, 8, 4, KvFormat{KvType::kF16, 8, false}};
  BlockPool pool(0);
  SequenceKv a(layout, 64, pool), b(layout, 64, pool);
  ASSERT_TRUE(a.Reserve(4).ok());
  for (int p = 0; p < 4; ++p) std::memset(a.k_row(0, p), p + 1, layout.row_bytes());
  a.SetTokens(4);
  a.NameBlock(0, Key(9));
  b.SetBlock(0, pool.Acquire(Key(9)));
  b.SetTokens(4);
  EXPECT_EQ(a.block(0), b.block(0));
  // b diverges at position 2: its block must be copied, a's left untouched.
  b.Truncate(2);
  ASSERT_TRUE(b.Reserve(3).ok());
  EXPECT_NE(a.block(0), b.block(0));
  std::memset(b.k_row(0, 2), 0x55, layout.row_bytes());
  EXPECT_EQ(a.k_row(0, 2)[0], 3);
  EXPECT_EQ(b.k_row(0, 1)[0], 2);  // the copy kept the shared prefix
  EXPECT_EQ(pool.Stats().blocks, 2);
}

}  // namespace
}  // namespace kvfs
