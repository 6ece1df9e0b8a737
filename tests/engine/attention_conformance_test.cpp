// Every attention kernel table this CPU supports against the scalar reference: dot_rows and
// axpy_rows over rows built by KvQuantizeRow from random data, for each KV type, several
// geometries (including the scalar fallback's hd 8) and row / query counts that are and are
// not multiples of the SIMD widths. The tables sum in different orders, so the comparison is a
// normalised mean squared error (printed), bounded far below any quantization error.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/cpu/attention.h"
#include "engine/model/quants.h"

namespace kvfs::cpu {
namespace {

constexpr double kMaxNmse = 1e-10;

struct Geometry {
  const char* label;
  int64_t hd;
  int64_t n_heads;  // heads per row
  int64_t group;    // quantization group (q8, q4)
};

const Geometry kGeometries[] = {
    {"hd64_G64", 64, 1, 64},
    {"hd128_G64", 128, 1, 64},
    {"hd64_4heads_G64", 64, 4, 64},   // tinyllama: 4 KV heads per row
    {"hd32_2heads_G64", 32, 2, 64},   // a slice in half a group
    {"hd8_4heads_G32", 8, 4, 32},     // stories260K: scalar fallback
};

std::vector<std::string> SimdTables() {
  std::vector<std::string> names;
  for (const char* n : {"avx2", "avx512"}) {
    if (AttentionKernelsByName(n) != nullptr) names.push_back(n);
  }
  return names;
}

KvFormat Format(KvType type, int64_t group) {
  KvFormat f;
  f.type = type;
  f.group = group;
  return f;
}

// n_rows encoded rows of n_heads * hd values. Values get a per-row offset and a few outliers
// so q4's minimum and q8's scale vary between groups.
std::vector<uint8_t> MakeRows(const KvFormat& f, const Geometry& g, int64_t n_rows, std::mt19937& rng) {
  const int64_t n = g.hd * g.n_heads;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> rows(static_cast<size_t>(f.RowBytes(n) * n_rows));
  std::vector<float> x(n);
  for (int64_t p = 0; p < n_rows; ++p) {
    const float offset = 0.5f * normal(rng);
    for (int64_t i = 0; i < n; ++i) x[i] = offset + normal(rng) * (i % 17 == 0 ? 4.0f : 1.0f);
    KvQuantizeRow(f, x.data(), rows.data() + p * f.RowBytes(n), n);
  }
  return rows;
}

std::vector<float> RandomVector(int64_t n, std::mt19937& rng, bool round_f16) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = round_f16 ? Fp16ToFp32(Fp32ToFp16(normal(rng))) : normal(rng);
  return v;
}

double Nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0.0 ? num / den : num;
}

const char* TypeName(KvType t) { return t == KvType::kF16 ? "f16" : t == KvType::kQ8 ? "q8" : "q4"; }

TEST(AttentionConformance, TablesAreRegistered) {
  EXPECT_NE(AttentionKernelsByName("scalar"), nullptr);
  EXPECT_EQ(AttentionKernelsByName("no-such-table"), nullptr);
  // KVFS_ATTN (a debugging override) would change what an unknown name maps to.
  if (const char* forced = std::getenv("KVFS_ATTN"); forced == nullptr || *forced == '\0') {
    EXPECT_STREQ(AttentionKernelsFor("no-such-table").name, "scalar");
    for (const std::string& name : SimdTables()) EXPECT_STREQ(AttentionKernelsFor(name).name, name.c_str());
  }
  for (const std::string& name : SimdTables()) {
    EXPECT_STREQ(AttentionKernelsByName(name)->name, name.c_str());
  }
  std::printf("[attention] SIMD tables on this CPU: %zu\n", SimdTables().size());
}

