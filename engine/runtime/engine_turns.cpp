// The engine thread: turn scheduling (batched forward passes), resume matching, and handing
// finished turns to the store thread. An agent's cache (assembly, loading, keys): engine_cache.cpp.
#include <algorithm>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/core/shred.h"
#include "engine/kv/kv_payload.h"
#include "engine/runtime/engine_impl.h"
#include "engine/runtime/prefill_plan.h"
#include "engine/store/manifest.h"

namespace kvfs {

using engine_internal::ActiveTurn;
using engine_internal::AgentRecord;
using engine_internal::CommitJob;
using engine_internal::DomainOf;
using engine_internal::PlanPrefill;
using engine_internal::PrefillWant;

namespace {

double MsSince(engine_internal::Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(engine_internal::Clock::now() - t0).count();
}

// Prefill chunk: long prompts run in pieces so that generating agents keep decoding between
// them (SharedPrefillChunk sizes them while others decode), and so that an erasure or a
// shutdown, which wait for the running piece, wait at most about a second (SoloPrefillChunk).
constexpr size_t kPrefillChunkAlone = 512;
constexpr size_t kPrefillChunkAloneMin = 128;  // the CPU's panel passes are 128 tokens
constexpr size_t kPrefillChunkShared = 32;  // until step costs are measured
constexpr size_t kRecentSamples = 1024;

template <typename T>
void PushBounded(std::vector<T>& v, T x) {
  if (v.size() >= kRecentSamples) v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(kRecentSamples / 2));
  v.push_back(x);
}

}  // namespace



std::string Engine::Render(const AgentRecord& a, const std::vector<ConversationTurn>& conversation,
                           std::vector<TextSpan>* content) const {
  std::vector<ChatMessage> messages;
  // As for a prompt, one trailing newline (echo's) is not part of the message; the file keeps it.
  std::string_view system = a.system;
  if (!system.empty() && system.back() == '\n') system.remove_suffix(1);
  if (!system.empty()) messages.push_back(ChatMessage{"system", std::string(system)});
  for (const ConversationTurn& t : conversation) messages.push_back(ChatMessage{t.role, t.text});
  return model_->chat_template().Format(messages, /*add_generation_prompt=*/true, content);
}

size_t Engine::RenderedTokens(const AgentRecord& a, const std::vector<ConversationTurn>& conversation) const {
  std::vector<TextSpan> content;
  const std::string text = Render(a, conversation, &content);
  return model_->tokenizer().Encode(text, /*add_special=*/true, SpecialParsing(content, markup_tokens_)).size();
}

void Engine::EngineLoop() {
  for (;;) {
    ScrubStack();  // what the last round's steps (tokens, text) left below this frame
    std::deque<std::function<void()>> tasks;
    bool stop = false;
    {
      std::unique_lock lock(mu_);
      auto startable = [&] {
        for (auto& [name, a] : agents_)
          if (!a->running && a->erasing_cache == 0 && !a->queue.empty()) return true;
        return false;
      };
      // A loaded turn that AdmitKv held while others ran starts once they are gone (they may
      // have failed, which posts nothing).
      auto held = [&] {
        for (const auto& t : warming_)
          if (t != nullptr && t->agent != nullptr && t->loaded && !t->cancelled) return true;
        return false;
      };
      auto ready = [&] { return stopping_ || !tasks_.empty() || startable() || held(); };
      if (active_.empty()) {
        if ((warm_up_ != nullptr || !warm_up_formats_.empty()) && !ready()) {  // else idle: warm up
          lock.unlock();
          WarmUpPass();
          continue;
        }
        // Idle: the backend's upkeep (a lost device made again) when it is due.
        const std::optional<int64_t> due = backend_->MaintenanceDueInMs();
        if (!due.has_value()) {
          engine_cv_.wait(lock, ready);
        } else if (!engine_cv_.wait_for(lock, std::chrono::milliseconds(*due), ready)) {
          lock.unlock();
          backend_->Maintain();
          NoteBackendHealth();
          continue;
        }
      }
      tasks.swap(tasks_);
      stop = stopping_;
    }
    for (auto& task : tasks) task();
    if (stop) {
      // Cancel what runs and what waits; commits already queued still complete.
      size_t running = active_.size();
      for (auto& turn : warming_) running += turn && turn->agent != nullptr ? 1 : 0;
      for (auto& turn : active_) FailTurn(*turn, Internal("the daemon is shutting down"));
      active_.clear();
      for (auto& turn : warming_)
        if (turn && turn->agent != nullptr) FailTurn(*turn, Internal("the daemon is shutting down"));
      std::vector<TurnRequest> dropped;
      {
        std::lock_guard lock(mu_);
        for (auto& [name, a] : agents_) {
          for (auto& r : a->queue) dropped.push_back(std::move(r));
          a->queue.clear();
        }
        counters_.turns_cancelled += dropped.size();
      }
      if (running + dropped.size() > 0) {
        // Accepted turns that will never run: their writers saw their close succeed, so say so.
        spdlog::warn("shutdown: {} running and {} queued turns cancelled (not committed: submit them again)",
                     running, dropped.size());
      }
      for (auto& r : dropped)
        if (r.on_done) r.on_done(Internal("the daemon is shutting down"));
      std::lock_guard lock(mu_);
      if (tasks_.empty()) {
        engine_loop_ended_ = true;
        return;
      }
      continue;
    }
    StartTurns();
    if (!active_.empty()) Step();
  }
}

