// AgentStore: creating and erasing agents (mkdir, rmdir), unlink, truncation.
#include <algorithm>
#include <tuple>
#include <cerrno>
#include <cstring>
#include <iterator>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/core/shred.h"
#include "engine/store/block_format.h"
#include "engine/store/manifest.h"
#include "fs/agent_store.h"
#include "fs/handle.h"

namespace kvfs::fs {

namespace {

bool IsOwnerOrRoot(const Caller& caller, uint32_t owner) { return caller.uid == 0 || caller.uid == owner; }

Status CheckAgentName(std::string_view name) {
  if (!name.empty() && name[0] == '.') return InvalidArgument(fmt::format("'{}': names starting with '.' are reserved", name));
  if (!store::IsValidAgentName(name)) {
    return InvalidArgument(fmt::format("'{}' is not a valid agent name ([A-Za-z0-9_-], 1 to 64 characters)", name));
  }
  return Status::Ok();
}

}  // namespace

Result<Attr> AgentStore::MakeAgent(InodeId parent, std::string_view name_view, const Caller& caller) {
  std::string name(name_view);
  {
    std::lock_guard lock(mu_);
    Node* dir = inodes_.Find(parent);
    if (dir == nullptr || dir->removed) return NotFound("directory is gone");
    if (dir->kind != NodeKind::kRoot) return NotPermitted("agents are directories of the mount root only");
    if (name == kPrefixDirName) return AlreadyExists(".prefixes exists");
    for (SpecialFile f : kSpecialFiles) {
      if (name == SpecialFileName(f)) return AlreadyExists(fmt::format("{} exists", name));
    }
    KVFS_RETURN_IF_ERROR(CheckAgentName(name));
    if (agents_.count(name) || agents_in_transition_.count(name)) {
      return AlreadyExists(fmt::format("agent '{}' exists", name));
    }
    if (shutting_down_.load()) return IoError("kvfsd is shutting down");
    agents_in_transition_[name] = "creating";
  }
  // The engine persists the new agent; no store lock is held meanwhile.
  Status created = engine_.CreateAgent(name, caller.uid);
  std::lock_guard lock(mu_);
  agents_in_transition_.erase(name);
  if (!created.ok()) return created;
  auto agent = std::make_shared<AgentRecord>(name, caller.uid, caller.gid);
  agent->transcript_valid = true;  // a new agent has an empty conversation
  agents_[name] = agent;
  InodeId ino = EnsureAgentInodeLocked(agent);
  inodes_.Ref(ino);
  root_mtime_ms_ = Now();
  return AgentDirAttr(*agent, nullptr, ino);
}

Status AgentStore::RemoveAgent(InodeId parent, std::string_view name_view, const Caller& caller) {
  std::string name(name_view);
  std::shared_ptr<AgentRecord> agent;
  {
    std::lock_guard lock(mu_);
    Node* dir = inodes_.Find(parent);
    if (dir == nullptr || dir->removed) return NotFound("directory is gone");
    if (dir->kind == NodeKind::kPrefixDir) return NotPermitted(".prefixes holds files only");
    if (dir->kind != NodeKind::kRoot) return NotFound(fmt::format("no directory '{}'", name));
    if (name == kPrefixDirName) return NotPermitted(".prefixes cannot be removed");
    agent = AgentLocked(name);
    if (agent == nullptr) return NotFound(fmt::format("no agent named '{}'", name));
    if (!IsOwnerOrRoot(caller, agent->uid)) return PermissionDenied(fmt::format("agent '{}' belongs to another user", name));
    if (agents_in_transition_.count(name)) return AlreadyExists(fmt::format("agent '{}' is being erased", name));
    agents_in_transition_[name] = "erasing";
  }
  // Edits and submissions through open handles that passed CheckStillLive finish first (against
  // this agent, which is then erased); later ones see the transition and fail.
  { std::lock_guard in_flight(agent->submit_mu); }
  // Returns once the erasure is complete (the engine cancels the running turn first).
  const std::string intent = IntendAudit(AuditEvent{.uid = caller.uid, .agent = name, .action = "erase", .owner_uid = agent->uid});
  {
    std::lock_guard lock(agent->mu);
    agent->erasing = true;
  }
  Result<store::EraseReport> report = engine_.EraseAgent(name);
  if (!report.ok()) {
    SettleFailedErasure(intent, engine_.GetAgent(name).ok());
    AnsweredReads answered;
    {
      std::lock_guard lock(agent->mu);
      agent->erasing = false;
      answered = AnswerReadyReads(*agent, readers_released_.load());  // a cancelled turn's: EIO
    }
    DeliverReads(answered);
  }
  {
    std::lock_guard lock(mu_);
    agents_in_transition_.erase(name);
    if (!report.ok()) return report.status();
    agents_.erase(name);
    if (agent->dir_ino != 0) inodes_.RemoveAgent(agent->dir_ino);
    root_mtime_ms_ = Now();
  }
  {
    std::lock_guard lock(metrics_->mu);
    ++metrics_->values.agents_erased;
  }
  AnsweredReads answered;
  {
    std::lock_guard lock(agent->mu);
    agent->erased = true;
    // Nothing of the agent's text outlives it in memory here either, open files' included.
    ShredString(agent->transcript);
    for (const std::shared_ptr<TurnStream>& turn : agent->pending) ShredString(turn->reply), ShredString(turn->user_text);
    if (agent->latest) ShredString(agent->latest->reply), ShredString(agent->latest->user_text);
    answered = AnswerReadyReads(*agent, readers_released_.load());
  }
  DeliverReads(answered);
  ShredOpenFiles(*agent, /*cache_only=*/false);
  CompleteAudit(intent,
                AuditEvent{.uid = caller.uid, .agent = name, .action = "erase", .erased = *report, .owner_uid = agent->uid});
  spdlog::info("erased agent '{}' for uid {}: {} bytes, {} blocks freed, {} kept shared", name, caller.uid,
               report->bytes_freed, report->blocks_freed, report->blocks_kept_shared);
  return Status::Ok();
}

void AgentStore::ShredOpenFiles(const AgentRecord& agent, bool cache_only) {
  std::vector<std::shared_ptr<Handle>> open;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, h] : handles_) {
      if (h->node.kind == NodeKind::kAgentFile && h->node.agent.get() == &agent &&
          (!cache_only || h->node.agent_file == AgentFile::kKvCache))
        open.push_back(h);
    }
  }
  for (const std::shared_ptr<Handle>& h : open) {
    std::lock_guard lock(h->mu);
    if (cache_only && h->kind != Handle::Kind::kSnapshot) continue;  // an import being written is new data
    h->erased = true;
    h->writes_erased = h->dirty || (h->kind == Handle::Kind::kPrompt && !h->data.empty());
    ShredString(h->data);
    if (h->import) h->import->Clear();
  }
}

