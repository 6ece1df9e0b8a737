#include "engine/kv/sequence_kv.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <spdlog/fmt/fmt.h>

namespace kvfs {

SequenceKv::SequenceKv(const KvLayout& layout, int64_t max_tokens)
    : layout_(layout), max_tokens_(max_tokens) {}

SequenceKv::~SequenceKv() {
  for (uint8_t* b : blocks_) {
    // Zeroed before release: a conversation's attention state must not linger in freed memory.
    std::memset(b, 0, static_cast<size_t>(layout_.block_bytes()));
    std::free(b);
  }
}

Status SequenceKv::Reserve(int64_t n) {
  if (n > max_tokens_) {
    return OutOfRange(fmt::format("{} tokens exceed the context size of {}", n, max_tokens_));
  }
  const int64_t need = (n + layout_.block_tokens - 1) / layout_.block_tokens;
  const size_t bytes = (static_cast<size_t>(layout_.block_bytes()) + 63) / 64 * 64;
  while (static_cast<int64_t>(blocks_.size()) < need) {
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) return Status(StatusCode::kResourceExhausted, "out of memory for KV blocks");
    blocks_.push_back(static_cast<uint8_t*>(p));
  }
  return Status::Ok();
}

}  // namespace kvfs
