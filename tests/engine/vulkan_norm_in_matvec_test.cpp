// The matrix-vector shader's norm prologue (Ops::MatMul with NormInput, VulkanMatvecShape::
// norm_group): every workgroup makes RMSNorm(x) * w and quantizes it itself. Its products must
// be those of the separate ops (NormQuantizeActs, a barrier, then the product of its codes) bit
// for bit: rows of 8 to 128 units (several units an invocation), every activation kind it takes
// (Q8_0, Q8_1), one to six tokens (groups of 4 with copies past the last), matrices in parts,
// and with the SwiGLU epilogue too. Without a Vulkan device the test skips.
#include <algorithm>

#include <gtest/gtest.h>

#include "engine/backend/backend.h"

#if defined(KVFS_VULKAN)

#include "engine/backend/vulkan/device_weights.h"
#include "engine/backend/vulkan/vk_transfer.h"
#include "tests/engine/vulkan_test_util.h"

namespace kvfs::testing {
namespace {

struct NormCase {
  GgmlType type;  // the matrix's (its codes' kind follows)
  int64_t n_in;
  int64_t n_rows;
  bool every_shape;  // also the other shapes and token counts (each pipeline costs lavapipe ~1 s)
};
constexpr NormCase kCases[] = {{GgmlType::kQ4_0, 4096, 40, true},
                               {GgmlType::kQ4_1, 2048, 24, false},
                               {GgmlType::kQ8_0, 256, 24, false}};

// Workgroups of 32 (a GPU's warp and slot: 4 units an invocation at 4096 values), 256 (2
// invocations a unit there), 1024 (8) and 64 with slots of 32 and 16 lanes, and the token counts
// each takes (256 invocations' partial sums and 4 tokens' codes of 4096 values overflow
// lavapipe's 32 KiB of shared memory). The other cases' short rows take 1 to 8 invocations a
// unit.
struct NormShape {
  vk::MatvecShape shape;
  std::initializer_list<int64_t> tokens;
};
const NormShape kShapes[] = {{{.max_lanes = 32, .norm_group = 32}, {1, 3, 6}},
                             {{.max_lanes = 32, .max_rows = 2, .norm_group = 256}, {1, 2}},
                             {{.max_lanes = 32, .max_rows = 2, .norm_group = 1024}, {1}},
                             {{.group = 32, .max_lanes = 16, .max_rows = 4, .norm_group = 64}, {3}}};

class VulkanNormInMatvecTest : public VulkanOpsTest {
 protected:
  // T rows of n values at scales 1e-3 to 1e3 (the sixth all zeros: its scale is eps's).
  static std::vector<float> Rows(int64_t T, int64_t n, std::mt19937& rng) {
    std::vector<float> x;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> row = RandomActivations(n, rng);
      const float scale = t == 5 ? 0.0f : std::pow(10.0f, static_cast<float>(t % 7) - 3.0f);
      for (float& v : row) v *= scale;
      x.insert(x.end(), row.begin(), row.end());
    }
    return x;
  }
  // Every case of kCases in its shapes, against the separate ops.
  void CheckCases();
};

// The shaders without the packed integer dot product (matvec_quant, matvec_quant_sg).
class VulkanNormInMatvecPlainDotTest : public VulkanNormInMatvecTest {
 protected:
  bool IntegerDot() const override { return false; }
};

TEST_F(VulkanNormInMatvecTest, MatricesMakeTheirNormAsTheSeparateOps) { CheckCases(); }
TEST_F(VulkanNormInMatvecPlainDotTest, MatricesMakeTheirNormAsTheSeparateOps) { CheckCases(); }

void VulkanNormInMatvecTest::CheckCases() {
  auto up = vk::Uploader::Create(*ctx_, 1 << 20);
  ASSERT_TRUE(up.ok());
  std::mt19937 rng(41);
  const float eps = 1e-5f;
  for (const NormCase& c : kCases) {
    const int64_t n = c.n_in, row_bytes = RowBytes(c.type, n);
    const std::vector<uint8_t> w = RandomWeights(c.type, c.n_rows, n, rng);
    const Matrix m{c.type, n, c.n_rows, row_bytes, w.data()};
    int64_t total = 0;
    // In parts of 16 rows (several dispatches, each making the norm).
    auto dm = vk::UploadMatrix(*ctx_, **up, m, {.max_binding_bytes = 16 * row_bytes + 4}, total);
    ASSERT_TRUE(dm.ok()) << dm.status().message();
    ASSERT_GT(dm->parts.size(), 1u);
    ASSERT_TRUE((*up)->Flush().ok());
    std::vector<float> norm_w = RandomActivations(n, rng);
    const vk::Buffer wb = Input(norm_w);
    const vk::ActKind kind = vk::ActKindFor(c.type);
    for (const int64_t T : {1, 2, 3, 6}) {
      for (const NormShape& s : kShapes) {
        const vk::MatvecShape& shape = s.shape;
        if (std::find(s.tokens.begin(), s.tokens.end(), T) == s.tokens.end()) continue;
        if (!c.every_shape && (&s != &kShapes[0] || T == 6)) continue;
        SCOPED_TRACE(::testing::Message() << TypeName(c.type) << " n_in " << n << " T=" << T << " norm group "
                                          << shape.norm_group << " lanes " << shape.max_lanes);
        ASSERT_TRUE(ops_->set_matvec_shape(shape).ok());
        ASSERT_TRUE(ops_->FusesNorm(*dm, T));
        const vk::Buffer xb = Input(Rows(T, n, rng));
        const vk::Buffer normed = Output(T * n * 4), codes = Output(T * n), aux = Output(T * n / 32 * 16);
        const vk::Buffer y_sep = Output(T * c.n_rows * 4);
        vk::Buffer y_fused = Output(T * c.n_rows * 4);
        std::memset(y_fused.mapped(), 0xA5, static_cast<size_t>(y_fused.bytes()));  // all must be written
        const vk::Ops::NormInput norm{&xb, n, &wb, eps};
        ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                      KVFS_RETURN_IF_ERROR(ops_->NormQuantizeActs(rec, kind, xb, n, wb, n, eps, normed, n, T, {&codes, &aux}));
                      rec.Barrier();
                      vk::Ops::MatMulArgs a;
                      a.acts = {&codes, &aux};
                      a.n_tokens = T;
                      a.y = &y_sep;
                      KVFS_RETURN_IF_ERROR(ops_->MatMul(rec, *dm, a));
                      a.acts = {};
                      a.y = &y_fused;
                      a.norm = &norm;
                      return ops_->MatMul(rec, *dm, a);
                    }).ok());
        const std::vector<float> want = Read<float>(y_sep, T * c.n_rows);
        ASSERT_TRUE(std::any_of(want.begin(), want.end(), [](float v) { return v != 0.0f; }));
        EXPECT_EQ(std::memcmp(y_sep.mapped(), y_fused.mapped(), static_cast<size_t>(T * c.n_rows * 4)), 0)
            << "NMSE " << Nmse(Read<float>(y_fused, T * c.n_rows), want);
      }
    }
    // Where it does not apply: no norm group, more tokens than the matrix-vector shader takes,
    // codes of a row longer than shared memory holds.
    ASSERT_TRUE(ops_->set_matvec_shape({}).ok());
    EXPECT_FALSE(ops_->FusesNorm(*dm, 1));
    ASSERT_TRUE(ops_->set_matvec_shape(kShapes[0].shape).ok());
    EXPECT_FALSE(ops_->FusesNorm(*dm, vk::Ops::kMatvecMaxTokens + 1));
  }
  // The k-quants' codes (Q8_K) are not made here; nor codes of rows beyond shared memory.
  for (const auto& [type, n_in] : {std::pair{GgmlType::kQ4_K, int64_t{256}}, std::pair{GgmlType::kQ4_0, int64_t{32768}}}) {
    const std::vector<uint8_t> w = RandomWeights(type, 4, n_in, rng);
    int64_t total = 0;
    auto dm = vk::UploadMatrix(*ctx_, **up, Matrix{type, n_in, 4, RowBytes(type, n_in), w.data()},
                               {.max_binding_bytes = ctx_->limits().max_binding_bytes}, total);
    ASSERT_TRUE(dm.ok());
    ASSERT_TRUE((*up)->Flush().ok());
    EXPECT_FALSE(ops_->FusesNorm(*dm, 4)) << TypeName(type) << " n_in " << n_in;
  }
}

