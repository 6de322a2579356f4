// AdaptiveWindow: what it learns (cost per batch size, arrival rate), how it decides (the
// plan's window and size, the backlog and SLO rules, the lookahead, cold start), what it
// exposes, and the goals on a subset of the simulated profiles and the changing
// load. Time comes from a ManualClock: the views are built by hand at chosen times, or
// the simulator drives the policy.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/detail/hash.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/tools/simulator.hpp>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

AdaptiveWindowConfig config(std::chrono::nanoseconds slo = 150ms, std::size_t max_batch = 64) {
  AdaptiveWindowConfig c;
  c.slo_p95 = slo;
  c.max_batch = max_batch;
  return c;
}

BatchFeedback feedback(std::size_t size, std::chrono::nanoseconds t,
                       BatchTime started = ManualClock::start()) {
  return {.size = size, .padded_size = size, .model_time = t, .started = started};
}

// Teaches `p` a cost L(b) for every size up to `up_to`, `times` samples each.
template <class Cost>
void teach(const AdaptiveWindow& p, Cost cost, std::size_t up_to, int times = 4,
           BatchTime at = ManualClock::start()) {
  for (int k = 0; k < times; ++k)
    for (std::size_t b = 1; b <= up_to; ++b) p.on_batch_executed(feedback(b, cost(b), at));
}

// A queue of n requests that arrived `spacing` apart, the last one at `last`.
std::vector<BatchCandidate> queue_of(std::size_t n, BatchTime last, BatchDuration spacing) {
  std::vector<BatchCandidate> v;
  for (std::size_t i = 0; i < n; ++i)
    v.push_back(BatchCandidate{last - spacing * static_cast<BatchDuration::rep>(n - 1 - i),
                               BatchTime::max(), 1, Priority::normal});
  return v;
}

BatchView view_of(const std::vector<BatchCandidate>& c, BatchTime now, std::size_t lanes = 2,
                  bool flush = false) {
  BatchView v{std::span<const BatchCandidate>(c), c.size(), now, flush};
  v.lanes = lanes;
  v.idle_lanes = lanes;
  return v;
}

// The same with every lane busy: the plan's rule alone decides (the lookahead weighs a
// choice only for a lane that is idle), and nothing is counted as dispatched.
BatchView busy_view_of(const std::vector<BatchCandidate>& c, BatchTime now, std::size_t lanes = 2) {
  BatchView v = view_of(c, now, lanes);
  v.idle_lanes = 0;
  return v;
}

// The value of one series in a Prometheus text exposition (-1 when it is absent).
double series_value(const std::string& text, const std::string& series) {
  const auto at = text.find(series + " ");
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 1));
}

// Feeds `count` arrivals `gap` apart through decide(), one view per arrival, dispatching
// whatever decide() asks for (as a Pipeline would). The clock ends at the last arrival.
void drive_arrivals(const AdaptiveWindow& p, ManualClock& clock, std::size_t count,
                    BatchDuration gap, std::size_t lanes = 2) {
  std::vector<BatchCandidate> q;
  for (std::size_t i = 0; i < count; ++i) {
    clock.advance(gap);
    q.push_back(BatchCandidate{clock.now(), BatchTime::max(), 1, Priority::normal});
    const BatchDecision d = p.decide(view_of(q, clock.now(), lanes));
    q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(d.count));
  }
}

// The lowest p95 the planner's grid offers on one lane at `rate` for sizes up to 32 (its
// windows are fractions of `call`, the cost of a batch of one, in seconds).
double lowest_p95(const AdaptiveWindow& p, double rate, double call) {
  double low = 1e300;
  for (double f : {0.0, 0.025, 0.05, 0.1, 0.15, 0.25, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0})
    for (std::size_t b : {1u, 2u, 3u, 4u, 6u, 8u, 12u, 16u, 24u, 32u})
      low = std::min(low, p.predict(rate, 1, b,
                                    std::chrono::duration_cast<BatchDuration>(
                                        std::chrono::duration<double>(f * call)))
                              .predicted_p95_s);
  return low;
}

const LinearCost example1_cost{20ms, 3ms};

// `count` arrivals `gap` apart (drive_arrivals), then Example 1's cost taught for every size
// up to 64, `times` times, at the time they ended: a window under steady load with a model.
void load_and_teach(const AdaptiveWindow& p, ManualClock& clock, std::size_t count,
                    BatchDuration gap, int times = 4) {
  drive_arrivals(p, clock, count, gap);
  teach(p, example1_cost, 64, times, clock.now());
}

}  // namespace

TEST_CASE("AdaptiveWindow: bad configuration names the field", "[adaptive]") {
  CHECK_THROWS_MATCHES(AdaptiveWindow(config(0ms)), std::invalid_argument,
                       MessageContains("slo_p95"));
  AdaptiveWindowConfig c = config();
  c.slo_p99 = 100ms;  // tighter than the p95 target
  CHECK_THROWS_MATCHES(AdaptiveWindow(c), std::invalid_argument, MessageContains("slo_p99"));
  CHECK_THROWS_MATCHES(AdaptiveWindow(config(150ms, 0)), std::invalid_argument,
                       MessageContains("max_batch"));
  CHECK_THROWS_MATCHES(AdaptiveWindow(config(150ms, AdaptiveWindow::max_batch_limit + 1)),
                       std::invalid_argument, MessageContains("max_batch"));
  static_assert(BatchPolicy<AdaptiveWindow> && BatchFeedbackPolicy<AdaptiveWindow>);
}

TEST_CASE("AdaptiveWindow: cold start holds nothing: what is queued goes at once, up to the cap",
          "[adaptive]") {
  ManualClock clock;
  const AdaptiveWindow p(config(150ms, 8));
  const auto one = queue_of(1, clock.now(), 1ms);
  BatchDecision d = p.decide(view_of(one, clock.now()));
  CHECK(d.count == 1);
  const auto twelve = queue_of(12, clock.now(), 1ms);
  d = p.decide(view_of(twelve, clock.now()));
  CHECK(d.count == 8);
  CHECK(d.reason == DispatchReason::size);
  CHECK(p.plan().batch == 8);
  CHECK(p.plan().window == BatchDuration::zero());
  CHECK(p.cost_model().samples == 0);
}

