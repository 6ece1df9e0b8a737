// Xxh3Stream (engine/core/xxh3_stream.h) against xxhash's one-shot functions of the shared
// library: the same digests for any cut of the input into pieces.
#include "engine/core/xxh3_stream.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <xxhash.h>

namespace kvfs {
namespace {

TEST(Xxh3Stream, PiecesHashAsTheLibrarysOneShot) {
  std::mt19937 rng(7);
  // Around XXH3's internal thresholds (16, 128, 240 bytes, its 256-byte buffer, its stripes).
  for (size_t size : {0, 1, 16, 17, 128, 129, 239, 240, 241, 255, 256, 257, 1024, 1025, 5000}) {
    std::vector<unsigned char> data(size);
    for (auto& b : data) b = static_cast<unsigned char>(rng());
    for (int trial = 0; trial < 4; ++trial) {
      Xxh3Stream s64(Xxh3Stream::Width::k64), s128(Xxh3Stream::Width::k128);
      size_t at = 0;
      while (at < size) {
        const size_t n = std::min(size - at, static_cast<size_t>(rng() % (trial == 0 ? 2 : 300)) + 1);
        s64.Update(data.data() + at, n);
        s128.Update(data.data() + at, n);
        at += n;
      }
      EXPECT_EQ(s64.Digest64(), XXH3_64bits(data.data(), size)) << size << " bytes, trial " << trial;
      const XXH128_hash_t want = XXH3_128bits(data.data(), size);
      const Xxh3Hash128 got = s128.Digest128();
      EXPECT_EQ(got.low64, want.low64) << size << " bytes, trial " << trial;
      EXPECT_EQ(got.high64, want.high64) << size << " bytes, trial " << trial;
    }
  }
}

}  // namespace
}  // namespace kvfs
