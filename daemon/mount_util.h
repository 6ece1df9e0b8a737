// Mount-point housekeeping: a kvfsd killed with -9 leaves its mount behind ("Transport endpoint
// is not connected"); the next start detaches it with `fusermount3 -u -z` before mounting.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace kvfs::daemon {

// The absolute, lexically normalised form of `path` (no symlink resolution: a stale FUSE mount
// cannot be resolved).
std::string AbsolutePath(const std::string& path);
// The filesystem type mounted at exactly `dir` according to /proc/self/mountinfo, if any.
std::optional<std::string> MountedTypeAt(const std::string& dir);
// Mount points of every kvfs filesystem visible to this process, in mount order.
std::vector<std::string> KvfsMountpoints();
// Detaches a stale kvfs mount at `dir` (its kvfsd was killed) and creates `dir` if missing. A
// kvfs mount that still answers (a running kvfsd's), or another kind of filesystem, is an error.
Status PrepareMountpoint(const std::string& dir);

}  // namespace kvfs::daemon
