// Internal to safetensors*.cpp: the per-KV-type table of fields (how a group of a row splits
// into tensors), the tensor plan both directions agree on, and the copy loops between rows and
// field tensors. A new row format is a new table entry here; q4k, whose keys are not rows, has
// its own tensor list (kQ4kTensors) and copy code (safetensors_q4k.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <xxhash.h>

#include "engine/store/safetensors.h"

namespace kvfs::store::st {

inline constexpr std::string_view kSource = "kv.safetensors";
inline constexpr std::string_view kFormat = "kvfs-kv";
// The version written. "2" differs from "1" in one thing only: its data's checksum
// (kPayloadHashKey) is required. Exports of version 1 (before 2026-12-01) carry it since
// 2026-11-29 and lack it before; they are still read, the checksum checked where present.
inline constexpr std::string_view kFormatVersion = "2";
inline constexpr std::string_view kFormatVersionOptionalHash = "1";
inline constexpr std::string_view kMetadataKey = "__metadata__";
// Every key the writer emits and the reader requires.
inline constexpr std::string_view kMetaKeys[] = {
    "format",  "format_version", "model_fingerprint", "kv_format", "group_size", "rotation",
    "n_layer", "n_head_kv",      "head_dim",          "n_cached",  "token_ids",  "conversation"};
// A JSON header larger than this is refused before parsing (the safetensors reference reader
// uses the same bound): token ids and text of even a 128K-token agent stay far below it.
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
// Geometry bounds: keep every size product far from int64 overflow.
inline constexpr int64_t kMaxDim = int64_t{1} << 16;

enum class FieldShape {
  kPerGroup,        // [n, ng]: one element per group (a scale, a minimum)
  kPerGroupVector,  // [n, ng, field_bytes / elem_bytes]: codes
  kPerValue,        // [n, n_head_kv, head_dim]: the whole row is the field (f16)
};

// One field of a group: bytes [offset, offset + fixed_bytes + G * half_bytes_per_value / 2).
// Variable-size fields come last in a group, so offsets are constants.
struct FieldSpec {
  std::string_view suffix;  // appended to "layers.{i}.{k|v}"
  std::string_view dtype;   // safetensors dtype name
  int64_t elem_bytes;
  int64_t offset;
  int64_t fixed_bytes;
  int64_t half_bytes_per_value;
  FieldShape shape;
  int64_t Bytes(int64_t group) const { return fixed_bytes + group * half_bytes_per_value / 2; }
};

struct KvTypeSpec {
  std::string_view name;
  std::span<const FieldSpec> fields;  // in file order
  bool needs_even_group;              // nibble packing
};

inline constexpr FieldSpec kF16Fields[] = {{"", "F16", 2, 0, 0, 4, FieldShape::kPerValue}};
inline constexpr FieldSpec kQ8Fields[] = {{".codes", "I8", 1, 2, 0, 2, FieldShape::kPerGroupVector},
                                          {".scales", "F16", 2, 0, 2, 0, FieldShape::kPerGroup}};
inline constexpr FieldSpec kQ4Fields[] = {{".codes", "U8", 1, 4, 0, 1, FieldShape::kPerGroupVector},
                                          {".scales", "F16", 2, 0, 2, 0, FieldShape::kPerGroup},
                                          {".mins", "F16", 2, 2, 2, 0, FieldShape::kPerGroup}};
inline constexpr KvTypeSpec kKvTypes[] = {
    {"f16", kF16Fields, false}, {"q8", kQ8Fields, false}, {"q4", kQ4Fields, true}, {"q4k", {}, true}};

// q4k (safetensors.h lists the tensors; kv_format.h the bytes). Keys: a K chunk is nv channel
// records, each the q4 group layout with G = C (scale, min, C/2 bytes of nibbles); the staged
// f16 rows follow the layers (kv_payload_layout.h). Values: a row header (D, M), then quads of
// sub-blocks (5 bytes of packed fields, then the quad's nibbles; offsets: Q4kFieldsOffset).
inline constexpr std::string_view kQ4kType = "q4k";
inline constexpr std::string_view kChunkMetaKey = "k_chunk_tokens";  // required for q4k only
// Optional: the exact text behind all token_ids (written only when the exporter knows it and
// every token is cached), so an importer can extend the context by characters.
inline constexpr std::string_view kContextTextKey = "context_text";
// Optional, with context_text: per token id, the bytes of context_text up to the end of the
// token's text, as differences from the previous token's end (-1: a token with no end of its
// own in the text); a JSON array of integers. Lets an importer match a changed context by
// characters token by token, as the agent that exported it would.
inline constexpr std::string_view kTokenEndsKey = "token_ends";
// XXH3-64 of the data buffer, 16 lowercase hex digits, so that a damaged copy is refused instead
// of imported as attention state. Required from format_version 2 on (a file that lost the key
// would otherwise import damaged data unchecked); in version 1 files, checked when present.
inline constexpr std::string_view kPayloadHashKey = "payload_xxh3_64";
inline constexpr int kPayloadHashDigits = 16;
inline constexpr int64_t kQ4kMaxChunk = 4096;
inline constexpr int64_t kQ4kRecordScale = 0, kQ4kRecordMin = 2, kQ4kRecordCodes = 4;  // in a K record
inline constexpr int64_t kQ4kRowScaleUnit = 0, kQ4kRowMinUnit = 2;                      // in a V row
inline constexpr int64_t kQ4kSubFieldBytes = 5;                                         // per quad
enum class Q4kPart { kNone, kKCodes, kKScales, kKMins, kKStaged, kVCodes, kVScaleUnits, kVMinUnits, kVSubFields };
struct Q4kTensorSpec {
  std::string_view suffix;  // appended to "layers.{i}"
  std::string_view dtype;
  int64_t elem_bytes;
  Q4kPart part;
};
// In file order, per layer.
inline constexpr Q4kTensorSpec kQ4kTensors[] = {
    {".k.codes", "U8", 1, Q4kPart::kKCodes},        {".k.scales", "F16", 2, Q4kPart::kKScales},
    {".k.mins", "F16", 2, Q4kPart::kKMins},         {".k.staged", "F16", 2, Q4kPart::kKStaged},
    {".v.codes", "U8", 1, Q4kPart::kVCodes},        {".v.scale_units", "F16", 2, Q4kPart::kVScaleUnits},
    {".v.min_units", "F16", 2, Q4kPart::kVMinUnits}, {".v.sub_fields", "U8", 1, Q4kPart::kVSubFields}};

inline const KvTypeSpec* FindKvType(std::string_view name) {
  for (const auto& t : kKvTypes)
    if (t.name == name) return &t;
  return nullptr;
}

inline int64_t GroupBytes(const KvTypeSpec& t, int64_t group) {
  int64_t sum = 0;
  for (const auto& f : t.fields) sum += f.Bytes(group);
  return sum;
}

// One tensor of the file, in file order.
struct TensorPlan {
  std::string name;
  const FieldSpec* field;  // row formats; nullptr for q4k
  int64_t layer;
  int plane;  // 0 = k, 1 = v
  std::vector<int64_t> shape;
  int64_t bytes;
  std::string_view dtype;
  Q4kPart part = Q4kPart::kNone;
};

std::vector<TensorPlan> PlanQ4kTensors(const KvGeometry& g, int64_t n_cached);

inline std::vector<TensorPlan> PlanTensors(const KvGeometry& g, const KvTypeSpec& t, int64_t n_cached) {
  if (t.name == kQ4kType) return PlanQ4kTensors(g, n_cached);
  const int64_t ng = g.n_head_kv * g.head_dim / g.group;
  std::vector<TensorPlan> plan;
  plan.reserve(static_cast<size_t>(g.n_layer) * 2 * t.fields.size());
  for (int64_t layer = 0; layer < g.n_layer; ++layer) {
    for (int plane = 0; plane < 2; ++plane) {
      for (const FieldSpec& f : t.fields) {
        TensorPlan p{"layers." + std::to_string(layer) + (plane == 0 ? ".k" : ".v") + std::string(f.suffix), &f, layer,
                     plane, {}, 0, f.dtype};
        const int64_t fb = f.Bytes(g.group);
        switch (f.shape) {
          case FieldShape::kPerGroup: p.shape = {n_cached, ng}; break;
          case FieldShape::kPerGroupVector: p.shape = {n_cached, ng, fb / f.elem_bytes}; break;
          case FieldShape::kPerValue: p.shape = {n_cached, g.n_head_kv, g.head_dim}; break;
        }
        p.bytes = n_cached * ng * fb;
        plan.push_back(std::move(p));
      }
    }
  }
  return plan;
}

// Copies field bytes [offset, offset + LEN) of `count` consecutive groups of `group_bytes` to a
// dense array (Gather) or back (Scatter). LEN fixed at compile time for the common sizes so the
// per-group copy is a register move rather than a memcpy call.
template <int64_t LEN>
void GatherFixed(const uint8_t* src, int64_t count, int64_t group_bytes, uint8_t* dst) {
  for (int64_t k = 0; k < count; ++k, src += group_bytes, dst += LEN) std::memcpy(dst, src, LEN);
}
template <int64_t LEN>
void ScatterFixed(const uint8_t* src, int64_t count, int64_t group_bytes, uint8_t* dst) {
  for (int64_t k = 0; k < count; ++k, src += LEN, dst += group_bytes) std::memcpy(dst, src, LEN);
}

// kPayloadHashKey's value for a data buffer.
inline std::string PayloadHashHex(const void* data, size_t bytes) {
  const uint64_t h = XXH3_64bits(data, bytes);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(kPayloadHashDigits, '0');
  for (int i = 0; i < kPayloadHashDigits; ++i) out[static_cast<size_t>(i)] = kHex[(h >> (60 - 4 * i)) & 0xF];
  return out;
}

inline void GatherField(const uint8_t* groups, int64_t count, int64_t group_bytes, int64_t offset, int64_t len,
                        uint8_t* dst) {
  if (count == 0) return;  // spans of empty chunks may hold null pointers
  if (len == group_bytes) {  // the field is the whole row (f16): one copy
    std::memcpy(dst, groups, static_cast<size_t>(count * len));
    return;
  }
  const uint8_t* src = groups + offset;
  switch (len) {
    case 2: return GatherFixed<2>(src, count, group_bytes, dst);
    case 4: return GatherFixed<4>(src, count, group_bytes, dst);
    case 8: return GatherFixed<8>(src, count, group_bytes, dst);
    case 16: return GatherFixed<16>(src, count, group_bytes, dst);
    case 32: return GatherFixed<32>(src, count, group_bytes, dst);
    case 64: return GatherFixed<64>(src, count, group_bytes, dst);
    default:
      for (int64_t k = 0; k < count; ++k) std::memcpy(dst + k * len, src + k * group_bytes, static_cast<size_t>(len));
  }
}

inline void ScatterField(const uint8_t* src, int64_t count, int64_t group_bytes, int64_t offset, int64_t len,
                         uint8_t* groups) {
  if (count == 0) return;
  if (len == group_bytes) {
    std::memcpy(groups, src, static_cast<size_t>(count * len));
    return;
  }
  uint8_t* dst = groups + offset;
  switch (len) {
    case 2: return ScatterFixed<2>(src, count, group_bytes, dst);
    case 4: return ScatterFixed<4>(src, count, group_bytes, dst);
    case 8: return ScatterFixed<8>(src, count, group_bytes, dst);
    case 16: return ScatterFixed<16>(src, count, group_bytes, dst);
    case 32: return ScatterFixed<32>(src, count, group_bytes, dst);
    case 64: return ScatterFixed<64>(src, count, group_bytes, dst);
    default:
      for (int64_t k = 0; k < count; ++k) std::memcpy(dst + k * group_bytes, src + k * len, static_cast<size_t>(len));
  }
}

// q4k: copies tensor p's part of the packed chunk `payload` of n tokens starting at token
// `first` (a multiple of C) between the payload and the tensor's data `tensor` (to_tensor
// picks the direction). The staged rows of a chunk are the tensor's first rows: only the last
// chunk of a cache has any.
void CopyQ4kPart(const TensorPlan& p, const KvGeometry& g, uint8_t* payload, int64_t n, int64_t first, uint8_t* tensor,
                 bool to_tensor);

}  // namespace kvfs::store::st
