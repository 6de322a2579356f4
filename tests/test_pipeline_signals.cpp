// What the Pipeline tells its server and its policy, on the ManualClock: the blocked-
// submitter signal (a metric and a one-time warning through the log sink), the lane
// slots in BatchView and the per-batch feedback to a policy that asks for it, and the
// occupancy integrals behind a Little's-law check on live data.
#include <tailbatch/pipeline.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

template <class Policy = FixedWindow>
using ManualPipeline = Pipeline<int, int, Policy, HostLanes, AdmitAll, ManualClock>;

const BatchTime t0 = ManualClock::start();

auto echo() {
  return [](std::span<const int> in, std::span<int> out, HostLane&) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
  };
}

// Collects what the Pipeline writes to its log sink.
struct Lines {
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();
  std::function<void(std::string_view)> sink() {
    return [l = lines](std::string_view s) { l->emplace_back(s); };
  }
  [[nodiscard]] std::size_t count(std::string_view what) const {
    std::size_t n = 0;
    for (const std::string& s : *lines) n += s.find(what) != std::string::npos ? 1 : 0;
    return n;
  }
};

}  // namespace

TEST_CASE("Pipeline signals: callers blocked on futures that cap the batch are counted and reported once") {
  ManualClock clock;
  MetricsRegistry reg;
  Lines lines;
  ManualPipeline<>::Config cfg;
  cfg.metrics = &reg;
  cfg.log = lines.sink();
  // One lane slot, max_batch 8: three blocked callers can never fill a batch.
  ManualPipeline<> p(echo(), FixedWindow{8, 10ms}, cfg, clock);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::future<Outcome<int>>> f;
    for (int i = 0; i < 3; ++i) f.push_back(p.submit(i));
    CHECK(p.blocked_submitters_approx() == 3);
    clock.advance(10ms);
    CHECK(p.poll().batches == 1);
    for (auto& x : f) CHECK(x.get().ok());
    CHECK(p.blocked_submitters_approx() == 0);
    // Reported once, after a run of such batches (16), never again.
    CHECK(lines.count("blocked submitters") == (round + 1 >= 16 ? 1U : 0U));
  }
  CHECK(p.stats().submitter_limited_batches == 20);
  REQUIRE(lines.lines->size() == 1);
  CHECK(lines.lines->front().find("3 callers wait on futures") != std::string::npos);
  CHECK(lines.lines->front().find("max_batch x lane slots = 8") != std::string::npos);
  CHECK(reg.counter("tailbatch_pipeline_submitter_limited_batches_total", "x", {}).value() == 20);
  const std::string text = reg.prometheus();
  CHECK(text.find("tailbatch_pipeline_blocked_submitters 0") != std::string::npos);
  auto pending = p.submit(1);
  CHECK(reg.prometheus().find("tailbatch_pipeline_blocked_submitters 1") != std::string::npos);
  p.shutdown();
  CHECK(pending.get().ok());
}

TEST_CASE("Pipeline signals: batches not capped by blocked callers are not counted") {
  ManualClock clock;
  Lines lines;
  ManualPipeline<>::Config cfg;
  cfg.log = lines.sink();
  ManualPipeline<> p(echo(), FixedWindow{4, 10ms}, cfg, clock);
  SECTION("callbacks: nobody is blocked") {
    for (int round = 0; round < 20; ++round) {
      p.submit(1, [](Outcome<int>&&) {});
      clock.advance(10ms);
      CHECK(p.poll().batches == 1);
    }
  }
  SECTION("enough callers to fill the batch: closed by size") {
    for (int round = 0; round < 20; ++round) {
      std::vector<std::future<Outcome<int>>> f;
      for (int i = 0; i < 4; ++i) f.push_back(p.submit(i));
      CHECK(p.poll().batches == 1);
      CHECK(p.stats().count(DispatchReason::size) == static_cast<std::uint64_t>(round + 1));
    }
  }
  SECTION("fewer callers wait on futures than the batch holds") {
    for (int round = 0; round < 20; ++round) {
      auto f = p.submit(1);
      p.submit(2, [](Outcome<int>&&) {});
      p.submit(3, [](Outcome<int>&&) {});
      clock.advance(10ms);
      CHECK(p.poll().batches == 1);
      CHECK(f.get().ok());
    }
  }
  CHECK(p.stats().submitter_limited_batches == 0);
  CHECK(lines.count("blocked submitters") == 0);
}

