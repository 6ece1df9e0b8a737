// Device copies of KV blocks (what the attention shaders read and kv_store writes).
//
// Design: the host blocks of the block pool stay the authoritative copy, because the engine
// names, shares, persists, loads and erases blocks in host memory. The device keeps a cache of
// block copies, keyed by PoolBlock::serial (unique per allocation, so a freed and reused
// address is never mistaken for the old block), each with the number of leading rows it holds
// that equal the host block. A forward pass:
//   1. Prepare: for every block a step reads or writes, finds or assigns a device slot; uploads
//      host rows the copy lacks (blocks loaded from disk, copied on write, shared from another
//      sequence, or written by the CPU backend); writes each step's block table.
//   2. the shaders write the new K/V rows into the device slots (kv_store) and attend over them;
//   3. write-back: the new rows are copied into the host blocks, so persistence, sharing and the
//      CPU backend see them; the copy is marked as holding them. kv_store writes them into a
//      host-visible buffer as it stores them (PlanWriteBack), so a pass ends without a copy
//      command per sequence, layer and plane.
// A row is only trusted while it is below the sequence's n_tokens at a Prepare, so a truncated
// sequence re-uploads what it rewrites elsewhere. Limitation: rows rewritten in place by
// another backend after a truncation, with no pass here in between, are not noticed (one
// backend per sequence).
//
// Memory: one arena per KV layout (format and block size), per layer a K plane and a V plane
// of n_slots * block_tokens rows, rows padded to whole words. Arenas grow by doubling within
// the budget; then the least recently used copies no step of the pass needs are dropped.
// When the pool frees a host block (erasure, eviction, a finished writable tail), the engine
// passes its serial to Forget: the device copy is overwritten with zeros and its slot freed
// before the erasure returns.
// q4k (keys per channel in chunks of C tokens): a slot's K plane holds the block's chunks
// (k_slot_bytes); the keys of each step's incomplete chunk and of its new tokens live, per pass,
// as f16 rows in the pass's key rows (one buffer per layer: the host's staged rows are uploaded
// at Prepare, kv_store-like k_stage writes the new ones, k_chunks encodes the chunks a pass
// completes); write-back copies the new V rows, the completed chunks and the new rows of the
// chunk left incomplete into the host block (its chunks and staging area), as the CPU backend's
// FlushKeyChunks does.
// Not yet: blocks living only in device memory (moving device <-> host <-> disk with the block
// pool's eviction).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_transfer.h"
#include "engine/core/status.h"
#include "engine/kv/sequence_kv.h"

namespace kvfs::vk {

struct KvArena {
  KvLayout layout;
  int64_t n_slots = 0;     // blocks it holds
  std::vector<Buffer> k_planes, v_planes;  // [n_layer]: n_slots slots each
  std::vector<int64_t> free_slots;
  // Bytes between device rows: the row's bytes rounded up to a word.
  int64_t row_stride() const { return (layout.row_bytes() + 3) / 4 * 4; }
  // One slot of one layer: V (and K but for q4k) block_tokens rows; q4k K the block's chunks.
  int64_t v_plane_bytes() const { return layout.block_tokens * row_stride(); }
  int64_t k_plane_bytes() const { return layout.format.KeysByChannel() ? layout.k_plane_bytes() : v_plane_bytes(); }
  int64_t slot_bytes() const { return layout.n_layer * (k_plane_bytes() + v_plane_bytes()); }
  int64_t largest_plane_bytes() const { return std::max(k_plane_bytes(), v_plane_bytes()); }  // vs the binding limit
};

// One step's KV during a pass.
struct StepKv {
  KvArena* arena = nullptr;
  uint32_t table0 = 0;  // its first entry in the block table
  int64_t n_old = 0;    // positions valid before the pass
  int64_t n_new = 0;    // after it
  // q4k: the pass's key rows of this step start at row key_row0, holding position key_pos0
  // (the start of the chunk holding n_old); rows up to n_new.
  int64_t key_row0 = 0;
  int64_t key_pos0 = 0;
};

class DeviceKvCache {
 public:
  // budget_bytes: device memory for all arenas; no plane exceeds max_binding_bytes.
  DeviceKvCache(Context& ctx, Uploader& uploader, int64_t budget_bytes, int64_t max_binding_bytes)
      : ctx_(ctx), uploader_(uploader), budget_bytes_(budget_bytes), max_binding_bytes_(max_binding_bytes) {}

