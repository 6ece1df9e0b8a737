#include "fs/audit_log.h"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>

namespace kvfs::fs {

namespace {

std::string IsoTime(int64_t time_ms) {
  std::time_t seconds = static_cast<std::time_t>(time_ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &utc);
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>(time_ms % 1000));
}

Status ErrnoStatus(const std::string& what) {
  int err = errno;
  std::string msg = what + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status(StatusCode::kNoSpace, msg);
  return IoError(msg);
}

}  // namespace

std::string FormatAuditLine(const AuditEvent& e) {
  nlohmann::json line = {{"time", IsoTime(e.time_ms)}, {"time_ms", e.time_ms}, {"uid", e.uid},
                         {"agent", e.agent},           {"action", e.action}};
  if (e.erased) {
    line["bytes_freed"] = e.erased->bytes_freed;
    line["blocks_freed"] = e.erased->blocks_freed;
    line["blocks_kept_shared"] = e.erased->blocks_kept_shared;
    line["files_removed"] = e.erased->files_removed;
  }
  if (e.bytes) line["bytes"] = *e.bytes;
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path) {
  if (path.empty()) return std::unique_ptr<AuditLog>(new AuditLog(-1));
  int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("cannot open the audit log " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = ErrnoStatus("cannot stat the audit log " + path);
    ::close(fd);
    return s;
  }
  auto log = std::unique_ptr<AuditLog>(new AuditLog(fd));
  log->size_ = static_cast<uint64_t>(st.st_size);
  return log;
}

AuditLog::~AuditLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status AuditLog::Append(const AuditEvent& event) {
  std::string line = FormatAuditLine(event);
  std::lock_guard lock(mu_);
  if (fd_ < 0) {
    memory_ += line;
    size_ += line.size();
    return Status::Ok();
  }
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status failed = ErrnoStatus("cannot append to the audit log");
      // No torn line: cut the file back to its last whole line, or, failing that, count the
      // bytes written, so that reads still reach the end of the file.
      if (done > 0 && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) size_ += done;
      return failed;
    }
    done += static_cast<size_t>(n);
  }
  size_ += line.size();
  if (::fsync(fd_) != 0) return ErrnoStatus("cannot fsync the audit log");
  return Status::Ok();
}

Result<std::string> AuditLog::Read(uint64_t offset, size_t size) const {
  std::lock_guard lock(mu_);
  if (offset >= size_) return std::string();
  size = static_cast<size_t>(std::min<uint64_t>(size, size_ - offset));
  if (fd_ < 0) return memory_.substr(offset, size);
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd_, out.data() + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("cannot read the audit log");
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

uint64_t AuditLog::Size() const {
  std::lock_guard lock(mu_);
  return size_;
}

}  // namespace kvfs::fs
