// Recording attention calls (Ops::AttnCall: attn_scores, softmax, attn_output), alone or merged: calls
// that need no barrier between them and share a pipeline, buffers and the grid dimension that
// is not numbered across calls run as one dispatch, which finds each workgroup's call in a table
// of the pass (shaders/jobs.glsl). A batched decode step of n agents then launches one
// attn_scores and one attn_output a layer instead of n of each.
#include <algorithm>
#include <cstddef>

#include <spdlog/spdlog.h>

#include "engine/backend/vulkan/vk_ops.h"
#include "engine/backend/vulkan/vk_ops_common.h"

namespace kvfs::vk {

using namespace ops_detail;

namespace {

// Whether two calls can be one dispatch: the same pipeline and buffers, and the grid dimension
// they would share alike.
bool Mergeable(const Ops::AttnCall& a, const Ops::AttnCall& b) {
  return a.shader == b.shader && a.flat_dim == b.flat_dim && a.n_spec == b.n_spec && a.spec == b.spec &&
         a.n_buffers == b.n_buffers && a.buffers == b.buffers && a.n_params == b.n_params &&
         a.grid[1 - a.flat_dim] == b.grid[1 - b.flat_dim];
}

// A call's workgroups numbered along its flat dimension (with those along z).
int64_t FlatGroups(const Ops::AttnCall& c) { return int64_t{c.grid[c.flat_dim]} * c.grid[2]; }

}  // namespace

Status Ops::DispatchCall(Recorder& rec, const AttnCall& call, bool merged, uint32_t job0, uint32_t groups0) {
  KVFS_ASSIGN_OR_RETURN(const Pipeline* p, CallPipeline(call, merged));
  std::array<uint32_t, kMaxCallWords + 2> push{};  // Params, then jobs.glsl's job0 and groups0
  std::copy_n(call.params.begin(), call.n_params, push.begin());
  push[call.n_params] = job0;
  push[call.n_params + 1] = groups0;
  return rec.Dispatch(*p, std::span(call.buffers.data(), call.n_buffers), push.data(), call.grid[0], call.grid[1],
                      call.grid[2]);
}

Status Ops::RecordCall(Recorder& rec, const AttnCall& call) { return DispatchCall(rec, call, false, 0, 0); }

Status Ops::RecordMerged(Recorder& rec, std::span<const AttnCall* const> calls) {
  const AttnCall& first = *calls.front();
  const uint32_t flat = first.flat_dim;
  const size_t entry_words = 2 + first.n_params;
  // The table (jobs.glsl): per call its first workgroup, its workgroups along `flat` and its
  // Params; then, per workgroup of the dispatch, its call (so a workgroup finds its call with
  // one load); padded to whole entries.
  job_table_.clear();
  int64_t total = 0;
  for (const AttnCall* c : calls) {
    job_table_.push_back(U32(total));
    job_table_.push_back(c->grid[flat]);
    job_table_.insert(job_table_.end(), c->params.begin(), c->params.begin() + static_cast<ptrdiff_t>(c->n_params));
    total += FlatGroups(*c);
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    job_table_.insert(job_table_.end(), static_cast<size_t>(FlatGroups(*calls[i])), U32(i));
  }
  job_table_.resize((job_table_.size() + entry_words - 1) / entry_words * entry_words);
  const auto bytes = std::as_bytes(std::span(job_table_));
  KVFS_ASSIGN_OR_RETURN(const int64_t job0,
                        rec.PassTable(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                                      static_cast<int64_t>(4 * entry_words)));
  if (job0 < 0) {  // the pass's table space is used up: each alone
    if (!warned_table_full_) {
      spdlog::warn("vulkan: the pass's call tables are full; the rest of its attention calls are recorded one by one");
      warned_table_full_ = true;
    }
    for (const AttnCall* c : calls) KVFS_RETURN_IF_ERROR(RecordCall(rec, *c));
    return Status::Ok();
  }
  AttnCall merged = first;  // its Params are unused: each workgroup reads its call's
  merged.buffers[merged.n_buffers - 1] = &rec.pass_tables();
  merged.grid[flat] = U32(total);
  merged.grid[2] = 1;
  const int64_t groups0 = (job0 + static_cast<int64_t>(calls.size())) * static_cast<int64_t>(entry_words);
  return DispatchCall(rec, merged, true, U32(job0), U32(groups0));
}

Status Ops::RecordCalls(Recorder& rec, std::span<const AttnCall> calls) {
  if (!merge_jobs_ || calls.size() < 2) {
    for (const AttnCall& c : calls) KVFS_RETURN_IF_ERROR(RecordCall(rec, c));
    return Status::Ok();
  }
  // Groups of mergeable calls, in the order of their first call (a step has few: one per KV
  // arena and pipeline).
  call_group_.clear();
  group_first_.clear();
  for (size_t i = 0; i < calls.size(); ++i) {
    size_t g = 0;
    while (g < group_first_.size() && !Mergeable(calls[group_first_[g]], calls[i])) ++g;
    if (g == group_first_.size()) group_first_.push_back(i);
    call_group_.push_back(g);
  }
  for (size_t g = 0; g < group_first_.size(); ++g) {
    // The group's calls in dispatches whose workgroups stay within the device's grid limit, and
    // whose per-workgroup lists (a word each) within a quarter of the pass's table space.
    const int64_t limit = std::min<int64_t>(ctx_.limits().max_group_count[calls[group_first_[g]].flat_dim],
                                            Recorder::kPassTableBytes / 16);
    merged_calls_.clear();
    int64_t groups = 0;
    auto flush = [&]() -> Status {
      const Status s = merged_calls_.size() == 1 ? RecordCall(rec, *merged_calls_.front())
                                                 : RecordMerged(rec, merged_calls_);
      merged_calls_.clear();
      groups = 0;
      return s;
    };
    for (size_t i = group_first_[g]; i < calls.size(); ++i) {
      if (call_group_[i] != g) continue;
      if (!merged_calls_.empty() && groups + FlatGroups(calls[i]) > limit) KVFS_RETURN_IF_ERROR(flush());
      merged_calls_.push_back(&calls[i]);
      groups += FlatGroups(calls[i]);
    }
    KVFS_RETURN_IF_ERROR(flush());  // (a group has at least its first call)
  }
  return Status::Ok();
}

}  // namespace kvfs::vk
