// Status and Result<T>: errors are values. A Status carries a code (mapped to errno and exit
// codes in exactly one place each) and a human-readable message that says what and where.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kvfs {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad input from the user (EINVAL)
  kNotFound,          // ENOENT
  kCorrupt,           // malformed or truncated data (EINVAL / EIO)
  kUnsupported,       // valid but not supported by this build (EOPNOTSUPP)
  kOutOfRange,        // e.g. prompt longer than the context
  kIoError,           // EIO
  kNoSpace,           // ENOSPC
  kResourceExhausted, // EAGAIN / ENOMEM
  kUnavailable,       // a device cannot run this now (device memory full, device lost): the
                      // caller may run it elsewhere (EIO)
  kInternal,          // a broken invariant
  // Filesystem-facing conditions (fs/ maps each to its own errno).
  kAlreadyExists,     // EEXIST
  kPermissionDenied,  // EACCES: e.g. writing a read-only file
  kNotPermitted,      // EPERM: an operation the filesystem never allows (creating unknown files)
  kIllegalSequence,   // EILSEQ: text that is not valid UTF-8
  kTooLarge,          // EFBIG: input over a size limit
  kCancelled,         // EINTR: a blocking call was interrupted
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("while loading X: ") to the message, keeping the code.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status NotPermitted(std::string m) { return {StatusCode::kNotPermitted, std::move(m)}; }
inline Status IllegalSequence(std::string m) { return {StatusCode::kIllegalSequence, std::move(m)}; }
inline Status TooLarge(std::string m) { return {StatusCode::kTooLarge, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

// Result<T> holds either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}                 // NOLINT(implicit)
  Result(Status status) : status_(std::move(status)) {          // NOLINT(implicit)
    assert(!status_.ok() && "Result constructed from an ok Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace kvfs

// Propagation helpers (RETURN_IF_ERROR, ASSIGN_OR_RETURN): the only macros in the code base.
#define KVFS_RETURN_IF_ERROR(expr)          \
  do {                                      \
    ::kvfs::Status kvfs_status_ = (expr);   \
    if (!kvfs_status_.ok()) return kvfs_status_; \
  } while (0)

#define KVFS_CONCAT_INNER(a, b) a##b
#define KVFS_CONCAT(a, b) KVFS_CONCAT_INNER(a, b)
#define KVFS_ASSIGN_OR_RETURN(lhs, expr) \
  KVFS_ASSIGN_OR_RETURN_IMPL(KVFS_CONCAT(kvfs_result_, __LINE__), lhs, expr)
#define KVFS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
