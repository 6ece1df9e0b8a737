#include "engine/backend/vulkan/phase_clock.h"

#include <algorithm>
#include <cstring>

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include "engine/backend/vulkan/vk_ops_common.h"

namespace kvfs::vk {
namespace {

// Samples kept per pipeline and mark (the first ones): enough for medians of a bench run.
constexpr size_t kMaxSamples = 1 << 18;

// The value at fraction q of the sorted samples (q = 0.5: the median).
double Quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t at = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
  return v[at];
}

// The shader's base name: without the variant suffixes (_idot, _sg).
std::string_view BaseName(std::string_view name) {
  for (std::string_view suffix : {"_sg", "_idot"}) {
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      name.remove_suffix(suffix.size());
    }
  }
  return name;
}

}  // namespace

const std::vector<std::string>& PhaseClock::MarkNames(std::string_view shader) {
  // The MarkPhase(k) calls of each shader, in order (keep in step with the .comp files).
  static const std::map<std::string, std::vector<std::string>, std::less<>> kMarkNames = {
      {"kv_store",
       {"start", "row loaded", "RoPE", "Hadamard", "q4k: sub-block ranges", "q4k: M, spans", "q4k: D, first scales",
        "q4k: candidates chosen", "encoded", "stored"}},
      {"attn_scores",
       {"start", "call loaded", "queries loaded", "queries prepared", "new keys staged", "q4k: chunk prepared",
        "scores computed", "scores stored", "stats: max", "stats: sum", "stats stored"}},
      {"attn_output",
       {"start", "call loaded", "fused: raw scores", "fused: row max", "fused: sum folds", "fused: 1 / L",
        "weights ready", "weighted sums", "lanes added", "partials out, counted", "splits added", "Hadamard",
        "stored"}},
      {"quantize_act", {"start", "norm scale", "quantized"}},
      {"matvec_quant", {"start", "norm prologue", "dot products", "tree, stored", "SwiGLU epilogue"}},
  };
  static const std::vector<std::string> kNone;
  const auto it = kMarkNames.find(BaseName(shader));
  return it == kMarkNames.end() ? kNone : it->second;
}

bool PhaseClock::Usable(const Context& ctx) {
  return ctx.phase_clock() && ctx.limits().max_storage_buffers > ops_detail::kMostStorageBuffers;
}

