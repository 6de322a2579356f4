// What every front door (Pipeline::submit, ContinuousBatcher::submit, ResultCache::submit)
// makes of a request's SubmitOptions, in one place, so that the three agree:
//
//   arrival   SubmitOptions::arrival when set, no earlier than the clock's origin and no
//             later than the submit; else the submit time.
//   deadline  the latest start: SubmitOptions::deadline, and at most arrival + timeout
//             when timeout > 0 (counted from the arrival, not from the submit).
//   timeout   = 0: no budget; < 0: the budget was spent upstream, the request expires at
//             once (Status::deadline_exceeded), whatever the deadline says.
//   level     the priority's index (0 = high); an out-of-range priority fails at once.
//   cancel    a token already stopped cancels at once.
//
// A request whose deadline is already behind the submit time expires at once (a deadline
// equal to now still allows a start now). The checks run in this order: cancelled, budget
// spent, deadline passed, invalid priority; the first that applies is the answer.
// Plain functions of a value and a time: never allocate, never throw. Thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/detail/time.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/submit_options.hpp>

namespace tailbatch::detail {

// Why a request is turned away by intake alone.
enum class IntakeRefusal : std::uint8_t {
  none,
  cancelled,
  budget_spent,
  deadline_passed,
  invalid_priority
};

// What intake made of one request's options.
struct Intake {
  BatchTime arrival{};
  BatchTime deadline = BatchTime::max();
  std::size_t level = static_cast<std::size_t>(Priority::normal);
  IntakeRefusal refusal = IntakeRefusal::none;

  [[nodiscard]] bool accepted() const noexcept { return refusal == IntakeRefusal::none; }

  // The status the request completes with when refused (ok when accepted).
  [[nodiscard]] Status status() const noexcept {
    switch (refusal) {
      case IntakeRefusal::none:
        return Status::ok;
      case IntakeRefusal::cancelled:
        return Status::cancelled;
      case IntakeRefusal::budget_spent:
      case IntakeRefusal::deadline_passed:
        return Status::deadline_exceeded;
      case IntakeRefusal::invalid_priority:
        return Status::failed;
    }
    return Status::failed;
  }

  // The message the request completes with when refused; the same at every front door.
  [[nodiscard]] std::string_view message() const noexcept {
    return enum_name(refusal,
                     {"", "tailbatch: cancelled",
                      "tailbatch: the request's time budget was already spent (negative timeout)",
                      "tailbatch: the deadline passed before the request was queued",
                      "tailbatch: invalid priority"},
                     {});
  }

  // The refusal as an outcome's error.
  [[nodiscard]] Error error() const {
    return Error{status(), RejectReason::none, std::string(message()), {}};
  }
};

// The arrival: the caller's, clamped to [the clock's origin, now], else now. With
// `now_is_exact` false (now is a stand-in, e.g. a cycle-counter stamp converted later) the
// caller's arrival is not clamped to it.
[[nodiscard]] constexpr BatchTime intake_arrival(const SubmitOptions& o, BatchTime now,
                                                 bool now_is_exact = true) noexcept {
  if (o.arrival == BatchTime::min()) return now;
  const BatchTime a = std::max(o.arrival, BatchTime{});
  return now_is_exact ? std::min(a, now) : a;
}

// The latest start for a request that arrived at `arrival` (see the file comment). A
// negative timeout leaves the deadline as it is: intake() refuses such a request.
[[nodiscard]] constexpr BatchTime intake_deadline(const SubmitOptions& o,
                                                  BatchTime arrival) noexcept {
  BatchTime d = o.deadline;
  if (o.timeout > std::chrono::nanoseconds::zero())
    d = std::min(d, saturating_add(arrival, o.timeout));
  return d;
}

// Turns a request's options into its arrival, deadline and priority level, or a refusal,
// at submit time `now` (see the file comment).
[[nodiscard]] inline Intake intake(const SubmitOptions& o, BatchTime now,
                                   bool now_is_exact = true) noexcept {
  Intake in;
  in.arrival = intake_arrival(o, now, now_is_exact);
  in.deadline = intake_deadline(o, in.arrival);
  in.level = static_cast<std::size_t>(o.priority);
  if (o.cancel.stop_requested()) {
    in.refusal = IntakeRefusal::cancelled;
  } else if (o.timeout < std::chrono::nanoseconds::zero()) {
    in.refusal = IntakeRefusal::budget_spent;
  } else if (now_is_exact && now > in.deadline) {
    in.refusal = IntakeRefusal::deadline_passed;
  } else if (in.level >= priority_levels) {
    in.refusal = IntakeRefusal::invalid_priority;
  }
  return in;
}

}  // namespace tailbatch::detail