TEST_CASE(
    "AdaptiveWindow: learns a linear cost from noisy timings, and extrapolates to sizes it has not "
    "seen",
    "[adaptive]") {
  const AdaptiveWindow p(config());
  // +-10 % noise from a fixed sequence; sizes 1..8 only.
  std::uint64_t x = 12345;
  for (int k = 0; k < 40; ++k) {
    for (std::size_t b = 1; b <= 8; ++b) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const double noise = 0.9 + 0.2 * static_cast<double>(x >> 11) / 9007199254740992.0;
      p.on_batch_executed(feedback(
          b, std::chrono::duration_cast<std::chrono::nanoseconds>(example1_cost(b) * noise)));
    }
  }
  const AdaptiveCostModel m = p.cost_model();
  CHECK(m.samples == 320);
  CHECK(m.sizes_seen == 8);
  // L(b) = 17 ms + 3 ms x b.
  CHECK(m.slope_s == Approx(0.003).epsilon(0.1));
  CHECK(m.intercept_s == Approx(0.017).epsilon(0.1));
  for (std::size_t b : {1u, 4u, 8u, 16u, 32u, 64u}) {
    INFO("size " << b);
    CHECK(p.estimate_seconds(b) ==
          Approx(std::chrono::duration<double>(example1_cost(b)).count()).epsilon(0.1));
  }
}

TEST_CASE("AdaptiveWindow: a cost that is not linear is followed piecewise where sizes were seen",
          "[adaptive]") {
  const AdaptiveWindow p(config(150ms, 32));
  // A model padded to 8 and 16 and 32: flat steps.
  auto stepped = [](std::size_t b) -> std::chrono::nanoseconds {
    return b <= 8 ? 10ms : b <= 16 ? 14ms : 22ms;
  };
  teach(p, stepped, 32);
  for (std::size_t b : {1u, 5u, 8u, 9u, 16u, 17u, 32u}) {
    INFO("size " << b);
    CHECK(p.estimate_seconds(b) ==
          Approx(std::chrono::duration<double>(stepped(b)).count()).epsilon(0.01));
  }
  // Between seen sizes it interpolates; sizes 1 and 8 seen only: halfway is halfway.
  const AdaptiveWindow q(config(150ms, 32));
  for (int k = 0; k < 4; ++k) {
    q.on_batch_executed(feedback(1, 10ms));
    q.on_batch_executed(feedback(9, 26ms));
  }
  CHECK(q.estimate_seconds(5) == Approx(0.018).epsilon(0.01));
}

TEST_CASE(
    "AdaptiveWindow: a cost that flattens at the largest size seen extrapolates to cheaper larger "
    "batches",
    "[adaptive]") {
  // Sizes 1..8 only, 300 us a request up to 6, then flatter: 2.0 ms at 7, 2.1 ms at 8. The
  // fitted line (about 0.09 ms + 0.27 ms x b) lies above the mean at 8; extended from
  // there with the line's slope, a batch of 32 would cost more per request than one of 8
  // (0.267 against 0.2625 ms): with a plan whose target is 8, a backlog would go 8 at a
  // time, and the larger sizes would never be run and measured (a live run stuck at
  // batches of 8 at a rate they cannot serve, where the fixed window sent 23 on average).
  const auto flattening = [](std::size_t b) -> std::chrono::nanoseconds {
    constexpr std::array<std::int64_t, 9> us{0, 300, 600, 900, 1200, 1500, 1800, 2000, 2100};
    return std::chrono::microseconds(us[b]);
  };
  ManualClock clock;
  const AdaptiveWindow p(config(50ms, 32));
  drive_arrivals(p, clock, 2000, 1ms, 1);     // 1000 requests/s on one lane
  teach(p, flattening, 8, 128, clock.now());  // enough batches for a plan to finish
  CHECK(p.estimate_seconds(8) == Approx(0.0021).epsilon(0.01));
  const double per8 = p.estimate_seconds(8) / 8.0;
  CHECK(p.estimate_seconds(16) / 16.0 < per8);
  CHECK(p.estimate_seconds(32) / 32.0 < 0.98 * per8);
  // Not below what the sizes seen say a request costs at the margin (0.1-0.3 ms).
  CHECK(p.estimate_seconds(32) - p.estimate_seconds(8) > 24 * 0.0001);
  // The lane free, 40 queued: a batch at the cap, as the fixed window at the cap sends.
  auto many = queue_of(40, clock.now(), 5us);
  CHECK(p.decide(view_of(many, clock.now(), 1)).count == 32);
}

TEST_CASE(
    "AdaptiveWindow: a backlog on one lane goes at the cap where the line says larger batches "
    "are cheaper, though one size's mean is lower",
    "[adaptive]") {
  // 0.3 ms + 0.24 ms x b for sizes 1..16, but 12 measured cheap (2.6 ms against the line's
  // 3.18). The table never models a batch cheaper than a smaller one, so 12 costs 11's
  // 2.94 ms there: 0.245 ms a request, the least of any size (16: 0.259; 32, extended
  // from 16: 0.246, not 2 % less). At 4300 requests/s the plan's target is 12; by the table
  // alone a backlog would go 12 at a time, and the cap would never be run (live, a lane
  // stuck at batches of 12 below the rate where the fixed window sent 28). The line over
  // the sizes seen (about 0.31 ms + 0.234 ms x b, a cost per call > 0) says a batch of 32
  // is 6 % cheaper per request (0.244 against 0.260 ms).
  const auto dip = [](std::size_t b) -> std::chrono::nanoseconds {
    return std::chrono::microseconds(b == 12 ? 2600 : 300 + 240 * static_cast<std::int64_t>(b));
  };
  ManualClock clock;
  const AdaptiveWindow p(config(50ms, 32));
  drive_arrivals(p, clock, 4300, std::chrono::nanoseconds(232558), 1);  // 4300/s, one lane
  teach(p, dip, 16, 128, clock.now());
  REQUIRE(p.plan().batch == 12);
  CHECK(p.estimate_seconds(32) / 32.0 > 0.98 * p.estimate_seconds(12) / 12.0);
  CHECK(p.cost_model().intercept_s > 0.0);
  // The lane free, 40 queued: a batch at the cap, as the fixed window at the cap sends.
  auto many = queue_of(40, clock.now(), 5us);
  CHECK(p.decide(view_of(many, clock.now(), 1)).count == 32);
}

TEST_CASE("AdaptiveWindow: one stall does not move the model; a drifting model is followed",
          "[adaptive]") {
  const AdaptiveWindow p(config(150ms, 16));
  teach(p, example1_cost, 16, 8);
  const double before = p.estimate_seconds(4);
  p.on_batch_executed(feedback(4, 3s));  // a page fault, a GC pause
  CHECK(p.estimate_seconds(4) == Approx(before).epsilon(0.15));
  // The model becomes twice as slow: within a few dozen batches per size the estimate follows.
  teach(
      p, [](std::size_t b) { return 2 * example1_cost(b); }, 16, 64);
  CHECK(p.estimate_seconds(4) == Approx(2 * before).epsilon(0.1));
}

