// CacheStore: loading, reading, listing and erasure (open and commit are in cache_store.cpp).
#include <algorithm>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

#include "engine/store/cache_store.h"

namespace kvfs::store {

void CacheStore::DropCorruptBlock(const BlockHash& hash, const std::string& why) {
  // Verify again under the exclusive lock: between the failed read and now the block may have
  // been erased and written afresh by another agent's commit.
  if (!present_.count(hash)) return;
  const std::string path = BlockPath(hash);
  auto again = ReadBlockFile(fs_, path, BlockKind::kBlock, hash);
  if (again.ok() || again.status().code() != StatusCode::kCorrupt) return;
  spdlog::warn("cache store {}: dropping block {}: {}", dir_, ToHex(hash), why);
  if (fs_.Unlink(path).ok()) {
    present_.erase(hash);
    (void)SettleBlockSubdirs({BlockSubdir(hash)});
  }
}

Result<LoadedAgent> CacheStore::LoadAgent(const std::string& name, const std::string& expected_fingerprint) {
  if (!IsValidAgentName(name)) return InvalidArgument("invalid agent name \"" + name + "\"");
  LoadedAgent out;
  std::vector<std::pair<BlockHash, std::string>> corrupt_blocks;
  std::optional<std::string> corrupt_tail;
  {
    std::shared_lock lock(mu_);
    if (auto b = broken_.find(name); b != broken_.end()) return Corrupt(b->second);
    if (!agents_.count(name)) return NotFound("no cached agent \"" + name + "\"");
    const std::string adir = AgentDir(name);
    const std::string manifest_path = JoinPath(adir, kManifestName);
    KVFS_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, fs_.ReadFile(manifest_path));
    KVFS_ASSIGN_OR_RETURN(out.manifest, ParseManifest(std::string(bytes.begin(), bytes.end()), manifest_path));
    const Manifest& m = out.manifest;
    if (m.model_fingerprint != expected_fingerprint) {
      spdlog::info("cache store {}: agent {} was cached for model {}, not {}; rebuilding from its text", dir_, name,
                   m.model_fingerprint, expected_fingerprint);
      out.fingerprint_mismatch = true;
      out.rebuild_from_block = 0;
      return out;
    }
    // Blocks in order; the first one that cannot be used ends the loaded prefix.
    for (size_t i = 0; i < m.blocks.size() && !out.rebuild_from_block; ++i) {
      const std::string path = BlockPath(m.blocks[i]);
      Status problem;
      auto block = ReadBlockFile(fs_, path, BlockKind::kBlock, m.blocks[i]);
      if (!block.ok()) problem = block.status();
      else if (block->header.n_tokens != m.block_size)
        problem = Corrupt(path + ": holds " + std::to_string(block->header.n_tokens) + " tokens, block size is " +
                          std::to_string(m.block_size));
      else if (i > 0 && block->header.kv_format != out.kv_format_id)
        problem = Corrupt(path + ": kv format " + std::to_string(block->header.kv_format) + " differs from block 0's");
      if (!problem.ok()) {
        out.rebuild_from_block = i;
        out.problems.push_back(problem.message());
        if (problem.code() == StatusCode::kCorrupt) corrupt_blocks.emplace_back(m.blocks[i], problem.message());
        break;
      }
      if (i == 0) out.kv_format_id = block->header.kv_format;
      out.blocks.push_back(std::move(block->payload));
    }
    if (!out.rebuild_from_block && m.tail) {
      const std::string path = JoinPath(adir, m.tail->file);
      Status problem;
      auto tail = ReadBlockFile(fs_, path, BlockKind::kTail, std::nullopt);
      if (!tail.ok()) problem = tail.status();
      else if (tail->header.n_tokens != m.tail->n_tokens)
        problem = Corrupt(path + ": holds " + std::to_string(tail->header.n_tokens) + " tokens, manifest says " +
                          std::to_string(m.tail->n_tokens));
      else if (!m.blocks.empty() && tail->header.kv_format != out.kv_format_id)
        problem = Corrupt(path + ": kv format differs from the blocks'");
      if (problem.ok()) {
        if (m.blocks.empty()) out.kv_format_id = tail->header.kv_format;
        out.tail = std::move(tail->payload);
      } else {
        out.rebuild_from_block = m.blocks.size();
        out.problems.push_back(problem.message());
        if (problem.code() == StatusCode::kCorrupt) corrupt_tail = path;
      }
    }
  }
  if (out.rebuild_from_block) {
    spdlog::warn("cache store {}: agent {}: {}; its cache will be rebuilt from its text from block {} (token {})", dir_,
                 name, out.problems.back(), *out.rebuild_from_block,
                 *out.rebuild_from_block * out.manifest.block_size);
  }
  if (!corrupt_blocks.empty() || corrupt_tail) {
    std::unique_lock lock(mu_);
    for (const auto& [hash, why] : corrupt_blocks) DropCorruptBlock(hash, why);
    if (corrupt_tail) {
      auto again = ReadBlockFile(fs_, *corrupt_tail, BlockKind::kTail, std::nullopt);
      if (!again.ok() && again.status().code() == StatusCode::kCorrupt && fs_.Unlink(*corrupt_tail).ok())
        (void)fs_.SyncDir(AgentDir(name));
    }
  }
  return out;
}

