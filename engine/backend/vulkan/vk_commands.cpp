#include "engine/backend/vulkan/vk_commands.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

namespace kvfs::vk {

namespace {
constexpr uint32_t kSetsPerPool = 1024;
}  // namespace

Recorder::~Recorder() {
  (void)Drain();
  VkDevice dev = ctx_.device();
  if (profile_ != nullptr) vkDestroyQueryPool(dev, profile_->queries, nullptr);
  if (fence_ != VK_NULL_HANDLE) vkDestroyFence(dev, fence_, nullptr);
  for (VkDescriptorPool p : descriptor_pools_) vkDestroyDescriptorPool(dev, p, nullptr);
  if (pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(dev, pool_, nullptr);
}

Status Recorder::Drain() {
  if (!in_flight_) return Status::Ok();
  in_flight_ = false;
  return ctx_.Check("vkQueueWaitIdle", vkQueueWaitIdle(ctx_.queue()));
}

Result<int64_t> Recorder::PassTable(std::span<const uint8_t> bytes, int64_t entry_bytes) {
  if (!recording_) return Internal("a pass table outside a pass");
  if (entry_bytes <= 0 || static_cast<int64_t>(bytes.size()) % entry_bytes != 0) {
    return Internal("a pass table must hold whole entries");
  }
  for (const RecentTable& t : recent_tables_) {
    if (t.offset >= 0 && t.entry_bytes == entry_bytes && std::equal(bytes.begin(), bytes.end(), t.bytes.begin(),
                                                                     t.bytes.end())) {
      return t.offset / entry_bytes;
    }
  }
  if (pass_tables_.bytes() == 0) {
    KVFS_ASSIGN_OR_RETURN(pass_tables_, ctx_.CreateBuffer(kPassTableBytes, MemoryKind::kDeviceUpload));
  }
  const int64_t offset = (pass_table_used_ + entry_bytes - 1) / entry_bytes * entry_bytes;
  const auto size = static_cast<int64_t>(bytes.size());
  if (offset + size > kPassTableBytes) return int64_t{-1};
  std::copy(bytes.begin(), bytes.end(), pass_tables_.mapped() + offset);
  pass_table_used_ = offset + size;
  RecentTable& t = recent_tables_[next_recent_++ % recent_tables_.size()];
  t.offset = offset;
  t.entry_bytes = entry_bytes;
  t.bytes.assign(bytes.begin(), bytes.end());
  return offset / entry_bytes;
}

Status Recorder::Begin() {
  VkDevice dev = ctx_.device();
  if (pool_ == VK_NULL_HANDLE) {
    VkCommandPoolCreateInfo info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    info.queueFamilyIndex = ctx_.queue_family();
    VkResult r = vkCreateCommandPool(dev, &info, nullptr, &pool_);
    if (r != VK_SUCCESS) return VkError("vkCreateCommandPool", r);
    VkFenceCreateInfo fence_info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    r = vkCreateFence(dev, &fence_info, nullptr, &fence_);
    if (r != VK_SUCCESS) return VkError("vkCreateFence", r);
  }
  KVFS_RETURN_IF_ERROR(Drain());  // a pass abandoned after an error: its pieces finish first
  if (phase_clock_ != nullptr) phase_clock_->Discard();  // an abandoned pass's marks
  if (sets_epoch_ != ctx_.buffer_epoch()) {
    for (VkDescriptorPool p : descriptor_pools_) vkResetDescriptorPool(dev, p, 0);
    current_pool_ = 0;
    sets_.clear();
    sets_epoch_ = ctx_.buffer_epoch();
  }
  const VkResult r = vkResetCommandPool(dev, pool_, 0);  // every piece of the last pass
  if (r != VK_SUCCESS) return VkError("vkResetCommandPool", r);
  n_pieces_ = 0;
  pass_table_used_ = 0;
  for (RecentTable& t : recent_tables_) t.offset = -1;
  deferred_ = Status::Ok();
  work_since_barrier_ = false;
  KVFS_RETURN_IF_ERROR(BeginPiece());
  recording_ = true;
  if (profile_ != nullptr) {
    profile_->begun = std::chrono::steady_clock::now();
    profile_->timed.clear();
    vkCmdResetQueryPool(cmd_, profile_->queries, 0, profile_->capacity);
    vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, profile_->queries, 0);
  }
  return Status::Ok();
}

Status Recorder::BeginPiece() {
  if (n_pieces_ == pieces_.size()) {
    VkCommandBufferAllocateInfo alloc{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    alloc.commandPool = pool_;
    alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    alloc.commandBufferCount = 1;
    VkCommandBuffer cmd;
    const VkResult r = vkAllocateCommandBuffers(ctx_.device(), &alloc, &cmd);
    if (r != VK_SUCCESS) return VkError("vkAllocateCommandBuffers", r);
    pieces_.push_back(cmd);
  }
  cmd_ = pieces_[n_pieces_++];
  piece_dispatches_ = 0;
  bound_pipeline_ = VK_NULL_HANDLE;
  bound_set_ = VK_NULL_HANDLE;
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  const VkResult r = vkBeginCommandBuffer(cmd_, &begin);
  if (r != VK_SUCCESS) return VkError("vkBeginCommandBuffer", r);
  return Status::Ok();
}

Status Recorder::SubmitPiece(VkFence fence) {
  VkResult r = vkEndCommandBuffer(cmd_);
  if (r != VK_SUCCESS) return VkError("vkEndCommandBuffer", r);
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &cmd_;
  KVFS_RETURN_IF_ERROR(ctx_.Submit(submit, fence));
  in_flight_ = true;
  return Status::Ok();
}

Status Recorder::EnablePhaseClock(PipelineCache& pipelines, const PhaseClock::Options& options) {
  if (phase_clock_ != nullptr) return Status::Ok();
  KVFS_RETURN_IF_ERROR(pipelines.PrepareClockSetLayout());
  KVFS_ASSIGN_OR_RETURN(phase_clock_, PhaseClock::Create(ctx_, pipelines.clock_set_layout(), options));
  return Status::Ok();
}

Status Recorder::EnableProfiling(uint32_t max_dispatches) {
  if (profile_ != nullptr) return Status::Ok();
  if (ctx_.limits().timestamp_period_ns <= 0) return Unsupported("the Vulkan queue has no timestamps to profile with");
  auto profile = std::make_unique<Profile>();
  profile->capacity = max_dispatches + 1;
  VkQueryPoolCreateInfo info{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  info.queryType = VK_QUERY_TYPE_TIMESTAMP;
  info.queryCount = profile->capacity;
  const VkResult r = vkCreateQueryPool(ctx_.device(), &info, nullptr, &profile->queries);
  if (r != VK_SUCCESS) return VkError("vkCreateQueryPool", r);
  profile_ = std::move(profile);
  return Status::Ok();
}

namespace {

template <typename Key, typename Line>
struct ReportRow {
  std::string label;
  Key key;
  Line line;
};

// Lines by device time, the longest first (ties by label, so reports compare run to run).
template <typename Key, typename Line, typename LabelOf>
std::vector<ReportRow<Key, Line>> ByDeviceTime(const std::map<Key, Line>& lines, LabelOf label_of, double* total_ms) {
  std::vector<ReportRow<Key, Line>> out;
  *total_ms = 0;
  for (const auto& [key, line] : lines) {
    out.push_back({label_of(key), key, line});
    *total_ms += line.device_ms;
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.line.device_ms != b.line.device_ms) return a.line.device_ms > b.line.device_ms;
    return a.label < b.label;
  });
  return out;
}

std::string PipelineLabel(const Pipeline& p) {
  std::string out = fmt::format("{} [", p.name);
  for (size_t i = 0; i < p.constants.size(); ++i) out += fmt::format("{}{}", i > 0 ? "," : "", p.constants[i]);
  return out + "]";
}

}  // namespace

std::string Recorder::TakeProfileReport(const PipelineCache* statistics) {
  if (profile_ == nullptr) return phase_clock_ != nullptr ? phase_clock_->TakeReport() : std::string();
  Profile& p = *profile_;
  double timed_ms = 0;
  std::string out = fmt::format("{:<28} {:>10} {:>12} {:>7}\n", "shader [groups]", "dispatches", "device ms", "share");
  const auto same = [](const std::string& label) { return label; };
  for (const auto& row : ByDeviceTime(p.lines, same, &timed_ms)) {
    out += fmt::format("{:<28} {:>10} {:>12.3f} {:>6.1f}%\n", row.label, row.line.dispatches, row.line.device_ms,
                       timed_ms > 0 ? 100 * row.line.device_ms / timed_ms : 0.0);
  }
  out += fmt::format("{} passes in {} pieces, {} dispatches, {} barriers, {} copies: device {:.3f} ms; host recording "
                     "{:.3f} ms (overlapping the device), waiting {:.3f} ms\n",
                     p.passes, p.pieces, p.dispatches, p.barriers, p.copies, p.device_ms, p.record_ms, p.wait_ms);
  // Per pipeline: which variant of a shader ran, and what the compiler made of it.
  const bool with_statistics = statistics != nullptr && statistics->captures_statistics();
  out += fmt::format("{:<48} {:>10} {:>12} {:>7}{}\n", "pipeline [specialization constants]", "dispatches",
                     "device ms", "share", with_statistics ? "  compiler statistics" : "");
  const auto label_of = [](const Pipeline* pipeline) { return PipelineLabel(*pipeline); };
  for (const auto& row : ByDeviceTime(p.by_pipeline, label_of, &timed_ms)) {
    std::string stats;
    if (with_statistics) {
      Result<std::vector<PipelineStatistic>> got = statistics->Statistics(*row.key);
      if (!got.ok()) {
        stats = "  (" + got.status().message() + ")";
      } else {
        for (size_t i = 0; i < got->size(); ++i) {
          stats += fmt::format("{}{}={}", i == 0 ? "  " : ", ", (*got)[i].name, (*got)[i].value);
        }
      }
    }
    out += fmt::format("{:<48} {:>10} {:>12.3f} {:>6.1f}%{}\n", row.label, row.line.dispatches, row.line.device_ms,
                       timed_ms > 0 ? 100 * row.line.device_ms / timed_ms : 0.0, stats);
  }
  p.lines.clear();
  p.by_pipeline.clear();
  p.passes = p.pieces = p.dispatches = p.barriers = p.copies = 0;
  p.device_ms = p.record_ms = p.wait_ms = 0;
  if (phase_clock_ != nullptr) out += phase_clock_->TakeReport();
  return out;
}

Result<VkDescriptorSet> Recorder::AllocateSet(VkDescriptorSetLayout layout) {
  VkDevice dev = ctx_.device();
  while (true) {
    if (current_pool_ == descriptor_pools_.size()) {
      const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBuffers};
      VkDescriptorPoolCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
      info.maxSets = kSetsPerPool;
      info.poolSizeCount = 1;
      info.pPoolSizes = &size;
      VkDescriptorPool p;
      const VkResult r = vkCreateDescriptorPool(dev, &info, nullptr, &p);
      if (r != VK_SUCCESS) return VkError("vkCreateDescriptorPool", r);
      descriptor_pools_.push_back(p);
    }
    VkDescriptorSetAllocateInfo alloc{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    alloc.descriptorPool = descriptor_pools_[current_pool_];
    alloc.descriptorSetCount = 1;
    alloc.pSetLayouts = &layout;
    VkDescriptorSet set;
    const VkResult r = vkAllocateDescriptorSets(dev, &alloc, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) return VkError("vkAllocateDescriptorSets", r);
    ++current_pool_;  // this pool is full: the next one (made on demand)
  }
}

Status Recorder::Dispatch(const Pipeline& pipeline, std::span<const Buffer* const> buffers, const void* push,
                          uint32_t x, uint32_t y, uint32_t z) {
  if (buffers.size() != pipeline.n_buffers) {
    return Internal(fmt::format("dispatch binds {} buffers, the pipeline has {}", buffers.size(), pipeline.n_buffers));
  }
  if (buffers.size() > kMaxBuffers) {
    return Internal(fmt::format("dispatch binds {} buffers, the recorder at most {}", buffers.size(), kMaxBuffers));
  }
  KVFS_RETURN_IF_ERROR(deferred_);
  if (x == 0 || y == 0 || z == 0) return Status::Ok();
  if (sets_epoch_ != ctx_.buffer_epoch()) {
    return Internal("a buffer was destroyed while a pass was being recorded");
  }
  SetKey key{pipeline.set_layout, {}};
  size_t n = 0;
  for (const Buffer* b : buffers) {
    if (b->empty()) return Internal(fmt::format("dispatch of {} binds a buffer that was never made", pipeline.name));
    key.second[n++] = b->handle();
  }
  auto it = sets_.find(key);
  if (it == sets_.end()) {
    KVFS_ASSIGN_OR_RETURN(VkDescriptorSet set, AllocateSet(pipeline.set_layout));
    VkDescriptorBufferInfo infos[kMaxBuffers];
    VkWriteDescriptorSet writes[kMaxBuffers];
    for (uint32_t i = 0; i < n; ++i) {
      infos[i] = {key.second[i], 0, VK_WHOLE_SIZE};
      writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
      writes[i].dstSet = set;
      writes[i].dstBinding = i;
      writes[i].descriptorCount = 1;
      writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      writes[i].pBufferInfo = &infos[i];
    }
    vkUpdateDescriptorSets(ctx_.device(), static_cast<uint32_t>(n), writes, 0, nullptr);
    it = sets_.emplace(key, set).first;
  }
  const VkDescriptorSet set = it->second;
  if (pipeline.pipeline != bound_pipeline_) {
    vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline);
    bound_pipeline_ = pipeline.pipeline;
  }
  // A set is made for one layout, so the same set means the same layout.
  if (set != bound_set_) {
    vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, 1, &set, 0, nullptr);
    bound_set_ = set;
  }
  if (pipeline.clocked) {  // its own region of the phase clock's buffer
    if (phase_clock_ == nullptr) return Internal(fmt::format("{} is clocked but the recorder has no phase clock", pipeline.name));
    const VkDescriptorSet clock_set = phase_clock_->set();
    const uint32_t offset = phase_clock_->NextRegion(pipeline, x, y, z);
    vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 1, 1, &clock_set, 1, &offset);
  }
  if (pipeline.push_bytes > 0) {
    vkCmdPushConstants(cmd_, pipeline.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pipeline.push_bytes, push);
  }
  vkCmdDispatch(cmd_, x, y, z);
  ++piece_dispatches_;
  work_since_barrier_ = true;
  if (profile_ != nullptr) {
    ++profile_->dispatches;
    if (profile_->timed.size() + 1 < profile_->capacity) {
      profile_->timed.emplace_back(&pipeline, x);
      vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, profile_->queries,
                          static_cast<uint32_t>(profile_->timed.size()));
    }
  }
  return Status::Ok();
}

