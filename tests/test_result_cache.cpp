// ResultCache: bounds, time-to-live and admission on their own; coalescing, failures and
// cancellation with a real Pipeline stepped by poll() on a ManualClock; and a concurrency
// sweep on a threaded Pipeline.
#include <tailbatch/result_cache.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <limits>
#include <list>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

using ManualCache = ResultCache<int, int, std::hash<int>, std::equal_to<int>, ManualClock>;
using ManualPipeline = Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock>;

// Records every batch the model sees; answers x -> 10x; throws for 13.
struct Log {
  std::vector<std::vector<int>> batches;
  auto model() {
    return [this](std::span<const int> in, std::span<int> out, HostLane&) {
      batches.emplace_back(in.begin(), in.end());
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (in[i] == 13) throw std::runtime_error("unlucky");
        out[i] = in[i] * 10;
      }
    };
  }
  [[nodiscard]] std::size_t executed(int key) const {
    std::size_t n = 0;
    for (const auto& b : batches) {
      for (int x : b) n += x == key ? 1 : 0;
    }
    return n;
  }
};

template <class T>
bool ready(const std::future<T>& f) {
  return f.wait_for(0s) == std::future_status::ready;
}

const BatchTime t0 = ManualClock::start();

ManualCache::Config one_shard(std::size_t entries) {
  ManualCache::Config c;
  c.max_entries = entries;
  c.shards = 1;
  return c;
}

using tailbatch::test::MessageIs;

}  // namespace

TEST_CASE("ResultCache: bad configuration names the field") {
  using Cache = ResultCache<int, int>;
  CHECK_THROWS_MATCHES(Cache({.max_entries = 0}), std::invalid_argument,
                       MessageIs("ResultCache: max_entries must be >= 1"));
  CHECK_THROWS_MATCHES(Cache({.max_entries = 10, .max_bytes = 100}), std::invalid_argument,
                       MessageIs("ResultCache: size_of must be set when max_bytes is set"));
  CHECK_THROWS_MATCHES(Cache({.max_entries = 10, .ttl = -1s}), std::invalid_argument,
                       MessageIs("ResultCache: ttl must be >= 0"));
  CHECK_THROWS_MATCHES(Cache({.max_entries = 100, .shards = 3}), std::invalid_argument,
                       MessageIs("ResultCache: shards must be a power of two, at most 256"));
  CHECK_THROWS_MATCHES(Cache({.max_entries = 2, .shards = 4}), std::invalid_argument,
                       MessageIs("ResultCache: max_entries must be >= shards"));
}

TEST_CASE("ResultCache: try_get, insert, erase and the hit/miss counts") {
  ManualCache cache(one_shard(8));
  CHECK_FALSE(cache.try_get(1).has_value());
  CHECK(cache.insert(1, 10));
  REQUIRE(cache.try_get(1).has_value());
  CHECK(*cache.try_get(1) == 10);
  CHECK(cache.insert(1, 11));  // replaces
  CHECK(*cache.try_get(1) == 11);
  const ResultCacheStats s = cache.stats();
  CHECK(s.hits == 3);
  CHECK(s.misses == 1);
  CHECK(s.entries == 1);
  CHECK(cache.size_approx() == 1);
  CHECK(cache.erase(1));
  CHECK_FALSE(cache.erase(1));
  CHECK_FALSE(cache.try_get(1).has_value());
  CHECK(cache.size_approx() == 0);
}

TEST_CASE("ResultCache: entries expire after the time-to-live on the cache's clock") {
  ManualClock clock;
  ManualCache::Config c = one_shard(8);
  c.ttl = 100ms;
  ManualCache cache(c, {}, {}, clock);
  CHECK(cache.insert(1, 10));
  clock.advance(99ms);
  CHECK(cache.try_get(1).has_value());
  CHECK(cache.insert(2, 20));  // inserted at t0 + 99 ms
  clock.advance(1ms);          // t0 + 100 ms: entry 1 has lived its 100 ms
  CHECK_FALSE(cache.try_get(1).has_value());
  CHECK(cache.try_get(2).has_value());
  CHECK(cache.stats().expired == 1);
  clock.advance(99ms);
  CHECK(cache.erase_expired() == 1);  // entry 2, without a lookup
  CHECK(cache.size_approx() == 0);
  CHECK(cache.stats().expired == 2);
}

