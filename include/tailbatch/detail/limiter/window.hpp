// Machinery behind LimitWindow and the ConcurrencyLimiter's sample windows: the log-linear
// RTT buckets, and the sharded atomic accumulator that releasing threads add samples to.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <thread>

namespace tailbatch::detail {

// RTT buckets: one underflow bucket below 2^10 ns (about 1 us), then 8 linear sub-buckets per
// power of two up to 2^38 ns (about 275 s), then one overflow bucket. A bucket's midpoint is
// within 1/16 (6.25 %) of every value in it, which is plenty for steering a limit; exact min,
// max and mean are tracked beside the buckets.
inline constexpr int kRttSubBits = 3;
inline constexpr std::uint64_t kRttSubBuckets = std::uint64_t{1} << kRttSubBits;
inline constexpr int kRttMinExp = 10;
inline constexpr int kRttMaxExp = 37;
inline constexpr std::size_t kRttBuckets =
    2 + static_cast<std::size_t>(kRttMaxExp - kRttMinExp + 1) * kRttSubBuckets;

[[nodiscard]] constexpr std::size_t rtt_bucket(std::uint64_t ns) noexcept {
  if (ns < (std::uint64_t{1} << kRttMinExp)) return 0;
  const int e = static_cast<int>(std::bit_width(ns)) - 1;
  if (e > kRttMaxExp) return kRttBuckets - 1;
  const auto sub = (ns >> (e - kRttSubBits)) & (kRttSubBuckets - 1);
  return 1 + static_cast<std::size_t>(e - kRttMinExp) * kRttSubBuckets +
         static_cast<std::size_t>(sub);
}

// The value a bucket stands for: its midpoint (the edges for the two open-ended buckets).
[[nodiscard]] constexpr std::uint64_t rtt_bucket_value(std::size_t b) noexcept {
  if (b == 0) return std::uint64_t{1} << (kRttMinExp - 1);
  if (b >= kRttBuckets - 1) return std::uint64_t{1} << (kRttMaxExp + 1);
  const int e = kRttMinExp + static_cast<int>((b - 1) / kRttSubBuckets);
  const auto sub = static_cast<std::uint64_t>((b - 1) % kRttSubBuckets);
  const std::uint64_t width = std::uint64_t{1} << (e - kRttSubBits);
  return (kRttSubBuckets + sub) * width + width / 2;
}

static_assert(rtt_bucket(1023) == 0);
static_assert(rtt_bucket(1024) == 1);
static_assert(rtt_bucket(std::uint64_t{1} << 40) == kRttBuckets - 1);
static_assert(rtt_bucket(rtt_bucket_value(17)) == 17);

// Where a thread adds its samples. Threads are spread over the shards by a hash of their id,
// so that two releasing threads rarely write the same cache line.
inline constexpr std::size_t kWindowShards = 8;

[[nodiscard]] inline std::size_t window_shard_index() noexcept {
  const auto h =
      static_cast<std::uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  // Thread ids are often addresses a large power of two apart: mix before taking bits.
  return static_cast<std::size_t>((h * 0x9E3779B97F4A7C15ULL) >> 61) & (kWindowShards - 1);
}

// One shard of one window: counters that releasing threads update with relaxed atomics.
// Values are folded into a LimitWindow by the thread that closes the window.
struct alignas(64) WindowShard {
  std::atomic<std::uint32_t> count{0};
  std::atomic<std::uint32_t> drops{0};
  std::atomic<std::uint32_t> max_in_flight{0};
  std::atomic<std::uint64_t> sum_ns{0};
  std::atomic<std::uint64_t> min_ns{std::numeric_limits<std::uint64_t>::max()};
  std::atomic<std::uint64_t> max_ns{0};
  std::array<std::atomic<std::uint32_t>, kRttBuckets> buckets{};

  void add(std::uint64_t ns, std::uint32_t in_flight, bool dropped) noexcept {
    buckets[rtt_bucket(ns)].fetch_add(1, std::memory_order_relaxed);
    sum_ns.fetch_add(ns, std::memory_order_relaxed);
    if (dropped) drops.fetch_add(1, std::memory_order_relaxed);
    raise(max_in_flight, in_flight);
    raise(max_ns, ns);
    lower(min_ns, ns);
    // Last, so that a closer that sees the count also tends to see the rest.
    count.fetch_add(1, std::memory_order_release);
  }

  template <class T>
  static void raise(std::atomic<T>& a, T v) noexcept {
    T cur = a.load(std::memory_order_relaxed);
    while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }
  template <class T>
  static void lower(std::atomic<T>& a, T v) noexcept {
    T cur = a.load(std::memory_order_relaxed);
    while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }
};

// All shards of one window.
struct WindowShards {
  std::array<WindowShard, kWindowShards> shards{};

  // Samples added so far (a sum of relaxed reads: exact once writers are quiet).
  [[nodiscard]] std::uint64_t count_approx() const noexcept {
    std::uint64_t n = 0;
    for (const auto& s : shards) n += s.count.load(std::memory_order_relaxed);
    return n;
  }
};

}  // namespace tailbatch::detail
