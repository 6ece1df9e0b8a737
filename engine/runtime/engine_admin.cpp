// Engine: erasure, cache export/import and shared prefixes.
#include <algorithm>
#include <set>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/runtime/engine_impl.h"

namespace kvfs {

using engine_internal::ActiveTurn;
using engine_internal::AgentRecord;
using engine_internal::CommitJob;

namespace {
constexpr std::string_view kPrefixDomain = "prefix";
}  // namespace

// Cancels the agent's running and queued turns (engine thread). Their on_done get `why`.
static void CancelTurnsOf(std::vector<std::unique_ptr<ActiveTurn>>& active, AgentRecord& a,
                          const std::function<void(ActiveTurn&)>& fail, std::mutex& mu, const Status& why) {
  for (auto& t : active)
    if (t->agent == &a) fail(*t);
  std::erase_if(active, [](const std::unique_ptr<ActiveTurn>& t) { return t->agent == nullptr; });
  std::deque<TurnRequest> queued;
  {
    std::lock_guard lock(mu);
    queued.swap(a.queue);
  }
  for (auto& r : queued)
    if (r.on_done) r.on_done(why);
}

Result<store::EraseReport> Engine::EraseAgent(const std::string& name) {
  const Status why(StatusCode::kNotFound, "agent " + name + " was erased");
  // Engine thread: stop its turns, take it out of the registry, collect its memory blocks.
  auto keys = RunOnEngine<Result<std::vector<BlockHash>>>([&]() -> Result<std::vector<BlockHash>> {
    AgentRecord* a = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = agents_.find(name);
      if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
      a = it->second.get();
    }
    CancelTurnsOf(active_, *a, [&](ActiveTurn& t) { FailTurn(t, why); }, mu_, why);
    std::vector<BlockHash> k = AgentBlockKeys(*a);
    std::lock_guard lock(mu_);
    // A turn whose commit is still queued keeps the record alive until the store thread is done
    // with it: the erasure job below runs after that commit.
    erased_.push_back(std::move(agents_[name]));
    agents_.erase(name);
    return k;
  });
  if (!keys.ok()) return keys.status();
  store::EraseReport report;
  if (store_) {
    CommitJob job;
    job.agent = name;
    job.run = [&]() -> Status {
      auto r = store_->EraseAgent(name);
      if (r.ok()) report = *r;
      return r.ok() || r.status().code() == StatusCode::kNotFound ? Status::Ok() : r.status();
    };
    KVFS_RETURN_IF_ERROR(CommitNow(std::move(job)));
  }
  // Memory: zero and free every block no other agent names (those are still someone's state).
  std::set<BlockHash> others;
  {
    std::lock_guard lock(mu_);
    for (auto& [n, a] : agents_) others.insert(a->blocks.begin(), a->blocks.end());
    for (auto& [n, p] : prefixes_) others.insert(p.blocks.begin(), p.blocks.end());
  }
  for (const BlockHash& h : *keys)
    if (!others.count(h)) pool_->Drop(h);
  std::lock_guard lock(mu_);
  ++counters_.erasures;
  return report;
}

Result<store::EraseReport> Engine::EraseCache(const std::string& name) {
  const Status why(StatusCode::kNotFound, "the cache of agent " + name + " was erased");
  struct Taken {
    std::vector<BlockHash> keys;
    CommitJob job;
  };
  auto taken = RunOnEngine<Result<Taken>>([&]() -> Result<Taken> {
    AgentRecord* a = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = agents_.find(name);
      if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
      a = it->second.get();
    }
    CancelTurnsOf(active_, *a, [&](ActiveTurn& t) { FailTurn(t, why); }, mu_, why);
    Taken t;
    t.keys = AgentBlockKeys(*a);
    ReleaseCache(*a);
    std::lock_guard lock(mu_);
    t.job.agent = name;
    t.job.manifest = ManifestOf(*a);
    return t;
  });
  if (!taken.ok()) return taken.status();
  store::EraseReport report;
  std::set<BlockHash> on_disk_before;
  if (store_) {
    for (const BlockHash& h : taken->keys)
      if (store_->HasBlock(h)) on_disk_before.insert(h);
    // The commit of a manifest without blocks makes the store shred every block only this
    // agent named, and the old tail.
    KVFS_RETURN_IF_ERROR(CommitNow(std::move(taken->job)));
    for (const BlockHash& h : on_disk_before) {
      if (store_->HasBlock(h)) ++report.blocks_kept_shared;
      else ++report.blocks_freed;
    }
  }
  std::set<BlockHash> others;
  {
    std::lock_guard lock(mu_);
    for (auto& [n, a] : agents_) others.insert(a->blocks.begin(), a->blocks.end());
  }
  for (const BlockHash& h : taken->keys)
    if (!others.count(h) && pool_->Drop(h)) report.bytes_freed += 0;
  return report;
}

