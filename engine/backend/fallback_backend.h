// A device backend with the CPU behind it. The host KV blocks are the authoritative copy (the
// device keeps copies of them, vulkan/device_kv.h), so whatever the device cannot run the CPU
// can, and no agent's state is lost on the way:
//   - steps whose KV blocks do not fit the device's KV budget (Backend::Fits) run on the CPU;
//     the rest of the pass runs on the device, in as few groups as fit;
//   - a group the device refuses with kUnavailable (device memory full) runs on the CPU;
//   - once the device is lost (Backend::Lost), the device backend is released and every pass
//     runs on the CPU until the device can be made again (DeviceRecovery: a GPU reset or a
//     driver timeout usually leaves it usable); tries come at doubling intervals, so a device
//     that stays gone costs little, at the start of a pass or between passes (Maintain).
// The CPU backend is made on first need (it may pack the weights: memory and seconds); until
// then the model's bytes of the matrices the device holds are given back (GgufFile::GiveBack).
// Before the CPU writes rows into blocks the device holds copies of, those copies are dropped
// (ForgetBlocks), so the device never trusts rows it did not write itself.
// A pass is all-or-nothing when it runs whole on the device or the CPU (the usual case: it
// fits). Split into groups, an error other than kUnavailable in a later group leaves the
// earlier groups' sequences advanced; the engine then fails every turn of the pass and drops
// their sequences, as for any failed pass.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/backend/backend.h"

namespace kvfs {

// How a lost device is made again. The first try comes first_delay_ms after the loss, each
// failed one doubles the wait (up to max_delay_ms), and so does a loss within max_delay_ms of
// the last recovery (a device that keeps failing is not remade every second).
struct DeviceRecovery {
  std::function<Result<std::unique_ptr<Backend>>()> make;  // a new device backend; empty: a lost
                                                           // device stays lost
  std::function<int64_t()> now_ms;                         // a clock; empty: the steady clock
  int64_t first_delay_ms = 1000;  // at least 1 ms is used: tries between passes need a wait
  int64_t max_delay_ms = 5 * 60 * 1000;
};

struct FallbackStats {
  int64_t device_passes = 0;  // Forward calls the device ran
  int64_t cpu_passes = 0;     // Forward calls the CPU ran (some or all steps of a pass)
  int64_t cpu_steps = 0;      // steps the CPU ran
  bool device_lost = false;   // lost now: every pass runs on the CPU
  int64_t device_losses = 0;  // times the device was lost
  int64_t device_remakes = 0; // times it was made again after a loss
  int64_t remake_failures = 0;
  std::string last_reason;    // why the CPU last ran something
};

class FallbackBackend final : public Backend {
 public:
  FallbackBackend(const Model& model, std::unique_ptr<Backend> device, CpuOptions cpu, DeviceRecovery recovery = {});

  const char* name() const override { return device_ != nullptr ? device_->name() : "cpu"; }
  Status Forward(std::span<const SequenceStep> steps, Logits& out) override;
  // Constant for the backend's life: the engine tracks freed blocks from the start.
  bool KeepsBlockCopies() const override { return keeps_copies_; }
  // A lost device's memory went with it: nothing is left to zero (and the engine, which treats
  // a failed zeroing as fatal, goes on).
  Status ForgetBlocks(std::span<const uint64_t> serials) override;
  int64_t BlockCopies() const override { return device_ != nullptr ? device_->BlockCopies() : 0; }
  bool CompilesOnFirstUse() const override { return device_ != nullptr && device_->CompilesOnFirstUse(); }
  bool MakesKernelsFor(std::span<const SequenceStep> steps) const override {
    return device_ != nullptr && !device_->Lost() && device_->MakesKernelsFor(steps);
  }
  // The device alone (a loss it reports is noticed by the next Forward, as any loss).
  Status ForwardOnDevice(std::span<const SequenceStep> steps, Logits& out) override {
    if (device_ == nullptr || device_->Lost()) return Unavailable("the device is lost");
    return device_->ForwardOnDevice(steps, out);
  }
  int64_t KernelsMade() const override { return device_ != nullptr ? device_->KernelsMade() : 0; }
  std::string TakeProfileReport() override { return device_ != nullptr ? device_->TakeProfileReport() : ""; }
  Status SetVulkanTuning(const VulkanTuning& tuning) override;

  BackendHealth Health() const override {
    return {stats_.cpu_steps, stats_.device_lost, stats_.device_losses, stats_.device_remakes,
            stats_.remake_failures};
  }
  // While the device is lost: the next try to make it again (which Forward would also make).
  std::optional<int64_t> MaintenanceDueInMs() const override;
  void Maintain() override { TryRemakeDevice(); }
  const FallbackStats& stats() const { return stats_; }
  // The device backend (null while lost): tests reach its hooks through it.
  Backend* device() { return device_.get(); }

 private:
  // The CPU backend, made on first need (after reading back the weights the device's made
  // gave back: GiveBackMatrices).
  Result<Backend*> Cpu();
  // With a device that holds its own copies of the matrices and no CPU backend made: gives the
  // model's bytes of them back (a private copy of the model would otherwise hold a second copy
  // of the weights in host memory for nothing). Cpu() and a remake read them back first.
  void GiveBackMatrices();
  int64_t NowMs() const;
  // Lost, and to be made again.
  bool Recovering() const { return device_ == nullptr && recovery_.make; }
  void DropDevice(const Status& why);
  // After a loss, once the wait is over: makes the device again, or schedules the next try.
  void TryRemakeDevice();
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
  const DeviceRecovery recovery_;
  int64_t remake_delay_ms_ = 0;          // the current wait between tries
  int64_t next_remake_ms_ = 0;           // when the next try may come
  std::optional<int64_t> remade_at_ms_;  // when the device was last made again
  std::optional<VulkanTuning> tuning_;   // the last tuning set: a remade device gets it too
  FallbackStats stats_;
  // Steps run on the CPU are logged at most once a minute (a device KV budget too small for the
  // load would log every step): how many have not been said yet, and when it was last.
  static constexpr int64_t kCpuStepsLogEveryMs = 60'000;
  std::optional<int64_t> cpu_steps_said_at_ms_;
  int64_t cpu_steps_unsaid_ = 0;
};

}  // namespace kvfs
