// The per-request options both front doors take: Pipeline::submit and
// ContinuousBatcher::submit read the same SubmitOptions (a latest start, a timeout, an
// arrival time, a priority, a tenant and a cancellation token), with the same meaning.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/outcome.hpp>

namespace tailbatch {

// The time every front door and batch policy reads: std::chrono::steady_clock time
// points, which both SteadyClock and ManualClock produce.
using BatchTime = std::chrono::steady_clock::time_point;
using BatchDuration = std::chrono::steady_clock::duration;

// A request's priority, the same for the Pipeline and the ContinuousBatcher. The Pipeline
// fills a batch from higher priorities first, and serves a lower priority whose oldest
// request has waited longer than its starvation limit first (so that it is never
// starved); the ContinuousBatcher gives a higher priority a head start in its waiting
// queue (ContinuousBatcherConfig::priority_step).
enum class Priority : std::uint8_t { high = 0, normal = 1, low = 2 };
inline constexpr std::size_t priority_levels = 3;

// A short, stable, lower-case name ("high"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(Priority p) noexcept {
  return detail::enum_name<priority_levels>(p, {"high", "normal", "low"});
}

// A tenant: the client (or group of clients) a request is served for, a small number the
// server chooses (TenantNames interns names into one). Fair scheduling shares the server
// between tenants by their weights; quotas bound each one (TenantsConfig, tenants.hpp).
// 0 is the default tenant, the one a request without a tenant belongs to.
using TenantId = std::uint32_t;

// Per-request options of Pipeline::submit and ContinuousBatcher::submit. A plain value;
// copying it copies the cancellation token (a shared reference). Thread-safety: as for
// any value type.
struct SubmitOptions {
  // The latest START time: a Pipeline request's model call, or a ContinuousBatcher
  // sequence's admission into the active set, may begin no later than this. A request
  // still waiting then completes with Status::deadline_exceeded and is never executed;
  // one that started in time is not interrupted however long it runs (the
  // ContinuousBatcher bounds a whole generation separately, with its request's
  // completion_deadline). BatchTime::max(): none.
  BatchTime deadline = BatchTime::max();
  // A budget for the latest start, counted from the arrival (below):
  //   > 0  the deadline is also at most arrival + timeout;
  //   = 0  no budget (the default): only `deadline` applies;
  //   < 0  the budget was already spent upstream: the request completes at once, inside
  //        submit, with Status::deadline_exceeded.
  std::chrono::nanoseconds timeout{0};
  // When the request reached the server (a time of the front door's clock), if earlier
  // than the submit: the queue wait, the end-to-end latency, the batch window's opening
  // and the timeout count from it, so that time spent before submit (an accept queue, a
  // parser) shows in the metrics. BatchTime::min() (the default): unset, the time of the
  // submit. A time later than the submit counts as the submit.
  BatchTime arrival = BatchTime::min();
  Priority priority = Priority::normal;
  // The tenant the request is served for (0: the default tenant). Read by fair scheduling
  // and the per-tenant quotas (TenantsConfig); FIFO scheduling without quotas ignores it.
  TenantId tenant = 0;
  // Stopping its source cancels the request: a queued request is removed and completes
  // with Status::cancelled; an executing one has its result discarded (Pipeline) or is
  // retired before the next step (ContinuousBatcher).
  CancellationToken cancel{};
};

}  // namespace tailbatch
