// AdaptiveWindow's lookahead: when a lane is idle, the policy plays two choices out (the
// plan's rule, and everything queued now) from the state it sees, and takes the one that
// leaves fewer requests late (docs/adaptive-window.md, "Lookahead"). This is the state it
// plays from (when each lane frees, as the policy's closes and the lanes' feedback tell
// it) and the playing out.
//
// Not thread-safe: its owner (detail::AdaptiveState) guards it with its mutex. Allocates in
// its constructor only; never throws after it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include <tailbatch/detail/time.hpp>
#include <tailbatch/batch_policy.hpp>

namespace tailbatch::detail {

class LaneLookahead {
 public:
  // Streams played per choice, the horizon in batches of the plan's size, and the most
  // arrivals a stream plays.
  static constexpr std::size_t streams = 16;
  static constexpr double batches = 3.0;
  static constexpr std::size_t max_arrivals = 1024;

  // What the plan in force says, as late() needs it.
  struct Plan {
    std::size_t lanes = 1;
    double rate = 0.0;          // arrivals per second
    std::size_t batch = 1;      // close at this many queued
    double window_s = 0.0;      // or when the oldest has waited this long
    double late_after_s = 0.0;  // a request later than this in queue and on the lane is late
  };

  // For batches of at most max_batch on at most max_lanes lanes.
  LaneLookahead(std::size_t max_batch, std::size_t max_lanes)
      : busy_until_(max_lanes, BatchTime::min()), t_(max_batch + max_arrivals), free_(max_lanes) {}

  // A batch modelled to take `cost` starts now on the lane (of the first `lanes`) that
  // frees first.
  void dispatched(BatchTime now, std::size_t lanes, BatchDuration cost) noexcept {
    const std::size_t n = std::clamp<std::size_t>(lanes, 1, busy_until_.size());
    std::size_t lane = 0;
    for (std::size_t i = 1; i < n; ++i)
      if (busy_until_[i] < busy_until_[lane]) lane = i;
    busy_until_[lane] = saturating_add(now, cost);
  }

  // A batch really ended at `end`: the lane whose modelled end is nearest takes the real one.
  void finished(BatchTime end, std::size_t lanes) noexcept {
    const std::size_t n = std::clamp<std::size_t>(lanes, 1, busy_until_.size());
    std::size_t lane = busy_until_.size();
    BatchDuration nearest = BatchDuration::max();
    for (std::size_t i = 0; i < n; ++i) {
      if (busy_until_[i] == BatchTime::min()) continue;
      const BatchDuration gap = busy_until_[i] > end ? busy_until_[i] - end : end - busy_until_[i];
      if (gap < nearest) {
        nearest = gap;
        lane = i;
      }
    }
    if (lane < busy_until_.size()) busy_until_[lane] = end;
  }

  // Plays the next moments out from the state in view and counts the late requests: the
  // queued requests (their arrival stamps), the lanes' free times (above), and `streams`
  // streams of Poisson arrivals at p.rate over `batches` times the cost of a batch of
  // p.batch, the same streams for every choice (common random numbers: unit-rate arrival
  // times, read from a different offset per stream, wrapping). `first` requests are
  // dispatched now on the lane that frees first (0: none), then the plan's rule (close at
  // p.batch queued, or when the oldest has waited p.window_s) serves the rest. A request is
  // late when its time in queue and on the lane exceeds p.late_after_s (the cost of a batch
  // of p.batch when that is 0). cost[b] is the modelled cost of a batch of b, seconds
  // (cost[0] unused; the cap is cost.size() - 1). Returns the late requests summed over
  // the streams, plus a thousandth of their summed lateness (in units of late_after_s) to
  // break ties. O(streams x (queued + arrivals in the horizon) x lanes); never allocates.
  double late(const BatchView& v, std::size_t first, const Plan& p, std::span<const double> cost,
              std::span<const double> unit_arrivals) noexcept {
    const std::size_t cap = cost.size() - 1;
    const std::size_t lanes = std::clamp<std::size_t>(p.lanes, 1, busy_until_.size());
    const double rate = std::max(p.rate, 1.0);
    const std::size_t b = std::clamp<std::size_t>(p.batch, 1, cap);
    const double w = p.window_s;
    const double horizon = batches * cost[b];
    const double tau = p.late_after_s > 0.0 ? p.late_after_s : cost[b];
    // The queued requests, as offsets from now (<= 0), oldest first.
    std::size_t queued = 0;
    for (const BatchCandidate& c : v.candidates) {
      if (queued == cap) break;
      t_[queued++] = std::min(0.0, std::chrono::duration<double>(c.arrival - v.now).count());
    }
    std::sort(t_.begin(), t_.begin() + static_cast<std::ptrdiff_t>(queued));
    const std::size_t units = unit_arrivals.size();
    const std::size_t stride = units / streams;
    const std::size_t room = t_.size() - queued;
    double over = 0.0, lateness = 0.0;
    for (std::size_t m = 0; m < streams; ++m) {
      // This stream's arrivals: the unit gaps from its own offset on (wrapping), scaled.
      std::size_t n = queued;
      double t = 0.0;
      for (std::size_t k = 0; k < room; ++k) {
        const std::size_t i = (m * stride + k) % (units - 1) + 1;
        t += (unit_arrivals[i] - unit_arrivals[i - 1]) / rate;
        if (t > horizon) break;
        t_[n++] = t;
      }
      // The lanes: each busy one frees when its last batch is modelled to end; as many as
      // the view says are idle are free now.
      std::size_t idle = 0;
      for (std::size_t i = 0; i < lanes; ++i) {
        free_[i] = busy_until_[i] > v.now ? std::chrono::duration<double>(busy_until_[i] - v.now).count() : 0.0;
        if (free_[i] == 0.0) ++idle;
      }
      for (std::size_t i = 0; i < lanes && idle < v.idle_lanes; ++i) {
        if (free_[i] > 0.0) {
          free_[i] = 0.0;
          ++idle;
        }
      }
      std::size_t h = 0;
      auto run = [&](double start, std::size_t e) {
        std::size_t lane = 0;
        for (std::size_t i = 1; i < lanes; ++i)
          if (free_[i] < free_[lane]) lane = i;
        const double done = std::max(start, free_[lane]) + cost[std::min(e - h, cap)];
        free_[lane] = done;
        for (; h < e; ++h) {
          const double l = done - t_[h];
          if (l > tau) {
            over += 1.0;
            lateness += (l - tau) / tau;
          }
        }
      };
      if (first > 0) run(0.0, std::min(first, queued));
      while (h < n) {
        double lane_free = free_[0];
        for (std::size_t i = 1; i < lanes; ++i) lane_free = std::min(lane_free, free_[i]);
        double close = t_[h] + w;
        if (h + b - 1 < n) close = std::min(close, t_[h + b - 1]);
        const double start = std::max({lane_free, close, 0.0});
        std::size_t e = h + 1;
        while (e < n && e - h < b && t_[e] <= start) ++e;
        run(start, e);
      }
    }
    return over + 1e-3 * lateness;
  }

 private:
  std::vector<BatchTime> busy_until_;  // per lane: the modelled (or real) end of its last batch
  std::vector<double> t_;              // arrival offsets from now, seconds
  std::vector<double> free_;           // lane free times from now, seconds
};

}  // namespace tailbatch::detail
