// Ops that encode new K/V rows into the stored KV formats, in place in the device planes:
// kv_store (every format's rows; q4k's V rows and staged keys), k_stage (q4k keys staged as f16
// rows) and k_chunks (q4k's complete chunks of keys, per channel). Attention over the planes is
// in vk_attention_ops.cpp.
#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_ops_common.h"

namespace kvfs::vk {

using namespace ops_detail;

namespace {

// Push-constant blocks, field for field the `Params` of each shader.
struct KvStoreParams {
  uint32_t n_tokens, pos0, src_stride, src_row0, block_tokens, table0;
  float hadamard_scale;
  uint32_t n_rot, stage_keys, key_row0;
  uint32_t mirror, mirror_word0[2], mirror_pos0[2];
  uint32_t entry0, layer;
};
static_assert(sizeof(Ops::KvStoreEntry) == 28);  // kv_store.comp's KvStoreEntry (std430: 7 words)
struct KStageParams {
  uint32_t n_tokens, row_words, src_stride, src_row0, dst_row0;
};
struct KChunksParams {
  uint32_t n_channels, chunk0, n_chunks, key_row0, key_pos0, block_tokens, table0, slot_words;
};

constexpr ShaderInterface kKvStore{"kv_store", 8, sizeof(KvStoreParams)};
constexpr ShaderInterface kKStage{"k_stage", 2, sizeof(KStageParams)};
constexpr ShaderInterface kKChunks{"k_chunks", 3, sizeof(KChunksParams)};

int64_t KvRowWords(const KvView& kv) { return kv.row_stride / 4; }

// Heads per kv_store workgroup: the fewest that hold whole groups and end at a word boundary,
// so a decode step's row spreads over several workgroups; the whole row for q4k (row-wide
// units) and for groups that span heads.
int64_t KvSegmentHeads(const KvFormat& f, const AttentionShape& shape) {
  if (f.type == KvType::kQ4K || shape.head_dim % f.group != 0) return shape.n_head_kv;
  const int64_t head_bytes = f.RowBytes(shape.head_dim);
  for (int64_t h = 1; h < shape.n_head_kv; ++h) {
    if (shape.n_head_kv % h == 0 && h * head_bytes % 4 == 0) return h;
  }
  return shape.n_head_kv;
}

}  // namespace

// Invocations of a kv_store workgroup: q4k rows spread their sub-blocks' 16 candidates over
// 256 (a decode step's V row is one workgroup), the other formats take a group or a word each.
uint32_t Ops::KvStoreGroup(const KvFormat& f) const {
  const uint32_t most = std::min(ctx_.limits().max_group_size_x, ctx_.limits().max_group_invocations);
  return f.type == KvType::kQ4K ? std::min<uint32_t>(256, most) : kElementwiseGroup;
}

Status Ops::KvStore(Recorder& rec, const KvView& kv, const Buffer& plane, const AttentionShape& shape,
                    const Buffer& src, int64_t src_stride, int64_t src_row0, int64_t n_tokens, int64_t pos0) {
  const KvStoreRows rows[] = {{&src, &plane}};
  return KvStoreRowsOf(rec, kv, shape, rows, src_stride, src_row0, n_tokens, pos0, nullptr, nullptr);
}

Status Ops::KvStoreBoth(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& k_src,
                        const Buffer& v_src, int64_t src_stride, int64_t src_row0, int64_t n_tokens, int64_t pos0,
                        const RopeTable* k_rope, const KvMirror* mirror) {
  // q4k: the keys go to the pass's f16 key rows (kv_store stages them as KStage does).
  const KvStoreRows rows[] = {{&k_src, kv.format.KeysByChannel() ? kv.keys : kv.k_plane}, {&v_src, kv.v_plane}};
  return KvStoreRowsOf(rec, kv, shape, rows, src_stride, src_row0, n_tokens, pos0, k_rope, mirror);
}

Result<Ops::KvStoreEntry> Ops::KvStoreEntryFor(const KvView& kv, const AttentionShape& shape, int64_t src_row,
                                               int64_t pos, const KvMirror* mirror) {
  KvStoreEntry e;
  e.src_row = U32(src_row);
  e.pos = U32(pos);
  e.table0 = kv.table0;
  const bool q4k = kv.format.KeysByChannel();
  e.key_row = q4k ? U32(kv.key_row0 + pos - kv.key_pos0) : 0u;
  if (mirror == nullptr || mirror->buffer == nullptr) return e;
  // Row bytes in the mirror as in kv_store.comp: q4k's staged keys are f16 rows.
  const int64_t row_bytes[2] = {q4k ? shape.n_head_kv * shape.head_dim * 2 : kv.row_stride, kv.row_stride};
  if (mirror->layer_bytes % 4 != 0) return Internal("kv_store's mirror layers must start at whole words");
  for (size_t i = 0; i < 2; ++i) {
    if (mirror->bytes0[i] < 0 || pos < mirror->pos0[i]) continue;
    const int64_t at = mirror->bytes0[i] + (pos - mirror->pos0[i]) * row_bytes[i];
    if (at % 4 != 0) return Internal("kv_store's mirror rows must start at whole words");
    e.mirror_word[i] = U32(at / 4);
  }
  e.mirror_layer_words = U32(mirror->layer_bytes / 4);
  return e;
}

Status Ops::KvStoreBatch(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& k_src,
                         const Buffer& v_src, int64_t src_stride, const Buffer& entries, int64_t entry0,
                         int64_t n_entries, int64_t layer, const RopeTable* k_rope, const Buffer* mirror) {
  const KvStoreRows rows[] = {{&k_src, kv.format.KeysByChannel() ? kv.keys : kv.k_plane}, {&v_src, kv.v_plane}};
  KvMirror all;  // the entries say which rows; both planes may be
  all.buffer = mirror;
  all.bytes0 = {0, 0};
  const KvStoreTable table{&entries, entry0, layer};
  return KvStoreRowsOf(rec, kv, shape, rows, src_stride, 0, n_entries, 0, k_rope, mirror != nullptr ? &all : nullptr,
                       &table);
}

Result<const Pipeline*> Ops::KvStorePipeline(const KvView& kv, const AttentionShape& shape, const RopeTable* rope,
                                             bool table) {
  const uint32_t spec[] = {KvStoreGroup(kv.format),
                           static_cast<uint32_t>(kv.format.type),
                           U32(kv.format.group),
                           U32(shape.head_dim),
                           kv.format.rotate ? 1u : 0u,
                           U32(shape.n_head_kv * shape.head_dim),
                           U32(KvRowWords(kv)),
                           U32(KvSegmentHeads(kv.format, shape)),
                           RopeMode(rope),
                           table ? 1u : 0u};
  if (kv.format.type == KvType::kQ4K) {
    // The row, its encoding, six words per sub-block (kv_store.comp's sub_lo .. sub_best) and
    // the errors of a wave's candidates (one an invocation).
    const int64_t row_values = shape.n_head_kv * shape.head_dim, sub_blocks = row_values / kv.format.group;
    const int64_t wave_errors = std::max<int64_t>(KvStoreGroup(kv.format), 16);
    const int64_t bytes = row_values * 4 + KvRowWords(kv) * 4 + sub_blocks * 6 * 4 + wave_errors * 4;
    if (bytes > ctx_.limits().max_shared_bytes) {
      return Unsupported(fmt::format("q4k rows of {} values in sub-blocks of {} need {} bytes of shared memory to "
                                     "encode; the device has {}",
                                     row_values, kv.format.group, bytes, ctx_.limits().max_shared_bytes));
    }
  }
  return pipelines_.Get(kKvStore, spec);
}

Status Ops::KvStoreRowsOf(Recorder& rec, const KvView& kv, const AttentionShape& shape,
                          std::span<const KvStoreRows> rows, int64_t src_stride, int64_t src_row0, int64_t n_tokens,
                          int64_t pos0, const RopeTable* rope, const KvMirror* mirror, const KvStoreTable* table) {
  const int64_t seg_heads = KvSegmentHeads(kv.format, shape);
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, KvStorePipeline(kv, shape, rope, table != nullptr));
  KvStoreParams params{U32(n_tokens),
                       U32(pos0),
                       U32(src_stride),
                       U32(src_row0),
                       U32(kv.block_tokens),
                       kv.table0,
                       InvSqrtHeadDim(shape.head_dim),
                       rope != nullptr ? U32(rope->n_rot) : 0u,
                       rows[0].plane == kv.keys ? 1u : 0u,
                       table != nullptr ? 0u : U32(kv.key_row0 + pos0 - kv.key_pos0),  // (table: the entries')
                       0u,
                       {0u, 0u},
                       {0u, 0u},
                       table != nullptr ? U32(table->entry0) : 0u,
                       table != nullptr ? U32(table->layer) : 0u};
  if (mirror != nullptr && mirror->buffer != nullptr) {
    if (rows.size() != 2) return Internal("kv_store mirrors the rows of K and V stored together");
    for (size_t i = 0; i < rows.size(); ++i) {
      if (mirror->bytes0[i] < 0) continue;
      if (mirror->bytes0[i] % 4 != 0) return Internal("kv_store's mirror rows must start at whole words");
      params.mirror |= 1u << i;
      params.mirror_word0[i] = U32(mirror->bytes0[i] / 4);
      params.mirror_pos0[i] = U32(mirror->pos0[i]);
    }
  }
  const KvStoreRows& second = rows.size() > 1 ? rows[1] : rows[0];
  return rec.Dispatch(*p,
                      {rows[0].src, rows[0].plane, kv.block_table, second.src, second.plane,
                       rope != nullptr ? rope->cos_sin : &unused_, params.mirror != 0u ? mirror->buffer : &unused_,
                       table != nullptr ? table->entries : &unused_},
                      &params, U32(n_tokens), U32(shape.n_head_kv / seg_heads), U32(rows.size()));
}

