// KV cache formats. One token's K (or V) vector of one layer, n_head_kv * head_dim values, is
// stored as a row of groups of G consecutive values:
//   f16: G halfs                                   (2 bytes/value)
//   q8:  f16 scale d, G int8 codes     x = d*q     (G+2 bytes per group)
//   q4:  f16 scale d, f16 min m, G/2 bytes of nibbles, x = m + d*q, q in 0..15,
//        value 2i in the low nibble of byte i, value 2i+1 in the high nibble   (G/2+4 bytes)
// With rotation, each head's K and V are multiplied by the orthonormal Walsh-Hadamard matrix
// before quantization (spreads outliers across the head so 4-bit groups lose less); Q is
// rotated alike so Q.K is unchanged, and the attention output is rotated back.
//
// q4k: keys 4-bit per channel over chunks of tokens, values 4-bit with two-level scales.
//   K: quantized per channel over chunks of C consecutive tokens (C = `chunk`, dividing the
//      KV block). A chunk of C tokens x n channels is n channel records, one after another:
//        record c = f16 scale d, f16 min m, C/2 bytes of nibbles: key[t][c] = m + d*q,
//                   token 2i in the low nibble of byte i, 2i+1 in the high nibble
//      i.e. the q4 encoding, with group C, of the chunk transposed to channel-major; one head's
//      slice of a chunk (channels [h*hd, (h+1)*hd)) is contiguous. Keys carry large
//      per-channel offsets and scales (outlier channels, the slow RoPE pairs); a per-channel
//      minimum and step absorb them where a per-token group spends its 16 levels on them.
//      Keys are not rotated (a rotation would mix the outlier channels into every channel).
//      The newest n % C tokens of a sequence, whose chunk is not complete, are kept as f16 K
//      rows in a per-sequence staging area (sequence_kv.h) and quantized when the chunk fills.
//   V: one row per token (rotated per head when `rotate`), in sub-blocks of S = `group` values
//      (S divides head_dim: a sub-block never spans two heads). The row starts with f16 D and
//      f16 M; then come quads of 4 sub-blocks (the last may have fewer), each 5 bytes of
//      fields followed by the quad's nibbles (S/2 bytes per sub-block, as in q4). Sub-block k of
//      a quad has a 10-bit field at bit 10*k of the little-endian 40 bits: sc = field & 31
//      (0..31), mn = (field >> 5) - 15 (-15..15), and its values are M*mn + (D*sc)*q. Scale
//      and minimum of every sub-block are 5-bit multiples of row-wide f16 units, so sub-blocks
//      of 16 cost 10 bits of header where a q4 group costs 32.
//   Bytes per token and layer for n values each of K and V: n/2 + 4n/C (K) plus
//   4 + 5*ceil(n/S/4) + n/2 (V); tinyllama (n 256, C 64, S 16): 144 + 152 = 0.289x f16.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/status.h"

namespace kvfs {

enum class KvType : uint32_t { kF16 = 1, kQ8 = 2, kQ4 = 3, kQ4K = 4 };  // stored in files: do not renumber

// q4k: tokens per K chunk (K costs what q4 with G = 64 does; divides the 256-token KV block) and
// the largest V sub-block.
constexpr int64_t kQ4KChunkTokens = 64;
constexpr int64_t kQ4KMaxSubBlock = 16;

struct KvFormat {
  KvType type = KvType::kF16;
  int64_t group = 64;   // values per group (q4k: per V sub-block)
  bool rotate = false;  // Walsh-Hadamard rotation per head (q4k: of V only)
  int64_t chunk = 0;    // q4k: tokens per K chunk; 0 for the row formats

  // Bytes of one row of n values (n a multiple of group); q4k rows are V rows.
  int64_t RowBytes(int64_t n) const;
  // q4k: bytes of one K chunk of `chunk` tokens x n channels.
  int64_t ChunkBytes(int64_t n) const { return n * (4 + chunk / 2); }
  // Keys stored per channel in chunks of tokens (q4k) rather than as rows.
  bool KeysByChannel() const { return type == KvType::kQ4K; }
  bool RotatesK() const { return rotate && type != KvType::kQ4K; }
  bool RotatesV() const { return rotate; }
  // The format of q4k's f16 staging rows of K (the incomplete chunk): f16, not rotated.
  KvFormat StagingFormat() const { return KvFormat{KvType::kF16, group, false, 0}; }
  std::string Name() const;  // "f16", "q8", "q4", "q4k", "q4-norot"...
  bool operator==(const KvFormat&) const = default;
};

// A 32-bit id of the format (type, group, rotation) for file headers: type | rotate << 8 | group << 16.
uint32_t KvFormatId(const KvFormat& f);

// The format for a model's geometry: group = largest divisor of n_head_kv*head_dim up to 64
// (q4k: largest even divisor of head_dim up to 16; chunk = kQ4KChunkTokens);
// rotation on by default for q4/q8/q4k when head_dim is a power of two.
// type_name: "f16", "q8", "q4" or "q4k"; rotate: "on", "off" or "" (default).
Result<KvFormat> MakeKvFormat(std::string_view type_name, std::string_view rotate, int64_t n_head_kv,
                              int64_t head_dim);

// Encodes n values (already rotated when the format rotates) into a row (q4k: a V row; the
// sub-block scales and minimums are chosen among a few candidates for the least squared error).
void KvQuantizeRow(const KvFormat& f, const float* x, uint8_t* row, int64_t n);
// Decodes values [begin, begin + n) of a row; begin and n are multiples of... anything:
// partial groups are handled (attention decodes one head's slice at a time).
void KvDequantize(const KvFormat& f, const uint8_t* row, int64_t begin, int64_t n, float* out);

// q4k keys: encodes f.chunk tokens of n channels, token t's K vector at x + t * x_stride, into
// a chunk of f.ChunkBytes(n) bytes.
void KvQuantizeKChunk(const KvFormat& f, const float* x, int64_t x_stride, uint8_t* chunk, int64_t n);
// Decodes channels [begin, begin + n) of token t of a q4k K chunk (m + d*q, as KvDequantize).
void KvDequantizeKChunk(const KvFormat& f, const uint8_t* chunk, int64_t t, int64_t begin, int64_t n, float* out);

// q4k V rows: byte offsets, from the row start, of sub-block j's quad of fields and of its codes.
inline int64_t Q4kFieldsOffset(int64_t sub_block, int64_t j) { return 4 + (j / 4) * (5 + 2 * sub_block); }
inline int64_t Q4kCodesOffset(int64_t sub_block, int64_t j) {
  return Q4kFieldsOffset(sub_block, j) + 5 + (j % 4) * (sub_block / 2);
}

// In-place orthonormal fast Walsh-Hadamard transform of n values (n a power of two).
void HadamardTransform(float* x, int64_t n);
bool IsPowerOfTwo(int64_t n);

}  // namespace kvfs