TEST_CASE(
    "AdaptiveWindow: the planner compares windows on the same slow spells: a longer window never "
    "predicts a lower p95 at light load",
    "[adaptive]") {
  // A cost line like the demo's classifier (0.4 ms + 0.17 ms a request), each batch's time
  // spread log-normally (sigma 0.35) from a fixed generator. The planner replays the spread
  // on its simulated batches; each batch draws the ratio of its first request's place, so
  // two windows that batch a few requests differently still meet the same slow spells at
  // the same requests. Drawn per batch in order instead, one batch merged early shifts
  // every later draw, and the predicted p95 of the longer window came out below the
  // shorter's at 4 of these 1200 steps.
  std::uint64_t state = 0;
  const auto uniform = [&state] {  // splitmix64, (0, 1)
    const std::uint64_t z = detail::mix64(state += 0x9e3779b97f4a7c15ULL);
    return (static_cast<double>(z >> 11) + 0.5) * 0x1.0p-53;
  };
  std::size_t decreasing = 0, steps = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    state = seed;
    const AdaptiveWindow p(config(50ms, 32));
    for (std::size_t k = 0; k < 2000; ++k) {
      const std::size_t b = 1 + k % 8;
      const double u1 = uniform(), u2 = uniform();  // in this order, whatever the compiler
      const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      const double seconds = (0.4e-3 + 0.17e-3 * static_cast<double>(b)) * std::exp(0.35 * normal);
      p.on_batch_executed(
          feedback(b, std::chrono::nanoseconds(static_cast<std::int64_t>(seconds * 1e9))));
    }
    for (const double rate : {300.0, 700.0}) {
      double last = 0.0;
      for (int i = 0; i <= 20; ++i) {
        const double p95 = p.predict(rate, 2, 32, 50us * i).predicted_p95_s;
        REQUIRE(p95 > 0.0);
        if (i > 0) {
          ++steps;
          if (p95 < last) {
            ++decreasing;
            INFO("spread " << seed << ", " << rate << " requests/s: window " << 50 * i
                           << " us predicts p95 " << p95 << " s, " << 50 * (i - 1)
                           << " us " << last << " s");
            CHECK(p95 >= last);
          }
        }
        last = p95;
      }
    }
  }
  CHECK(steps == 30 * 2 * 20);
  CHECK(decreasing == 0);
}

TEST_CASE("AdaptiveWindow: failed batches and empty timings teach nothing", "[adaptive]") {
  const AdaptiveWindow p(config());
  BatchFeedback f = feedback(4, 30ms);
  f.failed = true;
  p.on_batch_executed(f);
  p.on_batch_executed(feedback(4, 0ms));
  CHECK(p.cost_model().samples == 0);
  CHECK(p.estimate_seconds(4) == 0.0);
}

TEST_CASE("AdaptiveWindow: the arrival rate is counted from the queue, also behind a backlog",
          "[adaptive]") {
  ManualClock clock;
  const AdaptiveWindow p(config());
  CHECK(p.rate_rps(clock.now()) == 0.0);
  drive_arrivals(p, clock, 600, 5ms);  // 200 requests/s
  CHECK(p.rate_rps(clock.now()) == Approx(200.0).epsilon(0.02));
  // A backlog the view cannot show (queued far beyond the candidates): still counted.
  // The lanes free every 20 ms and take 4 each time while 10 arrive (500/s).
  const AdaptiveWindow q(config(150ms, 4));
  std::uint64_t queued = 0;
  const BatchTime start = clock.now();
  for (int i = 0; i < 150; ++i) {
    clock.advance(20ms);
    queued += 10;
    const auto shown = queue_of(4, start + 20ms * i / 3, 2ms);  // the oldest, long ago
    BatchView v = view_of(shown, clock.now());
    v.queued = static_cast<std::size_t>(queued);
    const BatchDecision d = q.decide(v);
    REQUIRE(d.count == 4);
    queued -= d.count;
  }
  CHECK(queued > 800);
  CHECK(q.rate_rps(clock.now()) == Approx(500.0).epsilon(0.05));
  // Load that stops: the estimate falls while nothing arrives.
  clock.advance(5s);
  CHECK(p.rate_rps(clock.now()) < 20.0);
}

TEST_CASE(
    "AdaptiveWindow: a dispatch decided with no idle lane is not counted until a lane runs it",
    "[adaptive]") {
  // The Pipeline asks the policy before it leases a lane; with every lane busy a dispatch
  // is not acted on: the requests stay queued and are shown again. Arrivals 5 ms apart
  // (200/s); a lane frees at every fourth one and takes what the policy dispatches.
  ManualClock clock;
  const AdaptiveWindow p(config());  // cold start: dispatches whatever is queued
  std::vector<BatchCandidate> q;
  for (std::size_t i = 0; i < 600; ++i) {
    clock.advance(5ms);
    q.push_back(BatchCandidate{clock.now(), BatchTime::max(), 1, Priority::normal});
    BatchView v = view_of(q, clock.now());
    v.idle_lanes = i % 4 == 3 ? 1 : 0;
    const BatchDecision d = p.decide(v);
    CHECK(d.count == q.size());
    if (v.idle_lanes > 0) q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(d.count));
  }
  CHECK(p.rate_rps(clock.now()) == Approx(200.0).epsilon(0.02));
}

TEST_CASE("AdaptiveWindow: a change of load is caught within a hundred arrivals", "[adaptive]") {
  ManualClock clock;
  const AdaptiveWindow p(config());
  drive_arrivals(p, clock, 1500, 20ms);  // 50 requests/s
  CHECK(p.rate_rps(clock.now()) == Approx(50.0).epsilon(0.02));
  drive_arrivals(p, clock, 100, 2500us);  // 400 requests/s
  CHECK(p.rate_rps(clock.now()) == Approx(400.0).epsilon(0.1));
}

TEST_CASE(
    "AdaptiveWindow: plans a short window and small batches at light load, large ones near "
    "capacity",
    "[adaptive]") {
  ManualClock clock;
  const AdaptiveWindow light(config());
  load_and_teach(light, clock, 300, 40ms);  // 25 requests/s
  const AdaptivePlan lp = light.plan();
  CHECK(lp.rate_rps == Approx(25.0).epsilon(0.05));
  CHECK(lp.batch <= 4);
  CHECK(lp.window <= 5ms);

  const AdaptiveWindow heavy(config());
  load_and_teach(heavy, clock, 3000, 2222us);  // 450 requests/s
  const AdaptivePlan hp = heavy.plan();
  CHECK(hp.rate_rps == Approx(450.0).epsilon(0.05));
  CHECK(hp.batch >= 12);
  // Two lanes keep up only with batches of 9 or more at 450/s: the plan is stable.
  const double capacity = 2.0 * static_cast<double>(hp.batch) /
                          std::chrono::duration<double>(example1_cost(hp.batch)).count();
  CHECK(capacity > 450.0);
  // The plan is the best the planner knows: no candidate it could have chosen predicts a
  // lower p95.
  for (std::size_t b : {8u, 12u, 16u, 24u, 32u})
    for (auto w : {0ms, 2ms, 8ms})
      CHECK(heavy.predict(hp.rate_rps, 2, b, w).predicted_p95_s >= hp.predicted_p95_s - 1e-9);
}

