// The Pipeline: the request path users embed around their own model call.
//
//   submit(req, {deadline, timeout, arrival, priority, cancel})
//     -> admission (AdmissionPolicy: AdmitAll, ConcurrencyLimiter)
//     -> bounded queue (three priority lanes; EDF or arrival order; length buckets)
//     -> batch policy decides "close now?" (FixedWindow, PreferredSizes, TokenBudget,
//        DeadlineAware, or your own BatchPolicy)
//     -> a lane is leased for the formed batch (HostLanes, or the CUDA StreamPool), and
//        deadlines are checked once more against the clock at that moment
//     -> model(span<const Req>, span<Resp>, Lane&)
//     -> each request's completion (future or callback), timed into the metrics.
//
// Every submitted request completes exactly once: ok, rejected (queue_full with a
// retry-after hint, overloaded, shutting_down, too_large), deadline_exceeded (a deadline
// is a latest start: a request is never started after it), cancelled, or failed (the
// model threw; the worker lives on).
//
// Threads. Config::workers chooses them, as for the ContinuousBatcher: unset, the default
// for the clock (one per lane slot with SteadyClock, none with any other); 0, none; n, n.
// The Pipeline owns its worker threads and nothing else starts any: the workers take
// turns leading batch formation (the leader sleeps until the policy closes a batch),
// lease a lane slot for the batch they formed (never while waiting for work), run it and
// deliver its completions; each sets its timer slack to 1 ns on Linux. Submitters append
// to per-thread submit shards and never wait for the leader. With no workers the caller
// steps it with poll(), in the calling thread. See docs/pipeline.md.
//
// A request's walk, one part each (detail/ unless named):
//   request_intake.hpp       SubmitOptions -> arrival, deadline, level, or a refusal;
//   pipeline/submit_shards   where it is queued (per-thread shards, the queue's places),
//     pipeline/entry         as what (request, completion, deadline, ticket, cost),
//     pipeline/cycle_stamp   with which arrival stamp;
//   pipeline/batch_former    where a batch is formed (queue_staging: the staged queue,
//                            the purge of the dead, the policy's decision);
//   pipeline/batch           the formed batch, checked again as its lane starts it;
//   outcome_ledger.hpp       where its life ends: counted, its admission released, its
//                            latency recorded, its completion (pipeline/completion)
//                            delivered, exactly once; the load and the service rate.
// Beside them: pipeline/leader_signal (the leader's sleep), pipeline/metrics (what is
// exported), pipeline/validate (the constructor's checks); pipeline_config.hpp holds the
// public types. This file composes them: the public API, the leader's turn (ingest,
// purge, decide, lease a lane, or sleep) and execution.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <tailbatch/detail/time.hpp>
#include <tailbatch/admission.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/detail/pipeline/cycle_stamp.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/pipeline/leader_signal.hpp>
#include <tailbatch/detail/pipeline/batch.hpp>
#include <tailbatch/detail/pipeline/completion.hpp>
#include <tailbatch/detail/pipeline/entry.hpp>
#include <tailbatch/detail/pipeline/metrics.hpp>
#include <tailbatch/detail/pipeline/submit_shards.hpp>
#include <tailbatch/detail/pipeline/validate.hpp>
#include <tailbatch/detail/pipeline/batch_former.hpp>
#include <tailbatch/detail/request_intake.hpp>
#include <tailbatch/detail/tenant_quotas.hpp>
#include <tailbatch/detail/outcome_ledger.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/littles_law.hpp>
#include <tailbatch/load.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/pipeline_config.hpp>
#include <tailbatch/submit_options.hpp>

namespace tailbatch {

// The configuration, statistics and poll result: pipeline_config.hpp. Per-request
// options: SubmitOptions (submit_options.hpp), shared with the ContinuousBatcher. The
// load (load(), load_between(), check_littles_law()): LoadReading and LoadWindow
// (load.hpp), the shape every front door shares.

// A dynamic batcher around a model call.
//
//   Req, Resp   the request and response types; Req move-constructible, Resp
//               default-constructible and movable (the model fills a span of them).
//   Policy      when a batch closes (BatchPolicy).
//   Lanes       where batches run (LaneBackend): HostLanes, or the CUDA StreamPool.
//   Admission   who is let in (AdmissionPolicy): AdmitAll, or a ConcurrencyLimiter.
//   C           the clock: SteadyClock (worker threads by default), ManualClock (stepped by poll()).
//
// The model is called as model(span<const Req> requests, span<Resp> responses, Lane&),
// responses pre-filled with Resp{}, one batch at a time per lane slot; it must write
// responses[i] for requests[i]. If it throws, every request of the batch completes with
// Status::failed and the exception's what(); the worker carries on.
//
// Thread-safety: submit(), stats(), the *_approx() observers, occupancy(),
// check_littles_law() and shutdown() may be called from any thread at once. poll() may be called from several threads (the
// calls take turns). The model and the completion callbacks must not call shutdown(),
// poll() or the destructor of their own Pipeline.
//
// Exceptions: the constructor throws std::invalid_argument naming a bad field,
// std::bad_alloc and std::system_error (a thread could not start). submit() with a
// callback never throws; submit() returning a future throws only std::bad_alloc (for the
// future's shared state). Nothing a model or callback throws leaves the Pipeline. Under
// -fno-exceptions the Pipeline works the same; bad configuration then prints its message
// and aborts (detail/throw.hpp).
template <class Req, class Resp, BatchPolicy Policy = FixedWindow, LaneBackend Lanes = HostLanes,
          AdmissionPolicy Admission = AdmitAll, Clock C = SteadyClock>
  requires std::move_constructible<Req> && std::default_initializable<Resp> && std::movable<Resp>
class Pipeline {
 public:
  using Request = Req;
  using Response = Resp;
  using Lane = typename Lanes::Lane;
  using Model = std::function<void(std::span<const Req>, std::span<Resp>, Lane&)>;
  using Config = PipelineConfig<Req>;
  using time_point = typename C::time_point;

  // A Pipeline that owns default-constructed lanes (HostLanes: one lane, one slot) and a
  // default-constructed admission policy. Starts the workers (see Config::workers).
  Pipeline(Model model, Policy policy, Config config = {}, C clock = C{})
    requires std::default_initializable<Lanes> && std::default_initializable<Admission>
      : Pipeline(std::move(model), std::move(policy), std::move(config), std::make_unique<Lanes>(), nullptr,
                 std::make_unique<Admission>(), nullptr, std::move(clock)) {}