// Rows from row0 on (the output matrix's norm of a prompt's last rows): the products of those
// rows alone.
TEST_F(VulkanNormInMatvecTest, RowsFromAnOffsetAreThoseRowsAlone) {
  auto up = vk::Uploader::Create(*ctx_, 1 << 20);
  ASSERT_TRUE(up.ok());
  std::mt19937 rng(47);
  const float eps = 1e-5f;
  const int64_t n = 512, n_rows = 24, T = 2, row0 = 3;
  const GgmlType type = GgmlType::kQ8_0;
  const std::vector<uint8_t> w = RandomWeights(type, n_rows, n, rng);
  int64_t total = 0;
  auto dm = vk::UploadMatrix(*ctx_, **up, Matrix{type, n, n_rows, RowBytes(type, n), w.data()},
                             {.max_binding_bytes = ctx_->limits().max_binding_bytes}, total);
  ASSERT_TRUE(dm.ok()) << dm.status().message();
  ASSERT_TRUE((*up)->Flush().ok());
  ASSERT_TRUE(ops_->set_matvec_shape(kShapes[0].shape).ok());
  ASSERT_TRUE(ops_->FusesNorm(*dm, T));
  const std::vector<float> x = Rows(row0 + T, n, rng);
  const vk::Buffer all = Input(x), wanted = Input(std::vector<float>(x.begin() + row0 * n, x.end()));
  const vk::Buffer wb = Input(RandomActivations(n, rng));
  const vk::Buffer y_alone = Output(T * n_rows * 4), y_offset = Output(T * n_rows * 4);
  const vk::Ops::NormInput alone{&wanted, n, &wb, eps, 0}, offset{&all, n, &wb, eps, row0};
  ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                vk::Ops::MatMulArgs a;
                a.n_tokens = T;
                a.y = &y_alone;
                a.norm = &alone;
                KVFS_RETURN_IF_ERROR(ops_->MatMul(rec, *dm, a));
                a.y = &y_offset;
                a.norm = &offset;
                return ops_->MatMul(rec, *dm, a);
              }).ok());
  const std::vector<float> want = Read<float>(y_alone, T * n_rows);
  ASSERT_TRUE(std::any_of(want.begin(), want.end(), [](float v) { return v != 0.0f; }));
  EXPECT_TRUE(want == Read<float>(y_offset, T * n_rows));
}

