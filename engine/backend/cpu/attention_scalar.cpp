// Scalar reference attention kernels: decode each row's head slice, then plain loops. The f16
// path accumulates the weighted sum of V in 16 interleaved partial sums reduced pairwise
// (the order of the reference engine's f16 GEMM), which keeps long contexts closest to it.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/cpu_features.h"

#include <algorithm>

#include "engine/backend/cpu/ops.h"
#include "engine/model/quants.h"

namespace kvfs::cpu {

namespace {

void DotRowsScalar(const KvFormat& f, const KvRows& k, const float* q, int64_t nq, float* scores, int64_t s_stride) {
  std::vector<float> row(k.hd);
  for (int64_t p = 0; p < k.n_rows; ++p) {
    KvDequantize(f, k.rows + p * k.row_bytes, k.head * k.hd, k.hd, row.data());
    for (int64_t i = 0; i < nq; ++i) {
      const float* qi = q + i * k.hd;
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

void DotChunksScalar(const KvFormat& f, const KvChunks& k, const float* q, int64_t nq, float* scores,
                     int64_t s_stride) {
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

void AxpyRowsScalar(const KvFormat& f, const KvRows& v, const float* w, int64_t nq, int64_t w_stride, float* out) {
  std::vector<float> row(v.hd);
  std::vector<float> lanes(nq * v.hd * 16, 0.0f);
  for (int64_t p = 0; p < v.n_rows; ++p) {
    KvDequantize(f, v.rows + p * v.row_bytes, v.head * v.hd, v.hd, row.data());
    const int64_t lane = p % 16;
    for (int64_t i = 0; i < nq; ++i) {
      const float a = w[i * w_stride + p];
      float* acc = lanes.data() + i * v.hd * 16;
      for (int64_t d = 0; d < v.hd; ++d) acc[d * 16 + lane] = std::fma(a, row[d], acc[d * 16 + lane]);
    }
  }
  for (int64_t j = 0; j < nq * v.hd; ++j) {
    float* a = lanes.data() + j * 16;
    for (int width = 8; width >= 1; width /= 2) {
      for (int l = 0; l < width; ++l) a[l] += a[l + width];
    }
    out[j] += a[0];
  }
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

void QuantizeQueries(const float* q, int64_t nq, int64_t hd, int8_t* codes, float* scales, float* sums,
                     int32_t* code_sums) {
  const int64_t nb = hd / kQueryBlock;
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* x = q + i * hd + b * kQueryBlock;
      int8_t* c = codes + i * hd + b * kQueryBlock;
      float amax = 0.0f, sum = 0.0f;
      for (int64_t j = 0; j < kQueryBlock; ++j) {
        amax = std::max(amax, std::fabs(x[j]));
        sum += x[j];
      }
      int e = 0;
      if (amax > 0.0f) {
        std::frexp(amax, &e);
        e -= 7;
      }
      // x * 2^-e is exact when 2^-e is a normal float (as ldexp, without a call per value), and
      // |x * 2^-e| < 128, so adding and removing 1.5 * 2^23 rounds it half to even.
      const float inv = -e <= 126 ? std::ldexp(1.0f, -e) : 0.0f;
      int32_t code_sum = 0;
      for (int64_t j = 0; j < kQueryBlock; ++j) {
        float r = 0.0f;
        if (amax > 0.0f) {
          const float scaled = inv != 0.0f ? x[j] * inv : std::ldexp(x[j], -e);
          r = (scaled + 0x1.8p23f) - 0x1.8p23f;  // IEEE semantics (no -ffast-math): not folded
        }
        c[Int8QueryCodeIndex(j)] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
        code_sum += c[Int8QueryCodeIndex(j)];
      }
      code_sums[i * nb + b] = code_sum;
      scales[i * nb + b] = amax > 0.0f ? std::ldexp(1.0f, e) : 0.0f;
      sums[i * nb + b] = sum;
    }
  }
}

const AttentionKernels& ScalarAttentionKernels() {
  static const AttentionKernels table{"scalar",        &DotRowsScalar,  &DotRowsQ8Scalar,  &AxpyRowsScalar,
                                      &DotChunksScalar, &SoftmaxScalar, &RoundF16Scalar, &HadamardTransform};
  return table;
}

const AttentionKernels* AttentionKernelsByName(const std::string& name) {
  if (name == "scalar") return &ScalarAttentionKernels();
#if defined(__x86_64__) || defined(_M_X64)
  // The same feature sets the files are compiled for (engine/CMakeLists.txt).
  const CpuFeatures& cpu = HostCpuFeatures();
  if (name == "avx2" && cpu.avx2_fma_f16c) return &Avx2AttentionKernels();
  if (name == "avx512" && cpu.avx512_core && cpu.avx512_vnni_bf16) {  // VNNI: the q4 keys' dpbusd
    return &Avx512AttentionKernels();
  }
#endif
  return nullptr;
}

const AttentionKernels& AttentionKernelsFor(const std::string& table_name) {
  if (const char* forced = std::getenv("KVFS_ATTN"); forced != nullptr && *forced != '\0') {
    if (const AttentionKernels* table = AttentionKernelsByName(forced)) return *table;
  }
  const AttentionKernels* table = AttentionKernelsByName(table_name);
  return table != nullptr ? *table : ScalarAttentionKernels();
}

}  // namespace kvfs::cpu
