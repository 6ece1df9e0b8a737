// AgentStore: open files: open/create, read, write, flush (close), release.
#include <algorithm>
#include <future>
#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/core/shred.h"
#include "fs/agent_store.h"
#include "fs/handle.h"

namespace kvfs::fs {

namespace {

using Kind = AgentStore::Handle::Kind;

// A write that would take a kv.safetensors or an editable file to `end` bytes: refused for good
// (nothing of the file is applied at close) past `limit`, or once an earlier write was.
Status CheckWriteLimit(AgentStore::Handle& handle, uint64_t end, size_t limit) {
  if (handle.refused.ok() && end > limit) {
    handle.refused = TooLarge(fmt::format("this file is limited to {} bytes", limit));
  }
  return handle.refused;
}

Status ReadOnly(std::string_view name) { return PermissionDenied(fmt::format("{} is read-only", name)); }

// Handles whose writes are applied at the close of the process that opened them (or the last
// close), not at a child's close of an inherited copy (Flush).
bool AppliedAtOpenersClose(Kind kind) { return kind == Kind::kPrompt || kind == Kind::kImport || kind == Kind::kEditable; }

std::string Slice(const std::string& data, uint64_t offset, size_t size) {
  if (offset >= data.size()) return {};
  return data.substr(static_cast<size_t>(offset), size);
}

}  // namespace

Result<std::string> AgentStore::RenderFile(const Node& node) {
  if (node.kind == NodeKind::kSpecialFile) {
    switch (node.special) {
      case SpecialFile::kStatusText: return EngineStatusText(engine_.Stats(), Metrics());
      case SpecialFile::kStatusJson: return JsonFileText(EngineStatusJson(engine_.Stats(), Metrics()));
      case SpecialFile::kMetrics: {
        EngineStatus status = engine_.Stats();
        size_t agents = 0;
        {
          std::lock_guard lock(mu_);
          agents = agents_.size();
        }
        return MetricsText(status, Metrics(), agents);
      }
      case SpecialFile::kModelJson: return JsonFileText(engine_.ModelInfo());
      case SpecialFile::kAuditLog: return audit_->Read(0, audit_->Size());
    }
  }
  if (node.kind == NodeKind::kPrefixFile) return engine_.PrefixText(node.prefix);
  if (node.kind != NodeKind::kAgentFile) return InvalidArgument("not a file");
  const std::string& name = node.agent->name;
  switch (node.agent_file) {
    case AgentFile::kSystem: {
      KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(name));
      return info.system;
    }
    case AgentFile::kConfig: {
      KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(name));
      return JsonFileText(AgentSettingsToJson(info.settings));
    }
    case AgentFile::kStatus: {
      KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(name));
      Status failure;
      std::optional<RefusedWrite> refused;
      {
        std::lock_guard lock(node.agent->mu);
        failure = node.agent->last_failure;
        refused = node.agent->last_refused_write;
      }
      return JsonFileText(AgentStatusJson(info, failure, refused ? &*refused : nullptr));
    }
    default: return InvalidArgument("not a rendered file");
  }
}

Result<HandleId> AgentStore::Open(InodeId ino, OpenFlags flags, const Caller& caller) {
  KVFS_ASSIGN_OR_RETURN(Node node, NodeCopy(ino));
  std::shared_ptr<Handle> handle;
  switch (node.kind) {
    case NodeKind::kSpecialFile: {
      KVFS_ASSIGN_OR_RETURN(handle, OpenRootFile(node.special, flags));
      break;
    }
    case NodeKind::kPrefixFile: {
      KVFS_ASSIGN_OR_RETURN(handle, OpenPrefixFile(node, ino, flags, caller));
      break;
    }
    case NodeKind::kAgentFile: {
      KVFS_ASSIGN_OR_RETURN(handle, OpenAgentFile(node, ino, flags, caller));
      break;
    }
    default:
      return InvalidArgument("cannot open a directory as a file");
  }
  handle->ino = ino;
  handle->node = std::move(node);
  handle->uid = caller.uid;
  handle->opener_process = caller.process;
  handle->append = flags.append;
  return AddHandle(std::move(handle));
}

