// Engine: set-up, the API called from other threads, and the store thread. The turn scheduler
// and the cache assembly are in engine_turns.cpp; what it reports (status, agent info) in
// engine_status.cpp.
#include "engine/runtime/engine.h"

#include <unistd.h>

#include <algorithm>
#include <map>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/core/shred.h"
#include "engine/model/fingerprint.h"
#include "engine/model/ggml_types.h"
#include "engine/kv/kv_payload.h"
#include "engine/runtime/engine_impl.h"
#include "engine/store/manifest.h"

namespace kvfs {

using engine_internal::AgentRecord;
using engine_internal::CommitJob;

namespace {

int64_t DefaultBudget() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return int64_t{1} << 30;
  return static_cast<int64_t>(pages) * page / 4;
}

constexpr int64_t kMaxDefaultContext = 32768;

// Bytes a committed manifest's cache takes on disk: its full blocks and its compact tail.
int64_t CacheDiskBytes(const KvLayout& layout, const store::Manifest& m) {
  return static_cast<int64_t>(m.blocks.size()) * layout.block_bytes() +
         (m.tail ? KvPayloadOf(layout).bytes(m.tail->n_tokens) : 0);
}

}  // namespace

Result<std::unique_ptr<AgentEngine>> CreateEngine(const EngineOptions& options) {
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options));
  return std::unique_ptr<AgentEngine>(std::move(engine));
}

Engine::Engine(const EngineOptions& options) : options_(options) {}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  std::unique_ptr<Engine> engine(new Engine(options));
  KVFS_RETURN_IF_ERROR(engine->Init());
  if (options.warm_up && engine->backend_->CompilesOnFirstUse()) engine->StartWarmUp();
  engine->engine_thread_ = std::thread([e = engine.get()] { e->EngineLoop(); });
  engine->store_thread_ = std::thread([e = engine.get()] { e->StoreLoop(); });
  engine->loader_thread_ = std::thread([e = engine.get()] { e->LoaderLoop(); });
  if (auto fmt = engine->FormatFor(engine->DefaultSettings()); fmt.ok()) {
    const int64_t budget = options.kv_budget_bytes > 0 ? options.kv_budget_bytes : DefaultBudget();
    const int64_t reserve =
        options.kv_reserve_bytes >= 0 ? options.kv_reserve_bytes : std::min(budget / 16, int64_t{64} << 20);
    const int64_t block = KvLayoutFor(engine->model_->hparams(), *fmt, options.block_tokens).block_bytes();
    // At most one full context's worth: what a reload of one agent needs.
    const int64_t n = block > 0 ? std::min(reserve / block, (engine->n_ctx_ + options.block_tokens - 1) / options.block_tokens) : 0;
    if (n > 0) engine->reserve_thread_ = std::thread([e = engine.get(), block, n] { e->pool_->Reserve(block, n); });
  }
  KVFS_RETURN_IF_ERROR(engine->RestorePrefixes());
  return engine;
}