void Engine::StartTurns() {
  std::vector<std::unique_ptr<ActiveTurn>> started;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, a] : agents_) {
      if (a->running || a->erasing_cache > 0 || a->queue.empty()) continue;
      auto turn = std::make_unique<ActiveTurn>();
      turn->agent = a.get();
      turn->request = std::move(a->queue.front());
      a->queue.pop_front();
      a->running = true;
      a->generating = a->prefilling = false;
      turn->submitted = engine_internal::Clock::now();
      started.push_back(std::move(turn));
    }
  }
  // A cold agent's files are read on the loader thread while the others keep running.
  for (auto& turn : started) {
    ActiveTurn* t = turn.get();
    turn->loaded = !QueueLoad(*turn->agent, [t] { t->loaded = true; });
    warming_.push_back(std::move(turn));
  }
  bool admitting = true;  // in arrival order: a turn that must wait for memory holds the later ones
  for (auto& turn : warming_) {
    if (!turn->loaded || turn->cancelled) continue;
    if (!admitting || !AdmitKv(*turn)) {
      admitting = false;
      continue;
    }
    kvfs::Status s = PrepareTurn(*turn);
    if (!s.ok()) {
      FailTurn(*turn, s);
      continue;
    }
    {
      std::lock_guard lock(mu_);
      turn->agent->prefilling = true;
    }
    NoteTurnMemory(*turn);  // a resumed tail
    active_.push_back(std::move(turn));
  }
  // A cancelled turn whose load is still running stays until the load reports back.
  std::erase_if(warming_, [](const std::unique_ptr<ActiveTurn>& t) { return t == nullptr || (t->agent == nullptr && t->loaded); });
}

