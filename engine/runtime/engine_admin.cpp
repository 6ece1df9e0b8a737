// Engine: erasure, cache export and import.
#include <algorithm>
#include <cstring>
#include <future>
#include <set>
#include <utility>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "engine/core/shred.h"
#include "engine/core/xxh3_stream.h"
#include "engine/kv/kv_payload.h"
#include "engine/runtime/engine_impl.h"
#include "engine/core/strict_json.h"
#include "engine/store/safetensors.h"

namespace kvfs {

using engine_internal::ActiveTurn;
using engine_internal::AgentRecord;
using engine_internal::CommitJob;

// Cancels the agent's running turns, and its queued ones unless keep_queued (engine thread).
// Their on_done get `why`. The queued ones, which never started, count as cancelled
// (*cancelled, guarded by mu) before their writers hear of it, so that turns submitted add up
// to ok + failed + cancelled.
static void CancelTurnsOf(std::vector<std::unique_ptr<ActiveTurn>>& active, AgentRecord& a,
                          const std::function<void(ActiveTurn&)>& fail, std::mutex& mu, uint64_t* cancelled,
                          const Status& why, bool keep_queued) {
  for (auto& t : active)
    if (t && t->agent == &a) fail(*t);
  std::erase_if(active, [](const std::unique_ptr<ActiveTurn>& t) { return t && t->agent == nullptr && t->loaded; });
  if (keep_queued) return;
  std::deque<TurnRequest> queued;
  {
    std::lock_guard lock(mu);
    queued.swap(a.queue);
    *cancelled += queued.size();
  }
  for (auto& r : queued)
    if (r.on_done) r.on_done(why);
}

Result<AgentRecord*> Engine::StopTurnsOf(const std::string& name, const kvfs::Status& why, bool keep_queued) {
  AgentRecord* a = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = agents_.find(name);
    if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
    a = it->second.get();
  }
  auto fail = [&](ActiveTurn& t) { FailTurn(t, why); };
  CancelTurnsOf(active_, *a, fail, mu_, &counters_.turns_cancelled, why, keep_queued);
  CancelTurnsOf(warming_, *a, fail, mu_, &counters_.turns_cancelled, why, keep_queued);
  return a;
}

// Zeroes what the record holds of the agent's conversation before its memory is freed: erased
// text must not linger on the heap (the filesystem shreds its copies likewise).
template <typename Container>
static void Zero(Container& c) {
  std::fill(c.begin(), c.end(), typename Container::value_type{});
}

static void ShredRecord(AgentRecord& a) {
  for (ConversationTurn& t : a.conversation) Zero(t.text);
  Zero(a.system);
  Zero(a.cached_text);
  Zero(a.tokens);
  Zero(a.dropped.text);
  Zero(a.dropped.tokens);
  Zero(a.last_error);
}

void Engine::ForgetErasedRecord(const AgentRecord* record) {
  // Called after the erasure's store job and DrainLoader. Whatever refers to the record was
  // queued before the erasure took it out of agents_: commits (whose done callbacks ran before
  // that store job and posted their engine tasks then), loads (whose done callbacks post theirs,
  // drained) and engine tasks. This task runs after all of those, on the engine thread.
  RunOnEngine<bool>([&] {
    std::lock_guard lock(mu_);
    std::erase_if(erased_, [&](const std::unique_ptr<AgentRecord>& r) {
      if (r.get() != record) return false;
      ShredRecord(*r);
      return true;
    });
    return true;
  });
}

