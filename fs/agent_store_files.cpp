// AgentStore: open files: open/create, read, write, flush (close), release.
#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "fs/agent_store.h"
#include "fs/handle.h"

namespace kvfs::fs {

namespace {

using Kind = AgentStore::Handle::Kind;

Status ReadOnly(std::string_view name) { return PermissionDenied(fmt::format("{} is read-only", name)); }

std::string Slice(const std::string& data, uint64_t offset, size_t size) {
  if (offset >= data.size()) return {};
  return data.substr(static_cast<size_t>(offset), size);
}

// Prefix files may carry an extension ("story.txt"); otherwise the agent-name rules.
bool IsValidPrefixName(std::string_view name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

Status CheckUtf8(std::string_view text, std::string_view what) {
  Utf8Validator v;
  if (!v.Feed(text) || !v.Complete()) return IllegalSequence(fmt::format("{} is not valid UTF-8", what));
  return Status::Ok();
}

// Finds where a JSON text breaks, without exceptions: nlohmann's SAX parser reports the byte.
struct JsonBreakFinder : nlohmann::json_sax<nlohmann::json> {
  std::optional<size_t> error_at;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    error_at = position;
    return false;
  }
};

// config.json as written so far: complete JSON is validated now (so that `echo ... > config.json`
// fails at write, where a shell reports it); text that more writes could still complete passes.
Status CheckPartialConfig(const std::string& text, const AgentSettings& current) {
  JsonBreakFinder finder;
  nlohmann::json::sax_parse(text, &finder, nlohmann::json::input_format_t::json, /*strict=*/true);
  if (!finder.error_at) return ParseAgentSettings(text, current).status();
  if (*finder.error_at >= text.size()) return Status::Ok();  // ends early: may be completed
  return InvalidArgument("config.json: not valid JSON");
}

}  // namespace

Result<std::string> AgentStore::RenderFile(const Node& node) {
  if (node.kind == NodeKind::kSpecialFile) {
    switch (node.special) {
      case SpecialFile::kStatusText: return EngineStatusText(engine_.Stats());
      case SpecialFile::kStatusJson: return EngineStatusJson(engine_.Stats()).dump(2) + "\n";
      case SpecialFile::kMetrics: {
        EngineStatus status = engine_.Stats();
        size_t agents = 0;
        {
          std::lock_guard lock(mu_);
          agents = agents_.size();
        }
        return MetricsText(status, Metrics(), agents);
      }
      case SpecialFile::kModelJson: return engine_.ModelInfo().dump(2) + "\n";
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
      return AgentSettingsToJson(info.settings).dump(2) + "\n";
    }
    case AgentFile::kStatus: {
      KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(name));
      Status failure;
      {
        std::lock_guard lock(node.agent->mu);
        failure = node.agent->last_failure;
      }
      return AgentStatusJson(info, failure).dump(2) + "\n";
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

Result<std::shared_ptr<AgentStore::Handle>> AgentStore::OpenPrefixFile(const Node& node, InodeId ino, OpenFlags flags,
                                                                       const Caller& caller) {
  auto handle = std::make_shared<Handle>();
  bool pending = false;
  {
    std::lock_guard lock(mu_);
    auto it = prefixes_.find(node.prefix);
    if (it == prefixes_.end() || it->second.ino != ino) return NotFound(fmt::format("prefix '{}' is gone", node.prefix));
    pending = it->second.pending;
  }
  std::string text;
  if (!pending && !(flags.write && flags.truncate)) {
    KVFS_ASSIGN_OR_RETURN(text, engine_.PrefixText(node.prefix));
  }
  handle->kind = flags.write ? Kind::kEditable : Kind::kSnapshot;
  handle->data = std::move(text);
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
      if (!flags.truncate) {
        KVFS_ASSIGN_OR_RETURN(handle->data, RenderFile(node));
      }
      return handle;
    }
    case AgentFile::kKvCache: {
      if (writes) {
        handle->kind = Kind::kImport;  // the file written replaces the cache at close
        return handle;
      }
      handle->kind = Kind::kSnapshot;
      // The export is a snapshot taken at open: a turn finishing meanwhile does not tear it.
      KVFS_ASSIGN_OR_RETURN(handle->data, engine_.ExportCache(agent->name));
      {
        std::lock_guard lock(metrics_->mu);
        ++metrics_->values.exports;
        metrics_->values.export_bytes += handle->data.size();
      }
      AuditEvent event;
      event.uid = caller.uid;
      event.agent = agent->name;
      event.action = "export";
      event.bytes = handle->data.size();
      Audit(std::move(event));
      return handle;
    }
  }
  return InvalidArgument("unknown agent file");
}

Result<std::pair<Attr, HandleId>> AgentStore::Create(InodeId parent, std::string_view name_view, OpenFlags flags,
                                                     const Caller& caller) {
  std::string name(name_view);
  KVFS_ASSIGN_OR_RETURN(Node dir, NodeCopy(parent));
  if (dir.kind == NodeKind::kAgentDir) {
    return NotPermitted(fmt::format("agents have a fixed set of files; '{}' cannot be created", name));
  }
  if (dir.kind == NodeKind::kRoot) {
    return NotPermitted(fmt::format("'{}': only agent directories (mkdir) can be created in the mount root", name));
  }
  if (dir.kind != NodeKind::kPrefixDir) return NotFound("not a directory");
  if (!IsValidPrefixName(name)) {
    return InvalidArgument(fmt::format("'{}' is not a valid prefix name ([A-Za-z0-9_.-], 1 to 64, no leading '.')", name));
  }
  InodeId ino = 0;
  {
    std::lock_guard lock(mu_);
    if (prefixes_.count(name)) return AlreadyExists(fmt::format("prefix '{}' exists", name));
    ino = inodes_.AddPrefix(name);
    prefixes_[name] = PrefixRecord{ino, caller.uid, /*pending=*/true};
    inodes_.Ref(ino);
  }
  Node node = *NodeCopy(ino);
  auto handle = std::make_shared<Handle>();
  handle->kind = Kind::kEditable;
  handle->ino = ino;
  handle->node = node;
  handle->uid = caller.uid;
  handle->append = flags.append;
  Attr attr = *AttrOf(ino, node, nullptr);
  return std::make_pair(attr, AddHandle(std::move(handle)));
}

Result<std::string> AgentStore::Read(HandleId id, uint64_t offset, size_t size, Interrupt* interrupt) {
  auto handle = FindHandle(id);
  if (handle == nullptr) return InvalidArgument("bad file handle");
  switch (handle->kind) {
    case Kind::kResponse: return ReadResponse(*handle, offset, size, interrupt);
    case Kind::kTranscript: {
      KVFS_ASSIGN_OR_RETURN(std::string text, TranscriptText(handle->node.agent));
      return Slice(text, offset, size);
    }
    case Kind::kAuditLog: return audit_->Read(offset, size);
    case Kind::kPrompt: return PermissionDenied("prompt is write-only");
    case Kind::kDirectory: return InvalidArgument("is a directory");
    default: {
      std::lock_guard lock(handle->mu);
      return Slice(handle->data, offset, size);
    }
  }
}

Result<std::string> AgentStore::ReadResponse(Handle& handle, uint64_t offset, size_t size, Interrupt* interrupt) {
  AgentRecord& agent = *handle.node.agent;
  const TurnStream& turn = *handle.turn;
  // Registered before the agent mutex is taken (see Interrupt::Register).
  InterruptRegistration registration(interrupt, &agent.mu, &agent.changed);
  std::unique_lock lock(agent.mu);
  agent.changed.wait(lock, [&] {
    return turn.reply.size() > offset || turn.done || agent.erased || shutting_down_.load() ||
           (interrupt != nullptr && interrupt->triggered());
  });
  if (turn.reply.size() > offset) return Slice(turn.reply, offset, size);
  if (turn.done) {
    if (!turn.failure.ok()) return IoError("the turn failed: " + turn.failure.message());
    return std::string();
  }
  if (agent.erased) return NotFound(fmt::format("agent '{}' was erased", agent.name));
  if (interrupt != nullptr && interrupt->triggered()) return Cancelled("read of response interrupted");
  return IoError("kvfsd is shutting down");
}

Result<size_t> AgentStore::Write(HandleId id, uint64_t offset, std::string_view bytes) {
  auto handle = FindHandle(id);
  if (handle == nullptr) return InvalidArgument("bad file handle");
  std::lock_guard lock(handle->mu);
  switch (handle->kind) {
    case Kind::kPrompt: {
      // A prompt is the bytes written, in order: offsets are ignored (echo's writes are
      // sequential; O_APPEND offsets come from a size the kernel may not know).
      if (!handle->refused.ok()) return handle->refused;
      if (handle->data.size() + bytes.size() > config_.max_prompt_bytes) {
        handle->refused = TooLarge(fmt::format("a prompt is limited to {} bytes", config_.max_prompt_bytes));
        std::lock_guard m(metrics_->mu);
        ++metrics_->values.prompts_refused;
        return handle->refused;
      }
      if (!handle->utf8.Feed(bytes)) {
        handle->refused = IllegalSequence("the prompt is not valid UTF-8");
        std::lock_guard m(metrics_->mu);
        ++metrics_->values.prompts_refused;
        return handle->refused;
      }
      handle->data.append(bytes);
      return bytes.size();
    }
    case Kind::kEditable:
    case Kind::kImport: {
      size_t limit = handle->kind == Kind::kImport ? config_.max_import_bytes : config_.max_text_bytes;
      uint64_t at = handle->append ? handle->data.size() : offset;
      if (at + bytes.size() > limit) return TooLarge(fmt::format("this file is limited to {} bytes", limit));
      if (!handle->refused.ok()) return handle->refused;
      if (handle->data.size() < at + bytes.size()) handle->data.resize(static_cast<size_t>(at + bytes.size()));
      handle->data.replace(static_cast<size_t>(at), bytes.size(), bytes);
      handle->dirty = true;
      Status early = CheckWrittenSoFar(*handle);
      if (!early.ok()) {
        handle->refused = early;  // nothing of this file is applied
        return early;
      }
      return bytes.size();
    }
    default:
      return PermissionDenied("file is read-only");
  }
}

Status AgentStore::Flush(HandleId id) {
  auto handle = FindHandle(id);
  if (handle == nullptr) return Status::Ok();
  std::lock_guard lock(handle->mu);
  if (handle->kind == Kind::kPrompt) {
    if (!handle->refused.ok()) return handle->refused;
    if (!handle->utf8.Complete()) {
      handle->refused = IllegalSequence("the prompt ends inside a UTF-8 character");
      std::lock_guard m(metrics_->mu);
      ++metrics_->values.prompts_refused;
      return handle->refused;
    }
    std::string text = std::move(handle->data);
    handle->data.clear();
    handle->utf8 = Utf8Validator();
    // One trailing newline (echo's) is not part of the message.
    if (!text.empty() && text.back() == '\n') text.pop_back();
    if (text.empty()) return Status::Ok();  // an empty prompt is no turn
    return SubmitPrompt(handle->node.agent, std::move(text));
  }
  if ((handle->kind == Kind::kEditable || handle->kind == Kind::kImport) && handle->dirty) {
    handle->dirty = false;  // applied once, whatever the outcome: release must not repeat it
    if (!handle->refused.ok()) return handle->refused;
    return ApplyWrites(*handle);
  }
  if (!handle->refused.ok()) return handle->refused;
  return Status::Ok();
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
                ((handle->kind == Kind::kEditable || handle->kind == Kind::kImport) && handle->dirty &&
                 handle->refused.ok());
  }
  if (handle->node.kind == NodeKind::kPrefixFile && !unapplied) {
    // A prefix created and closed without text (touch) is no prefix.
    bool pending = false;
    {
      std::lock_guard lock(mu_);
      auto it = prefixes_.find(handle->node.prefix);
      pending = it != prefixes_.end() && it->second.ino == handle->ino && it->second.pending;
    }
    if (pending) DropPendingPrefix(handle->node.prefix, handle->ino);
  }
  if (!unapplied) return;
  // Only reached when no flush came (the kernel normally flushes at every close).
  Status s = Status::Ok();
  {
    std::lock_guard lock(handle->mu);
    if (handle->kind == Kind::kPrompt && handle->refused.ok() && handle->utf8.Complete()) {
      std::string text = std::move(handle->data);
      if (!text.empty() && text.back() == '\n') text.pop_back();
      if (!text.empty()) s = SubmitPrompt(handle->node.agent, std::move(text));
    } else if (handle->kind != Kind::kPrompt) {
      handle->dirty = false;
      s = ApplyWrites(*handle);
    }
  }
  if (!s.ok()) spdlog::warn("release: {}", s.message());
}

