// A ConcurrencyLimiter as a Pipeline's admission stage, stepped by hand on a ManualClock:
// admission happens before queueing, rejected requests complete at once, tickets come back
// exactly once with the right sample, the "limit starves the batcher" check, metrics, and
// an adaptive limit holding the SLO under 3x overload.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/pipeline.hpp>
#include <type_traits>
#include <utility>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

// A learning algorithm that records the windows it is shown and keeps its limit.
struct Recorded {
  struct Seen {
    std::uint64_t count, drops;
    std::chrono::nanoseconds min_rtt, max_rtt;
  };
  std::uint32_t limit = 4;
  std::vector<Seen> seen;
};

struct RecordingLimit {
  static constexpr bool learns = true;
  std::shared_ptr<Recorded> r;
  [[nodiscard]] std::uint32_t limit() const noexcept { return r->limit; }
  [[nodiscard]] std::uint32_t max_limit() const noexcept { return r->limit; }
  [[nodiscard]] WindowSpec next_window() const noexcept { return {0ns, 1, false}; }
  std::uint32_t on_window(const LimitWindow& w) noexcept {
    if (r->seen.size() < r->seen.capacity())
      r->seen.push_back({w.count(), w.drops(), w.min_rtt(), w.max_rtt()});
    return r->limit;
  }
};

template <class Alg>
using Limiter = ConcurrencyLimiter<Alg, ManualClock>;
template <class Alg>
using Pipe = Pipeline<int, int, FixedWindow, HostLanes, Limiter<Alg>, ManualClock>;

// The model: answers x -> 10x and takes model_time of manual time; throws on request -1.
struct Model {
  Model(ManualClock c, std::chrono::nanoseconds t) : clock(std::move(c)), model_time(t) {}
  ManualClock clock;
  std::chrono::nanoseconds model_time;
  auto fn() {
    return [this](std::span<const int> in, std::span<int> out, HostLane&) {
      if (std::find(in.begin(), in.end(), -1) != in.end()) throw std::runtime_error("bad input");
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * 10;
      clock.advance(model_time);
    };
  }
};

template <class T>
bool ready(const std::future<T>& f) {
  return f.wait_for(0s) == std::future_status::ready;
}

}  // namespace

TEST_CASE("limiter + Pipeline: admission before queueing, rejections complete at once",
          "[limiter_pipeline]") {
  ManualClock clock;
  Model m(clock, 5ms);
  HostLanes lanes(1, 1);
  Limiter<StaticLimit> limiter(StaticLimit{8}, {}, clock);
  Pipe<StaticLimit> p(m.fn(), FixedWindow(8, 10ms), {}, lanes, limiter, clock);

  std::vector<std::future<Outcome<int>>> admitted;
  for (int i = 0; i < 8; ++i) admitted.push_back(p.submit(i));
  CHECK(limiter.in_flight_approx() == 8);
  CHECK(p.queued_approx() == 8);

  // The ninth is refused by the limiter: it never reaches the queue and its completion
  // runs inside submit(), before it returns.
  bool completed_inline = false;
  Status status = Status::ok;
  RejectReason reason = RejectReason::none;
  p.submit(99, [&](Outcome<int>&& o) {
    completed_inline = true;
    status = o.status();
    reason = o.reason();
  });
  CHECK(completed_inline);
  CHECK(status == Status::rejected);
  CHECK(reason == RejectReason::overloaded);
  CHECK(p.queued_approx() == 8);
  CHECK(limiter.rejected_count(RejectReason::overloaded) == 1);
  CHECK(p.stats().count(RejectReason::overloaded) == 1);

  CHECK(p.poll().batches == 1);  // a full batch dispatches at once
  for (int i = 0; i < 8; ++i) {
    REQUIRE(ready(admitted[static_cast<std::size_t>(i)]));
    CHECK(admitted[static_cast<std::size_t>(i)].get().value() == i * 10);
  }
  CHECK(limiter.in_flight_approx() == 0);                          // every ticket came back
  CHECK(p.submit(5).wait_for(0s) == std::future_status::timeout);  // admitted again
  p.shutdown();
  CHECK(limiter.in_flight_approx() == 0);
}

