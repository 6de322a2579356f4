// Simulator: predicts a batching configuration's p50/p95/p99, throughput and batch sizes in
// milliseconds of CPU, before anything is deployed.
//
// It is a discrete-event simulation on the ManualClock that drives the real thing: the
// same Pipeline (pipeline.hpp), stepped by poll(), with the same BatchPolicy object
// (FixedWindow, PreferredSizes, TokenBudget, DeadlineAware or your own) and the same
// admission policy (AdmitAll, or a ConcurrencyLimiter with any limit algorithm). Only the
// model and the lanes are modelled:
//
//   * the model: a batch of b requests occupies its lane for service_time(b) — the
//     guide's L(b) = base + per_item × (b − 1) is LinearCost{base, per_item} — plus
//     lane_overhead (per-batch work that also holds the lane: copies, response writing);
//   * the lanes: `lanes` lanes (GPU streams, workers), each running one batch at a time;
//   * the network: a fixed delay added to every request's latency, holding no lane.
//
// Each view the policy decides on carries the simulated lanes' state (BatchView::idle_lanes
// and lanes), and a policy that learns (BatchFeedbackPolicy, e.g. AdaptiveWindow) is told
// of every executed batch with its modelled lane time, so it learns in simulation as it
// would on real lanes.
//
// Requests arrive by a LoadProfile (Poisson or constant, steady, stepped or spiking), the
// same ArrivalSchedule the load generator uses. Latency runs from a request's arrival to
// the end of its batch plus the network delay. Because the admission policy sees each
// request's completion at the modelled time with the modelled latency, a learning limiter
// (AIMD, gradient) adapts in the simulation as it would in production.
//
// simulate() is single-threaded and owns no threads. Results are exactly reproducible for
// the same configuration and seed (with the same standard library).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <tailbatch/admission.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/tools/load_profile.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/queue_policy.hpp>
#include <tailbatch/tenants.hpp>

#include <map>

