#include "engine/backend/vulkan/device_kv.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include <spdlog/fmt/fmt.h>

namespace kvfs::vk {

namespace {

bool SameLayout(const KvLayout& a, const KvLayout& b) {
  return a.n_layer == b.n_layer && a.n_head_kv == b.n_head_kv && a.head_dim == b.head_dim &&
         a.block_tokens == b.block_tokens && a.format == b.format;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kInitialSlots = 4;

// q4k: a pass holds a step's keys as f16 rows from the start of the chunk holding its first new
// position (the host's staged rows of that incomplete chunk, then the new keys), since a chunk
// is encoded only when complete.
int64_t KeyChunkStart(const KvLayout& kl, int64_t n_old) { return n_old / kl.format.chunk * kl.format.chunk; }
int64_t StagedKeyRowBytes(const KvLayout& kl) { return kl.row_values() * 2; }

}  // namespace

Result<KvArena*> DeviceKvCache::ArenaFor(const KvLayout& layout) {
  for (auto& a : arenas_) {
    if (SameLayout(a->layout, layout)) return a.get();
  }
  auto arena = std::make_unique<KvArena>();
  arena->layout = layout;
  if (arena->largest_plane_bytes() > max_binding_bytes_) {
    return Unsupported(fmt::format("one KV block plane ({} bytes) exceeds the device's storage binding ({} bytes)",
                                   arena->largest_plane_bytes(), max_binding_bytes_));
  }
  arenas_.push_back(std::move(arena));
  return arenas_.back().get();
}

Status DeviceKvCache::Grow(KvArena& arena, int64_t n_slots) {
  std::vector<Buffer> k(arena.layout.n_layer), v(arena.layout.n_layer);
  for (int64_t l = 0; l < arena.layout.n_layer; ++l) {
    KVFS_ASSIGN_OR_RETURN(k[l], ctx_.CreateBuffer(n_slots * arena.k_plane_bytes(), MemoryKind::kDevice));
    KVFS_ASSIGN_OR_RETURN(v[l], ctx_.CreateBuffer(n_slots * arena.v_plane_bytes(), MemoryKind::kDevice));
  }
  if (arena.n_slots > 0) {
    Recorder rec(ctx_);
    KVFS_RETURN_IF_ERROR(rec.Begin());
    for (int64_t l = 0; l < arena.layout.n_layer; ++l) {
      rec.Copy(arena.k_planes[l], 0, k[l], 0, arena.n_slots * arena.k_plane_bytes());
      rec.Copy(arena.v_planes[l], 0, v[l], 0, arena.n_slots * arena.v_plane_bytes());
    }
    KVFS_RETURN_IF_ERROR(rec.SubmitAndWait());
  }
  for (int64_t s = n_slots - 1; s >= arena.n_slots; --s) arena.free_slots.push_back(s);
  used_bytes_ += (n_slots - arena.n_slots) * arena.slot_bytes();
  arena.n_slots = n_slots;
  arena.k_planes = std::move(k);
  arena.v_planes = std::move(v);
  return Status::Ok();
}

Result<int64_t> DeviceKvCache::AllocateSlot(KvArena& arena) {
  if (arena.free_slots.empty()) {
    // Grow (double) while the budget and the binding size allow it, else drop the least
    // recently used copy that no step of this pass needs.
    const int64_t by_binding = max_binding_bytes_ / arena.largest_plane_bytes();
    const int64_t by_budget = arena.n_slots + (budget_bytes_ - used_bytes_) / arena.slot_bytes();
    const int64_t target = std::min({std::max(kInitialSlots, 2 * arena.n_slots), by_binding, by_budget});
    if (target > arena.n_slots) {
      KVFS_RETURN_IF_ERROR(Grow(arena, target));
    } else {
      auto victim = resident_.end();
      for (auto it = resident_.begin(); it != resident_.end(); ++it) {
        if (it->second.arena != &arena || it->second.last_use == pass_) continue;
        if (victim == resident_.end() || it->second.last_use < victim->second.last_use) victim = it;
      }
      if (victim == resident_.end()) {
        return Unavailable(fmt::format("device KV memory is full: {} blocks of {} bytes, all needed by this pass "
                                  "(the device KV budget is {} bytes: --kv-device-budget)",
                                  arena.n_slots, arena.slot_bytes(), budget_bytes_));
      }
      arena.free_slots.push_back(victim->second.slot);
      resident_.erase(victim);
    }
  }
  const int64_t slot = arena.free_slots.back();
  arena.free_slots.pop_back();
  return slot;
}

bool DeviceKvCache::Fits(std::span<const SequenceStep> steps) const {
  struct Need {
    const KvLayout* layout = nullptr;
    const KvArena* arena = nullptr;  // null: Prepare would make it
    std::unordered_set<uint64_t> serials;  // blocks that exist
    int64_t fresh = 0;                     // blocks Reserve has yet to add
  };
  std::vector<Need> needs;
  int64_t key_rows = 0, key_row_bytes = 0;
  for (const SequenceStep& s : steps) {
    const KvLayout& kl = s.kv->layout();
    auto need = std::find_if(needs.begin(), needs.end(), [&](const Need& n) { return SameLayout(*n.layout, kl); });
    if (need == needs.end()) {
      Need n{.layout = &kl};
      for (const auto& a : arenas_) {
        if (SameLayout(a->layout, kl)) n.arena = a.get();
      }
      needs.push_back(std::move(n));
      need = needs.end() - 1;
    }
    const int64_t n_new = s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size());
    const int64_t n_blocks = CeilDiv(n_new, kl.block_tokens);
    for (int64_t b = 0; b < n_blocks; ++b) {
      if (b < s.kv->n_blocks()) {
        need->serials.insert(s.kv->block(b)->serial);
      } else {
        ++need->fresh;
      }
    }
    if (kl.format.KeysByChannel()) {
      key_rows += n_new - KeyChunkStart(kl, s.kv->n_tokens());
      key_row_bytes = StagedKeyRowBytes(kl);
    }
  }
  if (key_rows * key_row_bytes > max_binding_bytes_) return false;
  int64_t spare = budget_bytes_ - used_bytes_;
  for (const Need& n : needs) {
    KvArena probe;  // the sizes of the arena Prepare would make
    probe.layout = *n.layout;
    const KvArena& a = n.arena != nullptr ? *n.arena : probe;
    if (a.largest_plane_bytes() > max_binding_bytes_) return false;
    const int64_t blocks = static_cast<int64_t>(n.serials.size()) + n.fresh;
    // AllocateSlot grows the arena whenever it has no free slot, before it drops copies, so it
    // may grow past `blocks` by the copies of other blocks it holds: the largest growth.
    int64_t others = 0;
    if (n.arena != nullptr) {
      for (const auto& [serial, res] : resident_) {
        if (res.arena == n.arena && !n.serials.contains(serial)) ++others;
      }
    }
    const int64_t by_binding = max_binding_bytes_ / a.largest_plane_bytes();
    int64_t slots = a.n_slots;
    while (slots < std::min(blocks + others, by_binding)) {
      const int64_t target = std::min({std::max(kInitialSlots, 2 * slots), by_binding, slots + spare / a.slot_bytes()});
      if (target <= slots) break;
      spare -= (target - slots) * a.slot_bytes();
      slots = target;
    }
    if (blocks > slots) return false;
  }
  return true;
}

Status DeviceKvCache::Upload(SequenceKv& kv, int64_t block, const Resident& res, int64_t r0, int64_t r1) {
  const KvArena& a = *res.arena;
  const int64_t B = a.layout.block_tokens, row_bytes = a.layout.row_bytes();
  const int64_t dst = (res.slot * B + r0) * a.row_stride();
  const bool q4k = a.layout.format.KeysByChannel();
  const int64_t C = a.layout.format.chunk, chunk_bytes = a.layout.chunk_bytes();
  for (int64_t l = 0; l < a.layout.n_layer; ++l) {
    if (q4k) {  // the chunks complete at r1 that were not at r0
      for (int64_t c = r0 / C; c < r1 / C; ++c) {
        KVFS_RETURN_IF_ERROR(uploader_.AddRows(kv.k_chunk(l, block * B / C + c), 1, chunk_bytes, chunk_bytes,
                                               a.k_planes[l], res.slot * a.k_plane_bytes() + c * chunk_bytes,
                                               chunk_bytes));
      }
    } else {
      KVFS_RETURN_IF_ERROR(uploader_.AddRows(kv.k_row(l, block * B + r0), r1 - r0, row_bytes, row_bytes, a.k_planes[l],
                                             dst, a.row_stride()));
    }
    KVFS_RETURN_IF_ERROR(
        uploader_.AddRows(kv.v_row(l, block * B + r0), r1 - r0, row_bytes, row_bytes, a.v_planes[l], dst, a.row_stride()));
  }
  return Status::Ok();
}

Status DeviceKvCache::Prepare(std::span<const SequenceStep> steps, std::vector<StepKv>& out) {
  ++pass_;
  out.clear();
  // Slots first (growing an arena replaces its buffers, so no upload may be queued before).
  std::vector<std::vector<Resident*>> blocks(steps.size());
  int64_t table_entries = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    SequenceKv& kv = *steps[i].kv;
    StepKv s;
    KVFS_ASSIGN_OR_RETURN(s.arena, ArenaFor(kv.layout()));
    s.n_old = kv.n_tokens();
    s.n_new = s.n_old + static_cast<int64_t>(steps[i].tokens.size());
    s.table0 = static_cast<uint32_t>(table_entries);
    const int64_t n_blocks = CeilDiv(s.n_new, kv.layout().block_tokens);
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint64_t serial = kv.block(b)->serial;
      auto it = resident_.find(serial);
      if (it == resident_.end()) {
        KVFS_ASSIGN_OR_RETURN(int64_t slot, AllocateSlot(*s.arena));
        it = resident_.emplace(serial, Resident{s.arena, slot, 0, pass_}).first;
      }
      it->second.last_use = pass_;
    }
    table_entries += n_blocks;
    out.push_back(s);
  }
  // Pointers into resident_ are stable from here on: no more insertions or erasures.
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t n_blocks = CeilDiv(out[i].n_new, steps[i].kv->layout().block_tokens);
    for (int64_t b = 0; b < n_blocks; ++b) blocks[i].push_back(&resident_.at(steps[i].kv->block(b)->serial));
  }

  // q4k: the pass's key rows, and the staged rows of each step's incomplete chunk in them.
  int64_t key_rows = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const KvLayout& kl = steps[i].kv->layout();
    if (!kl.format.KeysByChannel()) continue;
    out[i].key_pos0 = KeyChunkStart(kl, out[i].n_old);
    out[i].key_row0 = key_rows;
    key_rows += out[i].n_new - out[i].key_pos0;
    key_row_bytes_ = StagedKeyRowBytes(kl);
    if (static_cast<int64_t>(keys_.size()) != kl.n_layer) {
      keys_.clear();
      keys_.resize(static_cast<size_t>(kl.n_layer));
      key_rows_ = 0;
    }
  }
  if (key_rows > key_rows_) {
    if (key_rows * key_row_bytes_ > max_binding_bytes_) {
      return Unavailable(fmt::format("a pass of {} q4k key rows exceeds the device's storage binding", key_rows));
    }
    const int64_t rows = std::min(std::max(key_rows, 2 * key_rows_), max_binding_bytes_ / key_row_bytes_);
    for (Buffer& b : keys_) {
      KVFS_ASSIGN_OR_RETURN(b, ctx_.CreateBuffer(rows * key_row_bytes_, MemoryKind::kDevice));
    }
    key_rows_ = rows;
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const SequenceKv& kv = *steps[i].kv;
    const int64_t staged = out[i].n_old - out[i].key_pos0;
    if (!kv.layout().format.KeysByChannel() || staged == 0) continue;
    for (int64_t l = 0; l < kv.layout().n_layer; ++l) {
      KVFS_RETURN_IF_ERROR(uploader_.AddRows(reinterpret_cast<const uint8_t*>(kv.k_staging(l, out[i].key_pos0)), staged,
                                             key_row_bytes_, key_row_bytes_, keys_[l], out[i].key_row0 * key_row_bytes_,
                                             key_row_bytes_));
    }
  }

  if (table_.bytes() < table_entries * 4) {
    KVFS_ASSIGN_OR_RETURN(table_, ctx_.CreateBuffer(table_entries * 4 * 2, MemoryKind::kDeviceUpload));
  }
  auto* table = reinterpret_cast<uint32_t*>(table_.mapped());
  for (size_t i = 0; i < steps.size(); ++i) {
    SequenceKv& kv = *steps[i].kv;
    const int64_t B = kv.layout().block_tokens;
    for (size_t b = 0; b < blocks[i].size(); ++b) {
      Resident& res = *blocks[i][b];
      table[out[i].table0 + b] = static_cast<uint32_t>(res.slot);
      // Rows this sequence holds in the block; a copy is trusted only that far.
      const int64_t valid = std::clamp<int64_t>(out[i].n_old - static_cast<int64_t>(b) * B, 0, B);
      res.rows = std::min(res.rows, valid);
      if (res.rows < valid) {
        KVFS_RETURN_IF_ERROR(Upload(kv, static_cast<int64_t>(b), res, res.rows, valid));
        res.rows = valid;
      }
    }
  }
  return uploader_.Flush();
}

