// ContinuousBatcher: iteration-level (continuous) batching for generative models.
//
// A decode loop keeps a set of active sequences. Between two calls of the user's
// step(std::span<Sequence>), it retires the sequences that finished, were cancelled or ran
// past their deadline, and admits waiting ones while the active set stays within
// max_active and the token budget. Each sequence's tokens reach its caller through a
// TokenStreamer as the step emits them. This is the scheduling half of what vLLM, TGI and
// TensorRT-LLM do inside their engines; the model half is the user's step function.
//
//   caller ──submit(request)──▶ waiting queue (bounded; FIFO with priority head starts)
//        ◀── TokenStreamer ───  │ admitted between steps within max_active + token budget
//                               ▼
//                  active set ──step(span<Sequence>)──▶ user's engine: prefill chunk or
//                               ▲                      decode one token; seq.emit(token)
//                               └── retire: finished / cancelled / deadline / failed
//
// Token budget. Each sequence reserves prompt + max_new_tokens tokens of the budget (the
// KV-cache analogue) from admission to retirement, as TGI's max_batch_total_tokens does, so
// a running sequence never has to be preempted for lack of room. A sequence whose
// reservation exceeds the whole budget is rejected at once (RejectReason::too_large).
//
// KV cache. With ContinuousBatcherConfig::kv (docs/kv-cache.md) the batcher schedules by a
// KvBlockPool instead: admission by the prompt's blocks (grow, with a watermark) or by
// prompt + max_new_tokens booked (reserve); before each step every decoding sequence gets
// the block its next token needs, and in grow mode, when the pool is dry, the least
// important running sequence (lowest priority, then newest admitted) is preempted: its
// blocks freed, it returns to the front of the queue and later recomputes its prompt and
// output (prefill_input()), its stream unaffected. Full prompt blocks are shared between
// requests with the same prefix. The step sees each sequence's block_table() and
// cached_tokens() (prefill starts there).
//
// Chunked prefill. With max_step_tokens and/or prefill_chunk set, a step processes at most
// that many prompt + decode tokens (decoding sequences first, one token each) and at most
// prefill_chunk prompt tokens per sequence, so that a long prompt is spread over several
// steps instead of stalling everyone else's next token.
//
// Per-request options. submit(request, options) takes the same SubmitOptions as
// Pipeline::submit (submit_options.hpp): deadline, timeout, arrival, priority, cancel. As
// everywhere in tailbatch, the `deadline` is a latest start: the latest time the sequence
// may be admitted into the active set (its first step follows with no user code in
// between). A sequence admitted in time runs to its end. A bound on the whole generation
// belongs to the generation request itself, Request::completion_deadline: a sequence
// still active at it is retired at the next step boundary. `timeout` bounds the deadline
// relative to the arrival; a negative one (a budget already spent upstream) expires the
// request at once.
//
// Outcomes. Every submitted sequence completes exactly once, through its stream's close:
// ok (finished, or max_new_tokens reached), rejected (queue_full, too_large,
// shutting_down), deadline_exceeded (not admitted by its deadline, or still active at its
// completion_deadline: retired at the next step boundary, the tokens already emitted stay
// delivered), cancelled (by its consumer; it leaves the active set before the next step),
// failed (the step threw, or called seq.fail(); the loop lives on).
//
// Load. stats() carries the time integral of the sequences in flight (active +
// waiting) and the sequences that left, so that two readings give the mean in flight and
// the throughput over the same window (load_between()): the inputs of the Little's-law
// check (check_littles_law in littles_law.hpp).
//
// Threads. ContinuousBatcherConfig::workers chooses them, as PipelineConfig::workers does:
// unset, the default for the clock (the one decode thread with SteadyClock, none with any
// other); 1, the decode thread; 0, none. The constructor starts the decode thread, which
// runs step() and the stream callbacks; shutdown() (or the destructor) stops and joins it.
// With no thread the caller drives the loop with poll() (deterministic tests on
// ManualClock, or a loop the caller owns).
//
// Why this file is longer than the core's usual 700 lines: about 730 of its lines are the
// ContinuousBatcher class: the step loop that admits, steps, streams and retires
// sequences, with the state every step reads (the waiting and active sets, the load
// integrals, the drain), its stats and its shutdown (about 200 of the file's lines are
// documentation); the waiting set's ordering stands alone (detail/continuous/waiting.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tailbatch/clock.hpp>
#include <tailbatch/detail/continuous/kv.hpp>
#include <tailbatch/detail/continuous/waiting.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/outcome_ledger.hpp>
#include <tailbatch/detail/request_intake.hpp>
#include <tailbatch/detail/tenant_series.hpp>
#include <tailbatch/detail/tenant_quotas.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/detail/time.hpp>
#include <tailbatch/kv_block_pool.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/littles_law.hpp>
#include <tailbatch/load.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/submit_options.hpp>
#include <tailbatch/tenants.hpp>
#include <tailbatch/token_streamer.hpp>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace tailbatch {

namespace detail {
// The KV pool of a ContinuousBatcher over Token: KvBlockPool<Token>, or NoKvPool.
template <class Token, bool = KvToken<Token>>
struct KvPoolFor {
  using type = NoKvPool;
};
template <class Token>
struct KvPoolFor<Token, true> {
  using type = KvBlockPool<Token>;
};
}  // namespace detail

// The per-sequence state of an engine that keeps none in the batcher.
struct NoSequenceState {};

// How a ContinuousBatcher budgets KV-cache memory (docs/kv-cache.md).
enum class KvMode : std::uint8_t {
  off,      // no KV pool: the token budget decides admission
  grow,     // vLLM: blocks as sequences grow; preempt (and later recompute) when the pool runs dry
  reserve,  // TGI: prompt + max_new_tokens booked at admission; never preempts
};

// A short, stable, lower-case name ("grow"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(KvMode m) noexcept {
  switch (m) {
    case KvMode::off:
      return "off";
    case KvMode::grow:
      return "grow";
    case KvMode::reserve:
      return "reserve";
  }
  return "unknown";
}

// The KV block pool a ContinuousBatcher schedules by (ContinuousBatcherConfig::kv). Plain
// values; checked at construction. With a mode other than off the batcher owns a
// KvBlockPool<Token> of this shape (or uses the one passed to its constructor, whose shape
// wins), the token budget no longer applies, and each step's sequences carry their block
// tables (Sequence::block_table()) and cached prompt tokens (Sequence::cached_tokens()).
struct ContinuousKvConfig {
  KvMode mode = KvMode::off;
  // Tokens per block. Must be >= 1.
  std::size_t block_size = 16;
  // Blocks in the pool: the engine's KV memory / one block's KV. Must be >= 1 when mode is
  // not off and the batcher owns the pool.
  std::size_t total_blocks = 0;
  // grow: blocks that must stay available after admitting a sequence, so that the running
  // ones can grow for a while before anything is preempted (vLLM keeps 1 % of the pool).
  // Ignored while nothing runs (it would only keep the pool idle). Must be < total_blocks.
  std::size_t watermark_blocks = 0;
  // Share the full blocks of equal prompt prefixes (KvBlockPoolConfig::prefix_caching).
  bool prefix_caching = true;
};

// How a ContinuousBatcher schedules. Plain values; checked at construction.
struct ContinuousBatcherConfig {
  // Most sequences in the active set (the decode batch). Must be >= 1.
  std::size_t max_active = 16;
  // Tokens the active set may reserve: each sequence reserves prompt + max_new_tokens.
  // Must be >= 1.
  std::size_t token_budget = 65536;
  // Most sequences waiting for admission; a submit beyond it is rejected (queue_full) with
  // a retry-after hint. Must be >= 1.
  std::size_t queue_capacity = 1024;
  // Most prompt + decode tokens in one step; 0: no limit. Decoding sequences are served
  // first, so it must be 0 or >= max_active.
  std::size_t max_step_tokens = 0;
  // Most prompt tokens of one sequence in one step; 0: the whole rest of the prompt.
  std::size_t prefill_chunk = 0;
  // What one priority level is worth in waiting time (see detail/continuous/waiting.hpp): a
  // Priority::high sequence is served as if it had arrived priority_step earlier, a
  // Priority::low one as if priority_step later, than a Priority::normal one. Must be >= 0.
  std::chrono::nanoseconds priority_step{std::chrono::milliseconds(100)};
  // How long shutdown() lets active sequences finish before it cancels them. Must be >= 0.
  std::chrono::nanoseconds drain_timeout{std::chrono::seconds(10)};
  // Stream options for requests that do not bring their own.
  TokenStreamerConfig stream{};
  // KV-cache memory as the admission resource (ContinuousKvConfig); off by default.
  ContinuousKvConfig kv{};
  // The decode thread, started by the constructor. Unset: the default for the clock, 1
  // with SteadyClock, 0 with any other. 0: no thread, the caller drives poll(). At most 1
  // (std::invalid_argument "workers" otherwise). The decode thread only waits for work,
  // never on the clock, so 1 is allowed with any clock. Same field, same meaning, in
  // PipelineConfig.
  std::optional<std::size_t> workers{};
  // Metrics (tailbatch_generation_*, tailbatch_stream_*), registered at construction with
  // metric_labels added to each (e.g. {{"model", "chat"}}). nullptr: none, at no cost. The
  // registry must outlive the batcher.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
  // Tenants (tenants.hpp): fair scheduling of the waiting queue across tenants, and
  // per-tenant quotas (max_queued: waiting sequences; max_in_flight: waiting + active).
  TenantsConfig tenants{};
  // Fair scheduling: a sequence costs its prompt tokens plus this many times its output
  // tokens (generation is dearer per token than prefill). Finite and >= 0.
  double output_token_cost = 2.0;
};

