// AgentStore: construction, names, attributes, directory listings, extended attributes.
#include "fs/agent_store.h"

#include <algorithm>
#include <chrono>
#include <pwd.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/store/manifest.h"
#include "fs/handle.h"

namespace kvfs::fs {

namespace {

constexpr uint32_t kRootMode = 01777;  // anyone may mkdir an agent; only its owner may remove it
constexpr uint32_t kAgentDirMode = 0700;
constexpr double kDirAttrTimeout = 1.0;
// An agent directory's mtime is its last turn: cached, it would go stale for a second after
// each one, and tar, which compares a directory's times before and after reading it, would
// warn that it changed while it was read. Its getattr takes the engine's lock and walks the
// residency of its blocks, never waiting for the engine thread (~50 us a stat, most of it the
// FUSE round trip).
constexpr double kAgentDirAttrTimeout = 0.0;

uint32_t PrimaryGroupOf(uint32_t uid) {
  struct passwd pw {};
  struct passwd* found = nullptr;
  char buf[4096];
  if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) return found->pw_gid;
  return uid;
}

uint32_t AgentFileMode(AgentFile file) {
  switch (file) {
    case AgentFile::kPrompt: return 0200;
    case AgentFile::kResponse:
    case AgentFile::kTranscript:
    case AgentFile::kStatus: return 0400;
    case AgentFile::kSystem:
    case AgentFile::kConfig:
    case AgentFile::kKvCache: return 0600;
  }
  return 0;
}

}  // namespace

Result<std::unique_ptr<AgentStore>> AgentStore::Create(AgentEngine& engine, StoreConfig config) {
  KVFS_ASSIGN_OR_RETURN(std::unique_ptr<AuditLog> audit, AuditLog::Open(config.audit_log_path));
  auto store = std::unique_ptr<AgentStore>(new AgentStore(engine, std::move(config), std::move(audit)));
  std::vector<AgentInfo> agents = engine.ListAgents();
  std::vector<std::pair<std::string, uint32_t>> prefixes;
  const std::vector<std::string> prefix_names = engine.ListPrefixes();
  for (const std::string& name : prefix_names) prefixes.emplace_back(name, engine.PrefixOwner(name));
  store->SettleAuditIntents(agents, prefix_names);
  std::lock_guard lock(store->mu_);
  for (const AgentInfo& info : agents) {
    store->agents_[info.name] = std::make_shared<AgentRecord>(info.name, info.owner_uid, PrimaryGroupOf(info.owner_uid));
  }
  const int64_t start_ms = store->root_mtime_ms_.load();
  for (const auto& [name, owner] : prefixes)
    store->prefixes_[name] = PrefixRecord{store->inodes_.AddPrefix(name), owner, false, start_ms, PrimaryGroupOf(owner)};
  return store;
}

AgentStore::AgentStore(AgentEngine& engine, StoreConfig config, std::unique_ptr<AuditLog> audit)
    : engine_(engine), config_(std::move(config)), audit_(std::move(audit)) {
  root_mtime_ms_ = Now();
  import_memory_limit_ = config_.max_import_memory_bytes;
  if (import_memory_limit_ == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    import_memory_limit_ = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2
                                                 : uint64_t{8} << 30;
  }
}

AgentStore::~AgentStore() = default;

