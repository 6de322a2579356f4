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
//   static TenantId tenant(const Entry&)        optional: its tenant (0 without it)
// A request that will not run is handed to the caller's `dead(Entry&, Status, BatchTime now)`
// after it has been taken off the queue (Status::cancelled, deadline_exceeded, or
// rejected from remove_all()); `dead` must leave the entry gone. A request the queue policy
// sheds is handed as (Entry&, Status::rejected, now, RejectReason::shed) when `dead` takes
// the fourth argument.
//
// Tenants and queue policies (configure()):
// - Fair scheduling. Within each priority lane of a bucket, candidates come from the
//   tenants in virtual-counter order (detail/virtual_counters.hpp), each tenant's own
//   requests in arrival (or earliest-deadline) order; the former keeps, per sub-queue, one
//   list of keys per tenant. A batch's requests are charged to their tenants' counters as
//   it is formed (cost / weight). Priority lanes and the starvation rule come first:
//   fairness orders requests within a priority class, never across classes.
// - shed-oldest, CoDel and adaptive LIFO drop (RejectReason::shed) through
//   apply_queue_policy(), which the leader calls each turn after staging: the victim is
//   the oldest request of the lowest non-empty priority class (with fair scheduling, of
//   the tenant there that would be served last), so that overload is paid by the lowest
//   class and the heaviest tenant.
// - adaptive LIFO serves each sub-queue newest first while a queue has formed (more
//   requests than one batch per lane slot, or the oldest has waited past codel_target),
//   and sheds as CoDel does while the queue stands (Facebook's adaptive LIFO with CoDel).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <tailbatch/batch_policy.hpp>
#include <tailbatch/detail/pipeline/lane_pacing.hpp>
#include <tailbatch/detail/pipeline/queue_policy.hpp>
#include <tailbatch/detail/pipeline/queue_staging.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/detail/virtual_counters.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/queue_policy.hpp>
#include <tailbatch/tenants.hpp>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace tailbatch::detail {

template <class Entry, class Traits, class Policy>
class BatchFormer {
 public:
  using Staged = StagedQueue<Entry, Traits>;
  using Pick = typename Staged::Pos;
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  // What decide() found.
  struct Round {
    std::size_t bucket = npos;   // the bucket to dispatch from, or npos: wait
    BatchDecision decision{};    // for that bucket
    BatchDecision wait{};        // when waiting: the earliest reasons to decide again
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

  // Sets the tenants' scheduling and the queue policy (both read until the former is
  // destroyed: `tenants` must outlive it) and the queue's capacity (shed-oldest sheds down
  // to it). Call before anything is staged. May allocate (std::bad_alloc).
  // paced_lanes: one-slot lanes whose batches' starts lane staggering spreads
  // (QueuePolicyConfig::stagger; 0: lanes of several slots, never paced).
  void configure(const TenantsConfig& tenants, const QueuePolicyConfig& queue, std::size_t capacity,
                 std::size_t paced_lanes = 0) {
    pacing_.configure(staggers(queue, tenants), paced_lanes);
    fair_ = tenants.scheduling == Scheduling::fair;
    if (fair_) {
      counters_.emplace(tenants);
      lists_.resize(staged_.sub_count());
    }
    queue_ = queue;
    capacity_ = capacity;
    // Adaptive LIFO runs CoDel's control loop too (Facebook pairs the two): newest first
    // serves the requests most likely to meet their deadline, and CoDel answers the ones a
    // standing queue has left behind early, instead of serving them late once it drains.
    if (queue.policy == QueuePolicy::codel || queue.policy == QueuePolicy::adaptive_lifo)
      codel_.emplace(queue.codel_target, queue.codel_interval);
  }

