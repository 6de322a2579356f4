// Deadlines, timeouts and arrival times on the Pipeline, on the ManualClock: a deadline is a
// latest start, checked when a batch is handed to its lane; a negative timeout means the
// budget is spent; SubmitOptions::arrival moves the origin of the queue wait, the latency
// and the timeout to when the request reached the server.
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

template <class Policy = FixedWindow, class Adm = AdmitAll>
using ManualPipeline = Pipeline<int, int, Policy, HostLanes, Adm, ManualClock>;

const BatchTime t0 = ManualClock::start();

template <class T>
bool ready(const std::future<T>& f) {
  return f.wait_for(0s) == std::future_status::ready;
}

// Records each batch the model saw and the clock when it was called; answers x -> 10x.
struct Log {
  ManualClock clock;
  std::vector<std::vector<int>> batches;
  std::vector<BatchTime> started;
  auto model() {
    return [this](std::span<const int> in, std::span<int> out, HostLane&) {
      batches.emplace_back(in.begin(), in.end());
      started.push_back(clock.now());
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * 10;
    };
  }
};

}  // namespace

TEST_CASE("Pipeline deadlines: slow callbacks of expired requests run after the next batch starts") {
  // A has expired; its callback takes 5 ms (it advances the manual clock). B (deadline
  // t0 + 12 ms) is formed at t0 + 10 ms. A's callback runs after the batch's model call,
  // so B starts at t0 + 10 ms, in time (it used to start at t0 + 15 ms and expire).
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, log.clock);
  Outcome<int> a_out(Error{Status::failed, RejectReason::none, "not completed", {}});
  BatchTime a_completed{};
  p.submit(1, {.timeout = 5ms}, [&](Outcome<int>&& o) {
    a_out = std::move(o);
    a_completed = log.clock.now();
    log.clock.advance(5ms);
  });
  auto b = p.submit(2, {.deadline = t0 + 12ms});
  auto c = p.submit(3);
  log.clock.advance_to(t0 + 10ms);
  CHECK(p.poll().batches == 1);
  CHECK(a_out.status() == Status::deadline_exceeded);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{2, 3});
  CHECK(log.started[0] == t0 + 10ms);
  CHECK(a_completed >= log.started[0]);  // after the model call
  CHECK(b.get().value() == 20);
  CHECK(c.get().value() == 30);
  const PipelineStats s = p.stats();
  CHECK(s.dropped_at_start == 0);
  CHECK(s.count(Status::deadline_exceeded) == 1);
  CHECK(s.batched_requests == 2);
  CHECK(s.in_flight == 0);
}

TEST_CASE("Pipeline deadlines: 300 slow callbacks of expired requests do not expire a live one") {
  // The live request's deadline is 1 ms after the poll; 300 expired requests' callbacks of
  // 20 us each take 6 ms. They run after the live request's batch has started.
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 1ms}, {}, log.clock);
  int expired = 0;
  for (int i = 0; i < 300; ++i) {
    p.submit(100 + i, {.deadline = t0 + 1ms}, [&](Outcome<int>&& o) {
      expired += o.status() == Status::deadline_exceeded ? 1 : 0;
      log.clock.advance(20us);
    });
  }
  log.clock.advance_to(t0 + 2ms);
  auto live = p.submit(1, {.deadline = t0 + 3ms});
  log.clock.advance_to(t0 + 3ms);
  CHECK(p.poll().batches == 1);
  CHECK(expired == 300);
  REQUIRE(ready(live));
  CHECK(live.get().value() == 10);
  REQUIRE(log.started.size() == 1);
  CHECK(log.started[0] == t0 + 3ms);  // at its deadline: still in time
  CHECK(log.clock.now() == t0 + 9ms);  // the callbacks ran, after it
}

TEST_CASE("Pipeline deadlines: the completions of requests that expired in the queue wait for the model call") {
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, log.clock);
  std::vector<BatchTime> completed_at;
  auto slow = [&](Outcome<int>&& o) {
    CHECK(o.status() == Status::deadline_exceeded);
    completed_at.push_back(log.clock.now());
    log.clock.advance(2ms);
  };
  p.submit(1, {.deadline = t0 + 9ms}, slow);
  p.submit(2, {.deadline = t0 + 9ms}, slow);
  auto keep = p.submit(4, {.deadline = t0 + 11ms});
  log.clock.advance_to(t0 + 10ms);
  CHECK(p.poll().batches == 1);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{4});
  CHECK(log.started[0] == t0 + 10ms);
  CHECK(keep.get().value() == 40);
  REQUIRE(completed_at.size() == 2);
  CHECK(completed_at[0] >= log.started[0]);  // after the model call
  CHECK(p.stats().count(Status::deadline_exceeded) == 2);
}

TEST_CASE("Pipeline deadlines: expired requests complete even when no batch forms") {
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{2, 10ms}, {}, log.clock);
  auto a = p.submit(1, {.deadline = t0 + 1ms});
  log.clock.advance_to(t0 + 2ms);
  CHECK(p.poll().batches == 0);
  REQUIRE(ready(a));
  CHECK(a.get().status() == Status::deadline_exceeded);
  CHECK(log.batches.empty());
  // The lane was never taken: the next batch runs.
  auto d = p.submit(4);
  auto e = p.submit(5);
  CHECK(p.poll().batches == 1);
  CHECK(d.get().value() == 40);
  CHECK(e.get().value() == 50);
}

