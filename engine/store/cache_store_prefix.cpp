// CacheStore: the records of shared prefixes (prefix_record.h).
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

#include "engine/store/cache_store.h"

namespace kvfs::store {

std::string CacheStore::PrefixPath(const std::string& name) const {
  return JoinPath(prefixes_dir_, name + std::string(kPrefixSuffix));
}

Status CacheStore::ScanPrefixes() {
  KVFS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs_.ListDir(prefixes_dir_));
  for (const DirEntry& e : entries) {
    const std::string path = JoinPath(prefixes_dir_, e.name);
    if (!e.is_dir && !e.is_symlink && e.name.ends_with(kTempSuffix)) {
      KVFS_RETURN_IF_ERROR(ShredFile(path, &open_report_.bytes_removed, &open_report_.temp_files_removed));
      continue;
    }
    if (!e.is_dir && !e.is_symlink && e.name.ends_with(kRetiredSuffix)) {  // a replace cut short
      // Unlinked while still the live record's second name, else shredded.
      KVFS_RETURN_IF_ERROR(DropName(path, &open_report_.bytes_removed, &open_report_.temp_files_removed));
      continue;
    }
    const std::string name =
        e.name.ends_with(kPrefixSuffix) ? e.name.substr(0, e.name.size() - kPrefixSuffix.size()) : std::string();
    if (e.is_dir || !IsValidPrefixName(name)) {
      open_report_.unknown_files.push_back(path);
      continue;
    }
    Result<PrefixRecord> p = Corrupt("unread");
    if (auto bytes = fs_.ReadFile(path); bytes.ok()) p = ParsePrefix(std::string(bytes->begin(), bytes->end()), path);
    else p = bytes.status();
    if (p.ok() && p->name != name) p = Corrupt(path + ": field \"name\": \"" + p->name + "\" does not match the file");
    if (!p.ok()) {
      // Kept (it may name blocks, so orphan collection is skipped) until it is erased or replaced.
      broken_prefixes_[name] = p.status().message();
      open_report_.broken_prefixes.push_back(name + ": " + p.status().message());
      continue;
    }
    AddRefs(p->blocks);
    prefixes_[name] = std::move(*p);
  }
  return fs_.SyncDir(prefixes_dir_);
}

Status CacheStore::ReplaceZeroingOld(const std::string& dir, const std::string& name, std::span<const uint8_t> data) {
  const std::string path = JoinPath(dir, name);
  const std::string retired = path + std::string(kRetiredSuffix);
  uint64_t bytes = 0;
  size_t files = 0;
  bool has_retired = false;
  if (fs_.FileSize(path).ok()) {
    if (fs_.FileSize(retired).ok()) KVFS_RETURN_IF_ERROR(DropName(retired, &bytes, &files));
    Status linked = fs_.Link(path, retired);
    // Without hard links the replaced file's blocks keep its bytes until reused (README, "Erasure").
    if (!linked.ok() && linked.code() != StatusCode::kUnsupported) return linked;
    has_retired = linked.ok();
  }
  Status st = WriteFileAtomic(fs_, dir, name, data);
  if (!has_retired) return st;
  // Whether or not the new file is in place, the second name goes: shredded when it is the last
  // name of the old bytes, unlinked when the rename did not happen (the Open after a crash does
  // the same). Once the new file is in place this is clean-up: its failure leaves a name that
  // Open or an erasure of the record drops, and the replace stands.
  Status dropped = DropName(retired, &bytes, &files);
  if (dropped.ok()) dropped = fs_.SyncDir(dir);
  if (!dropped.ok()) spdlog::warn("cache store {}: dropping {}: {}", dir_, retired, dropped.message());
  return st;
}

void CacheStore::ShredBlocks(const std::vector<BlockHash>& freed, EraseReport* report) {
  std::set<std::string> touched;
  for (const BlockHash& h : freed) {
    if (!present_.count(h)) continue;
    if (ShredFile(BlockPath(h), &report->bytes_freed, &report->files_removed).ok()) {
      present_.erase(h);
      ++report->blocks_freed;
      touched.insert(BlockSubdir(h));
    }
  }
  (void)SettleBlockSubdirs(touched);
}