// One (table, type, geometry) sweep over row counts, query counts and head indices.
void CheckTable(const AttentionKernels& table, KvType type, const Geometry& g) {
  const AttentionKernels& ref = ScalarAttentionKernels();
  const KvFormat f = Format(type, g.group);
  const int64_t row_bytes = f.RowBytes(g.hd * g.n_heads);
  std::mt19937 rng(1234u + static_cast<unsigned>(type) * 7u + static_cast<unsigned>(g.hd));
  const int64_t row_counts[] = {1, 2, 15, 16, 17, 31, 32, 33, 47, 100, 256, 300};
  const int64_t query_counts[] = {1, 2, 5, 8, 13, 24, 40};
  double worst_dot = 0.0, worst_axpy = 0.0;
  for (int64_t n_rows : row_counts) {
    const std::vector<uint8_t> rows = MakeRows(f, g, n_rows, rng);
    for (int64_t nq : query_counts) {
      const int64_t head = (n_rows + nq) % g.n_heads;
      const KvRows kv{rows.data(), row_bytes, n_rows, head, g.hd};
      // Q is f16-rounded as the backend does for an f16 cache (so f16 products are exact).
      const std::vector<float> q = RandomVector(nq * g.hd, rng, type == KvType::kF16);
      // Scores with a stride wider than n_rows: the kernels must not write past n_rows.
      const int64_t stride = n_rows + 3;
      std::vector<float> s_ref(nq * stride, -7.0f), s_got(nq * stride, -7.0f);
      ref.dot_rows(f, kv, q.data(), nq, s_ref.data(), stride);
      table.dot_rows(f, kv, q.data(), nq, s_got.data(), stride);
      for (int64_t i = 0; i < nq; ++i) {
        for (int64_t p = n_rows; p < stride; ++p) ASSERT_EQ(s_got[i * stride + p], -7.0f) << "wrote past n_rows";
      }
      const double e_dot = Nmse(s_got, s_ref);
      worst_dot = std::max(worst_dot, e_dot);
      EXPECT_LE(e_dot, kMaxNmse) << table.name << " " << TypeName(type) << " " << g.label << " dot rows=" << n_rows
                                 << " nq=" << nq << " head=" << head;

      // Weights like a softmax's (positive, summing to about 1), and a non-zero output to add to.
      std::vector<float> w = RandomVector(nq * stride, rng, false);
      for (float& x : w) x = std::fabs(x) / static_cast<float>(n_rows);
      const std::vector<float> out0 = RandomVector(nq * g.hd, rng, false);
      std::vector<float> o_ref = out0, o_got = out0;
      ref.axpy_rows(f, kv, w.data(), nq, stride, o_ref.data());
      table.axpy_rows(f, kv, w.data(), nq, stride, o_got.data());
      // Compare the increments, not out0 + increment, so out0 cannot hide an error.
      for (size_t j = 0; j < o_ref.size(); ++j) {
        o_ref[j] -= out0[j];
        o_got[j] -= out0[j];
      }
      const double e_axpy = Nmse(o_got, o_ref);
      worst_axpy = std::max(worst_axpy, e_axpy);
      EXPECT_LE(e_axpy, kMaxNmse) << table.name << " " << TypeName(type) << " " << g.label << " axpy rows=" << n_rows
                                  << " nq=" << nq << " head=" << head;
    }
  }
  std::printf("[attention] %-6s %-3s %-16s worst NMSE dot %.3g axpy %.3g\n", table.name, TypeName(type), g.label,
              worst_dot, worst_axpy);
}

class AttentionConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AttentionConformanceTest, MatchesScalar) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  for (KvType type : {KvType::kF16, KvType::kQ8, KvType::kQ4}) {
    for (const Geometry& g : kGeometries) CheckTable(*table, type, g);
  }
}

