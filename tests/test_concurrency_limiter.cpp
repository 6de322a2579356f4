// The ConcurrencyLimiter: permits, rejection, waiting, windows, and the guarantees under
// many threads. Timing behaviour runs on ManualClock; the thread tests assert invariants
// (never a timing) and every wait in them is bounded.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <stdexcept>
#include <tailbatch/concurrency_limiter.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::AimdLimitConfig;
using tailbatch::AimdLimit;
using tailbatch::ConcurrencyLimiter;
using tailbatch::GradientLimitConfig;
using tailbatch::GradientLimit;
using tailbatch::ConcurrencyLimiterConfig;
using tailbatch::LimitWindow;
using tailbatch::ManualClock;
using tailbatch::QueueOrder;
using tailbatch::RejectReason;
using tailbatch::StaticLimit;
using tailbatch::Status;
using tailbatch::WindowSpec;
using tailbatch::test::sanitizer_slowdown;

namespace {

// A learning algorithm the test scripts: it records every window and lets the test decide
// the next limit. The limiter serialises on_window(); the test reads the script after the
// work is done (or through inspect_algorithm()).
struct Script {
  struct Seen {
    std::uint64_t count, drops;
    std::uint32_t max_in_flight, limit;
    std::chrono::nanoseconds min_rtt, max_rtt;
  };
  std::uint32_t limit = 4;
  std::uint32_t max = 64;
  WindowSpec spec{0ns, 1, false};
  std::function<std::uint32_t(const LimitWindow&, std::uint32_t)> decide;
  std::vector<Seen> seen;
  std::uint32_t highest_set = 0;
  Script() { seen.reserve(1 << 16); }
  // A limit of `from` that becomes `to` when the first window closes.
  static std::shared_ptr<Script> jumping(std::uint32_t from, std::uint32_t to) {
    auto script = std::make_shared<Script>();
    script->limit = from;
    script->decide = [to](const LimitWindow&, std::uint32_t) { return to; };
    return script;
  }
};

struct ScriptedLimit {
  static constexpr bool learns = true;
  std::shared_ptr<Script> s;
  [[nodiscard]] std::uint32_t limit() const noexcept { return s->limit; }
  [[nodiscard]] std::uint32_t max_limit() const noexcept { return s->max; }
  [[nodiscard]] WindowSpec next_window() const noexcept { return s->spec; }
  std::uint32_t on_window(const LimitWindow& w) noexcept {
    if (s->seen.size() < s->seen.capacity())
      s->seen.push_back(
          {w.count(), w.drops(), w.max_in_flight(), w.limit(), w.min_rtt(), w.max_rtt()});
    if (s->decide) s->limit = s->decide(w, s->limit);
    s->highest_set = std::max(s->highest_set, s->limit);
    return s->limit;
  }
};
static_assert(tailbatch::LimitAlgorithm<ScriptedLimit>);

using Scripted = ConcurrencyLimiter<ScriptedLimit, ManualClock>;

// Waits (bounded, 20 s of real time) until pred() holds; false if it never did.
template <class Pred>
bool eventually(Pred pred) {
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

}  // namespace

// --- basics ----------------------------------------------------------------------------------

TEST_CASE("try_acquire admits up to the limit, then rejects as overloaded", "[limiter]") {
  ConcurrencyLimiter<> lim(StaticLimit{3});
  CHECK(lim.limit() == 3);
  CHECK(lim.max_limit() == 3);
  auto a = lim.try_acquire();
  auto b = lim.try_acquire();
  auto c = lim.try_acquire();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(c.value().admitted_in_flight() == 3);
  CHECK(c.value().admitted_limit() == 3);
  CHECK(lim.in_flight_approx() == 3);
  auto d = lim.try_acquire();
  REQUIRE_FALSE(d.ok());
  CHECK(d.status() == Status::rejected);
  CHECK(d.reason() == RejectReason::overloaded);
  CHECK(lim.rejected_count(RejectReason::overloaded) == 1);
  CHECK_THROWS_AS(d.value(), tailbatch::BadOutcomeAccess);
  // (string_views compared as bools: Catch2 2.x may be built without string_view support)
  CHECK((d.message() == "tailbatch: the concurrency limit is reached"));
  CHECK(d.error().reason == RejectReason::overloaded);
  CHECK(d.error().status == Status::rejected);
  auto as_outcome = std::move(d).to_outcome();
  CHECK(as_outcome.reason() == RejectReason::overloaded);
  CHECK((as_outcome.message() == d.message()));
  CHECK(a.status() == Status::ok);
  CHECK(a.reason() == RejectReason::none);
  CHECK(a.message().empty());
  a.value().success();
  CHECK(a.ok());  // stays ok after the permit is released
  CHECK(lim.in_flight_approx() == 2);
  CHECK(lim.try_acquire().ok());  // the temporary's permit is released at once
  CHECK(lim.in_flight_approx() == 2);
  tailbatch::Outcome<ConcurrencyLimiter<>::Permit> moved = lim.try_acquire().to_outcome();
  REQUIRE(moved.ok());
  CHECK(moved.value().valid());
  CHECK(lim.in_flight_approx() == 3);
}

TEST_CASE("stats() gathers the limiter's state in one snapshot, shaped like the Pipeline's", "[limiter]") {
  ConcurrencyLimiter<> lim(StaticLimit{2});
  tailbatch::ConcurrencyLimiterStats st = lim.stats();
  CHECK(st.limit == 2);
  CHECK(st.max_limit == 2);
  CHECK(st.in_flight == 0);
  CHECK(st.rejected() == 0);
  CHECK_FALSE(st.shut_down);
  auto a = lim.try_acquire();
  auto b = lim.try_acquire();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK_FALSE(lim.try_acquire().ok());
  CHECK_FALSE(lim.try_acquire().ok());
  st = lim.stats();
  CHECK(st.in_flight == 2);
  CHECK(st.queued == 0);
  CHECK(st.count(RejectReason::overloaded) == 2);
  CHECK(st.count(RejectReason::shutting_down) == 0);
  CHECK(st.rejected() == 2);
  CHECK(st.windows_closed == 0);  // StaticLimit learns nothing
  a.value().success();
  CHECK(lim.stats().in_flight == 1);
  lim.shutdown();
  CHECK_FALSE(lim.try_acquire().ok());
  st = lim.stats();
  CHECK(st.shut_down);
  CHECK(st.limit == 0);
  CHECK(st.count(RejectReason::shutting_down) == 1);
  CHECK(st.rejected() == 3);
}

TEST_CASE("a permit is released exactly once, whichever way it ends", "[limiter]") {
  ConcurrencyLimiter<> lim(StaticLimit{2});
  {
    auto p = lim.try_acquire();
    REQUIRE(p.ok());
    CHECK(lim.in_flight_approx() == 1);
    p.value().success();
    CHECK_FALSE(p.value().valid());
    p.value().success();  // a second report on an empty permit does nothing
    p.value().dropped();
    p.value().ignore();
    CHECK(lim.in_flight_approx() == 0);
  }
  {
    auto p = std::move(lim.try_acquire()).value();
    tailbatch::ConcurrencyLimiter<>::Permit q(std::move(p));
    CHECK_FALSE(p.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    CHECK(q.valid());
    CHECK(lim.in_flight_approx() == 1);
    auto r = std::move(lim.try_acquire()).value();
    CHECK(lim.in_flight_approx() == 2);
    q = std::move(r);  // releases q's own permit first
    CHECK(lim.in_flight_approx() == 1);
    auto& alias = q;
    q = std::move(alias);  // self-move changes nothing
    CHECK(lim.in_flight_approx() == 1);
  }
  CHECK(lim.in_flight_approx() == 0);  // destructor
}

TEST_CASE("a permit is released when the guarded work throws", "[limiter]") {
  auto script = std::make_shared<Script>();
  ManualClock clock;
  Scripted lim(ScriptedLimit{script}, {}, clock);
  auto work = [&](bool fail) {
    auto permit = std::move(lim.try_acquire()).value();
    if (fail) throw std::runtime_error("model failed");
    permit.success();
  };
  for (int i = 0; i < 10; ++i) {
    try {
      work(i % 2 == 0);
    } catch (const std::runtime_error&) {
    }
  }
  CHECK(lim.in_flight_approx() == 0);
  // Only the 5 successes were samples: the failures unwound as "ignore".
  std::uint64_t samples = 0;
  for (const auto& s : script->seen) samples += s.count;
  CHECK(samples == 5);
}

TEST_CASE("every acquire is released exactly once: sample accounting", "[limiter]") {
  auto script = std::make_shared<Script>();
  script->limit = 100;
  ManualClock clock;
  Scripted lim(ScriptedLimit{script}, {}, clock);
  std::vector<Scripted::Permit> held;
  for (int i = 0; i < 60; ++i) held.push_back(std::move(lim.try_acquire()).value());
  clock.advance(3ms);
  int success = 0, dropped = 0;
  for (std::size_t i = 0; i < held.size(); ++i) {
    switch (i % 4) {
      case 0:
        held[i].success();
        ++success;
        break;
      case 1:
        held[i].dropped();
        ++dropped;
        break;
      case 2:
        held[i].ignore();
        break;
      default:
        break;  // the destructor
    }
  }
  held.clear();
  CHECK(lim.in_flight_approx() == 0);
  std::uint64_t samples = 0, drops = 0;
  for (const auto& s : script->seen) {
    samples += s.count;
    drops += s.drops;
    CHECK(s.min_rtt == 3ms);
  }
  CHECK(samples == static_cast<std::uint64_t>(success + dropped));
  CHECK(drops == static_cast<std::uint64_t>(dropped));
}

TEST_CASE("AdmissionPolicy: try_admit and release map statuses to samples", "[limiter]") {
  static_assert(tailbatch::AdmissionPolicy<Scripted>);
  static_assert(tailbatch::AdmissionPolicy<ConcurrencyLimiter<AimdLimit>>);
  static_assert(tailbatch::AdmissionPolicy<ConcurrencyLimiter<GradientLimit>>);
  auto script = std::make_shared<Script>();
  script->limit = 1;
  ManualClock clock;
  Scripted lim(ScriptedLimit{script}, {}, clock);
  auto release = [&](Status s, std::chrono::nanoseconds latency) {
    auto t = lim.try_admit();
    REQUIRE(t.has_value());
    CHECK_FALSE(lim.try_admit().has_value());  // the limit is 1
    lim.release(std::move(*t), s, latency);
    CHECK(lim.in_flight_approx() == 0);
  };
  release(Status::ok, 7ms);
  REQUIRE(script->seen.size() == 1);
  CHECK(script->seen[0].count == 1);
  CHECK(script->seen[0].drops == 0);
  CHECK(script->seen[0].min_rtt == 7ms);  // the latency given, not the clock's
  release(Status::rejected, 9ms);
  release(Status::deadline_exceeded, 11ms);
  REQUIRE(script->seen.size() == 3);
  CHECK(script->seen[1].drops == 1);
  CHECK(script->seen[1].min_rtt == 9ms);
  CHECK(script->seen[2].drops == 1);
  release(Status::cancelled, 1ms);
  release(Status::failed, 1ms);
  CHECK(script->seen.size() == 3);  // no sample
  CHECK(lim.rejected_count(RejectReason::overloaded) == 5);
}

// --- limit changes ---------------------------------------------------------------------------

TEST_CASE("a shrinking limit issues no permit until in-flight falls below it", "[limiter]") {
  auto script = Script::jumping(8, 2);
  ManualClock clock;
  Scripted lim(ScriptedLimit{script}, {}, clock);
  std::vector<Scripted::Permit> held;
  for (int i = 0; i < 8; ++i) held.push_back(std::move(lim.try_acquire()).value());
  CHECK_FALSE(lim.try_acquire().ok());
  held.back().success();  // closes a window: the limit becomes 2 with 7 in flight
  held.pop_back();
  CHECK(lim.limit() == 2);
  CHECK(lim.in_flight_approx() == 7);
  while (held.size() > 2) {
    CHECK_FALSE(lim.try_acquire().ok());
    held.back().ignore();
    held.pop_back();
  }
  CHECK(lim.in_flight_approx() == 2);
  CHECK_FALSE(lim.try_acquire().ok());  // 2 in flight, limit 2
  held.back().ignore();
  held.pop_back();
  auto again = lim.try_acquire();  // 1 in flight: one more fits
  REQUIRE(again.ok());
  CHECK(again.value().admitted_in_flight() == 2);
  CHECK(again.value().admitted_limit() == 2);
  CHECK_FALSE(lim.try_acquire().ok());
}

TEST_CASE("a growing limit hands the new permits to waiters", "[limiter]") {
  auto script = Script::jumping(1, 3);
  ManualClock clock;
  Scripted lim(ScriptedLimit{script}, {}, clock);
  auto first = std::move(lim.try_acquire()).value();
  CHECK_FALSE(lim.try_acquire().ok());
  std::atomic<int> got{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i)
    waiters.emplace_back([&] {
      auto p = lim.acquire_for(1h);
      if (p.ok()) {
        ++got;
        p.value().ignore();
      }
    });
  REQUIRE(eventually([&] { return lim.queued_approx() == 2; }));
  // Releasing the only permit closes a window that raises the limit to 3: both waiters get in.
  first.success();
  for (auto& t : waiters) t.join();
  CHECK(got == 2);
  CHECK(lim.limit() == 3);
}

TEST_CASE("windows close once enough time and samples are in", "[limiter]") {
  auto script = std::make_shared<Script>();
  script->limit = 50;
  script->spec = WindowSpec{100ms, 10, false};
  ManualClock clock;
  Scripted lim(ScriptedLimit{script}, {}, clock);
  auto cycle = [&](int n) {
    std::vector<Scripted::Permit> held;
    for (int i = 0; i < n; ++i) held.push_back(std::move(lim.try_acquire()).value());
    for (auto& p : held) p.success();
  };
  cycle(20);  // plenty of samples, too little time
  CHECK(lim.windows_closed() == 0);
  clock.advance(100ms);
  cycle(1);  // time is up: this release closes the window with all 21 samples
  CHECK(lim.windows_closed() == 1);
  REQUIRE(script->seen.size() == 1);
  CHECK(script->seen[0].count == 21);
  CHECK(script->seen[0].max_in_flight == 20);
  CHECK(script->seen[0].limit == 50);
  clock.advance(150ms);
  cycle(5);  // time is up but 5 < 10 samples: stays open
  CHECK(lim.windows_closed() == 1);
  clock.advance(50ms);
  cycle(5);  // now 10 samples
  CHECK(lim.windows_closed() == 2);
  CHECK(script->seen[1].count == 10);
}

TEST_CASE("AIMD through the limiter: the saw-tooth on a manual clock", "[limiter][aimd]") {
  ManualClock clock;
  ConcurrencyLimiter<AimdLimit, ManualClock> lim(
      AimdLimit(AimdLimitConfig{
          .initial_limit = 10, .min_limit = 1, .window = 100ms, .min_window_samples = 1}),
      {}, clock);
  // A service with room for 12: beyond that the excess is shed (reported as drops).
  constexpr std::uint32_t capacity = 12;
  std::vector<std::uint32_t> limits;
  for (int step = 0; step < 30; ++step) {
    std::vector<ConcurrencyLimiter<AimdLimit, ManualClock>::Permit> held;
    while (true) {
      auto p = lim.try_acquire();
      if (!p.ok()) break;
      held.push_back(std::move(p).value());
    }
    CHECK(held.size() == lim.limit());
    // All but the last finish now; the last one, 100 ms later, closes the window.
    for (std::size_t i = 0; i < held.size(); ++i) {
      if (i + 1 == held.size()) clock.advance(100ms);
      if (i < capacity)
        held[i].success();
      else
        held[i].dropped();
    }
    limits.push_back(lim.limit());
  }
  CHECK(lim.windows_closed() == 30);
  // 10 -> 13, cut to 11, 12, 13, cut to 11, ...
  CHECK(limits[0] == 11);
  CHECK(limits[1] == 12);
  CHECK(limits[2] == 13);
  for (std::size_t i = 3; i < limits.size(); ++i) {
    const std::uint32_t tooth[] = {11, 12, 13};
    CHECK(limits[i] == tooth[i % 3]);
  }
}

namespace {

// A gradient limit whose 100 ms windows close on one sample, probing the minimum RTT with two
// requests at a time on the schedule given.
GradientLimitConfig probing_gradient(std::uint32_t initial_limit, std::chrono::nanoseconds interval,
                                     double jitter, std::uint32_t samples, std::uint64_t seed) {
  return GradientLimitConfig{.initial_limit = initial_limit,
                             .window = 100ms,
                             .min_window_samples = 1,
                             .probe_interval = interval,
                             .probe_jitter = jitter,
                             .probe_samples = samples,
                             .probe_concurrency = 2,
                             .seed = seed};
}

}  // namespace

TEST_CASE("Gradient through the limiter: probes ignore work admitted before them",
          "[limiter][gradient]") {
  // Envoy's MinRTTEpoch: requests admitted before a min-RTT probe began must not count
  // towards it, or the probe would measure the old, queued latency.
  ManualClock clock;
  using Lim = ConcurrencyLimiter<GradientLimit, ManualClock>;
  Lim lim(GradientLimit(probing_gradient(20, 30s, 0, 5, 1)), {}, clock);
  CHECK(lim.limit() == 2);  // the first probe
  for (int i = 0; i < 5; ++i) {
    auto p = std::move(lim.try_acquire()).value();
    clock.advance(5ms);
    p.success();
  }
  CHECK(lim.inspect_algorithm([](const GradientLimit& g) { return g.min_rtt(); }) == 5ms);
  CHECK(lim.limit() == 20);
  std::vector<Lim::Permit> old;
  for (int i = 0; i < 10; ++i) old.push_back(std::move(lim.try_acquire()).value());
  clock.advance(31s);
  old.back().success();  // closes a window past the due time: the probe starts
  old.pop_back();
  CHECK(lim.inspect_algorithm([](const GradientLimit& g) { return g.probing(); }));
  CHECK(lim.limit() == 2);
  for (auto& p : old) p.success();  // 9 slow samples from before the probe: discarded
  old.clear();
  CHECK(lim.inspect_algorithm([](const GradientLimit& g) { return g.probing(); }));
  for (int i = 0; i < 5; ++i) {
    auto p = std::move(lim.try_acquire()).value();
    clock.advance(6ms);
    p.success();
  }
  CHECK_FALSE(lim.inspect_algorithm([](const GradientLimit& g) { return g.probing(); }));
  CHECK(lim.inspect_algorithm([](const GradientLimit& g) { return g.min_rtt(); }) == 6ms);
  CHECK(lim.limit() == 20);  // the limit from before the probe is back
}

TEST_CASE("Gradient through the limiter: re-probes happen on the jittered schedule",
          "[limiter][gradient]") {
  ManualClock clock;
  using Lim = ConcurrencyLimiter<GradientLimit, ManualClock>;
  Lim lim(GradientLimit(probing_gradient(10, 10s, 0.5, 3, 2024)), {}, clock);
  int probes_started = 0;
  bool was_probing = true;
  std::optional<ManualClock::time_point> due;
  for (int step = 0; step < 2000; ++step) {  // 20 s of 10 ms steps
    std::vector<Lim::Permit> held;
    for (int i = 0; i < 2; ++i) held.push_back(std::move(lim.try_acquire()).value());
    clock.advance(10ms);
    for (auto& p : held) p.success();
    const auto [probing, next] = lim.inspect_algorithm(
        [](const GradientLimit& g) { return std::pair(g.probing(), g.next_probe_at()); });
    if (probing && !was_probing) {
      ++probes_started;
      REQUIRE(due.has_value());
      CHECK(clock.now() >= *due);                // never early
      CHECK(clock.now() < *due + 100ms + 10ms);  // at the first window close after it
    }
    if (!probing) {
      if (was_probing) {
        CHECK(next >= clock.now() + 10s);  // interval plus jitter in [0, 5 s)
        CHECK(next < clock.now() + 15s);
      }
      due = next;
    }
    was_probing = probing;
  }
  CHECK(probes_started >= 1);
  CHECK(probes_started <= 2);
}

// --- waiting ---------------------------------------------------------------------------------

TEST_CASE("acquire_for times out as overloaded", "[limiter][wait]") {
  ConcurrencyLimiter<> lim(StaticLimit{1});
  auto held = lim.try_acquire();
  const auto start = std::chrono::steady_clock::now();
  auto r = lim.acquire_for(2ms);
  CHECK(std::chrono::steady_clock::now() - start >= 2ms);  // it never gives up early
  CHECK(r.reason() == RejectReason::overloaded);
  CHECK(lim.queued_approx() == 0);
  CHECK(lim.acquire_for(0ms).reason() == RejectReason::overloaded);
  CHECK(lim.acquire_for(-1s).reason() == RejectReason::overloaded);
}

TEST_CASE("acquire_for on a manual clock times out when the clock passes the deadline",
          "[limiter][wait]") {
  ManualClock clock;
  ConcurrencyLimiter<StaticLimit, ManualClock> lim(StaticLimit{1}, {}, clock);
  auto held = lim.try_acquire();
  std::optional<RejectReason> reason;
  std::thread waiter([&] { reason = lim.acquire_for(100ms).reason(); });
  REQUIRE(eventually([&] { return lim.queued_approx() == 1; }));
  clock.advance(99ms);
  clock.advance(2ms);
  waiter.join();
  CHECK(reason == RejectReason::overloaded);
}

TEST_CASE("acquire_for gets a permit handed over on release", "[limiter][wait]") {
  ConcurrencyLimiter<> lim(StaticLimit{1});
  auto held = std::move(lim.try_acquire()).value();
  bool ok = false;
  std::uint32_t in_flight = 0;
  std::thread waiter([&] {
    auto p = lim.acquire_for(1h);
    ok = p.ok();
    if (ok) in_flight = p.value().admitted_in_flight();
  });
  REQUIRE(eventually([&] { return lim.queued_approx() == 1; }));
  CHECK_FALSE(lim.try_acquire().ok());  // a waiter goes first
  held.success();
  waiter.join();
  CHECK(ok);
  CHECK(in_flight == 1);
  CHECK(lim.in_flight_approx() == 0);
}

TEST_CASE("waiters are served in FIFO order, or LIFO when asked", "[limiter][wait]") {
  for (auto order : {QueueOrder::fifo, QueueOrder::lifo}) {
    ConcurrencyLimiter<> lim(StaticLimit{1}, ConcurrencyLimiterConfig{.queue_order = order});
    auto held = std::move(lim.try_acquire()).value();
    std::mutex m;
    std::vector<int> served;
    std::vector<std::thread> waiters;
    constexpr int n = 6;
    for (int i = 0; i < n; ++i) {
      waiters.emplace_back([&, i] {
        auto p = lim.acquire_for(1h);
        if (!p.ok()) return;
        std::lock_guard lock(m);
        served.push_back(i);
      });  // the permit is released as the thread ends, handing it to the next waiter
      REQUIRE(eventually([&] { return lim.queued_approx() == static_cast<std::uint32_t>(i + 1); }));
    }
    held.success();
    for (auto& t : waiters) t.join();
    std::vector<int> expected(n);
    for (int i = 0; i < n; ++i) expected[i] = order == QueueOrder::fifo ? i : n - 1 - i;
    CHECK(served == expected);
  }
}

TEST_CASE("a full queue rejects at once with queue_full", "[limiter][wait]") {
  ConcurrencyLimiter<> lim(StaticLimit{1}, ConcurrencyLimiterConfig{.queue_capacity = 1});
  auto held = std::move(lim.try_acquire()).value();
  bool first_ok = false;
  std::thread waiter([&] { first_ok = lim.acquire_for(1h).ok(); });
  REQUIRE(eventually([&] { return lim.queued_approx() == 1; }));
  auto second = lim.acquire_for(1h);
  CHECK(second.reason() == RejectReason::queue_full);
  CHECK(lim.rejected_count(RejectReason::queue_full) == 1);
  held.success();
  waiter.join();
  CHECK(first_ok);

  ConcurrencyLimiter<> no_queue(StaticLimit{1}, ConcurrencyLimiterConfig{.queue_capacity = 0});
  auto only = no_queue.try_acquire();
  CHECK(no_queue.acquire_for(1h).reason() == RejectReason::overloaded);
  CHECK(no_queue.queued_approx() == 0);
}

TEST_CASE("shutdown() rejects waiters and later callers as shutting_down", "[limiter][wait]") {
  ConcurrencyLimiter<> lim(StaticLimit{1});
  auto held = std::move(lim.try_acquire()).value();
  std::optional<RejectReason> reason;
  std::thread waiter([&] { reason = lim.acquire_for(1h).reason(); });
  REQUIRE(eventually([&] { return lim.queued_approx() == 1; }));
  lim.shutdown();
  waiter.join();
  CHECK(reason == RejectReason::shutting_down);
  CHECK(lim.is_shut_down());
  CHECK(lim.limit() == 0);
  CHECK(lim.try_acquire().reason() == RejectReason::shutting_down);
  CHECK(lim.acquire_for(1h).reason() == RejectReason::shutting_down);
  CHECK_FALSE(lim.try_admit().has_value());
  CHECK(lim.rejected_count(RejectReason::shutting_down) == 4);
  held.success();  // outstanding permits still release
  CHECK(lim.in_flight_approx() == 0);
  lim.shutdown();  // idempotent
}

// --- many threads ----------------------------------------------------------------------------

namespace {

// How many threads are inside a section at once, and the most there ever were.
struct HighWater {
  std::atomic<int> active{0}, high{0};
  void enter() {
    const int now = active.fetch_add(1) + 1;
    int hw = high.load();
    while (now > hw && !high.compare_exchange_weak(hw, now)) {
    }
  }
  void leave() { active.fetch_sub(1); }
};

// What hammer() saw.
struct Hammered {
  HighWater high_water;  // permits held at once, counted between admission and release
  std::atomic<std::uint64_t> admitted{0}, rejected{0}, wait_failures{0};
};

// Each of `threads` threads asks `lim` for a permit `iterations` times: every `wait_every`-th
// time (staggered by thread) with acquire_for(20s), otherwise with try_acquire(). On each
// permit it calls during(permit, i) while counted in the high water, then release(permit, i)
// after.
template <class Lim, class During, class Release>
void hammer(Lim& lim, int threads, int iterations, int wait_every, Hammered& h, During during,
            Release release) {
  on_threads(threads, [&](int t) {
    for (int i = 0; i < iterations; ++i) {
      const bool wait = (i + t) % wait_every == 0;
      auto r = wait ? lim.acquire_for(20s) : lim.try_acquire();
      if (!r.ok()) {
        (wait ? h.wait_failures : h.rejected).fetch_add(1);
        continue;
      }
      h.admitted.fetch_add(1);
      h.high_water.enter();
      during(r.value(), i);
      h.high_water.leave();
      release(r.value(), i);
    }
  });
}

}  // namespace

TEST_CASE("many threads: in-flight never exceeds a static limit", "[limiter][threads]") {
  for (int threads : {1, 2, 3, 7, 16}) {
    CAPTURE(threads);
    constexpr std::uint32_t limit = 4;
    ConcurrencyLimiter<> lim(StaticLimit{limit});
    Hammered h;
    const int iterations = 20000 / sanitizer_slowdown / threads + 100;
    hammer(
        lim, threads, iterations, 3, h,
        [](auto&, int i) {
          if (i % 7 == 0) std::this_thread::yield();
        },
        [](auto& p, int i) {
          if (i % 2 == 0) p.success();
          // else: the destructor releases it
        });
    CHECK(h.high_water.high.load() <= static_cast<int>(limit));
    CHECK(h.wait_failures.load() == 0);  // no lost wake-up: every bounded wait got its permit
    CHECK(h.admitted.load() + h.rejected.load() ==
          static_cast<std::uint64_t>(threads) * static_cast<std::uint64_t>(iterations));
    CHECK(lim.rejected_count(RejectReason::overloaded) == h.rejected.load());
    CHECK(lim.in_flight_approx() == 0);
    CHECK(lim.queued_approx() == 0);
  }
}

TEST_CASE("many threads: a flapping limit is never exceeded at admission", "[limiter][threads]") {
  for (int threads : {1, 2, 3, 7, 16}) {
    CAPTURE(threads);
    auto script = std::make_shared<Script>();
    script->limit = 8;
    script->spec = WindowSpec{0ns, 8, false};
    // Every window flips the limit between 1 and 8: it shrinks under work in flight.
    script->decide = [](const LimitWindow&, std::uint32_t l) { return l == 8 ? 1U : 8U; };
    ConcurrencyLimiter<ScriptedLimit> lim(ScriptedLimit{script});
    Hammered h;
    std::atomic<std::uint64_t> violations{0};
    hammer(
        lim, threads, 20000 / sanitizer_slowdown / threads + 100, 4, h,
        [&](auto& p, int) {
          if (p.admitted_in_flight() > p.admitted_limit() || p.admitted_in_flight() == 0)
            violations.fetch_add(1);
        },
        [](auto& p, int i) {
          switch (i % 4) {
            case 0:
              p.success();
              break;
            case 1:
              p.dropped();
              break;
            case 2:
              p.ignore();
              break;
            default:
              break;
          }
        });
    CHECK(violations.load() == 0);
    CHECK(h.wait_failures.load() == 0);
    CHECK(h.high_water.high.load() <= 8);
    CHECK(lim.in_flight_approx() == 0);
    CHECK(h.admitted.load() > 0);
    CHECK(lim.windows_closed() > 0);
  }
}

TEST_CASE("many threads: adaptive limits close windows concurrently", "[limiter][threads]") {
  for (int threads : {2, 7, 16}) {
    CAPTURE(threads);
    ConcurrencyLimiter<AimdLimit> aimd(AimdLimit(AimdLimitConfig{.initial_limit = 4,
                                                            .min_limit = 2,
                                                            .max_limit = 32,
                                                            .window = 200us,
                                                            .min_window_samples = 4}));
    ConcurrencyLimiter<GradientLimit> gradient(GradientLimit(GradientLimitConfig{.initial_limit = 4,
                                                                            .min_limit = 2,
                                                                            .max_limit = 32,
                                                                            .window = 200us,
                                                                            .min_window_samples = 4,
                                                                            .probe_interval = 5ms,
                                                                            .probe_samples = 8,
                                                                            .seed = 5}));
    const int iterations = 10000 / sanitizer_slowdown / threads + 100;
    on_threads(threads, [&](int t) {
      for (int i = 0; i < iterations; ++i) {
        if (auto p = aimd.try_acquire(); p.ok()) {
          if ((i + t) % 50 == 0)
            p.value().dropped();
          else
            p.value().success();
        }
        if (auto p = gradient.try_acquire(); p.ok()) p.value().success();
      }
    });
    CHECK(aimd.in_flight_approx() == 0);
    CHECK(gradient.in_flight_approx() == 0);
    CHECK(aimd.limit() >= 2);
    CHECK(aimd.limit() <= 32);
    CHECK(gradient.limit() <= 32);
  }
}

// --- overload --------------------------------------------------------------------------------

namespace {

// A discrete-event model of a service with fixed capacity: `slots` requests run at once,
// each takes `service`; more wait in the service's own FIFO. Requests arrive as a Poisson
// process at `offered` per second for `duration`; each goes through try_acquire() first.
struct OverloadReport {
  std::uint64_t offered = 0, admitted = 0, rejected = 0;
  std::size_t max_service_queue = 0;
  std::uint32_t max_in_flight = 0;
  // p95 of the admitted requests' latency: over the whole run, and over those arriving after
  // the first 6 s (adaptive limits start from their initial limit and need a few seconds of
  // windows to find the service's capacity).
  std::chrono::nanoseconds p95_all{0}, p95_steady{0};
  double goodput_per_s = 0;
};

template <class Alg>
OverloadReport run_overload(Alg algorithm, std::chrono::seconds duration) {
  constexpr int slots = 4;
  constexpr auto service = 20ms;         // capacity C = slots / service = 200 requests/s
  constexpr double offered_per_s = 600;  // 3 x C
  ManualClock clock;
  using Lim = ConcurrencyLimiter<Alg, ManualClock>;
  Lim lim(std::move(algorithm), {}, clock);
  const auto start = clock.now();
  const auto end = start + duration;

  struct Job {
    typename Lim::Permit permit;
    ManualClock::time_point arrived;
  };
  struct Running {
    ManualClock::time_point done;
    std::size_t job;
    bool operator>(const Running& o) const { return done > o.done; }
  };
  std::vector<Job> jobs;
  jobs.reserve(static_cast<std::size_t>(offered_per_s * static_cast<double>(duration.count()) * 2));
  std::deque<std::size_t> service_queue;
  std::priority_queue<Running, std::vector<Running>, std::greater<>> running;
  std::vector<std::pair<ManualClock::time_point, std::chrono::nanoseconds>> latencies;

  OverloadReport r;
  std::uint64_t rng = 0x5EED;
  auto uniform = [&] {
    rng += 0x9E3779B97F4A7C15ULL;
    std::uint64_t z = rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (static_cast<double>((z ^ (z >> 31)) >> 11) + 0.5) * 0x1.0p-53;
  };
  auto complete_until = [&](ManualClock::time_point t) {
    while (!running.empty() && running.top().done <= t) {
      const auto done = running.top();
      running.pop();
      clock.advance_to(done.done);
      auto& job = jobs[done.job];
      latencies.emplace_back(job.arrived, done.done - job.arrived);
      job.permit.success();
      if (!service_queue.empty()) {
        running.push({clock.now() + service, service_queue.front()});
        service_queue.pop_front();
      }
    }
  };
  auto next_arrival = start;
  while (next_arrival < end) {
    complete_until(next_arrival);
    clock.advance_to(next_arrival);
    ++r.offered;
    auto p = lim.try_acquire();
    if (p.ok()) {
      ++r.admitted;
      r.max_in_flight = std::max(r.max_in_flight, p.value().admitted_in_flight());
      jobs.push_back({std::move(p).value(), clock.now()});
      if (running.size() < static_cast<std::size_t>(slots)) {
        running.push({clock.now() + service, jobs.size() - 1});
      } else {
        service_queue.push_back(jobs.size() - 1);
        r.max_service_queue = std::max(r.max_service_queue, service_queue.size());
      }
    } else {
      // Rejected at its arrival instant: zero time spent, nothing queued.
      CHECK(p.reason() == RejectReason::overloaded);
      ++r.rejected;
    }
    const double gap_s = -std::log(uniform()) / offered_per_s;
    next_arrival += std::chrono::nanoseconds(static_cast<std::int64_t>(gap_s * 1e9));
  }
  complete_until(ManualClock::time_point::max());
  CHECK(lim.in_flight_approx() == 0);

  auto p95 = [](std::vector<std::chrono::nanoseconds> v) {
    if (v.empty()) return std::chrono::nanoseconds{0};
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(v.size()))) - 1];
  };
  std::vector<std::chrono::nanoseconds> all, steady;
  for (const auto& [arrived, latency] : latencies) {
    all.push_back(latency);
    if (arrived >= start + 6s) steady.push_back(latency);  // once the limit has converged
  }
  r.p95_all = p95(all);
  r.p95_steady = p95(steady);
  r.goodput_per_s = static_cast<double>(latencies.size()) / static_cast<double>(duration.count());
  return r;
}

}  // namespace

