// Internals of the Engine (engine.h). Threads:
//   - callers (FUSE threads): read agent records under mu_, queue turns, post tasks;
//   - the engine thread: owns every SequenceKv and the backend; runs tasks and the turn
//     scheduler (one forward pass per step over all running turns: decode tokens of the
//     generating ones plus prefill chunks of prefilling turns, shortest remaining first:
//     prefill_plan.h);
//   - the store thread: commits manifests, blocks and tails in FIFO order, then completes the
//     turn (on_done) and marks its blocks persisted (evictable).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/warm_up.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/sequence_kv.h"
#include "engine/model/model.h"
#include "engine/runtime/context_text.h"
#include "engine/runtime/engine.h"
#include "engine/store/cache_store.h"
#include "engine/store/fs.h"
#include "engine/store/safetensors.h"

namespace kvfs::engine_internal {

using Clock = std::chrono::steady_clock;

// Sharing domains of block names: agents of one uid share blocks among themselves; .prefixes/
// blocks are shared by everyone.
inline std::string DomainOf(uint32_t uid) { return "uid:" + std::to_string(uid); }
inline constexpr std::string_view kPrefixDomain = "prefix";

// Unique per agent record for the life of the process. An erased agent's record is freed once
// nothing refers to it (EraseAgent), so a later record may have its address: identity checks
// made across an engine call compare this instead.
inline uint64_t NextAgentSerial() {
  static std::atomic<uint64_t> next{0};
  return ++next;
}

struct AgentRecord {
  const uint64_t serial = NextAgentSerial();
  // Guarded by Engine::mu_.
  std::string name;
  uint32_t owner_uid = 0;
  std::string system;
  AgentSettings settings;
  std::vector<ConversationTurn> conversation;  // committed turns
  int64_t created_ms = 0, updated_ms = 0;
  std::deque<TurnRequest> queue;  // waiting, not yet started
  bool running = false;
  bool generating = false;  // the running turn has produced its first token
  bool prefilling = false;  // the running turn was admitted (memory for its KV) and is prefilling
  bool loading = false;     // its cache is being read from disk (state "warm")
  int erasing_cache = 0;  // EraseCache calls at work: its queued turns wait, then rebuild
  // KV bytes its running turn holds that ResidencyOf does not count (past the chain of named
  // blocks it reuses: the tail it resumed, the blocks it writes), so that status.json's
  // memory_bytes covers a generating agent's memory (NoteTurnMemory; 0 once its commit names them
  // the agent's, or when no turn runs).
  int64_t turn_bytes = 0;
  // Commit jobs built from this record so far: a failed edit is undone in memory only when no
  // later job (which carries the edit to disk) was built after it.
  uint64_t commits_built = 0;
  std::optional<TurnStats> last_turn;
  // The record the newest commit job carries (ManifestOf): last_turn once that commit is done. An
  // edit's manifest built meanwhile carries it too, so the disk never goes back to an older one.
  std::optional<TurnStats> last_turn_queued;
  std::string last_error;
  // Why its saved state could not be read (both manifests damaged, or written by a newer kvfs).
  // Such an agent is listed, owned by root, so that it can be erased, and refuses everything
  // else: a commit would overwrite what is left of it. Set at restore, never changed.
  std::string unreadable;
  int64_t disk_bytes = 0;
  uint64_t hits = 0;
  // ExportSize's last answer, with a hash of everything it depends on: computing it costs a
  // JSON dump of the conversation (~0.3 ms for 2k tokens), hashing that 1%.
  uint64_t export_key[2] = {0, 0};
  uint64_t export_bytes = 0;