Status Engine::Init() {
  // A private copy: the daemon runs for days, and a model file replaced in place under it
  // (cp over it, a download resumed) must not change or fault its weights.
  KVFS_ASSIGN_OR_RETURN(model_, Model::Load(options_.model_path, Model::PrivateCopyIfItFits(options_.model_path)));
  fingerprint_ = ModelFingerprint(model_->gguf());
  markup_tokens_ = model_->chat_template().MarkupTokens();
  const HParams& hp = model_->hparams();
  n_ctx_ = options_.n_ctx > 0 ? options_.n_ctx : std::min<int64_t>(hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096, kMaxDefaultContext);
  if (hp.n_ctx_train > 0 && n_ctx_ > hp.n_ctx_train)
    spdlog::warn("engine: a context of {} tokens is longer than the {} the model was trained on; replies past {} "
                 "tokens may lose coherence",
                 n_ctx_, hp.n_ctx_train, hp.n_ctx_train);
  if (options_.block_tokens <= 0 || options_.block_tokens > 4096) {
    return InvalidArgument(fmt::format("block size must be in [1, 4096] tokens, not {}", options_.block_tokens));
  }
  pool_ = std::make_unique<BlockPool>(options_.kv_budget_bytes > 0 ? options_.kv_budget_bytes : DefaultBudget());
  counters_.memory_budget_bytes = options_.kv_budget_bytes > 0 ? options_.kv_budget_bytes : DefaultBudget();
  KVFS_RETURN_IF_ERROR(MakeBackend());
  // After the backend: whether it runs the default format is part of the check, and so is
  // whether the budget holds a turn in it.
  KVFS_RETURN_IF_ERROR(CheckSettings(DefaultSettings()));
  if (!options_.store_dir.empty()) {
    if (options_.file_system == nullptr) owned_fs_ = std::make_unique<store::PosixFileSystem>();
    store::FileSystem& fs = options_.file_system != nullptr ? *options_.file_system : *owned_fs_;
    KVFS_ASSIGN_OR_RETURN(store_, store::CacheStore::Open(options_.store_dir, fs));
    KVFS_RETURN_IF_ERROR(RestoreAgents());
  }
  spdlog::info("engine: model {} ({}), fingerprint {}, context {}, KV budget {} bytes, {} agents restored, backend {}",
               model_->name(), options_.model_path, fingerprint_, n_ctx_, counters_.memory_budget_bytes, agents_.size(),
               backend_name_);
  if (model_->chat_template().unrecognised())
    spdlog::warn("engine: the model's chat template is none of the families kvfs renders (chatml, llama2, llama3, "
                 "mistral, gemma, phi3, zephyr): agents' conversations go to it as raw text, which it was not "
                 "trained on; replies may be poor (.model.json: chat_template_recognised false)");
  if (std::string_view marker = model_->chat_template().MissingTurnMarker(); !marker.empty())
    spdlog::warn("engine: the model's chat template is {}, but its vocabulary has no {} token: the template's "
                 "markup reaches the model as plain text, which it was not trained on; replies may be poor",
                 ChatFamilyName(model_->chat_template().family()), marker);
  return Status::Ok();
}

Status Engine::MakeBackend() {
  if (options_.make_backend) {
    KVFS_ASSIGN_OR_RETURN(backend_, options_.make_backend(*model_));
    backend_name_ = backend_->name();
  } else {
    if (options_.backend != "cpu" && options_.backend != "vulkan") {
      return InvalidArgument("backend must be cpu or vulkan, not " + options_.backend);
    }
    KVFS_ASSIGN_OR_RETURN(ChosenBackend chosen,
                          MakeRequestedBackend(*model_, BackendRequest{.vulkan = options_.backend == "vulkan",
                                                                       .device = options_.device,
                                                                       .kv_device_bytes = options_.kv_device_bytes,
                                                                       .tuning = VulkanTuning{},
                                                                       .tuning_file = options_.vulkan_tuning,
                                                                       .cpu = CpuOptions{options_.n_threads, nullptr}}));
    if (!chosen.warning.empty()) spdlog::warn("engine: {}", chosen.warning);
    if (chosen.tuned) spdlog::info("engine: Vulkan settings from {}", options_.vulkan_tuning);
    backend_ = std::move(chosen.backend);
    backend_name_ = chosen.name;
  }
  if (backend_->KeepsBlockCopies()) pool_->TrackFreed();  // device copies follow the host blocks' frees
  return Status::Ok();
}

void Engine::StartWarmUp() {
  Result<KvFormat> format = FormatFor(DefaultSettings());
  if (!format.ok()) return;  // Init checked it
  // The default format first (new agents'), then those of restored agents in other formats.
  std::lock_guard lock(mu_);
  warm_up_formats_ = {*format};
  for (const auto& [name, a] : agents_) {
    if (std::find(warm_up_formats_.begin(), warm_up_formats_.end(), a->format) == warm_up_formats_.end()) {
      warm_up_formats_.push_back(a->format);
    }
  }
  std::reverse(warm_up_formats_.begin(), warm_up_formats_.end());  // taken from the back
  counters_.backend_warming_up = true;
}