  // A Pipeline running on the caller's lanes (which must outlive it) with a
  // default-constructed admission policy.
  Pipeline(Model model, Policy policy, Config config, Lanes& lanes, C clock = C{})
    requires std::default_initializable<Admission>
      : Pipeline(std::move(model), std::move(policy), std::move(config), nullptr, &lanes,
                 std::make_unique<Admission>(), nullptr, std::move(clock)) {}

  // A Pipeline running on the caller's lanes behind the caller's admission policy (a
  // ConcurrencyLimiter); both must outlive it.
  Pipeline(Model model, Policy policy, Config config, Lanes& lanes, Admission& admission, C clock = C{})
      : Pipeline(std::move(model), std::move(policy), std::move(config), nullptr, &lanes, nullptr, &admission,
                 std::move(clock)) {}

  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Shuts down (see shutdown()): never leaves a request without its completion. Blocks
  // for at most the drain timeout plus the model calls in progress.
  ~Pipeline() { shutdown(); }

  // Queues req; `on_complete(Outcome<Resp>&&)` is called exactly once with its outcome.
  //
  // Where the callback runs: in this thread, before submit returns, when the request is
  // turned away at once (rejected, cancelled or deadline already passed); otherwise on a
  // worker thread (or in poll()'s caller). It should be quick and should not throw: an
  // exception it throws is caught, counted (stats().callback_exceptions, metric
  // tailbatch_pipeline_callback_exceptions_total) and dropped, and affects nothing else.
  // A callable of up to 24 bytes (pointer-aligned, nothrow-movable) is stored without allocating;
  // a larger one is allocated once. A cancellable token allocates a small record.
  // Never blocks beyond a short internal lock; never throws. Thread-safe.
  template <class F>
    requires std::is_invocable_v<std::decay_t<F>&, Outcome<Resp>&&>
  void submit(Req req, SubmitOptions options, F&& on_complete) noexcept {
    detail::Completion<Resp> done;
    // Only allocation can fail here, before the callable was touched.
    if (detail::call_guarded([&] { done = detail::Completion<Resp>(std::forward<F>(on_complete)); },
                             [](const char*) {})) {
      count_inline(Status::failed, RejectReason::none);
      invoke_user(on_complete, Outcome<Resp>(Error{Status::failed, RejectReason::none,
                                                   "tailbatch: out of memory queueing the request", {}}));
      return;
    }
    enqueue(std::move(req), options, std::move(done));
  }

  // As above, with default options. Never throws. Thread-safe.
  template <class F>
    requires std::is_invocable_v<std::decay_t<F>&, Outcome<Resp>&&>
  void submit(Req req, F&& on_complete) noexcept {
    submit(std::move(req), SubmitOptions{}, std::forward<F>(on_complete));
  }

  // Queues req and returns a future of its outcome, which is always fulfilled (never a
  // broken promise). Allocates the future's shared state; throws std::bad_alloc only.
  // Until the outcome is set the request counts as a blocked submitter (see
  // blocked_submitters_approx()). Thread-safe.
  [[nodiscard]] std::future<Outcome<Resp>> submit(Req req, SubmitOptions options = {}) {
    FutureDone f;
    std::future<Outcome<Resp>> future = f.promise.get_future();
    detail::Completion<Resp> done(std::move(f));
    counters_.future_waiters.fetch_add(1, std::memory_order_relaxed);
    enqueue(std::move(req), options, std::move(done));
    return future;
  }

  // Manual stepping (no worker threads): forms and runs, in this thread, every batch
  // that is due at the clock's now() (at most max_batches of them, which lets a test or a
  // simulation model a busy executor), and says when the next may be due. Requests
  // cancelled or past their deadline complete here too. Returns at once with nothing
  // done in a Pipeline that has worker threads. Blocks while the model runs; the model
  // and the completions run in this thread. Thread-safe (calls take turns).
  PipelinePollResult poll(std::size_t max_batches = std::numeric_limits<std::size_t>::max()) {
    PipelinePollResult result;
    if (threaded_) return result;
    for (;;) {
      if (result.batches >= max_batches) {
        result.next_due = clock_.now();
        return result;
      }
      std::unique_lock lead(lead_mu_);
      LeaseSlot lease;
      BatchTime next_due = BatchTime::max();
      const Lead r = lead_step(manual_batch_, false, next_due, lease);
      if (r != Lead::formed) {
        result.next_due = next_due;
        return result;
      }
      run_batch(manual_batch_, lease);
      ++result.batches;
    }
  }

  // Stops accepting (new submits complete with rejected/shutting_down), keeps forming
  // batches without waiting for windows until the queue is empty or drain_timeout has
  // passed, completes whatever is left with rejected/shutting_down, and stops the workers.
  // Blocks until then: at most drain_timeout plus the model calls in progress (a model
  // call is never interrupted). With no worker threads the drain runs in this thread.
  // Idempotent; a second caller waits for the first to finish. Thread-safe.
  void shutdown() noexcept {
    std::lock_guard once(shutdown_mu_);
    if (shut_down_) return;
    signal_.close(detail::saturating_add(clock_.now(), config_.drain_timeout));
    if (threaded_) {
      for (std::thread& t : workers_) {
        if (t.joinable()) t.join();
      }
    } else {
      drain_in_caller();
    }
    shut_down_ = true;
  }

  // Requests waiting in the queue (not yet in a batch). Racy by nature. Thread-safe.
  [[nodiscard]] std::size_t queued_approx() const noexcept {
    return shards_.queued_approx();
  }
  // Requests in batches being executed or completed right now. Racy. Thread-safe.
  [[nodiscard]] std::size_t in_flight_approx() const noexcept {
    return counters_.in_flight.load(std::memory_order_relaxed);
  }
  // The recent rate at which the Pipeline serves requests, per second: requests per
  // second of model time over the last few batches, times the lane slots (0 until
  // measured). Time with nothing to run never lowers it. Racy. Thread-safe.
  [[nodiscard]] double drain_rate_approx() const noexcept {
    return counters_.drain_rate.load(std::memory_order_relaxed);
  }
  // Future-returning submits whose outcome is not yet set: in a server that blocks a
  // thread on each future, the callers blocked right now. When these are fewer than
  // max_batch x lane slots, they cap the batch size; batches that look capped so are
  // counted (stats().submitter_limited_batches) and, with Config::log set, reported once.
  // Racy. Thread-safe.
  [[nodiscard]] std::size_t blocked_submitters_approx() const noexcept { return counters_.blocked_submitters(); }

