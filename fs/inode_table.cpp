#include "fs/inode_table.h"

#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

namespace kvfs::fs {

std::string_view AgentFileName(AgentFile file) {
  switch (file) {
    case AgentFile::kPrompt: return "prompt";
    case AgentFile::kResponse: return "response";
    case AgentFile::kTranscript: return "transcript";
    case AgentFile::kSystem: return "system";
    case AgentFile::kConfig: return "config.json";
    case AgentFile::kStatus: return "status.json";
    case AgentFile::kKvCache: return "kv.safetensors";
  }
  return "?";
}

std::string_view SpecialFileName(SpecialFile file) {
  switch (file) {
    case SpecialFile::kStatusText: return ".status";
    case SpecialFile::kStatusJson: return ".status.json";
    case SpecialFile::kMetrics: return ".metrics";
    case SpecialFile::kAuditLog: return ".audit.log";
    case SpecialFile::kModelJson: return ".model.json";
  }
  return "?";
}

void InvariantFailed(std::string_view what) {
  std::fprintf(stderr, "kvfs: broken invariant: %.*s\n", static_cast<int>(what.size()), what.data());
  spdlog::critical("kvfs: broken invariant: {}", what);
  spdlog::shutdown();
  std::abort();
}

InodeTable::InodeTable() {
  // The fixed nodes are never removed; their lookup counts are still tracked and checked.
  nodes_[kRootInode].kind = NodeKind::kRoot;
  for (SpecialFile f : kSpecialFiles) {
    Node& n = nodes_[SpecialFileInode(f)];
    n.kind = NodeKind::kSpecialFile;
    n.special = f;
  }
  nodes_[kPrefixDirInode].kind = NodeKind::kPrefixDir;
}

InodeId InodeTable::AddAgent(std::shared_ptr<AgentRecord> agent) {
  InodeId dir = next_;
  next_ += 8;  // the directory and its seven files
  Node& d = nodes_[dir];
  d.kind = NodeKind::kAgentDir;
  d.agent = agent;
  for (AgentFile f : kAgentFiles) {
    Node& n = nodes_[AgentFileInode(dir, f)];
    n.kind = NodeKind::kAgentFile;
    n.agent_file = f;
    n.agent = agent;
  }
  return dir;
}

InodeId InodeTable::AddPrefix(const std::string& name) {
  InodeId ino = next_++;
  Node& n = nodes_[ino];
  n.kind = NodeKind::kPrefixFile;
  n.prefix = name;
  return ino;
}

Node* InodeTable::Find(InodeId ino) {
  auto it = nodes_.find(ino);
  return it == nodes_.end() ? nullptr : &it->second;
}

void InodeTable::Ref(InodeId ino) {
  Node* n = Find(ino);
  if (n == nullptr) InvariantFailed("reference to an unknown inode " + std::to_string(ino));
  ++n->lookups;
}

void InodeTable::Forget(InodeId ino, uint64_t count) {
  Node* n = Find(ino);
  if (n == nullptr) InvariantFailed("forget of an unknown inode " + std::to_string(ino));
  if (count > n->lookups) {
    InvariantFailed("forget of " + std::to_string(count) + " references to inode " + std::to_string(ino) +
                    " that has " + std::to_string(n->lookups));
  }
  n->lookups -= count;
  DropIfUnused(ino);
}

void InodeTable::RemoveAgent(InodeId dir) {
  Node* d = Find(dir);
  if (d == nullptr || d->kind != NodeKind::kAgentDir) InvariantFailed("RemoveAgent of a non-agent inode");
  d->removed = true;
  for (AgentFile f : kAgentFiles) Find(AgentFileInode(dir, f))->removed = true;
  DropIfUnused(dir);
  for (AgentFile f : kAgentFiles) DropIfUnused(AgentFileInode(dir, f));
}

void InodeTable::RemovePrefix(InodeId ino) {
  Node* n = Find(ino);
  if (n == nullptr || n->kind != NodeKind::kPrefixFile) InvariantFailed("RemovePrefix of a non-prefix inode");
  n->removed = true;
  DropIfUnused(ino);
}

void InodeTable::DropIfUnused(InodeId ino) {
  auto it = nodes_.find(ino);
  if (it != nodes_.end() && it->second.removed && it->second.lookups == 0) nodes_.erase(it);
}

}  // namespace kvfs::fs
