// Micro-benchmarks of the CPU kernel tables (Google Benchmark), per table and weight type:
//  * vec_dot: GB/s of weight bytes streamed by one thread, one vec_dot per row, over matrices of
//    TinyLlama's ffn shape (5632 rows x 2048) cycled through a 256 MiB set so that every pass
//    reads from DRAM, not from the 32 MiB L3 (memory-bound, as decode is);
//  * decode: the same through matmul_tile with 1 token (what the forward pass calls), on 1 and
//    2 threads (2 threads: each its half of the rows, like CpuBackend::MatMul); decode_tile_Ntok:
//    N tokens at once (a batched decode step of N sequences: time against 1 token);
//  * prefill: GFLOP/s (2 * rows * n_in * tokens) of matmul_tile with 512 tokens on a
//    2048 x 2048 matrix, 1 and 2 threads;
//  * packed_*: the same decode and prefill cases through the table's packed kernels (weights
//    repacked at load, PackedKernels in kernels.h) where it has them.
// Run: build/bench/bench_kernels [--benchmark_filter=avx512/Q4_0] [--benchmark_repetitions=5
//      --benchmark_report_aggregates_only=true]
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "engine/backend/cpu/kernel_select.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/core/thread_pool.h"
#include "engine/model/quants.h"

namespace kvfs {
namespace {

using cpu::KernelTable;

constexpr int64_t kDecodeRows = 5632, kDecodeIn = 2048;      // TinyLlama ffn_gate/up
constexpr int64_t kDecodeSetBytes = int64_t{256} << 20;      // >> L3
constexpr int64_t kPrefillRows = 2048, kPrefillIn = 2048, kPrefillTokens = 512;

uint32_t Id(GgmlType t) { return static_cast<uint32_t>(t); }

// Random weight bytes with finite, moderate fp16 scales (so no NaN/inf slows anything down).
std::vector<uint8_t> RandomMatrix(GgmlType t, int64_t rows, int64_t n_in, uint32_t seed) {
  const int64_t row_bytes = RowBytes(t, n_in);
  std::vector<uint8_t> w(static_cast<size_t>(rows * row_bytes));
  std::mt19937 rng(seed);
  for (size_t i = 0; i < w.size(); i += 4) {
    const uint32_t v = rng();
    std::memcpy(&w[i], &v, std::min<size_t>(4, w.size() - i));
  }
  const GgmlTypeTraits* info = GgmlTypeInfo(Id(t));
  const uint16_t half = Fp32ToFp16(0.01f), bf = Fp32ToBf16(0.5f);
  const int64_t nb = rows * n_in / info->block_elems;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = w.data() + b * info->block_bytes;
    switch (t) {
      case GgmlType::kF32: {
        const float f = 0.5f;
        std::memcpy(p, &f, 4);
        break;
      }
      case GgmlType::kBF16: std::memcpy(p, &bf, 2); break;
      case GgmlType::kQ6_K: std::memcpy(p + 208, &half, 2); break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        std::memcpy(p, &half, 2);
        std::memcpy(p + 2, &half, 2);
        break;
      default: std::memcpy(p, &half, 2); break;  // F16 values and the legacy d
    }
  }
  return w;
}

std::vector<uint8_t> QuantizedActivations(const KernelTable& k, GgmlType t, int64_t n_in, int64_t tokens) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_in));
  const int64_t qb = cpu::QuantizedActivationRowBytes(t, n_in);
  std::vector<uint8_t> q(static_cast<size_t>(qb * tokens));
  for (int64_t i = 0; i < tokens; ++i) {
    for (float& v : x) v = normal(rng);
    k.quantize_row[Id(t)](x.data(), q.data() + i * qb, n_in);
  }
  return q;
}

