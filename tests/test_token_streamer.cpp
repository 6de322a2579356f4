// TokenStreamer: order and exactly-once delivery, the closing status on every path,
// coalescing on the manual clock, the slow-consumer policy, callbacks, cancellation,
// metrics, and many concurrent consumers.
#include <tailbatch/token_streamer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::ManualClock;
using tailbatch::RejectReason;
using tailbatch::Status;
using tailbatch::StreamCallbacks;
using tailbatch::StreamEnd;
using tailbatch::TokenStreamerConfig;

using Streamer = tailbatch::TokenStreamer<int, ManualClock>;

namespace {
TokenStreamerConfig coalesced(std::size_t n, std::chrono::nanoseconds t = {}, bool flush_first = false) {
  TokenStreamerConfig o;
  o.coalesce_tokens = n;
  o.coalesce_interval = t;
  o.flush_first_token = flush_first;
  return o;
}
}  // namespace

TEST_CASE("tokens arrive in order, exactly once, then the closing status", "[token_streamer]") {
  ManualClock clock;
  Streamer s({}, clock);
  for (int i = 0; i < 100; ++i) REQUIRE(s.push(i));
  REQUIRE(s.close(Status::ok));
  std::vector<int> got;
  while (auto t = s.next()) got.push_back(*t);
  std::vector<int> want(100);
  std::iota(want.begin(), want.end(), 0);
  CHECK(got == want);
  CHECK(s.done());
  CHECK_FALSE(s.next().has_value());
  CHECK_FALSE(s.try_next().has_value());
  auto end = s.end();
  REQUIRE(end.has_value());
  CHECK(end->ok());
  CHECK(end->tokens == 100);
}

TEST_CASE("the first close wins; pushes after close are refused", "[token_streamer]") {
  Streamer s({}, ManualClock{});
  REQUIRE(s.push(1));
  CHECK(s.close(Status::failed, "engine fell over"));
  CHECK_FALSE(s.close(Status::ok));
  CHECK_FALSE(s.push(2));
  CHECK(s.next() == 1);
  CHECK_FALSE(s.next().has_value());
  auto end = s.wait_end();
  CHECK(end.status == Status::failed);
  CHECK(end.message == "engine fell over");
  CHECK(end.reason == RejectReason::none);
  CHECK(end.tokens == 1);
}

TEST_CASE("a reject reason is kept only with Status::rejected", "[token_streamer]") {
  Streamer a({}, ManualClock{});
  a.close(Status::rejected, "full", RejectReason::queue_full, 5ms);
  CHECK(a.end()->reason == RejectReason::queue_full);
  CHECK(a.end()->retry_after == 5ms);
  Streamer b({}, ManualClock{});
  b.close(Status::cancelled, "bye", RejectReason::queue_full);
  CHECK(b.end()->reason == RejectReason::none);
}

TEST_CASE("next_for gives up after its timeout; done() tells timeout from end", "[token_streamer]") {
  Streamer s({}, ManualClock{});
  CHECK_FALSE(s.next_for(1ms).has_value());
  CHECK_FALSE(s.done());
  CHECK_FALSE(s.wait_end_for(1ms).has_value());
  s.push(7);
  CHECK(s.next_for(1ms) == 7);
  s.close(Status::ok);
  CHECK_FALSE(s.next_for(1ms).has_value());
  CHECK(s.done());
}

TEST_CASE("a blocked consumer wakes for a token and for the close", "[token_streamer]") {
  auto s = std::make_shared<tailbatch::TokenStreamer<int>>();
  std::vector<int> got;
  std::thread consumer([&] {
    while (auto t = s->next_for(10s)) got.push_back(*t);
  });
  for (int i = 0; i < 10; ++i) s->push(i);
  s->close(Status::ok);
  consumer.join();
  CHECK(got.size() == 10);
  CHECK(s->done());
}

