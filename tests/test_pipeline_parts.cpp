// The Pipeline's parts alone, without a Pipeline: the formed batch and its start-time drop
// (detail/pipeline/batch.hpp), the leader's sleep and wake-up (detail/pipeline/leader_signal.hpp),
// the counters, drain rate and metrics registration (detail/pipeline/metrics.hpp), and the
// queued entry (detail/pipeline/entry.hpp).
#include <tailbatch/detail/pipeline/leader_signal.hpp>
#include <tailbatch/detail/pipeline/batch.hpp>
#include <tailbatch/detail/pipeline/entry.hpp>
#include <tailbatch/detail/pipeline/metrics.hpp>
#include <tailbatch/pipeline_config.hpp>
#include <tailbatch/detail/outcome_ledger.hpp>
#include <tailbatch/detail/service_rate.hpp>

#include <tailbatch/admission.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

using Entry = detail::PipelineEntry<int, int, AdmitAll::Ticket, false>;
using Meta = Entry::Meta;
using Batch = detail::PipelineBatch<int, int, Meta>;

const BatchTime t0 = BatchTime{} + 1h;

// An entry whose completion records the status it was called with into *seen.
Entry make_entry(int req, BatchTime deadline, Status* seen, std::unique_ptr<detail::CancelHook> hook = nullptr) {
  detail::Completion<int> done([seen](Outcome<int>&& o) { *seen = o.status(); });
  return Entry(std::move(req), std::move(done), t0, std::move(hook), AdmitAll::Ticket{}, deadline, 1);
}

}  // namespace

TEST_CASE("PipelineEntry: one cache line when it fits, and the traits read it", "[pipeline_parts]") {
  STATIC_REQUIRE(alignof(Entry) == 64);
  Status seen = Status::ok;
  Entry e = make_entry(7, t0 + 5ms, &seen);
  using Traits = detail::PipelineEntryTraits<Entry>;
  CHECK_FALSE(Traits::gone(e));
  CHECK(Traits::deadline(e) == t0 + 5ms);
  CHECK(Traits::arrival(e) == t0);
  CHECK_FALSE(Traits::cancelled(e));
  CHECK(Traits::cost(e) == 1);
  Batch b;
  b.reserve(4);
  b.begin();
  b.take(e);
  CHECK(Traits::gone(e));  // its completion moved into the batch
  REQUIRE(b.metas.size() == 1);
  CHECK(b.reqs[0] == 7);
  CHECK(b.opened == t0);
  CHECK(b.earliest_deadline == t0 + 5ms);
}

TEST_CASE("PipelineBatch: pads with copies of the last request", "[pipeline_parts]") {
  Status s1 = Status::ok, s2 = Status::ok;
  Entry a = make_entry(1, BatchTime::max(), &s1);
  Entry c = make_entry(2, BatchTime::max(), &s2);
  Batch b;
  b.reserve(4);
  b.begin();
  b.take(a);
  b.take(c);
  b.pad_to(4);
  CHECK(b.padded == 4);
  CHECK(b.reqs == std::vector<int>{1, 2, 2, 2});
  b.pad_to(1);  // never below the requests it holds
  CHECK(b.padded == 2);
}

TEST_CASE("PipelineBatch: drops what may no longer start, late or cancelled", "[pipeline_parts]") {
  Status late = Status::ok, kept = Status::ok, cancelled = Status::ok;
  auto hook = std::make_unique<detail::CancelHook>([](void*) noexcept {}, nullptr);
  hook->fired.store(true);
  Entry e1 = make_entry(1, t0 + 1ms, &late);
  Entry e2 = make_entry(2, t0 + 10ms, &kept);
  Entry e3 = make_entry(3, t0 + 10ms, &cancelled, std::move(hook));
  Batch b;
  b.reserve(4);
  b.begin();
  b.take(e1);
  b.take(e2);
  b.take(e3);
  CHECK(b.cancellable);
  b.pad_to(4);

  SECTION("a padded batch keeps its size") {
    CHECK(b.drop_unstartable(t0 + 2ms, true) == 2);
    CHECK(b.reqs == std::vector<int>{2, 2, 2, 2});
    CHECK(b.padded == 4);
  }
  SECTION("otherwise it shrinks") {
    CHECK(b.drop_unstartable(t0 + 2ms, false) == 2);
    CHECK(b.reqs == std::vector<int>{2});
    CHECK(b.padded == 1);
  }
  REQUIRE(b.metas.size() == 1);
  REQUIRE(b.dropped.size() == 2);
  CHECK(b.dropped_status == std::vector<Status>{Status::deadline_exceeded, Status::cancelled});
  // The dropped completions are still there to be called (after the model call).
  b.dropped[0].done(Outcome<int>(Error{Status::deadline_exceeded, RejectReason::none, "late", {}}));
  CHECK(late == Status::deadline_exceeded);
  b.finish();
  CHECK(b.metas.empty());
  CHECK(b.dropped.empty());
  CHECK(b.drop_unstartable(t0, false) == 0);
}

TEST_CASE("LeaderSignal: a sleep ends at once when newcomers are already there", "[pipeline_parts]") {
  detail::LeaderSignal signal;
  // Would sleep forever, but the newcomers check (done after the sleeping flag is set)
  // sees something.
  signal.sleep(BatchTime::max(), 1, BatchTime::min(), false, [] { return true; });
  // Likewise for a pending cancel, which take_cancels() then clears, once.
  signal.cancelled();
  signal.sleep(BatchTime::max(), 1, BatchTime::min(), false, [] { return false; });
  CHECK(signal.take_cancels());
  CHECK_FALSE(signal.take_cancels());
  // And for a change of the closing flag since the leader looked.
  signal.close(t0);
  CHECK(signal.closing());
  CHECK(signal.drain_deadline() == t0);
  signal.sleep(BatchTime::max(), 1, BatchTime::min(), false, [] { return false; });
}

