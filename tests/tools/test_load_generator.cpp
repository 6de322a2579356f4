// The load generator: arrival processes (statistically, seeded), coordinated-omission-correct
// latency, warm-up, bounds, sweeps and the saturation point. Timing behaviour is checked on
// the ManualClock (virtual time: exact and fast); one sweep on the steady clock checks the
// threaded path with generous bounds.
#include <tailbatch/tools/load_generator.hpp>

#include <tailbatch/pipeline.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::ArrivalProcess;
using tailbatch::ArrivalSchedule;
using tailbatch::LoadConfig;
using tailbatch::LoadProfile;
using tailbatch::ManualClock;
using tailbatch::Status;

namespace {

std::vector<double> arrivals_s(const LoadProfile& p, std::uint64_t seed) {
  ArrivalSchedule s(p, seed);
  std::vector<double> out;
  while (auto t = s.next()) out.push_back(std::chrono::duration<double>(*t).count());
  return out;
}

double ms(std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

TEST_CASE("Poisson arrivals: count, mean gap and coefficient of variation match the rate", "[load][arrivals]") {
  const double rate = 1000.0;
  auto t = arrivals_s(LoadProfile::poisson(rate, 10s), 7);
  // 10 000 expected; the standard deviation of a Poisson count is 100.
  CHECK(std::fabs(static_cast<double>(t.size()) - 10000.0) < 400.0);
  std::vector<double> gaps;
  for (std::size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
  double mean = 0.0;
  for (double g : gaps) mean += g;
  mean /= static_cast<double>(gaps.size());
  double var = 0.0;
  std::size_t longer_than_mean = 0;
  for (double g : gaps) {
    var += (g - mean) * (g - mean);
    if (g > 1.0 / rate) ++longer_than_mean;
  }
  var /= static_cast<double>(gaps.size());
  CHECK(mean == Approx(1.0 / rate).epsilon(0.05));
  CHECK(std::sqrt(var) / mean == Approx(1.0).epsilon(0.05));  // exponential gaps: CV = 1
  // P(gap > 1/rate) = 1/e for exponential gaps.
  CHECK(static_cast<double>(longer_than_mean) / static_cast<double>(gaps.size()) == Approx(std::exp(-1.0)).epsilon(0.05));
  for (std::size_t i = 1; i < t.size(); ++i) REQUIRE(t[i] >= t[i - 1]);
  CHECK(t.back() < 10.0);
}

TEST_CASE("Arrivals are reproducible from the seed", "[load][arrivals]") {
  auto p = LoadProfile::poisson(500.0, 1s);
  CHECK(arrivals_s(p, 3) == arrivals_s(p, 3));
  CHECK(arrivals_s(p, 3) != arrivals_s(p, 4));
}

TEST_CASE("Constant arrivals are evenly spaced, without drift", "[load][arrivals]") {
  auto t = arrivals_s(LoadProfile::constant(300.0, 2s), 1);
  REQUIRE(t.size() == 600);
  for (std::size_t i = 0; i < t.size(); ++i) CHECK(std::fabs(t[i] - static_cast<double>(i) / 300.0) < 1e-9);
}

TEST_CASE("Step and spike profiles change the rate at the phase boundaries", "[load][arrivals]") {
  auto steps = LoadProfile::steps(ArrivalProcess::poisson, {{2s, 200.0}, {1s, 0.0}, {2s, 1000.0}});
  CHECK(steps.duration() == 5s);
  CHECK(steps.rate_at(2500ms) == 0.0);
  CHECK(steps.expected_arrivals(0s, 5s) == Approx(2400.0));
  auto t = arrivals_s(steps, 11);
  std::size_t first = 0, pause = 0, last = 0;
  for (double x : t) (x < 2.0 ? first : x < 3.0 ? pause : last)++;
  CHECK(std::fabs(static_cast<double>(first) - 400.0) < 4 * 20.0);
  CHECK(pause == 0);
  CHECK(std::fabs(static_cast<double>(last) - 2000.0) < 4 * 45.0);

  auto spike = LoadProfile::spike(ArrivalProcess::constant, 100.0, 500.0, 1s, 500ms, 1s);
  auto s = arrivals_s(spike, 1);
  CHECK(s.size() == 100 + 250 + 100);
  CHECK(spike.peak_rps() == 500.0);
}

TEST_CASE("Coordinated omission: a stall inflates the requests that should have been sent during it",
          "[load][co]") {
  // 100 rps for 1 s (a request every 10 ms) against a synchronous target called inline:
  // every call takes 1 ms, except request 50 (due at 500 ms), which stalls for 500 ms. The
  // generator cannot send requests 51..99 until 1000 ms; their latency counts from when they
  // were due, as their users would have waited.
  ManualClock clock;
  std::vector<double> service_ms;  // what a closed-loop tester timing each call would see
  auto target = [&](std::uint64_t i) {
    const auto t0 = clock.now();
    clock.advance(i == 50 ? 500ms : 1ms);
    service_ms.push_back(ms(clock.now() - t0));
    return Status::ok;
  };
  LoadConfig o;
  o.profile = LoadProfile::constant(100.0, 1s);
  auto r = tailbatch::run_load(o, target, clock);
  REQUIRE(r.ok == 100);
  REQUIRE(service_ms.size() == 100);
  // Request 51 was due at 510 ms and completed at 1001 ms; 99 was due at 990, done at 1049.
  CHECK(ms(r.max) == Approx(500.0).epsilon(0.01));
  CHECK(ms(r.p95) > 400.0);   // nearest rank: the sixth worst of 500, 491, 482, ... = 455 ms
  CHECK(ms(r.p50) < 2.0);     // the first half never waited
  CHECK(ms(r.mean) > 100.0);
  CHECK(ms(r.max_send_lag) == Approx(490.0).epsilon(0.01));  // request 51: due 510, sent 1000
  // A tester that timed each call from its actual send would report a p95 of 1 ms.
  std::sort(service_ms.begin(), service_ms.end());
  CHECK(service_ms[94] == Approx(1.0));
}

TEST_CASE("Warm-up requests are sent but not counted", "[load]") {
  ManualClock clock;
  const auto start = clock.now();
  auto target = [&](std::uint64_t) {
    // 10 ms during the first second (a cold cache), 2 ms after.
    clock.advance(clock.now() - start < 1s ? 10ms : 2ms);
    return true;
  };
  LoadConfig o;
  o.profile = LoadProfile::constant(50.0, 2s);
  o.warmup = 1s;
  auto r = tailbatch::run_load(o, target, clock);
  CHECK(r.warmup_requests == 50);
  CHECK(r.due == 50);
  CHECK(r.ok == 50);
  CHECK(ms(r.max) == Approx(2.0).epsilon(0.02));
  CHECK(r.offered_rps == Approx(50.0));
  REQUIRE(r.timeline.size() == 2);
  CHECK(r.timeline[0].warmup);
  CHECK_FALSE(r.timeline[1].warmup);
  CHECK(ms(r.timeline[0].p95) == Approx(10.0).epsilon(0.02));
}

TEST_CASE("Async targets: statuses, error rate and the timeline", "[load]") {
  ManualClock clock;
  // Completes inline after 3 ms; every 10th request is rejected, every 25th fails.
  auto target = [&](std::uint64_t i, tailbatch::LoadCompletion done) {
    clock.advance(3ms);
    if (i % 10 == 9) done(Status::rejected);
    else if (i % 25 == 24) done(false);
    else done(Status::ok);
  };
  LoadConfig o;
  o.profile = LoadProfile::steps(ArrivalProcess::constant, {{1s, 100.0}, {1s, 200.0}});
  o.timeline_interval = 500ms;
  auto r = tailbatch::run_load(o, target, clock);
  CHECK(r.due == 300);
  CHECK(r.by_status[static_cast<int>(Status::rejected)] == 30);
  CHECK(r.by_status[static_cast<int>(Status::failed)] == 6);  // 24, 74, 124, ...: not the 49s
  CHECK(r.failed == 36);
  CHECK(r.ok == 264);
  CHECK(r.error_rate() == Approx(36.0 / 300.0));
  CHECK(ms(r.p99) == Approx(3.0).epsilon(0.02));
  REQUIRE(r.timeline.size() == 4);
  CHECK(r.timeline[0].offered_rps == Approx(100.0));
  CHECK(r.timeline[3].offered_rps == Approx(200.0));
}

TEST_CASE("Bounds: max_requests, max_outstanding and the drain timeout", "[load]") {
  ManualClock clock;
  std::vector<tailbatch::LoadCompletion> held;
  auto never = [&](std::uint64_t, tailbatch::LoadCompletion done) { held.push_back(done); };

  LoadConfig o;
  o.profile = LoadProfile::constant(1000.0, 1s);
  o.max_requests = 120;
  o.max_outstanding = 100;
  o.drain_timeout = 20ms;
  auto r = tailbatch::run_load(o, never, clock);
  CHECK(r.stopped_at_max_requests);
  CHECK(r.due == 120);
  CHECK(r.sent == 100);
  CHECK(r.dropped == 20);
  CHECK(r.timed_out == 100);
  CHECK(r.error_rate() == Approx(1.0));
  // Completing after the run has ended is harmless and changes nothing.
  REQUIRE(held.size() == 100);
  for (auto& d : held) d(Status::ok);
  CHECK(r.ok == 0);
}

TEST_CASE("A target that throws counts as failed", "[load]") {
  ManualClock clock;
  LoadConfig o;
  o.profile = LoadProfile::constant(100.0, 100ms);
  auto sync_throw = [](std::uint64_t) -> Status { throw std::runtime_error("model fell over"); };
  auto r = tailbatch::run_load(o, sync_throw, clock);
  CHECK(r.failed == 10);
  auto async_throw = [](std::uint64_t, tailbatch::LoadCompletion) { throw std::runtime_error("no"); };
  r = tailbatch::run_load(o, async_throw, clock);
  CHECK(r.failed == 10);
  CHECK(r.timed_out == 0);
}

TEST_CASE("Saturation on a synthetic single server with known capacity (virtual time)", "[load][sweep]") {
  // One server, 5 ms per request: capacity 200 rps. Below it every request takes 5 ms;
  // above it the backlog grows for the whole step and p95 leaves the SLO far behind.
  ManualClock clock;
  auto server = [&](std::uint64_t) {
    clock.advance(5ms);
    return Status::ok;
  };
  tailbatch::SweepConfig s;
  s.rates = {50, 100, 150, 190, 250, 300};
  s.process = ArrivalProcess::constant;
  s.step_duration = 2s;
  s.warmup = 200ms;
  s.slo_p95_ms = 20.0;
  auto sweep = tailbatch::run_sweep(s, server, clock);
  REQUIRE(sweep.saturation_point() != nullptr);
  CHECK(sweep.saturation_point()->offered_rps == 190.0);
  CHECK(sweep.points.size() == 5);  // stops after the first failing rate
  CHECK_FALSE(sweep.points.back().meets_slo);
  CHECK(sweep.points.back().verdict.find("> SLO") != std::string::npos);
  CHECK(ms(sweep.points[3].result.p95) == Approx(5.0).epsilon(0.02));
  CHECK(sweep.points[3].result.throughput_rps == Approx(190.0).epsilon(0.01));
  // Capped by the capacity (a little under: the window also pays off the warm-up's backlog).
  CHECK(sweep.points.back().result.throughput_rps > 190.0);
  CHECK(sweep.points.back().result.throughput_rps <= 200.0 + 1e-9);

  const std::string table = tailbatch::format_sweep_table(sweep);
  CHECK(table.find("<- saturation") != std::string::npos);
  CHECK(table.find("saturation point: 190 rps offered") != std::string::npos);
  const std::string svg = tailbatch::render_svg(tailbatch::latency_vs_load_plot(sweep, "single server"));
  CHECK(svg.find("SLO p95 20 ms") != std::string::npos);
  CHECK(svg.find("saturation 190 rps") != std::string::npos);
}

TEST_CASE("Saturation by error rate: a target that sheds load past its capacity", "[load][sweep]") {
  ManualClock clock;
  const auto start = clock.now();
  // Admits at most 100 requests per virtual second, rejects the rest at once.
  std::uint64_t admitted = 0;
  std::int64_t second = -1;
  auto shedding = [&](std::uint64_t, tailbatch::LoadCompletion done) {
    const auto s = std::chrono::duration_cast<std::chrono::seconds>(clock.now() - start).count();
    if (s != second) {
      second = s;
      admitted = 0;
    }
    done(++admitted <= 100 ? Status::ok : Status::rejected);
  };
  tailbatch::SweepConfig s;
  s.rates = {50, 99, 120, 200};
  s.process = ArrivalProcess::constant;
  s.step_duration = 3s;
  s.warmup = 1s;
  s.slo_p95_ms = 50.0;
  s.stop_after_failures = 2;
  auto sweep = tailbatch::run_sweep(s, shedding, clock);
  REQUIRE(sweep.saturation_point() != nullptr);
  CHECK(sweep.saturation_point()->offered_rps == 99.0);
  REQUIRE(sweep.points.size() == 4);
  CHECK(sweep.points[2].verdict.find("errors") != std::string::npos);
}

TEST_CASE("Steady clock: worker threads, progress lines and a real saturation point", "[load][sweep][threads]") {
  // A synchronous target on one worker thread sleeping 4 ms per call: capacity <= 250 rps.
  // At 40 and 80 rps latency stays near 4 ms; at 600 rps the backlog grows by hundreds of
  // requests per second (about 1 s of queueing by the end of the step). Bounds are generous,
  // since the machine is shared and noisy: an SLO of 50 service times, which a loaded machine's
  // late wake-ups at 40 rps stay far below and the overloaded step far above.
  std::atomic<int> concurrent{0}, max_concurrent{0};
  auto sleeper = [&](std::uint64_t) {
    int c = ++concurrent;
    int m = max_concurrent.load();
    while (c > m && !max_concurrent.compare_exchange_weak(m, c)) {
    }
    std::this_thread::sleep_for(4ms);
    --concurrent;
    return Status::ok;
  };
  std::ostringstream progress;
  tailbatch::SweepConfig s;
  s.rates = {40, 80, 600};
  s.process = ArrivalProcess::constant;
  s.step_duration = 700ms;
  s.warmup = 100ms;
  s.slo_p95_ms = 200.0;
  s.base.workers = 1;
  s.base.drain_timeout = 3s;
  s.base.progress = tailbatch::progress_to(progress);
  s.base.progress_interval = 200ms;
  s.base.label = "sleeper";
  auto sweep = tailbatch::run_sweep(s, sleeper, tailbatch::SteadyClock{});
  INFO(tailbatch::format_sweep_table(sweep));
  REQUIRE(sweep.points.size() == 3);
  CHECK(sweep.points[0].meets_slo);
  CHECK(sweep.points[1].meets_slo);
  CHECK_FALSE(sweep.points[2].meets_slo);
  REQUIRE(sweep.saturation_point() != nullptr);
  CHECK(sweep.saturation_point()->offered_rps == 80.0);
  CHECK(ms(sweep.points[0].result.p50) >= 4.0);  // never faster than the service time
  CHECK(sweep.points[2].result.throughput_rps < 300.0);
  CHECK(max_concurrent.load() == 1);
  const std::string lines = progress.str();
  CHECK(lines.find("[sleeper 40 rps 1/3]") != std::string::npos);
  CHECK(lines.find("offered 600 rps") != std::string::npos);
}

TEST_CASE("Asynchronous completion from another thread", "[load][threads]") {
  // A server thread completes requests 2 ms after they arrive, in order.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<tailbatch::LoadCompletion> inbox;
  bool stop = false;
  std::thread server([&] {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !inbox.empty(); });
      if (inbox.empty()) return;
      auto done = inbox.front();
      inbox.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(2ms);
      done(Status::ok);
      lock.lock();
    }
  });
  auto target = [&](std::uint64_t, tailbatch::LoadCompletion done) {
    {
      std::lock_guard lock(mu);
      inbox.push_back(done);
    }
    cv.notify_one();
  };
  LoadConfig o;
  o.profile = LoadProfile::poisson(100.0, 500ms);
  o.drain_timeout = 5s;
  auto r = tailbatch::run_load(o, target);
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  cv.notify_one();
  server.join();
  CHECK(r.due > 20);
  CHECK(r.ok == r.due);
  CHECK(ms(r.p50) >= 2.0);
  CHECK(r.timed_out == 0);
}