TEST_CASE("coalescing by count publishes every N tokens; close flushes", "[token_streamer]") {
  Streamer s(coalesced(4), ManualClock{});
  std::vector<int> out;
  for (int i = 0; i < 3; ++i) s.push(i);
  CHECK(s.try_next_chunk(out) == 0);
  CHECK_FALSE(s.try_next().has_value());
  s.push(3);
  CHECK(s.try_next_chunk(out) == 4);
  s.push(4);
  s.push(5);
  CHECK(s.try_next_chunk(out) == 0);
  s.close(Status::ok);
  CHECK(s.try_next_chunk(out) == 2);
  CHECK(out == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(s.done());
}

TEST_CASE("coalescing never delays the first token unless told to", "[token_streamer]") {
  Streamer s(coalesced(8, {}, /*flush_first=*/true), ManualClock{});
  s.push(1);
  CHECK(s.try_next() == 1);
  s.push(2);
  CHECK_FALSE(s.try_next().has_value());
}

TEST_CASE("coalescing by time publishes once the oldest pending token is due", "[token_streamer]") {
  ManualClock clock;
  Streamer s(coalesced(100, 10ms), clock);
  s.push(1);
  clock.advance(4ms);
  s.push(2);
  CHECK_FALSE(s.try_next().has_value());
  clock.advance(5ms);
  CHECK_FALSE(s.try_next().has_value());  // 9 ms after the oldest
  clock.advance(1ms);
  CHECK(s.try_next() == 1);  // the consumer's look publishes the due group
  CHECK(s.try_next() == 2);
  s.push(3);
  clock.advance(10ms);
  s.push(4);  // the push finds token 3 due and publishes both
  std::vector<int> out;
  CHECK(s.try_next_chunk(out) == 2);
  CHECK(out == std::vector<int>{3, 4});
}

TEST_CASE("a slow consumer: the push past capacity closes the stream as cancelled", "[token_streamer]") {
  TokenStreamerConfig o;
  o.capacity = 4;
  Streamer s(o, ManualClock{});
  for (int i = 0; i < 4; ++i) REQUIRE(s.push(i));
  CHECK_FALSE(s.push(4));
  CHECK(s.closed());
  auto end = *s.end();
  CHECK(end.status == Status::cancelled);
  CHECK(end.message.find("fell 4 tokens behind") != std::string::npos);
  CHECK(end.tokens == 4);
  std::vector<int> out;
  CHECK(s.next_chunk(out));
  CHECK(out == std::vector<int>{0, 1, 2, 3});
  CHECK_FALSE(s.next_chunk(out));
  CHECK_FALSE(s.push(5));
}

TEST_CASE("a consumer that keeps up never hits the bound", "[token_streamer]") {
  TokenStreamerConfig o;
  o.capacity = 2;
  Streamer s(o, ManualClock{});
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(s.push(i));
    REQUIRE(s.try_next() == i);
  }
  s.close(Status::ok);
  CHECK(s.end()->ok());
}

TEST_CASE("callback mode delivers chunks in order and the end once, after them", "[token_streamer]") {
  std::vector<std::vector<int>> chunks;
  std::vector<StreamEnd> ends;
  StreamCallbacks<int> cb;
  cb.on_tokens = [&](std::span<const int> t) {
    CHECK(ends.empty());
    chunks.emplace_back(t.begin(), t.end());
  };
  cb.on_end = [&](const StreamEnd& e) { ends.push_back(e); };
  Streamer s(coalesced(3, {}, true), cb, ManualClock{});
  CHECK(s.callback_mode());
  for (int i = 0; i < 8; ++i) REQUIRE(s.push(i));
  s.close(Status::ok);
  s.close(Status::failed);
  REQUIRE(chunks.size() == 4);
  CHECK(chunks[0] == std::vector<int>{0});
  CHECK(chunks[1] == std::vector<int>{1, 2, 3});
  CHECK(chunks[2] == std::vector<int>{4, 5, 6});
  CHECK(chunks[3] == std::vector<int>{7});
  REQUIRE(ends.size() == 1);
  CHECK(ends[0].ok());
  CHECK(ends[0].tokens == 8);
  CHECK(s.done());
  CHECK_FALSE(s.try_next().has_value());
}

TEST_CASE("a throwing on_tokens fails the stream and stops the producer", "[token_streamer]") {
  int ends = 0;
  StreamEnd last;
  StreamCallbacks<int> cb;
  cb.on_tokens = [](std::span<const int> t) {
    if (t[0] == 2) throw std::runtime_error("socket closed");
  };
  cb.on_end = [&](const StreamEnd& e) {
    ++ends;
    last = e;
  };
  Streamer s({}, cb, ManualClock{});
  CHECK(s.push(1));
  CHECK_FALSE(s.push(2));
  CHECK_FALSE(s.push(3));
  CHECK_FALSE(s.close(Status::ok));
  CHECK(ends == 1);
  CHECK(last.status == Status::failed);
  CHECK(last.message.find("socket closed") != std::string::npos);
}

TEST_CASE("a throwing on_tokens during the closing flush turns ok into failed", "[token_streamer]") {
  StreamEnd last;
  StreamCallbacks<int> cb;
  cb.on_tokens = [](std::span<const int>) { throw std::runtime_error("gone"); };
  cb.on_end = [&](const StreamEnd& e) { last = e; };
  Streamer s(coalesced(10), cb, ManualClock{});
  s.push(1);
  s.close(Status::ok);
  CHECK(last.status == Status::failed);
  CHECK(s.end()->status == Status::failed);
}

