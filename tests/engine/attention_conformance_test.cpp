// Every attention kernel table this CPU supports against the scalar reference: dot_rows and
// axpy_rows over rows built by KvQuantizeRow from random data, for each KV type (q4k: its V
// rows), several geometries (including the scalar fallback's hd 8) and row / query counts that
// are and are not multiples of the SIMD widths; dot_chunks over q4k K chunks built by
// KvQuantizeKChunk, for several chunk sizes, token counts that end inside a chunk, and a
// chunk stride wider than the chunks (a block's K plane). The tables sum in different orders, so the comparison is a
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
  int64_t sub;      // q4k V sub-block
};

const Geometry kGeometries[] = {
    {"hd64_G64", 64, 1, 64, 16},
    {"hd128_G64", 128, 1, 64, 16},
    {"hd64_4heads_G64", 64, 4, 64, 16},  // tinyllama: 4 KV heads per row
    {"hd32_2heads_G64", 32, 2, 64, 16},  // a slice in half a group
    {"hd80_1head_G40", 80, 1, 40, 16},   // q4k: a last quad of one sub-block
    {"hd8_4heads_G32", 8, 4, 32, 8},     // stories260K: scalar fallback
};

std::vector<std::string> SimdTables() {
  std::vector<std::string> names;
  for (const char* n : {"avx2", "avxvnni", "avx512bw", "avx512"}) {
    if (AttentionKernelsByName(n) != nullptr) names.push_back(n);
  }
  return names;
}

KvFormat Format(KvType type, int64_t group, int64_t chunk = 64) {
  KvFormat f;
  f.type = type;
  f.group = group;
  if (type == KvType::kQ4K) f.chunk = chunk;
  return f;
}

KvFormat Format(KvType type, const Geometry& g) { return Format(type, type == KvType::kQ4K ? g.sub : g.group); }

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

const char* TypeName(KvType t) {
  return t == KvType::kF16 ? "f16" : t == KvType::kQ8 ? "q8" : t == KvType::kQ4 ? "q4" : "q4k";
}

constexpr KvType kRowTypes[] = {KvType::kF16, KvType::kQ8, KvType::kQ4, KvType::kQ4K};

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

// An integer path's error budget: `got` must be its rule recomputed in double (`rule`), and the
// int8 rounding (got against the float path) must add far less error than the 4-bit cache
// already has (the float path against the unquantized `exact`).
void ExpectIntegerErrorBudget(const char* what, const char* label, const std::vector<float>& got,
                              const std::vector<float>& rule, const std::vector<float>& float_path,
                              const std::vector<float>& exact) {
  const double e_rule = Nmse(got, rule), e_int8 = Nmse(got, float_path), e_4bit = Nmse(float_path, exact);
  std::printf("[attention] %s %-16s NMSE vs double %.3g; int8 rounding %.3g, 4-bit cache %.3g\n", what, label, e_rule,
              e_int8, e_4bit);
  EXPECT_LE(e_rule, 1e-12) << what << " " << label;
  EXPECT_LE(e_int8, 0.02 * e_4bit) << what << " " << label;
}

// Queries quantized for q4 keys (cpu::QuantizeQueries), owning their arrays.
struct Int8QueryBlocks {
  std::vector<int8_t> codes;
  std::vector<float> scales, sums;
  std::vector<int32_t> code_sums;
  Int8QueryBlocks(const std::vector<float>& q, int64_t nq, int64_t hd)
      : codes(nq * hd), scales(nq * hd / kQueryBlock), sums(nq * hd / kQueryBlock), code_sums(nq * hd / kQueryBlock) {
    QuantizeQueries(q.data(), nq, hd, codes.data(), scales.data(), sums.data(), code_sums.data());
  }
  Int8Queries view() const { return {codes.data(), scales.data(), sums.data(), code_sums.data()}; }
};

