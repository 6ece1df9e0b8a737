// AgentStore: edits applied at close (system, config.json, kv.safetensors imports) and the
// prefix files of .prefixes/ (created, written, opened).
#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "fs/agent_store.h"
#include "fs/handle.h"

namespace kvfs::fs {

namespace {

using Kind = AgentStore::Handle::Kind;

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
// Complete JSON must also be settings this engine runs (a KV format its blocks allow).
Status CheckPartialConfig(const std::string& text, const AgentSettings& current, AgentEngine& engine) {
  JsonBreakFinder finder;
  nlohmann::json::sax_parse(text, &finder, nlohmann::json::input_format_t::json, /*strict=*/true);
  if (!finder.error_at) {
    KVFS_ASSIGN_OR_RETURN(AgentSettings settings, ParseAgentSettings(text, current));
    return engine.CheckSettings(settings);
  }
  if (*finder.error_at >= text.size()) return Status::Ok();  // ends early: may be completed
  return InvalidArgument("config.json: not valid JSON");
}

}  // namespace

Result<std::pair<Attr, HandleId>> AgentStore::Create(InodeId parent, std::string_view name_view, OpenFlags flags,
                                                     const Caller& caller) {
  std::string name(name_view);
  KVFS_ASSIGN_OR_RETURN(Node dir, NodeCopy(parent));
  if (dir.kind == NodeKind::kAgentDir) {
    // A writable file unlinked before (tar -x, mv from another filesystem, install and
    // cp --remove-destination replace a file by unlink and create): created again, it opens
    // for writing from empty, as `>` would (kv.safetensors: an import).
    for (AgentFile f : kAgentFiles) {
      if (name != AgentFileName(f) || dir.agent == nullptr) continue;
      // Shown again by this create, once: of two creates at once, the second finds it there.
      const uint32_t bit = AgentFileBit(f);
      if ((dir.agent->unlinked_files.fetch_and(~bit) & bit) == 0) {
        return AlreadyExists(fmt::format("'{}' exists", name));
      }
      const InodeId ino = InodeTable::AgentFileInode(parent, f);
      OpenFlags as_new = flags;
      as_new.write = true;
      as_new.truncate = true;
      Result<HandleId> handle = Open(ino, as_new, caller);
      if (!handle.ok()) {
        dir.agent->unlinked_files.fetch_or(bit);  // still absent
        return handle.status();
      }
      Result<Attr> attr = Lookup(parent, name);  // the kernel's reference, as for any create
      if (!attr.ok()) {
        Discard(*handle);
        return attr.status();
      }
      return std::make_pair(*attr, *handle);
    }
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
    prefixes_[name] = PrefixRecord{ino, caller.uid, /*pending=*/true, /*mtime_ms=*/Now(), caller.gid};
    inodes_.Ref(ino);
  }
  Node node = *NodeCopy(ino);
  auto handle = std::make_shared<Handle>();
  handle->kind = Kind::kEditable;
  handle->ino = ino;
  handle->node = node;
  handle->uid = caller.uid;
  handle->opener_process = caller.process;
  handle->append = flags.append;
  Attr attr = *AttrOf(ino, node, nullptr);
  return std::make_pair(attr, AddHandle(std::move(handle)));
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
  handle->holds_only_writes = handle->data.empty();
  return handle;
}
Status AgentStore::CheckWrittenSoFar(Handle& handle) {
  if (handle.kind != Kind::kEditable) return Status::Ok();
  if (handle.node.kind == NodeKind::kAgentFile && handle.node.agent_file == AgentFile::kConfig) {
    KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(handle.node.agent->name));
    return CheckPartialConfig(handle.data, info.settings, engine_);
  }
  Utf8Validator utf8;  // system and prefix text: bad bytes now, a cut character at close
  if (!utf8.Feed(handle.data)) return IllegalSequence("the text is not valid UTF-8");
  return Status::Ok();
}

