// Queue policies: names, parsing, validation, and each policy's order and drops in the
// Pipeline on the manual clock (reject-newest, shed-oldest, adaptive LIFO, CoDel).
#include <tailbatch/queue_policy.hpp>

#include "tailbatch_test.hpp"

using tailbatch::QueuePolicy;
using tailbatch::QueuePolicyConfig;

TEST_CASE("QueuePolicy names round-trip", "[queue_policy]") {
  for (QueuePolicy p : {QueuePolicy::reject_newest, QueuePolicy::shed_oldest,
                        QueuePolicy::adaptive_lifo, QueuePolicy::codel}) {
    REQUIRE(tailbatch::parse_queue_policy(tailbatch::to_string(p)) == p);
  }
  STATIC_REQUIRE(tailbatch::to_string(QueuePolicy::shed_oldest) == "shed-oldest");
  REQUIRE(tailbatch::to_string(QueuePolicy::reject_newest) == "reject-newest");
  REQUIRE(tailbatch::to_string(QueuePolicy::adaptive_lifo) == "adaptive-lifo");
  REQUIRE(tailbatch::to_string(QueuePolicy::codel) == "codel");
  REQUIRE(tailbatch::parse_queue_policy("shed_oldest") == QueuePolicy::shed_oldest);
  REQUIRE_FALSE(tailbatch::parse_queue_policy("lifo").has_value());
  REQUIRE_FALSE(tailbatch::parse_queue_policy("").has_value());
  const QueuePolicyConfig c;
  REQUIRE(c.policy == QueuePolicy::reject_newest);
  REQUIRE(c.codel_target == std::chrono::milliseconds(5));
  REQUIRE(c.codel_interval == std::chrono::milliseconds(100));
}

// ---- The Pipeline's queue under each policy, stepped by hand on the manual clock ------

#include <map>
#include <optional>
#include <tailbatch/pipeline.hpp>
#include <vector>

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

using ManualPipeline = Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock>;

// Records the model's batches and every request's outcome (each exactly once).
struct Run {
  std::vector<std::vector<int>> batches;
  std::map<int, std::vector<Status>> status;
  std::map<int, RejectReason> reason;
  std::map<int, std::chrono::nanoseconds> retry;
  std::map<int, BatchTime> done_at;
  ManualClock* clock = nullptr;
  BatchDuration model_time{};
  std::map<int, BatchTime> served_at;

  auto model() {
    return [this](std::span<const int> in, std::span<int> out, HostLane&) {
      batches.emplace_back(in.begin(), in.end());
      for (std::size_t i = 0; i < in.size(); ++i) {
        out[i] = in[i];
        if (clock != nullptr) served_at[in[i]] = clock->now();
      }
      if (clock != nullptr) clock->advance(model_time);
    };
  }
  void submit(ManualPipeline& p, int id, SubmitOptions o = {}) {
    p.submit(id, std::move(o), [this, id](Outcome<int> out) {
      status[id].push_back(out.status());
      reason[id] = out.reason();
      retry[id] = out.retry_after();
      if (clock != nullptr) done_at[id] = clock->now();
    });
  }
  [[nodiscard]] bool once(int id) const {
    auto it = status.find(id);
    return it != status.end() && it->second.size() == 1;
  }
  [[nodiscard]] bool shed(int id) const {
    return once(id) && status.at(id)[0] == Status::rejected && reason.at(id) == RejectReason::shed;
  }
  [[nodiscard]] std::vector<int> served() const {
    std::vector<int> out;
    for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
    return out;
  }
};

PipelineConfig<int> config_with(QueuePolicy policy, std::size_t capacity) {
  PipelineConfig<int> c;
  c.queue_capacity = capacity;
  c.queue.policy = policy;
  return c;
}

}  // namespace

TEST_CASE("QueuePolicyConfig is validated by the Pipeline", "[queue_policy]") {
  ManualClock clock;
  Run run;
  auto c = config_with(QueuePolicy::codel, 8);
  c.queue.codel_target = 100ms;
  REQUIRE_THROWS_WITH(ManualPipeline(run.model(), FixedWindow{1, 1ms}, c, clock),
                      "Pipeline: queue.codel_target must be < queue.codel_interval");
  c.queue.codel_target = 0ms;
  REQUIRE_THROWS_WITH(ManualPipeline(run.model(), FixedWindow{1, 1ms}, c, clock),
                      "Pipeline: queue.codel_target must be > 0");
}