Result<store::EraseReport> Engine::EraseAgent(const std::string& name) {
  const Status why(StatusCode::kNotFound, "agent " + name + " was erased");
  // Engine thread: stop its turns, take it out of the registry, collect its memory blocks.
  const AgentRecord* record = nullptr;
  auto keys = RunOnEngine<Result<std::vector<BlockHash>>>([&]() -> Result<std::vector<BlockHash>> {
    KVFS_ASSIGN_OR_RETURN(AgentRecord* a, StopTurnsOf(name, why));
    NoteKeys(*a);
    std::vector<BlockHash> k(a->pool_keys.begin(), a->pool_keys.end());
    std::lock_guard lock(mu_);
    // A turn whose commit is still queued keeps the record alive until the store thread is done
    // with it: the erasure job below runs after that commit.
    record = a;
    erased_.push_back(std::move(agents_[name]));
    agents_.erase(name);
    ++erasures_begun_;
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
    if (Status erased = CommitNow(std::move(job)); !erased.ok()) {
      DrainLoader();
      ForgetErasedRecord(record);
      return erased;
    }
  }
  // Memory: zero and free every block no other agent names (those are still someone's state),
  // after any load of this agent's files has finished (it would put them back).
  DrainLoader();
  DropUnnamedBlocks(*keys);  // device copies of the turn's own blocks go too
  // And its record, text and tokens included: kept, every create-and-erase of an agent would
  // leave ~1.4 KB behind for good (kvfsd's memory grew with agent churn).
  ForgetErasedRecord(record);
  std::lock_guard lock(mu_);
  ++counters_.erasures;
  return report;
}

Result<store::EraseReport> Engine::EraseCache(const std::string& name) {
  {
    // Nothing of it can be read, so there is no cache to erase; and committing would overwrite
    // what is left (rm -r unlinks kv.safetensors before the rmdir that erases it all).
    std::lock_guard lock(mu_);
    auto it = agents_.find(name);
    if (it != agents_.end() && !it->second->unreadable.empty()) return store::EraseReport{};
  }
  const Status why(StatusCode::kNotFound, "the cache of agent " + name + " was erased");
  // The running turn builds on the cache: it is cancelled. Queued turns wait until the erasure is
  // done (behind the store's jobs and the memory's zeroing), then rebuild the cache from the
  // token ids, so none of them can commit blocks this erasure then drops.
  uint64_t record = 0;  // the serial of the record marked: an agent of the name made since is another
  auto resume_queued = [this, &name, &record] {
    {
      std::lock_guard lock(mu_);
      if (auto it = agents_.find(name); it != agents_.end() && it->second->serial == record)
        --it->second->erasing_cache;
    }
    engine_cv_.notify_all();
  };
  struct Taken {
    std::vector<BlockHash> memory_keys;  // every key it has had in the pool
    CommitJob job;
  };
  auto taken = RunOnEngine<Result<Taken>>([&]() -> Result<Taken> {
    KVFS_ASSIGN_OR_RETURN(AgentRecord* a, StopTurnsOf(name, why, /*keep_queued=*/true));
    {
      std::lock_guard lock(mu_);
      ++a->erasing_cache;
      record = a->serial;
    }
    Taken t;
    NoteKeys(*a);
    t.memory_keys.assign(a->pool_keys.begin(), a->pool_keys.end());
    ReleaseCache(*a);
    std::lock_guard lock(mu_);
    ++erasures_begun_;
    ++a->commits_built;
    t.job.agent = name;
    t.job.manifest = ManifestOf(*a);
    return t;
  });
  if (!taken.ok()) return taken.status();
  struct ResumeQueued {
    std::function<void()> run;
    ~ResumeQueued() { run(); }
  } resume{resume_queued};
  store::EraseReport report;
  if (store_) {
    // On the store thread, behind every commit queued before it (a turn that ended just now).
    std::set<BlockHash> on_disk_before;
    CommitJob job;
    job.agent = name;
    job.run = [&]() -> Status {
      // No cache on disk (never made, or erased already): nothing to write, so rm -r's unlink of
      // kv.safetensors succeeds on a full disk too.
      if (!store_->NamesCache(name)) return Status::Ok();
      // What the store names (a dropped cache's blocks are no longer the agent's in memory).
      for (const BlockHash& h : store_->CacheBlocks(name))
        if (store_->HasBlock(h)) on_disk_before.insert(h);
      // A manifest without blocks makes the store shred every block only this agent named, and
      // the old tail.
      auto r = store_->CommitTurn(name, taken->job.manifest, {}, std::nullopt);
      if (!r.ok()) return r.status();
      // The files it zeroed and removed, at their sizes on disk (shared blocks stay: not this
      // erasure's), whatever made them (another model's or format's cache included).
      report.bytes_freed = r->cache_bytes_shredded;
      report.files_removed = r->cache_files_shredded;
      std::lock_guard lock(mu_);
      if (auto it = agents_.find(name); it != agents_.end()) {
        it->second->disk_tail.reset();
        it->second->disk_bytes = 0;
      }
      return Status::Ok();
    };
    KVFS_RETURN_IF_ERROR(CommitNow(std::move(job)));
    for (const BlockHash& h : on_disk_before) {
      if (store_->HasBlock(h)) ++report.blocks_kept_shared;
      else ++report.blocks_freed;
    }
  }
  DrainLoader();
  DropUnnamedBlocks(taken->memory_keys);
  return report;
}

namespace {

store::KvGeometry GeometryOf(const HParams& hp, const KvFormat& f) {
  const std::string name = f.type == KvType::kF16 ? "f16"
                           : f.type == KvType::kQ8 ? "q8"
                           : f.type == KvType::kQ4 ? "q4"
                                                   : "q4k";
  return store::KvGeometry{hp.n_layer, hp.n_head_kv, hp.head_dim, name, f.group, f.rotate, f.chunk};
}

}  // namespace

store::CacheExportInfo Engine::ExportInfoOf(const AgentRecord& a, int64_t n_cached) const {
  store::CacheExportInfo info;
  info.model_fingerprint = fingerprint_;
  info.n_cached = n_cached;
  // No cache: written in the format the next one will have (so it imports back after a
  // settings change); else in the format the cache is in.
  auto next = FormatFor(a.settings);
  info.geometry = GeometryOf(model_->hparams(), n_cached == 0 && next.ok() ? *next : a.format);
  info.tokens.assign(a.tokens.begin(), a.tokens.end());
  info.conversation = a.conversation;
  // The text behind the tokens lets an importer match its next turn by characters (EXTEND)
  // instead of re-encoding, which rarely gives back the sampled tokens.
  if (n_cached == static_cast<int64_t>(info.tokens.size())) {
    info.context_text = a.cached_text;
    // And where each token's text ends in it, so that the match stays token by token.
    if (!info.context_text.empty() && a.token_ends.size() == info.tokens.size())
      info.token_end_deltas = TokenEndDeltas(a.token_ends);
  }
  return info;
}

Result<uint64_t> Engine::ExportSize(const std::string& name) {
  const int64_t B = options_.block_tokens;
  store::CacheExportInfo info;
  Xxh3Hash128 key;
  std::vector<BlockHash> blocks;
  {
    std::lock_guard lock(mu_);
    auto it = agents_.find(name);
    if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
    KVFS_RETURN_IF_ERROR(RefuseIfUnreadable(*it->second));
    blocks = it->second->blocks;
  }
  // (Outside mu_: the store's lock may wait for a commit.)
  size_t available = ExportableBlocks(blocks);
  {
    std::lock_guard lock(mu_);
    auto it = agents_.find(name);
    if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
    AgentRecord& a = *it->second;
    KVFS_RETURN_IF_ERROR(RefuseIfUnreadable(a));
    for (size_t i = 0; i < available; ++i) {
      if (i >= a.blocks.size() || a.blocks[i] != blocks[i]) available = i;  // changed since: as far as the same
    }
    // The tokens ExportCache exports: the full blocks the agent names (during a turn, or after
    // one that failed, only those it reuses) up to the first that cannot be had, then the tail
    // when all of them can and the rest of the tokens is one that is kept (in the pool, or on
    // disk). More blocks than tokens (blocks reused from another agent, past its tokens, during
    // a turn) make ExportCache fail, and this too.
    const int64_t n_tokens = static_cast<int64_t>(a.tokens.size());
    const int64_t full = static_cast<int64_t>(available) * B;
    const int64_t rest = n_tokens - static_cast<int64_t>(a.blocks.size()) * B;
    const bool tail_kept = available == a.blocks.size() &&
                           (a.parked_tail || (a.disk_tail && static_cast<int64_t>(a.disk_tail->n_tokens) == rest));
    const int64_t n_cached = full + (rest > 0 && rest < B && tail_kept ? rest : 0);
    // The key: what ExportInfoOf gives the header (the geometry, the tokens, the conversation
    // and the text behind the tokens; the fingerprint is the engine's), lengths before strings.
    Xxh3Stream state(Xxh3Stream::Width::k128);  // it sees the agent's text: a state kvfs zeros
    auto add = [&](const void* p, size_t n) { state.Update(p, n); };
    auto add_string = [&](const std::string& s) {
      const uint64_t n = s.size();
      add(&n, sizeof n);
      add(s.data(), s.size());
    };
    auto next = FormatFor(a.settings);
    const store::KvGeometry g = GeometryOf(model_->hparams(), n_cached == 0 && next.ok() ? *next : a.format);
    add_string(g.kv_type);
    const int64_t shape[] = {g.group, g.rotate ? 1 : 0, g.chunk, n_cached};
    add(shape, sizeof shape);
    add(a.tokens.data(), a.tokens.size() * sizeof(TokenId));
    for (const ConversationTurn& t : a.conversation) {
      add_string(t.role);
      add_string(t.text);
    }
    add_string(a.cached_text);
    add(a.token_ends.data(), a.token_ends.size() * sizeof(uint32_t));  // (the header's token_ends)
    key = state.Digest128();
    if (a.export_key[0] == key.low64 && a.export_key[1] == key.high64 && a.export_bytes > 0) return a.export_bytes;
    info = ExportInfoOf(a, n_cached);
  }
  // The header's JSON (~0.3 ms for 2k tokens), outside the lock the engine thread takes.
  KVFS_ASSIGN_OR_RETURN(const uint64_t bytes, store::KvSafetensorsBytes(info));
  std::lock_guard lock(mu_);
  if (auto it = agents_.find(name); it != agents_.end()) {
    it->second->export_key[0] = key.low64;
    it->second->export_key[1] = key.high64;
    it->second->export_bytes = bytes;
  }
  return bytes;
}

size_t Engine::ExportableBlocks(std::span<const BlockHash> blocks) const {
  size_t n = 0;
  while (n < blocks.size() && (pool_->Contains(blocks[n]) || (store_ && store_->HasBlock(blocks[n])))) ++n;
  return n;
}

Result<std::string> Engine::ExportCache(const std::string& name) {
  // A snapshot names the committed cache; the blocks it holds only on disk are read after it,
  // and the agent's next commit may shred those it no longer names (a diverging turn) or replace
  // the tail on disk meanwhile. The export of the cache as it is then is what a reader wants,
  // not EIO: take a new snapshot (a few times: each try is one commit behind at most).
  Result<std::string> file = Internal("not exported");
  for (int attempt = 0; attempt < 4; ++attempt) {
    bool moved_on = false;
    file = ExportCacheOnce(name, &moved_on);
    if (file.ok() || !moved_on) break;
    spdlog::debug("engine: exporting agent {}: its cache changed during the export; again", name);
  }
  return file;
}

Result<std::string> Engine::ExportCacheOnce(const std::string& name, bool* moved_on) {
  // Engine thread: a consistent snapshot of the committed cache, held by references (blocks are
  // immutable once named); the file is assembled on the calling thread.
  struct Snapshot {
    store::CacheExportInfo info;
    // Per full block: the pool's copy (held), or null: read from the store by the caller. Blocks
    // not in memory are never loaded into the pool for an export: under memory pressure there
    // may be no room (an export must not come out short: its size was promised to stat), and a
    // backup of every agent must not evict the agents at work.
    std::vector<PoolBlock*> blocks;
    std::vector<BlockHash> hashes;
    std::vector<uint8_t> tail;  // compact
    int64_t tail_tokens = 0;
    int64_t block_bytes = 0;
    uint64_t erasures_begun = 0;
  };
  // The agent's commits and tail on disk as the snapshot saw them: it moved on when either changed.
  std::optional<std::pair<uint64_t, std::optional<store::TailRef>>> seen;
  auto snap = RunOnEngine<Result<Snapshot>>([&]() -> Result<Snapshot> {
    AgentRecord* a = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = agents_.find(name);
      if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
      a = it->second.get();
      KVFS_RETURN_IF_ERROR(RefuseIfUnreadable(*a));
    }
    const int64_t B = options_.block_tokens;
    const KvLayout layout = KvLayoutFor(model_->hparams(), a->format, B);
    Snapshot s;
    s.block_bytes = layout.block_bytes();
    // Never a shorter file than ExportSize promised (tar would pad it with zeros): what cannot be
    // had fails the export, giving back what was held.
    auto fail = [&](Status why) {
      for (PoolBlock* held : s.blocks)
        if (held != nullptr) pool_->Release(held);
      return why;
    };
    for (size_t i = 0; i < a->blocks.size(); ++i) {
      const BlockHash& h = a->blocks[i];
      PoolBlock* b = pool_->Hold(h);
      // A block lost (a damaged file dropped, a missing one) ends the export before it, as
      // ExportSize counted: the next turn recomputes from there.
      if (b == nullptr && !(store_ && store_->HasBlock(h))) break;
      s.blocks.push_back(b);
      s.hashes.push_back(h);
    }
    const int64_t full = static_cast<int64_t>(s.blocks.size()) * B;
    const int64_t rest = static_cast<int64_t>(a->tokens.size()) - full;
    std::optional<store::TailRef> disk_tail;
    {
      std::lock_guard lock(mu_);
      disk_tail = a->disk_tail;
      seen.emplace(a->commits_built, disk_tail);
    }
    // The tail belongs to the snapshot only when it continues exactly the full blocks.
    if (rest > 0 && rest < B && s.blocks.size() == a->blocks.size()) {
      const bool counted = a->parked_tail || (disk_tail && disk_tail->n_tokens == rest);  // by ExportSize
      Status tail_status = Status::Ok();
      if (PoolBlock* t = a->parked_tail ? pool_->Hold(*a->parked_tail) : nullptr) {
        CompactTail(layout, t->data, rest, s.tail);
        pool_->Release(t);
        s.tail_tokens = rest;
      } else if (disk_tail && disk_tail->n_tokens == rest && store_) {
        auto bytes = store_->ReadTail(a->name, *disk_tail);
        if (bytes.ok()) {
          s.tail = std::move(*bytes);
          s.tail_tokens = rest;
        } else {
          tail_status = bytes.status();
        }
      }
      if (counted && s.tail_tokens == 0) {
        if (!a->parked_tail && disk_tail && store_ && !store_->HasTail(a->name, *disk_tail)) {
          // Gone (found damaged by this read, and dropped): the agent has no tail any more, and
          // an export of its full blocks is what ExportSize now says (the try after this one).
          std::lock_guard lock(mu_);
          if (a->disk_tail == disk_tail) a->disk_tail.reset();
        }
        return fail(IoError(fmt::format("exporting agent {}: its last {} tokens' rows could not be had{}", name, rest,
                                        tail_status.ok() ? std::string() : " (" + tail_status.message() + ")")));
      }
    }
    std::lock_guard lock(mu_);
    s.erasures_begun = erasures_begun_;
    s.info = ExportInfoOf(*a, full + s.tail_tokens);
    return s;
  });
  // Whether the agent committed, or its tail on disk was replaced or lost, since the snapshot: a
  // failed read may then be of what that removed.
  auto moved_since_snapshot = [&] {
    if (!seen) return false;
    std::lock_guard lock(mu_);
    auto it = agents_.find(name);
    return it != agents_.end() && (it->second->commits_built != seen->first || it->second->disk_tail != seen->second);
  };
  if (!snap.ok()) {
    // The tail read inside the snapshot: its file replaced by a commit that ended meanwhile, or lost.
    if (snap.status().code() == StatusCode::kIoError) *moved_on = moved_since_snapshot();
    return snap.status();
  }
  std::vector<BlockHash> held;
  for (PoolBlock* b : snap->blocks)
    if (b != nullptr) held.push_back(b->key);
  Result<std::string> file = Internal("the export was not assembled");
  {
    // The pool's blocks are given back at the end of this scope, however it ends (an allocation
    // may throw).
    struct HeldBlocks {
      BlockPool& pool;
      std::vector<PoolBlock*>& blocks;
      ~HeldBlocks() {
        for (PoolBlock* b : blocks)
          if (b != nullptr) pool.Release(b);
      }
    } release_at_end{*pool_, snap->blocks};
    // The blocks not in memory, read here (off the engine thread) from the store: named by their
    // content, they cannot have changed; one erased or damaged since fails its checksum.
    std::vector<std::vector<uint8_t>> read(snap->blocks.size());
    std::vector<store::KvChunk> chunks;
    Status read_status = Status::Ok();
    size_t failed_block = snap->blocks.size();
    for (size_t i = 0; i < snap->blocks.size() && read_status.ok(); ++i) {
      const uint8_t* data = snap->blocks[i] != nullptr ? snap->blocks[i]->data : nullptr;
      if (data == nullptr) {
        read[i].resize(static_cast<size_t>(snap->block_bytes));
        read_status = store_->ReadBlockInto(snap->hashes[i], read[i]);
        if (!read_status.ok()) {
          failed_block = i;
          read_status = read_status.WithContext(fmt::format("exporting agent {}: block {} of {}", name, i, read.size()));
        }
        data = read[i].data();
      }
      chunks.push_back(store::KvChunk{std::span<const uint8_t>(data, static_cast<size_t>(snap->block_bytes)),
                                      options_.block_tokens});
    }
    if (snap->tail_tokens > 0) chunks.push_back(store::KvChunk{snap->tail, snap->tail_tokens});
    file = read_status.ok() ? store::WriteKvSafetensors(snap->info, chunks) : Result<std::string>(read_status);
    for (std::vector<uint8_t>& bytes : read) ShredVector(bytes);  // KV rows: not left in freed memory
    ShredVector(snap->tail);
    // A block the read found damaged is dropped from the store: a new snapshot ends before it.
    if (!read_status.ok())
      *moved_on = moved_since_snapshot() ||
                  (failed_block < snap->hashes.size() && !store_->HasBlock(snap->hashes[failed_block]));
  }
  // An erasure that began while these blocks were held here could not drop them (they were in
  // use): drop now, zeroed, those nothing names any more, as it would have.
  bool erased_meanwhile = false;
  {
    std::lock_guard lock(mu_);
    erased_meanwhile = erasures_begun_ != snap->erasures_begun;
  }
  if (erased_meanwhile) DropUnnamedBlocks(held);
  return file;
}

