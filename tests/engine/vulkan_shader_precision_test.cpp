// The shaders compute the CPU's bits on any device: Vulkan leaves a shader's float division
// (2.5 ulp), square root and transcendental functions to the implementation, and lavapipe,
// where CI runs them, happens to round them exactly. On an NVIDIA H200 the softmax's 1 / sum
// was an ulp off in some rows, which moved f16-rounded and int8-coded attention weights (logits
// NMSE 1e-6 to 1e-4 against the CPU, a golden test over its bound). So every shader's SPIR-V is
// read here: a float division only inside common.glsl's exact Div (the estimates of the
// significands' quotient that it corrects, and its fallback for zeros, infinities and
// subnormals), a square root only inside its correctly rounded SqrtRounded (an
// H200 still differed from lavapipe with every float op rounded as written: the square root of
// RMSNorm's scale was the one instruction left to the device), no exp, log, pow,
// trigonometric or vector-length function, no float packing (its rounding is the
// implementation's), no OpDot (its order is).
// fma is allowed: the CPU's ExpPoly uses std::fma, and every GPU fuses it (Vulkan would let a
// device round the product first). No device needed: the embedded SPIR-V is all it reads.
#include <gtest/gtest.h>

#if defined(KVFS_VULKAN)

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/backend/vulkan/vk_pipelines.h"

namespace kvfs {
namespace {

// SPIR-V opcodes and GLSL.std.450 instruction numbers (SPIR-V 1.0 and the extended
// instruction set's specification).
constexpr uint32_t kOpExtInstImport = 11, kOpExtInst = 12, kOpName = 5, kOpFunction = 54, kOpFunctionEnd = 56;
constexpr uint32_t kOpFDiv = 136, kOpFRem = 140, kOpFMod = 141, kOpDot = 148;
constexpr uint32_t kGlslSqrt = 31;

std::string GlslName(uint32_t op) {
  static const std::map<uint32_t, std::string> kNames = {
      {13, "Sin"},  {14, "Cos"},  {15, "Tan"},   {16, "Asin"}, {17, "Acos"}, {18, "Atan"},  {19, "Sinh"},
      {20, "Cosh"}, {21, "Tanh"}, {22, "Asinh"}, {23, "Acosh"}, {24, "Atanh"}, {25, "Atan2"}, {26, "Pow"},
      {27, "Exp"},  {28, "Log"},  {29, "Exp2"},  {30, "Log2"}, {31, "Sqrt"}, {32, "InverseSqrt"},
      {54, "PackSnorm4x8"}, {55, "PackUnorm4x8"}, {56, "PackSnorm2x16"}, {57, "PackUnorm2x16"},
      {58, "PackHalf2x16"}, {66, "Length"}, {67, "Distance"}, {69, "Normalize"}};
  const auto it = kNames.find(op);
  return it == kNames.end() ? std::string() : it->second;
}

// What one pass over a module's instructions found: each device-rounded instruction, as
// "function: instruction", and how many divisions (all, Div's included) and square roots in
// SqrtRounded it saw, so that the test knows it sees instructions at all.
struct Scan {
  std::vector<std::string> found;
  int divisions = 0, allowed_sqrts = 0;
};

Scan DeviceRounded(const vk::EmbeddedShader& shader) {
  Scan scan;
  std::vector<std::string>& found = scan.found;
  std::map<uint32_t, std::string> names;
  uint32_t glsl_set = 0, function = 0;
  for (size_t at = 5; at < shader.n_words;) {  // after the 5-word header
    const uint32_t word = shader.words[at], op = word & 0xFFFFu, count = word >> 16;
    EXPECT_GT(count, 0u) << shader.name << ": malformed instruction at word " << at;
    if (count == 0 || at + count > shader.n_words) break;
    const uint32_t* w = shader.words + at;
    if (op == kOpName) names[w[1]] = reinterpret_cast<const char*>(w + 2);
    if (op == kOpExtInstImport && std::string(reinterpret_cast<const char*>(w + 2)) == "GLSL.std.450") glsl_set = w[1];
    if (op == kOpFunction) function = w[2];
    if (op == kOpFunctionEnd) function = 0;
    const std::string where = names.count(function) ? names[function] : std::string("?");
    scan.divisions += op == kOpFDiv;
    if (op == kOpFDiv || op == kOpFRem || op == kOpFMod) {
      const bool in_div = where.rfind("Div(", 0) == 0 || where.rfind("DivQuotient(", 0) == 0;
      if (!in_div) found.push_back(where + ": a float division");
    }
    if (op == kOpDot) found.push_back(where + ": a dot product");
    if (op == kOpExtInst && w[3] == glsl_set && !GlslName(w[4]).empty()) {
      const bool rms_scale_sqrt = w[4] == kGlslSqrt && where.rfind("SqrtRounded(", 0) == 0;
      if (!rms_scale_sqrt) found.push_back(where + ": " + GlslName(w[4]));
      scan.allowed_sqrts += rms_scale_sqrt;
    }
    at += count;
  }
  return scan;
}

TEST(VulkanShaderPrecision, NoShaderLeavesARoundingToTheDevice) {
  ASSERT_FALSE(vk::EmbeddedShaders().empty());
  int checked_divisions = 0, allowed_sqrts = 0;
  for (const vk::EmbeddedShader& shader : vk::EmbeddedShaders()) {
    ASSERT_GE(shader.n_words, 5u) << shader.name;
    ASSERT_EQ(shader.words[0], 0x07230203u) << shader.name << ": not SPIR-V";
    const Scan scan = DeviceRounded(shader);
    for (const std::string& what : scan.found) ADD_FAILURE() << shader.name << " rounds on the device: " << what;
    checked_divisions += scan.divisions;
    allowed_sqrts += scan.allowed_sqrts;
  }
  // The check sees what it looks for (Div's fallback divides; SqrtRounded starts from the
  // device's square root): a parse that missed instructions or the GLSL.std.450 import would pass vacuously.
  // (Stripped function names would fail it: every division would be outside Div.)
  EXPECT_GT(checked_divisions, 0);
  EXPECT_GT(allowed_sqrts, 0);
}

}  // namespace
}  // namespace kvfs

#endif  // KVFS_VULKAN
