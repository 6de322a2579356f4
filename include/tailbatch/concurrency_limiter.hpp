// ConcurrencyLimiter: caps how much work is in flight, and turns the rest away fast.
//
// Work holds a Permit while it runs. try_acquire() never blocks: it returns a permit or a
// rejection with a reason. acquire_for()/acquire_until() wait, bounded, in a FIFO queue (LIFO
// on request, which serves the freshest callers first under overload). The limit comes from
// a LimitAlgorithm (limit_algorithms.hpp): StaticLimit, AimdLimit or GradientLimit.
//
// Guarantees:
//   * In-flight work never exceeds the current limit at any admission: the limit and the
//     in-flight count live in one atomic word and a permit is taken by a compare-exchange
//     that checks both at once. When the limit shrinks below the work already in flight, no
//     permit is issued until in-flight falls below the new limit.
//   * Every permit is released exactly once: by success()/dropped()/ignore(), or by its
//     destructor (as "ignore"), also when the guarded work throws.
//   * The limit changes once per sample window, decided by the releasing thread that closes
//     the window; every other release only adds its sample to a per-thread-hashed shard with
//     relaxed atomics. Under StaticLimit nothing is timed and no window exists.
//
// The limiter owns no threads. It satisfies AdmissionPolicy (admission.hpp), so a Pipeline
// can use it as its admission stage.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <tailbatch/admission.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/detail/limiter/window.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/detail/time.hpp>
#include <tailbatch/limit_algorithms.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>
#include <type_traits>
#include <utility>
#include <vector>

namespace tailbatch {

// Which waiter of acquire_for()/acquire_until() a freed permit goes to.
enum class QueueOrder : std::uint8_t {
  fifo,  // the longest waiting (fair)
  lifo,  // the most recent: under overload the oldest waiters are the likeliest to have
         // given up already, so serving the newest keeps served latency low
};

// Limiter settings that do not belong to the limit algorithm.
struct ConcurrencyLimiterConfig {
  QueueOrder queue_order = QueueOrder::fifo;
  // At most this many callers wait in acquire_for()/acquire_until() at once; more are
  // rejected with RejectReason::queue_full. Zero: no waiting at all (those calls behave like
  // try_acquire()).
  std::uint32_t queue_capacity = 1024;
  // Metrics, registered at construction with metric_labels added to each; nullptr: none,
  // at no cost. The registry must outlive the limiter.
  //   tailbatch_limiter_limit            gauge    the limit in force
  //   tailbatch_limiter_max_limit        gauge    the largest limit the algorithm can set
  //   tailbatch_limiter_in_flight        gauge    permits held
  //   tailbatch_limiter_queued           gauge    callers waiting in acquire_for/until
  //   tailbatch_limiter_rejections_total counter  by reason: overloaded, queue_full,
  //                                               shutting_down
  //   tailbatch_limiter_window_rtt_seconds gauge  mean RTT of the last closed sample window
  //                                               (learning algorithms only)
  // Gauges are computed when the registry is read; only a rejection touches a counter, so
  // admitted work pays nothing for metrics.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
};
// The old name compiles, with a deprecation warning, until the next minor version (CHANGELOG.md).
using LimiterConfig [[deprecated("renamed ConcurrencyLimiterConfig")]] = ConcurrencyLimiterConfig;

// What a ConcurrencyLimiter has done and holds, read at one moment (stats()). The same
// shape as PipelineStats and ContinuousBatcherStats: counters indexed by RejectReason and
// read with count(). A snapshot: each field is read on its own with a relaxed load, so
// under concurrent use they may disagree by the calls in transit.
struct ConcurrencyLimiterStats {
  std::array<std::uint64_t, reject_reason_count> rejected_by_reason{};  // indexed by RejectReason
  std::uint32_t limit = 0;          // the limit in force (0 after shutdown())
  std::uint32_t max_limit = 0;      // the largest limit the algorithm can set
  std::uint32_t in_flight = 0;      // permits held
  std::uint32_t queued = 0;         // callers waiting in acquire_for()/acquire_until()
  std::uint64_t windows_closed = 0; // sample windows closed (0 for non-learning algorithms)
  std::chrono::nanoseconds retry_after{0};  // retry_after_hint() at the time of reading
  bool shut_down = false;           // whether shutdown() was called

