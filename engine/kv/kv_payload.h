// Moves a partial tail block between the pool's block layout (sequence_kv.h: planes, then the
// q4k staging area) and the packed KV chunk of tail files and exports (store/kv_payload_layout.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/sequence_kv.h"
#include "engine/store/kv_payload_layout.h"

namespace kvfs {

// The packed-chunk geometry of a layout.
store::KvPayloadGeometry KvPayloadOf(const KvLayout& layout);

// The first n tokens of a pool block (n < block_tokens), with its staged K rows, packed.
void CompactTail(const KvLayout& layout, const uint8_t* block, int64_t n, std::vector<uint8_t>& out);
// Unpacks a tail of n tokens into a pool block of at least layout.tail_block_bytes(); false when
// `tail` is not exactly the packed size of n tokens.
bool ExpandTail(const KvLayout& layout, std::span<const uint8_t> tail, int64_t n, uint8_t* block);

}  // namespace kvfs
