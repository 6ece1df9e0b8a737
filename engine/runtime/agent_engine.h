// The engine API the filesystem layer calls. AgentStore (fs/) holds an AgentEngine& and never
// sees the model, the block pool or the store; the daemon wires in the real Engine (engine.h),
// and the filesystem's unit tests use a fake. Every method may be called from any thread;
// callbacks of a turn run on the engine thread and must not block.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/runtime/sampler.h"
#include "engine/store/cache_store.h"

namespace kvfs {

// Per-agent settings: the content of an agent's config.json.
struct AgentSettings {
  SamplerParams sampling;              // temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed
  int max_tokens = 256;                // reply length limit
  std::vector<std::string> stop;       // stop strings (besides the model's end-of-turn tokens)
  std::string kv = "q4k";              // KV format of the agent's cache: f16 | q8 | q4 | q4k
  friend bool operator==(const AgentSettings&, const AgentSettings&) = default;
};

// Strict: `json_text` must be one JSON object whose keys are among those of AgentSettingsToJson;
// missing keys keep `base`'s values. Unknown keys, wrong types and out-of-range values give
// kInvalidArgument naming the key.
Result<AgentSettings> ParseAgentSettings(std::string_view json_text, const AgentSettings& base);
nlohmann::json AgentSettingsToJson(const AgentSettings& settings);

enum class AgentState { kCold, kWarm, kHot, kQueued, kGenerating, kError };
// "cold" (cache on disk only), "warm" (being reloaded / partly in memory), "hot" (in memory),
// "queued", "generating", "error" (last turn failed).
std::string_view AgentStateName(AgentState state);

struct TurnStats {
  std::string match;              // how the cached context was used: "new", "exact", "extend", "diverge", "rebuild"
  int64_t reused_tokens = 0;      // context tokens whose KV came from the cache
  int64_t prefilled_tokens = 0;   // tokens run through the model before the first reply token
  int64_t generated_tokens = 0;
  double ttft_ms = 0;             // submit -> first reply token
  double decode_tokens_per_s = 0;
  std::string stop_reason;        // "end_of_generation", "max_tokens", "stop_string", "context_full", "cancelled"
};

// TurnStats as status.json's last_turn shows it, and as the agent's manifest keeps it (in its
// config, opaque to the store), so status.json still shows the last turn after a restart. The reader is lenient: a missing or odd field is left at its
// default (the record is informative; a turn never depends on it), and a non-object gives none.
nlohmann::json TurnStatsToJson(const TurnStats& stats);
std::optional<TurnStats> TurnStatsFromJson(const nlohmann::json& j);

struct AgentInfo {
  std::string name;
  uint32_t owner_uid = 0;
  AgentState state = AgentState::kCold;
  int64_t context_tokens = 0;     // tokens of the conversation as last committed
  int64_t memory_bytes = 0;       // KV bytes resident in the pool
  int64_t disk_bytes = 0;         // KV bytes in the store (blocks it references + tail)
  bool stored_cache = false;      // the store names cache files of it (a dropped cache's too)
  int64_t created_ms = 0;         // unix milliseconds
  int64_t updated_ms = 0;         // last turn (or creation)
  uint64_t turns = 0;
  size_t queued_turns = 0;        // submitted and not finished (the running one included)
  std::string system;
  AgentSettings settings;
  std::optional<TurnStats> last_turn;
  std::string last_error;         // empty unless state == kError
};

// One entry of the conversation: role "system" | "user" | "assistant".
using ConversationTurn = store::ConversationTurn;

struct TurnRequest {
  std::string agent;
  std::string text;  // the user's message (valid UTF-8, non-empty; AgentStore checks)
  // Reply text as it becomes final (whole UTF-8 characters), in order.
  std::function<void(std::string_view)> on_text;
  // Called exactly once when the turn ends: its stats, or why it failed (the reply streamed so
  // far stays valid; a failed turn leaves the agent at its previous turn).
  std::function<void(const Result<TurnStats>&)> on_done;
  // The caller's name for the turn: its conversation entries carry it (ConversationTurn::tag).
  uint64_t tag = 0;
};

struct CacheEntryStatus {
  std::string agent;
  int64_t memory_bytes = 0;
  int64_t disk_bytes = 0;
  uint64_t hits = 0;  // block lookups served from memory for this agent
};

struct EngineStatus {
  int64_t memory_used_bytes = 0;
  int64_t memory_budget_bytes = 0;
  // Agents by the state their status.json shows (AgentState): hot, warm and cold are idle ones
  // by how much of their cache is in memory; an agent whose turn runs or waits is generating or
  // queued, whatever its cache; error: its last turn failed.
  size_t agents_hot = 0, agents_warm = 0, agents_cold = 0;
  size_t agents_queued = 0, agents_generating = 0, agents_error = 0;
  // Counts an agent in the field of the state its status.json shows.
  void CountAgent(AgentState state);
  uint64_t block_hits = 0, block_misses = 0;  // hit rate = hits / (hits + misses)
  uint64_t tokens_reused = 0, tokens_computed = 0;
  uint64_t turns_completed = 0, turns_failed = 0;
  // Turns dropped before they started: queued when their agent or its cache was erased, or at
  // shutdown. Every turn SubmitTurn took is completed, failed, cancelled or in flight.
  uint64_t turns_cancelled = 0;
  size_t turns_in_flight = 0;  // submitted and not finished: queued or running (gauge)
  uint64_t tokens_generated = 0;
  uint64_t evictions = 0;      // blocks dropped from memory under the budget
  uint64_t reload_bytes = 0;   // KV bytes read back from disk
  uint64_t erasures = 0;
  std::vector<double> ttft_ms;  // recent turns' TTFT (for the histogram), newest last, bounded
  std::vector<size_t> batch_sizes;  // recent forward passes' sequence counts (issue 6), bounded
  uint64_t forward_passes = 0;      // forward passes run by the engine thread
  uint64_t decode_tokens = 0;       // tokens those passes decoded (one per generating turn)
  uint64_t prefill_tokens = 0;      // and prefilled
  double forward_ms = 0;            // time spent inside them
  int64_t device_block_copies = 0;  // KV block copies in device memory (Vulkan backend)
  int64_t cpu_fallback_steps = 0;   // Vulkan: steps the CPU ran because the device could not
  bool device_lost = false;         // Vulkan: the device is lost; passes run on the CPU until it is
                                    // made again
  int64_t device_losses = 0;        // Vulkan: times the device was lost
  int64_t device_remakes = 0;       // Vulkan: times it was made again
  int64_t device_remake_failures = 0;  // Vulkan: tries to make it again that failed
  bool backend_warming_up = false;  // Vulkan: the backend's warm-up (EngineOptions::warm_up) has
                                    // passes left; turns may still compile kernels meanwhile
  std::vector<CacheEntryStatus> top_entries;  // largest agents first, at most 10
  // Agent records the engine holds: its agents', and erased ones' while their erasure runs (a
  // record left behind would be memory that agent churn never gives back). Not rendered.
  size_t agent_records = 0;
};

class AgentEngine {
 public:
  virtual ~AgentEngine() = default;

