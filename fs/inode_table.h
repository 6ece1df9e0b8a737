// The inode table: every node the filesystem shows (root, the special root files, .prefixes/
// and its files, agent directories and their files) with the kernel's lookup count of each.
// A node whose object is gone (an erased agent, a removed prefix) stays until the kernel
// forgets it, so an inode number is never reused while the kernel may still send it.
// Not thread-safe: AgentStore guards it with its mutex.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kvfs::fs {

using InodeId = uint64_t;
inline constexpr InodeId kRootInode = 1;

enum class NodeKind : uint8_t { kRoot, kSpecialFile, kPrefixDir, kPrefixFile, kAgentDir, kAgentFile };

// The files of an agent directory, in listing order.
enum class AgentFile : uint8_t { kPrompt, kResponse, kTranscript, kSystem, kConfig, kStatus, kKvCache };
inline constexpr std::array<AgentFile, 7> kAgentFiles = {AgentFile::kPrompt, AgentFile::kResponse,
                                                         AgentFile::kTranscript, AgentFile::kSystem,
                                                         AgentFile::kConfig, AgentFile::kStatus, AgentFile::kKvCache};
std::string_view AgentFileName(AgentFile file);

// The special files of the mount root, in listing order.
enum class SpecialFile : uint8_t { kStatusText, kStatusJson, kMetrics, kAuditLog, kModelJson };
inline constexpr std::array<SpecialFile, 5> kSpecialFiles = {SpecialFile::kStatusText, SpecialFile::kStatusJson,
                                                             SpecialFile::kMetrics, SpecialFile::kAuditLog,
                                                             SpecialFile::kModelJson};
std::string_view SpecialFileName(SpecialFile file);
inline constexpr std::string_view kPrefixDirName = ".prefixes";
inline constexpr InodeId kPrefixDirInode = 7;

struct AgentRecord;  // agent_record.h

struct Node {
  NodeKind kind = NodeKind::kRoot;
  AgentFile agent_file = AgentFile::kPrompt;
  SpecialFile special = SpecialFile::kStatusText;
  std::shared_ptr<AgentRecord> agent;  // agent directories and files
  std::string prefix;                  // prefix files
  uint64_t lookups = 0;
  bool removed = false;  // its agent or prefix is gone; dropped when lookups reach 0
};

class InodeTable {
 public:
  InodeTable();

  // Adds an agent's directory and its files; returns the directory's inode.
  InodeId AddAgent(std::shared_ptr<AgentRecord> agent);
  InodeId AddPrefix(const std::string& name);
  static InodeId AgentFileInode(InodeId dir, AgentFile file) { return dir + 1 + static_cast<InodeId>(file); }
  static InodeId SpecialFileInode(SpecialFile file) { return 2 + static_cast<InodeId>(file); }

  Node* Find(InodeId ino);
  // One more reference held by the kernel (a lookup, mkdir, create or readdirplus entry).
  void Ref(InodeId ino);
  // The kernel dropped `n` references. A count going negative is a broken invariant: abort.
  void Forget(InodeId ino, uint64_t n);
  // Marks an agent (directory and files) or a prefix file gone; nodes nobody references go now.
  void RemoveAgent(InodeId dir);
  void RemovePrefix(InodeId ino);
  size_t size() const { return nodes_.size(); }

 private:
  void DropIfUnused(InodeId ino);

  std::unordered_map<InodeId, Node> nodes_;
  InodeId next_ = 16;  // below: root, special files, .prefixes
};

// Logs the broken invariant and aborts (like libfuse's passthrough_hp does for lookup counts).
[[noreturn]] void InvariantFailed(std::string_view what);

}  // namespace kvfs::fs
