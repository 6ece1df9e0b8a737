// Every kernel table this CPU supports against the scalar reference, per weight type and op:
// quantize_row (codes and scales), vec_dot and matmul_tile (odd row counts, 1..17 tokens and
// beyond the tiles' internal blockings), on random blocks with sane fp16 scales. Errors are
// measured as NMSE = sum (a - b)^2 / sum b^2 against the scalar results and printed.
//
// Dot products are compared on the SAME quantized activations (made by the scalar quantizer),
// so only the dot product is under test; quantize_row is compared on its own.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/cpu/kernel_select.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/model/quants.h"
#include "tests/engine/random_operands.h"

namespace kvfs::cpu {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                               GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                               GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

uint32_t Id(GgmlType t) { return static_cast<uint32_t>(t); }
std::string Name(GgmlType t) { return std::string(GgmlTypeInfo(Id(t))->name); }
int64_t BlockElems(GgmlType t) { return GgmlTypeInfo(Id(t))->block_elems; }
bool IsFloat(GgmlType t) { return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16; }

// NMSE bounds. Integer paths sum each block (sub-block) exactly in int32 like the reference;
// only the float accumulation of the block terms is reordered (~1e-7 relative per term).
// Float types reorder the whole sum (F32 rows keep the reference order exactly).
double Bound(GgmlType t) { return IsFloat(t) ? 1e-9 : 1e-10; }

// The SIMD tables of this build that this CPU can run.
std::vector<const KernelTable*> SimdTables() {
  std::vector<const KernelTable*> out;
  for (const std::string& name : AllKernelTableNames()) {
    if (name == "scalar") continue;
    if (const KernelTable* t = KernelTableByName(name)) out.push_back(t);
  }
  return out;
}


// n_rows rows of n elements of type t: random bytes, with every scale field set to a sane
// fp16 (random bytes could be NaN or huge) and float types drawn from N(0, 1).
std::vector<uint8_t> RandomWeights(GgmlType t, int64_t n_rows, int64_t n, std::mt19937& rng) {
  const int64_t row_bytes = RowBytes(t, n);
  std::vector<uint8_t> w(static_cast<size_t>(row_bytes * n_rows));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  kvfs::testing::SetSaneScales(t, w, n_rows, n, rng);
  return w;
}

using kvfs::testing::AlignedPacked;
using kvfs::testing::PackAligned;
using kvfs::testing::RandomActivations;

double Nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0.0 ? num / den : num;
}

// Codes and scales of a quantized activation row, decoded for comparison.
struct Decoded {
  std::vector<int> codes;
  std::vector<float> scales;  // d per block (Q8_0/Q8_1/Q8_K), s too for Q8_1, bsums for Q8_K
};
Decoded DecodeActivations(GgmlType vdt, const uint8_t* p, int64_t n) {
  Decoded d;
  auto half = [](const uint8_t* q) {
    uint16_t h;
    std::memcpy(&h, q, 2);
    return Fp16ToFp32(h);
  };
  if (vdt == GgmlType::kQ8_0 || vdt == GgmlType::kQ8_1) {
    const int bytes = vdt == GgmlType::kQ8_0 ? 34 : 36, qs = bytes - 32;
    for (int64_t i = 0; i < n / 32; ++i) {
      const uint8_t* b = p + i * bytes;
      d.scales.push_back(half(b));
      if (vdt == GgmlType::kQ8_1) d.scales.push_back(half(b + 2));
      for (int j = 0; j < 32; ++j) d.codes.push_back(static_cast<int8_t>(b[qs + j]));
    }
  } else if (vdt == GgmlType::kQ8_K) {
    for (int64_t i = 0; i < n / 256; ++i) {
      const uint8_t* b = p + i * 292;
      float s;
      std::memcpy(&s, b, 4);
      d.scales.push_back(s);
      for (int j = 0; j < 256; ++j) d.codes.push_back(static_cast<int8_t>(b[4 + j]));
      for (int j = 0; j < 16; ++j) {
        int16_t v;
        std::memcpy(&v, b + 260 + 2 * j, 2);
        d.scales.push_back(v);
      }
    }
  }
  return d;
}

