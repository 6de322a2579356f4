// Admission: the first stage of a request's path, where it is let in or turned away.
//
// A Pipeline asks its admission policy for a ticket before it queues a request, and hands
// the ticket back, exactly once, when the request completes (with its status and its
// end-to-end latency, which adaptive limits learn from). AdmitAll lets everything in and
// costs nothing; ConcurrencyLimiter (concurrency_limiter.hpp) satisfies the same concept.
#pragma once

#include <chrono>
#include <concepts>
#include <optional>
#include <tailbatch/outcome.hpp>

namespace tailbatch {

// What a Pipeline needs of its admission stage.
//   try_admit(): never blocks; a ticket, or nullopt to reject (Status::rejected,
//                RejectReason::overloaded).
//   release(ticket, status, latency): called exactly once per admitted ticket, when the
//                request completes; latency is its end-to-end time.
template <class A>
concept AdmissionPolicy = requires(A& a, typename A::Ticket&& ticket, Status status,
                                   std::chrono::nanoseconds latency) {
  typename A::Ticket;
  { a.try_admit() }
  noexcept->std::same_as<std::optional<typename A::Ticket>>;
  { a.release(std::move(ticket), status, latency) }
  noexcept;
};

// Admits every request. Empty: a Pipeline that uses it pays nothing for admission.
// Thread-safe.
struct AdmitAll {
  struct Ticket {};
  [[nodiscard]] std::optional<Ticket> try_admit() noexcept { return Ticket{}; }
  void release(Ticket&&, Status, std::chrono::nanoseconds) noexcept {}
};

static_assert(AdmissionPolicy<AdmitAll>);

}  // namespace tailbatch