  // The cache: engine thread only.
  KvFormat format;
  std::vector<TokenId> tokens;   // context tokens, all with K/V (the cache never lags here)
  std::string cached_text;       // the rendered context that `tokens` encode (up to a byte
                                 // that is no UTF-8, which only a generated token makes)
  std::vector<uint32_t> token_ends;  // per token: the end of its text in cached_text (context_text.h)
  std::vector<BlockHash> blocks; // names of the cache's full blocks, in order
  // An imported cache whose rows past `verified_tokens` are the file's, unchecked (ImportCache:
  // not byte for byte blocks kvfsd holds, or its tail): the blocks the agent names hold such rows
  // or rows computed over them, so they are named in this domain (the file's), never in the
  // uid's, where other agents would take them for computed ones. Empty when no row is the file's
  // unchecked; cleared when the cache keeps none of them, or is dropped. In the manifest.
  std::string import_domain;
  int64_t verified_tokens = 0;
  // The context of a cache dropped whole (rm kv.safetensors, another KV format, a restart with
  // another --block-tokens): its tokens and their text, while `tokens` is empty. The next turn
  // recomputes these tokens instead of encoding the conversation again, which would lose those
  // with no text (a generated BOS) and give the model another context. Kept in the manifest
  // (tokens without blocks); cleared when a turn or an import gives the agent a cache again.
  struct DroppedContext {
    std::vector<TokenId> tokens;
    std::string text;             // as cached_text
    std::vector<uint32_t> ends;   // as token_ends
  } dropped;
  // The context the next turn starts from, and the manifest stores: the cache's, or while there
  // is none, the dropped one's.
  struct ContextRef {
    const std::vector<TokenId>& tokens;
    const std::string& text;
    const std::vector<uint32_t>& ends;
  };
  ContextRef Context() const {
    if (tokens.empty() && !dropped.tokens.empty()) return {dropped.tokens, dropped.text, dropped.ends};
    return {tokens, cached_text, token_ends};
  }
  std::optional<BlockHash> parked_tail;      // key of the partial tail cached in the pool
  std::optional<store::TailRef> disk_tail;   // the committed tail on disk
  uint64_t tail_generation = 0;
  // Keys its cache has had in the pool (NoteKeys). Those it no longer names are dropped after
  // each commit (DropStaleKeys) and at erasure, so superseded attention state (a diverged
  // branch, an earlier tail, a failed commit's blocks) neither lingers in memory nor, never
  // persisted, holds the budget for good.
  std::set<BlockHash> pool_keys;
};

// The domain an agent's new blocks are named in: its uid's, or its unchecked import's.
inline std::string NamingDomain(const AgentRecord& a) {
  return a.import_domain.empty() ? DomainOf(a.owner_uid) : a.import_domain;
}

struct ActiveTurn {
  AgentRecord* agent = nullptr;
  TurnRequest request;
  std::unique_ptr<SequenceKv> seq;
  std::vector<TokenId> context;      // every token of the turn's context (prompt, then fed replies)
  std::vector<uint32_t> context_ends;  // per token of context: its text's end in rendered_prompt +
                                       // fed_text (context_text.h)
  size_t prefill_at = 0;             // next context token to run
  size_t prefill_waited = 0;         // prefill steps in a row it was passed over (PlanPrefill)
  std::string rendered_prompt;
  std::vector<TextSpan> rendered_content;  // its messages' contents (ChatTemplate::Format)
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StopChecker> stop;
  std::unique_ptr<StreamDecoder> decoder;
  std::string reply;
  std::string fed_text;              // text of the generated tokens fed back, as the reply shows it
  TokenId pending = kNoToken;        // sampled, to be fed next step
  std::string domain;
  std::vector<std::string> prefix_copies;  // prefixes its blocks are copied for at its end (PrefixesToCopy)
  TurnStats stats;
  Clock::time_point submitted, first_token, decode_start;
  bool cancelled = false;
  bool loaded = false;  // its cache load (if any) finished: ready for PrepareTurn
  int64_t kv_admitted_bytes = 0;     // the most KV memory it can take (AdmitKv)
  bool waiting_for_kv = false;       // its last step did not get KV memory (ReserveStepKv)
  kvfs::Status kv_wait_status;       // why, for the failure should it come to that
};

// Cache files to read into the pool on the loader thread (blocks and the tail end up cached,
// idle, under their names); `done` runs on the loader thread with the tail's key if it loaded.
struct LoadJob {
  std::string agent;
  KvLayout layout;
  std::vector<BlockHash> blocks;
  std::optional<store::TailRef> disk_tail;
  BlockHash tail_key;
  std::function<void(std::optional<BlockHash>)> done;
};

// A commit for the store thread. Holds references to the blocks it writes.
struct CommitJob {
  std::string agent;
  store::Manifest manifest;
  std::vector<store::NewBlock> new_blocks;
  std::vector<PoolBlock*> held;     // released after the commit
  std::vector<uint8_t> tail_bytes;  // compact tail payload
  std::optional<store::TailData> tail;
  std::optional<BlockHash> tail_key;
  bool keep_tail = false;                   // no tail data: keep the stored tail (an edit)
  std::function<Status()> run;              // instead of a commit: another store operation (erasure)
  std::function<void(const Status&)> done;  // on the store thread
};

}  // namespace kvfs::engine_internal