  // The time integrals of requests held, read now (LoadReading, load.hpp): two readings
  // give the time-averaged in-system, queued and executing counts, the throughput and
  // the mean latency over the same window (load_between). Requests count from their
  // submit (not from SubmitOptions::arrival): a server that passes arrival times sees its
  // own queue before submit as the gap between L and lambda x W; latency_s sums the
  // end-to-end latencies (from the arrival). Requests submitted but not yet taken by the
  // batch leader are counted once it takes them (from their submit), and a batch's time
  // executing once it completes. Takes a short lock; never blocks otherwise, never
  // allocates. Thread-safe.
  [[nodiscard]] LoadReading load() const noexcept { return ledger_.load(clock_.now()); }
  // The earlier name of load(). Thread-safe.
  [[nodiscard]] LoadReading occupancy() const noexcept { return load(); }

  // Runs the Little's-law check (tailbatch::check_littles_law, littles_law.hpp) on this
  // Pipeline's own measurements over the window since the previous call (the first call:
  // since construction): L = the time-averaged requests in the Pipeline, lambda = their
  // completions per second, W = their mean end-to-end latency. The result is exported
  // (tailbatch_pipeline_littles_law_deviation, tailbatch_pipeline_hidden_queue_suspected)
  // and, when a hidden queue is suspected, written as one line to Config::log. Call it
  // periodically (every 10-60 s: a window much longer than the latency, so that the
  // requests straddling its edges matter little). Allocates the explanation; blocks only
  // for other calls of it and the log sink. Throws std::invalid_argument unless
  // threshold > 0 (a relative deviation, 0.2 = 20 %). Thread-safe.
  LittlesLawCheck check_littles_law(double threshold = 0.2) {
    LittlesLawCheck c = ledger_.check_littles_law(clock_.now(), threshold);
    if (c.hidden_queue_suspected) log_line("tailbatch: pipeline Little's law check: " + c.explanation);
    return c;
  }

  // Counts since construction (see PipelineStats). Takes each submit shard's lock in
  // turn, briefly. Thread-safe.
  [[nodiscard]] PipelineStats stats() const {
    PipelineStats s;
    s.submitted = shards_.accepted_exact();
    s.queued = queued_approx();
    const detail::PipelineCounters& c = counters_;
    s.submitted += c.inline_submitted.load(std::memory_order_relaxed);
    ledger_.fill(s.by_status, s.rejected_by_reason);
    for (std::size_t i = 0; i < s.batches_by_reason.size(); ++i) {
      s.batches_by_reason[i] = c.dispatched[i].load(std::memory_order_relaxed);
    }
    s.batched_requests = c.batched_requests.load(std::memory_order_relaxed);
    s.callback_exceptions = c.callback_exceptions.load(std::memory_order_relaxed);
    s.dropped_at_start = c.dropped_at_start.load(std::memory_order_relaxed);
    s.submitter_limited_batches = c.submitter_limited.load(std::memory_order_relaxed);
    s.blocked_submitters = c.blocked_submitters();
    s.in_flight = c.in_flight.load(std::memory_order_relaxed);
    return s;
  }

  // The configuration, as given. Thread-safe.
  [[nodiscard]] const Config& config() const noexcept { return config_; }
  // The policy, lanes, admission policy and clock in use. Thread-safe.
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  [[nodiscard]] Lanes& lanes() noexcept { return *lanes_; }
  [[nodiscard]] Admission& admission() noexcept { return *admission_; }
  [[nodiscard]] const C& clock() const noexcept { return clock_; }
  // The number of worker threads (0: stepped by poll()). Thread-safe.
  [[nodiscard]] std::size_t worker_count() const noexcept { return workers_.size(); }

 private:
  using Ticket = typename Admission::Ticket;
  using Hook = detail::CancelHook;

  // The completion of a future-returning submit (told apart from callbacks, to count the
  // callers blocked on futures). Fits the completion's inline buffer.
  struct FutureDone {
    std::promise<Outcome<Resp>> promise;
    void operator()(Outcome<Resp>&& o) { promise.set_value(std::move(o)); }
  };
  static_assert(detail::Completion<Resp>::template fits_inline<FutureDone>);

  using Entry = detail::PipelineEntry<Req, Resp, Ticket, detail::policy_uses_cost<Policy>()>;
  using EntryTraits = detail::PipelineEntryTraits<Entry>;
  using Meta = typename Entry::Meta;

  using Batch = detail::PipelineBatch<Req, Resp, Meta>;
  using Dead = detail::DeadRequest<Meta>;

  // formed: a batch, with a lane leased for it. no_lane: a batch is due but every lane
  // slot is busy (manual stepping only; a worker waits for one).
  enum class Lead : std::uint8_t { formed, idle, finished, no_lane };
  using LeaseSlot = std::optional<typename Lanes::Lease>;


  using Hist = detail::PipelineMetrics::Hist;
  using Shards = detail::SubmitShards<Entry>;
  using Former = detail::BatchFormer<Entry, EntryTraits, Policy>;
  using Round = typename Former::Round;
  static constexpr std::size_t npos = Former::npos;

  // Arrival stamps from the cycle counter: with the real-time clock only (a test's
  // ManualClock is read as it is).
  static constexpr bool cycle_stamps = detail::is_real_time_clock<C> && detail::has_cycle_counter;

