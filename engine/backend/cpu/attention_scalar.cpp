// Scalar reference attention kernels: decode each row's head slice, then plain loops. The f16
// path accumulates the weighted sum of V in 16 interleaved partial sums reduced pairwise
// (the order of the reference engine's f16 GEMM), which keeps long contexts closest to it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include <spdlog/spdlog.h>

#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/cpu_features.h"
#include "engine/backend/cpu/ops.h"
#include "engine/model/quants.h"

namespace kvfs::cpu {

namespace {

// The reference's reduction of 16 lanes (its 16-wide horizontal sum): lanes[l] += lanes[l + w]
// for w = 8, 4, 2, 1; returns lanes[0]. Every lane sum of this file ends with it.
float PairwiseSum16(float* lanes) {
  for (int width = 8; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// The reference engine's f16 dot product (vec_dot_f16), which it takes for lengths that are not a
// multiple of 16 (the only ones this path serves in a SIMD table): four 16-lane accumulators over
// 64-element steps, combined 0+2, 1+3, then the two, reduced pairwise, and the rest added in
// double. With f16 queries and keys every product is exact, so for head_dim < 64 the score is
// their sum rounded once (a float sum in order instead: stories260K p3 max 0.0085 -> 0.0108,
// median row 0.00023 -> 0.00051).
float DotReferenceOrder(const float* q, const float* k, int64_t n) {
  float acc[4][16] = {};
  const int64_t n64 = n / 64 * 64;
  for (int64_t i = 0; i < n64; i += 64) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 16; ++l) acc[j][l] = std::fma(q[i + 16 * j + l], k[i + 16 * j + l], acc[j][l]);
    }
  }
  for (int l = 0; l < 16; ++l) acc[0][l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  double sum = PairwiseSum16(acc[0]);
  for (int64_t i = n64; i < n; ++i) sum += static_cast<double>(q[i] * k[i]);
  return static_cast<float>(sum);
}

// Other caches (q8, q4: kvfs's own formats, which the reference has no order for) and head sizes
// that are a multiple of 16 (the SIMD tables' own; this table is their conformance reference
// there) keep a float sum in order, as the Vulkan shader does.
void DotRowsScalar(const KvFormat& f, const KvRows& k, const float* q, int64_t nq, float* scores, int64_t s_stride) {
  std::vector<float> row(k.hd);
  const bool reference_order = f.type == KvType::kF16 && k.hd % 16 != 0;
  for (int64_t p = 0; p < k.n_rows; ++p) {
    KvDequantize(f, k.rows + p * k.row_bytes, k.head * k.hd, k.hd, row.data());
    for (int64_t i = 0; i < nq; ++i) {
      const float* qi = q + i * k.hd;
      if (reference_order) {
        scores[i * s_stride + p] = DotReferenceOrder(qi, row.data(), k.hd);
        continue;
      }
      float s = 0.0f;
      for (int64_t d = 0; d < k.hd; ++d) s += qi[d] * row[d];
      scores[i * s_stride + p] = s;
    }
  }
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// The q4 group holding value v of a row: its header (f16 d, f16 m) and the byte of v's code.
struct Q4Place {
  int64_t header, code_byte;
  int shift;  // 0: low nibble, 4: high
};
Q4Place PlaceQ4(const KvFormat& f, int64_t v) {
  const int64_t g = v / f.group, off = v % f.group, header = g * (f.group / 2 + 4);
  return {header, header + 4 + off / 2, static_cast<int>(off % 2) * 4};
}

void DotRowsQ8Scalar(const KvFormat& f, const KvRows& k, const Int8Queries& q, int64_t nq, float* scores,
                     int64_t s_stride) {
  const int64_t nb = k.hd / kQueryBlock;
  for (int64_t p = 0; p < k.n_rows; ++p) {
    const uint8_t* row = k.rows + p * k.row_bytes;
    for (int64_t i = 0; i < nq; ++i) {
      float s = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const int8_t* qc = q.codes + i * k.hd + b * kQueryBlock;
        const int64_t v0 = k.head * k.hd + b * kQueryBlock;
        int32_t isum = 0;
        for (int64_t j = 0; j < kQueryBlock; ++j) {
          const Q4Place at = PlaceQ4(f, v0 + j);
          isum += static_cast<int32_t>(qc[Int8QueryCodeIndex(j)]) * (((row[at.code_byte] >> at.shift) & 15) - 8);
        }
        const Q4Place g = PlaceQ4(f, v0);
        const float d = Fp16ToFp32(LoadU16(row + g.header)), m = Fp16ToFp32(LoadU16(row + g.header + 2));
        const float m8 = m + 8.0f * d;
        const float t = std::fma(m8, q.sums[i * nb + b], static_cast<float>(isum) * (d * q.scales[i * nb + b]));
        s = b == 0 ? t : s + t;
      }
      scores[i * s_stride + p] = s;
    }
  }
}

// q4k keys, the integer path (attention.h).
void DotChunksQ8Scalar(const KvFormat& f, const KvChunks& k, const float* q, int64_t nq, float* scores,
                       int64_t s_stride) {
  const int64_t C = f.chunk, record = 4 + C / 2, slice_bytes = k.hd * record, nb = k.hd / kQueryBlock;
  std::vector<float> d(k.hd), m(k.hd);
  ChunkQueryQ8 cq;
  for (int64_t c = 0; c * C < k.n_tokens; ++c) {
    const uint8_t* slice = k.chunks + c * k.chunk_bytes + k.head * slice_bytes;
    for (int64_t ch = 0; ch < k.hd; ++ch) {
      d[ch] = Fp16ToFp32(LoadU16(slice + ch * record));
      m[ch] = Fp16ToFp32(LoadU16(slice + ch * record + 2));
    }
    for (int64_t i = 0; i < nq; ++i) {
      QuantizeChunkQuery(q + i * k.hd, d.data(), m.data(), k.hd, &cq);
      for (int64_t t = 0; t < C && c * C + t < k.n_tokens; ++t) {
        float s = cq.base;
        for (int64_t b = 0; b < nb; ++b) {
          int32_t isum = 0;
          for (int64_t j = 0; j < kQueryBlock; ++j) {
            const int64_t ch = b * kQueryBlock + j;
            const uint8_t byte = slice[ch * record + 4 + t / 2];
            isum += cq.codes[ch] * (((t % 2 == 0) ? (byte & 0x0F) : (byte >> 4)) - 8);
          }
          s = std::fma(static_cast<float>(isum), cq.scales[b], s);
        }
        scores[i * s_stride + c * C + t] = s;
      }
    }
  }
}

void DotChunksScalar(const KvFormat& f, const KvChunks& k, const float* q, int64_t nq, float* scores,
                     int64_t s_stride) {
  if (KeyChunksUseInt8(k.hd)) return DotChunksQ8Scalar(f, k, q, nq, scores, s_stride);
  std::vector<float> key(k.hd);
  for (int64_t p = 0; p < k.n_tokens; ++p) {
    KvDequantizeKChunk(f, k.chunks + (p / f.chunk) * k.chunk_bytes, p % f.chunk, k.head * k.hd, k.hd, key.data());
    for (int64_t i = 0; i < nq; ++i) {
      const float* qi = q + i * k.hd;
      float s = 0.0f;
      for (int64_t d = 0; d < k.hd; ++d) s += qi[d] * key[d];
      scores[i * s_stride + p] = s;
    }
  }
}

// q4 values with int8 weights (attention.h: ValuesUseInt8Weights), written as the rule reads.
void AxpyRowsQ8Scalar(const KvFormat& f, const KvRows& v, const float* w, int64_t nq, int64_t w_stride, float* out) {
  for (int64_t s0 = 0; s0 < v.n_rows; s0 += kValueSpan) {
    const int64_t s1 = std::min(v.n_rows, s0 + kValueSpan);
    for (int64_t b = 0; b < v.hd / kQueryBlock; ++b) {
      const int64_t v0 = v.head * v.hd + b * kQueryBlock;
      const Q4Place g = PlaceQ4(f, v0);
      auto row = [&](int64_t p) { return v.rows + p * v.row_bytes; };
      auto d = [&](int64_t p) { return Fp16ToFp32(LoadU16(row(p) + g.header)); };
      auto m8 = [&](int64_t p) { return Fp16ToFp32(LoadU16(row(p) + g.header + 2)) + 8.0f * d(p); };
      for (int64_t i = 0; i < nq; ++i) {
        const float* wi = w + i * w_stride;
        float acc[kQueryBlock] = {};
        for (int64_t t0 = s0; t0 < s1; t0 += kQueryBlock) {
          float a[kQueryBlock] = {};
          for (int64_t p = t0; p < std::min(s1, t0 + kQueryBlock); ++p) a[p - t0] = wi[p] * d(p);
          int8_t k[kQueryBlock];
          const QuantizedBlock qb = QuantizeInt8Block(a, k);
          for (int64_t j = 0; j < kQueryBlock; ++j) {
            const Q4Place at = PlaceQ4(f, v0 + j);
            int32_t isum = -8 * qb.code_sum;
            for (int64_t p = t0; p < std::min(s1, t0 + kQueryBlock); ++p) {
              isum += static_cast<int32_t>(k[p - t0]) * ((row(p)[at.code_byte] >> at.shift) & 15);
            }
            acc[j] = std::fma(static_cast<float>(isum), qb.scale, acc[j]);
          }
        }
        float lanes[16] = {};
        for (int64_t p = s0; p < s1; ++p) lanes[(p - s0) % 16] = std::fma(wi[p], m8(p), lanes[(p - s0) % 16]);
        const float base = PairwiseSum16(lanes);
        for (int64_t j = 0; j < kQueryBlock; ++j) out[i * v.hd + b * kQueryBlock + j] += acc[j] + base;
      }
    }
  }
}

// The float path keeps 16 lanes per output value across all blocks (attention.h: axpy_blocks)
// for head sizes that are not a multiple of 16, where every table comes here. For the SIMD
// tables' own head sizes this table is their conformance reference and sums block by block.
void AxpyBlocksScalar(const KvFormat& f, std::span<const KvRows> blocks, const float* w, int64_t nq, int64_t w_stride,
                      float* out) {
  if (blocks.empty()) return;
  const int64_t hd = blocks[0].hd;
  if (ValuesUseInt8Weights(f, hd)) {
    for (const KvRows& rows : blocks) {
      AxpyRowsQ8Scalar(f, rows, w, nq, w_stride, out);
      w += rows.n_rows;
    }
    return;
  }
  std::vector<float> row(hd);
  std::vector<float> lanes(nq * hd * 16, 0.0f);
  int64_t pos = 0;  // position across blocks: its lane is pos % 16
  const bool one_run = hd % 16 != 0;
  auto flush = [&] {
    for (int64_t j = 0; j < nq * hd; ++j) out[j] += PairwiseSum16(lanes.data() + j * 16);
    std::fill(lanes.begin(), lanes.end(), 0.0f);
  };
  for (const KvRows& v : blocks) {
    if (!one_run && pos > 0) flush();
    for (int64_t p = 0; p < v.n_rows; ++p, ++pos) {
      KvDequantize(f, v.rows + p * v.row_bytes, v.head * hd, hd, row.data());
      const int64_t lane = (one_run ? pos : p) % 16;
      for (int64_t i = 0; i < nq; ++i) {
        const float a = w[i * w_stride + pos];
        float* acc = lanes.data() + i * hd * 16;
        for (int64_t d = 0; d < hd; ++d) acc[d * 16 + lane] = std::fma(a, row[d], acc[d * 16 + lane]);
      }
    }
  }
  flush();
}

void AxpyRowsScalar(const KvFormat& f, const KvRows& v, const float* w, int64_t nq, int64_t w_stride, float* out) {
  AxpyBlocksScalar(f, std::span<const KvRows>(&v, 1), w, nq, w_stride, out);
}

void RoundF16Scalar(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Fp16ToFp32(Fp32ToFp16(x[i]));
}

void SoftmaxScalar(float* s, int64_t n, int64_t n_total, float scale, bool round_f16) {
  for (int64_t p = 0; p < n; ++p) s[p] *= scale;
  Softmax(s, n);
  std::fill(s + n, s + n_total, 0.0f);
  if (round_f16) RoundF16Scalar(s, n);
}

}  // namespace

bool KeysUseInt8Queries(const KvFormat& f, int64_t hd) {
  return f.type == KvType::kQ4 && hd > 0 && hd % kQueryBlock == 0 && f.group % kQueryBlock == 0;
}

bool KeyChunksUseInt8(int64_t hd) { return hd > 0 && hd % kQueryBlock == 0 && hd <= kMaxChunkHd; }

bool ValuesUseInt8Weights(const KvFormat& f, int64_t hd) { return KeysUseInt8Queries(f, hd); }

// Codes round half to even by adding and removing 1.5 * 2^23 (exact for |x / scale| < 128).
QuantizedBlock QuantizeInt8Block(const float* x, int8_t* codes) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kQueryBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  if (amax == 0.0f) {
    std::fill(codes, codes + kQueryBlock, int8_t{0});
    return {0.0f, 0};
  }
  const Int8BlockScale bs = BlockScaleFor(amax);
  int32_t sum = 0;
  for (int64_t j = 0; j < kQueryBlock; ++j) {
    const float scaled = bs.inv != 0.0f ? x[j] * bs.inv : std::ldexp(x[j], -bs.e);  // exact either way
    const float r = (scaled + 0x1.8p23f) - 0x1.8p23f;  // IEEE semantics (no -ffast-math): not folded
    codes[j] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    sum += codes[j];
  }
  return {bs.scale, sum};
}