Status Engine::PrepareTurn(ActiveTurn& turn) {
  AgentRecord& a = *turn.agent;
  turn.domain = DomainOf(a.owner_uid);
  std::vector<ConversationTurn> conversation = a.conversation;
  conversation.push_back(ConversationTurn{"user", turn.request.text});
  turn.rendered_prompt = Render(a, conversation, &turn.rendered_content);
  KVFS_ASSIGN_OR_RETURN(KvFormat format, FormatFor(a.settings));
  if (!(format == a.format)) {
    ReleaseCache(a);
    std::lock_guard lock(mu_);
    a.format = format;
  }
  const Tokenizer& tok = model_->tokenizer();
  // By characters against the text behind the cache (context_text.h): only what changed is
  // encoded and computed again.
  // A dropped cache's context is matched alike: its tokens are then recomputed as they were.
  const AgentRecord::ContextRef context = a.Context();
  const std::vector<TokenId>& before = context.tokens;
  ContextMatch matched =
      MatchContext(tok, turn.rendered_prompt, SpecialParsing(turn.rendered_content, markup_tokens_), before,
                   context.text, context.ends);
  turn.stats.match = matched.match;
  std::vector<TokenId> tokens = std::move(matched.tokens);
  turn.context_ends = std::move(matched.ends);
  if (tokens.empty()) return InvalidArgument("the prompt encodes to no tokens");
  // A context of exactly n_ctx tokens still gives the reply's first token (from the last
  // position's logits; it is not fed back): a one-token reply, stopped as context_full.
  if (static_cast<int64_t>(tokens.size()) > n_ctx_) {
    // Say what the user can do: a conversation that no longer fits is the agent's whole memory,
    // which kvfs does not cut on its own.
    std::string system_part;
    if (!a.system.empty()) {
      const size_t system_tokens = RenderedTokens(a, {});
      system_part = fmt::format(" (the system prompt takes {} of them: a shorter one frees them)", system_tokens);
    }
    if (a.conversation.empty())
      return OutOfRange(fmt::format("the prompt needs {} tokens, but the context holds {}{}: "
                                    "write a shorter one, or run kvfsd with a larger context (-c)",
                                    tokens.size(), n_ctx_, system_part));
    // A prompt too long on its own is not a full conversation: the agent takes shorter ones.
    std::vector<ConversationTurn> alone{ConversationTurn{"user", turn.request.text}};
    const size_t alone_tokens = RenderedTokens(a, alone);
    if (static_cast<int64_t>(alone_tokens) > n_ctx_)
      return OutOfRange(fmt::format("this prompt alone needs {} tokens, but the context "
                                    "holds {}{}: write a shorter one (the conversation so far is kept), or run kvfsd "
                                    "with a larger context (-c)",
                                    alone_tokens, n_ctx_, system_part));
    return OutOfRange(fmt::format("the conversation with this prompt needs {} tokens, but the "
                                  "context holds {}, {} of them taken by the conversation so far{}: write a shorter "
                                  "prompt, or, when the conversation itself is full, go on in a new agent (mkdir, then "
                                  "cp this one's system and config.json), or run kvfsd with a larger context (-c)",
                                  tokens.size(), n_ctx_, before.size(), system_part));
  }
  size_t keep = 0;
  while (keep < tokens.size() && keep < before.size() && tokens[keep] == before[keep]) ++keep;
  keep = std::min(keep, tokens.size() - 1);  // the last token runs again for its logits
  // q4k: resume only from what an uncached run would hold too: complete K chunks, and the
  // committed tail's staged f16 rows. A cut inside a complete chunk would stage its kept keys
  // decoded from 4 bits (SequenceKv::Truncate), so the chunk would be quantized from different
  // values; recomputing those at most C - 1 tokens keeps the turn's output identical.
  if (format.KeysByChannel()) {
    const size_t C = static_cast<size_t>(format.chunk);
    if (keep < before.size() / C * C) keep = keep / C * C;
  }
  const int64_t have = AssembleCache(turn, tokens, static_cast<int64_t>(keep));
  if (have < static_cast<int64_t>(keep)) turn.stats.match = "rebuild";
  turn.context = std::move(tokens);
  turn.prefill_at = static_cast<size_t>(have);
  turn.stats.reused_tokens = have;
  turn.stats.prefilled_tokens = static_cast<int64_t>(turn.context.size()) - have;

  const AgentSettings& s = a.settings;
  turn.sampler = std::make_unique<Sampler>(s.sampling);
  std::vector<TokenId> eog = tok.eog_tokens();
  for (TokenId t : model_->chat_template().EndOfTurnTokens())
    if (std::find(eog.begin(), eog.end(), t) == eog.end()) eog.push_back(t);
  std::vector<std::string> stops = s.stop;
  for (const std::string& t : model_->chat_template().StopStrings()) stops.push_back(t);
  turn.stop = std::make_unique<StopChecker>(eog, s.max_tokens, stops);
  turn.decoder = std::make_unique<StreamDecoder>(tok);
  return Status::Ok();
}

