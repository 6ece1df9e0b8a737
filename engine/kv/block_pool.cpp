#include "engine/kv/block_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

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

BlockPool::BlockPool(int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

BlockPool::~BlockPool() {
  std::lock_guard lock(mu_);
  for (auto& [key, b] : index_) FreeLocked(b);
  index_.clear();
  // Writable blocks still out belong to sequences that must be destroyed first.
  if (n_blocks_ != 0) {
    std::fprintf(stderr, "kvfs: BlockPool destroyed with %lld writable blocks in use\n",
                 static_cast<long long>(n_blocks_));
    std::abort();
  }
}

void BlockPool::FreeLocked(PoolBlock* b) {
  if (track_freed_) freed_.push_back(b->serial);
  std::memset(b->data, 0, static_cast<size_t>(b->bytes));
  std::free(b->data);
  used_bytes_ -= b->bytes;
  delete b;
  --n_blocks_;
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
  KVFS_RETURN_IF_ERROR(MakeRoomLocked(bytes));
  void* p = std::aligned_alloc(64, static_cast<size_t>(bytes));
  if (p == nullptr) return Status(StatusCode::kResourceExhausted, "out of memory for KV blocks");
  auto* b = new PoolBlock;
  b->data = static_cast<uint8_t*>(p);
  b->serial = NextBlockSerial();
  b->bytes = bytes;
  b->refs = 1;
  b->last_use = ++clock_;
  ++n_blocks_;
  used_bytes_ += bytes;
  return b;
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
  if (it == index_.end() || it->second->refs != 0 || it->second->pins != 0) return nullptr;
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
  s.named_blocks = static_cast<int64_t>(index_.size());
  for (auto& [key, b] : index_) s.idle_blocks += b->refs == 0 ? 1 : 0;
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  return s;
}

}  // namespace kvfs