Result<std::shared_ptr<AgentStore::Handle>> AgentStore::OpenRootFile(SpecialFile file, OpenFlags flags) {
  if (flags.write || flags.truncate) return ReadOnly(SpecialFileName(file));
  auto handle = std::make_shared<Handle>();
  if (file == SpecialFile::kAuditLog) {
    handle->kind = Kind::kAuditLog;
    return handle;
  }
  Node node;
  node.kind = NodeKind::kSpecialFile;
  node.special = file;
  handle->kind = Kind::kSnapshot;
  KVFS_ASSIGN_OR_RETURN(handle->data, RenderFile(node));
  return handle;
}
Result<std::shared_ptr<AgentStore::Handle>> AgentStore::OpenAgentFile(const Node& node, InodeId ino, OpenFlags flags,
                                                                      const Caller& caller) {
  const std::shared_ptr<AgentRecord>& agent = node.agent;
  if (caller.uid != 0 && caller.uid != agent->uid) {
    return PermissionDenied(fmt::format("agent '{}' belongs to another user", agent->name));
  }
  bool writes = flags.write || flags.truncate;
  AgentFile file = node.agent_file;
  std::string_view name = AgentFileName(file);
  // Root bypasses mode bits under default_permissions, so the open flags are checked here.
  bool read_only = file == AgentFile::kResponse || file == AgentFile::kTranscript || file == AgentFile::kStatus;
  if (read_only && writes) return ReadOnly(name);
  if (file == AgentFile::kPrompt && flags.read) return PermissionDenied("prompt is write-only");
  // Any open of a cold agent's file starts reloading its cache (a no-op when it is in memory).
  engine_.Prefetch(agent->name);

  auto handle = std::make_shared<Handle>();
  switch (file) {
    case AgentFile::kPrompt:
      handle->kind = Kind::kPrompt;
      return handle;
    case AgentFile::kResponse: {
      handle->kind = Kind::kResponse;
      {
        std::lock_guard lock(agent->mu);
        handle->turn = agent->latest;
      }
      if (handle->turn == nullptr) {
        // No turn through this mount since start: the latest committed reply.
        handle->kind = Kind::kSnapshot;
        handle->data = LastReplyText(agent);
      }
      return handle;
    }
    case AgentFile::kTranscript:
      handle->kind = Kind::kTranscript;
      return handle;
    case AgentFile::kStatus: {
      handle->kind = Kind::kSnapshot;
      KVFS_ASSIGN_OR_RETURN(handle->data, RenderFile(node));
      return handle;
    }
    case AgentFile::kSystem:
    case AgentFile::kConfig: {
      handle->kind = writes ? Kind::kEditable : Kind::kSnapshot;
      // config.json merges the JSON written, so `echo '{...}' >> config.json` (O_APPEND, write
      // only) is a merge of what it appends: its text is all the handle holds. Appended to the
      // rendered file, it would be invalid JSON, refused at a close the shell ignores.
      const bool merge_appended = file == AgentFile::kConfig && flags.append && !flags.read;
      if (!flags.truncate && !merge_appended) {
        KVFS_ASSIGN_OR_RETURN(handle->data, RenderFile(node));
      }
      handle->holds_only_writes = handle->data.empty();
      // `: > system` (O_TRUNC, no write) empties the system prompt at its last close, as on any
      // file. An emptied config.json merges nothing (ApplyWrites), so there it changes nothing.
      handle->empty_at_last_close = flags.truncate && file == AgentFile::kSystem;
      if (handle->empty_at_last_close) {
        KVFS_ASSIGN_OR_RETURN(handle->system_at_open, RenderFile(node));
      }
      return handle;
    }
    case AgentFile::kKvCache: {
      // The export is a snapshot taken at open: a turn finishing meanwhile does not tear it.
      auto export_cache = [&]() -> Result<std::string> {
        KVFS_ASSIGN_OR_RETURN(std::string file, engine_.ExportCache(agent->name));
        {
          std::lock_guard lock(metrics_->mu);
          ++metrics_->values.exports;
          metrics_->values.export_bytes += file.size();
        }
        // Audited at the first read: an open that reads nothing (ls, a close without reads, an
        // open for writing) exports nothing.
        handle->export_to_audit = file.size();
        return file;
      };
      if (writes) {
        handle->kind = Kind::kImport;  // the file written replaces the cache at close
        handle->import = std::make_unique<ImportBuffer>(ImportBufferOptions{
            .memory_total = import_memory_,
            .memory_limit = import_memory_limit_,
            .spill_dir = config_.import_spill_dir,
            .spill_bytes = config_.import_spill_bytes,
            .disk_total = import_disk_,
            .disk_limit = config_.max_import_spill_bytes});
        if (!flags.truncate && !flags.append) {
          // Opened for writing without O_TRUNC, as on any file: it starts as the export, reads
          // show it, writes change it in place (dd conv=notrunc, truncate -s), and a close after
          // writes imports what it has become. A close without writes imports nothing. (Opened
          // to append, `cat x >> kv.safetensors`, it holds what is written: an import of x.)
          KVFS_ASSIGN_OR_RETURN(std::string file, export_cache());
          Status copied = handle->import->Write(0, file);
          ShredString(file);  // (the agent's cache and conversation)
          KVFS_RETURN_IF_ERROR(copied);
        }
        return handle;
      }
      handle->kind = Kind::kSnapshot;
      KVFS_ASSIGN_OR_RETURN(handle->data, export_cache());
      return handle;
    }
  }
  return InvalidArgument("unknown agent file");
}
Result<std::string> AgentStore::Read(HandleId id, uint64_t offset, size_t size, Interrupt* interrupt) {
  auto handle = FindHandle(id);
  if (handle == nullptr) return InvalidArgument("bad file handle");
  switch (handle->kind) {
    case Kind::kResponse: {
      // The blocking form of ReadAsync (tests, callers without FUSE): the same wait. `interrupt`
      // is borrowed: it outlives the read, which returns only once answered.
      std::promise<Result<std::string>> answer;
      std::future<Result<std::string>> answered = answer.get_future();
      ReadAsync(id, offset, size, std::shared_ptr<Interrupt>(std::shared_ptr<Interrupt>(), interrupt),
                [&answer](Result<std::string> r) { answer.set_value(std::move(r)); });
      return answered.get();
    }
    case Kind::kTranscript: {
      std::string bytes;
      KVFS_RETURN_IF_ERROR(TranscriptRange(handle->node.agent, offset, size, &bytes).status());
      return bytes;
    }
    case Kind::kAuditLog: return audit_->Read(offset, size);
    case Kind::kPrompt: return PermissionDenied("prompt is write-only");
    case Kind::kDirectory: return InvalidArgument("is a directory");
    case Kind::kImport: {
      std::lock_guard lock(handle->mu);
      if (handle->erased) return ErasedUnderHandle(*handle);
      KVFS_RETURN_IF_ERROR(AuditExportRead(*handle));
      return handle->import->Read(offset, size);
    }
    default: {
      std::lock_guard lock(handle->mu);
      if (handle->erased) return ErasedUnderHandle(*handle);
      KVFS_RETURN_IF_ERROR(AuditExportRead(*handle));
      return Slice(handle->data, offset, size);
    }
  }
}

