// Block and tail files: one KV block (or an agent's partial tail block) per file, a fixed
// checksummed header (layout in block_format.h) and a payload that is zstd-compressed only
// where that pays. Encoding and decoding are pure functions over bytes (fuzzed); reading and
// writing go through the FileSystem seam.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/block_hash.h"
#include "engine/core/status.h"
#include "engine/store/block_format.h"
#include "engine/store/fs.h"

namespace kvfs::store {

using kvfs::BlockHash;
std::string ToHex(const BlockHash& h);
// Accepts exactly 32 hex digits (either case); nullopt otherwise.
std::optional<BlockHash> BlockHashFromHex(std::string_view hex);

enum class BlockKind { kBlock, kTail };

struct BlockHeader {
  BlockKind kind = BlockKind::kBlock;
  uint16_t version = kBlockFormatVersion;
  uint32_t kv_format = 0;
  uint32_t flags = 0;
  uint32_t n_tokens = 0;
  uint64_t payload_bytes = 0;  // as stored
  uint64_t raw_bytes = 0;      // after decompression
  BlockHash hash;              // zero for tails
  uint64_t payload_checksum = 0;
  bool compressed() const { return (flags & kFlagZstd) != 0; }
};

struct BlockEncodeOptions {
  bool allow_compression = true;
  int zstd_level = kDefaultZstdLevel;
  double min_saving = kMinCompressionSaving;
};

// Builds the complete file image. Fails only on an oversized payload or a zstd error.
Result<std::vector<uint8_t>> EncodeBlockFile(BlockKind kind, const BlockHash& hash, uint32_t kv_format,
                                             uint32_t n_tokens, std::span<const uint8_t> payload,
                                             const BlockEncodeOptions& options = {});

// Parses and validates the fixed header: size, magic, version, header size, flags, reserved
// field, limits and the header checksum. `bytes` may be the whole file or just its start.
// Errors are kCorrupt (kUnsupported for a newer format version) and name `name`.
Result<BlockHeader> ParseBlockHeader(std::span<const uint8_t> bytes, std::string_view name);

// Checks the stored payload against the header: its size, its checksum and, when compressed,
// that it is one zstd frame declaring raw_bytes of content. Allocates nothing.
Status VerifyStoredPayload(const BlockHeader& header, std::span<const uint8_t> stored, std::string_view name);

// Verifies the stored payload against the header (size, checksum) and decodes it into `dst`,
// which must be exactly header.raw_bytes long (so a caller can decode straight into pool memory).
Status DecodeBlockPayloadInto(const BlockHeader& header, std::span<const uint8_t> stored,
                              std::span<uint8_t> dst, std::string_view name);

struct DecodedBlock {
  BlockHeader header;
  std::vector<uint8_t> payload;  // raw (decompressed) bytes
};

// Header + payload checks of a whole file image.
Result<DecodedBlock> DecodeBlockFile(std::span<const uint8_t> file, std::string_view name);

// Reads `path` through the seam and decodes it; checks that it is of `kind`, that it is exactly
// header + payload long and, when `expect_hash` is given, that the header names that hash.
// An uncompressed payload is read once, straight into the returned buffer. Errors name the path.
Result<DecodedBlock> ReadBlockFile(FileSystem& fs, const std::string& path, BlockKind kind,
                                   const std::optional<BlockHash>& expect_hash);

// The same into caller memory (e.g. a block of the KV pool, whose size the caller knows from its
// format): the header is checked first, then `dst` must be exactly raw_bytes long
// (kInvalidArgument otherwise). On error the contents of `dst` are unspecified.
Result<BlockHeader> ReadBlockFileInto(FileSystem& fs, const std::string& path, BlockKind kind,
                                      const std::optional<BlockHash>& expect_hash, std::span<uint8_t> dst);
// The payload part only, for a header already read and checked.
Status ReadBlockPayloadInto(FileSystem& fs, const std::string& path, const BlockHeader& header, std::span<uint8_t> dst);

}  // namespace kvfs::store