int64_t AgentStore::Now() const {
  if (config_.now_ms) return config_.now_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void AgentStore::Audit(AuditEvent event) {
  event.time_ms = Now();
  Status s = audit_->Append(event);
  if (!s.ok()) spdlog::error("audit log: {} (event {} of {})", s.message(), event.action, event.agent);
}

std::string AgentStore::IntendAudit(AuditEvent event) {
  event.time_ms = Now();
  Result<std::string> id = audit_->Intend(event);
  if (id.ok()) return *id;
  spdlog::error("audit log: {} ({} of {}: its line is written when it is done, but a crash before that would "
                "leave it off the log)",
                id.status().message(), event.action, event.agent);
  return "";
}

void AgentStore::CompleteAudit(const std::string& intent, AuditEvent event) {
  event.time_ms = Now();
  Status s = audit_->Complete(intent, event);
  if (!s.ok()) spdlog::error("audit log: {} (event {} of {})", s.message(), event.action, event.agent);
}

void AgentStore::SettleFailedErasure(const std::string& intent, bool intact) {
  if (intact) audit_->Drop(intent);
}

void AgentStore::SettleAuditIntents(const std::vector<AgentInfo>& agents, const std::vector<std::string>& prefixes) {
  for (const AuditIntent& intent : audit_->LeftIntents()) {
    const AuditEvent& e = intent.event;
    const auto agent = std::find_if(agents.begin(), agents.end(), [&](const AgentInfo& a) { return a.name == e.agent; });
    // What the state after the crash says about the erasure: it happened (or the engine's
    // start finished it) when what it erases is gone.
    bool happened = false;
    if (e.action == "erase") happened = agent == agents.end();
    if (e.action == "erase_cache")
      happened = agent == agents.end() || (agent->context_tokens == 0 && !agent->stored_cache);
    if (e.action == "prefix_remove") happened = std::find(prefixes.begin(), prefixes.end(), e.agent) == prefixes.end();
    if (happened && audit_->HasLineOf(intent)) {  // logged, and the crash came before the intent went
      audit_->Drop(intent.id);
    } else if (happened) {
      AuditEvent line = e;  // at the time the erasure began
      line.completed_at_start = true;
      spdlog::warn("audit log: {} of {} (uid {}) was interrupted by a crash and is done: logged now", e.action, e.agent,
                   e.uid);
      if (Status s = audit_->Complete(intent.id, line); !s.ok())
        spdlog::error("audit log: {} (event {} of {})", s.message(), line.action, line.agent);
    } else {
      spdlog::info("audit log: {} of {} was interrupted before it erased anything", e.action, e.agent);
      audit_->Drop(intent.id);
    }
  }
}

std::shared_ptr<AgentRecord> AgentStore::AgentLocked(const std::string& name) {
  auto it = agents_.find(name);
  return it == agents_.end() ? nullptr : it->second;
}

Status AgentStore::CheckStillLive(const AgentRecord& agent) {
  std::lock_guard lock(mu_);
  if (AgentLocked(agent.name).get() != &agent || agents_in_transition_.count(agent.name)) {
    return NotFound(fmt::format("agent '{}' was erased", agent.name));
  }
  return Status::Ok();
}

InodeId AgentStore::EnsureAgentInodeLocked(const std::shared_ptr<AgentRecord>& agent) {
  if (agent->dir_ino == 0) agent->dir_ino = inodes_.AddAgent(agent);
  return agent->dir_ino;
}

Result<Node> AgentStore::NodeCopy(InodeId ino) {
  std::lock_guard lock(mu_);
  Node* node = inodes_.Find(ino);
  if (node == nullptr || node->removed) return NotFound(fmt::format("inode {} is gone", ino));
  return *node;
}

Attr AgentStore::AgentDirAttr(const AgentRecord& agent, const AgentInfo* info, InodeId ino) {
  Attr a;
  a.ino = ino;
  a.type = FileType::kDirectory;
  a.mode = kAgentDirMode;
  a.uid = agent.uid;
  a.gid = agent.gid;
  a.nlink = 2;
  a.size = 4096;
  a.mtime_ms = info != nullptr ? info->updated_ms : root_mtime_ms_.load();
  a.attr_timeout_s = kAgentDirAttrTimeout;
  return a;
}

Result<Attr> AgentStore::AttrOf(InodeId ino, const Node& node, const AgentInfo* known_info) {
  Attr a;
  a.ino = ino;
  a.uid = config_.root_uid;
  a.gid = config_.root_gid;
  switch (node.kind) {
    case NodeKind::kRoot:
    case NodeKind::kPrefixDir:
      a.type = FileType::kDirectory;
      a.mode = kRootMode;
      a.nlink = 2;
      a.size = 4096;
      a.mtime_ms = root_mtime_ms_.load();
      a.attr_timeout_s = kDirAttrTimeout;
      return a;
    case NodeKind::kSpecialFile:
      a.mode = 0444;
      a.mtime_ms = Now();
      // The status files are live views (/proc-like, size 0): a size taken at a stat would not
      // be that of the next read, and tar pads a file that shrank with zeros.
      if (node.special == SpecialFile::kAuditLog) a.size = audit_->Size();
      return a;
    case NodeKind::kPrefixFile: {
      a.mode = 0644;
      bool pending = false;
      a.mtime_ms = root_mtime_ms_.load();
      {
        std::lock_guard lock(mu_);
        auto it = prefixes_.find(node.prefix);
        if (it != prefixes_.end()) {
          a.uid = it->second.uid, a.gid = it->second.gid, pending = it->second.pending;
          if (it->second.mtime_ms != 0) a.mtime_ms = it->second.mtime_ms;
        }
      }
      if (pending) return a;
      Result<std::string> text = engine_.PrefixText(node.prefix);
      // An unreadable prefix (kIoError) keeps its name with size 0, so ls shows it and rm
      // or a rewrite can reach it; opening it for reading fails with EIO.
      if (!text.ok() && text.status().code() != StatusCode::kIoError) return text.status();
      a.size = text.ok() ? text->size() : 0;
      return a;
    }
    case NodeKind::kAgentDir:
    case NodeKind::kAgentFile:
      break;
  }
  const AgentRecord& agent = *node.agent;
  AgentInfo fetched;
  if (known_info == nullptr) {
    KVFS_ASSIGN_OR_RETURN(fetched, engine_.GetAgent(agent.name));
    known_info = &fetched;
  }
  if (node.kind == NodeKind::kAgentDir) return AgentDirAttr(agent, known_info, ino);
  a.uid = agent.uid;
  a.gid = agent.gid;
  a.mode = AgentFileMode(node.agent_file);
  a.mtime_ms = known_info->updated_ms;
  switch (node.agent_file) {
    case AgentFile::kSystem: a.size = known_info->system.size(); break;
    case AgentFile::kConfig: a.size = JsonFileText(AgentSettingsToJson(known_info->settings)).size(); break;
    case AgentFile::kTranscript: {
      KVFS_ASSIGN_OR_RETURN(a.size, TranscriptRange(node.agent, 0, 0, nullptr));
      break;
    }
    case AgentFile::kResponse: {
      bool bound = false;
      {
        std::lock_guard lock(node.agent->mu);
        if (node.agent->latest) a.size = node.agent->latest->reply.size(), bound = true;
      }
      if (!bound) a.size = LastReplyText(node.agent).size();  // what an open serves then
      break;
    }
    // Generated at open, but sized as an open now would make it, since tar and rsync copy as
    // many bytes as the size says (a /proc-like 0 gave them empty files). It changes with the
    // cache only (turns, imports, erasure), not as the cache moves between disk and memory.
    case AgentFile::kKvCache: {
      Result<uint64_t> size = engine_.ExportSize(agent.name);
      a.size = size.ok() ? *size : 0;  // an agent whose state cannot be read: its open says why
      break;
    }
    // status.json: a live view (state, memory) that changes as soon as an open reloads a cold
    // agent's cache, so size 0 like /proc; prompt: write-only.
    case AgentFile::kStatus:
    case AgentFile::kPrompt: break;
  }
  return a;
}

Result<Attr> AgentStore::GetAttr(InodeId ino, std::optional<HandleId> open_file) {
  KVFS_ASSIGN_OR_RETURN(Node node, NodeCopy(ino));
  KVFS_ASSIGN_OR_RETURN(Attr attr, AttrOf(ino, node, nullptr));
  if (!open_file) return attr;
  auto handle = FindHandle(*open_file);
  if (handle == nullptr || handle->ino != ino) return attr;
  std::lock_guard lock(handle->mu);
  const bool export_read = handle->kind == Handle::Kind::kSnapshot && node.kind == NodeKind::kAgentFile &&
                           node.agent_file == AgentFile::kKvCache;
  // (Not the status files' snapshots: their size is 0 whatever is read, as tar saw at lstat.)
  if (handle->kind == Handle::Kind::kImport) attr.size = handle->import->size();
  else if (handle->kind == Handle::Kind::kEditable || export_read) attr.size = handle->data.size();
  return attr;
}

Result<Attr> AgentStore::Lookup(InodeId parent, std::string_view name_view) {
  std::string name(name_view);
  InodeId ino = 0;
  Node node;
  {
    std::lock_guard lock(mu_);
    Node* dir = inodes_.Find(parent);
    if (dir == nullptr || dir->removed) return NotFound("directory is gone");
    switch (dir->kind) {
      case NodeKind::kRoot:
        if (name == kPrefixDirName) {
          ino = kPrefixDirInode;
        } else {
          for (SpecialFile f : kSpecialFiles) {
            if (name == SpecialFileName(f)) ino = InodeTable::SpecialFileInode(f);
          }
          if (ino == 0) {
            auto agent = AgentLocked(name);
            if (agent == nullptr) return NotFound(fmt::format("no agent named '{}'", name));
            ino = EnsureAgentInodeLocked(agent);
          }
        }
        break;
      case NodeKind::kAgentDir:
        for (AgentFile f : kAgentFiles) {
          if (name != AgentFileName(f)) continue;
          if (dir->agent != nullptr && (dir->agent->unlinked_files.load() & AgentFileBit(f)) != 0) {
            return NotFound(fmt::format("'{}' was unlinked; creating it writes it again", name));
          }
          ino = InodeTable::AgentFileInode(parent, f);
        }
        if (ino == 0) return NotFound(fmt::format("agents have no file '{}'", name));
        break;
      case NodeKind::kPrefixDir: {
        auto it = prefixes_.find(name);
        if (it == prefixes_.end()) return NotFound(fmt::format("no prefix named '{}'", name));
        ino = it->second.ino;
        break;
      }
      default:
        return NotFound("not a directory");
    }
    node = *inodes_.Find(ino);
  }
  KVFS_ASSIGN_OR_RETURN(Attr attr, AttrOf(ino, node, nullptr));
  std::lock_guard lock(mu_);
  Node* n = inodes_.Find(ino);
  if (n == nullptr || n->removed) return NotFound(fmt::format("'{}' was removed", name));
  inodes_.Ref(ino);
  return attr;
}

bool AgentStore::CountLookup(InodeId ino) {
  std::lock_guard lock(mu_);
  Node* node = inodes_.Find(ino);
  if (node == nullptr || node->removed) return false;
  inodes_.Ref(ino);
  return true;
}

void AgentStore::Forget(InodeId ino, uint64_t count) {
  std::lock_guard lock(mu_);
  inodes_.Forget(ino, count);
}

std::vector<DirEntry> AgentStore::ListRoot() {
  std::vector<AgentInfo> infos = engine_.ListAgents();
  std::map<std::string, const AgentInfo*> by_name;
  for (const AgentInfo& info : infos) by_name[info.name] = &info;
  std::vector<DirEntry> out;
  std::vector<std::shared_ptr<AgentRecord>> agents;
  {
    std::lock_guard lock(mu_);
    out.reserve(agents_.size() + 8);
    for (auto& [name, agent] : agents_) {
      EnsureAgentInodeLocked(agent);
      agents.push_back(agent);
    }
  }
  Node root;
  root.kind = NodeKind::kRoot;
  for (SpecialFile f : kSpecialFiles) {
    Node n;
    n.kind = NodeKind::kSpecialFile;
    n.special = f;
    InodeId ino = InodeTable::SpecialFileInode(f);
    out.push_back({std::string(SpecialFileName(f)), *AttrOf(ino, n, nullptr)});
  }
  Node prefix_dir;
  prefix_dir.kind = NodeKind::kPrefixDir;
  out.push_back({std::string(kPrefixDirName), *AttrOf(kPrefixDirInode, prefix_dir, nullptr)});
  for (const auto& agent : agents) {
    auto it = by_name.find(agent->name);
    out.push_back({agent->name, AgentDirAttr(*agent, it == by_name.end() ? nullptr : it->second, agent->dir_ino)});
  }
  return out;
}

std::vector<DirEntry> AgentStore::ListAgent(const std::shared_ptr<AgentRecord>& agent, InodeId dir) {
  std::vector<DirEntry> out;
  Result<AgentInfo> info = engine_.GetAgent(agent->name);
  const uint32_t unlinked = agent->unlinked_files.load();
  for (AgentFile f : kAgentFiles) {
    if ((unlinked & AgentFileBit(f)) != 0) continue;
    Node n;
    n.kind = NodeKind::kAgentFile;
    n.agent_file = f;
    n.agent = agent;
    InodeId ino = InodeTable::AgentFileInode(dir, f);
    Result<Attr> attr = AttrOf(ino, n, info.ok() ? &info.value() : nullptr);
    if (attr.ok()) out.push_back({std::string(AgentFileName(f)), *attr});
  }
  return out;
}

std::vector<DirEntry> AgentStore::ListPrefixes() {
  std::vector<std::pair<std::string, InodeId>> names;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, prefix] : prefixes_) names.emplace_back(name, prefix.ino);
  }
  std::vector<DirEntry> out;
  for (const auto& [name, ino] : names) {
    Node n;
    n.kind = NodeKind::kPrefixFile;
    n.prefix = name;
    Result<Attr> attr = AttrOf(ino, n, nullptr);
    if (attr.ok()) out.push_back({name, *attr});
  }
  return out;
}