Status AgentStore::CheckWrittenSoFar(Handle& handle) {
  if (handle.kind != Kind::kEditable) return Status::Ok();
  if (handle.node.kind == NodeKind::kAgentFile && handle.node.agent_file == AgentFile::kConfig) {
    KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(handle.node.agent->name));
    return CheckPartialConfig(handle.data, info.settings);
  }
  Utf8Validator utf8;  // system and prefix text: bad bytes now, a cut character at close
  if (!utf8.Feed(handle.data)) return IllegalSequence("the text is not valid UTF-8");
  return Status::Ok();
}

Status AgentStore::ApplyWrites(Handle& handle) {
  if (handle.node.kind == NodeKind::kPrefixFile) return ApplyPrefix(handle);
  const std::string& name = handle.node.agent->name;
  AuditEvent event;
  event.uid = handle.uid;
  event.agent = name;
  switch (handle.node.agent_file) {
    case AgentFile::kSystem: {
      KVFS_RETURN_IF_ERROR(CheckUtf8(handle.data, "the system prompt"));
      size_t bytes = handle.data.size();
      KVFS_RETURN_IF_ERROR(engine_.SetSystem(name, handle.data));
      {
        std::lock_guard lock(handle.node.agent->mu);
        InvalidateTranscript(*handle.node.agent);
      }
      event.action = "system";
      event.bytes = bytes;
      break;
    }
    case AgentFile::kConfig: {
      KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(name));
      KVFS_ASSIGN_OR_RETURN(AgentSettings settings, ParseAgentSettings(handle.data, info.settings));
      KVFS_RETURN_IF_ERROR(engine_.SetSettings(name, settings));
      event.action = "config";
      break;
    }
    case AgentFile::kKvCache: {
      size_t bytes = handle.data.size();
      Status imported = engine_.ImportCache(name, handle.data);
      handle.data.clear();
      handle.data.shrink_to_fit();
      std::lock_guard m(metrics_->mu);
      if (!imported.ok()) {
        ++metrics_->values.imports_refused;
        // A bad file is the user's input: EINVAL whatever the engine called it.
        if (imported.code() == StatusCode::kCorrupt || imported.code() == StatusCode::kOutOfRange) {
          return InvalidArgument(imported.message());
        }
        return imported;
      }
      ++metrics_->values.imports;
      metrics_->values.import_bytes += bytes;
      event.action = "import";
      event.bytes = bytes;
      break;
    }
    default:
      return PermissionDenied("file is read-only");
  }
  if (handle.node.agent_file == AgentFile::kKvCache) {
    std::lock_guard lock(handle.node.agent->mu);
    InvalidateTranscript(*handle.node.agent);
  }
  Audit(std::move(event));
  return Status::Ok();
}

