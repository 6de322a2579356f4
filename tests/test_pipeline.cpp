// The Pipeline stepped by hand on a ManualClock: no threads, so every window, trigger,
// priority, deadline, cancellation and shutdown rule is checked deterministically.
#include <tailbatch/pipeline.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

template <class Policy = FixedWindow, class Adm = AdmitAll>
using ManualPipeline = Pipeline<int, int, Policy, HostLanes, Adm, ManualClock>;

// Records every batch the model sees; answers x -> 10x.
struct Log {
  std::vector<std::vector<int>> batches;
  ManualClock* advance_clock = nullptr;
  BatchDuration model_time{};
  auto model() {
    return [this](std::span<const int> in, std::span<int> out, HostLane&) {
      batches.emplace_back(in.begin(), in.end());
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * 10;
      if (advance_clock != nullptr) advance_clock->advance(model_time);
    };
  }
};

template <class T>
bool ready(const std::future<T>& f) {
  return f.wait_for(0s) == std::future_status::ready;
}

const BatchTime t0 = ManualClock::start();

using tailbatch::test::MessageContains;
using tailbatch::test::MessageIs;
using tailbatch::test::MessageStartsWith;

}  // namespace

TEST_CASE("Pipeline (manual): size trigger dispatches a full batch at once") {
  ManualClock clock;
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{4, 10ms}, {}, clock);
  CHECK(p.worker_count() == 0);
  std::vector<std::future<Outcome<int>>> f;
  for (int i = 1; i <= 3; ++i) f.push_back(p.submit(i));
  PipelinePollResult r = p.poll();
  CHECK(r.batches == 0);
  CHECK(r.next_due == t0 + 10ms);
  f.push_back(p.submit(4));
  r = p.poll();
  CHECK(r.batches == 1);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{1, 2, 3, 4});
  for (int i = 0; i < 4; ++i) {
    REQUIRE(ready(f[static_cast<std::size_t>(i)]));
    CHECK(f[static_cast<std::size_t>(i)].get().value() == (i + 1) * 10);
  }
  CHECK(p.stats().count(DispatchReason::size) == 1);
}

TEST_CASE("Pipeline (manual): the window opens at the batch's first request") {
  ManualClock clock;
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, clock);
  auto a = p.submit(1);
  clock.advance(3ms);
  auto b = p.submit(2);
  CHECK(p.poll().next_due == t0 + 10ms);
  clock.advance_to(t0 + 10ms - 1ns);
  CHECK(p.poll().batches == 0);
  CHECK_FALSE(ready(a));
  clock.advance(1ns);
  CHECK(p.poll().batches == 1);
  CHECK(a.get().value() == 10);
  CHECK(b.get().value() == 20);
  CHECK(p.stats().count(DispatchReason::window) == 1);
  // The next batch's window opens at its own first request.
  clock.advance(2ms);
  auto c = p.submit(3);
  CHECK(p.poll().next_due == t0 + 22ms);
  clock.advance_to(t0 + 22ms);
  CHECK(p.poll().batches == 1);
  CHECK(c.get().value() == 30);
}

TEST_CASE("Pipeline (manual): more than max_batch queued forms several batches in one poll") {
  ManualClock clock;
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{3, 10ms}, {}, clock);
  std::vector<std::future<Outcome<int>>> f;
  for (int i = 0; i < 7; ++i) f.push_back(p.submit(i));
  CHECK(p.poll().batches == 2);  // two full batches; one request waits for its window
  clock.advance(10ms);
  CHECK(p.poll().batches == 1);
  REQUIRE(log.batches.size() == 3);
  CHECK(log.batches[2] == std::vector<int>{6});
  for (auto& x : f) CHECK(x.get().ok());
}

// A pipeline batching to the preferred sizes 4 and 8 with a 5 ms window, on a manual clock.
struct PreferredRun {
  ManualClock clock;
  Log log;
  ManualPipeline<PreferredSizes> p;
  explicit PreferredRun(PreferredSizes::Fill fill)
      : p(log.model(), PreferredSizes({4, 8}, 5ms, fill), {}, clock) {}
  // Submits 1..n: nothing dispatches before the window closes, then `batches` batches do.
  // Returns the futures, in submit order.
  std::vector<std::future<Outcome<int>>> submit_past_window(int n, std::size_t batches) {
    std::vector<std::future<Outcome<int>>> f;
    for (int i = 1; i <= n; ++i) f.push_back(p.submit(i));
    CHECK(p.poll().batches == 0);
    clock.advance(5ms);
    CHECK(p.poll().batches == batches);
    return f;
  }
};

