#include "fs/audit_log.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

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
    if (e.erased->blocks_kept_unattributed > 0) line["blocks_kept_unattributed"] = e.erased->blocks_kept_unattributed;
  }
  if (e.bytes) line["bytes"] = *e.bytes;
  if (e.completed_at_start) line["completed_at_start"] = true;
  if (e.owner_uid) line["owner_uid"] = *e.owner_uid;
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path, SyncFunction sync) {
  if (path.empty()) return std::unique_ptr<AuditLog>(new AuditLog(-1, ""));
  int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("cannot open the audit log " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = ErrnoStatus("cannot stat the audit log " + path);
    ::close(fd);
    return s;
  }
  auto log = std::unique_ptr<AuditLog>(new AuditLog(fd, path + ".intents"));
  log->size_ = static_cast<uint64_t>(st.st_size);
  log->sync_ = sync;
  // A log cut inside its last line (a crash while it was appended elsewhere, a copy): the next
  // line starts a line of its own, not the end of that one.
  char last = '\n';
  if (st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n') {
    spdlog::warn("audit log {}: its last line is incomplete; the next starts on a line of its own", path);
    std::lock_guard lock(log->mu_);
    const uint64_t before = log->size_;
    // (A full disk: with the next line. A failed fsync left it written: not again.)
    if (Status s = log->WriteLines("\n"); !s.ok() && log->size_ == before) log->pending_ = "\n";
  }
  KVFS_RETURN_IF_ERROR(log->LoadIntents());
  return log;
}

Status AuditLog::LoadIntents() {
  KVFS_RETURN_IF_ERROR(fs_.MakeDir(intents_dir_));
  KVFS_ASSIGN_OR_RETURN(std::vector<store::DirEntry> entries, fs_.ListDir(intents_dir_));
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const store::DirEntry& e : entries) {
    const std::string path = intents_dir_ + "/" + e.name;
    std::optional<AuditIntent> intent;
    if (!e.is_dir && e.name.ends_with(".json")) {
      Result<std::vector<uint8_t>> bytes = fs_.ReadFile(path);
      const nlohmann::json j =
          bytes.ok() ? nlohmann::json::parse(bytes->begin(), bytes->end(), nullptr, /*allow_exceptions=*/false)
                     : nlohmann::json();
      if (j.is_object() && j.value("agent", nlohmann::json()).is_string() && j.value("action", nlohmann::json()).is_string() &&
          j.value("uid", nlohmann::json()).is_number_unsigned()) {
        AuditEvent event;
        event.agent = j["agent"].get<std::string>();
        event.action = j["action"].get<std::string>();
        event.uid = j["uid"].get<uint32_t>();
        // When the erasure began (intents before this field: the time in the name).
        event.time_ms = j.value("time_ms", nlohmann::json()).is_number_integer() ? j["time_ms"].get<int64_t>() : 0;
        if (event.time_ms <= 0) event.time_ms = std::strtoll(e.name.c_str(), nullptr, 10);
        if (j.value("owner_uid", nlohmann::json()).is_number_unsigned()) event.owner_uid = j["owner_uid"].get<uint32_t>();
        intent = AuditIntent{e.name.substr(0, e.name.size() - 5), std::move(event)};
      }
    }
    if (intent) {
      left_intents_.push_back(std::move(*intent));
    } else if (!e.is_dir) {  // a temporary file, or one a crash cut short: no erasure had started
      spdlog::warn("audit log: dropping {}, which is no complete intent", path);
      ZeroAndUnlink(path);
    }
  }
  return Status::Ok();
}

