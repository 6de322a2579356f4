// Outcomes: how every request, sequence and stream of tailbatch ends.
//
// Every submitted request completes exactly once, with a value (Status::ok) or with one of
// the other statuses and a message saying why. Cancellation uses the standard stop-token
// machinery under tailbatch's names, so that one token cancels a queued request, a
// request's result, and a TokenStreamer alike.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/detail/throw.hpp>
#include <utility>

namespace tailbatch {

// How a request ended.
enum class Status : std::uint8_t {
  ok,                 // executed; the value is there
  rejected,           // never admitted or never executed: see RejectReason
  deadline_exceeded,  // its deadline passed before it could run; it was never executed late
  cancelled,          // the caller cancelled it: removed from the queue, or its result discarded
  failed,             // the model call (or step) threw; the message is the exception's what()
};

// Why a request was rejected. `none` for every status but Status::rejected.
enum class RejectReason : std::uint8_t {
  none,
  queue_full,     // the bounded queue was full: fail fast, retry after the hint
  overloaded,     // the concurrency limiter refused admission
  shutting_down,  // the component is stopping and takes no new work
  too_large,      // the request alone exceeds a budget (token budget, batch size) and can never run
  quota_exceeded,  // its tenant exceeded its own quota (max_queued, max_in_flight): retry after the hint
  shed,            // queued, then dropped by the queue policy (shed-oldest, CoDel) to keep latency
};

// The number of Status and RejectReason values: the sizes of the arrays indexed by them.
inline constexpr std::size_t status_count = 5;
inline constexpr std::size_t reject_reason_count = 7;

// A short, stable, lower-case name, as used in metrics labels ("deadline_exceeded").
// Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(Status s) noexcept {
  return detail::enum_name<status_count>(
      s, {"ok", "rejected", "deadline_exceeded", "cancelled", "failed"});
}

// A short, stable, lower-case name, as used in metrics labels ("queue_full").
// Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(RejectReason r) noexcept {
  return detail::enum_name<reject_reason_count>(
      r,
      {"none", "queue_full", "overloaded", "shutting_down", "too_large", "quota_exceeded", "shed"});
}

// The outcome counts every front door reports, the first fields of PipelineStats and
// ContinuousBatcherStats alike: requests submitted, and those completed by status and,
// when rejected, by reason. A plain value. Thread-safety: as for any value type.
struct OutcomeCounts {
  std::uint64_t submitted = 0;
  std::array<std::uint64_t, status_count> by_status{};                  // indexed by Status
  std::array<std::uint64_t, reject_reason_count> rejected_by_reason{};  // indexed by RejectReason

  // Requests completed with this status / rejected for this reason. Never blocks.
  [[nodiscard]] std::uint64_t count(Status s) const noexcept { return by_status[static_cast<std::size_t>(s)]; }
  [[nodiscard]] std::uint64_t count(RejectReason r) const noexcept {
    return rejected_by_reason[static_cast<std::size_t>(r)];
  }
  // Requests completed with any status. Never blocks.
  [[nodiscard]] std::uint64_t completed() const noexcept {
    return std::accumulate(by_status.begin(), by_status.end(), std::uint64_t{0});
  }
};

// Everything known about a request that did not end with a value.
struct Error {
  Status status = Status::failed;
  RejectReason reason = RejectReason::none;
  std::string message;
  // For Status::rejected with RejectReason::queue_full, overloaded, quota_exceeded or shed: how long the caller
  // should wait before retrying, derived from the current drain rate. Zero when unknown.
  std::chrono::nanoseconds retry_after{0};
};

// Thrown by Outcome::value() when there is no value. Carries the Error.
class BadOutcomeAccess : public std::runtime_error {
 public:
  explicit BadOutcomeAccess(Error e)
      : std::runtime_error(std::string("tailbatch: no value (") + std::string(to_string(e.status)) +
                           "): " + e.message),
        error_(std::move(e)) {}
  [[nodiscard]] const Error& error() const noexcept { return error_; }

 private:
  Error error_;
};

// The end of one request: a value, or an Error. Not thread-safe: owned by one caller.
template <class T>
class [[nodiscard]] Outcome {
 public:
  // An ok outcome holding value.
  Outcome(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // A non-ok outcome. error.status must not be Status::ok.
  Outcome(Error error) : error_(std::move(error)) {}  // NOLINT

  [[nodiscard]] bool ok() const noexcept { return value_.has_value(); }
  explicit operator bool() const noexcept { return ok(); }

  [[nodiscard]] Status status() const noexcept { return ok() ? Status::ok : error_.status; }
  // RejectReason::none unless status() is Status::rejected.
  [[nodiscard]] RejectReason reason() const noexcept { return ok() ? RejectReason::none : error_.reason; }
  // Empty for an ok outcome.
  [[nodiscard]] std::string_view message() const noexcept {
    return ok() ? std::string_view{} : std::string_view{error_.message};
  }
  [[nodiscard]] std::chrono::nanoseconds retry_after() const noexcept {
    return ok() ? std::chrono::nanoseconds{0} : error_.retry_after;
  }

  // The value. Throws BadOutcomeAccess (carrying the Error) if !ok().
  [[nodiscard]] T& value() & {
    check();
    return *value_;
  }
  [[nodiscard]] const T& value() const& {
    check();
    return *value_;
  }
  [[nodiscard]] T&& value() && {
    check();
    return std::move(*value_);
  }

  // The error. Precondition: !ok().
  [[nodiscard]] const Error& error() const& { return error_; }

 private:
  void check() const {
    if (!ok()) detail::throw_or_abort<BadOutcomeAccess>("Outcome::value() called on an outcome without a value", error_);
  }

  // The value, or (empty) the error. Two members rather than a std::variant: the same
  // meaning without <variant>'s compile cost; an ok outcome's Error is default-constructed
  // (an empty string, no allocation).
  std::optional<T> value_;
  Error error_{};
};

// Cancellation. A caller keeps a CancellationSource and passes source.get_token() with a
// request (or a TokenStreamer); source.request_stop() cancels. Components observe the
// token and may register a CancellationCallback to react at once. These are the standard
// library's stop-token types: no allocation for a default token, thread-safe, lock-free
// observation.
using CancellationSource = std::stop_source;
using CancellationToken = std::stop_token;
template <class Callback>
using CancellationCallback = std::stop_callback<Callback>;

}  // namespace tailbatch
