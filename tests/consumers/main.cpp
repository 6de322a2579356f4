// A consumer's program: it includes tailbatch the way every consumption mode spells it,
// runs a Pipeline (batches of squares on host lanes), records latencies, and checks what it
// reads back.
#include <tailbatch/tailbatch.hpp>
#if defined(TAILBATCH_CONSUMER_TOOLS)
#include <tailbatch/littles_law.hpp>  // tailbatch::tools, where the consumer links it
#endif

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <future>
#include <span>
#include <vector>

int main() {
  using namespace std::chrono_literals;
  static_assert(TAILBATCH_VERSION >= 100, "version macro present");

  auto square = [](std::span<const int> in, std::span<int> out, tailbatch::HostLane&) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * in[i];
  };
  tailbatch::Pipeline<int, int> pipeline(square, tailbatch::FixedWindow(8, 2ms));
  std::vector<std::future<tailbatch::Outcome<int>>> answers;
  for (int i = 0; i < 20; ++i) answers.push_back(pipeline.submit(i, {.timeout = 5s}));
  bool ok = true;
  for (int i = 0; i < 20; ++i) {
    tailbatch::Outcome<int> o = answers[static_cast<std::size_t>(i)].get();
    ok = ok && o.ok() && o.value() == i * i;
  }
  pipeline.shutdown();

  tailbatch::LatencyHistogram histogram;
  for (int i = 1; i <= 100; ++i) histogram.record(std::chrono::milliseconds(i));
  auto snap = histogram.snapshot();
  auto p50 = snap.percentile(50.0);
  std::printf("tailbatch %d.%d.%d: 20 requests through a Pipeline (%s); %llu samples, p50 %.2f ms\n",
              tailbatch::version.major, tailbatch::version.minor, tailbatch::version.patch,
              ok ? "all squared" : "WRONG", static_cast<unsigned long long>(snap.count()),
              std::chrono::duration<double, std::milli>(p50).count());
  ok = ok && snap.count() == 100 && p50 > 49ms && p50 < 51ms;
#if defined(TAILBATCH_CONSUMER_TOOLS)
  // The latency field guide's Example 3: 350 rps at 120 ms is 42 in flight.
  const auto check = tailbatch::check_littles_law(350.0, 120ms, 42.0);
  std::printf("tools: %s\n", check.explanation.c_str());
  ok = ok && !check.hidden_queue_suspected;
#endif
  return ok ? 0 : 1;
}