Result<std::string> AuditLog::Intend(const AuditEvent& event) {
  std::lock_guard lock(mu_);
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::string id = fmt::format("{}-{:06d}", now, next_intent_++);
  AuditEvent begun = event;
  if (begun.time_ms == 0) begun.time_ms = now;
  if (intents_dir_.empty()) {
    memory_intents_[id] = begun;
    return id;
  }
  // Written whole and synced before its name appears: a crash leaves a whole intent or a
  // temporary file.
  const std::string text = FormatAuditLine(begun);
  KVFS_RETURN_IF_ERROR(store::WriteFileAtomic(
      fs_, intents_dir_, id + ".json", std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
  return id;
}

bool AuditLog::HasLineOf(const AuditIntent& intent) const {
  // (A line completed at start carries the time the erasure began, at most the intent's.)
  int64_t since = std::strtoll(intent.id.c_str(), nullptr, 10);
  if (intent.event.time_ms > 0) since = std::min(since, intent.event.time_ms);
  // Lines written after the intent are the last ones before the crash: the log's tail holds them.
  constexpr uint64_t kTail = uint64_t{1} << 20;
  const uint64_t size = Size();
  Result<std::string> tail = Read(size > kTail ? size - kTail : 0, kTail);
  if (!tail.ok()) return false;
  size_t begin = 0;
  while (begin < tail->size()) {
    size_t end = tail->find('\n', begin);
    if (end == std::string::npos) end = tail->size();
    const nlohmann::json j = nlohmann::json::parse(tail->begin() + static_cast<std::ptrdiff_t>(begin),
                                                   tail->begin() + static_cast<std::ptrdiff_t>(end), nullptr, false);
    if (j.is_object() && j.value("agent", "") == intent.event.agent && j.value("action", "") == intent.event.action &&
        j.value("uid", uint32_t{0}) == intent.event.uid && j.value("time_ms", int64_t{0}) >= since)
      return true;
    begin = end + 1;
  }
  return false;
}

Status AuditLog::Complete(const std::string& intent_id, const AuditEvent& event) {
  Status appended = Append(event);
  // A line that could not be written keeps its intent: the next start writes it.
  if (appended.ok()) Drop(intent_id);
  return appended;
}

void AuditLog::Drop(const std::string& intent_id) {
  if (intent_id.empty()) return;
  std::lock_guard lock(mu_);
  if (intents_dir_.empty()) {
    memory_intents_.erase(intent_id);
    return;
  }
  // Durably gone, or a restart would log the erasure a second time.
  if (ZeroAndUnlink(intents_dir_ + "/" + intent_id + ".json")) (void)fs_.SyncDir(intents_dir_);
}

bool AuditLog::ZeroAndUnlink(const std::string& path) {
  // An intent names an agent and its owner: overwritten before it goes, as every file an
  // erasure removes. (A zeroed intent left by a crash before the unlink is no intent: dropped.)
  if (fs_.OverwriteWithZeros(path).ok()) (void)fs_.SyncFile(path);
  return fs_.Unlink(path).ok();
}

AuditLog::~AuditLog() {
  std::lock_guard lock(mu_);
  if (fd_ < 0) return;
  if (!pending_.empty()) {
    if (Status s = WriteLines(pending_); !s.ok())
      spdlog::error("audit log: {} lines were never written: {}",
                    std::count(pending_.begin(), pending_.end(), '\n'), s.message());
  }
  ::close(fd_);
}

Status AuditLog::Append(const AuditEvent& event) { return AppendLine(FormatAuditLine(event), /*keep=*/true); }

Status AuditLog::AppendBefore(const AuditEvent& event) { return AppendLine(FormatAuditLine(event), /*keep=*/false); }

Status AuditLog::AppendLine(const std::string& line, bool keep) {
  std::lock_guard lock(mu_);
  if (fd_ < 0) {
    memory_ += line;
    size_ += line.size();
    return Status::Ok();
  }
  // After those that could not be written before, in order.
  const bool kept = keep && pending_.size() + line.size() <= kMaxPendingBytes;
  if (kept) pending_ += line;
  const std::string& text = kept ? pending_ : pending_ + line;
  const uint64_t before = size_;
  Status written = WriteLines(text);
  const bool in_file = size_ == before + text.size();
  if (!written.ok() && in_file && !keep) {
    // Only the fsync failed. The caller refuses the operation this line announces, and a retry
    // appends it again: cut it off, so that the log never holds a line for an export that was
    // refused, nor two for one. The lines before it (kept from earlier failures) stay written.
    // Where the write ended is the file's end (O_APPEND), which is size_ unless something else
    // cut or extended the file; the line must be there, byte for byte, to be cut.
    struct stat st {};
    std::string tail(line.size(), '\0');
    const bool found = ::fstat(fd_, &st) == 0 && static_cast<uint64_t>(st.st_size) >= line.size() &&
                       ::pread(fd_, tail.data(), tail.size(), st.st_size - static_cast<off_t>(line.size())) ==
                           static_cast<ssize_t>(line.size()) &&
                       tail == line;
    const uint64_t without = found ? static_cast<uint64_t>(st.st_size) - line.size() : 0;
    if (found && ::ftruncate(fd_, static_cast<off_t>(without)) == 0) {
      size_ = without;
    } else {
      spdlog::error("audit log: a line whose fsync failed could not be cut off again ({}): a retry adds another",
                    found ? std::strerror(errno) : "it is not at the end of the file");
    }
  }
  // In the file (even when only the fsync failed: written again, they would be there twice).
  if (in_file) pending_.clear();
  else if (kept) written = written.WithContext("kept in memory until it can be written");
  return written;
}

Status AuditLog::WriteLines(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
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
  size_ += text.size();
  if (sync_(fd_) != 0) return ErrnoStatus("cannot fsync the audit log");
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