// Every head of a multi-head row, with the other heads' values very different, so reading the
// wrong slice or group header cannot pass.
TEST_P(AttentionConformanceTest, EveryHeadOfARow) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  const AttentionKernels& ref = ScalarAttentionKernels();
  const int64_t hd = 64, n_heads = 4, n = hd * n_heads, n_rows = 70, nq = 8;
  std::mt19937 rng(99);
  for (KvType type : {KvType::kF16, KvType::kQ8, KvType::kQ4}) {
    const KvFormat f = Format(type, 64);
    std::vector<uint8_t> rows(static_cast<size_t>(f.RowBytes(n) * n_rows));
    std::vector<float> x(n);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t p = 0; p < n_rows; ++p) {
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(10 * (i / hd)) + normal(rng);
      KvQuantizeRow(f, x.data(), rows.data() + p * f.RowBytes(n), n);
    }
    for (int64_t head = 0; head < n_heads; ++head) {
      const KvRows kv{rows.data(), f.RowBytes(n), n_rows, head, hd};
      const std::vector<float> q = RandomVector(nq * hd, rng, type == KvType::kF16);
      std::vector<float> s_ref(nq * n_rows), s_got(nq * n_rows);
      ref.dot_rows(f, kv, q.data(), nq, s_ref.data(), n_rows);
      table->dot_rows(f, kv, q.data(), nq, s_got.data(), n_rows);
      EXPECT_LE(Nmse(s_got, s_ref), kMaxNmse) << TypeName(type) << " head " << head;
      std::vector<float> o_ref(nq * hd, 0.0f), o_got(nq * hd, 0.0f);
      ref.axpy_rows(f, kv, s_ref.data(), nq, n_rows, o_ref.data());
      table->axpy_rows(f, kv, s_ref.data(), nq, n_rows, o_got.data());
      EXPECT_LE(Nmse(o_got, o_ref), kMaxNmse) << TypeName(type) << " head " << head;
    }
  }
}

// The softmax must give the scalar table's bits exactly (the golden tests' f16 path rounds the
// weights to f16, and equal inputs must round alike), including exponentials that underflow to
// subnormals or zero and tails that are not a multiple of the vector width.
TEST_P(AttentionConformanceTest, SoftmaxIsBitExact) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  const AttentionKernels& ref = ScalarAttentionKernels();
  std::mt19937 rng(5);
  int64_t rows = 0, mismatches = 0;
  for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 255, 256, 1000, 3500}) {
    for (float spread : {0.5f, 8.0f, 60.0f, 400.0f, 2000.0f}) {  // 400, 2000: exp underflows
      for (bool round_f16 : {false, true}) {
        std::uniform_real_distribution<float> uni(-spread, spread);
        const int64_t n_total = n + 5;
        std::vector<float> a(n_total);
        for (float& x : a) x = uni(rng);
        std::vector<float> b = a;
        const float scale = 0.125f;
        ref.softmax(a.data(), n, n_total, scale, round_f16);
        table->softmax(b.data(), n, n_total, scale, round_f16);
        for (int64_t i = 0; i < n_total; ++i) mismatches += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
        ++rows;
      }
    }
  }
  std::printf("[attention] %s softmax: %lld rows, %lld values differ in any bit\n", table->name,
              static_cast<long long>(rows), static_cast<long long>(mismatches));
  EXPECT_EQ(mismatches, 0);
}

// f16 rounding of queries: the same bits as Fp16ToFp32(Fp32ToFp16(x)) over normal, subnormal,
// overflowing and exactly-halfway values, at every tail length.
TEST_P(AttentionConformanceTest, RoundF16IsBitExact) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  std::mt19937 rng(11);
  std::vector<float> x;
  for (float mag : {1e-7f, 1e-5f, 0.01f, 1.0f, 300.0f, 60000.0f, 70000.0f}) {
    std::uniform_real_distribution<float> uni(-mag, mag);
    for (int i = 0; i < 200; ++i) x.push_back(uni(rng));
  }
  for (int i = 0; i < 100; ++i) x.push_back(1.0f + (2 * i + 1) * 0x1p-11f);  // halfway between two halfs
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{17}, static_cast<int64_t>(x.size())}) {
    std::vector<float> a(x.begin(), x.begin() + n), b = a;
    ScalarAttentionKernels().round_f16(a.data(), n);
    table->round_f16(b.data(), n);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0) << "n=" << n;
  }
}

TEST_P(AttentionConformanceTest, HadamardIsBitExact) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  std::mt19937 rng(13);
  for (int64_t n : {2, 8, 16, 32, 64, 128, 256, 512}) {
    const std::vector<float> x = RandomVector(n, rng, false);
    std::vector<float> a = x, b = x;
    HadamardTransform(a.data(), n);
    table->hadamard(b.data(), n);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0) << "n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(AttentionConformance, AttentionConformanceTest, ::testing::Values("avx2", "avx512"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kvfs::cpu
