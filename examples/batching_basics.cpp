// A Pipeline around a toy model: submit with a future and with a callback, print outcomes.
#include <tailbatch/tailbatch.hpp>

#include <fmt/core.h>

using namespace std::chrono_literals;

int main() {
  // The model sees a whole batch: one response per request, in order.
  auto square = [](std::span<const int> in, std::span<int> out, tailbatch::HostLane&) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * in[i];
  };
  // Batches of up to 32, each leaving at most 5 ms after its first request arrived.
  tailbatch::Pipeline<int, int> pipeline(square, tailbatch::FixedWindow(32, 5ms));

  std::future<tailbatch::Outcome<int>> answer = pipeline.submit(7, {.timeout = 100ms});
  pipeline.submit(8, [](tailbatch::Outcome<int>&& o) {  // runs on a worker thread
    fmt::print("callback: {}\n", o.ok() ? fmt::format("{}", o.value()) : std::string(o.message()));
  });

  tailbatch::Outcome<int> o = answer.get();
  fmt::print("future: {} ({})\n", o.value(), tailbatch::to_string(o.status()));
  pipeline.shutdown();  // drains what is queued; the destructor would too
  fmt::print("batches: {}, completed: {}\n", pipeline.stats().batches(), pipeline.stats().completed());
}