KvView DeviceKvCache::View(const StepKv& s, int64_t layer) const {
  KvView v;
  v.k_plane = &s.arena->k_planes[layer];
  v.v_plane = &s.arena->v_planes[layer];
  v.block_table = &table_;
  v.table0 = s.table0;
  v.format = s.arena->layout.format;
  v.block_tokens = s.arena->layout.block_tokens;
  v.row_stride = s.arena->row_stride();
  if (s.arena->layout.format.KeysByChannel()) {
    v.k_slot_bytes = s.arena->k_plane_bytes();
    v.keys = &keys_[layer];
    v.key_row0 = s.key_row0;
    v.key_pos0 = s.key_pos0;
  }
  return v;
}

// What a step's write-back holds, per layer: its new V rows (and K rows but for q4k); q4k: the
// chunks the pass completed and the new rows of the chunk left incomplete (the host already
// holds its rows from before the pass: they were uploaded from there).
namespace {
struct WriteBackShape {
  int64_t chunk0 = 0, n_chunks = 0;  // q4k
  int64_t chunk_start = 0;           // q4k: first position of the incomplete chunk
  int64_t staged0 = 0;               // q4k: first staged row to copy (rows staged0 .. n_new)
};
WriteBackShape ShapeOf(const StepKv& s) {
  WriteBackShape w;
  const KvFormat& f = s.arena->layout.format;
  if (!f.KeysByChannel()) return w;
  w.chunk0 = s.n_old / f.chunk;
  w.n_chunks = s.n_new / f.chunk - w.chunk0;
  w.chunk_start = s.n_new / f.chunk * f.chunk;
  w.staged0 = std::max(s.n_old, w.chunk_start);
  return w;
}
int64_t RoundUpToWord(int64_t bytes) { return (bytes + 3) / 4 * 4; }
}  // namespace

