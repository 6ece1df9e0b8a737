// On-disk formats of the cache store: constants only (layout, magic numbers, limits). Changing
// any of these changes the format: bump kBlockFormatVersion / kManifestVersion.
//
// Store directory layout:
//   <store>/blocks/<hh>/<32 hex>.kvb   a full KV block, named by its 128-bit hash; <hh> is the
//                                      first two hex digits (256-way fan-out keeps directories
//                                      small and lookups cheap)
//   <store>/agents/<name>/manifest.json  the agent's manifest (the commit point of a turn)
//   <store>/agents/<name>/manifest.prev.json  the manifest of the turn before, kept so that a
//                                      damaged manifest costs one turn, not the agent
//   <store>/agents/<name>/tail.<turn>.kvt  the partial last block as of that turn
//   <store>/agents/.erase.<name>/      an erasure in progress (rename is its commit point)
//   <store>/prefixes/<name>.prefix     a shared prefix of .prefixes/ (prefix_record.h): its text
//                                      and blocks, which it references like an agent's manifest
//   any name ending in ".tmp"          an interrupted write; removed by Open
//   <store>/prefixes/<name>.prefix.retired  a replaced record's bytes until they are zeroed;
//                                      shredded by Open (unlinked while still a second name
//                                      of the live record)
//
// Block and tail file = header (kBlockHeaderBytes, little-endian) + payload:
//   off size field
//     0    4  magic: kBlockMagic (block) or kTailMagic (tail)
//     4    2  format version (kBlockFormatVersion)
//     6    2  header size in bytes (kBlockHeaderBytes), so a reader can reject what it cannot parse
//     8    4  kv format id (opaque to the store; chosen by the KV layer)
//    12    4  flags (kFlagZstd: the payload is one zstd frame)
//    16    4  token count
//    20    4  reserved, 0
//    24    8  stored payload bytes (after compression) = file size - header size
//    32    8  raw payload bytes (before compression)
//    40   16  block hash (canonical xxh3-128 bytes, big-endian hi then lo); zero for tails.
//             A block file therefore proves its own name: a file copied or renamed over
//             another block is detected.
//    56    8  xxh3-64 of the stored payload
//    64    8  xxh3-64 of header bytes [0, 64): a flipped token count or flag is caught too
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvfs::store {

inline constexpr uint32_t kBlockMagic = 0x4B42564B;  // "KVBK" little-endian
inline constexpr uint32_t kTailMagic = 0x4C54564B;   // "KVTL" little-endian
inline constexpr uint16_t kBlockFormatVersion = 1;
inline constexpr uint16_t kBlockHeaderBytes = 72;

inline constexpr size_t kOffMagic = 0;
inline constexpr size_t kOffVersion = 4;
inline constexpr size_t kOffHeaderBytes = 6;
inline constexpr size_t kOffKvFormat = 8;
inline constexpr size_t kOffFlags = 12;
inline constexpr size_t kOffTokens = 16;
inline constexpr size_t kOffReserved = 20;
inline constexpr size_t kOffPayloadBytes = 24;
inline constexpr size_t kOffRawBytes = 32;
inline constexpr size_t kOffHash = 40;
inline constexpr size_t kOffPayloadChecksum = 56;
inline constexpr size_t kOffHeaderChecksum = 64;

inline constexpr uint32_t kFlagZstd = 1u << 0;
inline constexpr uint32_t kKnownFlags = kFlagZstd;

// Upper bound on a block's raw payload: bounds the allocation a hostile header can cause.
// A 256-token block of an 8B model in f16 is 32 MiB; 1 GiB leaves room for any model we run.
inline constexpr uint64_t kMaxRawPayloadBytes = uint64_t{1} << 30;

// Compression is kept only when it saves at least this fraction of the raw bytes; otherwise
// the block is stored raw and a load is one pread plus a checksum. Measured (bench/
// kvfs_store_bench, TinyLlama KV shape, zstd -3): f16 saves 6%, q8 16%, q4 10%, random 4-bit
// 0%, while decompressing runs at ~1 GB/s against ~8 GB/s for reading and verifying a raw block
// from the page cache (an agent of 4096 q4 tokens: 23-34 ms compressed vs ~3 ms raw). Real KV does
// not save enough to pay for that, so only payloads that shrink by a quarter (padding, zeros,
// structured test data) are stored compressed. StoreOptions can lower it to trade load time
// for disk space.
inline constexpr double kMinCompressionSaving = 0.25;
inline constexpr int kDefaultZstdLevel = 3;

inline constexpr std::string_view kBlocksDir = "blocks";
inline constexpr std::string_view kAgentsDir = "agents";
inline constexpr std::string_view kBlockSuffix = ".kvb";
inline constexpr std::string_view kTailPrefix = "tail.";
inline constexpr std::string_view kTailSuffix = ".kvt";
inline constexpr std::string_view kManifestName = "manifest.json";
inline constexpr std::string_view kPrevManifestName = "manifest.prev.json";
inline constexpr std::string_view kErasePrefix = ".erase.";
inline constexpr std::string_view kPrefixesDir = "prefixes";
inline constexpr std::string_view kPrefixSuffix = ".prefix";
inline constexpr std::string_view kPrefixFormat = "kvfs-prefix";
// Version 2 adds "checksum" (json_checksum.h); version 1 records are still read.
inline constexpr int kPrefixVersion = 2;
inline constexpr int kOldestPrefixVersion = 1;
// The last field of a checksummed JSON record (manifests and prefix records from version 2).
inline constexpr std::string_view kJsonChecksumKey = "checksum";

// Manifest (JSON) format identity and limits.
inline constexpr std::string_view kManifestFormat = "kvfs-manifest";
// Version 2 adds "checksum" (manifest.h); version 1 files (no checksum) are still read.
inline constexpr int kManifestVersion = 2;
inline constexpr int kOldestManifestVersion = 1;
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
inline constexpr size_t kMaxAgentNameLen = 64;
inline constexpr uint32_t kMaxBlockSize = 1u << 20;  // tokens per block

}  // namespace kvfs::store