  Pipeline(Model model, Policy policy, Config config, std::unique_ptr<Lanes> own_lanes, Lanes* lanes,
           std::unique_ptr<Admission> own_admission, Admission* admission, C clock)
      : model_(std::move(model)),
        policy_(std::move(policy)),
        config_(std::move(config)),
        clock_(std::move(clock)),
        owned_lanes_(std::move(own_lanes)),
        lanes_(owned_lanes_ ? owned_lanes_.get() : lanes),
        owned_admission_(std::move(own_admission)),
        admission_(owned_admission_ ? owned_admission_.get() : admission),
        max_batch_(policy_.max_batch()),
        shards_(config_.submit_shards, priority_levels * detail::policy_bucket_count(policy_),
                config_.queue_capacity * (config_.queue.policy == QueuePolicy::shed_oldest ? 2 : 1)),
        former_(policy_, detail::policy_bucket_count(policy_), config_.starvation_limit,
                lanes_ != nullptr ? lanes_->size() * lanes_->lane_capacity() : 1),
        ledger_(clock_.now()) {
    validate();
    former_.configure(config_.tenants, config_.queue, config_.queue_capacity, lanes_->lane_capacity() == 1 ? lanes_->size() : 0);
    total_slots_ = lanes_->size() * lanes_->lane_capacity();
    manual_batch_.reserve(max_batch_);
    metrics_ = config_.metrics.register_pipeline(
        config_.metric_labels,
        detail::PipelineGaugeSources{&counters_, &ledger_, max_batch_, this, [](const void* self) noexcept {
                                       return static_cast<const Pipeline*>(self)->queued_approx();
                                     }, &config_.tenants});
    track_tenants_ = quotas_.enabled() || (metrics_ && metrics_->tenants);
    if (metrics_) ledger_.set_end_to_end(metrics_->hist[Hist::end_to_end]);
    if constexpr (cycle_stamps) {
      if (detail::cycle_counter_is_constant()) {
        // Three readings, the tightest kept (the allowance before any is known is generous).
        const detail::ClockAndCycles r = detail::read_clock_and_cycles(clock_, 0);
        calibration_.start(r.time, r.cycles, r.spread);
      }
    }
    std::size_t n = 0;
    if constexpr (detail::is_real_time_clock<C>) {
      n = config_.workers.value_or(lanes_->size() * lanes_->lane_capacity());
    }
    threaded_ = n > 0;
    workers_.reserve(n);
#if TAILBATCH_HAS_EXCEPTIONS
    try {
      for (std::size_t i = 0; i < n; ++i) workers_.emplace_back([this] { worker_main(); });
    } catch (...) {
      shutdown();
      throw;
    }
#else
    for (std::size_t i = 0; i < n; ++i) workers_.emplace_back([this] { worker_main(); });
#endif
  }

  [[gnu::cold]] void validate() {
    detail::validate_pipeline<C>(config_, static_cast<bool>(model_), policy_, lanes_, admission_, max_batch_,
                                 Shards::max_shards);
  }

  // ---- submit side -------------------------------------------------------------------

  void enqueue(Req&& req, const SubmitOptions& options, detail::Completion<Resp>&& done) noexcept {
    // The submit time: the clock's, or (no deadline to check, counter calibrated) the
    // cycle counter's, which the leader converts when it takes the request.
    BatchTime now{};
    const bool timed = options.timeout != std::chrono::nanoseconds::zero() || options.deadline != BatchTime::max();
    if constexpr (cycle_stamps) {
      if (!timed && signal_.stamp_cycles.load(std::memory_order_relaxed)) {
        const std::uint64_t cycles = detail::read_cycle_counter();
        if (cycles < detail::max_stamp_cycles) now = detail::cycles_as_stamp(cycles);
      }
    }
    if (now == BatchTime{}) now = clock_.now();
    // Arrival, deadline, priority level and the refusals every front door shares
    // (detail/request_intake.hpp); a cycle stamp is no clock reading to clamp against.
    const detail::Intake in = detail::intake(options, now, !detail::stamp_is_cycles(now));
    const BatchTime arrival = in.arrival;
    const BatchTime deadline = in.deadline;
    const std::size_t level = in.level;
    if (signal_.closing(std::memory_order_relaxed)) {
      return reject_inline(done, RejectReason::shutting_down, "tailbatch: the pipeline is shutting down");
    }
    if (!in.accepted()) return complete_inline(done, in.error());
    std::size_t cost = 1;
    std::size_t bucket = 0;
    if constexpr (detail::policy_uses_cost<Policy>()) {
      bool threw = false;
      detail::call_guarded([&] { cost = config_.request_cost(req); },
                           [&](const char* what) {
                             threw = true;
                             complete_inline(done, Error{Status::failed, RejectReason::none,
                                                         what != nullptr
                                                             ? std::string("tailbatch: request_cost threw: ") + what
                                                             : std::string("tailbatch: request_cost threw"),
                                                         {}});
                           });
      if (threw) return;
    }
    if constexpr (CostLimitedBatchPolicy<Policy>) {
      if (cost > policy_.max_cost()) return reject_too_large(done, cost);
    }
    if constexpr (BucketedBatchPolicy<Policy>) {
      bucket = std::min(policy_.bucket_of(cost), former_.staged().buckets() - 1);
    }

    const TenantId tenant = options.tenant;
    if (quotas_.enabled()) {
      if (auto no = quotas_.refusal(tenant, counters_.drain_rate.load(std::memory_order_relaxed))) {
        tenant_metric(tenant, no->status, {});
        return complete_inline(done, std::move(*no));
      }
    }
    std::optional<Ticket> ticket = admission_->try_admit();
    if (!ticket) {
      finish_tenant(tenant, Status::rejected, {}, false);
      return reject_inline(done, RejectReason::overloaded, "tailbatch: the admission policy refused the request", retry_after_hint());
    }

    std::unique_ptr<Hook> hook;
    if (options.cancel.stop_possible()) {
      const bool threw = detail::call_guarded(
          [&] {
            hook = std::make_unique<Hook>(&Pipeline::on_cancel, this);
            // Registered before queueing: a stop that lands in between is seen by the leader.
            hook->callback.emplace(options.cancel, Hook::Fire{hook.get()});
          },
          [](const char*) {});
      if (threw) {
        return finish_inline(done, std::move(*ticket), arrival,
                             Error{Status::failed, RejectReason::none, "tailbatch: out of memory", {}}, nullptr, tenant);
      }
    }

    const std::size_t sub = former_.staged().sub_index(level, bucket);
    const std::size_t my_shard = shards_.shard_of_this_thread();
    auto pushed = Shards::Push::closed;
    bool fired = false;
    // Allocation (a new chunk), the only thing that can throw here, happens before the
    // arguments are moved from: on failure they are still ours.
    const bool threw = detail::call_guarded(
        [&] {
          pushed = shards_.push(my_shard, sub, signal_.closing_flag(), now, [&](std::vector<Entry>& chunk) {
            const Entry& e = chunk.emplace_back(std::move(req), std::move(done), arrival, std::move(hook),
                                                std::move(*ticket), deadline, cost, tenant);
            // A stop that landed between the token check and now found nothing queued to
            // flag: flag it here, so the leader removes the request promptly.
            fired = e.meta.cancel != nullptr && e.meta.cancel->fired.load(std::memory_order_acquire);
          });
        },
        [](const char*) {});
    if (threw) {
      return finish_inline(done, std::move(*ticket), arrival,
                           Error{Status::failed, RejectReason::none, "tailbatch: out of memory", {}}, std::move(hook),
                           tenant);
    }
    if (pushed == Shards::Push::queued) {
      signal_.arrived(deadline, fired);
      return;
    }
    // The hook is destroyed in finish_inline, outside the lock its callback takes.
    const bool full = pushed == Shards::Push::queue_full;
    finish_inline(done, std::move(*ticket), arrival,
                  Error{Status::rejected, full ? RejectReason::queue_full : RejectReason::shutting_down,
                        full ? "tailbatch: the queue is full" : "tailbatch: the pipeline is shutting down",
                        full ? retry_after_hint() : std::chrono::nanoseconds{0}},
                  std::move(hook), tenant);
  }

