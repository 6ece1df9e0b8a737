// The KV block pool: every KV block in memory, under one byte budget with exact accounting.
//
// A block holds block_tokens positions of every layer (layout: sequence_kv.h). It is either
//   - writable: owned by exactly one sequence, anonymous (the growing tail of a sequence), or
//   - named: immutable, indexed by a 128-bit key. A full block's key is its hash chain value
//     (ChainHash below), so two sequences with the same prefix, model, format and sharing domain
//     name the same blocks and share them. A parked sequence's partial tail is also named (by a
//     key private to its agent, TailKey) so it can stay cached while the agent is idle.
// `refs` counts the sequences using a block right now. A named block with no refs stays cached
// (an idle agent's blocks, a prefix nobody runs) until the budget needs its memory; it may be
// dropped only once it is persisted (on disk, so it can be read back) and not pinned. Victims
// are chosen least valuable first: least recently used, with a boost for blocks that were hit
// (found by another lookup) or are pinned by a prefix.
//
// Memory given back is zeroed first: a conversation's attention state must not linger.
//
// Free list: the zeroed memory of freed blocks is kept, per block size, and handed out again by
// Allocate, so a reload or a new turn does not page-fault its way through fresh memory (a block
// is ~1.6 MB: ~400 faults of 4 KiB each, every time). Accounting: the budget and used_bytes
// count live blocks only, exactly as before; the free list is extra, bounded so that
// live + free <= budget (free memory is given back to the system first, before any idle block is
// evicted) and free <= max_free_bytes (a cap on memory held for nothing). Free-list memory is
// zeroed when its block is freed, before it enters the list, so nothing one agent wrote is ever
// handed to another agent un-zeroed; Allocate's contents are therefore all zeros.
// Large blocks are mapped with mmap and pre-faulted (MAP_POPULATE) so that even fresh memory is
// faulted in one call rather than a page at a time.
// Thread-safety: all methods lock one mutex; block contents are not protected (the engine
// thread writes writable blocks; named blocks are immutable).
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/core/block_hash.h"
#include "engine/core/status.h"
#include "engine/kv/kv_format.h"
#include "engine/model/tokenizer.h"

namespace kvfs {

struct PoolBlock {
  uint8_t* data = nullptr;  // `bytes` bytes, 64-byte aligned
  uint64_t serial = 0;      // unique per allocation for the life of the process (across pools):
                            // device copies of blocks are keyed by it, since addresses get reused
  int64_t bytes = 0;        // a block of one layout (sequence_kv.h); layouts may differ per agent
  int32_t refs = 0;         // sequences using it now
  bool named = false;       // immutable and in the index under `key`
  bool persisted = false;   // a copy is on disk: may be dropped when unreferenced
  int32_t pins = 0;         // prefix pins: never dropped while > 0
  BlockHash key;
  uint64_t last_use = 0;    // pool clock at the last acquire/release
  uint64_t hits = 0;        // lookups that found it
};

struct PoolStats {
  int64_t budget_bytes = 0;     // 0: unlimited
  int64_t used_bytes = 0;       // sum of the live blocks' sizes (64-byte rounded)
  int64_t free_bytes = 0;       // zeroed memory kept for reuse (not in used_bytes; see above)
  int64_t free_blocks = 0;
  uint64_t reuses = 0;          // allocations served from the free list
  int64_t blocks = 0;
  int64_t named_blocks = 0;
  int64_t idle_blocks = 0;      // named, unreferenced: cached only
  uint64_t hits = 0, misses = 0;
  uint64_t evictions = 0;       // idle blocks dropped to make room
};

// Hash chain value of a full block: xxh3-128 over (parent, the block's token ids, the model
// fingerprint, the KV format, the sharing domain). The root's parent is BlockHash{}.
BlockHash ChainHash(const BlockHash& parent, std::span<const TokenId> tokens, std::string_view model_fingerprint,
                    const KvFormat& format, std::string_view domain);
// The key under which an agent's parked partial tail is cached (never equal to a chain hash in
// practice: a separate domain tag).
BlockHash TailKey(std::string_view agent, uint64_t generation);

class BlockPool {
 public:
  // budget_bytes <= 0: unlimited. max_free_bytes: cap of the free list (< 0: the default,
  // kDefaultMaxFreeBytes; 0: no free list); it is further bounded by budget - used.
  static constexpr int64_t kDefaultMaxFreeBytes = int64_t{256} << 20;
  explicit BlockPool(int64_t budget_bytes, int64_t max_free_bytes = -1);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A new writable block of `bytes` (refs = 1, contents zero). Drops idle blocks if the budget
  // needs room; kResourceExhausted when the budget is taken by blocks in use or pinned.
  Result<PoolBlock*> Allocate(int64_t bytes);
  // Puts up to `count` zeroed, pre-faulted blocks of `bytes` on the free list (within its
  // bounds), so that the first allocations of that size do not fault. Returns how many are
  // there now.
  int64_t Reserve(int64_t bytes, int64_t count);
  // A cached named block (refs + 1, counts a hit) or nullptr (counts a miss).
  PoolBlock* Acquire(const BlockHash& key);
  // As Acquire, for a reader outside the turns (an export): no hit or miss is counted, so that
  // backups do not show as the turns' cache hits (Release as for Acquire).
  PoolBlock* Hold(const BlockHash& key);
  // Whether a named block is in memory (no accounting).
  bool Contains(const BlockHash& key) const;
  void Retain(PoolBlock* b);
  // True when `b` may be written by its holder: anonymous and held once.
  bool IsWritable(const PoolBlock* b) const;
  // Gives back the end of a writable block: it keeps its first `bytes` bytes (<= its size) in a
  // new allocation, under a new serial; the old memory is zeroed and freed (or kept on the free
  // list). Shrinking never needs room, so it cannot fail; if the smaller allocation does, the
  // block stays as it is.
  void Shrink(PoolBlock* b, int64_t bytes);
  // refs - 1. A writable block at 0 refs is zeroed and freed; a named one stays cached.
  void Release(PoolBlock* b);