namespace tailbatch {

// What to simulate. A plain aggregate; simulate() validates it and throws
// std::invalid_argument naming the field.
struct SimulationConfig {
  LoadProfile arrivals = LoadProfile::poisson(100.0, std::chrono::seconds(10));
  std::uint64_t seed = 42;
  // Requests arriving before this offset run but are not counted.
  std::chrono::nanoseconds warmup{0};
  std::size_t lanes = 1;
  // The model's time for a batch of the given size (the padded size, when the policy pads).
  // Required. LinearCost{base, per_item} is the latency field guide's L(b).
  std::function<std::chrono::nanoseconds(std::size_t batch_size)> service_time{};
  // Per batch, on top of service_time, while still holding the lane.
  std::chrono::nanoseconds lane_overhead{0};
  // Added to every request's latency; holds no lane (the client's round trip).
  std::chrono::nanoseconds network{0};
  // The Pipeline's bounded queue: arrivals beyond it are rejected (queue_full).
  std::size_t queue_capacity = 4096;
  // When positive, each request's deadline: it completes deadline_exceeded rather than
  // start later than this after its arrival.
  std::chrono::nanoseconds request_timeout{0};
  // A request's cost (tokens), for policies that read it (TokenBudget); by request index.
  std::function<std::size_t(std::uint64_t index)> request_cost{};
  // Priority by request index (default: all normal).
  std::function<Priority(std::uint64_t index)> priority{};
  // Bounds the run in count (arrivals beyond it are not generated).
  std::uint64_t max_requests = 5'000'000;
  // Replay: when not empty, these arrivals (offsets from the start, ascending) replace
  // `arrivals`, and the run's offered window ends at the last of them.
  std::vector<std::chrono::nanoseconds> arrival_times{};
  // Replay: when not empty (as long as arrival_times), request i's latency is counted from
  // latency_from[i] (an offset from the start, <= its arrival) instead of its arrival: the
  // intended send time of a request that reached the Pipeline late.
  std::vector<std::chrono::nanoseconds> latency_from{};
  // When set, called once per request of each executed batch with its position in the
  // batch (0-based): a delay added to that request's completion after the batch ends,
  // holding no lane (delivering completions one after another, waking the caller).
  std::function<std::chrono::nanoseconds(std::size_t position)> completion_delay{};
  LatencyHistogramConfig histogram{};
  // Tenants: the tenant of each request by index (unset: every request is the default
  // tenant 0, and SimulationResult::tenants stays empty), and how the Pipeline shares
  // between them (fair scheduling by virtual counters, per-tenant quotas).
  std::function<TenantId(std::uint64_t index)> tenant{};
  TenantsConfig tenants{};
  // What the Pipeline's queue does under overload (reject newest, shed oldest, adaptive
  // LIFO, CoDel).
  QueuePolicyConfig queue{};
  // An ok request whose latency is at most this counts toward goodput; 0: every ok one.
  std::chrono::nanoseconds goodput_within{0};
  // The simulation's time. Share it (copies share one time) with a learning limiter that
  // is passed to simulate(), so that the limiter reads simulated time.
  ManualClock clock{};
};

// One tenant's share of a simulation (SimulationResult::tenants).
struct SimulationTenantResult {
  TenantId tenant = 0;
  std::uint64_t arrivals = 0, ok = 0;
  std::uint64_t good = 0;  // ok within SimulationConfig::goodput_within
  std::uint64_t by_status[status_count] = {};
  HistogramSnapshot latency;  // its ok requests
  std::chrono::nanoseconds p50{0}, p95{0}, p99{0};
};

// What a simulation measured. Counts and latencies cover requests arriving after the
// warm-up.
struct SimulationResult {
  std::uint64_t arrivals = 0;
  std::uint64_t warmup_arrivals = 0;  // arrived during the warm-up: run, not counted
  std::uint64_t ok = 0;
  std::uint64_t by_status[status_count] = {};                  // indexed by Status
  std::uint64_t rejected_by_reason[reject_reason_count] = {};  // indexed by RejectReason
  std::uint64_t good = 0;     // ok within SimulationConfig::goodput_within
  double goodput_rps = 0.0;   // good / the throughput's window
  // With SimulationConfig::tenant set: one entry per tenant that had a measured request,
  // by ascending id.
  std::vector<SimulationTenantResult> tenants;
  HistogramSnapshot latency;  // ok requests: arrival to completion + network
  std::chrono::nanoseconds p50{0}, p95{0}, p99{0}, mean{0}, max{0};
  double offered_rps = 0.0;
  double throughput_rps = 0.0;  // ok completions / (warm-up end to the later of the profile end and the last completion)
  // Batches executed, by the size the model ran (padding included): batch_sizes[b] is the
  // number of batches of size b (index 0 unused). Includes warm-up batches.
  std::vector<std::uint64_t> batch_sizes;
  double mean_batch_size = 0.0;    // requests per batch, padding excluded
  std::uint64_t batches = 0;
  std::uint64_t batches_by_reason[dispatch_reason_count] = {};  // indexed by DispatchReason
  double lane_utilization = 0.0;   // busy lane time / (lanes × simulated time)
  // Admitted and not yet completed, averaged over the measured window, and its peak:
  // Little's law says mean_in_flight ≈ throughput × mean server-side latency.
  double mean_in_flight = 0.0;
  std::uint64_t max_in_flight = 0;
  std::chrono::nanoseconds simulated{0};  // simulated time from start to the last event
  std::uint64_t events = 0;               // event-loop iterations (a cost measure)

  [[nodiscard]] std::uint64_t count(Status s) const noexcept { return by_status[static_cast<std::size_t>(s)]; }
  [[nodiscard]] std::uint64_t count(RejectReason r) const noexcept {
    return rejected_by_reason[static_cast<std::size_t>(r)];
  }
  // Completed with any status other than ok, over arrivals. Thread-safe.
  [[nodiscard]] double error_rate() const noexcept {
    return arrivals == 0 ? 0.0 : static_cast<double>(arrivals - ok) / static_cast<double>(arrivals);
  }
};

namespace tools::detail {

struct SimRequest {
  std::uint64_t index = 0;
};

struct SimResponse {
  BatchTime finish{};  // when the batch holding this request finished, lane overhead included
};

// A simulated lane: busy until the batch it runs has finished in simulated time.
struct SimLane {
  std::size_t index = 0;
  BatchTime busy_until{};
  bool leased = false;
};

// LaneBackend over simulated lanes: a lane can be leased when it is idle at the clock's
// current time. Single-threaded use (the simulation), but satisfies the concept fully.
class SimLanes {
 public:
  using Lane = SimLane;