  // Agents known to the engine (restored from the store at start-up, or created since).
  virtual std::vector<AgentInfo> ListAgents() = 0;
  virtual Result<AgentInfo> GetAgent(const std::string& name) = 0;
  // Creates an empty agent (persisted at once, so it survives a restart). kInvalidArgument for a
  // bad name (store::IsValidAgentName) or a name already in use.
  virtual Status CreateAgent(const std::string& name, uint32_t owner_uid) = 0;
  // The conversation so far, led by the system prompt (when set) as a "system" entry: committed
  // turns; a running turn's user message and partial reply are not included.
  virtual Result<std::vector<ConversationTurn>> Conversation(const std::string& name) = 0;
  // Changes the system prompt: the conversation stays; the cache is recomputed on the next turn.
  virtual Status SetSystem(const std::string& name, std::string text) = 0;
  virtual Status SetSettings(const std::string& name, const AgentSettings& settings) = 0;
  // Whether SetSettings would take these settings for any agent: kInvalidArgument naming what
  // this engine cannot run (a KV format its block size does not allow). The filesystem asks as
  // config.json is written, so that the write fails, where a shell reports it, and not only the
  // close, whose error `echo ... > config.json` never shows.
  virtual Status CheckSettings(const AgentSettings& settings) = 0;