Result<Manifest> CacheStore::ReadManifest(const std::string& name) {
  if (!IsValidAgentName(name)) return InvalidArgument("invalid agent name \"" + name + "\"");
  std::shared_lock lock(mu_);
  if (auto b = broken_.find(name); b != broken_.end()) return Corrupt(b->second);
  if (!agents_.count(name)) return NotFound("no cached agent \"" + name + "\"");
  const std::string manifest_path = JoinPath(AgentDir(name), kManifestName);
  KVFS_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, fs_.ReadFile(manifest_path));
  return ParseManifest(std::string(bytes.begin(), bytes.end()), manifest_path);
}

Result<std::vector<uint8_t>> CacheStore::ReadTail(const std::string& name, const TailRef& tail) {
  if (!IsValidAgentName(name) || !IsTailFileName(tail.file)) return InvalidArgument("invalid tail " + name + "/" + tail.file);
  const std::string path = JoinPath(AgentDir(name), tail.file);
  Status failure;
  {
    std::shared_lock lock(mu_);
    auto read = ReadBlockFile(fs_, path, BlockKind::kTail, std::nullopt);
    if (read.ok() && read->header.n_tokens == tail.n_tokens) return std::move(read->payload);
    failure = read.ok() ? Corrupt(path + ": holds " + std::to_string(read->header.n_tokens) + " tokens, manifest says " +
                                  std::to_string(tail.n_tokens))
                        : read.status();
  }
  if (failure.code() == StatusCode::kCorrupt) {
    spdlog::warn("cache store {}: {}; dropping it", dir_, failure.message());
    std::unique_lock lock(mu_);
    if (fs_.Unlink(path).ok()) (void)fs_.SyncDir(AgentDir(name));
  }
  return failure;
}

Result<std::vector<uint8_t>> CacheStore::ReadBlock(const BlockHash& hash) {
  Status failure;
  {
    std::shared_lock lock(mu_);
    if (!present_.count(hash)) return NotFound("block " + ToHex(hash) + " is not stored");
    auto block = ReadBlockFile(fs_, BlockPath(hash), BlockKind::kBlock, hash);
    if (block.ok()) return std::move(block->payload);
    failure = block.status();
  }
  if (failure.code() == StatusCode::kCorrupt) {
    std::unique_lock lock(mu_);
    DropCorruptBlock(hash, failure.message());
  }
  return failure;
}

Status CacheStore::ReadBlockInto(const BlockHash& hash, std::span<uint8_t> dst) {
  Status failure;
  {
    std::shared_lock lock(mu_);
    if (!present_.count(hash)) return NotFound("block " + ToHex(hash) + " is not stored");
    auto header = ReadBlockFileInto(fs_, BlockPath(hash), BlockKind::kBlock, hash, dst);
    if (header.ok()) return Status::Ok();
    failure = header.status();
  }
  if (failure.code() == StatusCode::kCorrupt) {
    std::unique_lock lock(mu_);
    DropCorruptBlock(hash, failure.message());
  }
  return failure;
}

bool CacheStore::HasBlock(const BlockHash& hash) const {
  std::shared_lock lock(mu_);
  return present_.count(hash) > 0;
}

bool CacheStore::HasTail(const std::string& name, const TailRef& tail) const {
  std::shared_lock lock(mu_);
  return TailFileExistsLocked(name, tail);
}

bool CacheStore::TailFileExistsLocked(const std::string& name, const TailRef& tail) const {
  if (!IsValidAgentName(name) || !IsTailFileName(tail.file)) return false;
  return fs_.FileSize(JoinPath(AgentDir(name), tail.file)).ok();
}

bool CacheStore::NamesCache(const std::string& agent) const {
  std::shared_lock lock(mu_);
  auto it = agents_.find(agent);
  return it != agents_.end() && (!it->second.blocks.empty() || it->second.tail.has_value());
}

std::vector<BlockHash> CacheStore::CacheBlocks(const std::string& agent) const {
  std::shared_lock lock(mu_);
  auto it = agents_.find(agent);
  return it != agents_.end() ? it->second.blocks : std::vector<BlockHash>{};
}

