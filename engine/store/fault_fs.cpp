#include "engine/store/fault_fs.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>

namespace kvfs::store {
namespace {

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) parts.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  return parts;
}

Status Crashed(const std::string& path) { return IoError("simulated crash: the process is dead (" + path + ")"); }

}  // namespace

FaultInjectingFileSystem::FaultInjectingFileSystem() {
  inodes_[kRoot].is_dir = true;
}

void FaultInjectingFileSystem::FailAt(uint64_t op_index, StatusCode code, uint32_t sticky_ops) {
  std::lock_guard lock(mu_);
  fault_ = FaultType::kFail;
  fault_at_ = op_index;
  fault_code_ = code;
  sticky_ops_ = sticky_ops;
  sticky_active_ = false;
  fired_ = false;
}

void FaultInjectingFileSystem::CrashAt(uint64_t op_index) {
  std::lock_guard lock(mu_);
  fault_ = FaultType::kCrash;
  fault_at_ = op_index;
  fired_ = false;
}

void FaultInjectingFileSystem::ClearFaults() {
  std::lock_guard lock(mu_);
  fault_ = FaultType::kNone;
  sticky_active_ = false;
  sticky_ops_ = 0;
}

void FaultInjectingFileSystem::ResetOpCount() {
  std::lock_guard lock(mu_);
  op_count_ = 0;
  log_.clear();
}

uint64_t FaultInjectingFileSystem::op_count() const {
  std::lock_guard lock(mu_);
  return op_count_;
}

bool FaultInjectingFileSystem::crashed() const {
  std::lock_guard lock(mu_);
  return crashed_;
}

bool FaultInjectingFileSystem::fault_fired() const {
  std::lock_guard lock(mu_);
  return fired_;
}

std::vector<std::string> FaultInjectingFileSystem::op_log() const {
  std::lock_guard lock(mu_);
  return log_;
}

void FaultInjectingFileSystem::Reboot(CrashMode mode) {
  std::lock_guard lock(mu_);
  for (auto& [ino, node] : inodes_) {
    switch (mode) {
      case CrashMode::kProcessKill:
        node.durable_data = node.data;
        node.durable_entries = node.entries;
        break;
      case CrashMode::kPowerLoss:
        node.data = node.durable_data;
        node.entries = node.durable_entries;
        break;
      case CrashMode::kMetadataJournaled:
        node.data = node.durable_data;
        node.durable_entries = node.entries;
        break;
    }
  }
  crashed_ = false;
  fault_ = FaultType::kNone;
  sticky_active_ = false;
  sticky_ops_ = 0;
}

FaultInjectingFileSystem::Gate FaultInjectingFileSystem::Admit(OpKind kind, const std::string& what,
                                                               Status* failure) {
  if (crashed_) {
    *failure = Crashed(what);
    return Gate::kFail;
  }
  const uint64_t index = op_count_++;
  log_.push_back(what);
  if (sticky_active_ && (sticky_ops_ & kind) != 0) {
    *failure = Status(fault_code_, "injected fault (sticky) at op " + std::to_string(index) + ": " + what);
    return Gate::kFail;
  }
  // A sticky fault models a condition (a full disk) that only some kinds of operation hit: it
  // fires at the first operation of those kinds at or after its index.
  const bool due = sticky_ops_ != 0 && fault_ == FaultType::kFail ? index >= fault_at_ && (sticky_ops_ & kind) != 0
                                                                   : index == fault_at_;
  if (fault_ != FaultType::kNone && !fired_ && due) {
    fired_ = true;
    if (fault_ == FaultType::kCrash) {
      crashed_ = true;
      *failure = Crashed(what);
      return Gate::kCrash;
    }
    sticky_active_ = sticky_ops_ != 0;
    *failure = Status(fault_code_, "injected fault at op " + std::to_string(index) + ": " + what);
    return Gate::kFail;
  }
  return Gate::kProceed;
}

