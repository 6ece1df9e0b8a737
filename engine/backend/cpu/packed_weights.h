// Weight matrices repacked at load into the kernel table's own layout (PackedKernels in
// kernels.h), for the matrices whose type the table packs. The packed copies live in anonymous
// memory (huge pages where the kernel gives them); the model's bytes of those matrices are
// then given back (GgufFile::GiveBack: this backend never reads them again), so the resident
// size stays that of one copy.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "engine/backend/cpu/kernels.h"
#include "engine/model/gguf.h"
#include "engine/model/weights.h"

namespace kvfs {

class ThreadPool;

class PackedWeights {
 public:
  struct Entry {
    const cpu::PackedKernels* kernels = nullptr;
    const uint8_t* data = nullptr;  // 64-byte aligned, inside the owned mapping
  };

  PackedWeights() = default;
  // Packs every matmul weight of `weights` the table has packed kernels for (on the pool's
  // threads). Nothing is packed when `enabled` is false. The bytes of what was packed are
  // given back to `source` (the file the weights point into) unless it is null.
  PackedWeights(const ModelWeights& weights, const cpu::KernelTable& table, ThreadPool& pool, bool enabled,
                const GgufFile* source);
  ~PackedWeights();
  PackedWeights(const PackedWeights&) = delete;
  PackedWeights& operator=(const PackedWeights&) = delete;

  // The packed form of `w`, or nullptr when it runs from the model's own bytes.
  const Entry* Find(const Matrix& w) const {
    auto it = entries_.find(w.data);
    return it == entries_.end() ? nullptr : &it->second;
  }
  int64_t bytes() const { return bytes_; }
  size_t count() const { return entries_.size(); }

 private:
  std::unordered_map<const uint8_t*, Entry> entries_;  // by the matrix's mapped data
  void* mapping_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace kvfs
