// Where a request's life ends, for every front door (Pipeline, ContinuousBatcher): the one
// place that counts outcomes, keeps the load integrals behind load() and the Little's-law
// check, records the end-to-end latency, measures the service rate behind the retry-after
// hint, and settles a request exactly once (counted, its admission released, its latency
// recorded, its completion delivered, in that order).
//
//   intake (detail/request_intake.hpp) -> queue -> batch / step -> ledger (this file)
//
// Thread-safety: count(), settle(), the readers and record_end_to_end() may be called from
// any thread (relaxed atomics: each counter is exact alone; a snapshot of several may
// disagree by requests in transit). The load integrals take one short lock per update
// (once per batch, step or leader turn, never per submit); check_littles_law() takes its
// own. Never allocates except check_littles_law()'s explanation; never throws except
// check_littles_law() (std::invalid_argument for a threshold <= 0).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <tailbatch/detail/occupancy.hpp>
#include <tailbatch/detail/service_rate.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/littles_law.hpp>
#include <tailbatch/load.hpp>
#include <tailbatch/outcome.hpp>
#include <utility>

namespace tailbatch::detail {

class OutcomeLedger {
 public:
  // Measures load from `start` (the front door's construction).
  explicit OutcomeLedger(BatchTime start) noexcept : load_(start) { littles_last_.at = start; }

  OutcomeLedger(const OutcomeLedger&) = delete;
  OutcomeLedger& operator=(const OutcomeLedger&) = delete;

  // ---- outcomes ----------------------------------------------------------------------

  // n requests completed with status s (reason r when rejected).
  void count(Status s, RejectReason r, std::uint64_t n = 1) noexcept {
    if (n == 0) return;
    by_status_[static_cast<std::size_t>(s)].fetch_add(n, std::memory_order_relaxed);
    if (s == Status::rejected)
      rejected_by_reason_[static_cast<std::size_t>(r)].fetch_add(n, std::memory_order_relaxed);
  }

  [[nodiscard]] std::uint64_t count_of(Status s) const noexcept {
    return by_status_[static_cast<std::size_t>(s)].load(std::memory_order_relaxed);
  }

  // Copies the counts into a stats value's arrays (indexed by Status and RejectReason).
  void fill(std::array<std::uint64_t, status_count>& by_status,
            std::array<std::uint64_t, reject_reason_count>& rejected_by_reason) const noexcept {
    for (std::size_t i = 0; i < status_count; ++i) by_status[i] = by_status_[i].load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < reject_reason_count; ++i) {
      rejected_by_reason[i] = rejected_by_reason_[i].load(std::memory_order_relaxed);
    }
  }

  // Where end-to-end latencies go (tailbatch_*_end_to_end_seconds), or nowhere (nullptr).
  // Set once, before any request completes.
  void set_end_to_end(LatencyHistogram* h) noexcept { end_to_end_ = h; }
  void record_end_to_end(std::chrono::nanoseconds latency) noexcept {
    if (end_to_end_ != nullptr) end_to_end_->record(latency);
  }

  // Settles one request, exactly once: counts it, releases its admission (release(status,
  // latency)), records its end-to-end latency and delivers its outcome (deliver()), in
  // that order, so that whoever the delivery wakes sees the request counted and its
  // admission slot free. Both callables must be noexcept.
  template <class Release, class Deliver>
  void settle(Status s, RejectReason r, std::chrono::nanoseconds latency, Release&& release,
              Deliver&& deliver) noexcept {
    count(s, r, 1);
    release(s, latency);
    record_end_to_end(latency);
    deliver();
  }

  // ---- load (Little's law) -----------------------------------------------------------

  // n requests entered at t, their ages at t (time already spent inside) summing to age_sum.
  void enter(BatchTime t, std::uint64_t n, BatchDuration age_sum = BatchDuration::zero()) noexcept {
    load_.enter(t, n, age_sum);
  }
  // n requests left at t with latencies summing to latency_sum; `executing` of them had
  // been executing since `started`.
  void leave(BatchTime t, std::uint64_t n, std::uint64_t executing, BatchTime started,
             BatchDuration latency_sum) noexcept {
    load_.leave(t, n, executing, started, latency_sum);
  }

  // The integrals read at `now` (or at the latest event, if that is later).
  [[nodiscard]] LoadReading load(BatchTime now) const noexcept {
    const OccupancyReading r = load_.read(now);
    return LoadReading{r.at, r.in_pipeline_s, r.executing_s, r.completed, r.latency_s};
  }

  // The Little's-law check over the window since the previous call (the first: since
  // construction), at `now`. Its result is kept for littles_deviation() and
  // hidden_queue_suspected(). Throws std::invalid_argument unless threshold > 0.
  LittlesLawCheck check_littles_law(BatchTime now, double threshold) {
    std::lock_guard lock(littles_mu_);
    const LoadReading reading = load(now);
    const LoadWindow w = load_between(littles_last_, reading);
    LittlesLawCheck c = tailbatch::check_littles_law(w.throughput_per_s, w.mean_latency,
                                                     w.mean_in_system, threshold);
    littles_last_ = reading;
    littles_deviation_.store(c.relative_deviation, std::memory_order_relaxed);
    littles_suspected_.store(c.hidden_queue_suspected, std::memory_order_relaxed);
    return c;
  }
  [[nodiscard]] double littles_deviation() const noexcept {
    return littles_deviation_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] bool hidden_queue_suspected() const noexcept {
    return littles_suspected_.load(std::memory_order_relaxed);
  }

  // ---- service rate (the retry-after hint) -------------------------------------------

  // Requests finished per second of busy time (one lane slot, or the decode loop).
  [[nodiscard]] ServiceRate& service() noexcept { return service_; }
  [[nodiscard]] const ServiceRate& service() const noexcept { return service_; }

 private:
  std::array<std::atomic<std::uint64_t>, status_count> by_status_{};
  std::array<std::atomic<std::uint64_t>, reject_reason_count> rejected_by_reason_{};
  LatencyHistogram* end_to_end_ = nullptr;
  OccupancyMeter load_;
  ServiceRate service_;
  std::mutex littles_mu_;
  LoadReading littles_last_{};
  std::atomic<double> littles_deviation_{0.0};
  std::atomic<bool> littles_suspected_{false};
};

}  // namespace tailbatch::detail