  // Names a writable block (refs must be 1: its only user). When a block with that key is
  // already cached, `b` is released and the cached one is returned retained; else `b` itself.
  PoolBlock* Name(PoolBlock* b, const BlockHash& key);
  // Takes a named block back as writable (used to resume a parked tail): succeeds only if its
  // refs == 0 and no pins; it leaves the index and comes back with refs = 1. Else nullptr.
  // Counted in Stats() as a hit or a miss, as Acquire.
  PoolBlock* TakeWritable(const BlockHash& key);

  void MarkPersisted(const BlockHash& key);
  void Pin(const BlockHash& key);
  void Unpin(const BlockHash& key);
  // Erasure: drops a named block with no refs and no pins now (zeroed, freed). False if absent
  // or in use.
  bool Drop(const BlockHash& key);

  PoolStats Stats() const;

  // Serials of the blocks freed since the last call, once TrackFreed() was called: a backend
  // that keeps device copies of blocks drops (and zeroes) them, so erased state does not
  // linger in device memory either.
  void TrackFreed();
  std::vector<uint64_t> TakeFreed();

 private:
  Status MakeRoomLocked(int64_t bytes);  // ensures `bytes` more fit the budget
  void FreeLocked(PoolBlock* b);
  uint64_t ValueLocked(const PoolBlock& b) const;
  // Gives free-list memory back to the system until live + free + `extra` fits the budget and
  // free fits max_free_bytes.
  void TrimFreeLocked(int64_t extra);
  // The free list may take `bytes` more.
  bool FreeListTakesLocked(int64_t bytes) const;
  // Zeroed memory of `bytes` from the free list, or nullptr; and zeroed memory back to it (or
  // to the system when the list's bounds do not take it).
  uint8_t* TakeFreeLocked(int64_t bytes);
  void PutFreeLocked(uint8_t* p, int64_t bytes);

  const int64_t budget_bytes_;
  const int64_t max_free_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, std::vector<uint8_t*>> free_;  // block size -> zeroed memory
  int64_t free_bytes_ = 0;
  int64_t free_blocks_ = 0;
  uint64_t reuses_ = 0;
  std::unordered_map<BlockHash, PoolBlock*, BlockHashHasher> index_;
  int64_t n_blocks_ = 0;
  int64_t used_bytes_ = 0;
  uint64_t clock_ = 0;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
  bool track_freed_ = false;
  std::vector<uint64_t> freed_;  // serials, while track_freed_
};

}  // namespace kvfs
