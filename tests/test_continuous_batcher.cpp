// ContinuousBatcher: the loop (admit between steps, retire after), the budget, chunked
// prefill, priorities without starvation, deadlines, every outcome exactly once, a step
// that throws, shutdown, deterministic manual runs, and a threaded stress test.
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/littles_law.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "continuous_test_support.hpp"
#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using namespace tailbatch;
using namespace tailbatch::test;

namespace {

// A step that emits one token per sequence that should emit, and records what it saw.
struct Recorder {
  ManualClock clock;
  std::chrono::nanoseconds step_time = 1ms;
  std::vector<std::vector<std::uint64_t>> steps;         // ids per step
  std::vector<std::size_t> step_tokens;                  // prompt + decode tokens per step
  std::function<void(std::span<Seq>)> also;              // extra behaviour

  auto fn() {
    return [this](std::span<Seq> batch) {
      std::vector<std::uint64_t> ids;
      std::size_t tokens = 0;
      for (auto& s : batch) {
        ids.push_back(s.id());
        tokens += s.decoding() ? 1 : s.prefill_chunk().size();
      }
      steps.push_back(ids);
      step_tokens.push_back(tokens);
      clock.advance(step_time);
      if (also) also(batch);
      for (auto& s : batch)
        if (s.emits()) s.emit(token_of(s));
    };
  }
};

SubmitOptions at(Priority p) {
  SubmitOptions o;
  o.priority = p;
  return o;
}

ContinuousBatcherConfig config(std::size_t max_active, std::size_t budget = 1 << 20) {
  ContinuousBatcherConfig c;
  c.max_active = max_active;
  c.token_budget = budget;
  return c;
}

}  // namespace

TEST_CASE("bad configuration throws std::invalid_argument naming the field", "[continuous_batcher]") {
  struct Case {
    void (*edit)(ContinuousBatcherConfig&);
    std::string_view message;  // after "ContinuousBatcher: "
  };
  const Case cases[] = {
      {[](ContinuousBatcherConfig& c) { c.max_active = 0; }, "max_active must be >= 1"},
      {[](ContinuousBatcherConfig& c) { c.token_budget = 0; }, "token_budget must be >= 1"},
      {[](ContinuousBatcherConfig& c) { c.queue_capacity = 0; }, "queue_capacity must be >= 1"},
      {[](ContinuousBatcherConfig& c) { c.max_step_tokens = 3; },
       "max_step_tokens must be 0 or >= max_active"},
      {[](ContinuousBatcherConfig& c) { c.priority_step = -1ms; }, "priority_step must be >= 0"},
      {[](ContinuousBatcherConfig& c) { c.drain_timeout = -1ms; }, "drain_timeout must be >= 0"},
      {[](ContinuousBatcherConfig& c) { c.stream.capacity = 0; }, "stream.capacity must be >= 1"},
      {[](ContinuousBatcherConfig& c) { c.workers = 2; }, "workers must be 0 or 1"},
  };
  for (const Case& bad : cases) {
    auto c = config(4);
    bad.edit(c);
    CHECK(config_error(c) == "ContinuousBatcher: " + std::string(bad.message));
  }
  CHECK_THROWS_AS(Batcher(nullptr, config(4), ManualClock{}), std::invalid_argument);
}

TEST_CASE("the queue_full hint comes from recent steps, not from idle time", "[continuous_batcher]") {
  Recorder rec;  // each step takes 1 ms
  auto c = config(1);
  c.queue_capacity = 2;
  Batcher b(rec.fn(), c, rec.clock);
  auto refused_hint = [&] {
    auto x = b.submit(req(0, 1));
    auto y = b.submit(req(0, 1));
    auto z = b.submit(req(0, 1));
    REQUIRE(z->closed());
    CHECK(z->end()->reason == RejectReason::queue_full);
    run_all(b);
    CHECK(x->end()->ok());
    CHECK(y->end()->ok());
    return z->end()->retry_after;
  };
  (void)refused_hint();  // measured: one sequence finished per 1 ms step
  rec.clock.advance(20s);
  CHECK(refused_hint() == 1ms);
  rec.clock.advance(20s);
  CHECK(refused_hint() == 1ms);
}

TEST_CASE("slow callbacks of expired sequences run after the step, not before admission", "[continuous_batcher]") {
  // 300 waiting sequences expired; each one's on_end takes 20 us (it advances the manual
  // clock): 6 ms in all. The live one's deadline is the poll's time; it is admitted and
  // stepped first, and the callbacks run after the step.
  Recorder rec;
  rec.step_time = 0ms;
  Batcher b(rec.fn(), config(4), rec.clock);
  const auto t0 = rec.clock.now();
  int expired = 0;
  for (int i = 0; i < 300; ++i) {
    tailbatch::StreamCallbacks<int> cb;
    cb.on_end = [&](const tailbatch::StreamEnd& e) {
      expired += e.status == Status::deadline_exceeded ? 1 : 0;
      rec.clock.advance(20us);
    };
    SubmitOptions o;
    o.deadline = t0 + 1ms;
    (void)b.submit(req(0, 1), o, std::move(cb));
  }
  rec.clock.advance(2ms);
  auto live = b.submit(req(0, 1), SubmitOptions{.deadline = rec.clock.now()});
  (void)b.poll();
  CHECK(expired == 300);
  REQUIRE(live->closed());
  CHECK(live->end()->ok());
  CHECK(rec.clock.now() == t0 + 8ms);
}

