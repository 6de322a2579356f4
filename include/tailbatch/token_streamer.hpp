// TokenStreamer: the per-request channel between a decode loop and the caller waiting for
// the tokens.
//
// The producer (the decode loop, e.g. ContinuousBatcher) pushes tokens as they are made and
// closes the stream exactly once with a final status. The consumer reads the tokens in
// order, each exactly once, then the status: by pulling (next, next_for, try_next and the
// *_chunk variants) or through callbacks. Coalescing (vLLM's stream_interval) publishes
// tokens in groups of N or after T, to cut per-token transport overhead; closing always
// flushes.
//
// Slow consumers. The producer never blocks: a decode step serves a whole batch and must
// not wait for one slow reader. The buffer of tokens not yet read is bounded (capacity);
// a push that finds it full closes the stream with Status::cancelled and a message saying
// the consumer fell behind, and returns false so that the decode loop retires the sequence
// and gives its slot and token budget to others. Tokens already buffered stay readable.
// A consumer that only wants the whole answer at the end needs capacity >= the number of
// tokens it may receive.
//
// Cancellation. The consumer calls cancel(), or requests a stop on the CancellationToken it
// gave; the producer sees cancel_requested() (ContinuousBatcher checks before every step)
// and closes with Status::cancelled.
//
// Metrics. Time to first token, inter-token latency, time per output token and end-to-end
// time are measured when the producer pushes (emission from the decode loop), from the
// stream's start (its construction, i.e. submission), into the LatencyHistograms named in
// StreamMetrics. times() returns the same instants for one stream.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tailbatch/clock.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>

namespace tailbatch {

// How a stream delivers its tokens. Plain values: copy freely.
struct TokenStreamerConfig {
  // Most tokens held that the consumer has not read yet (pull mode). A push beyond it
  // closes the stream with Status::cancelled (see the slow-consumer policy above).
  // Must be >= 1 and >= coalesce_tokens.
  std::size_t capacity = 4096;
  // Publish pending tokens once this many have accumulated (vLLM's stream_interval).
  // 1: every token at once. Must be >= 1.
  std::size_t coalesce_tokens = 1;
  // Also publish pending tokens once the oldest has waited this long (checked at each push
  // and whenever the consumer looks). Zero: no time trigger. Must be >= 0.
  std::chrono::nanoseconds coalesce_interval{0};
  // Publish the first token at once whatever the coalescing, so that coalescing never
  // costs time to first token.
  bool flush_first_token = true;

  // The first bad field, as "capacity must be >= 1", or nullptr when the options are
  // valid. Never throws, never allocates. Thread-safe.
  [[nodiscard]] const char* problem() const noexcept {
    if (capacity < 1) return "capacity must be >= 1";
    if (coalesce_tokens < 1) return "coalesce_tokens must be >= 1";
    if (capacity < coalesce_tokens) return "capacity must be >= coalesce_tokens";
    if (coalesce_interval < std::chrono::nanoseconds::zero()) return "coalesce_interval must be >= 0";
    return nullptr;
  }

  // Throws std::invalid_argument naming the first bad field, prefixed by `who` (e.g.
  // "TokenStreamer: capacity must be >= 1"). Thread-safe.
  void validate(std::string_view who = "TokenStreamer: ") const {
    if (const char* what = problem()) detail::throw_invalid_argument(std::string(who) + what);
  }
};
// The old name compiles, with a deprecation warning, until the next minor version (CHANGELOG.md).
using StreamConfig [[deprecated("renamed TokenStreamerConfig")]] = TokenStreamerConfig;

// How a stream ended. `tokens` counts every token pushed (delivered or still buffered).
struct StreamEnd {
  Status status = Status::ok;
  RejectReason reason = RejectReason::none;
  std::string message;
  std::chrono::nanoseconds retry_after{0};
  std::size_t tokens = 0;

