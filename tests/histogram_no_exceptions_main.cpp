// Built with -fno-exceptions: the histogram records, snapshots, merges and rolls there too
// (bad options would print a message and abort instead of throwing).
#include <tailbatch/latency_histogram.hpp>

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

  tailbatch::LatencyHistogram h;
  std::thread other([&] {
    for (int i = 1; i <= 100; ++i) h.record(std::chrono::milliseconds(i));
  });
  other.join();
  h.record_corrected(100ms, 10ms);
  const auto s = h.snapshot();
  check(s.count() == 110, "count of recorded and back-filled values");
  check(s.max() == 100ms, "exact max");
  check(s.percentile(0) == 1ms, "p0 is the minimum");

  tailbatch::HistogramSnapshot merged;
  merged.merge(s);
  h.merge_into(merged);
  check(merged.count() == 220, "merge");

  tailbatch::ManualClock clock;
  tailbatch::RollingHistogram<tailbatch::ManualClock> rolling(1s, 4, {}, clock);
  rolling.record(5ms);
  clock.advance(2s);
  check(rolling.snapshot().count() == 0, "rolling window forgets");

  if (failures == 0) std::puts("histogram works without exceptions");
  return failures == 0 ? 0 : 1;
}
