#include "engine/kv/kv_payload.h"

#include <cstring>

namespace kvfs {

store::KvPayloadGeometry KvPayloadOf(const KvLayout& l) {
  store::KvPayloadGeometry g;
  g.n_layer = l.n_layer;
  g.row_bytes = l.row_bytes();
  if (l.format.KeysByChannel()) {
    g.chunk_tokens = l.format.chunk;
    g.chunk_bytes = l.chunk_bytes();
    g.staged_row_bytes = l.row_values() * 2;
  }
  return g;
}

namespace {

// Pool block offsets (sequence_kv.h): per layer a K plane and a V plane, then the staging
// area of C rows per layer.
int64_t PoolK(const KvLayout& l, int64_t layer) { return layer * (l.k_plane_bytes() + l.plane_bytes()); }
int64_t PoolV(const KvLayout& l, int64_t layer) { return PoolK(l, layer) + l.k_plane_bytes(); }
int64_t PoolStaging(const KvLayout& l, int64_t layer) {
  return l.block_bytes() + layer * l.format.chunk * l.row_values() * 2;
}

// Copies between a pool block and a packed tail of n tokens; to_packed picks the direction.
void CopyTail(const KvLayout& l, const store::KvPayloadGeometry& g, int64_t n, uint8_t* block, uint8_t* packed,
              bool to_packed) {
  auto copy = [&](int64_t block_off, int64_t packed_off, int64_t bytes) {
    if (bytes == 0) return;
    if (to_packed) std::memcpy(packed + packed_off, block + block_off, static_cast<size_t>(bytes));
    else std::memcpy(block + block_off, packed + packed_off, static_cast<size_t>(bytes));
  };
  for (int64_t layer = 0; layer < l.n_layer; ++layer) {
    copy(PoolK(l, layer), g.k_offset(n, layer), g.k_bytes(n));
    copy(PoolV(l, layer), g.v_offset(n, layer), g.v_bytes(n));
    if (g.keys_by_chunk()) copy(PoolStaging(l, layer), g.staged_offset(n, layer), g.staged_rows(n) * g.staged_row_bytes);
  }
}

}  // namespace

void CompactTail(const KvLayout& l, const uint8_t* block, int64_t n, std::vector<uint8_t>& out) {
  const store::KvPayloadGeometry g = KvPayloadOf(l);
  out.resize(static_cast<size_t>(g.bytes(n)));
  CopyTail(l, g, n, const_cast<uint8_t*>(block), out.data(), /*to_packed=*/true);
}

bool ExpandTail(const KvLayout& l, std::span<const uint8_t> tail, int64_t n, uint8_t* block) {
  const store::KvPayloadGeometry g = KvPayloadOf(l);
  if (n < 0 || n >= l.block_tokens || tail.size() != static_cast<size_t>(g.bytes(n))) return false;
  CopyTail(l, g, n, block, const_cast<uint8_t*>(tail.data()), /*to_packed=*/false);
  return true;
}

}  // namespace kvfs
