// kv.safetensors: one agent's KV cache as a single, portable safetensors file.
//
// File = u64 little-endian N, N bytes of JSON header (padded with spaces so the data starts at a
// multiple of 8), then the data buffer. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (relative to the data buffer; the tensors tile
// the buffer exactly) and "__metadata__" to an object of string values.
//
// Tensors. Each KV row (one token's K or V vector of one layer, kv_format.h) is a sequence of
// groups of G values; the file splits every group into its fields and stores each field of all
// cached tokens as one tensor, so a generic reader sees scales and codes as ordinary arrays.
// For layer i and plane p in {k, v} (n = n_cached, ng = n_head_kv * head_dim / G):
//   f16: layers.{i}.{p}          F16 [n, n_head_kv, head_dim]  the row's halfs
//   q8:  layers.{i}.{p}.codes    I8  [n, ng, G]                x = scale * code
//        layers.{i}.{p}.scales   F16 [n, ng]
//   q4:  layers.{i}.{p}.codes    U8  [n, ng, G/2]              packed as in the row: value 2j in
//                                                              the low nibble of byte j
//        layers.{i}.{p}.scales   F16 [n, ng]                   x = min + scale * nibble
//        layers.{i}.{p}.mins     F16 [n, ng]
//   q4k (kv_format.h; C = k_chunk_tokens, S = group_size, nv = n_head_kv * head_dim,
//        nc = n / C complete K chunks, ns = n % C staged tokens, nsub = nv / S,
//        nq = ceil(nsub / 4)):
//        layers.{i}.k.codes        U8  [nc, nv, C/2]   chunk c, channel j: nibbles of tokens
//                                                      c*C .. c*C+C-1, token 2t in the low
//                                                      nibble of byte t
//        layers.{i}.k.scales       F16 [nc, nv]        key = min + scale * nibble
//        layers.{i}.k.mins         F16 [nc, nv]
//        layers.{i}.k.staged       F16 [ns, n_head_kv, head_dim]  keys of tokens nc*C .. n-1,
//                                                      not yet quantized (not rotated)
//        layers.{i}.v.codes        U8  [n, nsub, S/2]  packed as in q4
//        layers.{i}.v.scale_units  F16 [n]             the row's D
//        layers.{i}.v.min_units    F16 [n]             the row's M
//        layers.{i}.v.sub_fields   U8  [n, nq, 5]      per quad of sub-blocks, 40 bits little-
//                                                      endian: sub-block k's 10 bits at 10k,
//                                                      sc = f & 31, mn = (f >> 5) - 15, and its
//                                                      values are M*mn + (D*sc)*nibble
// Tensors are written layer by layer, k before v, fields in the order listed. With rotation the
// values are those of the Walsh-Hadamard-rotated head (kv_format.h); a reader that wants the
// model's K/V must rotate back.
//
// __metadata__ (all values are strings, as safetensors requires):
//   format "kvfs-kv", format_version "2" (read: "1" too, whose payload_xxh3_64 is optional),
//   payload_xxh3_64 (XXH3-64 of the data buffer, 16 lowercase hex digits), model_fingerprint
//   (32 hex), kv_format ("f16", "q8", "q4", "q4k"), group_size, rotation ("on"/"off"), n_layer,
//   n_head_kv, head_dim, n_cached (decimal), token_ids (a JSON array of ints, as a string),
//   conversation (a JSON array of {"role", "text"}, as a string); q4k adds k_chunk_tokens
//   (decimal); context_text (optional: the text the token ids were made from, as the model saw
//   it, when known); token_ends (optional, with context_text: a JSON array, per token id the
//   difference of its text's end in context_text from the previous one's, -1 when it has none).
// Readers ignore metadata keys they do not know (tools such as safetensors' save_file let users
// annotate a file; format_version is what gates the meaning of the tensors and which keys are
// required), but reject unknown tensors, since the tensors must cover the data buffer exactly.
// Reader limits (parsed JSON costs far more memory than its text): header <= 100 MiB, nesting as
// deep as the format needs, at most ~4096 metadata entries, conversation turns <= token ids + 1024.
//
// The "packed KV chunk" convention between the engine and the store: kv_payload_layout.h (for
// the row formats, [layer][K then V][n rows][row_bytes]). A full block of the in-memory pool is
// exactly this with n = block_tokens; a tail is the same for its n tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"
#include "engine/store/kv_payload_layout.h"
#include "engine/store/manifest.h"

