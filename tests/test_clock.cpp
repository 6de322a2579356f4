// Clocks: the concept, SteadyClock and ManualClock's shared, monotonic, hand-moved time.
#include <tailbatch/clock.hpp>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::ManualClock;
using tailbatch::SteadyClock;

namespace {
struct NotAClock {};
struct WrongReturn {
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;
  int now() const { return 0; }
};
}  // namespace

TEST_CASE("Clock concept accepts the shipped clocks and rejects others", "[clock]") {
  STATIC_REQUIRE(tailbatch::Clock<SteadyClock>);
  STATIC_REQUIRE(tailbatch::Clock<ManualClock>);
  STATIC_REQUIRE_FALSE(tailbatch::Clock<NotAClock>);
  STATIC_REQUIRE_FALSE(tailbatch::Clock<WrongReturn>);
  STATIC_REQUIRE(sizeof(SteadyClock) == 1);
}

TEST_CASE("SteadyClock never goes backwards", "[clock]") {
  SteadyClock clock;
  auto a = clock.now();
  auto b = clock.now();
  REQUIRE(b >= a);
}

TEST_CASE("ManualClock moves only when advanced, and copies share its time", "[clock]") {
  ManualClock clock;
  ManualClock copy = clock;
  REQUIRE(clock.now() == ManualClock::start());
  REQUIRE(clock.now() == clock.now());

  clock.advance(5ms);
  REQUIRE(copy.now() == ManualClock::start() + 5ms);

  copy.advance_to(ManualClock::start() + 7ms);
  REQUIRE(clock.now() == ManualClock::start() + 7ms);

  // advance_to a past time leaves the clock where it is.
  clock.advance_to(ManualClock::start());
  REQUIRE(clock.now() == ManualClock::start() + 7ms);

  REQUIRE_THROWS_AS(clock.advance(-1ns), std::invalid_argument);
  REQUIRE(clock.now() == ManualClock::start() + 7ms);

  ManualClock independent;
  REQUIRE(independent.now() == ManualClock::start());
}

TEST_CASE("ManualClock advanced from many threads loses no time", "[clock]") {
  for (int threads : {1, 2, 3, 7, 16}) {
    ManualClock clock;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([clock]() mutable {
        for (int i = 0; i < 1000; ++i) clock.advance(1us);
      });
    }
    for (auto& th : pool) th.join();
    REQUIRE(clock.now() - ManualClock::start() == threads * 1000us);
  }
}
