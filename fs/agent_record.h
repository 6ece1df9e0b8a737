// Per-agent state the filesystem keeps beside the engine's: the turns submitted through this
// mount and their streamed replies (what `response` and the tail of `transcript` show), the
// rendered transcript of committed turns, and the reads of `response` waiting for text.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"
#include "engine/runtime/agent_engine.h"
#include "fs/inode_table.h"

namespace kvfs::fs {

// A write to one of the agent's files that was refused, at the write or at close (status.json
// shows the latest: a shell redirection reports neither the reason nor a close's error).
struct RefusedWrite {
  std::string file;  // "prompt", "config.json", ...
  Status status;
  int64_t time_ms = 0;
};

// One submitted turn. Guarded by its agent's mutex.
struct TurnStream {
  uint64_t seq = 0;
  std::string user_text;
  std::string reply;    // streamed so far
  bool started = false; // the engine produced text or finished: the turn is shown in the transcript
  // The rendered transcript holds it already: the engine's conversation had it when rendered
  // (it joins that before the turn is done here), so it is neither shown nor appended again.
  bool in_transcript = false;
  bool done = false;
  Status failure;       // set when done and the turn failed
};

// How a read that waited is answered (once, from the thread that made it ready).
using ReadReply = std::function<void(Result<std::string>)>;

// A read of `response` waiting for text without holding a thread (AgentStore::ReadAsync):
// answered when its turn has text past `offset` or ends, the agent is erased, kvfsd shuts down,
// or the reader is interrupted.
struct ParkedRead {
  uint64_t id = 0;
  uint64_t offset = 0;
  size_t size = 0;
  std::shared_ptr<TurnStream> turn;
  ReadReply reply;
};

// Parked reads taken off their agent with their answers; delivered once its mutex is released.
using AnsweredReads = std::vector<std::pair<ReadReply, Result<std::string>>>;

struct AgentRecord {
  AgentRecord(std::string agent_name, uint32_t owner_uid, uint32_t owner_gid)
      : name(std::move(agent_name)), uid(owner_uid), gid(owner_gid) {}

  const std::string name;
  const uint32_t uid;
  const uint32_t gid;
  InodeId dir_ino = 0;  // set once when added to the inode table

  // Orders SubmitTurn calls like `pending` (held across the engine call); edits applied at close
  // hold it too, and an erasure waits on it (AgentStore::CheckStillLive).
  std::mutex submit_mu;
  std::mutex mu;
  bool erased = false;
  // rmdir is erasing it: readers of a turn it cancels wait for the erasure's outcome (ENOENT
  // once erased, not EIO; EIO if the erasure fails and the agent stays).
  bool erasing = false;
  // Reads of `response` waiting for text; whatever changes what they wait on (reply text, turn
  // end, erasure, shutdown) answers the ones it made ready (AnswerReadyReads).
  std::vector<ParkedRead> parked;
  uint64_t next_parked_id = 1;

  // Transcript of the committed conversation, rendered from AgentEngine::Conversation() when
  // first needed and after anything that rewrites it (a failed turn, an import, a system change);
  // successful turns are appended as they stream, so the file only grows while turns succeed.
  bool transcript_valid = false;
  uint64_t transcript_epoch = 0;  // bumped on invalidation (a render started before is dropped)
  std::string transcript;

  uint64_t next_seq = 1;
  std::deque<std::shared_ptr<TurnStream>> pending;  // submitted, not finished; oldest first
  std::shared_ptr<TurnStream> latest;               // the turn `response` binds to at open
  Status last_failure;                              // of the latest finished turn
  std::optional<TurnStats> last_stats;
  std::optional<RefusedWrite> last_refused_write;
  // The writable files (system, config.json, kv.safetensors) unlinked since the agent's last
  // turn was submitted, as bits 1 << AgentFile: absent from lookups and listings until created
  // again or that turn (AgentStore::Unlink says why).
  std::atomic<uint32_t> unlinked_files{0};
};

inline uint32_t AgentFileBit(AgentFile f) { return uint32_t{1} << static_cast<int>(f); }
// The files an unlink hides until they are created again (the others are views, or prompt).
inline bool HiddenByUnlink(AgentFile f) {
  return f == AgentFile::kSystem || f == AgentFile::kConfig || f == AgentFile::kKvCache;
}

// What a read of `response` of `turn` at `offset` returns now, or nullopt while it must wait
// (agent.mu held).
std::optional<Result<std::string>> ResponseNow(const AgentRecord& agent, const TurnStream& turn, uint64_t offset,
                                               size_t size, bool interrupted, bool shutting_down);
// Takes the agent's parked reads that can be answered now (agent.mu held, after any change they
// wait on); the caller runs DeliverReads after releasing it.
AnsweredReads AnswerReadyReads(AgentRecord& agent, bool shutting_down);
void DeliverReads(AnsweredReads& answered);

// Transcript text of one conversation entry.
std::string RenderTranscriptEntry(const std::string& role, const std::string& text);

}  // namespace kvfs::fs
