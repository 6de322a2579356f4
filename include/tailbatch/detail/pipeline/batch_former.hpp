// Batch formation: where a batch is formed from the staged queue.
//
// The Pipeline's leader owns one BatchFormer and is the only thread that touches it (no
// locking inside). Each turn it stages what the submit shards held (staged()), then asks
// decide(): every non-empty length bucket gets a view of its candidates in service order
// (starving lower priorities first, then by priority; within a sub-queue by arrival or
// earliest deadline), requests past their deadline or cancelled are completed on the way,
// the batch policy is asked about each view, and the most urgent bucket whose policy says
// "close now" wins. form() then hands the winner's requests over, one by one, in order.
//
// Time is only what the caller passes in (`now`): the former never reads a clock, so it is
// tested alone on a ManualClock's readings (tests/test_batch_former.cpp).
//
// Entries are the caller's; the traits say what the former reads of them:
//   static bool gone(const Entry&)              taken out (see StagedQueue)
//   static BatchTime deadline(const Entry&)     the latest start
//   static BatchTime arrival(const Entry&)
//   static bool cancelled(const Entry&)
//   static std::size_t cost(const Entry&)       its cost for the policy (1 if unused)
// A request that will not run is handed to the caller's `dead(Entry&, Status, BatchTime now)`
// after it has been taken off the queue (Status::cancelled, deadline_exceeded, or
// rejected from remove_all()); `dead` must leave the entry gone.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/detail/pipeline/queue_staging.hpp>
#include <tailbatch/outcome.hpp>

namespace tailbatch::detail {

template <class Entry, class Traits, class Policy>
class BatchFormer {
 public:
  using Staged = StagedQueue<Entry, Traits>;
  using Pick = typename Staged::Pos;
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  // What decide() found.
  struct Round {
    std::size_t bucket = npos;  // the bucket to dispatch from, or npos: wait
    BatchDecision decision{};   // for that bucket
    BatchDecision wait{};       // when waiting: the earliest reasons to decide again
    std::size_t wake_delta = 1;  // arrivals that could change the decision
  };

  // A former over `buckets` length buckets (priority_levels sub-queues each), asking
  // `policy` (which must outlive it). Allocates its views. Throws std::bad_alloc.
  BatchFormer(Policy& policy, std::size_t buckets, std::chrono::nanoseconds starvation_limit,
              std::size_t total_slots)
      : policy_(&policy),
        max_batch_(policy.max_batch()),
        starvation_limit_(starvation_limit),
        total_slots_(total_slots),
        staged_(priority_levels, buckets, policy.order()) {
    views_.resize(staged_.buckets());
    for (View& v : views_) {
      v.candidates.reserve(max_batch_);
      v.picks.reserve(max_batch_);
    }
  }

  // The staged queue, for adding what the submit shards held (add_chunk, settle) and
  // recycling chunks. Not thread-safe: the leader's.
  [[nodiscard]] Staged& staged() noexcept { return staged_; }
  [[nodiscard]] const Staged& staged() const noexcept { return staged_; }
  // Requests staged and not yet taken off. Not thread-safe: the leader's.
  [[nodiscard]] std::size_t size() const noexcept { return staged_.size(); }
  // Requests taken off the queue since construction (formed into batches, completed as
  // dead, removed, or counted by note_dequeued). Not thread-safe: the leader's.
  [[nodiscard]] std::uint64_t dequeued() const noexcept { return dequeued_; }
  // Counts n requests taken off the queue by the caller (never staged). Never throws.
  void note_dequeued(std::uint64_t n) noexcept { dequeued_ += n; }

  // Completes (through dead, with Status::cancelled) every staged request whose
  // cancellation has fired. Never allocates. Not thread-safe: the leader's.
  template <class Dead>
  void purge_cancelled(BatchTime now, Dead&& dead) noexcept {
    for (std::size_t s = 0; s < staged_.sub_count(); ++s) {
      if (staged_.live_in_sub(s) == 0) continue;
      staged_.for_each(s, [&](Entry& e, const Pick& p) {
        if (Traits::cancelled(e)) take_dead(e, p, Status::cancelled, now, dead);
        return true;
      });
      staged_.compact(s);
    }
  }

  // Takes every staged request off the queue and hands it to dead with Status::rejected.
  // Not thread-safe: the leader's.
  template <class Dead>
  void remove_all(BatchTime now, Dead&& dead) noexcept {
    for (std::size_t s = 0; s < staged_.sub_count(); ++s) {
      if (staged_.live_in_sub(s) == 0) continue;
      staged_.for_each(s, [&](Entry& e, const Pick& p) {
        take_dead(e, p, Status::rejected, now, dead);
        return true;
      });
      staged_.compact(s);
    }
  }

  // Drops gone entries from the front of every sub-queue. Never allocates.
  void compact_all() noexcept {
    for (std::size_t s = 0; s < staged_.sub_count(); ++s) staged_.compact(s);
  }

