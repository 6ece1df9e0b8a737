// A device backend with the CPU behind it. The host KV blocks are the authoritative copy (the
// device keeps copies of them, vulkan/device_kv.h), so whatever the device cannot run the CPU
// can, and no agent's state is lost on the way:
//   - steps whose KV blocks do not fit the device's KV budget (Backend::Fits) run on the CPU;
//     the rest of the pass runs on the device, in as few groups as fit;
//   - a group the device refuses with kUnavailable (device memory full) runs on the CPU;
//   - once the device is lost (Backend::Lost), every pass runs on the CPU and the device
//     backend is released.
// The CPU backend is made on first need (it may pack the weights: memory and seconds).
// Before the CPU writes rows into blocks the device holds copies of, those copies are dropped
// (ForgetBlocks), so the device never trusts rows it did not write itself.
// A pass is all-or-nothing when it runs whole on the device or the CPU (the usual case: it
// fits). Split into groups, an error other than kUnavailable in a later group leaves the
// earlier groups' sequences advanced; the engine then fails every turn of the pass and drops
// their sequences, as for any failed pass.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend/backend.h"

namespace kvfs {

struct FallbackStats {
  int64_t device_passes = 0;  // Forward calls the device ran
  int64_t cpu_passes = 0;     // Forward calls the CPU ran (some or all steps of a pass)
  int64_t cpu_steps = 0;      // steps the CPU ran
  bool device_lost = false;
  std::string last_reason;    // why the CPU last ran something
};

class FallbackBackend final : public Backend {
 public:
  FallbackBackend(const Model& model, std::unique_ptr<Backend> device, CpuOptions cpu)
      : model_(model), device_(std::move(device)), cpu_options_(cpu), keeps_copies_(device_->KeepsBlockCopies()) {}

  const char* name() const override { return device_ != nullptr ? device_->name() : "cpu"; }
  Status Forward(std::span<const SequenceStep> steps, Logits& out) override;
  // Constant for the backend's life: the engine tracks freed blocks from the start.
  bool KeepsBlockCopies() const override { return keeps_copies_; }
  // A lost device's memory went with it: nothing is left to zero (and the engine, which treats
  // a failed zeroing as fatal, goes on).
  Status ForgetBlocks(std::span<const uint64_t> serials) override;
  int64_t BlockCopies() const override { return device_ != nullptr ? device_->BlockCopies() : 0; }
  std::string TakeProfileReport() override { return device_ != nullptr ? device_->TakeProfileReport() : ""; }
  Status SetVulkanTuning(const VulkanTuning& tuning) override;

  BackendHealth Health() const override { return {stats_.cpu_steps, stats_.device_lost}; }
  const FallbackStats& stats() const { return stats_; }
  // The device backend (null once lost): tests reach its hooks through it.
  Backend* device() { return device_.get(); }

 private:
  Result<Backend*> Cpu();
  void DropDevice(const Status& why);
  // Runs `steps` on the device into `out`; what it refuses with kUnavailable (memory full, a
  // lost device) on the CPU.
  Status RunOnDevice(std::span<const SequenceStep> steps, Logits& out);
  // Runs `steps` on the CPU into `out`, after dropping the device's copies of the blocks they write.
  Status RunOnCpu(std::span<const SequenceStep> steps, Logits& out, const std::string& why);

  const Model& model_;
  std::unique_ptr<Backend> device_;
  std::unique_ptr<Backend> cpu_;
  const CpuOptions cpu_options_;
  const bool keeps_copies_;
  FallbackStats stats_;
};

}  // namespace kvfs