Status Ops::KStage(Recorder& rec, const KvView& kv, const AttentionShape& shape, const Buffer& src, int64_t src_stride,
                   int64_t src_row0, int64_t n_tokens, int64_t pos0) {
  const uint32_t spec[] = {kElementwiseGroup};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kKStage, spec));
  const int64_t row_words = shape.n_head_kv * shape.head_dim / 2;
  const KStageParams params{U32(n_tokens), U32(row_words), U32(src_stride), U32(src_row0),
                            U32(kv.key_row0 + pos0 - kv.key_pos0)};
  return rec.Dispatch(*p, {&src, kv.keys}, &params, CeilDiv(n_tokens * row_words, kElementwiseGroup));
}

Status Ops::KChunks(Recorder& rec, const KvView& kv, const AttentionShape& shape, int64_t chunk0, int64_t n_chunks) {
  if (n_chunks <= 0) return Status::Ok();
  const uint32_t spec[] = {kElementwiseGroup, U32(kv.format.chunk)};
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, pipelines_.Get(kKChunks, spec));
  const int64_t n_channels = shape.n_head_kv * shape.head_dim;
  const KChunksParams params{U32(n_channels),       U32(chunk0),  U32(n_chunks),
                             U32(kv.key_row0),      U32(kv.key_pos0), U32(kv.block_tokens),
                             kv.table0,             U32(kv.k_slot_bytes / 4)};
  return rec.Dispatch(*p, {kv.keys, kv.k_plane, kv.block_table}, &params, CeilDiv(n_channels, kElementwiseGroup),
                      U32(n_chunks));
}

}  // namespace kvfs::vk