TEST_CASE("ResultCache: never holds more entries than max_entries") {
  for (std::size_t shards : {1u, 4u}) {
    ManualCache::Config c;
    c.max_entries = 40;
    c.shards = shards;
    ManualCache cache(c);
    for (int k = 0; k < 1000; ++k) {
      (void)cache.try_get(k);
      (void)cache.insert(k, k);
      REQUIRE(cache.size_approx() <= 40);
    }
    const ResultCacheStats s = cache.stats();
    CHECK(s.entries == cache.size_approx());
    CHECK(s.entries >= 40 - shards);  // each shard fills its share
    CHECK(s.evictions == s.inserts - s.entries);
  }
}

TEST_CASE("ResultCache: never holds more bytes than max_bytes; an oversized value is not stored") {
  using Cache = ResultCache<int, std::string, std::hash<int>, std::equal_to<int>, ManualClock>;
  Cache::Config c;
  c.max_entries = 1000;
  c.max_bytes = 100;
  c.shards = 1;
  c.size_of = [](const int&, const std::string& v) { return v.size(); };
  Cache cache(c);
  for (int k = 0; k < 200; ++k) {
    (void)cache.insert(k, std::string(static_cast<std::size_t>(1 + k % 30), 'x'));
    REQUIRE(cache.bytes_approx() <= 100);
  }
  CHECK(cache.stats().bytes == cache.bytes_approx());
  CHECK(cache.bytes_approx() > 50);  // it does fill up
  CHECK_FALSE(cache.insert(9999, std::string(101, 'y')));
  CHECK_FALSE(cache.try_get(9999).has_value());
  CHECK(cache.bytes_approx() <= 100);
}

TEST_CASE("ResultCache: a scan of one-hit keys does not evict the hot set (admission)") {
  // 50 hot keys looked up in turn, with three never-repeated keys between consecutive hot
  // lookups: a hot key comes back after 200 lookups, twice the cache's 100 entries, so
  // an LRU cache would lose every hot key before its next use.
  ManualCache cache(one_shard(100));
  auto lookup = [&](int k) {
    if (cache.try_get(k)) return true;
    (void)cache.insert(k, k);
    return false;
  };
  int scan = 1'000'000;
  std::size_t hot_hits = 0;
  std::size_t hot_lookups = 0;
  std::size_t scan_hits = 0;
  for (int round = 0; round < 100; ++round) {
    for (int h = 0; h < 50; ++h) {
      const bool hit = lookup(h);
      if (round >= 10) {
        hot_hits += hit ? 1 : 0;
        ++hot_lookups;
      }
      for (int i = 0; i < 3; ++i) scan_hits += lookup(scan++) ? 1 : 0;
    }
  }
  CHECK(scan_hits == 0);
  INFO("hot hits " << hot_hits << " of " << hot_lookups);
  CHECK(static_cast<double>(hot_hits) >= 0.95 * static_cast<double>(hot_lookups));

  // The same stream through an exact LRU of the same size keeps none of them.
  std::list<int> order;
  std::unordered_map<int, std::list<int>::iterator> where;
  std::size_t lru_hot_hits = 0;
  scan = 1'000'000;
  auto lru = [&](int k) {
    auto it = where.find(k);
    if (it != where.end()) {
      order.splice(order.begin(), order, it->second);
      return true;
    }
    order.push_front(k);
    where[k] = order.begin();
    if (order.size() > 100) {
      where.erase(order.back());
      order.pop_back();
    }
    return false;
  };
  for (int round = 0; round < 100; ++round) {
    for (int h = 0; h < 50; ++h) {
      lru_hot_hits += lru(h) && round >= 10 ? 1 : 0;
      for (int i = 0; i < 3; ++i) (void)lru(scan++);
    }
  }
  CHECK(lru_hot_hits == 0);
}

