// Per-sequence KV storage, paged in blocks of `block_tokens` positions that hold every layer.
// Within a block, each layer has a K plane and a V plane of block_tokens rows; a row is one
// token's K (or V) vector, n_head_kv * head_dim values, encoded in the KV format (kv_format.h).
// Blocks become the unit of sharing and persistence in the block pool (DESIGN section 2).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/status.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/kv_format.h"
#include "engine/model/hparams.h"

namespace kvfs {

struct KvLayout {
  int64_t n_layer = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t block_tokens = 256;
  KvFormat format;
  int64_t row_values() const { return n_head_kv * head_dim; }
  int64_t row_bytes() const { return format.RowBytes(row_values()); }
  int64_t plane_bytes() const { return block_tokens * row_bytes(); }
  int64_t block_bytes() const { return n_layer * 2 * plane_bytes(); }
};

// The layout for a model's geometry in the given format.
inline KvLayout KvLayoutFor(const HParams& hp, const KvFormat& format, int64_t block_tokens = 256) {
  return KvLayout{hp.n_layer, hp.n_head_kv, hp.head_dim, block_tokens, format};
}

// A sequence's block table over a BlockPool. Positions [0, n_tokens) hold valid K/V. Blocks
// may be shared with other sequences (named blocks of a common prefix); Reserve makes every
// block that a forward pass will write private first (copy-on-write), so a shared block is
// never written. Constructed without a pool, a sequence owns a private unlimited one (CLI,
// tests, benchmarks).
class SequenceKv {
 public:
  SequenceKv(const KvLayout& layout, int64_t max_tokens);
  SequenceKv(const KvLayout& layout, int64_t max_tokens, BlockPool& pool);
  ~SequenceKv();  // releases every block
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  const KvLayout& layout() const { return layout_; }
  BlockPool& pool() { return *pool_; }
  int64_t n_tokens() const { return n_tokens_; }
  int64_t max_tokens() const { return max_tokens_; }

  // Makes positions [0, n) addressable and the blocks holding positions [n_tokens, n)
  // writable (copy-on-write of shared or named ones). OutOfRange past max_tokens;
  // kResourceExhausted when the pool's budget is full.
  Status Reserve(int64_t n);
  // Marks positions [0, n) as holding valid K/V (after a forward pass wrote them).
  void SetTokens(int64_t n) { n_tokens_ = n; }
  // Forgets positions >= n; blocks wholly past n are released.
  void Truncate(int64_t n);

  // Block table access for the KV layer (sharing, naming, persistence).
  int64_t n_blocks() const { return static_cast<int64_t>(table_.size()); }
  PoolBlock* block(int64_t i) const { return table_[i]; }
  // Replaces block i (taking over the caller's reference); i == n_blocks() appends.
  void SetBlock(int64_t i, PoolBlock* b);
  // Names full block i in the pool (it becomes immutable and shareable); when the pool already
  // holds a block of that name, that one replaces ours.
  void NameBlock(int64_t i, const BlockHash& key) { table_[i] = pool_->Name(table_[i], key); }
  // Releases every block; n_tokens = 0.
  void Clear();

  // The encoded K or V row of `pos` in `layer`.
  uint8_t* k_row(int64_t layer, int64_t pos) { return row(layer, 0, pos); }
  uint8_t* v_row(int64_t layer, int64_t pos) { return row(layer, 1, pos); }
  const uint8_t* k_row(int64_t layer, int64_t pos) const { return const_cast<SequenceKv*>(this)->row(layer, 0, pos); }
  const uint8_t* v_row(int64_t layer, int64_t pos) const { return const_cast<SequenceKv*>(this)->row(layer, 1, pos); }

 private:
  uint8_t* row(int64_t layer, int kv, int64_t pos) {
    const int64_t b = pos / layout_.block_tokens;
    return table_[b]->data + (layer * 2 + kv) * layout_.plane_bytes() + (pos % layout_.block_tokens) * layout_.row_bytes();
  }

  KvLayout layout_;
  int64_t max_tokens_;
  int64_t n_tokens_ = 0;
  std::unique_ptr<BlockPool> own_pool_;  // when constructed without a pool
  BlockPool* pool_;
  std::vector<PoolBlock*> table_;  // one reference held per entry
};

}  // namespace kvfs
