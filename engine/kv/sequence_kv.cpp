#include "engine/kv/sequence_kv.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "engine/model/quants.h"

namespace kvfs {

SequenceKv::SequenceKv(const KvLayout& layout, int64_t max_tokens)
    : layout_(layout), max_tokens_(max_tokens),
      own_pool_(std::make_unique<BlockPool>(0)), pool_(own_pool_.get()) {}

SequenceKv::SequenceKv(const KvLayout& layout, int64_t max_tokens, BlockPool& pool)
    : layout_(layout), max_tokens_(max_tokens), pool_(&pool) {}

SequenceKv::~SequenceKv() { Clear(); }

void SequenceKv::Clear() {
  for (PoolBlock* b : table_) pool_->Release(b);
  table_.clear();
  n_tokens_ = 0;
  restage_ = false;
}

void SequenceKv::SetBlock(int64_t i, PoolBlock* b) {
  if (i == n_blocks()) {
    table_.push_back(b);
    return;
  }
  pool_->Release(table_[i]);
  table_[i] = b;
}

void SequenceKv::SetTokens(int64_t n) {
  n_tokens_ = n;
  TrimFullBlocks();
}

void SequenceKv::TrimFullBlocks() {
  if (!layout_.format.KeysByChannel()) return;
  const int64_t full = std::min(n_tokens_ / layout_.block_tokens, n_blocks());
  for (int64_t i = 0; i < full; ++i) {
    PoolBlock* b = table_[i];
    // Only blocks this sequence wrote carry a staging area; named ones are already exact.
    if (b->bytes > (layout_.block_bytes() + 63) / 64 * 64 && pool_->IsWritable(b)) pool_->Shrink(b, layout_.block_bytes());
  }
}

void SequenceKv::NameBlock(int64_t i, const BlockHash& key) {
  if ((i + 1) * layout_.block_tokens <= n_tokens_ && layout_.format.KeysByChannel() && pool_->IsWritable(table_[i])) {
    pool_->Shrink(table_[i], layout_.block_bytes());
  }
  table_[i] = pool_->Name(table_[i], key);
}

void SequenceKv::Truncate(int64_t n) {
  if (n >= n_tokens_) return;
  const KvFormat& f = layout_.format;
  // q4k: the cut lands inside a complete K chunk, whose rows are no longer staged.
  if (f.KeysByChannel() && n % f.chunk != 0 && (n / f.chunk + 1) * f.chunk <= n_tokens_) restage_ = true;
  n_tokens_ = n;
  const int64_t keep = (n + layout_.block_tokens - 1) / layout_.block_tokens;
  while (n_blocks() > keep) {
    pool_->Release(table_.back());
    table_.pop_back();
  }
}

Status SequenceKv::Reserve(int64_t n) {
  if (n > max_tokens_) {
    return OutOfRange(fmt::format("{} tokens exceed the context size of {}", n, max_tokens_));
  }
  if (layout_.format.KeysByChannel() &&
      (layout_.format.chunk <= 0 || layout_.block_tokens % layout_.format.chunk != 0)) {
    return InvalidArgument(fmt::format("q4k chunks of {} tokens do not divide KV blocks of {}", layout_.format.chunk,
                                       layout_.block_tokens));
  }
  const int64_t B = layout_.block_tokens;
  const int64_t need = (n + B - 1) / B;
  const int64_t bytes = writable_block_bytes();
  // Blocks that will receive positions [n_tokens, n) must be private: copy shared or named ones.
  // A block without a staging area (a full block, now cut) gets one; the copy takes the staging
  // area along when the source has one (a parked or shared partial tail).
  for (int64_t i = n_tokens_ / B; i < std::min(need, n_blocks()); ++i) {
    PoolBlock* b = table_[i];
    if (!pool_->IsWritable(b) || b->bytes < bytes) {
      KVFS_ASSIGN_OR_RETURN(PoolBlock* copy, pool_->Allocate(bytes));
      std::memcpy(copy->data, b->data, static_cast<size_t>(std::min(b->bytes, bytes)));
      if (b->bytes < bytes) std::memset(copy->data + b->bytes, 0, static_cast<size_t>(bytes - b->bytes));
      SetBlock(i, copy);
    }
  }
  while (n_blocks() < need) {
    KVFS_ASSIGN_OR_RETURN(PoolBlock* b, pool_->Allocate(bytes));
    table_.push_back(b);
  }
  if (restage_ && n > n_tokens_) Restage();  // the block holding n_tokens is writable now
  return Status::Ok();
}

void SequenceKv::Restage() {
  restage_ = false;
  const KvFormat& f = layout_.format;
  const int64_t C = f.chunk, start = n_tokens_ / C * C, kept = n_tokens_ % C;
  if (kept == 0 || start / layout_.block_tokens >= n_blocks()) return;
  const int64_t nv = layout_.row_values();
  std::vector<float> x(static_cast<size_t>(nv));
  for (int64_t layer = 0; layer < layout_.n_layer; ++layer) {
    uint16_t* dst = k_staging(layer, start);
    for (int64_t t = 0; t < kept; ++t) {
      KvDequantizeKChunk(f, k_chunk(layer, start / C), t, 0, nv, x.data());
      for (int64_t i = 0; i < nv; ++i) dst[t * nv + i] = Fp32ToFp16(x[i]);
    }
  }
}

}  // namespace kvfs