// gate|up stacked, with its norm and SwiGLU's codes for the down matrix: the codes of the
// separate norm's product, bit for bit.
TEST_F(VulkanNormInMatvecTest, GateUpMakesItsNormAndHandsOnSwiGluCodes) {
  auto up = vk::Uploader::Create(*ctx_, 1 << 20);
  ASSERT_TRUE(up.ok());
  std::mt19937 rng(43);
  const float eps = 1e-6f;
  const int64_t n_in = 2048, n_ff = 160, counter_words = 4096;
  const GgmlType type = GgmlType::kQ4_0;
  const int64_t row_bytes = RowBytes(type, n_in);
  const std::vector<uint8_t> gate_w = RandomWeights(type, n_ff, n_in, rng), up_w = RandomWeights(type, n_ff, n_in, rng);
  const Matrix gate_m{type, n_in, n_ff, row_bytes, gate_w.data()}, up_m{type, n_in, n_ff, row_bytes, up_w.data()};
  const Matrix* halves[] = {&gate_m, &up_m};
  int64_t total = 0;
  auto dm = vk::UploadStacked(*ctx_, **up, halves, {.max_binding_bytes = 100 * row_bytes + 4}, total);
  ASSERT_TRUE(dm.ok()) << dm.status().message();
  ASSERT_TRUE((*up)->Flush().ok());
  const vk::Buffer wb = Input(RandomActivations(n_in, rng)), counters = Output(counter_words * 4);
  ASSERT_TRUE(ops_->set_matvec_shape(kShapes[0].shape).ok());
  for (const int64_t T : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const vk::Buffer xb = Input(Rows(T, n_in, rng));
    const vk::Buffer normed = Output(T * n_in * 4), in_codes = Output(T * n_in), in_aux = Output(T * n_in / 32 * 16);
    const vk::Buffer gate_sep = Output(T * n_ff * 4), up_sep = Output(T * n_ff * 4);
    const vk::Buffer gate_fused = Output(T * n_ff * 4), up_fused = Output(T * n_ff * 4);
    const vk::Buffer codes_sep = Output(T * n_ff), aux_sep = Output(T * n_ff / 32 * 16);
    const vk::Buffer codes_fused = Output(T * n_ff), aux_fused = Output(T * n_ff / 32 * 16);
    const vk::Ops::SwiGluCodes glu_sep{vk::ActKind::kQ8_0, {&codes_sep, &aux_sep}, &counters, counter_words};
    const vk::Ops::SwiGluCodes glu_fused{vk::ActKind::kQ8_0, {&codes_fused, &aux_fused}, &counters, counter_words};
    ASSERT_TRUE(ops_->FusesNorm(*dm, T, &glu_fused));
    const vk::Ops::NormInput norm{&xb, n_in, &wb, eps};
    ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                  KVFS_RETURN_IF_ERROR(ops_->NormQuantizeActs(rec, vk::ActKind::kQ8_0, xb, n_in, wb, n_in, eps, normed,
                                                              n_in, T, {&in_codes, &in_aux}));
                  rec.Barrier();
                  vk::Ops::MatMulArgs a;
                  a.acts = {&in_codes, &in_aux};
                  a.n_tokens = T;
                  a.y = &gate_sep;
                  a.y1 = &up_sep;
                  a.swiglu = &glu_sep;
                  KVFS_RETURN_IF_ERROR(ops_->MatMul(rec, *dm, a));
                  rec.Barrier();  // the counters, back at 0
                  a.acts = {};
                  a.y = &gate_fused;
                  a.y1 = &up_fused;
                  a.swiglu = &glu_fused;
                  a.norm = &norm;
                  return ops_->MatMul(rec, *dm, a);
                }).ok());
    EXPECT_TRUE(Read<float>(gate_sep, T * n_ff) == Read<float>(gate_fused, T * n_ff));
    EXPECT_TRUE(Read<float>(up_sep, T * n_ff) == Read<float>(up_fused, T * n_ff));
    const std::vector<int8_t> want = Read<int8_t>(codes_sep, T * n_ff);
    ASSERT_TRUE(std::any_of(want.begin(), want.end(), [](int8_t v) { return v != 0; }));
    EXPECT_TRUE(want == Read<int8_t>(codes_fused, T * n_ff));
    EXPECT_EQ(std::memcmp(aux_sep.mapped(), aux_fused.mapped(), static_cast<size_t>(T * n_ff / 32 * 16)), 0);
  }
}

}  // namespace
}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
