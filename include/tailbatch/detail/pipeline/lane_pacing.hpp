// Lane staggering (QueuePolicyConfig::stagger): while the queue is backlogged, the
// Pipeline's batches start spread over the lanes' batch time instead of in step.
//
// Why: a backlogged Pipeline starts a batch whenever a lane frees. Lanes that started
// together (they do: the first batches of a backlog start within one window of each
// other) free together, for as long as the backlog lasts, so the next start is up to one
// whole batch time away. A request that is served next whenever it comes (a light
// tenant's under fair scheduling, the newest under adaptive LIFO) waits for that start:
// up to a batch time with L lanes in step, up to batch time / L with the starts spread.
// Spreading costs one hold of at most batch time / L per lane when a backlog begins, and
// nothing while it lasts (each lane still starts a full batch as soon as its turn comes).
//
// How: each lane's batch-to-batch time is observed when a full batch is due and the lane
// it gets last started a full batch too (a backlog both times): the time since that start.
// Its moving average over the lanes divided by the lane count is the spacing; a full
// batch (closed by size or token budget) may start no sooner than that spacing after the
// previous start on any lane. Lanes with more than one slot, or one
// lane, are not paced. Time is only what the caller passes in: tested on the manual clock.
//
// Not thread-safe: the Pipeline's batch leader owns it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <tailbatch/batch_policy.hpp>
#include <tailbatch/queue_policy.hpp>
#include <tailbatch/submit_options.hpp>
#include <tailbatch/tenants.hpp>
#include <vector>

namespace tailbatch::detail {

// Whether a Pipeline with these settings staggers its lanes (LaneStagger::automatic: with
// fair scheduling or adaptive LIFO). Never throws.
[[nodiscard]] inline bool staggers(const QueuePolicyConfig& q, const TenantsConfig& t) noexcept {
  if (q.stagger != LaneStagger::automatic) return q.stagger == LaneStagger::on;
  return t.scheduling == Scheduling::fair || q.policy == QueuePolicy::adaptive_lifo;
}

class LanePacing {
 public:
  // Paces `lanes` one-slot lanes when `enabled` (and lanes > 1). May allocate.
  void configure(bool enabled, std::size_t lanes) {
    if (enabled && lanes > 1) lanes_.assign(lanes, Lane{});
  }
  [[nodiscard]] bool enabled() const noexcept { return !lanes_.empty(); }

  // The leader holds lane `lane` at `now` for a due batch (`full`: closed by size or token
  // budget): the earliest time that batch should start (now, or later to keep the starts
  // spread). Never throws.
  [[nodiscard]] BatchTime not_before(std::size_t lane, BatchTime now, bool full) noexcept {
    if (lane >= lanes_.size()) return now;
    Lane& l = lanes_[lane];
    if (full && l.full && !l.sampled && now > l.started) {
      l.sampled = true;  // once per batch: asking again after a hold would count the hold
      // A full batch then and a full one due now: a backlog both times, so the lane was
      // busy (or had just freed) in between: its batch-to-batch time. A sample over twice
      // the average is a lane that idled meanwhile, not a cycle: ignored.
      const double seen = static_cast<double>((now - l.started).count());
      if (cycle_ <= 0.0) {
        cycle_ = seen;
      } else if (seen <= 2.0 * cycle_) {
        cycle_ += (seen - cycle_) / 4.0;
      }
    }
    if (!full || cycle_ <= 0.0 || last_ == BatchTime{}) return now;
    const auto spacing =
        BatchDuration(static_cast<BatchDuration::rep>(cycle_ / static_cast<double>(lanes_.size())));
    return std::max(now, last_ + spacing);
  }

  // A batch (`full` or not) started on lane `lane` at `now`. Never throws.
  void started(std::size_t lane, BatchTime now, bool full) noexcept {
    if (lane >= lanes_.size()) return;
    lanes_[lane] = Lane{now, full, false};
    last_ = std::max(last_, now);
  }

  // The learned batch-to-batch time of a lane (0: none yet), for tests.
  [[nodiscard]] BatchDuration cycle() const noexcept {
    return BatchDuration(static_cast<BatchDuration::rep>(cycle_));
  }

 private:
  struct Lane {
    BatchTime started{};
    bool full = false;
    bool sampled = false;  // its batch-to-batch time seen since it started
  };
  std::vector<Lane> lanes_;
  double cycle_ = 0.0;  // ns
  BatchTime last_{};    // the latest start on any lane
};

// Whether a batch closed this way is full (by size or token budget): one a backlog formed.
[[nodiscard]] constexpr bool full_batch(const BatchDecision& d) noexcept {
  return d.reason == DispatchReason::size || d.reason == DispatchReason::token_budget;
}

}  // namespace tailbatch::detail
