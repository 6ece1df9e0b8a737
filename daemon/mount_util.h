// Mount-point housekeeping: a kvfsd killed with -9 leaves its mount behind ("Transport endpoint
// is not connected"); the next start detaches it with `fusermount3 -u -z` before mounting.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace kvfs::daemon {

// The absolute, lexically normalised form of `path` (no symlink resolution: a stale FUSE mount
// cannot be resolved).
std::string AbsolutePath(const std::string& path);
// Whether `path` is `dir` or lies inside it, by their absolute forms and, where the existing part
// of each resolves, by their real paths (a symlink into the mount point counts). `dir` itself is
// never resolved: a stale FUSE mount there cannot be.
bool PathIsWithin(const std::string& path, const std::string& dir);
// The filesystem type mounted at exactly `dir` according to /proc/self/mountinfo, if any.
std::optional<std::string> MountedTypeAt(const std::string& dir);
// Mount points of every kvfs filesystem visible to this process, in mount order.
std::vector<std::string> KvfsMountpoints();
// Before anything is made (the store): InvalidArgument when `dir` has a filesystem mounted that
// answers (a running kvfsd's, or another kind), as PrepareMountpoint would find.
Status CheckMountpointFree(const std::string& dir);
// Detaches a stale kvfs mount at `dir` (its kvfsd was killed) and creates `dir` if missing
// (then true). A kvfs mount that still answers (a running kvfsd's), or another kind of
// filesystem, is an error.
Result<bool> PrepareMountpoint(const std::string& dir);

// Removes, when it goes, a mount point that PrepareMountpoint created, so that a daemon leaves
// the tree as it found it (as `mount` helpers that create their directory do). rmdir only: a
// directory that someone filled meanwhile stays.
class CreatedMountpoint {
 public:
  CreatedMountpoint(std::string dir, bool created) : dir_(std::move(dir)), created_(created) {}
  ~CreatedMountpoint();
  CreatedMountpoint(const CreatedMountpoint&) = delete;
  CreatedMountpoint& operator=(const CreatedMountpoint&) = delete;

 private:
  std::string dir_;
  bool created_;
};

}  // namespace kvfs::daemon