TEST_CASE("bad per-request stream options are the request's outcome, not a throw", "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(4), rec.clock);
  auto r = req(2, 3);
  r.stream = tailbatch::TokenStreamerConfig{};
  r.stream->capacity = 0;
  std::shared_ptr<Batcher::Stream> bad;
  CHECK_NOTHROW(bad = b.submit(std::move(r)));
  REQUIRE(bad->end().has_value());
  CHECK(bad->end()->status == Status::failed);
  CHECK(bad->end()->message == "ContinuousBatcher: request.stream.capacity must be >= 1");
  // Callback mode hears of it through on_end, in this thread.
  auto r2 = req(2, 3);
  r2.stream = tailbatch::TokenStreamerConfig{};
  r2.stream->coalesce_interval = -1ms;
  std::optional<Status> ended;
  tailbatch::StreamCallbacks<int> cb;
  cb.on_end = [&](const tailbatch::StreamEnd& e) { ended = e.status; };
  (void)b.submit(std::move(r2), SubmitOptions{}, std::move(cb));
  CHECK(ended == Status::failed);
  // Counted, and the batcher carries on.
  auto good = b.submit(req(2, 3));
  run_all(b);
  CHECK(good->end()->ok());
  CHECK(b.stats().count(Status::failed) == 2);
  CHECK(b.stats().submitted == 3);
}

TEST_CASE("sequences decode in one batch; tokens in order, exactly once; each ends ok",
          "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(8), rec.clock);
  auto s1 = b.submit(req(3, 4));
  auto s2 = b.submit(req(0, 2));
  auto r = b.poll();
  CHECK(r.admitted == 2);
  CHECK(r.scheduled == 2);
  CHECK(r.step_tokens == 4);  // 3 prompt tokens + 1 decode token
  CHECK(r.emitted == 2);      // both emit: s1's prefill ends its prompt, s2 decodes
  while (b.active_approx() > 0) (void)b.poll();
  CHECK(drain(*s1) == expected_tokens(1, 4));
  CHECK(drain(*s2) == expected_tokens(2, 2));
  CHECK(s1->done());
  CHECK(s1->end()->ok());
  CHECK(s2->end()->ok());
  CHECK(rec.steps.size() == 4);
  CHECK(rec.steps[0] == std::vector<std::uint64_t>{1, 2});
  CHECK(rec.steps[1] == std::vector<std::uint64_t>{1, 2});
  CHECK(rec.steps[2] == std::vector<std::uint64_t>{1});  // 2 retired after its 2nd token
  auto st = b.stats();
  CHECK(st.submitted == 2);
  CHECK(st.count(Status::ok) == 2);
  CHECK(st.tokens == 6);
}

TEST_CASE("the active set stays within max_active; a freed slot is refilled before the next step",
          "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(2), rec.clock);
  auto a = b.submit(req(0, 1));
  auto c = b.submit(req(0, 3));
  auto d = b.submit(req(0, 2));
  CHECK(b.waiting_approx() == 3);
  (void)b.poll();
  CHECK(rec.steps.back() == std::vector<std::uint64_t>{1, 2});
  (void)b.poll();  // 1 finished after step 1, so 3 joins 2 at once
  CHECK(rec.steps.back() == std::vector<std::uint64_t>{2, 3});
  run_all(b);
  for (auto& ids : rec.steps) CHECK(ids.size() <= 2);
  CHECK(drain(*a) == expected_tokens(1, 1));
  CHECK(drain(*c) == expected_tokens(2, 3));
  CHECK(drain(*d) == expected_tokens(3, 2));
}

TEST_CASE("the token budget: reservations bound the active set; too large is rejected at once",
          "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(8, 100), rec.clock);
  auto big = b.submit(req(50, 60));  // 110 > 100: can never run
  REQUIRE(big->closed());
  CHECK(big->end()->status == Status::rejected);
  CHECK(big->end()->reason == RejectReason::too_large);
  CHECK(big->end()->message.find("token_budget (100)") != std::string::npos);

  auto a = b.submit(req(10, 30));  // reserves 40
  auto c = b.submit(req(10, 50));  // 100
  auto d = b.submit(req(10, 30));  // 140 > 100: waits
  (void)b.poll();
  CHECK(b.active_approx() == 2);
  CHECK(b.reserved_tokens_approx() == 100);
  CHECK(b.waiting_approx() == 1);
  while (!a->closed()) (void)b.poll();
  CHECK(b.waiting_approx() == 1);
  (void)b.poll();
  CHECK(b.waiting_approx() == 0);
  CHECK(b.reserved_tokens_approx() == 100);  // d took a's place
  run_all(b);
  CHECK(d->end()->ok());
  CHECK(b.reserved_tokens_approx() == 0);
}