Status AgentStore::Unlink(InodeId parent, std::string_view name_view, const Caller& caller) {
  std::string name(name_view);
  KVFS_ASSIGN_OR_RETURN(Node dir, NodeCopy(parent));
  if (dir.kind == NodeKind::kRoot) {
    for (SpecialFile f : kSpecialFiles) {
      if (name == SpecialFileName(f)) return NotPermitted(fmt::format("{} cannot be removed", name));
    }
    return NotFound(fmt::format("no file '{}'", name));
  }
  if (dir.kind == NodeKind::kPrefixDir) {
    // Not while a close applies a write of it: that close would add back what this erases.
    std::lock_guard writes(prefix_writes_mu_);
    InodeId ino = 0;
    {
      std::lock_guard lock(mu_);
      auto it = prefixes_.find(name);
      if (it == prefixes_.end()) return NotFound(fmt::format("no prefix named '{}'", name));
      ino = it->second.ino;
    }
    const std::string intent = IntendAudit(AuditEvent{.uid = caller.uid, .agent = name, .action = "prefix_remove"});
    Result<store::EraseReport> removed = engine_.RemovePrefix(name);
    if (!removed.ok()) {
      const std::vector<std::string> left = engine_.ListPrefixes();
      SettleFailedErasure(intent, std::find(left.begin(), left.end(), name) != left.end());
      return removed.status();
    }
    const store::EraseReport& report = *removed;
    {
      std::lock_guard lock(mu_);
      auto it = prefixes_.find(name);
      if (it != prefixes_.end() && it->second.ino == ino) {
        prefixes_.erase(it);
        inodes_.RemovePrefix(ino);
      }
    }
    {
      std::lock_guard lock(metrics_->mu);
      ++metrics_->values.prefixes_erased;
    }
    CompleteAudit(intent, AuditEvent{.uid = caller.uid, .agent = name, .action = "prefix_remove", .erased = report});
    return Status::Ok();
  }
  if (dir.kind != NodeKind::kAgentDir) return NotFound(fmt::format("no file '{}'", name));
  if (!IsOwnerOrRoot(caller, dir.agent->uid)) {
    return PermissionDenied(fmt::format("agent '{}' belongs to another user", dir.agent->name));
  }
  const AgentFile* file = std::find_if(std::begin(kAgentFiles), std::end(kAgentFiles),
                                       [&](AgentFile f) { return name == AgentFileName(f); });
  if (file == std::end(kAgentFiles)) return NotFound(fmt::format("agents have no file '{}'", name));
  if ((dir.agent->unlinked_files.load() & AgentFileBit(*file)) != 0) {
    return NotFound(fmt::format("'{}' was unlinked already", name));
  }
  // An agent's files exist as long as it does, so an unlink leaves the name in place. A process
  // that unlinks the same file again at once expected it gone: `tar -x` over an agent unlinks,
  // fails its O_EXCL create and unlinks again, forever. The repeat is refused, which ends that
  // loop; `rm -r` unlinks each file once. "At once": within kRepeatMs of the end of the last
  // unlink (an erasure of the cache takes time; tar's next try follows in microseconds). Not
  // for the files an unlink hides (system, config.json, kv.safetensors): tar's create of one
  // succeeds, and a second unlink after it came back (a cache reset, a turn, then rm -r) is
  // meant.
  constexpr int64_t kRepeatMs = 250;
  const InodeId ino = InodeTable::AgentFileInode(parent, *file);
  const bool repeat_refused = caller.pid != 0 && !HiddenByUnlink(*file);
  if (repeat_refused) {
    const int64_t now = Now();
    std::lock_guard lock(mu_);
    std::erase_if(recent_unlinks_, [&](const RecentUnlink& u) { return now - u.time_ms > kRepeatMs; });
    for (const RecentUnlink& u : recent_unlinks_) {
      if (u.pid == caller.pid && u.ino == ino) {
        return NotPermitted(fmt::format("{} cannot be removed: it exists as long as agent '{}' (rm -r erases the agent)",
                                        name, dir.agent->name));
      }
    }
  }
  if (*file == AgentFile::kKvCache) {
    const std::string intent =
        IntendAudit(AuditEvent{.uid = caller.uid, .agent = dir.agent->name, .action = "erase_cache", .owner_uid = dir.agent->uid});
    auto cache_of = [&] {
      Result<AgentInfo> info = engine_.GetAgent(dir.agent->name);
      return info.ok() ? std::tuple{info->context_tokens, info->disk_bytes, info->stored_cache}
                       : std::tuple<int64_t, int64_t, bool>{-1, -1, false};
    };
    const auto cache_before = cache_of();
    Result<store::EraseReport> erased = engine_.EraseCache(dir.agent->name);
    if (!erased.ok()) {
      SettleFailedErasure(intent, cache_of() == cache_before);  // refused (a turn running, ...): unchanged
      return erased.status();
    }
    const store::EraseReport& report = *erased;
    ShredOpenFiles(*dir.agent, /*cache_only=*/true);  // exports being read
    {
      std::lock_guard lock(metrics_->mu);
      ++metrics_->values.caches_erased;
    }
    CompleteAudit(intent, AuditEvent{.uid = caller.uid, .agent = dir.agent->name, .action = "erase_cache",
                                     .erased = report, .owner_uid = dir.agent->uid});
  }
  // The other files are views of the agent's state: unlinking them succeeds and changes
  // nothing, so that `rm -r agent` reaches the rmdir that erases it. The writable ones are then
  // absent until created again (or the agent's next turn): tools that replace a file by unlink
  // and create (tar -x, mv from another filesystem, install, cp --remove-destination) expect
  // the name free; their create writes the file (Create).
  if (HiddenByUnlink(*file)) {
    std::lock_guard submit(dir.agent->submit_mu);  // ordered with a turn's submission, which shows them again
    dir.agent->unlinked_files.fetch_or(AgentFileBit(*file));
  }
  if (repeat_refused) {
    std::lock_guard lock(mu_);
    recent_unlinks_.push_back(RecentUnlink{caller.pid, ino, Now()});
  }
  return Status::Ok();
}

