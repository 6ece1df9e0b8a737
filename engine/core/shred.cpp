#include "engine/core/shred.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>  // explicit_bzero

namespace kvfs {

// Not inlined: the array must lie below the caller's frame, where the returned calls' frames were.
[[gnu::noinline]] void ScrubStack() {
  unsigned char below[kStackScrubBytes];
  explicit_bzero(below, sizeof below);  // not dropped as a dead store
}

// The whole usable block, not just the size asked for: a string's bytes may sit anywhere in
// its capacity. explicit_bzero, so that the compiler cannot drop the stores as dead before free.
void ZeroAndFree(void* p) noexcept {
  if (p == nullptr) return;
  explicit_bzero(p, malloc_usable_size(p));
  std::free(p);
}

}  // namespace kvfs