TEST_CASE("Pipeline (manual): preferred sizes pad with copies whose responses are discarded") {
  PreferredRun run(PreferredSizes::Fill::pad);
  auto f = run.submit_past_window(3, 1);
  const auto& batches = run.log.batches;
  REQUIRE(batches.size() == 1);
  CHECK(batches[0] == std::vector<int>{1, 2, 3, 3});  // padded to 4 with the last request
  for (int i = 0; i < 3; ++i) CHECK(f[static_cast<std::size_t>(i)].get().value() == (i + 1) * 10);
  const PipelineStats s = run.p.stats();
  CHECK(s.count(Status::ok) == 3);
  CHECK(s.batched_requests == 3);
  // Reaching a preferred size dispatches at once.
  for (int i = 0; i < 4; ++i) f.push_back(run.p.submit(i));
  CHECK(run.p.poll().batches == 1);
  CHECK(batches.back().size() == 4);
}

TEST_CASE("Pipeline (manual): preferred sizes split a late batch into preferred sizes") {
  PreferredRun run(PreferredSizes::Fill::split);
  auto f = run.submit_past_window(6, 2);
  const auto& batches = run.log.batches;
  REQUIRE(batches.size() == 2);
  CHECK(batches[0] == std::vector<int>{1, 2, 3, 4});
  CHECK(batches[1] == std::vector<int>{5, 6, 6, 6});
  for (auto& x : f) CHECK(x.get().ok());
}

TEST_CASE("Pipeline (manual): token budget, length buckets, and an oversized request") {
  ManualClock clock;
  Log log;
  ManualPipeline<TokenBudget>::Config cfg;
  cfg.request_cost = [](const int& len) { return static_cast<std::size_t>(len); };
  ManualPipeline<TokenBudget> p(log.model(),
                                TokenBudget({.budget = 256, .max_batch = 16, .max_wait = 10ms, .bucket_bounds = {16, 128}}),
                                cfg, clock);
  std::vector<std::future<Outcome<int>>> f;
  f.push_back(p.submit(100));  // long bucket
  f.push_back(p.submit(3));    // short bucket
  f.push_back(p.submit(120));  // long: 2 x 120 = 240 fits
  f.push_back(p.submit(5));    // short
  SECTION("an oversized request is rejected at once and never stalls the queue") {
    auto big = p.submit(300);
    REQUIRE(ready(big));
    Outcome<int> o = big.get();
    CHECK(o.status() == Status::rejected);
    CHECK(o.reason() == RejectReason::too_large);
    CHECK(o.message().find("300") != std::string_view::npos);
    CHECK(o.message().find("256") != std::string_view::npos);
  }
  CHECK(p.poll().batches == 0);
  // A third long one would make 3 x 120 = 360 > 256: the long bucket closes at once.
  f.push_back(p.submit(110));
  CHECK(p.poll().batches == 1);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{100, 120});
  CHECK(p.stats().count(DispatchReason::token_budget) == 1);
  clock.advance(10ms);
  CHECK(p.poll().batches == 2);
  REQUIRE(log.batches.size() == 3);
  // Short requests never ride with long ones: each batch is one bucket.
  CHECK(log.batches[1] == std::vector<int>{3, 5});
  CHECK(log.batches[2] == std::vector<int>{110});
  for (auto& x : f) CHECK(x.get().ok());
}

TEST_CASE("Pipeline (manual): a token-budget policy needs a cost function") {
  ManualClock clock;
  Log log;
  CHECK_THROWS_MATCHES(ManualPipeline<TokenBudget>(log.model(),
                                                   TokenBudget({.budget = 8, .max_batch = 4, .max_wait = 1ms, .bucket_bounds = {}}),
                                                   {}, clock),
                       std::invalid_argument,
                       MessageIs("Pipeline: request_cost must be set for a policy that reads request cost"));
}

namespace {

// Deadline-aware batching with no margin: a batch closes at its tightest latest start, or
// after 50 ms.
DeadlineAware no_margin(std::size_t max_batch) {
  return DeadlineAware({.max_batch = max_batch, .max_wait = 50ms, .margin = 0ms});
}

}  // namespace

