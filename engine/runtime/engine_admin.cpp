// Engine: erasure, cache export/import and shared prefixes.
#include <algorithm>
#include <cstring>
#include <future>
#include <set>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/runtime/engine_impl.h"
#include "engine/store/safetensors.h"

namespace kvfs {

using engine_internal::ActiveTurn;
using engine_internal::AgentRecord;
using engine_internal::CommitJob;
using engine_internal::CompactTail;
using engine_internal::ExpandTail;

namespace {
constexpr std::string_view kPrefixDomain = "prefix";
}  // namespace

// Cancels the agent's running and queued turns (engine thread). Their on_done get `why`.
static void CancelTurnsOf(std::vector<std::unique_ptr<ActiveTurn>>& active, AgentRecord& a,
                          const std::function<void(ActiveTurn&)>& fail, std::mutex& mu, const Status& why) {
  for (auto& t : active)
    if (t && t->agent == &a) fail(*t);
  std::erase_if(active, [](const std::unique_ptr<ActiveTurn>& t) { return t && t->agent == nullptr && t->loaded; });
  std::deque<TurnRequest> queued;
  {
    std::lock_guard lock(mu);
    queued.swap(a.queue);
  }
  for (auto& r : queued)
    if (r.on_done) r.on_done(why);
}

Result<AgentRecord*> Engine::StopTurnsOf(const std::string& name, const kvfs::Status& why) {
  AgentRecord* a = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = agents_.find(name);
    if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
    a = it->second.get();
  }
  CancelTurnsOf(active_, *a, [&](ActiveTurn& t) { FailTurn(t, why); }, mu_, why);
  CancelTurnsOf(warming_, *a, [&](ActiveTurn& t) { FailTurn(t, why); }, mu_, why);
  return a;
}