TEST_CASE("Bad options throw std::invalid_argument naming the field", "[load]") {
  auto noop = [](std::uint64_t) { return Status::ok; };
  LoadConfig o;
  o.profile = LoadProfile::constant(10.0, 1s);
  o.warmup = 1s;
  CHECK_THROWS_AS(tailbatch::run_load(o, noop, ManualClock{}), std::invalid_argument);
  o.warmup = 0s;
  o.max_outstanding = 0;
  CHECK_THROWS_AS(tailbatch::run_load(o, noop, ManualClock{}), std::invalid_argument);
  CHECK_THROWS_AS(LoadProfile::poisson(-1.0, 1s), std::invalid_argument);
  CHECK_THROWS_AS(LoadProfile::poisson(1.0, 0s), std::invalid_argument);
  CHECK_THROWS_AS(LoadProfile::steps(ArrivalProcess::constant, {}), std::invalid_argument);
  tailbatch::SweepConfig s;
  CHECK_THROWS_AS(tailbatch::run_sweep(s, noop, ManualClock{}), std::invalid_argument);  // no rates
  s.rates = {10};
  s.step_duration = 1s;
  s.warmup = 2s;
  CHECK_THROWS_AS(tailbatch::run_sweep(s, noop, ManualClock{}), std::invalid_argument);
  CHECK_THROWS_AS(tailbatch::linear_rates(10, 5, 3), std::invalid_argument);
  CHECK(tailbatch::linear_rates(100, 300, 3) == std::vector<double>{100, 200, 300});
}

