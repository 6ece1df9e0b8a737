#include "fs/import_buffer.h"

#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/core/shred.h"
#include "engine/store/fs.h"

namespace kvfs::fs {

bool MemoryShare::Resize(uint64_t bytes, uint64_t limit) {
  if (!total_) return true;
  if (bytes <= held_) {
    total_->fetch_sub(held_ - bytes);
    held_ = bytes;
    return true;
  }
  const uint64_t more = bytes - held_;
  uint64_t now = total_->load();
  do {
    if (now + more > limit) return false;
  } while (!total_->compare_exchange_weak(now, now + more));
  held_ = bytes;
  return true;
}

namespace {

// Writes zeros over the bytes of [from, to) that hold data (holes are skipped: zeros there
// would only allocate blocks), going on past a failed range, then syncs. False if any range or
// the sync failed.
bool ZeroDataRanges(int fd, uint64_t from, uint64_t to) {
  static const std::vector<char> zeros(size_t{1} << 20, 0);
  bool ok = true;
  uint64_t pos = from;
  while (pos < to) {
    off_t data = ::lseek(fd, static_cast<off_t>(pos), SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;                 // no data past pos
    if (data < 0) data = static_cast<off_t>(pos);          // no SEEK_DATA here: all of it
    if (static_cast<uint64_t>(data) >= to) break;
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    const uint64_t end = hole < 0 ? to : std::min<uint64_t>(to, static_cast<uint64_t>(hole));
    for (uint64_t at = static_cast<uint64_t>(data); at < end; at += zeros.size()) {
      ok = store::PwriteAll(fd, zeros.data(), static_cast<size_t>(std::min<uint64_t>(zeros.size(), end - at)), at) == 0 && ok;
    }
    pos = end;
  }
  return ::fdatasync(fd) == 0 && ok;
}

}  // namespace

ImportBuffer::ImportBuffer(ImportBufferOptions options) : options_(std::move(options)) {
  memory_.Attach(options_.memory_total);
  disk_.Attach(options_.disk_total);
}

ImportBuffer::~ImportBuffer() { Clear(); }

Status ImportBuffer::NoMemory(uint64_t bytes) const {
  // Not sticky: the write can be tried again once other imports are done.
  return Status(StatusCode::kNoSpace,
                fmt::format("kv.safetensors files being written hold {} bytes of memory; with {} more this one "
                            "would pass the {} bytes allowed to imports at once",
                            options_.memory_total ? options_.memory_total->load() : 0, bytes - memory_.held(),
                            options_.memory_limit));
}

Status ImportBuffer::NoDisk(uint64_t bytes) const {
  return Status(StatusCode::kNoSpace,
                fmt::format("large kv.safetensors files being written hold {} bytes in {}; with {} more this one "
                            "would pass the {} bytes allowed to them at once",
                            options_.disk_total ? options_.disk_total->load() : 0, options_.spill_dir,
                            bytes - disk_.held(), options_.disk_limit));
}

Status ImportBuffer::Spill(uint64_t new_size) {
  const std::string& dir = options_.spill_dir;
  const uint64_t file_size = std::max<uint64_t>(new_size, data_.size());
  if (!disk_.Resize(file_size, options_.disk_limit)) return NoDisk(file_size);
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE on this file system: a named file, unlinked before anything is written.
    std::string path = store::JoinPath(dir, ".import-XXXXXX");
    fd = ::mkostemp(path.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(path.c_str());
  }
  if (fd < 0) {
    const int err = errno;
    disk_.Resize(0, options_.disk_limit);
    return store::ErrnoStatus(err, "create a file for a large import in", dir);
  }
  const auto give_up = [&](int err, std::string_view what) {
    // What reached the file is wiped; the bytes stay in memory, so nothing is lost.
    struct stat st {};
    const uint64_t landed = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : data_.size();
    if (!ZeroDataRanges(fd, 0, landed)) spdlog::warn("import buffer in {}: could not wipe a failed spill", dir);
    ::close(fd);
    disk_.Resize(0, options_.disk_limit);
    return store::ErrnoStatus(err, what, dir);
  };
  if (const int err = store::PwriteAll(fd, data_.data(), data_.size(), 0); err != 0) {
    return give_up(err, "write a large import into");
  }
  if (::ftruncate(fd, static_cast<off_t>(file_size)) != 0) return give_up(errno, "size a large import in");
  fd_ = fd;
  size_ = file_size;
  ShredString(data_);  // KV data: not left in freed memory either
  memory_.Resize(0, options_.memory_limit);
  return Status::Ok();
}

bool ImportBuffer::ShouldSpill(uint64_t new_size) {
  if (spilled() || options_.spill_dir.empty()) return false;
  if (new_size > options_.spill_bytes) return true;
  // Below the threshold too when the memory budget is full (what it takes stays held).
  return new_size > data_.size() && !memory_.Resize(new_size, options_.memory_limit);
}

Status ImportBuffer::Write(uint64_t offset, std::string_view bytes) {
  if (bytes.empty()) return Status::Ok();  // as write(2): a 0-byte write does not extend the file
  const uint64_t end = std::max<uint64_t>(size_, offset + bytes.size());
  if (ShouldSpill(end)) KVFS_RETURN_IF_ERROR(Spill(size_));
  if (spilled()) {
    if (end > disk_.held() && !disk_.Resize(end, options_.disk_limit)) return NoDisk(end);
    if (const int err = store::PwriteAll(fd_, bytes.data(), bytes.size(), offset); err != 0) {
      // Bytes past the old end that did land stay (they read as written); the size follows.
      struct stat st {};
      if (::fstat(fd_, &st) == 0) size_ = std::max<uint64_t>(size_, static_cast<uint64_t>(st.st_size));
      disk_.Resize(size_, options_.disk_limit);
      return store::ErrnoStatus(err, "write a large import into", options_.spill_dir);
    }
    size_ = end;
    return Status::Ok();
  }
  if (end > data_.size()) {
    if (!memory_.Resize(end, options_.memory_limit)) return NoMemory(end);
    GrowShredding(data_, static_cast<size_t>(end));  // (the buffer it outgrows held KV data)
    data_.resize(static_cast<size_t>(end));
  }
  data_.replace(static_cast<size_t>(offset), bytes.size(), bytes);
  size_ = end;
  return Status::Ok();
}

Status ImportBuffer::Resize(uint64_t bytes) {
  if (ShouldSpill(bytes)) KVFS_RETURN_IF_ERROR(Spill(bytes));
  if (spilled()) {
    if (bytes > disk_.held() && !disk_.Resize(bytes, options_.disk_limit)) return NoDisk(bytes);
    // The cut bytes are KV data too: zeros over them before the file gives their blocks back.
    if (bytes < size_ && !ZeroDataRanges(fd_, bytes, size_)) {
      spdlog::warn("import buffer in {}: could not overwrite {} cut bytes with zeros", options_.spill_dir,
                   size_ - bytes);
    }
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      // The cut range may already read as zeros: the file keeps its size but not its content.
      if (bytes < size_) poisoned_ = true;
      disk_.Resize(size_, options_.disk_limit);
      return store::ErrnoStatus(err, "size a large import in", options_.spill_dir);
    }
    size_ = bytes;
    disk_.Resize(bytes, options_.disk_limit);
    return Status::Ok();
  }
  if (bytes > data_.size() && !memory_.Resize(bytes, options_.memory_limit)) return NoMemory(bytes);
  if (bytes < data_.size()) std::fill(data_.begin() + static_cast<std::ptrdiff_t>(bytes), data_.end(), '\0');
  GrowShredding(data_, static_cast<size_t>(bytes));
  data_.resize(static_cast<size_t>(bytes));
  if (bytes < memory_.held()) memory_.Resize(bytes, options_.memory_limit);
  size_ = bytes;
  return Status::Ok();
}

Result<std::string> ImportBuffer::Read(uint64_t offset, size_t size) const {
  if (offset >= size_) return std::string();
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size, size_ - offset));
  if (!spilled()) return data_.substr(static_cast<size_t>(offset), n);
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, out.data() + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return store::ErrnoStatus(errno, "read a large import in", options_.spill_dir);
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

