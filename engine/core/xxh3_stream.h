// XXH3 of data given in pieces, with a state that is zeroed when the hash is done.
//
// xxhash's own XXH3_createState mallocs the state and XXH3_freeState frees it as it is. The state
// buffers the last bytes hashed (up to 256), and what kvfs hashes in pieces is an agent's text (a
// manifest's JSON, an export's key): that copy stayed in freed memory after an erasure, where the
// daemon's zeroing heap (daemon/zeroing_heap.cpp) cannot reach malloc's blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvfs {

struct Xxh3Hash128 {
  uint64_t low64 = 0;
  uint64_t high64 = 0;
};

class Xxh3Stream {
 public:
  enum class Width { k64, k128 };
  explicit Xxh3Stream(Width width);
  ~Xxh3Stream();  // zeros the state
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void Update(const void* data, size_t size);
  uint64_t Digest64() const;      // Width::k64
  Xxh3Hash128 Digest128() const;  // Width::k128

 private:
  struct State;  // xxhash's XXH3 state, 64-byte aligned (xxh3_stream.cpp)
  Width width_;
  std::unique_ptr<State> state_;
};

}  // namespace kvfs