void Engine::WarmUpPass() {
  if (warm_up_ == nullptr) {
    warm_up_format_ = warm_up_formats_.back();
    warm_up_formats_.pop_back();
    warm_up_ = std::make_unique<BackendWarmUp>(
        *backend_, KvLayoutFor(model_->hparams(), warm_up_format_, options_.block_tokens), model_->hparams().n_vocab);
  }
  const Status s = warm_up_->RunNextPass();
  NoteBackendHealth();  // a pass may have lost the device
  if (!s.ok()) {
    spdlog::warn("engine: warming up the {} backend for {} KV failed ({}); turns make the kernels they need",
                 backend_name_, warm_up_format_.Name(), s.message());
  } else if (warm_up_->done()) {
    const WarmUpReport& r = warm_up_->report();
    spdlog::info("engine: {} backend warmed up for {} KV: {} passes made {} kernels in {:.2f} s{}", backend_name_,
                 warm_up_format_.Name(), r.passes, r.kernels_made, r.seconds,
                 r.skipped > 0 ? fmt::format(" ({} passes skipped: the device would not run them)", r.skipped) : "");
  }
  if (!warm_up_->done()) return;
  warm_up_.reset();
  if (!warm_up_formats_.empty()) return;
  std::lock_guard lock(mu_);
  counters_.backend_warming_up = false;
}

void Engine::ForgetFreedBlocks() {
  if (!backend_->KeepsBlockCopies()) return;
  const std::vector<uint64_t> freed = pool_->TakeFreed();
  if (Status s = backend_->ForgetBlocks(freed); !s.ok()) {
    // The device can no longer be trusted to have dropped erased state: that is fatal.
    spdlog::critical("engine: could not zero device copies of freed KV blocks: {}", s.message());
    std::abort();
  }
  NoteBackendHealth();  // the loss of a device may show first here
}

Result<KvFormat> Engine::FormatFor(const AgentSettings& settings) const {
  const HParams& hp = model_->hparams();
  KVFS_ASSIGN_OR_RETURN(KvFormat f, MakeKvFormat(settings.kv, options_.kv_rotate, hp.n_head_kv, hp.head_dim));
  // q4k keys are quantized in chunks of C tokens that never span two blocks.
  if (f.KeysByChannel() && options_.block_tokens % f.chunk != 0) {
    return InvalidArgument(fmt::format("kv \"{}\" needs KV blocks of a multiple of {} tokens, not {}", settings.kv,
                                       f.chunk, options_.block_tokens));
  }
  return f;
}

int64_t Engine::Now() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The manifest's opaque config holds what the engine needs besides tokens and blocks.
store::Manifest Engine::ManifestOf(const AgentRecord& a) const {
  store::Manifest m;
  m.name = a.name;
  m.model_fingerprint = fingerprint_;
  m.kv_format = a.format.Name();
  m.block_size = static_cast<uint32_t>(options_.block_tokens);
  // A dropped cache's context: its tokens, with no blocks (restored as dropped again).
  const AgentRecord::ContextRef context = a.Context();
  m.tokens.assign(context.tokens.begin(), context.tokens.end());
  m.conversation = a.conversation;
  m.blocks = a.blocks;
  m.created_ms = a.created_ms;
  m.config = nlohmann::json{{"owner_uid", a.owner_uid},
                            {"system", a.system},
                            {"settings", AgentSettingsToJson(a.settings)},
                            {"context_text", context.text},
                            {"token_ends", TokenEndsToJson(context.ends)},
                            {"kv_format_id", KvFormatId(a.format)}};
  if (a.last_turn_queued) m.config["last_turn"] = TurnStatsToJson(*a.last_turn_queued);
  if (!a.import_domain.empty()) {
    m.config["import_domain"] = a.import_domain;
    m.config["verified_tokens"] = a.verified_tokens;
  }
  return m;
}