Result<std::string> Engine::ExportCache(const std::string& name) {
  (void)name;
  return Status(StatusCode::kUnsupported, "cache export is not available yet");
}

Status Engine::ImportCache(const std::string& name, std::string_view bytes) {
  (void)name;
  (void)bytes;
  return Status(StatusCode::kUnsupported, "cache import is not available yet");
}

Status Engine::AddPrefix(const std::string& name, std::string text) {
  if (!store::IsValidAgentName(name)) return InvalidArgument("invalid prefix name \"" + name + "\"");
  return RunOnEngine<kvfs::Status>([&]() -> kvfs::Status {
    {
      std::lock_guard lock(mu_);
      if (prefixes_.count(name)) return InvalidArgument("prefix \"" + name + "\" exists");
    }
    KVFS_ASSIGN_OR_RETURN(KvFormat format, FormatFor(AgentSettings{.kv = options_.kv}));
    Prefix p;
    p.text = std::move(text);
    p.tokens = model_->tokenizer().Encode(p.text, true, true);
    const int64_t B = options_.block_tokens;
    const int64_t full = static_cast<int64_t>(p.tokens.size()) / B;
    if (static_cast<int64_t>(p.tokens.size()) > n_ctx_) return OutOfRange("the prefix is longer than the context");
    SequenceKv seq(KvLayoutFor(model_->hparams(), format, B), n_ctx_, *pool_);
    BlockHash parent;
    for (int64_t i = 0; i < full; ++i) {
      const std::span<const TokenId> span(p.tokens.data() + i * B, static_cast<size_t>(B));
      const BlockHash h = ChainHash(parent, span, fingerprint_, format, kPrefixDomain);
      if (PoolBlock* b = pool_->Acquire(h)) {
        seq.SetBlock(i, b);
        seq.SetTokens((i + 1) * B);
      } else {
        SequenceStep step{&seq, span, false};
        Logits logits;
        KVFS_RETURN_IF_ERROR(backend_->Forward(std::span<const SequenceStep>(&step, 1), logits));
        seq.NameBlock(i, h);
      }
      pool_->Pin(h);
      p.blocks.push_back(h);
      parent = h;
    }
    std::lock_guard lock(mu_);
    prefixes_[name] = std::move(p);
    return kvfs::Status::Ok();
  });
}

Result<store::EraseReport> Engine::RemovePrefix(const std::string& name) {
  return RunOnEngine<Result<store::EraseReport>>([&]() -> Result<store::EraseReport> {
    Prefix p;
    {
      std::lock_guard lock(mu_);
      auto it = prefixes_.find(name);
      if (it == prefixes_.end()) return NotFound("no prefix \"" + name + "\"");
      p = std::move(it->second);
      prefixes_.erase(it);
    }
    store::EraseReport report;
    std::set<BlockHash> others;
    {
      std::lock_guard lock(mu_);
      for (auto& [n, a] : agents_) others.insert(a->blocks.begin(), a->blocks.end());
    }
    for (const BlockHash& h : p.blocks) {
      pool_->Unpin(h);
      if (others.count(h)) ++report.blocks_kept_shared;
      else if (pool_->Drop(h)) ++report.blocks_freed;
    }
    return report;
  });
}

}  // namespace kvfs
