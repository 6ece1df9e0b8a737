// An agent's cache on the engine side: assembling it for a turn from the pool and the disk,
// loading a cold agent's blocks (the loader thread), releasing it, and the pool keys it holds.
#include <algorithm>
#include <chrono>
#include <mutex>

#include <spdlog/spdlog.h>

#include "engine/core/shred.h"
#include "engine/kv/kv_payload.h"
#include "engine/runtime/engine_impl.h"
#include "engine/store/manifest.h"

namespace kvfs {

using engine_internal::ActiveTurn;
using engine_internal::AgentRecord;
using engine_internal::kPrefixDomain;

Result<PoolBlock*> Engine::AllocateToReload(int64_t bytes) {
  auto b = pool_->Allocate(bytes);
  // A full budget may be held by blocks of turns that just ended, evictable once the store has
  // written them (within milliseconds): wait for that, a quarter of a second at most, rather
  // than recompute what the disk holds (a turn that waited for memory, resuming). Not while the
  // engine has tasks queued: one of them may be what frees memory (and the engine thread, which
  // runs them, may be the one waiting here).
  const auto until = engine_internal::Clock::now() + std::chrono::milliseconds(250);
  while (!b.ok() && b.status().code() == StatusCode::kResourceExhausted) {
    {
      std::lock_guard lock(mu_);
      if (!tasks_.empty()) break;
    }
    {
      std::unique_lock lock(store_mu_);
      if (store_jobs_ == 0) break;
      const uint64_t finished = store_jobs_finished_;
      if (!store_job_done_cv_.wait_until(lock, until, [&] { return store_jobs_finished_ > finished; })) break;
    }
    b = pool_->Allocate(bytes);
  }
  return b;
}

PoolBlock* Engine::LoadBlock(const BlockHash& hash, const KvLayout& layout) {
  if (!store_ || !store_->HasBlock(hash)) return nullptr;
  auto b = AllocateToReload(layout.block_bytes());
  if (!b.ok()) return nullptr;
  kvfs::Status read = store_->ReadBlockInto(hash, std::span<uint8_t>((*b)->data, static_cast<size_t>(layout.block_bytes())));
  if (!read.ok()) {
    // Gone since HasBlock: an erasure (or a commit dropping it) came first, which is no fault (a
    // background load of an agent being erased meets it). Any other failure is worth a warning.
    // Either way the turn that needs the block computes it again.
    if (read.code() == StatusCode::kNotFound) {
      spdlog::info("engine: block {} was removed before it could be loaded; a turn that needs it recomputes it",
                   store::ToHex(hash));
    } else {
      spdlog::warn("engine: block {} could not be loaded ({}); a turn that needs it recomputes it",
                   store::ToHex(hash), read.message());
    }
    pool_->Release(*b);
    return nullptr;
  }
  PoolBlock* named = pool_->Name(*b, hash);
  pool_->MarkPersisted(hash);
  std::lock_guard lock(mu_);
  counters_.reload_bytes += static_cast<uint64_t>(layout.block_bytes());
  return named;
}

int64_t Engine::AssembleCache(ActiveTurn& turn, const std::vector<TokenId>& tokens, int64_t keep) {
  AgentRecord& a = *turn.agent;
  const int64_t B = options_.block_tokens;
  const KvLayout layout = KvLayoutFor(model_->hparams(), a.format, B);
  NoteKeys(a);  // the blocks and tail it names now may be superseded below
  turn.seq = std::make_unique<SequenceKv>(layout, n_ctx_, *pool_);
  SequenceKv& seq = *turn.seq;
  std::vector<BlockHash> chain;
  int64_t have = 0;
  uint64_t hits = 0;
  std::optional<store::TailRef> disk_tail;  // written by the store thread
  {
    std::lock_guard lock(mu_);
    disk_tail = a.disk_tail;
  }
  auto acquire = [&](const BlockHash& h) -> PoolBlock* {
    PoolBlock* b = pool_->Acquire(h);
    if (b != nullptr) ++hits;
    return b != nullptr ? b : LoadBlock(h, layout);
  };
  // The agent's own full blocks up to the common prefix.
  for (size_t i = 0; i < a.blocks.size() && have + B <= keep; ++i) {
    PoolBlock* b = acquire(a.blocks[i]);
    if (b == nullptr) break;
    seq.SetBlock(static_cast<int64_t>(i), b);
    chain.push_back(a.blocks[i]);
    have += B;
  }
  // The block holding the end of the common prefix: one of the agent's full blocks, or its tail.
  // Only when the loop above stopped there: when it stopped at a block it could not get (no
  // memory for it at that moment, a failed read), the reuse ends before that block. Taking the
  // block now would leave the positions after it claimed but unwritten, and the full block
  // outside the chain, unnamed to the commit (which found it named and aborted).
  if (have == static_cast<int64_t>(chain.size()) * B && have < keep && keep < have + B) {
    PoolBlock* b = nullptr;
    if (chain.size() < a.blocks.size()) {
      b = acquire(a.blocks[chain.size()]);
    } else if (a.parked_tail) {
      b = pool_->TakeWritable(*a.parked_tail);
      if (b != nullptr) ++hits;
    }
    // The tail on disk only when it is the one continuing the full blocks.
    const int64_t rest = static_cast<int64_t>(a.tokens.size()) - static_cast<int64_t>(a.blocks.size()) * B;
    if (b == nullptr && chain.size() == a.blocks.size() && disk_tail && store_ &&
        static_cast<int64_t>(disk_tail->n_tokens) == rest && rest >= keep - have) {
      auto tail = store_->ReadTail(a.name, *disk_tail);
      if (tail.ok()) {
        auto fresh = AllocateToReload(layout.tail_block_bytes());
        if (fresh.ok() && ExpandTail(layout, *tail, disk_tail->n_tokens, (*fresh)->data)) {
          b = *fresh;
          std::lock_guard lock(mu_);
          counters_.reload_bytes += tail->size();
        } else if (fresh.ok()) {
          pool_->Release(*fresh);
        }
        ShredVector(*tail);
      }
    }
    if (b != nullptr) {
      seq.SetBlock(static_cast<int64_t>(chain.size()), b);
      have = keep;
    }
  }
  // An unchecked import's rows kept no more: the blocks from here on are named in the uid's
  // domain again (and looked up there).
  if (!a.import_domain.empty() && have <= a.verified_tokens) {
    std::lock_guard lock(mu_);
    a.import_domain.clear();
    a.verified_tokens = 0;
  }
  turn.domain = NamingDomain(a);
  // Past the agent's own cache: blocks another agent of the same uid, or a shared prefix, has
  // already computed for the same tokens.
  if (have == static_cast<int64_t>(chain.size()) * B) {
    const int64_t last = static_cast<int64_t>(tokens.size()) - 1;
    while (have + B <= last) {
      const std::span<const TokenId> span(tokens.data() + have, static_cast<size_t>(B));
      const BlockHash parent = chain.empty() ? BlockHash{} : chain.back();
      PoolBlock* b = nullptr;
      BlockHash h;
      for (std::string_view domain : {std::string_view(turn.domain), kPrefixDomain}) {
        h = ChainHash(parent, span, fingerprint_, a.format, domain);
        // A removed prefix's blocks live on in the agents that used it, but are no longer
        // shared: across uids only a prefix in .prefixes/ now is.
        if (domain == kPrefixDomain && !PinnedByPrefix(h)) continue;
        if ((b = acquire(h)) != nullptr) break;
      }
      if (b == nullptr) break;
      seq.SetBlock(static_cast<int64_t>(chain.size()), b);
      chain.push_back(h);
      have += B;
    }
  }
  seq.SetTokens(have);
  if (have == 0) turn.prefix_copies = PrefixesToCopy(a.format, tokens);
  std::lock_guard lock(mu_);
  a.blocks = std::move(chain);
  a.parked_tail.reset();
  a.hits += hits;
  return have;
}

void Engine::ReleaseCache(AgentRecord& a) {
  NoteKeys(a);
  std::lock_guard lock(mu_);
  // (Tokens whose text is unknown, an import's that did not spell it, are of no use to the next
  // turn, which encodes the conversation then: not kept.)
  if (!a.tokens.empty() && !a.cached_text.empty()) {
    a.dropped.tokens = std::move(a.tokens);
    a.dropped.text = std::move(a.cached_text);
    a.dropped.ends = std::move(a.token_ends);
  } else if (!a.tokens.empty()) {
    a.dropped = {};
  }
  a.tokens.clear();
  a.cached_text.clear();
  a.token_ends.clear();
  a.blocks.clear();
  a.import_domain.clear();
  a.verified_tokens = 0;
  a.parked_tail.reset();
  a.disk_tail.reset();
}

void Engine::NoteKeys(AgentRecord& a) const {
  for (const BlockHash& h : AgentBlockKeys(a)) a.pool_keys.insert(h);
}

void Engine::DropStaleKeys(AgentRecord& a) {
  const std::vector<BlockHash> current = AgentBlockKeys(a);
  const std::set<BlockHash> keep(current.begin(), current.end());
  // Superseded keys still in the pool (a tail resumed by the next turn has left it already).
  std::vector<BlockHash> stale;
  for (auto it = a.pool_keys.begin(); it != a.pool_keys.end();) {
    if (keep.count(*it)) {
      ++it;
    } else if (!pool_->Contains(*it)) {
      it = a.pool_keys.erase(it);
    } else {
      stale.push_back(*it);
      ++it;
    }
  }
  if (stale.empty()) return;  // the usual turn, which extends the cache
  {
    std::lock_guard lock(mu_);
    auto it = agents_.find(a.name);
    if (it == agents_.end() || it->second.get() != &a) return;  // erased: the erasure dropped them
  }
  const std::set<BlockHash> others = NamedBlocks(&a, /*with_prefixes=*/true);
  // Named by someone else: theirs now. In use (an export, another agent's turn that found it by
  // hash): tried again after the next commit.
  for (const BlockHash& h : stale)
    if (others.count(h) || !pool_->Contains(h) || pool_->Drop(h)) a.pool_keys.erase(h);
}

void Engine::RollBackToCommitted(AgentRecord& a) {
  ReleaseCache(a);
  auto m = store_->ReadManifest(a.name);
  {
    std::lock_guard lock(mu_);
    if (m.ok()) ApplyManifest(a, *m);
  }
  DropStaleKeys(a);
}

std::vector<BlockHash> Engine::AgentBlockKeys(const AgentRecord& a) const {
  std::vector<BlockHash> keys = a.blocks;
  if (a.parked_tail) keys.push_back(*a.parked_tail);
  // A tail a pending load is bringing in is named with the newest generation.
  if (a.tail_generation > 0) keys.push_back(TailKey(a.name, a.tail_generation));
  return keys;
}

bool Engine::QueueLoad(AgentRecord& a, std::function<void()> on_loaded) {
  if (!store_) return false;
  {
    std::lock_guard lock(load_mu_);
    if (loader_ended_) return false;  // (shutdown) nothing loads any more: not marked loading
  }
  LoadJob job;
  job.agent = a.name;
  job.layout = KvLayoutFor(model_->hparams(), a.format, options_.block_tokens);
  for (const BlockHash& h : a.blocks)
    if (!pool_->Contains(h)) job.blocks.push_back(h);
  const bool tail_resident = a.parked_tail && pool_->Contains(*a.parked_tail);
  {
    std::lock_guard lock(mu_);
    if (a.disk_tail && !tail_resident) job.disk_tail = a.disk_tail;
  }
  if (job.blocks.empty() && !job.disk_tail) return false;
  {
    std::lock_guard lock(mu_);
    a.loading = true;
    job.tail_key = TailKey(a.name, ++a.tail_generation);
  }
  NoteKeys(a);
  // Back on the engine thread: adopt the loaded tail, then let the caller go on.
  job.done = [this, &a, on_loaded = std::move(on_loaded)](std::optional<BlockHash> tail) {
    Post([this, &a, tail, on_loaded] {
      {
        std::lock_guard l(mu_);
        a.loading = false;
        if (tail) a.parked_tail = tail;
      }
      on_loaded();
    });
  };
  {
    std::lock_guard lock(load_mu_);
    load_queue_.push_back(std::move(job));
  }
  load_cv_.notify_all();
  return true;
}

void Engine::LoaderLoop() {
  for (;;) {
    ScrubStack();  // the last load's manifest and tail parsed below this frame
    LoadJob job;
    {
      std::unique_lock lock(load_mu_);
      load_cv_.wait(lock, [&] { return load_stopping_ || !load_queue_.empty(); });
      if (load_queue_.empty()) {
        loader_ended_ = true;
        return;
      }
      job = std::move(load_queue_.front());
      load_queue_.pop_front();
      loader_busy_ = true;
    }
    for (const BlockHash& h : job.blocks) {
      PoolBlock* b = pool_->Contains(h) ? nullptr : LoadBlock(h, job.layout);
      if (b != nullptr) pool_->Release(b);  // stays cached, idle, until the turn acquires it
    }
    std::optional<BlockHash> tail_key;
    if (job.disk_tail) {
      auto tail = store_->ReadTail(job.agent, *job.disk_tail);
      if (tail.ok()) {
        auto b = AllocateToReload(job.layout.tail_block_bytes());
        if (b.ok() && ExpandTail(job.layout, *tail, job.disk_tail->n_tokens, (*b)->data)) {
          pool_->Release(pool_->Name(*b, job.tail_key));
          pool_->MarkPersisted(job.tail_key);
          tail_key = job.tail_key;
          std::lock_guard lock(mu_);
          counters_.reload_bytes += tail->size();
        } else if (b.ok()) {
          pool_->Release(*b);
        }
        ShredVector(*tail);
      }
    }
    if (job.done) job.done(tail_key);
    {
      std::lock_guard lock(load_mu_);
      loader_busy_ = false;
    }
  }
}

bool Engine::LoaderBusy() {
  std::lock_guard lock(load_mu_);
  return loader_busy_ || !load_queue_.empty();
}

void Engine::DrainLoader() {
  std::promise<void> drained;
  LoadJob barrier;
  barrier.done = [&drained](std::optional<BlockHash>) { drained.set_value(); };
  {
    std::lock_guard lock(load_mu_);
    if (loader_ended_) return;  // (shutdown) nothing loads any more, and nobody would answer
    load_queue_.push_back(std::move(barrier));
  }
  load_cv_.notify_all();
  drained.get_future().wait();
}

}  // namespace kvfs
