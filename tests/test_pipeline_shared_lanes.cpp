// Several Pipelines on one lane backend: an idle Pipeline holds no lane slot, busy ones
// take turns, and no shutdown waits on another Pipeline. Real threads on the steady clock;
// nothing asserts how long anything takes beyond generous bounds (a hang fails the test
// instead of hanging it).
#include <tailbatch/pipeline.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

constexpr auto bounded = 20s;  // 100x what any of these needs, sanitizers included

auto echo() {
  return [](std::span<const int> in, std::span<int> out, HostLane&) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
  };
}

// Whether f is ready by `until` (a shared bound, so that many waits together stay bounded).
template <class T>
bool ready_by(std::future<T>& f, std::chrono::steady_clock::time_point until) {
  return f.wait_until(until) == std::future_status::ready;
}

// Shuts `p` down on another thread; true when that finished within the bound.
template <class P>
bool shutdown_within(P& p, std::chrono::seconds limit, std::thread& runner) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  runner = std::thread([&p, done] {
    p.shutdown();
    done->set_value();
  });
  return f.wait_for(limit) == std::future_status::ready;
}

}  // namespace

TEST_CASE("LaneSlots: waiters are served first come, first served; try_acquire never jumps the line") {
  HostLanes lanes(1, 1);
  auto held = lanes.try_acquire();
  REQUIRE(held);
  CHECK(lanes.free_slots_approx() == 0);
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> waiting{0};
  auto waiter = [&](int id) {
    ++waiting;
    auto l = lanes.acquire_for(bounded);
    REQUIRE(l);
    std::lock_guard lock(mu);
    order.push_back(id);
    // The slot goes back when l is destroyed, to the next in line.
  };
  std::thread first(waiter, 1);
  while (waiting.load() < 1) std::this_thread::yield();
  std::this_thread::sleep_for(20ms);  // first is in line (order only; no time is asserted)
  std::thread second(waiter, 2);
  while (waiting.load() < 2) std::this_thread::yield();
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(lanes.try_acquire());  // waiters come first
  held.reset();
  first.join();
  second.join();
  CHECK(order == std::vector<int>{1, 2});
  CHECK(lanes.free_slots_approx() == 1);
  CHECK(lanes.try_acquire());
}

TEST_CASE("Shared lanes: an idle Pipeline holds no slot; the other serves as if it were alone") {
  for (std::size_t n : {1, 2, 4}) {
    CAPTURE(n);
    HostLanes lanes(n, 1);
    Pipeline<int, int> a(echo(), FixedWindow{8, 1ms}, {}, lanes);
    Pipeline<int, int> b(echo(), FixedWindow{8, 1ms}, {}, lanes);
    const auto until = std::chrono::steady_clock::now() + bounded;
    // The reproduction: 8 requests with a 100 ms timeout all complete (ok or, on a
    // badly overloaded machine, deadline_exceeded; never nothing). Without a deadline,
    // each must run.
    std::vector<std::future<Outcome<int>>> timed;
    std::vector<std::future<Outcome<int>>> plain;
    for (int i = 0; i < 8; ++i) timed.push_back(b.submit(i, {.timeout = 100ms}));
    for (int i = 0; i < 8; ++i) plain.push_back(b.submit(i));
    for (auto& f : timed) {
      const bool ready = ready_by(f, until);
      CHECK(ready);
      if (!ready) continue;
      const Status s = f.get().status();
      CHECK((s == Status::ok || s == Status::deadline_exceeded));
    }
    for (std::size_t i = 0; i < plain.size(); ++i) {
      const bool ready = ready_by(plain[i], until);
      CHECK(ready);
      if (ready) CHECK(plain[i].get().value() == static_cast<int>(i));
    }
    // B's shutdown does not wait for A (still alive and idle).
    std::thread runner;
    const bool finished = shutdown_within(b, bounded, runner);
    CHECK(finished);
    if (!finished) a.shutdown();  // lets the stuck shutdown finish, so that the test ends
    runner.join();
    // And A, idle all along, still serves.
    auto late = a.submit(7);
    REQUIRE(late.wait_for(bounded) == std::future_status::ready);
    CHECK(late.get().value() == 7);
  }
}

TEST_CASE("Shared lanes: two busy Pipelines take turns for one slot") {
  HostLanes lanes(1, 1);
  std::mutex mu;
  std::vector<char> ran;  // which Pipeline ran each batch, in order
  auto model = [&](char who) {
    return [&, who](std::span<const int> in, std::span<int> out, HostLane&) {
      {
        std::lock_guard lock(mu);
        ran.push_back(who);
      }
      std::this_thread::sleep_for(200us);
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
    };
  };
  Pipeline<int, int> a(model('a'), FixedWindow{4, 1ms}, {}, lanes);
  Pipeline<int, int> b(model('b'), FixedWindow{4, 1ms}, {}, lanes);
  constexpr int per = 400;  // 100 full batches each
  std::atomic<int> done{0};
  std::thread feed_a([&] {
    for (int i = 0; i < per; ++i) a.submit(i, [&](Outcome<int>&&) { ++done; });
  });
  std::thread feed_b([&] {
    for (int i = 0; i < per; ++i) b.submit(i, [&](Outcome<int>&&) { ++done; });
  });
  feed_a.join();
  feed_b.join();
  const auto until = std::chrono::steady_clock::now() + bounded;
  while (done.load() < 2 * per && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(done.load() == 2 * per);
  a.shutdown();
  b.shutdown();
  REQUIRE(done.load() == 2 * per);
  // While both had work (up to the batch on which the first of them finished), each ran
  // a fair share of the batches. With the slot taken back by whoever just gave it up,
  // one of them ran nearly all of them.
  std::lock_guard lock(mu);
  std::size_t na = 0;
  std::size_t nb = 0;
  const std::size_t batches_a = a.stats().batches();
  const std::size_t batches_b = b.stats().batches();
  for (char c : ran) {
    (c == 'a' ? na : nb) += 1;
    if (na == batches_a || nb == batches_b) break;
  }
  CAPTURE(na, nb, batches_a, batches_b);
  const std::size_t both = na + nb;
  CHECK(na * 4 >= both);
  CHECK(nb * 4 >= both);
}

TEST_CASE("Shared lanes: a busy Pipeline's requests still expire while another holds every slot") {
  HostLanes lanes(1, 1);
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  std::atomic<bool> entered{false};
  Pipeline<int, int> hog(
      [&](std::span<const int> in, std::span<int> out, HostLane&) {
        entered = true;
        go.wait_for(3 * bounded);
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
      },
      FixedWindow{1, 0ms}, {}, lanes);
  auto held = hog.submit(1);
  while (!entered.load()) std::this_thread::yield();
  Pipeline<int, int> b(echo(), FixedWindow{8, 1ms}, {}, lanes);
  auto f = b.submit(2, {.timeout = 5ms});
  // The only slot is busy: B's request cannot start, and completes as expired, without
  // waiting for the slot.
  const bool expired_while_busy = f.wait_for(bounded) == std::future_status::ready;
  CHECK(expired_while_busy);
  release.set_value();
  REQUIRE(f.wait_for(bounded) == std::future_status::ready);
  CHECK(f.get().status() == Status::deadline_exceeded);
  REQUIRE(held.wait_for(bounded) == std::future_status::ready);
  CHECK(held.get().value() == 1);
  hog.shutdown();
  b.shutdown();
}
