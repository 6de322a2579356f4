// Warmup: run every batch shape on every lane before the server says it is ready.
//
// The first batches a fresh process runs are its slowest: the model's weights are read
// from memory for the first time (page faults on first touch, cold caches), workspaces
// grow to their largest size, a GPU compiles kernels or captures graphs per shape. Those
// costs land on the first users' requests unless something pays them before the server
// is marked ready. warmup() pays them with synthetic requests:
//
//   Readiness ready(&registry);                 // tailbatch_ready 0
//   Pipeline<Req, Resp> pipeline(model, FixedWindow(32, 5ms));
//   WarmupReport r = warmup(pipeline, samples, {.readiness = &ready});
//   // tailbatch_ready 1 once every warmup request completed ok; /readyz reads ready.
//
// Sizes: every preferred size of a PreferredSizes policy; otherwise the powers of two up
// to max_batch, and max_batch itself (or WarmupConfig::sizes). For each size, warmup
// submits `size` requests (copies of the samples, in turn) as one batch per lane, and
// waits for them before the next size. The batches go through the Pipeline like any
// others: they are counted in its stats and metrics, and a policy that learns from
// executed batches (BatchFeedbackPolicy) sees them, so its cost model starts seeded.
//
// Which lane runs which batch:
//   Pipelines stepped by poll() (workers = 0): guaranteed. warmup holds a lease on every
//   lane slot but one slot of the lane it warms, so the batch can only run there.
//   Pipelines with worker threads: best effort. Each worker holds its lane while it waits
//   to lead, so warmup cannot choose; it submits each lane's batch only after the
//   previous one was formed, so that consecutive batches are formed by different workers
//   (different lanes) while the earlier ones run. With one worker per lane slot (the
//   default) and model calls longer than batch formation, every lane gets every size;
//   nothing in the public API lets warmup check it.
// A batch is formed at the intended size by policies that close on size or on their
// window (FixedWindow, PreferredSizes, TokenBudget within its budget, DeadlineAware
// without deadlines). A policy that closes early may split it; the sizes still run, in
// smaller pieces.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/pipeline.hpp>

namespace tailbatch {

// Whether the server is ready for traffic: false until warmup() (or the caller) says so.
// Exported, when given a registry, as the gauge tailbatch_ready (0 or 1) with the given
// labels; a readiness probe (/readyz) reads is_ready().
//
// Thread-safety: every member is thread-safe. Exceptions: the constructor throws what
// MetricsRegistry::gauge throws (std::invalid_argument, std::bad_alloc); nothing else
// throws. The registry, when given, must outlive this object.
class Readiness {
 public:
  // Not ready. Registers tailbatch_ready (set to 0) when metrics is not null. Allocates
  // only to register. Thread-safe.
  explicit Readiness(MetricsRegistry* metrics = nullptr, Labels labels = {})
      : gauge_(metrics != nullptr
                   ? &metrics->gauge("tailbatch_ready", "1 once the server has warmed up and takes traffic, else 0",
                                     std::move(labels))
                   : nullptr) {
    if (gauge_ != nullptr) gauge_->set(0.0);
  }

  Readiness(const Readiness&) = delete;
  Readiness& operator=(const Readiness&) = delete;

  // Whether ready. Never blocks. Thread-safe.
  [[nodiscard]] bool is_ready() const noexcept { return ready_.load(std::memory_order_acquire); }

  // Marks ready (or not ready again, e.g. while draining) and sets the gauge. Never
  // blocks. Thread-safe.
  void set_ready(bool ready = true) noexcept {
    ready_.store(ready, std::memory_order_release);
    if (gauge_ != nullptr) gauge_->set(ready ? 1.0 : 0.0);
  }

