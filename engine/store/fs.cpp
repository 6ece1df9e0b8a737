#include "engine/store/fs.h"

#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>

namespace kvfs::store {

Status ErrnoStatus(int err, std::string_view op, const std::string& path) {
  std::string msg = std::string(op) + " " + path + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status(StatusCode::kNoSpace, std::move(msg));
  if (err == ENOENT) return NotFound(std::move(msg));
  return IoError(std::move(msg));
}

std::string JoinPath(std::string_view a, std::string_view b) {
  std::string out(a);
  while (!out.empty() && out.back() == '/' && out.size() > 1) out.pop_back();
  if (!out.empty() && out.back() != '/') out += '/';
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  out += b;
  return out;
}

namespace {

// Closes the descriptor on every path out of a function.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Close explicitly so that a deferred write error (NFS, quota) is reported.
  int Close() { int fd = fd_; fd_ = -1; return ::close(fd); }

 private:
  int fd_;
};

int OpenRetry(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do { fd = ::open(path, flags | O_CLOEXEC, mode); } while (fd < 0 && errno == EINTR);
  return fd;
}

Status WriteAll(int fd, const uint8_t* p, size_t n, uint64_t offset, const std::string& path) {
  if (const int err = PwriteAll(fd, p, n, offset); err != 0) return ErrnoStatus(err, "write", path);
  return Status::Ok();
}

Status FsyncPath(const std::string& path, int flags, std::string_view op) {
  Fd fd(OpenRetry(path.c_str(), flags));
  if (fd.get() < 0) return ErrnoStatus(errno, op, path);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, op, path);
  return Status::Ok();
}

}  // namespace

int PwriteAll(int fd, const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;  // no progress: treat as full
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return 0;
}

Status PosixFileSystem::WriteFile(const std::string& path, std::span<const uint8_t> data) {
  Fd fd(OpenRetry(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600));
  if (fd.get() < 0) return ErrnoStatus(errno, "create", path);
  KVFS_RETURN_IF_ERROR(WriteAll(fd.get(), data.data(), data.size(), 0, path));
  if (fd.Close() != 0) return ErrnoStatus(errno, "close", path);
  return Status::Ok();
}

Status PosixFileSystem::OverwriteWithZeros(const std::string& path) {
  Fd fd(OpenRetry(path.c_str(), O_WRONLY | O_NOFOLLOW));  // zeros over a link's target: never
  if (fd.get() < 0) return ErrnoStatus(errno, "open for overwrite", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  static constexpr size_t kChunk = 1 << 16;
  const std::vector<uint8_t> zeros(kChunk, 0);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  for (uint64_t off = 0; off < size; off += kChunk) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, size - off));
    KVFS_RETURN_IF_ERROR(WriteAll(fd.get(), zeros.data(), n, off, path));
  }
  if (fd.Close() != 0) return ErrnoStatus(errno, "close", path);
  return Status::Ok();
}

Status PosixFileSystem::SyncFile(const std::string& path) {
  return FsyncPath(path, O_WRONLY, "fsync");
}

Status PosixFileSystem::Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, "rename " + from + " ->", to);
  return Status::Ok();
}

Status PosixFileSystem::Unlink(const std::string& path) {
  if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, "unlink", path);
  return Status::Ok();
}

Status PosixFileSystem::Link(const std::string& from, const std::string& to) {
  if (::link(from.c_str(), to.c_str()) == 0) return Status::Ok();
  const int err = errno;
  if (err == EPERM || err == EOPNOTSUPP || err == EMLINK || err == ENOSYS)  // vfat, FUSE and network file systems
    return Status(StatusCode::kUnsupported, "link " + from + " -> " + to + ": " + std::strerror(err));
  return ErrnoStatus(err, "link " + from + " ->", to);
}

Status PosixFileSystem::MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0) return Status::Ok();
  int err = errno;
  struct stat st {};
  if (err == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::Ok();
  return ErrnoStatus(err, "mkdir", path);
}

Status PosixFileSystem::RemoveDir(const std::string& path) {
  if (::rmdir(path.c_str()) != 0) return ErrnoStatus(errno, "rmdir", path);
  return Status::Ok();
}