namespace kvfs {

class Engine final : public AgentEngine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine() override;

  std::vector<AgentInfo> ListAgents() override;
  Result<AgentInfo> GetAgent(const std::string& name) override;
  Status CreateAgent(const std::string& name, uint32_t owner_uid) override;
  Result<std::vector<ConversationTurn>> Conversation(const std::string& name) override;
  Status SetSystem(const std::string& name, std::string text) override;
  Status SetSettings(const std::string& name, const AgentSettings& settings) override;
  Status CheckSettings(const AgentSettings& settings) override;
  Status SubmitTurn(TurnRequest request) override;
  Result<store::EraseReport> EraseAgent(const std::string& name) override;
  Result<store::EraseReport> EraseCache(const std::string& name) override;
  Result<std::string> ExportCache(const std::string& name) override;
  // One try of ExportCache. Sets *moved_on when it failed because the agent's cache changed
  // under it (its own commit shredded a block or replaced the tail being read): a new snapshot
  // then succeeds.
  Result<std::string> ExportCacheOnce(const std::string& name, bool* moved_on);
  // How many of `blocks`, from the first, an export can have: each in the pool or on disk (not
  // mu_: the store's lock may wait for a commit).
  size_t ExportableBlocks(std::span<const BlockHash> blocks) const;
  Result<uint64_t> ExportSize(const std::string& name) override;
  Status ImportCache(const std::string& name, std::string_view safetensors_bytes) override;
  void Prefetch(const std::string& name) override;
  Status AddPrefix(const std::string& name, std::string text, uint32_t owner_uid) override;
  Result<store::EraseReport> RemovePrefix(const std::string& name) override;
  Result<store::EraseReport> ReplacePrefix(const std::string& name, std::string text, uint32_t owner_uid) override;
  std::vector<std::string> ListPrefixes() override;
  Result<std::string> PrefixText(const std::string& name) override;
  uint32_t PrefixOwner(const std::string& name) override;
  EngineStatus Stats() override;
  nlohmann::json ModelInfo() override;
  void Shutdown() override;

 private:
  using AgentRecord = engine_internal::AgentRecord;
  using ActiveTurn = engine_internal::ActiveTurn;
  using CommitJob = engine_internal::CommitJob;
  using LoadJob = engine_internal::LoadJob;

  struct Prefix {
    std::string text;
    uint32_t owner_uid = 0;
    std::vector<TokenId> tokens;
    std::vector<BlockHash> blocks;  // pinned, in the daemon's KV format
    // Pinned too: its full blocks in other KV formats (KvFormatId), copied from the first turn in
    // that format that computed them (PrefixesToCopy), while all prefixes' pinned blocks stay
    // within half the KV budget. Not in its record or the store: after a restart, the first such
    // turn makes them again.
    struct FormatCopy {
      std::vector<BlockHash> blocks;
      int64_t block_bytes = 0;  // of that format
    };
    std::map<uint32_t, FormatCopy> other_formats;
    std::set<uint32_t> formats_not_copied;  // formats whose copy would not fit (warned once)
    // Why its saved record cannot be read (a damaged or newer-format file), else empty. Such a
    // prefix has no text or blocks; it is listed, owned by root (its owner is unknown), so that
    // it can be erased or written anew.
    std::string unreadable;
  };
  // Where a prefix's blocks came from (PinPrefix).
  struct PrefixSources {
    size_t cached = 0, loaded = 0, prefilled = 0;
  };