TEST_CASE(
    "AdaptiveWindow: at light load a tail a fraction of a model call higher buys a cheaper "
    "plan; above light load it does not",
    "[adaptive]") {
  // A model on one lane whose call costs 1 ms plus 800 us a request. Under a 50 ms target
  // the slack is min(0.25 x L(1), 0.5 % of the target) = 0.25 ms.
  const auto cost = [](std::size_t b) {
    return std::chrono::nanoseconds(1ms) + std::chrono::nanoseconds(800us) * b;
  };
  const double l1 = 0.0018;
  ManualClock clock;
  // 300 requests/s: one request at a time keeps the lane 54 % busy (light load: at most 60 %).
  const AdaptiveWindow light(config(50ms, 32));
  teach(light, cost, 32, 4, clock.now());  // the model first: the plans below are made on it
  drive_arrivals(light, clock, 1500, 3333us, 1);
  teach(light, cost, 32, 16, clock.now());
  const AdaptivePlan lp = light.plan();
  REQUIRE(lp.rate_rps == Approx(300.0).epsilon(0.05));
  const double light_low = lowest_p95(light, lp.rate_rps, l1);
  INFO("light: plan " << lp.batch << " / " << ms(lp.window) << " ms, p95 "
                      << lp.predicted_p95_s * 1e3 << " ms, lowest " << light_low * 1e3 << " ms");
  // Within the slack of the lowest (0.25 ms: 5.7 % of it here, more than tail_tolerance),
  // above the lowest, with a window that batches (0.72 ms). Without the slack the search
  // cuts short every candidate that does not lower the lowest tail so far, and keeps the
  // plan with the lowest (a 0.045 ms window).
  CHECK(lp.predicted_p95_s <= light_low + 0.00025 + 1e-9);
  CHECK(lp.predicted_p95_s > 1.005 * light_low);
  CHECK(lp.window >
        0.1 * std::chrono::duration_cast<BatchDuration>(std::chrono::duration<double>(l1)));

  // A model whose batch of 32 costs twice a batch of one (1.2 ms plus 40 us a request) at
  // 2000 requests/s: one at a time would need 2.5 lanes. The slack would be 0.25 ms, but
  // this is not light load: the search cuts at the lowest tail, and here the plan with the
  // lowest is the one it keeps.
  const auto fast = [](std::size_t b) {
    return std::chrono::nanoseconds(1200us) + std::chrono::nanoseconds(40us) * b;
  };
  const AdaptiveWindow heavy(config(50ms, 32));
  teach(heavy, fast, 32, 4, clock.now());
  drive_arrivals(heavy, clock, 8000, 500us, 1);
  teach(heavy, fast, 32, 16, clock.now());
  const AdaptivePlan hp = heavy.plan();
  REQUIRE(hp.rate_rps == Approx(2000.0).epsilon(0.05));
  const double heavy_low = lowest_p95(heavy, hp.rate_rps, 0.00124);
  INFO("heavy: plan " << hp.batch << " / " << ms(hp.window) << " ms, p95 "
                      << hp.predicted_p95_s * 1e3 << " ms, lowest " << heavy_low * 1e3 << " ms");
  CHECK(hp.predicted_p95_s <= heavy_low + 1e-9);
}

TEST_CASE(
    "AdaptiveWindow: at light load a tail above the lowest must buy lane time: where a window "
    "pairs too few requests the plan keeps the lowest tail",
    "[adaptive]") {
  // 200 us plus 600 us a request on one lane at 312 requests/s (one request at a time
  // keeps it 25 % busy). A pair costs 12.5 % less a request than two calls, but a window
  // a fraction of a call long pairs few requests at this rate. A plan above the lowest
  // tail must save lane time per request of at least a quarter of the fraction it is above
  // it (light_exchange); none within the slack (0.2 ms, min(0.25 x L(1), 0.5 % of the
  // 50 ms target)) does, so the plan keeps the lowest tail. Without that rule the cheapest
  // plan within the slack wins: a window of 0.32 ms, its p95 12 % above the lowest.
  const auto cost = [](std::size_t b) {
    return std::chrono::nanoseconds(200us) + std::chrono::nanoseconds(600us) * b;
  };
  ManualClock clock;
  const AdaptiveWindow p(config(50ms, 32));
  teach(p, cost, 32, 4, clock.now());
  drive_arrivals(p, clock, 1500, 3200us, 1);
  teach(p, cost, 32, 16, clock.now());
  const AdaptivePlan plan = p.plan();
  REQUIRE(plan.rate_rps == Approx(312.5).epsilon(0.05));
  const double low = lowest_p95(p, plan.rate_rps, 0.0008);
  INFO("plan " << plan.batch << " / " << ms(plan.window) << " ms, p95 "
               << plan.predicted_p95_s * 1e3 << " ms, lowest " << low * 1e3 << " ms");
  CHECK(plan.predicted_p95_s <= low + 1e-9);
}

TEST_CASE("AdaptiveWindow: decide follows the plan: target size, then window, then the SLO guard",
          "[adaptive]") {
  ManualClock clock;
  const AdaptiveWindow p(config());
  load_and_teach(p, clock, 2000, 3333us);  // 300 requests/s: a plan with a window and a size > 1
  const AdaptivePlan plan = p.plan();
  REQUIRE(plan.batch >= 2);
  REQUIRE(plan.window > BatchDuration::zero());

  // The plan's rule, on views with every lane busy (with a lane idle the lookahead may
  // overrule it: the next test).
  const BatchTime now = clock.now();
  // Below the target, inside the window: wait until the window ends, or the target fills.
  auto few = queue_of(plan.batch - 1, now, 100us);
  BatchDecision d = p.decide(busy_view_of(few, now));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at == few.front().arrival + plan.window);
  CHECK(d.decide_again_at_queued == plan.batch);
  // The window ends: what is there goes.
  d = p.decide(busy_view_of(few, few.front().arrival + plan.window));
  CHECK(d.count == few.size());
  CHECK(d.reason == DispatchReason::window);
  // The target: exactly that many go.
  auto full = queue_of(plan.batch + 1, now, 100us);
  d = p.decide(busy_view_of(full, now));
  CHECK(d.count == plan.batch);
  // Flush: never waits.
  d = p.decide(view_of(few, now, 2, true));
  CHECK(d.count == few.size());
  CHECK(d.reason == DispatchReason::flush);
}