// One (table, type, geometry) sweep over row counts, query counts and head indices.
void CheckTable(const AttentionKernels& table, KvType type, const Geometry& g) {
  const AttentionKernels& ref = ScalarAttentionKernels();
  const KvFormat f = Format(type, g);
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

      if (KeysUseInt8Queries(f, g.hd)) {
        // q4 keys with int8 queries: every table does the same integer sums and float steps.
        const Int8QueryBlocks q8(q, nq, g.hd);
        std::vector<float> i_ref(nq * stride, -7.0f), i_got(nq * stride, -7.0f);
        ref.dot_rows_q8(f, kv, q8.view(), nq, i_ref.data(), stride);
        table.dot_rows_q8(f, kv, q8.view(), nq, i_got.data(), stride);
        for (size_t j = 0; j < i_ref.size(); ++j) {
          ASSERT_EQ(i_got[j], i_ref[j]) << table.name << " " << g.label << " int8-query dot rows=" << n_rows
                                        << " nq=" << nq << " head=" << head << " at " << j;
        }
      }

      // Weights like a softmax's (positive, summing to about 1), and a non-zero output to add to.
      std::vector<float> w = RandomVector(nq * stride, rng, false);
      for (float& x : w) x = std::fabs(x) / static_cast<float>(n_rows);
      const std::vector<float> out0 = RandomVector(nq * g.hd, rng, false);
      std::vector<float> o_ref = out0, o_got = out0;
      ref.axpy_rows(f, kv, w.data(), nq, stride, o_ref.data());
      table.axpy_rows(f, kv, w.data(), nq, stride, o_got.data());
      if (ValuesUseInt8Weights(f, g.hd)) {
        // q4 values with int8 weights: every table does the same integer sums and float steps.
        for (size_t j = 0; j < o_ref.size(); ++j) {
          ASSERT_EQ(o_got[j], o_ref[j]) << table.name << " " << g.label << " int8-weight axpy rows=" << n_rows
                                        << " nq=" << nq << " head=" << head << " at " << j;
        }
      }
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
  for (KvType type : kRowTypes) {
    for (const Geometry& g : kGeometries) CheckTable(*table, type, g);
  }
}

// q4k keys: one (table, chunk size, geometry) sweep over token counts, query counts and heads.
// Keys are built like a model's: per-channel offsets and scales that differ widely.
void CheckChunks(const AttentionKernels& table, int64_t C, const Geometry& g) {
  const AttentionKernels& ref = ScalarAttentionKernels();
  const KvFormat f = Format(KvType::kQ4K, g.sub, C);
  const int64_t n = g.hd * g.n_heads;
  std::mt19937 rng(4321u + static_cast<unsigned>(C) * 3u + static_cast<unsigned>(g.hd));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t token_counts[] = {1, 2, 15, 16, 17, 31, 33, 47, 64, 100, 256, 300};
  const int64_t query_counts[] = {1, 2, 5, 8, 13, 24, 40};
  double worst = 0.0;
  for (int64_t n_tokens : token_counts) {
    const int64_t n_chunks = (n_tokens + C - 1) / C;
    // Chunks a little further apart than their size, as in a block (the K plane of one layer
    // is followed by others): the kernels must use the stride.
    const int64_t stride = f.ChunkBytes(n) + 64;
    std::vector<uint8_t> chunks(static_cast<size_t>(stride * n_chunks), 0xAB);
    std::vector<float> x(C * n);
    for (int64_t c = 0; c < n_chunks; ++c) {
      for (int64_t t = 0; t < C; ++t) {
        for (int64_t i = 0; i < n; ++i) {
          const float offset = static_cast<float>((i * 13) % 17) - 8.0f, spread = i % 5 == 0 ? 3.0f : 0.3f;
          x[t * n + i] = offset + spread * normal(rng);
        }
      }
      KvQuantizeKChunk(f, x.data(), n, chunks.data() + c * stride, n);
    }
    for (int64_t nq : query_counts) {
      const int64_t head = (n_tokens + nq) % g.n_heads;
      const KvChunks kv{chunks.data(), stride, n_tokens, head, g.hd};
      const std::vector<float> q = RandomVector(nq * g.hd, rng, false);
      const int64_t s_stride = n_tokens + 3;
      std::vector<float> s_ref(nq * s_stride, -7.0f), s_got(nq * s_stride, -7.0f);
      ref.dot_chunks(f, kv, q.data(), nq, s_ref.data(), s_stride);
      table.dot_chunks(f, kv, q.data(), nq, s_got.data(), s_stride);
      for (int64_t i = 0; i < nq; ++i) {
        for (int64_t p = n_tokens; p < s_stride; ++p) ASSERT_EQ(s_got[i * s_stride + p], -7.0f) << "wrote past n_tokens";
      }
      const double e = Nmse(s_got, s_ref);
      worst = std::max(worst, e);
      EXPECT_LE(e, kMaxNmse) << table.name << " q4k chunks C=" << C << " " << g.label << " tokens=" << n_tokens
                             << " nq=" << nq << " head=" << head;
      // The integer path is the same arithmetic in every table.
      if (KeyChunksUseInt8(g.hd)) {
        ASSERT_EQ(s_got, s_ref) << table.name << " q4k int8 chunks C=" << C << " " << g.label << " tokens=" << n_tokens
                                << " nq=" << nq;
      }
    }
  }
  std::printf("[attention] %-6s q4k-K C=%-3lld %-16s worst NMSE dot %.3g\n", table.name, static_cast<long long>(C),
              g.label, worst);
}