  // Rejections so far with this reason. Never blocks.
  [[nodiscard]] std::uint64_t count(RejectReason r) const noexcept {
    return rejected_by_reason[static_cast<std::size_t>(r)];
  }
  // Rejections with any reason. Never blocks.
  [[nodiscard]] std::uint64_t rejected() const noexcept {
    return std::accumulate(rejected_by_reason.begin(), rejected_by_reason.end(), std::uint64_t{0});
  }
};
// The old name compiles, with a deprecation warning, until the next minor version (CHANGELOG.md).
using LimiterStats [[deprecated("renamed ConcurrencyLimiterStats")]] = ConcurrencyLimiterStats;

// Caps in-flight work at a limit chosen by Algorithm, reading time from C.
//
// Thread-safety: every member is thread-safe. Exception guarantees: the constructor throws
// what the algorithm's or its own validation throws (std::invalid_argument naming the field)
// and std::bad_alloc; every other member but inspect_algorithm() (which passes on what f
// throws) is noexcept. Of an Acquisition, value() throws BadOutcomeAccess on a rejection and
// error()/to_outcome() may throw std::bad_alloc. Blocking: only acquire_for(),
// acquire_until() and shutdown() block (on the waiter mutex, and acquire_* until a permit or
// the deadline). Allocation: once, at construction, for the sample windows of learning
// algorithms (about 8 KiB) and, with ConcurrencyLimiterConfig::metrics, to register metrics; never
// afterwards (Acquisition::error() and to_outcome() allocate a message when asked).
//
// Lifetime: the limiter must outlive its permits. Not copyable, not movable (permits point
// at it).
template <LimitAlgorithm Algorithm = StaticLimit, Clock C = SteadyClock>
class ConcurrencyLimiter {
  struct NoTime {};
  struct Waiter;
  struct Learning;

 public:
  using algorithm_type = Algorithm;
  using clock_type = C;
  using time_point = typename C::time_point;
  // Whether permits are timed and sample windows kept (false for StaticLimit).
  static constexpr bool learns = Algorithm::learns;

  // The right to have one unit of work in flight. Move-only RAII: released exactly once, by
  // success(), dropped(), ignore() or the destructor (which reports "ignore": no sample, no
  // signal). An empty (default-constructed or moved-from) permit does nothing.
  // Thread-safety: a permit is owned by one thread at a time; releasing it is thread-safe
  // against everything else on the limiter.
  class Permit {
   public:
    Permit() noexcept = default;
    Permit(Permit&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)), word_(other.word_), start_(other.start_) {}
    // Releases the held permit (as "ignore") before taking over other's. Never throws.
    Permit& operator=(Permit&& other) noexcept {
      if (this != &other) {
        ignore();
        owner_ = std::exchange(other.owner_, nullptr);
        word_ = other.word_;
        start_ = other.start_;
      }
      return *this;
    }
    Permit(const Permit&) = delete;
    Permit& operator=(const Permit&) = delete;
    // Releases as "ignore" if still held (also during unwinding). Never throws.
    ~Permit() { ignore(); }

    // Whether this permit is still held.
    [[nodiscard]] bool valid() const noexcept { return owner_ != nullptr; }
    explicit operator bool() const noexcept { return valid(); }

    // Releases the permit reporting success; learning limits take the RTT from admission to
    // now (or the rtt given). Never blocks on anything but, once per window, the limit
    // update; never allocates; no-op on an empty permit. Thread-safe.
    void success() noexcept { finish(Kind::success, std::nullopt); }
    void success(std::chrono::nanoseconds rtt) noexcept { finish(Kind::success, rtt); }
    // Releases the permit reporting a drop: the work timed out, was shed or missed its
    // deadline: a sign of overload that learning limits back off from. Like success().
    void dropped() noexcept { finish(Kind::dropped, std::nullopt); }
    void dropped(std::chrono::nanoseconds rtt) noexcept { finish(Kind::dropped, rtt); }
    // Releases the permit without a sample (the work's time says nothing about load: it was
    // cancelled, or failed for its own reasons). Never blocks, never allocates. Thread-safe.
    void ignore() noexcept { finish(Kind::ignore, std::nullopt); }

