#include "daemon/store_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <spdlog/fmt/fmt.h>

namespace kvfs::daemon {

namespace {
constexpr const char* kLockName = "kvfsd.lock";
}  // namespace

StoreLock& StoreLock::operator=(StoreLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

StoreLock::~StoreLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

Result<StoreLock> StoreLock::Acquire(const std::string& store_dir) {
  const std::string path = store_dir + "/" + kLockName;
  StoreLock lock;
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock.fd_ < 0) return IoError("cannot open " + path + ": " + std::strerror(errno));
  // A daemon that was just stopped may still be closing its store (an unmount returns before
  // the engine is down): give it a few seconds.
  int tries = 50;
  while (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return IoError("cannot lock " + path + ": " + std::strerror(errno));
    if (--tries > 0) {
      ::usleep(100 * 1000);
      continue;
    }
    char pid[32] = {};
    const ssize_t n = ::pread(lock.fd_, pid, sizeof pid - 1, 0);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : std::string();
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return Unavailable(fmt::format("the store {} is in use by another kvfsd{}: stop it first, or give this one "
                                   "another --store",
                                   store_dir, holder.empty() ? std::string() : fmt::format(" (pid {})", holder)));
  }
  return lock;
}

void StoreLock::RecordPid() const {
  if (fd_ < 0) return;
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0) return;
  (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

}  // namespace kvfs::daemon
