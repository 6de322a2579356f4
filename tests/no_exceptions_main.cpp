// Built with -fno-exceptions: the components that support it compile and work here.
#include <tailbatch/admission.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/version.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

#if defined(__cpp_exceptions)
#error "this translation unit must be compiled with -fno-exceptions"
#endif

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

  std::printf("%s\n", failures == 0 ? "no-exceptions build: all checks passed" : "failures");
  return failures == 0 ? 0 : 1;
}
