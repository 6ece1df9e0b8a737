// Engine: what it reports of its agents and itself (status.json's AgentInfo, the root's
// EngineStatus), from the records under mu_.
#include <algorithm>

#include "engine/runtime/engine_impl.h"

namespace kvfs {

using engine_internal::AgentRecord;

Engine::Residency Engine::ResidencyOf(const AgentRecord& a) const {
  Residency r;
  const KvLayout layout = KvLayoutFor(model_->hparams(), a.format, options_.block_tokens);
  // A parked q4k tail carries its staging area (sequence_kv.h).
  const int64_t block_bytes = (layout.block_bytes() + 63) / 64 * 64;
  const int64_t tail_bytes = (layout.tail_block_bytes() + 63) / 64 * 64;
  auto count = [&](const BlockHash& h, int64_t bytes) {
    ++r.total;
    if (pool_->Contains(h)) {
      ++r.resident;
      r.bytes += bytes;
    }
  };
  for (const BlockHash& h : a.blocks) count(h, block_bytes);
  if (a.parked_tail) count(*a.parked_tail, tail_bytes);
  else if (a.disk_tail) ++r.total;  // on disk only
  return r;
}

AgentState Engine::StateOf(const AgentRecord& a, const Residency& r) {
  if (!a.last_error.empty() && !a.running && a.queue.empty()) return AgentState::kError;
  if (a.running && a.generating) return AgentState::kGenerating;
  if (a.loading) return AgentState::kWarm;
  if (a.running && a.prefilling) return AgentState::kGenerating;  // its prompt is being prefilled
  // Queued: turns waiting to start, or one started that waits for KV memory (admitted when
  // running turns free enough of the budget).
  if (!a.queue.empty() || a.running) return AgentState::kQueued;
  if (r.total > 0 && r.resident == r.total) return AgentState::kHot;
  if (r.resident > 0) return AgentState::kWarm;
  return AgentState::kCold;
}

AgentInfo Engine::InfoOf(const AgentRecord& a) const {
  const Residency r = ResidencyOf(a);
  AgentInfo info;
  info.name = a.name;
  info.owner_uid = a.owner_uid;
  info.state = StateOf(a, r);
  info.context_tokens = static_cast<int64_t>(a.tokens.size());
  info.stored_cache = store_ != nullptr && store_->NamesCache(a.name);
  info.memory_bytes = r.bytes + a.turn_bytes;
  info.disk_bytes = a.disk_bytes;
  info.created_ms = a.created_ms;
  info.updated_ms = a.updated_ms;
  info.turns = static_cast<uint64_t>(std::count_if(a.conversation.begin(), a.conversation.end(),
                                                   [](const ConversationTurn& t) { return t.role == "user"; }));
  info.queued_turns = a.queue.size() + (a.running ? 1 : 0);
  info.system = a.system;
  info.settings = a.settings;
  info.last_turn = a.last_turn;
  info.last_error = a.last_error;
  return info;
}

std::vector<AgentInfo> Engine::ListAgents() {
  std::lock_guard lock(mu_);
  std::vector<AgentInfo> out;
  out.reserve(agents_.size());
  for (auto& [name, a] : agents_) out.push_back(InfoOf(*a));
  return out;
}

Result<AgentInfo> Engine::GetAgent(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = agents_.find(name);
  if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
  return InfoOf(*it->second);
}

EngineStatus Engine::Stats() {
  const PoolStats ps = pool_->Stats();
  std::lock_guard lock(mu_);
  EngineStatus s = counters_;
  s.memory_used_bytes = ps.used_bytes;
  s.memory_budget_bytes = ps.budget_bytes;
  s.block_hits = ps.hits;
  s.block_misses = ps.misses;
  s.evictions = ps.evictions;
  std::vector<CacheEntryStatus> entries;
  for (auto& [name, a] : agents_) {
    const Residency r = ResidencyOf(*a);
    // As status.json shows it: an agent whose turn runs is generating (or queued), not idle.
    s.CountAgent(StateOf(*a, r));
    s.turns_in_flight += a->queue.size() + (a->running ? 1 : 0);
    entries.push_back(CacheEntryStatus{name, r.bytes + a->turn_bytes, a->disk_bytes, a->hits});
  }
  std::sort(entries.begin(), entries.end(), [](const CacheEntryStatus& x, const CacheEntryStatus& y) {
    return std::max(x.memory_bytes, x.disk_bytes) > std::max(y.memory_bytes, y.disk_bytes);
  });
  if (entries.size() > 10) entries.resize(10);
  s.top_entries = std::move(entries);
  s.agent_records = agents_.size() + erased_.size();
  return s;
}

}  // namespace kvfs
