// Built with -fno-exceptions: every core component compiles and works here, and bad
// configuration aborts with its message (through detail/throw.hpp) instead of throwing.
#include <tailbatch/admission.hpp>
#include <tailbatch/autoscaler.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/result_cache.hpp>
#include <tailbatch/serving.hpp>
#include <tailbatch/warmup.hpp>
#include <tailbatch/token_streamer.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/limit_algorithms.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/version.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#if defined(__unix__)
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>
#endif

#if defined(__cpp_exceptions)
#error "this translation unit must be compiled with -fno-exceptions"
#endif

namespace {

#if defined(__unix__)
// Runs f in a child process; true when the child aborted (SIGABRT) and wrote `expect`
// to stderr.
template <class F>
bool aborts_with(F f, const char* expect) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    f();
    std::_Exit(0);  // not reached when f aborts
  }
  ::close(fds[1]);
  std::string err;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && err.find(expect) != std::string::npos;
}
#endif

}  // namespace

int main() {
  using namespace std::chrono_literals;
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "FAILED: %s\n", what);
      ++failures;
    }
  };

  tailbatch::ManualClock clock;
  clock.advance(3ms);
  check(clock.now() - tailbatch::ManualClock::start() == 3ms, "ManualClock advances");

  tailbatch::Outcome<int> ok(42);
  check(ok.ok() && ok.value() == 42, "Outcome holds a value");
  tailbatch::Outcome<int> rejected(tailbatch::Error{tailbatch::Status::rejected,
                                                    tailbatch::RejectReason::queue_full, "full"});
  check(rejected.status() == tailbatch::Status::rejected, "Outcome holds an error");

  tailbatch::AdmitAll admit;
  auto ticket = admit.try_admit();
  check(ticket.has_value(), "AdmitAll admits");
  admit.release(std::move(*ticket), tailbatch::Status::ok, 1ms);

  tailbatch::FixedWindow window(8, 2ms);
  check(window.max_batch() == 8, "FixedWindow configured");

  tailbatch::HostLanes lanes(2, 1);
  {
    auto lease = lanes.try_acquire();
    check(lease.has_value() && lanes.size() == 2, "HostLanes leases a lane");
  }

  tailbatch::ConcurrencyLimiter<> limiter(tailbatch::StaticLimit(2));
  {
    auto a = limiter.try_acquire();
    auto b = limiter.try_acquire();
    auto c = limiter.try_acquire();
    check(a.ok() && b.ok() && !c.ok(), "ConcurrencyLimiter caps in-flight work");
  }
  check(limiter.in_flight_approx() == 0, "permits released on scope exit");

  // The histogram records from another thread, snapshots, merges and rolls.
  tailbatch::LatencyHistogram h;
  std::thread other([&] {
    for (int i = 1; i <= 100; ++i) h.record(std::chrono::milliseconds(i));
  });
  other.join();
  h.record_corrected(100ms, 10ms);
  const auto s = h.snapshot();
  check(s.count() == 110, "histogram counts recorded and back-filled values");
  check(s.max() == 100ms, "histogram max is exact");
  check(s.percentile(0) == 1ms, "histogram p0 is the minimum");
  tailbatch::HistogramSnapshot merged;
  merged.merge(s);
  h.merge_into(merged);
  check(merged.count() == 220, "histogram snapshots merge");
  tailbatch::RollingHistogram<tailbatch::ManualClock> rolling(1s, 4, {}, clock);
  rolling.record(5ms);
  clock.advance(2s);
  check(rolling.snapshot().count() == 0, "rolling window forgets old samples");

  // The Pipeline, stepped by poll() on the manual clock: a window closes, the model runs,
  // every callback fires once with its result.
  {
    using ManualPipeline =
        tailbatch::Pipeline<int, int, tailbatch::FixedWindow, tailbatch::HostLanes, tailbatch::AdmitAll,
                            tailbatch::ManualClock>;
    tailbatch::ManualClock pclock;
    std::vector<std::size_t> batch_sizes;
    ManualPipeline p(
        [&](std::span<const int> in, std::span<int> out, tailbatch::HostLane&) {
          batch_sizes.push_back(in.size());
          for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * 10;
        },
        tailbatch::FixedWindow(8, 2ms), {}, pclock);
    int sum = 0;
    int completed = 0;
    for (int i = 1; i <= 3; ++i) {
      p.submit(i, [&](tailbatch::Outcome<int>&& o) {
        ++completed;
        if (o.ok()) sum += o.value();
      });
    }
    check(p.poll().batches == 0, "Pipeline: no batch before the window closes");
    pclock.advance(2ms);
    check(p.poll().batches == 1, "Pipeline: the window closes");
    check(completed == 3 && sum == 60, "Pipeline: every request completes with its result");
    check(batch_sizes.size() == 1 && batch_sizes[0] == 3, "Pipeline: one batch of three");
    p.submit(4, [&](tailbatch::Outcome<int>&& o) {
      ++completed;
      check(o.ok() && o.value() == 40, "Pipeline: shutdown drains what is queued");
    });
    p.shutdown();
    check(completed == 4, "Pipeline: shutdown completes the queued request");
    p.submit(5, [&](tailbatch::Outcome<int>&& o) {
      ++completed;
      check(o.status() == tailbatch::Status::rejected, "Pipeline: after shutdown, submits are rejected");
    });
    check(completed == 5, "Pipeline: a rejected submit completes at once");
  }

  // The Pipeline with its own worker threads and futures.
  {
    tailbatch::Pipeline<int, int> p(
        [](std::span<const int> in, std::span<int> out, tailbatch::HostLane&) {
          for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] + 1;
        },
        tailbatch::FixedWindow(4, 100us));
    std::vector<std::future<tailbatch::Outcome<int>>> futures;
    for (int i = 0; i < 10; ++i) futures.push_back(p.submit(i));
    bool all = true;
    for (int i = 0; i < 10; ++i) {
      auto o = futures[static_cast<std::size_t>(i)].get();
      all = all && o.ok() && o.value() == i + 1;
    }
    check(all, "Pipeline (threads): every future gets its result");
    p.shutdown();
    check(p.stats().count(tailbatch::Status::ok) == 10, "Pipeline (threads): ten ok");
  }

  // The ContinuousBatcher stepped by hand, streaming through its TokenStreamers.
  {
    using Batcher = tailbatch::ContinuousBatcher<int, tailbatch::NoSequenceState, tailbatch::ManualClock>;
    tailbatch::ContinuousBatcherConfig c;
    c.max_active = 4;
    tailbatch::ManualClock bclock;
    Batcher b(
        [&](std::span<Batcher::Sequence> batch) {
          bclock.advance(1ms);
          for (auto& s : batch) {
            if (s.emits()) s.emit(static_cast<int>(s.generated()));
          }
        },
        c, bclock);
    Batcher::Request r;
    r.prompt.assign(3, 1);
    r.max_new_tokens = 5;
    auto stream = b.submit(std::move(r));
    while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
    std::vector<int> tokens;
    while (auto t = stream->try_next()) tokens.push_back(*t);
    check(tokens == std::vector<int>{0, 1, 2, 3, 4}, "ContinuousBatcher: five tokens in order");
    check(stream->end() && stream->end()->ok(), "ContinuousBatcher: the stream ends ok");
    b.shutdown();
  }

  // A TokenStreamer on its own.
  {
    tailbatch::TokenStreamer<int, tailbatch::ManualClock> s({}, clock);
    check(s.push(1) && s.push(2) && s.close(tailbatch::Status::ok), "TokenStreamer: push and close");
    std::vector<int> got;
    while (auto t = s.next()) got.push_back(*t);
    check(got == std::vector<int>{1, 2} && s.end() && s.end()->tokens == 2, "TokenStreamer: tokens then the end");
  }

#if defined(__unix__)
  // Bad configuration aborts with the message naming the field.
  check(aborts_with(
            [] {
              tailbatch::PipelineConfig<int> bad;
              bad.queue_capacity = 0;
              tailbatch::Pipeline<int, int> p([](std::span<const int>, std::span<int>, tailbatch::HostLane&) {},
                                              tailbatch::FixedWindow(4, 1ms), bad);
            },
            "Pipeline: queue_capacity must be >= 1"),
        "Pipeline: bad configuration aborts with its message");
  check(aborts_with(
            [] {
              tailbatch::ContinuousBatcherConfig bad;
              bad.max_active = 0;
              tailbatch::ContinuousBatcher<int> b([](auto) {}, bad);
            },
            "ContinuousBatcher: max_active must be >= 1"),
        "ContinuousBatcher: bad configuration aborts with its message");
  check(aborts_with(
            [] {
              tailbatch::TokenStreamerConfig bad;
              bad.capacity = 0;
              bad.validate();
            },
            "TokenStreamer: capacity must be >= 1"),
        "TokenStreamer: bad options abort with their message");
#endif

  std::printf("%s\n", failures == 0 ? "no-exceptions build: all checks passed" : "failures");
  return failures == 0 ? 0 : 1;
}