    // The in-flight count right after this permit was issued (itself included), and the
    // limit in force at that instant; admitted_in_flight() <= admitted_limit() always.
    [[nodiscard]] std::uint32_t admitted_in_flight() const noexcept {
      return static_cast<std::uint32_t>(word_ & kInFlightMask);
    }
    [[nodiscard]] std::uint32_t admitted_limit() const noexcept {
      return static_cast<std::uint32_t>(word_ >> 32);
    }

   private:
    friend class ConcurrencyLimiter;
    enum class Kind : std::uint8_t { success, dropped, ignore };
    using StartTime = std::conditional_t<learns, time_point, NoTime>;

    Permit(ConcurrencyLimiter* owner, std::uint64_t word, StartTime start) noexcept
        : owner_(owner), word_(word), start_(start) {}

    void finish(Kind kind, std::optional<std::chrono::nanoseconds> rtt) noexcept {
      if (owner_ == nullptr) return;
      std::exchange(owner_, nullptr)->finish(*this, kind, rtt);
    }

    ConcurrencyLimiter* owner_ = nullptr;
    std::uint64_t word_ = 0;
    [[no_unique_address]] StartTime start_{};
  };

  // AdmissionPolicy's ticket: the permit itself.
  using Ticket = Permit;

  // What try_acquire() and acquire_for()/acquire_until() return: a permit, or why there is
  // none. It reads like Outcome<Permit> (ok(), status(), reason(), message(),
  // retry_after(), value(), error()) but holds no string, so that the hot path pays for
  // nothing it does not use; to_outcome() converts. Not thread-safe: owned by its caller.
  class [[nodiscard]] Acquisition {
   public:
    // Whether a permit was issued (stays true after the permit is released).
    [[nodiscard]] bool ok() const noexcept { return reason_ == RejectReason::none; }
    explicit operator bool() const noexcept { return ok(); }
    // Status::ok, or Status::rejected.
    [[nodiscard]] Status status() const noexcept { return ok() ? Status::ok : Status::rejected; }
    // RejectReason::none when ok(); else overloaded, queue_full or shutting_down.
    [[nodiscard]] RejectReason reason() const noexcept { return reason_; }
    // A fixed description of the rejection; empty when ok(). Never allocates.
    [[nodiscard]] std::string_view message() const noexcept {
      // By RejectReason: the limiter turns away only with queue_full, overloaded and
      // shutting_down.
      return detail::enum_name<reject_reason_count>(
          reason_,
          {"", "tailbatch: too many callers are waiting for a permit",
           "tailbatch: the concurrency limit is reached",
           "tailbatch: the concurrency limiter is shut down", "", "", ""},
          {});
    }
    // When rejected: how long to wait before retrying (see retry_after_hint()); else zero.
    [[nodiscard]] std::chrono::nanoseconds retry_after() const noexcept { return retry_after_; }
    // The permit. Throws BadOutcomeAccess (carrying error()) if !ok().
    [[nodiscard]] Permit& value() & {
      check();
      return permit_;
    }
    [[nodiscard]] Permit&& value() && {
      check();
      return std::move(permit_);
    }
    // The rejection as an Error. Allocates the message. Precondition: !ok().
    [[nodiscard]] Error error() const {
      return Error{Status::rejected, reason_, std::string(message()), retry_after_};
    }
    // The same result as an Outcome<Permit> (moving the permit). Allocates on rejection.
    [[nodiscard]] Outcome<Permit> to_outcome() && {
      if (ok()) return Outcome<Permit>(std::move(permit_));
      return Outcome<Permit>(error());
    }

   private:
    friend class ConcurrencyLimiter;
    explicit Acquisition(Permit permit) noexcept : permit_(std::move(permit)) {}
    Acquisition(RejectReason reason, std::chrono::nanoseconds retry_after) noexcept
        : reason_(reason), retry_after_(retry_after) {}
    void check() const {
      if (!ok()) detail::throw_or_abort<BadOutcomeAccess>("value() called on a rejection", error());
    }

    Permit permit_;
    RejectReason reason_ = RejectReason::none;
    std::chrono::nanoseconds retry_after_{0};
  };

