#include "engine/store/block_file.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <xxhash.h>
// ZSTD_customMem and the contexts made with it: zstd's "static linking only" section, exported
// by the shared library as well (its experimental API; the struct has not changed since 1.3).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include "engine/core/shred.h"

namespace kvfs::store {
namespace {

template <typename T>
void Put(std::vector<uint8_t>& out, size_t off, T v) {
  std::memcpy(out.data() + off, &v, sizeof(T));  // little-endian host (checked by CMake)
}

template <typename T>
T Get(std::span<const uint8_t> in, size_t off) {
  T v;
  std::memcpy(&v, in.data() + off, sizeof(T));
  return v;
}

// zstd's working memory holds copies of what it codes (literals, the window): a block's KV
// bytes. zstd mallocs it, out of reach of kvfsd's zeroing operator delete, so its contexts get
// an allocator that zeros a buffer before freeing it, as every other copy of an erased agent's
// data is (DESIGN: freed memory is zeroed).
void* ZstdAllocate(void*, size_t size) { return std::malloc(size); }
void ZstdZeroAndFree(void*, void* p) { ZeroAndFree(p); }
constexpr ZSTD_customMem kZeroingMemory{ZstdAllocate, ZstdZeroAndFree, nullptr};

struct CompressContextFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DecompressContextFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

void PutHash(std::vector<uint8_t>& out, size_t off, const BlockHash& h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH128_hash_t{h.lo, h.hi});
  std::memcpy(out.data() + off, c.digest, sizeof(c.digest));
}

BlockHash GetHash(std::span<const uint8_t> in, size_t off) {
  XXH128_canonical_t c;
  std::memcpy(c.digest, in.data() + off, sizeof(c.digest));
  XXH128_hash_t h = XXH128_hashFromCanonical(&c);
  return BlockHash{h.high64, h.low64};
}

std::string Where(std::string_view name) { return std::string(name) + ": "; }

const char* KindName(BlockKind k) { return k == BlockKind::kBlock ? "block" : "tail"; }

}  // namespace

std::string ToHex(const BlockHash& h) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[static_cast<size_t>(15 - i)] = kDigits[(h.hi >> (4 * i)) & 0xF];
    out[static_cast<size_t>(31 - i)] = kDigits[(h.lo >> (4 * i)) & 0xF];
  }
  return out;
}

std::optional<BlockHash> BlockHashFromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t d;
    if (c >= '0' && c <= '9') d = static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<uint64_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') d = static_cast<uint64_t>(c - 'A' + 10);
    else return std::nullopt;
    parts[i / 16] = (parts[i / 16] << 4) | d;
  }
  return BlockHash{parts[0], parts[1]};
}