  // Stages a chunk of entries (all of sub-queue s) in arrival order; with fair scheduling
  // also indexes them by tenant. Throws std::bad_alloc with nothing changed but `entries`
  // kept by the caller.
  void stage(std::size_t s, std::vector<Entry>& entries) {
    if (entries.empty()) return;
    staged_.add_chunk(s, entries);
    if (!fair_) return;
    const std::uint64_t serial = staged_.last_serial(s);
    std::vector<Entry>& chunk = staged_.chunk_entries(s, serial);
    SubLists& sl = lists_[s];
    std::size_t i = 0;
    const bool ok = !call_guarded(
        [&] {
          for (; i < chunk.size(); ++i) {
            const TenantId t = tenant_of(chunk[i]);
            auto [it, fresh] = sl.index.try_emplace(t, sl.lists.size());
            if (fresh) sl.lists.push_back(TenantList{t, {}, 0});
            TenantList& l = sl.lists[it->second];
            const Key key{Traits::deadline(chunk[i]), serial, i};
            if (staged_.edf()) {
              l.keys.insert(std::upper_bound(l.keys.begin() + static_cast<std::ptrdiff_t>(l.head),
                                             l.keys.end(), key, key_less),
                            key);
            } else {
              l.keys.push_back(key);
            }
            counters_->joined(t);
          }
          if (cursors_.capacity() < sl.lists.size()) cursors_.reserve(2 * sl.lists.size());
        },
        [](const char*) {});
    // Out of memory while indexing: this sub-queue is served in arrival order until it
    // empties (nothing is lost; fairness pauses there).
    if (!ok) sl.unindexed = true;
  }

  // Fair scheduling's counters (nullptr with FIFO scheduling). Not thread-safe.
  [[nodiscard]] const VirtualCounters* counters() const noexcept {
    return counters_ ? &*counters_ : nullptr;
  }
  // Requests the queue policy shed since construction. Not thread-safe: the leader's.
  [[nodiscard]] std::uint64_t shed() const noexcept { return shed_; }
  // Whether the last decide() served newest first (adaptive LIFO). Not thread-safe.
  [[nodiscard]] bool lifo() const noexcept { return lifo_; }