TEST_CASE("reject-newest: a full queue refuses the newcomer", "[queue_policy]") {
  ManualClock clock;
  Run run;
  ManualPipeline p(run.model(), FixedWindow{1, 1ms}, config_with(QueuePolicy::reject_newest, 2),
                   clock);
  for (int i = 1; i <= 3; ++i) run.submit(p, i);
  REQUIRE(run.once(3));
  CHECK(run.reason[3] == RejectReason::queue_full);
  (void)p.poll();
  CHECK(run.served() == std::vector<int>{1, 2});
  CHECK(p.stats().count(RejectReason::shed) == 0);
}

TEST_CASE("shed-oldest: a full queue drops its oldest and keeps the newcomer", "[queue_policy]") {
  ManualClock clock;
  Run run;
  ManualPipeline p(run.model(), FixedWindow{1, 1ms}, config_with(QueuePolicy::shed_oldest, 2),
                   clock);
  for (int i = 1; i <= 4; ++i) run.submit(p, i);
  CHECK(run.status.empty());  // nobody refused at the door
  (void)p.poll();
  CHECK(run.shed(1));
  CHECK(run.shed(2));
  CHECK(run.served() == std::vector<int>{3, 4});
  for (int i = 1; i <= 4; ++i) CHECK(run.once(i));
  const PipelineStats s = p.stats();
  CHECK(s.count(RejectReason::shed) == 2);
  CHECK(s.count(Status::ok) == 2);
  CHECK(s.submitted == 4);
  CHECK(s.completed() == 4);
}

TEST_CASE("shed-oldest: the lowest priority class is shed first, deadlines still hold",
          "[queue_policy]") {
  ManualClock clock;
  Run run;
  ManualPipeline p(run.model(), FixedWindow{1, 1ms}, config_with(QueuePolicy::shed_oldest, 2),
                   clock);
  run.submit(p, 1, SubmitOptions{.priority = Priority::high});
  run.submit(p, 2, SubmitOptions{.priority = Priority::low});
  run.submit(p, 3, SubmitOptions{.timeout = 1ms});
  run.submit(p, 4, SubmitOptions{.priority = Priority::high});
  clock.advance(2ms);  // 3's deadline passes while it waits
  (void)p.poll();
  CHECK(run.shed(2));
  REQUIRE(run.once(3));
  CHECK(run.status[3][0] == Status::deadline_exceeded);
  CHECK(run.served() == std::vector<int>{1, 4});
}

TEST_CASE("adaptive LIFO: FIFO while no queue has formed, newest first once one has",
          "[queue_policy]") {
  ManualClock clock;
  Run run;
  ManualPipeline p(run.model(), FixedWindow{2, 10ms}, config_with(QueuePolicy::adaptive_lifo, 64),
                   clock);
  run.submit(p, 1);
  run.submit(p, 2);
  (void)p.poll();
  CHECK(run.served() == std::vector<int>{1, 2});  // one batch's worth: FIFO
  for (int i = 3; i <= 7; ++i) run.submit(p, i);
  (void)p.poll(1);
  CHECK(run.batches.back() == std::vector<int>{7, 6});  // 5 > one batch per lane slot: LIFO
  (void)p.poll(1);
  CHECK(run.batches.back() == std::vector<int>{5, 4});
  clock.advance(6ms);  // the oldest (3) has now waited past codel_target: still a queue
  run.submit(p, 8);
  (void)p.poll(1);
  CHECK(run.batches.back() == std::vector<int>{8, 3});
  run.submit(p, 9);
  run.submit(p, 10);
  (void)p.poll(1);
  CHECK(run.batches.back() == std::vector<int>{9, 10});  // drained: FIFO again
  for (int i = 1; i <= 10; ++i) CHECK(run.once(i));
}