void Engine::Step() {
  std::vector<SequenceStep> steps;
  std::vector<ActiveTurn*> owners;
  std::vector<size_t> chunk;
  for (auto& t : active_) {
    if (t->pending != kNoToken) {
      steps.push_back(SequenceStep{t->seq.get(), std::span<const TokenId>(&t->pending, 1), false});
      owners.push_back(t.get());
      chunk.push_back(0);
    }
  }
  size_t decode_count = steps.size();
  std::vector<ActiveTurn*> prefilling;
  for (auto& t : active_)
    if (t->pending == kNoToken) prefilling.push_back(t.get());
  // Chunks shared with decoding turns are sized from the cost of a decode-only step, which
  // changes with the batch and the contexts' depth: while someone decodes, one step in
  // kDecodeOnlyEvery (and the first) leaves the prefill out to measure it.
  constexpr size_t kDecodeOnlyEvery = 16;
  const bool decode_only =
      !steps.empty() && !prefilling.empty() && (decode_step_ms_ <= 0 || steps_since_decode_only_ >= kDecodeOnlyEvery);
  steps_since_decode_only_ = decode_only || steps.empty() ? 0 : steps_since_decode_only_ + 1;
  // Prefill: a token budget per step, shared by PlanPrefill (shortest remaining prompt first,
  // short remainders whole, no turn passed over for long).
  size_t prefill_tokens = 0;
  if (!prefilling.empty() && !decode_only) {
    std::vector<PrefillWant> wants;
    wants.reserve(prefilling.size());
    for (const ActiveTurn* t : prefilling) wants.push_back({t->context.size() - t->prefill_at, t->prefill_waited});
    const std::vector<size_t> plan =
        PlanPrefill(wants, steps.empty() ? SoloPrefillChunk() : SharedPrefillChunk(), kPrefillChunkAlone);
    for (size_t k = 0; k < prefilling.size(); ++k) {
      ActiveTurn* t = prefilling[k];
      const size_t n = plan[k];
      if (n == 0) {
        ++t->prefill_waited;
        continue;
      }
      steps.push_back(SequenceStep{t->seq.get(), std::span<const TokenId>(t->context.data() + t->prefill_at, n), false});
      owners.push_back(t);
      chunk.push_back(n);
      prefill_tokens += n;
    }
  }
  decode_count = ReserveStepKv(steps, owners, chunk);  // a prefill it holds back counts as passed over
  for (ActiveTurn* t : owners) NoteTurnMemory(*t);  // what this step's blocks add
  prefill_tokens = 0;
  for (size_t k = 0; k < chunk.size(); ++k) {
    prefill_tokens += chunk[k];
    if (chunk[k] > 0) owners[k]->prefill_waited = 0;
  }
  if (steps.empty()) {
    std::erase_if(active_, [](const std::unique_ptr<ActiveTurn>& t) { return t->agent == nullptr; });
    return;
  }
  Logits logits;
  ForgetFreedBlocks();
  const BackendHealth health_before = backend_->Health();
  const auto t0 = engine_internal::Clock::now();
  kvfs::Status s = backend_->Forward(steps, logits);
  const double ms = MsSince(t0);
  const BackendHealth health = backend_->Health();
  // Step costs for sizing prefill chunks: decode-only steps, and prefill-only steps per token.
  // Not from a pass in which the device was lost or made again (a rerun, a weight upload).
  const bool usual_pass = health.device_losses == health_before.device_losses &&
                          health.device_remakes == health_before.device_remakes;
  if (s.ok() && usual_pass && prefill_tokens == 0 && decode_count > 0) {
    decode_step_ms_ = decode_step_ms_ > 0 ? 0.8 * decode_step_ms_ + 0.2 * ms : ms;
  }
  if (s.ok() && usual_pass && prefill_tokens >= 32 && decode_count == 0) {
    const double per_token = ms / static_cast<double>(prefill_tokens);
    prefill_ms_per_token_ = prefill_ms_per_token_ > 0 ? 0.8 * prefill_ms_per_token_ + 0.2 * per_token : per_token;
  }
  // Shared steps price their chunk too (what it added to a decode step), so the estimate
  // follows the prefilling turn's depth and the chunk's real cost.
  if (s.ok() && usual_pass && prefill_tokens >= 4 && decode_count > 0 && decode_step_ms_ > 0) {
    const double per_token = std::max(0.0, ms - decode_step_ms_) / static_cast<double>(prefill_tokens);
    prefill_ms_per_token_ = prefill_ms_per_token_ > 0 ? 0.7 * prefill_ms_per_token_ + 0.3 * per_token : per_token;
  }
  {
    std::lock_guard lock(mu_);
    PushBounded(counters_.batch_sizes, steps.size());
    ++counters_.forward_passes;
    counters_.decode_tokens += decode_count;
    counters_.prefill_tokens += prefill_tokens;
    counters_.forward_ms += ms;
    NoteBackendHealthLocked(health);
  }
  if (!s.ok()) {
    for (ActiveTurn* t : owners) t->cancelled = true;
    for (auto& t : active_)
      if (t->cancelled) FailTurn(*t, s);
  } else {
    for (size_t k = 0; k < owners.size(); ++k) {
      ActiveTurn& t = *owners[k];
      const float* row = logits.row(logits.first_row[k]);
      if (chunk[k] > 0) {
        t.prefill_at += chunk[k];
        if (t.prefill_at < t.context.size()) continue;
      } else {
        t.context.push_back(t.pending);
        // As the reply shows it (a control token, e.g. a <s> inside a reply, adds no text): the
        // next turn renders the reply, and must find this text to extend the cache.
        t.fed_text += model_->tokenizer().TokenToPiece(t.pending, /*render_special=*/false);
        t.context_ends.push_back(static_cast<uint32_t>(t.rendered_prompt.size() + t.fed_text.size()));
        t.pending = kNoToken;
      }
      OnLogits(t, row);
    }
  }
  std::erase_if(active_, [](const std::unique_ptr<ActiveTurn>& t) { return t->agent == nullptr; });
}

