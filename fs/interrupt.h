// A cancellation flag for a read of `response` that waits for text. The FUSE layer triggers it
// from libfuse's interrupt callback (a FUSE_INTERRUPT from the kernel: Ctrl-C or a kill of the
// reader), and the waiting read is answered EINTR at once.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>

namespace kvfs::fs {

class Interrupt {
 public:
  // Sets the flag and runs the cancel set by OnTrigger, if any. Any thread, any number of times.
  void Trigger();
  bool triggered() const { return triggered_.load(std::memory_order_acquire); }

  // For the wait: `cancel` runs once, at the trigger (at once when it came already), on the
  // triggering thread with no lock of this object held.
  void OnTrigger(std::function<void()> cancel);

 private:
  std::mutex self_mu_;
  std::function<void()> on_trigger_;
  std::atomic<bool> triggered_{false};
};

}  // namespace kvfs::fs