void Engine::DropUnnamedBlocks(std::span<const BlockHash> keys) {
  const std::set<BlockHash> named = NamedBlocks(nullptr, /*with_prefixes=*/true);
  for (const BlockHash& h : keys)
    if (!named.count(h)) pool_->Drop(h);
  // Device copies of the freed blocks are zeroed before the erasure returns.
  RunOnEngine<int>([&] {
    ForgetFreedBlocks();
    return 0;
  });
}

// What a kv.safetensors says beside the cache must be something an export of this model can say:
// token ids of its vocabulary (an id past it would index past the embeddings at the next turn)
// and a conversation of user and assistant turns (the system prompt is not part of it).
Status Engine::CheckImportedText(const store::CacheExportInfo& info, std::string* text,
                                 std::vector<uint32_t>* ends) const {
  const int64_t n_vocab = model_->hparams().n_vocab;
  for (size_t i = 0; i < info.tokens.size(); ++i) {
    if (info.tokens[i] >= n_vocab) {
      return InvalidArgument(fmt::format("kv.safetensors: token id {} (position {}) is not in the model's vocabulary "
                                         "of {} tokens",
                                         info.tokens[i], i, n_vocab));
    }
  }
  for (size_t i = 0; i < info.conversation.size(); ++i) {
    const std::string& role = info.conversation[i].role;
    if (role != "user" && role != "assistant") {
      return InvalidArgument(fmt::format("kv.safetensors: conversation turn {} has the role \"{}\"; an agent's turns "
                                         "are \"user\" or \"assistant\"",
                                         i, ClipForMessage(role, 32)));
    }
  }
  // A conversation that no context holds could never be followed by a turn: every later turn
  // would fail. Its turns' texts, each encoded alone, may take a token or two more than together
  // (merges across a boundary are lost, a leading space marker), hence the slack, per turn that
  // has text and at most an eighth of the context (empty turns would otherwise buy any amount);
  // the byte bound first, so that a huge text is refused without encoding it.
  // (No token stands for more text than its vocabulary's longest piece.)
  const Tokenizer& tok = model_->tokenizer();
  size_t longest_piece = 1;
  for (TokenId t = 0; t < tok.n_vocab(); ++t) longest_piece = std::max(longest_piece, tok.token_text(t).size());
  int64_t turns_with_text = 0;
  size_t conversation_bytes = 0;
  for (const ConversationTurn& turn : info.conversation) {
    conversation_bytes += turn.text.size();
    turns_with_text += !turn.text.empty();
  }
  const int64_t most_tokens = n_ctx_ + std::min(2 * turns_with_text, n_ctx_ / 8);
  bool fits = conversation_bytes <= static_cast<size_t>(most_tokens) * longest_piece;
  int64_t conversation_tokens = 0;
  for (size_t i = 0; fits && i < info.conversation.size(); ++i) {
    conversation_tokens += static_cast<int64_t>(tok.Encode(info.conversation[i].text, false, false).size());
    fits = conversation_tokens <= most_tokens;
  }
  if (!fits) {
    return InvalidArgument(fmt::format("kv.safetensors: its conversation ({} bytes) is longer than the context of {} "
                                       "tokens holds: no turn could follow it",
                                       conversation_bytes, n_ctx_));
  }
  text->clear();
  ends->clear();
  // The text is believed only for a cache of every token whose file says where each token's
  // text ends (exports since 2026-12-01), and only when the tokens spell it: the next turn keeps
  // the cache as far as that text matches the conversation, so text the tokens do not stand for
  // would keep attention state that the transcript does not show. Otherwise the text is dropped
  // and the import goes on: the next turn then keeps only the tokens that the conversation the
  // agent shows encodes to (an agent whose ends were never recorded, from before they were,
  // exports one run of them that its tokens rarely spell; its file must still import).
  if (info.context_text.empty() || info.n_cached != static_cast<int64_t>(info.tokens.size()) ||
      info.token_end_deltas.empty())
    return Status::Ok();
  // A text longer than its tokens' longest pieces is not the tokens' (and encoding it to check
  // would take as long as the file makes it).
  if (info.context_text.size() > info.tokens.size() * (longest_piece + 4)) return Status::Ok();
  std::optional<std::vector<uint32_t>> read =
      TokenEndsFromDeltas(info.token_end_deltas, info.tokens.size(), info.context_text.size());
  std::optional<size_t> bad =
      read ? FirstTokenNotSpellingText(tok, info.tokens, info.context_text, *read) : std::optional<size_t>(0);
  if (bad) {
    spdlog::info("engine: kv.safetensors: its token {} is not what its context_text says there; imported "
                 "without the text (the next turn matches the conversation on tokens)",
                 *bad);
    return Status::Ok();
  }
  *text = info.context_text;
  *ends = std::move(*read);
  return Status::Ok();
}

