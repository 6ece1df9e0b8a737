// Per-sequence KV storage, paged in blocks of `block_tokens` positions that hold every layer.
// Within a block, each layer has a K plane and a V plane of block_tokens rows; a row is one
// token's K (or V) vector, n_head_kv * head_dim values, encoded in the KV format (kv_format.h).
// Blocks become the unit of sharing and persistence in the block pool (DESIGN section 2).
//
// q4k (kv_format.h) stores keys per channel: a layer's K plane is block_tokens / C chunks of C
// tokens (k_chunk), its V plane is rows as for the other formats. A chunk is written only when
// its C tokens are known, so the tail of a q4k sequence of n tokens consists of
//   - the blocks up to position n, whose K chunks are complete for positions < n - n % C and
//     whose V rows are valid for every position < n (as for any format), and
//   - per layer, the f16 K rows of positions [n - n % C, n): the staging area (k_staging),
//     staged_tokens() = n % C rows, row r holding position n - n % C + r.
// The staging area lives in pool memory, after the planes of the block that holds the
// incomplete chunk (C divides block_tokens, so that block is the partial tail whenever rows are
// staged): a writable q4k block is allocated with block_bytes() + staging_bytes(), so every path
// that copies, parks, persists or zeroes the tail block (copy-on-write, the pool's parked tail,
// the store's tail file, erasure) carries the staged rows with it. Block layout:
//   [layer 0: K plane, V plane] ... [layer L-1: K plane, V plane] [staging: layer 0 .. L-1]
//   staging of layer l = C rows of row_values() halfs at block_bytes() + l * C * row_values() * 2.
// A full block has no incomplete chunk: it is exactly block_bytes() (SetTokens gives a writable
// block's staging memory back once the block fills), which keeps q4k's memory at 0.289x f16.
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
  int64_t row_bytes() const { return format.RowBytes(row_values()); }  // q4k: of a V row
  int64_t plane_bytes() const { return block_tokens * row_bytes(); }     // a V plane (and K, but q4k)
  // q4k: bytes of one K chunk; K plane = block_tokens / C chunks.
  int64_t chunk_bytes() const { return format.KeysByChannel() ? format.ChunkBytes(row_values()) : 0; }
  int64_t k_plane_bytes() const {
    return format.KeysByChannel() ? block_tokens / format.chunk * chunk_bytes() : plane_bytes();
  }
  int64_t block_bytes() const { return n_layer * (k_plane_bytes() + plane_bytes()); }
  // q4k: bytes of the staged f16 K rows of one incomplete chunk, all layers; 0 otherwise.
  int64_t staging_bytes() const { return format.KeysByChannel() ? n_layer * format.chunk * row_values() * 2 : 0; }
  // A block that is (or may become) a partial tail: the planes and the staging area.
  int64_t tail_block_bytes() const { return block_bytes() + staging_bytes(); }
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
  // Marks positions [0, n) as holding valid K/V (after a forward pass wrote them). q4k: trims
  // the writable blocks that became full to block_bytes (their chunks are complete).
  void SetTokens(int64_t n);
  // Forgets positions >= n; blocks wholly past n are released. q4k: when n falls inside a
  // complete K chunk, that chunk's positions below n must be staged again: the next Reserve
  // decodes them from the chunk into the staging area (so they are quantized again, from their
  // 4-bit values, when the chunk fills anew: not what a run that never truncated would store).
  // The engine avoids that re-quantization by resuming at chunk boundaries (engine_turns.cpp).
  void Truncate(int64_t n);

  // Block table access for the KV layer (sharing, naming, persistence).
  int64_t n_blocks() const { return static_cast<int64_t>(table_.size()); }
  PoolBlock* block(int64_t i) const { return table_[i]; }
  // Replaces block i (taking over the caller's reference); i == n_blocks() appends.
  void SetBlock(int64_t i, PoolBlock* b);
  // Names block i in the pool (it becomes immutable and shareable); when the pool already
  // holds a block of that name, that one replaces ours. A full q4k block is trimmed to
  // block_bytes first; a partial one (a parked tail) keeps its staging area.
  void NameBlock(int64_t i, const BlockHash& key);
  // Releases every block; n_tokens = 0.
  void Clear();

  // The encoded K or V row of `pos` in `layer` (q4k: V rows only; keys are in chunks).
  uint8_t* k_row(int64_t layer, int64_t pos) { return row(layer, 0, pos); }
  uint8_t* v_row(int64_t layer, int64_t pos) { return row(layer, 1, pos); }
  const uint8_t* k_row(int64_t layer, int64_t pos) const { return const_cast<SequenceKv*>(this)->row(layer, 0, pos); }
  const uint8_t* v_row(int64_t layer, int64_t pos) const { return const_cast<SequenceKv*>(this)->row(layer, 1, pos); }

  // q4k: the K chunk holding positions [c * C, (c + 1) * C) of `layer`.
  uint8_t* k_chunk(int64_t layer, int64_t c) { return chunk(layer, c); }
  const uint8_t* k_chunk(int64_t layer, int64_t c) const { return const_cast<SequenceKv*>(this)->chunk(layer, c); }
  // q4k: the f16 K rows of `layer` for the chunk that starts at position `chunk_start` (a
  // multiple of C), in the staging area of the block holding it: C rows of row_values() halfs,
  // row r for position chunk_start + r (see the note above). That block must be one that
  // Reserve made writable (only those carry a staging area).
  uint16_t* k_staging(int64_t layer, int64_t chunk_start) { return staging(layer, chunk_start); }
  const uint16_t* k_staging(int64_t layer, int64_t chunk_start) const {
    return const_cast<SequenceKv*>(this)->staging(layer, chunk_start);
  }
  // q4k: how many staged rows per layer are valid (n_tokens % C); 0 for the row formats.
  int64_t staged_tokens() const { return layout_.format.KeysByChannel() ? n_tokens_ % layout_.format.chunk : 0; }

 private:
  uint8_t* row(int64_t layer, int kv, int64_t pos) {
    const int64_t b = pos / layout_.block_tokens;
    return table_[b]->data + layer * (layout_.k_plane_bytes() + layout_.plane_bytes()) + kv * layout_.k_plane_bytes() +
           (pos % layout_.block_tokens) * layout_.row_bytes();
  }
  uint8_t* chunk(int64_t layer, int64_t c) {
    const int64_t per_block = layout_.block_tokens / layout_.format.chunk;
    return table_[c / per_block]->data + layer * (layout_.k_plane_bytes() + layout_.plane_bytes()) +
           (c % per_block) * layout_.chunk_bytes();
  }
  uint16_t* staging(int64_t layer, int64_t chunk_start) {
    uint8_t* base = table_[chunk_start / layout_.block_tokens]->data + layout_.block_bytes();
    return reinterpret_cast<uint16_t*>(base) + layer * layout_.format.chunk * layout_.row_values();
  }
  // q4k: a writable block's allocation (with the staging area), and trimming it to the planes.
  int64_t writable_block_bytes() const { return layout_.tail_block_bytes(); }
  void TrimFullBlocks();
  // q4k, after Truncate: decodes the kept positions of the complete chunk that holds n_tokens
  // into the staging area (see Truncate).
  void Restage();

  KvLayout layout_;
  int64_t max_tokens_;
  int64_t n_tokens_ = 0;
  std::unique_ptr<BlockPool> own_pool_;  // when constructed without a pool
  BlockPool* pool_;
  std::vector<PoolBlock*> table_;  // one reference held per entry
  bool restage_ = false;           // q4k: Truncate cut a complete chunk (see Restage)
};

}  // namespace kvfs
