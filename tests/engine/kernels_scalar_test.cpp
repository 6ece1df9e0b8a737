// The scalar reference kernel table: activation quantizers (exact codes on hand-built input)
// and dot products (against double-precision dot products of the dequantized operands).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/cpu/kernels.h"
#include "engine/model/quants.h"

namespace kvfs::cpu {
namespace {

constexpr GgmlType kSupported[] = {
    GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
    GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
    GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

uint32_t Id(GgmlType t) { return static_cast<uint32_t>(t); }

int16_t GetI16(const uint8_t* p) {
  int16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(GetI16(p)); }
float GetF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

TEST(KernelScalarTable, EntriesAndActivationTypes) {
  const KernelTable& k = ScalarKernels();
  EXPECT_STREQ(k.name, "scalar");
  EXPECT_EQ(&k, &ScalarKernels());
  for (uint32_t id = 0; id < kNumGgmlTypes; ++id) {
    bool supported = false;
    for (GgmlType t : kSupported) supported |= Id(t) == id;
    EXPECT_EQ(k.quantize_row[id] != nullptr, supported) << id;
    EXPECT_EQ(k.vec_dot[id] != nullptr, supported) << id;
  }
  EXPECT_EQ(VecDotType(GgmlType::kF32), GgmlType::kF32);
  EXPECT_EQ(VecDotType(GgmlType::kF16), GgmlType::kF16);
  EXPECT_EQ(VecDotType(GgmlType::kBF16), GgmlType::kBF16);
  EXPECT_EQ(VecDotType(GgmlType::kQ4_0), GgmlType::kQ8_0);
  EXPECT_EQ(VecDotType(GgmlType::kQ5_0), GgmlType::kQ8_0);
  EXPECT_EQ(VecDotType(GgmlType::kQ8_0), GgmlType::kQ8_0);
  EXPECT_EQ(VecDotType(GgmlType::kQ4_1), GgmlType::kQ8_1);
  EXPECT_EQ(VecDotType(GgmlType::kQ5_1), GgmlType::kQ8_1);
  EXPECT_EQ(VecDotType(GgmlType::kQ4_K), GgmlType::kQ8_K);
  EXPECT_EQ(VecDotType(GgmlType::kQ5_K), GgmlType::kQ8_K);
  EXPECT_EQ(VecDotType(GgmlType::kQ6_K), GgmlType::kQ8_K);
  EXPECT_EQ(QuantizedActivationRowBytes(GgmlType::kF32, 8), 32);
  EXPECT_EQ(QuantizedActivationRowBytes(GgmlType::kBF16, 8), 16);
  EXPECT_EQ(QuantizedActivationRowBytes(GgmlType::kQ4_0, 64), 68);
  EXPECT_EQ(QuantizedActivationRowBytes(GgmlType::kQ5_1, 64), 72);
  EXPECT_EQ(QuantizedActivationRowBytes(GgmlType::kQ6_K, 512), 584);
}

// Q8_0: d = amax/127, q = x * (127/amax) rounded half to even, d stored as fp16.
// Q8_1: the same codes plus s = fp16(d * sum(q)).
TEST(KernelScalarQuantize, Q8_0AndQ8_1ExactCodes) {
  std::vector<float> x(64, 0.0f);  // second block stays all zero
  const float in[10] = {63.5f, -63.5f, 1.25f, -1.25f, 0.75f, 0.2f, -0.3f, 10.0f, 0.25f, -0.25f};
  // id = 127 / amax = 2 exactly; halves round to even (x86 reference quantizer).
  const int8_t want[10] = {127, -127, 2, -2, 2, 0, -1, 20, 0, 0};
  for (int i = 0; i < 10; ++i) x[i] = in[i];

  std::vector<uint8_t> q0(68 + 1);  // +1: write at an odd address
  ScalarKernels().quantize_row[Id(GgmlType::kQ8_0)](x.data(), q0.data() + 1, 64);
  const uint8_t* b = q0.data() + 1;
  EXPECT_EQ(GetU16(b), 0x3800);  // d = 63.5 / 127 = 0.5
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(static_cast<int8_t>(b[2 + i]), i < 10 ? want[i] : 0) << i;
  }
  EXPECT_EQ(GetU16(b + 34), 0x0000);  // all-zero block: d = 0, codes 0
  for (int i = 0; i < 32; ++i) EXPECT_EQ(b[36 + i], 0) << i;

  std::vector<uint8_t> q1(72 + 1);
  ScalarKernels().quantize_row[Id(GgmlType::kQ4_1)](x.data(), q1.data() + 1, 64);
  const uint8_t* c = q1.data() + 1;
  EXPECT_EQ(GetU16(c), 0x3800);
  EXPECT_EQ(GetU16(c + 2), 0x4940);  // s = 0.5 * 21 = 10.5
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(static_cast<int8_t>(c[4 + i]), i < 10 ? want[i] : 0) << i;
  }
  EXPECT_EQ(GetU16(c + 36), 0x0000);
  EXPECT_EQ(GetU16(c + 38), 0x0000);
}

// Q8_K: the element of largest magnitude (the first on ties) gives max; iscale = -127/max,
// q = nearest_int(iscale * x) (ties to even), d = 1/iscale as float, bsums per 16.
TEST(KernelScalarQuantize, Q8_KExactCodes) {
  std::vector<float> x(512, 0.0f);
  // Block 0: max = -63.5 (first of the two elements with |x| = 63.5) -> iscale = 2, d = 0.5.
  x[0] = -63.5f;
  x[1] = 63.5f;
  x[2] = 1.25f;   // 2.5 -> 2
  x[3] = 1.75f;   // 3.5 -> 4
  x[4] = -0.25f;  // -0.5 -> 0
  x[5] = -0.75f;  // -1.5 -> -2
  x[6] = 0.3f;    // 0.6 -> 1
  x[17] = 10.0f;  // 20
  x[255] = -3.0f; // -6
  // Block 1: max = +127 -> iscale = -1, d = -1.
  x[256] = 127.0f;
  x[257] = 2.5f;   // -2.5 -> -2
  x[258] = -3.5f;  // 3.5 -> 4
  x[300] = 0.5f;   // -0.5 -> 0

  std::vector<uint8_t> q(2 * 292 + 1);
  ScalarKernels().quantize_row[Id(GgmlType::kQ4_K)](x.data(), q.data() + 1, 512);
  const uint8_t* b0 = q.data() + 1;
  const uint8_t* b1 = b0 + 292;

  EXPECT_EQ(GetF32(b0), 0.5f);
  std::vector<int> want0(256, 0);
  want0[0] = -127;
  want0[1] = 127;
  want0[2] = 2;
  want0[3] = 4;
  want0[4] = 0;
  want0[5] = -2;
  want0[6] = 1;
  want0[17] = 20;
  want0[255] = -6;
  for (int i = 0; i < 256; ++i) EXPECT_EQ(static_cast<int8_t>(b0[4 + i]), want0[i]) << i;
  const int want_bsums0[16] = {5, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -6};
  for (int g = 0; g < 16; ++g) EXPECT_EQ(GetI16(b0 + 260 + 2 * g), want_bsums0[g]) << g;

  EXPECT_EQ(GetF32(b1), -1.0f);
  std::vector<int> want1(256, 0);
  want1[0] = -127;
  want1[1] = -2;
  want1[2] = 4;
  for (int i = 0; i < 256; ++i) EXPECT_EQ(static_cast<int8_t>(b1[4 + i]), want1[i]) << i;
  EXPECT_EQ(GetI16(b1 + 260), -125);
  for (int g = 1; g < 16; ++g) EXPECT_EQ(GetI16(b1 + 260 + 2 * g), 0) << g;

  // All-zero input: d = 0, codes and sums 0.
  std::vector<float> zeros(256, 0.0f);
  std::vector<uint8_t> z(292, 0xAB);
  ScalarKernels().quantize_row[Id(GgmlType::kQ6_K)](zeros.data(), z.data(), 256);
  for (int i = 0; i < 292; ++i) EXPECT_EQ(z[i], 0) << i;
}

TEST(KernelScalarQuantize, F16AndBf16RoundElements) {
  const float x[4] = {1.0f, 1.0f + 1.0f / 2048, 3.0f, -65520.0f};
  uint8_t h[8 + 1];
  ScalarKernels().quantize_row[Id(GgmlType::kF16)](x, h + 1, 4);
  EXPECT_EQ(GetU16(h + 1), 0x3C00);
  EXPECT_EQ(GetU16(h + 3), 0x3C00);  // tie to even
  EXPECT_EQ(GetU16(h + 5), 0x4200);
  EXPECT_EQ(GetU16(h + 7), 0xFC00);
  uint8_t bf[8 + 1];
  ScalarKernels().quantize_row[Id(GgmlType::kBF16)](x, bf + 1, 4);
  EXPECT_EQ(GetU16(bf + 1), 0x3F80);
  EXPECT_EQ(GetU16(bf + 3), 0x3F80);
  EXPECT_EQ(GetU16(bf + 5), 0x4040);
}

// ------------------------------------------------------------------------------------------
// Dot-product properties on random data.

// A random fp16 of moderate magnitude, |v| in [2^lo, 2^(hi+1)), built from its bit fields.
uint16_t RandomHalf(std::mt19937& rng, int lo, int hi, bool allow_negative) {
  std::uniform_int_distribution<int> exp(lo + 15, hi + 15);
  std::uniform_int_distribution<int> mant(0, 1023);
  const bool neg = allow_negative && (rng() & 1u);
  return static_cast<uint16_t>((neg ? 0x8000 : 0) | (exp(rng) << 10) | mant(rng));
}

void PutU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

// A random weight row: random code bytes, with every fp16 scale field overwritten by a sane
// value (no inf/NaN). Offsets are those of the ggml block layouts.
std::vector<uint8_t> RandomWeights(GgmlType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(static_cast<size_t>(RowBytes(t, n)));
  for (auto& b : row) b = static_cast<uint8_t>(rng());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (t) {
    case GgmlType::kF32:
      for (int64_t i = 0; i < n; ++i) {
        const float v = normal(rng);
        std::memcpy(row.data() + 4 * i, &v, 4);
      }
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) PutU16(row.data() + 2 * i, RandomHalf(rng, -6, 1, true));
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(normal(rng));
        PutU16(row.data() + 2 * i, static_cast<uint16_t>(u >> 16));
      }
      break;
    default: {
      const GgmlTypeTraits* info = GgmlTypeInfo(Id(t));
      for (int64_t b = 0; b < n / info->block_elems; ++b) {
        uint8_t* blk = row.data() + b * info->block_bytes;
        const bool k = t == GgmlType::kQ4_K || t == GgmlType::kQ5_K;
        const bool has_m = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
        if (t == GgmlType::kQ6_K) {
          PutU16(blk + 208, RandomHalf(rng, -10, -7, true));
        } else if (k) {
          PutU16(blk, RandomHalf(rng, -10, -7, true));
          PutU16(blk + 2, RandomHalf(rng, -10, -7, true));
        } else {
          PutU16(blk, RandomHalf(rng, -8, -4, true));
          if (has_m) PutU16(blk + 2, RandomHalf(rng, -6, -2, true));
        }
      }
    }
  }
  return row;
}