Result<std::vector<uint8_t>> EncodeBlockFile(BlockKind kind, const BlockHash& hash, uint32_t kv_format,
                                             uint32_t n_tokens, std::span<const uint8_t> payload,
                                             const BlockEncodeOptions& options) {
  if (payload.size() > kMaxRawPayloadBytes)
    return InvalidArgument("block payload of " + std::to_string(payload.size()) + " bytes exceeds the limit");
  std::vector<uint8_t> out;
  uint32_t flags = 0;
  if (options.allow_compression && !payload.empty()) {
    // Compress straight after the header; fall back to raw if it does not save enough.
    const size_t bound = ZSTD_compressBound(payload.size());
    out.resize(kBlockHeaderBytes + bound);
    const std::unique_ptr<ZSTD_CCtx, CompressContextFree> context(ZSTD_createCCtx_advanced(kZeroingMemory));
    if (context == nullptr) return Status(StatusCode::kResourceExhausted, "zstd: no memory for a compression context");
    size_t n = ZSTD_compressCCtx(context.get(), out.data() + kBlockHeaderBytes, bound, payload.data(),
                                 payload.size(), options.zstd_level);
    if (ZSTD_isError(n)) return Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    if (static_cast<double>(n) <= static_cast<double>(payload.size()) * (1.0 - options.min_saving)) {
      out.resize(kBlockHeaderBytes + n);
      flags |= kFlagZstd;
    }
  }
  if ((flags & kFlagZstd) == 0) {
    out.assign(kBlockHeaderBytes + payload.size(), 0);
    if (!payload.empty()) std::memcpy(out.data() + kBlockHeaderBytes, payload.data(), payload.size());
  }
  std::fill(out.begin(), out.begin() + kBlockHeaderBytes, uint8_t{0});
  const uint64_t stored = out.size() - kBlockHeaderBytes;
  Put<uint32_t>(out, kOffMagic, kind == BlockKind::kBlock ? kBlockMagic : kTailMagic);
  Put<uint16_t>(out, kOffVersion, kBlockFormatVersion);
  Put<uint16_t>(out, kOffHeaderBytes, kBlockHeaderBytes);
  Put<uint32_t>(out, kOffKvFormat, kv_format);
  Put<uint32_t>(out, kOffFlags, flags);
  Put<uint32_t>(out, kOffTokens, n_tokens);
  Put<uint64_t>(out, kOffPayloadBytes, stored);
  Put<uint64_t>(out, kOffRawBytes, payload.size());
  PutHash(out, kOffHash, kind == BlockKind::kBlock ? hash : BlockHash{});
  Put<uint64_t>(out, kOffPayloadChecksum, XXH3_64bits(out.data() + kBlockHeaderBytes, stored));
  Put<uint64_t>(out, kOffHeaderChecksum, XXH3_64bits(out.data(), kOffHeaderChecksum));
  return out;
}

Result<BlockHeader> ParseBlockHeader(std::span<const uint8_t> bytes, std::string_view name) {
  if (bytes.size() < kBlockHeaderBytes)
    return Corrupt(Where(name) + "truncated header: " + std::to_string(bytes.size()) + " bytes, need " +
                   std::to_string(kBlockHeaderBytes));
  BlockHeader h;
  const uint32_t magic = Get<uint32_t>(bytes, kOffMagic);
  if (magic == kBlockMagic) h.kind = BlockKind::kBlock;
  else if (magic == kTailMagic) h.kind = BlockKind::kTail;
  else return Corrupt(Where(name) + "bad magic (not a kvfs block or tail file)");
  h.version = Get<uint16_t>(bytes, kOffVersion);
  if (h.version == 0) return Corrupt(Where(name) + "format version 0");
  if (h.version > kBlockFormatVersion)
    return Unsupported(Where(name) + "format version " + std::to_string(h.version) + " is newer than this build's " +
                       std::to_string(kBlockFormatVersion));
  if (Get<uint16_t>(bytes, kOffHeaderBytes) != kBlockHeaderBytes)
    return Corrupt(Where(name) + "header size " + std::to_string(Get<uint16_t>(bytes, kOffHeaderBytes)) +
                   " is not " + std::to_string(kBlockHeaderBytes));
  if (XXH3_64bits(bytes.data(), kOffHeaderChecksum) != Get<uint64_t>(bytes, kOffHeaderChecksum))
    return Corrupt(Where(name) + "header checksum mismatch");
  h.kv_format = Get<uint32_t>(bytes, kOffKvFormat);
  h.flags = Get<uint32_t>(bytes, kOffFlags);
  if ((h.flags & ~kKnownFlags) != 0) return Corrupt(Where(name) + "unknown flags " + std::to_string(h.flags));
  if (Get<uint32_t>(bytes, kOffReserved) != 0) return Corrupt(Where(name) + "reserved field is not zero");
  h.n_tokens = Get<uint32_t>(bytes, kOffTokens);
  h.payload_bytes = Get<uint64_t>(bytes, kOffPayloadBytes);
  h.raw_bytes = Get<uint64_t>(bytes, kOffRawBytes);
  if (h.raw_bytes > kMaxRawPayloadBytes)
    return Corrupt(Where(name) + "raw payload size " + std::to_string(h.raw_bytes) + " exceeds the limit");
  if (!h.compressed() && h.payload_bytes != h.raw_bytes)
    return Corrupt(Where(name) + "uncompressed payload: stored size " + std::to_string(h.payload_bytes) +
                   " != raw size " + std::to_string(h.raw_bytes));
  if (h.compressed() && h.payload_bytes > ZSTD_compressBound(h.raw_bytes))
    return Corrupt(Where(name) + "compressed payload larger than zstd's bound for its raw size");
  h.hash = GetHash(bytes, kOffHash);
  if (h.kind == BlockKind::kTail && h.hash != BlockHash{}) return Corrupt(Where(name) + "tail file carries a block hash");
  h.payload_checksum = Get<uint64_t>(bytes, kOffPayloadChecksum);
  return h;
}