  // Builds every non-empty bucket's view at `now`, completing dead requests on the way
  // (through dead), and asks the policy about each (flush: close whatever is queued;
  // idle_lanes: lane slots free for a batch now). The bucket whose first candidate is most
  // urgent wins: starving first, then priority, then order key, then arrival. Never
  // allocates. Not thread-safe: the leader's.
  template <class Dead>
  [[nodiscard]] Round decide(BatchTime now, bool flush, std::size_t idle_lanes, Dead&& dead) noexcept {
    Round round;
    round.wait.decide_again_at = BatchTime::max();
    round.wait.decide_again_if_deadline_before = BatchTime::min();
    std::size_t best_delta = npos;
    struct Rank {
      int starving;
      int lane;
      BatchTime key;
      BatchTime arrival;
      bool operator<(const Rank& o) const noexcept {
        if (starving != o.starving) return starving < o.starving;
        if (lane != o.lane) return lane < o.lane;
        if (key != o.key) return key < o.key;
        return arrival < o.arrival;
      }
    };
    Rank best{};
    for (std::size_t b = 0; b < staged_.buckets(); ++b) {
      if (staged_.live_in_bucket(b) == 0) continue;
      View& v = views_[b];
      const bool head_starving = build_view(b, now, v, dead);
      if (v.candidates.empty()) continue;
      BatchView bv{std::span<const BatchCandidate>(v.candidates), staged_.live_in_bucket(b), now, flush, idle_lanes,
                   total_slots_};
      BatchDecision d = policy_->decide(bv);
      if (d.count > 0) {
        d.count = std::min(d.count, v.candidates.size());
        const Entry& head = staged_.at(v.picks.front());
        const BatchTime key = policy_->order() == BatchOrder::earliest_deadline ? Traits::deadline(head) : BatchTime{};
        const Rank r{head_starving ? 0 : 1, static_cast<int>(v.picks.front().sub % priority_levels), key,
                     Traits::arrival(head)};
        if (round.bucket == npos || r < best) {
          best = r;
          round.bucket = b;
          round.decision = d;
        }
      } else {
        round.wait.decide_again_at = std::min(round.wait.decide_again_at, d.decide_again_at);
        round.wait.decide_again_if_deadline_before =
            std::max(round.wait.decide_again_if_deadline_before, d.decide_again_if_deadline_before);
        const std::size_t q = bv.queued;
        const std::size_t delta = d.decide_again_at_queued > q ? d.decide_again_at_queued - q : 1;
        best_delta = std::min(best_delta, delta);
      }
    }
    round.wake_delta = best_delta == npos ? 1 : best_delta;
    return round;
  }

  // Hands the first round.decision.count candidates of the round's bucket (as decide()
  // left them: call it with nothing in between) to take(Entry&), in service order; take
  // must leave each gone (move its contents out). Counts them dequeued and compacts the
  // sub-queues they came from. Returns how many were taken. Never allocates. Not
  // thread-safe: the leader's.
  template <class Take>
  std::size_t form(const Round& round, Take&& take) noexcept {
    View& v = views_[round.bucket];
    const std::size_t count = std::min(round.decision.count, v.picks.size());
    for (std::size_t i = 0; i < count; ++i) {
      const Pick& p = v.picks[i];
      take(staged_.at(p));
      staged_.removed(p);
    }
    dequeued_ += count;
    // Each sub-queue the batch took from, once.
    std::uint32_t last = std::numeric_limits<std::uint32_t>::max();
    for (std::size_t i = 0; i < count; ++i) {
      if (v.picks[i].sub != last) staged_.compact(last = v.picks[i].sub);
    }
    return count;
  }

 private:
  struct View {
    std::vector<BatchCandidate> candidates;
    std::vector<Pick> picks;
  };

  template <class Dead>
  void take_dead(Entry& e, const Pick& p, Status why, BatchTime now, Dead& dead) noexcept {
    staged_.removed(p);
    ++dequeued_;
    dead(e, why, now);
  }

  // Fills v with bucket b's candidates in service order. Returns whether the first one
  // comes from a starving lane.
  template <class Dead>
  bool build_view(std::size_t b, BatchTime now, View& v, Dead& dead) noexcept {
    v.candidates.clear();
    v.picks.clear();
    std::array<std::size_t, priority_levels> order{};
    std::size_t n = 0;
    bool first_starving = false;
    // Starving lower lanes first (in priority order), then every other lane.
    for (std::size_t lane = 1; lane < priority_levels; ++lane) {
      if (lane_starving(lane, b, now)) order[n++] = lane;
    }
    const std::size_t starving = n;
    for (std::size_t lane = 0; lane < priority_levels; ++lane) {
      if (std::find(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(starving), lane) ==
          order.begin() + static_cast<std::ptrdiff_t>(starving)) {
        order[n++] = lane;
      }
    }
    for (std::size_t i = 0; i < n && v.candidates.size() < max_batch_; ++i) {
      const std::size_t s = staged_.sub_index(order[i], b);
      if (staged_.live_in_sub(s) == 0) continue;
      const auto priority = static_cast<Priority>(order[i]);
      staged_.for_each(s, [&](Entry& e, const Pick& p) {
        if (now > Traits::deadline(e)) {
          take_dead(e, p, Traits::cancelled(e) ? Status::cancelled : Status::deadline_exceeded, now, dead);
          return true;
        }
        if (Traits::cancelled(e)) {
          take_dead(e, p, Status::cancelled, now, dead);
          return true;
        }
        if (v.candidates.empty()) first_starving = i < starving;
        v.candidates.push_back(BatchCandidate{Traits::arrival(e), Traits::deadline(e), Traits::cost(e), priority});
        v.picks.push_back(p);
        return v.candidates.size() < max_batch_;
      });
    }
    return first_starving;
  }

  bool lane_starving(std::size_t lane, std::size_t b, BatchTime now) noexcept {
    const std::size_t s = staged_.sub_index(lane, b);
    if (staged_.live_in_sub(s) == 0) return false;
    staged_.compact(s);
    const Entry* e = staged_.first(s);
    return e != nullptr && now - Traits::arrival(*e) >= starvation_limit_;
  }

  Policy* policy_;
  std::size_t max_batch_;
  std::chrono::nanoseconds starvation_limit_;
  std::size_t total_slots_;
  Staged staged_;
  std::vector<View> views_;
  std::uint64_t dequeued_ = 0;
};

}  // namespace tailbatch::detail