  // A request whose cost no batch can hold.
  [[gnu::cold]] void reject_too_large(detail::Completion<Resp>& done, std::size_t cost) noexcept {
    std::string message;
    detail::call_guarded(
        [&] {
          message = "tailbatch: the request's cost " + std::to_string(cost) + " exceeds the batch policy's limit of " +
                    std::to_string(policy_.max_cost()) + " per batch: it can never run";
        },
        [](const char*) {});
    reject_inline(done, RejectReason::too_large, std::move(message));
  }

  // The time the recent service rate (detail/service_rate.hpp: measured over the batches'
  // model time, never over idle time) needs to empty the queue as it stands.
  // The depth is the places not in the pool (one load, for a fast refusal): the queue,
  // plus the few places shards have claimed and not used yet.
  std::chrono::nanoseconds retry_after_hint() const noexcept {
    return detail::ServiceRate::retry_after(counters_.drain_rate.load(std::memory_order_relaxed),
                                          shards_.places_in_use_approx());
  }

  static void on_cancel(void* self) noexcept { static_cast<Pipeline*>(self)->signal_.cancelled(); }

  void count_inline(Status s, RejectReason r) noexcept {
    counters_.inline_submitted.fetch_add(1, std::memory_order_relaxed);
    count_status(s, r, 1);
  }

  // Counts n outcomes: the ledger's counters and the metric series.
  void count_status(Status s, RejectReason r, std::uint64_t n) noexcept {
    ledger_.count(s, r, n);
    counters_.count(s, r, n, metrics_.get());
  }

  // Settles a request that was queued (see OutcomeLedger::settle): counted, its admission
  // released, its end-to-end latency recorded, its outcome delivered; exactly once.
  void settle(Meta& m, Status s, RejectReason r, std::chrono::nanoseconds latency, Outcome<Resp>&& o) noexcept {
    counters_.count(s, r, 1, metrics_.get());
    ledger_.settle(
        s, r, latency,
        [&](Status st, std::chrono::nanoseconds lat) noexcept { admission_->release(std::move(m.ticket), st, lat); },
        [&]() noexcept { deliver(m.done, std::move(o)); });
  }

  void reject_inline(detail::Completion<Resp>& done, RejectReason r, std::string message,
                     std::chrono::nanoseconds retry_after = std::chrono::nanoseconds{0}) noexcept {
    complete_inline(done, Error{Status::rejected, r, std::move(message), retry_after});
  }

  // A request that never got an admission ticket.
  void complete_inline(detail::Completion<Resp>& done, Error&& e) noexcept {
    count_inline(e.status, e.reason);
    deliver(done, Outcome<Resp>(std::move(e)));
  }

  // A request admitted but never queued.
  void finish_inline(detail::Completion<Resp>& done, Ticket&& ticket, BatchTime arrival, Error&& e,
                     std::unique_ptr<Hook> hook = nullptr, TenantId tenant = 0) noexcept {
    hook.reset();
    const Status s = e.status;
    count_inline(s, e.reason);
    const BatchTime end = clock_.now();
    if (detail::stamp_is_cycles(arrival)) arrival = end;  // refused at once: no time spent
    finish_tenant(tenant, s, elapsed(arrival, end), false);
    admission_->release(std::move(ticket), s, elapsed(arrival, end));
    deliver(done, Outcome<Resp>(std::move(e)));
  }

  // A request of tenant t ends (quotas, metrics); `queued`: its queued place was given back.
  void finish_tenant(TenantId t, Status s, std::chrono::nanoseconds latency, bool queued) noexcept {
    if (quotas_.enabled()) queued ? quotas_.done(t) : quotas_.release(t);
    tenant_metric(t, s, latency);
  }
  void tenant_metric(TenantId t, Status s, std::chrono::nanoseconds latency) noexcept {
    if (metrics_ && metrics_->tenants) metrics_->tenants->record(t, s, latency);
  }

  template <class F>
  void invoke_user(F& f, Outcome<Resp>&& o) noexcept {
    if (detail::call_guarded([&] { std::invoke(f, std::move(o)); }, [](const char*) {})) note_callback_exception();
  }

  void deliver(detail::Completion<Resp>& done, Outcome<Resp>&& o) noexcept {
    // Before the outcome is set: whoever it wakes sees itself no longer blocked.
    if (done.template holds<FutureDone>()) counters_.future_waiters.fetch_sub(1, std::memory_order_relaxed);
    if (detail::call_guarded([&] { done(std::move(o)); }, [](const char*) {})) note_callback_exception();
  }

  void note_callback_exception() noexcept { counters_.callback_threw(metrics_.get()); }

  static std::chrono::nanoseconds elapsed(BatchTime from, BatchTime to) noexcept {
    return to > from ? std::chrono::duration_cast<std::chrono::nanoseconds>(to - from) : std::chrono::nanoseconds{0};
  }

  // ---- batch formation (under lead_mu_) -----------------------------------------------

  void worker_main() noexcept {
#if defined(__linux__)
    // This thread's timed sleeps end on time rather than up to 50 us late (the default
    // slack lets the kernel batch wake-ups): a window's close depends on them.
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
    Batch batch;
    // Without the reservation (out of memory) the batch still forms, allocating as it goes.
    (void)detail::call_guarded([&] { batch.reserve(max_batch_); }, [](const char*) {});
    LeaseSlot lease;
    for (;;) {
      Lead r;
      {
        std::unique_lock lead(lead_mu_);
        BatchTime ignored;
        r = lead_step(batch, true, ignored, lease);
      }
      if (r == Lead::finished) return;
      if (r == Lead::formed) run_batch(batch, lease);
    }
  }

  // Waits, in line, for a lane slot; bounded, so that the leader looks again at the
  // queue (expired and cancelled requests, shutdown) at least this often while every
  // slot is busy.
  static constexpr std::chrono::milliseconds lane_wait{2};
  LeaseSlot wait_for_lane() noexcept {
    LeaseSlot lease;
    if (detail::call_guarded([&] { lease = lanes_->acquire_for(lane_wait); }, [](const char*) {})) {
      std::this_thread::sleep_for(lane_wait);
    }
    return lease;
  }

