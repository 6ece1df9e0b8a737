#include "fs/interrupt.h"

#include <utility>

namespace kvfs::fs {

void Interrupt::Trigger() {
  std::function<void()> cancel;
  {
    std::lock_guard self(self_mu_);
    triggered_.store(true, std::memory_order_release);
    if (waiter_cv_ != nullptr) {
      // Taking the waiter's mutex orders this notify after its predicate check: it is either
      // about to see the flag or already waiting.
      std::lock_guard waiter(*waiter_mu_);
      waiter_cv_->notify_all();
    }
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

void Interrupt::Register(std::mutex* mu, std::condition_variable* cv) {
  std::lock_guard self(self_mu_);
  waiter_mu_ = mu;
  waiter_cv_ = cv;
}

void Interrupt::Unregister() {
  std::lock_guard self(self_mu_);
  waiter_mu_ = nullptr;
  waiter_cv_ = nullptr;
}

}  // namespace kvfs::fs
