// kv.safetensors for q4k (tensors: safetensors.h): the tensor plan and the copies between
// packed chunks (kv_payload_layout.h) and tensors, both directions.
#include <cstring>
#include <string>

#include "engine/kv/kv_format.h"
#include "engine/store/safetensors.h"
#include "engine/store/safetensors_layout.h"

namespace kvfs::store::st {
namespace {

int64_t SubBlocks(const KvGeometry& g) { return g.n_head_kv * g.head_dim / g.group; }
int64_t Quads(const KvGeometry& g) { return (SubBlocks(g) + 3) / 4; }

}  // namespace

std::vector<TensorPlan> PlanQ4kTensors(const KvGeometry& g, int64_t n_cached) {
  const int64_t nv = g.n_head_kv * g.head_dim, C = g.chunk;
  const int64_t nc = n_cached / C, ns = n_cached % C;
  std::vector<TensorPlan> plan;
  for (int64_t layer = 0; layer < g.n_layer; ++layer) {
    for (const Q4kTensorSpec& t : kQ4kTensors) {
      std::vector<int64_t> shape;
      switch (t.part) {
        case Q4kPart::kKCodes: shape = {nc, nv, C / 2}; break;
        case Q4kPart::kKScales:
        case Q4kPart::kKMins: shape = {nc, nv}; break;
        case Q4kPart::kKStaged: shape = {ns, g.n_head_kv, g.head_dim}; break;
        case Q4kPart::kVCodes: shape = {n_cached, SubBlocks(g), g.group / 2}; break;
        case Q4kPart::kVScaleUnits:
        case Q4kPart::kVMinUnits: shape = {n_cached}; break;
        case Q4kPart::kVSubFields: shape = {n_cached, Quads(g), kQ4kSubFieldBytes}; break;
        case Q4kPart::kNone: break;
      }
      int64_t bytes = t.elem_bytes;
      for (int64_t d : shape) bytes *= d;
      plan.push_back(TensorPlan{"layers." + std::to_string(layer) + std::string(t.suffix), nullptr, layer,
                                t.part >= Q4kPart::kVCodes ? 1 : 0, std::move(shape), bytes, t.dtype, t.part});
    }
  }
  return plan;
}

void CopyQ4kPart(const TensorPlan& p, const KvGeometry& g, uint8_t* payload, int64_t n, int64_t first, uint8_t* tensor,
                 bool to_tensor) {
  const KvPayloadGeometry pg = KvPayloadOf(g);
  const int64_t nv = g.n_head_kv * g.head_dim, C = g.chunk, S = g.group;
  const int64_t record = kQ4kRecordCodes + C / 2;
  // Field [offset, offset + len) of `count` items `stride` bytes apart <-> a dense array.
  auto fields = [&](uint8_t* items, int64_t count, int64_t stride, int64_t offset, int64_t len, uint8_t* dense) {
    if (to_tensor) GatherField(items, count, stride, offset, len, dense);
    else ScatterField(dense, count, stride, offset, len, items);
  };
  auto bytes = [&](uint8_t* at, uint8_t* dense, int64_t len) {
    if (len == 0) return;
    if (to_tensor) std::memcpy(dense, at, static_cast<size_t>(len));
    else std::memcpy(at, dense, static_cast<size_t>(len));
  };
  uint8_t* k = payload + pg.k_offset(n, p.layer);
  uint8_t* v = payload + pg.v_offset(n, p.layer);
  const int64_t records = pg.complete_chunks(n) * nv, first_record = first / C * nv;
  switch (p.part) {
    case Q4kPart::kKCodes:
      return fields(k, records, record, kQ4kRecordCodes, C / 2, tensor + first_record * (C / 2));
    case Q4kPart::kKScales:
      return fields(k, records, record, kQ4kRecordScale, 2, tensor + first_record * 2);
    case Q4kPart::kKMins:
      return fields(k, records, record, kQ4kRecordMin, 2, tensor + first_record * 2);
    case Q4kPart::kKStaged:
      return bytes(payload + pg.staged_offset(n, p.layer), tensor, pg.staged_rows(n) * pg.staged_row_bytes);
    case Q4kPart::kVScaleUnits:
      return fields(v, n, pg.row_bytes, kQ4kRowScaleUnit, 2, tensor + first * 2);
    case Q4kPart::kVMinUnits:
      return fields(v, n, pg.row_bytes, kQ4kRowMinUnit, 2, tensor + first * 2);
    case Q4kPart::kVSubFields: {
      const int64_t nq = (nv / S + 3) / 4;
      uint8_t* dense = tensor + first * nq * kQ4kSubFieldBytes;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t q = 0; q < nq; ++q, dense += kQ4kSubFieldBytes)
          bytes(v + r * pg.row_bytes + Q4kFieldsOffset(S, 4 * q), dense, kQ4kSubFieldBytes);
      return;
    }
    case Q4kPart::kVCodes: {
      const int64_t nsub = nv / S;
      uint8_t* dense = tensor + first * nsub * (S / 2);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < nsub; ++j, dense += S / 2) bytes(v + r * pg.row_bytes + Q4kCodesOffset(S, j), dense, S / 2);
      return;
    }
    case Q4kPart::kNone: return;
  }
}

}  // namespace kvfs::store::st