std::vector<int64_t> Lengths(GgmlType t) {
  if (IsFloat(t)) return {1, 15, 16, 17, 64, 100, 256, 1000};
  if (BlockElems(t) == 32) return {32, 7 * 32, 8 * 32, 9 * 32, 17 * 32, 71 * 32};
  return {256, 2 * 256, 3 * 256, 9 * 256};
}

TEST(KernelConformance, TablesAreComplete) {
  for (const KernelTable* k : SimdTables()) {
    for (GgmlType t : kTypes) {
      EXPECT_NE(k->quantize_row[Id(t)], nullptr) << k->name << " " << Name(t);
      EXPECT_NE(k->vec_dot[Id(t)], nullptr) << k->name << " " << Name(t);
      EXPECT_NE(k->matmul_tile[Id(t)], nullptr) << k->name << " " << Name(t);
    }
  }
  for (GgmlType t : kTypes) EXPECT_NE(ScalarKernels().matmul_tile[Id(t)], nullptr) << Name(t);
  if (SimdTables().empty()) GTEST_SKIP() << "this CPU runs no SIMD table";
}

TEST(KernelConformance, Selection) {
  const std::vector<std::string> names = AllKernelTableNames();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "scalar");
  EXPECT_EQ(KernelTableByName("scalar"), &ScalarKernels());
  EXPECT_EQ(KernelTableByName("no-such-table"), nullptr);
  // Without KVFS_CPU the default is the fastest table this CPU supports (the last one listed).
  std::string best;
  for (const std::string& n : names) {
    if (const KernelTable* t = KernelTableByName(n)) {
      EXPECT_STREQ(t->name, n.c_str());
      best = n;
    }
  }
  const char* forced = std::getenv("KVFS_CPU");
  if (forced == nullptr || *forced == '\0') {
    EXPECT_EQ(DefaultKernelTable().name, best);
  }
  std::printf("[conformance] tables: %zu compiled, default %s\n", names.size(), DefaultKernelTable().name);
}

TEST(KernelConformance, QuantizeRow) {
  std::mt19937 rng(1234);
  const KernelTable& ref = ScalarKernels();
  for (const KernelTable* k : SimdTables()) {
    for (GgmlType t : kTypes) {
      const GgmlType vdt = VecDotType(t);
      int64_t differing = 0, total = 0;
      double scale_rel = 0.0;
      for (int64_t n : Lengths(t)) {
        const std::vector<float> x = RandomActivations(n, rng);
        const int64_t bytes = QuantizedActivationRowBytes(t, n);
        // One guard byte each side; the row starts at an odd address (no alignment assumed).
        std::vector<uint8_t> a(static_cast<size_t>(bytes + 2), 0xAA), b(static_cast<size_t>(bytes + 2), 0xAA);
        ref.quantize_row[Id(t)](x.data(), a.data() + 1, n);
        k->quantize_row[Id(t)](x.data(), b.data() + 1, n);
        EXPECT_TRUE(b.front() == 0xAA && b.back() == 0xAA) << k->name << " " << Name(t) << " wrote outside the row";
        if (IsFloat(t)) {
          // Plain conversions: identical bits.
          EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size())) << k->name << " " << Name(t) << " n=" << n;
          continue;
        }
        const Decoded da = DecodeActivations(vdt, a.data() + 1, n), db = DecodeActivations(vdt, b.data() + 1, n);
        ASSERT_EQ(da.codes.size(), db.codes.size());
        for (size_t i = 0; i < da.codes.size(); ++i) {
          EXPECT_LE(std::abs(da.codes[i] - db.codes[i]), 1) << k->name << " " << Name(t) << " n=" << n << " i=" << i;
          differing += da.codes[i] != db.codes[i];
        }
        total += static_cast<int64_t>(da.codes.size());
        ASSERT_EQ(da.scales.size(), db.scales.size());
        for (size_t i = 0; i < da.scales.size(); ++i) {
          const double rel = std::fabs(da.scales[i] - db.scales[i]) / std::max(1e-30, std::fabs(static_cast<double>(da.scales[i])));
          scale_rel = std::max(scale_rel, rel);
        }
      }
      if (!IsFloat(t)) {
        std::printf("[conformance] quantize_row %-6s %-5s -> %-4s codes differing: %lld of %lld, max scale rel diff %.2e\n",
                    k->name, Name(t).c_str(), Name(vdt).c_str(), static_cast<long long>(differing),
                    static_cast<long long>(total), scale_rel);
        // Ties may round differently in principle; these tables reproduce the scalar codes.
        EXPECT_EQ(differing, 0) << k->name << " " << Name(t);
        EXPECT_LE(scale_rel, 1e-6) << k->name << " " << Name(t);
      } else {
        std::printf("[conformance] quantize_row %-6s %-5s identical bytes\n", k->name, Name(t).c_str());
      }
    }
  }
}