TEST_CASE("Pipeline (manual): EDF order and deadline-aware closing") {
  ManualClock clock;
  Log log;
  ManualPipeline<DeadlineAware> p(log.model(), no_margin(4), {}, clock);
  auto a = p.submit(1, {.deadline = t0 + 100ms});
  auto b = p.submit(2, {.deadline = t0 + 40ms});
  auto c = p.submit(3);  // no deadline
  // Tightest deadline (latest start) 40 ms, no margin: the batch closes at 40 ms.
  CHECK(p.poll().next_due == t0 + 40ms);
  clock.advance_to(t0 + 40ms - 1ns);
  CHECK(p.poll().batches == 0);
  clock.advance(1ns);
  CHECK(p.poll().batches == 1);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{2, 1, 3});  // earliest deadline first, none last
  CHECK(p.stats().count(DispatchReason::deadline) == 1);
  CHECK(a.get().ok());
  CHECK(b.get().ok());
  CHECK(c.get().ok());
}

TEST_CASE("Pipeline (manual): an urgent newcomer brings the close forward") {
  ManualClock clock;
  Log log;
  ManualPipeline<DeadlineAware> p(log.model(), no_margin(8), {}, clock);
  auto a = p.submit(1, {.deadline = t0 + 45ms});
  CHECK(p.poll().next_due == t0 + 45ms);
  clock.advance(5ms);
  auto b = p.submit(2, {.timeout = 20ms});  // deadline t0 + 25 ms
  CHECK(p.poll().next_due == t0 + 25ms);
  clock.advance_to(t0 + 25ms);
  CHECK(p.poll().batches == 1);
  CHECK(log.batches.at(0) == std::vector<int>{2, 1});
  CHECK(a.get().ok());
  CHECK(b.get().ok());
}

TEST_CASE("Pipeline (manual): a request past its deadline is never executed") {
  ManualClock clock;
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, clock);
  auto late = p.submit(1, {.deadline = t0 + 5ms});
  auto fine = p.submit(2, {.deadline = t0 + 50ms});
  auto past = p.submit(3, {.deadline = t0 - 1ms});
  REQUIRE(ready(past));
  CHECK(past.get().status() == Status::deadline_exceeded);
  clock.advance(10ms);
  CHECK(p.poll().batches == 1);
  Outcome<int> o = late.get();
  CHECK(o.status() == Status::deadline_exceeded);
  CHECK_FALSE(o.message().empty());
  CHECK(fine.get().value() == 20);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{2});
  CHECK(p.stats().count(Status::deadline_exceeded) == 2);
}

TEST_CASE("Pipeline (manual): a batch is filled from higher priorities first") {
  ManualClock clock;
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{3, 10ms}, {}, clock);
  std::vector<std::future<Outcome<int>>> f;
  f.push_back(p.submit(1, {.priority = Priority::low}));
  f.push_back(p.submit(2, {.priority = Priority::normal}));
  f.push_back(p.submit(3, {.priority = Priority::low}));
  f.push_back(p.submit(4, {.priority = Priority::high}));
  CHECK(p.poll().batches == 1);
  CHECK(log.batches.at(0) == std::vector<int>{4, 2, 1});
  clock.advance(10ms);
  CHECK(p.poll().batches == 1);
  CHECK(log.batches.at(1) == std::vector<int>{3});
  for (auto& x : f) CHECK(x.get().ok());
}

TEST_CASE("Pipeline (manual): the low lane is never starved by a stream of high-priority work") {
  ManualClock clock;
  Log log;
  ManualPipeline<>::Config cfg;
  cfg.starvation_limit = 20ms;
  ManualPipeline<> p(log.model(), FixedWindow{2, 10ms}, cfg, clock);
  auto low = p.submit(-1, {.priority = Priority::low});
  int served_at = -1;
  std::vector<std::future<Outcome<int>>> highs;
  for (int step = 0; step < 40 && served_at < 0; ++step) {
    // Two high-priority requests each millisecond, and one batch of two run each
    // millisecond (a busy model): high-priority work alone fills every batch.
    highs.push_back(p.submit(step * 2, {.priority = Priority::high}));
    highs.push_back(p.submit(step * 2 + 1, {.priority = Priority::high}));
    p.poll(1);
    if (ready(low)) served_at = step;
    clock.advance(1ms);
  }
  CHECK(served_at == 20);  // exactly when it had waited the starvation limit
  CHECK(low.get().value() == -10);
  CHECK(log.batches.back().front() == -1);  // it led its batch
}

