// Status and StatusOr: how every Granary function reports failure.
//
// No exceptions cross a module, RPC or FUSE boundary; functions that can fail return a Status (or a
// StatusOr<T>) and callers must look at it ([[nodiscard]]). Codes are the canonical gRPC codes, so a
// Status maps one-to-one onto a grpc::Status (rpc/rpc.h) and onto one errno (fuse/errno.h).
//
// Retry logic branches on flags, never on message text:
//   IsRetryable()       UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED: the same call may succeed later.
//   IsDataLoss()        DATA_LOSS: stored bytes failed their checksum; refetch, never serve.
//   IsNotFound()        NOT_FOUND.
//   IsVersionChanged()  the file changed in the under-storage since it was listed: a
//                       FAILED_PRECONDITION with Reason::kVersionChanged (VersionChangedError),
//                       which granary-fuse turns into ESTALE and a dropped file cache. Any other
//                       FAILED_PRECONDITION ("unpin it first", "not a holder") is not that.
//   IsUnderStorageDown()  UNAVAILABLE with Reason::kUnderStorage: the server that answered is up,
//                       the under-storage behind it failed (after its own retries). Callers that
//                       wait for an unreachable server to come back do not wait for this.
// A Reason, like RocksDB's sub-codes, refines a code; it travels with the status over gRPC and the
// worker's local socket (rpc/rpc.h).
// Messages name what was wrong and, where useful, what to do; they never carry credentials.
//
// Thread-safety: values; safe to copy between threads.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace granary {

enum class Code : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// The canonical upper-snake name of a code, e.g. "NOT_FOUND".
std::string_view CodeName(Code code);

// What a code does not say by itself. Values are part of the wire format: never renumber.
enum class Reason : int {
  kNone = 0,
  kVersionChanged = 1,  // with FAILED_PRECONDITION: the file changed in the under-storage
  kUnderStorage = 2,    // with UNAVAILABLE: the under-storage failed, not the server that answered
  // With FAILED_PRECONDITION, for the write calls (granary-fuse's errno funnel gives the errno named):
  kNotEmpty = 3,      // a directory to remove or replace has entries (ENOTEMPTY)
  kReadOnly = 4,      // the dataset is not mounted writable (EROFS)
  kNotSupported = 5,  // a write the under-storage or Granary cannot make whole (EOPNOTSUPP)
};
// A reason as a wire number; one this build does not know reads as kNone.
inline Reason ReasonFromWire(int r) {
  return r >= 1 && r <= 5 ? static_cast<Reason>(r) : Reason::kNone;
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message, Reason reason = Reason::kNone)
      : code_(code), reason_(code == Code::kOk ? Reason::kNone : reason), message_(std::move(message)) {}

  static Status OK() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  Reason reason() const { return reason_; }
  const std::string& message() const { return message_; }

  bool IsRetryable() const {
    return code_ == Code::kUnavailable || code_ == Code::kDeadlineExceeded || code_ == Code::kAborted;
  }
  bool IsDataLoss() const { return code_ == Code::kDataLoss; }
  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsVersionChanged() const { return code_ == Code::kFailedPrecondition && reason_ == Reason::kVersionChanged; }
  bool IsUnderStorageDown() const { return code_ == Code::kUnavailable && reason_ == Reason::kUnderStorage; }

  // "NOT_FOUND: message" (or "OK").
  std::string ToString() const;

  // The same status with "context: " put before the message.
  Status WithContext(std::string_view context) const;

  // Explicitly discards a status whose failure the caller has decided not to act on.
  void IgnoreError() const {}

  bool operator==(const Status& o) const { return code_ == o.code_ && reason_ == o.reason_ && message_ == o.message_; }

 private:
  Code code_ = Code::kOk;
  Reason reason_ = Reason::kNone;
  std::string message_;
};

inline Status CancelledError(std::string m) { return Status(Code::kCancelled, std::move(m)); }
inline Status InvalidArgumentError(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
inline Status NotFoundError(std::string m) { return Status(Code::kNotFound, std::move(m)); }
inline Status AlreadyExistsError(std::string m) { return Status(Code::kAlreadyExists, std::move(m)); }
inline Status PermissionDeniedError(std::string m) { return Status(Code::kPermissionDenied, std::move(m)); }
inline Status ResourceExhaustedError(std::string m) { return Status(Code::kResourceExhausted, std::move(m)); }
inline Status FailedPreconditionError(std::string m) { return Status(Code::kFailedPrecondition, std::move(m)); }
inline Status AbortedError(std::string m) { return Status(Code::kAborted, std::move(m)); }
inline Status OutOfRangeError(std::string m) { return Status(Code::kOutOfRange, std::move(m)); }
inline Status UnimplementedError(std::string m) { return Status(Code::kUnimplemented, std::move(m)); }
inline Status InternalError(std::string m) { return Status(Code::kInternal, std::move(m)); }
inline Status UnavailableError(std::string m) { return Status(Code::kUnavailable, std::move(m)); }
inline Status DataLossError(std::string m) { return Status(Code::kDataLoss, std::move(m)); }
inline Status DeadlineExceededError(std::string m) { return Status(Code::kDeadlineExceeded, std::move(m)); }
inline Status UnauthenticatedError(std::string m) { return Status(Code::kUnauthenticated, std::move(m)); }
// The write calls' refusals (Reason above): FAILED_PRECONDITION with a reason.
inline Status NotEmptyError(std::string m) { return Status(Code::kFailedPrecondition, std::move(m), Reason::kNotEmpty); }
inline Status ReadOnlyError(std::string m) { return Status(Code::kFailedPrecondition, std::move(m), Reason::kReadOnly); }
inline Status NotSupportedError(std::string m) {
  return Status(Code::kFailedPrecondition, std::move(m), Reason::kNotSupported);
}
// The file changed in the under-storage since it was listed (see IsVersionChanged).
inline Status VersionChangedError(std::string m) {
  return Status(Code::kFailedPrecondition, std::move(m), Reason::kVersionChanged);
}

// A Status for a failed system call: the errno is mapped to the closest code
// (ENOENT -> NOT_FOUND, EACCES -> PERMISSION_DENIED, ...) and its text appended.
Status ErrnoError(int err, std::string_view what);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& s) : v_(s) { assert(!s.ok() && "StatusOr built from an OK status"); }  // NOLINT
  StatusOr(Status&& s) : v_(std::move(s)) { assert(!std::get<Status>(v_).ok()); }           // NOLINT
  StatusOr(const T& value) : v_(value) {}                                                     // NOLINT
  StatusOr(T&& value) : v_(std::move(value)) {}                                               // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }

  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace granary

#define GRANARY_CONCAT_INNER_(a, b) a##b
#define GRANARY_CONCAT_(a, b) GRANARY_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::granary::Status _granary_st = (expr);      \
    if (!_granary_st.ok()) return _granary_st;   \
  } while (0)

// `lhs = value of expr` when expr (a StatusOr) is OK; otherwise returns its Status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(GRANARY_CONCAT_(_granary_sor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