// Dequantizes an activation row of type a (F32, F16, BF16, Q8_0, Q8_1 or Q8_K) directly from
// the ggml block layout (byte offsets), independently of the code under test, as d * q. The
// Q8_1 s field is not used here; Q8_K bsums are checked against the codes.
std::vector<double> DequantActivations(GgmlType a, const uint8_t* p, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  switch (a) {
    case GgmlType::kF32:
      for (int64_t i = 0; i < n; ++i) out[i] = GetF32(p + 4 * i);
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Fp16ToFp32(GetU16(p + 2 * i));
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFp32(GetU16(p + 2 * i));
      break;
    case GgmlType::kQ8_0:
    case GgmlType::kQ8_1: {
      const int bytes = a == GgmlType::kQ8_0 ? 34 : 36;
      const int qoff = a == GgmlType::kQ8_0 ? 2 : 4;
      for (int64_t b = 0; b < n / 32; ++b) {
        const double d = Fp16ToFp32(GetU16(p + b * bytes));
        for (int j = 0; j < 32; ++j) out[32 * b + j] = d * static_cast<int8_t>(p[b * bytes + qoff + j]);
      }
      break;
    }
    case GgmlType::kQ8_K:
      for (int64_t b = 0; b < n / 256; ++b) {
        const uint8_t* blk = p + b * 292;
        const double d = GetF32(blk);
        int sums[16] = {};
        for (int j = 0; j < 256; ++j) {
          out[256 * b + j] = d * static_cast<int8_t>(blk[4 + j]);
          sums[j / 16] += static_cast<int8_t>(blk[4 + j]);
        }
        for (int g = 0; g < 16; ++g) EXPECT_EQ(GetI16(blk + 260 + 2 * g), sums[g]);
      }
      break;
    default:
      ADD_FAILURE() << "not an activation type";
  }
  return out;
}

