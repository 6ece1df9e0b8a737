// Per-agent state the filesystem keeps beside the engine's: the turns submitted through this
// mount and their streamed replies (what `response` and the tail of `transcript` show), the
// rendered transcript of committed turns, and the condition variable readers block on.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

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
  std::condition_variable changed;  // any reply text, turn end, erasure or shutdown
  bool erased = false;

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
};

// Transcript text of one conversation entry.
std::string RenderTranscriptEntry(const std::string& role, const std::string& text);

}  // namespace kvfs::fs
