// AgentStore: the filesystem's logic, with no FUSE headers, so it is tested without a mount.
// The FUSE layer (fuse_ops.cpp) decodes each request into one call here and maps the Status
// to an errno (errno_map.h). See DESIGN.md section 1 for the contract and fs/README.md for
// the choices made where it leaves room.
//
// Thread-safety: every method may be called from any thread. One mutex guards the inode table,
// the name maps and the handle table and is never held across an engine call; each agent has
// its own mutex and condition variable for its turns (agent_record.h). Engine callbacks take
// only agent mutexes, so a long generation never blocks `ls` or another agent.
#pragma once

#include <sys/statvfs.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/core/status.h"
#include "engine/runtime/agent_engine.h"
#include "fs/agent_record.h"
#include "fs/audit_log.h"
#include "fs/inode_table.h"
#include "fs/interrupt.h"
#include "fs/render.h"

namespace kvfs::fs {

using HandleId = uint64_t;

struct StoreConfig {
  size_t max_prompt_bytes = 1 << 20;       // a larger prompt: EFBIG at write
  size_t max_text_bytes = 1 << 20;         // system, config.json, a prefix file
  size_t max_import_bytes = size_t{16} << 30;  // kv.safetensors written for import
  // Memory all kv.safetensors being written hold together (their buffers live until close);
  // past it a write fails with ENOSPC. 0: half the machine's memory.
  size_t max_import_memory_bytes = 0;
  // A kv.safetensors being written that grows past import_spill_bytes moves out of memory into
  // an unnamed file in import_spill_dir (kvfsd: the store directory), so that writers hold disk
  // rather than memory until close (the import at close still needs the file's size in memory,
  // from the budget above, for as long as it runs). All such files together may hold at most
  // max_import_spill_bytes (ENOSPC past it). Empty dir: imports stay in memory.
  std::string import_spill_dir;
  size_t import_spill_bytes = size_t{64} << 20;
  size_t max_import_spill_bytes = size_t{64} << 30;
  std::string audit_log_path;              // empty: in memory
  // Where the engine keeps the agents' caches (kvfsd: the store directory): statfs of the mount
  // reports that directory's file system, the space the agents' state fills. Empty: zeros.
  std::string store_dir;
  uint32_t root_uid = 0, root_gid = 0;     // owner of the mount root and the special files
  std::function<int64_t()> now_ms;         // defaults to the system clock
};

struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t pid = 0;  // the calling thread (0: unknown)
  uint32_t process = 0;  // its thread group, the process (0: unknown); for Open and Flush
};

enum class FileType : uint8_t { kDirectory, kRegular };

struct Attr {
  InodeId ino = 0;
  FileType type = FileType::kRegular;
  uint32_t mode = 0;  // permission bits (and sticky), no type bits
  uint32_t uid = 0, gid = 0;
  uint32_t nlink = 1;
  uint64_t size = 0;
  int64_t mtime_ms = 0;
  // How long the kernel may cache this node's attributes (sizes of agent files change).
  double attr_timeout_s = 0;
};

struct DirEntry {
  std::string name;
  Attr attr;
};

// open(2) flags, decoded by the FUSE layer.
struct OpenFlags {
  bool read = false;
  bool write = false;
  bool truncate = false;
  bool append = false;
};

class AgentStore {
 public:
  // Reads the engine's agents and prefixes and opens the audit log.
  static Result<std::unique_ptr<AgentStore>> Create(AgentEngine& engine, StoreConfig config);
  ~AgentStore();

  // --- Names and attributes. Lookup, MakeAgent, Create and CountLookup add a kernel reference.
  Result<Attr> Lookup(InodeId parent, std::string_view name);
  // For a readdirplus entry: false (and no reference) when the node went away since the listing.
  bool CountLookup(InodeId ino);
  void Forget(InodeId ino, uint64_t count);
  // With the open file it comes from (fstat), a file being written or an export read has the
  // size of that file's bytes (written so far; the snapshot taken at open).
  Result<Attr> GetAttr(InodeId ino, std::optional<HandleId> open_file = std::nullopt);
  // Truncation (setattr size): allowed on writable files; `handle` when done through an fd.
  // Without one (truncate(2) by path), only to 0: system and config.json then get what an open
  // with O_TRUNC and no writes gives them at close.
  Result<Attr> Truncate(InodeId ino, uint64_t size, std::optional<HandleId> handle, const Caller& caller);
  // Modes and owners are fixed: OK when every value given is the node's own (and the caller may
  // see it), EPERM otherwise.
  Status CheckModeAndOwner(InodeId ino, std::optional<uint32_t> mode, std::optional<uint32_t> uid,
                           std::optional<uint32_t> gid, const Caller& caller);