// What one ContinuousBatcher::poll() did (the counterpart of the Pipeline's PipelinePollResult).
struct ContinuousBatcherPollResult {
  std::size_t admitted = 0;     // sequences moved from waiting to active
  std::size_t scheduled = 0;    // sequences handed to step()
  std::size_t step_tokens = 0;  // prompt + decode tokens in that step
  std::size_t emitted = 0;      // tokens emitted by the step
  std::size_t completed = 0;    // sequences completed (any status) during the call
  bool stepped = false;         // step() was called
  bool failed = false;          // step() threw
};

// Totals since construction: the outcome counts every front door shares (OutcomeCounts,
// outcome.hpp, as PipelineStats), and the batcher's own. Exact once shutdown() has
// returned; while the batcher runs the counters are read without a lock (each racy with the
// others); the four load fields are read together under the batcher's lock, so they are
// consistent with one another.
struct ContinuousBatcherStats : OutcomeCounts {
  std::uint64_t admitted = 0;                         // sequences moved into the active set
  std::uint64_t steps = 0;                            // step() calls
  std::uint64_t tokens = 0;                           // tokens emitted
  // KV pool (all zero with KvMode::off): preemptions (grow mode) and the tokens whose KV
  // was computed again after one (prompt and generated tokens re-prefilled, less what the
  // prefix cache still held), and the pool's own counts (blocks total/used/cached, prefix
  // lookups and hits).
  std::uint64_t preemptions = 0;
  std::uint64_t recomputed_tokens = 0;
  KvBlockPoolStats kv{};

  // Load, for Little's law (take two readings and call load_between()). "In flight" is a
  // sequence in the waiting queue or the active set: from a submit that queued it to the
  // moment it leaves the active set or the queue. A request completed inside submit()
  // (rejected, expired, max_new_tokens 0) is never in flight and is not counted here.
  std::chrono::nanoseconds observed_at{0};  // the batcher clock's reading (since its epoch)
  double in_flight_seconds = 0.0;           // integral of (active + waiting) over time, sequence-seconds
  std::uint64_t departed = 0;               // sequences that left (any status) after being queued
  double time_in_system_seconds = 0.0;      // the departed sequences' total time from submit to leaving
};

// A ContinuousBatcher's load over the window between two stats readings.
struct ContinuousBatcherLoad {
  std::chrono::nanoseconds window{0};  // later.observed_at - earlier.observed_at
  double mean_in_flight = 0.0;         // time-averaged active + waiting sequences (L)
  double throughput_per_s = 0.0;       // sequences that left per second (lambda)
  std::uint64_t departed = 0;          // sequences that left in the window
  // Their mean time from submit to leaving (W as the batcher sees it; it includes time
  // before the window for sequences submitted before it). Zero when none left.
  std::chrono::nanoseconds mean_time_in_system{0};
};

// The load between two readings of the same batcher's stats(), `earlier` taken
// first. A window that is not positive (readings out of order, or the same instant)
// gives all zeros. Feed it to check_littles_law(load.throughput_per_s, mean_latency,
// load.mean_in_flight) with the mean latency your server measured over the same window
// (see docs/continuous-batching.md). Never allocates. Thread-safe (a pure function).
[[nodiscard]] inline ContinuousBatcherLoad load_between(const ContinuousBatcherStats& earlier,
                                                        const ContinuousBatcherStats& later) noexcept {
  ContinuousBatcherLoad load;
  if (later.observed_at <= earlier.observed_at) return load;
  load.window = later.observed_at - earlier.observed_at;
  const double seconds = std::chrono::duration<double>(load.window).count();
  load.mean_in_flight = std::max(0.0, later.in_flight_seconds - earlier.in_flight_seconds) / seconds;
  load.departed = later.departed >= earlier.departed ? later.departed - earlier.departed : 0;
  load.throughput_per_s = static_cast<double>(load.departed) / seconds;
  if (load.departed > 0) {
    const double total = std::max(0.0, later.time_in_system_seconds - earlier.time_in_system_seconds);
    load.mean_time_in_system =
        std::chrono::nanoseconds(detail::llround(total * 1e9 / static_cast<double>(load.departed)));
  }
  return load;
}

// The continuous batcher. Token: what the engine emits (e.g. std::int32_t). State: per
// sequence data the engine keeps with it (moved in from the request, handed back in every
// step). C: the clock that times deadlines, priorities and metrics.
//
// Thread-safety: submit(), shutdown(), the observers and stats() are thread-safe; poll()
// calls are serialized internally (one step at a time) and do nothing while the decode
// thread runs.
// Exceptions: the constructor throws std::invalid_argument naming a bad config field
// (std::system_error if the decode thread cannot start);
// submit() throws std::bad_alloc only, and reports every outcome through the stream (bad
// per-request stream options included: Status::failed); an exception from step() fails the
// sequences of that step and is not rethrown.
template <class Token, class State = NoSequenceState, Clock C = SteadyClock>
class ContinuousBatcher {
 public:
  using token_type = Token;
  using state_type = State;
  using clock_type = C;
  using time_point = typename C::time_point;
  using duration = typename C::duration;
  using Stream = TokenStreamer<Token, C>;
  // The KV block pool of this token type: KvBlockPool<Token>, or (for a token type the pool
  // cannot hold) an empty stand-in, so that KvMode::off costs nothing.
  using KvPool = typename detail::KvPoolFor<Token>::type;

  // One generation request: what to generate. How it is scheduled (latest start,
  // timeout, arrival, priority, cancellation) travels beside it in SubmitOptions, as for
  // the Pipeline; only the generation's own end bound, completion_deadline, lives here.
  struct Request {
    std::vector<Token> prompt;
    std::size_t max_new_tokens = 16;  // the sequence ends ok after this many tokens
    State state{};                    // handed to the engine as seq.state()
    // The time by which the whole generation must be over: a sequence still active then is
    // retired at the next step boundary with Status::deadline_exceeded (the tokens already
    // emitted stay delivered), and one still waiting is dropped. time_point::max(): none.
    time_point completion_deadline = time_point::max();
    std::optional<TokenStreamerConfig> stream;  // default: the config's
  };

  // One sequence as the step function sees it. Valid only during the step() call.
  // Not thread-safe: the step function may hand sequences to its own threads, one thread
  // per sequence at a time.
  class Sequence {
   public:
    // Submission order, from 1. Never blocks.
    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
    // The request's prompt.
    [[nodiscard]] std::span<const Token> prompt() const noexcept {
      return std::span<const Token>(prompt_).first(prompt_size_);
    }
    [[nodiscard]] Priority priority() const noexcept { return priority_; }
    [[nodiscard]] TenantId tenant() const noexcept { return tenant_; }
    [[nodiscard]] std::size_t max_new_tokens() const noexcept { return max_new_; }
    // The latest admission time (already met: the sequence is running). Never blocks.
    [[nodiscard]] time_point deadline() const noexcept { return deadline_; }
    // When the sequence is retired if still active (time_point::max(): never). Never blocks.
    [[nodiscard]] time_point completion_deadline() const noexcept { return completion_deadline_; }
    // What prefill computes: the prompt, or after a preemption (KvMode::grow) the prompt
    // followed by every token generated so far, whose KV is computed again (recompute).
    // The stream never sees the recomputed tokens twice: the step that ends this prefill
    // emits the next new token.
    [[nodiscard]] std::span<const Token> prefill_input() const noexcept { return prompt_; }
    // Prefill input tokens processed by earlier steps, or already in the KV cache
    // (cached_tokens()): prefill continues from here.
    [[nodiscard]] std::size_t prefilled() const noexcept { return prefilled_; }
    // The prefill input tokens to process in this step (empty once prefill is done).
    [[nodiscard]] std::span<const Token> prefill_chunk() const noexcept {
      return std::span<const Token>(prompt_).subspan(prefilled_, chunk_);
    }
    // True if the prefill input was fully processed before this step: the step feeds the
    // last emitted token and emits the next one.
    [[nodiscard]] bool decoding() const noexcept { return prefilled_ == prompt_.size(); }
    // True if this step should emit a token: decoding, or its prefill chunk ends the input.
    [[nodiscard]] bool emits() const noexcept { return prefilled_ + chunk_ == prompt_.size(); }
    // The sequence's blocks in the KV pool, in token order: token t's KV lives in block
    // block_table()[t / block_size] at offset t % block_size, where t counts the prompt
    // and then the generated tokens. The table holds every position this step writes.
    // Empty with KvMode::off. Valid during this step only.
    [[nodiscard]] std::span<const KvBlockId> block_table() const noexcept {
      return table_.blocks();
    }
    // Leading prefill input tokens whose KV was already in shared blocks when the sequence
    // was admitted (prefix reuse): prefill started at this position, and the engine reads
    // their KV from the blocks instead of computing it. 0 with KvMode::off.
    [[nodiscard]] std::size_t cached_tokens() const noexcept { return cached_; }
    // The position (index in prompt + generated tokens, as in block_table()) of the first
    // token this step feeds: prefilled() while prefilling; while decoding the position of
    // the last emitted token, prompt().size() + generated() - 1.
    [[nodiscard]] std::size_t position() const noexcept {
      if (!decoding()) return prefilled_;
      const std::size_t fed = prompt_size_ + generated_;
      return fed == 0 ? 0 : fed - 1;
    }
    // Times this sequence was preempted (KvMode::grow) and recomputed.
    [[nodiscard]] std::size_t preemptions() const noexcept { return preemptions_; }
    // Tokens emitted so far.
    [[nodiscard]] std::size_t generated() const noexcept { return generated_; }
    // The engine's per-sequence state.
    [[nodiscard]] State& state() noexcept { return state_; }
    [[nodiscard]] const State& state() const noexcept { return state_; }