void QuantizeChunkQuery(const float* q, const float* d, const float* m, int64_t hd, ChunkQueryQ8* out) {
  float lanes[16] = {};
  for (int64_t c = 0; c < hd; ++c) lanes[c % 16] = std::fma(q[c], m[c] + 8.0f * d[c], lanes[c % 16]);
  out->base = PairwiseSum16(lanes);
  for (int64_t b = 0; b < hd / kQueryBlock; ++b) {
    float a[kQueryBlock];
    for (int64_t j = 0; j < kQueryBlock; ++j) a[j] = q[b * kQueryBlock + j] * d[b * kQueryBlock + j];
    const QuantizedBlock qb = QuantizeInt8Block(a, out->codes + b * kQueryBlock);
    out->scales[b] = qb.scale;
    out->code_sums[b] = qb.code_sum;
  }
}

void QuantizeQueries(const float* q, int64_t nq, int64_t hd, int8_t* codes, float* scales, float* sums,
                     int32_t* code_sums) {
  const int64_t nb = hd / kQueryBlock;
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* x = q + i * hd + b * kQueryBlock;
      int8_t natural[kQueryBlock];
      const QuantizedBlock qb = QuantizeInt8Block(x, natural);
      for (int64_t j = 0; j < kQueryBlock; ++j) codes[i * hd + b * kQueryBlock + Int8QueryCodeIndex(j)] = natural[j];
      float sum = 0.0f;
      for (int64_t j = 0; j < kQueryBlock; ++j) sum += x[j];
      scales[i * nb + b] = qb.scale;
      sums[i * nb + b] = sum;
      code_sums[i * nb + b] = qb.code_sum;
    }
  }
}

