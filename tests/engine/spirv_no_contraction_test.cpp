// The modules the pipelines are made from round every float multiply and add as the CPU does
// (engine/backend/vulkan/spirv_no_contraction.h): each such result of every embedded shader is
// decorated NoContraction, and nothing else of the module changes. Read from the embedded
// SPIR-V alone, against a parse of our own; the Vulkan tests then make every pipeline from
// these modules (on lavapipe in CI), which checks that the driver takes them.
#include <gtest/gtest.h>

#if defined(KVFS_VULKAN)

#include <cstdint>
#include <set>
#include <vector>

#include "engine/backend/vulkan/spirv_no_contraction.h"
#include "engine/backend/vulkan/vk_pipelines.h"

namespace kvfs {
namespace {

constexpr uint32_t kOpFunction = 54, kOpDecorate = 71;

struct Parsed {
  std::vector<std::vector<uint32_t>> instructions;  // each instruction's words, in order
  std::set<uint32_t> no_contraction;                // ids decorated NoContraction
  std::vector<uint32_t> float_results;              // results of fusable float ops in functions
};

Parsed Parse(const std::vector<uint32_t>& words) {
  Parsed p;
  bool in_functions = false;
  for (size_t at = 5; at < words.size();) {
    const uint32_t op = words[at] & 0xFFFFu, count = words[at] >> 16;
    if (count == 0 || at + count > words.size()) {
      ADD_FAILURE() << "malformed instruction at word " << at;
      break;
    }
    p.instructions.emplace_back(words.begin() + static_cast<std::ptrdiff_t>(at),
                                words.begin() + static_cast<std::ptrdiff_t>(at + count));
    in_functions |= op == kOpFunction;
    if (op == kOpDecorate && count >= 3 && words[at + 2] == vk::kSpirvDecorationNoContraction) {
      p.no_contraction.insert(words[at + 1]);
    }
    if (in_functions && (op == vk::kSpirvOpFAdd || op == vk::kSpirvOpFSub || op == vk::kSpirvOpFMul ||
                         op == vk::kSpirvOpVectorTimesScalar)) {
      p.float_results.push_back(words[at + 2]);
    }
    at += count;
  }
  return p;
}

bool IsNoContraction(const std::vector<uint32_t>& instruction) {
  return instruction.size() == 3 && (instruction[0] & 0xFFFFu) == kOpDecorate &&
         instruction[2] == vk::kSpirvDecorationNoContraction;
}

TEST(SpirvNoContraction, EveryFloatMultiplyAndAddOfEveryShaderRoundsAsWritten) {
  ASSERT_FALSE(vk::EmbeddedShaders().empty());
  size_t float_ops = 0;
  for (const vk::EmbeddedShader& shader : vk::EmbeddedShaders()) {
    const std::vector<uint32_t> before(shader.words, shader.words + shader.n_words);
    const std::vector<uint32_t> after = vk::WithoutContraction(before);
    ASSERT_TRUE(std::equal(before.begin(), before.begin() + 5, after.begin())) << shader.name << ": header";
    const Parsed a = Parse(before), b = Parse(after);
    for (const uint32_t id : b.float_results) {
      EXPECT_TRUE(b.no_contraction.count(id)) << shader.name << ": float op %" << id << " left to fuse";
    }
    EXPECT_EQ(a.float_results, b.float_results) << shader.name;
    float_ops += b.float_results.size();
    // The module is the old one with NoContraction decorations added (one per id, none twice)
    // and none of the old instructions moved relative to each other.
    std::vector<std::vector<uint32_t>> kept;
    size_t added = 0;
    std::set<uint32_t> added_ids;
    for (const auto& instruction : b.instructions) {
      if (IsNoContraction(instruction) && !a.no_contraction.count(instruction[1])) {
        ++added;
        EXPECT_TRUE(added_ids.insert(instruction[1]).second) << shader.name << ": %" << instruction[1] << " twice";
      } else {
        kept.push_back(instruction);
      }
    }
    EXPECT_EQ(kept, a.instructions) << shader.name;
    EXPECT_EQ(after.size(), before.size() + 3 * added) << shader.name;
  }
  EXPECT_GT(float_ops, 300u) << "the shaders' float arithmetic was not seen";
}

// A module it cannot place decorations in, or cannot parse, comes back as it was.
TEST(SpirvNoContraction, LeavesWhatItCannotParseAlone) {
  const std::vector<uint32_t> not_spirv = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(vk::WithoutContraction(not_spirv), not_spirv);
  const vk::EmbeddedShader& shader = vk::EmbeddedShaders().front();
  std::vector<uint32_t> truncated(shader.words, shader.words + shader.n_words);
  truncated[truncated.size() - 1] = (50u << 16) | 1;  // an instruction past the end
  EXPECT_EQ(vk::WithoutContraction(truncated), truncated);
  std::vector<uint32_t> zero_count(shader.words, shader.words + shader.n_words);
  zero_count[5] = 0;
  EXPECT_EQ(vk::WithoutContraction(zero_count), zero_count);
}

}  // namespace
}  // namespace kvfs

#endif  // KVFS_VULKAN
