#include "engine/core/shred.h"

#include <cstring>  // explicit_bzero

namespace kvfs {

// Not inlined: the array must lie below the caller's frame, where the returned calls' frames were.
[[gnu::noinline]] void ScrubStack() {
  unsigned char below[kStackScrubBytes];
  explicit_bzero(below, sizeof below);  // not dropped as a dead store
}

}  // namespace kvfs