  class Lease {
   public:
    Lease(Lease&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), index_(o.index_) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        release();
        owner_ = std::exchange(o.owner_, nullptr);
        index_ = o.index_;
      }
      return *this;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }
    [[nodiscard]] SimLane& lane() const noexcept { return owner_->lanes_[index_]; }
    [[nodiscard]] std::size_t index() const noexcept { return index_; }

   private:
    friend class SimLanes;
    Lease(SimLanes* o, std::size_t i) noexcept : owner_(o), index_(i) {}
    void release() noexcept {
      if (owner_ != nullptr) std::exchange(owner_, nullptr)->lanes_[index_].leased = false;
    }
    SimLanes* owner_;
    std::size_t index_;
  };

  SimLanes(std::size_t n, ManualClock clock) : clock_(std::move(clock)) {
    lanes_.resize(n);
    for (std::size_t i = 0; i < n; ++i) lanes_[i].index = i;
  }
  SimLanes(const SimLanes&) = delete;
  SimLanes& operator=(const SimLanes&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return lanes_.size(); }
  [[nodiscard]] std::size_t lane_capacity() const noexcept { return 1; }
  [[nodiscard]] std::optional<Lease> try_acquire() noexcept {
    const BatchTime now = clock_.now();
    for (auto& l : lanes_)
      if (!l.leased && l.busy_until <= now) {
        l.leased = true;
        return Lease(this, l.index);
      }
    return std::nullopt;
  }
  // Simulated time does not pass while waiting: the same as try_acquire().
  [[nodiscard]] std::optional<Lease> acquire_for(std::chrono::nanoseconds) noexcept { return try_acquire(); }

  // Lanes not running a batch at `now` (a leased lane about to run one counts as idle).
  [[nodiscard]] std::size_t idle_count(BatchTime now) const noexcept {
    return static_cast<std::size_t>(
        std::count_if(lanes_.begin(), lanes_.end(), [&](const SimLane& l) { return l.busy_until <= now; }));
  }
  [[nodiscard]] bool any_idle(BatchTime now) const noexcept {
    return std::any_of(lanes_.begin(), lanes_.end(), [&](const SimLane& l) { return l.busy_until <= now; });
  }
  // The earliest time after `now` at which a busy lane frees, or BatchTime::max().
  [[nodiscard]] BatchTime next_free_after(BatchTime now) const noexcept {
    BatchTime t = BatchTime::max();
    for (const auto& l : lanes_)
      if (l.busy_until > now) t = std::min(t, l.busy_until);
    return t;
  }

 private:
  ManualClock clock_;
  std::vector<SimLane> lanes_;
};

static_assert(LaneBackend<SimLanes>);

// The simulation's bookkeeping that the admission adapter and the callbacks reach.
template <class InnerTicket>
struct SimShared {
  struct Pending {
    BatchTime at;
    std::uint64_t order;
    std::optional<InnerTicket> ticket;
    Status status;
    std::chrono::nanoseconds latency;
  };
  struct Later {
    bool operator()(const Pending* a, const Pending* b) const noexcept {
      return a->at != b->at ? a->at > b->at : a->order > b->order;
    }
  };

  BatchTime current_finish{};    // the finish time of the batch being completed
  BatchTime current_arrival{};   // the arrival of the request being submitted
  std::uint64_t in_flight = 0;
  std::uint64_t max_in_flight = 0;
  std::uint64_t order = 0;
  std::vector<std::unique_ptr<Pending>> storage;
  std::priority_queue<Pending*, std::vector<Pending*>, Later> pending;
};

// Wraps the user's admission policy so that it sees each request complete at its modelled
// finish time with its modelled latency (the Pipeline, stepped in simulated time, hands
// tickets back when the model call returns, which in a simulation is before the batch has
// finished).
template <AdmissionPolicy A>
class SimAdmission {
 public:
  struct Ticket {
    std::optional<typename A::Ticket> inner;
    BatchTime arrival{};
  };