  // --- Directories. OpenDir snapshots the entries ("." and ".." first); a readdirplus adds a
  // reference (CountLookup) for each entry it returns except "." and "..".
  Result<HandleId> OpenDir(InodeId ino, const Caller& caller);
  std::shared_ptr<const std::vector<DirEntry>> DirEntries(HandleId handle);
  void ReleaseDir(HandleId handle);

  // mkdir in the root creates an agent owned by the caller.
  Result<Attr> MakeAgent(InodeId parent, std::string_view name, const Caller& caller);
  // rmdir of an agent erases it (engine EraseAgent), returning when that is done.
  Status RemoveAgent(InodeId parent, std::string_view name, const Caller& caller);
  // unlink: kv.safetensors erases the agent's cache; a prefix file unpins and erases the
  // prefix; the agent's other files are views of its state and stay (so `rm -r` works), but
  // system, config.json and kv.safetensors are absent until created again or the next turn.
  Status Unlink(InodeId parent, std::string_view name, const Caller& caller);

  // --- Files.
  Result<HandleId> Open(InodeId ino, OpenFlags flags, const Caller& caller);
  // O_CREAT of a name that does not exist: prefix files, and an agent's system, config.json or
  // kv.safetensors after an unlink (opened for writing from empty).
  Result<std::pair<Attr, HandleId>> Create(InodeId parent, std::string_view name, OpenFlags flags, const Caller& caller);
  // Blocks on `response` while its turn generates (ReadAsync, waited for); `interrupt` (may be
  // null) cancels the wait.
  Result<std::string> Read(HandleId handle, uint64_t offset, size_t size, Interrupt* interrupt);
  // Read without holding the caller's thread: a read of `response` that would block is parked
  // and `reply` runs later, once, on the thread that makes it ready (new text, the turn's end,
  // erasure, shutdown) or that triggers `interrupt` (may be null); any other read is answered at
  // once. A FUSE request thread is then free for other requests: a thousand readers of
  // `response` do not stall the mount.
  void ReadAsync(HandleId handle, uint64_t offset, size_t size, const std::shared_ptr<Interrupt>& interrupt,
                 ReadReply reply);
  Result<size_t> Write(HandleId handle, uint64_t offset, std::string_view data);
  // close(2): a prompt becomes a turn, system/config.json/kv.safetensors/prefix writes are
  // applied. The error is what close() returns.
  //
  // A prompt or kv.safetensors is submitted only at the close of the process that opened it
  // (`process`: the closing one, 0 if unknown: taken as the opener) or at the last close: a
  // child that inherited the descriptor (`{ cat ctx; echo question; } > prompt`) closes its copy
  // before its parent has written everything, and must not cut the prompt in two turns.
  Status Flush(HandleId handle, uint32_t process = 0);
  // Whether the process that opens (an inode) or closes (a handle) a file matters: only for a
  // prompt or kv.safetensors, which Flush submits at the opener's close. The FUSE layer looks
  // the process up only then.
  bool OpeningProcessMatters(InodeId ino);
  bool ClosingProcessMatters(HandleId handle);
  // Last close: anything not yet applied is applied now (errors are only logged: the kernel
  // ignores release's result).
  void Release(HandleId handle);
  // Releases a handle whose opener never got it (a create whose reply failed): nothing written
  // or truncated through it is applied.
  void Discard(HandleId handle);

