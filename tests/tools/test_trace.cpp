// Record and replay: the trace's text format (round trip, and each malformed line named),
// the recorder behind a Pipeline on the manual clock, the breakdown of a known trace, and
// replays that must predict exactly what a synthetic trace says happened.
#include <chrono>
#include <future>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/tools/trace.hpp>
#include <utility>
#include <vector>

#include "tailbatch_test.hpp"

#if defined(TAILBATCH_CATCH2_V3)
using Catch::Approx;
#else
using Catch::Detail::Approx;
#endif

using namespace std::chrono_literals;
using tailbatch::DispatchReason;
using tailbatch::LoadTrace;
using tailbatch::Status;
using tailbatch::TraceBatch;
using tailbatch::TraceRequest;
using tailbatch::test::MessageContains;

namespace {

double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// A run of n requests, one every `gap`, each alone in a batch that closes on arrival,
// starts `dispatch` later and runs `model`; completions come `delivery` after the end.
// The first `warm` requests are the warm-up.
LoadTrace serial_trace(std::size_t n, std::size_t warm, std::chrono::nanoseconds gap,
                       std::chrono::nanoseconds model, std::chrono::nanoseconds dispatch = 0ns,
                       std::chrono::nanoseconds delivery = 0ns) {
  LoadTrace t;
  t.setup = {{"policy", "fixed"},
             {"lanes", "1"},
             {"max_batch", "1"},
             {"window_ms", "0"},
             {"model", "test"}};
  for (std::size_t i = 0; i < n; ++i) {
    const auto at = gap * static_cast<std::int64_t>(i);
    TraceBatch b{at, at + dispatch, at + dispatch + model, 1, 0, DispatchReason::size};
    t.batches.push_back(b);
    t.requests.push_back(TraceRequest{i, at, at, b.ended + delivery, Status::ok, i >= warm});
  }
  return t;
}

std::string written(const LoadTrace& t) {
  std::ostringstream s;
  tailbatch::write_trace(s, t);
  return s.str();
}

LoadTrace read(const std::string& text) {
  std::istringstream s(text);
  return tailbatch::read_trace(s);
}

}  // namespace

TEST_CASE("trace: the text format round-trips every field") {
  LoadTrace t;
  t.setup = {{"policy", "adaptive"}, {"lanes", "2"}, {"slo_p95_ms", "50"}};
  t.requests = {TraceRequest{0, 5ns, 7ns, 1000ns, Status::ok, false},
                TraceRequest{1, 10ns, 12ns, -1ns, Status::ok, true},
                TraceRequest{3, 20ns, 25ns, 30ns, Status::rejected, true}};
  t.batches = {TraceBatch{100ns, 110ns, 900ns, 2, 1, DispatchReason::window},
               TraceBatch{200ns, 200ns, 300ns, 1, 0, DispatchReason::flush}};
  const std::string text = written(t);
  CHECK(text.rfind(
            "tailbatch-trace 1\nsetup lanes=2 policy=adaptive slo_p95_ms=50\nr 0 5 7 1000 ok 0\n",
            0) == 0);
  CHECK(text.find("r 3 20 25 30 rejected 1\n") != std::string::npos);
  CHECK(text.find("b 100 110 900 2 1 window\n") != std::string::npos);
  const LoadTrace back = read(text);
  CHECK(back.setup == t.setup);
  REQUIRE(back.requests.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(back.requests[i].index == t.requests[i].index);
    CHECK(back.requests[i].intended == t.requests[i].intended);
    CHECK(back.requests[i].submitted == t.requests[i].submitted);
    CHECK(back.requests[i].completed == t.requests[i].completed);
    CHECK(back.requests[i].status == t.requests[i].status);
    CHECK(back.requests[i].measured == t.requests[i].measured);
  }
  REQUIRE(back.batches.size() == 2);
  CHECK(back.batches[0].closed == 100ns);
  CHECK(back.batches[0].started == 110ns);
  CHECK(back.batches[0].ended == 900ns);
  CHECK(back.batches[0].size == 2);
  CHECK(back.batches[0].lane == 1);
  CHECK(back.batches[0].reason == DispatchReason::window);
  CHECK(back.batches[1].reason == DispatchReason::flush);
  CHECK(back.number("slo_p95_ms", 0) == 50.0);
  CHECK(back.number("absent", 7) == 7.0);
  CHECK(back.text("policy", "") == "adaptive");
  CHECK(written(back) == text);
}