void Engine::NoteBackendHealth() {
  const BackendHealth health = backend_->Health();
  std::lock_guard lock(mu_);
  NoteBackendHealthLocked(health);
}

void Engine::NoteBackendHealthLocked(const BackendHealth& health) {
  counters_.device_block_copies = backend_->BlockCopies();
  counters_.cpu_fallback_steps = health.cpu_fallback_steps;
  counters_.device_lost = health.device_lost;
  counters_.device_losses = health.device_losses;
  counters_.device_remakes = health.device_remakes;
  counters_.device_remake_failures = health.remake_failures;
}

// While others decode, a prefill chunk may add at most kDecodeSlowdown of a decode step's time,
// so generating agents keep more than half their speed (1 / 1.6) while a long prompt is
// prefilled; the chunk follows the measured costs (a deeper cache makes decode steps longer and
// allows more).
size_t Engine::SharedPrefillChunk() const {
  constexpr double kDecodeSlowdown = 0.6;
  if (decode_step_ms_ <= 0 || prefill_ms_per_token_ <= 0) return kPrefillChunkShared;
  const double n = kDecodeSlowdown * decode_step_ms_ / prefill_ms_per_token_;
  return static_cast<size_t>(std::clamp(n, 4.0, static_cast<double>(kPrefillChunkAlone)));
}

// Alone, a chunk takes up to kPieceMs at the measured cost: 512 tokens on a GPU or a small
// model, down to 128 for a large model on a CPU (~30 ms a token for 8B on two cores: ~4 s
// instead of 15), whose matrix passes take 128 tokens at a time anyway.
size_t Engine::SoloPrefillChunk() const {
  constexpr double kPieceMs = 1000;
  if (prefill_ms_per_token_ <= 0) return kPrefillChunkAloneMin;  // until measured (a GPU: one pass)
  const double n = kPieceMs / prefill_ms_per_token_;
  return static_cast<size_t>(
      std::clamp(n, static_cast<double>(kPrefillChunkAloneMin), static_cast<double>(kPrefillChunkAlone)));
}

void Engine::OnLogits(ActiveTurn& turn, const float* row) {
  const int64_t n_vocab = model_->hparams().n_vocab;
  const TokenId next = turn.sampler->Sample(std::span<const float>(row, static_cast<size_t>(n_vocab)), turn.context);
  if (turn.stats.generated_tokens == 0) {
    turn.first_token = turn.decode_start = engine_internal::Clock::now();
    turn.stats.ttft_ms = MsSince(turn.submitted);
    std::lock_guard lock(mu_);
    turn.agent->generating = true;
  }
  ++turn.stats.generated_tokens;
  const Tokenizer& tok = model_->tokenizer();
  const std::string piece = tok.IsEog(next) ? std::string() : turn.decoder->Push(next);
  const std::string out = turn.stop->Push(next, piece);
  if (!out.empty()) {
    turn.reply += out;
    if (turn.request.on_text) turn.request.on_text(out);
  }
  if (turn.stop->reason() != StopReason::kNone) {
    turn.stats.stop_reason = std::string(StopReasonName(turn.stop->reason()));
    FinishTurn(turn, Status::Ok());
  } else if (static_cast<int64_t>(turn.context.size()) + 1 > n_ctx_) {
    turn.stats.stop_reason = "context_full";
    FinishTurn(turn, Status::Ok());
  } else {
    turn.pending = next;
  }
}