Status AgentStore::AuditExportRead(Handle& handle) {
  if (!handle.export_to_audit) return Status::Ok();
  const AuditEvent event{.time_ms = Now(), .uid = handle.uid, .agent = handle.node.agent->name, .action = "export",
                         .bytes = *handle.export_to_audit};
  if (Status s = audit_->AppendBefore(event); !s.ok()) {
    spdlog::error("audit log: {} (export of {} refused: it is not served unless it is on record)", s.message(),
                  event.agent);
    return s.WithContext("the export of agent '" + event.agent + "' cannot be put on record");
  }
  handle.export_to_audit.reset();
  return Status::Ok();
}

Status AgentStore::ErasedUnderHandle(const Handle& handle) {
  return NotFound(fmt::format("what this file of agent '{}' held was erased while it was open", handle.node.agent->name));
}

std::optional<Result<std::string>> ResponseNow(const AgentRecord& agent, const TurnStream& turn, uint64_t offset,
                                               size_t size, bool interrupted, bool shutting_down) {
  if (agent.erased) return NotFound(fmt::format("agent '{}' was erased", agent.name));
  if (turn.reply.size() > offset) return Slice(turn.reply, offset, size);
  // A turn that rmdir cancelled: its readers wait for the erasure's end, then get ENOENT (erased)
  // or, if the erasure failed and the agent stays, EIO (the turn failed) as any failed turn's do.
  const bool cancelled_by_erasure = turn.done && !turn.failure.ok() && agent.erasing;
  if (turn.done && !cancelled_by_erasure) {
    if (!turn.failure.ok()) return IoError("the turn failed: " + turn.failure.message());
    return std::string();
  }
  if (interrupted) return Cancelled("read of response interrupted");
  if (shutting_down) return IoError("kvfsd is shutting down");
  return std::nullopt;
}