TEST_CASE("overload: 3x capacity keeps admitted p95 within the SLO, queues bounded",
          "[limiter][overload]") {
  constexpr auto slo = 50ms;
  const auto duration = std::chrono::seconds(20);
  // An adaptive limit (capped at 100) settles within the first seconds: after that the SLO
  // holds, most of the capacity is served and the excess is rejected.
  auto check_adaptive = [&](const OverloadReport& r) {
    CHECK(r.max_in_flight <= 100);
    CHECK(r.max_service_queue <= 100);
    CHECK(r.p95_steady <= slo);
    CHECK(r.goodput_per_s > 180);
    CHECK(r.rejected > r.offered / 2);
  };
  SECTION("static limit sized by Little's law") {
    // 200 requests/s x 20 ms = 4 in service; allow one more round queued: 8.
    const auto r = run_overload(StaticLimit{8}, duration);
    CHECK(r.max_in_flight <= 8);
    CHECK(r.max_service_queue <= 4);
    CHECK(r.p95_all <= slo);
    CHECK(r.goodput_per_s > 190);  // the service stays busy
    CHECK(r.rejected > r.offered / 2);
  }
  SECTION("AIMD with a latency target") {
    const auto r = run_overload(AimdLimit(AimdLimitConfig{.initial_limit = 20,
                                                     .min_limit = 1,
                                                     .max_limit = 100,
                                                     .latency_target = 40ms,
                                                     .target_percentile = 95,
                                                     .window = 250ms,
                                                     .min_window_samples = 10}),
                                duration);
    check_adaptive(r);
  }
  SECTION("gradient") {
    const auto r = run_overload(GradientLimit(GradientLimitConfig{.initial_limit = 20,
                                                             .min_limit = 2,
                                                             .max_limit = 100,
                                                             .sample_percentile = 90,
                                                             .window = 250ms,
                                                             .probe_interval = 10s,
                                                             .seed = 11}),
                                duration);
    check_adaptive(r);
  }
}