TEST_P(AttentionConformanceTest, KeyChunksMatchScalar) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  // 64: the format's; 16 and 48: one and three SIMD widths (a chunk ending in a single panel);
  // 128: two panels of two.
  for (int64_t C : {64, 16, 48, 128}) {
    for (const Geometry& g : kGeometries) CheckChunks(*table, C, g);
  }
}

// The scalar reference itself, q4k keys on the integer path, against an independent
// computation: the per-(query, chunk) codes checked against the rule of attention.h (a
// power-of-two scale with max|a| in [64, 128) steps, each code within half a step), then every
// score formed in double from the record's codes: q . (m + 8d) + sum sa * code * (k - 8). And
// the error budget: the int8 rounding must add little to what the 4-bit keys already lose
// (keys built like a model's, with per-channel offsets and a few wide channels).
TEST(AttentionConformance, ScalarKeyChunksAreQuantizedDots) {
  const KvFormat f = Format(KvType::kQ4K, 16, 64);
  const int64_t hd = 64, n = 2 * hd, n_tokens = 100, head = 1, C = 64, record = 4 + C / 2, nq = 4;
  ASSERT_TRUE(KeyChunksUseInt8(hd));
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> chunks(static_cast<size_t>(2 * f.ChunkBytes(n)));
  std::vector<float> x(2 * C * n);
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t t = 0; t < C; ++t) {
      for (int64_t i = 0; i < n; ++i) {
        const float offset = static_cast<float>((i * 13) % 17) - 8.0f, spread = i % 5 == 0 ? 3.0f : 0.3f;
        x[(c * C + t) * n + i] = offset + spread * normal(rng);
      }
    }
    KvQuantizeKChunk(f, x.data() + c * C * n, n, chunks.data() + c * f.ChunkBytes(n), n);
  }
  const std::vector<float> q = RandomVector(nq * hd, rng, false);
  std::vector<float> got(nq * n_tokens), want(nq * n_tokens), fdot(nq * n_tokens), exact(nq * n_tokens);
  ScalarAttentionKernels().dot_chunks(f, KvChunks{chunks.data(), f.ChunkBytes(n), n_tokens, head, hd}, q.data(), nq,
                                      got.data(), n_tokens);
  std::vector<float> key(hd), d(hd), m(hd);
  for (int64_t c = 0; c < 2; ++c) {
    const uint8_t* slice = chunks.data() + c * f.ChunkBytes(n) + head * hd * record;
    for (int64_t ch = 0; ch < hd; ++ch) {
      uint16_t dh, mh;
      std::memcpy(&dh, slice + ch * record, 2);
      std::memcpy(&mh, slice + ch * record + 2, 2);
      d[ch] = Fp16ToFp32(dh);
      m[ch] = Fp16ToFp32(mh);
    }
    for (int64_t i = 0; i < nq; ++i) {
      const float* qi = q.data() + i * hd;
      ChunkQueryQ8 cq;
      QuantizeChunkQuery(qi, d.data(), m.data(), hd, &cq);
      for (int64_t b = 0; b < hd / kQueryBlock; ++b) {
        double amax = 0.0;
        int32_t sum = 0;
        for (int64_t j = 0; j < kQueryBlock; ++j) {
          amax = std::max(amax, std::fabs(static_cast<double>(qi[b * kQueryBlock + j] * d[b * kQueryBlock + j])));
          sum += cq.codes[b * kQueryBlock + j];
        }
        const double sa = cq.scales[b];
        ASSERT_GT(amax, 0.0);
        EXPECT_GE(amax / sa, 64.0);
        EXPECT_LT(amax / sa, 128.0);
        EXPECT_EQ(std::exp2(std::round(std::log2(sa))), sa) << "a power of two";
        EXPECT_EQ(cq.code_sums[b], sum);
        for (int64_t j = 0; j < kQueryBlock; ++j) {
          const int64_t ch = b * kQueryBlock + j;
          const int code = cq.codes[ch];
          EXPECT_LE(std::fabs(qi[ch] * d[ch] - sa * code), (std::abs(code) == 127 ? 1.0 : 0.5) * sa) << "channel " << ch;
        }
      }
      for (int64_t t = 0; t < C && c * C + t < n_tokens; ++t) {
        const int64_t p = c * C + t;
        double s = 0.0, fs = 0.0, es = 0.0;
        KvDequantizeKChunk(f, chunks.data() + c * f.ChunkBytes(n), t, head * hd, hd, key.data());
        for (int64_t ch = 0; ch < hd; ++ch) {
          const uint8_t byte = slice[ch * record + 4 + t / 2];
          const int k = t % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
          const double m8 = static_cast<double>(m[ch]) + 8.0 * d[ch];
          s += qi[ch] * m8 + static_cast<double>(cq.scales[ch / kQueryBlock]) * cq.codes[ch] * (k - 8);
          fs += static_cast<double>(qi[ch]) * key[ch];
          es += static_cast<double>(qi[ch]) * x[p * n + head * hd + ch];
        }
        want[i * n_tokens + p] = static_cast<float>(s);
        fdot[i * n_tokens + p] = static_cast<float>(fs);
        exact[i * n_tokens + p] = static_cast<float>(es);
      }
    }
  }
  const double e_double = Nmse(got, want), e_int8 = Nmse(got, fdot), e_keys = Nmse(fdot, exact);
  std::printf("[attention] q4k int8 chunk dot: NMSE vs double %.3g; int8 weights %.3g, 4-bit keys %.3g\n", e_double,
              e_int8, e_keys);
  EXPECT_LE(e_double, 1e-12);
  EXPECT_LE(e_int8, 0.1 * e_keys);
}

