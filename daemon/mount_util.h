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
// Detaches a kvfs mount (stale or not) at `dir` and creates `dir` if missing. Another kind of
// filesystem mounted there is an error.
Status PrepareMountpoint(const std::string& dir);

}  // namespace kvfs::daemon