void Recorder::Barrier() {
  if (!deferred_.ok()) return;  // the pass failed: nothing more is recorded
  // Nothing recorded since the last barrier (or since Begin: earlier passes were waited for):
  // another barrier would only make the device wait again.
  if (!work_since_barrier_) return;
  work_since_barrier_ = false;
  if (profile_ != nullptr) ++profile_->barriers;
  const int64_t piece = n_pieces_ == 1 ? kFirstPieceDispatches : kPieceDispatches;
  if (piece_dispatches_ < piece) {
    RecordBarrier();
    return;
  }
  // Submit the piece so far; the next one starts with the barrier, which orders it after
  // everything submitted before it on the queue.
  deferred_ = SubmitPiece(VK_NULL_HANDLE);
  if (deferred_.ok()) deferred_ = BeginPiece();
  if (deferred_.ok()) RecordBarrier();
}

void Recorder::RecordBarrier() {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                          VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(cmd_, stages, stages, 0, 1, &barrier, 0, nullptr, 0, nullptr);
}

void Recorder::Copy(const Buffer& src, int64_t src_offset, const Buffer& dst, int64_t dst_offset, int64_t bytes) {
  if (bytes <= 0 || !deferred_.ok()) return;
  const VkBufferCopy region{static_cast<VkDeviceSize>(src_offset), static_cast<VkDeviceSize>(dst_offset),
                            static_cast<VkDeviceSize>(bytes)};
  vkCmdCopyBuffer(cmd_, src.handle(), dst.handle(), 1, &region);
  work_since_barrier_ = true;
  if (profile_ != nullptr) ++profile_->copies;
}

