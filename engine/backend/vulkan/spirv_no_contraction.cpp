#include "engine/backend/vulkan/spirv_no_contraction.h"

#include <unordered_set>

namespace kvfs::vk {
namespace {

constexpr uint32_t kMagic = 0x07230203u;
constexpr size_t kHeaderWords = 5;
constexpr uint32_t kOpMemberDecorate = 72, kOpDecorationGroup = 73, kOpFunction = 54;

// Whether op is a float operation a device may fuse with its neighbours.
bool IsContractibleFloatOp(uint32_t op) {
  return op == kSpirvOpFAdd || op == kSpirvOpFSub || op == kSpirvOpFMul || op == kSpirvOpVectorTimesScalar;
}

}  // namespace

std::vector<uint32_t> WithoutContraction(std::span<const uint32_t> words) {
  auto unchanged = [words] { return std::vector<uint32_t>(words.begin(), words.end()); };
  if (words.size() < kHeaderWords || words[0] != kMagic) return unchanged();
  // One pass: where the annotations start, which ids are decorated already, which need it.
  size_t first_annotation = 0, first_function = 0;
  std::unordered_set<uint32_t> decorated;
  std::vector<uint32_t> results;
  for (size_t at = kHeaderWords; at < words.size();) {
    const uint32_t op = words[at] & 0xFFFFu, count = words[at] >> 16;
    if (count == 0 || at + count > words.size()) return unchanged();
    const bool annotation = op == kSpirvOpDecorate || op == kOpMemberDecorate || op == kOpDecorationGroup;
    if (annotation && first_annotation == 0) first_annotation = at;
    if (op == kOpFunction && first_function == 0) first_function = at;
    if (op == kSpirvOpDecorate && count >= 3 && words[at + 2] == kSpirvDecorationNoContraction) {
      decorated.insert(words[at + 1]);
    }
    // Float ops before the first function are OpSpecConstantOp's operands, not instructions.
    if (first_function != 0 && IsContractibleFloatOp(op) && count >= 4) results.push_back(words[at + 2]);
    at += count;
  }
  // A module has decorations (its bindings) before any function; without them, before the
  // first function would be wrong (types come first), so leave it to the device.
  if (first_annotation == 0 || (first_function != 0 && first_annotation > first_function)) return unchanged();
  std::vector<uint32_t> out;
  out.reserve(words.size() + 3 * results.size());
  out.insert(out.end(), words.begin(), words.begin() + static_cast<std::ptrdiff_t>(first_annotation));
  for (const uint32_t id : results) {
    if (!decorated.insert(id).second) continue;
    out.insert(out.end(), {(3u << 16) | kSpirvOpDecorate, id, kSpirvDecorationNoContraction});
  }
  out.insert(out.end(), words.begin() + static_cast<std::ptrdiff_t>(first_annotation), words.end());
  return out;
}

}  // namespace kvfs::vk