void Engine::FailTurn(ActiveTurn& turn, const kvfs::Status& error) {
  FinishTurn(turn, error);
}

void Engine::FinishTurn(ActiveTurn& turn, kvfs::Status error) {
  AgentRecord& a = *turn.agent;
  turn.agent = nullptr;  // marks it finished for Step's sweep
  if (error.ok() && turn.stop->reason() != StopReason::kStopString) {
    std::string rest = turn.stop->Flush() + turn.decoder->Flush();
    if (!rest.empty()) {
      turn.reply += rest;
      if (turn.request.on_text) turn.request.on_text(rest);
    }
  }
  const double decode_ms = turn.stats.generated_tokens > 0 ? MsSince(turn.decode_start) : 0;
  if (turn.stats.generated_tokens > 1 && decode_ms > 0)
    turn.stats.decode_tokens_per_s = (turn.stats.generated_tokens - 1) * 1000.0 / decode_ms;
  auto on_done = std::move(turn.request.on_done);
  if (!error.ok() || turn.seq == nullptr) {
    // The agent stays at its previous turn: its cache is whatever its blocks still hold, which
    // is valid for a prefix of its tokens; drop the partial work.
    turn.seq.reset();
    {
      std::lock_guard lock(mu_);
      a.running = a.generating = false;
      a.turn_bytes = 0;
      a.last_error = error.message();
      ++counters_.turns_failed;
    }
    engine_cv_.notify_all();
    if (on_done) on_done(error);
    return;
  }
  TurnStats stats = turn.stats;
  {
    std::lock_guard lock(mu_);
    a.conversation.push_back(ConversationTurn{"user", turn.request.text, turn.request.tag});
    a.conversation.push_back(ConversationTurn{"assistant", turn.reply, turn.request.tag});
    a.tokens = turn.context;
    a.cached_text = turn.rendered_prompt + turn.fed_text;
    a.token_ends = turn.context_ends;
    a.dropped = {};
    // Byte tokens can leave the fed text invalid UTF-8 (a character cut by max_tokens, bytes
    // that form none). The reply shows U+FFFD there, and so will the next turn's rendering of
    // it; the manifest (JSON) cannot hold such bytes either. The text behind the cache says
    // U+FFFD too, so the next turn extends the cache over the bytes the model generated.
    ShowContextAsRendered(a.cached_text, a.token_ends);
    a.updated_ms = Now();
    counters_.tokens_reused += static_cast<uint64_t>(stats.reused_tokens);
    counters_.tokens_computed += static_cast<uint64_t>(stats.prefilled_tokens + std::max<int64_t>(0, stats.generated_tokens - 1));
    counters_.tokens_generated += static_cast<uint64_t>(stats.generated_tokens);
    PushBounded(counters_.ttft_ms, stats.ttft_ms);
  }
  CopyBlocksToPrefixes(turn, a);
  CommitAgent(a, turn.seq.get(), &stats, [this, &a, stats, on_done = std::move(on_done)](const kvfs::Status& committed) {
    if (!committed.ok()) {
      // The turn is not on disk, so it did not happen: back to the previous commit (whose cache
      // the next turn reloads), on the engine thread, before anyone hears of the failure.
      Post([this, &a, committed, on_done] {
        RollBackToCommitted(a);
        {
          std::lock_guard l(mu_);
          a.running = a.generating = false;
          a.last_error = committed.message();
          ++counters_.turns_failed;
        }
        if (on_done) on_done(committed);
      });
      return;
    }
    Post([this, &a] { DropStaleKeys(a); });
    {
      std::lock_guard lock(mu_);
      a.running = a.generating = false;
      a.last_turn = stats;
      a.last_error.clear();
      ++counters_.turns_completed;
    }
    engine_cv_.notify_all();
    if (on_done) on_done(stats);
  });
  turn.seq.reset();
}