TEST_CASE("ResultCache + Pipeline: identical requests in flight share one batch slot") {
  ManualClock clock;
  Log log;
  ManualPipeline p(log.model(), FixedWindow{4, 10ms}, {}, clock);
  MetricsRegistry registry;
  ManualCache::Config c = one_shard(100);
  c.metrics = &registry;
  ManualCache cache(c, {}, {}, clock);

  std::vector<std::future<Outcome<int>>> f;
  f.push_back(cache.submit(p, 7));
  f.push_back(cache.submit(p, 7));
  f.push_back(cache.submit(p, 8));
  f.push_back(cache.submit(p, 7));
  CHECK(p.stats().submitted == 2);  // 7 once, 8 once
  CHECK(cache.stats().in_flight == 2);
  CHECK(p.poll().batches == 0);
  clock.advance(10ms);
  CHECK(p.poll().batches == 1);
  REQUIRE(log.batches.size() == 1);
  CHECK(log.batches[0] == std::vector<int>{7, 8});
  const int want[] = {70, 70, 80, 70};
  for (std::size_t i = 0; i < f.size(); ++i) {
    REQUIRE(ready(f[i]));
    CHECK(f[i].get().value() == want[i]);
  }
  ResultCacheStats s = cache.stats();
  CHECK(s.misses == 2);
  CHECK(s.coalesced == 2);
  CHECK(s.in_flight == 0);
  CHECK(s.entries == 2);

  // A hit completes before submit returns and never reaches the queue.
  int got = 0;
  cache.submit(p, 7, {}, [&](Outcome<int>&& o) { got = o.value(); });
  CHECK(got == 70);
  CHECK(p.stats().submitted == 2);
  CHECK(cache.stats().hits == 1);

  const std::string text = registry.prometheus();
  check_contains_all(text, {"tailbatch_cache_hits_total 1", "tailbatch_cache_misses_total 2",
                            "tailbatch_cache_coalesced_total 2", "tailbatch_cache_entries 2",
                            "tailbatch_cache_evictions_total{reason=\"capacity\"} 0"});
}

// A one-shard cache of 100 entries in front of a pipeline with a 10 ms window (batches of
// up to 4), on a manual clock.
struct CachedPipeline {
  ManualClock clock;
  Log log;
  ManualPipeline p{log.model(), FixedWindow{4, 10ms}, {}, clock};
  ManualCache cache{one_shard(100), {}, {}, clock};
  // Closes the window: the queued batch runs.
  void next_window() {
    clock.advance(10ms);
    (void)p.poll();
  }
};

TEST_CASE_METHOD(
    CachedPipeline,
    "ResultCache + Pipeline: a failed outcome reaches every waiter and is not cached") {
  auto a = cache.submit(p, 13);
  auto b = cache.submit(p, 13);
  next_window();
  REQUIRE(ready(a));
  REQUIRE(ready(b));
  const Outcome<int> oa = a.get();
  const Outcome<int> ob = b.get();
  CHECK(oa.status() == Status::failed);
  CHECK(oa.message() == "unlucky");
  CHECK(ob.status() == Status::failed);
  CHECK(cache.stats().entries == 0);
  auto again = cache.submit(p, 13);  // a miss again: goes to the Pipeline
  CHECK(p.stats().submitted == 2);
  CHECK_FALSE(ready(again));
  next_window();
  CHECK(again.get().status() == Status::failed);
  CHECK(log.executed(13) == 2);
}

TEST_CASE_METHOD(CachedPipeline, "ResultCache + Pipeline: a cancelled request is not cached") {
  CancellationSource src;
  auto a = cache.submit(p, 5, SubmitOptions{.cancel = src.get_token()});
  src.request_stop();
  REQUIRE(ready(a));  // at once, in the cancelling thread
  CHECK(a.get().status() == Status::cancelled);
  next_window();
  CHECK(log.executed(5) == 0);  // nobody wanted it: removed from the queue
  CHECK(p.stats().count(Status::cancelled) == 1);
  CHECK(cache.stats().entries == 0);
  CHECK(cache.stats().in_flight == 0);
  // An already cancelled token completes at once and submits nothing.
  auto b = cache.submit(p, 5, SubmitOptions{.cancel = src.get_token()});
  REQUIRE(ready(b));
  CHECK(b.get().status() == Status::cancelled);
  CHECK(p.stats().submitted == 1);
}

TEST_CASE_METHOD(CachedPipeline,
                 "ResultCache + Pipeline: a cancelled leader does not cancel its followers") {
  CancellationSource leader_src;
  CancellationSource follower_src;
  auto leader = cache.submit(p, 6, SubmitOptions{.cancel = leader_src.get_token()});
  auto follower = cache.submit(p, 6, SubmitOptions{.cancel = follower_src.get_token()});
  auto plain = cache.submit(p, 6);
  CHECK(cache.stats().coalesced == 2);
  leader_src.request_stop();
  REQUIRE(ready(leader));
  CHECK(leader.get().status() == Status::cancelled);
  follower_src.request_stop();  // one of two followers gives up too
  REQUIRE(ready(follower));
  CHECK(follower.get().status() == Status::cancelled);
  next_window();
  REQUIRE(ready(plain));
  CHECK(plain.get().value() == 60);
  CHECK(log.executed(6) == 1);
  CHECK(cache.try_get(6) == std::optional<int>(60));
}