void Engine::ApplyManifest(AgentRecord& a, const store::Manifest& m) const {
  a.conversation = m.conversation;
  a.created_ms = m.created_ms;
  a.updated_ms = m.updated_ms;
  const nlohmann::json& c = m.config;
  if (c.is_object()) {
    a.owner_uid = c.value("owner_uid", 0u);
    a.system = c.value("system", std::string());
    a.last_turn = a.last_turn_queued = c.contains("last_turn") ? TurnStatsFromJson(c["last_turn"]) : std::nullopt;
    if (c.contains("settings")) {
      auto s = ParseAgentSettings(c["settings"].dump(), DefaultSettings());
      if (s.ok()) a.settings = *s;
    }
  }
  auto format = FormatFor(a.settings);
  a.format = format.ok() ? *format : KvFormat{};
  a.tokens.clear();
  a.cached_text.clear();
  a.token_ends.clear();
  a.dropped = {};
  a.blocks.clear();
  a.import_domain.clear();
  a.verified_tokens = 0;
  a.disk_tail.reset();
  a.parked_tail.reset();
  a.disk_bytes = 0;
  // A cache in another format than the settings' (kv changed in config.json, or --kv-rotate, since
  // it was made) is kept as it is, in its own format, until the next turn rebuilds it in the new
  // one, as without the restart: it still exports, and its files are counted and erased.
  std::optional<KvFormat> stored = format.ok() && m.kv_format == format->Name() ? std::optional<KvFormat>(*format)
                                                                                  : StoredFormat(m);
  const bool has_text = c.is_object() && c.contains("context_text") && c["context_text"].is_string();
  const bool same_model = m.model_fingerprint == fingerprint_;
  const bool usable = stored.has_value() && same_model &&
                      m.block_size == static_cast<uint32_t>(options_.block_tokens) && has_text;
  if (usable) a.format = *stored;
  std::string text = has_text ? c["context_text"].get<std::string>() : std::string();
  // Written before the ends were kept (or not fitting): the text as one run, which still
  // extends, and diverges as before.
  std::optional<std::vector<uint32_t>> token_ends =
      c.contains("token_ends") ? TokenEndsFromJson(c["token_ends"], m.tokens.size(), text.size()) : std::nullopt;
  std::vector<uint32_t> ends = token_ends ? std::move(*token_ends) : OneRunEnds(m.tokens.size(), text.size());
  // The cache is exactly the committed blocks plus the tail; else, made by this model, its
  // tokens are what the next turn recomputes (another model's ids mean nothing here).
  const size_t cached = m.blocks.size() * m.block_size + (m.tail ? m.tail->n_tokens : 0);
  if (!usable || cached != m.tokens.size()) {
    if (!same_model || !has_text) {
      // Its files stay until the next commit or rm kv.safetensors: status.json counts them.
      if (store_) a.disk_bytes = static_cast<int64_t>(store_->CacheFileBytes(a.name));
      if (!m.tokens.empty())
        spdlog::info("engine: agent {}'s cache was made by another model{}; it is rebuilt from its text on its next turn",
                     a.name, same_model ? " (or without its text)" : "");
      return;
    }
    a.dropped.tokens.assign(m.tokens.begin(), m.tokens.end());
    a.dropped.text = std::move(text);
    a.dropped.ends = std::move(ends);
    // Its files stay until the next commit: counted (and erased by rm kv.safetensors) as its.
    if (stored) a.disk_bytes = CacheDiskBytes(KvLayoutFor(model_->hparams(), *stored, m.block_size), m);
    if (cached > 0)
      spdlog::info("engine: agent {}'s stored cache cannot be used as it is (another format or block size, or blocks "
                   "lost); it is rebuilt from its tokens on its next turn",
                   a.name);
    return;
  }
  a.tokens.assign(m.tokens.begin(), m.tokens.end());
  a.cached_text = std::move(text);
  a.token_ends = std::move(ends);
  a.blocks = m.blocks;
  if (c.contains("import_domain") && c["import_domain"].is_string() && c.contains("verified_tokens") &&
      c["verified_tokens"].is_number_integer()) {
    a.import_domain = c["import_domain"].get<std::string>();
    a.verified_tokens = c["verified_tokens"].get<int64_t>();
  }
  a.disk_tail = m.tail;
  if (m.tail && store_ && !store_->HasTail(a.name, *m.tail)) {
    // (A manifest put back from manifest.prev.json: the commit after it removed that tail.) The
    // tokens stay; the last ones are recomputed from them at the next turn, and an export until
    // then holds the full blocks.
    spdlog::info("engine: agent {}'s tail file {} is missing; its last {} tokens are recomputed at its next turn",
                 a.name, m.tail->file, m.tail->n_tokens);
    a.disk_tail.reset();
  }
  const KvLayout layout = KvLayoutFor(model_->hparams(), a.format, options_.block_tokens);
  a.disk_bytes = CacheDiskBytes(layout, m) - (m.tail && !a.disk_tail ? KvPayloadOf(layout).bytes(m.tail->n_tokens) : 0);
}