  // Extended attributes of agent directories: user.kvfs.state, user.kvfs.tokens, user.kvfs.bytes.
  // nullopt: no such attribute.
  Result<std::optional<std::string>> GetXattr(InodeId ino, std::string_view name);
  Result<std::vector<std::string>> ListXattr(InodeId ino);
  // Setting or removing one: EPERM for kvfs's own (read-only), EOPNOTSUPP for any other name, so
  // that cp -p / cp -a (ACLs, SELinux labels) go on as on a file system without them.
  Status SetXattr(InodeId ino, std::string_view name);

  // statfs of the mount: the sizes and counts of config.store_dir's file system (what `df`
  // should tell a user whose agents fill it), and names of at most 64 bytes.
  Result<struct statvfs> StatFs() const;

  // Shutdown, in this order: BeginShutdown refuses new turns; the engine's Shutdown finishes or
  // cancels the running ones (their readers get the reply's end, or EIO with the reason); then
  // WakeAllReaders answers every read still waiting (EIO: kvfsd is shutting down). Readers are
  // not answered before the engine stops: a turn that still commits must end its reply as one.
  void BeginShutdown();
  void WakeAllReaders();

  // For tests and the bench.
  size_t InodeCount();
  size_t HandleCount();
  FsMetrics Metrics();

  struct Handle;  // an open file or directory; defined in handle.h (private to fs/)
  struct SharedMetrics {
    std::mutex mu;
    FsMetrics values;
  };

 private:
  struct PrefixRecord {
    InodeId ino = 0;
    uint32_t uid = 0;
    bool pending = false;  // created, its text not yet written (the engine does not know it)
    int64_t mtime_ms = 0;  // its last write through this mount (after a restart: the mount's start)
    uint32_t gid = 0;      // its writer's group (after a restart: the owner's primary group)
  };

  AgentStore(AgentEngine& engine, StoreConfig config, std::unique_ptr<AuditLog> audit);
  void MarkPrefixWritten(const std::string& name, InodeId ino);  // no longer pending; mtime now
  // After an erasure: the agent's open files (or, cache_only, its exports being read) have their
  // bytes zeroed, and reads of them fail (Handle::erased).
  void ShredOpenFiles(const AgentRecord& agent, bool cache_only);
  static Status ErasedUnderHandle(const Handle& handle);
  int64_t Now() const;
  void Audit(AuditEvent event);
  // Erasures: the intent first (AuditLog::Intend; "" when it could not be written, which is
  // logged: the erasure goes on, as it must on a full disk), the line when it is done.
  std::string IntendAudit(AuditEvent event);
  void CompleteAudit(const std::string& intent, AuditEvent event);
  // An erasure that failed: when what it erases is still there (`intact`) nothing happened and
  // the intent goes; else it happened in part and the next start, which finishes it, logs it.
  void SettleFailedErasure(const std::string& intent, bool intact);
  // At start: the line of every erasure a crash interrupted after it happened.
  void SettleAuditIntents(const std::vector<AgentInfo>& agents, const std::vector<std::string>& prefixes);

  // Lookup helpers (mu_ held).
  std::shared_ptr<AgentRecord> AgentLocked(const std::string& name);
  // NotFound unless `agent` is still the agent of its name: not erased or being erased, and not
  // replaced by a new agent of the same name (whose owner may differ). A handle opened before an
  // erasure must never reach its successor through the name. Call with agent.submit_mu held:
  // RemoveAgent waits on it, so the answer holds until it is released.
  Status CheckStillLive(const AgentRecord& agent);
  InodeId EnsureAgentInodeLocked(const std::shared_ptr<AgentRecord>& agent);
  Result<Node> NodeCopy(InodeId ino);
  Result<Attr> AttrOf(InodeId ino, const Node& node, const AgentInfo* known_info);
  Attr AgentDirAttr(const AgentRecord& agent, const AgentInfo* info, InodeId ino);
  std::vector<DirEntry> ListRoot();
  std::vector<DirEntry> ListAgent(const std::shared_ptr<AgentRecord>& agent, InodeId dir);
  std::vector<DirEntry> ListPrefixes();