Status FaultInjectingFileSystem::CheckAlive(const std::string& path) const {
  return crashed_ ? Crashed(path) : Status::Ok();
}

Result<FaultInjectingFileSystem::Resolved> FaultInjectingFileSystem::Resolve(const std::string& path) const {
  std::vector<std::string> parts = SplitPath(path);
  if (parts.empty()) return InvalidArgument("cannot resolve the root as an entry: " + path);
  uint64_t dir = kRoot;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const Inode& node = inodes_.at(dir);
    auto it = node.entries.find(parts[i]);
    if (it == node.entries.end()) return NotFound("no such directory: " + path);
    if (!inodes_.at(it->second).is_dir) return IoError("not a directory: " + path);
    dir = it->second;
  }
  Resolved r;
  r.parent = dir;
  r.name = parts.back();
  const Inode& parent = inodes_.at(dir);
  auto it = parent.entries.find(r.name);
  r.ino = it == parent.entries.end() ? 0 : it->second;
  return r;
}

Result<uint64_t> FaultInjectingFileSystem::Lookup(const std::string& path) const {
  if (SplitPath(path).empty()) return kRoot;
  KVFS_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
  if (r.ino == 0) return NotFound("no such file or directory: " + path);
  return r.ino;
}

size_t FaultInjectingFileSystem::NamesOf(uint64_t ino) const {
  size_t n = 0;
  for (const auto& [dir_ino, node] : inodes_)
    for (const auto& [name, child] : node.entries) n += child == ino ? 1 : 0;
  return n;
}

void FaultInjectingFileSystem::NoteRelease(uint64_t ino, const std::string& what) {
  const Inode& node = inodes_.at(ino);
  auto nonzero = [](const std::vector<uint8_t>& v) { return std::any_of(v.begin(), v.end(), [](uint8_t b) { return b; }); };
  if (!node.is_dir && (nonzero(node.data) || nonzero(node.durable_data))) released_.push_back(what);
}

std::vector<std::string> FaultInjectingFileSystem::released_unzeroed() const {
  std::lock_guard lock(mu_);
  return released_;
}

uint64_t FaultInjectingFileSystem::NewInode(bool is_dir) {
  uint64_t ino = next_ino_++;
  inodes_[ino].is_dir = is_dir;
  return ino;
}

Status FaultInjectingFileSystem::WriteFile(const std::string& path, std::span<const uint8_t> data) {
  std::lock_guard lock(mu_);
  Status failure;
  Gate gate = Admit(kOpWrite, "write " + path, &failure);
  if (gate == Gate::kCrash) return failure;
  if (gate == Gate::kFail && crashed_) return failure;
  KVFS_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
  if (r.ino != 0 && inodes_.at(r.ino).is_dir) return IoError("is a directory: " + path);
  if (r.ino == 0) {
    r.ino = NewInode(false);
    inodes_.at(r.parent).entries[r.name] = r.ino;
  } else {
    NoteRelease(r.ino, "truncate: " + path);
  }
  Inode& node = inodes_.at(r.ino);
  if (gate == Gate::kFail) {  // a write that ran out of space part-way
    node.data.assign(data.begin(), data.begin() + static_cast<ptrdiff_t>(data.size() / 2));
    return failure;
  }
  if (capacity_ > 0) {
    node.data.clear();
    const uint64_t used = UsedBytes();
    const uint64_t room = capacity_ > used ? capacity_ - used : 0;
    if (data.size() > room) {
      node.data.assign(data.begin(), data.begin() + static_cast<ptrdiff_t>(room));
      return Status(StatusCode::kNoSpace, "no space left for " + std::to_string(data.size()) + " bytes: " + path);
    }
  }
  node.data.assign(data.begin(), data.end());
  return Status::Ok();
}

uint64_t FaultInjectingFileSystem::UsedBytes() const {
  uint64_t used = 0;
  for (const auto& [ino, node] : inodes_)
    if (!node.is_dir && !node.data.empty() && NamesOf(ino) > 0) used += node.data.size();
  return used;
}