std::optional<KvFormat> Engine::StoredFormat(const store::Manifest& m) const {
  const nlohmann::json& c = m.config;
  if (!c.is_object() || !c.contains("kv_format_id") || !c["kv_format_id"].is_number_unsigned()) return std::nullopt;
  const uint64_t id = c["kv_format_id"].get<uint64_t>();
  const HParams& hp = model_->hparams();
  for (const char* type : {"f16", "q8", "q4", "q4k"}) {
    for (const char* rotate : {"on", "off"}) {
      auto f = MakeKvFormat(type, rotate, hp.n_head_kv, hp.head_dim);
      if (!f.ok() || KvFormatId(*f) != id || f->Name() != m.kv_format) continue;
      if (f->KeysByChannel() && options_.block_tokens % f->chunk != 0) continue;
      return *f;
    }
  }
  return std::nullopt;
}

Status Engine::RestoreAgents() {
  // Caches this daemon cannot use as they are, by why: said once, with what keeps them.
  std::map<uint32_t, size_t> other_block_size;
  size_t other_model = 0;
  for (const std::string& name : store_->ListAgents()) {
    auto m = store_->ReadManifest(name);
    auto a = std::make_unique<AgentRecord>();
    a->name = name;
    if (!m.ok()) {
      // Listed so that it can be erased (by root: its owner is unknown) and cannot be made anew
      // over what is left of it by accident.
      spdlog::warn("engine: agent {} is unreadable and can only be erased: {}", name, m.status().message());
      a->unreadable = m.status().message();
      a->last_error = "its saved state cannot be read, so it can only be erased (rm -r): " + a->unreadable;
      a->settings = DefaultSettings();
      agents_[name] = std::move(a);
      continue;
    }
    if (!m->tokens.empty() && m->model_fingerprint != fingerprint_) ++other_model;
    else if ((!m->blocks.empty() || m->tail) && m->block_size != static_cast<uint32_t>(options_.block_tokens))
      ++other_block_size[m->block_size];
    ApplyManifest(*a, *m);
    if (Result<KvFormat> f = FormatFor(a->settings); !f.ok())
      spdlog::warn("engine: agent {}'s turns fail until its config.json names a kv format this daemon runs (e.g. "
                   "{{\"kv\": \"q4\"}}): {}",
                   name, f.status().message());
    for (const auto& r : store_->open_report().recovered_agents)
      if (r.name == name)
        a->last_error = "restored from its previous saved turn; the latest one was lost: " + r.reason;
    agents_[name] = std::move(a);
  }
  for (const auto& [block_size, n] : other_block_size)
    spdlog::warn("engine: {} agents' caches were stored in blocks of {} tokens, and this daemon uses {} "
                 "(--block-tokens): each is recomputed from its tokens on its next turn (restart with "
                 "--block-tokens {} to use them as they are)",
                 n, block_size, options_.block_tokens, block_size);
  if (other_model > 0)
    spdlog::warn("engine: {} agents' caches were made by another model: each is recomputed from its text on its "
                 "next turn",
                 other_model);
  return Status::Ok();
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !engine_thread_.joinable() && !store_thread_.joinable() && !loader_thread_.joinable() &&
        !reserve_thread_.joinable())
      return;
    stopping_ = true;
  }
  engine_cv_.notify_all();
  if (reserve_thread_.joinable()) reserve_thread_.join();
  if (engine_thread_.joinable()) engine_thread_.join();
  {
    std::lock_guard lock(load_mu_);
    load_stopping_ = true;
  }
  load_cv_.notify_all();
  if (loader_thread_.joinable()) loader_thread_.join();
  {
    std::lock_guard lock(store_mu_);
    store_stopping_ = true;
  }
  store_cv_.notify_all();
  if (store_thread_.joinable()) store_thread_.join();
}

// ---- store thread ----

void Engine::Enqueue(CommitJob job) {
  bool queued = false;
  {
    std::lock_guard lock(store_mu_);
    if (!store_stopping_) {
      store_queue_.push_back(std::move(job));
      ++store_jobs_;
      queued = true;
    }
  }
  if (queued) {
    store_cv_.notify_all();
    return;
  }
  // The store thread has stopped (or is draining its last jobs): nothing more is written.
  for (PoolBlock* b : job.held) pool_->Release(b);
  if (job.done) job.done(Internal("the engine has stopped: nothing more is stored"));
}

