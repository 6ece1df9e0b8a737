// AgentStore: turns (a closed prompt becomes a turn; its reply streams into `response` and
// `transcript`) and the transcript text.
#include <algorithm>
#include <set>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "fs/agent_store.h"

namespace kvfs::fs {

namespace {

// Copies the bytes of a text given in pieces that fall in [offset, offset + size) and counts its
// whole length, so a read or a stat of a long transcript copies only what it returns.
class RangeCopier {
 public:
  RangeCopier(uint64_t offset, size_t size, std::string* out) : offset_(offset), end_(offset + size), out_(out) {}
  void Add(std::string_view piece) {
    const uint64_t begin = length_;
    length_ += piece.size();
    if (out_ == nullptr || length_ <= offset_ || begin >= end_) return;
    const uint64_t from = std::max(begin, offset_), to = std::min(length_, end_);
    out_->append(piece.substr(static_cast<size_t>(from - begin), static_cast<size_t>(to - from)));
  }
  uint64_t length() const { return length_; }

 private:
  uint64_t offset_, end_;
  std::string* out_;
  uint64_t length_ = 0;
};

// The transcript as it reads now: the committed conversation, then every started turn still
// streaming. Called with the agent's mutex held.
void AddLiveTranscript(const AgentRecord& agent, RangeCopier& copier) {
  copier.Add(agent.transcript);
  for (const auto& turn : agent.pending) {
    if (!turn->started || turn->in_transcript) continue;
    copier.Add(RenderTranscriptEntry("user", turn->user_text));
    copier.Add("[assistant]\n");
    copier.Add(turn->reply);  // the entry's closing blank line comes at its end
  }
}

void RemovePending(AgentRecord& agent, const std::shared_ptr<TurnStream>& turn) {
  auto it = std::find(agent.pending.begin(), agent.pending.end(), turn);
  if (it != agent.pending.end()) agent.pending.erase(it);
}

}  // namespace

void AgentStore::InvalidateTranscript(AgentRecord& agent) {
  agent.transcript_valid = false;
  ++agent.transcript_epoch;
  agent.transcript.clear();
}

Status AgentStore::SubmitPrompt(const std::shared_ptr<AgentRecord>& agent, std::string text) {
  if (shutting_down_.load()) return IoError("kvfsd is shutting down: no new turns");
  auto turn = std::make_shared<TurnStream>();
  turn->user_text = text;
  // One submission at a time per agent, so `pending` and `latest` follow the engine's order.
  std::lock_guard submit(agent->submit_mu);
  KVFS_RETURN_IF_ERROR(CheckStillLive(*agent));
  std::shared_ptr<TurnStream> previous_latest;
  {
    std::lock_guard lock(agent->mu);
    if (agent->erased) return NotFound(fmt::format("agent '{}' was erased", agent->name));
    turn->seq = agent->next_seq++;
    agent->pending.push_back(turn);
    previous_latest = agent->latest;
    agent->latest = turn;
  }
  TurnRequest request;
  request.agent = agent->name;
  request.text = std::move(text);
  request.tag = turn->seq;
  // The callbacks run on the engine thread: they only take the agent's and the metrics' mutex.
  request.on_text = [agent, turn](std::string_view piece) { OnTurnText(*agent, *turn, piece); };
  request.on_done = [agent, turn, metrics = metrics_](const Result<TurnStats>& result) {
    OnTurnDone(*agent, turn, *metrics, result);
  };
  Status submitted = engine_.SubmitTurn(std::move(request));
  if (submitted.ok()) agent->unlinked_files.store(0);  // the turn remakes the cache; the files show again
  if (!submitted.ok()) {
    AnsweredReads answered;
    {
      std::lock_guard lock(agent->mu);
      RemovePending(*agent, turn);
      if (agent->latest == turn) agent->latest = previous_latest;
      // A `response` opened meanwhile bound to this turn: it ends, failed, for its readers.
      turn->done = true;
      turn->failure = submitted;
      answered = AnswerReadyReads(*agent, false);
    }
    DeliverReads(answered);
    std::lock_guard m(metrics_->mu);
    if (submitted.code() == StatusCode::kResourceExhausted) ++metrics_->values.turns_rejected_queue_full;
    return submitted;
  }
  std::lock_guard m(metrics_->mu);
  ++metrics_->values.turns_submitted;
  return Status::Ok();
}

void AgentStore::OnTurnText(AgentRecord& agent, TurnStream& turn, std::string_view text) {
  AnsweredReads answered;
  {
    std::lock_guard lock(agent.mu);
    turn.started = true;
    turn.reply.append(text);
    answered = AnswerReadyReads(agent, false);
  }
  DeliverReads(answered);
}

void AgentStore::OnTurnDone(AgentRecord& agent, const std::shared_ptr<TurnStream>& turn, SharedMetrics& metrics,
                            const Result<TurnStats>& result) {
  {
    // Counted before readers of `response` wake: whoever sees the turn done sees it counted.
    std::lock_guard m(metrics.mu);
    if (result.ok()) {
      ++metrics.values.turns_ok;
      metrics.values.ObserveTtft(result.value().ttft_ms);
    } else {
      ++metrics.values.turns_failed;
    }
  }
  AnsweredReads answered;
  std::unique_lock lock(agent.mu);
  turn->started = true;
  turn->done = true;
  if (result.ok()) {
    if (agent.transcript_valid && !turn->in_transcript) {
      agent.transcript += RenderTranscriptEntry("user", turn->user_text);
      agent.transcript += RenderTranscriptEntry("assistant", turn->reply);
    }
    agent.last_failure = Status::Ok();
    agent.last_stats = result.value();
  } else {
    // Logged once, here: reads of `response` (any number, or none) answer EIO quietly.
    if (result.status().code() == StatusCode::kCancelled)
      spdlog::info("agent {}: a turn was cancelled: {}", agent.name, result.status().message());
    else
      spdlog::warn("agent {}: a turn failed: {}", agent.name, result.status().message());
    turn->failure = result.status();
    agent.last_failure = result.status();
    // The engine left the agent at its previous turn: render the transcript afresh.
    InvalidateTranscript(agent);
  }
  RemovePending(agent, turn);
  answered = AnswerReadyReads(agent, false);
  lock.unlock();
  DeliverReads(answered);
}

Result<uint64_t> AgentStore::TranscriptRange(const std::shared_ptr<AgentRecord>& agent, uint64_t offset, size_t size,
                                             std::string* out) {
  size = static_cast<size_t>(std::min<uint64_t>(size, UINT64_MAX - offset));
  RangeCopier copier(offset, size, out);
  uint64_t epoch = 0;
  {
    std::lock_guard lock(agent->mu);
    if (agent->erased) return NotFound(fmt::format("agent '{}' was erased", agent->name));
    if (agent->transcript_valid) {
      AddLiveTranscript(*agent, copier);
      return copier.length();
    }
    epoch = agent->transcript_epoch;
  }
  // Rendered outside the agent's lock: Conversation() is an engine call.
  KVFS_ASSIGN_OR_RETURN(std::vector<ConversationTurn> conversation, engine_.Conversation(agent->name));
  std::string rendered;
  std::set<uint64_t> tags;
  for (const ConversationTurn& entry : conversation) {
    rendered += RenderTranscriptEntry(entry.role, entry.text);
    if (entry.tag != 0) tags.insert(entry.tag);
  }
  std::lock_guard lock(agent->mu);
  if (!agent->transcript_valid && agent->transcript_epoch == epoch) {
    agent->transcript = std::move(rendered);
    agent->transcript_valid = true;
    for (const auto& turn : agent->pending)
      if (tags.count(turn->seq)) turn->in_transcript = true;
  }
  if (agent->transcript_valid) {
    AddLiveTranscript(*agent, copier);
    return copier.length();
  }
  copier.Add(rendered);  // invalidated meanwhile: this read sees the conversation as it was
  return copier.length();
}

std::string AgentStore::LastReplyText(const std::shared_ptr<AgentRecord>& agent) {
  Result<std::vector<ConversationTurn>> conversation = engine_.Conversation(agent->name);
  if (!conversation.ok()) return {};
  for (auto it = conversation->rbegin(); it != conversation->rend(); ++it) {
    if (it->role == "assistant") return it->text;
  }
  return {};
}

}  // namespace kvfs::fs