  [[gnu::cold]] void drain_in_caller() noexcept {
    LeaseSlot lease;
    for (;;) {
      std::unique_lock lead(lead_mu_);
      if (finished_) return;
      BatchTime ignored;
      const Lead r = lead_step(manual_batch_, false, ignored, lease);
      if (r == Lead::finished) return;
      if (r == Lead::formed) {
        run_batch(manual_batch_, lease);
      } else if (r == Lead::no_lane && detail::is_real_time_clock<C>) {
        // The lanes are shared and busy: wait in line for one (lead_step ends the drain
        // at its deadline).
        lead.unlock();
        lease = wait_for_lane();
      } else {
        // No lane, and a clock that will not move by itself; or (defensive: closing and
        // idle cannot both hold, flush always dispatches) nothing to run.
        reject_all_staged();
        publish_dequeued();
        finished_ = true;
        return;
      }
    }
  }

  // One leadership turn: ingest, purge, decide; form a batch, or sleep (threaded) and
  // decide again, or report when the next batch may be due (manual).
  //
  // A lane slot is leased only for a batch that is due: when every slot is busy the batch
  // stays queued (growing) while the leader waits in line for one (threaded), or the turn
  // ends with no_lane (manual). `lease` holds a slot got while waiting; it is given back
  // before the leader sleeps.
  //
  // Requests taken off the queue without running (cancelled, expired) are completed when
  // the turn ends without a batch, before the leader waits; with a batch, after its model
  // call (Batch::dead): a slow callback never delays the batch it was formed beside.
  Lead lead_step(Batch& b, bool may_sleep, BatchTime& next_due, LeaseSlot& lease) noexcept {
    const Lead r = lead_turn(b, may_sleep, next_due, lease);
    if (r == Lead::formed) {
      std::swap(b.dead, dead_);  // b.dead is empty: finish() cleared it
    } else {
      complete_dead();
    }
    return r;
  }

  Lead lead_turn(Batch& b, bool may_sleep, BatchTime& next_due, LeaseSlot& lease) noexcept {
    for (;;) {
      if (finished_) {
        lease.reset();
        return Lead::finished;
      }
      const bool closing = signal_.closing();
      const BatchTime drain_deadline = closing ? signal_.drain_deadline() : BatchTime::max();
      const bool cancels = signal_.take_cancels();
      // Once closing, every shard: a submitter that saw closing false under a shard's
      // lock has queued by the time this takes that lock.
      shards_.take(closing, [this](std::vector<std::vector<Entry>>& free_list, std::size_t most) {
        former_.staged().give_back_chunks(free_list, most);
      });
      BatchTime now{};
      std::uint64_t cycles = 0;
      if constexpr (cycle_stamps) {
        const detail::ClockAndCycles r = detail::read_clock_and_cycles(clock_, calibration_.good_spread());
        now = r.time;
        cycles = r.cycles;
        const bool usable = calibration_.update(r.time, r.cycles, r.spread);
        if (usable != signal_.stamp_cycles.load(std::memory_order_relaxed)) {
          signal_.stamp_cycles.store(usable, std::memory_order_relaxed);
        }
      } else {
        now = clock_.now();
      }
      stage_ingested(now, cycles);
      if (cancels) former_.purge_cancelled(now, dead_sink());
      former_.apply_queue_policy(now, dead_sink());
      if (closing && now >= drain_deadline) {
        reject_all_staged();
        publish_dequeued();
        finished_ = true;
        lease.reset();
        return Lead::finished;
      }
      // A dispatch decided on a view with no idle slot is not acted on at once (the policy
      // is asked again once a slot is held), so that a policy may count what it dispatches.
      const std::size_t idle = idle_lane_slots(lease.has_value());
      Round round = former_.decide(now, closing, idle, dead_sink());
      if (round.bucket != npos && !lease && idle > 0) lease = lanes_->try_acquire();
      if (round.bucket != npos && former_.start_now(round, now, lease ? lease->index() : npos, closing)) {
        form(b, round, now);
        former_.pacing().started(lease->index(), now, detail::full_batch(round.decision));
        publish_dequeued();
        return Lead::formed;
      }
      if (round.bucket != npos) {
        former_.compact_all();
        publish_dequeued();
        if (!may_sleep) {
          next_due = now;
          return Lead::no_lane;
        }
        complete_dead();
        lease = wait_for_lane();
        continue;
      }
      lease.reset();  // nothing to run: the slot goes back before any wait
      former_.compact_all();
      publish_dequeued();
      if (closing && former_.size() == 0) {
        finished_ = true;
        return Lead::finished;
      }
      if (!may_sleep) {
        next_due = round.wait.decide_again_at;
        return Lead::idle;
      }
      // A timed sleep ends late by the OS's wake-up latency (tens to hundreds of
      // microseconds); the last stretch before a window closes is spent spinning
      // instead, watching for newcomers. (Yielding would be worse: under load a yielded
      // processor comes back a scheduler slice later.)
      complete_dead();
      const BatchTime wake_at = round.wait.decide_again_at;
      const BatchTime early = detail::saturating_sub(wake_at, config_.dispatch_spin);
      if (wake_at != BatchTime::max() && now >= early) {
        // Newcomers end the spin only once there are enough to change the decision, as
        // they would end a sleep: the spinning leader leaves the shards to the submitters.
        const std::uint64_t enough = shards_.taken_total() + std::max<std::size_t>(1, round.wake_delta);
        while (clock_.now() < wake_at && !signal_.closing(std::memory_order_relaxed) &&
               (!shards_.any_dirty(std::memory_order_relaxed) || shards_.accepted_approx() < enough)) {
          detail::cpu_relax();
        }
        continue;
      }
      signal_.sleep(wake_at == BatchTime::max() ? BatchTime::max() : early, round.wake_delta,
                    round.wait.decide_again_if_deadline_before, closing,
                    [this] { return shards_.any_dirty(std::memory_order_seq_cst); });
    }
  }

  // Makes what the leader took off the queue visible to submitters' capacity check: their
  // places go back to the pool.
  void publish_dequeued() noexcept { shards_.publish_dequeued(former_.dequeued()); }