Status CacheStore::CommitPrefix(PrefixRecord record, std::span<const NewBlock> new_blocks, EraseReport* replaced) {
  if (!IsValidPrefixName(record.name)) return InvalidArgument("invalid prefix name \"" + record.name + "\"");
  const std::set<BlockHash> named(record.blocks.begin(), record.blocks.end());
  uint64_t needed = 2 * (record.text.size() + 64 * record.blocks.size() + 4096);
  for (const NewBlock& b : new_blocks) {
    if (!named.count(b.hash)) return InvalidArgument("new block " + ToHex(b.hash) + " is not in the prefix record");
    if (b.n_tokens != record.block_size)
      return InvalidArgument("new block " + ToHex(b.hash) + " holds " + std::to_string(b.n_tokens) +
                             " tokens, block size is " + std::to_string(record.block_size));
  }
  KVFS_ASSIGN_OR_RETURN(std::string bytes, SerializePrefix(record));

  std::unique_lock lock(mu_);
  std::set<BlockHash> incoming;
  for (const NewBlock& b : new_blocks) {
    incoming.insert(b.hash);
    if (!present_.count(b.hash)) needed += kBlockHeaderBytes + b.payload.size();
  }
  for (const BlockHash& h : record.blocks)
    if (!present_.count(h) && !incoming.count(h))
      return InvalidArgument("prefix record names block " + ToHex(h) + ", which is neither stored nor new");
  if (auto free = fs_.FreeBytes(dir_); free.ok() && *free < needed)
    return Status(StatusCode::kNoSpace, "storing prefix " + record.name + " needs about " + std::to_string(needed) +
                                            " bytes, " + std::to_string(*free) + " are free in " + dir_);
  uint64_t written = 0;
  for (const NewBlock& b : new_blocks) {
    if (present_.count(b.hash)) continue;
    KVFS_RETURN_IF_ERROR(WriteBlock(b, &written).WithContext("writing a block of prefix " + record.name));
  }
  const auto data = std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  Status published = ReplaceZeroingOld(prefixes_dir_, record.name + std::string(kPrefixSuffix), data);
  if (!published.ok()) {
    // New blocks nothing names yet are orphans that the next Open collects.
    return published.WithContext("storing prefix " + record.name);
  }
  // Published: swap the references, then erase what nothing names any more.
  AddRefs(record.blocks);
  std::vector<BlockHash> unreferenced;
  if (auto old = prefixes_.find(record.name); old != prefixes_.end()) unreferenced = DropRefs(old->second.blocks);
  const bool was_unreadable = broken_prefixes_.erase(record.name) > 0;
  const std::string name = record.name;
  prefixes_[name] = std::move(record);
  EraseReport ignored;
  ShredBlocks(unreferenced, replaced != nullptr ? replaced : &ignored);
  // Best effort, like the shredding above: what is left is collected by the next Open.
  if (was_unreadable && NothingUnreadable()) (void)CollectOrphanBlocks(&ignored);
  return Status::Ok();
}

std::map<std::string, std::string> CacheStore::UnreadablePrefixes() const {
  std::shared_lock lock(mu_);
  return broken_prefixes_;
}

std::vector<PrefixRecord> CacheStore::ListPrefixes() const {
  std::shared_lock lock(mu_);
  std::vector<PrefixRecord> out;
  for (const auto& [name, p] : prefixes_) out.push_back(p);
  return out;
}

Result<EraseReport> CacheStore::ErasePrefix(const std::string& name) {
  if (!IsValidPrefixName(name)) return InvalidArgument("invalid prefix name \"" + name + "\"");
  std::unique_lock lock(mu_);
  auto it = prefixes_.find(name);
  const bool broken = broken_prefixes_.count(name) > 0;
  if (it == prefixes_.end() && !broken) return NotFound("no stored prefix \"" + name + "\"");
  EraseReport report;
  // The commit point: once the record is gone (and that is durable) the prefix does not exist.
  const std::string retired = PrefixPath(name) + std::string(kRetiredSuffix);  // a replace's leftover
  if (fs_.FileSize(retired).ok())
    KVFS_RETURN_IF_ERROR(DropName(retired, &report.bytes_freed, &report.files_removed).WithContext("erasing prefix " + name));
  KVFS_RETURN_IF_ERROR(ShredFile(PrefixPath(name), &report.bytes_freed, &report.files_removed)
                           .WithContext("erasing prefix " + name));
  Status synced = fs_.SyncDir(prefixes_dir_);
  broken_prefixes_.erase(name);
  if (it != prefixes_.end()) {
    const std::set<BlockHash> unique(it->second.blocks.begin(), it->second.blocks.end());
    const std::vector<BlockHash> freed = DropRefs(it->second.blocks);
    report.blocks_kept_shared = unique.size() - freed.size();
    prefixes_.erase(it);
    ShredBlocks(freed, &report);
  }
  if (!synced.ok()) return synced.WithContext("erasing prefix " + name + " (its record is unlinked)");
  // The blocks an unreadable record named are unknown: with the last such record gone,
  // whatever nothing references is garbage.
  if (broken && NothingUnreadable())
    KVFS_RETURN_IF_ERROR(CollectOrphanBlocks(&report).WithContext("erasing prefix " + name + " (its record is unlinked)"));
  return report;
}

}  // namespace kvfs::store