void Recorder::Zero(const Buffer& dst, int64_t offset, int64_t bytes) {
  if (bytes <= 0 || !deferred_.ok()) return;
  vkCmdFillBuffer(cmd_, dst.handle(), static_cast<VkDeviceSize>(offset), static_cast<VkDeviceSize>(bytes), 0u);
  work_since_barrier_ = true;
}

Status Recorder::SubmitAndWait() {
  if (!recording_) return Internal("SubmitAndWait without Begin");
  recording_ = false;
  KVFS_RETURN_IF_ERROR(deferred_);  // a piece failed to go: the pass is abandoned
  // Device writes become visible to host reads after the fence.
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier, 0, nullptr, 0, nullptr);
  const auto submitted = std::chrono::steady_clock::now();
  KVFS_RETURN_IF_ERROR(SubmitPiece(fence_));
  // The last piece began with a barrier after every earlier piece, so its fence covers them.
  KVFS_RETURN_IF_ERROR(ctx_.Check("vkWaitForFences", vkWaitForFences(ctx_.device(), 1, &fence_, VK_TRUE, UINT64_MAX)));
  in_flight_ = false;
  vkResetFences(ctx_.device(), 1, &fence_);
  if (phase_clock_ != nullptr) phase_clock_->Collect();
  if (profile_ != nullptr) return CollectProfile(submitted);
  return Status::Ok();
}

