// Conformance of the Vulkan ops with the CPU scalar reference, per op and weight type:
// activation quantization (codes and scales), matrix products (matrix-vector and matrix-matrix
// paths, matrices split into parts, bias and residual epilogues), embedding lookup, RMSNorm,
// RoPE (SwiGLU and softmax: vulkan_exp_ops_test.cpp). Errors are NMSE = sum (gpu - cpu)^2 / sum cpu^2, printed per case.
// Attention and KV encoding: vulkan_attention_test.cpp. Without a Vulkan device the tests skip.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>

#include <gtest/gtest.h>

#include "engine/backend/backend.h"

#if defined(KVFS_VULKAN)

#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/ops.h"
#include "engine/backend/vulkan/device_weights.h"
#include "engine/backend/vulkan/weight_layout.h"
#include "engine/backend/vulkan/vk_transfer.h"
#include "engine/model/quant_block_access.h"
#include "engine/model/quants.h"
#include "tests/engine/vulkan_test_util.h"

namespace kvfs::testing {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                               GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                               GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

// Lengths whose blocks fill the shader's passes of 8 blocks and lengths that leave a part pass
// (1056: 33 blocks of 32; 2304: 9 of 256), with Q8_K blocks whose largest magnitude is tied.
TEST_F(VulkanOpsTest, QuantizeActivationsMatchCpuCodes) {
  for (const int64_t n : {1024, 1056, 2304}) {
    SCOPED_TRACE(n);
    const int64_t rows = 3;
    std::mt19937 rng(7);
    std::vector<float> x;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> row = RandomActivations(n, rng);
      if (n >= 768) {
        // Ties for Q8_K's signed maximum, which the CPU takes at its first index: across the
        // invocations of a block (values 43 and 161 of block 2), and inside one (260 and 263).
        for (int64_t j = 512; j < 768; ++j) row[j] *= 1e-4f;
        row[512 + 161] = 3.0f;
        row[512 + 43] = -3.0f;
        for (int64_t j = 256; j < 512; ++j) row[j] *= 1e-4f;
        row[263] = -2.5f;
        row[260] = 2.5f;
      }
      x.insert(x.end(), row.begin(), row.end());
    }
    const cpu::KernelTable& scalar = cpu::ScalarKernels();
    // One weight type per activation kind picks the CPU quantizer; each kind with the trees' last steps by subgroup shuffles (where the device has them) and
    // entirely in shared memory.
    for (const auto& [weight, trees] : {std::pair{GgmlType::kQ4_0, true}, {GgmlType::kQ4_1, true},
                                        {GgmlType::kQ4_K, true}, {GgmlType::kQ4_0, false},
                                        {GgmlType::kQ4_1, false}, {GgmlType::kQ4_K, false}}) {
      ops_->set_subgroup_trees(trees);
      const vk::ActKind kind = vk::ActKindFor(weight);
      if (kind == vk::ActKind::kQ8_K && n % 256 != 0) continue;
      const vk::Buffer in = Input(x);
      const vk::Buffer codes = Output(rows * n);
      const vk::Buffer aux = Output(rows * n / 32 * 16);
      ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                    return ops_->QuantizeActs(rec, kind, in, n, n, rows, {&codes, &aux});
                  }).ok());
      const std::vector<int8_t> got_codes = Read<int8_t>(codes, rows * n);
      const std::vector<float> got_aux = Read<float>(aux, rows * n / 32 * 4);
      int64_t code_diffs = 0, scale_diffs = 0;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<uint8_t> q(static_cast<size_t>(cpu::QuantizedActivationRowBytes(weight, n)));
        scalar.quantize_row[static_cast<int>(weight)](x.data() + r * n, q.data(), n);
        for (int64_t u = 0; u < n / 32; ++u) {
          const float* a = got_aux.data() + (r * n / 32 + u) * 4;
          const int8_t* c = got_codes.data() + r * n + u * 32;
          const int8_t* want = nullptr;
          float want_d = 0, want_s = 0;
          int want_lo = 0, want_hi = 0;
          if (kind == vk::ActKind::kQ8_K) {
            const BlockQ8_K b = LoadBlock<BlockQ8_K>(q.data(), u / 8);
            want = b.qs + 32 * (u % 8);
            want_d = b.d;
            want_lo = b.bsums[2 * (u % 8)];
            want_hi = b.bsums[2 * (u % 8) + 1];
            code_diffs += std::memcmp(c, want, 32) != 0;
          } else {
            // Only the row's own block type: the other's stride would read past the row.
            BlockQ8_1 b1{};
            BlockQ8_0 b0{};
            if (kind == vk::ActKind::kQ8_1) {
              b1 = LoadBlock<BlockQ8_1>(q.data(), u);
            } else {
              b0 = LoadBlock<BlockQ8_0>(q.data(), u);
            }
            want = kind == vk::ActKind::kQ8_1 ? b1.qs : b0.qs;
            want_d = Fp16ToFp32(kind == vk::ActKind::kQ8_1 ? b1.d : b0.d);
            want_s = kind == vk::ActKind::kQ8_1 ? Fp16ToFp32(b1.s) : 0.0f;
            for (int j = 0; j < 16; ++j) want_lo += want[j];
            for (int j = 16; j < 32; ++j) want_hi += want[j];
            code_diffs += std::memcmp(c, want, 32) != 0;
          }
          scale_diffs += a[0] != want_d || a[1] != want_s || a[2] != want_lo || a[3] != want_hi;
        }
      }
      std::printf("[vulkan quantize] %s activations%s: %lld of %lld units with different codes, %lld with different "
                  "scales/sums\n",
                  TypeName(cpu::VecDotType(weight)).c_str(), ops_->subgroup_trees() ? " (subgroup trees)" : "",
                  static_cast<long long>(code_diffs), static_cast<long long>(rows * n / 32),
                  static_cast<long long>(scale_diffs));
      EXPECT_EQ(code_diffs, 0);
      EXPECT_EQ(scale_diffs, 0);
    }
  }
}