AnsweredReads AnswerReadyReads(AgentRecord& agent, bool shutting_down) {
  AnsweredReads answered;
  std::vector<ParkedRead> still;
  for (ParkedRead& read : agent.parked) {
    std::optional<Result<std::string>> now = ResponseNow(agent, *read.turn, read.offset, read.size, false, shutting_down);
    if (now) answered.emplace_back(std::move(read.reply), std::move(*now));
    else still.push_back(std::move(read));
  }
  agent.parked = std::move(still);
  return answered;
}

void DeliverReads(AnsweredReads& answered) {
  for (auto& [reply, result] : answered) reply(std::move(result));
  answered.clear();
}

void AgentStore::ReadAsync(HandleId id, uint64_t offset, size_t size, const std::shared_ptr<Interrupt>& interrupt,
                           ReadReply reply) {
  auto handle = FindHandle(id);
  if (handle == nullptr || handle->kind != Kind::kResponse) return reply(Read(id, offset, size, interrupt.get()));
  const std::shared_ptr<AgentRecord>& agent = handle->node.agent;
  uint64_t parked_id = 0;
  {
    std::unique_lock lock(agent->mu);
    std::optional<Result<std::string>> now = ResponseNow(
        *agent, *handle->turn, offset, size, interrupt != nullptr && interrupt->triggered(), readers_released_.load());
    if (now) {
      lock.unlock();
      return reply(std::move(*now));
    }
    parked_id = agent->next_parked_id++;
    agent->parked.push_back(ParkedRead{parked_id, offset, size, handle->turn, std::move(reply)});
  }
  if (interrupt == nullptr) return;
  // Takes the park back; null when it was answered already.
  auto unpark = [agent, parked_id]() -> ReadReply {
    std::lock_guard lock(agent->mu);
    auto it = std::find_if(agent->parked.begin(), agent->parked.end(),
                           [&](const ParkedRead& r) { return r.id == parked_id; });
    if (it == agent->parked.end()) return nullptr;
    ReadReply reply = std::move(it->reply);
    agent->parked.erase(it);
    return reply;
  };
  // Set after the park is visible (and with the agent's mutex released: the cancel takes it); an
  // interrupt that came in between runs it at once.
  try {
    interrupt->OnTrigger([unpark] {
      if (ReadReply cancelled = unpark()) cancelled(Cancelled("read of response interrupted"));
    });
  } catch (...) {
    // (bad_alloc) The caller answers the request from the exception, so the park must go; if
    // it was answered meanwhile, the request is done and the exception must not answer it again.
    if (unpark()) throw;
  }
}

Result<size_t> AgentStore::Write(HandleId id, uint64_t offset, std::string_view bytes) {
  auto handle = FindHandle(id);
  if (handle == nullptr) return InvalidArgument("bad file handle");
  std::lock_guard lock(handle->mu);
  Result<size_t> written = WriteLocked(*handle, offset, bytes);
  if (!written.ok()) NoteRefusedWrite(*handle, written.status());
  return written;
}

void AgentStore::NoteRefusedWrite(const Handle& handle, const Status& status) {
  if (handle.node.kind != NodeKind::kAgentFile || handle.node.agent == nullptr) return;
  AgentRecord& agent = *handle.node.agent;
  std::lock_guard lock(agent.mu);
  agent.last_refused_write = RefusedWrite{std::string(AgentFileName(handle.node.agent_file)), status, Now()};
}