// A matrix in the table's packed layout, 64-byte aligned as the backend allocates it.
struct PackedMatrix {
  std::vector<uint8_t> storage;
  uint8_t* data = nullptr;
};
PackedMatrix Pack(const cpu::PackedKernels& pk, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t n_in) {
  PackedMatrix m;
  const int64_t bytes = pk.bytes(rows, n_in);
  m.storage.resize(static_cast<size_t>(bytes + 64));
  m.data = m.storage.data() + (64 - reinterpret_cast<uintptr_t>(m.storage.data()) % 64) % 64;
  pk.pack(w, row_bytes, rows, n_in, m.data);
  return m;
}

// Enough copies of the decode matrix to fill kDecodeSetBytes (plain, or packed by `packed`).
struct DecodeSet {
  int64_t row_bytes = 0;
  int64_t matrix_bytes = 0;  // one copy, rounded up to 64
  int64_t copies = 0;
  std::vector<uint8_t> storage;
  uint8_t* data = nullptr;   // 64-byte aligned
};
DecodeSet MakeDecodeSet(GgmlType t, const cpu::PackedKernels* packed = nullptr) {
  DecodeSet s;
  s.row_bytes = RowBytes(t, kDecodeIn);
  const std::vector<uint8_t> plain = RandomMatrix(t, kDecodeRows, kDecodeIn, 1);
  PackedMatrix pm;
  if (packed != nullptr) pm = Pack(*packed, plain.data(), s.row_bytes, kDecodeRows, kDecodeIn);
  const uint8_t* one = packed != nullptr ? pm.data : plain.data();
  const int64_t one_bytes = packed != nullptr ? packed->bytes(kDecodeRows, kDecodeIn) : s.row_bytes * kDecodeRows;
  s.matrix_bytes = (one_bytes + 63) / 64 * 64;
  s.copies = std::max<int64_t>(2, kDecodeSetBytes / s.matrix_bytes);
  s.storage.resize(static_cast<size_t>(s.matrix_bytes * s.copies + 64));
  s.data = s.storage.data() + (64 - reinterpret_cast<uintptr_t>(s.storage.data()) % 64) % 64;
  for (int64_t c = 0; c < s.copies; ++c) std::memcpy(s.data + c * s.matrix_bytes, one, static_cast<size_t>(one_bytes));
  return s;
}

