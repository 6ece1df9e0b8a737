// Attention kernel micro-benchmarks: dot_rows (Q.K scores) and axpy_rows (weights x V) over
// encoded KV rows (q4k: dot_chunks over its K chunks of 64 tokens, axpy_rows over its V rows),
// per KV type and attention table, in the shapes of tinyllama-1.1b at depth
// 3500: rows of 4 KV heads x 64 values, one head's slice read, calls of up to 256 rows (one KV
// block, as CpuBackend::Attention makes them).
//   decode:  nq = 8   (one token, 8 query heads per KV head)
//   prefill: nq = 128 (a tile of 16 tokens x 8 query heads)
// q4 keys: "dot" is the float-query kernel (dot_rows), "dot-int8q" the int8-query one the
// backend uses for them (dot_rows_q8, with the queries' quantization).
// "hot" runs over one plane of 3500 rows (cache resident after the first pass: kernel speed);
// "cold" cycles through 24 planes (> L3, like 22 layers of a real cache: memory bound).
// softmax: the weights of nq queries over the 3500 positions, per table.
// Counters: KV_GB/s = bytes of the head slices read per second; ns/row/q = time per (row, query).
// Usage: bench_attention [--benchmark_filter=...]   (e.g. --benchmark_filter=decode)
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "engine/backend/cpu/attention.h"