Status VerifyStoredPayload(const BlockHeader& header, std::span<const uint8_t> stored, std::string_view name) {
  if (stored.size() != header.payload_bytes)
    return Corrupt(Where(name) + "payload is " + std::to_string(stored.size()) + " bytes, header says " +
                   std::to_string(header.payload_bytes) + (stored.size() < header.payload_bytes ? " (truncated)" : ""));
  if (XXH3_64bits(stored.data(), stored.size()) != header.payload_checksum)
    return Corrupt(Where(name) + "payload checksum mismatch");
  if (header.compressed()) {
    // Exactly one frame, declaring exactly raw_bytes of content (checked before anything is
    // allocated for it).
    const size_t frame = ZSTD_findFrameCompressedSize(stored.data(), stored.size());
    if (ZSTD_isError(frame) || frame != stored.size())
      return Corrupt(Where(name) + "payload is not exactly one zstd frame");
    if (ZSTD_getFrameContentSize(stored.data(), stored.size()) != header.raw_bytes)
      return Corrupt(Where(name) + "zstd frame does not declare " + std::to_string(header.raw_bytes) + " bytes");
  }
  return Status::Ok();
}

namespace {

// Decodes a payload that VerifyStoredPayload accepted into dst (exactly raw_bytes long).
Status DecodeVerified(const BlockHeader& header, std::span<const uint8_t> stored, std::span<uint8_t> dst,
                      std::string_view name) {
  if (!header.compressed()) {
    if (!stored.empty()) std::memcpy(dst.data(), stored.data(), stored.size());
    return Status::Ok();
  }
  const std::unique_ptr<ZSTD_DCtx, DecompressContextFree> context(ZSTD_createDCtx_advanced(kZeroingMemory));
  if (context == nullptr) return Status(StatusCode::kResourceExhausted, "zstd: no memory for a decompression context");
  const size_t n = ZSTD_decompressDCtx(context.get(), dst.data(), dst.size(), stored.data(), stored.size());
  if (ZSTD_isError(n)) return Corrupt(Where(name) + "zstd: " + ZSTD_getErrorName(n));
  if (n != header.raw_bytes)
    return Corrupt(Where(name) + "decompressed to " + std::to_string(n) + " bytes, header says " +
                   std::to_string(header.raw_bytes));
  return Status::Ok();
}

}  // namespace

Status DecodeBlockPayloadInto(const BlockHeader& header, std::span<const uint8_t> stored, std::span<uint8_t> dst,
                              std::string_view name) {
  if (dst.size() != header.raw_bytes)
    return InvalidArgument(Where(name) + "destination is " + std::to_string(dst.size()) + " bytes, block holds " +
                           std::to_string(header.raw_bytes));
  KVFS_RETURN_IF_ERROR(VerifyStoredPayload(header, stored, name));
  return DecodeVerified(header, stored, dst, name);
}