namespace {

// A policy that closes at once and records what it sees and what it is told.
struct Observed {
  std::mutex mu;
  std::vector<std::pair<std::size_t, std::size_t>> lanes;  // (idle, total) at each decide
  std::vector<BatchFeedback> feedback;
  std::vector<std::string> events;  // "feedback", "completion", in order
};

struct Recording {
  std::shared_ptr<Observed> seen = std::make_shared<Observed>();
  std::size_t max = 4;
  [[nodiscard]] std::size_t max_batch() const noexcept { return max; }
  [[nodiscard]] BatchOrder order() const noexcept { return BatchOrder::fifo; }
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    std::lock_guard lock(seen->mu);
    seen->lanes.emplace_back(v.idle_lanes, v.lanes);
    if (v.candidates.empty()) return BatchDecision::wait(BatchTime::max(), 1);
    return BatchDecision::dispatch(std::min(v.candidates.size(), max), DispatchReason::size);
  }
  void on_batch_executed(const BatchFeedback& f) const noexcept {
    std::lock_guard lock(seen->mu);
    seen->feedback.push_back(f);
    seen->events.emplace_back("feedback");
  }
};
static_assert(BatchFeedbackPolicy<Recording>);

}  // namespace

TEST_CASE("Pipeline signals: the policy sees the lane slots and is told how each batch went") {
  ManualClock clock;
  HostLanes lanes(2, 2);
  Recording policy;
  bool fail_next = false;
  ManualPipeline<Recording> p(
      [&](std::span<const int> in, std::span<int> out, HostLane&) {
        clock.advance(3ms);
        if (fail_next) throw std::runtime_error("boom");
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
      },
      policy, {}, lanes, clock);
  auto note = [&](Outcome<int>&&) {
    std::lock_guard lock(policy.seen->mu);
    policy.seen->events.emplace_back("completion");
  };
  for (int i = 0; i < 3; ++i) p.submit(i, note);
  CHECK(p.poll().batches == 1);
  {
    std::lock_guard lock(policy.seen->mu);
    REQUIRE_FALSE(policy.seen->lanes.empty());
    CHECK(policy.seen->lanes.back() == std::pair<std::size_t, std::size_t>{4, 4});
    REQUIRE(policy.seen->feedback.size() == 1);
    const BatchFeedback& f = policy.seen->feedback[0];
    CHECK(f.size == 3);
    CHECK(f.padded_size == 3);
    CHECK(f.model_time == 3ms);
    CHECK(f.lane == 0);
    CHECK(f.started == t0);
    CHECK_FALSE(f.failed);
    // The policy learns after the completions: its work never delays them.
    CHECK(policy.seen->events == std::vector<std::string>{"completion", "completion", "completion", "feedback"});
  }
  // Another holder of the shared lanes: fewer idle slots; the batch runs on another lane.
  auto other = lanes.try_acquire();
  REQUIRE(other);
  REQUIRE(other->index() == 0);
  fail_next = true;
  p.submit(7, note);
  CHECK(p.poll().batches == 1);
  std::lock_guard lock(policy.seen->mu);
  CHECK(policy.seen->lanes.back() == std::pair<std::size_t, std::size_t>{3, 4});
  REQUIRE(policy.seen->feedback.size() == 2);
  const BatchFeedback& g = policy.seen->feedback[1];
  CHECK(g.size == 1);
  CHECK(g.lane == 1);
  CHECK(g.failed);
  CHECK(g.started == t0 + 3ms);
  CHECK(g.model_time == 3ms);
}

TEST_CASE("Pipeline signals: occupancy integrals give L, lambda and W over a window") {
  ManualClock clock;
  Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock> p(
      [&](std::span<const int> in, std::span<int> out, HostLane&) {
        clock.advance(4ms);  // the model takes 4 ms
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
      },
      FixedWindow{2, 10ms}, {}, clock);
  const PipelineOccupancy start = p.occupancy();
  CHECK(start.at == t0);
  // Every 10 ms, two requests arrive together, wait for nothing (a full batch), and run
  // for 4 ms: each spends 4 ms in the Pipeline. L = 2 x 4 / 10 = 0.8, lambda = 200/s,
  // W = 4 ms.
  for (int round = 0; round < 100; ++round) {
    auto a = p.submit(1);
    auto b = p.submit(2);
    CHECK(p.poll().batches == 1);
    CHECK(a.get().ok());
    CHECK(b.get().ok());
    clock.advance_to(t0 + (round + 1) * 10ms);
  }
  const PipelineOccupancy end = p.occupancy();
  CHECK(end.at == t0 + 1s);
  CHECK(end.completed == 200);
  const OccupancyWindow w = occupancy_between(start, end);
  CHECK(w.window == 1s);
  CHECK(w.mean_in_system == Approx(0.8));
  CHECK(w.mean_executing == Approx(0.8));
  CHECK(w.mean_queued == Approx(0.0).margin(1e-9));
  CHECK(w.throughput_per_s == Approx(200.0));
  CHECK(w.mean_latency == 4ms);
  const LittlesLawCheck c = p.check_littles_law();
  CHECK_FALSE(c.hidden_queue_suspected);
  CHECK(c.relative_deviation == Approx(0.0).margin(1e-9));
}

