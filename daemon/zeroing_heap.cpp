// kvfsd's C++ heap: every block given back through operator delete is zeroed before it is freed.
//
// DESIGN: erasing an agent removes its text, and "freed memory is zeroed". An agent's text goes
// through strings, vectors and JSON values all over the daemon (a manifest's serialization, the
// tokenizer's pieces, an export's header, a config's stop strings), and a string that grows
// leaves its old buffer behind, unreachable from anything an erasure could walk. Zeroing every
// block as it is freed covers all of those copies at once; an erasure then only has to free what
// it holds. The cost is one pass over each freed block, a fraction of the cost of having written
// it (docs/performance.md, "Erased text in the daemon's memory").
//
// Linked into the daemons (kvfsd, kvfsd_fake) only, as the program's replacement of the global
// operators: the library and the CLI keep the default ones; and not into AddressSanitizer builds,
// whose own operators check that new[] meets delete[] (the memory test has ASan fill freed
// memory with zeros instead). Memory that C code mallocs is not covered: fs/fuse_ops.cpp zeroes
// a write's data in libfuse's request buffer, and zstd's contexts get a zeroing allocator
// (engine/store/block_file.cpp).
#include <cstdlib>
#include <new>

#include "engine/core/shred.h"

namespace {

// Tries again after the new-handler, as the default operator new does.
template <typename AllocateOnce>
void* AllocateOrThrow(AllocateOnce allocate_once) {
  for (;;) {
    if (void* p = allocate_once()) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* Allocate(std::size_t size) {
  if (size == 0) size = 1;
  return AllocateOrThrow([size] { return std::malloc(size); });
}

void* AllocateAligned(std::size_t size, std::align_val_t align) {
  std::size_t alignment = static_cast<std::size_t>(align);
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  if (size == 0) size = 1;
  if ((alignment & (alignment - 1)) != 0) throw std::bad_alloc();  // not a power of two: no retry helps
  return AllocateOrThrow([size, alignment]() -> void* {
    void* p = nullptr;
    return posix_memalign(&p, alignment, size) == 0 ? p : nullptr;
  });
}

}  // namespace

using kvfs::ZeroAndFree;

void* operator new(std::size_t size) { return Allocate(size); }
void* operator new[](std::size_t size) { return Allocate(size); }
void* operator new(std::size_t size, std::align_val_t align) { return AllocateAligned(size, align); }
void* operator new[](std::size_t size, std::align_val_t align) { return AllocateAligned(size, align); }

void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return Allocate(size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept { return operator new(size, tag); }
void* operator new(std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  try {
    return AllocateAligned(size, align);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, std::align_val_t align, const std::nothrow_t& tag) noexcept {
  return operator new(size, align, tag);
}

void operator delete(void* p) noexcept { ZeroAndFree(p); }
void operator delete[](void* p) noexcept { ZeroAndFree(p); }
void operator delete(void* p, std::size_t) noexcept { ZeroAndFree(p); }
void operator delete[](void* p, std::size_t) noexcept { ZeroAndFree(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { ZeroAndFree(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { ZeroAndFree(p); }
void operator delete(void* p, std::align_val_t) noexcept { ZeroAndFree(p); }
void operator delete[](void* p, std::align_val_t) noexcept { ZeroAndFree(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { ZeroAndFree(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { ZeroAndFree(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { ZeroAndFree(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { ZeroAndFree(p); }