// y = W x (+ bias) (+ y_old) for every weight type against the scalar vec_dot, for token
// counts on both sides of the matrix-vector / tiled switch and with the matrix split in parts;
// with the packed integer dot product (the *_idot shaders) and without it.
class VulkanMatMulTest : public VulkanOpsTest, public ::testing::WithParamInterface<bool> {
 protected:
  bool IntegerDot() const override { return GetParam(); }
  void SetUp() override {
    VulkanOpsTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (GetParam() && !ctx_->integer_dot()) {
      // CI's lavapipe has it: there, its absence would silently drop the packed shaders' test.
      if (InCi()) FAIL() << "CI=true but the Vulkan device has no packed integer dot product";
      GTEST_SKIP() << "the Vulkan device has no packed integer dot product (VK_KHR_shader_integer_dot_product)";
    }
    ASSERT_EQ(ctx_->integer_dot(), GetParam());
  }
  // A random n_out x n_in matrix of `type` (sane scales), uploaded whole.
  Result<vk::DeviceMatrix> RandomDeviceMatrix(GgmlType type, int64_t n_out, int64_t n_in, std::mt19937& rng) {
    KVFS_ASSIGN_OR_RETURN(auto up, vk::Uploader::Create(*ctx_, 1 << 20));
    const std::vector<uint8_t> w = RandomWeights(type, n_out, n_in, rng);
    const Matrix m{type, n_in, n_out, RowBytes(type, n_in), w.data()};
    int64_t total = 0;
    const vk::WeightUploadOptions options{.max_binding_bytes = ctx_->limits().max_binding_bytes};
    KVFS_ASSIGN_OR_RETURN(vk::DeviceMatrix dm, vk::UploadMatrix(*ctx_, *up, m, options, total));
    KVFS_RETURN_IF_ERROR(up->Flush());
    return dm;
  }
  // y = W x for T activation rows (x, and for quantized weights their codes and aux), read back.
  std::vector<float> Product(const vk::DeviceMatrix& dm, const vk::Buffer& x, const vk::Buffer& codes,
                             const vk::Buffer& aux, int64_t T) {
    const vk::Buffer y = Output(T * dm.n_out * 4);
    vk::Ops::MatMulArgs a;
    a.x = &x;
    a.x_stride = dm.n_in;
    a.acts = {&codes, &aux};
    a.n_tokens = T;
    a.y = &y;
    const Status st = Run([&](vk::Recorder& rec) { return ops_->MatMul(rec, dm, a); });
    EXPECT_TRUE(st.ok()) << st.message();
    return Read<float>(y, T * dm.n_out);
  }
  enum class Types { kAll, kQuantized, kWithSplitRows };
  // n_out x n_in matrices of every type (of `types`), uploaded in parts of part_rows rows, times
  // each token count's activations.
  void CheckEveryType(int64_t n_in, int64_t n_out, int64_t part_rows, std::initializer_list<int64_t> token_counts,
                      Types types = Types::kAll);
};

TEST_P(VulkanMatMulTest, MatchesScalarForEveryType) {
  // Parts of 20 rows: 4 parts, the last one short.
  CheckEveryType(512, 67, 20, {1, 2, 3, 5, 9, 40, 70});
}

// Matrices large enough that matvec_quant gives each slot of invocations 2 or 4 rows, with a
// last workgroup that holds fewer rows than it has room for, and 3 tokens in a group of 4.
TEST_P(VulkanMatMulTest, LargeMatricesMatchScalarForEveryQuantizedType) {
  CheckEveryType(2048, 12247, 4099, {1, 3}, Types::kQuantized);
}

// Rows of 25 units: split rows pad their 50 bytes of scales to 64 (weight_layout.h); rows of
// 3 Q6_K super-blocks pad their 6 bytes of d to 16.
TEST_P(VulkanMatMulTest, SplitRowsWithPaddedScalesMatchScalar) {
  CheckEveryType(800, 300, 120, {1, 2, 3, 5, 70}, Types::kWithSplitRows);
  CheckEveryType(768, 300, 120, {1, 2, 3, 5, 70}, Types::kWithSplitRows);
}