// The int8-query q4 dot against an independent computation: the query codes checked against the
// rule of attention.h (a power-of-two scale putting max|x| in [64, 128) code steps, each code
// within half a step), then the score formed in double from the keys as KvDequantize decodes
// them: the unquantized query times each group's centre m + 8d, the quantized one times the
// rest. The scalar
// kernel may differ only by float rounding; and it must stay close to the float dot of the
// unquantized queries (the int8 rounding is the only approximation).
TEST(AttentionConformance, Int8QueryDotsAreQuantizedDots) {
  const AttentionKernels& ref = ScalarAttentionKernels();
  for (const Geometry& g : kGeometries) {
    const KvFormat f = Format(KvType::kQ4, g);
    if (!KeysUseInt8Queries(f, g.hd)) continue;
    std::mt19937 rng(7 + static_cast<unsigned>(g.hd));
    const int64_t n_rows = 40, nq = 5, n = g.hd * g.n_heads, nb = g.hd / kQueryBlock;
    // Keys like MakeRows's (a per-row offset, outliers), kept unquantized too.
    std::vector<float> keys(n_rows * n);
    std::vector<uint8_t> rows(static_cast<size_t>(f.RowBytes(n) * n_rows));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t p = 0; p < n_rows; ++p) {
      const float offset = 0.5f * normal(rng);
      for (int64_t i = 0; i < n; ++i) keys[p * n + i] = offset + normal(rng) * (i % 17 == 0 ? 4.0f : 1.0f);
      KvQuantizeRow(f, keys.data() + p * n, rows.data() + p * f.RowBytes(n), n);
    }
    std::vector<float> q = RandomVector(nq * g.hd, rng, false);
    for (int64_t j = 0; j < kQueryBlock; ++j) q[j] = 0.0f;  // an all-zero block
    const Int8QueryBlocks q8(q, nq, g.hd);
    for (int64_t i = 0; i < nq; ++i) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* x = q.data() + i * g.hd + b * kQueryBlock;
        double amax = 0.0, sum = 0.0;
        for (int64_t j = 0; j < kQueryBlock; ++j) amax = std::max(amax, std::fabs(static_cast<double>(x[j])));
        for (int64_t j = 0; j < kQueryBlock; ++j) sum = static_cast<float>(sum + x[j]);
        const double sq = q8.scales[i * nb + b];
        EXPECT_EQ(q8.sums[i * nb + b], static_cast<float>(sum));
        if (amax == 0.0) {
          EXPECT_EQ(sq, 0.0);
          continue;
        }
        EXPECT_GE(amax / sq, 64.0);
        EXPECT_LT(amax / sq, 128.0);
        EXPECT_EQ(std::exp2(std::round(std::log2(sq))), sq) << "a power of two";
        for (int64_t j = 0; j < kQueryBlock; ++j) {
          const int code = q8.codes[i * g.hd + b * kQueryBlock + Int8QueryCodeIndex(j)];
          EXPECT_LE(std::fabs(x[j] - sq * code), (std::fabs(code) == 127 ? 1.0 : 0.5) * sq) << "value " << j;
        }
      }
    }
    const int64_t head = g.n_heads - 1;
    const KvRows kv{rows.data(), f.RowBytes(n), n_rows, head, g.hd};
    std::vector<float> got(nq * n_rows), fdot(nq * n_rows), want(nq * n_rows), exact(nq * n_rows);
    ref.dot_rows_q8(f, kv, q8.view(), nq, got.data(), n_rows);
    ref.dot_rows(f, kv, q.data(), nq, fdot.data(), n_rows);
    std::vector<float> key(g.hd);
    for (int64_t p = 0; p < n_rows; ++p) {
      KvDequantize(f, rows.data() + p * f.RowBytes(n), head * g.hd, g.hd, key.data());
      for (int64_t i = 0; i < nq; ++i) {
        double s = 0.0;
        for (int64_t b = 0; b < nb; ++b) {
          // The key group's centre m + 8d (header: f16 d, f16 m): the unquantized query meets
          // it, the quantized one the rest of the key.
          const int64_t v0 = head * g.hd + b * kQueryBlock;
          const uint8_t* header = rows.data() + p * f.RowBytes(n) + v0 / f.group * (f.group / 2 + 4);
          uint16_t dh, mh;
          std::memcpy(&dh, header, 2);
          std::memcpy(&mh, header + 2, 2);
          const double m8 = Fp16ToFp32(mh) + 8.0 * Fp16ToFp32(dh);
          // Decoding the codes back: Int8QueryCodeIndex must place value j's code where the
          // kernels expect it, or these sums disagree.
          for (int64_t j = 0; j < kQueryBlock; ++j) {
            const double qx = q8.scales[i * nb + b] * q8.codes[i * g.hd + b * kQueryBlock + Int8QueryCodeIndex(j)];
            s += q[i * g.hd + b * kQueryBlock + j] * m8 + qx * (key[b * kQueryBlock + j] - m8);
          }
        }
        want[i * n_rows + p] = static_cast<float>(s);
        double e = 0.0;
        for (int64_t j = 0; j < g.hd; ++j) e += static_cast<double>(q[i * g.hd + j]) * keys[p * n + head * g.hd + j];
        exact[i * n_rows + p] = static_cast<float>(e);
      }
    }
    ExpectIntegerErrorBudget("int8-query q4 dot", g.label, got, want, fdot, exact);
  }
}

