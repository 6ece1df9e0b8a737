// SPIR-V's float arithmetic is the device's to fuse: without the NoContraction decoration a
// compiler may turn a * b + c into one fma, rounding once where the CPU (built with
// -ffp-contract=off) rounds twice. NVIDIA's compiler does, lavapipe's does not, so a pass on an
// H200 differed from the CPU's in the last bits of its float sums, which moved int8 activation
// codes and f16-rounded attention weights (logits NMSE 1e-6 to 1e-4, a golden test over its
// bound) while lavapipe matched the CPU bit for bit. The pipelines are made from modules with
// every float multiply, add and subtract decorated NoContraction, unless asked to leave the
// device free to fuse (VulkanOptions::contract_floats). Explicit fma() calls stay fused.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvfs::vk {

// SPIR-V's opcodes and decoration for this (the SPIR-V specification, sections 3.32, 3.20).
inline constexpr uint32_t kSpirvOpDecorate = 71;
inline constexpr uint32_t kSpirvOpFAdd = 129, kSpirvOpFSub = 131, kSpirvOpFMul = 133;
inline constexpr uint32_t kSpirvOpVectorTimesScalar = 142;
inline constexpr uint32_t kSpirvDecorationNoContraction = 42;

// `words` (a whole module, header included) with an OpDecorate NoContraction for the result of
// every contractible float operation inside its functions that has none yet, inserted at the
// start of the annotations (before the module's first decoration). A module that does not
// parse as SPIR-V is returned unchanged (vkCreateShaderModule then reports it).
std::vector<uint32_t> WithoutContraction(std::span<const uint32_t> words);

}  // namespace kvfs::vk
