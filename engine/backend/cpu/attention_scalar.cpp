// Scalar reference attention kernels: decode each row's head slice, then plain loops. The f16
// path accumulates the weighted sum of V in 16 interleaved partial sums reduced pairwise
// (the order of the reference engine's f16 GEMM), which keeps long contexts closest to it.
#include <cmath>
#include <cstdlib>
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

const AttentionKernels& ScalarAttentionKernels() {
  static const AttentionKernels table{"scalar",       &DotRowsScalar,   &AxpyRowsScalar,   &DotChunksScalar,
                                      &SoftmaxScalar, &RoundF16Scalar, &HadamardTransform};
  return table;
}

const AttentionKernels* AttentionKernelsByName(const std::string& name) {
  if (name == "scalar") return &ScalarAttentionKernels();
#if defined(__x86_64__) || defined(_M_X64)
  // The same feature sets the files are compiled for (engine/CMakeLists.txt).
  const CpuFeatures& cpu = HostCpuFeatures();
  if (name == "avx2" && cpu.avx2_fma_f16c) return &Avx2AttentionKernels();
  if (name == "avx512" && cpu.avx512_core) {
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