Status DeviceKvCache::PlanWriteBack(std::span<const StepKv> kvs, bool mirror) {
  write_back_.clear();
  int64_t bytes = 0;
  for (const StepKv& s : kvs) {
    const KvArena& a = *s.arena;
    const WriteBackShape w = ShapeOf(s);
    const int64_t n_rows = s.n_new - s.n_old;
    StepWriteBack at;
    at.base = bytes;
    if (a.layout.format.KeysByChannel()) {
      at.staged = RoundUpToWord(w.n_chunks * a.layout.chunk_bytes());
      at.v_rows = at.staged + (s.n_new - w.staged0) * key_row_bytes_;
    } else {
      at.k_rows = 0;
      at.v_rows = n_rows * a.row_stride();
    }
    at.layer_bytes = at.v_rows + n_rows * a.row_stride();
    bytes += a.layout.n_layer * at.layer_bytes;
    write_back_.push_back(at);
  }
  // kv_store binds the whole buffer, so with the mirror it must fit one binding: a buffer grown
  // past it by a long prefill (which copied its rows) is made again at this pass's size.
  const bool fits = bytes <= max_binding_bytes_;
  if (readback_.bytes() < bytes || (mirror && fits && readback_.bytes() > max_binding_bytes_)) {
    readback_ = Buffer();  // freed before its successor is made
    KVFS_ASSIGN_OR_RETURN(readback_, ctx_.CreateBuffer(bytes, MemoryKind::kReadback));
  }
  mirrored_ = mirror && fits;
  return Status::Ok();
}

