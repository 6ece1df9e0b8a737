// CacheStore: the persistent KV cache of every agent in one directory (layout in
// block_format.h). Full blocks are content-named files written once and shared by every agent
// that references them; each agent has a manifest (its text, tokens, block list) and a tail
// file (its partial last block). Publishing the manifest is the commit point of a turn, so after
// a crash or an error an agent is at exactly its previous or its new turn.
//
// Crash-safety protocol of CommitTurn: new blocks (write-temp, fsync, rename, fsync dir), then
// the new tail (same), then manifest.prev.json made a second name (hard link; a copy where the
// file system has none) of the current manifest, the one it named before shredded, then the new
// manifest (same); the old tail is removed only after the manifest is durable. The link means the
// publishing rename frees no bytes of the old turn: they are zeroed when that name goes (next
// turn, erasure), as erasure promises. manifest.prev.json is for damage, not crashes: when Open finds a manifest missing or unreadable (a checksum
// mismatch included), it puts the previous one back, so the agent loses its last turn instead
// of everything (the blocks and tail only that turn named are gone, so its cache is rebuilt).
// Anything a crash leaves behind (temp files, blocks and tails no manifest names, an agent
// directory without a manifest, an interrupted erasure) is removed by the next Open.
//
// Blocks are refcounted by the number of agents whose manifest names them: counted by scanning
// the manifests at Open and maintained in memory after. A block whose refcount drops to zero is
// deleted (overwritten with zeros, fsynced, unlinked) by EraseAgent, or collected by Open.
//
// Thread-safety: every method may be called from any thread. One std::shared_mutex: LoadAgent
// and ReadBlock share it (they only read immutable files), the mutating calls take it
// exclusively, so a long commit delays loads but nothing tears. The FileSystem must itself be
// thread-safe (both implementations are). One process owns a store directory at a time.
//
// A different model fingerprint: LoadAgent does not read the blocks at all and returns the
// manifest (its text and tokens are still valid) with fingerprint_mismatch = true and
// rebuild_from_block = 0, so the caller rebuilds the whole cache from the text under its model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/store/block_file.h"
#include "engine/store/fs.h"
#include "engine/store/manifest.h"
#include "engine/store/prefix_record.h"