TEST_CASE("trace: a malformed trace is refused with its line named") {
  const std::string head = "# a comment\ntailbatch-trace 1\n\n";
  const std::pair<std::string, const char*> malformed[] = {
      {"", "no \"tailbatch-trace 1\" header"},
      {"hello\n", "line 1: not a tailbatch trace"},
      {"tailbatch-trace 2\n", "unsupported version 2"},
      {head + "r 0 1 2\n", "line 4: expected r INDEX"},
      {head + "r 0 5 2 9 ok 1\n", "line 4: submitted before intended"},
      {head + "r 0 1 2 9 fine 1\n", "unknown status \"fine\""},
      {head + "r 1 1 2 9 ok 1\nr 0 1 2 9 ok 1\n", "line 5: requests out of index order"},
      {head + "b 10 5 20 1 0 size\n", "batch times run backwards"},
      {head + "b 1 2 3 1 0 soon\n", "unknown dispatch reason"},
      {head + "b 1 2 3 1 0 size extra\n", "unexpected \"extra\""},
      {head + "setup novalue\n", "expected KEY=VALUE"},
      {head + "x 1\n", "unknown record \"x\""},
  };
  for (const auto& entry : malformed) {
    const std::string& text = entry.first;  // named, not bound: lambdas may capture it
    INFO(text);
    CHECK_INVALID(read(text), entry.second);
  }
  LoadTrace bad;
  bad.setup = {{"model", "two words"}};
  std::ostringstream out;
  CHECK_THROWS_AS(tailbatch::write_trace(out, bad), std::invalid_argument);
}

TEST_CASE("trace: a recorder behind a Pipeline on the manual clock records requests and batches") {
  using namespace tailbatch;
  ManualClock clock;
  const BatchTime origin = clock.now();
  TraceRecorder rec(origin);
  auto model = [clock](std::span<const int> in, std::span<int> out, HostLane&) mutable {
    clock.advance(2ms);
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
  };
  Pipeline<int, int, RecordingPolicy<FixedWindow>, HostLanes, AdmitAll, ManualClock> p(
      model, RecordingPolicy<FixedWindow>(FixedWindow(2, 5ms), &rec), {}, clock);
  std::vector<std::future<Outcome<int>>> f;
  for (std::uint64_t i = 0; i < 3; ++i) {
    rec.submitted(i, origin + 1ms * static_cast<std::int64_t>(i), clock.now(), i > 0);
    p.submit(static_cast<int>(i), [&rec, &clock, i](Outcome<int>&& o) noexcept {
      rec.completed(i, o.status(), clock.now());
    });
    (void)p.poll();
    clock.advance(1ms);
  }
  clock.advance(10ms);
  (void)p.poll();
  const LoadTrace t = rec.take({{"policy", "fixed"}});
  REQUIRE(t.requests.size() == 3);
  REQUIRE(t.batches.size() == 2);
  // Requests 0 and 1 fill a batch of 2 at 1 ms (size); it runs to 3 ms. Request 2 comes at
  // 4 ms (after the model's 2 ms and the 1 ms step) and closes by its window at 15 ms.
  CHECK(t.batches[0].size == 2);
  CHECK(t.batches[0].reason == DispatchReason::size);
  CHECK(t.batches[0].closed == 1ms);
  CHECK(t.batches[0].ended - t.batches[0].started == 2ms);
  CHECK(t.batches[1].size == 1);
  CHECK(t.batches[1].reason == DispatchReason::window);
  CHECK(t.requests[0].measured == false);
  CHECK(t.requests[1].intended == 1ms);
  CHECK(t.requests[0].completed == t.batches[0].ended);
  CHECK(t.requests[2].completed == t.batches[1].ended);
  CHECK(rec.dropped() == 0);
  const auto bd = tailbatch::trace_breakdown(t);
  CHECK(bd.matched);
  CHECK(bd.requests == 2);
}