TEST_CASE("Pipeline deadlines: a negative timeout means the budget is already spent") {
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, log.clock);
  auto f = p.submit(1, {.timeout = -1ms});
  REQUIRE(ready(f));  // inside submit
  Outcome<int> o = f.get();
  CHECK(o.status() == Status::deadline_exceeded);
  CHECK(o.message().find("negative timeout") != std::string::npos);
  bool called = false;
  p.submit(2, {.timeout = -1ns}, [&](Outcome<int>&& x) {
    called = true;
    CHECK(x.status() == Status::deadline_exceeded);
  });
  CHECK(called);
  log.clock.advance(1h);
  p.poll();
  CHECK(log.batches.empty());
  CHECK(p.stats().count(Status::deadline_exceeded) == 2);
}

TEST_CASE("Pipeline deadlines: a zero timeout means no budget") {
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, log.clock);
  auto f = p.submit(1, {.timeout = 0ns});
  log.clock.advance(1h);
  CHECK(p.poll().batches == 1);
  CHECK(f.get().value() == 10);
}

TEST_CASE("Pipeline arrival: queue wait and latency count from the arrival, so does the timeout") {
  ManualClock clock;
  MetricsRegistry reg;
  ManualPipeline<>::Config cfg;
  cfg.metrics = &reg;
  std::vector<std::vector<int>> batches;
  ManualPipeline<> p(
      [&](std::span<const int> in, std::span<int> out, HostLane&) {
        batches.emplace_back(in.begin(), in.end());
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
      },
      FixedWindow{8, 10ms}, cfg, clock);
  auto& wait = reg.histogram("tailbatch_pipeline_queue_wait_seconds", "x", {});
  auto& e2e = reg.histogram("tailbatch_pipeline_end_to_end_seconds", "x", {});
  auto& formation = reg.histogram("tailbatch_pipeline_batch_formation_seconds", "x", {});

  SECTION("the histograms see the earlier time, and the window opened at it") {
    clock.advance(30ms);
    auto f = p.submit(1, {.arrival = t0 + 2ms});
    // The window (10 ms) opened at the arrival, 28 ms ago: the batch is due now.
    CHECK(p.poll().batches == 1);
    CHECK(f.get().value() == 1);
    CHECK(wait.snapshot().count() == 1);
    CHECK(wait.snapshot().min() >= 28ms);
    CHECK(wait.snapshot().max() <= 29ms);
    CHECK(e2e.snapshot().min() >= 28ms);
    CHECK(formation.snapshot().min() >= 28ms);
  }
  SECTION("a timeout counts from the arrival") {
    clock.advance(30ms);
    // Arrived 30 ms ago with a 20 ms budget: already spent.
    auto spent = p.submit(1, {.timeout = 20ms, .arrival = t0});
    REQUIRE(ready(spent));
    CHECK(spent.get().status() == Status::deadline_exceeded);
    // Arrived 30 ms ago with a 35 ms budget: 5 ms left, less than the window.
    auto tight = p.submit(2, {.timeout = 35ms, .arrival = t0});
    auto plain = p.submit(3);
    CHECK_FALSE(ready(tight));
    clock.advance(6ms);
    p.poll();
    CHECK(tight.get().status() == Status::deadline_exceeded);
    clock.advance(10ms);
    CHECK(p.poll().batches == 1);
    CHECK(plain.get().value() == 3);
    REQUIRE(batches.size() == 1);
    CHECK(batches[0] == std::vector<int>{3});
  }
  SECTION("an arrival later than the submit counts as the submit") {
    auto f = p.submit(1, {.arrival = t0 + 1h});
    CHECK(p.poll().next_due == t0 + 10ms);
    clock.advance(10ms);
    CHECK(p.poll().batches == 1);
    CHECK(f.get().ok());
    CHECK(wait.snapshot().max() <= 11ms);
  }
}

TEST_CASE("Pipeline arrival (threads): the arrival is carried on the fast submit path") {
  // Requests without a deadline may be stamped with the cycle counter; one with an
  // arrival carries it as it is. After a warm-up long enough for the counter to be
  // calibrated, every request's end-to-end latency still counts from its arrival.
  MetricsRegistry reg;
  PipelineConfig<int> cfg;
  cfg.metrics = &reg;
  Pipeline<int, int> p([](std::span<const int> in, std::span<int> out, HostLane&) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
  }, FixedWindow{16, 200us}, cfg);
  std::atomic<int> done{0};
  int sent = 0;
  const auto warm_until = std::chrono::steady_clock::now() + 60ms;
  while (std::chrono::steady_clock::now() < warm_until || sent < 64) {
    p.submit(sent++, {.arrival = SteadyClock{}.now() - 50ms}, [&](Outcome<int>&&) { ++done; });
    std::this_thread::sleep_for(100us);
  }
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (done.load() < sent && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(done.load() == sent);
  const HistogramSnapshot e2e = reg.histogram("tailbatch_pipeline_end_to_end_seconds", "x", {}).snapshot();
  CHECK(e2e.count() == static_cast<std::uint64_t>(sent));
  CHECK(e2e.min() >= 50ms);
  CHECK(reg.histogram("tailbatch_pipeline_queue_wait_seconds", "x", {}).snapshot().min() >= 50ms);
}