// Largest error of one dequantized activation element relative to its float input, per
// element (a bound, from the quantizer definitions).
std::vector<double> ActivationErrorBound(GgmlType a, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> bound(x.size());
  if (a == GgmlType::kF32) return std::vector<double>(x.size(), 0.0);
  if (a == GgmlType::kF16 || a == GgmlType::kBF16) {
    const double rel = a == GgmlType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    for (int64_t i = 0; i < n; ++i) bound[i] = std::fabs(x[i]) * rel * 1.0001;
    return bound;
  }
  const int64_t block = a == GgmlType::kQ8_K ? 256 : 32;
  for (int64_t b = 0; b < n / block; ++b) {
    double amax = 0.0;
    for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(double{x[b * block + j]}));
    const double step = amax / 127.0;
    // Half a step of rounding; with an fp16 scale (Q8_0/Q8_1) the scale error (relative
    // 2^-11) can add up to 127 * step * 2^-11 more.
    const double e = a == GgmlType::kQ8_K ? 0.5001 * step : (0.5 + 127.0 / 2048.0) * step * 1.001;
    for (int64_t j = 0; j < block; ++j) bound[b * block + j] = e;
  }
  return bound;
}

void CheckVecDot(GgmlType t, int64_t n, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << GgmlTypeInfo(Id(t))->name << " n=" << n << " seed=" << seed);
  std::mt19937 rng(seed);
  const std::vector<uint8_t> w = RandomWeights(t, n, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = normal(rng) * ((rng() % 16 == 0) ? 8.0f : 1.0f);  // some outliers

  // Unaligned copies of both operands (odd addresses).
  std::vector<uint8_t> wbuf(w.size() + 1);
  std::memcpy(wbuf.data() + 1, w.data(), w.size());
  const GgmlType at = VecDotType(t);
  std::vector<uint8_t> abuf(static_cast<size_t>(QuantizedActivationRowBytes(t, n)) + 3);
  const KernelTable& k = ScalarKernels();
  k.quantize_row[Id(t)](x.data(), abuf.data() + 3, n);
  const float got = k.vec_dot[Id(t)](wbuf.data() + 1, abuf.data() + 3, n);

  std::vector<float> wd(static_cast<size_t>(n));
  DequantizeRow(t, w.data(), wd.data(), n);
  const std::vector<double> ad = DequantActivations(at, abuf.data() + 3, n);

  double exact_q = 0.0;  // dot of the two dequantized operands
  double exact_x = 0.0;  // dot with the float activations
  double mag = 0.0;      // sum |w * a|, the scale of float rounding errors
  for (int64_t i = 0; i < n; ++i) {
    exact_q += double{wd[i]} * ad[i];
    exact_x += double{wd[i]} * x[i];
    mag += std::fabs(double{wd[i]} * ad[i]);
  }
  // Float rounding: block products and the float accumulation (one eps per block and step).
  const GgmlTypeTraits* info = GgmlTypeInfo(Id(t));
  const double blocks = static_cast<double>(n / info->block_elems);
  double tol = mag * (blocks + 8.0) * std::ldexp(1.0, -23);
  if (t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1) {
    // The min term uses s = fp16(d * sum q) with the unrounded d instead of fp16(d) * sum q:
    // up to 2^-10 relative to |m * sum(a)| per block.
    for (int64_t b = 0; b < n / 32; ++b) {
      const double m = Fp16ToFp32(GetU16(w.data() + b * info->block_bytes + 2));
      double suma = 0.0;
      for (int j = 0; j < 32; ++j) suma += std::fabs(ad[32 * b + j]);
      tol += std::fabs(m) * suma * std::ldexp(1.0, -10) * 1.01;
    }
  }
  EXPECT_NEAR(got, exact_q, tol) << "against dequant(w) . dequant(quantize(x))";

  // Against the float activations: add the activation quantization error.
  const std::vector<double> ea = ActivationErrorBound(at, x);
  double qtol = tol;
  for (int64_t i = 0; i < n; ++i) qtol += std::fabs(double{wd[i]}) * ea[i];
  EXPECT_NEAR(got, exact_x, qtol) << "against dequant(w) . x";
  // The bounds are meaningful: well below the size of the result's terms.
  EXPECT_LT(tol, 1e-3 * mag + 1e-6);
  EXPECT_LT(qtol, 0.2 * mag + 1e-6);
}