TEST(KernelConformance, VecDot) {
  std::mt19937 rng(99);
  const KernelTable& ref = ScalarKernels();
  for (const KernelTable* k : SimdTables()) {
    for (GgmlType t : kTypes) {
      double worst = 0.0;
      for (int64_t n : Lengths(t)) {
        const int64_t rows = 13;
        const std::vector<uint8_t> w = RandomWeights(t, rows, n, rng);
        const int64_t rb = RowBytes(t, n);
        const std::vector<float> x = RandomActivations(n, rng);
        std::vector<uint8_t> q(static_cast<size_t>(QuantizedActivationRowBytes(t, n)));
        ref.quantize_row[Id(t)](x.data(), q.data(), n);
        std::vector<float> want(rows), got(rows);
        for (int64_t r = 0; r < rows; ++r) {
          want[r] = ref.vec_dot[Id(t)](w.data() + r * rb, q.data(), n);
          got[r] = k->vec_dot[Id(t)](w.data() + r * rb, q.data(), n);
        }
        const double e = Nmse(got, want);
        EXPECT_LE(e, Bound(t)) << k->name << " " << Name(t) << " n=" << n;
        worst = std::max(worst, e);
      }
      std::printf("[conformance] vec_dot      %-6s %-5s NMSE %.3e (bound %.0e)\n", k->name, Name(t).c_str(), worst, Bound(t));
    }
  }
}

// One matmul_tile call against vec_dot of the scalar table, on every (row, token); y has a
// wider stride than n_rows and its padding must stay untouched.
double TileNmse(const KernelTable& k, GgmlType t, int64_t n_rows, int64_t n_tokens, int64_t n, std::mt19937& rng) {
  const KernelTable& ref = ScalarKernels();
  const std::vector<uint8_t> w = RandomWeights(t, n_rows, n, rng);
  const int64_t rb = RowBytes(t, n), qb = QuantizedActivationRowBytes(t, n);
  std::vector<uint8_t> q(static_cast<size_t>(qb * n_tokens));
  for (int64_t tok = 0; tok < n_tokens; ++tok) {
    const std::vector<float> x = RandomActivations(n, rng);
    ref.quantize_row[Id(t)](x.data(), q.data() + tok * qb, n);
  }
  const int64_t stride = n_rows + 3;
  const float kSentinel = -12345.0f;
  std::vector<float> y(static_cast<size_t>(stride * n_tokens), kSentinel), want, got;
  k.matmul_tile[Id(t)](w.data(), rb, n_rows, q.data(), qb, n_tokens, n, y.data(), stride);
  for (int64_t tok = 0; tok < n_tokens; ++tok) {
    for (int64_t r = 0; r < stride; ++r) {
      const float v = y[tok * stride + r];
      if (r >= n_rows) {
        EXPECT_EQ(v, kSentinel) << k.name << " " << Name(t) << " wrote padding at token " << tok << " row " << r;
        continue;
      }
      got.push_back(v);
      want.push_back(ref.vec_dot[Id(t)](w.data() + r * rb, q.data() + tok * qb, n));
    }
  }
  return Nmse(got, want);
}