  // A limiter starting at algorithm.limit(). Allocates the sample windows when the algorithm
  // learns, and registers metrics when config.metrics is set. Throws std::bad_alloc, and
  // std::invalid_argument for metric labels the registry refuses.
  explicit ConcurrencyLimiter(Algorithm algorithm, ConcurrencyLimiterConfig config = {}, C clock = C{})
      : config_(config), clock_(std::move(clock)), algorithm_(std::move(algorithm)) {
    max_limit_ = clamp_limit(algorithm_.max_limit());
    word_.store(pack(clamp_limit(algorithm_.limit()), 0), std::memory_order_relaxed);
    if constexpr (learns) {
      learning_ = std::make_unique<Learning>();
      open_window(clock_.now());
    }
    if (config_.metrics != nullptr) register_metrics(*config_.metrics);
  }

  ConcurrencyLimiter(const ConcurrencyLimiter&) = delete;
  ConcurrencyLimiter& operator=(const ConcurrencyLimiter&) = delete;

  // Shuts the limiter down (waking any waiters). Precondition: no permit is outstanding.
  ~ConcurrencyLimiter() {
    shutdown();
    assert(in_flight_approx() == 0 && "ConcurrencyLimiter destroyed with permits outstanding");
  }

  // A permit if in-flight work is below the limit and no caller is waiting in
  // acquire_for()/acquire_until() (waiters go first); else Status::rejected with
  // RejectReason::overloaded (shutting_down after shutdown()), and a retry_after hint when the
  // algorithm learns. Never blocks, never allocates. Thread-safe.
  [[nodiscard]] Acquisition try_acquire() noexcept {
    std::uint64_t word = 0;
    if (try_take_slot(word)) return Acquisition(make_permit(word));
    return reject(current_reason());
  }

  // Like try_acquire(), but when no permit is free, waits in the queue until one is handed
  // over or the timeout passes (then RejectReason::overloaded), the queue is full
  // (RejectReason::queue_full, at once) or the limiter is shut down (shutting_down). Blocks up
  // to the timeout; never allocates. Thread-safe.
  template <class Rep, class Period>
  [[nodiscard]] Acquisition acquire_for(std::chrono::duration<Rep, Period> timeout) noexcept {
    return acquire_until(detail::saturating_add(clock_.now(), timeout));
  }

  // acquire_for() with an absolute deadline on the limiter's clock. Thread-safe.
  [[nodiscard]] Acquisition acquire_until(time_point deadline) noexcept {
    std::uint64_t word = 0;
    if (try_take_slot(word)) return Acquisition(make_permit(word));
    if (closed_.load(std::memory_order_acquire)) return reject(RejectReason::shutting_down);
    if (config_.queue_capacity == 0 || clock_.now() >= deadline)
      return reject(RejectReason::overloaded);

    std::unique_lock lock(mu_);
    if (closed_.load(std::memory_order_acquire)) {
      lock.unlock();
      return reject(RejectReason::shutting_down);
    }
    if (queued_count_ >= config_.queue_capacity) {
      lock.unlock();
      return reject(RejectReason::queue_full);
    }
    Waiter self;
    // Raises the waiters flag in the word before retrying: a release either comes after it
    // in the word's modification order (and sees the flag, so it grants) or before it (and
    // the retry below sees its slot).
    link_back(&self);
    grant_locked();
    while (!self.granted && !self.closed) {
      const auto now = clock_.now();
      if (now >= deadline) break;
      wait_step(lock, self.cv, now, deadline);
    }
    if (self.granted) {
      lock.unlock();
      return Acquisition(make_permit(self.word));
    }
    if (!self.closed) unlink(&self);
    const bool closed = self.closed;
    lock.unlock();
    return reject(closed ? RejectReason::shutting_down : RejectReason::overloaded);
  }

  // AdmissionPolicy: try_acquire() as an optional (the Pipeline rejects with
  // RejectReason::overloaded on nullopt). Never blocks, never allocates. Thread-safe.
  [[nodiscard]] std::optional<Permit> try_admit() noexcept {
    std::uint64_t word = 0;
    if (try_take_slot(word)) return std::optional<Permit>(make_permit(word));
    count_rejection(current_reason());
    return std::nullopt;
  }