const AttentionKernels& ScalarAttentionKernels() {
  static const AttentionKernels table{"scalar",        &DotRowsScalar,   &DotRowsQ8Scalar, &QuantizeQueries, &AxpyRowsScalar, &AxpyBlocksScalar,
                                      &DotChunksScalar, &SoftmaxScalar, &RoundF16Scalar, &HadamardTransform};
  return table;
}

const AttentionKernels* AttentionKernelsByName(const std::string& name) {
  if (name == "scalar") return &ScalarAttentionKernels();
#if defined(__x86_64__) || defined(_M_X64)
  // The same feature sets the files are compiled for (engine/CMakeLists.txt).
  const CpuFeatures& cpu = HostCpuFeatures();
  if (name == "avx2" && cpu.avx2_fma_f16c) return &Avx2AttentionKernels();
  if (name == "avxvnni" && cpu.avx_vnni) return &AvxVnniAttentionKernels();
  if (name == "avx512bw" && cpu.avx512_core) return &Avx512BwAttentionKernels();
  // "amx" is the avx512 matrix table with prompt-sized products on AMX tiles: its attention is
  // avx512's.
  if ((name == "avx512" || name == "amx") && cpu.avx512_core && cpu.avx512_vnni_bf16) {  // VNNI: the q4 keys' dpbusd
    return &Avx512AttentionKernels();
  }
#endif
  return nullptr;
}

const AttentionKernels& AttentionKernelsFor(const std::string& table_name) {
  if (const char* forced = std::getenv("KVFS_ATTN"); forced != nullptr && *forced != '\0') {
    if (const AttentionKernels* table = AttentionKernelsByName(forced)) return *table;
    spdlog::warn("KVFS_ATTN={} is unknown or not supported by this CPU; using the {} attention kernels", forced,
                 AttentionKernelsByName(table_name) != nullptr ? table_name : std::string("scalar"));
  }
  const AttentionKernels* table = AttentionKernelsByName(table_name);
  return table != nullptr ? *table : ScalarAttentionKernels();
}

}  // namespace kvfs::cpu
