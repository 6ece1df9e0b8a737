// A "device" backend for tests of the CPU fallback and of device recovery, with no Vulkan: it
// runs passes on a CPU backend until it is marked lost; then every pass fails with
// kUnavailable, as a lost Vulkan device's does (`full_after`: as a device whose memory is full).
// `lost` and `passes` are atomic so that a test thread may lose it while an engine thread runs it.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/vulkan_tuning.h"

namespace kvfs::testing {

class ScriptedDevice final : public Backend {
 public:
  // `tunings` (may be null) receives the tunings set on it; `refuse_tuning` refuses them all.
  ScriptedDevice(const Model& model, CpuOptions cpu, std::vector<VulkanTuning>* tunings = nullptr,
                 bool refuse_tuning = false)
      : cpu_(MakeCpuBackend(model, cpu)), tunings_(tunings), refuse_tuning_(refuse_tuning) {}
  const char* name() const override { return "scripted"; }
  Status Forward(std::span<const SequenceStep> steps, Logits& out) override {
    if (lost) return Unavailable("VK_ERROR_DEVICE_LOST (-4) (scripted)");
    if (full_after >= 0 && passes >= full_after) return Unavailable("device memory is full (scripted)");
    ++passes;
    return cpu_->Forward(steps, out);
  }
  bool Lost() const override { return lost; }
  // As a Vulkan device: kernels made on first use (counted by the passes), for warm-up tests.
  bool CompilesOnFirstUse() const override { return compiles; }
  int64_t KernelsMade() const override { return compiles ? passes.load() : 0; }
  bool KeepsBlockCopies() const override { return true; }
  Status SetVulkanTuning(const VulkanTuning& tuning) override {
    if (refuse_tuning_) return Unsupported("matrix-vector shape not supported (scripted)");
    if (tunings_ != nullptr) tunings_->push_back(tuning);
    return Status::Ok();
  }

  std::atomic<bool> lost{false};
  std::atomic<int> passes{0};
  bool compiles = false;
  int full_after = -1;  // >= 0: passes after this many fail with kUnavailable (memory full)

 private:
  std::unique_ptr<Backend> cpu_;
  std::vector<VulkanTuning>* tunings_;
  const bool refuse_tuning_;
};

}  // namespace kvfs::testing
