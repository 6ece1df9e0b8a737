#include "engine/kv/block_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include <sys/mman.h>

#include <spdlog/fmt/fmt.h>
#include <xxhash.h>

namespace kvfs {

namespace {

// Field separator tags: each field's length is hashed before it, so no two different inputs
// serialize alike.
void Append(std::string& buf, const void* p, size_t n) { buf.append(static_cast<const char*>(p), n); }
void AppendU64(std::string& buf, uint64_t v) { Append(buf, &v, sizeof v); }

BlockHash FromXxh(XXH128_hash_t h) { return BlockHash{h.high64, h.low64}; }

// A hit counts as this many ticks of the LRU clock: a block found again by a lookup (a shared
// prefix, an agent that keeps coming back) outlives that many newer one-off blocks.
constexpr uint64_t kHitBoost = 64;
constexpr uint64_t kMaxBoostedHits = 16;
constexpr uint64_t kPinBoost = uint64_t{1} << 40;

// The next PoolBlock::serial. Process-wide on purpose: serials must differ across pools (every
// SequenceKv without a pool has its own), and an id source is the one piece of shared state
// that nothing else reads.
uint64_t NextBlockSerial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// Blocks at least this large get their own mapping (page-aligned, pre-faulted, returned to the
// system at once when the free list lets them go); smaller ones (tests, tiny models) come from
// the heap.
constexpr int64_t kMapThreshold = int64_t{256} << 10;

// Measured (bench/kvfs_pool_reload_bench, 16 blocks of 1.6 MB from the page cache): the read
// and checksum alone take ~2.7 ms; into fresh heap memory ~7 ms (~6,400 page faults); into
// MAP_POPULATE memory ~5.4 ms (the kernel maps and zeroes it in one call, ~2.9 ms); into
// free-list memory ~2.7 ms.
uint8_t* AllocMemory(int64_t bytes) {
  if (bytes >= kMapThreshold) {
    void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    // Agents' KV rows stay out of core dumps (best effort: a kernel without it dumps them).
    (void)::madvise(p, static_cast<size_t>(bytes), MADV_DONTDUMP);
    return static_cast<uint8_t*>(p);
  }
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(bytes)));
  if (p != nullptr) std::memset(p, 0, static_cast<size_t>(bytes));  // as a fresh mapping is
  return p;
}

// `p` must be zeroed already (the caller's duty: FreeLocked zeroes before anything else).
void FreeMemory(uint8_t* p, int64_t bytes) {
  if (bytes >= kMapThreshold) ::munmap(p, static_cast<size_t>(bytes));
  else std::free(p);
}

}  // namespace

BlockHash ChainHash(const BlockHash& parent, std::span<const TokenId> tokens, std::string_view model_fingerprint,
                    const KvFormat& format, std::string_view domain) {
  std::string buf;
  buf.reserve(64 + tokens.size() * sizeof(TokenId) + model_fingerprint.size() + domain.size());
  buf.append("kvfs-block-v1");
  AppendU64(buf, parent.hi);
  AppendU64(buf, parent.lo);
  AppendU64(buf, tokens.size());
  Append(buf, tokens.data(), tokens.size() * sizeof(TokenId));
  AppendU64(buf, model_fingerprint.size());
  buf.append(model_fingerprint);
  AppendU64(buf, static_cast<uint64_t>(format.type));
  AppendU64(buf, static_cast<uint64_t>(format.group));
  AppendU64(buf, format.rotate ? 1 : 0);
  AppendU64(buf, domain.size());
  buf.append(domain);
  return FromXxh(XXH3_128bits(buf.data(), buf.size()));
}

BlockHash TailKey(std::string_view agent, uint64_t generation) {
  std::string buf("kvfs-tail-v1");
  AppendU64(buf, agent.size());
  buf.append(agent);
  AppendU64(buf, generation);
  return FromXxh(XXH3_128bits(buf.data(), buf.size()));
}