TEST_CASE("limiter + Pipeline: each ticket returns once, with the end-to-end latency",
          "[limiter_pipeline]") {
  ManualClock clock;
  Model m(clock, 5ms);
  HostLanes lanes(1, 1);
  auto rec = std::make_shared<Recorded>();
  rec->limit = 8;
  rec->seen.reserve(256);
  Limiter<RecordingLimit> limiter(RecordingLimit{rec}, {}, clock);
  Pipe<RecordingLimit> p(m.fn(), FixedWindow(8, 10ms), {}, lanes, limiter, clock);

  SECTION("ok: a success sample of queue wait + model time") {
    auto f = p.submit(1);
    clock.advance(10ms);
    CHECK(p.poll().batches == 1);
    CHECK(f.get().ok());
    REQUIRE(rec->seen.size() == 1);
    CHECK(rec->seen[0].count == 1);
    CHECK(rec->seen[0].drops == 0);
    CHECK(rec->seen[0].min_rtt == 15ms);
  }
  SECTION("deadline exceeded: a drop") {
    auto f = p.submit(1, SubmitOptions{.timeout = 3ms});
    clock.advance(10ms);
    p.poll();
    CHECK(f.get().status() == Status::deadline_exceeded);
    REQUIRE(rec->seen.size() == 1);
    CHECK(rec->seen[0].drops == 1);
  }
  SECTION("cancelled and failed: no sample") {
    CancellationSource source;
    auto cancelled = p.submit(1, SubmitOptions{.cancel = source.get_token()});
    source.request_stop();
    auto failed = p.submit(-1);
    clock.advance(10ms);
    p.poll();
    CHECK(cancelled.get().status() == Status::cancelled);
    CHECK(failed.get().status() == Status::failed);
    CHECK(rec->seen.empty());
  }
  SECTION("shutdown drains admitted work: a success sample") {
    auto f = p.submit(1);
    p.shutdown();  // drains: the request still runs
    CHECK(f.get().ok());
    REQUIRE(rec->seen.size() == 1);
    CHECK(rec->seen[0].drops == 0);
  }
  p.shutdown();
  CHECK(limiter.in_flight_approx() == 0);
}

TEST_CASE("limiter + Pipeline: a limit below max_batch x lanes is refused at construction",
          "[limiter_pipeline]") {
  ManualClock clock;
  Model m(clock, 1ms);
  HostLanes two_lanes(2, 1);
  auto build = [&](auto& limiter, bool check) {
    using L = std::remove_reference_t<decltype(limiter)>;
    using P = Pipeline<int, int, FixedWindow, HostLanes, L, ManualClock>;
    typename P::Config config;
    config.check_admission_limit = check;
    P p(m.fn(), FixedWindow(8, 1ms), config, two_lanes, limiter, clock);
  };
  Limiter<StaticLimit> starving(StaticLimit{12}, {}, clock);  // < 8 x 2: a lane could never fill
  try {
    build(starving, true);
    FAIL("constructed a Pipeline whose limit starves the batcher");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("max_batch x lanes") != std::string::npos);
  }
  CHECK_NOTHROW(build(starving, false));  // the user said they know
  Limiter<StaticLimit> enough(StaticLimit{16}, {}, clock);
  CHECK_NOTHROW(build(enough, true));
  // Adaptive limits are checked by the most they may ever allow.
  Limiter<AimdLimit> aimd(
      AimdLimit(AimdLimitConfig{.initial_limit = 4, .min_limit = 1, .max_limit = 12}), {}, clock);
  CHECK_THROWS_AS(build(aimd, true), std::invalid_argument);
  Limiter<AimdLimit> roomy(AimdLimit(AimdLimitConfig{.initial_limit = 4, .min_limit = 1}), {}, clock);
  CHECK_NOTHROW(build(roomy, true));
}

TEST_CASE("limiter + Pipeline: limit, in-flight, queued and rejections exported together",
          "[limiter_pipeline][metrics]") {
  MetricsRegistry registry;
  const Labels labels{{"pipeline", "classifier"}};
  ManualClock clock;
  Model m(clock, 5ms);
  HostLanes lanes(1, 1);
  Limiter<StaticLimit> limiter(
      StaticLimit{8}, ConcurrencyLimiterConfig{.metrics = &registry, .metric_labels = labels}, clock);
  Pipe<StaticLimit>::Config config;
  config.metrics = &registry;
  config.metric_labels = labels;
  Pipe<StaticLimit> p(m.fn(), FixedWindow(8, 10ms), config, lanes, limiter, clock);
  std::vector<std::future<Outcome<int>>> f;
  for (int i = 0; i < 11; ++i) f.push_back(p.submit(i));
  const auto text = registry.prometheus();
  CAPTURE(text);
  CHECK(text.find("tailbatch_limiter_limit{pipeline=\"classifier\"} 8") != std::string::npos);
  CHECK(text.find("tailbatch_limiter_in_flight{pipeline=\"classifier\"} 8") != std::string::npos);
  CHECK(text.find("tailbatch_limiter_queued{pipeline=\"classifier\"} 0") != std::string::npos);
  CHECK(text.find("tailbatch_pipeline_queue_depth{pipeline=\"classifier\"} 8") !=
        std::string::npos);
  CHECK(
      text.find(
          "tailbatch_limiter_rejections_total{pipeline=\"classifier\",reason=\"overloaded\"} 3") !=
      std::string::npos);
  CHECK(text.find("tailbatch_pipeline_requests_total{pipeline=\"classifier\",reason=\"overloaded\","
                  "status=\"rejected\"} 3") != std::string::npos);
  p.poll();
  CHECK(registry.prometheus().find("tailbatch_limiter_in_flight{pipeline=\"classifier\"} 0") !=
        std::string::npos);
}