  explicit Engine(const EngineOptions& options);
  kvfs::Status Init();
  kvfs::Status RestoreAgents();
  // kIoError naming the reason when `agent` is unreadable (see AgentRecord), else Ok.
  static kvfs::Status RefuseIfUnreadable(const AgentRecord& agent);
  // ImportCache: the file's token ids and conversation are ones this model's agents can have.
  // Also settles the text behind the imported tokens: the file's context_text and token_ends
  // when the tokens spell them (a file whose tokens do not is refused), empty when it says none
  // (the next turn then keeps only the tokens that the visible conversation encodes to).
  kvfs::Status CheckImportedText(const store::CacheExportInfo& info, std::string* text,
                                 std::vector<uint32_t>* ends) const;
  // ImportCache, engine thread: whether the block of this name, in memory or stored, is `bytes`.
  bool HoldsBlockBytes(const BlockHash& name, std::span<const uint8_t> bytes);
  // What kv.safetensors records of the agent besides its K/V rows, for the first n_cached of its
  // tokens (ExportCache, ExportSize). Under mu_, or on the engine thread.
  store::CacheExportInfo ExportInfoOf(const AgentRecord& a, int64_t n_cached) const;
  // Applies `edit` to the agent on the engine thread (mu_ held) and commits its manifest:
  // kNotFound, or RefuseIfUnreadable's error, and nothing is applied.
  kvfs::Status EditAgent(const std::string& name, const std::function<void(AgentRecord&)>& edit);
  // The prefixes of the store's records, pinned again (after the engine threads started).
  kvfs::Status RestorePrefixes();
  // Engine thread: makes the full blocks of p.tokens (PrefixTokens of its text) resident and
  // pinned (from the pool, else the store, else prefilled) and fills p.blocks. Returns each block retained once, for
  // PersistPrefix; on an error nothing stays pinned.
  Result<std::vector<PoolBlock*>> PinPrefix(Prefix& p, PrefixSources* sources);
  // A prefix's tokens: its text encoded as a context is (a leading BOS text is the BOS the
  // tokenizer adds).
  std::vector<TokenId> PrefixTokens(std::string_view text) const;
  // Bytes the prefixes' blocks pin (in the daemon's KV format and their copies in others), but
  // for the prefix `except`'s, with `more_blocks` in the daemon's format besides (takes mu_).
  int64_t PinnedPrefixBytes(const std::string& except = {}, int64_t more_blocks = 0);
  // Whether `more_bytes` more pinned by prefixes would keep them within half the KV budget
  // (pinned blocks are never evicted: a prefix that took it all made every turn of every agent
  // fail). The error says how far over; `except` as in PinnedPrefixBytes.
  kvfs::Status PrefixPinFits(const std::string& except, int64_t more_blocks, int64_t more_bytes = 0);
  // Engine thread: pins the prefix-domain blocks of the full blocks of `tokens` in `format` (from
  // the pool, else the store, else prefilled), appending their hashes to `blocks`; returns each
  // retained once. On an error nothing stays pinned.
  Result<std::vector<PoolBlock*>> PinPrefixBlocks(std::span<const TokenId> tokens, const KvFormat& format,
                                                  std::vector<BlockHash>* blocks, PrefixSources* sources);
  // Engine thread, before a turn that reuses nothing: the prefixes whose full blocks start
  // `context` and that have none yet in `format` (not the daemon's). The turn computes those
  // blocks itself, and at its end CopyBlocksToPrefixes pins copies of them in the prefix's
  // domain, so that later agents in that format, of any uid, share the prefix as the design
  // says. Only a turn that reused nothing is copied from: its blocks are what this engine computed
  // from the prefix's tokens (never imported ones, whoever wrote them).
  std::vector<std::string> PrefixesToCopy(const KvFormat& format, std::span<const TokenId> context);
  // Engine thread, at the end of a successful turn (its full blocks named): see PrefixesToCopy.
  void CopyBlocksToPrefixes(const ActiveTurn& turn, const AgentRecord& agent);
  // Engine thread: unpins p's blocks, in every format, and drops those no agent holds (erasure of memory).
  store::EraseReport UnpinPrefix(const Prefix& p);
  // Engine thread: unpins `blocks` and drops those no agent names (`others`: the blocks agents
  // name, when known), counting them in `report`.
  void UnpinBlocks(std::span<const BlockHash> blocks, const std::set<BlockHash>* others, store::EraseReport* report);
  // Writes p's record and the blocks the store lacks (store thread); releases `held`. A record
  // of the same name is replaced; `replaced` (optional) counts the erasure of its blocks.
  kvfs::Status PersistPrefix(const std::string& name, const Prefix& p, std::vector<PoolBlock*> held,
                             store::EraseReport* replaced = nullptr);
  // PinPrefix then PersistPrefix of a prefix with this text and owner; on an error nothing of
  // it stays pinned (AddPrefix and ReplacePrefix; prefix_mu_ held).
  Result<Prefix> PinAndPersistPrefix(const std::string& name, std::string text, uint32_t owner_uid,
                                     store::EraseReport* replaced);
  // Sets an agent's conversation, settings and cache references from its committed manifest.
  void ApplyManifest(AgentRecord& agent, const store::Manifest& manifest) const;