// Other matrix-vector shapes than the default (kvfs bench --matvec-*, for sweeps on a GPU), on
// rows of 1024 values (32 quantized units, 128 float groups of 8) in one part of 300 rows:
// workgroups of 256 whose slots take 32 lanes and 4 rows (8 rows would need all of lavapipe's
// 32 KiB of shared memory for the partial sums, and the shader keeps 24 bytes more), and workgroups of 128 with float rows in one 128-lane slot and quantized ones in four slots
// of 2 rows. Shapes the shaders cannot take are refused.
TEST_P(VulkanMatMulTest, OtherMatvecShapesMatchScalar) {
  const vk::MatvecShape wide{.group = 256, .max_lanes = 32, .min_groups = 4, .max_rows = 4};
  const vk::MatvecShape one_slot{.group = 128, .max_lanes = 128, .min_groups = 1, .max_rows = 2};
  for (const vk::MatvecShape& shape : {wide, one_slot}) {
    ASSERT_TRUE(ops_->set_matvec_shape(shape).ok());
    CheckEveryType(1024, 300, 300, {1, 3, 6});
  }
  for (const vk::MatvecShape bad : {vk::MatvecShape{.group = 96}, vk::MatvecShape{.group = 64, .max_lanes = 128},
                                    vk::MatvecShape{.group = 64, .max_lanes = 2},
                                    vk::MatvecShape{.group = 1024, .max_lanes = 64, .max_rows = 64}}) {
    EXPECT_EQ(ops_->set_matvec_shape(bad).code(), StatusCode::kInvalidArgument) << bad.group << " " << bad.max_lanes;
  }
}

// The matrix-vector shaders' tree by subgroup shuffles (the *_sg variants, subgroup_tree.glsl)
// against the same tree in shared memory: the products must be equal bit for bit, for slots
// wider than a subgroup (steps of both kinds), as wide as one (shuffles only) and narrower
// (several slots in a subgroup), for quantized and float types (the tree is the same code for
// all) and 1 and 6 tokens (one and four a workgroup).
TEST_P(VulkanMatMulTest, SubgroupSumsEqualSharedMemorySums) {
  if (!ctx_->subgroup_shuffle()) {
    if (InCi()) FAIL() << "CI=true but the Vulkan device has no subgroup shuffles in compute shaders";
    GTEST_SKIP() << "the Vulkan device has no subgroup shuffles in compute shaders";
  }
  const uint32_t subgroup = ctx_->info().subgroup_size;
  // ctest's vulkan_ops_subgroup16, vulkan_subgroup32 and vulkan_subgroup64 ask lavapipe for 16, 32
  // and 64 lanes: check that it got them.
  if (const char* expect = std::getenv("KVFS_EXPECT_SUBGROUP"); expect != nullptr && ctx_->info().type == "cpu") {
    ASSERT_EQ(subgroup, static_cast<uint32_t>(std::atoi(expect)));
  }
  std::mt19937 rng(5);
  const int64_t n_in = 2048, n_out = 300;  // 64 quantized units, 256 float groups a row
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kF16}) {
    auto dm = RandomDeviceMatrix(type, n_out, n_in, rng);
    ASSERT_TRUE(dm.ok()) << dm.status().message();
    const vk::ActKind kind = vk::ActKindFor(type);
    for (const int64_t T : {1, 6}) {
      std::vector<float> x;
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> row = RandomActivations(n_in, rng);
        x.insert(x.end(), row.begin(), row.end());
      }
      const vk::Buffer xb = Input(x), codes = Output(T * n_in), aux = Output(T * n_in / 32 * 16);
      // The activations once, with shared-memory trees: only the products' sums differ below.
      if (kind != vk::ActKind::kFloat) {
        ops_->set_subgroup_trees(false);
        ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                      return ops_->QuantizeActs(rec, kind, xb, n_in, n_in, T, {&codes, &aux});
                    }).ok());
      }
      // Slots of 64 lanes (the group), of a subgroup and of half of one (at least 4 lanes).
      for (const uint32_t lanes : {64u, std::min(64u, subgroup), std::clamp(subgroup / 2, 4u, 64u)}) {
        std::vector<float> got[2];
        for (const bool trees : {true, false}) {
          ASSERT_TRUE(ops_->set_matvec_shape({.group = 64, .max_lanes = lanes, .min_groups = 4}).ok());
          ops_->set_subgroup_trees(trees);
          ASSERT_EQ(ops_->subgroup_trees(), trees);
          got[trees ? 0 : 1] = Product(*dm, xb, codes, aux, T);
        }
        EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4), 0)
            << TypeName(type) << " T=" << T << " lanes " << lanes << " (subgroup " << subgroup << ")";
      }
    }
  }
}