TEST_CASE("Pipeline (manual): cancellation removes a queued request and discards a running one") {
  ManualClock clock;
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{8, 10ms}, {}, clock);
  SECTION("queued: completes as cancelled at the next step, never executed") {
    CancellationSource src;
    auto a = p.submit(1, {.cancel = src.get_token()});
    auto b = p.submit(2);
    src.request_stop();
    CHECK(p.poll().batches == 0);
    REQUIRE(ready(a));
    CHECK(a.get().status() == Status::cancelled);
    clock.advance(10ms);
    CHECK(p.poll().batches == 1);
    CHECK(log.batches.at(0) == std::vector<int>{2});
    CHECK(b.get().ok());
    CHECK(p.stats().queued == 0);
  }
  SECTION("already cancelled: completes inside submit") {
    CancellationSource src;
    src.request_stop();
    auto a = p.submit(1, {.cancel = src.get_token()});
    REQUIRE(ready(a));
    CHECK(a.get().status() == Status::cancelled);
  }
  SECTION("while running: the result is discarded") {
    CancellationSource src;
    ManualPipeline<> q(
        [&](std::span<const int> in, std::span<int> out, HostLane&) {
          src.request_stop();
          for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
        },
        FixedWindow{2, 10ms}, {}, clock);
    auto a = q.submit(1, {.cancel = src.get_token()});
    auto b = q.submit(2);
    CHECK(q.poll().batches == 1);
    CHECK(a.get().status() == Status::cancelled);
    CHECK(b.get().value() == 2);
  }
}

TEST_CASE("Pipeline (manual): a model that throws fails its batch and the pipeline lives on") {
  ManualClock clock;
  int calls = 0;
  ManualPipeline<> p(
      [&](std::span<const int> in, std::span<int> out, HostLane&) {
        if (++calls == 1) throw std::runtime_error("out of GPU memory");
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
      },
      FixedWindow{2, 10ms}, {}, clock);
  auto a = p.submit(1);
  auto b = p.submit(2);
  auto c = p.submit(3);
  auto d = p.submit(4);
  CHECK(p.poll().batches == 2);
  for (auto* f : {&a, &b}) {
    Outcome<int> o = f->get();
    CHECK(o.status() == Status::failed);
    CHECK(std::string(o.message()) == "out of GPU memory");
    CHECK_THROWS_AS(o.value(), BadOutcomeAccess);
  }
  CHECK(c.get().value() == 3);
  CHECK(d.get().value() == 4);
  CHECK(p.stats().count(Status::failed) == 2);
}

TEST_CASE("Pipeline (manual): a callback that throws is counted and affects nothing else") {
  ManualClock clock;
  Log log;
  ManualPipeline<> p(log.model(), FixedWindow{2, 10ms}, {}, clock);
  int delivered = 0;
  p.submit(1, [&](Outcome<int>&&) {
    ++delivered;
    throw std::runtime_error("callback bug");
  });
  p.submit(2, [&](Outcome<int>&& o) { delivered += o.ok() ? 10 : 0; });
  CHECK(p.poll().batches == 1);
  CHECK(delivered == 11);
  CHECK(p.stats().callback_exceptions == 1);
  // Also when the callback runs inside submit (an immediate rejection).
  p.shutdown();
  p.submit(3, [&](Outcome<int>&& o) {
    CHECK(o.reason() == RejectReason::shutting_down);
    throw 42;
  });
  CHECK(p.stats().callback_exceptions == 2);
  CHECK(p.stats().completed() == p.stats().submitted);
}

TEST_CASE("Pipeline (manual): the retry-after hint comes from recent service, not from idle time") {
  ManualClock clock;
  ManualPipeline<>::Config cfg;
  cfg.queue_capacity = 16;
  // A batch of 8 takes 1 ms: 8000 requests per second, so 16 queued empty in 2 ms.
  ManualPipeline<> p(
      [&](std::span<const int> in, std::span<int> out, HostLane&) {
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
        clock.advance(1ms);
      },
      FixedWindow{8, 1ms}, cfg, clock);
  auto fill_and_refuse = [&] {
    std::vector<std::future<Outcome<int>>> f;
    for (int i = 0; i < 16; ++i) f.push_back(p.submit(i));
    auto refused = p.submit(99);
    REQUIRE(ready(refused));
    const Outcome<int> o = refused.get();
    CHECK(o.reason() == RejectReason::queue_full);
    CHECK(p.poll().batches == 2);
    for (auto& x : f) CHECK(x.get().ok());
    return o.retry_after();
  };
  // Idle 20 s from construction, then one batch: the first measurement.
  clock.advance(20s);
  std::vector<std::future<Outcome<int>>> first;
  for (int i = 0; i < 8; ++i) first.push_back(p.submit(i));
  CHECK(p.poll().batches == 1);
  CHECK(fill_and_refuse() == 2ms);
  // Busy, then idle 20 s, then busy again: the same hint.
  clock.advance(20s);
  CHECK(fill_and_refuse() == 2ms);
  clock.advance(20s);
  CHECK(fill_and_refuse() == 2ms);
}