TEST_CASE(
    "AdaptiveWindow: with lanes idle, the lookahead sends a batch short of the target when waiting "
    "makes more late",
    "[adaptive]") {
  MetricsRegistry registry;
  AdaptiveWindowConfig c = config();
  c.metrics = &registry;
  ManualClock clock;
  const AdaptiveWindow p(c);
  load_and_teach(p, clock, 2000, 3333us);  // 300 requests/s
  const AdaptivePlan plan = p.plan();
  REQUIRE(plan.batch >= 2);
  REQUIRE(plan.window > BatchDuration::zero());
  const std::string lookahead = "tailbatch_adaptive_closes_total{reason=\"lookahead\"}";
  const double before = series_value(registry.prometheus(), lookahead);
  // One short of the target with both lanes idle: the plan's rule would wait for the
  // window or the next arrival (the previous test); played out, sending them now on one
  // lane, with the other lane free for what comes next, leaves fewer requests over the
  // plan's predicted p95.
  const BatchTime now = clock.now();
  const auto few = queue_of(plan.batch - 1, now, 100us);
  const BatchDecision d = p.decide(view_of(few, now));
  CHECK(d.count == few.size());
  CHECK(d.reason == DispatchReason::size);
  CHECK(series_value(registry.prometheus(), lookahead) == before + 1.0);
  // With no lane idle nothing is played out: the plan's rule stands (it waits).
  CHECK(p.decide(busy_view_of(few, now)).count == 0);
}

TEST_CASE(
    "AdaptiveWindow in the simulator: where batching buys nothing, the lookahead never sends a "
    "larger batch",
    "[adaptive][simulator]") {
  // L(b) = 2 ms x b on two lanes at 900 requests/s (the no-gain profile near capacity):
  // a larger batch would only take work from the other lane, so it is never weighed.
  MetricsRegistry registry;
  AdaptiveWindowConfig c = config(100ms, 16);
  c.metrics = &registry;
  const AdaptiveWindow p(c);
  SimulationConfig sim;
  sim.arrivals = LoadProfile::poisson(900, 6s);
  sim.warmup = 1s;
  sim.seed = 42;
  sim.lanes = 2;
  sim.service_time = LinearCost{2ms, 2ms};
  const SimulationResult r = simulate(sim, p);
  CHECK(r.ok == r.arrivals);
  CHECK(series_value(registry.prometheus(),
                     "tailbatch_adaptive_closes_total{reason=\"lookahead\"}") == 0.0);
  CHECK(ms(r.p95) <= 1.05 * ms(simulate(sim, FixedWindow(1, 0ms)).p95));
}

TEST_CASE("AdaptiveWindow: never holds a request past what the SLO allows", "[adaptive]") {
  ManualClock clock;
  // An SLO so tight that the plan's window would break it: 40 ms with batches of 20+ ms.
  const AdaptiveWindow p(config(40ms));
  load_and_teach(p, clock, 2000, 3333us);
  const AdaptivePlan plan = p.plan();
  const auto one = queue_of(1, clock.now(), 1ms);
  const BatchDecision d = p.decide(view_of(one, clock.now()));
  if (d.count == 0) {
    // It wakes by the guard: SLO - cost(target) - SLO/10 after the oldest arrival.
    const auto guard = one.front().arrival + 40ms -
                       std::chrono::duration_cast<BatchDuration>(
                           std::chrono::duration<double>(p.estimate_seconds(plan.batch))) -
                       4ms;
    CHECK(d.decide_again_at <= guard + 1us);
    const BatchDecision late = p.decide(view_of(one, guard + 1us));
    CHECK(late.count == 1);
  }
}

TEST_CASE(
    "AdaptiveWindow: a backlog the target cannot drain within the SLO goes in larger batches, only "
    "where they pay",
    "[adaptive]") {
  ManualClock clock;
  const AdaptiveWindow gain(config(150ms, 64));
  load_and_teach(gain, clock, 2000, 10ms, 16);  // 100 requests/s: a small target
  const std::size_t target = gain.plan().batch;
  REQUIRE(target < 20);
  // Twice the target drains in time in batches of the target: the target goes.
  auto some = queue_of(2 * target, clock.now(), 100us);
  CHECK(gain.decide(view_of(some, clock.now())).count == target);
  // 64 queued would take rounds of target-sized batches past the SLO: a larger batch goes,
  // the smallest whose rounds on the two lanes end within the SLO less the oldest's 6.3 ms
  // of waiting and a tenth of the SLO (128.7 ms).
  auto backlog = queue_of(64, clock.now(), 100us);
  const BatchDecision d = gain.decide(view_of(backlog, clock.now()));
  CHECK(d.count > target);
  CHECK(d.count < 64);
  const double rounds = std::ceil(64.0 / (2.0 * static_cast<double>(d.count)));
  CHECK(rounds * gain.estimate_seconds(d.count) <= 0.1287 + 1e-9);
  const double smaller = std::ceil(64.0 / (2.0 * static_cast<double>(d.count - 1)));
  CHECK(smaller * gain.estimate_seconds(d.count - 1) > 0.1287 - 1e-9);

  // Batching buys nothing (L(b) = 2 ms x b): one at a time, whatever the queue.
  const AdaptiveWindow flat(config(100ms, 16));
  drive_arrivals(flat, clock, 2000, 1250us);  // 800 requests/s on two lanes
  teach(
      flat, [](std::size_t b) { return 2ms * static_cast<std::int64_t>(b); }, 16, 16, clock.now());
  REQUIRE(flat.plan().batch == 1);
  auto queue = queue_of(10, clock.now(), 100us);
  CHECK(flat.decide(view_of(queue, clock.now())).count == 1);
}