TEST_CASE("the waiting queue is bounded: queue_full with a retry hint", "[continuous_batcher]") {
  Recorder rec;
  auto c = config(1);
  c.queue_capacity = 2;
  Batcher b(rec.fn(), c, rec.clock);
  auto a = b.submit(req(0, 1));
  auto d = b.submit(req(0, 1));
  auto e = b.submit(req(0, 1));
  REQUIRE(e->closed());
  CHECK(e->end()->status == Status::rejected);
  CHECK(e->end()->reason == RejectReason::queue_full);
  CHECK_FALSE(a->closed());
  (void)b.poll();
  (void)b.poll();
  (void)b.poll();
  auto f = b.submit(req(0, 1));
  auto g = b.submit(req(0, 1));
  auto h = b.submit(req(0, 1));
  CHECK(h->end()->reason == RejectReason::queue_full);
  CHECK(h->end()->retry_after == 1ms);  // one admission per 1 ms step
  while (!g->closed()) (void)b.poll();
  CHECK(f->end()->ok());
  CHECK(g->end()->ok());
}

TEST_CASE("chunked prefill: a long prompt does not stall the others' decoding", "[continuous_batcher]") {
  Recorder rec;
  auto c = config(4);
  c.prefill_chunk = 16;
  c.max_step_tokens = 20;
  Batcher b(rec.fn(), c, rec.clock);
  auto d1 = b.submit(req(1, 40));
  auto d2 = b.submit(req(1, 40));
  (void)b.poll();  // both prefill their one-token prompt and emit
  auto longp = b.submit(req(100, 1));
  std::size_t steps_until_long = 0;
  while (!longp->closed()) {
    auto before1 = d1->tokens_pushed();
    auto before2 = d2->tokens_pushed();
    auto r = b.poll();
    ++steps_until_long;
    CHECK(r.step_tokens <= 20);
    // Every step still advances both decoders by a token.
    CHECK(d1->tokens_pushed() == before1 + 1);
    CHECK(d2->tokens_pushed() == before2 + 1);
  }
  CHECK(steps_until_long == 7);  // 100 prompt tokens at most 16 per step (18 left beside 2 decoders)
  CHECK(longp->end()->ok());
  CHECK(drain(*longp) == expected_tokens(3, 1));
  b.shutdown();
}

TEST_CASE("without chunking a long prompt runs in one step", "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(4), rec.clock);
  auto d1 = b.submit(req(1, 5));
  auto longp = b.submit(req(100, 1));
  auto r = b.poll();
  CHECK(r.step_tokens == 101);
  CHECK(longp->closed());
  b.shutdown();
}

TEST_CASE("a cancelled sequence leaves the active set within one step", "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(4), rec.clock);
  tailbatch::CancellationSource source;
  auto r1 = req(0, 100);
  SubmitOptions r1_opt;
  r1_opt.cancel = source.get_token();
  auto s1 = b.submit(std::move(r1), r1_opt);
  auto s2 = b.submit(req(0, 100));
  (void)b.poll();
  (void)b.poll();
  CHECK(b.active_approx() == 2);
  source.request_stop();
  (void)b.poll();
  CHECK(rec.steps.back() == std::vector<std::uint64_t>{2});
  CHECK(b.active_approx() == 1);
  CHECK(s1->end()->status == Status::cancelled);
  CHECK(drain(*s1) == expected_tokens(1, 2));

  s2->cancel();  // cancel() on the stream works the same way
  auto r = b.poll();
  CHECK_FALSE(r.stepped);
  CHECK(b.active_approx() == 0);
  CHECK(s2->end()->status == Status::cancelled);

  // Cancelled while waiting: completes at the next turn without ever running.
  auto c = config(1);
  Recorder rec2;
  Batcher b2(rec2.fn(), c, rec2.clock);
  auto run = b2.submit(req(0, 10));
  auto wait = b2.submit(req(0, 10));
  (void)b2.poll();
  wait->cancel();
  (void)b2.poll();
  CHECK(wait->end()->status == Status::cancelled);
  CHECK(wait->end()->tokens == 0);
  for (auto& ids : rec2.steps) CHECK(std::find(ids.begin(), ids.end(), 2u) == ids.end());
  run->cancel();
  b2.shutdown();
}

TEST_CASE("deadlines: not admitted by its deadline never runs; active at its completion deadline is retired",
          "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  Batcher b(rec.fn(), config(1), rec.clock);
  auto r1 = req(0, 100);
  r1.completion_deadline = rec.clock.now() + 35ms;
  auto s1 = b.submit(std::move(r1));
  auto r2 = req(0, 5);
  // The one slot is s1's until 40 ms.
  auto s2 = b.submit(std::move(r2), SubmitOptions{.deadline = rec.clock.now() + 15ms});
  while (!s1->closed() || !s2->closed()) (void)b.poll();
  CHECK(s2->end()->status == Status::deadline_exceeded);
  CHECK(s2->end()->tokens == 0);
  CHECK(s2->end()->message.find("not admitted in time") != std::string::npos);
  CHECK(s1->end()->status == Status::deadline_exceeded);
  CHECK(s1->end()->tokens == 4);  // steps at 0, 10, 20, 30 ms; retired at 40 ms
  CHECK(s1->end()->message.find("completion_deadline") != std::string::npos);
  CHECK(drain(*s1) == expected_tokens(1, 4));

  auto past = req(0, 1);

  auto s3 = b.submit(std::move(past), SubmitOptions{.deadline = rec.clock.now() - 1ns});
  REQUIRE(s3->end().has_value());
  CHECK(s3->end()->status == Status::deadline_exceeded);
  auto over = req(0, 1);
  over.completion_deadline = rec.clock.now();
  auto s4 = b.submit(std::move(over));
  REQUIRE(s4->end().has_value());
  CHECK(s4->end()->status == Status::deadline_exceeded);
  // A deadline of exactly now may still start now.
  auto edge = req(0, 1);
  auto s5 = b.submit(std::move(edge), SubmitOptions{.deadline = rec.clock.now()});
  CHECK_FALSE(s5->closed());
  (void)b.poll();
  REQUIRE(s5->end().has_value());
  CHECK(s5->end()->status == Status::ok);
}