  // AdmissionPolicy: releases a ticket with the request's final status and end-to-end
  // latency, which becomes the RTT sample:
  //   ok                          -> success (sample = latency)
  //   rejected, deadline_exceeded -> dropped (sample = latency; an overload signal: the
  //                                  request was shed or waited past its deadline after
  //                                  admission)
  //   cancelled, failed           -> ignore (the caller gave up, or the model failed for its
  //                                  own reasons: neither says anything about load)
  // Never allocates. Thread-safe.
  void release(Permit&& permit, Status status, std::chrono::nanoseconds latency) noexcept {
    Permit held(std::move(permit));
    switch (status) {
      case Status::ok:
        held.success(latency);
        break;
      case Status::rejected:
      case Status::deadline_exceeded:
        held.dropped(latency);
        break;
      case Status::cancelled:
      case Status::failed:
        held.ignore();
        break;
    }
  }

  // Stops issuing permits: every waiter and every later acquire is rejected with
  // RejectReason::shutting_down; outstanding permits release as usual. Idempotent. Blocks
  // briefly on the limiter's mutexes. Thread-safe.
  void shutdown() noexcept {
    {
      std::lock_guard update(update_mu_);
      closed_.store(true, std::memory_order_release);
      set_limit_word(0);
    }
    std::lock_guard lock(mu_);
    while (head_ != nullptr) {
      Waiter* w = head_;
      unlink(w);
      w->closed = true;
      w->cv.notify_one();
    }
  }

  // Whether shutdown() was called. Thread-safe.
  [[nodiscard]] bool is_shut_down() const noexcept { return closed_.load(std::memory_order_acquire); }

  // The limit in force now (0 after shutdown()). A snapshot. Thread-safe.
  [[nodiscard]] std::uint32_t limit() const noexcept {
    return static_cast<std::uint32_t>(word_.load(std::memory_order_relaxed) >> 32);
  }
  // The largest limit the algorithm can ever set: a Pipeline checks it against
  // max_batch x lanes. Thread-safe.
  [[nodiscard]] std::uint32_t max_limit() const noexcept { return max_limit_; }
  // Permits currently held. Racy by nature. Thread-safe.
  [[nodiscard]] std::uint32_t in_flight_approx() const noexcept {
    return static_cast<std::uint32_t>(word_.load(std::memory_order_relaxed) & kInFlightMask);
  }
  // Callers waiting in acquire_for()/acquire_until(). Racy by nature. Thread-safe.
  [[nodiscard]] std::uint32_t queued_approx() const noexcept {
    return queued_.load(std::memory_order_relaxed);
  }
  // Rejections so far with this reason (try_admit() included). Thread-safe.
  [[nodiscard]] std::uint64_t rejected_count(RejectReason reason) const noexcept {
    return rejections_[static_cast<std::size_t>(reason)].load(std::memory_order_relaxed);
  }
  // Sample windows closed so far (always 0 for non-learning algorithms). Thread-safe.
  [[nodiscard]] std::uint64_t windows_closed() const noexcept {
    return windows_closed_.load(std::memory_order_relaxed);
  }
  // Everything above in one snapshot (ConcurrencyLimiterStats). Never blocks, never allocates.
  // Thread-safe.
  [[nodiscard]] ConcurrencyLimiterStats stats() const noexcept {
    ConcurrencyLimiterStats st;
    for (std::size_t i = 0; i < st.rejected_by_reason.size(); ++i) {
      st.rejected_by_reason[i] = rejections_[i].load(std::memory_order_relaxed);
    }
    const std::uint64_t word = word_.load(std::memory_order_relaxed);
    st.limit = static_cast<std::uint32_t>(word >> 32);
    st.in_flight = static_cast<std::uint32_t>(word & kInFlightMask);
    st.max_limit = max_limit_;
    st.queued = queued_approx();
    st.windows_closed = windows_closed();
    st.retry_after = retry_after_hint();
    st.shut_down = is_shut_down();
    return st;
  }
  // How long a rejected caller should wait before retrying: the last window's mean RTT
  // divided by the limit (the mean time between freed permits). Zero when unknown.
  // Thread-safe.
  [[nodiscard]] std::chrono::nanoseconds retry_after_hint() const noexcept {
    return std::chrono::nanoseconds(retry_after_ns_.load(std::memory_order_relaxed));
  }
  // The configuration it was built with. Thread-safe.
  [[nodiscard]] const ConcurrencyLimiterConfig& config() const noexcept { return config_; }
  [[nodiscard]] const C& clock() const noexcept { return clock_; }