Status FaultInjectingFileSystem::OverwriteWithZeros(const std::string& path) {
  std::lock_guard lock(mu_);
  Status failure;
  if (Admit(kOpOverwrite, "overwrite " + path, &failure) != Gate::kProceed) return failure;
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  Inode& node = inodes_.at(ino);
  if (node.is_dir) return IoError("is a directory: " + path);
  std::fill(node.data.begin(), node.data.end(), uint8_t{0});
  return Status::Ok();
}

Status FaultInjectingFileSystem::SyncFile(const std::string& path) {
  std::lock_guard lock(mu_);
  Status failure;
  if (Admit(kOpSyncFile, "fsync " + path, &failure) != Gate::kProceed) return failure;
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  Inode& node = inodes_.at(ino);
  node.durable_data = node.data;
  return Status::Ok();
}

Status FaultInjectingFileSystem::Rename(const std::string& from, const std::string& to) {
  std::lock_guard lock(mu_);
  Status failure;
  if (Admit(kOpRename, "rename " + from + " -> " + to, &failure) != Gate::kProceed) return failure;
  KVFS_ASSIGN_OR_RETURN(Resolved src, Resolve(from));
  if (src.ino == 0) return NotFound("rename: no such file: " + from);
  KVFS_ASSIGN_OR_RETURN(Resolved dst, Resolve(to));
  if (dst.ino == src.ino) return Status::Ok();
  if (dst.ino != 0 && inodes_.at(dst.ino).is_dir) return IoError("rename over a directory: " + to);
  if (dst.ino != 0 && inodes_.at(src.ino).is_dir) return IoError("rename a directory over a file: " + to);
  inodes_.at(src.parent).entries.erase(src.name);
  inodes_.at(dst.parent).entries[dst.name] = src.ino;
  if (dst.ino != 0 && NamesOf(dst.ino) == 0) NoteRelease(dst.ino, "rename over: " + to);
  return Status::Ok();
}

Status FaultInjectingFileSystem::Unlink(const std::string& path) {
  std::lock_guard lock(mu_);
  Status failure;
  if (Admit(kOpUnlink, "unlink " + path, &failure) != Gate::kProceed) return failure;
  KVFS_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
  if (r.ino == 0) return NotFound("unlink: no such file: " + path);
  if (inodes_.at(r.ino).is_dir) return IoError("unlink: is a directory: " + path);
  inodes_.at(r.parent).entries.erase(r.name);
  if (NamesOf(r.ino) == 0) NoteRelease(r.ino, "unlink: " + path);
  return Status::Ok();
}

Status FaultInjectingFileSystem::Link(const std::string& from, const std::string& to) {
  std::lock_guard lock(mu_);
  Status failure;
  if (Admit(kOpLink, "link " + from + " -> " + to, &failure) != Gate::kProceed) return failure;
  if (!hard_links_) return Status(StatusCode::kUnsupported, "link " + from + " -> " + to + ": no hard links here");
  KVFS_ASSIGN_OR_RETURN(Resolved src, Resolve(from));
  if (src.ino == 0) return NotFound("link: no such file: " + from);
  if (inodes_.at(src.ino).is_dir) return IoError("link: is a directory: " + from);
  KVFS_ASSIGN_OR_RETURN(Resolved dst, Resolve(to));
  if (dst.ino != 0) return Status(StatusCode::kAlreadyExists, "link: exists: " + to);
  inodes_.at(dst.parent).entries[dst.name] = src.ino;
  return Status::Ok();
}

Status FaultInjectingFileSystem::MakeDir(const std::string& path) {
  std::lock_guard lock(mu_);
  Status failure;
  if (Admit(kOpMkdir, "mkdir " + path, &failure) != Gate::kProceed) return failure;
  KVFS_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
  if (r.ino != 0) {
    if (inodes_.at(r.ino).is_dir) return Status::Ok();
    return IoError("mkdir: exists and is not a directory: " + path);
  }
  uint64_t ino = NewInode(true);
  inodes_.at(r.parent).entries[r.name] = ino;
  return Status::Ok();
}