bool Engine::HoldsBlockBytes(const BlockHash& name, std::span<const uint8_t> bytes) {
  if (PoolBlock* b = pool_->Hold(name)) {
    const bool same = b->bytes >= static_cast<int64_t>(bytes.size()) && std::memcmp(b->data, bytes.data(), bytes.size()) == 0;
    pool_->Release(b);
    return same;
  }
  if (!store_ || !store_->HasBlock(name)) return false;
  std::vector<uint8_t> stored(bytes.size());
  return store_->ReadBlockInto(name, stored).ok() && std::equal(stored.begin(), stored.end(), bytes.begin());
}

Status Engine::ImportCache(const std::string& name, std::string_view bytes) {
  // The file must be in the format the agent's settings ask for, or in the one the cache it
  // holds is still in after a settings change (until its next turn recomputes it): a file just
  // exported then comes back as it was, and the next turn drops it like the cache it replaced.
  AgentSettings settings;
  KvFormat cache_format;
  bool holds_cache = false;
  uint32_t owner_uid = 0;
  {
    std::lock_guard lock(mu_);
    auto it = agents_.find(name);
    if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
    KVFS_RETURN_IF_ERROR(RefuseIfUnreadable(*it->second));
    settings = it->second->settings;
    cache_format = it->second->format;
    holds_cache = !it->second->tokens.empty();
    owner_uid = it->second->owner_uid;
  }
  KVFS_ASSIGN_OR_RETURN(KvFormat format, FormatFor(settings));
  // Validate everything before touching the agent.
  auto read = [&](const KvFormat& f) {
    return store::ReadKvSafetensors(bytes, fingerprint_, GeometryOf(model_->hparams(), f), options_.block_tokens);
  };
  Result<store::ImportedCache> parsed = read(format);
  if (!parsed.ok() && holds_cache && !(cache_format == format)) {
    if (Result<store::ImportedCache> as_cached = read(cache_format); as_cached.ok()) {
      parsed = std::move(as_cached);
      format = cache_format;
    }
  }
  if (!parsed.ok()) return parsed.status();
  store::ImportedCache imported = std::move(*parsed);
  if (imported.info.n_cached > n_ctx_) return InvalidArgument("kv.safetensors: the cache is longer than the context");
  std::string context_text;
  std::vector<uint32_t> context_ends;
  KVFS_RETURN_IF_ERROR(CheckImportedText(imported.info, &context_text, &context_ends));
  // Nothing ties the file's K/V to the token ids it claims (whoever writes the file decides
  // what this agent attends to), so its blocks must never stand in for the ones the engine
  // computes for those tokens, for another agent of the uid or for a later import of other
  // bytes. A block takes the computed name only while every block up to it is byte for byte the
  // block of that name the engine holds (a backup of a cache still stored, a clone); from the
  // first that is not, the blocks are named in a domain of this file's bytes, and the blocks the
  // agent computes after them chain from those names, so they stay apart too. The same file
  // imported again shares them.
  // (Off the engine lock: the checks may read blocks from the store.)
  const XXH128_hash_t file_hash = XXH3_128bits(bytes.data(), bytes.size());
  const std::string uid_domain = engine_internal::DomainOf(owner_uid);
  const std::string import_domain = fmt::format("{}:import:{:016x}{:016x}", uid_domain, file_hash.high64, file_hash.low64);
  const int64_t B = options_.block_tokens;
  std::vector<BlockHash> names;
  int64_t verified_tokens = 0;
  for (int64_t i = 0; i < imported.info.n_cached / B; ++i) {
    const BlockHash parent = i > 0 ? names.back() : BlockHash{};
    const std::span<const TokenId> span(imported.info.tokens.data() + i * B, static_cast<size_t>(B));
    const BlockHash computed = ChainHash(parent, span, fingerprint_, format, uid_domain);
    if (verified_tokens == i * B && HoldsBlockBytes(computed, imported.chunks[static_cast<size_t>(i)])) {
      names.push_back(computed);
      verified_tokens += B;
    } else {
      names.push_back(ChainHash(parent, span, fingerprint_, format, import_domain));
    }
  }
  // Rows past the verified blocks (unchecked blocks, and the tail, which is never checked) taint
  // every block the agent names from them on, until its cache keeps none of them.
  const bool tainted = verified_tokens < imported.info.n_cached;
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
      auto now = FormatFor(a->settings);
      if (!now.ok() || !(*now == format || a->format == format)) {
        return InvalidArgument("kv.safetensors: the agent's KV format changed");
      }
    }
    const KvLayout layout = KvLayoutFor(model_->hparams(), format, B);
    SequenceKv seq(layout, n_ctx_, *pool_);
    for (size_t i = 0; i < imported.chunks.size(); ++i) {
      const std::vector<uint8_t>& c = imported.chunks[i];
      const bool full = imported.chunk_tokens[i] == B;
      KVFS_ASSIGN_OR_RETURN(PoolBlock* b, pool_->Allocate(full ? layout.block_bytes() : layout.tail_block_bytes()));
      seq.SetBlock(static_cast<int64_t>(i), b);
      if (full ? c.size() != static_cast<size_t>(layout.block_bytes())
               : !ExpandTail(layout, c, imported.chunk_tokens[i], b->data)) {
        return Internal("kv.safetensors: an imported chunk does not match the KV layout");
      }
      if (full) std::memcpy(b->data, c.data(), c.size());
    }
    seq.SetTokens(imported.info.n_cached);
    ReleaseCache(*a);
    {
      std::lock_guard lock(mu_);
      a->format = format;
      a->conversation = imported.info.conversation;
      a->tokens.assign(imported.info.tokens.begin(), imported.info.tokens.begin() + imported.info.n_cached);
      for (size_t i = 0; i < names.size(); ++i) seq.NameBlock(static_cast<int64_t>(i), names[i]);
      a->blocks = names;
      a->import_domain = tainted ? import_domain : std::string();
      a->verified_tokens = tainted ? verified_tokens : 0;
      // Unknown unless the file says it, and its tokens spell it (CheckImportedText): then the
      // next turn matches on tokens only (DIVERGE).
      a->cached_text = std::move(context_text);
      a->token_ends = std::move(context_ends);
      a->dropped = {};
      a->updated_ms = Now();
      a->last_turn.reset();  // the record was of the conversation the import replaced
      a->last_turn_queued.reset();
    }
    // Then, on the engine thread: a failed commit puts the agent back at its committed state;
    // either way what it no longer names leaves the pool.
    CommitAgent(*a, &seq, nullptr, [this, a, &committed](const kvfs::Status& s) {
      Post([this, a, s, &committed] {
        if (s.ok()) DropStaleKeys(*a);
        else RollBackToCommitted(*a);
        committed.set_value(s);
      });
    });
    return kvfs::Status::Ok();
  });
  if (!started.ok()) return started;
  return done.get();
}

}  // namespace kvfs