// Rounds of several units a lane (MatvecShape::ahead, kvfs bench --matvec-ahead): every lane
// adds its units in the same order whatever the round's size, so the products are those of one
// unit a round bit for bit; rows of 67 units (lanes of 16: rounds that end past the row) and
// 1, 3 and 6 tokens, for the legacy, K and split-row layouts.
TEST_P(VulkanMatMulTest, UnitsAheadGiveTheSameSums) {
  std::mt19937 rng(9);
  const int64_t n_in = 67 * 32, n_out = 200;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ5_1}) {
    auto dm = RandomDeviceMatrix(type, n_out, n_in, rng);
    ASSERT_TRUE(dm.ok()) << dm.status().message();
    for (const int64_t T : {1, 3, 6}) {
      std::vector<float> x;
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> row = RandomActivations(n_in, rng);
        x.insert(x.end(), row.begin(), row.end());
      }
      const vk::Buffer xb = Input(x), codes = Output(T * n_in), aux = Output(T * n_in / 32 * 16);
      ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                    return ops_->QuantizeActs(rec, vk::ActKindFor(type), xb, n_in, n_in, T, {&codes, &aux});
                  }).ok());
      std::vector<float> one;
      for (const uint32_t ahead : {1u, 2u, 4u, 8u}) {
        ASSERT_TRUE(ops_->set_matvec_shape({.group = 64, .max_lanes = 16, .min_groups = 4, .ahead = ahead}).ok());
        const std::vector<float> got = Product(*dm, xb, codes, aux, T);
        if (ahead == 1) {
          one = got;
        } else {
          EXPECT_EQ(std::memcmp(got.data(), one.data(), got.size() * 4), 0)
              << TypeName(type) << " T=" << T << " ahead " << ahead;
        }
      }
    }
  }
  EXPECT_EQ(ops_->set_matvec_shape({.ahead = 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops_->set_matvec_shape({.ahead = 9}).code(), StatusCode::kInvalidArgument);
}

void VulkanMatMulTest::CheckEveryType(int64_t n_in, int64_t n_out, int64_t part_rows,
                                      std::initializer_list<int64_t> token_counts, Types types) {
  std::mt19937 rng(11);
  const cpu::KernelTable& scalar = cpu::ScalarKernels();
  auto up = vk::Uploader::Create(*ctx_, 1 << 20);
  ASSERT_TRUE(up.ok());
  std::vector<float> bias(n_out);
  for (float& b : bias) b = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  const vk::Buffer bias_buf = Input(bias);
  for (GgmlType type : kTypes) {
    if (types == Types::kQuantized && vk::ActKindFor(type) == vk::ActKind::kFloat) continue;
    if (types == Types::kWithSplitRows && !vk::SplitRowsApplies(type)) continue;
    if (n_in % GgmlTypeInfo(static_cast<uint32_t>(type))->block_elems != 0) continue;  // (Q6_K's 256 in 800)
    const std::vector<uint8_t> w = RandomWeights(type, n_out, n_in, rng);
    const Matrix m{type, n_in, n_out, RowBytes(type, n_in), w.data()};
    // The GGUF rows, and the split rows where the type has them: the same products, bit for bit.
    // Each also as three matrices stacked into one (rows [0, n/3), [n/3, 2n/3), the rest: q|k|v),
    // whose outputs must hold the same products too.
    std::vector<vk::DeviceMatrix> layouts, stacked;
    const int64_t seg[] = {0, n_out / 3, 2 * n_out / 3, n_out};
    std::vector<Matrix> thirds;
    for (int i = 0; i < 3; ++i) thirds.push_back({type, n_in, seg[i + 1] - seg[i], m.row_bytes, m.row(seg[i])});
    const Matrix* thirds_ptrs[] = {&thirds[0], &thirds[1], &thirds[2]};
    for (bool split : {false, true}) {
      if (split && !vk::SplitRowsApplies(type)) continue;
      const int64_t device_row_bytes = split ? vk::SplitRowBytes(type, n_in) : m.row_bytes;
      const vk::WeightUploadOptions options{.max_binding_bytes = part_rows * device_row_bytes + 4, .split_rows = split};
      int64_t total = 0;
      auto dm = vk::UploadMatrix(*ctx_, **up, m, options, total);
      ASSERT_TRUE(dm.ok()) << dm.status().message();
      ASSERT_EQ(dm->layout, split ? vk::WeightLayout::kSplitRows : vk::WeightLayout::kGguf);
      ASSERT_EQ(dm->parts.size(), static_cast<size_t>((n_out + part_rows - 1) / part_rows));
      layouts.push_back(std::move(*dm));
      auto sm = vk::UploadStacked(*ctx_, **up, thirds_ptrs, options, total);
      ASSERT_TRUE(sm.ok()) << sm.status().message();
      ASSERT_EQ(sm->segment_rows, (std::vector<int64_t>{seg[1], seg[2]}));
      ASSERT_EQ(sm->n_out, n_out);
      stacked.push_back(std::move(*sm));
    }
    ASSERT_TRUE((*up)->Flush().ok());
    for (int64_t T : token_counts) {
      const bool epilogue = T == 3 || T == 40;  // bias and residual add
      std::vector<float> x;
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> row = RandomActivations(n_in, rng);
        x.insert(x.end(), row.begin(), row.end());
      }
      std::vector<float> y_old(T * n_out);
      for (float& v : y_old) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
      std::vector<float> want(T * n_out);
      std::vector<uint8_t> xq(static_cast<size_t>(cpu::QuantizedActivationRowBytes(type, n_in)));
      for (int64_t t = 0; t < T; ++t) {
        scalar.quantize_row[static_cast<int>(type)](x.data() + t * n_in, xq.data(), n_in);
        for (int64_t r = 0; r < n_out; ++r) {
          float v = scalar.vec_dot[static_cast<int>(type)](m.row(r), xq.data(), n_in);
          if (epilogue) v = y_old[t * n_out + r] + (v + bias[r]);
          want[t * n_out + r] = v;
        }
      }
      const vk::Buffer xb = Input(x);
      const vk::Buffer codes = Output(T * n_in);
      const vk::Buffer aux = Output(T * n_in / 32 * 16);
      const vk::ActKind kind = vk::ActKindFor(type);
      // Quantizes x (quantized types) and multiplies by dm into y (stacked: y, y1, y2).
      auto multiply = [&](const vk::DeviceMatrix& dm, const vk::Buffer* y, const vk::Buffer* y1,
                          const vk::Buffer* y2) {
        return Run([&](vk::Recorder& rec) -> Status {
          if (kind != vk::ActKind::kFloat) {
            KVFS_RETURN_IF_ERROR(ops_->QuantizeActs(rec, kind, xb, n_in, n_in, T, {&codes, &aux}));
            rec.Barrier();
          }
          vk::Ops::MatMulArgs a;
          a.x = &xb;
          a.x_stride = n_in;
          a.acts = {&codes, &aux};
          a.n_tokens = T;
          a.y = y;
          a.y1 = y1;
          a.y2 = y2;
          a.bias = epilogue ? &bias_buf : nullptr;
          a.accumulate = epilogue;
          return ops_->MatMul(rec, dm, a);
        });
      };
      std::vector<float> gguf_rows_y;
      for (size_t li = 0; li < layouts.size(); ++li) {
        const vk::DeviceMatrix& dm = layouts[li];
        const bool split = dm.layout == vk::WeightLayout::kSplitRows;
        vk::Buffer y = Output(T * n_out * 4);
        if (epilogue) std::memcpy(y.mapped(), y_old.data(), y_old.size() * 4);
        const Status s = multiply(dm, &y, nullptr, nullptr);
        ASSERT_TRUE(s.ok()) << s.message();
        const std::vector<float> got = Read<float>(y, T * n_out);
        const double nmse = Nmse(got, want);
        std::printf("[vulkan matmul] %-5s %lldx%lld T=%-3lld%s NMSE %.3g\n", TypeName(type).c_str(),
                    static_cast<long long>(n_out), static_cast<long long>(n_in), static_cast<long long>(T),
                    split ? " split rows" : "", nmse);
        // Integer paths sum each unit exactly; only the float accumulation order differs.
        EXPECT_LE(nmse, 1e-10) << TypeName(type) << " T=" << T;
        if (!split) {
          gguf_rows_y = got;
        } else {
          EXPECT_EQ(std::memcmp(got.data(), gguf_rows_y.data(), got.size() * 4), 0)
              << TypeName(type) << " T=" << T << ": split rows give other products than the GGUF rows";
        }
        // The stacked matrix: each third's rows in its own output, [T][rows of the third].
        std::vector<vk::Buffer> ys;
        for (int i = 0; i < 3; ++i) {
          const int64_t w3 = seg[i + 1] - seg[i];
          ys.push_back(Output(T * w3 * 4));
          if (!epilogue) continue;
          for (int64_t t = 0; t < T; ++t) {
            std::memcpy(ys[i].mapped() + t * w3 * 4, y_old.data() + t * n_out + seg[i], w3 * 4);
          }
        }
        const Status ss = multiply(stacked[li], &ys[0], &ys[1], &ys[2]);
        ASSERT_TRUE(ss.ok()) << ss.message();
        for (int i = 0; i < 3; ++i) {
          const int64_t w3 = seg[i + 1] - seg[i];
          const std::vector<float> part = Read<float>(ys[i], T * w3);
          for (int64_t t = 0; t < T; ++t) {
            EXPECT_EQ(std::memcmp(part.data() + t * w3, got.data() + t * n_out + seg[i], w3 * 4), 0)
                << TypeName(type) << " T=" << T << (split ? " split rows" : "") << ": stacked matrix " << i
                << " token " << t << " differs from the whole matrix's rows";
          }
        }
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(IntegerDot, VulkanMatMulTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Packed" : "Plain"; });

// The tables of a pass (Recorder::PassTable, e.g. merged attention calls): each starts at a
// multiple of its entry size, holds the bytes given, and a table of the same bytes as an earlier
// one of the pass is that one (a pass's layers repeat theirs); a table that does not fit the
// space left is refused (-1) without taking any; the next pass starts over; a table of part
// entries, or outside a pass, is an error.
TEST_F(VulkanOpsTest, PassTablesAreSharedWithinAPassAndStartOverInTheNext) {
  const std::vector<uint8_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // 3 entries of 4 bytes
  const std::vector<uint8_t> b(16, 7);                                     // 2 entries of 8 bytes
  const std::vector<uint8_t> too_big(vk::Recorder::kPassTableBytes, 0);
  int64_t ia = -1, ib = -1, ia2 = -1, ib2 = -1, ic = -1, refused = 0;
  ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                KVFS_ASSIGN_OR_RETURN(ia, rec.PassTable(a, 4));
                KVFS_ASSIGN_OR_RETURN(ib, rec.PassTable(b, 8));
                KVFS_ASSIGN_OR_RETURN(ia2, rec.PassTable(a, 4));
                KVFS_ASSIGN_OR_RETURN(refused, rec.PassTable(too_big, 4));
                KVFS_ASSIGN_OR_RETURN(ic, rec.PassTable(a, 12));  // the same bytes, other entries: a new table
                if (rec.PassTable(std::span(a).first(5), 4).ok()) return Internal("a part entry was taken");
                return Status::Ok();
              }).ok());
  EXPECT_EQ(ia, 0);
  EXPECT_EQ(ib, 2) << "bytes 12..16 skipped: 8-byte entries start at 16";
  EXPECT_EQ(ia2, ia) << "the same table again";
  EXPECT_EQ(refused, -1);
  EXPECT_EQ(ic, 3) << "after b's 32 bytes, at 36: 12-byte entry 3";
  const uint8_t* tables = rec_->pass_tables().mapped();
  EXPECT_TRUE(std::equal(a.begin(), a.end(), tables));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), tables + 16));
  EXPECT_TRUE(std::equal(a.begin(), a.end(), tables + 36));
  ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                KVFS_ASSIGN_OR_RETURN(ib2, rec.PassTable(b, 8));
                return Status::Ok();
              }).ok());
  EXPECT_EQ(ib2, 0) << "a new pass starts over";
  EXPECT_FALSE(rec_->PassTable(a, 4).ok()) << "outside a pass";
}