// q4 values with int8 weights, by the scalar table: against the rule recomputed in double (the
// codes from log2 and nearbyint, not the kernels' bit tricks), and against float weights: the
// int8 weights must add far less error than the 4-bit values already have.
TEST(AttentionConformance, Int8WeightSumsAreQuantizedSums) {
  const AttentionKernels& ref = ScalarAttentionKernels();
  for (const Geometry& g : kGeometries) {
    const KvFormat f = Format(KvType::kQ4, g);
    if (!ValuesUseInt8Weights(f, g.hd)) continue;
    std::mt19937 rng(11 + static_cast<unsigned>(g.hd));
    const int64_t n_rows = 300, nq = 5, n = g.hd * g.n_heads, head = g.n_heads - 1, row_bytes = f.RowBytes(n);
    std::vector<float> values(n_rows * n);
    std::vector<uint8_t> rows(static_cast<size_t>(row_bytes * n_rows));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t p = 0; p < n_rows; ++p) {
      const float offset = 2.0f * normal(rng);  // a large minimum, as real V groups have
      for (int64_t i = 0; i < n; ++i) values[p * n + i] = offset + normal(rng) * (i % 17 == 0 ? 4.0f : 1.0f);
      KvQuantizeRow(f, values.data() + p * n, rows.data() + p * row_bytes, n);
    }
    // Softmax-like weights: a few large, most small, and an all-zero tile (positions 32..63).
    std::vector<float> w(nq * n_rows);
    for (int64_t i = 0; i < nq; ++i) {
      double total = 0.0;
      for (int64_t p = 0; p < n_rows; ++p) total += w[i * n_rows + p] = std::exp(3.0f * normal(rng));
      for (int64_t p = 0; p < n_rows; ++p) {
        w[i * n_rows + p] = p / 32 == 1 ? 0.0f : static_cast<float>(w[i * n_rows + p] / total);
      }
    }
    std::vector<float> got(nq * g.hd, 0.0f), fsum(nq * g.hd), exact(nq * g.hd);
    std::vector<double> want_sum(nq * g.hd, 0.0);
    ref.axpy_rows(f, KvRows{rows.data(), row_bytes, n_rows, head, g.hd}, w.data(), nq, n_rows, got.data());
    std::vector<float> v(g.hd);
    for (int64_t i = 0; i < nq; ++i) {
      for (int64_t c = 0; c < g.hd; ++c) {
        double fs = 0.0, ex = 0.0;
        for (int64_t p = 0; p < n_rows; ++p) {
          KvDequantize(f, rows.data() + p * row_bytes, head * g.hd + c, 1, v.data());
          fs += static_cast<double>(w[i * n_rows + p]) * v[0];
          ex += static_cast<double>(w[i * n_rows + p]) * values[p * n + head * g.hd + c];
        }
        fsum[i * g.hd + c] = static_cast<float>(fs);
        exact[i * g.hd + c] = static_cast<float>(ex);
      }
      for (int64_t c0 = 0; c0 < g.hd; c0 += kQueryBlock) {
        // The block's q4 group header (f16 d, f16 m) per row.
        const int64_t v0 = head * g.hd + c0, header = v0 / f.group * (f.group / 2 + 4);
        auto half = [&](int64_t p, int64_t off) {
          uint16_t h;
          std::memcpy(&h, rows.data() + p * row_bytes + header + off, 2);
          return static_cast<double>(Fp16ToFp32(h));
        };
        for (int64_t t0 = 0; t0 < n_rows; t0 += kQueryBlock) {
          const int64_t t1 = std::min(n_rows, t0 + kQueryBlock);
          double amax = 0.0;
          std::vector<float> a;
          for (int64_t p = t0; p < t1; ++p) {
            a.push_back(w[i * n_rows + p] * static_cast<float>(half(p, 0)));
            amax = std::max(amax, std::fabs(static_cast<double>(a.back())));
          }
          const double sa = amax > 0.0 ? std::exp2(std::floor(std::log2(amax)) + 1.0 - 7.0) : 0.0;
          for (int64_t p = t0; p < t1; ++p) {
            const double k = sa > 0.0 ? std::clamp(std::nearbyint(a[p - t0] / sa), -127.0, 127.0) : 0.0;
            if (sa > 0.0) {
              EXPECT_LE(std::fabs(a[p - t0] - k * sa), (std::fabs(k) == 127.0 ? 1.0 : 0.5) * sa);
            }
            const double m8 = half(p, 2) + 8.0 * half(p, 0);
            for (int64_t j = 0; j < kQueryBlock; ++j) {
              // v = m8 + d (c - 8): the weight meets m8 unquantized, d (c - 8) as k * sa ~ w d.
              const int64_t at = v0 % f.group + j;
              const int c = (rows[p * row_bytes + header + 4 + at / 2] >> (4 * (at % 2))) & 15;
              want_sum[i * g.hd + c0 + j] += w[i * n_rows + p] * m8 + k * sa * (c - 8);
            }
          }
        }
      }
    }
    ExpectIntegerErrorBudget("int8-weight q4 axpy", g.label, got, std::vector<float>(want_sum.begin(), want_sum.end()),
                             fsum, exact);
  }
}