TEST_CASE("a completion deadline that passes while waiting drops the sequence", "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  Batcher b(rec.fn(), config(1), rec.clock);
  auto s1 = b.submit(req(0, 3));
  auto r2 = req(0, 1);
  r2.completion_deadline = rec.clock.now() + 15ms;  // the slot frees at 30 ms
  auto s2 = b.submit(std::move(r2));
  run_all(b);
  CHECK(s1->end()->status == Status::ok);
  CHECK(s2->end()->status == Status::deadline_exceeded);
  CHECK(s2->end()->tokens == 0);
  CHECK(s2->end()->message.find("completion_deadline") != std::string::npos);
}

TEST_CASE("SubmitOptions::arrival: the timeout and the queue order count from the arrival",
          "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  rec.clock.advance(1s);
  Batcher b(rec.fn(), config(1), rec.clock);
  SubmitOptions early;
  early.arrival = rec.clock.now() - 20ms;
  early.timeout = 15ms;  // spent 5 ms before the submit
  auto s_early = b.submit(req(0, 1), early);
  REQUIRE(s_early->end().has_value());
  CHECK(s_early->end()->status == Status::deadline_exceeded);
  SubmitOptions now;
  now.timeout = 15ms;  // the same budget from the submit: still open
  auto s_now = b.submit(req(0, 1), now);
  CHECK_FALSE(s_now->closed());
  // An earlier arrival is served first, as if it had been submitted then.
  auto s_older = b.submit(req(0, 1), SubmitOptions{.arrival = rec.clock.now() - 5ms});
  (void)b.poll();
  CHECK(s_older->end().has_value());
  CHECK_FALSE(s_now->end().has_value());
  run_all(b);
  CHECK(s_now->end()->status == Status::ok);
}

TEST_CASE("workers chooses the decode thread: the clock's default, or explicit", "[continuous_batcher]") {
  Recorder rec;
  Batcher manual(rec.fn(), config(1), rec.clock);
  CHECK(manual.worker_count() == 0);  // ManualClock: none by default
  auto c = config(1);
  c.workers = 1;
  Batcher threaded(rec.fn(), c, rec.clock);
  CHECK(threaded.worker_count() == 1);
  CHECK(threaded.poll().admitted == 0);
  threaded.shutdown();

  using SBatcher = tailbatch::ContinuousBatcher<int>;
  auto emit_one = [](std::span<SBatcher::Sequence> batch) {
    for (auto& s : batch)
      if (s.emits()) s.emit(1);
  };
  SBatcher by_default(emit_one);
  CHECK(by_default.worker_count() == 1);  // SteadyClock: the decode thread
  c.workers = 0;
  SBatcher stepped(emit_one, c);
  CHECK(stepped.worker_count() == 0);
  SBatcher::Request r;
  r.max_new_tokens = 1;
  auto s = stepped.submit(std::move(r));
  CHECK(stepped.poll().stepped);
  REQUIRE(s->end().has_value());
  CHECK(s->end()->ok());
}

TEST_CASE("timeout: positive bounds the deadline, negative is already expired, zero is none",
          "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  Batcher b(rec.fn(), config(1), rec.clock);
  auto spent = req(0, 1);
  auto s_spent =
      b.submit(std::move(spent), SubmitOptions{.timeout = -1ns});  // a budget spent upstream
  REQUIRE(s_spent->end().has_value());
  CHECK(s_spent->end()->status == Status::deadline_exceeded);
  CHECK(b.waiting_approx() == 0);

  auto hog = b.submit(req(0, 3));  // holds the slot for 30 ms
  auto tight = req(0, 1);
  auto s_tight =
      b.submit(std::move(tight), SubmitOptions{.timeout = 15ms});  // must be admitted by 15 ms
  auto loose = req(0, 1);
  auto s_loose =
      b.submit(std::move(loose), SubmitOptions{.timeout = 0ns});  // none: waits as long as it takes
  auto both = req(0, 1);
  SubmitOptions both_opt;
  both_opt.deadline = rec.clock.now() + 100ms;
  both_opt.timeout = 35ms;  // the earlier of the two wins: 35 ms
  auto s_both = b.submit(std::move(both), both_opt);
  run_all(b);
  CHECK(hog->end()->status == Status::ok);
  CHECK(s_tight->end()->status == Status::deadline_exceeded);
  CHECK(s_loose->end()->status == Status::ok);               // admitted at 30 ms
  CHECK(s_both->end()->status == Status::deadline_exceeded);  // its turn came at 40 ms
}