Ops::KvMirror DeviceKvCache::Mirror(std::span<const StepKv> kvs, size_t step, int64_t layer) const {
  Ops::KvMirror m;
  if (!mirrored_) return m;
  const StepKv& s = kvs[step];
  const StepWriteBack& at = write_back_[step];
  const int64_t layer0 = at.base + layer * at.layer_bytes;
  const bool q4k = s.arena->layout.format.KeysByChannel();
  m.buffer = &readback_;
  // q4k: the staged keys from staged0 on (those of completed chunks are copied as chunks).
  m.bytes0[0] = layer0 + (q4k ? at.staged : at.k_rows);
  m.pos0[0] = q4k ? ShapeOf(s).staged0 : s.n_old;
  m.bytes0[1] = layer0 + at.v_rows;
  m.pos0[1] = s.n_old;
  m.layer_bytes = at.layer_bytes;
  return m;
}

Status DeviceKvCache::RecordWriteBack(Recorder& rec, std::span<const StepKv> kvs) {
  if (write_back_.size() != kvs.size()) return Internal("RecordWriteBack without PlanWriteBack for these steps");
  const auto* table = reinterpret_cast<const uint32_t*>(table_.mapped());
  for (size_t i = 0; i < kvs.size(); ++i) {
    const StepKv& s = kvs[i];
    const StepWriteBack& at = write_back_[i];
    const KvArena& a = *s.arena;
    const int64_t B = a.layout.block_tokens;
    const bool q4k = a.layout.format.KeysByChannel();
    const WriteBackShape w = ShapeOf(s);
    for (int64_t l = 0; l < a.layout.n_layer; ++l) {
      const int64_t layer0 = at.base + l * at.layer_bytes;
      if (q4k) {  // completed chunks: k_chunks wrote them, after kv_store
        const int64_t C = a.layout.format.chunk, chunk_bytes = a.layout.chunk_bytes();
        for (int64_t c = w.chunk0; c < w.chunk0 + w.n_chunks; ++c) {
          const int64_t slot = table[s.table0 + c * C / B];
          rec.Copy(a.k_planes[l], slot * a.k_plane_bytes() + (c * C % B) / C * chunk_bytes, readback_,
                   layer0 + (c - w.chunk0) * chunk_bytes, chunk_bytes);
        }
      }
      if (mirrored_) continue;  // kv_store wrote the rows there itself
      if (q4k && s.n_new > w.staged0) {
        rec.Copy(keys_[l], (s.key_row0 + w.staged0 - s.key_pos0) * key_row_bytes_, readback_, layer0 + at.staged,
                 (s.n_new - w.staged0) * key_row_bytes_);
      }
      for (int plane = q4k ? 1 : 0; plane < 2; ++plane) {
        const Buffer& rows = plane == 0 ? a.k_planes[l] : a.v_planes[l];
        int64_t out = layer0 + (plane == 0 ? at.k_rows : at.v_rows);
        // Runs of consecutive positions within one block are contiguous on the device.
        for (int64_t p = s.n_old; p < s.n_new;) {
          const int64_t end = std::min(s.n_new, (p / B + 1) * B);
          const int64_t slot = table[s.table0 + p / B];
          rec.Copy(rows, (slot * B + p % B) * a.row_stride(), readback_, out, (end - p) * a.row_stride());
          out += (end - p) * a.row_stride();
          p = end;
        }
      }
    }
  }
  return Status::Ok();
}

