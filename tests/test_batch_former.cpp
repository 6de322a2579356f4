// Batch formation alone (detail/pipeline/batch_former.hpp), on a ManualClock's readings: staging,
// the purge of expired and cancelled requests, the policy's decision, the forming of a
// batch, and priority and starvation order, with no Pipeline, shard or thread involved.
#include <tailbatch/detail/pipeline/batch_former.hpp>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/clock.hpp>

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

struct Item {
  int id = 0;
  BatchTime arrival{};
  BatchTime deadline = BatchTime::max();
  bool cancelled = false;
  std::size_t cost = 1;
  bool gone = false;
};

struct ItemTraits {
  static bool gone(const Item& e) noexcept { return e.gone; }
  static BatchTime deadline(const Item& e) noexcept { return e.deadline; }
  static BatchTime arrival(const Item& e) noexcept { return e.arrival; }
  static bool cancelled(const Item& e) noexcept { return e.cancelled; }
  static std::size_t cost(const Item& e) noexcept { return e.cost; }
};

template <class Policy = FixedWindow>
struct Bench {
  using Former = detail::BatchFormer<Item, ItemTraits, Policy>;

  explicit Bench(Policy p, std::chrono::nanoseconds starvation = 50ms, std::size_t slots = 1)
      : policy(std::move(p)), former(policy, 1, starvation, slots) {}

  // Stages one chunk of requests into the sub-queue of `priority`.
  void stage(Priority priority, std::vector<Item> items) {
    former.staged().add_chunk(former.staged().sub_index(static_cast<std::size_t>(priority), 0), items);
    former.staged().settle();
  }

  // A dead-request sink that records (id, why).
  auto sink() {
    return [this](Item& e, Status why, BatchTime) {
      dead.emplace_back(e.id, why);
      e.gone = true;
    };
  }

  typename Former::Round decide(bool flush = false) { return former.decide(clock.now(), flush, 1, sink()); }

  std::vector<int> form(const typename Former::Round& round) {
    std::vector<int> ids;
    former.form(round, [&](Item& e) {
      ids.push_back(e.id);
      e.gone = true;
    });
    return ids;
  }

  Policy policy;
  Former former;
  ManualClock clock;
  std::vector<std::pair<int, Status>> dead;
};

Item at(int id, BatchTime t) { return Item{id, t}; }

}  // namespace

TEST_CASE("batch former: a window closes at max_wait from the first request, not before") {
  Bench<> b(FixedWindow(8, 2ms));
  const BatchTime t0 = b.clock.now();
  b.stage(Priority::normal, {at(1, t0), at(2, t0), at(3, t0)});
  REQUIRE(b.former.size() == 3);

  b.clock.advance(1ms);
  auto r = b.decide();
  CHECK(r.bucket == b.former.npos);
  CHECK(r.wait.decide_again_at == t0 + 2ms);
  // Five more arrivals would fill the batch: the leader may sleep until then.
  CHECK(r.wake_delta == 5);
  CHECK(b.former.size() == 3);

  b.clock.advance(1ms);
  r = b.decide();
  REQUIRE(r.bucket == 0);
  CHECK(r.decision.count == 3);
  CHECK(r.decision.reason == DispatchReason::window);
  CHECK(b.form(r) == std::vector<int>{1, 2, 3});
  CHECK(b.former.size() == 0);
  CHECK(b.former.dequeued() == 3);
  CHECK(b.dead.empty());
}

TEST_CASE("batch former: a full batch closes at once; the rest stays queued in order") {
  Bench<> b(FixedWindow(4, 10ms));
  const BatchTime t0 = b.clock.now();
  b.stage(Priority::normal, {at(1, t0), at(2, t0), at(3, t0), at(4, t0), at(5, t0), at(6, t0)});
  auto r = b.decide();
  REQUIRE(r.bucket == 0);
  CHECK(r.decision.reason == DispatchReason::size);
  CHECK(b.form(r) == std::vector<int>{1, 2, 3, 4});
  CHECK(b.former.size() == 2);
  r = b.decide();
  CHECK(r.bucket == b.former.npos);  // two left, window still open
  r = b.decide(true);                 // flush: whatever is queued
  REQUIRE(r.bucket == 0);
  CHECK(r.decision.reason == DispatchReason::flush);
  CHECK(b.form(r) == std::vector<int>{5, 6});
  CHECK(b.former.dequeued() == 6);
}