// A leader sleeps on `signal`, asking to be woken by `arrivals` arrivals or one due before
// t0 + 1ms; arrive() runs every millisecond until it is woken (the arrivals count only while
// it sleeps). Returns once the leader has woken.
template <class Arrive>
void sleep_until_woken(detail::LeaderSignal& signal, std::size_t arrivals, Arrive arrive) {
  std::atomic<bool> woke{false};
  std::thread leader([&] {
    signal.sleep(BatchTime::max(), arrivals, t0 + 1ms, false, [] { return false; });
    woke.store(true);
  });
  while (!woke.load()) {
    arrive();
    std::this_thread::sleep_for(1ms);
  }
  leader.join();
  CHECK(woke.load());
}

TEST_CASE("LeaderSignal: the sleeper is woken by the arrivals it asked for", "[pipeline_parts]") {
  detail::LeaderSignal signal;
  // Each round is 3 arrivals with late deadlines (not urgent), enough once it is asleep.
  sleep_until_woken(signal, 3, [&] {
    for (int i = 0; i < 3; ++i) signal.arrived(t0 + 1h, false);
  });
}

TEST_CASE("LeaderSignal: an urgent arrival wakes the sleeper alone", "[pipeline_parts]") {
  detail::LeaderSignal signal;
  sleep_until_woken(signal, 1000, [&] { signal.arrived(t0, false); });  // earlier than the mark
}

TEST_CASE("PipelineCounters and ServiceRate", "[pipeline_parts]") {
  detail::PipelineCounters c;
  detail::OutcomeLedger ledger(t0);
  ledger.count(Status::rejected, RejectReason::queue_full, 2);
  ledger.count(Status::ok, RejectReason::none, 0);  // nothing
  std::array<std::uint64_t, tailbatch::status_count> by_status{};
  std::array<std::uint64_t, tailbatch::reject_reason_count> by_reason{};
  ledger.fill(by_status, by_reason);
  CHECK(by_status[static_cast<std::size_t>(Status::rejected)] == 2);
  CHECK(by_reason[static_cast<std::size_t>(RejectReason::queue_full)] == 2);
  CHECK(by_status[static_cast<std::size_t>(Status::ok)] == 0);
  c.batch_ran(DispatchReason::size, 8, 1ms, nullptr);
  c.batch_ran(DispatchReason::window, 4, 1ms, nullptr);
  CHECK(c.fill_ratio(8) == 0.75);
  c.future_waiters.store(-3);
  CHECK(c.blocked_submitters() == 0);

  CHECK(detail::ServiceRate::retry_after(0.0, 100) == 0ns);
  CHECK(detail::ServiceRate::retry_after(1000.0, 100) == 100ms);
  CHECK(detail::ServiceRate::retry_after(1000.0, 0) == 1ms);  // at least one
  CHECK(detail::ServiceRate::retry_after(1.0, 1000) == 60s);  // capped
  detail::ServiceRate rate;
  CHECK(rate.record(5, 0ns) == 0.0);  // no busy time: no rate
  CHECK(rate.record(10, 10ms) == Approx(1000.0));
  // 30 in 10 ms: the earlier report kept at 3/4 weight, (7.5 + 30) / (7.5 ms + 10 ms).
  CHECK(rate.record(30, 10ms) == Approx(37.5 / 0.0175));
  CHECK(rate.rate() == Approx(37.5 / 0.0175));
}

TEST_CASE("PipelineMetricsTarget: registers through the registry it was given, or not at all", "[pipeline_parts]") {
  detail::PipelineCounters c;
  const detail::PipelineGaugeSources src{&c, nullptr, 8, nullptr, [](const void*) noexcept { return std::size_t{5}; }};
  PipelineMetricsTarget none = nullptr;
  const bool none_is_null = none == nullptr;  // compares as a pointer does
  CHECK(none_is_null);
  CHECK(none.register_pipeline({}, src) == nullptr);

  MetricsRegistry registry;
  PipelineMetricsTarget target = &registry;
  const bool target_is_set = target != nullptr;
  CHECK(target_is_set);
  CHECK(target.get() == &registry);
  auto m = target.register_pipeline({{"pipeline", "p"}}, src);
  REQUIRE(m != nullptr);
  CHECK(m->by_size.size() == 4);  // 1, 2, 3-4, 5-8
  c.count(Status::cancelled, RejectReason::none, 3, m.get());
  c.in_flight.store(2);
  const std::string text = registry.prometheus();
  CHECK(text.find("tailbatch_pipeline_requests_total{pipeline=\"p\",reason=\"none\",status=\"cancelled\"} 3") !=
        std::string::npos);
  CHECK(text.find("tailbatch_pipeline_queue_depth{pipeline=\"p\"} 5") != std::string::npos);
  CHECK(text.find("tailbatch_pipeline_in_flight{pipeline=\"p\"} 2") != std::string::npos);
  m.reset();  // unregisters the gauges
  CHECK(registry.prometheus().find("tailbatch_pipeline_queue_depth") == std::string::npos);
}