TEST_CASE_METHOD(CachedPipeline,
                 "ResultCache + Pipeline: a follower joining a request that everyone cancelled "
                 "still gets a result") {
  CancellationSource src;
  auto leader = cache.submit(p, 4, SubmitOptions{.cancel = src.get_token()});
  src.request_stop();  // the only waiter: the shared request is cancelled in the Pipeline
  REQUIRE(ready(leader));
  auto late = cache.submit(p, 4);  // joins before the Pipeline has seen the cancellation
  CHECK(cache.stats().coalesced == 1);
  clock.advance(10ms);
  (void)p.poll();  // the shared request completes cancelled: submitted again for `late`
  CHECK(cache.stats().resubmitted == 1);
  CHECK(p.stats().submitted == 2);
  CHECK_FALSE(ready(late));
  next_window();
  REQUIRE(ready(late));
  CHECK(late.get().value() == 40);
  CHECK(log.executed(4) == 1);
}

TEST_CASE_METHOD(CachedPipeline,
                 "ResultCache + Pipeline: deadlines are never stretched by coalescing") {
  // The leader's deadline passes in the queue; its patient follower is submitted again.
  auto leader = cache.submit(p, 3, SubmitOptions{.deadline = t0 + 5ms});
  auto patient = cache.submit(p, 3, SubmitOptions{.deadline = t0 + 100ms});
  // A tighter deadline than the shared request's runs on its own.
  auto hasty = cache.submit(p, 3, SubmitOptions{.deadline = t0 + 2ms});
  ResultCacheStats s = cache.stats();
  CHECK(s.coalesced == 1);
  CHECK(s.misses == 2);
  CHECK(p.stats().submitted == 2);
  next_window();
  REQUIRE(ready(leader));
  CHECK(leader.get().status() == Status::deadline_exceeded);
  REQUIRE(ready(hasty));
  CHECK(hasty.get().status() == Status::deadline_exceeded);
  CHECK_FALSE(ready(patient));
  CHECK(cache.stats().resubmitted == 1);
  next_window();
  REQUIRE(ready(patient));
  CHECK(patient.get().value() == 30);
  CHECK(log.executed(3) == 1);
}

TEST_CASE_METHOD(
    CachedPipeline,
    "ResultCache + Pipeline: a throwing callback is counted and harms no other waiter") {
  cache.submit(p, 2, {}, [](Outcome<int>&&) { throw std::runtime_error("callback"); });
  auto other = cache.submit(p, 2);
  next_window();
  REQUIRE(ready(other));
  CHECK(other.get().value() == 20);
  CHECK(cache.stats().callback_exceptions == 1);
}