TEST(KernelConformance, MatMulTile) {
  std::mt19937 rng(7);
  std::vector<const KernelTable*> tables = SimdTables();
  tables.push_back(&ScalarKernels());  // the reference tile (a loop of vec_dot) too
  for (const KernelTable* k : tables) {
    for (GgmlType t : kTypes) {
      const int64_t be = BlockElems(t);
      const int64_t n = IsFloat(t) ? 80 : (be == 32 ? 9 * 32 : 2 * 256);
      double worst = 0.0;
      // Rows: fewer than, not a multiple of, and more than the 32-row panels / 4-row groups.
      for (int64_t rows : {1, 5, 33, 70}) {
        for (int64_t tokens = 1; tokens <= 17; ++tokens) {
          const double e = TileNmse(*k, t, rows, tokens, n, rng);
          EXPECT_LE(e, Bound(t)) << k->name << " " << Name(t) << " rows=" << rows << " tokens=" << tokens;
          worst = std::max(worst, e);
        }
      }
      // Past the internal blockings: K chunks of 512, passes of 128 tokens (a remainder under 64
      // joins the pass before it: 191 is one pass, 200 two, 259 = 128 + 131 ends in 3 tokens);
      // odd lengths.
      const int64_t n_big = IsFloat(t) ? 1000 : (be == 32 ? 41 * 32 : 5 * 256);
      for (int64_t tokens : {130, 191, 200, 259, 3}) {
        const double e = TileNmse(*k, t, 37, tokens, n_big, rng);
        EXPECT_LE(e, Bound(t)) << k->name << " " << Name(t) << " big, tokens=" << tokens;
        worst = std::max(worst, e);
      }
      std::printf("[conformance] matmul_tile  %-6s %-5s NMSE %.3e (bound %.0e)\n", k->name, Name(t).c_str(), worst, Bound(t));
    }
  }
}

}  // namespace
}  // namespace kvfs::cpu