TEST_CASE("Pipeline (manual): a full queue rejects at once with a retry-after from the drain rate") {
  ManualClock clock;
  Log log;
  ManualPipeline<>::Config cfg;
  cfg.queue_capacity = 4;
  // Each batch of 2 takes 5 ms of model time: 400 requests per second of service.
  ManualPipeline<> p(
      [&](std::span<const int> in, std::span<int> out, HostLane& lane) {
        log.model()(in, out, lane);
        clock.advance(5ms);
      },
      FixedWindow{2, 1ms}, cfg, clock);
  std::vector<std::future<Outcome<int>>> f;
  f.push_back(p.submit(1));
  f.push_back(p.submit(2));
  CHECK(p.poll().batches == 1);
  clock.advance(10ms);
  f.push_back(p.submit(3));
  f.push_back(p.submit(4));
  CHECK(p.poll().batches == 1);  // 2 requests per 5 ms of model time: 400 per second
  CHECK(p.drain_rate_approx() == Approx(400.0));
  for (int i = 0; i < 4; ++i) f.push_back(p.submit(i));
  auto rejected = p.submit(99);
  REQUIRE(ready(rejected));
  Outcome<int> o = rejected.get();
  CHECK(o.status() == Status::rejected);
  CHECK(o.reason() == RejectReason::queue_full);
  CHECK(o.retry_after() == 10ms);  // 4 queued at 400 per second
  CHECK(p.stats().count(RejectReason::queue_full) == 1);
  CHECK(p.poll().batches == 2);
  for (auto& x : f) CHECK(x.get().ok());
}

TEST_CASE("Pipeline (manual): threads on different shards share one capacity; each keeps its order") {
  ManualClock clock;
  std::vector<std::vector<int>> batches;
  ManualPipeline<>::Config cfg;
  cfg.queue_capacity = 1000;
  cfg.submit_shards = 64;
  ManualPipeline<> p(
      [&](std::span<const int> in, std::span<int> out, HostLane&) {
        batches.emplace_back(in.begin(), in.end());
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
      },
      FixedWindow{64, 1ms}, cfg, clock);
  // 8 threads x 300 requests race for 1000 places: exactly 1000 are queued, whichever
  // shards their threads hash to.
  constexpr int threads = 8;
  constexpr int per = 300;
  std::atomic<int> accepted_done{0};
  std::atomic<int> full{0};
  on_threads(threads, [&](int t) {
    for (int i = 0; i < per; ++i) {
      p.submit(t * per + i, [&](Outcome<int>&& o) {
        if (o.ok()) {
          accepted_done.fetch_add(1);
        } else if (o.reason() == RejectReason::queue_full) {
          full.fetch_add(1);
        }
      });
    }
  });
  CHECK(p.queued_approx() == 1000);
  CHECK(full.load() == threads * per - 1000);
  clock.advance(1ms);
  while (p.poll().batches > 0) {
  }
  CHECK(accepted_done.load() == 1000);
  CHECK(p.queued_approx() == 0);
  // Within the batches, each thread's requests run in the order that thread submitted.
  std::vector<int> last(threads, -1);
  std::size_t ran = 0;
  for (const auto& b : batches) {
    for (int x : b) {
      CHECK(x > last[static_cast<std::size_t>(x / per)]);
      last[static_cast<std::size_t>(x / per)] = x;
      ++ran;
    }
  }
  CHECK(ran == 1000);
  const PipelineStats s = p.stats();
  CHECK(s.submitted == threads * per);
  CHECK(s.count(RejectReason::queue_full) == threads * per - 1000);
}