namespace kvfs::store {

struct KvChunk {
  std::span<const uint8_t> payload;
  int64_t n_tokens = 0;
};

// The KV geometry a cache was computed with (what the file records and an import must match).
struct KvGeometry {
  int64_t n_layer = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  std::string kv_type;  // "f16", "q8", "q4", "q4k"
  int64_t group = 0;    // values per group (KvFormat::group; q4k: per V sub-block)
  bool rotate = false;
  int64_t chunk = 0;    // q4k: tokens per K chunk (KvFormat::chunk); 0 otherwise
  friend bool operator==(const KvGeometry&, const KvGeometry&) = default;
};

// Bytes of one token's K row (== its V row; q4k: its V row) in this geometry; 0 for an invalid
// geometry.
int64_t KvRowBytes(const KvGeometry& g);
// The packed-chunk geometry (kv_payload_layout.h) of a valid geometry.
KvPayloadGeometry KvPayloadOf(const KvGeometry& g);
// kInvalidArgument naming the field when the geometry is unusable (unknown type, group that does
// not divide the row, sizes out of range).
Status ValidateKvGeometry(const KvGeometry& g);

struct CacheExportInfo {
  std::string model_fingerprint;  // 32 lowercase hex
  KvGeometry geometry;
  std::vector<int32_t> tokens;    // the conversation's tokens
  int64_t n_cached = 0;           // tokens that have K/V rows (<= tokens.size())
  std::vector<ConversationTurn> conversation;
  // The rendered text behind `tokens` (chat template applied), or empty when unknown; only
  // meaningful when n_cached == tokens.size().
  std::string context_text;
  // With context_text: per token, where its text ends in context_text, as differences from the
  // previous end (-1: none of its own; context_text.h); empty when unknown.
  std::vector<int64_t> token_end_deltas;
  friend bool operator==(const CacheExportInfo&, const CacheExportInfo&) = default;
};

// Serializes the cache. The chunks hold the first n_cached tokens in order; each payload must be
// exactly the packed size of its n_tokens (kv_payload_layout.h); q4k: every chunk but the last
// holds whole K chunks (a multiple of C tokens). kInvalidArgument naming what is wrong otherwise.
Result<std::string> WriteKvSafetensors(const CacheExportInfo& info, std::span<const KvChunk> chunks);
// The size of the file WriteKvSafetensors makes of this info (with n_cached tokens of chunks),
// without the chunks: what `ls -l` and tar are told before the file is assembled. Costs the
// header (a JSON dump of the token ids and the conversation), not the data.
Result<uint64_t> KvSafetensorsBytes(const CacheExportInfo& info);

struct ImportedCache {
  CacheExportInfo info;
  // The cache split at block_tokens: full blocks in the pool's block layout, then the last,
  // partial block compact (no chunk when n_cached is 0).
  std::vector<std::vector<uint8_t>> chunks;
  std::vector<int64_t> chunk_tokens;
};

// Parses and validates a whole file: header length, JSON, dtypes, shapes, offsets (in range,
// contiguous, covering the buffer), metadata, token ids, UTF-8 text, and that the file was made
// for `expected_fingerprint` and `expected` geometry. Errors name what is wrong:
//   kInvalidArgument: a valid file for another model, KV format, group, rotation, geometry or
//                     format version (and bad arguments);
//   kCorrupt:         anything malformed or truncated.
// Allocates at most about the size of `bytes` (every size is checked against it first).
Result<ImportedCache> ReadKvSafetensors(std::string_view bytes, std::string_view expected_fingerprint,
                                        const KvGeometry& expected, int64_t block_tokens);

}  // namespace kvfs::store
