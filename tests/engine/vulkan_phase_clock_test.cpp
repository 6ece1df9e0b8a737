// Phase clocks (engine/backend/vulkan/phase_clock.h, kvfs bench --phases): the NAME_clock
// variants of the decode path's shaders compute exactly what the plain ones compute (a prompt
// and decode steps give the same logits bit for bit, q4k and q4 KV), and the profile then has a
// block for each clocked shader with the host's names of its marks, a positive span, and, in
// decode, every recorded workgroup at the shader's last mark. lavapipe, where CI runs this, has the clocks (VK_KHR_shader_clock).
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/engine/vulkan_backend_fixture.h"

#if defined(KVFS_VULKAN)
#include "engine/backend/vulkan/phase_clock.h"
#endif

namespace kvfs::testing {
namespace {

#if defined(KVFS_VULKAN)

// The report's block of a clocked shader (its first pipeline of that name): the header line and
// the mark lines under it.
struct ShaderBlock {
  std::string header;
  std::vector<std::pair<int, std::string>> marks;  // (number, line)
};

std::vector<ShaderBlock> BlocksOf(const std::string& report, const std::string& shader) {
  std::vector<ShaderBlock> blocks;
  std::istringstream in(report.substr(report.find("phase clocks:")));
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("  ", 0) == 0) {
      if (inside) blocks.back().marks.emplace_back(std::atoi(line.c_str()), line);
      continue;
    }
    // "<pipeline name> [constants]: ..." where the name is the shader's or a variant of it.
    inside = line.rfind(shader, 0) == 0 && (line[shader.size()] == ' ' || line[shader.size()] == '_');
    if (inside) blocks.push_back({line, {}});
  }
  return blocks;
}

TEST_F(VulkanBackendTest, PhaseClocksChangeNoLogitAndMarkEveryShortShader) {
  VulkanOptions options;
  options.tuning.attention_split = VulkanTuning::kDefaultAttentionSplit;
  options.profile = true;
  options.phase_clock = true;
  auto clocked = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(clocked.ok()) << clocked.status().message();
  for (const char* kv : {"q4k", "q4"}) {
    SCOPED_TRACE(kv);
    SequenceKv plain_kv(Layout(kv, 64), 256), clocked_kv(Layout(kv, 64), 256);
    EXPECT_EQ(Step(*vulkan_, plain_kv, prompt_), Step(**clocked, clocked_kv, prompt_));
    (*clocked)->TakeProfileReport();  // the decode steps' alone
    for (const TokenId t : {TokenId{5}, TokenId{17}, TokenId{100}}) {
      EXPECT_EQ(Step(*vulkan_, plain_kv, std::span<const TokenId>(&t, 1)),
                Step(**clocked, clocked_kv, std::span<const TokenId>(&t, 1)));
    }
    const std::string report = (*clocked)->TakeProfileReport();
    if (report.find("phase clocks:") == std::string::npos) {
      if (InCi()) FAIL() << "no phase clocks on CI's device (lavapipe has them)";
      GTEST_SKIP() << "the Vulkan device has no shader clocks";
    }
    for (const std::string shader : {"kv_store", "attn_scores", "attn_output", "quantize_act", "matvec_quant"}) {
      SCOPED_TRACE(shader);
      const std::vector<ShaderBlock> blocks = BlocksOf(report, shader);
      ASSERT_FALSE(blocks.empty()) << report;
      const std::vector<std::string>& names = vk::PhaseClock::MarkNames(shader);
      for (const ShaderBlock& b : blocks) {
        EXPECT_EQ(b.header.find("span 0.00 us"), std::string::npos) << b.header;
        ASSERT_GE(b.marks.size(), 2u) << b.header;  // at least a mark after the start, and the end
        for (const auto& [k, line] : b.marks) {
          ASSERT_LT(static_cast<size_t>(k), names.size()) << line;
          EXPECT_NE(line.find(names[k]), std::string::npos) << line;
        }
        // In decode every workgroup of these shaders reaches its last mark (one attention split:
        // the contexts are shorter than it): the last line counts every recorded workgroup.
        const int64_t dispatches = std::atoll(b.header.c_str() + b.header.find("]: ") + 3);
        const int64_t recorded = std::atoll(b.header.c_str() + b.header.find(" (") + 2);
        const auto& [last, last_line] = b.marks.back();
        EXPECT_EQ(last, static_cast<int>(names.size()) - 1) << last_line;
        const size_t count_end = last_line.find(" workgroups  median");
        ASSERT_NE(count_end, std::string::npos) << last_line;
        const int64_t reached = std::atoll(last_line.c_str() + last_line.rfind(' ', count_end - 1) + 1);
        EXPECT_EQ(reached, dispatches * recorded) << b.header << "\n" << last_line;
      }
    }
    // kv_store's q4k rows mark the candidate search; q4 rows do not go there.
    const std::vector<ShaderBlock> stores = BlocksOf(report, "kv_store");
    bool searched = false;
    for (const ShaderBlock& b : stores) {
      for (const auto& [k, line] : b.marks) searched = searched || k == 7;  // candidates chosen
    }
    EXPECT_EQ(searched, std::string(kv) == "q4k");
    std::printf("[vulkan phases] kv %s:\n%s", kv, report.substr(report.find("phase clocks:")).c_str());
  }
}

// With the norms inside the matrices (VulkanMatvecShape::norm_group), the decode step's
// matrix-vector blocks that make them mark the prologue (mark 1), the others do not reach it.
TEST_F(VulkanBackendTest, PhaseClocksMarkTheNormPrologue) {
  VulkanOptions options;
  options.profile = true;
  options.phase_clock = true;
  options.tuning.matvec.norm_group = 256;
  auto clocked = MakeVulkanBackend(*model_, options);
  ASSERT_TRUE(clocked.ok()) << clocked.status().message();
  SequenceKv kv(Layout("q4k", 64), 256);
  Step(**clocked, kv, prompt_);
  (*clocked)->TakeProfileReport();
  const TokenId t = 5;
  Step(**clocked, kv, std::span<const TokenId>(&t, 1));
  const std::string report = (*clocked)->TakeProfileReport();
  if (report.find("phase clocks:") == std::string::npos) {
    if (InCi()) FAIL() << "no phase clocks on CI's device (lavapipe has them)";
    GTEST_SKIP() << "the Vulkan device has no shader clocks";
  }
  int with_prologue = 0, without = 0;
  for (const ShaderBlock& b : BlocksOf(report, "matvec_quant")) {
    bool marked = false;
    for (const auto& [k, line] : b.marks) {
      if (k != 1) continue;
      marked = true;
      EXPECT_NE(line.find("norm prologue"), std::string::npos) << line;
    }
    ++(marked ? with_prologue : without);
  }
  // q|k|v, gate|up and the output make their norms; o and down do not.
  EXPECT_GT(with_prologue, 0) << report;
  EXPECT_GT(without, 0) << report;
}

#endif  // KVFS_VULKAN

}  // namespace
}  // namespace kvfs::testing