TEST_CASE("Pipeline (manual): threads sharing a shard keep their order too") {
  ManualClock clock;
  std::vector<int> order;
  ManualPipeline<>::Config cfg;
  cfg.queue_capacity = 1 << 16;
  cfg.submit_shards = 2;  // 8 threads: every shard is shared
  ManualPipeline<> p(
      [&](std::span<const int> in, std::span<int>, HostLane&) { order.insert(order.end(), in.begin(), in.end()); },
      FixedWindow{64, 1ms}, cfg, clock);
  constexpr int threads = 8;
  constexpr int per = 500;
  on_threads(threads, [&](int t) {
    for (int i = 0; i < per; ++i) p.submit(t * per + i, [](Outcome<int>&&) {});
  });
  clock.advance(1ms);
  while (p.poll().batches > 0) {
  }
  REQUIRE(order.size() == std::size_t{threads * per});
  std::vector<int> last(threads, -1);
  for (int x : order) {
    CHECK(x > last[static_cast<std::size_t>(x / per)]);
    last[static_cast<std::size_t>(x / per)] = x;
  }
}

TEST_CASE("Pipeline (manual): with a large capacity, shards hold back less than 1/16 of it") {
  ManualClock clock;
  ManualPipeline<>::Config cfg;
  cfg.queue_capacity = 4096;
  cfg.submit_shards = 16;  // each claims 4096 / (16 x 16) = 16 places at a time
  ManualPipeline<> p([](std::span<const int>, std::span<int>, HostLane&) {}, FixedWindow{64, 1ms}, cfg, clock);
  std::atomic<std::size_t> full{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < 8; ++t) {
    producers.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        p.submit(i, [&](Outcome<int>&& o) {
          if (o.reason() == RejectReason::queue_full) full.fetch_add(1);
        });
      }
    });
  }
  for (auto& th : producers) th.join();
  const std::size_t queued = p.queued_approx();
  CHECK(queued <= 4096);
  CHECK(queued > 4096 - 4096 / 16);
  CHECK(queued + full.load() == 8000);
  // Another thread finds every place the pool still holds: it fills the queue but for
  // what the other shards hold back.
  std::size_t refused = 0;
  std::thread([&] {
    for (int i = 0; i < 4096; ++i) {
      p.submit(i, [&](Outcome<int>&& o) { refused += o.reason() == RejectReason::queue_full; });
    }
  }).join();
  const std::size_t topped_up = p.queued_approx();
  CHECK(topped_up == queued + (4096 - refused));
  CHECK(topped_up <= 4096);
  CHECK(topped_up > 4096 - 4096 / 16);
  clock.advance(1ms);
  while (p.poll().batches > 0) {
  }
  CHECK(p.queued_approx() == 0);
  CHECK(p.stats().count(Status::ok) == topped_up);
}

TEST_CASE("Pipeline (manual): shutdown drains the queue, then rejects new work") {
  ManualClock clock;
  Log log;
  auto p = std::make_unique<ManualPipeline<>>(log.model(), FixedWindow{4, 1s}, ManualPipeline<>::Config{}, clock);
  std::vector<std::future<Outcome<int>>> f;
  for (int i = 0; i < 6; ++i) f.push_back(p->submit(i));
  CHECK(p->poll().batches == 1);
  p->shutdown();
  CHECK(log.batches.size() == 2);
  CHECK(p->stats().count(DispatchReason::flush) == 1);
  for (auto& x : f) CHECK(x.get().ok());
  auto after = p->submit(7);
  REQUIRE(ready(after));
  CHECK(after.get().reason() == RejectReason::shutting_down);
  const PipelineStats s = p->stats();
  CHECK(s.submitted == 7);
  CHECK(s.completed() == 7);
  p.reset();  // a second shutdown (in the destructor) is a no-op
}

TEST_CASE("Pipeline (manual): the drain is bounded; what is left is rejected") {
  ManualClock clock;
  Log log;
  log.advance_clock = &clock;
  log.model_time = 10ms;
  ManualPipeline<>::Config cfg;
  cfg.drain_timeout = 15ms;
  ManualPipeline<> p(log.model(), FixedWindow{2, 1s}, cfg, clock);
  std::vector<std::future<Outcome<int>>> f;
  for (int i = 0; i < 10; ++i) f.push_back(p.submit(i));
  p.shutdown();
  // Batches start at 0 ms and 10 ms; at 20 ms the 15 ms drain is over.
  CHECK(log.batches.size() == 2);
  int ok = 0;
  int rejected = 0;
  for (auto& x : f) {
    REQUIRE(ready(x));
    Outcome<int> o = x.get();
    if (o.ok()) ++ok;
    if (o.reason() == RejectReason::shutting_down) ++rejected;
  }
  CHECK(ok == 4);
  CHECK(rejected == 6);
}