Result<HandleId> AgentStore::OpenDir(InodeId ino, const Caller& caller) {
  KVFS_ASSIGN_OR_RETURN(Node node, NodeCopy(ino));
  auto entries = std::make_shared<std::vector<DirEntry>>();
  KVFS_ASSIGN_OR_RETURN(Attr self, AttrOf(ino, node, nullptr));
  Attr parent = self;
  if (node.kind != NodeKind::kRoot) {
    Node root;
    root.kind = NodeKind::kRoot;
    KVFS_ASSIGN_OR_RETURN(parent, AttrOf(kRootInode, root, nullptr));
  }
  entries->push_back({".", self});
  entries->push_back({"..", parent});
  std::vector<DirEntry> children;
  switch (node.kind) {
    case NodeKind::kRoot: children = ListRoot(); break;
    case NodeKind::kPrefixDir: children = ListPrefixes(); break;
    case NodeKind::kAgentDir:
      if (caller.uid != 0 && caller.uid != node.agent->uid) {
        return PermissionDenied(fmt::format("agent '{}' belongs to another user", node.agent->name));
      }
      // No prefetch: listing (ls -l, du, find, updatedb) is not using; a walk of the mount
      // would otherwise load every agent's cache, evicting the ones in use.
      children = ListAgent(node.agent, ino);
      break;
    default:
      return InvalidArgument("not a directory");
  }
  for (DirEntry& e : children) entries->push_back(std::move(e));
  auto handle = std::make_shared<Handle>();
  handle->kind = Handle::Kind::kDirectory;
  handle->ino = ino;
  handle->node = node;
  handle->entries = std::move(entries);
  return AddHandle(std::move(handle));
}