Result<size_t> AgentStore::WriteLocked(Handle& handle, uint64_t offset, std::string_view bytes) {
  switch (handle.kind) {
    case Kind::kPrompt: {
      // A prompt is the bytes written, in order. A write anywhere but at the end of what was
      // written (a pwrite back, a seek forward) is refused, and the prompt with it: it would not
      // say what its writer meant. O_APPEND writes need no check (their offsets come from a size
      // the kernel may not know). The first refusal is for good: this prompt never becomes a turn.
      if (!handle.refused.ok()) return handle.refused;
      auto refuse = [&](Status why) -> Status {
        handle.refused = std::move(why);
        std::lock_guard m(metrics_->mu);
        ++metrics_->values.prompts_refused;
        return handle.refused;
      };
      if (handle.prompt_cut_at && offset == *handle.prompt_cut_at) handle.prompt_end = offset;  // (see the field)
      handle.prompt_cut_at.reset();
      if (!handle.append && offset != handle.prompt_end) {
        return refuse(InvalidArgument(fmt::format(
            "a prompt is written in order: this write starts at byte {}, the prompt has {}", offset, handle.prompt_end)));
      }
      if (handle.data.size() + bytes.size() > config_.max_prompt_bytes) {
        return refuse(TooLarge(fmt::format("a prompt is limited to {} bytes", config_.max_prompt_bytes)));
      }
      if (!handle.utf8.Feed(bytes)) return refuse(IllegalSequence("the prompt is not valid UTF-8"));
      GrowShredding(handle.data, handle.data.size() + bytes.size());  // (prompt text)
      handle.data.append(bytes);
      handle.prompt_end += bytes.size();
      return bytes.size();
    }
    case Kind::kImport: {
      const uint64_t at = handle.append ? handle.import->size() : offset;
      KVFS_RETURN_IF_ERROR(CheckWriteLimit(handle, at + bytes.size(), config_.max_import_bytes));
      // Out of memory budget or disk: the write fails, not the file (it can be tried again).
      if (Status written = handle.import->Write(at, bytes); !written.ok()) {
        handle.import_write_failure = written;
        handle.import_failed_at = at;
        return written;
      }
      // A retry that wrote the bytes the failed write was for makes the file whole again.
      if (!handle.import_write_failure.ok() && at <= handle.import_failed_at && at + bytes.size() > handle.import_failed_at)
        handle.import_write_failure = Status::Ok();
      handle.dirty = true;
      return bytes.size();
    }
    case Kind::kEditable: {
      const uint64_t at = handle.append ? handle.data.size() : offset;
      KVFS_RETURN_IF_ERROR(CheckWriteLimit(handle, at + bytes.size(), config_.max_text_bytes));
      if (handle.data.size() < at + bytes.size()) {
        GrowShredding(handle.data, static_cast<size_t>(at + bytes.size()));  // (system text, settings)
        handle.data.resize(static_cast<size_t>(at + bytes.size()));
      }
      handle.data.replace(static_cast<size_t>(at), bytes.size(), bytes);
      handle.dirty = true;
      handle.empty_at_last_close = false;  // a flush applies what it now holds
      Status early = handle.holds_only_writes ? CheckWrittenSoFar(handle) : Status::Ok();
      if (!early.ok()) {
        handle.refused = early;  // nothing of this file is applied
        return early;
      }
      return bytes.size();
    }
    default:
      return PermissionDenied("file is read-only");
  }
}

bool AgentStore::OpeningProcessMatters(InodeId ino) {
  std::lock_guard lock(mu_);
  const Node* node = inodes_.Find(ino);
  if (node == nullptr) return false;
  if (node->kind == NodeKind::kPrefixFile) return true;
  return node->kind == NodeKind::kAgentFile &&
         (node->agent_file == AgentFile::kPrompt || node->agent_file == AgentFile::kKvCache ||
          node->agent_file == AgentFile::kSystem || node->agent_file == AgentFile::kConfig);
}

bool AgentStore::ClosingProcessMatters(HandleId id) {
  auto handle = FindHandle(id);
  return handle != nullptr && AppliedAtOpenersClose(handle->kind);
}

Status AgentStore::Flush(HandleId id, uint32_t process) {
  auto handle = FindHandle(id);
  if (handle == nullptr) return Status::Ok();
  std::lock_guard lock(handle->mu);
  Status flushed = FlushLocked(*handle, process);
  if (!flushed.ok()) NoteRefusedWrite(*handle, flushed);
  return flushed;
}

Status AgentStore::FlushLocked(Handle& handle, uint32_t process) {
  if (handle.writes_erased)
    return NotFound(fmt::format("agent '{}' was erased while this file was open: what was written to it is gone",
                                handle.node.agent->name));
  // Another process's close of a prompt, an import or an edit (a child's copy of the descriptor):
  // the opener may write more. Its refusal so far, if any, is this close's error too.
  if (AppliedAtOpenersClose(handle.kind) && process != 0 && handle.opener_process != 0 &&
      process != handle.opener_process)
    return handle.refused;
  if (handle.kind == Kind::kPrompt) {
    if (!handle.refused.ok()) return handle.refused;
    if (!handle.utf8.Complete()) {
      handle.refused = IllegalSequence("the prompt ends inside a UTF-8 character");
      std::lock_guard m(metrics_->mu);
      ++metrics_->values.prompts_refused;
      return handle.refused;
    }
    std::string text = std::move(handle.data);
    handle.data.clear();
    handle.utf8 = Utf8Validator();
    // One trailing newline (echo's) is not part of the message.
    if (!text.empty() && text.back() == '\n') text.pop_back();
    if (text.empty()) return Status::Ok();  // an empty prompt is no turn
    return SubmitPrompt(handle.node.agent, std::move(text));
  }
  // `: > system` closes twice without a write (a shell's dup2 and its restore): the second
  // is the command's own close, so the emptying is applied there, before close returns.
  if (handle.kind == Kind::kEditable && handle.empty_at_last_close && !handle.dirty &&
      ++handle.flushes_without_writes >= 2)
    return ApplyEmptying(handle);
  if ((handle.kind == Kind::kEditable || handle.kind == Kind::kImport) && handle.dirty) {
    handle.dirty = false;  // applied once, whatever the outcome: release must not repeat it
    if (handle.refused.ok()) {
      Status applied = ApplyWrites(handle);
      if (!applied.ok()) UndoAppliedEdit(handle);
      return applied;
    }
  }
  if (!handle.refused.ok()) UndoAppliedEdit(handle);
  return handle.refused;
}