TEST_CASE(
    "AdaptiveWindow: on one lane a backlog goes in larger batches where they are any cheaper; "
    "several lanes need a clear saving",
    "[adaptive]") {
  // The reference classifier's fitted cost on this machine: 0.7 ms + 0.17 ms a request.
  // Near its capacity (about 85 % busy in batches of the target) a batch of 32 costs
  // 10-20 % less per request than one of the target: no clear saving (20 %), but on one
  // lane that saving is all the throughput there is to have.
  const auto classifier = [](std::size_t b) {
    return 700us + 170us * static_cast<std::int64_t>(b);
  };
  for (const std::size_t lanes : {std::size_t{1}, std::size_t{2}}) {
    CAPTURE(lanes);
    ManualClock clock;
    const AdaptiveWindow p(config(50ms, 32));
    // 4000 requests/s a lane.
    drive_arrivals(p, clock, 8000, 250us / static_cast<std::int64_t>(lanes), lanes);
    teach(p, classifier, 32, 16, clock.now());
    const std::size_t target = p.plan().batch;
    CAPTURE(target);
    const double per_request_target = p.estimate_seconds(target) / static_cast<double>(target);
    const double saving = (p.estimate_seconds(32) / 32.0) / per_request_target;
    REQUIRE(saving > 0.8);
    REQUIRE(saving < 0.98);
    // 800 queued: rounds of target-sized batches run far past the SLO on either setup.
    auto backlog = queue_of(800, clock.now(), 5us);
    const BatchDecision d = p.decide(busy_view_of(backlog, clock.now(), lanes));
    if (lanes == 1) {
      CHECK(d.count > target);
      CHECK(p.estimate_seconds(d.count) / static_cast<double>(d.count) < per_request_target);
      // The lane free again, a few more than the target queued behind its batch: they all
      // go, up to the cap, as the fixed window at the cap would send them.
      auto more = queue_of(target + 3, clock.now(), 5us);
      CHECK(p.decide(view_of(more, clock.now(), 1)).count == std::min<std::size_t>(target + 3, 32));
      auto many = queue_of(40, clock.now(), 5us);
      CHECK(p.decide(view_of(many, clock.now(), 1)).count == 32);
    } else {
      CHECK(d.count == target);
    }
  }
}

TEST_CASE(
    "AdaptiveWindow: a rise in load the plan has not caught up with: the target keeps up with the "
    "counted rate",
    "[adaptive]") {
  ManualClock clock;
  const AdaptiveWindow p(config());
  load_and_teach(p, clock, 1500, 20ms, 16);  // 50 requests/s
  const AdaptivePlan low = p.plan();
  REQUIRE(low.rate_rps == Approx(50.0).epsilon(0.05));
  REQUIRE(low.batch < 8);
  drive_arrivals(p, clock, 100, 2222us);     // 450 requests/s, and no feedback yet
  CHECK(p.plan().rate_rps == low.rate_rps);  // the plan is still the one for 50/s
  const double rate = p.rate_rps(clock.now());
  REQUIRE(rate > 300.0);
  // The smallest size that keeps two lanes at most 90 % busy at the counted rate.
  std::size_t keep = 1;
  while (keep < 64 && rate * std::chrono::duration<double>(example1_cost(keep)).count() >
                          1.8 * static_cast<double>(keep))
    ++keep;
  const auto one = queue_of(1, clock.now(), 1ms);
  const BatchDecision d = p.decide(view_of(one, clock.now()));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at_queued == keep);
  CHECK(keep > low.batch);
}

TEST_CASE(
    "AdaptiveWindow: planning is done in bounded slices; the plan in force holds until it ends",
    "[adaptive]") {
  ManualClock clock;
  MetricsRegistry reg;
  AdaptiveWindowConfig c = config();
  c.metrics = &reg;
  const AdaptiveWindow p(c);
  drive_arrivals(p, clock, 2000, 3333us);  // 300 requests/s
  // The first feedback starts a plan; one call does not finish the whole grid.
  p.on_batch_executed(feedback(8, example1_cost(8), clock.now()));
  CHECK(p.plan().rate_rps == 0.0);  // cold start: still no plan
  int calls = 1;
  while (p.plan().rate_rps == 0.0 && calls < 1000) {
    p.on_batch_executed(feedback(8, example1_cost(8), clock.now()));
    ++calls;
  }
  CHECK(calls > 1);
  CHECK(calls < 200);
  CHECK(p.plan().rate_rps == Approx(300.0).epsilon(0.05));
}

TEST_CASE("AdaptiveWindow: a planning slice follows the cost of the batch that reported it",
          "[adaptive]") {
  // The same problem at two time scales: Example 1 (batches of tens of ms) and the same
  // model 20 times faster at 20 times the rate (batches of 1-3 ms). A short batch gets a
  // short slice (about 1100 simulated requests for a 2.2 ms batch), a long one the ceiling
  // (8192), so the fast model's first plan takes several times as many calls.
  auto calls_to_plan = [](std::chrono::nanoseconds slo, LinearCost cost, BatchDuration gap) {
    ManualClock clock;
    const AdaptiveWindow p(config(slo, 64));
    drive_arrivals(p, clock, 2000, gap);
    int calls = 0;
    while (p.plan().rate_rps == 0.0 && calls < 5000) {
      p.on_batch_executed(feedback(8, cost(8), clock.now()));
      ++calls;
    }
    return calls;
  };
  const int slow = calls_to_plan(150ms, example1_cost, 3333us);           // 300 requests/s
  const int fast = calls_to_plan(7500us, LinearCost{1ms, 150us}, 167us);  // about 6000/s
  INFO("calls to the first plan: " << slow << " with 41 ms batches, " << fast << " with 2 ms ones");
  CHECK(slow > 1);
  CHECK(fast < 5000);
  CHECK(fast >= 3 * slow);
}

TEST_CASE("AdaptiveWindow: a plan for a new load gets larger slices than a re-plan for a model "
          "that drifted",
          "[adaptive]") {
  // A re-plan at the rate of the plan in force (the model's cost moved) runs in slices of
  // about 250 000 simulated requests per second of model time; one for a rate more than
  // 10 % away from it (or the first plan) in slices twice that, since until it is in
  // force the plan in force is for another load. Two re-plans of like size on one model:
  // after a 30 % cost move at the same rate, and after a third more load at the same
  // cost. With one slice for both they take about as many calls (160 and 139).
  auto calls_to_replan = [](bool rate_moves) {
    ManualClock clock;
    MetricsRegistry reg;
    AdaptiveWindowConfig c = config(7500us, 64);
    c.metrics = &reg;
    const AdaptiveWindow p(c);
    auto plans = [&] { return series_value(reg.prometheus(), "\ntailbatch_adaptive_plans_total"); };
    drive_arrivals(p, clock, 3000, 167us);  // about 6000 requests/s
    const LinearCost cost{1ms, 150us};
    auto run_until_planned = [&](double scale) {
      const double before = plans();
      int calls = 0;
      while (plans() == before && calls < 20000) {
        p.on_batch_executed(feedback(
            8, std::chrono::duration_cast<std::chrono::nanoseconds>(cost(8) * scale), clock.now()));
        ++calls;
      }
      return calls;
    };
    const int first = run_until_planned(1.0);
    if (rate_moves)
      drive_arrivals(p, clock, 3000, 125us);  // about 8000 requests/s: a third more
    const int again = run_until_planned(rate_moves ? 1.0 : 1.3);
    return std::pair{first, again};
  };
  const auto [first_a, drift] = calls_to_replan(false);
  const auto [first_b, rate] = calls_to_replan(true);
  INFO("calls to the first plan " << first_a << ", to the re-plan after a cost move " << drift
                                  << ", after a rate move " << rate);
  CHECK(first_a == first_b);
  CHECK(drift < 20000);
  CHECK(rate < 20000);
  CHECK(drift >= 2 * rate);
}