TEST_CASE("a deadline is the latest admission: a sequence admitted in time runs to its end",
          "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  Batcher b(rec.fn(), config(1), rec.clock);
  auto r = req(0, 5);
  SubmitOptions r_opt;
  r_opt.deadline = rec.clock.now() + 15ms;  // admitted at 0 ms; five 10 ms steps end at 50 ms
  auto s = b.submit(std::move(r), r_opt);
  run_all(b);
  REQUIRE(s->end().has_value());
  CHECK(s->end()->status == Status::ok);
  CHECK(drain(*s) == expected_tokens(1, 5));
}

TEST_CASE("admission reads the clock after the retirements' callbacks: never admitted late",
          "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 1ms;
  Batcher b(rec.fn(), config(1), rec.clock);
  tailbatch::StreamCallbacks<int> slow_end;
  slow_end.on_end = [&](const tailbatch::StreamEnd&) { rec.clock.advance(5ms); };  // user code
  auto first = b.submit(req(0, 10), slow_end);
  (void)b.poll();  // first is active
  auto r = req(0, 3);
  auto second = b.submit(std::move(r), SubmitOptions{.deadline = rec.clock.now() + 3ms});
  first->cancel();
  (void)b.poll();  // retires first (its on_end takes 5 ms), then looks at second
  run_all(b);
  REQUIRE(second->end().has_value());
  CHECK(second->end()->status == Status::deadline_exceeded);
  CHECK(second->end()->tokens == 0);
  CHECK(rec.steps.size() == 1);  // only first's step ran
}

TEST_CASE("load(), load_between() and check_littles_law(): the Pipeline's shape on the batcher",
          "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  Batcher b(rec.fn(), config(1), rec.clock);
  const tailbatch::LoadReading start = b.load();
  auto a = b.submit(req(0, 2));  // waiting 0 ms, active 0-20 ms
  auto c = b.submit(req(0, 1));  // waits 0-20 ms, active 20-30 ms
  run_all(b);
  rec.clock.advance(10ms);
  const tailbatch::LoadReading end = b.load();
  CHECK(end.at - start.at == 40ms);
  CHECK(end.completed == 2);
  CHECK(end.in_system_s == Approx(0.050));
  CHECK(end.executing_s == Approx(0.030));  // the active set: a 20 ms, c 10 ms
  CHECK(end.latency_s == Approx(0.050));
  const tailbatch::LoadWindow w = tailbatch::load_between(start, end);
  CHECK(w.mean_in_system == Approx(1.25));
  CHECK(w.mean_executing == Approx(0.75));
  CHECK(w.mean_queued == Approx(0.5));
  CHECK(w.throughput_per_s == Approx(50.0));
  CHECK(w.mean_latency == 25ms);
  // The batcher's own check: L = lambda x W holds over its own measurements.
  const tailbatch::LittlesLawCheck check = b.check_littles_law();
  CHECK_FALSE(check.hidden_queue_suspected);
  CHECK(check.predicted_in_flight == Approx(1.25));
  CHECK_THROWS_AS(b.check_littles_law(0.0), std::invalid_argument);
  // The stats carry the same integrals.
  const auto st = b.stats();
  CHECK(st.in_flight_seconds == Approx(end.in_system_s));
  CHECK(st.departed == end.completed);
}

TEST_CASE("load: time-averaged in flight and throughput over a window feed the Little's-law check",
          "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  Batcher b(rec.fn(), config(1), rec.clock);
  const auto t0 = rec.clock.now();
  const auto start = b.stats();
  CHECK(start.in_flight_seconds == 0.0);
  CHECK(start.departed == 0);
  auto a = b.submit(req(0, 2));  // in flight 0-20 ms (two 10 ms steps)
  auto c = b.submit(req(0, 1));  // waits 0-20 ms, runs 20-30 ms
  auto rejected = b.submit(req(0, 1 << 30));  // too large: never in flight
  REQUIRE(rejected->end().has_value());
  (void)b.poll();                              // 0 -> 10 ms
  const auto mid = b.stats();               // at 10 ms: 2 in flight so far
  CHECK(mid.observed_at - start.observed_at == 10ms);
  CHECK(mid.in_flight_seconds == Approx(0.020));
  run_all(b);                                       // a leaves at 20 ms, c at 30 ms
  rec.clock.advance(10ms);                          // nothing in flight 30-40 ms
  const auto end = b.stats();
  CHECK(rec.clock.now() - t0 == 40ms);
  CHECK(end.departed == 2);
  CHECK(end.in_flight_seconds == Approx(2 * 0.020 + 1 * 0.010));
  CHECK(end.time_in_system_seconds == Approx(0.020 + 0.030));

  const auto load = tailbatch::load_between(start, end);
  CHECK(load.window == 40ms);
  CHECK(load.mean_in_flight == Approx(0.050 / 0.040));   // 1.25 sequences
  CHECK(load.throughput_per_s == Approx(2 / 0.040));     // 50 per second
  CHECK(load.departed == 2);
  CHECK(load.mean_time_in_system == 25ms);
  // The batcher's own time in system satisfies L = lambda x W ...
  auto self = tailbatch::check_littles_law(load.throughput_per_s, load.mean_time_in_system, load.mean_in_flight);
  CHECK_FALSE(self.hidden_queue_suspected);
  CHECK(self.predicted_in_flight == Approx(1.25));
  // ... and a server whose latency timer covers only the model steps (a's two and c's one:
  // 15 ms on average) is told that requests wait somewhere its latency does not see.
  auto server = tailbatch::check_littles_law(load.throughput_per_s, 15ms, load.mean_in_flight);
  CHECK(server.hidden_queue_suspected);
  CHECK(server.relative_deviation > 0.0);

  // A window in the middle: 10-30 ms, 2 in flight for 10 ms then 1 for 10 ms.
  const auto later = tailbatch::load_between(mid, end);
  CHECK(later.window == 30ms);
  CHECK(later.mean_in_flight == Approx(0.030 / 0.030));
  CHECK(later.throughput_per_s == Approx(2 / 0.030));
  // Readings out of order give an empty window, never a negative rate.
  const auto backwards = tailbatch::load_between(end, start);
  CHECK(backwards.window == 0ns);
  CHECK(backwards.throughput_per_s == 0.0);
  CHECK(backwards.mean_in_flight == 0.0);
}