  // Calls f(const Algorithm&) while no window can close, and returns its result: a
  // consistent look at the algorithm's state (GradientLimit::min_rtt(), probing(), ...).
  // Blocks window updates for as long as f runs. Thread-safe.
  template <class F>
  decltype(auto) inspect_algorithm(F&& f) const {
    std::lock_guard update(update_mu_);
    return std::forward<F>(f)(std::as_const(algorithm_));
  }

 private:
  // The word: limit in the high 32 bits; in the low 32, the in-flight count (bits 0-30) and
  // the "waiters queued" flag (bit 31). The flag makes the in-flight half look larger than
  // any limit, so the fast path's single compare-exchange fails while anyone waits (waiters
  // go first), and a release learns from its own decrement whether to hand its slot over.
  static constexpr std::uint64_t kInFlightMask = 0x7FFFFFFFULL;
  static constexpr std::uint64_t kWaitersFlag = 0x80000000ULL;
  static constexpr std::uint64_t kLowHalf = 0xFFFFFFFFULL;

  struct Waiter {
    std::condition_variable cv;
    Waiter* prev = nullptr;
    Waiter* next = nullptr;
    std::uint64_t word = 0;
    bool granted = false;
    bool closed = false;
  };

  struct Learning {
    // The open window: releasers add to it, the closer drains it.
    detail::WindowShards shards{};
    // Clock ticks: the earliest time the open window may close; and the admission time a
    // permit needs for its sample to count (WindowSpec::fresh_only).
    std::atomic<std::int64_t> due{0};
    std::atomic<std::int64_t> fresh_after{std::numeric_limits<std::int64_t>::min()};
    // Guarded by update_mu_.
    time_point window_open{};
    WindowSpec spec{};
  };

  static constexpr std::uint64_t pack(std::uint32_t limit, std::uint32_t in_flight) noexcept {
    return (std::uint64_t{limit} << 32) | in_flight;
  }
  static std::uint32_t clamp_limit(std::uint32_t limit) noexcept {
    return std::min(limit, kMaxConcurrencyLimit);
  }


  // Takes one slot if in-flight < limit (and, unless for_waiter, nobody waits), atomically
  // against limit changes. On success `out` is the word after the increment.
  bool try_take_slot(std::uint64_t& out, bool for_waiter = false) noexcept {
    const std::uint64_t mask = for_waiter ? kInFlightMask : kLowHalf;
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    for (;;) {
      if ((w & mask) >= (w >> 32)) return false;
      if (word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
        out = w + 1;
        return true;
      }
    }
  }

  Permit make_permit(std::uint64_t word) noexcept {
    if constexpr (learns) {
      return Permit(this, word, clock_.now());
    } else {
      return Permit(this, word, NoTime{});
    }
  }

  RejectReason current_reason() const noexcept {
    return closed_.load(std::memory_order_acquire) ? RejectReason::shutting_down
                                                   : RejectReason::overloaded;
  }
  void count_rejection(RejectReason reason) noexcept {
    const auto i = static_cast<std::size_t>(reason);
    rejections_[i].fetch_add(1, std::memory_order_relaxed);
    if (rejection_counters_[i] != nullptr) rejection_counters_[i]->inc();
  }