TEST_F(VulkanOpsTest, EmbeddingMatchesDequantizeForEveryType) {
  std::mt19937 rng(3);
  const int64_t n = 512, n_vocab = 45;
  const std::vector<int32_t> tokens = {0, 44, 7, 21, 7, 30};
  const int64_t T = static_cast<int64_t>(tokens.size());
  auto up = vk::Uploader::Create(*ctx_, 1 << 20);
  ASSERT_TRUE(up.ok());
  const vk::Buffer ids = Input(tokens);
  for (GgmlType type : kTypes) {
    const std::vector<uint8_t> w = RandomWeights(type, n_vocab, n, rng);
    const Matrix m{type, n, n_vocab, RowBytes(type, n), w.data()};
    std::vector<float> want(T * n);
    for (int64_t t = 0; t < T; ++t) DequantizeRow(type, m.row(tokens[t]), want.data() + t * n, n);
    for (bool split : {false, true}) {
      if (split && !vk::SplitRowsApplies(type)) continue;
      const int64_t device_row_bytes = split ? vk::SplitRowBytes(type, n) : m.row_bytes;
      const vk::WeightUploadOptions options{.max_binding_bytes = 16 * device_row_bytes, .split_rows = split};
      int64_t total = 0;
      auto dm = vk::UploadMatrix(*ctx_, **up, m, options, total);  // 3 parts
      ASSERT_TRUE(dm.ok()) << dm.status().message();
      ASSERT_EQ(dm->parts.size(), 3u);
      ASSERT_TRUE((*up)->Flush().ok());
      const vk::Buffer x = Output(T * n * 4);
      ASSERT_TRUE(Run([&](vk::Recorder& rec) { return ops_->Embed(rec, *dm, ids, T, x); }).ok());
      const double nmse = Nmse(Read<float>(x, T * n), want);
      std::printf("[vulkan embed] %-5s%s NMSE %.3g\n", TypeName(type).c_str(), split ? " split rows" : "", nmse);
      EXPECT_LE(nmse, 1e-12) << TypeName(type) << (split ? " split rows" : "");
    }
  }
}