TEST(KernelScalarVecDot, MatchesDequantizedDotForAllTypes) {
  for (GgmlType t : kSupported) {
    for (uint32_t seed = 1; seed <= 8; ++seed) {
      CheckVecDot(t, 512, seed * 7919 + Id(t));
    }
    CheckVecDot(t, 1024, 99 + Id(t));
    if (GgmlTypeInfo(Id(t))->block_elems == 32) CheckVecDot(t, 96, 5 + Id(t));
  }
}

TEST(KernelScalarVecDot, F32IsExactUpToRounding) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int64_t n : {1, 3, 17, 256, 1000}) {
    std::vector<float> w(static_cast<size_t>(n));
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : w) v = u(rng);
    for (auto& v : x) v = u(rng);
    std::vector<float> a(static_cast<size_t>(n));
    ScalarKernels().quantize_row[Id(GgmlType::kF32)](x.data(), a.data(), n);
    EXPECT_EQ(std::memcmp(a.data(), x.data(), a.size() * sizeof(float)), 0);
    const float got = ScalarKernels().vec_dot[Id(GgmlType::kF32)](w.data(), a.data(), n);
    double exact = 0.0;
    double mag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      exact += double{w[i]} * x[i];
      mag += std::fabs(double{w[i]} * x[i]);
    }
    EXPECT_NEAR(got, exact, mag * static_cast<double>(n + 1) * std::ldexp(1.0, -24)) << n;
  }
  // Small integers: exact.
  const float w[4] = {1, 2, 3, 4};
  const float x[4] = {5, -6, 7, 8};
  EXPECT_EQ(ScalarKernels().vec_dot[Id(GgmlType::kF32)](w, x, 4), 5 - 12 + 21 + 32);
}

// Hand-built Q8_0 x Q8_0 dot: sum of code products times both scales.
TEST(KernelScalarVecDot, Q8_0ByHand) {
  uint8_t w[34];
  uint8_t a[34];
  PutU16(w, 0x3800);  // 0.5
  PutU16(a, 0x4000);  // 2.0
  int expect = 0;
  for (int j = 0; j < 32; ++j) {
    const int qw = j - 16;
    const int qa = 3 * j - 50;
    w[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(qw));
    a[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(qa));
    expect += qw * qa;
  }
  EXPECT_EQ(ScalarKernels().vec_dot[Id(GgmlType::kQ8_0)](w, a, 32), static_cast<float>(expect));
}

}  // namespace
}  // namespace kvfs::cpu
