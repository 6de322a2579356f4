// serving_adapters: tailbatch's serving adapters without a server.
//
// Prints the HTTP status and Retry-After headers a server should send for each way a
// request can end, then streams a ContinuousBatcher's tokens as Server-Sent Events the way
// an asynchronous server does: the stream's callbacks (on the decode thread) only append
// SSE text to a buffer under a short lock, and the thread that owns the connection (here,
// main) writes what has accumulated. tailbatch-serve (examples/server/) does the same on
// real sockets.
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/serving.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>

using namespace std::chrono_literals;
namespace tb = tailbatch;

int main() {
  std::printf("how each outcome goes on the wire:\n");
  const tb::Error endings[] = {
      {tb::Status::rejected, tb::RejectReason::queue_full, "queue full", 68ms},
      {tb::Status::rejected, tb::RejectReason::overloaded, "limiter", 2500ms},
      {tb::Status::rejected, tb::RejectReason::shutting_down, "draining", 0ns},
      {tb::Status::rejected, tb::RejectReason::too_large, "too long", 0ns},
      {tb::Status::deadline_exceeded, tb::RejectReason::none, "late", 0ns},
      {tb::Status::cancelled, tb::RejectReason::none, "client left", 0ns},
      {tb::Status::failed, tb::RejectReason::none, "model threw", 0ns},
  };
  for (const tb::Error& e : endings) {
    const int code = tb::http_status(e);
    std::printf("  %-18s %-14s -> %d %s", std::string(tb::to_string(e.status)).c_str(),
                std::string(tb::to_string(e.reason)).c_str(), code, std::string(tb::http_reason_phrase(code)).c_str());
    if (tb::retryable(e.status, e.reason) && e.retry_after > 0ns) {
      std::printf(", Retry-After: %llu, retry-after-ms: %llu",
                  static_cast<unsigned long long>(tb::retry_after_seconds(e.retry_after)),
                  static_cast<unsigned long long>(tb::retry_after_milliseconds(e.retry_after)));
    }
    std::printf("\n");
  }

  // A toy decode loop: each step emits the next integer for every active sequence.
  using Batcher = tb::ContinuousBatcher<std::int32_t>;
  // SteadyClock: the constructor starts the decode thread (ContinuousBatcherConfig::workers).
  Batcher batcher([](std::span<Batcher::Sequence> batch) {
    for (auto& s : batch) {
      if (s.emits()) s.emit(static_cast<std::int32_t>(s.generated() * 10));
    }
  });

  // The connection's outbox: the callbacks append, the connection's thread writes.
  std::mutex mu;
  std::condition_variable cv;
  std::string outbox;
  bool ended = false;
  tb::SseEncoder<std::int32_t> encoder;
  tb::StreamCallbacks<std::int32_t> callbacks;
  callbacks.on_tokens = [&](std::span<const std::int32_t> tokens) {
    std::lock_guard lock(mu);
    encoder.append_tokens(outbox, tokens);
    cv.notify_one();
  };
  callbacks.on_end = [&](const tb::StreamEnd& end) {
    std::lock_guard lock(mu);
    encoder.append_end(outbox, end);
    ended = true;
    cv.notify_one();
  };
  Batcher::Request request;
  request.prompt = {1, 2, 3};
  request.max_new_tokens = 4;
  auto stream = batcher.submit(std::move(request), std::move(callbacks));

  std::printf("\nthe event stream (Content-Type: %s):\n", std::string(tb::sse_content_type).c_str());
  std::unique_lock lock(mu);
  for (;;) {
    cv.wait(lock, [&] { return !outbox.empty() || ended; });
    std::string chunk;
    chunk.swap(outbox);
    const bool last = ended && outbox.empty();
    lock.unlock();
    std::fputs(chunk.c_str(), stdout);  // a server writes this to the socket
    lock.lock();
    if (last && outbox.empty()) break;
  }
  lock.unlock();
  batcher.shutdown();
  return 0;
}
