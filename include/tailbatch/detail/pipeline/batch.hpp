// A formed batch: what the batch leader hands to a lane, and the last check before it runs.
//
// The leader moves each chosen request out of the staged queue into a PipelineBatch (the
// requests side by side, as the model takes them, their PipelineMeta alongside), pads it with
// copies of the last request when the policy asks for a padded size, and hands it to a lane.
// As the lane starts it, drop_unstartable() takes out the requests whose deadline (a latest
// start) has passed or that were cancelled meanwhile, keeping their completions for after
// the model call. Every vector is reserved for max_batch up front, so neither forming nor
// dropping allocates after construction. Single-threaded: one batch belongs to one leader or
// worker at a time.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <tailbatch/batch_policy.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/submit_options.hpp>
#include <utility>
#include <vector>

namespace tailbatch::detail {

// A request taken off the queue without running (cancelled, expired, or refused at
// shutdown), whose completion waits until the next batch has been handed to its lane.
template <class Meta>
struct DeadRequest {
  Meta meta;
  Status why = Status::deadline_exceeded;
  BatchTime at{};                            // when it was taken off
  RejectReason reason = RejectReason::none;  // with Status::rejected: shed, else shutting_down
  TenantId tenant = 0;
};

// The outcome of a request taken off the queue without running (see DeadRequest).
// retry_after: the hint a shed request carries. Allocates the message: as on every path
// that completes a request, an allocation failure here terminates.
[[nodiscard]] inline Error dead_request_error(Status why, RejectReason reason,
                                              std::chrono::nanoseconds retry_after) noexcept {
  switch (why) {
    case Status::cancelled:
      return Error{Status::cancelled, RejectReason::none, "tailbatch: cancelled", {}};
    case Status::rejected:
      if (reason == RejectReason::shed) {
        return Error{Status::rejected, RejectReason::shed, "tailbatch: shed by the queue policy",
                     retry_after};
      }
      return Error{Status::rejected,
                   RejectReason::shutting_down,
                   "tailbatch: the pipeline shut down before the request could run",
                   {}};
    default:
      return Error{Status::deadline_exceeded,
                   RejectReason::none,
                   "tailbatch: the deadline passed before the request could run",
                   {}};
  }
}

template <class Req, class Resp, class Meta>
struct PipelineBatch {
  std::vector<Req> reqs;
  std::vector<Resp> resps;
  std::vector<Meta> metas;
  std::size_t padded = 0;
  DispatchReason reason = DispatchReason::window;
  BatchTime opened{};  // the first request's arrival
  BatchTime formed{};
  BatchTime earliest_deadline = BatchTime::max();
  bool cancellable = false;  // some request has a cancellation token
  // Looked limited by blocked submitters: report it (once) after the model call.
  bool warn_submitters = false;
  std::size_t blocked = 0;  // blocked submitters when it formed
  // Scratch for the requests dropped when the batch starts, and for those kept.
  std::vector<Meta> dropped;
  std::vector<Status> dropped_status;
  std::vector<Req> kept_reqs;
  std::vector<Meta> kept_metas;
  // Requests the leader took off the queue while forming this batch, completed after its
  // model call (so that their callbacks never delay its start).
  std::vector<DeadRequest<Meta>> dead;
  // With tenant quotas or per-tenant metrics: the tenants of metas and of dropped, index
  // for index (empty otherwise).
  std::vector<TenantId> tenants;
  std::vector<TenantId> dropped_tenants;
  std::vector<TenantId> kept_tenants;

  // Reserves every vector for `most` requests. Throws std::bad_alloc.
  void reserve(std::size_t most) {
    tenants.reserve(most);
    dropped_tenants.reserve(most);
    kept_tenants.reserve(most);
    reqs.reserve(most);
    resps.reserve(most);
    metas.reserve(most);
    dropped.reserve(most);
    dropped_status.reserve(most);
    kept_reqs.reserve(most);
    kept_metas.reserve(most);
  }

  // Empties the batch for the next one.
  void begin() noexcept {
    tenants.clear();
    reqs.clear();
    resps.clear();
    metas.clear();
    opened = BatchTime::max();
    earliest_deadline = BatchTime::max();
    cancellable = false;
  }

  // Moves a queued entry's request and meta in (leaves the entry gone). Within the
  // reserved capacity, and entry moves are expected not to throw.
  template <class Entry>
  void take(Entry& e) noexcept {
    opened = std::min(opened, e.meta.arrival);
    earliest_deadline = std::min(earliest_deadline, e.meta.deadline);
    cancellable = cancellable || e.meta.cancel != nullptr;
    reqs.push_back(std::move(e.req));
    metas.push_back(std::move(e.meta));
  }

  // Pads the requests up to `want` with copies of the last one (copyable requests only);
  // on allocation failure it stays unpadded. Sets `padded`.
  void pad_to(std::size_t want) noexcept {
    const std::size_t n = metas.size();
    padded = n;
    if constexpr (std::copy_constructible<Req>) {
      if (want > n && n > 0) {
        detail::call_guarded(
            [&] {
              while (reqs.size() < want) reqs.push_back(reqs[n - 1]);
            },
            [&](const char*) { reqs.resize(n); });
        padded = reqs.size();
      }
    }
  }

  // Takes out the requests that must not start at `start`: past their deadline, or
  // cancelled. Their completions are kept in `dropped` for after the model call. A padded
  // batch (`keep_padding`) keeps its size with copies of the last request kept; otherwise
  // it shrinks. Never allocates. Returns how many were taken out.
  std::size_t drop_unstartable(BatchTime start, bool keep_padding) noexcept {
    const std::size_t n = metas.size();
    const auto unstartable = [&](const Meta& m) { return start > m.deadline || m.cancelled(); };
    if (std::none_of(metas.begin(), metas.end(), unstartable)) return 0;
    kept_reqs.clear();
    kept_metas.clear();
    kept_tenants.clear();
    const std::size_t before = dropped.size();
    for (std::size_t i = 0; i < n; ++i) {
      Meta& m = metas[i];
      if (!tenants.empty()) (unstartable(m) ? dropped_tenants : kept_tenants).push_back(tenants[i]);
      if (unstartable(m)) {
        // A request both late and cancelled is reported cancelled.
        dropped_status.push_back(m.cancelled() ? Status::cancelled : Status::deadline_exceeded);
        dropped.push_back(std::move(m));
      } else {
        kept_reqs.push_back(std::move(reqs[i]));
        kept_metas.push_back(std::move(m));
      }
    }
    const std::size_t kept = kept_metas.size();
    std::size_t size = kept;
    if constexpr (std::copy_constructible<Req>) {
      if (keep_padding && kept > 0) size = padded;
      detail::call_guarded(
          [&] {
            while (kept_reqs.size() < size) kept_reqs.push_back(kept_reqs[kept - 1]);
          },
          [&](const char*) { kept_reqs.resize(kept); });
      size = kept_reqs.size();
    }
    reqs.clear();
    metas.clear();
    std::swap(reqs, kept_reqs);
    std::swap(metas, kept_metas);
    std::swap(tenants, kept_tenants);
    padded = size;
    return dropped.size() - before;
  }

  // Empties it after its completions ran.
  void finish() noexcept {
    metas.clear();
    reqs.clear();
    resps.clear();
    dropped.clear();
    dropped_status.clear();
    dropped_tenants.clear();
    tenants.clear();
    dead.clear();
  }
};

}  // namespace tailbatch::detail
