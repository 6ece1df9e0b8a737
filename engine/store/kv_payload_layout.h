// The "packed KV chunk": how n tokens of one agent's KV cache are laid out in a block file, a
// tail file, and the chunks that kv.safetensors export/import exchanges with the engine. Layout
// only (sizes and offsets); the byte formats of rows and K chunks are in engine/kv/kv_format.h.
// Changing this changes the block and tail file formats: bump kBlockFormatVersion.
//
// A chunk of n tokens, for a model of L layers:
//   for each layer l in 0..L-1:
//     K part: row formats (f16, q8, q4): n K rows of row_bytes
//             q4k: floor(n / C) complete K chunks of chunk_bytes (C tokens each, kv_format.h)
//     V part: n V rows of row_bytes (q4k: q4k V rows)
//   q4k only, after every layer: the staged K rows of the incomplete chunk, for each layer l,
//     n % C rows of row_values halfs (f16, not rotated): position floor(n / C) * C + r in row r.
// A full block (n = block_tokens, a multiple of C) has no staged rows: it is exactly the pool's
// block planes (engine/kv/sequence_kv.h), so blocks are stored and loaded by one copy. A
// partial tail carries its staged rows, so the f16 keys of the chunk being filled survive
// parking, persistence, restart and export: nothing of the cache is recomputed or re-quantized
// when it is resumed.
#pragma once

#include <cstdint>

namespace kvfs::store {

struct KvPayloadGeometry {
  int64_t n_layer = 0;
  int64_t row_bytes = 0;         // one K (row formats) or V row
  int64_t chunk_tokens = 0;      // q4k: C; 0 when keys are rows
  int64_t chunk_bytes = 0;       // q4k: one K chunk of C tokens
  int64_t staged_row_bytes = 0;  // q4k: one staged f16 K row (row_values * 2)

  bool keys_by_chunk() const { return chunk_tokens > 0; }
  int64_t complete_chunks(int64_t n) const { return keys_by_chunk() ? n / chunk_tokens : 0; }
  int64_t staged_rows(int64_t n) const { return keys_by_chunk() ? n % chunk_tokens : 0; }
  int64_t k_bytes(int64_t n) const { return keys_by_chunk() ? complete_chunks(n) * chunk_bytes : n * row_bytes; }
  int64_t v_bytes(int64_t n) const { return n * row_bytes; }
  int64_t layer_bytes(int64_t n) const { return k_bytes(n) + v_bytes(n); }
  // Offsets within a chunk of n tokens.
  int64_t k_offset(int64_t n, int64_t layer) const { return layer * layer_bytes(n); }
  int64_t v_offset(int64_t n, int64_t layer) const { return layer * layer_bytes(n) + k_bytes(n); }
  int64_t staged_offset(int64_t n, int64_t layer) const {
    return n_layer * layer_bytes(n) + layer * staged_rows(n) * staged_row_bytes;
  }
  int64_t bytes(int64_t n) const { return n_layer * (layer_bytes(n) + staged_rows(n) * staged_row_bytes); }
};

}  // namespace kvfs::store
