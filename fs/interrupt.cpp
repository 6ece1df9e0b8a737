#include "fs/interrupt.h"

#include <utility>

namespace kvfs::fs {

void Interrupt::Trigger() {
  std::function<void()> cancel;
  {
    std::lock_guard self(self_mu_);
    triggered_.store(true, std::memory_order_release);
    cancel = std::exchange(on_trigger_, nullptr);
  }
  if (cancel) cancel();
}

void Interrupt::OnTrigger(std::function<void()> cancel) {
  {
    std::lock_guard self(self_mu_);
    if (!triggered_.load(std::memory_order_acquire)) {
      on_trigger_ = std::move(cancel);
      return;
    }
  }
  cancel();
}

}  // namespace kvfs::fs