  SimAdmission(A& inner, SimShared<typename A::Ticket>& shared) noexcept : inner_(&inner), shared_(&shared) {}

  [[nodiscard]] std::optional<Ticket> try_admit() noexcept {
    std::optional<typename A::Ticket> t = inner_->try_admit();
    if (!t) return std::nullopt;
    shared_->max_in_flight = std::max(shared_->max_in_flight, ++shared_->in_flight);
    return std::optional<Ticket>(Ticket{std::move(t), shared_->current_arrival});
  }

  void release(Ticket&& t, Status status, std::chrono::nanoseconds latency) noexcept {
    if (status == Status::ok) {
      // The batch finishes later in simulated time: hand the ticket back then.
      const BatchTime finish = shared_->current_finish;
      latency = std::chrono::duration_cast<std::chrono::nanoseconds>(finish - t.arrival);
      try {
        auto p = std::make_unique<typename SimShared<typename A::Ticket>::Pending>();
        p->at = finish;
        p->order = shared_->order++;
        p->ticket = std::move(t.inner);
        p->status = status;
        p->latency = latency;
        shared_->pending.push(p.get());
        shared_->storage.push_back(std::move(p));
        return;
      } catch (...) {
        // Out of memory: release now rather than leak the permit.
      }
    }
    --shared_->in_flight;
    if (t.inner) inner_->release(std::move(*t.inner), status, latency);
  }

  // The Pipeline checks a limiter's cap against max_batch × lanes: forward it.
  [[nodiscard]] std::uint64_t max_limit() const noexcept
    requires requires(const A& a) { { a.max_limit() } -> std::convertible_to<std::uint64_t>; }
  {
    return static_cast<std::uint64_t>(inner_->max_limit());
  }

 private:
  A* inner_;
  SimShared<typename A::Ticket>* shared_;
};

// The policy as the simulated Pipeline sees it: the user's policy, with each view told
// how many simulated lanes are idle (BatchView::idle_lanes, lanes). Its own optional
// members are forwarded; feedback (on_batch_executed) is not: the simulator reports each
// executed batch itself, with its modelled time, from the model call.
template <BatchPolicy Policy>
class SimPolicy {
 public:
  static constexpr bool uses_cost = tailbatch::detail::policy_uses_cost<Policy>();

  SimPolicy(Policy p, const SimLanes* lanes) : inner_(std::move(p)), lanes_(lanes) {}

  [[nodiscard]] std::size_t max_batch() const noexcept { return inner_.max_batch(); }
  [[nodiscard]] BatchOrder order() const noexcept { return inner_.order(); }
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    BatchView w = v;
    w.lanes = lanes_->size();
    w.idle_lanes = lanes_->idle_count(v.now);
    return inner_.decide(w);
  }
  [[nodiscard]] std::size_t max_cost() const noexcept
    requires CostLimitedBatchPolicy<Policy>
  {
    return inner_.max_cost();
  }
  [[nodiscard]] std::size_t bucket_count() const noexcept
    requires BucketedBatchPolicy<Policy>
  {
    return inner_.bucket_count();
  }
  [[nodiscard]] std::size_t bucket_of(std::size_t cost) const noexcept
    requires BucketedBatchPolicy<Policy>
  {
    return inner_.bucket_of(cost);
  }
  [[nodiscard]] bool may_pad() const noexcept
    requires requires(const Policy& p) { { p.may_pad() } -> std::convertible_to<bool>; }
  {
    return inner_.may_pad();
  }

 private:
  Policy inner_;
  const SimLanes* lanes_;
};

}  // namespace tools::detail

