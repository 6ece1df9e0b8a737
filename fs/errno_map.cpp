#include "fs/errno_map.h"

#include <cerrno>
#include <cstring>

#include <spdlog/fmt/fmt.h>

namespace kvfs::fs {

int ErrnoFromStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return 0;
    case StatusCode::kInvalidArgument: return EINVAL;
    case StatusCode::kNotFound: return ENOENT;
    case StatusCode::kCorrupt: return EINVAL;  // a malformed file from the user (an import)
    case StatusCode::kUnsupported: return EOPNOTSUPP;
    case StatusCode::kOutOfRange: return EINVAL;
    case StatusCode::kIoError: return EIO;
    case StatusCode::kNoSpace: return ENOSPC;
    case StatusCode::kResourceExhausted: return EAGAIN;
    case StatusCode::kUnavailable: return EIO;
    case StatusCode::kInternal: return EIO;
    case StatusCode::kAlreadyExists: return EEXIST;
    case StatusCode::kPermissionDenied: return EACCES;
    case StatusCode::kNotPermitted: return EPERM;
    case StatusCode::kIllegalSequence: return EILSEQ;
    case StatusCode::kTooLarge: return EFBIG;
    case StatusCode::kCancelled: return EINTR;
  }
  return EIO;
}

std::string ErrnoName(int err) {
  const char* name = strerrorname_np(err);
  if (name != nullptr) return name;
  return fmt::format("E{}", err);  // (not "E" + to_string: GCC 12 warns falsely, bug 105651)
}

}  // namespace kvfs::fs