std::shared_ptr<const std::vector<DirEntry>> AgentStore::DirEntries(HandleId id) {
  auto handle = FindHandle(id);
  if (handle == nullptr || handle->kind != Handle::Kind::kDirectory) return nullptr;
  return handle->entries;
}

void AgentStore::ReleaseDir(HandleId id) { Release(id); }

HandleId AgentStore::AddHandle(std::shared_ptr<Handle> handle) {
  std::lock_guard lock(mu_);
  HandleId id = next_handle_++;
  handles_[id] = std::move(handle);
  return id;
}

std::shared_ptr<AgentStore::Handle> AgentStore::FindHandle(HandleId id) {
  std::lock_guard lock(mu_);
  auto it = handles_.find(id);
  return it == handles_.end() ? nullptr : it->second;
}

Result<std::optional<std::string>> AgentStore::GetXattr(InodeId ino, std::string_view name) {
  KVFS_ASSIGN_OR_RETURN(Node node, NodeCopy(ino));
  if (node.kind != NodeKind::kAgentDir) return std::optional<std::string>();
  if (name != "user.kvfs.state" && name != "user.kvfs.tokens" && name != "user.kvfs.bytes") {
    return std::optional<std::string>();
  }
  KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(node.agent->name));
  if (name == "user.kvfs.state") return std::optional<std::string>(std::string(AgentStateName(info.state)));
  if (name == "user.kvfs.tokens") return std::optional<std::string>(std::to_string(info.context_tokens));
  return std::optional<std::string>(std::to_string(std::max(info.memory_bytes, info.disk_bytes)));
}