// Runs the simulation: the arrivals of config.arrivals through a Pipeline with `policy`
// and `admission` on `config.lanes` modelled lanes, until every request has completed.
// The admission policy is used in place (a ConcurrencyLimiter keeps its learned limit);
// give a learning limiter config.clock as its clock. Single-threaded; allocates; costs
// a fraction of a microsecond of CPU per simulated request. Throws std::invalid_argument naming a bad field
// of config (or what the Pipeline's constructor throws, e.g. a limiter cap below
// max_batch × lanes). Not thread-safe with respect to `admission` and config.clock.
template <BatchPolicy Policy, AdmissionPolicy Admission>
[[nodiscard]] SimulationResult simulate(const SimulationConfig& config, Policy policy, Admission& admission) {
  using namespace std::chrono;
  if (!config.service_time) tailbatch::detail::throw_invalid_argument("SimulationConfig: service_time must be set");
  if (config.lanes < 1) tailbatch::detail::throw_invalid_argument("SimulationConfig: lanes must be >= 1");
  if (!config.latency_from.empty() && config.latency_from.size() != config.arrival_times.size())
    tailbatch::detail::throw_invalid_argument("SimulationConfig: latency_from must be empty or as long as arrival_times");
  if (!std::is_sorted(config.arrival_times.begin(), config.arrival_times.end()) ||
      (!config.arrival_times.empty() && config.arrival_times.front() < nanoseconds::zero()))
    tailbatch::detail::throw_invalid_argument("SimulationConfig: arrival_times must be ascending and >= 0");
  const nanoseconds arrivals_duration =
      config.arrival_times.empty() ? config.arrivals.duration() : config.arrival_times.back() + nanoseconds(1);
  if (config.warmup < nanoseconds::zero() || config.warmup >= arrivals_duration)
    tailbatch::detail::throw_invalid_argument("SimulationConfig: warmup must be >= 0 and shorter than the arrivals");
  if (config.lane_overhead < nanoseconds::zero())
    tailbatch::detail::throw_invalid_argument("SimulationConfig: lane_overhead must be >= 0");
  if (config.network < nanoseconds::zero()) tailbatch::detail::throw_invalid_argument("SimulationConfig: network must be >= 0");
  if (config.queue_capacity < 1) tailbatch::detail::throw_invalid_argument("SimulationConfig: queue_capacity must be >= 1");
  if (config.request_timeout < nanoseconds::zero())
    tailbatch::detail::throw_invalid_argument("SimulationConfig: request_timeout must be >= 0");
  if constexpr (detail::policy_uses_cost<Policy>()) {
    if (!config.request_cost)
      tailbatch::detail::throw_invalid_argument("SimulationConfig: request_cost must be set for a policy that reads request cost");
  }

  ManualClock clock = config.clock;
  using Shared = tools::detail::SimShared<typename Admission::Ticket>;
  Shared shared;
  tools::detail::SimAdmission<Admission> adm(admission, shared);
  tools::detail::SimLanes lanes(config.lanes, clock);

  const BatchTime start = clock.now();
  const BatchTime warm_end = start + config.warmup;
  SimulationResult r;
  r.batch_sizes.assign(policy.max_batch() + 1, 0);
  LatencyHistogram hist(config.histogram);
  BatchTime last_completion = start;
  nanoseconds busy{0};
  std::uint64_t real_in_batches = 0;

  // A copy that shares a learning policy's state: the model call reports to it.
  [[maybe_unused]] const Policy feedback = policy;
  auto model = [&](std::span<const tools::detail::SimRequest> reqs, std::span<tools::detail::SimResponse> resps,
                   tools::detail::SimLane& lane) {
    const std::size_t b = reqs.size();
    const auto service = duration_cast<nanoseconds>(config.service_time(b)) + config.lane_overhead;
    const BatchTime started = clock.now();
    const BatchTime finish = started + std::max(service, nanoseconds::zero());
    lane.busy_until = finish;
    busy += finish - clock.now();
    shared.current_finish = finish;
    for (std::size_t i = 0; i < resps.size(); ++i)
      resps[i].finish = config.completion_delay ? finish + std::max(config.completion_delay(i), nanoseconds::zero()) : finish;
    if (b >= r.batch_sizes.size()) r.batch_sizes.resize(b + 1, 0);
    ++r.batch_sizes[b];
    // Padding repeats the last real request: count the real ones.
    std::size_t real = b;
    while (real > 1 && reqs[real - 1].index == reqs[real - 2].index) --real;
    real_in_batches += real;
    if constexpr (BatchFeedbackPolicy<Policy>) {
      BatchFeedback f;
      f.size = real;
      f.padded_size = b;
      f.model_time = std::max(service, nanoseconds::zero());
      f.lane = lane.index;
      f.started = started;
      feedback.on_batch_executed(f);
    }
  };

  PipelineConfig<tools::detail::SimRequest> pc;
  pc.queue_capacity = config.queue_capacity;
  pc.workers = 0;
  pc.tenants = config.tenants;
  pc.queue = config.queue;
  struct PerTenant {
    SimulationTenantResult r;
    std::unique_ptr<LatencyHistogram> hist;
  };
  std::map<TenantId, PerTenant> per_tenant;
  if constexpr (detail::policy_uses_cost<Policy>()) {
    pc.request_cost = [&](const tools::detail::SimRequest& q) { return config.request_cost(q.index); };
  }
  using P = Pipeline<tools::detail::SimRequest, tools::detail::SimResponse, tools::detail::SimPolicy<Policy>, tools::detail::SimLanes,
                     tools::detail::SimAdmission<Admission>, ManualClock>;
  P pipeline(model, tools::detail::SimPolicy<Policy>(std::move(policy), &lanes), std::move(pc), lanes, adm, clock);

  // In-flight integral (admitted, not yet finished) over the measured window.
  double in_flight_area = 0.0;  // request-seconds
  BatchTime last_change = start;
  auto account = [&](BatchTime now) {
    if (now > warm_end) {
      const BatchTime from = std::max(last_change, warm_end);
      if (now > from) in_flight_area += static_cast<double>(shared.in_flight) * duration<double>(now - from).count();
    }
    last_change = std::max(last_change, now);
  };

  auto release_due = [&](BatchTime now) {
    while (!shared.pending.empty() && shared.pending.top()->at <= now) {
      auto* p = shared.pending.top();
      shared.pending.pop();
      account(p->at);
      --shared.in_flight;
      if (p->ticket) admission.release(std::move(*p->ticket), p->status, p->latency);
      p->ticket.reset();
    }
    if (shared.pending.empty()) shared.storage.clear();
  };

  ArrivalSchedule schedule(config.arrivals, config.seed);
  std::size_t replayed = 0;
  auto next_of = [&]() -> std::optional<nanoseconds> {
    if (config.arrival_times.empty()) return schedule.next();
    if (replayed < config.arrival_times.size()) return config.arrival_times[replayed++];
    return std::nullopt;
  };
  std::optional<nanoseconds> next_arrival = next_of();
  std::uint64_t index = 0;
  BatchTime next_due = BatchTime::max();
  for (;;) {
    BatchTime t = BatchTime::max();
    if (next_arrival && index < config.max_requests) t = std::min(t, start + *next_arrival);
    const BatchTime now0 = clock.now();
    t = std::min(t, lanes.next_free_after(now0));
    if (!shared.pending.empty()) t = std::min(t, shared.pending.top()->at);
    if (lanes.any_idle(now0) && next_due > now0) t = std::min(t, next_due);
    if (t == BatchTime::max()) break;
    ++r.events;
    account(t);
    clock.advance_to(t);
    const BatchTime now = clock.now();
    release_due(now);
    while (next_arrival && index < config.max_requests && start + *next_arrival <= now) {
      const BatchTime arrival = start + *next_arrival;
      const bool measured = arrival >= warm_end;
      const BatchTime counted_from =
          config.latency_from.empty() ? arrival : start + std::min(config.latency_from[index], *next_arrival);
      if (measured) ++r.arrivals;
      else ++r.warmup_arrivals;
      SubmitOptions so;
      if (config.request_timeout > nanoseconds::zero()) so.deadline = arrival + config.request_timeout;
      if (config.priority) so.priority = config.priority(index);
      PerTenant* tenant = nullptr;
      if (config.tenant) {
        so.tenant = config.tenant(index);
        if (measured) {
          PerTenant& pt = per_tenant[so.tenant];
          if (!pt.hist) {
            pt.r.tenant = so.tenant;
            pt.hist = std::make_unique<LatencyHistogram>(config.histogram);
          }
          ++pt.r.arrivals;
          tenant = &pt;
        }
      }
      shared.current_arrival = arrival;
      account(now);
      pipeline.submit(tools::detail::SimRequest{index}, so,
                      [&r, &hist, &last_completion, &config, counted_from, measured, tenant](
                          Outcome<tools::detail::SimResponse>&& o) noexcept {
                        if (!measured) return;
                        ++r.by_status[static_cast<std::size_t>(o.status())];
                        if (tenant != nullptr) ++tenant->r.by_status[static_cast<std::size_t>(o.status())];
                        if (o.status() == Status::rejected) ++r.rejected_by_reason[static_cast<std::size_t>(o.reason())];
                        if (!o.ok()) return;
                        const BatchTime done = o.value().finish;
                        last_completion = std::max(last_completion, done);
                        const auto latency = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            done - counted_from + config.network);
                        hist.record(latency);
                        const bool good = config.goodput_within <= nanoseconds::zero() || latency <= config.goodput_within;
                        if (good) ++r.good;
                        if (tenant != nullptr) {
                          ++tenant->r.ok;
                          if (good) ++tenant->r.good;
                          tenant->hist->record(latency);
                        }
                      });
      ++index;
      next_arrival = next_of();
    }
    const PipelinePollResult pr = pipeline.poll();
    next_due = pr.next_due;
  }
  // Nothing is queued any more (a policy that never dispatches is flushed here); hand the
  // remaining tickets back at their times.
  pipeline.shutdown();
  while (!shared.pending.empty()) {
    clock.advance_to(shared.pending.top()->at);
    release_due(clock.now());
  }
  const BatchTime end = std::max(clock.now(), last_completion);
  const PipelineStats stats = pipeline.stats();

  r.ok = r.by_status[static_cast<std::size_t>(Status::ok)];
  r.latency = hist.snapshot();
  const double ps[] = {50.0, 95.0, 99.0};
  nanoseconds out[3];
  r.latency.percentiles(ps, out);
  r.p50 = out[0];
  r.p95 = out[1];
  r.p99 = out[2];
  r.mean = r.latency.mean();
  r.max = r.latency.max();
  const BatchTime profile_end = start + arrivals_duration;
  const double offered_s = duration<double>(profile_end - warm_end).count();
  r.offered_rps = offered_s > 0 ? static_cast<double>(r.arrivals) / offered_s : 0.0;
  const BatchTime window_end = std::max(profile_end, last_completion);
  const double window_s = duration<double>(window_end - warm_end).count();
  r.throughput_rps = window_s > 0 ? static_cast<double>(r.ok) / window_s : 0.0;
  r.goodput_rps = window_s > 0 ? static_cast<double>(r.good) / window_s : 0.0;
  for (auto& [id, pt] : per_tenant) {
    pt.r.latency = pt.hist->snapshot();
    if (pt.r.latency.count() > 0) {
      nanoseconds q[3];
      pt.r.latency.percentiles(ps, q);
      pt.r.p50 = q[0];
      pt.r.p95 = q[1];
      pt.r.p99 = q[2];
    }
    r.tenants.push_back(std::move(pt.r));
  }
  r.batches = stats.batches();
  for (std::size_t i = 0; i < dispatch_reason_count; ++i) r.batches_by_reason[i] = stats.batches_by_reason[i];
  r.mean_batch_size = r.batches ? static_cast<double>(real_in_batches) / static_cast<double>(r.batches) : 0.0;
  r.simulated = duration_cast<nanoseconds>(end - start);
  const double total_s = duration<double>(end - start).count();
  r.lane_utilization = total_s > 0 ? duration<double>(busy).count() / (total_s * static_cast<double>(config.lanes)) : 0.0;
  const double measured_s = duration<double>(end - warm_end).count();
  r.mean_in_flight = measured_s > 0 ? in_flight_area / measured_s : 0.0;
  r.max_in_flight = shared.max_in_flight;
  return r;
}

// simulate() with no admission control (AdmitAll). Thread-safe apart from config.clock.
template <BatchPolicy Policy>
[[nodiscard]] SimulationResult simulate(const SimulationConfig& config, Policy policy) {
  AdmitAll all;
  return simulate(config, std::move(policy), all);
}

}  // namespace tailbatch