TEST_CASE("a step that throws fails that step's sequences; the loop lives on", "[continuous_batcher]") {
  Recorder rec;
  int calls = 0;
  rec.also = [&](std::span<Seq>) {
    if (++calls == 3) throw std::runtime_error("CUDA error: out of memory");
  };
  Batcher b(rec.fn(), config(4), rec.clock);
  auto s1 = b.submit(req(0, 10));
  auto s2 = b.submit(req(0, 10));
  (void)b.poll();
  (void)b.poll();
  auto r = b.poll();
  CHECK(r.failed);
  CHECK(s1->end()->status == Status::failed);
  CHECK(s1->end()->message == "CUDA error: out of memory");
  CHECK(s2->end()->status == Status::failed);
  CHECK(drain(*s1) == expected_tokens(1, 2));
  auto s3 = b.submit(req(0, 3));
  while (!s3->closed()) (void)b.poll();
  CHECK(s3->end()->ok());
  CHECK(drain(*s3) == expected_tokens(3, 3));
}

TEST_CASE("seq.fail() and seq.finish() end one sequence without touching the others",
          "[continuous_batcher]") {
  Recorder rec;
  rec.also = [](std::span<Seq> batch) {
    for (auto& s : batch) {
      if (s.id() == 1 && s.generated() == 1) s.fail("bad sequence");
      if (s.id() == 2 && s.generated() == 2) s.finish();
    }
  };
  Batcher b(rec.fn(), config(4), rec.clock);
  auto s1 = b.submit(req(0, 10));
  auto s2 = b.submit(req(0, 10));
  auto s3 = b.submit(req(0, 4));
  run_all(b);
  CHECK(s1->end()->status == Status::failed);
  CHECK(s1->end()->message == "bad sequence");
  CHECK(s1->end()->tokens == 2);
  CHECK(s2->end()->ok());
  CHECK(s2->end()->tokens == 3);
  CHECK(s3->end()->ok());
  CHECK(drain(*s3) == expected_tokens(3, 4));
}

TEST_CASE("a slow consumer's sequence is stopped and leaves the batch", "[continuous_batcher]") {
  Recorder rec;
  auto c = config(4);
  c.stream.capacity = 3;
  Batcher b(rec.fn(), c, rec.clock);
  auto slow = b.submit(req(0, 50));
  auto fast = b.submit(req(0, 50));
  int steps = 0;
  while (!fast->closed()) {
    (void)b.poll();
    drain(*fast);
    ++steps;
  }
  CHECK(slow->end()->status == Status::cancelled);
  CHECK(slow->end()->tokens == 3);
  CHECK(fast->end()->ok());
  CHECK(rec.steps[4] == std::vector<std::uint64_t>{2});  // gone the step after its refused push
}

TEST_CASE("priorities: higher first, FIFO within a level", "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(1), rec.clock);
  auto lo1 = b.submit(req(0, 1), at(Priority::low));
  auto lo2 = b.submit(req(0, 1), at(Priority::low));
  auto hi = b.submit(req(0, 1), at(Priority::high));
  auto mid = b.submit(req(0, 1), at(Priority::normal));
  run_all(b);
  std::vector<std::uint64_t> order;
  for (auto& ids : rec.steps) order.push_back(ids.at(0));
  CHECK(order == std::vector<std::uint64_t>{3, 4, 1, 2});
}

TEST_CASE("no starvation: a low-priority sequence under a steady stream of short high-priority ones",
          "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  auto c = config(1);
  c.priority_step = 100ms;
  c.queue_capacity = 100000;
  Batcher b(rec.fn(), c, rec.clock);
  auto low = b.submit(req(0, 1), at(Priority::low));
  int arrivals = 0;
  // Each step, one new normal-priority sequence arrives: they alone could keep the batch busy.
  while (!low->closed() && arrivals < 1000) {
    (void)b.submit(req(0, 1), at(Priority::normal));
    ++arrivals;
    (void)b.poll();
  }
  REQUIRE(low->closed());
  CHECK(low->end()->ok());
  // One priority level is worth 100 ms of waiting: the low one runs once the newest
  // arrival is more than 100 ms younger than it, i.e. after about 10 steps of 10 ms.
  CHECK(arrivals <= 12);
}