// --- metrics ---------------------------------------------------------------------------------

TEST_CASE("metrics: limit, in-flight, queued and rejections by reason", "[limiter][metrics]") {
  tailbatch::MetricsRegistry registry;
  ManualClock clock;
  {
    ConcurrencyLimiter<AimdLimit, ManualClock> lim(
        AimdLimit(AimdLimitConfig{
            .initial_limit = 1, .min_limit = 1, .window = 10ms, .min_window_samples = 1}),
        ConcurrencyLimiterConfig{
            .queue_capacity = 0, .metrics = &registry, .metric_labels = {{"pipeline", "classifier"}}},
        clock);
    auto a = std::move(lim.try_acquire()).value();
    CHECK_FALSE(lim.try_acquire().ok());
    CHECK_FALSE(lim.try_admit().has_value());
    CHECK(lim.acquire_for(1s).reason() == RejectReason::overloaded);  // queue_capacity = 0
    clock.advance(20ms);
    a.success();  // closes a window: mean RTT 20 ms, limit 1 -> 2
    const auto text = registry.prometheus();
    CAPTURE(text);
    CHECK(text.find("tailbatch_limiter_limit{pipeline=\"classifier\"} 2") != std::string::npos);
    CHECK(text.find("tailbatch_limiter_max_limit{pipeline=\"classifier\"} 200") !=
          std::string::npos);
    CHECK(text.find("tailbatch_limiter_in_flight{pipeline=\"classifier\"} 0") != std::string::npos);
    CHECK(text.find("tailbatch_limiter_queued{pipeline=\"classifier\"} 0") != std::string::npos);
    CHECK(text.find("tailbatch_limiter_rejections_total{pipeline=\"classifier\",reason="
                    "\"overloaded\"} 3") != std::string::npos);
    CHECK(text.find("tailbatch_limiter_rejections_total{pipeline=\"classifier\",reason=\"queue_"
                    "full\"} 0") != std::string::npos);
    CHECK(text.find("tailbatch_limiter_window_rtt_seconds{pipeline=\"classifier\"} 0.02") !=
          std::string::npos);
    auto b = std::move(lim.try_acquire()).value();
    CHECK(registry.prometheus().find("tailbatch_limiter_in_flight{pipeline=\"classifier\"} 1") !=
          std::string::npos);
  }
  // The limiter is gone: its gauges went with it, the counters stay.
  const auto after = registry.prometheus();
  CHECK(after.find("tailbatch_limiter_in_flight") == std::string::npos);
  CHECK(after.find("tailbatch_limiter_rejections_total") != std::string::npos);
  // A static limiter has no window RTT gauge.
  ConcurrencyLimiter<> plain(StaticLimit{5}, ConcurrencyLimiterConfig{.metrics = &registry});
  CHECK(registry.prometheus().find("tailbatch_limiter_limit 5") != std::string::npos);
}