 private:
  std::atomic<bool> ready_{false};
  Gauge* gauge_;
};

// How warmup() runs.
struct WarmupConfig {
  // The batch sizes to run, each in [1, max_batch]. Empty: warmup_sizes(policy).
  std::vector<std::size_t> sizes{};
  // Batches of each size per lane.
  std::size_t rounds = 1;
  // Pipelines with worker threads: the longest warmup may take in all (real time); what
  // has not completed by then is reported as timed out (the requests still complete
  // later, unobserved).
  std::chrono::nanoseconds timeout = std::chrono::seconds(60);
  // Pipelines stepped by poll() on a clock that does not move by itself (ManualClock):
  // called with the time the next batch is due, to move the clock there. Required for
  // them; unused otherwise (a poll-driven Pipeline on SteadyClock is waited for).
  std::function<void(BatchTime)> advance_clock{};
  // Set ready when the warmup succeeds (WarmupReport::ok()). Optional.
  Readiness* readiness = nullptr;
};

// What warmup() did.
struct WarmupReport {
  std::vector<std::size_t> sizes;  // the sizes run, ascending
  std::size_t lanes = 0;           // lanes of the Pipeline
  std::size_t requests = 0;        // warmup requests submitted
  std::size_t completed_ok = 0;
  std::size_t failed = 0;          // the model threw
  std::size_t other = 0;           // rejected, deadline_exceeded or cancelled
  std::uint64_t batches = 0;       // batches the Pipeline formed meanwhile (its stats)
  bool lanes_forced = false;       // each lane was made to run each size (poll-driven)
  bool timed_out = false;
  std::chrono::nanoseconds elapsed{0};  // real time
  std::string first_error;         // the message of the first request that was not ok