TEST_CASE("Reports: a result summary and a p95-over-time plot", "[load]") {
  ManualClock clock;
  auto target = [&](std::uint64_t) {
    clock.advance(1ms);
    return Status::ok;
  };
  LoadConfig o;
  o.profile = LoadProfile::spike(ArrivalProcess::constant, 100.0, 1500.0, 1s, 1s, 1s);
  o.warmup = 500ms;
  auto r = tailbatch::run_load(o, target, clock);
  // During the spike (1500 rps against a 1 ms server) requests queue behind each other.
  REQUIRE(r.timeline.size() == 3);
  CHECK(r.timeline[1].p95 > r.timeline[0].p95);
  const std::string text = tailbatch::format_load_result(r);
  CHECK(text.find("latency from intended send") != std::string::npos);
  const std::string svg = tailbatch::render_svg(tailbatch::latency_over_time_plot(r, 50.0, "spike"));
  CHECK(svg.find("warm-up ends") != std::string::npos);
  CHECK(svg.find("SLO p95 50 ms") != std::string::npos);
}

TEST_CASE("pipeline_target: a real Pipeline under open-loop load", "[load][threads][pipeline]") {
  // Two host lanes, batches of up to 8 within 2 ms, a model that takes 1 ms per batch.
  struct Req {
    std::uint64_t id;
  };
  struct Resp {
    std::uint64_t id = 0;
  };
  tailbatch::HostLanes lanes(2);
  tailbatch::Pipeline<Req, Resp> pipeline(
      [](std::span<const Req> in, std::span<Resp> out, tailbatch::HostLane&) {
        std::this_thread::sleep_for(1ms);
        for (std::size_t i = 0; i < in.size(); ++i) out[i].id = in[i].id;
      },
      tailbatch::FixedWindow(8, 2ms), {}, lanes);
  LoadConfig o;
  o.profile = LoadProfile::poisson(400.0, 600ms);
  o.warmup = 100ms;
  o.drain_timeout = 5s;
  auto r = tailbatch::run_load(o, tailbatch::pipeline_target(pipeline, [](std::uint64_t i) { return Req{i}; }));
  CHECK(r.due > 100);
  CHECK(r.ok == r.due);
  CHECK(r.error_rate() == 0.0);
  CHECK(ms(r.p50) >= 1.0);  // never faster than the model
  CHECK(pipeline.stats().batches() < pipeline.stats().completed());  // it batched
}