TEST_CASE("callback mode: one final status, published once, when the closing flush throws",
          "[token_streamer]") {
  // While the final flush runs, a consumer looking at the stream must not already see an
  // ok that on_end and end() later contradict.
  ManualClock clock;
  tailbatch::LatencyHistogram e2e;
  tailbatch::StreamMetrics metrics;
  metrics.end_to_end = &e2e;
  std::shared_ptr<Streamer> s;
  std::vector<StreamEnd> ends;
  std::optional<StreamEnd> seen_during_flush;
  bool closed_during_flush = true;
  StreamCallbacks<int> cb;
  cb.on_tokens = [&](std::span<const int>) {
    seen_during_flush = s->wait_end_for(0s);
    closed_during_flush = s->closed();
    throw std::runtime_error("client went away");
  };
  cb.on_end = [&](const StreamEnd& e) { ends.push_back(e); };
  s = std::make_shared<Streamer>(coalesced(10), cb, clock, tailbatch::CancellationToken{}, &metrics);
  REQUIRE(s->push(1));
  REQUIRE(s->push(2));
  CHECK(s->close(Status::ok));
  CHECK_FALSE(seen_during_flush.has_value());
  CHECK_FALSE(closed_during_flush);
  REQUIRE(ends.size() == 1);
  CHECK(ends[0].status == Status::failed);
  CHECK(ends[0].message.find("client went away") != std::string::npos);
  CHECK(s->wait_end().status == Status::failed);
  CHECK(s->end()->status == Status::failed);
  CHECK(s->end()->tokens == 2);
  CHECK(e2e.snapshot().count() == 0);  // a failed stream is not a successful end to end
  CHECK_FALSE(s->close(Status::cancelled));
  CHECK(ends.size() == 1);
}

TEST_CASE("callback mode: a consumer waiting on another thread sees the status on_end gets",
          "[token_streamer]") {
  for (int round = 0; round < 50; ++round) {
    std::shared_ptr<Streamer> s;
    std::atomic<int> end_status{-1};
    StreamCallbacks<int> cb;
    cb.on_tokens = [&](std::span<const int>) {
      std::this_thread::yield();
      throw std::runtime_error("gone");
    };
    cb.on_end = [&](const StreamEnd& e) { end_status.store(static_cast<int>(e.status)); };
    s = std::make_shared<Streamer>(coalesced(10), cb, ManualClock{});
    std::optional<StreamEnd> waited;
    std::thread consumer([&] { waited = s->wait_end_for(30s); });
    REQUIRE(s->push(round));
    s->close(Status::ok);
    consumer.join();
    REQUIRE(waited.has_value());
    CHECK(waited->status == Status::failed);
    CHECK(end_status.load() == static_cast<int>(Status::failed));
  }
}

TEST_CASE("cancellation by cancel() or by the token reaches the producer", "[token_streamer]") {
  Streamer a({}, ManualClock{});
  CHECK_FALSE(a.cancel_requested());
  a.push(1);
  a.cancel();
  CHECK(a.cancel_requested());
  CHECK_FALSE(a.push(2));
  a.close(Status::cancelled, "cancelled by the consumer");
  CHECK(a.next() == 1);
  CHECK_FALSE(a.next().has_value());

  tailbatch::CancellationSource source;
  Streamer b({}, ManualClock{}, source.get_token());
  CHECK_FALSE(b.cancel_requested());
  source.request_stop();
  CHECK(b.cancel_requested());
}