// The tables' query quantizers against the scalar one, bit for bit: ordinary blocks, all-zero
// blocks, and blocks so small that their codes need ldexp.
TEST_P(AttentionConformanceTest, QuantizeQueriesMatchesScalar) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  std::mt19937 rng(17);
  for (int64_t hd : {32, 64, 128}) {
    const int64_t nq = 9, nb = hd / kQueryBlock;
    std::vector<float> q = RandomVector(nq * hd, rng, false);
    for (int64_t j = 0; j < nq * hd; ++j) {
      const int64_t block = j / kQueryBlock;
      if (block % 5 == 1) q[j] = 0.0f;
      if (block % 5 == 2) q[j] *= 1e-38f;
      if (block % 5 == 3) q[j] *= 1e-44f;
      if (block % 5 == 4) q[j] *= 1e30f;
    }
    std::vector<int8_t> c_ref(nq * hd), c_got(nq * hd, 99);
    std::vector<float> s_ref(nq * nb), s_got(nq * nb), m_ref(nq * nb), m_got(nq * nb);
    std::vector<int32_t> k_ref(nq * nb), k_got(nq * nb);
    ScalarAttentionKernels().quantize_queries(q.data(), nq, hd, c_ref.data(), s_ref.data(), m_ref.data(), k_ref.data());
    table->quantize_queries(q.data(), nq, hd, c_got.data(), s_got.data(), m_got.data(), k_got.data());
    EXPECT_EQ(c_got, c_ref) << "hd " << hd;
    EXPECT_EQ(s_got, s_ref) << "hd " << hd;
    EXPECT_EQ(m_got, m_ref) << "hd " << hd;
    EXPECT_EQ(k_got, k_ref) << "hd " << hd;
  }
}