Result<Attr> AgentStore::Truncate(InodeId ino, uint64_t size, std::optional<HandleId> handle_id, const Caller& caller) {
  KVFS_ASSIGN_OR_RETURN(Node node, NodeCopy(ino));
  bool writable = false;
  if (node.kind == NodeKind::kPrefixFile) writable = true;
  if (node.kind == NodeKind::kAgentFile) {
    if (!IsOwnerOrRoot(caller, node.agent->uid)) {
      return PermissionDenied(fmt::format("agent '{}' belongs to another user", node.agent->name));
    }
    AgentFile f = node.agent_file;
    writable = f == AgentFile::kPrompt || f == AgentFile::kSystem || f == AgentFile::kConfig || f == AgentFile::kKvCache;
  }
  if (node.kind == NodeKind::kRoot || node.kind == NodeKind::kPrefixDir || node.kind == NodeKind::kAgentDir) {
    return InvalidArgument("cannot truncate a directory");
  }
  if (!writable) return PermissionDenied("read-only file");
  bool resized = false;  // an open file's buffer
  if (handle_id) {
    auto handle = FindHandle(*handle_id);
    if (handle != nullptr && handle->kind != Handle::Kind::kSnapshot) {
      resized = true;
      std::lock_guard lock(handle->mu);
      if (handle->kind == Handle::Kind::kPrompt) {
        // The UTF-8 state covers the whole buffer: only a restart from empty keeps it exact. A
        // refused cut refuses the prompt, as a refused write does: its text is not what the
        // writer meant any more.
        if (size != 0 && size == handle->prompt_end) {
          // (Python's f.truncate() after its writes: a cut to where it is changes nothing.)
        } else if (size != 0) {
          if (handle->refused.ok()) {
            handle->refused = InvalidArgument("a prompt can only be truncated to 0");
            std::lock_guard m(metrics_->mu);
            ++metrics_->values.prompts_refused;
          }
          NoteRefusedWrite(*handle, handle->refused);
          return handle->refused;
        } else {
          handle->data.clear();
          if (handle->prompt_end != 0) handle->prompt_cut_at = handle->prompt_end;
          handle->prompt_end = 0;  // the next write starts the prompt again
          handle->utf8 = Utf8Validator();
          handle->refused = Status::Ok();
        }
      } else {
        const size_t limit = handle->kind == Handle::Kind::kImport ? config_.max_import_bytes : config_.max_text_bytes;
        if (size > limit) return TooLarge(fmt::format("this file is limited to {} bytes", limit));
        if (handle->kind == Handle::Kind::kImport) {
          KVFS_RETURN_IF_ERROR(handle->import->Resize(size));
        } else {
          handle->data.resize(size);
          if (size == 0) handle->holds_only_writes = true;
        }
        handle->dirty = true;
        handle->empty_at_last_close = false;
      }
    }
  } else if (node.kind == NodeKind::kPrefixFile ||
             (node.kind == NodeKind::kAgentFile &&
              (node.agent_file == AgentFile::kSystem || node.agent_file == AgentFile::kConfig))) {
    // truncate(2) by path: the file as an open without O_TRUNC, an ftruncate to `size` and a
    // close leave it: the text cut to `size` bytes (or padded with NULs), applied at once or
    // refused with nothing changed. Emptied, system is empty and config.json as it was (an empty
    // file merges nothing).
    if (size > config_.max_text_bytes) return TooLarge(fmt::format("this file is limited to {} bytes", config_.max_text_bytes));
    Handle edited;
    edited.kind = Handle::Kind::kEditable;
    edited.ino = ino;
    edited.node = node;
    edited.uid = caller.uid;
    if (node.kind == NodeKind::kPrefixFile) {
      bool pending = false;
      {
        std::lock_guard lock(mu_);
        auto it = prefixes_.find(node.prefix);
        if (it == prefixes_.end() || it->second.ino != ino) return NotFound(fmt::format("prefix '{}' is gone", node.prefix));
        pending = it->second.pending;
      }
      // Emptied, a prefix stays as it was, as after `: >` (rm it instead); a new one is applied
      // when its creator closes it, from what that one wrote.
      if (size == 0) return AttrOf(ino, node, nullptr);
      if (pending) {
        return Status(StatusCode::kResourceExhausted,
                      fmt::format("prefix '{}' is being written: try again once it is", node.prefix));
      }
      KVFS_ASSIGN_OR_RETURN(edited.data, engine_.PrefixText(node.prefix));
    } else if (size != 0) {
      KVFS_ASSIGN_OR_RETURN(edited.data, RenderFile(node));
    }
    edited.data.resize(size);
    Status applied = ApplyWrites(edited);
    if (!applied.ok()) {
      NoteRefusedWrite(edited, applied);
      return applied;
    }
  } else if (node.kind == NodeKind::kAgentFile && node.agent_file == AgentFile::kKvCache) {
    return InvalidArgument("kv.safetensors is not emptied by truncation: rm it to erase the cache");
  } else if (size != 0) {
    return InvalidArgument("a prompt can only be truncated to 0");
  }
  KVFS_ASSIGN_OR_RETURN(Attr attr, AttrOf(ino, node, nullptr));
  // A file being written has the size it was cut to until it is closed (fstat after ftruncate),
  // not that of what it replaces then.
  if (resized) attr.size = size;
  return attr;
}

