#include "engine/backend/vulkan/vk_pipelines.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "engine/backend/vulkan/spirv_no_contraction.h"
#include "engine/backend/vulkan/vk_context.h"

namespace kvfs::vk {

PipelineCache::~PipelineCache() {
  for (auto& [name, s] : shaders_) {
    for (auto& [key, p] : s.pipelines) vkDestroyPipeline(device_, p->pipeline, nullptr);
    if (s.layout != VK_NULL_HANDLE) vkDestroyPipelineLayout(device_, s.layout, nullptr);
    if (s.set_layout != VK_NULL_HANDLE) vkDestroyDescriptorSetLayout(device_, s.set_layout, nullptr);
    if (s.module != VK_NULL_HANDLE) vkDestroyShaderModule(device_, s.module, nullptr);
  }
  if (clock_set_layout_ != VK_NULL_HANDLE) vkDestroyDescriptorSetLayout(device_, clock_set_layout_, nullptr);
}

Status PipelineCache::PrepareClockSetLayout() {
  if (clock_set_layout_ != VK_NULL_HANDLE) return Status::Ok();
  const VkDescriptorSetLayoutBinding binding{0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC, 1,
                                             VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  info.bindingCount = 1;
  info.pBindings = &binding;
  const VkResult r = vkCreateDescriptorSetLayout(device_, &info, nullptr, &clock_set_layout_);
  if (r != VK_SUCCESS) return VkError("vkCreateDescriptorSetLayout (phase clock)", r);
  return Status::Ok();
}

Result<PipelineCache::ShaderState*> PipelineCache::Shader(const ShaderInterface& shader) {
  if (auto it = shaders_.find(shader.name); it != shaders_.end()) return &it->second;
  const EmbeddedShader* code = nullptr;
  const EmbeddedShader* clocked = nullptr;  // its NAME_clock variant
  const std::string clocked_name = std::string(shader.name) + "_clock";
  for (const EmbeddedShader& s : EmbeddedShaders()) {
    if (s.name == shader.name) code = &s;
    if (s.name == clocked_name) clocked = &s;
  }
  if (code == nullptr) return Internal(fmt::format("shader {} is not embedded in this build", shader.name));
  if (phase_clock_ && clocked != nullptr) {
    KVFS_RETURN_IF_ERROR(PrepareClockSetLayout());
    code = clocked;
  }
  ShaderState& state = shaders_[std::string(shader.name)];
  state.clocked = code == clocked;

  std::span<const uint32_t> words(code->words, code->n_words);
  std::vector<uint32_t> rounded_as_written;  // the module with NoContraction (kept until made)
  if (!contract_floats_) {
    rounded_as_written = WithoutContraction(words);
    words = rounded_as_written;
  }
  VkShaderModuleCreateInfo module_info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  module_info.codeSize = words.size_bytes();
  module_info.pCode = words.data();
  VkResult r = vkCreateShaderModule(device_, &module_info, nullptr, &state.module);
  if (r != VK_SUCCESS) return VkError(fmt::format("vkCreateShaderModule({})", shader.name), r);

  std::vector<VkDescriptorSetLayoutBinding> bindings(shader.n_buffers);
  for (uint32_t i = 0; i < shader.n_buffers; ++i) {
    bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  VkDescriptorSetLayoutCreateInfo set_info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  set_info.bindingCount = shader.n_buffers;
  set_info.pBindings = bindings.data();
  r = vkCreateDescriptorSetLayout(device_, &set_info, nullptr, &state.set_layout);
  if (r != VK_SUCCESS) return VkError("vkCreateDescriptorSetLayout", r);

  const VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, shader.push_bytes};
  VkPipelineLayoutCreateInfo layout_info{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  const VkDescriptorSetLayout set_layouts[2] = {state.set_layout, clock_set_layout_};
  layout_info.setLayoutCount = state.clocked ? 2 : 1;
  layout_info.pSetLayouts = set_layouts;
  layout_info.pushConstantRangeCount = shader.push_bytes > 0 ? 1 : 0;
  layout_info.pPushConstantRanges = &push;
  r = vkCreatePipelineLayout(device_, &layout_info, nullptr, &state.layout);
  if (r != VK_SUCCESS) return VkError("vkCreatePipelineLayout", r);
  return &state;
}

Result<const Pipeline*> PipelineCache::Get(const ShaderInterface& shader, std::span<const uint32_t> constants) {
  if (constants.size() > kMaxConstants) {
    return Internal(fmt::format("{} specialization constants for {}; at most {}", constants.size(), shader.name,
                                kMaxConstants));
  }
  KVFS_ASSIGN_OR_RETURN(ShaderState * state, Shader(shader));
  ConstantsKey key{{}, constants.size()};
  std::copy(constants.begin(), constants.end(), key.first.begin());
  if (auto it = state->pipelines.find(key); it != state->pipelines.end()) return it->second.get();

  std::vector<VkSpecializationMapEntry> entries(constants.size());
  for (uint32_t i = 0; i < constants.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo spec{static_cast<uint32_t>(entries.size()), entries.data(), constants.size() * 4u,
                            key.first.data()};
  VkComputePipelineCreateInfo info{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  info.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  info.stage.module = state->module;
  info.stage.pName = "main";
  info.stage.pSpecializationInfo = &spec;
  info.layout = state->layout;
  if (capture_statistics_) info.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  auto p = std::make_unique<Pipeline>();
  const VkResult r = vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &info, nullptr, &p->pipeline);
  if (r != VK_SUCCESS) return VkError(fmt::format("creating the {} pipeline", shader.name), r);
  p->layout = state->layout;
  p->set_layout = state->set_layout;
  p->n_buffers = shader.n_buffers;
  p->push_bytes = shader.push_bytes;
  p->name = shader.name;
  p->constants.assign(constants.begin(), constants.end());
  p->clocked = state->clocked;
  const Pipeline* out = p.get();
  spdlog::debug("vulkan: made the {} pipeline {}", shader.name, fmt::join(out->constants, ","));
  state->pipelines.emplace(std::move(key), std::move(p));
  ++made_;
  return out;
}

Result<std::vector<PipelineStatistic>> PipelineCache::Statistics(const Pipeline& pipeline) const {
  if (!capture_statistics_) return Unsupported("pipeline statistics were not asked for (or the device lacks them)");
  // Extension entry points: the loader does not export them, the device hands them out.
  const auto properties = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device_, "vkGetPipelineExecutablePropertiesKHR"));
  const auto statistics = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device_, "vkGetPipelineExecutableStatisticsKHR"));
  if (properties == nullptr || statistics == nullptr) {
    return Unsupported("the device does not hand out VK_KHR_pipeline_executable_properties' functions");
  }
  VkPipelineInfoKHR info{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  info.pipeline = pipeline.pipeline;
  uint32_t n_executables = 0;
  VkResult r = properties(device_, &info, &n_executables, nullptr);
  if (r != VK_SUCCESS) return VkError("vkGetPipelineExecutablePropertiesKHR", r);
  std::vector<PipelineStatistic> out;
  for (uint32_t e = 0; e < n_executables; ++e) {
    VkPipelineExecutableInfoKHR executable{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    executable.pipeline = pipeline.pipeline;
    executable.executableIndex = e;
    uint32_t n = 0;
    r = statistics(device_, &executable, &n, nullptr);
    if (r != VK_SUCCESS) return VkError("vkGetPipelineExecutableStatisticsKHR", r);
    std::vector<VkPipelineExecutableStatisticKHR> stats(n, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    r = statistics(device_, &executable, &n, stats.data());
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return VkError("vkGetPipelineExecutableStatisticsKHR", r);
    for (uint32_t i = 0; i < n; ++i) {
      const VkPipelineExecutableStatisticKHR& s = stats[i];
      double value = 0;
      switch (s.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: value = s.value.b32 ? 1 : 0; break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: value = static_cast<double>(s.value.i64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: value = static_cast<double>(s.value.u64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: value = s.value.f64; break;
        default: continue;
      }
      out.push_back({s.name, s.description, value});
    }
  }
  return out;
}

}  // namespace kvfs::vk
