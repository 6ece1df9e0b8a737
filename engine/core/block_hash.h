// A KV block's 128-bit name: the hash chain value of the KV layer (block_pool.h), which the
// store also uses as the block's file name. Hex form: 32 lowercase digits, hi first, equal to
// xxh3-128's canonical representation (store/block_file.h: ToHex, BlockHashFromHex).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>

namespace kvfs {

struct BlockHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  friend auto operator<=>(const BlockHash&, const BlockHash&) = default;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

}  // namespace kvfs