// RMSNorm gives the CPU's bits (its squares summed as exactly as the CPU's double sum, the
// mean and square root rounded as the CPU's): rows of several lengths (a workgroup's multiple,
// odd, shorter than the workgroup) and scales, gathered rows too, with the tree's last steps by
// subgroup shuffles and all in shared memory.
TEST_F(VulkanOpsTest, RmsNormMatchesCpu) {
  std::mt19937 rng(5);
  for (const int64_t n : {1000, 4096, 172, 64, 37}) {
    const int64_t rows = 48;
    std::vector<float> x(rows * n), w(n);
    for (int64_t r = 0; r < rows; ++r) {
      std::normal_distribution<float> normal(0.0f, std::ldexp(1.0f, static_cast<int>(r % 9) - 4));
      for (int64_t i = 0; i < n; ++i) x[r * n + i] = normal(rng);
    }
    std::normal_distribution<float> weights(0.0f, 2.0f);
    for (float& v : w) v = weights(rng);
    const std::vector<int32_t> gather = {3, 0};
    const vk::Buffer xb = Input(x), wb = Input(w), ids = Input(gather);
    std::vector<float> want(rows * n), want_g(2 * n);
    for (int64_t r = 0; r < rows; ++r) cpu::RmsNorm(x.data() + r * n, w.data(), want.data() + r * n, n, 1e-5f);
    for (int64_t r = 0; r < 2; ++r) cpu::RmsNorm(x.data() + gather[r] * n, w.data(), want_g.data() + r * n, n, 1e-5f);
    for (const bool trees : {true, false}) {
      ops_->set_subgroup_trees(trees);
      const vk::Buffer y = Output(rows * n * 4), yg = Output(gather.size() * n * 4);
      ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                    KVFS_RETURN_IF_ERROR(ops_->RmsNorm(rec, xb, n, wb, n, 1e-5f, y, n, rows, nullptr));
                    return ops_->RmsNorm(rec, xb, n, wb, n, 1e-5f, yg, n, 2, &ids);
                  }).ok());
      const std::vector<float> got = Read<float>(y, rows * n), got_g = Read<float>(yg, 2 * n);
      int64_t rows_differing = 0;
      for (int64_t r = 0; r < rows; ++r) {
        rows_differing += !std::equal(got.begin() + r * n, got.begin() + (r + 1) * n, want.begin() + r * n);
      }
      std::printf("[vulkan rms_norm]%s n=%lld: %lld of %lld rows differ from the CPU's, NMSE %.3g\n",
                  ops_->subgroup_trees() ? " (subgroup trees)" : "", static_cast<long long>(n),
                  static_cast<long long>(rows_differing), static_cast<long long>(rows), Nmse(got, want));
      EXPECT_EQ(rows_differing, 0) << "n=" << n << (trees ? ", subgroup trees" : "");
      EXPECT_TRUE(got_g == want_g) << "gathered rows, n=" << n;
    }
  }
}