TEST_CASE(
    "CodelState: a whole interval's minimum wait above target sheds what waited past 2 x target",
    "[queue_policy][codel]") {
  const BatchTime t = ManualClock::start();
  detail::CodelState c(5ms, 100ms);
  // The first interval (t .. t+100 ms) decides nothing: not yet overloaded.
  CHECK_FALSE(c.should_drop(t, 6ms, false));
  CHECK_FALSE(c.should_drop(t + 50ms, 40ms, false));
  CHECK_FALSE(c.overloaded());
  // It ends with a minimum of 6 ms > target: the next interval is overloaded, and a head
  // that waited more than 10 ms is dropped; one that waited 10 ms or less is not.
  CHECK(c.should_drop(t + 100ms, 30ms, false));
  CHECK(c.overloaded());
  CHECK(c.should_drop(t + 100ms, 11ms, false));
  CHECK_FALSE(c.should_drop(t + 100ms, 10ms, false));
  // A small queue (one batch or less) is never dropped from.
  CHECK_FALSE(c.should_drop(t + 150ms, 50ms, true));
  CHECK(c.drops() == 2);
  // This interval's minimum was 10 ms (above target): still overloaded in the next.
  CHECK(c.should_drop(t + 200ms, 12ms, false));
  // A burst: the wait falls to 2 ms once in this interval, so the next one is not
  // overloaded, however long the head waits meanwhile.
  CHECK_FALSE(c.should_drop(t + 250ms, 2ms, false));
  CHECK(c.should_drop(t + 260ms, 40ms, false));  // still this interval: overloaded
  CHECK_FALSE(c.should_drop(t + 300ms, 40ms, false));
  CHECK_FALSE(c.overloaded());
  CHECK_FALSE(c.should_drop(t + 350ms, 80ms, false));
  // That interval's minimum (40 ms) was above target again: overloaded from t+400 ms.
  CHECK(c.should_drop(t + 400ms, 80ms, false));
  CHECK(c.drops() == 5);
}

TEST_CASE("CoDel in the Pipeline: a standing queue at 2x load is shed to keep the wait near target",
          "[queue_policy][codel]") {
  // One request served per 10 ms, two arriving: the backlog grows by one per step.
  const auto run_with = [](QueuePolicy policy, Run& run) {
    ManualClock clock;
    run.clock = &clock;
    run.model_time = 10ms;
    ManualPipeline p(run.model(), FixedWindow{1, 0ms}, config_with(policy, 4096), clock);
    int id = 0;
    std::vector<BatchTime> submitted(1, BatchTime{});
    for (int step = 0; step < 400; ++step) {
      for (int k = 0; k < 2; ++k) {
        submitted.push_back(clock.now());
        run.submit(p, ++id);
      }
      (void)p.poll(1);
    }
    p.shutdown();
    for (int i = 1; i <= id; ++i) REQUIRE(run.once(i));
    // The wait of the last 100 requests served.
    std::vector<int> served = run.served();
    BatchDuration worst{};
    for (std::size_t i = served.size() - 100; i < served.size(); ++i) {
      const int r = served[i];
      worst = std::max(worst, run.served_at[r] - submitted[static_cast<std::size_t>(r)]);
    }
    return worst;
  };
  Run fifo, codel;
  const BatchDuration fifo_wait = run_with(QueuePolicy::reject_newest, fifo);
  const BatchDuration codel_wait = run_with(QueuePolicy::codel, codel);
  std::size_t shed = 0;
  int first_shed = 0;
  BatchTime first_drop = BatchTime::max();
  for (const auto& [id, st] : codel.status) {
    if (codel.shed(id)) {
      ++shed;
      if (codel.done_at[id] < first_drop) {
        first_drop = codel.done_at[id];
        first_shed = id;
      }
    }
  }
  CHECK(shed > 100);
  // No drop before the head's wait had stood above target for a whole interval.
  CHECK(first_drop >= ManualClock::start() + 100ms);
  CHECK(codel_wait < fifo_wait / 4);
  CHECK(codel_wait < 1s);
  CHECK(codel.retry[first_shed] > 0ns);
  CHECK(fifo.served().size() == 800);  // shutdown drains what is left
}

// ---- Exactly once under threads: every policy, tenants, quotas, cancellations ----------

#include <atomic>
#include <thread>

