// Model fingerprint: identifies the exact weights a KV cache was computed with, so a cache is
// never loaded into another model. xxh3-128 over the GGUF header region (metadata and tensor
// table as raw bytes), the parsed tensor table, and sampled tensor bytes: the start, middle and
// end of every tensor (64 KiB each by default, whole tensors when smaller). Only sampled pages
// of the mapping are touched, so an 8B model fingerprints in milliseconds from the page cache.
// A change confined to unsampled bytes of a tensor is not detected; a re-quantization, a
// fine-tune, another vocabulary or any metadata change is.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model/gguf.h"

namespace kvfs {

struct FingerprintOptions {
  uint64_t sample_bytes = 64 * 1024;  // per region (start, middle, end) of each tensor
  // Cap on all sampled bytes together: with many tensors the per-region sample shrinks
  // (down to 4 KiB) to stay under it.
  uint64_t max_total_sample_bytes = uint64_t{96} << 20;
};

// 32 lowercase hex digits (xxh3-128, canonical byte order).
std::string ModelFingerprint(const GgufFile& file, const FingerprintOptions& options = {});

}  // namespace kvfs
