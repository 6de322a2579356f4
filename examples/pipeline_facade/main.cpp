// A request handler's file: it includes the server's own interface and no tailbatch header
// (the target that builds it does not even have tailbatch's include directory), so it
// compiles in the time of its standard headers. Prints the replies of eight requests
// submitted from two threads, then one submitted after shutdown.
//
//   pipeline_facade
#include <chrono>
#include <cstdio>
#include <future>
#include <thread>
#include <vector>

#include "square_service.hpp"

int main() {
  using namespace std::chrono_literals;
  example::SquareService service(/*max_batch=*/8, /*window=*/2000us);

  std::vector<std::future<example::SquareService::Reply>> replies(8);
  std::thread other([&] {
    for (int i = 4; i < 8; ++i) replies[static_cast<std::size_t>(i)] = service.submit(i, 1000ms);
  });
  for (int i = 0; i < 4; ++i) replies[static_cast<std::size_t>(i)] = service.submit(i, 1000ms);
  other.join();

  int failures = 0;
  for (std::size_t i = 0; i < replies.size(); ++i) {
    const example::SquareService::Reply r = replies[i].get();
    if (r.ok) {
      std::printf("square(%zu) = %d\n", i, r.value);
    } else {
      std::printf("square(%zu) failed: %s\n", i, r.error.c_str());
      ++failures;
    }
  }

  service.shutdown();
  const example::SquareService::Reply late = service.submit(9, 1000ms).get();
  std::printf("after shutdown: %s\n", late.ok ? "served (unexpected)" : late.error.c_str());
  return (failures == 0 && !late.ok) ? 0 : 1;
}
