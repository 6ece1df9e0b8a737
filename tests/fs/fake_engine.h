// FakeEngine: an in-memory AgentEngine for the filesystem's tests (and for kvfsd_fake, the
// daemon the integration tests can run before or without the real engine). A turn's reply is
// deterministic ("reply N: <text>", N = the agent's turn number), streamed in small pieces on
// worker threads with a controllable delay; failures, held turns and a full disk can be
// injected. With a store directory it persists each agent as one JSON file (write-temp, fsync,
// rename), so restarts, kill -9 and ENOSPC behave like the real store's contract.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/runtime/agent_engine.h"

namespace kvfs::testing {

struct FakeEngineOptions {
  std::string model_path;          // its bytes give the fingerprint; empty: "fake-model"
  std::string store_dir;           // empty: nothing persisted
  int64_t n_ctx = 4096;            // context, in "tokens" (1 token = 1 byte)
  size_t max_queued_turns = 8;     // per agent, the running one included
  int workers = 2;                 // turns of different agents run concurrently
  std::chrono::milliseconds piece_delay{0};  // between streamed pieces
  int64_t kv_bytes_per_token = 64; // size of the fake cache (persisted, exported)
  std::vector<std::string> refused_kv;  // kv formats refused, as the engine refuses q4k with odd blocks
  std::chrono::milliseconds prefix_delay{0};  // what AddPrefix takes before it adds (a prefill)
};

class FakeEngine : public AgentEngine {
 public:
  static Result<std::unique_ptr<FakeEngine>> Open(FakeEngineOptions options);
  ~FakeEngine() override;

  std::vector<AgentInfo> ListAgents() override;
  Result<AgentInfo> GetAgent(const std::string& name) override;
  kvfs::Status CreateAgent(const std::string& name, uint32_t owner_uid) override;
  Result<std::vector<ConversationTurn>> Conversation(const std::string& name) override;
  kvfs::Status SetSystem(const std::string& name, std::string text) override;
  kvfs::Status SetSettings(const std::string& name, const AgentSettings& settings) override;
  kvfs::Status CheckSettings(const AgentSettings& settings) override;
  kvfs::Status SubmitTurn(TurnRequest request) override;
  Result<store::EraseReport> EraseAgent(const std::string& name) override;
  Result<store::EraseReport> EraseCache(const std::string& name) override;
  Result<std::string> ExportCache(const std::string& name) override;
  Result<uint64_t> ExportSize(const std::string& name) override;
  kvfs::Status ImportCache(const std::string& name, std::string_view safetensors_bytes) override;
  void Prefetch(const std::string& name) override;
  kvfs::Status AddPrefix(const std::string& name, std::string text, uint32_t owner_uid) override;
  Result<store::EraseReport> RemovePrefix(const std::string& name) override;
  Result<store::EraseReport> ReplacePrefix(const std::string& name, std::string text, uint32_t owner_uid) override;
  std::vector<std::string> ListPrefixes() override;
  Result<std::string> PrefixText(const std::string& name) override;
  uint32_t PrefixOwner(const std::string& name) override;
  EngineStatus Stats() override;
  nlohmann::json ModelInfo() override;
  void Shutdown() override;

  // Test controls.
  void HoldTurns(bool hold);                 // held turns wait before producing anything
  void HoldAfterFirstPiece(bool hold);       // running turns wait after their first piece
  // Finished turns wait before on_done, already in Conversation() (as the engine's do while
  // their commit is written).
  void HoldBeforeDone(bool hold);
  void FailNextTurn(kvfs::Status failure);   // the next turn to run fails with it
  // The next EraseAgent cancels the agent's turns, then fails with it and keeps the agent (as
  // the store's erasure failing on a disk error).
  void FailNextErase(kvfs::Status failure);
  void SetPieceDelay(std::chrono::milliseconds delay);
  size_t PrefetchCount();
  const std::string& fingerprint() const { return fingerprint_; }
  static std::string ReplyFor(uint64_t turn_number, const std::string& text);

 private:
  struct Agent {
    AgentInfo info;
    std::vector<ConversationTurn> conversation;  // without the system entry
    std::deque<TurnRequest> queue;
    bool running = false;
    bool has_cache = false;
    std::atomic<bool> cancel{false};
  };

  explicit FakeEngine(FakeEngineOptions options);
  kvfs::Status Load();
  void Worker();
  void RunTurn(const std::shared_ptr<Agent>& agent, TurnRequest request);
  std::vector<ConversationTurn> FullConversation(const Agent& agent) const;
  int64_t ContextTokens(const Agent& agent) const;
  kvfs::Status Persist(const Agent& agent);  // mu_ held
  kvfs::Status PersistPrefixes();            // mu_ held
  std::string AgentPath(const std::string& name) const;
  int64_t NowMs() const;
  std::shared_ptr<Agent> Find(const std::string& name);  // mu_ held
  std::string ExportOf(const Agent& agent) const;        // mu_ held

  const FakeEngineOptions options_;
  std::string fingerprint_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // ready_ changed, hold released or stopping
  std::condition_variable idle_cv_;  // a turn finished (erasure waits for it)
  std::map<std::string, std::shared_ptr<Agent>> agents_;
  std::map<std::string, std::string> prefixes_;
  std::map<std::string, uint32_t> prefix_owners_;
  std::deque<std::shared_ptr<Agent>> ready_;
  bool hold_ = false;
  bool hold_after_first_piece_ = false;
  bool hold_before_done_ = false;
  bool stopping_ = false;
  std::chrono::milliseconds piece_delay_;
  std::optional<kvfs::Status> fail_next_;
  std::optional<kvfs::Status> fail_next_erase_;
  size_t prefetches_ = 0;
  EngineStatus counters_;
  std::vector<std::thread> workers_;
};

}  // namespace kvfs::testing