namespace kvfs::store {

struct StoreOptions {
  BlockEncodeOptions encode;
  // Wall clock for the manifest timestamps (unix milliseconds); defaults to the system clock.
  std::function<int64_t()> now_ms;
};

// What Open removed or could not use.
struct OpenReport {
  size_t temp_files_removed = 0;        // and stale manifest.prev.json copies (see ScanAgentDir)
  size_t orphan_blocks_removed = 0;     // block files no manifest references
  size_t orphan_tails_removed = 0;      // tail files their manifest does not name
  size_t incomplete_agents_removed = 0; // agent directories without a manifest (first turn never committed)
  size_t erasures_completed = 0;        // erasures interrupted by a crash, finished now
  uint64_t bytes_removed = 0;
  size_t missing_blocks = 0;            // referenced by a manifest but absent (LoadAgent will rebuild)
  // Agents whose manifest cannot be read, nor their previous one ("name: reason"). Their files
  // are kept; while any exists, orphan blocks are not collected (we cannot know which blocks
  // such a manifest names).
  std::vector<std::string> broken_agents;
  // Agents whose manifest was missing or unreadable and whose previous one was put back.
  struct Recovered {
    std::string name;
    uint64_t turn = 0;   // the turn the agent is back at
    std::string reason;  // what was wrong with the manifest
  };
  std::vector<Recovered> recovered_agents;
  std::vector<std::string> broken_prefixes;  // likewise, prefix records ("name: reason")
  bool orphan_collection_skipped = false;
  std::vector<std::string> unknown_files;  // not ours; left alone
};

struct NewBlock {
  BlockHash hash;
  uint32_t kv_format = 0;  // opaque id chosen by the KV layer
  uint32_t n_tokens = 0;   // must equal the manifest's block_size
  std::span<const uint8_t> payload;
};

struct TailData {
  uint32_t kv_format = 0;
  uint32_t n_tokens = 0;  // in [1, block_size)
  std::span<const uint8_t> payload;
};

struct CommitReport {
  size_t blocks_written = 0;
  size_t blocks_already_present = 0;  // named in new_blocks but stored before (shared or retried)
  uint64_t bytes_written = 0;         // block, tail and manifest files
  // Files of the cache before it that the commit zeroed and removed (its old tail, blocks no one
  // names any more), with their sizes on disk: what an erasure of the cache freed.
  uint64_t cache_bytes_shredded = 0;
  size_t cache_files_shredded = 0;
  Manifest manifest;                  // as committed (turn, timestamps and tail filled in)
};

struct LoadedAgent {
  Manifest manifest;
  // Verified, decompressed payloads of manifest.blocks[0 .. blocks.size()).
  std::vector<std::vector<uint8_t>> blocks;
  std::optional<std::vector<uint8_t>> tail;  // only when every block loaded
  uint32_t kv_format_id = 0;                 // of the loaded blocks (when any)
  bool fingerprint_mismatch = false;
  // nullopt: the whole cache loaded. Otherwise the index of the first block that could not be
  // loaded (== manifest.blocks.size() when only the tail is bad): the cache must be recomputed
  // from the text from token rebuild_from_block * block_size on.
  std::optional<size_t> rebuild_from_block;
  std::vector<std::string> problems;  // one message per missing or dropped file
  size_t cached_tokens() const;
};

// What an erasure removed, for the audit log. Counts are exact. files_removed counts every file
// unlinked (manifest, tails, temp files, block files).
struct EraseReport {
  uint64_t bytes_freed = 0;
  size_t blocks_freed = 0;
  size_t blocks_kept_shared = 0;
  size_t files_removed = 0;
  // The erasure of an agent whose record was unreadable, while other unreadable records remain:
  // blocks that no readable record names, which may have been its own or theirs (none can tell),
  // kept until the last unreadable record is erased, whose erasure frees them.
  size_t blocks_kept_unattributed = 0;
};

struct StoreStats {
  size_t agents = 0;
  size_t blocks = 0;
  uint64_t block_bytes = 0;  // file sizes of the block files
};

class CacheStore {
 public:
  // Creates the layout if needed, cleans up after a crash (see OpenReport) and loads the
  // refcounts. `fs` must outlive the store.
  static Result<std::unique_ptr<CacheStore>> Open(const std::string& dir, FileSystem& fs, StoreOptions options = {});

  const OpenReport& open_report() const { return open_report_; }

  // Commits one turn of `agent`: writes the blocks of `new_blocks` not already stored, the tail
  // (if any) and then the manifest. `manifest` carries everything but turn, timestamps and
  // tail, which the store fills in; every hash in manifest.blocks must be stored already or be
  // in new_blocks. A turn that clearly cannot fit in the free space fails with kNoSpace before
  // anything is written. On any error the previous manifest and every stored block are intact (the
  // agent stays at its previous turn), the blocks it wrote that nothing names are shredded, and
  // the error is returned (kNoSpace for a full disk). Without `tail`, the agent has no tail
  // after the commit, unless keep_tail and the manifest's tokens still end with the current tail
  // (an edit of the agent's settings or system text, which leaves its cache as it is).
  // The erasure of a cache (no blocks, no tail, not keep_tail) that does not fit shreds the
  // files it drops first, to make room; a crash or failure then leaves the old manifest naming
  // files that are gone (a cache LoadAgent reports for rebuilding), the conversation intact.
  Result<CommitReport> CommitTurn(const std::string& agent, Manifest manifest, std::span<const NewBlock> new_blocks,
                                  std::optional<TailData> tail, bool keep_tail = false);

  // Loads and verifies an agent's cache. kNotFound for an unknown agent; kCorrupt when its
  // manifest cannot be read. A block or tail that fails verification is removed (with a
  // warning) and reported through rebuild_from_block; a missing one likewise.
  Result<LoadedAgent> LoadAgent(const std::string& name, const std::string& expected_fingerprint);