Status ImportBuffer::Consume(const std::function<Status(std::string_view)>& f) {
  Status result = Status::Ok();
  if (poisoned_) {
    result = IoError("a truncation of this kv.safetensors failed part way: write the file again");
  } else if (!spilled()) {
    result = f(data_);
  } else if (size_ == 0) {
    result = f(std::string_view());
  } else if (!memory_.Resize(size_, options_.memory_limit)) {
    // The import copies the cache into memory: it waits for the budget like a write does.
    result = Status(StatusCode::kNoSpace,
                    fmt::format("importing this kv.safetensors needs its {} bytes in memory, and the imports "
                                "being written hold {} of the {} bytes allowed to them",
                                size_, options_.memory_total ? options_.memory_total->load() : 0,
                                options_.memory_limit));
  } else {
    void* map = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
    if (map == MAP_FAILED) {
      result = store::ErrnoStatus(errno, "map a large import in", options_.spill_dir);
    } else {
      result = f(std::string_view(static_cast<const char*>(map), static_cast<size_t>(size_)));
      ::munmap(map, static_cast<size_t>(size_));
    }
  }
  Clear();
  return result;
}

void ImportBuffer::Wipe() {
  if (fd_ < 0) return;
  if (!ZeroDataRanges(fd_, 0, size_)) {
    spdlog::warn("import buffer in {}: could not overwrite all of its {} bytes with zeros before freeing them",
                 options_.spill_dir, size_);
  }
  ::close(fd_);
  fd_ = -1;
  disk_.Resize(0, options_.disk_limit);
}

void ImportBuffer::Clear() {
  Wipe();
  poisoned_ = false;
  ShredString(data_);
  memory_.Resize(0, options_.memory_limit);
  size_ = 0;
}

}  // namespace kvfs::fs