  // Files (agent_store_files.cpp).
  Result<std::shared_ptr<Handle>> OpenAgentFile(const Node& node, InodeId ino, OpenFlags flags, const Caller& caller);
  Result<std::shared_ptr<Handle>> OpenRootFile(SpecialFile file, OpenFlags flags);
  Result<std::shared_ptr<Handle>> OpenPrefixFile(const Node& node, InodeId ino, OpenFlags flags, const Caller& caller);
  HandleId AddHandle(std::shared_ptr<Handle> handle);
  std::shared_ptr<Handle> FindHandle(HandleId id);
  Status ApplyWrites(Handle& handle);
  Status CheckWrittenSoFar(Handle& handle);  // early refusal of edits that cannot become valid
  Result<size_t> WriteLocked(Handle& handle, uint64_t offset, std::string_view bytes);
  Status FlushLocked(Handle& handle, uint32_t process);
  void UndoAppliedEdit(Handle& handle);  // a refused system edit: the text before the handle's first apply
  // system opened with O_TRUNC and never written: emptied, unless another writer changed it since the open.
  Status ApplyEmptying(Handle& handle);
  void NoteRefusedWrite(const Handle& handle, const Status& status);  // for status.json
  // An export's line, at its first read: an export is not served unless its line is in the log
  // (the error, e.g. ENOSPC on a full disk, fails the read; the next read tries again).
  Status AuditExportRead(Handle& handle);  // handle.mu held
  Result<std::string> RenderFile(const Node& node);
  Status ApplyPrefix(Handle& handle);
  void DropPendingPrefix(const std::string& name, InodeId ino);
  void DropPendingPrefixLocked(std::map<std::string, PrefixRecord>::iterator it);  // mu_ held

  // Turns and transcripts (agent_store_turns.cpp).
  Status SubmitPrompt(const std::shared_ptr<AgentRecord>& agent, std::string text);
  // Appends bytes [offset, offset + size) of the transcript to *out (when not null) and returns
  // the transcript's length; copies only those bytes (`tail -f` stats and reads it often).
  Result<uint64_t> TranscriptRange(const std::shared_ptr<AgentRecord>& agent, uint64_t offset, size_t size,
                                   std::string* out);
  std::string LastReplyText(const std::shared_ptr<AgentRecord>& agent);
  static void InvalidateTranscript(AgentRecord& agent);
  static void OnTurnText(AgentRecord& agent, TurnStream& turn, std::string_view text);
  static void OnTurnDone(AgentRecord& agent, const std::shared_ptr<TurnStream>& turn, SharedMetrics& metrics,
                         const Result<TurnStats>& result);

  AgentEngine& engine_;
  const StoreConfig config_;
  std::unique_ptr<AuditLog> audit_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> readers_released_{false};  // WakeAllReaders ran: waiting reads end (EIO)
  // Prefix writes are applied one at a time (ApplyPrefix), so that a close which finds a new
  // prefix still pending sees what an earlier close of the same name made of it; taken before mu_.
  std::mutex prefix_writes_mu_;

  std::mutex mu_;  // guards everything below
  InodeTable inodes_;
  std::map<std::string, std::shared_ptr<AgentRecord>> agents_;  // sorted: stable listings
  std::map<std::string, std::string> agents_in_transition_;     // name -> "creating" | "erasing"
  // Agent files unlinked lately (pid, inode, ms): a process unlinking the same one again at once
  // expected it gone (AgentStore::Unlink).
  struct RecentUnlink {
    uint32_t pid;
    InodeId ino;
    int64_t time_ms;
  };
  std::vector<RecentUnlink> recent_unlinks_;
  std::map<std::string, PrefixRecord> prefixes_;
  std::unordered_map<HandleId, std::shared_ptr<Handle>> handles_;
  HandleId next_handle_ = 1;
  std::atomic<int64_t> root_mtime_ms_{0};  // read by getattr without mu_
  // Engine callbacks update the metrics: they hold this (and their agent) by shared_ptr, never
  // the store, so a callback running late cannot touch a destroyed AgentStore.
  std::shared_ptr<SharedMetrics> metrics_ = std::make_shared<SharedMetrics>();
  // Bytes the import buffers of open handles hold in memory (ImportBuffer), against this limit.
  std::shared_ptr<std::atomic<uint64_t>> import_memory_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> import_disk_ = std::make_shared<std::atomic<uint64_t>>(0);  // spilled
  uint64_t import_memory_limit_ = 0;
};

}  // namespace kvfs::fs