  // Every warmup request completed ok, in time.
  [[nodiscard]] bool ok() const noexcept {
    return !timed_out && requests > 0 && completed_ok == requests;
  }
};

// The batch sizes a policy will form, ascending: every preferred size (a policy with
// sizes(), PreferredSizes), else the powers of two below max_batch and max_batch itself.
// Allocates. Thread-safe.
template <BatchPolicy Policy>
[[nodiscard]] std::vector<std::size_t> warmup_sizes(const Policy& policy) {
  std::vector<std::size_t> sizes;
  if constexpr (requires {
                  { policy.sizes() } -> std::convertible_to<std::span<const std::size_t>>;
                }) {
    const std::span<const std::size_t> preferred = policy.sizes();
    sizes.assign(preferred.begin(), preferred.end());
  } else {
    const std::size_t max_batch = policy.max_batch();
    for (std::size_t s = 1; s < max_batch; s *= 2) sizes.push_back(s);
    sizes.push_back(max_batch);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

namespace detail {

// What warmup's completions report, shared with callbacks that may outlive warmup().
struct WarmupTally {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t done = 0;
  std::size_t ok = 0;
  std::size_t failed = 0;
  std::size_t other = 0;
  std::string first_error;
};

}  // namespace detail

// Runs every batch size the policy will form (see warmup_sizes and the file comment) on
// every lane of pipeline, with copies of samples as requests, and blocks until they have
// completed (or options.timeout has passed, with worker threads). Marks
// options.readiness ready if every request completed ok. Call it before the Pipeline
// takes traffic: requests submitted meanwhile may share warmup's batches.
//
// Blocks; allocates. Throws std::invalid_argument when samples is empty, rounds is 0, a
// size is outside [1, max_batch], or a poll-driven Pipeline on a clock other than
// SteadyClock has no advance_clock; std::bad_alloc; and what copying a sample throws.
// Model failures do not throw: they are counted in the report. Thread-safe with respect
// to the Pipeline (it only submits, polls and reads stats), but one warmup per Pipeline
// at a time.
template <class P>
  requires std::copy_constructible<typename P::Request>
WarmupReport warmup(P& pipeline, std::span<const typename P::Request> samples, WarmupConfig options = {}) {
  using Req = typename P::Request;
  using Resp = typename P::Response;
  using PipelineClock = std::decay_t<decltype(pipeline.clock())>;
  const auto started = std::chrono::steady_clock::now();

  WarmupReport report;
  report.sizes = options.sizes.empty() ? warmup_sizes(pipeline.policy()) : options.sizes;
  std::sort(report.sizes.begin(), report.sizes.end());
  report.sizes.erase(std::unique(report.sizes.begin(), report.sizes.end()), report.sizes.end());
  if (samples.empty()) detail::throw_invalid_argument("warmup: samples must not be empty");
  if (options.rounds < 1) detail::throw_invalid_argument("warmup: rounds must be >= 1");
  for (std::size_t s : report.sizes) {
    if (s < 1 || s > pipeline.policy().max_batch()) {
      detail::throw_invalid_argument("warmup: sizes must be in [1, max_batch]");
    }
  }
  const bool manual = pipeline.worker_count() == 0;
  if (manual && !options.advance_clock && !std::is_same_v<PipelineClock, SteadyClock>) {
    detail::throw_invalid_argument("warmup: advance_clock must be set for a Pipeline stepped by poll() on a manual clock");
  }

  auto& lanes = pipeline.lanes();
  report.lanes = lanes.size();
  const std::uint64_t batches_before = pipeline.stats().batches();
  const auto deadline = started + options.timeout;
  auto tally = std::make_shared<detail::WarmupTally>();
  std::size_t next_sample = 0;

  // Submits one batch's worth of requests.
  auto submit_group = [&](std::size_t size) {
    for (std::size_t i = 0; i < size; ++i) {
      Req req = samples[next_sample];
      next_sample = (next_sample + 1) % samples.size();
      ++report.requests;
      pipeline.submit(std::move(req), SubmitOptions{}, [tally](Outcome<Resp>&& o) {
        std::lock_guard lock(tally->mu);
        ++tally->done;
        if (o.ok()) {
          ++tally->ok;
        } else {
          if (o.status() == Status::failed) {
            ++tally->failed;
          } else {
            ++tally->other;
          }
          if (tally->first_error.empty()) {
            tally->first_error = std::string(to_string(o.status())) + ": " + std::string(o.message());
          }
        }
        tally->cv.notify_all();
      });
    }
  };
  auto done_count = [&] {
    std::lock_guard lock(tally->mu);
    return tally->done;
  };

  // Steps a poll-driven Pipeline until `target` requests have completed. False if it is
  // stuck (nothing due and nothing done).
  auto drive = [&](std::size_t target) {
    while (done_count() < target) {
      const PipelinePollResult r = pipeline.poll();
      if (done_count() >= target) break;
      if (r.batches > 0) continue;
      if (r.next_due == BatchTime::max()) return false;
      if (options.advance_clock) {
        options.advance_clock(r.next_due);
      } else {
        std::this_thread::sleep_until(r.next_due);
      }
    }
    return true;
  };

  bool stuck = false;
  if (manual) {
    report.lanes_forced = true;
    for (std::size_t size : report.sizes) {
      for (std::size_t lane = 0; lane < lanes.size() && !stuck; ++lane) {
        for (std::size_t round = 0; round < options.rounds && !stuck; ++round) {
          // Every lane slot but one of `lane` held here: the batch can only run there.
          std::vector<typename std::decay_t<decltype(lanes)>::Lease> held;
          while (auto lease = lanes.try_acquire()) held.push_back(std::move(*lease));
          auto mine = std::find_if(held.begin(), held.end(), [&](const auto& l) { return l.index() == lane; });
          if (mine == held.end()) {
            report.lanes_forced = false;  // someone else holds every slot of this lane
            held.clear();
          } else {
            held.erase(mine);
          }
          submit_group(size);
          stuck = !drive(report.requests);
        }
      }
    }
  } else {
    // pred runs without the tally's lock (it may read the Pipeline's stats).
    auto wait_until = [&](auto&& pred) {
      for (;;) {
        if (pred()) return true;
        if (std::chrono::steady_clock::now() >= deadline) return false;
        // Formation is seen through stats(), not the tally: wake up to look.
        std::unique_lock lock(tally->mu);
        tally->cv.wait_for(lock, std::chrono::microseconds(200));
      }
    };
    for (std::size_t size : report.sizes) {
      for (std::size_t round = 0; round < options.rounds && !report.timed_out; ++round) {
        for (std::size_t lane = 0; lane < lanes.size() && !report.timed_out; ++lane) {
          const std::uint64_t formed = pipeline.stats().batches();
          const std::size_t submitted = report.requests + size;
          submit_group(size);
          // The next group waits until this one left the queue in a batch (or completed).
          report.timed_out = !wait_until([&] {
            return done_count() >= submitted || (pipeline.stats().batches() > formed && pipeline.queued_approx() == 0);
          });
        }
        if (!report.timed_out) {
          const std::size_t target = report.requests;
          report.timed_out = !wait_until([&] { return done_count() >= target; });
        }
      }
      if (report.timed_out) break;
    }
  }

  {
    std::lock_guard lock(tally->mu);
    report.completed_ok = tally->ok;
    report.failed = tally->failed;
    report.other = tally->other;
    report.first_error = tally->first_error;
    if (stuck || tally->done < report.requests) report.timed_out = true;
  }
  report.batches = pipeline.stats().batches() - batches_before;
  report.elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started);
  if (options.readiness != nullptr && report.ok()) options.readiness->set_ready(true);
  return report;
}

}  // namespace tailbatch