Status PosixFileSystem::SyncDir(const std::string& path) {
  return FsyncPath(path, O_RDONLY | O_DIRECTORY, "fsync directory");
}

Result<std::vector<uint8_t>> PosixFileSystem::ReadFile(const std::string& path) {
  Fd fd(OpenRetry(path.c_str(), O_RDONLY));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) return IoError("not a regular file: " + path);
  std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::pread(fd.get(), out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (r == 0) break;  // shrank while reading
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

Status PosixFileSystem::ReadAt(const std::string& path, uint64_t offset, std::span<uint8_t> dst) {
  Fd fd(OpenRetry(path.c_str(), O_RDONLY));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", path);
  size_t got = 0;
  while (got < dst.size()) {
    ssize_t r = ::pread(fd.get(), dst.data() + got, dst.size() - got, static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (r == 0) return Corrupt(path + ": file too short (truncated): wanted " + std::to_string(dst.size()) +
                               " bytes at offset " + std::to_string(offset) + ", got " + std::to_string(got));
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

Result<std::vector<DirEntry>> PosixFileSystem::ListDir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "opendir", path);
  std::vector<DirEntry> out;
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    bool is_dir = e->d_type == DT_DIR;
    bool is_symlink = e->d_type == DT_LNK;
    if (e->d_type == DT_UNKNOWN) {  // some file systems do not fill d_type
      struct stat st {};
      const bool known = ::lstat(JoinPath(path, name).c_str(), &st) == 0;
      is_dir = known && S_ISDIR(st.st_mode);
      is_symlink = known && S_ISLNK(st.st_mode);
    }
    out.push_back({std::move(name), is_dir, is_symlink});
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoStatus(err, "readdir", path);
  std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return out;
}

Result<uint64_t> PosixFileSystem::FileSize(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  return static_cast<uint64_t>(st.st_size);
}

Result<bool> PosixFileSystem::IsDir(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  return S_ISDIR(st.st_mode);
}

Result<uint64_t> PosixFileSystem::FreeBytes(const std::string& path) {
  struct statvfs sv {};
  if (::statvfs(path.c_str(), &sv) != 0) return ErrnoStatus(errno, "statvfs", path);
  return static_cast<uint64_t>(sv.f_bavail) * static_cast<uint64_t>(sv.f_frsize);
}

Result<bool> PosixFileSystem::SameFile(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::lstat(a.c_str(), &sa) != 0) return ErrnoStatus(errno, "stat", a);
  if (::lstat(b.c_str(), &sb) != 0) return ErrnoStatus(errno, "stat", b);
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

Result<uint64_t> PosixFileSystem::LinkCount(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  return static_cast<uint64_t>(st.st_nlink);
}

Status ZeroFileBeforeReplacing(FileSystem& fs, const std::string& path) {
  if (Result<uint64_t> size = fs.FileSize(path); !size.ok()) {
    return size.status().code() == StatusCode::kNotFound ? Status::Ok() : size.status();  // none: nothing to zero
  }
  KVFS_RETURN_IF_ERROR(fs.OverwriteWithZeros(path));
  return fs.SyncFile(path);
}

Status WriteFileAtomic(FileSystem& fs, const std::string& dir, const std::string& name,
                       std::span<const uint8_t> data, bool zero_replaced) {
  const std::string final_path = JoinPath(dir, name);
  const std::string tmp_path = final_path + std::string(kTempSuffix);
  Status st = fs.WriteFile(tmp_path, data);
  if (st.ok()) st = fs.SyncFile(tmp_path);
  if (st.ok() && zero_replaced) st = ZeroFileBeforeReplacing(fs, final_path);
  if (st.ok()) st = fs.Rename(tmp_path, final_path);
  if (!st.ok()) {
    // Best effort; Open shreds what is left. The bytes written so far may be KV data, which an
    // erasure must not find on the disk later: zeros first, as for every file the store drops.
    if (fs.OverwriteWithZeros(tmp_path).ok()) (void)fs.SyncFile(tmp_path);
    (void)fs.Unlink(tmp_path);
    return st;
  }
  // After the rename the new file is in place; only the directory fsync makes it durable. If
  // that fails we cannot undo the rename, so the caller must treat the outcome as unknown.
  return fs.SyncDir(dir);
}

}  // namespace kvfs::store
