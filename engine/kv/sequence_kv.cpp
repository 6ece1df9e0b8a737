#include "engine/kv/sequence_kv.h"

#include <algorithm>
#include <cstring>

#include <spdlog/fmt/fmt.h>

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
}

void SequenceKv::SetBlock(int64_t i, PoolBlock* b) {
  if (i == n_blocks()) {
    table_.push_back(b);
    return;
  }
  pool_->Release(table_[i]);
  table_[i] = b;
}

void SequenceKv::Truncate(int64_t n) {
  if (n >= n_tokens_) return;
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
  const int64_t B = layout_.block_tokens;
  const int64_t need = (n + B - 1) / B;
  // Blocks that will receive positions [n_tokens, n) must be private: copy shared or named ones.
  for (int64_t i = n_tokens_ / B; i < std::min(need, n_blocks()); ++i) {
    PoolBlock* b = table_[i];
    if (!pool_->IsWritable(b)) {
      KVFS_ASSIGN_OR_RETURN(PoolBlock* copy, pool_->Allocate(layout_.block_bytes()));
      std::memcpy(copy->data, b->data, static_cast<size_t>(layout_.block_bytes()));
      SetBlock(i, copy);
    }
  }
  while (n_blocks() < need) {
    KVFS_ASSIGN_OR_RETURN(PoolBlock* b, pool_->Allocate(layout_.block_bytes()));
    table_.push_back(b);
  }
  return Status::Ok();
}

}  // namespace kvfs
