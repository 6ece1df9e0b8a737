// A cancellation flag that can wake a thread blocked on a condition variable. The FUSE layer
// triggers it from libfuse's interrupt callback (a FUSE_INTERRUPT from the kernel: Ctrl-C or a
// kill of the reader), so a read blocked on `response` returns EINTR at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>

namespace kvfs::fs {

class Interrupt {
 public:
  // Sets the flag and wakes the waiter registered now, if any. Any thread, any number of times.
  void Trigger();
  bool triggered() const { return triggered_.load(std::memory_order_acquire); }

  // While registered, Trigger() locks `mu` and notifies `cv`. Register before locking `mu`
  // (Trigger holds its own lock while it takes `mu`; the waiter must not hold `mu` here).
  void Register(std::mutex* mu, std::condition_variable* cv);
  void Unregister();

  // For a wait without a thread: `cancel` runs once, at the trigger (at once when it came
  // already), on the triggering thread with no lock of this object held.
  void OnTrigger(std::function<void()> cancel);

 private:
  std::mutex self_mu_;
  std::mutex* waiter_mu_ = nullptr;
  std::condition_variable* waiter_cv_ = nullptr;
  std::function<void()> on_trigger_;
  std::atomic<bool> triggered_{false};
};

// Registers for the scope of a wait.
class InterruptRegistration {
 public:
  InterruptRegistration(Interrupt* interrupt, std::mutex* mu, std::condition_variable* cv) : interrupt_(interrupt) {
    if (interrupt_ != nullptr) interrupt_->Register(mu, cv);
  }
  ~InterruptRegistration() {
    if (interrupt_ != nullptr) interrupt_->Unregister();
  }
  InterruptRegistration(const InterruptRegistration&) = delete;
  InterruptRegistration& operator=(const InterruptRegistration&) = delete;

 private:
  Interrupt* interrupt_;
};

}  // namespace kvfs::fs
