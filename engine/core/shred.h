// Zeroing buffers that held an agent's text or KV bytes before the heap gets them back, so that
// an erased agent's data does not linger in freed memory (a core dump, swap, a debugger), and
// growing such buffers without leaving unzeroed copies behind.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace kvfs {

// Zeros the bytes, the whole buffer's (a string cut or cleared before keeps its old bytes past
// its end), then frees them.
inline void ShredString(std::string& s) {
  s.resize(s.capacity());
  std::fill(s.begin(), s.end(), '\0');
  // (the compiler may not drop the fill: the bytes are still owned and read by no one after,
  // so make the write observable)
  asm volatile("" : : "r"(s.data()) : "memory");
  s.clear();
  s.shrink_to_fit();
}

template <typename T>
void ShredVector(std::vector<T>& v) {
  v.resize(v.capacity());
  if (!v.empty()) std::memset(static_cast<void*>(v.data()), 0, v.size() * sizeof(T));
  asm volatile("" : : "r"(v.data()) : "memory");
  v.clear();
  v.shrink_to_fit();
}

// Makes room for `size` bytes in `s`, moving its bytes to a larger buffer itself (zeroing the old
// one) instead of letting the string reallocate: capacity at least doubles, as std::string's does.
inline void GrowShredding(std::string& s, size_t size) {
  if (size <= s.capacity()) return;
  std::string bigger;
  bigger.reserve(std::max(size, 2 * s.capacity()));
  bigger.assign(s);
  ShredString(s);
  s.swap(bigger);
}

// Zeros the kStackScrubBytes of stack below the caller's frame: what the calls that returned to
// it left there (a JSON serializer's buffer, a formatter's, a tokenizer's scratch) may be an
// agent's text, and a thread's stack below its pointer is freed memory too. Each long-lived
// thread that handles text calls it between units of work (a FUSE request, an engine step, a
// store commit), so an erasure leaves no copy on any thread's stack once those threads are idle.
// About a microsecond a call (64 KiB, in cache).
inline constexpr size_t kStackScrubBytes = 64 * 1024;
void ScrubStack();

// Zeros a block from malloc (its whole usable size) and frees it: for memory that C code
// allocates through kvfs's hooks (zstd's contexts) and for kvfsd's operator delete.
void ZeroAndFree(void* p) noexcept;

}  // namespace kvfs