// The table's weighted sum of every head of `rows` (weights w: nq x n_rows) equals the scalar
// table's bit for bit.
void ExpectAxpyBitsOfScalar(const AttentionKernels& table, const KvFormat& f, const Geometry& g,
                            const std::vector<uint8_t>& rows, const std::vector<float>& w, int64_t nq, int64_t n_rows) {
  for (int64_t head = 0; head < g.n_heads; ++head) {
    const KvRows kv{rows.data(), f.RowBytes(g.hd * g.n_heads), n_rows, head, g.hd};
    std::vector<float> o_ref(nq * g.hd, 0.0f), o_got(nq * g.hd, 0.0f);
    ScalarAttentionKernels().axpy_rows(f, kv, w.data(), nq, n_rows, o_ref.data());
    table.axpy_rows(f, kv, w.data(), nq, n_rows, o_got.data());
    EXPECT_EQ(o_got, o_ref) << table.name << " head " << head;
  }
}

// Weights so small that their quantization scale is not a normal float: the SIMD tables must
// take the scalar rule's ldexp codes there and agree bit for bit.
TEST_P(AttentionConformanceTest, TinyInt8WeightsMatchScalar) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  const Geometry g = kGeometries[2];  // tinyllama's rows
  const KvFormat f = Format(KvType::kQ4, g);
  ASSERT_TRUE(ValuesUseInt8Weights(f, g.hd));
  std::mt19937 rng(3);
  const int64_t n_rows = 200, nq = 3;
  const std::vector<uint8_t> rows = MakeRows(f, g, n_rows, rng);
  std::vector<float> w = RandomVector(nq * n_rows, rng, false);
  for (int64_t j = 0; j < nq * n_rows; ++j) {
    const int64_t tile = (j % n_rows) / kQueryBlock;
    w[j] = std::fabs(w[j]) * (tile % 3 == 0 ? 1e-39f : tile % 3 == 1 ? 1e-44f : 0.01f);
  }
  ExpectAxpyBitsOfScalar(*table, f, g, rows, w, nq, n_rows);
}