TEST_CASE("bad options throw std::invalid_argument naming the field", "[token_streamer]") {
  auto message = [](TokenStreamerConfig o) {
    try {
      Streamer s(o, ManualClock{});
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TokenStreamerConfig o;
  o.capacity = 0;
  CHECK(message(o) == "TokenStreamer: capacity must be >= 1");
  o = {};
  o.coalesce_tokens = 0;
  CHECK(message(o) == "TokenStreamer: coalesce_tokens must be >= 1");
  o = {};
  o.capacity = 2;
  o.coalesce_tokens = 3;
  CHECK(message(o) == "TokenStreamer: capacity must be >= coalesce_tokens");
  o = {};
  o.coalesce_interval = -1ms;
  CHECK(message(o) == "TokenStreamer: coalesce_interval must be >= 0");
}

TEST_CASE("time to first token, inter-token latency and time per token on the manual clock",
          "[token_streamer][metrics]") {
  tailbatch::LatencyHistogram ttft, itl, tpot, e2e;
  tailbatch::Counter tokens;
  tailbatch::StreamMetrics m{&ttft, &itl, &tpot, &e2e, &tokens};
  ManualClock clock;
  Streamer s({}, clock, {}, &m);
  auto t0 = s.times().start;
  clock.advance(200ms);
  s.push(1);
  clock.advance(20ms);
  s.push(2);
  clock.advance(40ms);
  s.push(3);
  clock.advance(5ms);
  s.close(Status::ok);

  // The one sample a histogram holds.
  auto only_sample = [](const auto& histogram) {
    const auto snap = histogram.snapshot();
    REQUIRE(snap.count() == 1);
    return snap.max();
  };
  CHECK(only_sample(ttft) == 200ms);
  auto b = itl.snapshot();
  REQUIRE(b.count() == 2);
  CHECK(b.min() == 20ms);
  CHECK(b.max() == 40ms);
  CHECK(only_sample(tpot) == 30ms);
  CHECK(only_sample(e2e) == 265ms);
  CHECK(tokens.value() == 3);

  auto times = s.times();
  CHECK(times.start == t0);
  CHECK(*times.first_token - t0 == 200ms);
  CHECK(*times.last_token - t0 == 260ms);
  CHECK(*times.closed - t0 == 265ms);

  Streamer failed({}, clock, {}, &m);
  failed.push(1);
  failed.close(Status::failed, "x");
  CHECK(e2e.snapshot().count() == 1);  // end-to-end only for successful streams
  CHECK(ttft.snapshot().count() == 2);
}

TEST_CASE("registered metrics use the standard names", "[token_streamer][metrics]") {
  tailbatch::MetricsRegistry registry;
  auto m = tailbatch::StreamMetrics::registered(registry, {{"model", "demo"}});
  tailbatch::TokenStreamer<int> s({}, {}, {}, &m);
  s.push(1);
  s.push(2);
  s.close(Status::ok);
  auto text = registry.prometheus();
  CHECK(text.find("tailbatch_generation_time_to_first_token_seconds") != std::string::npos);
  CHECK(text.find("tailbatch_generation_inter_token_seconds") != std::string::npos);
  CHECK(text.find("tailbatch_generation_tokens_total{model=\"demo\"} 2") != std::string::npos);
}

TEST_CASE("many consumers: every token is read exactly once, each reader in order",
          "[token_streamer][stress]") {
  for (int consumers : {1, 2, 3, 7, 16}) {
    for (std::size_t coalesce : {std::size_t{1}, std::size_t{5}}) {
      const int n = 20000 / tailbatch::test::sanitizer_slowdown;
      TokenStreamerConfig o;
      o.capacity = static_cast<std::size_t>(n) + 1;
      o.coalesce_tokens = coalesce;
      auto s = std::make_shared<tailbatch::TokenStreamer<int>>(o);
      std::vector<std::vector<int>> got(static_cast<std::size_t>(consumers));
      std::vector<std::thread> threads;
      for (int c = 0; c < consumers; ++c) {
        threads.emplace_back([&, c] {
          auto& mine = got[static_cast<std::size_t>(c)];
          if (c % 2 == 0) {
            while (auto t = s->next_for(30s)) mine.push_back(*t);
          } else {
            std::vector<int> chunk;
            while (s->next_chunk_for(chunk, 30s) > 0) {
              mine.insert(mine.end(), chunk.begin(), chunk.end());
              chunk.clear();
            }
          }
        });
      }
      for (int i = 0; i < n; ++i) REQUIRE(s->push(i));
      s->close(Status::ok);
      for (auto& t : threads) t.join();
      std::vector<int> all;
      for (auto& g : got) {
        CHECK(std::is_sorted(g.begin(), g.end()));
        all.insert(all.end(), g.begin(), g.end());
      }
      std::sort(all.begin(), all.end());
      std::vector<int> want(static_cast<std::size_t>(n));
      std::iota(want.begin(), want.end(), 0);
      CHECK(all == want);
      CHECK(s->done());
    }
  }
}

TEST_CASE("cancel from another thread while the producer pushes", "[token_streamer][stress]") {
  for (int round = 0; round < 200 / tailbatch::test::sanitizer_slowdown; ++round) {
    auto s = std::make_shared<tailbatch::TokenStreamer<int>>();
    std::atomic<bool> go{false};
    std::thread canceller([&] {
      while (!go.load()) std::this_thread::yield();
      s->cancel();
    });
    int pushed = 0;
    go = true;
    while (s->push(pushed)) ++pushed;
    s->close(Status::cancelled);
    canceller.join();
    int read = 0;
    while (auto t = s->next_for(10s)) {
      CHECK(*t == read);
      ++read;
    }
    CHECK(read == pushed);
    CHECK(s->end()->status == Status::cancelled);
  }
}