    // Streams one token to the caller (timed for the metrics). Returns false when the
    // sequence should stop: max_new_tokens reached, cancelled, or its stream refused the
    // token (closed by a slow consumer or a throwing callback). A token refused or beyond
    // max_new_tokens is dropped. Never blocks; allocates while the stream buffer grows.
    bool emit(Token token) noexcept {
      if (stop_ || generated_ >= max_new_) return false;
      if constexpr (!std::is_same_v<KvPool, detail::NoKvPool>) {
        // Kept for a recompute after a preemption.
        if (kv_ && detail::call_guarded([&] { output_.push_back(token); }, [](const char*) {})) {
          fail("ContinuousBatcher: out of memory keeping the generated tokens");
          stop_ = true;
          return false;
        }
      }
      if (!stream_->push(std::move(token))) {
        stop_ = true;
        return false;
      }
      ++generated_;
      ++emitted_in_step_;
      if (generated_ >= max_new_) stop_ = true;
      return !stop_;
    }
    // Ends the sequence with Status::ok after this step (end of sequence).
    void finish() noexcept { finished_ = true; }
    // Ends the sequence with Status::failed and this message after this step; the rest of
    // the batch is unaffected. Allocates the message.
    void fail(std::string message) noexcept {
      if (detail::call_guarded([&] { failure_ = std::move(message); }, [](const char*) {})) failure_ = std::string();
    }

    Sequence(Sequence&&) noexcept = default;
    Sequence& operator=(Sequence&&) noexcept = default;

   private:
    friend class ContinuousBatcher;
    Sequence() = default;

    std::uint64_t id_ = 0;
    std::vector<Token> prompt_;
    std::size_t max_new_ = 0;
    State state_{};
    Priority priority_ = Priority::normal;
    TenantId tenant_ = 0;
    detail::CbatchKey key_{};  // its key in the waiting queue
    time_point deadline_{};
    time_point completion_deadline_{};
    time_point submitted_{};  // its arrival (SubmitOptions::arrival, else the submit)
    time_point queued_at_{};  // the submit: when it entered the waiting queue
    time_point admitted_at_{};  // when it entered the active set
    std::shared_ptr<Stream> stream_;
    std::size_t reserved_ = 0;
    std::size_t prefilled_ = 0;
    std::size_t chunk_ = 0;
    std::size_t generated_ = 0;
    std::size_t emitted_in_step_ = 0;
    bool scheduled_ = false;
    bool stop_ = false;
    bool finished_ = false;
    bool retired_ = false;
    bool dropped_for_stop_ = false;  // left the waiting queue because of shutdown
    std::optional<std::string> failure_;
    // KV pool (KvMode other than off).
    bool kv_ = false;              // grow mode: output_ is kept
    bool preempted_ = false;       // gave up its blocks in this turn
    std::size_t prompt_size_ = 0;  // prompt_ holds the prompt, then (after a preemption) the output
    std::size_t cached_ = 0;
    std::size_t computed_ = 0;  // tokens whose KV it held when it was preempted
    std::size_t preemptions_ = 0;
    std::uint64_t admission_no_ = 0;
    typename KvPool::BlockTable table_{};
    std::vector<Token> output_;  // the generated tokens, for a recompute
  };

  using StepFn = std::function<void(std::span<Sequence>)>;

  // Validates config (std::invalid_argument naming the field), registers metrics if
  // config.metrics is set, and starts the decode thread if config.workers asks for it
  // (see ContinuousBatcherConfig::workers; std::system_error if it cannot start).
  // Allocates.
  explicit ContinuousBatcher(StepFn step, ContinuousBatcherConfig config = {}, C clock = C{})
      : ContinuousBatcher(std::move(step), std::move(config), nullptr, std::move(clock)) {}

  // As above, scheduling by a KV block pool the caller owns (config.kv.mode must not be
  // off; the pool's block size, block count and prefix caching replace config.kv's, and
  // its metrics are the pool's own). The pool must outlive the batcher, and nothing else
  // may use it meanwhile: the batcher's stepping thread is its one owner.
  ContinuousBatcher(StepFn step, ContinuousBatcherConfig config, KvPool& pool, C clock = C{})
      : ContinuousBatcher(std::move(step), std::move(config), &pool, std::move(clock)) {}

 private:
  ContinuousBatcher(StepFn step, ContinuousBatcherConfig config, KvPool* pool, C clock)
      : config_(validated(std::move(config), pool)),
        step_(std::move(step)),
        clock_(std::move(clock)) {
    if (!step_) detail::throw_invalid_argument("ContinuousBatcher: step must be callable");
    if constexpr (!std::is_same_v<KvPool, detail::NoKvPool>) {
      if (config_.kv.mode != KvMode::off) {
        if (pool == nullptr) {
          KvBlockPoolConfig pc;
          pc.block_size = config_.kv.block_size;
          pc.total_blocks = config_.kv.total_blocks;
          pc.prefix_caching = config_.kv.prefix_caching;
          pc.metrics = config_.metrics;
          pc.metric_labels = config_.metric_labels;
          own_pool_ = std::make_unique<KvPool>(std::move(pc));
          pool = own_pool_.get();
        }
        pool_ = pool;
      }
    }
    active_.reserve(config_.max_active);
    if (config_.tenants.scheduling == Scheduling::fair) fair_.emplace(config_.tenants, config_.output_token_cost);
    if (config_.metrics) register_metrics(*config_.metrics);
    if (config_.workers.value_or(std::is_same_v<C, SteadyClock> ? 1 : 0) == 1) {
      started_ = true;
      thread_ = std::thread([this] { run(); });
    }
  }

 public:
  ContinuousBatcher(const ContinuousBatcher&) = delete;
  ContinuousBatcher& operator=(const ContinuousBatcher&) = delete;

  // Shuts down (see shutdown()): blocks until every sequence has completed.
  ~ContinuousBatcher() { shutdown(); }

  // Queues a request with these options (SubmitOptions, the Pipeline's) and returns its
  // pull-mode stream. Every outcome, rejection included, arrives through the stream (a
  // rejected stream is closed before submit returns). Never blocks on the decode loop
  // beyond a short lock. Bad per-request stream options (request.stream) complete the
  // stream at once with Status::failed and a message naming the field. Throws
  // std::bad_alloc only. Thread-safe.
  [[nodiscard]] std::shared_ptr<Stream> submit(Request request, SubmitOptions options = {}) {
    return submit_impl(std::move(request), options, StreamCallbacks<Token>{});
  }

  // Like submit(request, options), in callback mode: on_tokens and on_end run on the
  // decode thread (or in poll()'s caller; on the submitting thread for a request rejected
  // at once). The returned stream serves cancel() and end(). Thread-safe.
  std::shared_ptr<Stream> submit(Request request, SubmitOptions options, StreamCallbacks<Token> callbacks) {
    return submit_impl(std::move(request), options, std::move(callbacks));
  }

  // As above, with default options. Thread-safe.
  std::shared_ptr<Stream> submit(Request request, StreamCallbacks<Token> callbacks) {
    return submit_impl(std::move(request), SubmitOptions{}, std::move(callbacks));
  }