  [[nodiscard]] bool ok() const noexcept { return status == Status::ok; }
};

// Callback mode: the producer's thread calls on_tokens with each published chunk (in order)
// and on_end exactly once, after the last chunk. Both run inside push()/close(), i.e. on
// the decode thread: keep them short. If on_tokens throws, the stream closes with
// Status::failed and the exception's message; exceptions from on_end are swallowed.
//
// One stream has one final status, published once: close() first hands the last pending
// chunk to on_tokens, then settles the status (failed if that last on_tokens threw), and
// only then do end(), closed() and wait_end() report the stream closed; on_end receives
// the same status. While the last chunk is being delivered the stream still reads as open.
template <class Token>
struct StreamCallbacks {
  std::function<void(std::span<const Token>)> on_tokens;
  std::function<void(const StreamEnd&)> on_end;
};

// Where a stream records its timings. Every pointer may be null (that metric is skipped).
// The pointees must outlive every stream that uses them.
struct StreamMetrics {
  LatencyHistogram* time_to_first_token = nullptr;   // start -> first push
  LatencyHistogram* inter_token = nullptr;           // push -> next push
  LatencyHistogram* time_per_output_token = nullptr; // (last - first) / (tokens - 1), at close
  LatencyHistogram* end_to_end = nullptr;            // start -> close, Status::ok only
  Counter* tokens = nullptr;                         // tokens pushed

  // Registers the standard generation metrics in registry, each with labels:
  // tailbatch_generation_time_to_first_token_seconds, tailbatch_generation_inter_token_seconds,
  // tailbatch_generation_time_per_output_token_seconds,
  // tailbatch_generation_end_to_end_seconds (histograms) and tailbatch_generation_tokens_total
  // (counter). Registering the same labels twice returns the same metrics. Allocates;
  // throws what MetricsRegistry throws. Thread-safe.
  [[nodiscard]] static StreamMetrics registered(MetricsRegistry& registry, const Labels& labels = {}) {
    StreamMetrics m;
    m.time_to_first_token = &registry.histogram(
        "tailbatch_generation_time_to_first_token_seconds",
        "Time from submission to the first token's emission", labels);
    m.inter_token = &registry.histogram("tailbatch_generation_inter_token_seconds",
                                        "Time between consecutive tokens of a sequence", labels);
    m.time_per_output_token = &registry.histogram(
        "tailbatch_generation_time_per_output_token_seconds",
        "Mean time per token after the first, per finished sequence", labels);
    m.end_to_end = &registry.histogram("tailbatch_generation_end_to_end_seconds",
                                       "Time from submission to successful close", labels);
    m.tokens = &registry.counter("tailbatch_generation_tokens_total", "Tokens emitted", labels);
    return m;
  }
};

// The instants one stream went through, on its clock.
template <class TimePoint>
struct StreamTimes {
  TimePoint start{};
  std::optional<TimePoint> first_token;
  std::optional<TimePoint> last_token;
  std::optional<TimePoint> closed;
};

// A per-request token channel. See the file comment for the semantics.
//
// Thread-safety: the consumer side (next*, try_next*, wait_end*, cancel, observers) is
// thread-safe. The producer side (push, close) must be called by one thread at a time (the
// decode loop); calls from different threads must be ordered (e.g. by a join).
// Exceptions: construction validates options (std::invalid_argument naming the field) and
// allocates (std::bad_alloc); push and close are noexcept and report by return value.
// Share it with std::shared_ptr between producer and consumer.
template <class Token, Clock C = SteadyClock>
class TokenStreamer {
 public:
  using token_type = Token;
  using clock_type = C;
  using time_point = typename C::time_point;
  using duration = typename C::duration;

  // A pull-mode stream. The stream's start (for time to first token) is clock.now().
  // cancel: a token whose stop request cancels the stream like cancel() does. metrics: may
  // be null. Throws std::invalid_argument naming a bad field of options. Allocates.
  explicit TokenStreamer(TokenStreamerConfig options = {}, C clock = C{}, CancellationToken cancel = {},
                         const StreamMetrics* metrics = nullptr)
      : TokenStreamer(std::move(options), StreamCallbacks<Token>{}, std::move(clock),
                      std::move(cancel), metrics) {}