BlockPool::BlockPool(int64_t budget_bytes, int64_t max_free_bytes)
    : budget_bytes_(budget_bytes), max_free_bytes_(max_free_bytes < 0 ? kDefaultMaxFreeBytes : max_free_bytes) {}

BlockPool::~BlockPool() {
  std::lock_guard lock(mu_);
  for (auto& [key, b] : index_) FreeLocked(b);
  index_.clear();
  for (auto& [bytes, list] : free_)
    for (uint8_t* p : list) FreeMemory(p, bytes);
  free_.clear();
  // Writable blocks still out belong to sequences that must be destroyed first.
  if (n_blocks_ != 0) {
    std::fprintf(stderr, "kvfs: BlockPool destroyed with %lld writable blocks in use\n",
                 static_cast<long long>(n_blocks_));
    std::abort();
  }
}

void BlockPool::FreeLocked(PoolBlock* b) {
  if (track_freed_) freed_.push_back(b->serial);
  // Zeroed first, whatever happens to the memory next: kept for reuse or given back.
  std::memset(b->data, 0, static_cast<size_t>(b->bytes));
  used_bytes_ -= b->bytes;
  --n_blocks_;
  PutFreeLocked(b->data, b->bytes);
  delete b;
}

void BlockPool::PutFreeLocked(uint8_t* p, int64_t bytes) {
  if (FreeListTakesLocked(bytes)) {
    free_[bytes].push_back(p);
    free_bytes_ += bytes;
    ++free_blocks_;
  } else {
    FreeMemory(p, bytes);
  }
}

uint8_t* BlockPool::TakeFreeLocked(int64_t bytes) {
  auto it = free_.find(bytes);
  if (it == free_.end() || it->second.empty()) return nullptr;
  uint8_t* m = it->second.back();
  it->second.pop_back();
  free_bytes_ -= bytes;
  --free_blocks_;
  return m;
}

bool BlockPool::FreeListTakesLocked(int64_t bytes) const {
  if (free_bytes_ + bytes > max_free_bytes_) return false;
  return budget_bytes_ <= 0 || used_bytes_ + free_bytes_ + bytes <= budget_bytes_;
}

void BlockPool::TrimFreeLocked(int64_t extra) {
  auto over = [&] {
    return free_bytes_ > max_free_bytes_ || (budget_bytes_ > 0 && used_bytes_ + free_bytes_ + extra > budget_bytes_);
  };
  for (auto it = free_.begin(); it != free_.end() && over();) {
    std::vector<uint8_t*>& list = it->second;
    while (!list.empty() && over()) {
      FreeMemory(list.back(), it->first);
      list.pop_back();
      free_bytes_ -= it->first;
      --free_blocks_;
    }
    it = list.empty() ? free_.erase(it) : std::next(it);
  }
}

void BlockPool::TrackFreed() {
  std::lock_guard lock(mu_);
  track_freed_ = true;
}

std::vector<uint64_t> BlockPool::TakeFreed() {
  std::lock_guard lock(mu_);
  return std::exchange(freed_, {});
}

uint64_t BlockPool::ValueLocked(const PoolBlock& b) const {
  return b.last_use + kHitBoost * std::min(b.hits, kMaxBoostedHits) + (b.pins > 0 ? kPinBoost : 0);
}

