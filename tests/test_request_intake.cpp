// detail/request_intake.hpp: what SubmitOptions mean (arrival, timeout counted from it, a
// negative timeout, a deadline as a latest start), and the three front doors that use it
// (Pipeline, ContinuousBatcher, ResultCache over a Pipeline) agreeing on the same options
// on one manual clock.
#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <stop_token>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/detail/request_intake.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/result_cache.hpp>
#include <utility>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

using ManualPipeline = Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock>;
using ManualCache = ResultCache<int, int, std::hash<int>, std::equal_to<int>, ManualClock>;
using Batcher = ContinuousBatcher<int, NoSequenceState, ManualClock>;

// One request with these options through each front door; the clock advanced by `wait`
// between the submit and the first step; the status each door ends it with.
struct Doors {
  Status pipeline = Status::ok;
  Status batcher = Status::ok;
  Status cache = Status::ok;
};

// A pipeline on `clock` that multiplies by ten, in batches of up to 8 over a 1 ms window.
ManualPipeline times_ten(ManualClock& clock) {
  return ManualPipeline(
      [](std::span<const int> in, std::span<int> out, HostLane&) {
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * 10;
      },
      FixedWindow(8, 1ms), ManualPipeline::Config{}, clock);
}

Doors through_each_door(const std::function<SubmitOptions(BatchTime now)>& options,
                        std::chrono::nanoseconds wait) {
  Doors d;
  {
    ManualClock clock;
    ManualPipeline p = times_ten(clock);
    std::optional<Status> got;
    p.submit(1, options(clock.now()), [&](Outcome<int>&& o) { got = o.status(); });
    clock.advance(wait);
    (void)p.poll();
    REQUIRE(got.has_value());
    d.pipeline = *got;
  }
  {
    ManualClock clock;
    Batcher b(
        [](std::span<Batcher::Sequence> seqs) {
          for (auto& s : seqs) {
            if (s.emits()) s.emit(7);
            s.finish();
          }
        },
        ContinuousBatcherConfig{}, clock);
    Batcher::Request r;
    r.prompt = {1, 2};
    r.max_new_tokens = 1;
    auto stream = b.submit(std::move(r), options(clock.now()));
    clock.advance(wait);
    (void)b.poll();
    REQUIRE(stream->end().has_value());
    d.batcher = stream->end()->status;
  }
  {
    ManualClock clock;
    ManualPipeline p = times_ten(clock);
    ManualCache::Config cc;
    cc.max_entries = 16;
    cc.shards = 1;
    ManualCache cache(cc, {}, {}, clock);
    std::optional<Status> got;
    cache.submit(p, 1, options(clock.now()), [&](Outcome<int>&& o) { got = o.status(); });
    clock.advance(wait);
    (void)p.poll();
    REQUIRE(got.has_value());
    d.cache = *got;
  }
  return d;
}

void all_three(const Doors& d, Status want) {
  CHECK(d.pipeline == want);
  CHECK(d.batcher == want);
  CHECK(d.cache == want);
}

}  // namespace