Result<std::unique_ptr<PhaseClock>> PhaseClock::Create(Context& ctx, VkDescriptorSetLayout layout,
                                                       const Options& options) {
  if (!Usable(ctx)) {
    return Unsupported("the Vulkan device has no shader clocks (VK_KHR_shader_clock) or no storage buffer to spare for them");
  }
  if (layout == VK_NULL_HANDLE) return Internal("the pipeline cache was made without phase clocks");
  if (options.max_dispatches < 1 || options.max_workgroups < 1) return InvalidArgument("phase clock sizes must be positive");
  std::unique_ptr<PhaseClock> clock(new PhaseClock(ctx, options));
  clock->region_bytes_ = options.max_workgroups * kMarks * kMarkBytes;
  const int64_t bytes = (options.max_dispatches + 1) * clock->region_bytes_;
  KVFS_ASSIGN_OR_RETURN(clock->marks_, ctx.CreateBuffer(bytes, MemoryKind::kReadback));
  std::memset(clock->marks_.mapped(), 0, static_cast<size_t>(bytes));

  const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC, 1};
  VkDescriptorPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pool_info.maxSets = 1;
  pool_info.poolSizeCount = 1;
  pool_info.pPoolSizes = &size;
  VkResult r = vkCreateDescriptorPool(ctx.device(), &pool_info, nullptr, &clock->pool_);
  if (r != VK_SUCCESS) return VkError("vkCreateDescriptorPool (phase clock)", r);
  VkDescriptorSetAllocateInfo alloc{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  alloc.descriptorPool = clock->pool_;
  alloc.descriptorSetCount = 1;
  alloc.pSetLayouts = &layout;
  r = vkAllocateDescriptorSets(ctx.device(), &alloc, &clock->set_);
  if (r != VK_SUCCESS) return VkError("vkAllocateDescriptorSets (phase clock)", r);
  const VkDescriptorBufferInfo info{clock->marks_.handle(), 0, static_cast<VkDeviceSize>(clock->region_bytes_)};
  VkWriteDescriptorSet write{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
  write.dstSet = clock->set_;
  write.dstBinding = 0;
  write.descriptorCount = 1;
  write.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC;
  write.pBufferInfo = &info;
  vkUpdateDescriptorSets(ctx.device(), 1, &write, 0, nullptr);
  return clock;
}

PhaseClock::~PhaseClock() {
  if (pool_ != VK_NULL_HANDLE) vkDestroyDescriptorPool(ctx_.device(), pool_, nullptr);
}

uint32_t PhaseClock::NextRegion(const Pipeline& pipeline, uint32_t x, uint32_t y, uint32_t z) {
  const int64_t region = static_cast<int64_t>(pass_.size());
  if (region >= options_.max_dispatches) return static_cast<uint32_t>(options_.max_dispatches * region_bytes_);
  pass_.push_back({&pipeline, int64_t{x} * y * z});
  return static_cast<uint32_t>(region * region_bytes_);
}

void PhaseClock::Discard() {
  for (size_t d = 0; d < pass_.size(); ++d) {
    const int64_t recorded = std::min(pass_[d].workgroups, options_.max_workgroups);
    std::memset(marks_.mapped() + static_cast<int64_t>(d) * region_bytes_, 0,
                static_cast<size_t>(recorded * kMarks * kMarkBytes));
  }
  pass_.clear();
}

void PhaseClock::Collect() {
  for (size_t d = 0; d < pass_.size(); ++d) {
    const Clocked& c = pass_[d];
    uint8_t* region = marks_.mapped() + static_cast<int64_t>(d) * region_bytes_;
    Tally& t = tallies_[c.pipeline];
    const int64_t recorded = std::min(c.workgroups, options_.max_workgroups);
    ++t.dispatches;
    t.workgroups += c.workgroups;
    t.recorded += recorded;
    uint64_t first_start = UINT64_MAX, last_start = 0, last_end = 0;
    for (int64_t w = 0; w < recorded; ++w) {
      uint32_t words[kMarks * 4];
      std::memcpy(words, region + w * kMarks * kMarkBytes, sizeof(words));
      int prev = -1;
      uint64_t prev_ns = 0, prev_cycles = 0, start_ns = 0, start_cycles = 0;
      for (uint32_t k = 0; k < kMarks; ++k) {
        const uint64_t ns = words[4 * k] | uint64_t{words[4 * k + 1]} << 32;
        const uint64_t cycles = words[4 * k + 2] | uint64_t{words[4 * k + 3]} << 32;
        if (ns == 0) continue;  // not reached
        if (prev < 0) {
          start_ns = ns;
          start_cycles = cycles;
          first_start = std::min(first_start, ns);
          last_start = std::max(last_start, ns);
        } else if (t.interval_ns[k].size() < kMaxSamples) {
          t.interval_ns[k].push_back(static_cast<double>(ns - prev_ns));
          t.interval_cycles[k].push_back(static_cast<double>(cycles - prev_cycles));
        }
        prev = static_cast<int>(k);
        prev_ns = ns;
        prev_cycles = cycles;
      }
      if (prev < 0) continue;
      last_end = std::max(last_end, prev_ns);
      if (prev_ns > start_ns) {
        ns_ += static_cast<double>(prev_ns - start_ns);
        cycles_ += static_cast<double>(prev_cycles - start_cycles);
      }
    }
    if (first_start != UINT64_MAX && t.span_ns.size() < kMaxSamples) {
      t.span_ns.push_back(static_cast<double>(last_end - first_start));
      t.skew_ns.push_back(static_cast<double>(last_start - first_start));
    }
    std::memset(region, 0, static_cast<size_t>(recorded * kMarks * kMarkBytes));
  }
  pass_.clear();
}

std::string PhaseClock::TakeReport() {
  if (tallies_.empty()) return {};
  const double ghz = ns_ > 0 ? cycles_ / ns_ : 0;
  std::string out = fmt::format(
      "phase clocks: per clocked pipeline, the span of a dispatch (first workgroup's start to last one's end) and, "
      "per mark, the time workgroups took from the mark before (realtime clock; its cycle counter ran at {:.3f} "
      "GHz, from the workgroups' lives)\n",
      ghz);
  for (auto& [pipeline, t] : tallies_) {
    const std::vector<std::string>& names = MarkNames(pipeline->name);
    out += fmt::format("{} [{}]: {} dispatches, {} workgroups a dispatch ({} recorded), span {:.2f} us median "
                       "({:.2f} max), starts spread over {:.2f} us\n",
                       pipeline->name, fmt::join(pipeline->constants, ","), t.dispatches,
                       t.dispatches > 0 ? t.workgroups / t.dispatches : 0, t.dispatches > 0 ? t.recorded / t.dispatches : 0,
                       Quantile(t.span_ns, 0.5) * 1e-3, Quantile(t.span_ns, 1.0) * 1e-3, Quantile(t.skew_ns, 0.5) * 1e-3);
    for (uint32_t k = 1; k < kMarks; ++k) {
      std::vector<double>& ns = t.interval_ns[k];
      if (ns.empty()) continue;
      const size_t n = ns.size();
      const double median = Quantile(ns, 0.5), p90 = Quantile(ns, 0.9), max = Quantile(ns, 1.0);
      out += fmt::format("  {:>2} {:<26} {:>8} workgroups  median {:8.2f} us  p90 {:8.2f}  max {:8.2f}  ({:.0f} cycles)\n",
                         k, k < names.size() ? names[k] : std::string("?"), n, median * 1e-3, p90 * 1e-3, max * 1e-3,
                         Quantile(t.interval_cycles[k], 0.5));
    }
  }
  tallies_.clear();
  cycles_ = ns_ = 0;
  return out;
}

}  // namespace kvfs::vk