void Engine::NoteTurnMemory(ActiveTurn& turn) {
  if (turn.agent == nullptr || turn.seq == nullptr) return;
  const AgentRecord& a = *turn.agent;
  // AssembleCache made a.blocks the chain of named blocks the turn reuses (its own, another
  // agent's of its uid, a prefix's), which ResidencyOf counts. The rest of the sequence (the tail
  // it resumed, the blocks it writes, copies made before writing to a shared one) is memory only
  // the turn shows until its commit names it. Engine thread: it alone names and swaps them.
  int64_t bytes = 0;
  for (int64_t i = 0; i < turn.seq->n_blocks(); ++i) {
    const PoolBlock* b = turn.seq->block(i);
    if (b == nullptr) continue;
    const bool counted = b->named && static_cast<size_t>(i) < a.blocks.size() && b->key == a.blocks[static_cast<size_t>(i)];
    if (!counted) bytes += (b->bytes + 63) / 64 * 64;  // as the pool counts it
  }
  std::lock_guard lock(mu_);
  turn.agent->turn_bytes = bytes;
}

void Engine::CommitAgent(AgentRecord& a, SequenceKv* seq, const TurnStats* turn_stats,
                         std::function<void(const kvfs::Status&)> done) {
  const KvLayout& layout = seq->layout();
  const int64_t B = layout.block_tokens, n = seq->n_tokens();
  CommitJob job;
  job.agent = a.name;
  {
    std::lock_guard lock(mu_);
    for (int64_t i = static_cast<int64_t>(a.blocks.size()); i < n / B; ++i) {
      const BlockHash parent = i > 0 ? a.blocks[i - 1] : BlockHash{};
      const BlockHash h = ChainHash(parent, std::span<const TokenId>(a.tokens.data() + i * B, static_cast<size_t>(B)),
                                    fingerprint_, a.format, NamingDomain(a));
      seq->NameBlock(i, h);
      a.blocks.push_back(h);
    }
    const uint32_t format_id = KvFormatId(a.format);
    // Every full block goes with the job, stored or not (the store skips those it has): a block
    // stored now may be shredded before this job runs, by an erasure or a diverging commit of
    // the agent that alone named it, queued ahead of this one.
    for (int64_t i = 0; i < n / B; ++i) {
      PoolBlock* b = seq->block(i);
      pool_->Retain(b);
      job.held.push_back(b);
      job.new_blocks.push_back(store::NewBlock{a.blocks[i], format_id, static_cast<uint32_t>(B),
                                               std::span<const uint8_t>(b->data, static_cast<size_t>(layout.block_bytes()))});
    }
    if (n % B != 0) {
      CompactTail(layout, seq->block(n / B)->data, n % B, job.tail_bytes);
      job.tail = store::TailData{format_id, static_cast<uint32_t>(n % B), job.tail_bytes};
      const BlockHash key = TailKey(a.name, ++a.tail_generation);
      seq->NameBlock(n / B, key);
      a.parked_tail = key;
      job.tail_key = key;
    } else {
      a.parked_tail.reset();
    }
    // Named, the running turn's blocks are the agent's, which ResidencyOf counts: from this
    // moment (mu_ held throughout) they are no longer the turn's own.
    a.turn_bytes = 0;
    NoteKeys(a);
    // The turn's record goes in its manifest (and in any built after it); the agent shows it once
    // that is committed.
    if (turn_stats != nullptr) a.last_turn_queued = *turn_stats;
    job.manifest = ManifestOf(a);
    ++a.commits_built;
  }
  // job.tail's payload points into job.tail_bytes, whose heap buffer moves with the job.
  job.done = std::move(done);
  if (!store_) {
    // Nothing to persist: blocks can never be dropped, so keep them marked as not persisted.
    for (PoolBlock* b : job.held) pool_->Release(b);
    job.held.clear();
    job.done(Status::Ok());
    return;
  }
  Enqueue(std::move(job));
}

}  // namespace kvfs
