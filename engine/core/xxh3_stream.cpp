#include "engine/core/xxh3_stream.h"

#include <cstring>  // explicit_bzero

// The state's layout is needed to own its memory: xxhash gives it only to code that compiles
// xxhash in (XXH_INLINE_ALL, its names prefixed so as not to clash with the shared library's).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvfs {

struct Xxh3Stream::State {
  XXH3_state_t xxh;  // XXH_ALIGN_MEMBER(64, ...) members: new honours the alignment (C++17)
};

Xxh3Stream::Xxh3Stream(Width width) : width_(width), state_(std::make_unique<State>()) {
  XXH3_INITSTATE(&state_->xxh);
  if (width == Width::k64) {
    XXH3_64bits_reset(&state_->xxh);
  } else {
    XXH3_128bits_reset(&state_->xxh);
  }
}

Xxh3Stream::~Xxh3Stream() { explicit_bzero(state_.get(), sizeof(State)); }

void Xxh3Stream::Update(const void* data, size_t size) {
  if (width_ == Width::k64) {
    XXH3_64bits_update(&state_->xxh, data, size);
  } else {
    XXH3_128bits_update(&state_->xxh, data, size);
  }
}

uint64_t Xxh3Stream::Digest64() const { return XXH3_64bits_digest(&state_->xxh); }

Xxh3Hash128 Xxh3Stream::Digest128() const {
  const XXH128_hash_t h = XXH3_128bits_digest(&state_->xxh);
  return {h.low64, h.high64};
}

}  // namespace kvfs