namespace kvfs::cpu {
namespace {

// The packed kernels (weights repacked at load, PackedKernels in kernels.h) against vec_dot of
// the scalar table on every (row, token), over row ranges that start at a 32-row unit inside
// the matrix (as CpuBackend's threads call them), with odd block counts, rows that fill no
// whole group, and token counts through the row passes (1..8, 9..63) and the panels (64+, one
// pass up to 191 tokens, then passes of 128).
// Each token's results must also be bit-identical whatever the number of tokens sharing the
// call, row passes and panels alike (41 blocks: more than one K chunk of the panels): a batched
// decode step gives every sequence what it would get alone, and a prompt gives the same logits
// however the scheduler cuts it into passes.
TEST(KernelConformance, PackedMatMul) {
  std::mt19937 rng(11);
  const KernelTable& ref = ScalarKernels();
  int checked = 0;
  for (const KernelTable* k : SimdTables()) {
    for (GgmlType t : kTypes) {
      const PackedKernels& pk = k->packed[Id(t)];
      if (!pk.available()) continue;
      ++checked;
      double worst = 0.0;
      // Sizes in blocks of the type (32 or 256 inputs). Blocks of 32: 260 is past the AVX2
      // packed kernels' K chunk of 256 blocks, 530 past the AVX-512 row passes' 512 (their
      // activation terms per chunk), whose sums a later chunk continues from y; the K-quants'
      // panels take 2 super-blocks a chunk, so odd counts end in a part chunk.
      const int64_t be = BlockElems(t);
      for (auto [n_rows, blocks] : be == 32 ? std::vector<std::pair<int64_t, int64_t>>{{70, 9}, {45, 41}, {16, 2}, {100, 1}, {20, 260}, {20, 530}}
                                            : std::vector<std::pair<int64_t, int64_t>>{{70, 3}, {45, 5}, {16, 2}, {100, 1}, {20, 11}}) {
        const int64_t n = blocks * be;
        const std::vector<uint8_t> w = RandomWeights(t, n_rows, n, rng);
        const int64_t rb = RowBytes(t, n), qb = QuantizedActivationRowBytes(t, n);
        const AlignedPacked aligned = PackAligned(pk, w, rb, n_rows, n);
        const uint8_t* packed = aligned.data;
        const int64_t max_tokens = 200;
        std::vector<uint8_t> q(static_cast<size_t>(qb * max_tokens));
        for (int64_t tok = 0; tok < max_tokens; ++tok) {
          ref.quantize_row[Id(t)](RandomActivations(n, rng).data(), q.data() + tok * qb, n);
        }
        for (int64_t tokens : {1, 2, 3, 5, 8, 9, 17, 50, 64, 70, 191, 200}) {
          for (int64_t r0 : {int64_t{0}, int64_t{32}}) {
            if (r0 >= n_rows) continue;
            const int64_t rows = n_rows - r0, stride = rows + 3;
            const float kSentinel = -12345.0f;
            std::vector<float> y(static_cast<size_t>(stride * tokens), kSentinel), got, want;
            pk.matmul(packed, r0, rows, q.data(), qb, tokens, n, y.data(), stride);
            for (int64_t tok = 0; tok < tokens; ++tok) {
              for (int64_t r = 0; r < stride; ++r) {
                const float v = y[tok * stride + r];
                if (r >= rows) {
                  EXPECT_EQ(v, kSentinel) << k->name << " wrote padding, token " << tok << " row " << r;
                  continue;
                }
                got.push_back(v);
                want.push_back(ref.vec_dot[Id(t)](w.data() + (r0 + r) * rb, q.data() + tok * qb, n));
              }
            }
            const double e = Nmse(got, want);
            EXPECT_LE(e, Bound(t)) << k->name << " " << Name(t) << " rows=" << n_rows << " n=" << n << " r0=" << r0
                                   << " tokens=" << tokens;
            worst = std::max(worst, e);
            if (r0 == 0) {
              for (int64_t tok = 0; tok < tokens; ++tok) {
                std::vector<float> one(static_cast<size_t>(n_rows));
                pk.matmul(packed, 0, n_rows, q.data() + tok * qb, qb, 1, n, one.data(), n_rows);
                for (int64_t r = 0; r < n_rows; ++r) {
                  ASSERT_EQ(y[tok * stride + r], one[static_cast<size_t>(r)])
                      << k->name << " token " << tok << " of " << tokens << " row " << r << " differs from the token alone";
                }
              }
            }
          }
        }
      }
      std::printf("[conformance] packed       %-6s %-5s NMSE %.3e (bound %.0e)\n", k->name, Name(t).c_str(), worst, Bound(t));
    }
  }
  if (checked == 0) GTEST_SKIP() << "no kernel table this CPU runs has packed kernels";
}

// The packed kernels add products in int16 before widening them (vpmaddubsw, then a few pair
// vectors added as int16): safe only while the codes and activations stay inside the bounds
// the kernels' comments derive. Random operands never come near them, so here every weight code
// is at its largest magnitude (nibbles 15 with every fifth bit set, Q6_K 63, Q8_0 -128) against
// activations that all quantize to +127 or all to -127: a sum that wrapped would be far off.
TEST(KernelConformance, PackedMatMulAtTheIntegerBounds) {
  std::mt19937 rng(13);
  const KernelTable& ref = ScalarKernels();
  int checked = 0;
  for (const KernelTable* k : SimdTables()) {
    for (GgmlType t : kTypes) {
      const PackedKernels& pk = k->packed[Id(t)];
      if (!pk.available()) continue;
      ++checked;
      const int64_t n_rows = 40, n = 9 * 256, rb = RowBytes(t, n), qb = QuantizedActivationRowBytes(t, n);
      std::vector<uint8_t> w(static_cast<size_t>(rb * n_rows), t == GgmlType::kQ8_0 ? 0x80 : 0xFF);
      kvfs::testing::SetSaneScales(t, w, n_rows, n, rng);
      const AlignedPacked aligned = PackAligned(pk, w, rb, n_rows, n);
      const uint8_t* packed = aligned.data;
      const int64_t tokens = 6;  // a pass of 4 and one of 2 in every table
      std::vector<uint8_t> q(static_cast<size_t>(qb * tokens));
      for (int64_t tok = 0; tok < tokens; ++tok) {
        ref.quantize_row[Id(t)](std::vector<float>(static_cast<size_t>(n), tok % 2 == 0 ? 1.0f : -1.0f).data(),
                                q.data() + tok * qb, n);
      }
      std::vector<float> y(static_cast<size_t>(n_rows * tokens)), want;
      pk.matmul(packed, 0, n_rows, q.data(), qb, tokens, n, y.data(), n_rows);
      for (int64_t tok = 0; tok < tokens; ++tok) {
        for (int64_t r = 0; r < n_rows; ++r) want.push_back(ref.vec_dot[Id(t)](w.data() + r * rb, q.data() + tok * qb, n));
      }
      EXPECT_LE(Nmse(y, want), Bound(t)) << k->name << " " << Name(t);
    }
  }
  if (checked == 0) GTEST_SKIP() << "no kernel table this CPU runs has packed kernels";
}

// Every packed kernel of a type sums each block (K-quants: each sub-block) exactly in integers,
// then does the same float operations per row in the same order (Q4_0: acc += float(isum) *
// (d_w * d_a), blocks in order; the K-quants: kernels_avx2_packed_kquants.cpp), so below the
// AVX-512 table's panel path for the 32-value formats (64 tokens) a decode step gives the same
// bits whichever table runs it: an agent's output does not depend on the machine kind's
// instruction set.
TEST(KernelConformance, PackedSameBitsInEveryTable) {
  std::mt19937 rng(12);
  int compared = 0;
  for (GgmlType t : kTypes) {
    std::vector<const KernelTable*> tables;
    for (const KernelTable* k : SimdTables()) {
      if (k->packed[Id(t)].available()) tables.push_back(k);
    }
    if (tables.size() < 2) continue;
    ++compared;
    const int64_t be = BlockElems(t);
    for (auto [n_rows, blocks] : be == 32 ? std::vector<std::pair<int64_t, int64_t>>{{45, 41}, {20, 260}}
                                          : std::vector<std::pair<int64_t, int64_t>>{{45, 5}, {20, 11}}) {
      const int64_t n = blocks * be;
      const std::vector<uint8_t> w = RandomWeights(t, n_rows, n, rng);
      const int64_t rb = RowBytes(t, n), qb = QuantizedActivationRowBytes(t, n), max_tokens = 40;
      std::vector<uint8_t> q(static_cast<size_t>(qb * max_tokens));
      for (int64_t tok = 0; tok < max_tokens; ++tok) {
        ScalarKernels().quantize_row[Id(t)](RandomActivations(n, rng).data(), q.data() + tok * qb, n);
      }
      // Rows from 0 and, as the backend's threads call it, from a later 32-row unit.
      for (auto [tokens, r0] : std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {3, 0}, {8, 0}, {13, 0}, {40, 0}, {1, 32}, {5, 32}}) {
        if (r0 >= n_rows) continue;
        const int64_t rows = n_rows - r0;
        std::vector<float> first;
        for (const KernelTable* k : tables) {
          const PackedKernels& pk = k->packed[Id(t)];
          const AlignedPacked aligned = PackAligned(pk, w, rb, n_rows, n);
          const uint8_t* packed = aligned.data;
          std::vector<float> y(static_cast<size_t>(rows * tokens));
          pk.matmul(packed, r0, rows, q.data(), qb, tokens, n, y.data(), rows);
          if (first.empty()) {
            first = y;
            continue;
          }
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_EQ(std::memcmp(&y[i], &first[i], sizeof(float)), 0)
                << Name(t) << " " << k->name << " vs " << tables.front()->name << ": token " << i / rows << " row "
                << r0 + static_cast<int64_t>(i) % rows << " of " << tokens << " tokens, n=" << n << ": " << y[i] << " vs "
                << first[i];
          }
        }
      }
    }
  }
  if (compared == 0) GTEST_SKIP() << "no type has packed kernels in two kernel tables this CPU runs";
}

}  // namespace
}  // namespace kvfs::cpu