TEST_CASE(
    "AdaptiveWindow: the cost of sizes never run moving does not re-plan; the sizes in use moving "
    "does",
    "[adaptive]") {
  ManualClock clock;
  MetricsRegistry reg;
  AdaptiveWindowConfig c = config(150ms, 64);
  c.metrics = &reg;
  const AdaptiveWindow p(c);
  drive_arrivals(p, clock, 2000, 3333us);  // 300 requests/s
  auto plans = [&] { return series_value(reg.prometheus(), "\ntailbatch_adaptive_plans_total"); };
  auto teach_until_planned = [&](auto cost) {
    for (int k = 0; k < 400; ++k)
      for (std::size_t b = 1; b <= 8; ++b) p.on_batch_executed(feedback(b, cost(b), clock.now()));
  };
  teach_until_planned(example1_cost);
  const double first = plans();
  REQUIRE(first >= 1.0);
  const double cap_before = p.estimate_seconds(64);
  // L(1) 8 % up, L(8) 8 % down: each within the 10 % drift, but the fitted slope, and so
  // the extrapolated cost of a batch of 64, move by far more.
  teach_until_planned([](std::size_t b) {
    const double f = 1.08 - 0.16 * static_cast<double>(b - 1) / 7.0;
    return std::chrono::duration_cast<std::chrono::nanoseconds>(example1_cost(b) * f);
  });
  INFO("L(64) " << cap_before << " s, then " << p.estimate_seconds(64) << " s");
  CHECK(std::abs(p.estimate_seconds(64) - cap_before) > 0.2 * cap_before);
  CHECK(plans() == first);
  // The sizes in use 30 % slower: a new model, a new plan.
  teach_until_planned([](std::size_t b) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(example1_cost(b) * 1.3);
  });
  CHECK(plans() > first);
}

TEST_CASE("AdaptiveWindow: copies share what they learned", "[adaptive]") {
  const AdaptiveWindow p(config());
  const AdaptiveWindow copy = p;  // as a Pipeline holds it
  teach(copy, example1_cost, 8);
  CHECK(p.cost_model().samples == copy.cost_model().samples);
  CHECK(p.estimate_seconds(4) == copy.estimate_seconds(4));
}

TEST_CASE("AdaptiveWindow: explains itself in metrics", "[adaptive][metrics]") {
  MetricsRegistry registry;
  AdaptiveWindowConfig c = config();
  c.metrics = &registry;
  c.metric_labels = {{"pipeline", "demo"}};
  ManualClock clock;
  const AdaptiveWindow p(c);
  load_and_teach(p, clock, 1000, 5ms);
  drive_arrivals(p, clock, 200, 5ms);
  const std::string text = registry.prometheus();
  auto value = [&](const std::string& series) {
    const auto at = text.find(series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 1));
  };
  CHECK(value("tailbatch_adaptive_cost_intercept_seconds{pipeline=\"demo\"}") == Approx(0.017));
  CHECK(value("tailbatch_adaptive_cost_slope_seconds{pipeline=\"demo\"}") == Approx(0.003));
  CHECK(value("tailbatch_adaptive_arrival_rate{pipeline=\"demo\"}") == Approx(200.0).epsilon(0.02));
  CHECK(value("tailbatch_adaptive_target_batch{pipeline=\"demo\"}") ==
        static_cast<double>(p.plan().batch));
  CHECK(text.find("tailbatch_adaptive_window_seconds{pipeline=\"demo\"}") != std::string::npos);
  CHECK(text.find("tailbatch_adaptive_predicted_p95_seconds{pipeline=\"demo\"}") !=
        std::string::npos);
  CHECK(value("tailbatch_adaptive_feedback_total{pipeline=\"demo\"}") == 256.0);
  CHECK(text.find("tailbatch_adaptive_plans_total{pipeline=\"demo\"}") != std::string::npos);
  for (const char* reason :
       {"max_batch", "target_size", "window", "slo_guard", "backlog", "flush", "lookahead"})
    CHECK(text.find(std::string("tailbatch_adaptive_closes_total{pipeline=\"demo\",reason=\"") +
                    reason + "\"}") != std::string::npos);
  CHECK(text.find("reason=\"window\"} 0\n") == std::string::npos);  // windows did close
}

// ---- in the simulator: learning from the simulated lanes, and the goals -------------------

namespace {

// Under the sanitizers (10x slower) the runs are shorter: 6 simulated seconds, not 12.
constexpr std::chrono::seconds goal_duration = tailbatch::test::sanitizer_slowdown > 1 ? 6s : 12s;

SimulationConfig profile(double rps, double base_ms, double per_item_ms, double network_ms,
                         std::size_t lanes, std::chrono::seconds duration = goal_duration) {
  SimulationConfig c;
  c.arrivals = LoadProfile::poisson(rps, duration);
  c.warmup = duration / 6;
  c.seed = 42;
  c.lanes = lanes;
  c.service_time = LinearCost{std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::duration<double, std::milli>(base_ms)),
                              std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::duration<double, std::milli>(per_item_ms))};
  c.network = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double, std::milli>(network_ms));
  return c;
}

// The lowest p95 of the grid tailbatch-load --policy best-static searches, among the
// configurations that complete every request.
double best_static_p95(const SimulationConfig& c, std::size_t cap) {
  double best = 1e300;
  for (double w : {0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 20.0}) {
    for (std::size_t b : {1u, 2u, 4u, 6u, 8u, 12u, 16u, 24u, 32u, 48u, 64u}) {
      if (b > cap) continue;
      const SimulationResult r =
          simulate(c, FixedWindow(b, std::chrono::duration_cast<BatchDuration>(
                                         std::chrono::duration<double, std::milli>(w))));
      if (r.ok == r.arrivals) best = std::min(best, ms(r.p95));
    }
  }
  return best;
}

}  // namespace

TEST_CASE("AdaptiveWindow in the simulator: learns the modelled cost and is exactly reproducible",
          "[adaptive][simulator]") {
  const SimulationConfig c = profile(200, 20, 3, 5, 2);
  const AdaptiveWindow p(config());
  const SimulationResult a = simulate(c, p);
  CHECK(p.cost_model().samples == a.batches);
  CHECK(p.cost_model().slope_s == Approx(0.003).epsilon(0.01));
  CHECK(p.cost_model().intercept_s == Approx(0.017).epsilon(0.01));
  const SimulationResult b = simulate(c, AdaptiveWindow(config()));
  CHECK(a.p95 == b.p95);
  CHECK(a.batches == b.batches);
  CHECK(a.ok == a.arrivals);
}

