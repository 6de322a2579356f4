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

TEST_CASE("Pipeline deadlines: a request never starts after its deadline, however long callbacks take") {
  // The case: A has expired; its callback takes 5 ms (it advances the manual
  // clock). B (deadline t0 + 12 ms) is formed at t0 + 10 ms, and would start at t0 + 15 ms,
  // 3 ms after its deadline. C has no deadline and runs.
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, log.clock);
  Outcome<int> a_out(Error{Status::failed, RejectReason::none, "not completed", {}});
  p.submit(1, {.timeout = 5ms}, [&](Outcome<int>&& o) {
    a_out = std::move(o);
    log.clock.advance(5ms);
  });
  auto b = p.submit(2, {.deadline = t0 + 12ms});
  auto c = p.submit(3);
  log.clock.advance_to(t0 + 10ms);
  CHECK(p.poll().batches == 1);
  CHECK(a_out.status() == Status::deadline_exceeded);
  REQUIRE(ready(b));
  Outcome<int> bo = b.get();
  CHECK(bo.status() == Status::deadline_exceeded);
  CHECK_FALSE(bo.message().empty());
  CHECK(c.get().value() == 30);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{3});  // B never reached the model
  CHECK(log.started[0] == t0 + 15ms);
  const PipelineStats s = p.stats();
  CHECK(s.dropped_at_start == 1);
  CHECK(s.count(Status::deadline_exceeded) == 2);
  CHECK(s.batched_requests == 1);
  CHECK(s.in_flight == 0);
}

TEST_CASE("Pipeline deadlines: the completions of requests dropped at the start wait for the model call") {
  // Two expired-at-start requests whose callbacks would each push the clock on: neither
  // runs between the check and the model call, so the survivor starts at the checked time.
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, log.clock);
  std::vector<BatchTime> completed_at;
  // Expire in the first purge: their callbacks move the clock past the others' deadlines.
  p.submit(1, {.deadline = t0 + 9ms}, [&](Outcome<int>&&) { log.clock.advance(2ms); });
  p.submit(2, {.deadline = t0 + 11ms}, [&](Outcome<int>&& o) {
    CHECK(o.status() == Status::deadline_exceeded);
    completed_at.push_back(log.clock.now());
    log.clock.advance(2ms);
  });
  p.submit(3, {.deadline = t0 + 11ms}, [&](Outcome<int>&& o) {
    CHECK(o.status() == Status::deadline_exceeded);
    completed_at.push_back(log.clock.now());
    log.clock.advance(2ms);
  });
  auto keep = p.submit(4, {.deadline = t0 + 12ms});
  log.clock.advance_to(t0 + 10ms);
  CHECK(p.poll().batches == 1);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{4});
  CHECK(log.started[0] == t0 + 12ms);  // at its deadline: still in time
  CHECK(keep.get().value() == 40);
  REQUIRE(completed_at.size() == 2);
  CHECK(completed_at[0] >= log.started[0]);  // after the model call
}

TEST_CASE("Pipeline deadlines: a batch whose every request expired is not run") {
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{2, 10ms}, {}, log.clock);
  p.submit(1, {.deadline = t0 + 1ms}, [&](Outcome<int>&&) { log.clock.advance(5ms); });
  auto b = p.submit(2, {.deadline = t0 + 3ms});
  auto c = p.submit(3, {.deadline = t0 + 3ms});
  log.clock.advance_to(t0 + 2ms);
  p.poll();
  CHECK(log.batches.empty());
  CHECK(b.get().status() == Status::deadline_exceeded);
  CHECK(c.get().status() == Status::deadline_exceeded);
  CHECK(p.stats().batches() == 0);
  // The lane was given back: the next batch runs.
  auto d = p.submit(4);
  auto e = p.submit(5);
  CHECK(p.poll().batches == 1);
  CHECK(d.get().value() == 40);
  CHECK(e.get().value() == 50);
}

TEST_CASE("Pipeline deadlines: a padding policy keeps its batch size when a request is dropped") {
  Log log;
  ManualPipeline<PreferredSizes> p(log.model(), PreferredSizes({2, 4}, 10ms), {}, log.clock);
  p.submit(1, {.deadline = t0 + 1ms}, [&](Outcome<int>&&) { log.clock.advance(5ms); });
  auto b = p.submit(2, {.deadline = t0 + 3ms});
  auto c = p.submit(3);
  auto d = p.submit(4);
  auto e = p.submit(5);
  log.clock.advance_to(t0 + 2ms);
  CHECK(p.poll().batches == 1);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{3, 4, 5, 5});  // 4, the size decided, padded
  CHECK(b.get().status() == Status::deadline_exceeded);
  CHECK(c.get().value() == 30);
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