  // Manual stepping (no decode thread): one turn of the loop, in this thread: retires
  // cancelled and expired sequences, admits waiting ones, calls step() once if any
  // sequence has work, and retires what finished. Returns at once with nothing done in a
  // batcher that has its decode thread. Blocks for the step's duration; allocates only as
  // the active set grows (std::bad_alloc). Thread-safe (calls are serialized).
  ContinuousBatcherPollResult poll() {
    if (started_) return {};
    std::lock_guard step_lock(step_mutex_);
    return turn();
  }

  // Stops taking requests (later submits are rejected with shutting_down), rejects every
  // waiting sequence with shutting_down, lets active sequences run until they finish or
  // drain_timeout passes, then cancels the rest. In threaded mode the decode thread does
  // this and is joined; in manual mode the calling thread drives the steps. Blocks until
  // every sequence has completed: bounded by drain_timeout plus one step. Idempotent; a
  // second caller waits for the first to finish. Never throws. Thread-safe.
  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex_);
      if (!stopping_) {
        stopping_ = true;
        drain_deadline_ = detail::saturating_add(clock_.now(), config_.drain_timeout);
      }
    }
    cv_.notify_all();
    std::lock_guard control(control_mutex_);
    if (started_) {
      if (thread_.joinable()) thread_.join();
      return;
    }
    std::lock_guard step_lock(step_mutex_);
    while (!idle_locked()) {
      // Only allocation failures can throw here (step() exceptions are caught in turn()).
      if (detail::call_guarded([&] { (void)turn(); }, [](const char*) {})) std::this_thread::yield();
    }
  }

  // Sequences in the active set. Thread-safe; racy by nature.
  [[nodiscard]] std::size_t active_approx() const noexcept { return active_count_.load(std::memory_order_relaxed); }
  // Sequences waiting for admission. Thread-safe; racy by nature.
  [[nodiscard]] std::size_t waiting_approx() const noexcept { return waiting_count_.load(std::memory_order_relaxed); }
  // Tokens reserved by the active set. Thread-safe; racy by nature.
  [[nodiscard]] std::size_t reserved_tokens_approx() const noexcept { return reserved_.load(std::memory_order_relaxed); }
  // Totals since construction, and the load integrals up to now (see
  // ContinuousBatcherStats). The counters are racy with one another; the load fields are
  // read under the batcher's lock (a short wait behind a submit or an admission). Never
  // allocates. Thread-safe.
  [[nodiscard]] ContinuousBatcherStats stats() const noexcept {
    ContinuousBatcherStats s;
    s.submitted = submitted_.load(std::memory_order_relaxed);
    s.admitted = admitted_total_.load(std::memory_order_relaxed);
    s.steps = steps_.load(std::memory_order_relaxed);
    s.tokens = tokens_.load(std::memory_order_relaxed);
    s.preemptions = preemptions_total_.load(std::memory_order_relaxed);
    s.recomputed_tokens = recomputed_total_.load(std::memory_order_relaxed);
    if constexpr (!std::is_same_v<KvPool, detail::NoKvPool>) {
      if (pool_ != nullptr) s.kv = pool_->stats();
    }
    ledger_.fill(s.by_status, s.rejected_by_reason);
    const LoadReading r = load();
    s.observed_at = std::chrono::duration_cast<std::chrono::nanoseconds>(r.at.time_since_epoch());
    s.in_flight_seconds = r.in_system_s;
    s.departed = r.completed;
    s.time_in_system_seconds = r.latency_s;
    return s;
  }
  // The time integrals of the sequences in flight (LoadReading, load.hpp, the Pipeline's
  // shape), read now: in_system_s integrates waiting + active sequences, executing_s the
  // active set, completed counts the sequences that left after being queued, latency_s
  // their times from submit to leaving. Two readings give L, lambda and W over the window
  // between (load_between). A request completed inside submit() is never counted. Takes
  // a short lock; never allocates. Thread-safe.
  [[nodiscard]] LoadReading load() const noexcept { return ledger_.load(as_batch_time(clock_.now())); }

  // The Little's-law check (littles_law.hpp) on this batcher's own load over the window
  // since the previous call (the first: since construction): L = mean sequences in
  // flight, lambda = departures per second, W = their mean time from submit to leaving.
  // A deviation means time the batcher cannot see; call it every 10-60 s. Allocates the
  // explanation. Throws std::invalid_argument unless threshold > 0. Thread-safe.
  LittlesLawCheck check_littles_law(double threshold = 0.2) {
    return ledger_.check_littles_law(as_batch_time(clock_.now()), threshold);
  }

  // The number of worker threads, as Pipeline::worker_count(): 1 (the decode thread) or 0
  // (stepped by poll()). Thread-safe.
  [[nodiscard]] std::size_t worker_count() const noexcept { return started_ ? 1 : 0; }
  // The validated configuration. Thread-safe.
  [[nodiscard]] const ContinuousBatcherConfig& config() const noexcept { return config_; }

 private:
  using Waiting = detail::CbatchWaiting<Sequence>;

  static ContinuousBatcherConfig validated(ContinuousBatcherConfig c, const KvPool* pool) {
    if (c.kv.mode != KvMode::off) {
      if constexpr (std::is_same_v<KvPool, detail::NoKvPool>) {
        detail::throw_invalid_argument(
            "ContinuousBatcher: kv.mode needs a token type the KV pool can hold (KvToken)");
      } else {
        if (pool != nullptr) {
          c.kv.block_size = pool->block_size();
          c.kv.total_blocks = pool->total_blocks();
          c.kv.prefix_caching = pool->prefix_caching();
        }
        if (c.kv.block_size < 1)
          detail::throw_invalid_argument("ContinuousBatcher: kv.block_size must be >= 1");
        if (c.kv.total_blocks < 1)
          detail::throw_invalid_argument("ContinuousBatcher: kv.total_blocks must be >= 1");
        if (c.kv.watermark_blocks >= c.kv.total_blocks)
          detail::throw_invalid_argument(
              "ContinuousBatcher: kv.watermark_blocks must be < kv.total_blocks");
      }
    } else if (pool != nullptr) {
      detail::throw_invalid_argument(
          "ContinuousBatcher: kv.mode must be grow or reserve with a KV pool");
    }
    if (c.max_active < 1) detail::throw_invalid_argument("ContinuousBatcher: max_active must be >= 1");
    if (c.token_budget < 1) detail::throw_invalid_argument("ContinuousBatcher: token_budget must be >= 1");
    if (c.queue_capacity < 1) detail::throw_invalid_argument("ContinuousBatcher: queue_capacity must be >= 1");
    if (c.max_step_tokens != 0 && c.max_step_tokens < c.max_active)
      detail::throw_invalid_argument("ContinuousBatcher: max_step_tokens must be 0 or >= max_active");
    if (c.priority_step < std::chrono::nanoseconds::zero())
      detail::throw_invalid_argument("ContinuousBatcher: priority_step must be >= 0");
    if (c.drain_timeout < std::chrono::nanoseconds::zero())
      detail::throw_invalid_argument("ContinuousBatcher: drain_timeout must be >= 0");
    if (c.workers.value_or(0) > 1) detail::throw_invalid_argument("ContinuousBatcher: workers must be 0 or 1");
    detail::validate_tenants(c.tenants, "ContinuousBatcher");
    if (!(detail::is_finite(c.output_token_cost) && c.output_token_cost >= 0.0))
      detail::throw_invalid_argument("ContinuousBatcher: output_token_cost must be finite and >= 0");
    // Surfaces bad default stream options now rather than at the first submit.
    c.stream.validate("ContinuousBatcher: stream.");
    return c;
  }

  static BatchTime as_batch_time(time_point t) noexcept {
    return BatchTime(std::chrono::duration_cast<BatchDuration>(t.time_since_epoch()));
  }

  std::shared_ptr<Stream> submit_impl(Request request, const SubmitOptions& options, StreamCallbacks<Token> callbacks) {
    // Bad per-request stream options are the request's outcome (Status::failed), not a
    // throw: its stream is built with the config's options and closed at once.
    const char* bad_stream = request.stream ? request.stream->problem() : nullptr;
    const TokenStreamerConfig& stream_options = request.stream && bad_stream == nullptr ? *request.stream : config_.stream;
    auto stream = std::make_shared<Stream>(stream_options, std::move(callbacks), clock_, options.cancel,
                                           metrics_.streams_ptr());
    submitted_.fetch_add(1, std::memory_order_relaxed);
    const time_point now = clock_.now();
    if (bad_stream != nullptr) {
      complete_for(options.tenant, {}, *stream, Status::failed, std::string("ContinuousBatcher: request.stream.") + bad_stream);
      return stream;
    }
    // Arrival, deadline, priority level and the refusals every front door shares
    // (detail/request_intake.hpp).
    const detail::Intake in = detail::intake(options, now);
    if (!in.accepted()) {
      complete_for(options.tenant, {}, *stream, in.status(), std::string(in.message()));
      return stream;
    }
    const time_point arrival = in.arrival;
    const time_point deadline = in.deadline;
    const std::size_t reserve = request.prompt.size() + request.max_new_tokens;
    if (request.max_new_tokens == 0) {
      complete_for(options.tenant, {}, *stream, Status::ok, {});
      return stream;
    }
    if (pool_ != nullptr) {
      if (std::string why = kv_refusal(request); !why.empty()) {
        if (request.prompt.empty()) {
          complete_for(options.tenant, {}, *stream, Status::failed, why);
        } else {
          complete_for(options.tenant, {}, *stream, Status::rejected, why, RejectReason::too_large);
        }
        return stream;
      }
    } else if (reserve > config_.token_budget || reserve < request.prompt.size()) {
      complete_for(options.tenant, {}, *stream, Status::rejected,
               "ContinuousBatcher: prompt (" + std::to_string(request.prompt.size()) +
                   ") + max_new_tokens (" + std::to_string(request.max_new_tokens) +
                   ") exceeds token_budget (" + std::to_string(config_.token_budget) + ")",
               RejectReason::too_large);
      return stream;
    }
    if (now >= request.completion_deadline) {
      complete_for(options.tenant, {}, *stream, Status::deadline_exceeded, "ContinuousBatcher: completion_deadline passed before submission");
      return stream;
    }

    Sequence seq;
    seq.prompt_ = std::move(request.prompt);
    seq.prompt_size_ = seq.prompt_.size();
    seq.kv_ =
        pool_ != nullptr && config_.kv.mode == KvMode::grow;  // keeps its output for a recompute
    seq.max_new_ = request.max_new_tokens;
    seq.state_ = std::move(request.state);
    seq.priority_ = options.priority;
    seq.tenant_ = options.tenant;
    seq.deadline_ = deadline;
    seq.completion_deadline_ = request.completion_deadline;
    seq.submitted_ = arrival;
    seq.queued_at_ = now;
    seq.stream_ = stream;
    seq.reserved_ = reserve;

    if (quotas_.enabled()) {
      if (auto no = quotas_.refusal(seq.tenant_, ledger_.service().rate())) {
        complete_for(options.tenant, {}, *stream, no->status, std::move(no->message), no->reason, no->retry_after);
        return stream;
      }
    }
    RejectReason refused = RejectReason::none;
    bool indexed = true;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) {
        refused = RejectReason::shutting_down;
      } else if (waiting_.size() >= config_.queue_capacity) {
        refused = RejectReason::queue_full;
      } else {
        seq.id_ = ++next_id_;
        const detail::CbatchKey key{
            detail::cbatch_effective_arrival(
                std::chrono::duration_cast<std::chrono::nanoseconds>(arrival.time_since_epoch()).count(),
                static_cast<int>(Priority::normal) - static_cast<int>(seq.priority_), config_.priority_step.count()),
            seq.id_};
        seq.key_ = key;
        const TenantId tenant = seq.tenant_;
        waiting_.emplace(key, std::move(seq));
        if (fair_ && detail::call_guarded([&] { fair_->added(tenant, key); }, [](const char*) {})) {
          indexed = false;  // out of memory: not queued after all
          waiting_.erase(key);
        } else {
          waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
          ledger_.enter(as_batch_time(now), 1);
        }
      }
    }
    if (quotas_.enabled() && (refused != RejectReason::none || !indexed)) quotas_.release(options.tenant);
    if (!indexed) {
      complete_for(options.tenant, {}, *stream, Status::failed, "ContinuousBatcher: out of memory");
    } else if (refused == RejectReason::shutting_down) {
      complete_for(options.tenant, {}, *stream, Status::rejected, "ContinuousBatcher: shutting down", refused);
    } else if (refused == RejectReason::queue_full) {
      complete_for(options.tenant, {}, *stream, Status::rejected,
               "ContinuousBatcher: waiting queue full (" + std::to_string(config_.queue_capacity) + ")",
               refused, detail::ServiceRate::retry_after(ledger_.service().rate(), 1));
    } else {
      cv_.notify_one();
    }
    return stream;
  }

  // Why the KV pool can never run this request (empty: it can). grow: the prompt alone must
  // fit in the whole pool; reserve: prompt + max_new_tokens must.
  std::string kv_refusal(const Request& r) const {
    if (r.prompt.empty())
      return "ContinuousBatcher: a KV-cached sequence needs a prompt of at least one token (a "
             "start token)";
    const bool reserve = config_.kv.mode == KvMode::reserve;
    const std::size_t tokens = reserve ? r.prompt.size() + r.max_new_tokens : r.prompt.size();
    if (tokens >= r.prompt.size() && pool_->can_ever_fit(tokens)) return {};
    return std::string("ContinuousBatcher: ") +
           (reserve ? "prompt + max_new_tokens (" : "prompt (") + std::to_string(tokens) +
           " tokens) exceeds the KV pool (" + std::to_string(pool_->total_blocks()) +
           " blocks of " + std::to_string(pool_->block_size()) + " tokens)";
  }

  // Closes a stream (first close wins) and counts how it actually ended.
  Status complete(Stream& stream, Status status, std::string message,
                  RejectReason reason = RejectReason::none,
                  std::chrono::nanoseconds retry_after = std::chrono::nanoseconds{0}) noexcept {
    (void)stream.close(status, std::move(message), reason, retry_after);
    return count_end(stream);
  }
  // complete(), also counted for tenant t (per-tenant metrics), `latency` after its arrival.
  void complete_for(TenantId t, std::chrono::nanoseconds latency, Stream& stream, Status status,
                    std::string message, RejectReason reason = RejectReason::none,
                    std::chrono::nanoseconds retry_after = std::chrono::nanoseconds{0}) noexcept {
    tenant_ended(t, complete(stream, status, std::move(message), reason, retry_after), latency);
  }
  void tenant_ended(TenantId t, Status s, std::chrono::nanoseconds latency) noexcept {
    if (metrics_.tenants) metrics_.tenants->record(t, s, latency);
  }
  std::chrono::nanoseconds since(time_point from, time_point to) const noexcept {
    return to > from ? std::chrono::duration_cast<std::chrono::nanoseconds>(to - from) : std::chrono::nanoseconds{0};
  }

  // Counts how the stream ended; returns that status.
  Status count_end(const Stream& stream) noexcept {
    Status s = Status::failed;
    RejectReason r = RejectReason::none;
    detail::call_guarded(
        [&] {
          if (auto end = stream.end()) {
            s = end->status;
            r = end->reason;
          }
        },
        [](const char*) {});
    ledger_.count(s, r);
    metrics_.count(s, r);
    return s;
  }

  bool idle_locked() {
    std::lock_guard lock(mutex_);
    return active_.empty() && waiting_.empty() && preempted_.empty();
  }

  // The decode thread: wait for work, turn, repeat until shut down and drained.
  void run() {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] {
          return stopping_ || !waiting_.empty() || !active_.empty() || !preempted_.empty();
        });
        if (stopping_ && waiting_.empty() && active_.empty() && preempted_.empty()) return;
      }
      // Only allocation failures escape turn() (step() exceptions are caught there); the
      // loop lives on and tries again.
      if (detail::call_guarded([&] { (void)turn(); }, [](const char*) {})) std::this_thread::yield();
    }
  }

  // One turn of the loop. Runs on one thread at a time (the decode thread or a serialized
  // poll() caller), the only one that touches active_'s contents.
  ContinuousBatcherPollResult turn() {
    ContinuousBatcherPollResult report;
    bool stopping = false;
    time_point drain_deadline{};

    // 1. Retire active sequences that were cancelled, or ran past their completion deadline
    //    or the drain deadline, before they cost another step.
    {
      std::lock_guard lock(mutex_);
      stopping = stopping_;
      drain_deadline = drain_deadline_;
    }
    time_point now = clock_.now();
    for (auto& seq : active_) {
      if (seq.stream_->closed()) {
        retire(seq, report);
      } else if (seq.stream_->cancel_requested()) {
        finish_with(seq, Status::cancelled, "cancelled by the consumer", report);
      } else if (now >= seq.completion_deadline_) {
        finish_with(seq, Status::deadline_exceeded,
                    "completion_deadline passed after " + std::to_string(seq.generated_) + " tokens", report);
      } else if (stopping && now >= drain_deadline) {
        finish_with(seq, Status::cancelled, "ContinuousBatcher: shutdown drain timeout", report);
      }
    }
    compact();

    // 1b. KV pool: end preempted sequences that were cancelled or ran out of time, then
    //     give every decoding sequence the block its next token needs, preempting the
    //     least important ones (grow mode) when the pool runs dry.
    bool preempted_now = false;
    if (pool_ != nullptr) {
      retire_preempted(stopping, drain_deadline, report);
      preempted_now = grow_active(report);
    }

    // 2. Drop waiting sequences that were cancelled or expired (or all of them when
    //    shutting down). Their streams are closed after the step (complete_late below):
    //    their callbacks never delay the step, nor make a sequence admitted next miss its
    //    deadline. The retirements above ran user callbacks: read the clock again.
    std::vector<Sequence> dropped;
    now = clock_.now();
    {
      std::lock_guard lock(mutex_);
      stopping = stopping_;
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (stopping || must_drop(it->second, now)) {
          it->second.dropped_for_stop_ = stopping;
          left_waiting_locked(it->second, false);
          dropped.push_back(std::move(it->second));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      depart_locked(dropped, now);
    }
    const std::size_t dropped_waiting = dropped.size();

    // 3. Admit in service order while the next one fits. The drops above ran callbacks too,
    //    so the deadlines are checked against a fresh reading, and from here to the step
    //    no user code runs: a sequence admitted here starts by its deadline (up to the
    //    time this turn takes to plan). One that expired in the meantime is completed
    //    after the step, so that its callbacks do not delay the step either.
    now = clock_.now();
    {
      std::lock_guard lock(mutex_);
      stopping = stopping_;
      std::size_t reserved = reserved_.load(std::memory_order_relaxed);
      // A preempted sequence comes back before anything new: it is at the queue's front.
      // Nothing is admitted in a turn that had to preempt: the pool is short already.
      bool kv_full = preempted_now;
      while (!kv_full && !preempted_.empty() && active_.size() < config_.max_active) {
        if (!kv_admit(preempted_.front())) {
          kv_full = true;
          break;
        }
        preempted_.front().admitted_at_ = now;
        reserved += preempted_.front().reserved_;
        active_.push_back(std::move(preempted_.front()));
        preempted_.erase(preempted_.begin());
      }
      while (!kv_full && !waiting_.empty() && active_.size() < config_.max_active) {
        auto it = next_waiting_locked();
        if (stopping || must_drop(it->second, now)) {
          it->second.dropped_for_stop_ = stopping;
          left_waiting_locked(it->second, false);
          dropped.push_back(std::move(it->second));
          waiting_.erase(it);
          continue;
        }
        // No bypass: if the head does not fit, nothing behind it is admitted either, so a
        // large sequence is never starved by a stream of small ones.
        if (pool_ == nullptr ? reserved + it->second.reserved_ > config_.token_budget
                             : !kv_admit(it->second))
          break;
        reserved += it->second.reserved_;
        left_waiting_locked(it->second, true);
        it->second.admitted_at_ = now;
        active_.push_back(std::move(it->second));
        waiting_.erase(it);
        ++report.admitted;
      }
      depart_locked(std::span<const Sequence>(dropped).subspan(dropped_waiting), now);
      reserved_.store(reserved, std::memory_order_relaxed);
      waiting_count_.store(waiting_.size() + preempted_.size(), std::memory_order_relaxed);
      active_count_.store(active_.size(), std::memory_order_relaxed);
    }
    if (report.admitted > 0) note_admissions(report.admitted);
    for (std::size_t i = active_.size() - report.admitted; i < active_.size(); ++i) {
      metrics_.record_queue_wait(now - active_[i].submitted_);
    }
    const time_point admitted_at = now;
    auto complete_late = [&] {
      for (auto& s : dropped) complete_dropped(s, s.dropped_for_stop_, admitted_at, report);
    };

    // 4. Plan the step: decoding sequences one token each, then prompt chunks in
    //    admission order within the step budget.
    std::size_t decoding = 0;
    for (auto& s : active_) {
      s.scheduled_ = false;
      s.chunk_ = 0;
      s.emitted_in_step_ = 0;
      if (s.decoding()) {
        s.scheduled_ = true;
        ++decoding;
      }
    }
    std::size_t step_tokens = decoding;
    std::size_t left = config_.max_step_tokens == 0 ? static_cast<std::size_t>(-1)
                                                    : config_.max_step_tokens - decoding;
    for (auto& s : active_) {
      if (s.decoding() || left == 0) continue;
      std::size_t chunk = s.prompt_.size() - s.prefilled_;
      if (config_.prefill_chunk != 0) chunk = std::min(chunk, config_.prefill_chunk);
      chunk = std::min(chunk, left);
      s.chunk_ = chunk;
      s.scheduled_ = true;
      left -= chunk;
      step_tokens += chunk;
    }
    auto first_idle = std::stable_partition(active_.begin(), active_.end(),
                                            [](const Sequence& s) { return s.scheduled_; });
    const auto scheduled = static_cast<std::size_t>(first_idle - active_.begin());
    if (scheduled == 0) {
      complete_late();
      return report;
    }

    // 5. Step.
    report.stepped = true;
    report.scheduled = scheduled;
    report.step_tokens = step_tokens;
    std::optional<std::string> failure;
    const time_point step_start = clock_.now();
    if (detail::call_guarded([&] { step_(std::span<Sequence>(active_.data(), scheduled)); },
                             [&](const char* what) { failure = what != nullptr ? what : "step threw a non-standard exception"; })) {
      // An exception whose message could not be copied still fails the step.
      if (!failure) failure.emplace();
    }
    const time_point step_end = clock_.now();
    steps_.fetch_add(1, std::memory_order_relaxed);
    metrics_.record_step(step_end - step_start);
    report.failed = failure.has_value();

    // 6. Retire what finished; everything else stays for the next step.
    for (std::size_t i = 0; i < scheduled; ++i) {
      Sequence& s = active_[i];
      s.prefilled_ += s.chunk_;
      if constexpr (!std::is_same_v<KvPool, detail::NoKvPool>) {
        // The step wrote this chunk's KV: full prompt blocks become shareable.
        if (pool_ != nullptr && s.chunk_ > 0 && !failure)
          pool_->commit(s.table_, std::span<const Token>(s.prompt_).first(s.prefilled_));
        // A decode step that filled a block of generated tokens (grow mode keeps them):
        // shareable too, by a next turn that repeats the conversation, or by this
        // sequence's own recompute after a preemption.
        else if (pool_ != nullptr && !failure && s.kv_ && config_.kv.prefix_caching && s.decoding() &&
                 s.generated_ > 0)
          commit_output(s);
      }
      s.chunk_ = 0;
      report.emitted += s.emitted_in_step_;
      if (failure) {
        finish_with(s, Status::failed, *failure, report);
      } else if (s.failure_) {
        finish_with(s, Status::failed, std::move(*s.failure_), report);
      } else if (s.stream_->closed()) {
        retire(s, report);
      } else if (s.stream_->cancel_requested()) {
        finish_with(s, Status::cancelled, "cancelled by the consumer", report);
      } else if (s.finished_ || s.generated_ >= s.max_new_) {
        finish_with(s, Status::ok, {}, report);
      }
    }
    tokens_.fetch_add(report.emitted, std::memory_order_relaxed);
    std::uint64_t finished = 0;
    for (std::size_t i = 0; i < scheduled; ++i) finished += active_[i].retired_ ? 1u : 0u;
    (void)ledger_.service().record(finished, std::chrono::duration_cast<std::chrono::nanoseconds>(step_end - step_start));
    compact();
    complete_late();
    return report;
  }

  // The waiting sequence to serve next (waiting_ not empty): the first in key order, or
  // with fair scheduling the first of the tenant with the smallest counter. mutex_ held.
  typename Waiting::iterator next_waiting_locked() noexcept {
    if (!fair_) return waiting_.begin();
    const auto key = fair_->next();
    auto it = key ? waiting_.find(*key) : waiting_.end();
    return it != waiting_.end() ? it : waiting_.begin();
  }

  // s leaves the waiting queue: admitted (charged its reservation, see CbatchFair), or
  // dropped (completes without running). mutex_ held. Never throws.
  void left_waiting_locked(const Sequence& s, bool admitted) noexcept {
    if (fair_) {
      fair_->removed(s.tenant_, s.key_);
      if (admitted) fair_->charge(s.tenant_, fair_->cost(s.prompt_.size(), s.max_new_));
    }
    if (quotas_.enabled()) {
      if (admitted) {
        quotas_.dequeued(s.tenant_);
      } else {
        quotas_.release(s.tenant_);
      }
    }
  }

  // True when a waiting sequence can no longer be admitted in time, or was cancelled.
  static bool must_drop(const Sequence& s, time_point now) noexcept {
    return s.stream_->cancel_requested() || now > s.deadline_ || now >= s.completion_deadline_;
  }

  // KV pool: allocates the blocks of s's prefill input (all of it; reserve mode books
  // max_new_tokens too) and starts its prefill after the cached prefix. False when the
  // pool has no room now: s waits, and nothing behind it is admitted. Called with mutex_
  // held, on the stepping thread (the pool's owner).
  bool kv_admit(Sequence& s) {
    if constexpr (std::is_same_v<KvPool, detail::NoKvPool>) {
      (void)s;
      return true;
    } else {
      KvAllocateOptions o;
      o.max_tokens = s.prompt_size_ + s.max_new_;
      o.reserve = config_.kv.mode == KvMode::reserve;
      o.watermark_blocks =
          config_.kv.mode == KvMode::grow && !active_.empty() ? config_.kv.watermark_blocks : 0;
      if (pool_->allocate(s.table_, std::span<const Token>(s.prompt_), o) != KvAllocStatus::ok)
        return false;
      s.cached_ = s.table_.cached_tokens();
      s.prefilled_ = s.cached_;
      s.admission_no_ = ++admissions_;
      if (s.computed_ > s.cached_) {
        const std::size_t again = s.computed_ - s.cached_;
        recomputed_total_.fetch_add(again, std::memory_order_relaxed);
        if (metrics_.recomputed != nullptr) metrics_.recomputed->inc(again);
      }
      s.computed_ = 0;
      return true;
    }
  }

  // KV pool, grow mode: indexes the block the last decode step filled, if it did. Its
  // tokens are the prompt and then the output, copied together once per full block (the
  // pool hashes a sequence from its start). Skipped if that copy cannot allocate.
  void commit_output(Sequence& s) noexcept {
    if constexpr (!std::is_same_v<KvPool, detail::NoKvPool>) {
      const std::size_t written = s.prompt_size_ + s.generated_ - 1;  // the last emitted is not fed yet
      if (written <= s.prompt_.size() || written % pool_->block_size() != 0) return;
      if (detail::call_guarded(
              [&] {
                kv_scratch_.assign(s.prompt_.begin(),
                                   s.prompt_.begin() + static_cast<std::ptrdiff_t>(s.prompt_size_));
                kv_scratch_.insert(kv_scratch_.end(), s.output_.begin(), s.output_.end());
              },
              [](const char*) {}))
        return;
      pool_->commit(s.table_, std::span<const Token>(kv_scratch_).first(std::min(written, kv_scratch_.size())));
    }
  }

  // KV pool: ends the preempted sequences that were cancelled, closed by their consumer,
  // past their completion deadline, or (shutting down) past the drain deadline: they had
  // started, so they end as active ones do. Stepping thread only.
  void retire_preempted(bool stopping, time_point drain_deadline,
                        ContinuousBatcherPollResult& report) {
    std::vector<Sequence> gone;
    const time_point now = clock_.now();
    {
      std::lock_guard lock(mutex_);
      for (auto it = preempted_.begin(); it != preempted_.end();) {
        if (it->stream_->closed() || it->stream_->cancel_requested() ||
            now >= it->completion_deadline_ || (stopping && now >= drain_deadline)) {
          gone.push_back(std::move(*it));
          it = preempted_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (gone.empty()) return;
    for (auto& seq : gone) {
      if (seq.stream_->closed()) {
        retire(seq, report);
      } else if (seq.stream_->cancel_requested()) {
        finish_with(seq, Status::cancelled, "cancelled by the consumer", report);
      } else if (now >= seq.completion_deadline_) {
        finish_with(
            seq, Status::deadline_exceeded,
            "completion_deadline passed after " + std::to_string(seq.generated_) + " tokens",
            report);
      } else {
        finish_with(seq, Status::cancelled, "ContinuousBatcher: shutdown drain timeout", report);
      }
    }
    const time_point left = clock_.now();
    std::lock_guard lock(mutex_);
    for (const auto& seq : gone) {
      settle_tenant_locked(seq);
      ledger_.leave(as_batch_time(left), 1, 1, as_batch_time(seq.admitted_at_),
                    std::chrono::duration_cast<BatchDuration>(
                        std::max(left - seq.queued_at_, duration::zero())));
    }
    waiting_count_.store(waiting_.size() + preempted_.size(), std::memory_order_relaxed);
  }

  // KV pool: makes every decoding sequence's table hold the token its next step writes.
  // The most important sequences grow first; when the pool is dry, the least important
  // running sequence (detail::cbatch_preempt_before) is preempted: its blocks are freed
  // and it goes back to the front of the queue, to recompute its prompt and output. A
  // sequence that cannot grow even alone fails. Returns whether anything was preempted.
  // Stepping thread only.
  bool grow_active(ContinuousBatcherPollResult& report) {
    if constexpr (std::is_same_v<KvPool, detail::NoKvPool>) {
      (void)report;
      return false;
    } else {
      kv_order_.clear();
      for (auto& seq : active_) kv_order_.push_back(&seq);
      std::sort(kv_order_.begin(), kv_order_.end(), [](const Sequence* a, const Sequence* b) {
        return detail::cbatch_preempt_before(importance(*b), b->admission_no_, importance(*a),
                                             a->admission_no_);
      });
      bool preempted = false;
      bool ended = false;
      for (Sequence* seq : kv_order_) {
        if (seq->preempted_ || seq->retired_ || !seq->decoding()) continue;
        const std::size_t need = seq->prompt_size_ + seq->generated_;
        for (;;) {
          const KvAllocStatus st = pool_->grow(seq->table_, need);
          if (st == KvAllocStatus::ok) break;
          Sequence* victim = nullptr;
          bool alone = true;
          for (auto it = kv_order_.rbegin(); it != kv_order_.rend(); ++it) {
            if ((*it)->preempted_ || (*it)->retired_) continue;
            if (victim == nullptr) victim = *it;
            if (*it != seq) alone = false;
          }
          if (st == KvAllocStatus::too_large || config_.kv.mode == KvMode::reserve || alone) {
            finish_with(*seq, Status::failed,
                        "ContinuousBatcher: the KV pool cannot hold " + std::to_string(need) +
                            " tokens of this sequence (" + std::to_string(pool_->total_blocks()) +
                            " blocks of " + std::to_string(pool_->block_size()) + " tokens)",
                        report);
            ended = true;
            break;
          }
          preempt(*victim, report);
          preempted = true;
          if (victim == seq) break;
        }
      }
      if (preempted) requeue_preempted();
      if (ended || preempted) compact();
      return preempted;
    }
  }

  // Frees a running sequence's blocks and readies it for a recompute: its prefill input
  // becomes prompt + output. Stepping thread only.
  void preempt(Sequence& seq, ContinuousBatcherPollResult& report) {
    if constexpr (!std::is_same_v<KvPool, detail::NoKvPool>) {
      seq.computed_ = seq.decoding() ? seq.prompt_size_ + seq.generated_ - 1 : seq.prefilled_;
      pool_->free(seq.table_);
      if (detail::call_guarded(
              [&] {
                seq.prompt_.resize(seq.prompt_size_);
                seq.prompt_.insert(seq.prompt_.end(), seq.output_.begin(), seq.output_.end());
              },
              [](const char*) {})) {
        finish_with(seq, Status::failed, "ContinuousBatcher: out of memory preparing a recompute",
                    report);
        return;
      }
      seq.prefilled_ = 0;
      seq.cached_ = 0;
      seq.preempted_ = true;
      ++seq.preemptions_;
      preemptions_total_.fetch_add(1, std::memory_order_relaxed);
      if (metrics_.preemptions != nullptr) metrics_.preemptions->inc();
    }
  }

  // Moves the preempted sequences from the active set to the front of the queue
  // (preempted_), the most important and oldest first. Stepping thread only.
  void requeue_preempted() {
    std::lock_guard lock(mutex_);
    std::size_t released = 0;
    for (auto& seq : active_) {
      if (!seq.preempted_ || seq.retired_) continue;
      seq.preempted_ = false;
      released += seq.reserved_;
      const auto at = std::upper_bound(
          preempted_.begin(), preempted_.end(), seq, [](const Sequence& a, const Sequence& b) {
            return importance(a) != importance(b) ? importance(a) > importance(b) : a.id_ < b.id_;
          });
      preempted_.insert(at, std::move(seq));
      seq.retired_ = true;  // the moved-from husk: compact() erases it
      seq.preempted_ = true;
    }
    std::erase_if(active_, [](const Sequence& q) { return q.retired_ && q.preempted_; });
    reserved_.fetch_sub(released, std::memory_order_relaxed);
    active_count_.store(active_.size(), std::memory_order_relaxed);
    waiting_count_.store(waiting_.size() + preempted_.size(), std::memory_order_relaxed);
  }

  static int importance(const Sequence& s) noexcept {
    return static_cast<int>(Priority::normal) - static_cast<int>(s.priority_);
  }

  // Closes a sequence that left the waiting queue at `when` without running.
  void complete_dropped(Sequence& s, bool stopping, time_point when, ContinuousBatcherPollResult& report) noexcept {
    const TenantId t = s.tenant_;
    const std::chrono::nanoseconds waited = since(s.submitted_, when);
    if (stopping) {
      complete_for(t, waited, *s.stream_, Status::rejected, "ContinuousBatcher: shutting down", RejectReason::shutting_down);
    } else if (s.stream_->cancel_requested()) {
      complete_for(t, waited, *s.stream_, Status::cancelled, "cancelled by the consumer while waiting");
    } else if (when >= s.completion_deadline_) {
      complete_for(t, waited, *s.stream_, Status::deadline_exceeded, "completion_deadline passed while waiting");
    } else {
      complete_for(t, waited, *s.stream_, Status::deadline_exceeded, "deadline passed while waiting: not admitted in time");
    }
    ++report.completed;
  }

  // Counts sequences leaving the batcher (load integrals). Called with mutex_ held.
  void depart_locked(std::span<const Sequence> gone, time_point now) noexcept {
    const BatchTime t = as_batch_time(now);
    for (const Sequence& s : gone) {
      ledger_.leave(t, 1, 0, t, std::chrono::duration_cast<BatchDuration>(std::max(now - s.queued_at_, duration::zero())));
    }
  }

  void finish_with(Sequence& s, Status status, std::string message, ContinuousBatcherPollResult& report) noexcept {
    (void)s.stream_->close(status, std::move(message));
    retire(s, report);
  }

  void retire(Sequence& s, ContinuousBatcherPollResult& report) noexcept {
    if (s.retired_) return;
    s.retired_ = true;
    const Status ended = count_end(*s.stream_);
    if (metrics_.tenants) tenant_ended(s.tenant_, ended, since(s.submitted_, clock_.now()));
    ++report.completed;
  }

  void compact() {
    std::size_t released = 0;
    for (auto& s : active_)
      if (s.retired_) released += s.reserved_;
    if (released == 0) return;
    const time_point now = clock_.now();
    const BatchTime t = as_batch_time(now);
    std::lock_guard lock(mutex_);
    for (const auto& s : active_) {
      if (!s.retired_) continue;
      settle_tenant_locked(s);
      ledger_.leave(t, 1, 1, as_batch_time(s.admitted_at_),
                    std::chrono::duration_cast<BatchDuration>(std::max(now - s.queued_at_, duration::zero())));
    }
    std::erase_if(active_, [](const Sequence& s) { return s.retired_; });
    reserved_.fetch_sub(released, std::memory_order_relaxed);
    active_count_.store(active_.size(), std::memory_order_relaxed);
  }

  // A sequence that ran (or was admitted and preempted) ends: fair scheduling refunds the
  // output tokens it reserved and did not generate; its tenant's quota counts it done.
  // mutex_ held. Never throws.
  void settle_tenant_locked(const Sequence& s) noexcept {
    if (fair_ && s.generated_ < s.max_new_) fair_->charge(s.tenant_, -fair_->cost(0, s.max_new_ - s.generated_));
    if (quotas_.enabled()) quotas_.done(s.tenant_);
  }

  void note_admissions(std::size_t n) noexcept { admitted_total_.fetch_add(n, std::memory_order_relaxed); }

  // The batcher's registered metrics; everything is a no-op without a registry.
  struct Metrics {
    StreamMetrics streams{};
    bool enabled = false;
    Counter* by_status[5] = {};
    Counter* rejected[reject_reason_count] = {};  // indexed by RejectReason
    Counter* steps = nullptr;
    LatencyHistogram* step_seconds = nullptr;
    LatencyHistogram* queue_wait = nullptr;
    Counter* preemptions = nullptr;  // KV pool only
    Counter* recomputed = nullptr;   // KV pool only
    CallbackRegistration active_gauge, waiting_gauge, reserved_gauge;
    // With tenants enabled and metric_tenants > 0: tailbatch_generation_tenant_*.
    std::unique_ptr<detail::TenantSeries> tenants;

    const StreamMetrics* streams_ptr() const noexcept { return enabled ? &streams : nullptr; }
    void count(Status s, RejectReason r) noexcept {
      if (!enabled) return;
      by_status[static_cast<std::size_t>(s)]->inc();
      if (s == Status::rejected && rejected[static_cast<std::size_t>(r)]) rejected[static_cast<std::size_t>(r)]->inc();
    }
    template <class D>
    void record_step(D d) noexcept {
      if (!enabled) return;
      steps->inc();
      step_seconds->record(d);
    }
    template <class D>
    void record_queue_wait(D d) noexcept {
      if (enabled) queue_wait->record(d);
    }
  };

  void register_metrics(MetricsRegistry& r) {
    const Labels& base = config_.metric_labels;
    auto with = [&](const char* key, std::string_view value) {
      Labels l = base;
      l.emplace_back(key, std::string(value));
      return l;
    };
    metrics_.streams = StreamMetrics::registered(r, base);
    for (Status s : {Status::ok, Status::rejected, Status::deadline_exceeded, Status::cancelled, Status::failed}) {
      metrics_.by_status[static_cast<std::size_t>(s)] =
          &r.counter("tailbatch_generation_sequences_total", "Sequences completed, by status",
                     with("status", to_string(s)));
    }
    for (RejectReason why : {RejectReason::queue_full, RejectReason::shutting_down, RejectReason::too_large,
                             RejectReason::quota_exceeded}) {
      metrics_.rejected[static_cast<std::size_t>(why)] =
          &r.counter("tailbatch_generation_rejected_total", "Sequences rejected, by reason",
                     with("reason", to_string(why)));
    }
    metrics_.steps = &r.counter("tailbatch_generation_steps_total", "Decode steps run", base);
    metrics_.step_seconds = &r.histogram("tailbatch_generation_step_seconds", "Duration of one step() call", base);
    metrics_.queue_wait = &r.histogram("tailbatch_generation_queue_wait_seconds",
                                       "Time from submission to admission into the active set", base);
    metrics_.active_gauge = r.gauge_callback("tailbatch_generation_active_sequences", "Sequences in the active set",
                                             base, [this] { return static_cast<double>(active_approx()); });
    metrics_.waiting_gauge = r.gauge_callback("tailbatch_generation_waiting_sequences",
                                              "Sequences waiting for admission", base,
                                              [this] { return static_cast<double>(waiting_approx()); });
    metrics_.reserved_gauge = r.gauge_callback("tailbatch_generation_reserved_tokens",
                                               "Token budget reserved by the active set", base,
                                               [this] { return static_cast<double>(reserved_tokens_approx()); });
    if (config_.kv.mode != KvMode::off) {
      metrics_.preemptions =
          &r.counter("tailbatch_generation_preemptions_total",
                     "Sequences preempted for KV memory (their KV is recomputed later)", base);
      metrics_.recomputed =
          &r.counter("tailbatch_generation_recomputed_tokens_total",
                     "Tokens whose KV was computed again after a preemption", base);
    }
    if (config_.tenants.enabled() && config_.tenants.metric_tenants > 0) {
      metrics_.tenants = std::make_unique<detail::TenantSeries>(
          r, base, "tailbatch_generation", "sequences", config_.tenants.metric_tenants,
          config_.tenants.tenant_name);
    }
    metrics_.enabled = true;
  }

  const ContinuousBatcherConfig config_;
  const StepFn step_;
  C clock_;
  // The KV pool (KvMode other than off): owned, or the caller's. Declared before every
  // container of sequences, whose block tables it must outlive.
  std::unique_ptr<KvPool> own_pool_;
  KvPool* pool_ = nullptr;
  std::atomic<std::uint64_t> preemptions_total_{0};
  std::atomic<std::uint64_t> recomputed_total_{0};

  std::atomic<std::size_t> active_count_{0};
  std::atomic<std::size_t> waiting_count_{0};
  std::atomic<std::size_t> reserved_{0};
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> admitted_total_{0};
  std::atomic<std::uint64_t> steps_{0};
  std::atomic<std::uint64_t> tokens_{0};
  // Outcome counts, the load integrals (load(), check_littles_law()) and the service rate:
  // sequences finished per second of step time, whose inverse is the queue_full hint (the
  // time one of them takes to free a place; idle time never counted).
  detail::OutcomeLedger ledger_{as_batch_time(clock_.now())};

  mutable std::mutex mutex_;  // guards waiting_, stopping_, drain_deadline_, next_id_, active_'s size
  std::condition_variable cv_;
  Waiting waiting_;
  std::optional<detail::CbatchFair> fair_;  // fair scheduling's index and counters (mutex_)
  detail::TenantQuotas quotas_{config_.tenants};
  bool stopping_ = false;
  time_point drain_deadline_ = time_point::max();
  std::uint64_t next_id_ = 0;

  std::vector<Sequence> active_;  // contents: the stepping thread only
  // Preempted sequences, the front of the queue: readmitted before waiting_. Guarded by
  // mutex_; changed by the stepping thread only.
  std::vector<Sequence> preempted_;
  std::vector<Sequence*> kv_order_;  // grow_active()'s scratch
  std::vector<Token> kv_scratch_;    // commit_output()'s scratch
  std::uint64_t admissions_ = 0;     // admission order, for preemption (stepping thread)

  std::mutex step_mutex_;     // serializes poll() calls
  std::mutex control_mutex_;  // serializes shutdown()s
  bool started_ = false;      // the decode thread runs; set once, by the constructor
  std::thread thread_;

  Metrics metrics_;  // last: its gauge callbacks read the atomics above
};

}  // namespace tailbatch