  // Applies the queue policy at `now`: shed-oldest sheds down to the capacity; CoDel and
  // adaptive LIFO, while the queue stands, shed the oldest while they waited past twice
  // codel_target (never below one batch per lane slot).
  // Victims go to dead with RejectReason::shed. Never allocates. Not thread-safe: the leader's.
  template <class Dead>
  void apply_queue_policy(BatchTime now, Dead&& dead) noexcept {
    if (queue_.policy == QueuePolicy::shed_oldest) {
      while (staged_.size() > capacity_ && shed_one(now, dead)) {
      }
    } else if (codel_) {
      for (;;) {
        // No more than every lane slot's next batch: never dropped from (RFC 8289's
        // "maxpacket" rule, once per slot), so shedding never leaves a lane short of work.
        const bool small = staged_.size() <= max_batch_ * total_slots_;
        const BatchTime oldest = oldest_arrival();
        const BatchDuration sojourn =
            oldest == BatchTime::max() || now < oldest ? BatchDuration::zero() : now - oldest;
        if (!codel_->should_drop(now, sojourn, small) || !shed_one(now, dead)) break;
      }
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
    for (std::size_t s = 0; s < staged_.sub_count(); ++s) {
      staged_.compact(s);
      if (fair_) drop_empty_lists(s);
    }
  }

  // Builds every non-empty bucket's view at `now`, completing dead requests on the way
  // (through dead), and asks the policy about each (flush: close whatever is queued;
  // idle_lanes: lane slots free for a batch now). The bucket whose first candidate is most
  // urgent wins: starving first, then priority, then order key, then arrival. Never
  // allocates. Not thread-safe: the leader's.
  template <class Dead>
  [[nodiscard]] Round decide(BatchTime now, bool flush, std::size_t idle_lanes,
                             Dead&& dead) noexcept {
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
    lifo_ = false;
    if (queue_.policy == QueuePolicy::adaptive_lifo && staged_.size() > 0) {
      const BatchTime oldest = oldest_arrival();
      lifo_ = staged_.size() > max_batch_ * total_slots_ ||
              (now > oldest && now - oldest > queue_.codel_target);
    }
    for (std::size_t b = 0; b < staged_.buckets(); ++b) {
      if (staged_.live_in_bucket(b) == 0) continue;
      View& v = views_[b];
      const bool head_starving = build_view(b, now, v, dead);
      if (v.candidates.empty()) continue;
      BatchView bv{std::span<const BatchCandidate>(v.candidates),
                   staged_.live_in_bucket(b),
                   now,
                   flush,
                   idle_lanes,
                   total_slots_};
      BatchDecision d = policy_->decide(bv);
      if (d.count > 0) {
        d.count = std::min(d.count, v.candidates.size());
        const Entry& head = staged_.at(v.picks.front());
        const BatchTime key = policy_->order() == BatchOrder::earliest_deadline
                                  ? Traits::deadline(head)
                                  : BatchTime{};
        const Rank r{head_starving ? 0 : 1, static_cast<int>(v.picks.front().sub % priority_levels),
                     key, Traits::arrival(head)};
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

  // Lane staggering's state. Not thread-safe: the leader's.
  [[nodiscard]] LanePacing& pacing() noexcept { return pacing_; }

  // Whether round's batch (as decide() left it) starts now on lane `lane` (npos: every
  // slot busy, so no). With staggered lanes a full batch may wait on its lane to keep the
  // starts spread: then round becomes that wait. Never when closing, nor past the earliest
  // deadline of the batch's requests. Never throws. Not thread-safe: the leader's.
  [[nodiscard]] bool start_now(Round& round, BatchTime now, std::size_t lane,
                               bool closing) noexcept {
    if (lane == npos) return false;
    if (!pacing_.enabled()) return true;
    const BatchTime at = pacing_.not_before(lane, now, full_batch(round.decision));
    if (at <= now || closing || earliest_deadline(round) < at) return true;
    round =
        Round{npos, {}, BatchDecision::wait(at, npos), std::numeric_limits<std::uint32_t>::max()};
    return false;
  }

  // The earliest deadline among the requests round's batch would take (as decide() left
  // them). Never allocates. Not thread-safe: the leader's.
  [[nodiscard]] BatchTime earliest_deadline(const Round& round) const noexcept {
    BatchTime t = BatchTime::max();
    const View& v = views_[round.bucket];
    const std::size_t count = std::min(round.decision.count, v.candidates.size());
    for (std::size_t i = 0; i < count; ++i) t = std::min(t, v.candidates[i].deadline);
    return t;
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
      if (fair_) {
        const TenantId t = tenant_of(staged_.at(p));
        counters_->charge(t, static_cast<double>(Traits::cost(staged_.at(p))));
        counters_->left(t);
      }
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
  void take_dead(Entry& e, const Pick& p, Status why, BatchTime now, Dead& dead,
                 RejectReason reason = RejectReason::none) noexcept {
    if (fair_) counters_->left(tenant_of(e));
    staged_.removed(p);
    ++dequeued_;
    if constexpr (std::is_invocable_v<Dead&, Entry&, Status, BatchTime, RejectReason>) {
      dead(e, why, now, reason);
    } else {
      dead(e, why, now);
    }
  }

  using Key = typename Staged::Key;

  // One tenant's keys in one sub-queue, in service order from head (arrival, or earliest
  // deadline). Keys of entries gone are skipped and dropped lazily.
  struct TenantList {
    TenantId tenant;
    std::vector<Key> keys;
    std::size_t head;
  };
  struct SubLists {
    std::vector<TenantList> lists;
    std::unordered_map<TenantId, std::size_t> index;  // tenant -> lists index
    bool unindexed = false;                           // see stage()
  };

  static bool key_less(const Key& a, const Key& b) noexcept {
    if (a.deadline != b.deadline) return a.deadline < b.deadline;
    return a.serial != b.serial ? a.serial < b.serial : a.index < b.index;
  }

  static TenantId tenant_of(const Entry& e) noexcept {
    if constexpr (requires { Traits::tenant(e); }) {
      return Traits::tenant(e);
    } else {
      return 0;
    }
  }

  // The earliest arrival among the heads of the sub-queues (with earliest-deadline order,
  // among the most urgent of each). BatchTime::max() when empty.
  BatchTime oldest_arrival() noexcept {
    BatchTime oldest = BatchTime::max();
    for (std::size_t s = 0; s < staged_.sub_count(); ++s) {
      if (staged_.live_in_sub(s) == 0) continue;
      if (const Entry* e = staged_.first(s)) oldest = std::min(oldest, Traits::arrival(*e));
    }
    return oldest;
  }

  // Drops list l's gone keys from both ends. Never allocates.
  void trim(std::size_t s, TenantList& l) noexcept {
    Pick p{};
    while (l.head < l.keys.size() &&
           !staged_.locate(s, l.keys[l.head].serial, l.keys[l.head].index, p))
      ++l.head;
    while (l.keys.size() > l.head &&
           !staged_.locate(s, l.keys.back().serial, l.keys.back().index, p)) {
      l.keys.pop_back();
    }
    if (l.head == l.keys.size()) {
      l.keys.clear();
      l.head = 0;
    } else if (l.head >= 64 && 2 * l.head >= l.keys.size()) {
      l.keys.erase(l.keys.begin(), l.keys.begin() + static_cast<std::ptrdiff_t>(l.head));
      l.head = 0;
    }
  }

  // Forgets sub-queue s's empty tenant lists. Never allocates.
  void drop_empty_lists(std::size_t s) noexcept {
    SubLists& sl = lists_[s];
    for (std::size_t i = 0; i < sl.lists.size();) {
      trim(s, sl.lists[i]);
      if (!sl.lists[i].keys.empty()) {
        ++i;
        continue;
      }
      sl.index.erase(sl.lists[i].tenant);
      if (i + 1 != sl.lists.size()) {
        sl.lists[i] = std::move(sl.lists.back());
        sl.index[sl.lists[i].tenant] = i;  // an existing key: no allocation
      }
      sl.lists.pop_back();
    }
    if (staged_.live_in_sub(s) == 0) sl.unindexed = false;
  }

  // Visits sub-queue s's live entries in service order: with fair scheduling by tenant
  // (virtual counters, charged tentatively as f accepts entries), else by arrival (or
  // deadline), newest first under adaptive LIFO. f as for StagedQueue::for_each.
  template <class F>
  void visit(std::size_t s, F&& f) {
    if (!fair_ || lists_[s].unindexed) {
      if (lifo_) {
        staged_.for_each_reverse(s, f);
      } else {
        staged_.for_each(s, f);
      }
      return;
    }
    SubLists& sl = lists_[s];
    const bool backwards = lifo_ && !staged_.edf();
    cursors_.clear();
    for (std::size_t i = 0; i < sl.lists.size() && cursors_.size() < cursors_.capacity(); ++i) {
      TenantList& l = sl.lists[i];
      trim(s, l);
      if (l.keys.empty()) continue;
      cursors_.push_back(Cursor{i,
                                backwards ? l.keys.size() : l.head,
                                counters_->counter(l.tenant),
                                counters_->weight(l.tenant),
                                {},
                                nullptr});
    }
    // Each cursor's next live entry.
    const auto advance = [&](Cursor& c) noexcept {
      TenantList& l = sl.lists[c.list];
      c.entry = nullptr;
      if (backwards) {
        while (c.at > l.head) {
          --c.at;
          if (staged_.locate(s, l.keys[c.at].serial, l.keys[c.at].index, c.pos)) {
            c.entry = c.pos.entry;
            return;
          }
        }
      } else {
        while (c.at < l.keys.size()) {
          const Key& k = l.keys[c.at++];
          if (staged_.locate(s, k.serial, k.index, c.pos)) {
            c.entry = c.pos.entry;
            return;
          }
        }
      }
    };
    for (Cursor& c : cursors_) advance(c);
    for (;;) {
      Cursor* best = nullptr;
      for (Cursor& c : cursors_) {
        if (c.entry == nullptr) continue;
        if (best == nullptr || c.counter < best->counter ||
            (c.counter == best->counter &&
             Traits::arrival(*c.entry) < Traits::arrival(*best->entry))) {
          best = &c;
        }
      }
      if (best == nullptr) return;
      Entry& e = *best->entry;
      const Pick p = best->pos;
      const bool more = f(e, p);
      if (!Traits::gone(e)) best->counter += static_cast<double>(Traits::cost(e)) / best->weight;
      if (!more) return;
      advance(*best);
    }
  }

  // Sheds one request (see the file comment). false: nothing to shed.
  template <class Dead>
  bool shed_one(BatchTime now, Dead& dead) noexcept {
    for (std::size_t lane = priority_levels; lane-- > 0;) {
      Pick victim{};
      bool found = false;
      BatchTime best{};
      const auto consider = [&](const Pick& p) noexcept {
        const Entry& e = staged_.at(p);
        const BatchTime k = staged_.edf() ? Traits::deadline(e) : Traits::arrival(e);
        if (!found || k < best) {
          best = k;
          victim = p;
          found = true;
        }
      };
      if (fair_) {
        // The tenant in this lane that would be served last, then its first request.
        bool any = false;
        TenantId heavy = 0;
        double load = 0.0;
        for (std::size_t b = 0; b < staged_.buckets(); ++b) {
          const std::size_t s = staged_.sub_index(lane, b);
          if (staged_.live_in_sub(s) == 0 || lists_[s].unindexed) continue;
          for (TenantList& l : lists_[s].lists) {
            trim(s, l);
            if (l.keys.empty()) continue;
            const double x =
                counters_->counter(l.tenant) +
                static_cast<double>(counters_->queued(l.tenant)) / counters_->weight(l.tenant);
            if (!any || x > load || (x == load && l.tenant < heavy)) {
              any = true;
              load = x;
              heavy = l.tenant;
            }
          }
        }
        for (std::size_t b = 0; any && b < staged_.buckets(); ++b) {
          const std::size_t s = staged_.sub_index(lane, b);
          if (staged_.live_in_sub(s) == 0 || lists_[s].unindexed) continue;
          auto it = lists_[s].index.find(heavy);
          if (it == lists_[s].index.end()) continue;
          TenantList& l = lists_[s].lists[it->second];
          Pick p{};
          if (!l.keys.empty() && staged_.locate(s, l.keys[l.head].serial, l.keys[l.head].index, p))
            consider(p);
        }
      }
      if (!found) {
        for (std::size_t b = 0; b < staged_.buckets(); ++b) {
          const std::size_t s = staged_.sub_index(lane, b);
          Pick p{};
          if (staged_.live_in_sub(s) > 0 && staged_.first_pos(s, p)) consider(p);
        }
      }
      if (!found) continue;
      // A victim already past its deadline, or cancelled, ends as that: deadlines hold.
      const Entry& v = staged_.at(victim);
      if (now > Traits::deadline(v) || Traits::cancelled(v)) {
        take_dead(staged_.at(victim), victim,
                  Traits::cancelled(v) ? Status::cancelled : Status::deadline_exceeded, now, dead);
      } else {
        take_dead(staged_.at(victim), victim, Status::rejected, now, dead, RejectReason::shed);
        ++shed_;
      }
      staged_.compact(victim.sub);
      if (fair_) drop_empty_lists(victim.sub);
      return true;
    }
    return false;
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
      visit(s, [&](Entry& e, const Pick& p) {
        if (now > Traits::deadline(e)) {
          take_dead(e, p, Traits::cancelled(e) ? Status::cancelled : Status::deadline_exceeded, now,
                    dead);
          return true;
        }
        if (Traits::cancelled(e)) {
          take_dead(e, p, Status::cancelled, now, dead);
          return true;
        }
        if (v.candidates.empty()) first_starving = i < starving;
        v.candidates.push_back(
            BatchCandidate{Traits::arrival(e), Traits::deadline(e), Traits::cost(e), priority});
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

  struct Cursor {
    std::size_t list;
    std::size_t at;
    double counter;
    double weight;
    Pick pos;
    Entry* entry;
  };

  Policy* policy_;
  std::size_t max_batch_;
  std::chrono::nanoseconds starvation_limit_;
  std::size_t total_slots_;
  Staged staged_;
  std::vector<View> views_;
  std::uint64_t dequeued_ = 0;
  // Tenants and the queue policy (configure()).
  bool fair_ = false;
  std::optional<VirtualCounters> counters_;
  std::vector<SubLists> lists_;  // index: sub-queue
  std::vector<Cursor> cursors_;  // visit()'s scratch; capacity reserved by stage()
  QueuePolicyConfig queue_{};
  std::size_t capacity_ = std::numeric_limits<std::size_t>::max();
  std::optional<CodelState> codel_;
  LanePacing pacing_;
  std::uint64_t shed_ = 0;
  bool lifo_ = false;
};

}  // namespace tailbatch::detail