void DeviceKvCache::FinishWriteBack(std::span<const SequenceStep> steps, std::span<const StepKv> kvs) {
  const uint8_t* in = readback_.mapped();
  for (size_t i = 0; i < steps.size(); ++i) {
    SequenceKv& kv = *steps[i].kv;
    const StepKv& s = kvs[i];
    const StepWriteBack& at = write_back_[i];
    const int64_t row_bytes = kv.layout().row_bytes(), B = kv.layout().block_tokens;
    const int64_t row_stride = s.arena->row_stride();
    const bool q4k = kv.layout().format.KeysByChannel();
    const WriteBackShape w = ShapeOf(s);
    for (int64_t l = 0; l < kv.layout().n_layer; ++l) {
      const uint8_t* layer = in + at.base + l * at.layer_bytes;
      if (q4k) {
        const int64_t chunk_bytes = kv.layout().chunk_bytes();
        for (int64_t c = w.chunk0; c < w.chunk0 + w.n_chunks; ++c) {
          std::memcpy(kv.k_chunk(l, c), layer + (c - w.chunk0) * chunk_bytes, static_cast<size_t>(chunk_bytes));
        }
        const int64_t staged_bytes = (s.n_new - w.staged0) * key_row_bytes_;
        if (staged_bytes > 0) {
          uint16_t* rows = kv.k_staging(l, w.chunk_start) + (w.staged0 - w.chunk_start) * kv.layout().row_values();
          std::memcpy(rows, layer + at.staged, static_cast<size_t>(staged_bytes));
        }
      }
      for (int plane = q4k ? 1 : 0; plane < 2; ++plane) {
        const uint8_t* rows = layer + (plane == 0 ? at.k_rows : at.v_rows);
        for (int64_t p = s.n_old; p < s.n_new; ++p, rows += row_stride) {
          std::memcpy(plane == 0 ? kv.k_row(l, p) : kv.v_row(l, p), rows, static_cast<size_t>(row_bytes));
        }
      }
    }
    for (int64_t b = s.n_old / B; b < CeilDiv(s.n_new, B); ++b) {
      Resident& res = resident_.at(kv.block(b)->serial);
      res.rows = std::max(res.rows, std::min(s.n_new - b * B, B));
    }
  }
}

}  // namespace kvfs::vk