namespace kvfs::cpu {
namespace {

constexpr int64_t kHd = 64, kHeads = 4, kRows = 3500, kBlock = 256;

struct Shape {
  KvType type;
  int64_t nq;
  int planes;  // 1: hot; > 1: cycle through planes to defeat the caches
  bool dot;    // dot_rows or axpy_rows
  bool int8q = false;  // q4 dot: dot_rows_q8 with the queries quantized per call (as the backend does per layer)
};

const char* TypeName(KvType t) {
  return t == KvType::kF16 ? "f16" : t == KvType::kQ8 ? "q8" : t == KvType::kQ4 ? "q4" : "q4k";
}

void Run(benchmark::State& state, const AttentionKernels* table, Shape s) {
  KvFormat f;
  f.type = s.type;
  f.group = s.type == KvType::kQ4K ? 16 : 64;
  if (s.type == KvType::kQ4K) f.chunk = 64;
  const int64_t n = kHd * kHeads, row_bytes = f.RowBytes(n);
  // q4k keys: chunks of 64 tokens (the last one read partly), one plane after another.
  const bool chunks = s.type == KvType::kQ4K && s.dot;
  const int64_t n_chunks = (kRows + 63) / 64, chunk_bytes = chunks ? f.ChunkBytes(n) : 0;
  const int64_t plane_bytes = chunks ? n_chunks * chunk_bytes : kRows * row_bytes;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> kv(static_cast<size_t>(plane_bytes * s.planes));
  if (chunks) {
    std::vector<float> x(64 * n);
    for (int64_t c = 0; c < n_chunks * s.planes; ++c) {
      for (float& v : x) v = normal(rng);
      KvQuantizeKChunk(f, x.data(), n, kv.data() + c * chunk_bytes, n);
    }
  } else {
    std::vector<float> x(n);
    for (int64_t r = 0; r < kRows * s.planes; ++r) {
      for (float& v : x) v = normal(rng);
      KvQuantizeRow(f, x.data(), kv.data() + r * row_bytes, n);
    }
  }
  std::vector<float> q(s.nq * kHd), scores(s.nq * kRows), out(s.nq * kHd);
  for (float& v : q) v = normal(rng);
  for (float& v : scores) v = std::fabs(normal(rng)) / kRows;
  std::vector<int8_t> q8_codes(s.nq * kHd);
  std::vector<float> q8_scales(s.nq * kHd / kQueryBlock), q8_sums(q8_scales.size());
  std::vector<int32_t> q8_code_sums(q8_scales.size());
  int plane = 0;
  for (auto _ : state) {
    const uint8_t* base = kv.data() + static_cast<int64_t>(plane) * plane_bytes;
    for (int64_t p0 = 0; p0 < kRows; p0 += kBlock) {
      if (chunks) {
        const KvChunks ck{base + p0 / 64 * chunk_bytes, chunk_bytes, std::min(kBlock, kRows - p0), 1, kHd};
        table->dot_chunks(f, ck, q.data(), s.nq, scores.data() + p0, kRows);
        continue;
      }
      const KvRows rows{base + p0 * row_bytes, row_bytes, std::min(kBlock, kRows - p0), 1, kHd};
      if (s.int8q) {
        if (p0 == 0) {
          QuantizeQueries(q.data(), s.nq, kHd, q8_codes.data(), q8_scales.data(), q8_sums.data(), q8_code_sums.data());
        }
        table->dot_rows_q8(f, rows, Int8Queries{q8_codes.data(), q8_scales.data(), q8_sums.data(), q8_code_sums.data()},
                           s.nq, scores.data() + p0, kRows);
      } else if (s.dot) table->dot_rows(f, rows, q.data(), s.nq, scores.data() + p0, kRows);
      else table->axpy_rows(f, rows, scores.data() + p0, s.nq, kRows, out.data());
    }
    benchmark::DoNotOptimize(scores.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    plane = (plane + 1) % s.planes;
  }
  // What a head reads per token.
  const double slice_bytes = static_cast<double>(chunks ? chunk_bytes / 64 : row_bytes) / kHeads;
  state.counters["KV_GB/s"] = benchmark::Counter(slice_bytes * kRows * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ns/row/q"] = benchmark::Counter(static_cast<double>(kRows * s.nq) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The softmax of nq queries over the 3500 positions (scale, exp, sum, normalise, f16 rounding
// as for an f16 cache): ns/row/q is per weight, comparable with dot and axpy.
void RunSoftmax(benchmark::State& state, const AttentionKernels* table, int64_t nq) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> src(nq * kRows), s(nq * kRows);
  for (float& v : src) v = normal(rng);
  for (auto _ : state) {
    state.PauseTiming();
    s = src;
    state.ResumeTiming();
    for (int64_t i = 0; i < nq; ++i) table->softmax(s.data() + i * kRows, kRows, kRows, 0.125f, true);
    benchmark::DoNotOptimize(s.data());
    benchmark::ClobberMemory();
  }
  state.counters["ns/row/q"] = benchmark::Counter(static_cast<double>(kRows * nq) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

}  // namespace
}  // namespace kvfs::cpu

int main(int argc, char** argv) {
  using namespace kvfs::cpu;
  for (const char* name : {"scalar", "avx2", "avxvnni", "avx512bw", "avx512"}) {
    const AttentionKernels* table = AttentionKernelsByName(name);
    if (table == nullptr) continue;
    for (auto [label, nq] : {std::pair{"decode", int64_t{8}}, std::pair{"prefill", int64_t{128}}}) {
      benchmark::RegisterBenchmark((std::string(label) + "/" + name + "/softmax").c_str(), RunSoftmax, table, nq)
          ->Unit(benchmark::kMicrosecond);
      for (kvfs::KvType type : {kvfs::KvType::kF16, kvfs::KvType::kQ8, kvfs::KvType::kQ4, kvfs::KvType::kQ4K}) {
        for (int planes : {1, 24}) {
          if (planes > 1 && nq > 8) continue;  // prefill is compute bound: hot only
          for (bool dot : {true, false}) {
            const std::string bname = std::string(label) + "/" + name + "/" + TypeName(type) + "/" +
                                      (dot ? "dot" : "axpy") + (planes > 1 ? "/cold" : "/hot");
            benchmark::RegisterBenchmark(bname.c_str(), Run, table, Shape{type, nq, planes, dot})
                ->Unit(benchmark::kMicrosecond);
            if (type == kvfs::KvType::kQ4 && dot) {  // what the backend runs for q4 keys
              const std::string iname = std::string(label) + "/" + name + "/q4/dot-int8q" + (planes > 1 ? "/cold" : "/hot");
              benchmark::RegisterBenchmark(iname.c_str(), Run, table, Shape{type, nq, planes, dot, true})
                  ->Unit(benchmark::kMicrosecond);
            }
          }
        }
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
