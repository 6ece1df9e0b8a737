#include "engine/backend/cpu/packed_weights.h"

#include <sys/mman.h>

#include <algorithm>
#include <vector>

#include <spdlog/spdlog.h>

#include "engine/core/thread_pool.h"

namespace kvfs {
namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kRowUnit = 32;  // threads pack whole units (a multiple of every row group)

}  // namespace

PackedWeights::PackedWeights(const ModelWeights& weights, const cpu::KernelTable& table, ThreadPool& pool,
                             bool enabled, const GgufFile* source) {
  if (!enabled) return;
  std::vector<const Matrix*> matrices;
  for (const LayerWeights& l : weights.layers) {
    for (const Matrix* m : l.Matrices()) matrices.push_back(m);
  }
  matrices.push_back(&weights.output);
  std::vector<std::pair<const Matrix*, int64_t>> todo;  // matrix, offset in the mapping
  for (const Matrix* m : matrices) {
    if (m->empty() || entries_.count(m->data) != 0) continue;
    const cpu::PackedKernels& pk = table.packed[static_cast<int>(m->type)];
    if (!pk.available()) continue;
    todo.emplace_back(m, bytes_);
    entries_[m->data] = Entry{&pk, nullptr};
    bytes_ += (pk.bytes(m->n_out, m->n_in) + kAlign - 1) / kAlign * kAlign;
  }
  if (todo.empty()) return;
  void* map = mmap(nullptr, static_cast<size_t>(bytes_), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    spdlog::warn("weights run unpacked: no memory for the {} MiB packed copy", bytes_ >> 20);
    entries_.clear();
    bytes_ = 0;
    return;
  }
  madvise(map, static_cast<size_t>(bytes_), MADV_HUGEPAGE);  // a hint; fewer TLB misses when streaming
  mapping_ = map;
  auto* base = static_cast<uint8_t*>(map);
  for (auto& [m, offset] : todo) {
    Entry& e = entries_[m->data];
    e.data = base + offset;
    const cpu::PackedKernels& pk = *e.kernels;
    pool.Run([&, m = m](int ith, int nth) {
      auto [u0, u1] = SplitRange((m->n_out + kRowUnit - 1) / kRowUnit, ith, nth);
      const int64_t r0 = u0 * kRowUnit, r1 = std::min(u1 * kRowUnit, m->n_out);
      if (r1 > r0) pk.pack(m->row(r0), m->row_bytes, r1 - r0, m->n_in, const_cast<uint8_t*>(e.data) + pk.bytes(r0, m->n_in));
    });
    // The tied output matrix is also the embedding table, read by token: keep its pages.
    if (source != nullptr && !(weights.tied_output && m->data == weights.token_embd.data))
      source->GiveBack(m->data, static_cast<size_t>(m->n_out * m->row_bytes));
  }
}

PackedWeights::~PackedWeights() {
  if (mapping_ != nullptr) munmap(mapping_, static_cast<size_t>(bytes_));
}

}  // namespace kvfs
