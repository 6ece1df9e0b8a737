// The one mapping from Status to errno: the FUSE replies use it, and status.json uses it to
// name a failed turn's error (e.g. "ENOSPC").
#pragma once

#include <string>

#include "engine/core/status.h"

namespace kvfs::fs {

int ErrnoFromStatus(const Status& status);  // 0 for ok
std::string ErrnoName(int err);              // "ENOSPC"

}  // namespace kvfs::fs
