// Stress: 8 producers x 100k requests (scaled down under sanitizers, never skipped) with
// random priorities, deadlines and cancellations, a model that throws on 1 % of its
// calls, and a shutdown in the middle of the run. Every request must complete exactly
// once, and the statuses must add up.
#include <tailbatch/pipeline.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

struct Req {
  std::uint32_t id;
};

struct Tally {
  std::array<std::atomic<std::uint64_t>, 5> by_status{};
  std::array<std::atomic<std::uint64_t>, 5> by_reason{};
  std::atomic<std::uint64_t> wrong_value{0};
  void add(const Outcome<std::uint64_t>& o, std::uint32_t id) {
    by_status[static_cast<std::size_t>(o.status())].fetch_add(1, std::memory_order_relaxed);
    by_reason[static_cast<std::size_t>(o.reason())].fetch_add(1, std::memory_order_relaxed);
    if (o.ok() && o.value() != std::uint64_t{id} * 7 + 3) wrong_value.fetch_add(1, std::memory_order_relaxed);
  }
};

template <class Policy>
void run_stress(Policy policy, std::size_t lanes_count, int producers) {
  const int per = 100000 / tailbatch::test::sanitizer_slowdown;
  const std::size_t total = static_cast<std::size_t>(per) * static_cast<std::size_t>(producers);
  std::vector<std::atomic<std::uint8_t>> completions(total);
  Tally tally;
  std::atomic<std::uint64_t> model_calls{0};
  std::atomic<std::uint64_t> executed{0};

  HostLanes lanes(lanes_count);
  using P = Pipeline<Req, std::uint64_t, Policy>;
  typename P::Config cfg;
  cfg.queue_capacity = 2048;
  cfg.drain_timeout = 20ms;
  cfg.starvation_limit = 2ms;
  auto pipeline = std::make_unique<P>(
      [&](std::span<const Req> in, std::span<std::uint64_t> out, HostLane&) {
        // 1 % of model calls throw, the first early: a sanitized run may form few batches
        // before the shutdown.
        if (model_calls.fetch_add(1, std::memory_order_relaxed) % 100 == 3) throw std::runtime_error("model failure");
        executed.fetch_add(in.size(), std::memory_order_relaxed);
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = std::uint64_t{in[i].id} * 7 + 3;
      },
      std::move(policy), cfg, lanes);
  P& p = *pipeline;

  std::atomic<std::uint64_t> submitted{0};
  std::mutex futures_mu;
  std::vector<std::pair<std::uint32_t, std::future<Outcome<std::uint64_t>>>> futures;

  // Cancellations from another thread, some time after submit.
  std::mutex cancel_mu;
  std::vector<CancellationSource> to_cancel;
  std::atomic<bool> producers_done{false};
  std::thread canceller([&] {
    while (!producers_done.load()) {
      std::vector<CancellationSource> batch;
      {
        std::lock_guard lock(cancel_mu);
        batch.swap(to_cancel);
      }
      for (auto& s : batch) s.request_stop();
      std::this_thread::sleep_for(100us);
    }
  });

  // Shutdown in the middle of the run.
  std::thread stopper([&] {
    while (submitted.load() < total / 2) std::this_thread::sleep_for(200us);
    p.shutdown();
  });

  std::vector<std::thread> threads;
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1u);
      std::uniform_int_distribution<int> pct(0, 99);
      for (int i = 0; i < per; ++i) {
        const auto id = static_cast<std::uint32_t>(t * per + i);
        SubmitOptions opt;
        opt.priority = static_cast<Priority>(pct(rng) % 3);
        const int d = pct(rng);
        if (d < 20) opt.timeout = std::chrono::microseconds(50 + pct(rng) * 20);  // some expire
        const int c = pct(rng);
        CancellationSource src;
        if (c < 6) {
          opt.cancel = src.get_token();
          if (c < 2) src.request_stop();  // cancelled before or right after submit
        }
        auto on_done = [&completions, &tally, id](Outcome<std::uint64_t>&& o) {
          tally.add(o, id);
          completions[id].fetch_add(1, std::memory_order_relaxed);
        };
        if (i % 50 == 0) {
          auto fut = p.submit(Req{id}, opt);
          std::lock_guard lock(futures_mu);
          futures.emplace_back(id, std::move(fut));
        } else {
          p.submit(Req{id}, opt, on_done);
        }
        if (c >= 2 && c < 6) {
          if (c < 4) {
            src.request_stop();  // after submit: queued, running or already done
          } else {
            std::lock_guard lock(cancel_mu);
            to_cancel.push_back(src);
          }
        }
        submitted.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& t : threads) t.join();
  stopper.join();
  producers_done = true;
  canceller.join();

  for (auto& [id, fut] : futures) {
    REQUIRE(fut.wait_for(0s) == std::future_status::ready);  // shutdown has returned
    Outcome<std::uint64_t> o = fut.get();
    tally.add(o, id);
    completions[id].fetch_add(1, std::memory_order_relaxed);
  }

  const PipelineStats s = p.stats();
  pipeline.reset();

  INFO("ok " << s.count(Status::ok) << ", deadline_exceeded " << s.count(Status::deadline_exceeded) << ", cancelled "
             << s.count(Status::cancelled) << ", failed " << s.count(Status::failed) << ", queue_full "
             << s.count(RejectReason::queue_full) << ", shutting_down " << s.count(RejectReason::shutting_down)
             << ", batches " << s.batches());
  std::size_t not_once = 0;
  for (auto& c : completions) not_once += c.load() != 1;
  CHECK(not_once == 0);
  CHECK(tally.wrong_value == 0);
  CHECK(s.submitted == total);
  CHECK(s.completed() == total);
  CHECK(s.queued == 0);
  CHECK(s.in_flight == 0);
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(tally.by_status[i].load() == s.by_status[i]);
    sum += s.by_status[i];
  }
  CHECK(sum == total);
  for (std::size_t i = 1; i < 5; ++i) CHECK(tally.by_reason[i].load() == s.rejected_by_reason[i]);
  // The run really exercised every path.
  CHECK(s.count(Status::ok) > 0);
  CHECK(s.count(Status::cancelled) > 0);
  CHECK(s.count(Status::failed) > 0);
  CHECK(s.count(RejectReason::shutting_down) > 0);
  // Every request the model saw in a batch that did not throw came back ok or cancelled.
  CHECK(s.count(Status::ok) <= executed.load());
}

}  // namespace

TEST_CASE("Pipeline stress: fixed window, two lanes, shutdown mid-run") {
  run_stress(FixedWindow{32, 300us}, 2, 8);
}

TEST_CASE("Pipeline stress: deadline-aware EDF, three lanes, shutdown mid-run") {
  run_stress(DeadlineAware({.max_batch = 16, .max_wait = 500us, .margin = 10us}), 3,
             8);
}
