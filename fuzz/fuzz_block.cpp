// libFuzzer target: the block/tail file decoder (header parser, payload checks, zstd). Each
// input is decoded as is, then again with both checksums recomputed, so that the fuzzer gets
// past them to the structural checks and the decompressor. Whatever decodes must re-encode and
// decode to the same payload.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <xxhash.h>

#include "engine/store/block_file.h"

using namespace kvfs::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)DecodeBlockFile(std::span<const uint8_t>(data, size), "fuzz");
  if (size < kBlockHeaderBytes) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint64_t payload_sum = XXH3_64bits(fixed.data() + kBlockHeaderBytes, size - kBlockHeaderBytes);
  std::memcpy(fixed.data() + kOffPayloadChecksum, &payload_sum, 8);
  const uint64_t header_sum = XXH3_64bits(fixed.data(), kOffHeaderChecksum);
  std::memcpy(fixed.data() + kOffHeaderChecksum, &header_sum, 8);
  // Keep single inputs cheap: a valid header may declare up to 1 GiB of raw payload.
  auto header = ParseBlockHeader(fixed, "fuzz");
  if (header.ok() && header->raw_bytes > (uint64_t{16} << 20)) return 0;
  auto block = DecodeBlockFile(fixed, "fuzz");
  if (!block.ok()) return 0;
  const BlockHeader& h = block->header;
  auto image = EncodeBlockFile(h.kind, h.hash, h.kv_format, h.n_tokens, block->payload);
  if (!image.ok()) __builtin_trap();
  auto again = DecodeBlockFile(*image, "fuzz");
  if (!again.ok() || again->payload != block->payload || again->header.hash != h.hash ||
      again->header.n_tokens != h.n_tokens || again->header.kv_format != h.kv_format)
    __builtin_trap();
  return 0;
}
