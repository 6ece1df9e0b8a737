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
  std::vector<uint32_t> constants;  // its specialization constants (ids 0..)
  bool clocked = false;  // the NAME_clock variant: binds the phase clock's set 1 (phase_clock.h)
};

// One number the driver's compiler reports about a pipeline (VK_KHR_pipeline_executable_properties),
// in its own words: e.g. RADV's "VGPRs", "Subgroups per SIMD", "Spilled VGPRs".
struct PipelineStatistic {
  std::string name;
  std::string description;
  double value = 0;  // integers, floats and booleans (0/1) alike
};

class PipelineCache {
 public:
  // capture_statistics: the device was made with VK_KHR_pipeline_executable_properties
  // (Context::captures_statistics()); pipelines then keep their statistics for Statistics().
  // contract_floats: the modules as compiled, the device free to fuse a * b + c into one
  // rounding; off, every float multiply and add rounds as the CPU's (spirv_no_contraction.h).
  // phase_clock: shaders that have a NAME_clock variant are made from it (the context must have
  // Context::phase_clock()); their layouts add set 1, the clock's region (clock_set_layout()).
  explicit PipelineCache(VkDevice device, bool capture_statistics = false, bool contract_floats = false,
                         bool phase_clock = false)
      : device_(device), capture_statistics_(capture_statistics), contract_floats_(contract_floats),
        phase_clock_(phase_clock) {}
  ~PipelineCache();
  PipelineCache(const PipelineCache&) = delete;
  PipelineCache& operator=(const PipelineCache&) = delete;

  static constexpr size_t kMaxConstants = 12;
  // The pipeline of `shader` specialized with `constants` (ids 0..n-1, at most kMaxConstants).
  // Called for every dispatch: a lookup allocates nothing.
  Result<const Pipeline*> Get(const ShaderInterface& shader, std::span<const uint32_t> constants);
  // The compiler's statistics of a pipeline made by this cache (of its one executable, the
  // compute shader). Unsupported unless made with capture_statistics.
  Result<std::vector<PipelineStatistic>> Statistics(const Pipeline& pipeline) const;
  bool captures_statistics() const { return capture_statistics_; }
  // Set 1 of the clocked pipelines: one dynamic storage buffer (made on first use; null before).
  VkDescriptorSetLayout clock_set_layout() const { return clock_set_layout_; }
  // Makes clock_set_layout() now (a Recorder needs it before any clocked pipeline exists).
  Status PrepareClockSetLayout();
  // Pipelines made so far.
  int64_t size() const { return made_; }

 private:
  // Specialization constants, unused ones zero, and how many there are.
  using ConstantsKey = std::pair<std::array<uint32_t, kMaxConstants>, size_t>;
  struct ShaderState {
    VkShaderModule module = VK_NULL_HANDLE;
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    bool clocked = false;
    std::map<ConstantsKey, std::unique_ptr<Pipeline>> pipelines;
  };
  Result<ShaderState*> Shader(const ShaderInterface& shader);

  VkDevice device_;
  bool capture_statistics_;
  bool contract_floats_;
  bool phase_clock_;
  VkDescriptorSetLayout clock_set_layout_ = VK_NULL_HANDLE;
  int64_t made_ = 0;
  std::map<std::string, ShaderState, std::less<>> shaders_;
};

}  // namespace kvfs::vk