TEST_CASE(
    "Storm: every request's outcome exactly once under every policy, with tenants and "
    "cancellations",
    "[queue_policy][storm]") {
  using ThreadedPipeline = Pipeline<int, int, FixedWindow, HostLanes>;
  for (const QueuePolicy policy : {QueuePolicy::reject_newest, QueuePolicy::shed_oldest,
                                   QueuePolicy::adaptive_lifo, QueuePolicy::codel}) {
    INFO(to_string(policy));
    constexpr int threads = 4;
    constexpr int per_thread = 400;
    std::vector<std::atomic<int>> seen(threads * per_thread);
    std::atomic<int> shed{0}, ok{0};
    {
      PipelineConfig<int> c;
      c.queue_capacity = 32;
      c.workers = 2;
      c.queue.policy = policy;
      c.queue.codel_target = 50us;
      c.queue.codel_interval = 500us;
      c.tenants.scheduling = Scheduling::fair;
      c.tenants.tenants.push_back({1, TenantQuota{2.0, 16, 24}});
      c.tenants.defaults.max_in_flight = 64;
      ThreadedPipeline p(
          [](std::span<const int> in, std::span<int> out, HostLane&) {
            for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
            std::this_thread::sleep_for(20us);
          },
          FixedWindow{8, 100us}, c);
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          std::vector<CancellationSource> sources(per_thread);
          for (int i = 0; i < per_thread; ++i) {
            const int id = t * per_thread + i;
            SubmitOptions o;
            o.tenant = static_cast<TenantId>(id % 3);
            o.priority = static_cast<Priority>(id % 3);
            if (id % 7 == 0) o.timeout = 200us;
            if (id % 5 == 0) o.cancel = sources[static_cast<std::size_t>(i)].get_token();
            p.submit(id, std::move(o), [&, id](Outcome<int> out) {
              seen[static_cast<std::size_t>(id)].fetch_add(1);
              if (out.ok()) {
                ok.fetch_add(1);
                CHECK(out.value() == id);
              }
              if (out.reason() == RejectReason::shed) shed.fetch_add(1);
            });
            if (id % 5 == 0 && i % 2 == 0) sources[static_cast<std::size_t>(i)].request_stop();
            if (i % 64 == 0) std::this_thread::sleep_for(100us);
          }
        });
      }
      for (auto& th : ts) th.join();
      p.shutdown();
      const PipelineStats s = p.stats();
      CHECK(s.submitted == static_cast<std::uint64_t>(threads * per_thread));
      CHECK(s.completed() == s.submitted);
      CHECK(s.count(RejectReason::shed) == static_cast<std::uint64_t>(shed.load()));
      CHECK(s.count(Status::ok) == static_cast<std::uint64_t>(ok.load()));
    }
    for (auto& n : seen) REQUIRE(n.load() == 1);
    if (policy == QueuePolicy::reject_newest) CHECK(shed.load() == 0);
  }
}

TEST_CASE("adaptive LIFO with CoDel: a standing queue's oldest are shed, none is served late",
          "[queue_policy][codel]") {
  // One request served per 10 ms, two arriving: without shedding the backlog would grow by
  // one per step and be served, seconds late, when the load ends.
  ManualClock clock;
  Run run;
  run.clock = &clock;
  run.model_time = 10ms;
  ManualPipeline p(run.model(), FixedWindow{1, 0ms}, config_with(QueuePolicy::adaptive_lifo, 4096),
                   clock);
  int id = 0;
  std::vector<BatchTime> submitted(1, BatchTime{});
  for (int step = 0; step < 400; ++step) {
    for (int k = 0; k < 2; ++k) {
      submitted.push_back(clock.now());
      run.submit(p, ++id);
    }
    (void)p.poll(1);
  }
  p.shutdown();
  std::size_t shed = 0;
  BatchDuration worst{};
  for (int i = 1; i <= id; ++i) {
    REQUIRE(run.once(i));
    if (run.shed(i)) ++shed;
    if (run.served_at.count(i) != 0)
      worst = std::max(worst, run.served_at[i] - submitted[static_cast<std::size_t>(i)]);
  }
  CHECK(shed > 300);
  CHECK(run.served().size() + shed == 800);
  // Served newest first while the queue stands, and what stood past 2 x target (10 ms) was
  // shed once the first interval (100 ms) had shown the queue standing.
  CHECK(worst <= 120ms);
}

#include <tailbatch/detail/pipeline/lane_pacing.hpp>