  // A callback-mode stream (when callbacks.on_tokens or on_end is set): tokens are handed to
  // the callbacks on the producer's thread and never buffered beyond the coalescing group;
  // the pull methods then see no tokens. Throws std::invalid_argument naming a bad field.
  TokenStreamer(TokenStreamerConfig options, StreamCallbacks<Token> callbacks, C clock = C{},
                CancellationToken cancel = {}, const StreamMetrics* metrics = nullptr)
      : options_(validated(std::move(options))),
        callbacks_(std::move(callbacks)),
        callback_mode_(static_cast<bool>(callbacks_.on_tokens) || static_cast<bool>(callbacks_.on_end)),
        clock_(std::move(clock)),
        cancel_token_(std::move(cancel)),
        metrics_(metrics) {
    times_.start = clock_.now();
  }

  TokenStreamer(const TokenStreamer&) = delete;
  TokenStreamer& operator=(const TokenStreamer&) = delete;

  // ---- producer ------------------------------------------------------------------------

  // Appends one token. Returns true if the stream still wants tokens; false if it is
  // closed, cancelled, or this push found the buffer full (the stream is then closed with
  // Status::cancelled) or on_tokens threw (closed with Status::failed): the producer should
  // stop producing for it. A token refused is never delivered. Never blocks on the
  // consumer; allocates while the buffer grows. Not thread-safe: one producer at a time.
  bool push(Token token) noexcept {
    const time_point now = clock_.now();
    std::unique_lock lock(mutex_);
    if (closed_ || closing_) return false;
    if (cancel_requested_locked()) return false;
    if (!callback_mode_ && buffer_.size() >= options_.capacity) {
      close_locked(lock, Status::cancelled, RejectReason::none,
                   "TokenStreamer: the consumer fell " + std::to_string(buffer_.size()) +
                       " tokens behind (capacity " + std::to_string(options_.capacity) +
                       "); the sequence was stopped so that the batch is not held back",
                   now);
      return false;
    }
    if (detail::call_guarded([&] { buffer_.push_back(std::move(token)); }, [](const char*) {})) {
      close_locked(lock, Status::failed, RejectReason::none, "TokenStreamer: out of memory", now);
      return false;
    }
    record_emission_locked(now);
    if (buffer_.size() - visible_ == 1) pending_since_ = now;
    const bool first = pushed_ == 1;
    if ((first && options_.flush_first_token) || publish_due_locked(now)) {
      publish_locked();
      if (callback_mode_) {
        std::string failure = deliver(lock);
        if (failure.empty()) return true;
        lock.lock();
        if (!closed_ && !closing_) close_locked(lock, Status::failed, RejectReason::none, std::move(failure), clock_.now());
        return false;
      }
    }
    return true;
  }

  // Closes the stream with its final status, publishing every pending token first. The
  // first close wins: returns false (and changes nothing) if the stream was already closed
  // or is being closed (a close called from inside the closing flush's on_tokens). In
  // callback mode the last chunk goes to on_tokens first; if it throws, an ok status
  // becomes failed with its message before anyone sees the stream closed. Then calls
  // on_end with that status. Wakes every waiting consumer. Allocates the message.
  // Not thread-safe: one producer at a time.
  bool close(Status status, std::string message = {}, RejectReason reason = RejectReason::none,
             std::chrono::nanoseconds retry_after = std::chrono::nanoseconds{0}) noexcept {
    const time_point now = clock_.now();
    std::unique_lock lock(mutex_);
    if (closed_ || closing_) return false;
    close_locked(lock, status, reason, std::move(message), now, retry_after);
    return true;
  }

  // True once the consumer called cancel() or its CancellationToken was stopped. The
  // producer should then close with Status::cancelled. Never blocks. Thread-safe.
  [[nodiscard]] bool cancel_requested() const noexcept {
    return cancel_flag_.load(std::memory_order_acquire) || cancel_token_.stop_requested();
  }