  // Engine thread.
  void EngineLoop();
  // Runs `task` on the engine thread and waits for it.
  template <typename T>
  T RunOnEngine(std::function<T()> task);
  // Queues `task` for the engine thread (from any thread; mu_ not held).
  void Post(std::function<void()> task);
  // The blocks every agent but `except` names, and with_prefixes the prefixes' too: those are
  // still someone's state, not to be dropped (takes mu_).
  std::set<BlockHash> NamedBlocks(const AgentRecord* except, bool with_prefixes);
  // Whether a prefix in .prefixes/ now pins the block (takes mu_).
  bool PinnedByPrefix(const BlockHash& h);
  // Erasure of memory: zeroes and frees those of `keys` that nothing names and nothing uses,
  // and their device copies (not on the engine thread).
  void DropUnnamedBlocks(std::span<const BlockHash> keys);
  void StartTurns();
  kvfs::Status PrepareTurn(ActiveTurn& turn);
  // Makes the first `keep` tokens of `tokens` resident in turn.seq from the agent's own blocks,
  // shared blocks of the same domain or prefixes, and the disk; returns how many it got.
  int64_t AssembleCache(ActiveTurn& turn, const std::vector<TokenId>& tokens, int64_t keep);
  // pool_->Allocate for a block read back from disk; when the budget is full, waits (briefly)
  // for the store to write blocks that then become evictable.
  Result<PoolBlock*> AllocateToReload(int64_t bytes);
  PoolBlock* LoadBlock(const BlockHash& hash, const KvLayout& layout);
  void Step();
  // Whether a prepared turn may start now: under a KV budget, the most memory it can take (its
  // context bound: the agent's tokens, the new text at a token a byte, the template, the whole
  // reply) must fit beside the running turns' bounds. A lone turn always starts. Turns that
  // start together cannot then grow into each other and all stall half-way.
  bool AdmitKv(ActiveTurn& turn);
  // Reserves each step's KV blocks. Steps whose turns cannot get them (the KV budget) leave the
  // batch and wait for others to finish; when no step gets its blocks, the turn started last
  // fails. Other reservation errors fail their turn. Returns how many decode steps are left.
  size_t ReserveStepKv(std::vector<SequenceStep>& steps, std::vector<ActiveTurn*>& owners,
                       std::vector<size_t>& chunk);
  // Logs, once per wait, the turns among `short_of_memory` (indices into owners) still running.
  void NoteWaitingForKv(const std::vector<ActiveTurn*>& owners, const std::vector<size_t>& short_of_memory);
  // Copies the backend's health (fallbacks, a lost or remade device) and its block copies into
  // counters_; the second with mu_ held.
  void NoteBackendHealth();
  void NoteBackendHealthLocked(const BackendHealth& health);
  size_t SharedPrefillChunk() const;
  size_t SoloPrefillChunk() const;
  void OnLogits(ActiveTurn& turn, const float* logits);
  void FinishTurn(ActiveTurn& turn, kvfs::Status error);
  void FailTurn(ActiveTurn& turn, const kvfs::Status& error);
  // Names full blocks, parks the tail, queues the commit; completes the turn after it.
  // turn_stats: the record of the turn being committed (null for other commits: the agent's
  // last turn stays as it is).
  void CommitAgent(AgentRecord& agent, SequenceKv* seq, const TurnStats* turn_stats,
                   std::function<void(const kvfs::Status&)> done);
  // Forgets the agent's cache; its context stays as AgentRecord::dropped.
  void ReleaseCache(AgentRecord& agent);
  // Engine thread: the agent's record, after failing its running and loading turns, and its
  // queued ones too unless keep_queued.
  Result<AgentRecord*> StopTurnsOf(const std::string& name, const kvfs::Status& why, bool keep_queued = false);
  // Engine thread: queues a load of the agent's cache files that are not in the pool; false if
  // everything is resident (or there is no store).
  bool QueueLoad(AgentRecord& agent, std::function<void()> on_loaded);
  void LoaderLoop();
  // Waits until the loader has finished every job queued so far.
  void DrainLoader();
  // Whether the loader has a job queued or running (takes load_mu_).
  bool LoaderBusy();
  std::vector<BlockHash> AgentBlockKeys(const AgentRecord& agent) const;
  // Engine thread: adds the agent's current keys to agent.pool_keys (before they change).
  void NoteKeys(AgentRecord& agent) const;
  // Engine thread: drops from the pool every key of agent.pool_keys that the agent no longer
  // names and no other agent or prefix does (a key in use is tried again next time).
  void DropStaleKeys(AgentRecord& agent);
  // Engine thread, after a failed commit: the agent goes back to its committed manifest and
  // what the failed commit named leaves the pool.
  void RollBackToCommitted(AgentRecord& agent);