Status FaultInjectingFileSystem::RemoveDir(const std::string& path) {
  std::lock_guard lock(mu_);
  Status failure;
  if (Admit(kOpRmdir, "rmdir " + path, &failure) != Gate::kProceed) return failure;
  KVFS_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
  if (r.ino == 0) return NotFound("rmdir: no such directory: " + path);
  const Inode& node = inodes_.at(r.ino);
  if (!node.is_dir) return IoError("rmdir: not a directory: " + path);
  if (!node.entries.empty()) return IoError("rmdir: directory not empty: " + path);
  inodes_.at(r.parent).entries.erase(r.name);
  return Status::Ok();
}

Status FaultInjectingFileSystem::SyncDir(const std::string& path) {
  std::lock_guard lock(mu_);
  Status failure;
  if (Admit(kOpSyncDir, "fsync dir " + path, &failure) != Gate::kProceed) return failure;
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  Inode& node = inodes_.at(ino);
  if (!node.is_dir) return IoError("fsync dir: not a directory: " + path);
  node.durable_entries = node.entries;
  return Status::Ok();
}

void FaultInjectingFileSystem::FailReads(const std::string& part, uint32_t times) {
  std::lock_guard lock(mu_);
  failing_reads_part_ = part;
  failing_reads_left_ = times;
}

void FaultInjectingFileSystem::SlowReads(const std::string& part, std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  slow_reads_part_ = part;
  slow_reads_delay_ = delay;
}

uint64_t FaultInjectingFileSystem::SlowReadsBegun() const {
  std::lock_guard lock(mu_);
  return slow_reads_begun_;
}

void FaultInjectingFileSystem::WaitIfSlow(const std::string& path) {
  std::chrono::milliseconds delay{0};
  {
    std::lock_guard lock(mu_);
    if (slow_reads_delay_.count() == 0 || path.find(slow_reads_part_) == std::string::npos) return;
    ++slow_reads_begun_;
    delay = slow_reads_delay_;
  }
  std::this_thread::sleep_for(delay);
}