  // ---- consumer ------------------------------------------------------------------------

  // Asks the producer to stop. The stream stays open until the producer closes it (a
  // ContinuousBatcher does so before its next step); tokens already published remain
  // readable. Never blocks. Thread-safe.
  void cancel() noexcept { cancel_flag_.store(true, std::memory_order_release); }

  // The next token, blocking until one is published; nullopt once the stream is closed
  // and every token has been read. Never allocates. Thread-safe.
  [[nodiscard]] std::optional<Token> next() {
    std::unique_lock lock(mutex_);
    wait_locked(lock, std::nullopt);
    return pop_locked();
  }

  // Like next(), but gives up after timeout: nullopt on timeout too (done() tells the two
  // apart). Thread-safe.
  template <class Rep, class Period>
  [[nodiscard]] std::optional<Token> next_for(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lock(mutex_);
    wait_locked(lock, std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
    return pop_locked();
  }

  // The next published token if there is one; never blocks. Thread-safe.
  [[nodiscard]] std::optional<Token> try_next() {
    std::unique_lock lock(mutex_);
    publish_if_due_locked();
    return pop_locked();
  }

  // Moves every published token to the end of out, blocking until there is at least one.
  // Returns false (appending nothing) once the stream is closed and fully read. Allocates
  // in out. Thread-safe.
  bool next_chunk(std::vector<Token>& out) {
    std::unique_lock lock(mutex_);
    wait_locked(lock, std::nullopt);
    return take_all_locked(out) > 0;
  }

  // Like next_chunk, but gives up after timeout. Returns the number of tokens appended
  // (0 on timeout or at the end: done() tells them apart). Thread-safe.
  template <class Rep, class Period>
  std::size_t next_chunk_for(std::vector<Token>& out, std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lock(mutex_);
    wait_locked(lock, std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
    return take_all_locked(out);
  }

  // Moves every published token to the end of out without blocking; returns how many.
  // Thread-safe.
  std::size_t try_next_chunk(std::vector<Token>& out) {
    std::unique_lock lock(mutex_);
    publish_if_due_locked();
    return take_all_locked(out);
  }

  // How the stream ended, once it has (tokens may still be unread); nullopt while open.
  // Allocates the copy. Thread-safe.
  [[nodiscard]] std::optional<StreamEnd> end() const {
    std::lock_guard lock(mutex_);
    if (!closed_) return std::nullopt;
    return end_;
  }

  // Blocks until the stream is closed and returns how it ended. Does not read tokens.
  // Thread-safe.
  [[nodiscard]] StreamEnd wait_end() const {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return closed_; });
    return end_;
  }

