// Per-sequence KV storage, paged in blocks of `block_tokens` positions that hold every layer.
// This is the f16 format of the engine foundation; the quantized formats and the shared block
// pool (DESIGN section 2) build on the same block geometry.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/status.h"

namespace kvfs {

struct KvLayout {
  int64_t n_layer = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t block_tokens = 256;
  // Elements of one plane (K or V of one layer) in one block: [n_head_kv][block_tokens][head_dim].
  int64_t plane_elems() const { return n_head_kv * block_tokens * head_dim; }
  int64_t block_bytes() const { return n_layer * 2 * plane_elems() * 2; }  // f16
};

class SequenceKv {
 public:
  SequenceKv(const KvLayout& layout, int64_t max_tokens);
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t n_tokens() const { return n_tokens_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t bytes_allocated() const { return static_cast<int64_t>(blocks_.size()) * layout_.block_bytes(); }

  // Makes positions [0, n) addressable. OutOfRange past max_tokens.
  Status Reserve(int64_t n);
  // Marks positions [0, n) as holding valid K/V (after a forward pass wrote them).
  void SetTokens(int64_t n) { n_tokens_ = n; }
  // Forgets positions >= n (keeps the memory).
  void Truncate(int64_t n) { if (n < n_tokens_) n_tokens_ = n; }

  // K or V of (layer, kv head) for `pos`: head_dim f16 values. Positions within one block are
  // consecutive rows, so attention walks a block's keys contiguously.
  uint16_t* k_row(int64_t layer, int64_t head, int64_t pos) { return row(layer, 0, head, pos); }
  uint16_t* v_row(int64_t layer, int64_t head, int64_t pos) { return row(layer, 1, head, pos); }
  const uint16_t* k_row(int64_t layer, int64_t head, int64_t pos) const {
    return const_cast<SequenceKv*>(this)->row(layer, 0, head, pos);
  }
  const uint16_t* v_row(int64_t layer, int64_t head, int64_t pos) const {
    return const_cast<SequenceKv*>(this)->row(layer, 1, head, pos);
  }

 private:
  uint16_t* row(int64_t layer, int kv, int64_t head, int64_t pos) {
    const int64_t b = pos / layout_.block_tokens;
    const int64_t in_block = pos % layout_.block_tokens;
    return blocks_[b] + (layer * 2 + kv) * layout_.plane_elems() +
           (head * layout_.block_tokens + in_block) * layout_.head_dim;
  }

  KvLayout layout_;
  int64_t max_tokens_;
  int64_t n_tokens_ = 0;
  std::vector<uint16_t*> blocks_;  // owned, 64-byte aligned
};

}  // namespace kvfs