Status Recorder::CollectProfile(std::chrono::steady_clock::time_point submitted) {
  Profile& p = *profile_;
  const auto done = std::chrono::steady_clock::now();
  p.record_ms += std::chrono::duration<double, std::milli>(submitted - p.begun).count();
  p.wait_ms += std::chrono::duration<double, std::milli>(done - submitted).count();
  ++p.passes;
  p.pieces += static_cast<int64_t>(n_pieces_);
  const uint32_t n = static_cast<uint32_t>(p.timed.size()) + 1;
  std::vector<uint64_t> ticks(n);
  const VkResult r = vkGetQueryPoolResults(ctx_.device(), p.queries, 0, n, n * sizeof(uint64_t), ticks.data(),
                                           sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  KVFS_RETURN_IF_ERROR(ctx_.Check("vkGetQueryPoolResults", r));
  const double ms_per_tick = ctx_.limits().timestamp_period_ns * 1e-6;
  for (uint32_t i = 1; i < n; ++i) {
    const double ms = static_cast<double>(ticks[i] - ticks[i - 1]) * ms_per_tick;
    const auto [pipeline, groups] = p.timed[i - 1];
    // Matrix shaders by grid width: one line per matrix shape.
    const std::string label = pipeline->name.substr(0, 3) == "mat" ? fmt::format("{} [{}]", pipeline->name, groups)
                                                                   : std::string(pipeline->name);
    for (ProfileLine* line : {&p.lines[label], &p.by_pipeline[pipeline]}) {
      ++line->dispatches;
      line->device_ms += ms;
    }
  }
  p.device_ms += static_cast<double>(ticks[n - 1] - ticks[0]) * ms_per_tick;
  return Status::Ok();
}

}  // namespace kvfs::vk