Status AgentStore::ApplyWrites(Handle& handle) {
  if (handle.node.kind == NodeKind::kPrefixFile) return ApplyPrefix(handle);
  const std::string& name = handle.node.agent->name;
  // The engine knows agents by name: the check and the change below happen under submit_mu, so
  // an erasure (and a new agent of the same name) cannot come between them.
  std::lock_guard submit(handle.node.agent->submit_mu);
  KVFS_RETURN_IF_ERROR(CheckStillLive(*handle.node.agent));
  AuditEvent event;
  event.uid = handle.uid;
  event.agent = name;
  switch (handle.node.agent_file) {
    case AgentFile::kSystem: {
      KVFS_RETURN_IF_ERROR(CheckUtf8(handle.data, "the system prompt"));
      size_t bytes = handle.data.size();
      std::optional<std::string> before;
      if (!handle.applied_edit || handle.only_if_system_is) {
        KVFS_ASSIGN_OR_RETURN(before, RenderFile(handle.node));
        if (handle.only_if_system_is && *before != *handle.only_if_system_is) return Status::Ok();
        if (*before == handle.data) return Status::Ok();  // the same text: no change, no audit line
      }
      KVFS_RETURN_IF_ERROR(engine_.SetSystem(name, handle.data));
      if (before) handle.applied_edit = Handle::AppliedEdit{std::move(*before), handle.data};
      else handle.applied_edit->applied = handle.data;
      {
        std::lock_guard lock(handle.node.agent->mu);
        InvalidateTranscript(*handle.node.agent);
      }
      event.action = "system";
      event.bytes = bytes;
      break;
    }
    case AgentFile::kConfig: {
      // Written text is merged into the settings, so an emptied file (`: >`, truncate, `echo >`)
      // merges nothing: the settings stay, and the close succeeds however it was emptied.
      if (handle.data.find_first_not_of(" \t\r\n") == std::string::npos) return Status::Ok();
      KVFS_ASSIGN_OR_RETURN(AgentInfo info, engine_.GetAgent(name));
      KVFS_ASSIGN_OR_RETURN(AgentSettings settings, ParseAgentSettings(handle.data, info.settings));
      if (settings == info.settings) return Status::Ok();  // `{}`, or the values it has: no change, no audit line
      KVFS_RETURN_IF_ERROR(engine_.SetSettings(name, settings));
      event.action = "config";
      break;
    }
    case AgentFile::kKvCache: {
      const uint64_t bytes = handle.import->size();
      Status imported =
          handle.import->Consume([&](std::string_view file) { return engine_.ImportCache(name, file); });
      std::lock_guard m(metrics_->mu);
      if (!imported.ok()) {
        ++metrics_->values.imports_refused;
        // (Only when the file looks broken: an agent busy with a turn is still EAGAIN.)
        const bool looks_incomplete = imported.code() == StatusCode::kCorrupt || imported.code() == StatusCode::kOutOfRange ||
                                      imported.code() == StatusCode::kInvalidArgument;
        if (!handle.import_write_failure.ok() && looks_incomplete) {
          return Status(handle.import_write_failure.code(),
                        "not imported: a write to it failed (" + handle.import_write_failure.message() +
                            "), so the file lacks those bytes");
        }
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
  // Two writers of a new name closing at once: the first adds it, the second then replaces it
  // (the last close wins, as on any file). Concurrently, the second found it pending, failed to
  // add it again and dropped the name the first had just added: an unlisted, unerasable prefix.
  std::lock_guard writes(prefix_writes_mu_);
  bool pending = false;
  uint32_t owner = handle.uid;
  {
    std::lock_guard lock(mu_);
    auto it = prefixes_.find(name);
    if (it == prefixes_.end() || it->second.ino != handle.ino) return NotFound(fmt::format("prefix '{}' is gone", name));
    pending = it->second.pending;
    owner = it->second.uid;
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
  size_t bytes = handle.data.size();
  if (!pending) {
    // Rewriting a prefix replaces it: the new text is added first and the old one erased after,
    // on record like an rm of it. If the new text cannot be added (too long, full disk), the
    // old prefix stays as it was.
    Result<store::EraseReport> replaced = engine_.ReplacePrefix(name, handle.data, owner);
    if (replaced.ok()) {
      MarkPrefixWritten(name, handle.ino);
      // In the order they happened: the new text added, then the old one erased.
      Audit(AuditEvent{.uid = handle.uid, .agent = name, .action = "prefix_add", .bytes = bytes});
      Audit(AuditEvent{.uid = handle.uid, .agent = name, .action = "prefix_remove", .erased = *replaced});
      {
        std::lock_guard lock(metrics_->mu);
        ++metrics_->values.prefixes_erased;
      }
      return Status::Ok();
    }
    if (replaced.status().code() != StatusCode::kNotFound) return replaced.status();
  }
  Status added = engine_.AddPrefix(name, handle.data, owner);
  if (!added.ok()) {
    DropPendingPrefix(name, handle.ino);
    return added;
  }
  MarkPrefixWritten(name, handle.ino);
  Audit(AuditEvent{.uid = handle.uid, .agent = name, .action = "prefix_add", .bytes = bytes});
  return Status::Ok();
}

void AgentStore::MarkPrefixWritten(const std::string& name, InodeId ino) {
  std::lock_guard lock(mu_);
  auto it = prefixes_.find(name);
  if (it == prefixes_.end() || it->second.ino != ino) return;
  it->second.pending = false;
  it->second.mtime_ms = Now();
}

void AgentStore::DropPendingPrefix(const std::string& name, InodeId ino) {
  std::lock_guard lock(mu_);
  auto it = prefixes_.find(name);
  if (it == prefixes_.end() || it->second.ino != ino || !it->second.pending) return;
  DropPendingPrefixLocked(it);
}

void AgentStore::DropPendingPrefixLocked(std::map<std::string, PrefixRecord>::iterator it) {
  const InodeId ino = it->second.ino;
  prefixes_.erase(it);
  inodes_.RemovePrefix(ino);
}
}  // namespace kvfs::fs