TEST_CASE("intake: arrival, timeout from the arrival, negative timeout, deadline") {
  const BatchTime now = ManualClock::start() + 1s;
  SECTION("defaults: arrival now, no deadline, normal priority") {
    const detail::Intake in = detail::intake(SubmitOptions{}, now);
    CHECK(in.accepted());
    CHECK(in.arrival == now);
    CHECK(in.deadline == BatchTime::max());
    CHECK(in.level == static_cast<std::size_t>(Priority::normal));
  }
  SECTION("the timeout counts from the arrival, not from the submit") {
    SubmitOptions o;
    o.arrival = now - 30ms;
    o.timeout = 50ms;
    const detail::Intake in = detail::intake(o, now);
    CHECK(in.accepted());
    CHECK(in.arrival == now - 30ms);
    CHECK(in.deadline == now + 20ms);
  }
  SECTION("a budget spent before the submit expires at once") {
    SubmitOptions o;
    o.arrival = now - 30ms;
    o.timeout = 20ms;
    const detail::Intake in = detail::intake(o, now);
    CHECK(in.refusal == detail::IntakeRefusal::deadline_passed);
    CHECK(in.status() == Status::deadline_exceeded);
  }
  SECTION("a negative timeout is a budget already spent, whatever the deadline") {
    SubmitOptions o;
    o.timeout = -1ns;
    o.deadline = now + 1h;
    const detail::Intake in = detail::intake(o, now);
    CHECK(in.refusal == detail::IntakeRefusal::budget_spent);
    CHECK(in.status() == Status::deadline_exceeded);
  }
  SECTION("a zero timeout is no budget: only the deadline applies") {
    SubmitOptions o;
    o.deadline = now + 5ms;
    const detail::Intake in = detail::intake(o, now);
    CHECK(in.accepted());
    CHECK(in.deadline == now + 5ms);
  }
  SECTION("the tighter of deadline and arrival + timeout") {
    SubmitOptions o;
    o.deadline = now + 5ms;
    o.timeout = 1s;
    CHECK(detail::intake(o, now).deadline == now + 5ms);
  }
  SECTION("an arrival later than the submit counts as the submit") {
    SubmitOptions o;
    o.arrival = now + 1h;
    o.timeout = 10ms;
    const detail::Intake in = detail::intake(o, now);
    CHECK(in.arrival == now);
    CHECK(in.deadline == now + 10ms);
  }
  SECTION("a deadline equal to now still allows a start now") {
    SubmitOptions o;
    o.deadline = now;
    CHECK(detail::intake(o, now).accepted());
    o.deadline = now - 1ns;
    CHECK(detail::intake(o, now).refusal == detail::IntakeRefusal::deadline_passed);
  }
  SECTION("a stopped token cancels; an unknown priority fails") {
    std::stop_source src;
    src.request_stop();
    SubmitOptions o;
    o.cancel = src.get_token();
    CHECK(detail::intake(o, now).status() == Status::cancelled);
    SubmitOptions p;
    p.priority = static_cast<Priority>(7);
    CHECK(detail::intake(p, now).status() == Status::failed);
  }
  SECTION("a huge timeout saturates") {
    SubmitOptions o;
    o.timeout = std::chrono::nanoseconds::max();
    CHECK(detail::intake(o, now).deadline == BatchTime::max());
  }
}

TEST_CASE("intake: the Pipeline, the ContinuousBatcher and the ResultCache agree on deadlines") {
  // Each row: the options relative to the submit, then how long the request waits and what
  // all three front doors must report.
  struct Row {
    const char* what;
    std::optional<std::chrono::nanoseconds> arrival, timeout, deadline;
    std::vector<std::pair<std::chrono::nanoseconds, Status>> waits;
  };
  const Row rows[] = {
      {"timeout counted from an earlier arrival: 10 ms left at the submit", -10ms, 20ms, {},
       {{9ms, Status::ok}, {11ms, Status::deadline_exceeded}}},
      {"a negative timeout expires at once", {}, -1ms, {}, {{0ns, Status::deadline_exceeded}}},
      {"a zero timeout is no budget", {}, 0ns, {}, {{1h, Status::ok}}},
      {"an absolute deadline is a latest start, inclusive", {}, {}, 5ms,
       {{5ms, Status::ok}, {6ms, Status::deadline_exceeded}}},
      {"an arrival in the future counts as the submit", 1h, 10ms, {},
       {{10ms, Status::ok}, {11ms, Status::deadline_exceeded}}},
      {"a deadline already behind the arrival's budget expires inside submit", -30ms, 20ms, {},
       {{0ns, Status::deadline_exceeded}}},
  };
  for (const Row& row : rows) {
    CAPTURE(row.what);
    auto opts = [&row](BatchTime now) {
      SubmitOptions o;
      if (row.arrival) o.arrival = now + *row.arrival;
      if (row.timeout) o.timeout = *row.timeout;
      if (row.deadline) o.deadline = now + *row.deadline;
      return o;
    };
    for (const auto& [wait, want] : row.waits) {
      CAPTURE(wait.count());
      all_three(through_each_door(opts, wait), want);
    }
  }
}