TEST_CASE("Goal, Example 1: adaptive p95 within 5 % of the best static window at low and high load",
          "[adaptive][simulator][goal]") {
  for (double rps : {50.0, 450.0}) {
    const SimulationConfig c = profile(rps, 20, 3, 5, 2);
    const double adaptive = ms(simulate(c, AdaptiveWindow(config(150ms, 64))).p95);
    const double best = best_static_p95(c, 64);
    INFO(rps << " rps: adaptive p95 " << adaptive << " ms, best static " << best << " ms");
    CHECK(adaptive <= 1.05 * best);
  }
}

TEST_CASE("Goal, GPU-like and no-gain profiles: within 5 % of the best static window",
          "[adaptive][simulator][goal]") {
  {
    const SimulationConfig c = profile(1000, 8, 0.2, 1, 1);
    const double adaptive = ms(simulate(c, AdaptiveWindow(config(50ms, 16))).p95);
    const double best = best_static_p95(c, 16);
    INFO("GPU-like at 1000 rps: adaptive " << adaptive << " ms, best static " << best << " ms");
    CHECK(adaptive <= 1.05 * best);
  }
  {
    // Batching buys nothing: adaptive must not batch its way to a worse tail.
    const SimulationConfig c = profile(800, 2, 2, 0, 2);
    const double adaptive = ms(simulate(c, AdaptiveWindow(config(100ms, 16))).p95);
    const double best = best_static_p95(c, 16);
    INFO("no gain at 800 rps: adaptive " << adaptive << " ms, best static " << best << " ms");
    CHECK(adaptive <= 1.05 * best);
  }
}

TEST_CASE(
    "Goal, changing load: over 50, 450, 50 requests/s adaptive's p95 is below the static settings "
    "around the best",
    "[adaptive][simulator][goal]") {
  // The Example 1 profile over the issue's --steps 50:20,450:20,50:20 (60 simulated
  // seconds, no warm-up). The whole grid is benchmarks/adaptive/run.sh's; here, to keep
  // the test short, the part of it where the best static setting lies at these seeds
  // (batch 12 to 24, windows up to 2 ms): the best of the whole grid is (0.5 ms, 16) at
  // seeds 42, 1 and 2 and (0 ms, 16) at seed 3.
  SimulationConfig c = profile(50, 20, 3, 5, 2);
  c.arrivals =
      LoadProfile::steps(ArrivalProcess::poisson, {{20s, 50.0}, {20s, 450.0}, {20s, 50.0}});
  c.warmup = 0s;
  // Under the sanitizers (10x slower) seed 42 only.
  const std::vector<std::uint64_t> seeds = tailbatch::test::sanitizer_slowdown > 1
                                               ? std::vector<std::uint64_t>{42}
                                               : std::vector<std::uint64_t>{42, 1};
  for (std::uint64_t seed : seeds) {
    c.seed = seed;
    const SimulationResult a = simulate(c, AdaptiveWindow(config(150ms, 64)));
    REQUIRE(a.ok == a.arrivals);
    double best = 1e300;
    for (double w : {0.0, 0.5, 1.0, 2.0})
      for (std::size_t b : {12u, 16u, 24u})
        best = std::min(
            best, ms(simulate(c, FixedWindow(b, std::chrono::duration_cast<BatchDuration>(
                                                    std::chrono::duration<double, std::milli>(w))))
                         .p95));
    INFO("seed " << seed << ": adaptive p95 " << ms(a.p95) << " ms, best static nearby " << best
                 << " ms");
    CHECK(ms(a.p95) < best);
  }
}

// ---- on the real clock -----------------------------------------------------------------

TEST_CASE("AdaptiveWindow on the real clock: lanes that really sleep teach it their cost",
          "[adaptive][threads]") {
  // Three "lanes" run batches of sizes 1..8 of a model that sleeps 20 ms + 2 ms x b and
  // report each as the Pipeline does (the time measured around the call), while a fourth
  // thread keeps asking decide(). A sleep overshoots by the machine's wake-up latency, so
  // the model's true cost is what the sleeps really took: per size their mean (how long a
  // lane was held), made non-decreasing in size as a batch's cost is, and beyond the sizes
  // run the least-squares line through those. No time is asserted: only that the model
  // learned is that cost, within 10 %.
  const AdaptiveWindow policy(config(200ms, 32));
  auto nominal = [](std::size_t b) { return 20ms + 2ms * static_cast<std::int64_t>(b); };
  std::mutex mu;
  std::vector<std::vector<double>> took_by_size(9);
  std::atomic<bool> done{false};
  std::thread asker([&] {
    std::vector<BatchCandidate> q;
    while (!done.load()) {
      q.assign(1, BatchCandidate{std::chrono::steady_clock::now(), BatchTime::max(), 1,
                                 Priority::normal});
      (void)policy.decide(view_of(q, std::chrono::steady_clock::now()));
      std::this_thread::sleep_for(1ms);
    }
  });
  std::vector<std::thread> lanes;
  for (std::size_t lane = 0; lane < 3; ++lane) {
    lanes.emplace_back([&, lane] {
      for (int k = 0; k < 6; ++k) {
        for (std::size_t b = 1 + lane; b <= 8; b += 1) {
          const auto start = std::chrono::steady_clock::now();
          std::this_thread::sleep_for(nominal(b));
          const auto took_now = std::chrono::steady_clock::now() - start;
          {
            std::lock_guard lock(mu);
            took_by_size[b].push_back(std::chrono::duration<double>(took_now).count());
          }
          BatchFeedback f = feedback(b, took_now, start);
          f.lane = lane;
          policy.on_batch_executed(f);
        }
      }
    });
  }
  for (auto& t : lanes) t.join();
  done = true;
  asker.join();
  double sx = 0, sy = 0, sxx = 0, sxy = 0, n = 0, floor = 0;
  for (std::size_t b = 1; b <= 8; ++b) {
    const std::vector<double>& t = took_by_size[b];
    double sum = 0;
    for (double v : t) sum += v;
    const double mean = std::max(floor, sum / static_cast<double>(t.size()));
    floor = mean;
    INFO("size " << b);
    CHECK(policy.estimate_seconds(b) == Approx(mean).epsilon(0.1));
    const double x = static_cast<double>(b);
    sx += x, sy += mean, sxx += x * x, sxy += x * mean, n += 1;
  }
  const double slope = (sxy / n - sx / n * sy / n) / (sxx / n - sx / n * sx / n);
  const double intercept = sy / n - slope * sx / n;
  for (std::size_t b : {16u, 32u}) {
    INFO("size " << b << " (never run)");
    CHECK(policy.estimate_seconds(b) ==
          Approx(intercept + slope * static_cast<double>(b)).epsilon(0.1));
  }
}
