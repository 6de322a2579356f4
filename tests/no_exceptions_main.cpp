// Built with -fno-exceptions: the components that support it compile and work here.
#include <tailbatch/admission.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/version.hpp>

#include <chrono>
#include <cstdio>

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

  std::printf("%s\n", failures == 0 ? "no-exceptions build: all checks passed" : "failures");
  return failures == 0 ? 0 : 1;
}