TEST_CASE("batch former: requests past their deadline or cancelled are handed over as dead, never formed") {
  Bench<> b(FixedWindow(8, 2ms));
  const BatchTime t0 = b.clock.now();
  Item late = at(2, t0);
  late.deadline = t0 + 1ms;
  Item gone_cancelled = at(3, t0);
  gone_cancelled.cancelled = true;
  Item late_and_cancelled = at(4, t0);
  late_and_cancelled.deadline = t0 + 1ms;
  late_and_cancelled.cancelled = true;
  b.stage(Priority::normal, {at(1, t0), late, gone_cancelled, late_and_cancelled, at(5, t0)});

  b.clock.advance(2ms);
  auto r = b.decide();
  REQUIRE(r.bucket == 0);
  CHECK(b.form(r) == std::vector<int>{1, 5});
  REQUIRE(b.dead.size() == 3);
  CHECK(b.dead[0] == std::pair{2, Status::deadline_exceeded});
  CHECK(b.dead[1] == std::pair{3, Status::cancelled});
  CHECK(b.dead[2] == std::pair{4, Status::cancelled});  // both: reported cancelled
  CHECK(b.former.dequeued() == 5);
}

TEST_CASE("batch former: purge_cancelled removes cancelled requests before any decision") {
  Bench<> b(FixedWindow(8, 2ms));
  const BatchTime t0 = b.clock.now();
  Item c = at(2, t0);
  c.cancelled = true;
  b.stage(Priority::normal, {at(1, t0), c, at(3, t0)});
  b.former.purge_cancelled(b.clock.now(), b.sink());
  REQUIRE(b.dead.size() == 1);
  CHECK(b.dead[0] == std::pair{2, Status::cancelled});
  CHECK(b.former.size() == 2);
  CHECK(b.former.dequeued() == 1);
}

TEST_CASE("batch former: higher priority first, but a starving lower priority goes ahead") {
  Bench<> b(FixedWindow(2, 0ms), 50ms);
  const BatchTime t0 = b.clock.now();
  b.stage(Priority::low, {at(10, t0), at(11, t0)});
  b.clock.advance(10ms);
  b.stage(Priority::high, {at(1, b.clock.now()), at(2, b.clock.now())});
  b.stage(Priority::normal, {at(5, b.clock.now())});
  auto r = b.decide();
  REQUIRE(r.bucket == 0);
  CHECK(b.form(r) == std::vector<int>{1, 2});

  // The low lane's head has now waited past the starvation limit: it goes first.
  b.clock.advance(45ms);
  b.stage(Priority::high, {at(3, b.clock.now()), at(4, b.clock.now())});
  r = b.decide();
  REQUIRE(r.bucket == 0);
  CHECK(b.form(r) == std::vector<int>{10, 11});
  r = b.decide();
  CHECK(b.form(r) == std::vector<int>{3, 4});
  r = b.decide();
  CHECK(b.form(r) == std::vector<int>{5});
}

TEST_CASE("batch former: remove_all hands every staged request over as rejected") {
  Bench<> b(FixedWindow(8, 2ms));
  const BatchTime t0 = b.clock.now();
  b.stage(Priority::high, {at(1, t0)});
  b.stage(Priority::low, {at(2, t0), at(3, t0)});
  b.former.remove_all(b.clock.now(), b.sink());
  CHECK(b.former.size() == 0);
  CHECK(b.former.dequeued() == 3);
  REQUIRE(b.dead.size() == 3);
  for (const auto& d : b.dead) CHECK(d.second == Status::rejected);
}

TEST_CASE("batch former: earliest-deadline order forms the most urgent requests first") {
  Bench<DeadlineAware> b(DeadlineAware(DeadlineAware::Config{2, 1ms, 0ms}));
  const BatchTime t0 = b.clock.now();
  Item a = at(1, t0);
  a.deadline = t0 + 30ms;
  Item c = at(2, t0);
  c.deadline = t0 + 10ms;
  Item d = at(3, t0);
  d.deadline = t0 + 20ms;
  b.stage(Priority::normal, {a, c, d});
  b.clock.advance(1ms);
  auto r = b.decide();
  REQUIRE(r.bucket == 0);
  CHECK(b.form(r) == std::vector<int>{2, 3});
}
