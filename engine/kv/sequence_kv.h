// Per-sequence KV storage, paged in blocks of `block_tokens` positions that hold every layer.
// Within a block, each layer has a K plane and a V plane of block_tokens rows; a row is one
// token's K (or V) vector, n_head_kv * head_dim values, encoded in the KV format (kv_format.h).
// Blocks become the unit of sharing and persistence in the block pool (DESIGN section 2).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/status.h"
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

class SequenceKv {
 public:
  SequenceKv(const KvLayout& layout, int64_t max_tokens);
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t n_tokens() const { return n_tokens_; }
  int64_t max_tokens() const { return max_tokens_; }

  // Makes positions [0, n) addressable. OutOfRange past max_tokens.
  Status Reserve(int64_t n);
  // Marks positions [0, n) as holding valid K/V (after a forward pass wrote them).
  void SetTokens(int64_t n) { n_tokens_ = n; }
  // Forgets positions >= n (keeps the memory).
  void Truncate(int64_t n) { if (n < n_tokens_) n_tokens_ = n; }

  // The encoded K or V row of `pos` in `layer`.
  uint8_t* k_row(int64_t layer, int64_t pos) { return row(layer, 0, pos); }
  uint8_t* v_row(int64_t layer, int64_t pos) { return row(layer, 1, pos); }
  const uint8_t* k_row(int64_t layer, int64_t pos) const { return const_cast<SequenceKv*>(this)->row(layer, 0, pos); }
  const uint8_t* v_row(int64_t layer, int64_t pos) const { return const_cast<SequenceKv*>(this)->row(layer, 1, pos); }

 private:
  uint8_t* row(int64_t layer, int kv, int64_t pos) {
    const int64_t b = pos / layout_.block_tokens;
    return blocks_[b] + (layer * 2 + kv) * layout_.plane_bytes() + (pos % layout_.block_tokens) * layout_.row_bytes();
  }

  KvLayout layout_;
  int64_t max_tokens_;
  int64_t n_tokens_ = 0;
  std::vector<uint8_t*> blocks_;  // owned, 64-byte aligned
};

}  // namespace kvfs