// The SIMD tables sum q4 values with unsigned weight codes, which holds while every a_p = w_p d_p
// is >= 0 (softmax weights, scales from our encoder); a span with a negative weight or a negative
// group scale (a foreign cache) takes the scalar code. Both cases, in some spans and not others,
// must still agree bit for bit with the scalar table.
TEST_P(AttentionConformanceTest, NegativeInt8WeightsMatchScalar) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  const Geometry g = kGeometries[2];  // tinyllama's rows
  const KvFormat f = Format(KvType::kQ4, g);
  ASSERT_TRUE(ValuesUseInt8Weights(f, g.hd));
  std::mt19937 rng(5);
  const int64_t n_rows = 300, nq = 5, row_bytes = f.RowBytes(g.hd * g.n_heads);
  std::vector<uint8_t> rows = MakeRows(f, g, n_rows, rng);
  // Row 140 (second span): every group's scale made negative (f16 sign bit).
  for (int64_t v0 = 0; v0 < g.hd * g.n_heads; v0 += f.group) rows[140 * row_bytes + v0 / f.group * (f.group / 2 + 4) + 1] |= 0x80;
  std::vector<float> w = RandomVector(nq * n_rows, rng, false);
  for (int64_t j = 0; j < nq * n_rows; ++j) {
    w[j] = std::fabs(w[j]) / static_cast<float>(n_rows);
    // Query 1 has one negative weight in the third span.
    if (j / n_rows == 1 && j % n_rows == 270) w[j] = -w[j];
  }
  ExpectAxpyBitsOfScalar(*table, f, g, rows, w, nq, n_rows);
}

// A weighted sum with one weight of 1 (the others 0) is one row's values, exactly: the float
// paths decode a row with the operations of KvDequantize (f16, q8, q4k: d = D sc, m = M mn,
// m + d q), so each table must reproduce its bits, whichever way it unpacks (q4k: a whole quad
// at a time on AVX2 and AVX-512). q4 values take the integer path, whose weights are quantized, so they are not
// part of this.
TEST_P(AttentionConformanceTest, OneHotWeightsDecodeRowsExactly) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  std::mt19937 rng(8);
  int64_t checked = 0;
  for (const Geometry& g : kGeometries) {
    for (KvType type : {KvType::kF16, KvType::kQ8, KvType::kQ4K}) {
      const KvFormat f = Format(type, g);
      const int64_t n = g.hd * g.n_heads, n_rows = 40, row_bytes = f.RowBytes(n);
      const std::vector<uint8_t> rows = MakeRows(f, g, n_rows, rng);
      for (int64_t head = 0; head < g.n_heads; ++head) {
        for (int64_t p : {int64_t{0}, int64_t{17}, n_rows - 1}) {
          std::vector<float> w(n_rows, 0.0f), out(g.hd, 0.0f), want(g.hd);
          w[p] = 1.0f;
          table->axpy_rows(f, KvRows{rows.data(), row_bytes, n_rows, head, g.hd}, w.data(), 1, n_rows, out.data());
          KvDequantize(f, rows.data() + p * row_bytes, head * g.hd, g.hd, want.data());
          for (int64_t j = 0; j < g.hd; ++j) {
            ASSERT_EQ(std::memcmp(&out[j], &want[j], sizeof(float)), 0)
                << TypeName(type) << " " << g.label << " head " << head << " row " << p << " value " << j << ": "
                << out[j] << " vs " << want[j];
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Every head of a multi-head row, with the other heads' values very different, so reading the
// wrong slice or group header cannot pass.
TEST_P(AttentionConformanceTest, EveryHeadOfARow) {
  const AttentionKernels* table = AttentionKernelsByName(GetParam());
  if (table == nullptr) GTEST_SKIP() << "attention table " << GetParam() << " not supported by this CPU";
  const AttentionKernels& ref = ScalarAttentionKernels();
  const int64_t hd = 64, n_heads = 4, n = hd * n_heads, n_rows = 70, nq = 8;
  std::mt19937 rng(99);
  for (KvType type : kRowTypes) {
    const KvFormat f = Format(type, type == KvType::kQ4K ? 16 : 64);
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
      if (KeysUseInt8Queries(f, hd)) {
        const Int8QueryBlocks q8(q, nq, hd);
        std::vector<float> i_ref(nq * n_rows), i_got(nq * n_rows);
        ref.dot_rows_q8(f, kv, q8.view(), nq, i_ref.data(), n_rows);
        table->dot_rows_q8(f, kv, q8.view(), nq, i_got.data(), n_rows);
        EXPECT_EQ(i_got, i_ref) << "int8-query dot, head " << head;
      }
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

INSTANTIATE_TEST_SUITE_P(AttentionConformance, AttentionConformanceTest, ::testing::Values("avx2", "avxvnni", "avx512bw", "avx512"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kvfs::cpu
