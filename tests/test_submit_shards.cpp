// Ingress alone (detail/pipeline/submit_shards.hpp): queue places never exceeded and given back,
// closing refuses under the lock, a thread keeps to one shard and its requests stay in
// order, and the leader takes every request exactly once while submitters push.
#include <tailbatch/detail/pipeline/submit_shards.hpp>

#include <tailbatch/clock.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <set>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

struct Item {
  int thread = 0;
  int seq = 0;
};

using Shards = detail::SubmitShards<Item>;

// Keeps every emptied chunk: the leader's recycling is not under test here.
const auto no_recycle = [](std::vector<std::vector<Item>>&, std::size_t) noexcept {};

Shards::Push push(Shards& s, std::size_t shard, std::size_t sub, const std::atomic<bool>& closing, Item item,
                  BatchTime stamp = BatchTime{} + 1ms) {
  return s.push(shard, sub, closing, stamp, [&](std::vector<Item>& chunk) { chunk.push_back(item); });
}

// Takes everything queued; returns it in the order taken, per sub-queue.
std::vector<Item> take_all(Shards& s, bool all = false) {
  std::vector<Item> out;
  s.take(all, no_recycle);
  s.drain_taken([&](std::size_t, std::vector<std::vector<Item>>& chain) {
    for (auto& chunk : chain) out.insert(out.end(), chunk.begin(), chunk.end());
  });
  return out;
}

}  // namespace

TEST_CASE("submit shards: the capacity is never exceeded, and places taken off come back") {
  std::atomic<bool> closing{false};
  Shards s(1, 3, 10);
  CHECK(s.count() == 1);
  for (int i = 0; i < 10; ++i) REQUIRE(push(s, 0, 1, closing, Item{0, i}) == Shards::Push::queued);
  CHECK(push(s, 0, 1, closing, Item{0, 10}) == Shards::Push::queue_full);
  CHECK(s.queued_approx() == 10);
  CHECK(s.places_in_use_approx() == 10);
  CHECK(s.any_dirty(std::memory_order_relaxed));

  const std::vector<Item> got = take_all(s);
  REQUIRE(got.size() == 10);
  for (int i = 0; i < 10; ++i) CHECK(got[static_cast<std::size_t>(i)].seq == i);
  CHECK(s.taken_total() == 10);
  CHECK_FALSE(s.any_dirty(std::memory_order_relaxed));
  // Taken, but not yet published: still full.
  CHECK(push(s, 0, 1, closing, Item{0, 10}) == Shards::Push::queue_full);
  s.publish_dequeued(10);
  CHECK(s.queued_approx() == 0);
  CHECK(push(s, 0, 1, closing, Item{0, 10}) == Shards::Push::queued);
  CHECK(s.accepted_exact() == 11);
}

TEST_CASE("submit shards: closing refuses without calling make") {
  std::atomic<bool> closing{true};
  Shards s(4, 1, 100);
  bool made = false;
  const auto r = s.push(0, 0, closing, BatchTime{} + 1ms, [&](std::vector<Item>& chunk) {
    made = true;
    chunk.push_back(Item{});
  });
  CHECK(r == Shards::Push::closed);
  CHECK_FALSE(made);
  CHECK(s.accepted_exact() == 0);
  CHECK(take_all(s, true).empty());
}

TEST_CASE("submit shards: submit times are summed for the occupancy integrals") {
  std::atomic<bool> closing{false};
  Shards s(2, 1, 100);
  REQUIRE(push(s, 0, 0, closing, Item{}, BatchTime{} + 5ns) == Shards::Push::queued);
  REQUIRE(push(s, 1, 0, closing, Item{}, BatchTime{} + 7ns) == Shards::Push::queued);
  (void)take_all(s);
  const detail::EnteredSums e = s.take_entered();
  CHECK(e.ns_count == 2);
  CHECK(e.ns_sum == 12);
  CHECK(e.cycles_count == 0);
  CHECK(s.take_entered().ns_count == 0);
}

TEST_CASE("submit shards: a thread keeps to one shard; threads claim their own while any is free") {
  Shards s(16, 1, 100);
  const std::size_t mine = s.shard_of_this_thread();
  CHECK(s.shard_of_this_thread() == mine);
  std::vector<std::size_t> theirs(3);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < theirs.size(); ++i) {
    threads.emplace_back([&, i] {
      theirs[i] = s.shard_of_this_thread();
      CHECK(s.shard_of_this_thread() == theirs[i]);
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::size_t> distinct(theirs.begin(), theirs.end());
  distinct.insert(mine);
  CHECK(distinct.size() == 4);
}

TEST_CASE("submit shards: concurrent submitters, one leader: each request taken once, each thread's in order") {
  for (const int producers : {1, 2, 3, 7}) {
    CAPTURE(producers);
    constexpr int per_thread = 2000;
    std::atomic<bool> closing{false};
    Shards s(0, 2, 256);  // automatic shard count; a small queue, so that refusals happen
    std::atomic<int> done{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < producers; ++t) {
      threads.emplace_back([&, t] {
        const std::size_t shard = s.shard_of_this_thread();
        for (int i = 0; i < per_thread;) {
          if (push(s, shard, static_cast<std::size_t>(i % 2), closing, Item{t, i}) == Shards::Push::queued) {
            ++i;
          } else {
            std::this_thread::yield();
          }
        }
        done.fetch_add(1);
      });
    }
    std::vector<std::vector<int>> seen(static_cast<std::size_t>(producers));
    std::uint64_t taken = 0;
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (taken < static_cast<std::uint64_t>(producers) * per_thread && std::chrono::steady_clock::now() < deadline) {
      for (const Item& it : take_all(s, done.load() == producers)) {
        seen[static_cast<std::size_t>(it.thread)].push_back(it.seq);
        ++taken;
      }
      s.publish_dequeued(taken);
    }
    for (auto& t : threads) t.join();
    REQUIRE(taken == static_cast<std::uint64_t>(producers) * per_thread);
    CHECK(s.accepted_exact() == taken);
    CHECK(s.queued_approx() == 0);
    for (auto& v : seen) {
      REQUIRE(v.size() == static_cast<std::size_t>(per_thread));
      // Within one sub-queue (even, odd) a thread's requests arrive in order.
      int last_even = -2;
      int last_odd = -1;
      for (const int seq : v) {
        int& last = seq % 2 == 0 ? last_even : last_odd;
        CHECK(seq == last + 2);
        last = seq;
      }
    }
  }
}