TEST_CASE("no starvation: a large sequence is not bypassed by a stream of small ones",
          "[continuous_batcher]") {
  Recorder rec;
  auto c = config(8, 100);
  c.queue_capacity = 100000;
  Batcher b(rec.fn(), c, rec.clock);
  std::vector<std::shared_ptr<Batcher::Stream>> small;
  for (int i = 0; i < 4; ++i) small.push_back(b.submit(req(0, 20)));
  (void)b.poll();
  auto large = b.submit(req(10, 80));  // needs 90 of the 100: must wait for the budget
  int steps = 0;
  while (!large->closed() && steps < 1000) {
    small.push_back(b.submit(req(0, 20)));
    (void)b.poll();
    ++steps;
  }
  REQUIRE(large->closed());
  CHECK(large->end()->ok());
  CHECK(steps < 200);
  run_all(b);
  for (auto& s : small) CHECK(s->end()->ok());
}

TEST_CASE("shutdown: waiting rejected, active drained, later submits rejected", "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(1), rec.clock);
  auto active = b.submit(req(0, 5));
  auto waiting = b.submit(req(0, 5));
  (void)b.poll();
  b.shutdown();
  CHECK(active->end()->ok());
  CHECK(drain(*active) == expected_tokens(1, 5));
  CHECK(waiting->end()->status == Status::rejected);
  CHECK(waiting->end()->reason == RejectReason::shutting_down);
  auto late = b.submit(req(0, 5));
  CHECK(late->end()->reason == RejectReason::shutting_down);
  b.shutdown();  // idempotent
  auto st = b.stats();
  CHECK(st.completed() == st.submitted);
}

TEST_CASE("shutdown cancels what has not finished by the drain timeout", "[continuous_batcher]") {
  Recorder rec;
  rec.step_time = 10ms;
  auto c = config(2);
  c.drain_timeout = 50ms;
  Batcher b(rec.fn(), c, rec.clock);
  auto s = b.submit(req(0, 1000));
  (void)b.poll();
  b.shutdown();
  CHECK(s->end()->status == Status::cancelled);
  CHECK(s->end()->message.find("drain timeout") != std::string::npos);
  CHECK(s->end()->tokens == 6);
}

TEST_CASE("manual runs on the manual clock are deterministic", "[continuous_batcher]") {
  auto run = [] {
    Recorder rec;
    auto c = config(3, 200);
    c.prefill_chunk = 4;
    c.max_step_tokens = 8;
    Batcher b(rec.fn(), c, rec.clock);
    std::vector<std::shared_ptr<Batcher::Stream>> streams;
    std::uint64_t x = 42;
    std::vector<std::string> log;
    for (int i = 0; i < 60; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      if ((x >> 60) < 10) {
        auto r = req((x >> 20) % 12, 1 + (x >> 40) % 20);
        SubmitOptions r_opt = at(static_cast<Priority>((x >> 33) % 3));
        if ((x >> 12) % 7 == 0) r_opt.deadline = rec.clock.now() + std::chrono::milliseconds((x >> 24) % 30);
        streams.push_back(b.submit(std::move(r), r_opt));
      }
      auto rep = b.poll();
      log.push_back(std::to_string(rep.admitted) + "/" + std::to_string(rep.scheduled) + "/" +
                    std::to_string(rep.step_tokens) + "/" + std::to_string(rep.completed));
    }
    b.shutdown();
    for (auto& s : streams) {
      auto e = *s->end();
      log.push_back(std::string(tailbatch::to_string(e.status)) + ":" + std::to_string(e.tokens));
    }
    log.push_back(std::to_string(rec.steps.size()));
    return log;
  };
  auto a = run();
  auto b = run();
  CHECK(a == b);
  CHECK(a.size() > 60);
}

TEST_CASE("callback-mode requests get their tokens and exactly one end", "[continuous_batcher]") {
  Recorder rec;
  Batcher b(rec.fn(), config(2), rec.clock);
  std::vector<int> got;
  int ends = 0;
  tailbatch::StreamCallbacks<int> cb;
  cb.on_tokens = [&](std::span<const int> t) { got.insert(got.end(), t.begin(), t.end()); };
  cb.on_end = [&](const tailbatch::StreamEnd& e) {
    ++ends;
    CHECK(e.ok());
  };
  (void)b.submit(req(2, 4), cb);
  run_all(b);
  CHECK(got == expected_tokens(1, 4));
  CHECK(ends == 1);

  int rejected_ends = 0;
  tailbatch::StreamCallbacks<int> cb2;
  cb2.on_end = [&](const tailbatch::StreamEnd& e) {
    ++rejected_ends;
    CHECK(e.reason == RejectReason::shutting_down);
  };
  b.shutdown();
  (void)b.submit(req(2, 4), cb2);
  CHECK(rejected_ends == 1);
}