  // Like wait_end(), but gives up after timeout (nullopt). Thread-safe.
  template <class Rep, class Period>
  [[nodiscard]] std::optional<StreamEnd> wait_end_for(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return closed_; })) return std::nullopt;
    return end_;
  }

  // True once the producer has closed the stream. Thread-safe.
  [[nodiscard]] bool closed() const noexcept {
    std::lock_guard lock(mutex_);
    return closed_;
  }

  // True once the stream is closed and every token has been read (or handed to the
  // callbacks): nothing more will ever come. Thread-safe.
  [[nodiscard]] bool done() const noexcept {
    std::lock_guard lock(mutex_);
    return closed_ && buffer_.empty();
  }

  // Tokens pushed so far. Thread-safe.
  [[nodiscard]] std::size_t tokens_pushed() const noexcept {
    std::lock_guard lock(mutex_);
    return pushed_;
  }

  // Tokens waiting to be read, published or not (pull mode). Thread-safe; racy by nature.
  [[nodiscard]] std::size_t buffered_approx() const noexcept {
    std::lock_guard lock(mutex_);
    return buffer_.size();
  }

  // The stream's start, first/last token and close instants. Allocates nothing.
  // Thread-safe.
  [[nodiscard]] StreamTimes<time_point> times() const {
    std::lock_guard lock(mutex_);
    return times_;
  }

  // The options it was built with. Thread-safe.
  [[nodiscard]] const TokenStreamerConfig& config() const noexcept { return options_; }
  // True if tokens go to callbacks rather than to pull-mode readers. Thread-safe.
  [[nodiscard]] bool callback_mode() const noexcept { return callback_mode_; }

 private:
  static TokenStreamerConfig validated(TokenStreamerConfig o) {
    o.validate();
    return o;
  }

  bool cancel_requested_locked() const noexcept { return cancel_requested(); }

  std::size_t pending_locked() const noexcept { return buffer_.size() - visible_; }

  bool publish_due_locked(time_point now) const noexcept {
    const std::size_t pending = pending_locked();
    if (pending == 0) return false;
    if (pending >= options_.coalesce_tokens) return true;
    return options_.coalesce_interval > std::chrono::nanoseconds::zero() &&
           now - pending_since_ >= options_.coalesce_interval;
  }

  void publish_locked() noexcept {
    if (visible_ != buffer_.size()) {
      visible_ = buffer_.size();
      cv_.notify_all();
    }
  }

  void publish_if_due_locked() noexcept {
    if (!callback_mode_ && publish_due_locked(clock_.now())) publish_locked();
  }

  void record_emission_locked(time_point now) noexcept {
    ++pushed_;
    if (!times_.first_token) {
      times_.first_token = now;
      if (metrics_ && metrics_->time_to_first_token) metrics_->time_to_first_token->record(now - times_.start);
    } else if (metrics_ && metrics_->inter_token) {
      metrics_->inter_token->record(now - *times_.last_token);
    }
    times_.last_token = now;
    if (metrics_ && metrics_->tokens) metrics_->tokens->inc();
  }

  // Hands the published tokens to on_tokens. Called locked; returns unlocked, with the
  // failure message if on_tokens threw (empty otherwise).
  std::string deliver(std::unique_lock<std::mutex>& lock) noexcept {
    // delivery_ belongs to the producer: reusing it saves an allocation per chunk.
    delivery_.clear();
    std::string failure;
    if (detail::call_guarded(
            [&] {
              delivery_.reserve(buffer_.size());
              for (auto& t : buffer_) delivery_.push_back(std::move(t));
            },
            [](const char*) {})) {
      failure = "TokenStreamer: out of memory";
    }
    buffer_.clear();
    visible_ = 0;
    lock.unlock();
    if (failure.empty() && callbacks_.on_tokens && !delivery_.empty()) {
      const bool threw = detail::call_guarded(
          [&] { callbacks_.on_tokens(std::span<const Token>(delivery_.data(), delivery_.size())); },
          [&](const char* what) {
            failure = what != nullptr ? std::string("TokenStreamer: on_tokens threw: ") + what
                                      : std::string("TokenStreamer: on_tokens threw a non-standard exception");
          });
      if (threw && failure.empty()) failure = "TokenStreamer: on_tokens threw";
    }
    delivery_.clear();
    return failure;
  }

  // Precondition: locked, !closed_ and !closing_. In callback mode runs the last
  // on_tokens and then on_end outside the lock; the lock's state on return is unspecified
  // (callers return at once). The final status is settled before closed_ is set, so every
  // observer sees one status.
  void close_locked(std::unique_lock<std::mutex>& lock, Status status, RejectReason reason,
                    std::string message, time_point now,
                    std::chrono::nanoseconds retry_after = std::chrono::nanoseconds{0}) noexcept {
    closing_ = true;
    if (callback_mode_ && !buffer_.empty()) {
      std::string failure = deliver(lock);
      lock.lock();
      if (!failure.empty() && status == Status::ok) {
        // The final flush failed: the consumer did not get the whole answer.
        status = Status::failed;
        reason = RejectReason::none;
        message = std::move(failure);
        retry_after = std::chrono::nanoseconds{0};
      }
    }
    closed_ = true;
    end_.status = status;
    end_.reason = status == Status::rejected ? reason : RejectReason::none;
    end_.message = std::move(message);
    end_.retry_after = retry_after;
    end_.tokens = pushed_;
    times_.closed = now;
    if (metrics_) {
      if (metrics_->time_per_output_token && pushed_ >= 2)
        metrics_->time_per_output_token->record((*times_.last_token - *times_.first_token) /
                                                static_cast<std::int64_t>(pushed_ - 1));
      if (metrics_->end_to_end && status == Status::ok) metrics_->end_to_end->record(now - times_.start);
    }
    visible_ = buffer_.size();
    cv_.notify_all();
    if (!callback_mode_) return;
    StreamEnd end;
    if (detail::call_guarded([&] { end = end_; }, [](const char*) {})) {
      // Out of memory copying the message: on_end still gets the status.
      end.status = end_.status;
      end.reason = end_.reason;
      end.retry_after = end_.retry_after;
      end.tokens = end_.tokens;
    }
    lock.unlock();
    if (callbacks_.on_end) {
      // Documented: exceptions from on_end are swallowed.
      (void)detail::call_guarded([&] { callbacks_.on_end(end); }, [](const char*) {});
    }
  }

  // Waits until a token is published, the stream closes, or `until` (steady time) passes.
  // Time-coalesced tokens are published here when they fall due.
  void wait_locked(std::unique_lock<std::mutex>& lock,
                   std::optional<std::chrono::steady_clock::time_point> until) {
    for (;;) {
      if (callback_mode_) {
        if (closed_) return;
      } else {
        publish_if_due_locked();
        if (visible_ > 0 || closed_) return;
      }
      auto wake = until;
      if (!callback_mode_ && pending_locked() > 0 &&
          options_.coalesce_interval > std::chrono::nanoseconds::zero()) {
        // The pending group falls due at pending_since_ + interval on the stream's clock;
        // wait for that long in real time, then look again.
        auto left = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            pending_since_ + options_.coalesce_interval - clock_.now());
        if (left < std::chrono::steady_clock::duration::zero()) left = {};
        auto due = std::chrono::steady_clock::now() + left + std::chrono::microseconds(50);
        if (!wake || due < *wake) wake = due;
      }
      if (wake) {
        if (cv_.wait_until(lock, *wake) == std::cv_status::timeout && until &&
            std::chrono::steady_clock::now() >= *until) {
          if (!callback_mode_) publish_if_due_locked();
          return;
        }
      } else {
        cv_.wait(lock);
      }
    }
  }

  std::optional<Token> pop_locked() {
    if (visible_ == 0) return std::nullopt;
    std::optional<Token> t(std::move(buffer_.front()));
    buffer_.pop_front();
    --visible_;
    return t;
  }

  std::size_t take_all_locked(std::vector<Token>& out) {
    const std::size_t n = visible_;
    out.reserve(out.size() + n);
    for (std::size_t i = 0; i < n; ++i) {
      out.push_back(std::move(buffer_.front()));
      buffer_.pop_front();
    }
    visible_ = 0;
    return n;
  }

  const TokenStreamerConfig options_;
  const StreamCallbacks<Token> callbacks_;
  const bool callback_mode_;
  C clock_;
  CancellationToken cancel_token_;
  const StreamMetrics* const metrics_;
  std::atomic<bool> cancel_flag_{false};

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::deque<Token> buffer_;     // unread tokens; the first visible_ are published
  std::size_t visible_ = 0;
  std::size_t pushed_ = 0;
  time_point pending_since_{};   // when the oldest unpublished token was pushed
  bool closing_ = false;  // close() has begun (the final flush may be running unlocked)
  bool closed_ = false;   // the final status is settled and published
  StreamEnd end_;
  StreamTimes<time_point> times_;
  std::vector<Token> delivery_;  // producer-only: the chunk being handed to on_tokens
};

}  // namespace tailbatch