Status FaultInjectingFileSystem::CheckReadable(const std::string& path) {
  KVFS_RETURN_IF_ERROR(CheckAlive(path));
  if (failing_reads_left_ > 0 && path.find(failing_reads_part_) != std::string::npos) {
    --failing_reads_left_;
    return IoError("injected read failure: " + path);
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> FaultInjectingFileSystem::ReadFile(const std::string& path) {
  WaitIfSlow(path);
  std::lock_guard lock(mu_);
  KVFS_RETURN_IF_ERROR(CheckReadable(path));
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  const Inode& node = inodes_.at(ino);
  if (node.is_dir) return IoError("is a directory: " + path);
  return node.data;
}

Status FaultInjectingFileSystem::ReadAt(const std::string& path, uint64_t offset, std::span<uint8_t> dst) {
  WaitIfSlow(path);
  std::lock_guard lock(mu_);
  KVFS_RETURN_IF_ERROR(CheckReadable(path));
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  const Inode& node = inodes_.at(ino);
  if (node.is_dir) return IoError("is a directory: " + path);
  if (offset > node.data.size() || dst.size() > node.data.size() - offset)
    return Corrupt(path + ": file too short (truncated): wanted " + std::to_string(dst.size()) + " bytes at offset " +
                   std::to_string(offset) + ", file has " + std::to_string(node.data.size()));
  if (!dst.empty()) std::memcpy(dst.data(), node.data.data() + offset, dst.size());
  return Status::Ok();
}

Result<std::vector<DirEntry>> FaultInjectingFileSystem::ListDir(const std::string& path) {
  std::lock_guard lock(mu_);
  KVFS_RETURN_IF_ERROR(CheckAlive(path));
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  const Inode& node = inodes_.at(ino);
  if (!node.is_dir) return IoError("not a directory: " + path);
  std::vector<DirEntry> out;
  for (const auto& [name, child] : node.entries) out.push_back({name, inodes_.at(child).is_dir});
  return out;  // std::map keeps names sorted
}

Result<uint64_t> FaultInjectingFileSystem::FileSize(const std::string& path) {
  std::lock_guard lock(mu_);
  KVFS_RETURN_IF_ERROR(CheckAlive(path));
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  return static_cast<uint64_t>(inodes_.at(ino).data.size());
}

Result<bool> FaultInjectingFileSystem::IsDir(const std::string& path) {
  std::lock_guard lock(mu_);
  KVFS_RETURN_IF_ERROR(CheckAlive(path));
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  return inodes_.at(ino).is_dir;
}

Result<uint64_t> FaultInjectingFileSystem::FreeBytes(const std::string& path) {
  std::lock_guard lock(mu_);
  KVFS_RETURN_IF_ERROR(CheckAlive(path));
  if (capacity_ > 0) {
    const uint64_t used = UsedBytes();
    return capacity_ > used ? capacity_ - used : 0;
  }
  return free_bytes_;
}

Result<bool> FaultInjectingFileSystem::SameFile(const std::string& a, const std::string& b) {
  std::lock_guard lock(mu_);
  KVFS_RETURN_IF_ERROR(CheckAlive(a));
  KVFS_ASSIGN_OR_RETURN(uint64_t ia, Lookup(a));
  KVFS_ASSIGN_OR_RETURN(uint64_t ib, Lookup(b));
  return ia == ib;
}

Result<uint64_t> FaultInjectingFileSystem::LinkCount(const std::string& path) {
  std::lock_guard lock(mu_);
  KVFS_RETURN_IF_ERROR(CheckAlive(path));
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  return static_cast<uint64_t>(NamesOf(ino));
}

void FaultInjectingFileSystem::SetFreeBytes(uint64_t bytes) {
  std::lock_guard lock(mu_);
  free_bytes_ = bytes;
}

void FaultInjectingFileSystem::SetCapacity(uint64_t bytes) {
  std::lock_guard lock(mu_);
  capacity_ = bytes;
}

void FaultInjectingFileSystem::SetHardLinks(bool supported) {
  std::lock_guard lock(mu_);
  hard_links_ = supported;
}

std::vector<std::string> FaultInjectingFileSystem::ListFilesRecursive(const std::string& dir) {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  auto root = Lookup(dir);
  if (!root.ok()) return out;
  std::function<void(uint64_t, const std::string&)> walk = [&](uint64_t ino, const std::string& prefix) {
    for (const auto& [name, child] : inodes_.at(ino).entries) {
      std::string p = JoinPath(prefix, name);
      if (inodes_.at(child).is_dir) walk(child, p);
      else out.push_back(p);
    }
  };
  walk(*root, dir);
  std::sort(out.begin(), out.end());
  return out;
}

Status FaultInjectingFileSystem::FlipByte(const std::string& path, uint64_t offset, uint8_t mask) {
  std::lock_guard lock(mu_);
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  Inode& node = inodes_.at(ino);
  if (offset >= node.data.size()) return OutOfRange("flip past the end of " + path);
  node.data[offset] ^= mask;
  if (offset < node.durable_data.size()) node.durable_data[offset] ^= mask;
  return Status::Ok();
}

Status FaultInjectingFileSystem::Truncate(const std::string& path, uint64_t length) {
  std::lock_guard lock(mu_);
  KVFS_ASSIGN_OR_RETURN(uint64_t ino, Lookup(path));
  Inode& node = inodes_.at(ino);
  node.data.resize(std::min<uint64_t>(length, node.data.size()));
  node.durable_data.resize(std::min<uint64_t>(length, node.durable_data.size()));
  return Status::Ok();
}

}  // namespace kvfs::store