  void register_metrics(MetricsRegistry& r) {
    const Labels& base = config_.metric_labels;
    for (auto reason :
         {RejectReason::overloaded, RejectReason::queue_full, RejectReason::shutting_down}) {
      rejection_counters_[static_cast<std::size_t>(reason)] =
          &r.counter("tailbatch_limiter_rejections_total",
                     "Acquisitions the concurrency limiter refused, by reason",
                     join_labels(base, {{"reason", std::string(to_string(reason))}}));
    }
    gauges_.push_back(r.gauge_callback("tailbatch_limiter_limit", "The concurrency limit in force",
                                       base, [this] { return static_cast<double>(limit()); }));
    gauges_.push_back(r.gauge_callback("tailbatch_limiter_max_limit",
                                       "The largest concurrency limit the algorithm can set", base,
                                       [this] { return static_cast<double>(max_limit()); }));
    gauges_.push_back(r.gauge_callback("tailbatch_limiter_in_flight",
                                       "Permits held (work in flight)", base,
                                       [this] { return static_cast<double>(in_flight_approx()); }));
    gauges_.push_back(r.gauge_callback(
        "tailbatch_limiter_queued", "Callers waiting for a permit in acquire_for/acquire_until",
        base, [this] { return static_cast<double>(queued_approx()); }));
    if constexpr (learns) {
      gauges_.push_back(r.gauge_callback(
          "tailbatch_limiter_window_rtt_seconds",
          "Mean round-trip time of the last closed sample window", base, [this] {
            return static_cast<double>(last_window_rtt_ns_.load(std::memory_order_relaxed)) * 1e-9;
          }));
    }
  }
  Acquisition reject(RejectReason reason) noexcept {
    count_rejection(reason);
    return Acquisition(reason, retry_after_hint());
  }