Status BlockPool::MakeRoomLocked(int64_t bytes) {
  // Free-list memory goes before any cached block: it holds nothing.
  TrimFreeLocked(bytes);
  if (budget_bytes_ <= 0 || used_bytes_ + bytes <= budget_bytes_) return Status::Ok();
  // Candidates: idle, persisted, unpinned. Drop the least valuable until the request fits; a
  // sort per eviction round is fine (rounds are rare and drop several blocks at once).
  std::vector<PoolBlock*> idle;
  for (auto& [key, b] : index_) {
    if (b->refs == 0 && b->persisted && b->pins == 0) idle.push_back(b);
  }
  std::sort(idle.begin(), idle.end(), [&](PoolBlock* a, PoolBlock* b) { return ValueLocked(*a) < ValueLocked(*b); });
  // Free a sixteenth of the budget beyond the request, so the next allocations do not each pay
  // for a scan.
  const int64_t target = budget_bytes_ - bytes - budget_bytes_ / 16;
  for (size_t i = 0; i < idle.size() && (used_bytes_ + bytes > budget_bytes_ || used_bytes_ > target); ++i) {
    index_.erase(idle[i]->key);
    FreeLocked(idle[i]);
    ++evictions_;
  }
  TrimFreeLocked(bytes);  // what the evictions put on the free list must leave room too
  if (bytes > budget_bytes_) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("a KV block of {} bytes is larger than the whole KV budget of {} bytes (kvfsd "
                              "--kv-budget; a smaller format, config.json \"kv\", takes less)",
                              bytes, budget_bytes_));
  }
  if (used_bytes_ + bytes > budget_bytes_) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("KV budget of {} bytes is taken by blocks in use, pinned or not yet on disk "
                              "({} bytes in {} blocks)",
                              budget_bytes_, used_bytes_, n_blocks_));
  }
  return Status::Ok();
}

Result<PoolBlock*> BlockPool::Allocate(int64_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  std::lock_guard lock(mu_);
  // Free-list memory of this size: live + free is unchanged by taking it, so it fits the budget
  // whenever a fresh block would.
  auto take = [&] { return TakeFreeLocked(bytes); };
  uint8_t* p = take();
  if (Status room = MakeRoomLocked(bytes); !room.ok()) {
    if (p != nullptr) FreeMemory(p, bytes);  // zeroed; the list's bound may no longer hold it
    return room;
  }
  if (p == nullptr) p = take();  // what an eviction just freed
  if (p != nullptr) {
    ++reuses_;
  } else {
    p = AllocMemory(bytes);
    if (p == nullptr) return Status(StatusCode::kResourceExhausted, "out of memory for KV blocks");
  }
  auto* b = new PoolBlock;
  b->data = p;
  b->serial = NextBlockSerial();
  b->bytes = bytes;
  b->refs = 1;
  b->last_use = ++clock_;
  ++n_blocks_;
  used_bytes_ += bytes;
  return b;
}

int64_t BlockPool::Reserve(int64_t bytes, int64_t count) {
  bytes = (bytes + 63) / 64 * 64;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(bytes);
      const int64_t have = it == free_.end() ? 0 : static_cast<int64_t>(it->second.size());
      if (have >= count || !FreeListTakesLocked(bytes)) return have;
    }
    // Faulted in without the lock: the engine thread keeps allocating meanwhile.
    uint8_t* p = AllocMemory(bytes);
    if (p == nullptr) return 0;
    std::lock_guard lock(mu_);
    if (!FreeListTakesLocked(bytes)) {
      FreeMemory(p, bytes);
      auto it = free_.find(bytes);
      return it == free_.end() ? 0 : static_cast<int64_t>(it->second.size());
    }
    free_[bytes].push_back(p);
    free_bytes_ += bytes;
    ++free_blocks_;
  }
}

PoolBlock* BlockPool::Acquire(const BlockHash& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  PoolBlock* b = it->second;
  ++b->refs;
  ++b->hits;
  b->last_use = ++clock_;
  return b;
}

PoolBlock* BlockPool::Hold(const BlockHash& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  ++it->second->refs;
  return it->second;
}

bool BlockPool::Contains(const BlockHash& key) const {
  std::lock_guard lock(mu_);
  return index_.count(key) != 0;
}

void BlockPool::Retain(PoolBlock* b) {
  std::lock_guard lock(mu_);
  ++b->refs;
}

bool BlockPool::IsWritable(const PoolBlock* b) const {
  std::lock_guard lock(mu_);
  return !b->named && b->refs == 1;
}