  // Stages what shards_.take() took. (now, cycles): a reading of the clock and the counter
  // taken after it, to convert counter stamps with.
  void stage_ingested(BatchTime now, [[maybe_unused]] std::uint64_t cycles) noexcept {
    note_entered(shards_.take_entered(), now, cycles);
    shards_.drain_taken([&](std::size_t s, std::vector<std::vector<Entry>>& chain) {
      for (std::vector<Entry>& chunk : chain) {
        if constexpr (cycle_stamps) {
          for (Entry& e : chunk) {
            if (detail::stamp_is_cycles(e.meta.arrival)) {
              e.meta.arrival = calibration_.to_time(detail::stamp_cycles(e.meta.arrival), now, cycles);
            } else if (e.meta.arrival > now) {
              e.meta.arrival = now;  // a caller's arrival later than its submit
            }
          }
        }
        detail::call_guarded([&] { former_.stage(s, chunk); },
                             [&](const char*) {
                               // Out of memory while staging: these requests fail rather than vanish.
                               for (Entry& e : chunk) {
                                 former_.note_dequeued(1);
                                 complete_entry(e, Error{Status::failed, RejectReason::none,
                                                         "tailbatch: out of memory", {}}, now);
                               }
                               chunk.clear();
                             });
      }
    });
    former_.staged().settle();
  }

  // Enters the requests taken from the shards into the occupancy integrals, each from its
  // submit time. (now, cycles): a reading of the clock and the counter taken after the take.
  void note_entered(const detail::EnteredSums& in, BatchTime now, [[maybe_unused]] std::uint64_t cycles) noexcept {
    double ns_per_cycle = 0.0;
    if constexpr (cycle_stamps) ns_per_cycle = calibration_.ns_per_cycle();
    ledger_.enter(now, in.ns_count + in.cycles_count, detail::entered_age_sum(in, now, cycles, ns_per_cycle));
  }

  // Completes a queued request that will not run. Leaves e gone.
  void complete_entry(Entry& e, Error&& err, BatchTime now) noexcept {
    complete_meta(e.meta, std::move(err), now, false, now);
  }

  // Completes a request that will not run (from the queue, or dropped from a batch, formed
  // at `formed`, as it started). Leaves m gone.
  void complete_meta(Meta& m, Error&& err, BatchTime now, bool from_batch, BatchTime formed) noexcept {
    m.cancel.reset();
    const Status s = err.status;
    const RejectReason r = err.reason;
    const auto latency = elapsed(m.arrival, now);
    ledger_.leave(now, 1, from_batch ? 1 : 0, formed, latency);
    settle(m, s, r, latency, Outcome<Resp>(std::move(err)));
  }

  // What the former hands over of a request that will not run: its place goes back to the
  // pool at once, its completion waits in dead_ (see lead_step), or runs now if even that
  // small record cannot be allocated.
  auto dead_sink() noexcept {
    return [this](Entry& e, Status why, BatchTime now, RejectReason reason) {
      if (quotas_.enabled()) quotas_.dequeued(e.tenant);
      publish_dequeued();
      const bool room = !detail::call_guarded(
          [&] {
            if (dead_.size() == dead_.capacity()) dead_.reserve(std::max<std::size_t>(16, 2 * dead_.capacity()));
          },
          [](const char*) {});
      if (room) {
        dead_.push_back(Dead{std::move(e.meta), why, now, reason, e.tenant});  // within capacity: no throw
      } else {
        complete_dead(e.meta, why, now, reason, e.tenant);
      }
    };
  }

  // Completes a request taken off the queue at `at` without running.
  void complete_dead(Meta& m, Status why, BatchTime at, RejectReason reason, TenantId tenant) noexcept {
    if (track_tenants_) finish_tenant(tenant, why, elapsed(m.arrival, at), true);
    complete_meta(m, detail::dead_request_error(why, reason, retry_after_hint()), at, false, at);
  }

  // Completes what the leader's turn took off the queue (under lead_mu_).
  void complete_dead() noexcept {
    for (Dead& d : dead_) complete_dead(d.meta, d.why, d.at, d.reason, d.tenant);
    dead_.clear();
  }

  void reject_all_staged() noexcept {
    former_.remove_all(clock_.now(), dead_sink());
    complete_dead();
  }

  // Lane slots free for a batch now: the backend's count where it keeps one (with the
  // slot the leader holds, if any), else every slot not running one of this Pipeline's
  // batches.
  [[nodiscard]] std::size_t idle_lane_slots(bool holding) const noexcept {
    if constexpr (requires(const Lanes& l) { { l.free_slots_approx() } -> std::convertible_to<std::size_t>; }) {
      return std::min(total_slots_, static_cast<std::size_t>(lanes_->free_slots_approx()) + (holding ? 1 : 0));
    } else {
      const std::size_t running = counters_.running_batches.load(std::memory_order_relaxed);
      // A held slot is idle even while the batch that left it is still counted as running.
      return std::max<std::size_t>(holding ? 1 : 0, total_slots_ > running ? total_slots_ - running : 0);
    }
  }

  void form(Batch& b, const Round& round, BatchTime now) noexcept {
    b.begin();
    // Within the reserved capacity, and Entry moves are expected not to throw: an
    // exception here terminates (this is noexcept) rather than lose a request.
    former_.form(round, [&](Entry& e) {
      if (track_tenants_) {
        if (quotas_.enabled()) quotas_.dequeued(e.tenant);
        b.tenants.push_back(e.tenant);  // within the reserved capacity
      }
      b.take(e);  // leaves e gone
    });
    const std::size_t n = b.metas.size();
    b.pad_to(round.decision.padded_size);
    b.reason = round.decision.reason;
    b.formed = now;
    counters_.in_flight.fetch_add(n, std::memory_order_relaxed);
    note_submitter_limit(b, n);
    if (metrics_) {
      metrics_->hist[Hist::formation]->record(elapsed(b.opened, now));
      for (const Meta& m : b.metas) metrics_->hist[Hist::queue_wait]->record(elapsed(m.arrival, now));
    }
  }

  // A batch that closed by its window, short of max_batch, with nothing else queued, while
  // fewer callers wait on futures than could fill every lane slot's batch (and at least as
  // many as the batch holds): in a server that parks a thread on each future, the threads
  // are what limits the batch. Counted; reported once, after a run of such batches.
  void note_submitter_limit(Batch& b, std::size_t n) noexcept {
    const std::size_t blocked = blocked_submitters_approx();
    const bool limited = b.reason == DispatchReason::window && n < max_batch_ && former_.size() == 0 &&
                         blocked >= n && blocked < max_batch_ * total_slots_;
    if (limited) counters_.submitter_limited.fetch_add(1, std::memory_order_relaxed);
    if (limited && metrics_) metrics_->submitter_limited->inc();
    b.warn_submitters = submitter_streak_.note(limited);
    b.blocked = blocked;
  }

  // ---- execution and completion (no lock held) ---------------------------------------

