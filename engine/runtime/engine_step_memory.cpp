// Engine::ReserveStepKv: each step's KV blocks are taken before the forward pass, so that a KV
// budget too small for every running turn at once makes some turns wait instead of failing the
// whole batch (a failed pass fails every turn in it).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/runtime/engine_impl.h"

namespace kvfs {

bool Engine::AdmitKv(ActiveTurn& turn) {
  const int64_t budget = counters_.memory_budget_bytes;  // set at construction
  const AgentRecord& a = *turn.agent;
  Result<KvFormat> format = FormatFor(a.settings);
  if (!format.ok()) return true;  // PrepareTurn fails it, saying why
  const KvLayout layout = KvLayoutFor(model_->hparams(), *format, options_.block_tokens);
  constexpr int64_t kTemplateTokens = 64;
  // Without a usable cache (another model or format at restore, released) the whole
  // conversation is encoded again.
  size_t history = a.tokens.size();
  if (a.tokens.empty() || a.cached_text.empty())
    for (const ConversationTurn& c : a.conversation) history += c.text.size() + c.role.size() + 16;
  const int64_t bound = std::min<int64_t>(
      n_ctx_, static_cast<int64_t>(history + turn.request.text.size() + a.system.size()) + kTemplateTokens +
                  std::max(0, a.settings.max_tokens));
  const int64_t B = options_.block_tokens;
  const int64_t block_bytes = (std::max(layout.block_bytes(), layout.tail_block_bytes()) + 63) / 64 * 64;
  turn.kv_admitted_bytes = (bound + B - 1) / B * block_bytes;
  int64_t running = 0;
  for (const auto& t : active_) running += t->kv_admitted_bytes;
  if (active_.empty() || budget <= 0 || running + turn.kv_admitted_bytes <= budget) {
    turn.waiting_for_kv = false;
    return true;
  }
  if (!turn.waiting_for_kv) {
    turn.waiting_for_kv = true;
    spdlog::debug("engine: turn of {} waits for KV memory: it may take {} bytes, running turns {} of the budget's {}",
                 a.name, turn.kv_admitted_bytes, running, budget);
  }
  return false;
}

void Engine::NoteWaitingForKv(const std::vector<ActiveTurn*>& owners, const std::vector<size_t>& short_of_memory) {
  for (size_t k : short_of_memory) {
    ActiveTurn& t = *owners[k];
    if (t.agent == nullptr || t.waiting_for_kv) continue;  // failed, or said already
    t.waiting_for_kv = true;
    spdlog::debug("engine: turn of {} waits for KV memory ({})", t.agent->name, t.kv_wait_status.message());
  }
}

size_t Engine::ReserveStepKv(std::vector<SequenceStep>& steps, std::vector<ActiveTurn*>& owners,
                             std::vector<size_t>& chunk) {
  std::vector<bool> keep(steps.size(), true);
  std::vector<size_t> short_of_memory;
  for (size_t k = 0; k < steps.size(); ++k) {
    SequenceKv& kv = *steps[k].kv;
    const kvfs::Status s = kv.Reserve(kv.n_tokens() + static_cast<int64_t>(steps[k].tokens.size()));
    if (s.ok()) continue;
    keep[k] = false;
    if (s.code() == StatusCode::kResourceExhausted) {
      short_of_memory.push_back(k);
      owners[k]->kv_wait_status = s;
    } else {
      FailTurn(*owners[k], s);  // the context is full, say: waiting would not help
    }
    if (chunk[k] > 0) ++owners[k]->prefill_waited;
  }
  const bool none_runs = std::none_of(keep.begin(), keep.end(), [](bool b) { return b; });
  if (none_runs && !short_of_memory.empty()) {
    bool tasks_pending = false;  // e.g. dropping stale blocks, which frees memory
    {
      std::lock_guard lock(mu_);
      tasks_pending = !tasks_.empty();
    }
    // A load holds the blocks it reads until it ends (then they are idle, evictable): no reason
    // to fail a turn either.
    const bool loading = LoaderBusy();
    std::unique_lock lock(store_mu_);
    if (store_jobs_ > 0 || tasks_pending || loading) {
      // Blocks of finished turns become evictable once the store has written them: while it has
      // work, wait for a job (briefly: the engine loop comes back here) instead of failing. The
      // engine's own tasks run first too.
      const size_t before = store_jobs_;
      if (!tasks_pending && !loading)
        store_job_done_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return store_jobs_ < before; });
      lock.unlock();
      if (loading && !tasks_pending) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // (a load: ms)
      NoteWaitingForKv(owners, short_of_memory);
      steps.clear();
      owners.clear();
      chunk.clear();
      return 0;
    }
    lock.unlock();
    // Nobody can go on, so nobody would free memory by finishing: the turn started last fails,
    // its blocks go back to the pool, and the others try again at the next step.
    const size_t youngest = *std::max_element(short_of_memory.begin(), short_of_memory.end(), [&](size_t a, size_t b) {
      return owners[a]->submitted < owners[b]->submitted;
    });
    kvfs::Status why = owners[youngest]->kv_wait_status;
    if (steps.size() == 1) {
      // It ran alone: no other turn's finishing would make room, so the budget is too small for it.
      const SequenceKv& kv = *steps[youngest].kv;
      const int64_t pinned = PinnedPrefixBytes();
      why = kvfs::Status(StatusCode::kResourceExhausted,
                         fmt::format("this turn alone needs more KV memory than the budget of {} bytes holds{}: its "
                                     "context reached {} tokens, in blocks of {} tokens ({}) (raise --kv-budget, or "
                                     "go on in a new agent)",
                                     counters_.memory_budget_bytes,
                                     pinned > 0 ? fmt::format(" besides the {} bytes .prefixes/ pins", pinned) : "",
                                     kv.n_tokens() + static_cast<int64_t>(steps[youngest].tokens.size()),
                                     kv.layout().block_tokens, why.message()));
    }
    FailTurn(*owners[youngest], why);
  }
  NoteWaitingForKv(owners, short_of_memory);
  size_t decode_kept = 0, out = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (!keep[k]) continue;
    owners[k]->waiting_for_kv = false;
    if (chunk[k] == 0) ++decode_kept;
    steps[out] = steps[k];
    owners[out] = owners[k];
    chunk[out] = chunk[k];
    ++out;
  }
  steps.resize(out);
  owners.resize(out);
  chunk.resize(out);
  return decode_kept;
}

}  // namespace kvfs