TEST_CASE("Pipeline (manual): destroying the pipeline fulfils every future") {
  ManualClock clock;
  Log log;
  std::vector<std::future<Outcome<int>>> f;
  {
    ManualPipeline<>::Config cfg;
    cfg.drain_timeout = 0ms;
    ManualPipeline<> p(log.model(), FixedWindow{4, 1s}, cfg, clock);
    for (int i = 0; i < 5; ++i) f.push_back(p.submit(i));
  }
  for (auto& x : f) {
    REQUIRE(ready(x));
    CHECK(x.get().reason() == RejectReason::shutting_down);  // drain_timeout 0: nothing ran
  }
  CHECK(log.batches.empty());
}

TEST_CASE("Pipeline: bad configuration names the field") {
  ManualClock clock;
  Log log;
  using P = ManualPipeline<>;
  auto make = [&](P::Config cfg) { P p(log.model(), FixedWindow{4, 1ms}, std::move(cfg), clock); };
  CHECK_THROWS_MATCHES(make({.queue_capacity = 0}), std::invalid_argument,
                       MessageIs("Pipeline: queue_capacity must be >= 1"));
  CHECK_THROWS_MATCHES(make({.workers = 2}), std::invalid_argument,
                       MessageIs("Pipeline: workers must be 0 with a clock other than SteadyClock"));
  CHECK_THROWS_MATCHES(make({.drain_timeout = -1ms}), std::invalid_argument,
                       MessageIs("Pipeline: drain_timeout must be >= 0"));
  CHECK_THROWS_MATCHES(make({.starvation_limit = 0ms}), std::invalid_argument,
                       MessageIs("Pipeline: starvation_limit must be > 0"));
  CHECK_THROWS_MATCHES(make({.submit_shards = 65}), std::invalid_argument,
                       MessageIs("Pipeline: submit_shards must be at most 64 (0: automatic)"));
  CHECK_THROWS_MATCHES(P(P::Model{}, FixedWindow{4, 1ms}, {}, clock), std::invalid_argument,
                       MessageIs("Pipeline: model must be set"));
}

namespace {

// A user policy: batches go out in pairs; a single request waits at most 1 ms.
struct Pairs {
  [[nodiscard]] std::size_t max_batch() const noexcept { return 2; }
  [[nodiscard]] BatchOrder order() const noexcept { return BatchOrder::fifo; }
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    if (v.candidates.size() >= 2) return BatchDecision::dispatch(2, DispatchReason::size);
    if (v.candidates.empty()) return BatchDecision::wait(BatchTime::max(), 1);
    const BatchTime due = v.candidates[0].arrival + 1ms;
    if (v.flush || v.now >= due) return BatchDecision::dispatch(1, v.flush ? DispatchReason::flush : DispatchReason::window);
    return BatchDecision::wait(due, 2);
  }
};
static_assert(BatchPolicy<Pairs>);

}  // namespace

TEST_CASE("Pipeline (manual): a user-written policy plugs in") {
  ManualClock clock;
  Log log;
  ManualPipeline<Pairs> p(log.model(), Pairs{}, {}, clock);
  auto a = p.submit(1);
  auto b = p.submit(2);
  auto c = p.submit(3);
  CHECK(p.poll().batches == 1);
  clock.advance(1ms);
  CHECK(p.poll().batches == 1);
  CHECK(log.batches == std::vector<std::vector<int>>{{1, 2}, {3}});
  CHECK(c.get().ok());
}

namespace {

// Counts admissions and releases; admits up to `cap` at once and reports a limit.
struct CountingAdmission {
  struct Ticket {
    int id;
  };
  std::size_t cap = 1000;
  std::size_t in_flight = 0;
  int next = 0;
  std::vector<int> released;
  std::vector<Status> statuses;
  [[nodiscard]] std::optional<Ticket> try_admit() noexcept {
    if (in_flight >= cap) return std::nullopt;
    ++in_flight;
    return Ticket{next++};
  }
  void release(Ticket&& t, Status s, std::chrono::nanoseconds) noexcept {
    --in_flight;
    released.push_back(t.id);
    statuses.push_back(s);
  }
  [[nodiscard]] std::size_t limit() const noexcept { return cap; }
};
static_assert(AdmissionPolicy<CountingAdmission>);

}  // namespace