Result<DecodedBlock> DecodeBlockFile(std::span<const uint8_t> file, std::string_view name) {
  DecodedBlock out;
  KVFS_ASSIGN_OR_RETURN(out.header, ParseBlockHeader(file, name));
  const auto stored = file.subspan(kBlockHeaderBytes);
  KVFS_RETURN_IF_ERROR(VerifyStoredPayload(out.header, stored, name));
  out.payload.resize(static_cast<size_t>(out.header.raw_bytes));
  KVFS_RETURN_IF_ERROR(DecodeVerified(out.header, stored, out.payload, name));
  return out;
}

namespace {

// Reads and checks the header of `path` and that the file is exactly header + payload long.
Result<BlockHeader> ReadCheckedHeader(FileSystem& fs, const std::string& path, BlockKind kind,
                                      const std::optional<BlockHash>& expect_hash) {
  KVFS_ASSIGN_OR_RETURN(uint64_t size, fs.FileSize(path));
  if (size < kBlockHeaderBytes)
    return Corrupt(path + ": truncated header: " + std::to_string(size) + " bytes, need " +
                   std::to_string(kBlockHeaderBytes));
  std::array<uint8_t, kBlockHeaderBytes> raw;
  KVFS_RETURN_IF_ERROR(fs.ReadAt(path, 0, raw));
  KVFS_ASSIGN_OR_RETURN(BlockHeader h, ParseBlockHeader(raw, path));
  if (h.kind != kind)
    return Corrupt(path + ": is a " + KindName(h.kind) + " file, expected a " + KindName(kind) + " file");
  if (expect_hash && h.hash != *expect_hash)
    return Corrupt(path + ": header names block " + ToHex(h.hash) + ", expected " + ToHex(*expect_hash));
  if (size != kBlockHeaderBytes + h.payload_bytes)
    return Corrupt(path + ": file is " + std::to_string(size) + " bytes, header says " +
                   std::to_string(kBlockHeaderBytes + h.payload_bytes) + (size < kBlockHeaderBytes + h.payload_bytes
                                                                              ? " (truncated)" : ""));
  return h;
}

}  // namespace

Result<DecodedBlock> ReadBlockFile(FileSystem& fs, const std::string& path, BlockKind kind,
                                   const std::optional<BlockHash>& expect_hash) {
  DecodedBlock out;
  KVFS_ASSIGN_OR_RETURN(out.header, ReadCheckedHeader(fs, path, kind, expect_hash));
  out.payload.resize(static_cast<size_t>(out.header.raw_bytes));
  KVFS_RETURN_IF_ERROR(ReadBlockPayloadInto(fs, path, out.header, out.payload));
  return out;
}

Status ReadBlockPayloadInto(FileSystem& fs, const std::string& path, const BlockHeader& header, std::span<uint8_t> dst) {
  if (dst.size() != header.raw_bytes)
    return InvalidArgument(path + ": destination is " + std::to_string(dst.size()) + " bytes, block holds " +
                           std::to_string(header.raw_bytes));
  if (!header.compressed()) {  // one read straight into place, then the checksum over it
    KVFS_RETURN_IF_ERROR(fs.ReadAt(path, kBlockHeaderBytes, dst));
    return VerifyStoredPayload(header, dst, path);
  }
  std::vector<uint8_t> stored(static_cast<size_t>(header.payload_bytes));
  Status decoded = fs.ReadAt(path, kBlockHeaderBytes, stored);
  if (decoded.ok()) decoded = VerifyStoredPayload(header, stored, path);
  if (decoded.ok()) decoded = DecodeVerified(header, stored, dst, path);
  ShredVector(stored);  // KV rows, compressed: not left in freed memory
  return decoded;
}

Result<BlockHeader> ReadBlockFileInto(FileSystem& fs, const std::string& path, BlockKind kind,
                                      const std::optional<BlockHash>& expect_hash, std::span<uint8_t> dst) {
  KVFS_ASSIGN_OR_RETURN(BlockHeader header, ReadCheckedHeader(fs, path, kind, expect_hash));
  KVFS_RETURN_IF_ERROR(ReadBlockPayloadInto(fs, path, header, dst));
  return header;
}

}  // namespace kvfs::store
