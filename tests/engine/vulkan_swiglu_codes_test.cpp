// The matrix-vector shader's SwiGLU epilogue (Ops::MatMul with SwiGluCodes): a stacked
// gate|up matrix hands the down matrix SwiGLU(gate, up) quantized, written by the workgroup
// whose rows complete each block. Its codes, scales and sums must be those of the separate ops
// (the product into gate and up, then SwiGluQuantizeActs) bit for bit, and the counters must be
// left at 0. Without a Vulkan device the test skips.
#include <algorithm>

#include <gtest/gtest.h>

#include "engine/backend/backend.h"

#if defined(KVFS_VULKAN)

#include "engine/backend/vulkan/device_weights.h"
#include "engine/backend/vulkan/vk_transfer.h"
#include "tests/engine/vulkan_test_util.h"

namespace kvfs::testing {
namespace {

struct GluCase {
  GgmlType gate_up;  // the stacked matrix's type (its input codes' kind follows)
  vk::ActKind down;  // the codes handed on
  int64_t n_ff;      // rows of each half
  bool every_shape;  // also the other matrix-vector shapes, and shared-memory trees
};

// Every activation kind, one with another kind than gate|up's own. Halves of 5 blocks of 32
// (a block's rows straddle workgroups, parts and the gate/up boundary) and of 2 blocks of 256.
// (Each pipeline takes lavapipe about a second to compile: the cases share out the shapes.)
constexpr GluCase kCases[] = {{GgmlType::kQ4_0, vk::ActKind::kQ8_0, 160, true},
                              {GgmlType::kQ4_1, vk::ActKind::kQ8_1, 160, false},
                              {GgmlType::kQ4_K, vk::ActKind::kQ8_K, 512, true},
                              {GgmlType::kQ8_0, vk::ActKind::kQ8_K, 512, false}};

// Matrix-vector shapes (rows of 8 units: slots of 8 lanes at most), on the matrix in parts of
// 100 rows unless whole: the default (8 slots of a row), 64 rows a workgroup (32 slots of 2:
// several blocks, of gate and of up, in one workgroup), 32 invocations in 8 slots of 4 lanes
// and up to 4 rows, and the whole matrix in workgroups of 32 slots of 8 rows (256 rows: with
// halves of 160, a block's gate and up rows in one workgroup, which finishes 3 blocks).
struct GluShape {
  vk::MatvecShape shape;
  bool subgroup_trees;
  bool every_shape_only;  // only for cases with every_shape
  bool whole;             // the matrix in one part
  std::initializer_list<int64_t> tokens;
};
const GluShape kShapes[] = {
    {{}, true, false, false, {1, 6}},
    {{}, true, true, false, {2}},
    {{}, false, true, false, {1, 6}},
    {{.group = 256, .max_lanes = 32, .min_groups = 1, .max_rows = 2}, true, true, false, {1, 6}},
    {{.group = 32, .max_lanes = 4, .min_groups = 1, .max_rows = 4}, true, true, false, {6}},
    {{.group = 128, .max_lanes = 4, .min_groups = 1, .max_rows = 8}, true, true, true, {1}}};

class VulkanSwiGluCodesTest : public VulkanOpsTest {
 protected:
  // Every case of kCases (all: false: the first one, in the default shape) against the
  // separate ops.
  void CheckCases(bool all);
};

// The shaders without the packed integer dot product (matvec_quant, matvec_quant_sg).
class VulkanSwiGluCodesPlainDotTest : public VulkanSwiGluCodesTest {
 protected:
  bool IntegerDot() const override { return false; }
};

TEST_F(VulkanSwiGluCodesTest, GateUpMatvecQuantizesSwiGluAsTheSeparateOps) { CheckCases(true); }
TEST_F(VulkanSwiGluCodesPlainDotTest, GateUpMatvecQuantizesSwiGluAsTheSeparateOps) { CheckCases(false); }

void VulkanSwiGluCodesTest::CheckCases(bool all) {
  const int64_t n_in = 256;
  auto up = vk::Uploader::Create(*ctx_, 1 << 20);
  ASSERT_TRUE(up.ok());
  const int64_t counter_words = 4096;
  const vk::Buffer counters = Output(counter_words * 4);
  std::mt19937 rng(23);
  for (const GluCase& c : kCases) {
    if (!all && &c != &kCases[0]) continue;
    const int64_t n = c.n_ff, block = c.down == vk::ActKind::kQ8_K ? 256 : 32;
    const std::vector<uint8_t> gate_w = RandomWeights(c.gate_up, n, n_in, rng);
    const std::vector<uint8_t> up_w = RandomWeights(c.gate_up, n, n_in, rng);
    const int64_t row_bytes = RowBytes(c.gate_up, n_in);
    const Matrix gate_m{c.gate_up, n_in, n, row_bytes, gate_w.data()}, up_m{c.gate_up, n_in, n, row_bytes, up_w.data()};
    const Matrix* halves[] = {&gate_m, &up_m};
    // In parts of 100 rows (part boundaries inside blocks and inside workgroups' rows), and whole.
    int64_t total = 0;
    const vk::WeightUploadOptions options{.max_binding_bytes = 100 * row_bytes + 4};
    auto in_parts = vk::UploadStacked(*ctx_, **up, halves, options, total);
    ASSERT_TRUE(in_parts.ok()) << in_parts.status().message();
    ASSERT_GT(in_parts->parts.size(), 2u);
    auto whole = vk::UploadStacked(*ctx_, **up, halves, {.max_binding_bytes = ctx_->limits().max_binding_bytes}, total);
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    ASSERT_EQ(whole->parts.size(), 1u);
    ASSERT_TRUE((*up)->Flush().ok());
    const vk::ActKind in_kind = vk::ActKindFor(c.gate_up);
    for (const int64_t T : {1, 2, 6}) {  // 6: two groups of 4 tokens, the second part full
      std::vector<float> x;
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> row = RandomActivations(n_in, rng);
        x.insert(x.end(), row.begin(), row.end());
      }
      const vk::Buffer xb = Input(x), in_codes = Output(T * n_in), in_aux = Output(T * n_in / 32 * 16);
      ASSERT_TRUE(Run([&](vk::Recorder& rec) {
                    return ops_->QuantizeActs(rec, in_kind, xb, n_in, n_in, T, {&in_codes, &in_aux});
                  }).ok());
      for (const GluShape& s : kShapes) {
        if ((s.every_shape_only && !(c.every_shape && all)) ||
            std::find(s.tokens.begin(), s.tokens.end(), T) == s.tokens.end()) {
          continue;
        }
        const vk::MatvecShape& shape = s.shape;
        const bool trees = s.subgroup_trees;
        const vk::DeviceMatrix* dm = s.whole ? &*whole : &*in_parts;
        ASSERT_TRUE(ops_->set_matvec_shape(shape).ok());
        ops_->set_subgroup_trees(trees);
        SCOPED_TRACE(::testing::Message() << TypeName(c.gate_up) << " -> kind " << static_cast<int>(c.down)
                                          << " n_ff " << n << " T=" << T << " group " << shape.group << " lanes "
                                          << shape.max_lanes << (trees ? " subgroup trees" : "")
                                          << (s.whole ? " whole" : " in parts"));
        ASSERT_TRUE(ops_->FusesSwiGlu(*dm, T, c.down, counter_words));
        const vk::Buffer gate_sep = Output(T * n * 4), up_sep = Output(T * n * 4), hidden = Output(T * n * 4);
        const vk::Buffer codes_sep = Output(T * n), aux_sep = Output(T * n / 32 * 16);
        const vk::Buffer gate_fused = Output(T * n * 4), up_fused = Output(T * n * 4);
        vk::Buffer codes_fused = Output(T * n), aux_fused = Output(T * n / 32 * 16);
        std::memset(codes_fused.mapped(), 0xA5, static_cast<size_t>(codes_fused.bytes()));  // all must be written
        std::memset(aux_fused.mapped(), 0xA5, static_cast<size_t>(aux_fused.bytes()));
        const vk::Ops::SwiGluCodes swiglu{c.down, {&codes_fused, &aux_fused}, &counters, counter_words};
        ASSERT_TRUE(Run([&](vk::Recorder& rec) -> Status {
                      vk::Ops::MatMulArgs a;
                      a.acts = {&in_codes, &in_aux};
                      a.n_tokens = T;
                      a.y = &gate_sep;
                      a.y1 = &up_sep;
                      KVFS_RETURN_IF_ERROR(ops_->MatMul(rec, *dm, a));
                      rec.Barrier();
                      KVFS_RETURN_IF_ERROR(
                          ops_->SwiGluQuantizeActs(rec, c.down, gate_sep, up_sep, n, T, hidden, {&codes_sep, &aux_sep}));
                      a.y = &gate_fused;
                      a.y1 = &up_fused;
                      a.swiglu = &swiglu;
                      return ops_->MatMul(rec, *dm, a);
                    }).ok());
        EXPECT_TRUE(Read<float>(gate_sep, T * n) == Read<float>(gate_fused, T * n));
        EXPECT_TRUE(Read<float>(up_sep, T * n) == Read<float>(up_fused, T * n));
        const std::vector<int8_t> want_codes = Read<int8_t>(codes_sep, T * n);
        ASSERT_TRUE(std::any_of(want_codes.begin(), want_codes.end(), [](int8_t v) { return v != 0; }));
        const std::vector<int8_t> got_codes = Read<int8_t>(codes_fused, T * n);
        int64_t code_diffs = 0;
        for (int64_t b = 0; b < T * n / block; ++b) {
          code_diffs += std::memcmp(want_codes.data() + b * block, got_codes.data() + b * block, block) != 0;
        }
        EXPECT_EQ(code_diffs, 0) << "of " << T * n / block << " blocks";
        EXPECT_EQ(std::memcmp(aux_sep.mapped(), aux_fused.mapped(), static_cast<size_t>(T * n / 32 * 16)), 0);
        const std::vector<uint32_t> left = Read<uint32_t>(counters, counter_words);
        EXPECT_TRUE(std::all_of(left.begin(), left.end(), [](uint32_t v) { return v == 0; }))
            << "counters not left at 0";
      }
    }
    // Where it does not apply: more tokens than the matrix-vector shader takes, too few
    // counters, float codes, workgroups too small for the quantizer, a matrix that is not two
    // halves, halves that are not whole blocks.
    const vk::DeviceMatrix* dm = &*in_parts;
    ASSERT_TRUE(ops_->set_matvec_shape({}).ok());
    EXPECT_FALSE(ops_->FusesSwiGlu(*dm, vk::Ops::kMatvecMaxTokens + 1, c.down, counter_words));
    EXPECT_FALSE(ops_->FusesSwiGlu(*dm, 1, c.down, n / block - 1));
    EXPECT_FALSE(ops_->FusesSwiGlu(*dm, 1, vk::ActKind::kFloat, counter_words));
    ASSERT_TRUE(ops_->set_matvec_shape({.group = 16, .max_lanes = 16}).ok());
    EXPECT_FALSE(ops_->FusesSwiGlu(*dm, 1, c.down, counter_words));
    ASSERT_TRUE(ops_->set_matvec_shape({}).ok());
    auto unstacked = vk::UploadMatrix(*ctx_, **up, gate_m, options, total);
    ASSERT_TRUE(unstacked.ok());
    EXPECT_FALSE(ops_->FusesSwiGlu(*unstacked, 1, c.down, counter_words));
    if (block == 32) {
      EXPECT_FALSE(ops_->FusesSwiGlu(*dm, 1, vk::ActKind::kQ8_K, counter_words));  // 160 rows
    }
    ASSERT_TRUE((*up)->Flush().ok());
  }
}

}  // namespace
}  // namespace kvfs::testing

#endif  // KVFS_VULKAN