TEST_F(VulkanOpsTest, RopeMatchesCpuBothStyles) {
  std::mt19937 rng(9);
  const int64_t n_heads = 4, head_dim = 64;
  const std::vector<int64_t> positions = {0, 7, 1000, 4095, 30000};
  const int64_t T = static_cast<int64_t>(positions.size());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> factors(32);
  for (float& f : factors) f = std::uniform_real_distribution<float>(1.0f, 8.0f)(rng);
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    for (int64_t n_rot : {int64_t{64}, int64_t{32}}) {
      for (bool llama3 : {false, true}) {
        const cpu::RopeParams p{n_rot, head_dim, 500000.0f, llama3 ? 1.0f : 0.25f, style,
                                llama3 ? factors.data() : nullptr};
        std::vector<float> x(T * n_heads * head_dim), table(T * n_rot);
        for (float& v : x) v = normal(rng);
        std::vector<float> want = x, c(n_rot / 2), s(n_rot / 2);
        for (int64_t t = 0; t < T; ++t) {
          cpu::RopeAngles(p, positions[t], c.data(), s.data());
          for (int64_t i = 0; i < n_rot / 2; ++i) {
            table[t * n_rot + 2 * i] = c[i];
            table[t * n_rot + 2 * i + 1] = s[i];
          }
          cpu::RopeApply(p, c.data(), s.data(), want.data() + t * n_heads * head_dim, n_heads);
        }
        const vk::Buffer xb = Output(x.size() * 4);
        std::memcpy(xb.mapped(), x.data(), x.size() * 4);
        const vk::Buffer tb = Input(table);
        ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                      return ops_->Rope(rec, xb, n_heads * head_dim, n_heads, head_dim, n_rot, style, tb, T);
                    }).ok());
        const double nmse = Nmse(Read<float>(xb, x.size()), want);
        std::printf("[vulkan rope] %s n_rot=%lld %s NMSE %.3g\n", style == RopeStyle::kNeox ? "neox" : "normal",
                    static_cast<long long>(n_rot), llama3 ? "rope_freqs" : "freq_scale 0.25", nmse);
        EXPECT_LE(nmse, 1e-14);
      }
    }
  }
}

// The fused ops (RMSNorm or SwiGLU and the quantization after them, one dispatch) give exactly
// what the separate ops give: the f32 rows and every code, scale and sum; with input rows
// strided, for every activation kind.
// Decode-like (3 rows: a row over several workgroups) and prefill-like (100 rows: a workgroup
// takes several passes, the last one part full).
TEST_F(VulkanOpsTest, FusedNormAndSwiGluQuantizeAsTheSeparateOps) {
  for (const auto& [n, rows] : {std::pair<int64_t, int64_t>{1024, 3}, {2304, 100}}) {
    SCOPED_TRACE(n);
    std::mt19937 rng(17);
    const int64_t x_stride = n + 64;
    std::vector<float> x, gate, up;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> row = RandomActivations(x_stride, rng);
      x.insert(x.end(), row.begin(), row.end());
      const std::vector<float> g = RandomActivations(n, rng), u = RandomActivations(n, rng);
      gate.insert(gate.end(), g.begin(), g.end());
      up.insert(up.end(), u.begin(), u.end());
    }
    std::vector<float> w(n);
    for (float& v : w) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    const vk::Buffer xb = Input(x), wb = Input(w), gb = Input(gate), ub = Input(up);
    // With the trees' last steps by subgroup shuffles (where the device has them), then all in
    // shared memory: the same rows, codes and scales.
    std::vector<std::vector<uint8_t>> outputs[2];
    for (const bool trees : {true, false}) {
      ops_->set_subgroup_trees(trees);
      for (vk::ActKind kind : {vk::ActKind::kQ8_0, vk::ActKind::kQ8_1, vk::ActKind::kQ8_K}) {
        for (const bool swiglu : {false, true}) {
          const vk::Buffer y_sep = Output(rows * n * 4), y_fused = Output(rows * n * 4);
          const vk::Buffer codes_sep = Output(rows * n), aux_sep = Output(rows * n / 32 * 16);
          const vk::Buffer codes_fused = Output(rows * n), aux_fused = Output(rows * n / 32 * 16);
          ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                        if (swiglu) {
                          KVFS_RETURN_IF_ERROR(ops_->SwiGlu(rec, gb, ub, y_sep, rows * n));
                        } else {
                          KVFS_RETURN_IF_ERROR(ops_->RmsNorm(rec, xb, x_stride, wb, n, 1e-5f, y_sep, n, rows, nullptr));
                        }
                        rec.Barrier();
                        KVFS_RETURN_IF_ERROR(ops_->QuantizeActs(rec, kind, y_sep, n, n, rows, {&codes_sep, &aux_sep}));
                        if (swiglu) {
                          return ops_->SwiGluQuantizeActs(rec, kind, gb, ub, n, rows, y_fused, {&codes_fused, &aux_fused});
                        }
                        return ops_->NormQuantizeActs(rec, kind, xb, x_stride, wb, n, 1e-5f, y_fused, n, rows,
                                                      {&codes_fused, &aux_fused});
                      }).ok());
          const char* what = swiglu ? "swiglu" : "rms_norm";
          const int kind_id = static_cast<int>(kind);
          EXPECT_TRUE(Read<float>(y_sep, rows * n) == Read<float>(y_fused, rows * n)) << what << " kind " << kind_id;
          EXPECT_TRUE(Read<int8_t>(codes_sep, rows * n) == Read<int8_t>(codes_fused, rows * n)) << what << " kind " << kind_id;
          EXPECT_TRUE(Read<float>(aux_sep, rows * n / 32 * 4) == Read<float>(aux_fused, rows * n / 32 * 4))
              << what << " kind " << kind_id;
          outputs[trees ? 0 : 1].push_back(Read<uint8_t>(y_fused, rows * n * 4));
          outputs[trees ? 0 : 1].push_back(Read<uint8_t>(codes_fused, rows * n));
          outputs[trees ? 0 : 1].push_back(Read<uint8_t>(aux_fused, rows * n / 32 * 16));
        }
      }
    }
    EXPECT_TRUE(outputs[0] == outputs[1]) << "subgroup shuffles changed the fused ops' outputs";
  }
}