namespace kvfs::vk {

int64_t DeviceKvCache::Forget(Recorder& rec, std::span<const uint64_t> serials) {
  int64_t n = 0;
  for (uint64_t serial : serials) {
    auto it = resident_.find(serial);
    if (it == resident_.end()) continue;
    KvArena& a = *it->second.arena;
    const int64_t slot = it->second.slot;
    for (int64_t l = 0; l < a.layout.n_layer; ++l) {
      rec.Zero(a.k_planes[l], slot * a.k_plane_bytes(), a.k_plane_bytes());
      rec.Zero(a.v_planes[l], slot * a.v_plane_bytes(), a.v_plane_bytes());
    }
    a.free_slots.push_back(slot);
    resident_.erase(it);
    ++n;
  }
  // q4k: the last pass's key rows may hold keys of the freed blocks' sequence.
  if (n > 0) {
    for (const Buffer& b : keys_) rec.Zero(b, 0, b.bytes());
  }
  return n;
}

Result<std::pair<KvArena*, int64_t>> DeviceKvCache::SlotOf(uint64_t serial) const {
  auto it = resident_.find(serial);
  if (it == resident_.end()) return Status(StatusCode::kNotFound, "no device copy of that block");
  return std::make_pair(it->second.arena, it->second.slot);
}

Result<std::vector<uint8_t>> DeviceKvCache::ReadSlot(Recorder& rec, const KvArena& a, int64_t slot) {
  KVFS_ASSIGN_OR_RETURN(Buffer out, ctx_.CreateBuffer(a.slot_bytes(), MemoryKind::kReadback));
  KVFS_RETURN_IF_ERROR(rec.Begin());
  int64_t at = 0;
  for (int64_t l = 0; l < a.layout.n_layer; ++l) {
    rec.Copy(a.k_planes[l], slot * a.k_plane_bytes(), out, at, a.k_plane_bytes());
    at += a.k_plane_bytes();
    rec.Copy(a.v_planes[l], slot * a.v_plane_bytes(), out, at, a.v_plane_bytes());
    at += a.v_plane_bytes();
  }
  KVFS_RETURN_IF_ERROR(rec.SubmitAndWait());
  return std::vector<uint8_t>(out.mapped(), out.mapped() + a.slot_bytes());
}

Result<std::vector<uint8_t>> DeviceKvCache::ReadCopy(Recorder& rec, uint64_t serial) {
  KVFS_ASSIGN_OR_RETURN(auto where, SlotOf(serial));
  return ReadSlot(rec, *where.first, where.second);
}

}  // namespace kvfs::vk