  void finish(Permit& p, typename Permit::Kind kind,
              std::optional<std::chrono::nanoseconds> rtt) noexcept {
    if constexpr (learns) {
      if (kind != Permit::Kind::ignore) {
        const auto now = clock_.now();
        Learning& l = *learning_;
        if (p.start_.time_since_epoch().count() >= l.fresh_after.load(std::memory_order_relaxed)) {
          const auto sample = rtt ? *rtt : std::chrono::nanoseconds(now - p.start_);
          const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(sample.count(), 0));
          l.shards.shards[detail::window_shard_index()].add(ns, p.admitted_in_flight(),
                                                            kind == Permit::Kind::dropped);
        }
        release_slot();
        if (now.time_since_epoch().count() >= l.due.load(std::memory_order_relaxed))
          maybe_close_window(now);
        return;
      }
    }
    (void)p;
    (void)kind;
    (void)rtt;
    release_slot();
  }

  [[gnu::always_inline]] void release_slot() noexcept {
    if (word_.fetch_sub(1, std::memory_order_acq_rel) & kWaitersFlag) [[unlikely]]
      grant_waiters();
  }

  // Out of line, so that release_slot() stays a single inlined instruction and a test.
  [[gnu::noinline]] void grant_waiters() noexcept {
    std::lock_guard lock(mu_);
    grant_locked();
  }

  // Hands free slots to waiters, in queue order. Requires mu_.
  void grant_locked() noexcept {
    while (head_ != nullptr) {
      std::uint64_t word = 0;
      if (!try_take_slot(word, true)) return;
      Waiter* w = config_.queue_order == QueueOrder::fifo ? head_ : tail_;
      unlink(w);
      w->granted = true;
      w->word = word;
      w->cv.notify_one();
    }
  }

  void link_back(Waiter* w) noexcept {
    w->prev = tail_;
    w->next = nullptr;
    if (tail_ != nullptr)
      tail_->next = w;
    else
      head_ = w;
    tail_ = w;
    ++queued_count_;
    queued_.store(queued_count_, std::memory_order_relaxed);
    if (head_ == w) word_.fetch_or(kWaitersFlag, std::memory_order_acq_rel);
  }
  void unlink(Waiter* w) noexcept {
    if (w->prev != nullptr)
      w->prev->next = w->next;
    else
      head_ = w->next;
    if (w->next != nullptr)
      w->next->prev = w->prev;
    else
      tail_ = w->prev;
    w->prev = w->next = nullptr;
    --queued_count_;
    queued_.store(queued_count_, std::memory_order_relaxed);
    if (head_ == nullptr) word_.fetch_and(~kWaitersFlag, std::memory_order_acq_rel);
  }

  void wait_step(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, time_point now,
                 time_point deadline) {
    if constexpr (std::is_same_v<C, SteadyClock>) {
      (void)now;
      cv.wait_until(lock, deadline);
    } else {
      // Another clock (ManualClock in tests) may jump: look at it again at least every
      // millisecond of real time.
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
      cv.wait_for(lock, std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(1)));
    }
  }

  // Replaces the limit half of the word; returns the word before. Requires update_mu_.
  std::uint64_t set_limit_word(std::uint32_t limit) noexcept {
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    while (!word_.compare_exchange_weak(w, pack(limit, static_cast<std::uint32_t>(w & kLowHalf)),
                                        std::memory_order_acq_rel, std::memory_order_relaxed)) {
    }
    return w;
  }

  // Opens the next window at `now` with the algorithm's spec. Requires update_mu_ (or the
  // constructor).
  void open_window(time_point now) noexcept {
    Learning& l = *learning_;
    l.spec = algorithm_.next_window();
    l.window_open = now;
    l.fresh_after.store(l.spec.fresh_only ? now.time_since_epoch().count()
                                          : std::numeric_limits<std::int64_t>::min(),
                        std::memory_order_relaxed);
    l.due.store(detail::saturating_add(now, l.spec.min_duration).time_since_epoch().count(),
                std::memory_order_relaxed);
  }

  void maybe_close_window(time_point now) noexcept {
    std::unique_lock update(update_mu_, std::try_to_lock);
    if (!update.owns_lock()) return;  // another thread is closing it
    Learning& l = *learning_;
    if (now.time_since_epoch().count() < l.due.load(std::memory_order_relaxed)) return;
    // Too few samples: the window stays open and the next release looks again (the sample
    // rate is low then, so the extra look costs little).
    if (l.shards.count_approx() < l.spec.min_samples) return;
    // Draining exchanges every counter with zero while other threads may still add: a sample
    // that races the close lands in this window or the next, never nowhere.
    LimitWindow window(l.window_open, now, limit());
    for (auto& shard : l.shards.shards) detail::LimitWindowAccess::drain(window, shard);
    const std::uint32_t next = clamp_limit(algorithm_.on_window(window));
    open_window(now);
    if (l.spec.fresh_only) {
      // Samples added between the drain and fresh_after's update came from work admitted
      // before this window opened: discard them.
      LimitWindow stale;
      for (auto& shard : l.shards.shards) detail::LimitWindowAccess::drain(stale, shard);
    }
    windows_closed_.fetch_add(1, std::memory_order_relaxed);
    if (window.count() > 0) {
      const auto mean = window.mean_rtt().count();
      last_window_rtt_ns_.store(mean, std::memory_order_relaxed);
      retry_after_ns_.store(mean / std::max<std::int64_t>(next, 1), std::memory_order_relaxed);
    }
    if (closed_.load(std::memory_order_acquire)) return;
    const std::uint64_t before = set_limit_word(next);
    // A waiter that queues after this update retries against the new limit itself.
    if (next > (before >> 32) && (before & kWaitersFlag) != 0) grant_waiters();
  }

  ConcurrencyLimiterConfig config_;
  [[no_unique_address]] C clock_;
  std::uint32_t max_limit_ = 0;

  // Hot: limit (high 32 bits) and in-flight (low 32 bits).
  alignas(64) std::atomic<std::uint64_t> word_{0};
  alignas(64) std::atomic<bool> closed_{false};
  // Mirrors queued_count_ for queued_approx(); written under mu_.
  std::atomic<std::uint32_t> queued_{0};

  alignas(64) std::array<std::atomic<std::uint64_t>, reject_reason_count> rejections_{};
  std::atomic<std::uint64_t> windows_closed_{0};
  std::atomic<std::int64_t> retry_after_ns_{0};
  std::atomic<std::int64_t> last_window_rtt_ns_{0};
  std::array<Counter*, reject_reason_count> rejection_counters_{};

  // The waiter queue: an intrusive list of stack-allocated waiters.
  std::mutex mu_;
  Waiter* head_ = nullptr;
  Waiter* tail_ = nullptr;
  std::uint32_t queued_count_ = 0;

  // Serialises window closes, limit updates and shutdown().
  mutable std::mutex update_mu_;
  Algorithm algorithm_;
  std::unique_ptr<Learning> learning_;

  // Last: unregistered before anything their callbacks read is destroyed.
  std::vector<CallbackRegistration> gauges_;
};

static_assert(AdmissionPolicy<ConcurrencyLimiter<>>);

}  // namespace tailbatch
