// A consumer's program: it includes tailbatch the way every consumption mode spells it,
// records a few latencies, and checks what it reads back.
#include <tailbatch/tailbatch.hpp>

#include <chrono>
#include <cstdio>

int main() {
  using namespace std::chrono_literals;
  static_assert(TAILBATCH_VERSION >= 100, "version macro present");
  tailbatch::LatencyHistogram histogram;
  for (int i = 1; i <= 100; ++i) histogram.record(std::chrono::milliseconds(i));
  auto snap = histogram.snapshot();
  auto p50 = snap.percentile(50.0);
  std::printf("tailbatch %d.%d.%d: %llu samples, p50 %.2f ms\n", tailbatch::version.major,
              tailbatch::version.minor, tailbatch::version.patch,
              static_cast<unsigned long long>(snap.count()),
              std::chrono::duration<double, std::milli>(p50).count());
  bool ok = snap.count() == 100 && p50 > 49ms && p50 < 51ms;
  return ok ? 0 : 1;
}
