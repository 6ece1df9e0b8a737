// The "avx512bw" kernel table, for CPUs with AVX-512 F/BW/VL/DQ but without VNNI (Skylake-SP and
// Cascade Lake without DL Boost): the AVX2 table, with packed Q4_0 on zmm registers (16 rows per
// group, the Q4_0 kernel of packed_rows_kernel.h). Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq and no VNNI (engine/CMakeLists.txt), so no instruction here needs more than that.
//
// Why only this entry: a batched decode step is the packed matmul against a few tokens, and on
// such a CPU it was compute-bound on ymm (vpmaddubsw at 8 rows per instruction); zmm doubles the
// rows per instruction and halves the activation broadcasts per row. One-token decode is
// bandwidth-bound either way, and prefill goes through the same packed kernel. The other packed
// types (Q4_1, Q5_0, Q5_1, Q8_0, the K-quants) stay the AVX2 table's, 8 rows on ymm: Q8_0 on zmm
// (AVX-512 has no vpsignb, so a mask and a masked subtract per token instead) was slower than on
// ymm in every case measured on Emerald Rapids (`bench_kernels`, one thread: decode 9.1 vs 10.1
// GB/s, 8 tokens 3.02 vs 2.87 ms, prefill 59 vs 81 GFLOP/s); the others were not tried on zmm.
#include "engine/backend/cpu/kernels_avx2_common.h"
#include "engine/backend/cpu/packed_rows_kernel.h"

namespace kvfs::cpu {
namespace {

struct Avx512BwIsa {
  static constexpr int kRows = 16;
  // 8 tokens' sums and accumulators would fit the 32 zmm registers, but passes of 4 were no
  // slower at 4 tokens and a little faster at 8 (`bench_kernels packed_decode_tile_8tok`, 5632 x
  // 2048, 2 threads, three alternating runs: 0.88 / 0.92 / 0.79 ms against 0.91 / 0.94 / 0.81).
  static constexpr int kPassTokens = 4;
  using I = __m512i;
  using F = __m512;
  static constexpr bool kDotBytes = false;  // no VNNI on these CPUs

  static I Load(const uint8_t* p) { return _mm512_load_si512(p); }
  static I LowNibbles(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I HighNibbles(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static I Broadcast32(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
  }
  static I MulAddPairs(I codes, I act) { return _mm512_maddubs_epi16(codes, act); }
  static I Add16(I a, I b) { return _mm512_add_epi16(a, b); }
  // No barrier: with 32 zmm registers GCC's tree of int16 adds does not spill, and it measured
  // 2-5% faster than the chain in every alternating run (standalone, 2048 x 1024 x 16 tokens in
  // cache, 5632 x 2048 x 4 and 8 tokens from DRAM, 2048 x 2048 x 512: 12 of 12). The int16 sums
  // are exact in any order, so the results are the same bits.
  static void KeepChain(I&) {}
  static I BlockSums(I sum16, int32_t init) {
    return _mm512_add_epi32(_mm512_madd_epi16(sum16, _mm512_set1_epi16(1)), _mm512_set1_epi32(init));
  }
  static F Scales(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))); }
  static F FmaScaled(I isum, F dw, float da, F acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(da)), acc);
  }
  static F LoadF(const float* p) { return _mm512_load_ps(p); }
  static void StoreF(float* p, F v) { _mm512_store_ps(p, v); }
  static void StoreFU(float* p, F v) { _mm512_storeu_ps(p, v); }
};

KernelTable MakeAvx512BwTable() {
  KernelTable t = Avx2Kernels();
  t.name = "avx512bw";
  t.packed[static_cast<uint32_t>(GgmlType::kQ4_0)] = PackedRowsKernel<Avx512BwIsa, Q4_0Rows>::kKernels;
  return t;
}

}  // namespace

// Only reached after kernel_select.cpp has seen AVX-512 F/BW/VL/DQ in cpuid.
const KernelTable& Avx512BwKernels() {
  static const KernelTable kTable = MakeAvx512BwTable();
  return kTable;
}

}  // namespace kvfs::cpu
