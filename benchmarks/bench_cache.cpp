// ResultCache against the usual hand-written cache, measured in the same binary.
//
//   BM_Baseline_MutexUnorderedMap  one std::mutex around an std::unordered_map and an LRU
//                                  list (std::list + splice on every hit); miss:0 looks
//                                  up keys that are all present, miss:1 looks up a key that
//                                  is never present and inserts it (evicting the oldest)
//   BM_Cache_Hit                   ResultCache::try_get() on present keys
//   BM_Cache_Miss                  ResultCache::try_get() on an absent key, then insert()
//                                  (admission and eviction included)
//   BM_Cache_ZipfHitRatio          one stream of 2M lookups, keys drawn Zipf(0.99) from 1M,
//                                  through a ResultCache of 10k entries and through an
//                                  exact LRU of 10k entries (lookup, insert on a miss);
//                                  counters hit_ratio and lru_hit_ratio
//
// Keys and values are 64-bit integers; hits and misses cycle over 4096 keys in a shuffled
// order. Threaded runs use UseRealTime(), so items_per_second is the aggregate throughput.
// Keys and values being trivially copyable, BM_Cache_Hit measures the lock-free hit.
// What this does not show: the locked hit that other types take (std::string keys, values
// that are expensive to copy), more threads than the machine has cores (the development
// machines have 2), and the coalescing path, whose cost is a Pipeline submit.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <tailbatch/result_cache.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using Key = std::uint64_t;
using Value = std::uint64_t;
using Cache = tailbatch::ResultCache<Key, Value>;

// The usual hand-written cache: one mutex, a hash map into an LRU list.
class MutexLru {
 public:
  explicit MutexLru(std::size_t capacity) : capacity_(capacity) { map_.reserve(capacity * 2); }

  std::optional<Value> get(Key k) {
    std::lock_guard lock(mu_);
    auto it = map_.find(k);
    if (it == map_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  void put(Key k, Value v) {
    std::lock_guard lock(mu_);
    auto it = map_.find(k);
    if (it != map_.end()) {
      it->second->second = v;
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.emplace_front(k, v);
    map_.emplace(k, order_.begin());
    if (order_.size() > capacity_) {
      map_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  std::mutex mu_;
  std::size_t capacity_;
  std::list<std::pair<Key, Value>> order_;
  std::unordered_map<Key, std::list<std::pair<Key, Value>>::iterator> map_;
};

constexpr std::size_t hot_keys = 4096;
constexpr std::size_t capacity = 10000;

// The keys every hit run cycles over, in a fixed shuffled order.
const std::vector<Key>& hit_keys() {
  static const std::vector<Key> keys = [] {
    std::vector<Key> k(hot_keys);
    for (std::size_t i = 0; i < hot_keys; ++i) k[i] = i * 0x9E3779B97F4A7C15ULL + 1;
    std::mt19937_64 rng(42);
    std::shuffle(k.begin(), k.end(), rng);
    return k;
  }();
  return keys;
}

// A never-repeating key for each (thread, iteration): every lookup misses.
Key miss_key(int thread, std::uint64_t i) { return (static_cast<Key>(thread) << 56) ^ (i * 0xD1B54A32D192ED03ULL + 7); }

MutexLru& baseline_full() {
  static MutexLru& lru = []() -> MutexLru& {
    static MutexLru l(capacity);
    for (Key k : hit_keys()) l.put(k, k);
    return l;
  }();
  return lru;
}

Cache& cache_full() {
  static Cache& cache = []() -> Cache& {
    static Cache c(Cache::Config{.max_entries = capacity});
    for (Key k : hit_keys()) (void)c.insert(k, k);
    return c;
  }();
  return cache;
}

void BM_Baseline_MutexUnorderedMap(benchmark::State& state) {
  const bool miss = state.range(0) != 0;
  const auto& keys = hit_keys();
  static MutexLru miss_lru(capacity);
  MutexLru& lru = miss ? miss_lru : baseline_full();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 977;
  std::uint64_t n = 0;
  for (auto _ : state) {
    if (miss) {
      const Key k = miss_key(state.thread_index(), n++);
      auto v = lru.get(k);
      benchmark::DoNotOptimize(v);
      lru.put(k, k);
    } else {
      auto v = lru.get(keys[i++ & (hot_keys - 1)]);
      benchmark::DoNotOptimize(v);
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Baseline_MutexUnorderedMap)->ArgName("miss")->Arg(0)->Arg(1)->Threads(1)->Threads(2)->UseRealTime();

void BM_Cache_Hit(benchmark::State& state) {
  const auto& keys = hit_keys();
  Cache& cache = cache_full();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 977;
  std::uint64_t misses = 0;
  for (auto _ : state) {
    auto v = cache.try_get(keys[i++ & (hot_keys - 1)]);
    misses += v ? 0 : 1;
    benchmark::DoNotOptimize(v);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["misses"] = static_cast<double>(misses);  // 0: every lookup hit
}
BENCHMARK(BM_Cache_Hit)->Threads(1)->Threads(2)->UseRealTime();

void BM_Cache_Miss(benchmark::State& state) {
  static Cache cache(Cache::Config{.max_entries = capacity});
  std::uint64_t n = 0;
  for (auto _ : state) {
    const Key k = miss_key(state.thread_index(), n++);
    auto v = cache.try_get(k);
    benchmark::DoNotOptimize(v);
    (void)cache.insert(k, k);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Cache_Miss)->Threads(1)->Threads(2)->UseRealTime();

// Zipf(s) over n ranks by inverse transform on the cumulative weights.
std::vector<Key> zipf_stream(std::size_t n, double s, std::size_t length, std::uint64_t seed) {
  std::vector<double> cdf(n);
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) cdf[i] = (sum += 1.0 / std::pow(static_cast<double>(i + 1), s));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, sum);
  std::vector<Key> out(length);
  for (auto& k : out) {
    const auto rank = static_cast<Key>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
    k = rank * 0x9E3779B97F4A7C15ULL + 12345;  // ranks scattered over the key space
  }
  return out;
}

void BM_Cache_ZipfHitRatio(benchmark::State& state) {
  static const std::vector<Key> stream = zipf_stream(1'000'000, 0.99, 2'000'000, 7);
  double hit_ratio = 0.0;
  double lru_ratio = 0.0;
  for (auto _ : state) {
    Cache cache(Cache::Config{.max_entries = capacity});
    MutexLru lru(capacity);
    std::uint64_t hits = 0;
    std::uint64_t lru_hits = 0;
    for (Key k : stream) {
      if (cache.try_get(k)) {
        ++hits;
      } else {
        (void)cache.insert(k, k);
      }
      if (lru.get(k)) {
        ++lru_hits;
      } else {
        lru.put(k, k);
      }
    }
    hit_ratio = static_cast<double>(hits) / static_cast<double>(stream.size());
    lru_ratio = static_cast<double>(lru_hits) / static_cast<double>(stream.size());
  }
  state.counters["hit_ratio"] = hit_ratio;
  state.counters["lru_hit_ratio"] = lru_ratio;
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(stream.size()));
}
BENCHMARK(BM_Cache_ZipfHitRatio)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