TEST_CASE("ResultCache + threaded Pipeline: concurrent submits from 1, 2, 3, 7 and 16 threads") {
  for (int threads : {1, 2, 3, 7, 16}) {
    Pipeline<int, int> p(
        [](std::span<const int> in, std::span<int> out, HostLane&) {
          for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * 10;
        },
        FixedWindow{16, 200us});
    ResultCache<int, int> cache({.max_entries = 64, .shards = 4});
    const int per_thread = 2000 / test::sanitizer_slowdown;
    std::atomic<int> wrong{0};
    std::atomic<int> done{0};
    std::atomic<int> get_misses{0};
    on_threads(threads, [&](int t) {
      for (int i = 0; i < per_thread; ++i) {
        const int key = (i * 7 + t) % 256;  // more keys than entries: evictions too
        if (i % 5 == 0) {
          const auto v = cache.try_get(key);
          if (!v) get_misses.fetch_add(1);
          if (v && *v != key * 10) wrong.fetch_add(1);
          continue;
        }
        cache.submit(p, key, {}, [&, key](Outcome<int>&& o) {
          if (!o.ok() || o.value() != key * 10) wrong.fetch_add(1);
          done.fetch_add(1);
        });
      }
    });
    const int expected = threads * (per_thread - (per_thread + 4) / 5);
    const auto give_up = std::chrono::steady_clock::now() + 30s;
    while (done.load() < expected && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
    p.shutdown();
    INFO("threads " << threads);
    CHECK(done.load() == expected);
    CHECK(wrong.load() == 0);
    const ResultCacheStats s = cache.stats();
    CHECK(s.in_flight == 0);
    CHECK(s.entries <= 64);
    CHECK(s.hits + s.misses + s.coalesced ==
          static_cast<std::uint64_t>(threads) * static_cast<std::uint64_t>(per_thread));
    // Every miss of submit() went to the Pipeline once; joins and hits never did.
    CHECK(p.stats().submitted == s.misses - static_cast<std::uint64_t>(get_misses.load()) + s.resubmitted);
  }
}

TEST_CASE("FrequencySketch: the doorkeeper absorbs first sightings; counts saturate; aging halves") {
  detail::FrequencySketch sketch(64);
  const std::uint64_t a = detail::mix64(1);
  const std::uint64_t b = detail::mix64(2);
  CHECK(sketch.estimate(a) == 0);
  sketch.record(a);
  CHECK(sketch.estimate(a) == 1);  // the doorkeeper only
  for (int i = 0; i < 5; ++i) sketch.record(a);
  CHECK(sketch.estimate(a) == 6);  // five counted, plus the doorkeeper
  CHECK(sketch.estimate(b) <= 1);  // another key: at most a collision in the doorkeeper
  for (int i = 0; i < 40; ++i) sketch.record(a);
  CHECK(sketch.estimate(a) == detail::FrequencySketch::max_count + 1);
  // Fill the sample with other keys until the sketch ages once: a's count halves and the
  // doorkeeper forgets it.
  const std::size_t left = sketch.sample_size() - sketch.additions();
  for (std::size_t i = 0; i < left; ++i) sketch.record(detail::mix64(1000 + i));
  CHECK(sketch.additions() == sketch.sample_size() / 2);
  const unsigned aged = sketch.estimate(a);
  CHECK(aged >= 7);  // 15 / 2, plus collisions from the filler keys at most
  CHECK(aged <= 8);
}

TEST_CASE("FrequencySketch: a weighted sighting counts as that many; saturation holds until aging") {
  detail::FrequencySketch weighted(64);
  detail::FrequencySketch single(64);
  const std::uint64_t g = detail::FrequencySketch::slot_of(detail::mix64(7));
  CHECK_FALSE(weighted.record_slot(g, 4));  // one to the doorkeeper, three counted
  for (int i = 0; i < 4; ++i) CHECK_FALSE(single.record_slot(g));
  CHECK(weighted.estimate(detail::mix64(7)) == 4);
  CHECK(single.estimate(detail::mix64(7)) == 4);
  CHECK(weighted.additions() == single.additions());
  // Saturation is reported once all four counters reach max_count, and not before.
  bool saturated = false;
  int more = 0;
  while (!saturated) {
    saturated = single.record_slot(g);
    ++more;
  }
  CHECK(more == detail::FrequencySketch::max_count - 3);
  CHECK(single.estimate(detail::mix64(7)) == detail::FrequencySketch::max_count + 1);
  // record_saturated counts a sighting without changing the estimate; aging changes the
  // epoch, which ends the saturation.
  const std::uint32_t epoch = single.epoch();
  const std::size_t before = single.additions();
  single.record_saturated();
  CHECK(single.additions() == before + 1);
  CHECK(single.estimate(detail::mix64(7)) == detail::FrequencySketch::max_count + 1);
  while (single.epoch() == epoch) single.record_saturated();
  CHECK(single.estimate(detail::mix64(7)) == detail::FrequencySketch::max_count / 2);
  CHECK_FALSE(single.record_slot(g));  // the doorkeeper was cleared: not saturated
}

TEST_CASE("TinyLfuStore: buffered and sampled hits count as every hit did, before admission") {
  using Store = detail::TinyLfuStore<int, int, std::equal_to<int>, ManualClock::time_point>;
  Store store(10, std::numeric_limits<std::size_t>::max(), std::equal_to<int>{});
  detail::EvictionTally tally;
  const auto h = [](int k) { return detail::mix64(static_cast<std::uint64_t>(k)); };
  for (int k = 1; k <= 10; ++k) {
    CHECK(store.insert(int{k}, int{k}, h(k), 0, ManualClock::time_point::max(), tally));
  }
  auto* hot = store.find(3, h(3));
  REQUIRE(hot != nullptr);
  REQUIRE(store.segment_of(hot) == Store::Segment::probation);
  // Ten hits, fewer than the buffer holds: the first promotes it to protected, the second
  // marks it, the other eight are sampled one in four with weight four.
  for (int i = 0; i < 10; ++i) store.hit(hot);
  // An insert applies the buffered hits before it picks a victim.
  CHECK(store.insert(11, 11, h(11), 0, ManualClock::time_point::max(), tally));
  hot = store.find(3, h(3));
  REQUIRE(hot != nullptr);
  CHECK(store.segment_of(hot) == Store::Segment::protect);
  // Ten sightings: one in the doorkeeper and nine counted, as if each had been recorded.
  CHECK(store.frequency(h(3)) == 10);
  // Hits on an entry about to be erased are applied first, and nothing dangles (ASan).
  auto* gone = store.find(4, h(4));
  REQUIRE(gone != nullptr);
  store.hit(gone);
  store.erase(gone);
  CHECK(store.find(4, h(4)) == nullptr);
  CHECK(store.frequency(h(4)) == 1);
}

TEST_CASE("ResultCache: concurrent try_get and insert from 1, 2, 3, 7 and 16 threads keep values and counts") {
  for (const int threads : {1, 2, 3, 7, 16}) {
    CAPTURE(threads);
    // Small shards, so that hits are buffered while other threads insert and evict.
    ResultCache<int, int> cache({.max_entries = 64, .shards = 4});
    constexpr int per_thread = 4000;
    std::atomic<int> wrong{0};
    std::atomic<std::uint64_t> hits{0};
    on_threads(threads, [&](int t) {
      std::uint64_t mine = 0;
      for (int i = 0; i < per_thread; ++i) {
        // Mostly a hot set of 32 keys, sometimes one of 200 others.
        const int key = (i % 5 == 4) ? 100 + (i * 7 + t * 13) % 200 : (i * 11 + t) % 32;
        if (auto v = cache.try_get(key)) {
          ++mine;
          if (*v != key * 3) wrong.fetch_add(1);
        } else {
          (void)cache.insert(key, key * 3);
        }
      }
      hits.fetch_add(mine);
    });
    CHECK(wrong.load() == 0);
    const ResultCacheStats s = cache.stats();
    CHECK(s.hits == hits.load());
    CHECK(s.hits + s.misses == static_cast<std::uint64_t>(threads) * per_thread);
    CHECK(s.entries <= 64);
    CHECK(s.entries == cache.size_approx());
    CHECK(s.hits > s.misses);  // the hot set stays in
  }
}

namespace {

// A value of three words that only a torn copy could make inconsistent: `check` is a
// function of the key and the version, and each writer stores several versions.
struct Tagged {
  std::uint64_t key;
  std::uint64_t version;
  std::uint64_t check;
};
constexpr std::uint64_t tag_of(std::uint64_t key, std::uint64_t version) {
  return (key * 0x9E3779B97F4A7C15ULL) ^ (version * 0xD1B54A32D192ED03ULL) ^ 0x5555;
}

}  // namespace

TEST_CASE("ResultCache: lock-free hits never see a torn or wrong value while writers insert and evict") {
  static_assert(detail::optimistic_eligible<std::uint64_t, Tagged, SteadyClock::time_point>);
  for (const int readers : {1, 2, 3}) {
    CAPTURE(readers);
    // Two small shards: every insert evicts, tables are rewritten under the readers.
    ResultCache<std::uint64_t, Tagged> cache({.max_entries = 48, .shards = 2});
    constexpr std::uint64_t keys = 256;
    constexpr int writes = 300000;
    std::atomic<bool> done{false};
    std::atomic<int> started{0};
    std::atomic<int> wrong{0};
    const int threads = 2 + readers;
    const auto start_together = [&] {
      started.fetch_add(1);
      while (started.load() < threads) std::this_thread::yield();
    };
    std::atomic<std::uint64_t> seen{0};
    std::vector<std::thread> pool;
    for (int w = 0; w < 2; ++w) {
      pool.emplace_back([&, w] {
        start_together();
        for (int i = 0; i < writes; ++i) {
          // Half the writes replace one of four hot keys, which the readers mostly read:
          // a reader copying a value while it is rewritten is what a torn read needs.
          const auto k = i % 2 == 0 ? static_cast<std::uint64_t>(i / 2 % 4)
                                    : static_cast<std::uint64_t>((i * 37 + w * 101) % static_cast<int>(keys));
          const auto version = static_cast<std::uint64_t>(i + w * writes);
          if (i % 7 == 6) {
            (void)cache.erase(k);
          } else {
            (void)cache.insert(k, Tagged{k, version, tag_of(k, version)});
          }
        }
      });
    }
    for (int r = 0; r < readers; ++r) {
      pool.emplace_back([&, r] {
        start_together();
        std::uint64_t hits = 0;
        std::uint64_t i = static_cast<std::uint64_t>(r) * 13;
        // Keep reading until the writers are done (and at least a little after).
        for (int rounds = 0; !done.load(std::memory_order_relaxed) || rounds < 2000; ++rounds) {
          const std::uint64_t k = i % 4 != 0 ? i % 4 : (i * 11) % keys;
          ++i;
          if (auto v = cache.try_get(k)) {
            ++hits;
            if (v->key != k || v->check != tag_of(k, v->version)) wrong.fetch_add(1);
          }
        }
        seen.fetch_add(hits);
      });
    }
    pool[0].join();
    pool[1].join();
    done = true;
    for (std::size_t t = 2; t < pool.size(); ++t) pool[t].join();
    CHECK(wrong.load() == 0);
    const ResultCacheStats s = cache.stats();
    CHECK(s.hits == seen.load());
    CHECK(s.entries <= 48);
    CHECK(s.entries == cache.size_approx());
  }
}

TEST_CASE("ResultCache: a lock-free hit sees the latest value, respects the time-to-live, and erase") {
  ManualClock clock;
  ManualCache::Config c = one_shard(64);
  c.ttl = 100ms;
  ManualCache cache(c, {}, {}, clock);
  for (int k = 0; k < 40; ++k) CHECK(cache.insert(k, k * 2));
  // Enough hits to promote and settle every entry, so that later hits are sampled.
  for (int round = 0; round < 50; ++round) {
    for (int k = 0; k < 40; ++k) {
      const auto v = cache.try_get(k);
      REQUIRE(v.has_value());
      CHECK(*v == k * 2);
    }
  }
  CHECK(cache.stats().hits == 50 * 40);
  CHECK(cache.insert(7, 700));  // replaced: the next hit sees the new value
  CHECK(*cache.try_get(7) == 700);
  CHECK(cache.erase(8));
  CHECK_FALSE(cache.try_get(8).has_value());
  clock.advance(99ms);
  CHECK(cache.try_get(9).has_value());
  clock.advance(1ms);  // every entry has lived its 100 ms
  CHECK_FALSE(cache.try_get(9).has_value());
  CHECK(cache.stats().expired == 1);
  cache.clear();
  CHECK_FALSE(cache.try_get(10).has_value());
  CHECK(cache.insert(10, 1));
  CHECK(*cache.try_get(10) == 1);
}

TEST_CASE("OptimisticIndex: put, replace, erase with backward shift, growth and clear") {
  using Index = detail::OptimisticIndex<int, int, ManualClock::time_point>;
  Index index;
  const std::equal_to<int> eq;
  const auto h = [](int k) { return detail::mix64(static_cast<std::uint64_t>(k)); };
  const auto get = [&](int k) -> std::optional<int> {
    const auto f = index.find(h(k), k, eq);
    REQUIRE(f.probe != detail::Probe::busy);  // no writer: never busy
    if (f.probe == detail::Probe::absent) return std::nullopt;
    return f.value();
  };
  for (int k = 0; k < 500; ++k) {
    index.reserve(static_cast<std::size_t>(k) + 1);
    index.put(h(k), k, k + 1, ManualClock::time_point{}, eq);
  }
  for (int k = 0; k < 500; ++k) CHECK(get(k) == k + 1);
  CHECK_FALSE(get(500).has_value());
  for (int k = 0; k < 500; k += 2) index.erase(h(k), k, eq);
  for (int k = 0; k < 500; ++k) CHECK(get(k) == (k % 2 == 0 ? std::nullopt : std::optional<int>(k + 1)));
  index.put(h(3), 3, 33, ManualClock::time_point{}, eq);
  CHECK(get(3) == 33);
  index.settle(h(3), 3, eq, true);
  CHECK(index.find(h(3), 3, eq).settled);
  CHECK(get(3) == 33);
  index.settle(h(3), 3, eq, false);
  CHECK_FALSE(index.find(h(3), 3, eq).settled);
  index.clear();
  CHECK_FALSE(get(3).has_value());
}
