// Compute pipelines made from the SPIR-V embedded at build time (shaders/*.comp, compiled by
// glslangValidator; see shaders.cmake). A shader is specialized with a vector of
// specialization constants (ids 0, 1, 2, ... in order: workgroup size, weight or KV type,
// tile sizes), never compiled in generated variants; each (shader, constants) pipeline is
// made once, on first use, and kept.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace kvfs::vk {

struct EmbeddedShader {
  std::string_view name;  // the .comp file's name without extension
  const uint32_t* words;
  size_t n_words;
};
// Every shader of shaders/ (the generated vk_shaders.cpp).
std::span<const EmbeddedShader> EmbeddedShaders();

// What a shader needs bound: storage buffers at bindings 0 .. n_buffers-1 of set 0, and a
// push-constant block of push_bytes.
struct ShaderInterface {
  std::string_view name;
  uint32_t n_buffers;
  uint32_t push_bytes;
};

struct Pipeline {
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t n_buffers = 0;
  uint32_t push_bytes = 0;
  std::string_view name;  // the shader's (profiles name dispatches by it)
};

class PipelineCache {
 public:
  explicit PipelineCache(VkDevice device) : device_(device) {}
  ~PipelineCache();
  PipelineCache(const PipelineCache&) = delete;
  PipelineCache& operator=(const PipelineCache&) = delete;

  static constexpr size_t kMaxConstants = 12;
  // The pipeline of `shader` specialized with `constants` (ids 0..n-1, at most kMaxConstants).
  // Called for every dispatch: a lookup allocates nothing.
  Result<const Pipeline*> Get(const ShaderInterface& shader, std::span<const uint32_t> constants);

 private:
  // Specialization constants, unused ones zero, and how many there are.
  using ConstantsKey = std::pair<std::array<uint32_t, kMaxConstants>, size_t>;
  struct ShaderState {
    VkShaderModule module = VK_NULL_HANDLE;
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    std::map<ConstantsKey, std::unique_ptr<Pipeline>> pipelines;
  };
  Result<ShaderState*> Shader(const ShaderInterface& shader);

  VkDevice device_;
  std::map<std::string, ShaderState, std::less<>> shaders_;
};

}  // namespace kvfs::vk
