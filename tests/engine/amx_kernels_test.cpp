// The "amx" kernel table against the "avx512" one, bit for bit. Both sum each block's products
// exactly in int32 (the tile unit here, vpdpbusd there) and then do the same float operations
// per (token, row) in the same order (acc += float(sum) * (d_w * d_a), plus m_w * s_a for the
// formats with a minimum, blocks in order), so the AMX tiles must reproduce the VNNI panels'
// and row kernels' results exactly: an agent's prompt gives the same logits on a CPU with AMX
// as on one without. The conformance test checks both against the scalar reference by NMSE;
// this one would catch, for instance, a block scaled with its neighbour's d_a or a K chunk that
// restarts a row's sum (NMSE of ~1e-14 either way, far inside that test's bound).
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_features.h"
#include "engine/backend/cpu/kernel_select.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/model/quants.h"
#include "tests/engine/random_operands.h"

namespace kvfs::cpu {
namespace {

using kvfs::testing::AlignedPacked;
using kvfs::testing::PackAligned;

uint32_t Id(GgmlType t) { return static_cast<uint32_t>(t); }

std::vector<uint8_t> RandomWeights(GgmlType t, int64_t n_rows, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> w(static_cast<size_t>(RowBytes(t, n) * n_rows));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  kvfs::testing::SetSaneScales(t, w, n_rows, n, rng);
  return w;
}

// Token counts below the tiles (the avx512 kernels then run in both tables), at the first tile
// count, through a last tile of 1 and 15 tokens, over one and several passes of 128 tokens.
constexpr int64_t kTokenCounts[] = {5, 31, 32, 33, 47, 64, 128, 129, 143, 259};
// Block counts: one K chunk (9 blocks; 1, 2 and 3, fewer than the tiles in flight), one and a
// part (41; 35, a last chunk of 3), several (100); rows that fill no whole group of 16, one
// group, less than one, and whole groups.
struct Shape {
  int64_t rows;
  int64_t blocks;
};
constexpr Shape kShapes[] = {{37, 9}, {70, 41}, {21, 100}, {16, 1}, {8, 2}, {32, 3}, {48, 35}};

std::vector<uint8_t> QuantizedTokens(const KernelTable& k, GgmlType t, int64_t n, int64_t tokens, std::mt19937& rng) {
  const int64_t qb = QuantizedActivationRowBytes(t, n);
  std::vector<uint8_t> q(static_cast<size_t>(qb * tokens));
  for (int64_t i = 0; i < tokens; ++i) k.quantize_row[Id(t)](kvfs::testing::RandomActivations(n, rng).data(), q.data() + i * qb, n);
  return q;
}

// Why this process has no amx table: no AMX-INT8 in this CPU, or a kernel (or sandbox) that
// refused the tile state (then the engine runs the avx512 table, and says so in its log).
const char* NoAmxReason() {
  return HostCpuFeatures().amx_int8 ? "the CPU has AMX-INT8 but this process was refused the tile state"
                                    : "this CPU has no AMX-INT8 tiles";
}

TEST(AmxKernels, TilesGiveTheAvx512Bits) {
  const KernelTable* amx = KernelTableByName("amx");
  const KernelTable* avx512 = KernelTableByName("avx512");
  if (amx == nullptr) GTEST_SKIP() << NoAmxReason();
  ASSERT_NE(avx512, nullptr) << "the amx table needs the avx512 table's features";
  // The table's own kernels, not avx512's under another name.
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0}) {
    EXPECT_NE(amx->matmul_tile[Id(t)], avx512->matmul_tile[Id(t)]) << GgmlTypeInfo(Id(t))->name;
  }
  std::mt19937 rng(31);
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0}) {
    for (const Shape& s : kShapes) {
      const int64_t n = 32 * s.blocks, rb = RowBytes(t, n), qb = QuantizedActivationRowBytes(t, n);
      const std::vector<uint8_t> w = RandomWeights(t, s.rows, n, rng);
      const std::vector<uint8_t> q = QuantizedTokens(*avx512, t, n, 259, rng);
      for (int64_t tokens : kTokenCounts) {
        const int64_t stride = s.rows + 3;  // y rows wider than the matrix: padding untouched
        std::vector<float> want(static_cast<size_t>(stride * tokens), -7.0f), got = want;
        avx512->matmul_tile[Id(t)](w.data(), rb, s.rows, q.data(), qb, tokens, n, want.data(), stride);
        amx->matmul_tile[Id(t)](w.data(), rb, s.rows, q.data(), qb, tokens, n, got.data(), stride);
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
              << GgmlTypeInfo(Id(t))->name << " rows=" << s.rows << " blocks=" << s.blocks << " tokens=" << tokens
              << ": token " << i / stride << " row " << i % stride << ": " << got[i] << " vs " << want[i];
        }
      }
    }
  }
}

TEST(AmxKernels, PackedQ4_0GivesTheAvx512Bits) {
  const KernelTable* amx = KernelTableByName("amx");
  const KernelTable* avx512 = KernelTableByName("avx512");
  if (amx == nullptr) GTEST_SKIP() << NoAmxReason();
  ASSERT_NE(avx512, nullptr);
  const GgmlType t = GgmlType::kQ4_0;
  const PackedKernels& pk = amx->packed[Id(t)];
  ASSERT_TRUE(pk.available());
  ASSERT_NE(pk.matmul, avx512->packed[Id(t)].matmul) << "the table's own kernel";
  ASSERT_EQ(pk.bytes, avx512->packed[Id(t)].bytes) << "both tables read the same packed layout";
  std::mt19937 rng(32);
  for (const Shape& s : kShapes) {
    const int64_t n = 32 * s.blocks, rb = RowBytes(t, n), qb = QuantizedActivationRowBytes(t, n);
    const std::vector<uint8_t> w = RandomWeights(t, s.rows, n, rng);
    const AlignedPacked aligned = PackAligned(pk, w, rb, s.rows, n);
    const uint8_t* packed = aligned.data;
    const std::vector<uint8_t> q = QuantizedTokens(*avx512, t, n, 259, rng);
    for (int64_t tokens : kTokenCounts) {
      // Rows from 32 on, as a second thread of CpuBackend's products takes them.
      for (int64_t r0 : {int64_t{0}, int64_t{32}}) {
        if (r0 >= s.rows) continue;
        const int64_t rows = s.rows - r0, stride = rows + 3;
        std::vector<float> want(static_cast<size_t>(stride * tokens), -7.0f), got = want;
        avx512->packed[Id(t)].matmul(packed, r0, rows, q.data(), qb, tokens, n, want.data(), stride);
        pk.matmul(packed, r0, rows, q.data(), qb, tokens, n, got.data(), stride);
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
              << "rows=" << s.rows << " r0=" << r0 << " blocks=" << s.blocks << " tokens=" << tokens << ": token "
              << i / stride << " row " << i % stride << ": " << got[i] << " vs " << want[i];
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvfs::cpu