Status Engine::CommitNow(CommitJob job) {
  std::promise<Status> result;
  auto future = result.get_future();
  job.done = [&result](const Status& s) { result.set_value(s); };
  Enqueue(std::move(job));
  return future.get();
}

void Engine::StoreLoop() {
  for (;;) {
    ScrubStack();  // the last commit's manifest (the agent's text) serialized below this frame
    CommitJob job;
    {
      std::unique_lock lock(store_mu_);
      store_cv_.wait(lock, [&] { return store_stopping_ || !store_queue_.empty(); });
      if (store_queue_.empty()) return;
      job = std::move(store_queue_.front());
      store_queue_.pop_front();
    }
    Status status;
    if (job.run) {
      status = job.run();
    } else if (store_) {
      auto report = store_->CommitTurn(job.agent, job.manifest, job.new_blocks, job.tail, job.keep_tail);
      status = report.status();
      if (report.ok()) {
        // The tail on disk is the new one before the pool may evict the parked tail it copies
        // (MarkPersisted): a turn or export that finds no parked tail must not read the tail
        // file of the commit before, which holds other positions' rows.
        {
          std::lock_guard lock(mu_);
          if (auto it = agents_.find(job.agent); it != agents_.end()) {
            AgentRecord& a = *it->second;
            a.disk_tail = report->manifest.tail;
            const KvLayout layout = KvLayoutFor(model_->hparams(), a.format, options_.block_tokens);
            a.disk_bytes = CacheDiskBytes(layout, report->manifest);
          }
        }
        for (const store::NewBlock& b : job.new_blocks) pool_->MarkPersisted(b.hash);
        for (const BlockHash& h : report->manifest.blocks) pool_->MarkPersisted(h);
        if (job.tail_key) pool_->MarkPersisted(*job.tail_key);
      } else {
        spdlog::warn("engine: committing agent {} failed: {}", job.agent, status.message());
      }
    }
    for (PoolBlock* b : job.held) pool_->Release(b);
    ShredVector(job.tail_bytes);  // KV rows: not left in freed memory (an erasure may follow)
    if (job.done) job.done(status);
    {
      std::lock_guard lock(store_mu_);
      --store_jobs_;
      ++store_jobs_finished_;
    }
    store_job_done_cv_.notify_all();
  }
}

// ---- API ----

Status Engine::CreateAgent(const std::string& name, uint32_t owner_uid) {
  if (!store::IsValidAgentName(name)) return InvalidArgument("invalid agent name \"" + name + "\"");
  CommitJob job;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Internal("the engine is shutting down");
    if (agents_.count(name)) return InvalidArgument("agent \"" + name + "\" exists");
    auto a = std::make_unique<AgentRecord>();
    a->name = name;
    a->owner_uid = owner_uid;
    a->settings = DefaultSettings();
    KVFS_ASSIGN_OR_RETURN(a->format, FormatFor(a->settings));
    a->created_ms = a->updated_ms = Now();
    job.agent = name;
    job.manifest = ManifestOf(*a);
    ++a->commits_built;
    agents_[name] = std::move(a);
  }
  if (!store_) return Status::Ok();
  Status committed = CommitNow(std::move(job));
  if (!committed.ok()) {
    std::lock_guard lock(mu_);
    agents_.erase(name);
  }
  return committed;
}

Result<std::vector<ConversationTurn>> Engine::Conversation(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = agents_.find(name);
  if (it == agents_.end()) return NotFound("no agent \"" + name + "\"");
  std::vector<ConversationTurn> out;
  if (!it->second->system.empty()) out.push_back({"system", it->second->system});
  out.insert(out.end(), it->second->conversation.begin(), it->second->conversation.end());
  return out;
}

Status Engine::RefuseIfUnreadable(const AgentRecord& a) {
  if (a.unreadable.empty()) return Status::Ok();
  return IoError("agent " + a.name + "'s saved state cannot be read, so it can only be erased: " + a.unreadable);
}