void BlockPool::Shrink(PoolBlock* b, int64_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  std::lock_guard lock(mu_);
  if (b->named || b->refs != 1) {
    std::fprintf(stderr, "kvfs: BlockPool::Shrink of a block that is not writable\n");
    std::abort();
  }
  if (bytes >= b->bytes) return;
  uint8_t* p = TakeFreeLocked(bytes);
  if (p == nullptr) p = AllocMemory(bytes);
  if (p == nullptr) return;
  std::memcpy(p, b->data, static_cast<size_t>(bytes));
  // The old memory is zeroed, then kept for reuse or given back, as a freed block's is.
  std::memset(b->data, 0, static_cast<size_t>(b->bytes));
  used_bytes_ -= b->bytes - bytes;
  PutFreeLocked(b->data, b->bytes);
  b->data = p;
  b->bytes = bytes;
  // Device copies are keyed by serial: the old one's copy goes as a freed block's does, and
  // the new memory is a new block to them.
  if (track_freed_) freed_.push_back(b->serial);
  b->serial = NextBlockSerial();
}

void BlockPool::Release(PoolBlock* b) {
  std::lock_guard lock(mu_);
  if (b->refs <= 0) {
    std::fprintf(stderr, "kvfs: BlockPool::Release of a block with %d refs\n", b->refs);
    std::abort();
  }
  --b->refs;
  b->last_use = ++clock_;
  if (b->refs == 0 && !b->named) FreeLocked(b);
}

PoolBlock* BlockPool::Name(PoolBlock* b, const BlockHash& key) {
  std::lock_guard lock(mu_);
  if (b->named || b->refs != 1) {
    std::fprintf(stderr, "kvfs: BlockPool::Name of a block that is not writable\n");
    std::abort();
  }
  auto [it, inserted] = index_.emplace(key, b);
  if (!inserted) {
    // Someone computed the same tokens first: share theirs, give ours back.
    PoolBlock* existing = it->second;
    ++existing->refs;
    existing->last_use = ++clock_;
    b->refs = 0;
    FreeLocked(b);
    return existing;
  }
  b->named = true;
  b->key = key;
  return b;
}

PoolBlock* BlockPool::TakeWritable(const BlockHash& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  // A turn's lookup of its parked tail, counted as Acquire's are (.status's hit rate and the
  // per-agent hits agree): not there, or in use, the turn reads it from disk.
  if (it == index_.end() || it->second->refs != 0 || it->second->pins != 0) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  PoolBlock* b = it->second;
  index_.erase(it);
  b->named = false;
  b->persisted = false;
  b->refs = 1;
  b->hits = 0;
  b->last_use = ++clock_;
  return b;
}

void BlockPool::MarkPersisted(const BlockHash& key) {
  std::lock_guard lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) it->second->persisted = true;
}

void BlockPool::Pin(const BlockHash& key) {
  std::lock_guard lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) ++it->second->pins;
}

void BlockPool::Unpin(const BlockHash& key) {
  std::lock_guard lock(mu_);
  if (auto it = index_.find(key); it != index_.end() && it->second->pins > 0) --it->second->pins;
}

bool BlockPool::Drop(const BlockHash& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || it->second->refs != 0 || it->second->pins != 0) return false;
  PoolBlock* b = it->second;
  index_.erase(it);
  FreeLocked(b);
  return true;
}

PoolStats BlockPool::Stats() const {
  std::lock_guard lock(mu_);
  PoolStats s;
  s.budget_bytes = budget_bytes_;
  s.blocks = n_blocks_;
  s.used_bytes = used_bytes_;
  s.free_bytes = free_bytes_;
  s.free_blocks = free_blocks_;
  s.reuses = reuses_;
  s.named_blocks = static_cast<int64_t>(index_.size());
  for (auto& [key, b] : index_) s.idle_blocks += b->refs == 0 ? 1 : 0;
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  return s;
}

}  // namespace kvfs