TEST_CASE("Pipeline (manual): admission is asked first and released exactly once per request") {
  ManualClock clock;
  Log log;
  HostLanes lanes;
  CountingAdmission adm;
  adm.cap = 5;
  ManualPipeline<FixedWindow, CountingAdmission> p(log.model(), FixedWindow{4, 10ms}, {}, lanes, adm, clock);
  std::vector<std::future<Outcome<int>>> f;
  for (int i = 0; i < 5; ++i) f.push_back(p.submit(i));
  auto refused = p.submit(5);
  REQUIRE(ready(refused));
  CHECK(refused.get().reason() == RejectReason::overloaded);
  CHECK(p.poll().batches == 1);
  clock.advance(10ms);
  CHECK(p.poll().batches == 1);
  for (auto& x : f) CHECK(x.get().ok());
  CHECK(adm.in_flight == 0);
  std::vector<int> ids = adm.released;
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("Pipeline (manual): an admission limit below max_batch x lanes is refused at construction") {
  ManualClock clock;
  Log log;
  HostLanes lanes(2);
  CountingAdmission adm;
  adm.cap = 7;  // < 4 x 2
  using P = ManualPipeline<FixedWindow, CountingAdmission>;
  CHECK_THROWS_MATCHES(P(log.model(), FixedWindow{4, 1ms}, {}, lanes, adm, clock), std::invalid_argument,
                       MessageStartsWith("Pipeline: the admission limit is below max_batch x lanes"));
  P::Config cfg;
  cfg.check_admission_limit = false;
  P p(log.model(), FixedWindow{4, 1ms}, cfg, lanes, adm, clock);
}

TEST_CASE("Pipeline (manual): metrics reach the registry") {
  ManualClock clock;
  Log log;
  MetricsRegistry reg;
  ManualPipeline<>::Config cfg;
  cfg.metrics = &reg;
  cfg.metric_labels = {{"pipeline", "test"}};
  cfg.queue_capacity = 3;
  ManualPipeline<> p(log.model(), FixedWindow{2, 5ms}, cfg, clock);
  std::vector<std::future<Outcome<int>>> f;
  for (int i = 0; i < 3; ++i) f.push_back(p.submit(i));
  auto full = p.submit(9);
  CHECK(p.queued_approx() == 3);
  clock.advance(1ms);
  CHECK(p.poll().batches == 1);
  clock.advance(5ms);
  CHECK(p.poll().batches == 1);
  const Labels base{{"pipeline", "test"}};
  auto counter = [&](const char* name, Labels extra) { return reg.counter(name, "x", join_labels(base, extra)).value(); };
  CHECK(counter("tailbatch_pipeline_batches_total", {{"reason", "size"}}) == 1);
  CHECK(counter("tailbatch_pipeline_batches_total", {{"reason", "window"}}) == 1);
  CHECK(counter("tailbatch_pipeline_batch_size_total", {{"size", "2"}}) == 1);
  CHECK(counter("tailbatch_pipeline_batch_size_total", {{"size", "1"}}) == 1);
  CHECK(counter("tailbatch_pipeline_requests_total", {{"status", "ok"}, {"reason", "none"}}) == 3);
  CHECK(counter("tailbatch_pipeline_requests_total", {{"status", "rejected"}, {"reason", "queue_full"}}) == 1);
  CHECK(counter("tailbatch_pipeline_batched_requests_total", {}) == 3);
  auto& wait = reg.histogram("tailbatch_pipeline_queue_wait_seconds", "x", base);
  const HistogramSnapshot w = wait.snapshot();
  CHECK(w.count() == 3);
  CHECK(w.max() >= 5ms);  // the third request waited 6 ms for its window
  // Requests that entered the queue; the one turned away at submit never waited.
  CHECK(reg.histogram("tailbatch_pipeline_end_to_end_seconds", "x", base).snapshot().count() == 3);
  CHECK(reg.histogram("tailbatch_pipeline_model_seconds", "x", base).snapshot().count() == 2);
  const std::string text = reg.prometheus();
  CHECK(text.find("tailbatch_pipeline_queue_depth{pipeline=\"test\"} 0") != std::string::npos);
  CHECK(text.find("tailbatch_pipeline_batch_fill_ratio{pipeline=\"test\"} 0.75") != std::string::npos);
  for (auto& x : f) CHECK(x.get().ok());
  CHECK(full.get().reason() == RejectReason::queue_full);
}