  // Store thread.
  void StoreLoop();
  void Enqueue(CommitJob job);
  kvfs::Status CommitNow(CommitJob job);  // enqueue and wait
  store::Manifest ManifestOf(const AgentRecord& agent) const;  // mu_ held

  Result<KvFormat> FormatFor(const AgentSettings& settings) const;
  // The format a manifest's cache is in (its kv_format_id and name), when this engine can hold
  // it; nullopt for manifests without the id or formats this model and block size cannot take.
  std::optional<KvFormat> StoredFormat(const store::Manifest& manifest) const;
  // Settings of a new agent: the defaults with the daemon's KV format.
  AgentSettings DefaultSettings() const {
    AgentSettings s;
    s.kv = options_.kv;
    return s;
  }
  // The agent's context as its chat template renders it; `content` receives the spans that are
  // messages' contents (ChatTemplate::Format), to be encoded with SpecialParsing(*content).
  std::string Render(const AgentRecord& agent, const std::vector<ConversationTurn>& conversation,
                     std::vector<TextSpan>* content) const;
  // The number of tokens that rendering encodes to.
  size_t RenderedTokens(const AgentRecord& agent, const std::vector<ConversationTurn>& conversation) const;
  AgentInfo InfoOf(const AgentRecord& agent) const;  // mu_ held
  // How much of the agent's cache is in the pool now (mu_ held): its bytes there, and whether
  // all of it is (hot) or none (cold).
  struct Residency {
    int64_t bytes = 0;
    size_t resident = 0, total = 0;
  };
  Residency ResidencyOf(const AgentRecord& agent) const;
  // The state status.json shows (mu_ held); Stats counts agents by it too.
  static AgentState StateOf(const AgentRecord& agent, const Residency& residency);
  // Engine thread: the bytes of turn.seq's blocks that ResidencyOf does not count, published as
  // the agent's turn_bytes (takes mu_).
  void NoteTurnMemory(ActiveTurn& turn);
  // After an erasure: frees the record once every task that may still refer to it has run.
  void ForgetErasedRecord(const AgentRecord* record);
  int64_t Now() const;