void AgentStore::UndoAppliedEdit(Handle& handle) {
  if (!handle.applied_edit) return;
  Handle::AppliedEdit edit = std::move(*handle.applied_edit);
  handle.applied_edit.reset();
  Handle restore;
  restore.kind = Kind::kEditable;
  restore.ino = handle.ino;
  restore.node = handle.node;
  restore.uid = handle.uid;
  restore.data = std::move(edit.before);
  restore.only_if_system_is = std::move(edit.applied);  // else changed since by someone else: theirs stands
  Status undone = ApplyWrites(restore);
  if (!undone.ok()) spdlog::warn("{}: the system prompt before a refused write was not put back: {}",
                                 handle.node.agent->name, undone.message());
}

Status AgentStore::ApplyEmptying(Handle& handle) {
  handle.empty_at_last_close = false;
  Handle empty;
  empty.kind = Kind::kEditable;
  empty.ino = handle.ino;
  empty.node = handle.node;
  empty.uid = handle.uid;
  empty.only_if_system_is = handle.system_at_open;  // another writer's edit since the open stands
  return ApplyWrites(empty);
}

void AgentStore::Discard(HandleId id) {
  if (auto handle = FindHandle(id)) {
    std::lock_guard lock(handle->mu);
    handle->dirty = false;
    handle->empty_at_last_close = false;
    handle->data.clear();
  }
  Release(id);
}

void AgentStore::Release(HandleId id) {
  std::shared_ptr<Handle> handle;
  {
    std::lock_guard lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end()) return;
    handle = std::move(it->second);
    handles_.erase(it);
  }
  bool unapplied = false;
  {
    std::lock_guard lock(handle->mu);
    unapplied = (handle->kind == Kind::kPrompt && !handle->data.empty()) ||
                ((handle->kind == Kind::kEditable || handle->kind == Kind::kImport) &&
                 (handle->dirty || handle->empty_at_last_close) && handle->refused.ok());
  }
  if (handle->node.kind == NodeKind::kPrefixFile && handle->kind == Kind::kEditable && !unapplied) {
    // A prefix created and closed without text (touch) is no prefix, once no other writer has it
    // open. (Not while another writer's close is adding it: ApplyPrefix.)
    std::lock_guard writes(prefix_writes_mu_);
    std::lock_guard lock(mu_);  // the check and the drop at once: an open may come between them
    auto it = prefixes_.find(handle->node.prefix);
    const bool drop = it != prefixes_.end() && it->second.ino == handle->ino && it->second.pending &&
                      std::none_of(handles_.begin(), handles_.end(), [&](const auto& open) {
                        return open.second->ino == handle->ino && open.second->kind == Kind::kEditable;
                      });
    if (drop) DropPendingPrefixLocked(it);
  }
  if (!unapplied) return;
  // Reached when no flush applied it: none came, or only other processes' (the opener closed
  // its descriptor before a child that inherited it wrote the rest).
  Status s = Status::Ok();
  {
    std::lock_guard lock(handle->mu);
    if (handle->kind == Kind::kPrompt && handle->refused.ok() && handle->utf8.Complete()) {
      std::string text = std::move(handle->data);
      if (!text.empty() && text.back() == '\n') text.pop_back();
      if (!text.empty()) s = SubmitPrompt(handle->node.agent, std::move(text));
    } else if (handle->kind != Kind::kPrompt && !handle->dirty) {
      s = ApplyEmptying(*handle);  // opened with O_TRUNC, never written
    } else if (handle->kind != Kind::kPrompt) {
      handle->dirty = false;
      s = ApplyWrites(*handle);
    }
    if (!s.ok()) NoteRefusedWrite(*handle, s);
  }
  if (!s.ok()) spdlog::warn("release: {}", s.message());
}
}  // namespace kvfs::fs
