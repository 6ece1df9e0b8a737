// One daemon per store: two kvfsd on one store would each commit turns over the other's
// manifests (a committed turn lost, silently). The lock is flock(2) on STORE/kvfsd.lock, so it
// goes with the process however it ends (kill -9 included); the file holds the holder's pid for
// the message a second daemon prints.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace kvfs::daemon {

class StoreLock {
 public:
  StoreLock() = default;
  StoreLock(StoreLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  StoreLock& operator=(StoreLock&& other) noexcept;
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;
  ~StoreLock();

  // Takes the lock of `store_dir` (which must exist), waiting up to 5 s for a daemon that is
  // stopping: kUnavailable naming the holder's pid when another process keeps it. Taken before
  // the daemon forks, the lock stays with the child (the open file is shared); call RecordPid()
  // there.
  static Result<StoreLock> Acquire(const std::string& store_dir);
  // Writes this process's pid into the lock file.
  void RecordPid() const;

 private:
  int fd_ = -1;
};

}  // namespace kvfs::daemon