Status Engine::EditAgent(const std::string& name, const std::function<void(AgentRecord&)>& edit) {
  // On the engine thread, so the manifest snapshot orders correctly with turn commits.
  struct Editable {
    std::string system;
    AgentSettings settings;
    int64_t updated_ms = 0;
  };
  Editable before, after;
  uint64_t record = 0;  // its serial: the record may be erased, and its address reused, meanwhile
  uint64_t seq = 0;
  Status found;
  CommitJob job = RunOnEngine<CommitJob>([&] {
    std::lock_guard lock(mu_);
    CommitJob j;
    auto it = agents_.find(name);
    if (it == agents_.end()) {
      found = NotFound("no agent \"" + name + "\"");
      return j;
    }
    if (found = RefuseIfUnreadable(*it->second); !found.ok()) return j;
    AgentRecord& a = *it->second;
    before = Editable{a.system, a.settings, a.updated_ms};
    edit(a);
    if (a.system == before.system && a.settings == before.settings) return j;  // nothing changed: nothing to store
    // The agent's files show it as their mtime, so that `cp -u` and rsync see the edit.
    a.updated_ms = Now();
    after = Editable{a.system, a.settings, a.updated_ms};
    record = a.serial;
    seq = ++a.commits_built;
    j.agent = name;
    j.manifest = ManifestOf(a);
    j.keep_tail = true;  // an edit: the cache is unchanged, its stored tail stays (CommitTurn)
    return j;
  });
  KVFS_RETURN_IF_ERROR(found);
  if (!store_ || record == 0) return Status::Ok();
  Status committed = CommitNow(std::move(job));
  if (!committed.ok() && committed.code() != StatusCode::kInternal) {
    // Not on disk, so not made (a full disk): the agent goes back to what it had, unless a job
    // built after this one carries the edit on (a turn's commit, which rolls back to the disk's
    // state if it fails too). Turns that started meanwhile used the edit, as they would a file's
    // contents that a failed close() later left in place. (kInternal: the store may have
    // published it; it follows what is on disk.)
    RunOnEngine<bool>([&] {
      std::lock_guard lock(mu_);
      auto it = agents_.find(name);
      if (it == agents_.end() || it->second->serial != record || it->second->commits_built != seq) return false;
      if (it->second->system == after.system) it->second->system = std::move(before.system);
      if (it->second->settings == after.settings) it->second->settings = std::move(before.settings);
      if (it->second->updated_ms == after.updated_ms) it->second->updated_ms = before.updated_ms;
      return true;
    });
  }
  return committed;
}

Status Engine::SetSystem(const std::string& name, std::string text) {
  return EditAgent(name, [&](AgentRecord& a) { a.system = std::move(text); });
}

Status Engine::CheckSettings(const AgentSettings& settings) {
  KVFS_ASSIGN_OR_RETURN(const KvFormat format, FormatFor(settings));
  // A budget below the block a turn writes into (a q4k one also stages its open chunk's keys;
  // the pool allocates whole 64-byte lines) would fail every turn in this format.
  const int64_t block_bytes = (KvLayoutFor(model_->hparams(), format, options_.block_tokens).tail_block_bytes() + 63) / 64 * 64;
  if (counters_.memory_budget_bytes > 0 && block_bytes > counters_.memory_budget_bytes) {
    return InvalidArgument(fmt::format("a KV budget of {} bytes holds no turn in kv \"{}\": the block of {} tokens a "
                                       "turn writes into takes {} bytes (kvfsd --kv-budget)",
                                       counters_.memory_budget_bytes, settings.kv, options_.block_tokens, block_bytes));
  }
  return Status::Ok();
}

Status Engine::SetSettings(const std::string& name, const AgentSettings& settings) {
  KVFS_RETURN_IF_ERROR(CheckSettings(settings));
  return EditAgent(name, [&](AgentRecord& a) { a.settings = settings; });
}

Status Engine::SubmitTurn(TurnRequest request) {
  // The conversation is stored as JSON text: refuse what it could not hold now, not at commit.
  if (!store::ValidUtf8(request.text)) return InvalidArgument("the prompt is not valid UTF-8");
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Internal("the engine is shutting down");
    auto it = agents_.find(request.agent);
    if (it == agents_.end()) return NotFound("no agent \"" + request.agent + "\"");
    AgentRecord& a = *it->second;
    KVFS_RETURN_IF_ERROR(RefuseIfUnreadable(a));
    if (a.queue.size() + (a.running ? 1 : 0) >= options_.max_queued_turns) {
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("agent {} already has {} turns queued", a.name, options_.max_queued_turns));
    }
    a.queue.push_back(std::move(request));
  }
  engine_cv_.notify_all();
  return Status::Ok();
}