  const EngineOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Backend> backend_;
  // The warm-up (engine thread; declared after backend_: destroyed first, it drops its device
  // copies): the one running, its KV format, and the formats still to warm up (last first).
  std::unique_ptr<BackendWarmUp> warm_up_;
  KvFormat warm_up_format_;
  std::vector<KvFormat> warm_up_formats_;
  std::string backend_name_;  // "cpu" or "vulkan: DEVICE"
  // backend_name_, and what became of the device (a lost one: the CPU runs every pass).
  std::string BackendName();
  // Backend choice (EngineOptions::backend), with the CPU as fallback.
  Status MakeBackend();
  // EngineOptions::warm_up: the backend's warm-up in the default KV format and those of the
  // restored agents, planned at start and run pass by pass by the engine thread while it has no
  // turn to run (turns go first).
  void StartWarmUp();
  void WarmUpPass();
  // Engine thread: device copies of the blocks the pool freed since the last call are zeroed
  // and dropped (before every pass, and before an erasure returns).
  void ForgetFreedBlocks();
  std::string fingerprint_;
  std::vector<TokenId> markup_tokens_;  // the chat template's (ChatTemplate::MarkupTokens)
  int64_t n_ctx_ = 0;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<store::FileSystem> owned_fs_;  // when EngineOptions::file_system is null
  std::unique_ptr<store::CacheStore> store_;

  std::mutex mu_;
  std::condition_variable engine_cv_;
  std::map<std::string, std::unique_ptr<AgentRecord>> agents_;
  std::map<std::string, Prefix> prefixes_;
  std::mutex prefix_mu_;  // serializes AddPrefix and RemovePrefix (their pool and store steps)
  // Erased agents' records while their erasure runs: a commit or load queued before it may still
  // refer to them. EraseAgent frees each once those are done (ForgetErasedRecord).
  std::vector<std::unique_ptr<AgentRecord>> erased_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  bool engine_loop_ended_ = false;  // RunOnEngine and Post then run tasks on the caller's thread
  // Held by a task run so (engine-thread state: one at a time; recursive: a task may post one).
  std::recursive_mutex after_loop_mu_;
  bool store_stopping_ = false;
  EngineStatus counters_;  // the cumulative fields; the rest is filled by Status()
  // Erasures (of an agent or of its cache) begun so far: an export that held blocks while one
  // ran drops afterwards what that erasure could not (mu_).
  uint64_t erasures_begun_ = 0;

  std::vector<std::unique_ptr<ActiveTurn>> active_;  // engine thread
  std::vector<std::unique_ptr<ActiveTurn>> warming_; // engine thread: waiting for their cache load
  double decode_step_ms_ = 0;                        // engine thread: moving averages of
  double prefill_ms_per_token_ = 0;                  // step costs (SharedPrefillChunk)
  size_t steps_since_decode_only_ = 0;               // engine thread: see Step

  std::mutex store_mu_;
  std::condition_variable store_cv_;
  std::deque<CommitJob> store_queue_;
  size_t store_jobs_ = 0;                     // store_mu_: queued or running
  std::condition_variable store_job_done_cv_;  // a job finished (ReserveStepKv waits on it)
  uint64_t store_jobs_finished_ = 0;           // store_mu_: jobs finished so far

  std::mutex load_mu_;
  std::condition_variable load_cv_;
  std::deque<engine_internal::LoadJob> load_queue_;
  bool load_stopping_ = false;
  bool loader_ended_ = false;  // the loader thread has returned: its queue is read no more
  bool loader_busy_ = false;   // load_mu_: a job is being loaded (its blocks held meanwhile)

  std::thread engine_thread_, store_thread_, loader_thread_;
  std::thread reserve_thread_;  // fills the pool's free list at start (EngineOptions::kv_reserve_bytes)
};

template <typename T>
inline T Engine::RunOnEngine(std::function<T()> task) {
  std::packaged_task<T()> packaged(std::move(task));
  std::future<T> result = packaged.get_future();
  bool inline_run = false;
  {
    std::lock_guard lock(mu_);
    // After the engine loop has ended (shutdown) nobody would run it: the caller does.
    if (engine_loop_ended_) inline_run = true;
    else tasks_.push_back([&packaged] { packaged(); });
  }
  if (inline_run) {
    std::lock_guard ended(after_loop_mu_);
    packaged();
  } else {
    engine_cv_.notify_all();
  }
  return result.get();
}

}  // namespace kvfs