Status AgentStore::ApplyPrefix(Handle& handle) {
  const std::string& name = handle.node.prefix;
  bool pending = false;
  {
    std::lock_guard lock(mu_);
    auto it = prefixes_.find(name);
    if (it == prefixes_.end() || it->second.ino != handle.ino) return NotFound(fmt::format("prefix '{}' is gone", name));
    pending = it->second.pending;
  }
  if (handle.data.empty()) {
    // Nothing to prefill (yet): a new prefix left empty is dropped when its creator releases it.
    return pending ? Status::Ok() : InvalidArgument("a prefix cannot be empty (rm it instead)");
  }
  Status valid = CheckUtf8(handle.data, "the prefix");
  if (!valid.ok()) {
    if (pending) DropPendingPrefix(name, handle.ino);
    return valid;
  }
  if (!pending) {
    // Rewriting a prefix replaces it: the old one is unpinned and erased first.
    Result<store::EraseReport> removed = engine_.RemovePrefix(name);
    if (!removed.ok() && removed.status().code() != StatusCode::kNotFound) return removed.status();
  }
  size_t bytes = handle.data.size();
  Status added = engine_.AddPrefix(name, handle.data);
  if (!added.ok()) {
    DropPendingPrefix(name, handle.ino);
    return added;
  }
  {
    std::lock_guard lock(mu_);
    auto it = prefixes_.find(name);
    if (it != prefixes_.end()) it->second.pending = false;
  }
  AuditEvent event;
  event.uid = handle.uid;
  event.agent = name;
  event.action = "prefix_add";
  event.bytes = bytes;
  Audit(std::move(event));
  return Status::Ok();
}

void AgentStore::DropPendingPrefix(const std::string& name, InodeId ino) {
  std::lock_guard lock(mu_);
  auto it = prefixes_.find(name);
  if (it == prefixes_.end() || it->second.ino != ino) return;
  prefixes_.erase(it);
  inodes_.RemovePrefix(ino);
}

}  // namespace kvfs::fs