  // Runs a formed batch on its leased slot, gives the slot back, and completes the batch.
  //
  // The clock is read as the batch is handed to the lane, and a request whose deadline
  // (a latest start) has passed by then, or that was cancelled, is taken out of the batch
  // without running. Nothing runs between that reading and the model call: the
  // completions of the requests taken out wait until after it.
  void run_batch(Batch& b, LeaseSlot& lease) noexcept {
    const std::size_t lane_index = lease->index();
    Lane& lane = lease->lane();
    counters_.running_batches.fetch_add(1, std::memory_order_relaxed);
    const BatchTime start = clock_.now();
    if (start > b.earliest_deadline || b.cancellable) {
      counters_.dropped_at_start.fetch_add(b.drop_unstartable(start, detail::policy_pads(policy_)), std::memory_order_relaxed);
    }
    const std::size_t n = b.metas.size();
    bool threw = false;
    std::string error;
    BatchTime end = start;
    if (n > 0) {
      threw = detail::call_guarded(
          [&] {
            b.resps.resize(b.padded);
            model_(std::span<const Req>(b.reqs.data(), b.padded), std::span<Resp>(b.resps.data(), b.padded), lane);
          },
          [&](const char* what) {
            error = what != nullptr ? what : "tailbatch: the model threw an exception not derived from std::exception";
          });
      end = clock_.now();
    }
    // The lane is free before the completions run.
    lease.reset();
    counters_.running_batches.fetch_sub(1, std::memory_order_relaxed);
    if (n > 0) {
      counters_.batch_ran(b.reason, n, elapsed(start, end), metrics_.get());
      const double per_slot = ledger_.service().record(n, elapsed(start, end));
      counters_.drain_rate.store(per_slot * static_cast<double>(total_slots_), std::memory_order_relaxed);
    }
    BatchDuration latency_sum{0};
    for (const Meta& m : b.metas) latency_sum += elapsed(m.arrival, end);
    ledger_.leave(end, n, n, b.formed, latency_sum);
    for (std::size_t i = 0; i < n; ++i) {
      Meta& m = b.metas[i];
      const bool was_cancelled = m.cancelled();
      m.cancel.reset();
      const auto latency = elapsed(m.arrival, end);
      if (track_tenants_) finish_tenant(b.tenants[i], was_cancelled ? Status::cancelled : threw ? Status::failed : Status::ok, latency, true);
      if (was_cancelled) {
        settle(m, Status::cancelled, RejectReason::none, latency,
               Outcome<Resp>(Error{Status::cancelled, RejectReason::none,
                                   "tailbatch: cancelled; the result was discarded", {}}));
      } else if (threw) {
        settle(m, Status::failed, RejectReason::none, latency,
               Outcome<Resp>(Error{Status::failed, RejectReason::none, error, {}}));
      } else {
        settle(m, Status::ok, RejectReason::none, latency, Outcome<Resp>(std::move(b.resps[i])));
      }
    }
    const std::size_t dropped = b.dropped.size();
    for (std::size_t i = 0; i < dropped; ++i) {
      const bool was_cancelled = b.dropped_status[i] == Status::cancelled;
      if (track_tenants_) finish_tenant(b.dropped_tenants[i], b.dropped_status[i], elapsed(b.dropped[i].arrival, end), true);
      complete_meta(b.dropped[i],
                    was_cancelled ? Error{Status::cancelled, RejectReason::none, "tailbatch: cancelled", {}}
                                  : Error{Status::deadline_exceeded, RejectReason::none,
                                          "tailbatch: the deadline passed before the request's batch could start", {}},
                    end, true, b.formed);
    }
    // What the leader took off the queue while forming this batch, now that it ran.
    for (detail::DeadRequest<Meta>& d : b.dead) complete_dead(d.meta, d.why, d.at, d.reason, d.tenant);
    // The policy learns after the completions: its work never delays them.
    if constexpr (BatchFeedbackPolicy<Policy>) {
      if (n > 0) policy_.on_batch_executed(BatchFeedback{n, b.padded, elapsed(start, end), lane_index, start, threw, b.formed, b.reason});
    }
    b.finish();
    counters_.in_flight.fetch_sub(n + dropped, std::memory_order_relaxed);
    if (b.warn_submitters) {
      b.warn_submitters = false;
      warn_submitter_limit(b.blocked);
    }
  }

  [[gnu::cold]] void warn_submitter_limit(std::size_t blocked) noexcept {
    if (!config_.log) return;
    detail::call_guarded([&] { log_line(detail::submitter_limit_message(blocked, max_batch_ * total_slots_)); },
                         [](const char*) {});
  }

  // Writes one line to Config::log, if set; what it throws is dropped.
  void log_line(std::string_view line) noexcept {
    if (!config_.log) return;
    detail::call_guarded([&] { config_.log(line); }, [](const char*) {});
  }

  // ---- state -------------------------------------------------------------------------

  Model model_;
  Policy policy_;
  Config config_;
  C clock_;
  std::unique_ptr<Lanes> owned_lanes_;
  Lanes* lanes_;
  std::unique_ptr<Admission> owned_admission_;
  Admission* admission_;
  std::size_t max_batch_;
  std::size_t total_slots_ = 1;  // lanes x lane capacity
  bool threaded_ = false;

  // Where submitters queue (ingress): shards, each under its own lock, merged by the leader.
  Shards shards_;
  // The leader's sleep and who wakes it; the closing and cycle-stamp flags.
  detail::LeaderSignal signal_;

  // The leader's, under lead_mu_.
  std::mutex lead_mu_;
  Former former_;  // the staged queue and batch formation
  detail::CycleCalibration calibration_;  // the cycle counter's rate, for arrival stamps
  bool finished_ = false;
  Batch manual_batch_;
  // Requests this turn took off the queue without running, not yet completed.
  std::vector<Dead> dead_;
  // once, after this many.
  detail::SubmitterStreak submitter_streak_;

  // Counters (and the drain rate, in_flight, the blocked submitters), read by stats().
  detail::PipelineCounters counters_;

  // Where every request's life ends: outcome counts, the load integrals and the
  // Little's-law check, the end-to-end histogram, the service rate (retry-after hint).
  detail::OutcomeLedger ledger_;
  detail::TenantQuotas quotas_{config_.tenants};  // per-tenant max_queued / max_in_flight
  bool track_tenants_ = false;                    // quotas or per-tenant metrics: tenants leave with batches

  std::mutex shutdown_mu_;
  bool shut_down_ = false;
  std::vector<std::thread> workers_;
  // Last: destroyed first, so that no gauge callback reads a destroyed counter.
  std::unique_ptr<detail::PipelineMetrics> metrics_;
};

}  // namespace tailbatch