TEST_CASE("metrics: statuses, rejections, steps and generation timings", "[continuous_batcher][metrics]") {
  tailbatch::MetricsRegistry registry;
  Recorder rec;
  auto c = config(2, 50);
  c.metrics = &registry;
  c.metric_labels = {{"model", "tiny"}};
  {
    Batcher b(rec.fn(), c, rec.clock);
    auto s1 = b.submit(req(0, 3));
    auto s2 = b.submit(req(0, 100));  // too large
    (void)b.poll();
    auto text = registry.prometheus();
    CHECK(text.find("tailbatch_generation_active_sequences{model=\"tiny\"} 1") != std::string::npos);
    b.shutdown();
  }
  auto text = registry.prometheus();
  CHECK(text.find("tailbatch_generation_sequences_total{model=\"tiny\",status=\"ok\"} 1") != std::string::npos);
  CHECK(text.find("tailbatch_generation_rejected_total{model=\"tiny\",reason=\"too_large\"} 1") !=
        std::string::npos);
  CHECK(text.find("tailbatch_generation_steps_total{model=\"tiny\"} 3") != std::string::npos);
  CHECK(text.find("tailbatch_generation_tokens_total{model=\"tiny\"} 3") != std::string::npos);
  CHECK(text.find("tailbatch_generation_time_to_first_token_seconds_count{model=\"tiny\"} 1") !=
        std::string::npos);
  CHECK(text.find("tailbatch_generation_active_sequences") == std::string::npos);  // unregistered
}

TEST_CASE("threaded mode: many submitting threads, every sequence exactly once, tokens in order",
          "[continuous_batcher][stress]") {
  for (int threads : {1, 2, 3, 7, 16}) {
    using TBatcher = tailbatch::ContinuousBatcher<int>;
    auto c = config(8, 400);
    c.prefill_chunk = 3;
    c.max_step_tokens = 16;
    c.queue_capacity = 64;
    std::atomic<int> step_calls{0};
    TBatcher b(
        [&](std::span<TBatcher::Sequence> batch) {
          step_calls.fetch_add(1);
          for (auto& s : batch)
            if (s.emits()) s.emit(static_cast<int>(s.id() * 1000 + s.generated()));
        },
        c);
    REQUIRE(b.worker_count() == 1);  // SteadyClock: the decode thread by default
    const int per_thread = 300 / tailbatch::test::sanitizer_slowdown + 5;
    std::atomic<int> bad{0};
    std::mutex m;
    std::map<Status, int> statuses;
    on_threads(threads, [&](int t) {
      std::uint64_t x = static_cast<std::uint64_t>(t) * 7919 + 1;
      for (int i = 0; i < per_thread; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        TBatcher::Request r;
        r.prompt.assign((x >> 50) % 8, 1);
        r.max_new_tokens = 1 + (x >> 40) % 12;
        SubmitOptions o;
        o.priority = static_cast<Priority>((x >> 30) % 3);
        if ((x >> 20) % 5 == 0)
          o.deadline =
              std::chrono::steady_clock::now() + std::chrono::microseconds((x >> 8) % 2000);
        const bool cancel = (x >> 10) % 7 == 0;
        auto s = b.submit(std::move(r), o);
        if (cancel) s->cancel();
        // Read everything; a sequence's tokens carry its id and consecutive positions.
        std::vector<int> got;
        while (auto tok = s->next_for(30s)) got.push_back(*tok);
        auto end = s->wait_end_for(30s);
        if (!end || !s->done()) {
          bad.fetch_add(1);
          continue;
        }
        for (std::size_t k = 0; k < got.size(); ++k)
          if (got[k] % 1000 != static_cast<int>(k) || got[k] / 1000 != got[0] / 1000)
            bad.fetch_add(1);
        if (got.size() != end->tokens) bad.fetch_add(1);
        std::lock_guard lock(m);
        ++statuses[end->status];
      }
    });
    b.shutdown();
    CHECK(bad.load() == 0);
    int total = 0;
    for (auto& [s, n] : statuses) total += n;
    CHECK(total == threads * per_thread);
    auto st = b.stats();
    CHECK(st.submitted == static_cast<std::uint64_t>(threads * per_thread));
    CHECK(st.completed() == st.submitted);
    CHECK(statuses[Status::ok] > 0);
    CHECK(st.count(Status::failed) == 0);
  }
}

TEST_CASE("threaded mode: shutdown with work in flight completes everything", "[continuous_batcher][stress]") {
  for (int round = 0; round < 20 / tailbatch::test::sanitizer_slowdown + 2; ++round) {
    using TBatcher = tailbatch::ContinuousBatcher<int>;
    auto c = config(4);
    c.drain_timeout = 5ms;
    TBatcher b(
        [](std::span<TBatcher::Sequence> batch) {
          for (auto& s : batch) s.emit(1);
          std::this_thread::sleep_for(50us);
        },
        c);
    std::vector<std::shared_ptr<TBatcher::Stream>> streams;
    for (int i = 0; i < 32; ++i) {
      TBatcher::Request r;
      r.max_new_tokens = 1000000;
      streams.push_back(b.submit(std::move(r)));
    }
    b.shutdown();
    for (auto& s : streams) {
      REQUIRE(s->closed());
      auto st = s->end()->status;
      CHECK((st == Status::cancelled || st == Status::rejected));
    }
    CHECK(b.poll().admitted == 0);  // poll() does nothing beside the decode thread
    CHECK(b.active_approx() == 0);
  }
}