  // Queues a turn. kNotFound (no agent), kResourceExhausted (the agent already has the maximum
  // of queued turns, 8 by default), kInternal once shutting down. Turns of one agent run in
  // order; on_done is not called when SubmitTurn fails.
  virtual Status SubmitTurn(TurnRequest request) = 0;

  // Erases an agent for good (text, tokens, memory blocks zeroed, disk blocks no one else holds),
  // waiting for its running turn to be cancelled first. Returns what was removed.
  virtual Result<store::EraseReport> EraseAgent(const std::string& name) = 0;
  // Erases only the agent's KV cache; the conversation stays and the next turn rebuilds it.
  virtual Result<store::EraseReport> EraseCache(const std::string& name) = 0;
  // The agent's cache as a safetensors file (see engine/store/safetensors.h).
  virtual Result<std::string> ExportCache(const std::string& name) = 0;
  // The size ExportCache's file has while the cache stays as it is, without assembling it (the
  // header's cost: a JSON dump of the token ids and the conversation): kv.safetensors's size in
  // `ls -l`, so that tar and rsync, which read a file's size in bytes, archive all of it.
  virtual Result<uint64_t> ExportSize(const std::string& name) = 0;
  // Replaces the agent's cache and conversation with an imported file. kInvalidArgument for a
  // file of another model or format, truncated or garbage; nothing changes then.
  virtual Status ImportCache(const std::string& name, std::string_view safetensors_bytes) = 0;
  // Starts loading a cold agent's cache into memory in the background (no-op when hot).
  virtual void Prefetch(const std::string& name) = 0;

  // Shared prefixes (.prefixes/): prefilled once, blocks pinned, used by any agent whose context
  // starts with the text. They persist: a restarted engine has them again (their blocks loaded
  // from the store, or prefilled again when the store lacks them). RemovePrefix erases the
  // persisted record too. `owner_uid` is kept for the file's owner in .prefixes/.
  virtual Status AddPrefix(const std::string& name, std::string text, uint32_t owner_uid) = 0;
  virtual Result<store::EraseReport> RemovePrefix(const std::string& name) = 0;
  // Gives an existing prefix a new text: the new one is prefilled and stored first, the stored
  // record replaced in one rename, and only then the old one unpinned and its blocks erased
  // (what it returns). On any error (too long, full disk) the old prefix stays as it was.
  // kNotFound when there is none (AddPrefix then).
  virtual Result<store::EraseReport> ReplacePrefix(const std::string& name, std::string text, uint32_t owner_uid) = 0;
  // Every prefix, those whose saved record cannot be read included: PrefixText refuses them with
  // kIoError, and RemovePrefix (or RemovePrefix then AddPrefix) is all they allow.
  virtual std::vector<std::string> ListPrefixes() = 0;
  virtual Result<std::string> PrefixText(const std::string& name) = 0;
  // The uid given to AddPrefix (0 for an unknown prefix or an unreadable one).
  virtual uint32_t PrefixOwner(const std::string& name) = 0;

  virtual EngineStatus Stats() = 0;
  // .model.json: architecture, sizes, quantization, fingerprint, kv formats, block size.
  virtual nlohmann::json ModelInfo() = 0;

  // Stops accepting turns, finishes or cancels the running ones, flushes the store.
  virtual void Shutdown() = 0;
};

}  // namespace kvfs