TEST_CASE("Pipeline signals: queued time counts in L; a queue before submit shows as a hidden queue") {
  ManualClock clock;
  MetricsRegistry reg;
  Lines lines;
  Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock>::Config cfg;
  cfg.metrics = &reg;
  cfg.log = lines.sink();
  Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock> p(echo(), FixedWindow{8, 6ms}, cfg, clock);
  // One request every 10 ms; each waits its 6 ms window (the model takes no time).
  // L = 0.6, lambda = 100/s, W = 6 ms: consistent.
  for (int round = 0; round < 50; ++round) {
    auto f = p.submit(round);
    clock.advance(6ms);
    CHECK(p.poll().batches == 1);
    CHECK(f.get().ok());
    clock.advance(4ms);
  }
  const OccupancyWindow w1 = occupancy_between(PipelineOccupancy{t0, 0, 0, 0, 0}, p.occupancy());
  CHECK(w1.mean_in_system == Approx(0.6));
  CHECK(w1.mean_queued == Approx(0.6));
  CHECK(w1.mean_latency == 6ms);
  LittlesLawCheck c = p.check_littles_law();
  CHECK_FALSE(c.hidden_queue_suspected);
  CHECK(lines.count("Little's law") == 0);
  // Now each request reached the server 12 ms before its submit (an accept queue the
  // Pipeline does not hold): W = 18 ms from arrival, but L, counted from submit, stays
  // 0.6 where lambda x W predicts 1.8.
  for (int round = 0; round < 50; ++round) {
    auto f = p.submit(round, {.arrival = clock.now() - 12ms});
    clock.advance(6ms);
    CHECK(p.poll().batches == 1);
    CHECK(f.get().ok());
    clock.advance(4ms);
  }
  c = p.check_littles_law();
  CHECK(c.hidden_queue_suspected);
  CHECK(c.measured_in_flight == Approx(0.6));
  CHECK(c.predicted_in_flight == Approx(1.8));
  CHECK(c.relative_deviation == Approx(-2.0 / 3.0));
  REQUIRE(lines.count("Little's law") == 1);
  CHECK(lines.count("hidden queue suspected") == 1);
  const std::string text = reg.prometheus();
  CHECK(text.find("tailbatch_pipeline_hidden_queue_suspected 1") != std::string::npos);
  CHECK(text.find("tailbatch_pipeline_littles_law_deviation -0.66") != std::string::npos);
  CHECK_THROWS_AS(p.check_littles_law(0.0), std::invalid_argument);
}

namespace {

// docs/pipeline.md's example of a custom policy with feedback, as written there.
struct TimedWindow : tailbatch::FixedWindow {
  using FixedWindow::FixedWindow;
  // Shared with the copy the Pipeline keeps.
  std::shared_ptr<std::atomic<std::int64_t>> ns_per_request = std::make_shared<std::atomic<std::int64_t>>(0);
  void on_batch_executed(const tailbatch::BatchFeedback& f) const noexcept {
    if (!f.failed) ns_per_request->store(f.model_time.count() / static_cast<std::int64_t>(f.padded_size));
  }
};
static_assert(BatchFeedbackPolicy<TimedWindow>);
static_assert(!BatchFeedbackPolicy<FixedWindow>);

}  // namespace

TEST_CASE("Pipeline signals: the documented feedback policy learns the model time per request") {
  ManualClock clock;
  TimedWindow policy(4, 10ms);
  ManualPipeline<TimedWindow> p(
      [&](std::span<const int> in, std::span<int> out, HostLane&) {
        clock.advance(static_cast<int>(in.size()) * 2ms);
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
      },
      policy, {}, clock);
  for (int i = 0; i < 4; ++i) p.submit(i, [](Outcome<int>&&) {});
  CHECK(p.poll().batches == 1);
  CHECK(policy.ns_per_request->load() == std::chrono::nanoseconds(2ms).count());
}