Result<store::EraseReport> Engine::EraseAgent(const std::string& name) {
  const Status why(StatusCode::kNotFound, "agent " + name + " was erased");
  // Engine thread: stop its turns, take it out of the registry, collect its memory blocks.
  auto keys = RunOnEngine<Result<std::vector<BlockHash>>>([&]() -> Result<std::vector<BlockHash>> {
    KVFS_ASSIGN_OR_RETURN(AgentRecord* a, StopTurnsOf(name, why));
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
  // Memory: zero and free every block no other agent names (those are still someone's state),
  // after any load of this agent's files has finished (it would put them back).
  DrainLoader();
  std::set<BlockHash> others;
  {
    std::lock_guard lock(mu_);
    for (auto& [n, a] : agents_) others.insert(a->blocks.begin(), a->blocks.end());
    for (auto& [n, p] : prefixes_) others.insert(p.blocks.begin(), p.blocks.end());
  }
  for (const BlockHash& h : *keys)
    if (!others.count(h)) pool_->Drop(h);
  // Device copies of the freed blocks (the turn's own blocks too) are zeroed before returning.
  RunOnEngine<int>([&] {
    ForgetFreedBlocks();
    return 0;
  });
  std::lock_guard lock(mu_);
  ++counters_.erasures;
  return report;
}

Result<store::EraseReport> Engine::EraseCache(const std::string& name) {
  const Status why(StatusCode::kNotFound, "the cache of agent " + name + " was erased");
  struct Taken {
    std::vector<BlockHash> keys;
    CommitJob job;
    int64_t disk_bytes = 0;  // the cache's blocks and tail on disk
    size_t files = 0;        // its tail file
    int64_t block_bytes = 0;
  };
  auto taken = RunOnEngine<Result<Taken>>([&]() -> Result<Taken> {
    KVFS_ASSIGN_OR_RETURN(AgentRecord* a, StopTurnsOf(name, why));
    Taken t;
    t.keys = AgentBlockKeys(*a);
    {
      std::lock_guard lock(mu_);
      t.disk_bytes = a->disk_bytes;
      if (a->disk_tail) ++t.files;
      t.block_bytes = KvLayoutFor(model_->hparams(), a->format, options_.block_tokens).block_bytes();
    }
    ReleaseCache(*a);
    std::lock_guard lock(mu_);
    t.job.agent = name;
    t.job.manifest = ManifestOf(*a);
    return t;
  });
  if (!taken.ok()) return taken.status();
  store::EraseReport report;
  std::set<BlockHash> on_disk_before;
  report.bytes_freed = static_cast<uint64_t>(taken->disk_bytes);
  if (store_) {
    for (const BlockHash& h : taken->keys)
      if (store_->HasBlock(h)) on_disk_before.insert(h);
    // The commit of a manifest without blocks makes the store shred every block only this
    // agent named, and the old tail.
    KVFS_RETURN_IF_ERROR(CommitNow(std::move(taken->job)));
    report.files_removed = taken->files;
    for (const BlockHash& h : on_disk_before) {
      if (store_->HasBlock(h)) ++report.blocks_kept_shared;
      else ++report.blocks_freed, ++report.files_removed;
    }
    // Shared blocks stay on disk: they are not this erasure's bytes.
    const uint64_t kept = report.blocks_kept_shared * static_cast<uint64_t>(taken->block_bytes);
    report.bytes_freed = report.bytes_freed > kept ? report.bytes_freed - kept : 0;
  }
  DrainLoader();
  std::set<BlockHash> others;
  {
    std::lock_guard lock(mu_);
    for (auto& [n, a] : agents_) others.insert(a->blocks.begin(), a->blocks.end());
  }
  for (const BlockHash& h : taken->keys)
    if (!others.count(h)) pool_->Drop(h);
  RunOnEngine<int>([&] {
    ForgetFreedBlocks();
    return 0;
  });
  return report;
}

namespace {

store::KvGeometry GeometryOf(const HParams& hp, const KvFormat& f) {
  const std::string name = f.type == KvType::kF16 ? "f16" : f.type == KvType::kQ8 ? "q8" : "q4";
  return store::KvGeometry{hp.n_layer, hp.n_head_kv, hp.head_dim, name, f.group, f.rotate};
}

}  // namespace

Result<std::string> Engine::ExportCache(const std::string& name) {
  // Engine thread: a consistent snapshot of the committed cache, held by references (blocks are
  // immutable once named); the file is assembled on the calling thread.
  struct Snapshot {
    store::CacheExportInfo info;
    std::vector<PoolBlock*> blocks;
    std::vector<uint8_t> tail;  // compact
    int64_t tail_tokens = 0;
    int64_t block_bytes = 0;
  };
  auto snap = RunOnEngine<Result<Snapshot>>([&]() -> Result<Snapshot> {
    AgentRecord* a = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = agents_.find(name);
      if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
      a = it->second.get();
    }
    const int64_t B = options_.block_tokens;
    const KvLayout layout = KvLayoutFor(model_->hparams(), a->format, B);
    Snapshot s;
    s.block_bytes = layout.block_bytes();
    for (const BlockHash& h : a->blocks) {
      PoolBlock* b = pool_->Acquire(h);
      if (b == nullptr) b = LoadBlock(h, layout);
      if (b == nullptr) break;
      s.blocks.push_back(b);
    }
    const int64_t full = static_cast<int64_t>(s.blocks.size()) * B;
    const int64_t rest = static_cast<int64_t>(a->tokens.size()) - full;
    std::optional<store::TailRef> disk_tail;
    {
      std::lock_guard lock(mu_);
      disk_tail = a->disk_tail;
    }
    // The tail belongs to the snapshot only when it continues exactly the full blocks.
    if (rest > 0 && rest < B && s.blocks.size() == a->blocks.size()) {
      if (PoolBlock* t = a->parked_tail ? pool_->Acquire(*a->parked_tail) : nullptr) {
        CompactTail(layout, t->data, rest, s.tail);
        pool_->Release(t);
        s.tail_tokens = rest;
      } else if (disk_tail && disk_tail->n_tokens == rest && store_) {
        auto bytes = store_->ReadTail(a->name, *disk_tail);
        if (bytes.ok()) {
          s.tail = std::move(*bytes);
          s.tail_tokens = rest;
        }
      }
    }
    std::lock_guard lock(mu_);
    s.info.model_fingerprint = fingerprint_;
    s.info.geometry = GeometryOf(model_->hparams(), a->format);
    s.info.tokens.assign(a->tokens.begin(), a->tokens.end());
    s.info.n_cached = full + s.tail_tokens;
    s.info.conversation = a->conversation;
    return s;
  });
  if (!snap.ok()) return snap.status();
  std::vector<store::KvChunk> chunks;
  for (PoolBlock* b : snap->blocks)
    chunks.push_back(store::KvChunk{std::span<const uint8_t>(b->data, static_cast<size_t>(snap->block_bytes)), options_.block_tokens});
  if (snap->tail_tokens > 0) chunks.push_back(store::KvChunk{snap->tail, snap->tail_tokens});
  auto file = store::WriteKvSafetensors(snap->info, chunks);
  for (PoolBlock* b : snap->blocks) pool_->Release(b);
  return file;
}

Status Engine::ImportCache(const std::string& name, std::string_view bytes) {
  KvFormat format;
  {
    std::lock_guard lock(mu_);
    auto it = agents_.find(name);
    if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
    format = it->second->format;
  }
  // Validate everything before touching the agent.
  KVFS_ASSIGN_OR_RETURN(store::ImportedCache imported,
                        store::ReadKvSafetensors(bytes, fingerprint_, GeometryOf(model_->hparams(), format),
                                                 options_.block_tokens));
  if (imported.info.n_cached > n_ctx_) return InvalidArgument("kv.safetensors: the cache is longer than the context");
  std::promise<kvfs::Status> committed;
  auto done = committed.get_future();
  kvfs::Status started = RunOnEngine<kvfs::Status>([&]() -> kvfs::Status {
    AgentRecord* a = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = agents_.find(name);
      if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
      a = it->second.get();
      if (a->running || !a->queue.empty() || a->loading) {
        return kvfs::Status(StatusCode::kResourceExhausted, "agent " + name + " is busy with a turn");
      }
      if (!(a->format == format)) return InvalidArgument("kv.safetensors: the agent's KV format changed");
    }
    const int64_t B = options_.block_tokens;
    const KvLayout layout = KvLayoutFor(model_->hparams(), format, B);
    SequenceKv seq(layout, n_ctx_, *pool_);
    for (size_t i = 0; i < imported.chunks.size(); ++i) {
      KVFS_ASSIGN_OR_RETURN(PoolBlock* b, pool_->Allocate(layout.block_bytes()));
      const std::vector<uint8_t>& c = imported.chunks[i];
      if (imported.chunk_tokens[i] == B) {
        std::memcpy(b->data, c.data(), std::min(c.size(), static_cast<size_t>(layout.block_bytes())));
      } else {
        ExpandTail(layout, c, imported.chunk_tokens[i], b->data);
      }
      seq.SetBlock(static_cast<int64_t>(i), b);
    }
    seq.SetTokens(imported.info.n_cached);
    ReleaseCache(*a);
    {
      std::lock_guard lock(mu_);
      a->conversation = imported.info.conversation;
      a->tokens.assign(imported.info.tokens.begin(), imported.info.tokens.begin() + imported.info.n_cached);
      a->cached_text.clear();  // unknown: the next turn matches on tokens (DIVERGE)
      a->updated_ms = Now();
    }
    CommitAgent(*a, &seq, [&committed](const kvfs::Status& s) { committed.set_value(s); });
    return kvfs::Status::Ok();
  });
  if (!started.ok()) return started;
  return done.get();
}

Status Engine::AddPrefix(const std::string& name, std::string text) {
  if (!store::IsValidAgentName(name)) return InvalidArgument("invalid prefix name \"" + name + "\"");
  return RunOnEngine<kvfs::Status>([&]() -> kvfs::Status {
    {
      std::lock_guard lock(mu_);
      if (prefixes_.count(name)) return InvalidArgument("prefix \"" + name + "\" exists");
    }
    KVFS_ASSIGN_OR_RETURN(KvFormat format, FormatFor(DefaultSettings()));
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