Status AgentStore::SetXattr(InodeId ino, std::string_view name) {
  KVFS_RETURN_IF_ERROR(NodeCopy(ino).status());
  if (name.starts_with("user.kvfs.")) return NotPermitted("kvfs extended attributes are read-only");
  return Unsupported(fmt::format("kvfs files have no extended attribute {}", name));
}

Result<std::vector<std::string>> AgentStore::ListXattr(InodeId ino) {
  KVFS_ASSIGN_OR_RETURN(Node node, NodeCopy(ino));
  if (node.kind != NodeKind::kAgentDir) return std::vector<std::string>{};
  return std::vector<std::string>{"user.kvfs.state", "user.kvfs.tokens", "user.kvfs.bytes"};
}

void AgentStore::BeginShutdown() { shutting_down_.store(true); }

void AgentStore::WakeAllReaders() {
  readers_released_.store(true);
  std::vector<std::shared_ptr<AgentRecord>> agents;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, agent] : agents_) agents.push_back(agent);
  }
  for (auto& agent : agents) {
    AnsweredReads answered;
    {
      std::lock_guard lock(agent->mu);
      answered = AnswerReadyReads(*agent, readers_released_.load());
    }
    DeliverReads(answered);
  }
}

size_t AgentStore::InodeCount() {
  std::lock_guard lock(mu_);
  return inodes_.size();
}

size_t AgentStore::HandleCount() {
  std::lock_guard lock(mu_);
  return handles_.size();
}

FsMetrics AgentStore::Metrics() {
  std::lock_guard lock(metrics_->mu);
  return metrics_->values;
}

}  // namespace kvfs::fs
