// The backend seam: one forward pass over a batch of sequences. CPU now; Vulkan implements
// the same interface. The engine thread owns a backend; it is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/core/status.h"
#include "engine/kv/sequence_kv.h"
#include "engine/model/model.h"

namespace kvfs {

// One sequence's part of a batch: new tokens appended at positions kv->n_tokens() onwards.
struct SequenceStep {
  SequenceKv* kv = nullptr;
  std::span<const TokenId> tokens;
  bool all_logits = false;  // logits for every new token, else only for the last
};

// Logits of a forward pass: rows of n_vocab floats, for each step in order either one row per
// new token (all_logits) or one row.
struct Logits {
  int64_t n_vocab = 0;
  std::vector<float> data;
  std::vector<int64_t> first_row;  // per step: index of its first row
  const float* row(int64_t r) const { return data.data() + r * n_vocab; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Runs the model over every step's new tokens, writes their K/V into each step's kv, and
  // advances kv->n_tokens(). Fails without touching any kv when a step does not fit.
  virtual Status Forward(std::span<const SequenceStep> steps, Logits& out) = 0;
};

namespace cpu { struct KernelTable; }

struct CpuOptions {
  int n_threads = 2;
  // Kernel table to use; nullptr = the best one this CPU supports (or KVFS_CPU=scalar|avx2|avx512).
  const cpu::KernelTable* kernels = nullptr;
};
std::unique_ptr<Backend> MakeCpuBackend(const Model& model, const CpuOptions& options);

}  // namespace kvfs