  // Only the manifest (a cold agent's text, tokens and block list, without its blocks).
  // kNotFound for an unknown agent, kCorrupt when unreadable.
  Result<Manifest> ReadManifest(const std::string& name);
  // An agent's verified tail payload (its manifest's tail). A corrupt tail is removed.
  Result<std::vector<uint8_t>> ReadTail(const std::string& name, const TailRef& tail);

  // One verified block payload. kNotFound if not stored; kCorrupt (and the file dropped) if it
  // fails verification.
  Result<std::vector<uint8_t>> ReadBlock(const BlockHash& hash);
  // The same straight into caller memory (e.g. the KV pool), exactly the block's raw size.
  Status ReadBlockInto(const BlockHash& hash, std::span<uint8_t> dst);
  bool HasBlock(const BlockHash& hash) const;
  // Whether the agent's tail file is there (not whether it is sound: ReadTail checks that). A
  // manifest put back from manifest.prev.json names a tail that the commit after it removed.
  bool HasTail(const std::string& name, const TailRef& tail) const;
  // Whether an agent's committed manifest names blocks or a tail (false for a broken one).
  bool NamesCache(const std::string& agent) const;
  // The blocks an agent's committed manifest names (none for a broken one).
  std::vector<BlockHash> CacheBlocks(const std::string& agent) const;
  // The sizes on disk of the files of the agent's stored cache (its blocks, shared ones too, and
  // its tail): what it holds on disk whatever made it (another model's cache, say).
  uint64_t CacheFileBytes(const std::string& agent) const;

  // Every agent with a manifest, including those whose manifest is broken; sorted.
  std::vector<std::string> ListAgents() const;

  // Erases an agent for good: its manifest, tails and temp files, and every block no other agent
  // references, are overwritten with zeros, fsynced and unlinked before the call returns. Shared
  // blocks are kept. The commit point is the rename of its directory to agents/.erase.<name>; an
  // error after it leaves the rest to the next Open (the agent is already gone).
  Result<EraseReport> EraseAgent(const std::string& name);

  // Shared prefixes (prefix_record.h). CommitPrefix writes the blocks of `new_blocks` not
  // already stored, then publishes the record (replacing one of the same name; the blocks only
  // the old one named are erased). Every hash in record.blocks must be stored or in new_blocks.
  // On an error the previous record, if any, is intact. `replaced` (optional) counts the
  // erasure of the old record's blocks.
  Status CommitPrefix(PrefixRecord record, std::span<const NewBlock> new_blocks, EraseReport* replaced = nullptr);
  // Every readable prefix record, by name.
  std::vector<PrefixRecord> ListPrefixes() const;
  // Prefix records that cannot be read (damaged, or a newer version): name -> why. They are
  // kept (and orphan blocks are not collected) until ErasePrefix or CommitPrefix replaces them.
  std::map<std::string, std::string> UnreadablePrefixes() const;
  // Erases a prefix's record and the blocks nothing else references (overwritten, fsynced,
  // unlinked). kNotFound if there is no such record.
  Result<EraseReport> ErasePrefix(const std::string& name);

  StoreStats Stats() const;
  const std::string& dir() const { return dir_; }

 private:
  struct AgentInfo {
    std::vector<BlockHash> blocks;
    std::optional<TailRef> tail;
    uint64_t turn = 0;
    int64_t created_ms = 0;
    std::string kv_format;    // of the blocks and tail (an edit keeps a tail of its own format only)
    uint32_t block_size = 0;
  };