Status AgentStore::CheckModeAndOwner(InodeId ino, std::optional<uint32_t> mode, std::optional<uint32_t> uid,
                                     std::optional<uint32_t> gid, const Caller& caller) {
  KVFS_ASSIGN_OR_RETURN(Node node, NodeCopy(ino));
  if (node.agent != nullptr && !IsOwnerOrRoot(caller, node.agent->uid)) {
    return PermissionDenied(fmt::format("agent '{}' belongs to another user", node.agent->name));
  }
  KVFS_ASSIGN_OR_RETURN(Attr attr, AttrOf(ino, node, nullptr));
  if ((mode && *mode != attr.mode) || (uid && *uid != attr.uid) || (gid && *gid != attr.gid)) {
    return NotPermitted("modes and owners of kvfs files are fixed");
  }
  return Status::Ok();
}

Result<struct statvfs> AgentStore::StatFs() const {
  struct statvfs st {};
  if (!config_.store_dir.empty() && ::statvfs(config_.store_dir.c_str(), &st) != 0) {
    const int err = errno;
    return IoError(fmt::format("statfs of the store {}: {}", config_.store_dir, std::strerror(err)));
  }
  st.f_namemax = store::kMaxAgentNameLen;  // agent and prefix names; the fixed files' are shorter
  st.f_flag = 0;                           // the mount's own flags are the kernel's to report
  return st;
}

}  // namespace kvfs::fs