uint64_t CacheStore::CacheFileBytes(const std::string& agent) const {
  std::shared_lock lock(mu_);
  auto it = agents_.find(agent);
  if (it == agents_.end()) return 0;
  uint64_t bytes = 0;
  for (const BlockHash& h : std::set<BlockHash>(it->second.blocks.begin(), it->second.blocks.end()))
    if (auto p = present_.find(h); p != present_.end()) bytes += p->second;
  if (it->second.tail)
    if (auto size = fs_.FileSize(JoinPath(AgentDir(agent), it->second.tail->file)); size.ok()) bytes += *size;
  return bytes;
}

std::vector<std::string> CacheStore::ListAgents() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, info] : agents_) out.push_back(name);
  for (const auto& [name, why] : broken_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

StoreStats CacheStore::Stats() const {
  std::shared_lock lock(mu_);
  StoreStats s;
  s.agents = agents_.size() + broken_.size();
  s.blocks = present_.size();
  for (const auto& [hash, size] : present_) s.block_bytes += size;
  return s;
}

Result<EraseReport> CacheStore::EraseAgent(const std::string& name) {
  if (!IsValidAgentName(name)) return InvalidArgument("invalid agent name \"" + name + "\"");
  std::unique_lock lock(mu_);
  const auto it = agents_.find(name);
  const bool was_broken = broken_.count(name) > 0;
  if (it == agents_.end() && !was_broken) return NotFound("no cached agent \"" + name + "\"");
  EraseReport report;
  const std::string adir = AgentDir(name);
  const std::string doomed = JoinPath(agents_dir_, std::string(kErasePrefix) + name);
  if (fs_.IsDir(doomed).ok())  // left by an erasure of an earlier agent of this name that failed
    KVFS_RETURN_IF_ERROR(PurgeDir(doomed, &report.bytes_freed, &report.files_removed));

  // Commit point: once the rename is durable the agent no longer exists for Open.
  KVFS_RETURN_IF_ERROR(fs_.Rename(adir, doomed).WithContext("erasing agent " + name));
  if (Status st = fs_.SyncDir(agents_dir_); !st.ok()) {
    if (fs_.Rename(doomed, adir).ok() && fs_.SyncDir(agents_dir_).ok())
      return st.WithContext("erasing agent " + name + " (nothing was erased)");
    // Neither state is known durable; the agent is gone as far as this process is concerned.
  }

  std::vector<BlockHash> freed;
  if (it != agents_.end()) {
    const std::set<BlockHash> unique(it->second.blocks.begin(), it->second.blocks.end());
    freed = DropRefs(it->second.blocks);
    report.blocks_kept_shared = unique.size() - freed.size();
    agents_.erase(it);
  }
  broken_.erase(name);

  Status first_error = PurgeDir(doomed, &report.bytes_freed, &report.files_removed);
  std::set<std::string> touched;
  for (const BlockHash& h : freed) {
    if (!present_.count(h)) continue;  // referenced but already missing
    Status st = ShredFile(BlockPath(h), &report.bytes_freed, &report.files_removed);
    if (!st.ok()) {
      if (first_error.ok()) first_error = st;
      continue;  // unreferenced now: the next Open collects it
    }
    present_.erase(h);
    ++report.blocks_freed;
    touched.insert(BlockSubdir(h));
  }
  if (Status st = SettleBlockSubdirs(touched); !st.ok() && first_error.ok()) first_error = st;
  // Blocks only a broken manifest could have named were held back from collection; with the
  // last unreadable record gone they are garbage.
  if (was_broken && NothingUnreadable() && first_error.ok()) first_error = CollectOrphanBlocks(&report);
  if (was_broken && !NothingUnreadable()) {
    for (const auto& [h, unused] : present_) report.blocks_kept_unattributed += refs_.count(h) ? 0 : 1;
    if (report.blocks_kept_unattributed > 0)
      spdlog::warn("cache store {}: erased agent {}, whose record was unreadable: {} blocks that no readable record "
                   "names may have been its own and stay until the other unreadable records are erased",
                   dir_, name, report.blocks_kept_unattributed);
  }
  if (!first_error.ok())
    return first_error.WithContext("erasing agent " + name + " (the agent is gone; the next Open removes what is left)");
  spdlog::info("cache store {}: erased agent {}: {} files, {} bytes, {} blocks freed, {} shared blocks kept", dir_,
               name, report.files_removed, report.bytes_freed, report.blocks_freed, report.blocks_kept_shared);
  return report;
}

}  // namespace kvfs::store