  CacheStore(std::string dir, FileSystem& fs, StoreOptions options);
  Status Init();
  Status ScanAgents();
  // One agent directory of ScanAgents: its manifest (or the previous one, put back), refcounts
  // and the clean-up of its temp files and stale tails.
  Status ScanAgentDir(const std::string& name, const std::string& path);
  // Reads and parses a manifest file, checking that it names `agent`; `bytes`, when given, gets
  // the file's contents.
  Result<Manifest> ReadManifestFile(const std::string& path, const std::string& agent,
                                    std::vector<uint8_t>* bytes = nullptr);
  Status ScanBlocks();
  Status ScanPrefixes();
  std::string PrefixPath(const std::string& name) const;
  // Shreds the given unreferenced blocks (best effort), counting into `report`.
  void ShredBlocks(const std::vector<BlockHash>& freed, EraseReport* report);
  // Shreds every stored block no record references. Only safe when NothingUnreadable(): an
  // unreadable manifest or prefix record may name any block.
  Status CollectOrphanBlocks(EraseReport* report);
  // After blocks were shredded: each of these blocks/<hh> directories is synced, or removed
  // when it is empty (an erasure leaves no trace of what it held, not even the hashes' first
  // byte). Returns the first error.
  Status SettleBlockSubdirs(const std::set<std::string>& subdirs);
  bool NothingUnreadable() const { return broken_.empty() && broken_prefixes_.empty(); }

  std::string AgentDir(const std::string& name) const;
  bool TailFileExistsLocked(const std::string& name, const TailRef& tail) const;  // HasTail; mu_ held
  std::string BlockSubdir(const BlockHash& hash) const;
  std::string BlockPath(const BlockHash& hash) const;
  int64_t Now() const;

  Status WriteBlock(const NewBlock& block, uint64_t* bytes_written);
  // Overwrite with zeros, fsync, unlink; adds to the counters. Does not fsync the directory.
  Status ShredFile(const std::string& path, uint64_t* bytes, size_t* files);
  // Shreds every file in `dir` and removes it; fsyncs its parent.
  Status PurgeDir(const std::string& dir, uint64_t* bytes, size_t* files);
  Status PublishManifest(const std::string& agent_dir, const std::string& bytes,
                         const std::optional<std::vector<uint8_t>>& previous);
  // Makes manifest.prev.json a second name of the agent's manifest.json, dropping the file the
  // name had; kUnsupported (after the drop) where the file system has no hard links.
  Status LinkPreviousManifest(const std::string& agent_dir);
  // LinkPreviousManifest for a readable `previous` (the manifest's bytes), or a copy of it where
  // there are no hard links.
  Status KeepPreviousManifest(const std::string& agent_dir, const std::vector<uint8_t>& previous,
                              uint64_t* bytes_written);
  // Writes dir/name atomically; the file it replaces is zeroed before its bytes are freed. The old
  // file gets a second name (name + kRetiredSuffix) first, so the rename frees nothing and a crash
  // leaves one readable version; that name is shredded after the rename.
  Status ReplaceZeroingOld(const std::string& dir, const std::string& name, std::span<const uint8_t> data);
  // Removes `path`: only the name when the file has others (nothing is freed), else shredded.
  Status DropName(const std::string& path, uint64_t* bytes, size_t* files);
  // Removes manifest.prev.json: shredded, unless it is a name of manifest.json itself (left by a
  // crash between its link and the publish), which must keep its bytes.
  Status DropPreviousManifest(const std::string& agent_dir, uint64_t* bytes, size_t* files);
  void AddRefs(const std::vector<BlockHash>& blocks);
  // Returns the blocks whose refcount dropped to zero.
  std::vector<BlockHash> DropRefs(const std::vector<BlockHash>& blocks);
  // Removes a block that failed verification (exclusive lock held).
  void DropCorruptBlock(const BlockHash& hash, const std::string& why);

  const std::string dir_, blocks_dir_, agents_dir_, prefixes_dir_;
  FileSystem& fs_;
  const StoreOptions options_;
  OpenReport open_report_;

  mutable std::shared_mutex mu_;
  std::map<std::string, AgentInfo> agents_;
  std::map<std::string, std::string> broken_;  // agent -> why its manifest is unreadable
  std::map<std::string, PrefixRecord> prefixes_;
  std::map<std::string, std::string> broken_prefixes_;  // prefix -> why its record is unreadable
  std::map<BlockHash, uint32_t> refs_;         // agents and prefixes referencing each block
  std::map<BlockHash, uint64_t> present_;      // stored block files and their sizes
  std::set<std::string> block_subdirs_;        // blocks/<hh> known to exist durably
  bool copies_previous_manifest_ = false;      // the file system has no hard links (seen once)
};

}  // namespace kvfs::store