TEST_CASE("trace: the breakdown splits a known run into its parts") {
  const LoadTrace t = serial_trace(100, 10, 10ms, 3ms, 100us, 50us);
  const auto bd = tailbatch::trace_breakdown(t);
  REQUIRE(bd.matched);
  CHECK(bd.requests == 90);
  CHECK(bd.model.p95_ms == 3.0);
  CHECK(bd.dispatch.p50_ms == 0.1);
  CHECK(bd.delivery.p99_ms == 0.05);
  CHECK(bd.queue.p99_ms == 0.0);
  CHECK(bd.total.p50_ms == ms(3ms + 100us + 50us));
}

TEST_CASE("trace: replaying a synthetic trace predicts what it says happened, deterministically") {
  // Each request alone on an idle lane: the prediction is the recorded time exactly.
  const LoadTrace t = serial_trace(200, 20, 10ms, 3ms, 100us, 50us);
  const auto a = tailbatch::replay_trace(t, tailbatch::FixedWindow(1, 0ms));
  CHECK(a.measured_ok == 180);
  CHECK(a.predicted.ok == 180);
  CHECK(a.predicted_p95_ms == a.measured_p95_ms);
  CHECK(a.predicted_p50_ms == a.measured_p50_ms);
  // Without the lags put back, the simulator alone misses the close-to-start and delivery
  // times: it predicts the model time.
  const tailbatch::ReplayConfig plain{false, false, false, false, 1};
  const auto bare = tailbatch::replay_trace(t, tailbatch::FixedWindow(1, 0ms), plain);
  CHECK(bare.predicted_p50_ms < a.measured_p50_ms);
  CHECK(bare.predicted_p50_ms == Approx(3.0).epsilon(0.02));

  // Bursts: 4 requests at once every 20 ms into a lane that runs one 5 ms batch at a time:
  // the queue is what the simulator must get right; replays repeat exactly.
  LoadTrace burst = serial_trace(0, 0, 1ms, 1ms);
  for (std::size_t k = 0; k < 50; ++k) {
    const auto at = 20ms * static_cast<std::int64_t>(k);
    for (std::size_t j = 0; j < 4; ++j) {
      const auto start = at + 5ms * static_cast<std::int64_t>(j);
      burst.batches.push_back(TraceBatch{start, start, start + 5ms, 1, 0, DispatchReason::size});
      burst.requests.push_back(TraceRequest{4 * k + j, at, at, start + 5ms, Status::ok, k >= 5});
    }
  }
  const auto r1 = tailbatch::replay_trace(burst, tailbatch::FixedWindow(1, 0ms));
  const auto r2 = tailbatch::replay_trace(burst, tailbatch::FixedWindow(1, 0ms));
  CHECK(r1.predicted_p99_ms == r2.predicted_p99_ms);
  CHECK(r1.predicted.latency.count() == r2.predicted.latency.count());
  CHECK(r1.measured_p50_ms == Approx(ms(10ms)).epsilon(0.02));
  CHECK(r1.predicted_p50_ms == Approx(r1.measured_p50_ms).epsilon(0.02));
  CHECK(r1.predicted_p99_ms == Approx(r1.measured_p99_ms).epsilon(0.02));
  // Batching the same arrivals (max 4) changes the prediction: the policy is replayed.
  const auto batched = tailbatch::replay_trace(burst, tailbatch::FixedWindow(4, 0ms));
  CHECK(batched.predicted.batches < r1.predicted.batches);

  LoadTrace empty;
  CHECK_THROWS_MATCHES(tailbatch::replay_trace(empty, tailbatch::FixedWindow(1, 0ms)),
                       std::invalid_argument, MessageContains("no request"));
}