TEST_CASE("limiter + Pipeline: an AIMD limit holds the SLO under 3x overload",
          "[limiter_pipeline][overload]") {
  // One lane; a batch of n takes 2 ms + 0.5 ms x n, so batches of 8 serve 8 / 6 ms = 1333/s.
  // Requests arrive every 0.25 ms (4000/s, 3x that). Without a limit the queue would grow
  // without bound; with AIMD (p95 target 35 ms, set below the SLO for headroom) the
  // admitted requests keep p95 under a 50 ms SLO once the limit has settled, the queue
  // stays within the limit, and every rejection completes inside submit().
  ManualClock clock;
  HostLanes lanes(1, 1);
  Limiter<AimdLimit> limiter(AimdLimit(AimdLimitConfig{.initial_limit = 64,
                                                  .min_limit = 8,
                                                  .max_limit = 256,
                                                  .latency_target = 35ms,
                                                  .target_percentile = 95,
                                                  .window = 100ms,
                                                  .min_window_samples = 10}),
                             {}, clock);
  auto model = [&clock](std::span<const int> in, std::span<int> out, HostLane&) {
    std::copy(in.begin(), in.end(), out.begin());
    clock.advance(2ms + 500us * static_cast<std::int64_t>(in.size()));
  };
  Pipe<AimdLimit> p(model, FixedWindow(8, 2ms), {}, lanes, limiter, clock);

  struct Done {
    ManualClock::time_point arrived;
    std::chrono::nanoseconds latency{-1};
    Status status = Status::ok;
  };
  constexpr int arrivals = 40'000;  // 10 s
  std::vector<Done> done(arrivals);
  std::size_t max_queue = 0;
  int rejected_inline = 0, rejected_late = 0;
  const auto start = clock.now();
  auto arrival_of = [&](int i) { return start + 250us * i; };
  int next = 0;
  while (next < arrivals) {
    // Everything that has arrived by now is submitted (arrivals during a model call are
    // submitted when it returns; their latency still counts from their arrival).
    while (next < arrivals && arrival_of(next) <= clock.now()) {
      const int i = next++;
      done[static_cast<std::size_t>(i)].arrived = arrival_of(i);
      bool returned = false;
      p.submit(i, [&, i](Outcome<int>&& o) {
        auto& d = done[static_cast<std::size_t>(i)];
        d.status = o.status();
        d.latency = clock.now() - d.arrived;
        if (o.status() == Status::rejected) (returned ? rejected_late : rejected_inline) += 1;
      });
      returned = true;
      max_queue = std::max(max_queue, p.queued_approx());
    }
    const PipelinePollResult r = p.poll(1);  // runs one due batch (the model moves the clock)
    if (r.batches == 0 && next < arrivals) clock.advance_to(std::min(arrival_of(next), r.next_due));
  }
  p.shutdown();
  CHECK(limiter.in_flight_approx() == 0);
  CHECK(rejected_late == 0);
  CHECK(rejected_inline > arrivals / 3);
  CHECK(max_queue <= 256);

  std::vector<std::chrono::nanoseconds> steady;
  int ok = 0;
  for (const auto& d : done) {
    if (d.status != Status::ok) continue;
    ++ok;
    if (d.arrived >= start + 3s) steady.push_back(d.latency);
  }
  REQUIRE_FALSE(steady.empty());
  std::sort(steady.begin(), steady.end());
  const auto p95 =
      steady[static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(steady.size()))) - 1];
  CAPTURE(p95.count(), ok, limiter.limit());
  CHECK(p95 <= 50ms);
  CHECK(ok > arrivals / 4);  // the service stays busy: ~1333/s of the 4000/s offered
}