void Engine::Post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (!engine_loop_ended_) {
      tasks_.push_back(std::move(task));
      task = nullptr;
    }
  }
  if (task == nullptr) {
    engine_cv_.notify_all();
    return;
  }
  // After the engine loop has ended (shutdown), a commit or load that finishes still reports
  // back: run here, one at a time, or whoever waits on it (an import's writer, a FUSE thread
  // that the shutdown then waits for) would wait forever.
  std::lock_guard ended(after_loop_mu_);
  task();
}

std::set<BlockHash> Engine::NamedBlocks(const AgentRecord* except, bool with_prefixes) {
  std::set<BlockHash> named;
  std::lock_guard lock(mu_);
  for (auto& [n, a] : agents_)
    if (a.get() != except) named.insert(a->blocks.begin(), a->blocks.end());
  if (with_prefixes) {
    for (auto& [n, p] : prefixes_) {
      named.insert(p.blocks.begin(), p.blocks.end());
      for (const auto& [id, copy] : p.other_formats) named.insert(copy.blocks.begin(), copy.blocks.end());
    }
  }
  return named;
}

bool Engine::PinnedByPrefix(const BlockHash& h) {
  std::lock_guard lock(mu_);
  for (auto& [n, p] : prefixes_) {
    if (std::find(p.blocks.begin(), p.blocks.end(), h) != p.blocks.end()) return true;
    for (const auto& [id, copy] : p.other_formats)
      if (std::find(copy.blocks.begin(), copy.blocks.end(), h) != copy.blocks.end()) return true;
  }
  return false;
}

void Engine::Prefetch(const std::string& name) {
  Post([this, name] {
    AgentRecord* a = nullptr;
    {
      std::lock_guard l(mu_);
      auto it = agents_.find(name);
      if (it == agents_.end() || it->second->running || it->second->loading) return;
      a = it->second.get();
    }
    QueueLoad(*a, [] {});
  });
}

std::vector<std::string> Engine::ListPrefixes() {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (auto& [name, p] : prefixes_) out.push_back(name);
  return out;
}

Result<std::string> Engine::PrefixText(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = prefixes_.find(name);
  if (it == prefixes_.end()) return NotFound("no prefix \"" + name + "\"");
  if (!it->second.unreadable.empty())
    return IoError("prefix " + name + "'s saved record cannot be read, so it can only be erased (rm) or written anew: " +
                   it->second.unreadable);
  return it->second.text;
}

uint32_t Engine::PrefixOwner(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = prefixes_.find(name);
  return it == prefixes_.end() ? 0 : it->second.owner_uid;
}

std::string Engine::BackendName() {
  std::lock_guard lock(mu_);
  if (!counters_.device_lost) return backend_name_;
  return backend_name_ + " (device lost: passes run on the CPU until it is made again)";
}

nlohmann::json Engine::ModelInfo() {
  const HParams& hp = model_->hparams();
  auto fmt = FormatFor(DefaultSettings());
  return nlohmann::json{{"name", model_->name()},
                        {"path", options_.model_path},
                        {"architecture", std::string(ArchitectureName(hp.arch))},
                        {"fingerprint", fingerprint_},
                        {"n_layer", hp.n_layer},
                        {"n_embd", hp.n_embd},
                        {"n_head", hp.n_head},
                        {"n_head_kv", hp.n_head_kv},
                        {"head_dim", hp.head_dim},
                        {"n_vocab", hp.n_vocab},
                        {"n_ctx_train", hp.n_ctx_train},
                        {"n_ctx", n_ctx_},
                        {"weights_bytes", model_->weights().total_bytes},
                        {"weights_type", std::string(GgmlTypeInfo(static_cast<uint32_t>(model_->weights().layers.at(0).wq.type))->name)},
                        {"chat_template", std::string(ChatFamilyName(model_->chat_template().family()))},
                        {"chat_template_recognised", !model_->chat_template().unrecognised()},
                        {"kv_format", fmt.ok() ? fmt->Name() : options_.kv},
                        {"kv_block_tokens", options_.block_tokens},
                        {"kv_budget_bytes", counters_.memory_budget_bytes},
                        {"backend", BackendName()}};
}

}  // namespace kvfs