TEST_CASE("LanePacing: full batches on two lanes that started together are spread apart",
          "[queue_policy][stagger]") {
  const BatchTime t = ManualClock::start();
  detail::LanePacing pacing;
  pacing.configure(false, 2);
  CHECK_FALSE(pacing.enabled());
  pacing.configure(true, 1);
  CHECK_FALSE(pacing.enabled());  // one lane: nothing to spread
  pacing.configure(true, 2);
  REQUIRE(pacing.enabled());
  // Two full batches of 60 ms, 10 ms apart; nothing learned yet: no hold.
  CHECK(pacing.not_before(0, t, true) == t);
  pacing.started(0, t, true);
  CHECK(pacing.not_before(1, t + 10ms, true) == t + 10ms);
  pacing.started(1, t + 10ms, true);
  // Lane 0 gets a full batch at 60 ms after one at 0: a lane's cycle is 60 ms, so starts
  // should be 30 ms apart; the last start was 50 ms ago: it starts at once.
  CHECK(pacing.not_before(0, t + 60ms, true) == t + 60ms);
  CHECK(pacing.cycle() == 60ms);
  pacing.started(0, t + 60ms, true);
  // Lane 1 frees at 70 ms, 10 ms after that start: it waits until 60 + 30 = 90 ms.
  CHECK(pacing.not_before(1, t + 70ms, true) == t + 90ms);
  // Asked again at 90 ms (not a fresh observation: the cycle stays), it starts.
  CHECK(pacing.not_before(1, t + 90ms, true) == t + 90ms);
  CHECK(pacing.cycle() == 60ms);
  pacing.started(1, t + 90ms, true);
  // From now on the lanes free 30 ms apart: no more holds.
  CHECK(pacing.not_before(0, t + 120ms, true) == t + 120ms);
  pacing.started(0, t + 120ms, true);
  CHECK(pacing.not_before(1, t + 150ms, true) == t + 150ms);
  pacing.started(1, t + 150ms, true);
  // A lane that idled (a sample over twice the cycle) teaches nothing.
  CHECK(pacing.not_before(0, t + 400ms, true) == t + 400ms);
  CHECK(pacing.cycle() == 60ms);
  // A batch that is not full (no backlog) is never held.
  CHECK(pacing.not_before(1, t + 401ms, false) == t + 401ms);
}

#include <tailbatch/tools/simulator.hpp>

TEST_CASE("Lane staggering: a light tenant beside a backlogged one waits for a lane less",
          "[queue_policy][stagger]") {
  // The field guide's Example 1 on two lanes (L(b) = 20 + 3 (b - 1) ms, max_batch 16,
  // window 8 ms); tenant 1 offers 700/s (a backlog), tenant 2 100/s; fair scheduling.
  const auto run_with = [](LaneStagger stagger, std::vector<BatchTime>& starts) {
    SimulationConfig c;
    c.arrivals = LoadProfile::poisson(800, 10s);
    c.warmup = 2s;
    c.lanes = 2;
    const ManualClock clock = c.clock;
    c.service_time = [clock, &starts](std::size_t b) {
      starts.push_back(clock.now());
      return std::chrono::nanoseconds(20ms + 3ms * (b - 1));
    };
    c.tenant = [](std::uint64_t i) { return static_cast<TenantId>(i % 8 == 0 ? 2 : 1); };
    c.tenants.scheduling = Scheduling::fair;
    c.tenants.defaults.max_queued = 500;
    c.queue.stagger = stagger;
    return simulate(c, FixedWindow{16, 8ms});
  };
  std::vector<BatchTime> off_starts, on_starts;
  const SimulationResult off = run_with(LaneStagger::off, off_starts);
  const SimulationResult on = run_with(LaneStagger::automatic, on_starts);
  REQUIRE(off.tenants.size() == 2);
  REQUIRE(on.tenants.size() == 2);
  INFO("light p95 off " << off.tenants[1].p95.count() / 1e6 << " ms, on "
                        << on.tenants[1].p95.count() / 1e6 << " ms");
  CHECK(on.tenants[1].by_status[static_cast<std::size_t>(Status::ok)] == on.tenants[1].arrivals);
  CHECK(on.tenants[1].p95 < off.tenants[1].p95 * 0.85);
  // No throughput lost: the backlog still runs full batches on both lanes.
  CHECK(on.throughput_rps > off.throughput_rps * 0.99);
  CHECK(on.mean_batch_size > 15.5);
  // Once the backlog stands (after the first second), no two starts closer than a third
  // of a 65 ms batch.
  std::sort(on_starts.begin(), on_starts.end());
  BatchDuration closest = 1h;
  for (std::size_t i = 1; i < on_starts.size(); ++i) {
    if (on_starts[i] - ManualClock::start() < 1s || on_starts[i] - ManualClock::start() > 9s)
      continue;
    closest = std::min(closest, on_starts[i] - on_starts[i - 1]);
  }
  CHECK(closest > 20ms);
}