  // Whether Prepare can hold these steps' blocks (Reserve'd or not) at once: per KV layout, the
  // distinct blocks they name against the slots its arena can reach (grown as AllocateSlot grows
  // it, within the budget and the binding, or by dropping copies no step names); q4k's key rows
  // against the binding. Exact for one layout. With several, arenas share the budget in the
  // order Prepare happens to grow them, which this does not follow: it may then say yes where
  // Prepare fails (kUnavailable, touching nothing: FallbackBackend runs the pass on the CPU) or
  // no where Prepare would have managed. Changes nothing.
  bool Fits(std::span<const SequenceStep> steps) const;
  // After every step's kv->Reserve: steps[i]'s blocks for positions [0, n_tokens + tokens)
  // are resident, their rows below n_tokens uploaded; out[i] describes step i.
  Status Prepare(std::span<const SequenceStep> steps, std::vector<StepKv>& out);
  // The view of layer `layer` for a step of this pass.
  KvView View(const StepKv& s, int64_t layer) const;
  // Write-back of a pass's new rows into the host blocks, through a host-visible buffer laid
  // out per step and layer: q4k's completed chunks, its staged keys, then the K rows of row
  // formats, then the V rows. PlanWriteBack (after Prepare, before recording the pass) sizes
  // and lays it out; with `mirror` (and the buffer within one binding) kv_store writes the rows
  // into it as it stores them (Mirror says where), and RecordWriteBack (recorded last, before
  // the pass is submitted) copies only q4k's completed chunks; without, it copies every row
  // there. FinishWriteBack (after the pass completed) writes them into the host blocks.
  Status PlanWriteBack(std::span<const StepKv> kvs, bool mirror);
  // What kv_store of step `step` (of the kvs PlanWriteBack laid out), layer `layer` writes to
  // the buffer too (no buffer: nothing).
  Ops::KvMirror Mirror(std::span<const StepKv> kvs, size_t step, int64_t layer) const;
  Status RecordWriteBack(Recorder& rec, std::span<const StepKv> kvs);
  void FinishWriteBack(std::span<const SequenceStep> steps, std::span<const StepKv> kvs);

  int64_t device_bytes() const { return used_bytes_; }
  // Zeroes and frees the device copies of these host blocks (freed by the pool), recorded
  // into `rec` (the caller submits). Returns how many copies there were.
  int64_t Forget(Recorder& rec, std::span<const uint64_t> serials);
  int64_t copies() const { return static_cast<int64_t>(resident_.size()); }
  // Test hook: reads a block copy's bytes back (every layer's K then V plane, row_stride rows);
  // NotFound when the serial has no copy.
  Result<std::vector<uint8_t>> ReadCopy(Recorder& rec, uint64_t serial);
  // The slot a copy had (tests check a forgotten slot reads as zeros): NotFound when none.
  Result<std::pair<KvArena*, int64_t>> SlotOf(uint64_t serial) const;
  Result<std::vector<uint8_t>> ReadSlot(Recorder& rec, const KvArena& arena, int64_t slot);

 private:
  struct Resident {
    KvArena* arena = nullptr;
    int64_t slot = 0;
    int64_t rows = 0;        // leading rows equal to the host block's
    uint64_t last_use = 0;   // pass number
  };
  Result<KvArena*> ArenaFor(const KvLayout& layout);
  Result<int64_t> AllocateSlot(KvArena& arena);
  Status Grow(KvArena& arena, int64_t n_slots);
  Status Upload(SequenceKv& kv, int64_t block, const Resident& res, int64_t r0, int64_t r1);

  Context& ctx_;
  Uploader& uploader_;
  const int64_t budget_bytes_;
  const int64_t max_binding_bytes_;
  int64_t used_bytes_ = 0;
  uint64_t pass_ = 0;
  std::vector<std::unique_ptr<KvArena>> arenas_;
  std::unordered_map<uint64_t, Resident> resident_;  // by PoolBlock::serial
  Buffer table_;     // host-visible uint32 block tables of the pass, steps back to back
  std::vector<Buffer> keys_;  // q4k: [n_layer] the pass's f16 key rows (StepKv::key_row0)
  int64_t key_row_bytes_ = 0, key_rows_ = 0;
  Buffer readback_;  // host-visible: the pass's new rows, per step, layer, K then V
  // Where each step's rows lie in readback_ (bytes; offsets in a layer from the layer's start).
  struct StepWriteBack {
    int64_t base = 0;         // the step's layer 0
    int64_t layer_bytes = 0;  // a layer's share
    int64_t staged = 0;       // q4k: staged keys (after the completed chunks, from 0)
    int64_t k_rows = 0;       // row formats: K rows
    int64_t v_rows = 0;
  };
  std::vector<StepWriteBack> write_back_;
  bool mirrored_ = false;  // kv_store writes the rows into readback_ this pass
};

}  // namespace kvfs::vk
