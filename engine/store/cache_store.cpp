#include "engine/store/cache_store.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include <spdlog/spdlog.h>

#include "engine/core/shred.h"

namespace kvfs::store {
namespace {

std::string ParentDir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

// "<32 hex>.kvb" inside blocks/<hh>/ -> the hash; nullopt for anything else.
std::optional<BlockHash> ParseBlockFileName(std::string_view subdir, std::string_view name) {
  if (name.size() != 32 + kBlockSuffix.size() || !name.ends_with(kBlockSuffix)) return std::nullopt;
  std::string_view hex = name.substr(0, 32);
  if (!IsHex128(hex) || hex.substr(0, 2) != subdir) return std::nullopt;
  return BlockHashFromHex(hex);
}

std::string AsString(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

size_t LoadedAgent::cached_tokens() const {
  size_t n = blocks.size() * manifest.block_size;
  if (tail && manifest.tail) n += manifest.tail->n_tokens;
  return n;
}

CacheStore::CacheStore(std::string dir, FileSystem& fs, StoreOptions options)
    : dir_(std::move(dir)),
      blocks_dir_(JoinPath(dir_, kBlocksDir)),
      agents_dir_(JoinPath(dir_, kAgentsDir)),
      prefixes_dir_(JoinPath(dir_, kPrefixesDir)),
      fs_(fs),
      options_(std::move(options)) {}

Result<std::unique_ptr<CacheStore>> CacheStore::Open(const std::string& dir, FileSystem& fs, StoreOptions options) {
  if (dir.empty()) return InvalidArgument("cache store directory is empty");
  std::unique_ptr<CacheStore> store(new CacheStore(dir, fs, std::move(options)));
  KVFS_RETURN_IF_ERROR(store->Init().WithContext("opening cache store " + dir));
  return store;
}

int64_t CacheStore::Now() const {
  if (options_.now_ms) return options_.now_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string CacheStore::AgentDir(const std::string& name) const { return JoinPath(agents_dir_, name); }
std::string CacheStore::BlockSubdir(const BlockHash& hash) const { return JoinPath(blocks_dir_, ToHex(hash).substr(0, 2)); }
std::string CacheStore::BlockPath(const BlockHash& hash) const {
  return JoinPath(BlockSubdir(hash), ToHex(hash) + std::string(kBlockSuffix));
}

Status CacheStore::Init() {
  std::unique_lock lock(mu_);
  auto is_dir = fs_.IsDir(dir_);
  if (!is_dir.ok()) {
    if (is_dir.status().code() != StatusCode::kNotFound) return is_dir.status();
    KVFS_RETURN_IF_ERROR(fs_.MakeDir(dir_));
    KVFS_RETURN_IF_ERROR(fs_.SyncDir(ParentDir(dir_)));
  } else if (!*is_dir) {
    return InvalidArgument(dir_ + " exists and is not a directory");
  }
  KVFS_RETURN_IF_ERROR(fs_.MakeDir(blocks_dir_));
  KVFS_RETURN_IF_ERROR(fs_.MakeDir(agents_dir_));
  KVFS_RETURN_IF_ERROR(fs_.MakeDir(prefixes_dir_));
  KVFS_RETURN_IF_ERROR(fs_.SyncDir(dir_));
  KVFS_RETURN_IF_ERROR(ScanAgents());
  KVFS_RETURN_IF_ERROR(ScanPrefixes());
  KVFS_RETURN_IF_ERROR(ScanBlocks());
  for (const auto& [hash, count] : refs_)
    if (!present_.count(hash)) ++open_report_.missing_blocks;
  if (NothingUnreadable()) {
    EraseReport gc;
    KVFS_RETURN_IF_ERROR(CollectOrphanBlocks(&gc));
    open_report_.orphan_blocks_removed = gc.blocks_freed;
    open_report_.bytes_removed += gc.bytes_freed;
  } else {
    open_report_.orphan_collection_skipped = true;
  }
  const OpenReport& r = open_report_;
  if (r.temp_files_removed + r.orphan_blocks_removed + r.orphan_tails_removed + r.incomplete_agents_removed +
          r.erasures_completed > 0)
    spdlog::info("cache store {}: removed {} temp files, {} orphan blocks, {} orphan tails, {} incomplete agents; "
                 "finished {} erasures ({} bytes)",
                 dir_, r.temp_files_removed, r.orphan_blocks_removed, r.orphan_tails_removed,
                 r.incomplete_agents_removed, r.erasures_completed, r.bytes_removed);
  for (const std::string& b : r.broken_agents) spdlog::warn("cache store {}: unreadable manifest: {}", dir_, b);
  for (const std::string& b : r.broken_prefixes) spdlog::warn("cache store {}: unreadable prefix record: {}", dir_, b);
  if (r.missing_blocks > 0)
    spdlog::warn("cache store {}: {} referenced blocks are missing; those caches will be rebuilt", dir_, r.missing_blocks);
  return Status::Ok();
}

Status CacheStore::ScanAgents() {
  KVFS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs_.ListDir(agents_dir_));
  size_t files = 0;
  for (const DirEntry& e : entries) {
    const std::string path = JoinPath(agents_dir_, e.name);
    if (e.is_dir && e.name.starts_with(kErasePrefix)) {
      KVFS_RETURN_IF_ERROR(PurgeDir(path, &open_report_.bytes_removed, &files));
      ++open_report_.erasures_completed;
    } else if (!e.is_dir && e.name.ends_with(kTempSuffix)) {
      KVFS_RETURN_IF_ERROR(ShredFile(path, &open_report_.bytes_removed, &open_report_.temp_files_removed));
    } else if (!e.is_dir || !IsValidAgentName(e.name)) {
      open_report_.unknown_files.push_back(path);
    } else {
      KVFS_RETURN_IF_ERROR(ScanAgentDir(e.name, path));
    }
  }
  return fs_.SyncDir(agents_dir_);
}

Result<Manifest> CacheStore::ReadManifestFile(const std::string& path, const std::string& agent,
                                              std::vector<uint8_t>* bytes) {
  KVFS_ASSIGN_OR_RETURN(std::vector<uint8_t> read, fs_.ReadFile(path));
  KVFS_ASSIGN_OR_RETURN(Manifest m, ParseManifest(AsString(read), path));
  if (m.name != agent) return Corrupt(path + ": field \"name\": \"" + m.name + "\" does not match the directory");
  if (bytes != nullptr) *bytes = std::move(read);
  return m;
}

Status CacheStore::ScanAgentDir(const std::string& name, const std::string& path) {
  KVFS_ASSIGN_OR_RETURN(std::vector<DirEntry> files_in, fs_.ListDir(path));
  auto has_file = [&](std::string_view file) {
    return std::any_of(files_in.begin(), files_in.end(),
                       [&](const DirEntry& f) { return !f.is_dir && !f.is_symlink && f.name == file; });
  };
  const bool has_manifest = has_file(kManifestName), has_prev = has_file(kPrevManifestName);
  if (!has_manifest && !has_prev) {  // the first turn never committed: the agent does not exist
    size_t files = 0;
    KVFS_RETURN_IF_ERROR(PurgeDir(path, &open_report_.bytes_removed, &files));
    ++open_report_.incomplete_agents_removed;
    return Status::Ok();
  }
  const std::string manifest_path = JoinPath(path, kManifestName);
  const std::string prev_path = JoinPath(path, kPrevManifestName);
  Result<Manifest> m = has_manifest ? ReadManifestFile(manifest_path, name)
                                    : Result<Manifest>(Corrupt(manifest_path + " is missing"));
  bool keep_prev = has_prev;
  // Only damage is repaired: a manifest of a newer format (kUnsupported) or one that could not
  // be read for now (an I/O error) must not be overwritten by an older copy.
  if (!m.ok() && m.status().code() == StatusCode::kCorrupt && has_prev) {
    // Damaged (a crash never leaves a manifest unreadable): go back one turn, and make that the
    // manifest again so that every later read and commit sees it.
    std::vector<uint8_t> prev_bytes;
    Result<Manifest> prev = ReadManifestFile(prev_path, name, &prev_bytes);
    const Status restored = prev.ok() ? WriteFileAtomic(fs_, path, std::string(kManifestName), prev_bytes,
                                                        /*zero_replaced=*/true)
                                      : prev.status();
    if (restored.ok()) {
      spdlog::warn("cache store {}: agent {}: {}; restored its previous turn ({}) from {}", dir_, name,
                   m.status().message(), prev->turn, kPrevManifestName);
      open_report_.recovered_agents.push_back({name, prev->turn, m.status().message()});
      m = std::move(prev);
    } else {
      m = Corrupt(m.status().message() + "; " + std::string(kPrevManifestName) + ": " + restored.message());
    }
  } else if (m.ok() && m->turn <= 1 && has_prev) {
    keep_prev = false;  // a first turn has no previous one: a copy left by a crashed second turn
  }
  if (!m.ok()) {
    broken_[name] = m.status().message();
    open_report_.broken_agents.push_back(name + ": " + m.status().message());
  } else {
    agents_[name] = AgentInfo{m->blocks, m->tail, m->turn, m->created_ms, m->kv_format, m->block_size};
    AddRefs(m->blocks);
  }
  for (const DirEntry& f : files_in) {
    const std::string fpath = JoinPath(path, f.name);
    if (f.is_dir || f.is_symlink) {
      open_report_.unknown_files.push_back(fpath);
    } else if (f.name.ends_with(kTempSuffix)) {
      KVFS_RETURN_IF_ERROR(ShredFile(fpath, &open_report_.bytes_removed, &open_report_.temp_files_removed));
    } else if (IsTailFileName(f.name)) {
      // A broken manifest might name any tail: keep them all until it is erased or replaced.
      if (m.ok() && !(m->tail && m->tail->file == f.name))
        KVFS_RETURN_IF_ERROR(ShredFile(fpath, &open_report_.bytes_removed, &open_report_.orphan_tails_removed));
    } else if (f.name == kPrevManifestName) {
      if (!keep_prev)
        KVFS_RETURN_IF_ERROR(DropPreviousManifest(path, &open_report_.bytes_removed, &open_report_.temp_files_removed));
    } else if (f.name != kManifestName) {
      open_report_.unknown_files.push_back(fpath);
    }
  }
  // Make durable what we rely on: after a kill -9 the visible entries may not be yet.
  return fs_.SyncDir(path);
}

Status CacheStore::ScanBlocks() {
  KVFS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs_.ListDir(blocks_dir_));
  for (const DirEntry& e : entries) {
    const std::string path = JoinPath(blocks_dir_, e.name);
    if (e.is_symlink) {  // not the store's: left alone, never followed
      open_report_.unknown_files.push_back(path);
      continue;
    }
    if (!e.is_dir) {
      if (e.name.ends_with(kTempSuffix))
        KVFS_RETURN_IF_ERROR(ShredFile(path, &open_report_.bytes_removed, &open_report_.temp_files_removed));
      else
        open_report_.unknown_files.push_back(path);
      continue;
    }
    if (e.name.size() != 2 || !IsLowerHex(e.name)) {
      open_report_.unknown_files.push_back(path);
      continue;
    }
    KVFS_ASSIGN_OR_RETURN(std::vector<DirEntry> files, fs_.ListDir(path));
    size_t shredded = 0;
    for (const DirEntry& f : files) {
      const std::string fpath = JoinPath(path, f.name);
      if (f.is_symlink) {  // a link in place of a block: the block is missing (recomputed)
        open_report_.unknown_files.push_back(fpath);
      } else if (!f.is_dir && f.name.ends_with(kTempSuffix)) {
        KVFS_RETURN_IF_ERROR(ShredFile(fpath, &open_report_.bytes_removed, &open_report_.temp_files_removed));
        ++shredded;
      } else if (auto hash = ParseBlockFileName(e.name, f.name); hash && !f.is_dir) {
        KVFS_ASSIGN_OR_RETURN(present_[*hash], fs_.FileSize(fpath));
      } else {
        open_report_.unknown_files.push_back(fpath);
      }
    }
    if (shredded == files.size()) {  // empty: left by a crash after an erasure's last block went
      if (fs_.RemoveDir(path).ok()) continue;  // (best effort: a directory left costs nothing)
    }
    KVFS_RETURN_IF_ERROR(fs_.SyncDir(path));
    block_subdirs_.insert(e.name);
  }
  return fs_.SyncDir(blocks_dir_);
}

Status CacheStore::CollectOrphanBlocks(EraseReport* report) {
  std::set<std::string> touched;
  for (auto it = present_.begin(); it != present_.end();) {
    if (refs_.count(it->first)) {
      ++it;
      continue;
    }
    KVFS_RETURN_IF_ERROR(ShredFile(BlockPath(it->first), &report->bytes_freed, &report->files_removed));
    ++report->blocks_freed;
    touched.insert(BlockSubdir(it->first));
    it = present_.erase(it);
  }
  return SettleBlockSubdirs(touched);
}

Status CacheStore::SettleBlockSubdirs(const std::set<std::string>& subdirs) {
  Status first_error = Status::Ok();
  bool removed_any = false;
  for (const std::string& d : subdirs) {
    auto entries = fs_.ListDir(d);
    Status st = entries.status();
    if (entries.ok() && entries->empty()) {
      st = fs_.RemoveDir(d);
      if (st.ok()) {
        block_subdirs_.erase(d.substr(d.rfind('/') + 1));
        removed_any = true;
      }
    } else if (entries.ok()) {
      st = fs_.SyncDir(d);
    }
    if (!st.ok() && first_error.ok()) first_error = st;
  }
  if (removed_any) {
    if (Status st = fs_.SyncDir(blocks_dir_); !st.ok() && first_error.ok()) first_error = st;
  }
  return first_error;
}

Status CacheStore::ShredFile(const std::string& path, uint64_t* bytes, size_t* files) {
  KVFS_ASSIGN_OR_RETURN(uint64_t size, fs_.FileSize(path));
  KVFS_RETURN_IF_ERROR(fs_.OverwriteWithZeros(path));
  KVFS_RETURN_IF_ERROR(fs_.SyncFile(path));
  KVFS_RETURN_IF_ERROR(fs_.Unlink(path));
  *bytes += size;
  ++*files;
  return Status::Ok();
}

Status CacheStore::DropName(const std::string& path, uint64_t* bytes, size_t* files) {
  // By the link count, not by comparing inode numbers, which some FUSE file systems make up.
  KVFS_ASSIGN_OR_RETURN(uint64_t names, fs_.LinkCount(path));
  if (names > 1) return fs_.Unlink(path);
  return ShredFile(path, bytes, files);
}

Status CacheStore::DropPreviousManifest(const std::string& agent_dir, uint64_t* bytes, size_t* files) {
  return DropName(JoinPath(agent_dir, kPrevManifestName), bytes, files);
}

Status CacheStore::PurgeDir(const std::string& dir, uint64_t* bytes, size_t* files) {
  KVFS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs_.ListDir(dir));
  // manifest.prev.json first: when it is a second name of the manifest, only its name goes, and
  // the manifest's bytes are zeroed (and counted) once, with the manifest.
  auto is_prev = [](const DirEntry& e) { return e.name == kPrevManifestName && !e.is_dir && !e.is_symlink; };
  if (std::any_of(entries.begin(), entries.end(), is_prev)) KVFS_RETURN_IF_ERROR(DropPreviousManifest(dir, bytes, files));
  for (const DirEntry& e : entries) {
    const std::string path = JoinPath(dir, e.name);
    if (is_prev(e)) continue;
    // A link holds none of our bytes: it goes, what it points at stays.
    KVFS_RETURN_IF_ERROR(e.is_symlink ? fs_.Unlink(path)
                         : e.is_dir   ? PurgeDir(path, bytes, files)
                                      : ShredFile(path, bytes, files));
  }
  KVFS_RETURN_IF_ERROR(fs_.RemoveDir(dir));
  return fs_.SyncDir(ParentDir(dir));
}

void CacheStore::AddRefs(const std::vector<BlockHash>& blocks) {
  for (const BlockHash& h : std::set<BlockHash>(blocks.begin(), blocks.end())) ++refs_[h];
}

std::vector<BlockHash> CacheStore::DropRefs(const std::vector<BlockHash>& blocks) {
  std::vector<BlockHash> freed;
  for (const BlockHash& h : std::set<BlockHash>(blocks.begin(), blocks.end())) {
    auto it = refs_.find(h);
    if (it == refs_.end()) continue;
    if (--it->second == 0) {
      refs_.erase(it);
      freed.push_back(h);
    }
  }
  return freed;
}

Status CacheStore::WriteBlock(const NewBlock& block, uint64_t* bytes_written) {
  const std::string subdir = BlockSubdir(block.hash);
  const std::string hh = ToHex(block.hash).substr(0, 2);
  if (!block_subdirs_.count(hh)) {
    KVFS_RETURN_IF_ERROR(fs_.MakeDir(subdir));
    KVFS_RETURN_IF_ERROR(fs_.SyncDir(blocks_dir_));
    block_subdirs_.insert(hh);
  }
  KVFS_ASSIGN_OR_RETURN(std::vector<uint8_t> image, EncodeBlockFile(BlockKind::kBlock, block.hash, block.kv_format,
                                                                    block.n_tokens, block.payload, options_.encode));
  Status written = WriteFileAtomic(fs_, subdir, ToHex(block.hash) + std::string(kBlockSuffix), image);
  const size_t size = image.size();
  ShredVector(image);  // KV rows: not left in freed memory
  KVFS_RETURN_IF_ERROR(written);
  present_[block.hash] = size;
  *bytes_written += size;
  return Status::Ok();
}

Status CacheStore::PublishManifest(const std::string& agent_dir, const std::string& bytes,
                                   const std::optional<std::vector<uint8_t>>& previous) {
  const std::string final_path = JoinPath(agent_dir, kManifestName);
  const std::string tmp_path = final_path + std::string(kTempSuffix);
  const auto data = std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  Status st = fs_.WriteFile(tmp_path, data);
  if (st.ok()) st = fs_.SyncFile(tmp_path);
  // The rename frees nothing: manifest.prev.json is another name of the file it replaces
  // (KeepPreviousManifest). Where that is a copy, the replaced file's disk blocks keep the old
  // turn until reused (README, "Erasure"): zeroing it first could leave no readable manifest.
  if (st.ok()) st = fs_.Rename(tmp_path, final_path);
  if (!st.ok()) {
    if (fs_.OverwriteWithZeros(tmp_path).ok()) (void)fs_.SyncFile(tmp_path);  // the turn's text
    (void)fs_.Unlink(tmp_path);
    return st;
  }
  st = fs_.SyncDir(agent_dir);
  if (st.ok()) return st;
  // The new manifest is visible but its rename may not be durable: put the old one back so
  // that an error return really means "still at the previous turn".
  // The new turn's file goes under a temp name first, which Open shreds after a crash: then
  // Open finds no manifest and puts manifest.prev.json back (or, for a first turn, no agent),
  // where zeroing it in place would leave an unreadable manifest in the running store.
  uint64_t shredded_bytes = 0;
  size_t shredded_files = 0;
  const std::string undone_path = final_path + ".undone" + std::string(kTempSuffix);  // not WriteFileAtomic's
  const bool moved = fs_.Rename(final_path, undone_path).ok();
  // Where even that rename fails, the new manifest stays as it is, readable: the caller then
  // follows what the disk shows.
  Status rollback = !moved   ? IoError("moving " + final_path + " aside failed")
                    : previous ? WriteFileAtomic(fs_, agent_dir, std::string(kManifestName), *previous)
                               : Status::Ok();
  if (moved) {
    Status shredded = ShredFile(undone_path, &shredded_bytes, &shredded_files);
    if (rollback.ok()) rollback = shredded;
  }
  if (rollback.ok() && !previous) rollback = fs_.SyncDir(agent_dir);
  if (!rollback.ok())
    return Internal("committing " + final_path + " failed (" + st.message() + ") and so did restoring the previous "
                    "manifest (" + rollback.message() + "); the agent may be at either turn");
  return st;
}

// A second name, not a copy: the rename that publishes the new turn then frees none of the old
// turn's bytes (its text). They stay under manifest.prev.json until the next turn or an erasure
// zeroes them. A crash anywhere in here leaves manifest.json as it was.
Status CacheStore::LinkPreviousManifest(const std::string& agent_dir) {
  uint64_t bytes = 0;
  size_t files = 0;
  // A name left by a commit that crashed after its link has another name too: only unlinked.
  if (fs_.FileSize(JoinPath(agent_dir, kPrevManifestName)).ok())
    KVFS_RETURN_IF_ERROR(DropPreviousManifest(agent_dir, &bytes, &files));
  KVFS_RETURN_IF_ERROR(fs_.Link(JoinPath(agent_dir, kManifestName), JoinPath(agent_dir, kPrevManifestName)));
  return fs_.SyncDir(agent_dir);
}

Status CacheStore::KeepPreviousManifest(const std::string& agent_dir, const std::vector<uint8_t>& previous,
                                        uint64_t* bytes_written) {
  // An unreadable manifest is no turn to keep: the readable copy stays instead.
  if (!ParseManifest(AsString(previous), JoinPath(agent_dir, kManifestName)).ok()) return Status::Ok();
  Status linked = LinkPreviousManifest(agent_dir);
  if (linked.code() != StatusCode::kUnsupported) return linked;
  copies_previous_manifest_ = true;
  KVFS_RETURN_IF_ERROR(WriteFileAtomic(fs_, agent_dir, std::string(kPrevManifestName), previous));
  *bytes_written += previous.size();
  return Status::Ok();
}

Result<CommitReport> CacheStore::CommitTurn(const std::string& agent, Manifest manifest,
                                            std::span<const NewBlock> new_blocks, std::optional<TailData> tail,
                                            bool keep_tail) {
  if (!IsValidAgentName(agent)) return InvalidArgument("invalid agent name \"" + agent + "\"");
  if (manifest.name.empty()) manifest.name = agent;
  if (manifest.name != agent) return InvalidArgument("manifest name \"" + manifest.name + "\" is not " + agent);
  if (tail && tail->n_tokens == 0) tail.reset();
  if (tail && tail->n_tokens >= manifest.block_size)
    return InvalidArgument("tail of " + std::to_string(tail->n_tokens) + " tokens is not a partial block");
  const std::set<BlockHash> named(manifest.blocks.begin(), manifest.blocks.end());
  for (const NewBlock& b : new_blocks) {
    if (!named.count(b.hash)) return InvalidArgument("new block " + ToHex(b.hash) + " is not in the manifest");
    if (b.n_tokens != manifest.block_size)
      return InvalidArgument("new block " + ToHex(b.hash) + " holds " + std::to_string(b.n_tokens) +
                             " tokens, block size is " + std::to_string(manifest.block_size));
  }

  std::unique_lock lock(mu_);
  // An edit (a manifest and no KV data) names the blocks the agent had when it was made. One
  // dropped since (it failed its checksum, or its file was gone) ends the stored cache there:
  // the tokens stay, and the next turn recomputes the rest from them. (Refusing would refuse
  // every edit of the agent until a turn rebuilt its cache.)
  if (keep_tail && new_blocks.empty() && !tail) {
    auto gone = std::find_if(manifest.blocks.begin(), manifest.blocks.end(),
                             [&](const BlockHash& h) { return !present_.count(h); });
    if (gone != manifest.blocks.end()) manifest.blocks.erase(gone, manifest.blocks.end());  // (and the tail)
  }
  std::set<BlockHash> incoming;
  for (const NewBlock& b : new_blocks) incoming.insert(b.hash);
  for (const BlockHash& h : manifest.blocks)
    if (!present_.count(h) && !incoming.count(h))
      return InvalidArgument("manifest names block " + ToHex(h) + ", which is neither stored nor new in this turn");
  const auto prev_it = agents_.find(agent);
  const std::optional<AgentInfo> prev =
      prev_it == agents_.end() ? std::nullopt : std::optional<AgentInfo>(prev_it->second);
  const bool was_broken = broken_.count(agent) > 0;
  const int64_t now = Now();
  manifest.turn = prev ? prev->turn + 1 : 1;
  // The first commit keeps the creation time the caller gives (the engine stamps an agent when
  // it makes it, and reports that time until the restart that reads this manifest).
  manifest.created_ms = prev ? prev->created_ms : manifest.created_ms > 0 ? manifest.created_ms : now;
  manifest.updated_ms = now;
  manifest.tail.reset();
  if (tail) manifest.tail = TailRef{TailFileName(manifest.turn), tail->n_tokens};
  // An edit that leaves the cache as it is keeps the tail file, while the tokens still end with it
  // and it is of the cache's format and block size (not that of a cache dropped since).
  const bool keeps_tail = !tail && keep_tail && prev && prev->tail && prev->kv_format == manifest.kv_format &&
                          prev->block_size == manifest.block_size &&
                          manifest.blocks.size() * manifest.block_size + prev->tail->n_tokens == manifest.tokens.size() &&
                          TailFileExistsLocked(agent, *prev->tail);  // not lost meanwhile
  if (keeps_tail) manifest.tail = prev->tail;
  KVFS_ASSIGN_OR_RETURN(std::string manifest_bytes, SerializeManifest(manifest));

  const std::string adir = AgentDir(agent);
  // Refuse early, before writing anything, when the new files clearly cannot fit (an upper
  // bound: blocks not yet stored, the tail, the manifest, with the manifest's temp copy).
  // Each file counted in whole 4 KiB allocation units, plus one for the directories. (The old
  // manifest and tail stay until the new ones are in place: their room is not counted free.)
  auto in_units = [](uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  uint64_t needed = 4096;
  std::set<std::string> new_subdirs;  // blocks/<hh> made for the new blocks
  for (const NewBlock& b : new_blocks) {
    if (present_.count(b.hash)) continue;
    needed += in_units(kBlockHeaderBytes + b.payload.size());
    if (const std::string hh = ToHex(b.hash).substr(0, 2); !block_subdirs_.count(hh)) new_subdirs.insert(hh);
  }
  needed += 4096 * (new_subdirs.size() + (prev ? 0 : 1));  // and the agent's directory
  if (tail) needed += in_units(kBlockHeaderBytes + tail->payload.size());
  needed += in_units(manifest_bytes.size());
  // Without hard links the previous manifest is kept as a copy (KeepPreviousManifest).
  if (prev && copies_previous_manifest_) {
    if (auto old = fs_.FileSize(JoinPath(adir, kManifestName)); old.ok()) needed += in_units(*old);
  }
  uint64_t early_bytes = 0;  // the cache's files a full disk made go first (below)
  size_t early_files = 0;
  if (auto free = fs_.FreeBytes(dir_); free.ok() && *free < needed) {
    if (!manifest.blocks.empty() || manifest.tail || !prev || keep_tail) {  // (keep_tail: an edit)
      const bool edit = keep_tail || (new_blocks.empty() && !tail);  // a manifest and no KV data
      return Status(StatusCode::kNoSpace,
                    fmt::format("saving {} of {} needs about {} bytes, {} are free in {}",
                                edit ? "an edit" : "a turn", agent, needed, *free, dir_));
    }
    // The erasure of a cache (rm kv.safetensors, which rm -r does first) on a full disk: its
    // files go before the manifest that no longer names them, to make room for it, and the
    // writes below say whether it fits. A crash or failure from here on leaves the old manifest
    // naming files that are gone, which Open reads as a cache to rebuild: the conversation
    // stays, as the erasure meant.
    uint64_t bytes = 0;
    size_t files = 0;
    if (prev->tail) {
      const std::string old_tail = JoinPath(adir, prev->tail->file);
      if (fs_.FileSize(old_tail).ok()) KVFS_RETURN_IF_ERROR(ShredFile(old_tail, &bytes, &files));
      prev_it->second.tail.reset();  // no later commit keeps it
    }
    std::set<std::string> touched;
    for (const BlockHash& h : prev->blocks) {
      auto ref = refs_.find(h);
      if (ref == refs_.end() || ref->second != 1 || !present_.count(h)) continue;  // kept for others
      KVFS_RETURN_IF_ERROR(ShredFile(BlockPath(h), &bytes, &files));
      present_.erase(h);
      touched.insert(BlockSubdir(h));
    }
    (void)SettleBlockSubdirs(touched);
    early_bytes = bytes;
    early_files = files;
  }
  std::optional<std::vector<uint8_t>> previous;
  if (prev || was_broken) {
    auto bytes = fs_.ReadFile(JoinPath(adir, kManifestName));
    if (bytes.ok()) previous = std::move(*bytes);
    else if (!was_broken || bytes.status().code() != StatusCode::kNotFound) return bytes.status();
  } else {
    KVFS_RETURN_IF_ERROR(fs_.MakeDir(adir));
    KVFS_RETURN_IF_ERROR(fs_.SyncDir(agents_dir_));
  }

  CommitReport report;
  report.cache_bytes_shredded = early_bytes;
  report.cache_files_shredded = early_files;
  // On an error from here on, the blocks this call wrote that nothing references are shredded at
  // once: they hold the agent's attention state, and an erasure only finds what a record names.
  std::vector<BlockHash> written;
  std::string new_tail;
  auto abandon = [&](Status st) {
    uint64_t bytes = 0;
    size_t files = 0;
    if (!new_tail.empty() && fs_.FileSize(new_tail).ok()) (void)ShredFile(new_tail, &bytes, &files);
    std::vector<BlockHash> unreferenced;
    for (const BlockHash& h : written)
      if (!refs_.count(h)) unreferenced.push_back(h);
    EraseReport shredded;
    ShredBlocks(unreferenced, &shredded);
    return st;
  };
  for (const NewBlock& b : new_blocks) {
    if (present_.count(b.hash)) {
      ++report.blocks_already_present;
      continue;
    }
    Status st = WriteBlock(b, &report.bytes_written);
    if (!st.ok()) {
      // The file may be in place already (the rename done, the directory sync failed).
      if (auto size = fs_.FileSize(BlockPath(b.hash)); size.ok()) {
        present_[b.hash] = *size;
        written.push_back(b.hash);
      }
      return abandon(st.WithContext("writing a block of agent " + agent));
    }
    written.push_back(b.hash);
    ++report.blocks_written;
  }
  if (tail) {
    auto image = EncodeBlockFile(BlockKind::kTail, BlockHash{}, tail->kv_format, tail->n_tokens, tail->payload,
                                 options_.encode);
    if (!image.ok()) return abandon(image.status());
    // This turn's tail file is no other turn's: abandon shreds it, in place or not, and so is
    // one of that name already there (a failed try of this turn, an unreadable incarnation's).
    new_tail = JoinPath(adir, manifest.tail->file);
    uint64_t bytes = 0;
    size_t files = 0;
    if (fs_.FileSize(new_tail).ok()) {
      if (Status st = ShredFile(new_tail, &bytes, &files); !st.ok()) return abandon(st);
    }
    Status st = WriteFileAtomic(fs_, adir, manifest.tail->file, *image);
    report.bytes_written += st.ok() ? image->size() : 0;
    ShredVector(*image);  // KV rows: not left in freed memory
    if (!st.ok()) return abandon(st.WithContext("writing the tail of " + agent));
  }
  if (prev && previous) {
    Status st = KeepPreviousManifest(adir, *previous, &report.bytes_written);
    if (!st.ok()) return abandon(st.WithContext("keeping the previous manifest of " + agent));
  } else if (was_broken) {
    // The copy belongs to the unreadable incarnation this commit replaces. Its unreadable
    // manifest takes that name instead, so that the publish frees none of its bytes; the next
    // commit, an erasure or Open zeroes them.
    uint64_t bytes = 0;
    size_t files = 0;
    Status st = Status::Ok();
    if (fs_.FileSize(JoinPath(adir, kManifestName)).ok()) {
      st = LinkPreviousManifest(adir);
      if (st.code() == StatusCode::kUnsupported) st = Status::Ok();  // the copy is dropped all the same
    } else if (fs_.FileSize(JoinPath(adir, kPrevManifestName)).ok()) {
      st = DropPreviousManifest(adir, &bytes, &files);
    }
    if (!st.ok()) return abandon(st);
  }
  Status published = PublishManifest(adir, manifest_bytes, previous);
  if (!published.ok()) {
    if (published.code() == StatusCode::kInternal) {
      // Unknown outcome: follow what is on disk so that refcounts match the visible manifest.
      auto bytes = fs_.ReadFile(JoinPath(adir, kManifestName));
      auto m = bytes.ok() ? ParseManifest(AsString(*bytes), adir) : Result<Manifest>(bytes.status());
      if (m.ok() && m->turn == manifest.turn) {
        if (prev) DropRefs(prev->blocks);
        AddRefs(manifest.blocks);
        agents_[agent] = AgentInfo{manifest.blocks, manifest.tail, manifest.turn, manifest.created_ms,
                               manifest.kv_format, manifest.block_size};
        broken_.erase(agent);
        new_tail.clear();  // the visible manifest names it
      }
    }
    return abandon(published.WithContext("committing turn " + std::to_string(manifest.turn) + " of agent " + agent));
  }
  report.bytes_written += manifest_bytes.size();

  // Committed. Swap the references, then remove what nothing names any more (best effort: a
  // failure or crash here only leaves garbage that Open collects).
  AddRefs(manifest.blocks);
  std::vector<BlockHash> unreferenced = prev ? DropRefs(prev->blocks) : std::vector<BlockHash>{};
  agents_[agent] = AgentInfo{manifest.blocks, manifest.tail, manifest.turn, manifest.created_ms,
                               manifest.kv_format, manifest.block_size};
  broken_.erase(agent);
  uint64_t bytes = 0;
  size_t files = 0;
  if (prev && prev->tail && !keeps_tail) (void)ShredFile(JoinPath(adir, prev->tail->file), &bytes, &files);
  std::set<std::string> touched;
  for (const BlockHash& h : unreferenced) {
    if (present_.count(h) && ShredFile(BlockPath(h), &bytes, &files).ok()) {
      present_.erase(h);
      touched.insert(BlockSubdir(h));
    }
  }
  (void)SettleBlockSubdirs(touched);
  report.cache_bytes_shredded += bytes;
  report.cache_files_shredded += files;
  report.manifest = std::move(manifest);
  return report;
}

}  // namespace kvfs::store