void BenchVecDot(benchmark::State& state, const KernelTable* k, GgmlType t) {
  const DecodeSet set = MakeDecodeSet(t);
  const std::vector<uint8_t> q = QuantizedActivations(*k, t, kDecodeIn, 1);
  const cpu::VecDotFn dot = k->vec_dot[Id(t)];
  const int64_t matrix = set.row_bytes * kDecodeRows;
  int64_t c = 0;
  float sink = 0.0f;
  for (auto _ : state) {
    const uint8_t* w = set.data + (c++ % set.copies) * set.matrix_bytes;
    for (int64_t r = 0; r < kDecodeRows; ++r) sink += dot(w + r * set.row_bytes, q.data(), kDecodeIn);
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(state.iterations() * matrix);
}

void BenchDecodeTile(benchmark::State& state, const KernelTable* k, GgmlType t, int threads, int64_t tokens, bool packed) {
  const cpu::PackedKernels& pk = k->packed[Id(t)];
  const DecodeSet set = MakeDecodeSet(t, packed ? &pk : nullptr);
  const std::vector<uint8_t> q = QuantizedActivations(*k, t, kDecodeIn, tokens);
  const int64_t qb = cpu::QuantizedActivationRowBytes(t, kDecodeIn);
  const cpu::MatMulTileFn tile = k->matmul_tile[Id(t)];
  std::vector<float> y(kDecodeRows * tokens);
  ThreadPool pool(threads);
  int64_t c = 0;
  for (auto _ : state) {
    const uint8_t* w = set.data + (c++ % set.copies) * set.matrix_bytes;
    pool.Run([&](int ith, int nth) {
      auto [u0, u1] = SplitRange(kDecodeRows / 32, ith, nth);
      if (packed) {
        pk.matmul(w, u0 * 32, (u1 - u0) * 32, q.data(), qb, tokens, kDecodeIn, y.data() + u0 * 32, kDecodeRows);
      } else {
        tile(w + u0 * 32 * set.row_bytes, set.row_bytes, (u1 - u0) * 32, q.data(), qb, tokens, kDecodeIn,
             y.data() + u0 * 32, kDecodeRows);
      }
    });
    benchmark::ClobberMemory();
  }
  // The plain layout's bytes in both cases, so GB/s compare (the packed form is no larger).
  state.SetBytesProcessed(state.iterations() * set.row_bytes * kDecodeRows);
}

void BenchPrefill(benchmark::State& state, const KernelTable* k, GgmlType t, int threads, bool packed) {
  const std::vector<uint8_t> w = RandomMatrix(t, kPrefillRows, kPrefillIn, 2);
  const int64_t rb = RowBytes(t, kPrefillIn);
  const cpu::PackedKernels& pk = k->packed[Id(t)];
  PackedMatrix pw;
  if (packed) pw = Pack(pk, w.data(), rb, kPrefillRows, kPrefillIn);
  const std::vector<uint8_t> q = QuantizedActivations(*k, t, kPrefillIn, kPrefillTokens);
  const int64_t qb = cpu::QuantizedActivationRowBytes(t, kPrefillIn);
  const cpu::MatMulTileFn tile = k->matmul_tile[Id(t)];
  std::vector<float> y(kPrefillRows * kPrefillTokens);
  ThreadPool pool(threads);
  for (auto _ : state) {
    pool.Run([&](int ith, int nth) {
      auto [u0, u1] = SplitRange(kPrefillRows / 32, ith, nth);
      if (packed) {
        pk.matmul(pw.data, u0 * 32, (u1 - u0) * 32, q.data(), qb, kPrefillTokens, kPrefillIn, y.data() + u0 * 32,
                  kPrefillRows);
      } else {
        tile(w.data() + u0 * 32 * rb, rb, (u1 - u0) * 32, q.data(), qb, kPrefillTokens, kPrefillIn, y.data() + u0 * 32,
             kPrefillRows);
      }
    });
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * kPrefillRows * kPrefillIn * kPrefillTokens;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

void RegisterAll() {
  const GgmlType types[] = {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF16,
                            GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ5_K, GgmlType::kBF16,
                            GgmlType::kF32};
  for (const std::string& name : cpu::AllKernelTableNames()) {
    const KernelTable* k = cpu::KernelTableByName(name);
    if (k == nullptr) continue;
    for (GgmlType t : types) {
      const std::string tn = name + "/" + std::string(GgmlTypeInfo(Id(t))->name);
      benchmark::RegisterBenchmark(("vec_dot/" + tn).c_str(), BenchVecDot, k, t)->UseRealTime()->Unit(benchmark::kMillisecond);
      for (bool packed : {false, true}) {
        if (packed && !k->packed[Id(t)].available()) continue;
        const std::string prefix = packed ? "packed_" : "";
        for (int th : {1, 2}) {
          const std::string suffix = "/threads:" + std::to_string(th);
          benchmark::RegisterBenchmark((prefix + "decode_tile/" + tn + suffix).c_str(), BenchDecodeTile, k, t, th,
                                       int64_t{1}, packed)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
          // Batched decode: one token of each of several sequences per weight pass.
          for (int64_t tokens : {2, 4, 6, 8, 16, 32, 48, 64, 128}) {
            benchmark::RegisterBenchmark((prefix + "decode_tile_" + std::to_string(tokens) + "tok/" + tn + suffix).c_str(),
                                         BenchDecodeTile, k, t, th, tokens, packed)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
          }
          // The scalar table needs minutes per prefill call: skip it there.
          if (name != "scalar") {
            benchmark::RegisterBenchmark((prefix + "prefill_tile_512tok/" + tn + suffix).c_str(), BenchPrefill, k, t,
                                         th, packed)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvfs

int main(int argc, char** argv) {
  kvfs::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