// Halves below the normal range (|x| < 2^-14): a peaked softmax row's weights rounded to f16
// (an f16 cache) and F16 weights looked up. Vulkan lets a device flush subnormals unless the
// shader asks otherwise, and lavapipe keeps them; the shaders' own conversions must give the
// CPU's bits on any device.
TEST_F(VulkanOpsTest, SubnormalHalvesKeepTheirValues) {
  std::mt19937 rng(29);
  const int64_t n_head = 2, T = 2, pos0 = 200, stride = pos0 + T;
  std::normal_distribution<float> normal(0.0f, 40.0f);
  std::vector<float> s(T * n_head * stride);
  for (float& v : s) v = normal(rng);
  std::vector<float> want = s;
  for (int64_t r = 0; r < T * n_head; ++r) {
    cpu::ScalarAttentionKernels().softmax(want.data() + r * stride, pos0 + r / n_head + 1, stride, 0.125f, true);
  }
  const vk::Buffer sb = Output(s.size() * 4);
  std::memcpy(sb.mapped(), s.data(), s.size() * 4);
  ASSERT_TRUE(Run([&](vk::Recorder& rec) { return ops_->Softmax(rec, sb, n_head, T, pos0, stride, 0.125f, true); }).ok());
  const std::vector<float> got = Read<float>(sb, s.size());
  // A device whose fma rounds twice (lavapipe) has other exponentials than the CPU, so 1 / sum
  // may differ in its last bit and a weight by one f16 step. A flushed subnormal is 0 where the
  // CPU's is not, or further off than one step of 2^-24.
  int64_t subnormal = 0, flushed = 0, equal = 0;
  for (int64_t r = 0; r < T * n_head; ++r) {
    for (int64_t p = 0; p <= pos0 + r / n_head; ++p) {
      const float w = want[r * stride + p], g = got[r * stride + p];
      if (w == 0.0f || std::fabs(w) >= 6.103515625e-05f) continue;
      ++subnormal;
      equal += w == g;
      flushed += g == 0.0f || std::fabs(g - w) > 0x1p-24f;
    }
  }
  std::printf("[vulkan subnormal] softmax weights rounded to f16: %lld subnormal, %lld equal to the CPU's, %lld "
              "flushed\n",
              static_cast<long long>(subnormal), static_cast<long long>(equal), static_cast<long long>(flushed));
  ASSERT_GT(subnormal, 20) << "the rows must be peaked enough to give subnormal weights";
  EXPECT_EQ(flushed, 0);

  // An F16 table whose every other value is subnormal (both signs), looked up.
  const int64_t n = 256, n_vocab = 4;
  std::vector<uint16_t> table(n * n_vocab);
  std::uniform_int_distribution<int> mantissa(1, 0x3FF), any(0, 0xFFFF);
  for (size_t i = 0; i < table.size(); ++i) {
    uint16_t h = i % 2 == 0 ? static_cast<uint16_t>(mantissa(rng) | (any(rng) & 0x8000)) : static_cast<uint16_t>(any(rng));
    if ((h & 0x7C00) == 0x7C00) h &= 0x83FF;  // no infinities or NaNs
    table[i] = h;
  }
  const Matrix m{GgmlType::kF16, n, n_vocab, n * 2, reinterpret_cast<const uint8_t*>(table.data())};
  auto up = vk::Uploader::Create(*ctx_, 1 << 20);
  ASSERT_TRUE(up.ok());
  int64_t total = 0;
  auto dm = vk::UploadMatrix(*ctx_, **up, m, vk::WeightUploadOptions{.max_binding_bytes = 1 << 20}, total);
  ASSERT_TRUE(dm.ok()) << dm.status().message();
  ASSERT_TRUE((*up)->Flush().ok());
  const std::vector<int32_t> tokens = {3, 0, 2};
  const vk::Buffer ids = Input(tokens);
  const vk::Buffer x = Output(tokens.size() * n * 4);
  ASSERT_TRUE(Run([&](vk::Recorder& rec) { return ops_->Embed(rec, *dm, ids, 3, x); }).ok());
  const std::vector<float> row = Read<float>(x, tokens.size() * n);
  int64_t embed_differing = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int64_t i = 0; i < n; ++i) {
      const float w = Fp16ToFp32(table[tokens[t] * n + i]);
      embed_differing += std::memcmp(&w, &row[t * n + i], 4) != 0;
    }
  }
  std::printf("[vulkan subnormal] F16 lookup: %lld of %lld values differ from the CPU's\n",
              static_cast<long long>(embed_differing), static_cast<long long>(tokens.size() * n));
  EXPECT_EQ(embed_differing, 0);
}

}  // namespace
}  // namespace kvfs::testing

#else  // !KVFS_VULKAN

namespace kvfs {
namespace {

TEST(VulkanDisabled, BackendIsUnsupported) {
  auto devices = ListVulkanDevices();
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace kvfs

#endif  // KVFS_VULKAN
