// Queue policies: what the Pipeline's bounded queue does under overload.
//
//   reject-newest  (the default) a full queue refuses the new request at submit
//                  (rejected/queue_full); the queue is served oldest first.
//   shed-oldest    a full queue drops its oldest queued request (rejected/shed) and takes
//                  the new one: under overload the queue keeps the requests whose callers
//                  are most likely still waiting.
//   adaptive-lifo  oldest first while no queue has formed; once one has (the oldest
//                  request has waited longer than codel_target, or more requests wait than
//                  one batch per lane slot holds), newest first, so that a backlog costs
//                  the old requests rather than every request; and, as Facebook pairs it
//                  with CoDel, while the queue stands what waited past 2 x codel_target is
//                  dropped (rejected/shed) rather than served late once the queue drains.
//   codel          oldest first; when the queue's minimum wait over a whole codel_interval
//                  stayed above codel_target (a standing queue, not a burst), every request
//                  that has waited longer than 2 x codel_target is dropped (rejected/shed)
//                  as the leader forms the next batch, until an interval's minimum falls
//                  back to target (CoDel as folly's Codel applies it to request queues).
//                  A queue of no more than one batch per lane slot is never dropped from.
//                  Set codel_target to about half the wait a request may spend queued.
//
// Priorities, deadlines and fair scheduling between tenants hold under every policy; the
// policy orders and drops within what they leave. docs/pipeline.md says when to use which.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tailbatch/submit_options.hpp>

namespace tailbatch {

// The Pipeline queue's overload policy (see the file comment).
enum class QueuePolicy : std::uint8_t { reject_newest, shed_oldest, adaptive_lifo, codel };

// A short, stable, lower-case name, as on a command line ("shed-oldest"). Never allocates.
// Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(QueuePolicy p) noexcept {
  switch (p) {
    case QueuePolicy::reject_newest:
      return "reject-newest";
    case QueuePolicy::shed_oldest:
      return "shed-oldest";
    case QueuePolicy::adaptive_lifo:
      return "adaptive-lifo";
    case QueuePolicy::codel:
      return "codel";
  }
  return "unknown";
}

// The policy named by to_string()'s name (or the same with '_' for '-'); nullopt for any
// other text. Never allocates. Thread-safe.
[[nodiscard]] constexpr std::optional<QueuePolicy> parse_queue_policy(
    std::string_view name) noexcept {
  for (QueuePolicy p : {QueuePolicy::reject_newest, QueuePolicy::shed_oldest,
                        QueuePolicy::adaptive_lifo, QueuePolicy::codel}) {
    const std::string_view want = to_string(p);
    if (name.size() != want.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i) {
      const char c = name[i] == '_' ? '-' : name[i];
      same = c == want[i];
    }
    if (same) return p;
  }
  return std::nullopt;
}

// Whether a backlogged Pipeline spreads its batches' starts over its lanes
// (QueuePolicyConfig::stagger). automatic: with fair scheduling or adaptive LIFO, the two
// orders that serve a newcomer next.
enum class LaneStagger : std::uint8_t { automatic, off, on };

// PipelineConfig::queue. A plain value. Thread-safety: as for any value type.
struct QueuePolicyConfig {
  QueuePolicy policy = QueuePolicy::reject_newest;
  // CoDel: the queue wait it keeps the minimum below (a standing queue sheds what waited
  // past twice this), and the window over which the minimum is taken (folly's defaults).
  // adaptive-lifo reads codel_target as the wait past which a queue has formed, and sheds as CoDel
  // does while the queue stands (Facebook's adaptive LIFO with CoDel). Both > 0, target < interval.
  BatchDuration codel_target = std::chrono::milliseconds(5);
  BatchDuration codel_interval = std::chrono::milliseconds(100);
  // Lane staggering: while the queue is backlogged, a full batch starts no sooner than a
  // lane's recent batch-to-batch time / the lane count after the previous start, so that
  // lanes that started together stop freeing together. A request served next whenever it
  // arrives (a light tenant's under fair scheduling, the newest under adaptive LIFO) then
  // waits for a lane at most about batch time / lanes instead of a whole batch time. It
  // costs one short hold per lane when a backlog begins. Lanes of one slot each, two or
  // more of them; never delays a request past its deadline. See
  // detail/pipeline/lane_pacing.hpp.
  LaneStagger stagger = LaneStagger::automatic;
};

}  // namespace tailbatch
