#include "fs/errno_map.h"

#include <cerrno>
#include <cstring>

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
  return name != nullptr ? name : "E" + std::to_string(err);
}

}  // namespace kvfs::fs
