// tailbatch-load --url: open-loop HTTP/1.1 load against a running server.
//
// The schedule, the latency accounting (from each request's intended send time), the
// sweep verdicts, the tables and the SVG plots are the load generator's
// (include/tailbatch/tools/load_generator.hpp); this file adds an asynchronous HTTP target on
// Boost.Beast/Asio and the HTTP-specific counts:
//
//   * run_load()'s sending thread hands each request, when it is due, to one I/O thread
//     (HttpClient owns it: started in the constructor, joined in the destructor) that
//     holds every connection and every request in flight; one thread holds thousands.
//   * At most --connections connections are open. A request due while all of them are
//     busy waits in a FIFO for the next free one; its latency still counts from its
//     intended send time (that wait is exactly what a closed-loop tool leaves out).
//   * Each response's status is counted (2xx, 429, 503, 504, other), and errors
//     separately (connect: the connection could not be made; timeout: no answer within
//     --timeout-s; io: the connection broke mid-request). For the load generator a 2xx is
//     ok, 429/503 are rejections, 504 a deadline and everything else a failure; only ok
//     requests enter the latency percentiles.
//   * Beside the open-loop percentiles the client records, for the same requests, the
//     latency from the moment the request was actually written (the figure a closed-loop
//     tool such as wrk reports) and the send lag: how late after its intended time each
//     request reached the I/O thread (the generator's own lag) and its socket (lag plus
//     the wait for a free connection).
//
// Only loopback hosts (127.0.0.0/8, ::1, localhost) are accepted unless allow_remote is set.
#pragma once

#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/tools/load_generator.hpp>

#include "tenant_mix.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <strings.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <tuple>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tailbatch_load_http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

// The parts of an http:// URL.
struct Url {
  std::string host;     // without brackets for IPv6
  std::string port = "80";
  std::string target = "/";
};

// Parses http://HOST[:PORT][/PATH]. Throws std::invalid_argument naming --url when the URL
// is not of that form (https is not supported). Allocates. Thread-safe.
[[nodiscard]] inline Url parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) throw std::invalid_argument("--url: \"" + url + "\" must start with http://");
  std::string rest = url.substr(scheme.size());
  Url u;
  const auto slash = rest.find('/');
  if (slash != std::string::npos) {
    u.target = rest.substr(slash);
    rest.resize(slash);
  }
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos) throw std::invalid_argument("--url: unterminated [ in \"" + url + "\"");
    u.host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw std::invalid_argument("--url: cannot read the port of \"" + url + "\"");
      u.port = rest.substr(1);
    }
  } else {
    const auto colon = rest.rfind(':');
    u.host = rest.substr(0, colon);
    if (colon != std::string::npos) u.port = rest.substr(colon + 1);
  }
  if (u.host.empty()) throw std::invalid_argument("--url: no host in \"" + url + "\"");
  if (u.port.empty() || u.port.find_first_not_of("0123456789") != std::string::npos || u.port.size() > 5 ||
      std::stoul(u.port) == 0 || std::stoul(u.port) > 65535)
    throw std::invalid_argument("--url: bad port in \"" + url + "\"");
  return u;
}

// True for localhost, an IPv4 address in 127.0.0.0/8 and ::1 (also ::ffff:127.x.y.z).
// Does not resolve names: any other name is not loopback. Thread-safe.
[[nodiscard]] inline bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const auto a = asio::ip::make_address(host, ec);
  if (ec) return false;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6()).is_loopback();
  return a.is_loopback();
}

// What to send.
struct HttpTargetOptions {
  std::string url;
  std::string method = "GET";
  std::vector<std::string> bodies;  // cycled, one per request; empty: no body
  std::vector<std::string> headers; // "Name: value"
  std::size_t connections = 64;
  std::chrono::nanoseconds timeout = std::chrono::seconds(10);
  bool allow_remote = false;
  // --tenant-mix: each request carries "X-Tenant: NAME" of tenant_of(index).
  std::vector<std::string> tenants;
  std::function<std::size_t(std::uint64_t)> tenant_of{};
};

// The HTTP outcome counts, and the client-side histograms, of one run.
struct HttpCounts {
  std::uint64_t sent = 0;  // requests handed to the client (warm-up included)
  std::uint64_t s2xx = 0, s429 = 0, s503 = 0, s504 = 0, other = 0;
  std::uint64_t connect_errors = 0, timeouts = 0, io_errors = 0;
  tailbatch::HistogramSnapshot from_send;      // 2xx after the warm-up: latency from the actual write
  tailbatch::HistogramSnapshot dispatch_lag;   // intended time -> the I/O thread has it
  tailbatch::HistogramSnapshot write_lag;      // intended time -> written to a socket
  std::size_t max_connections_open = 0;

  // Every request sent ends in exactly one of these. Thread-safe.
  [[nodiscard]] std::uint64_t accounted() const noexcept {
    return s2xx + s429 + s503 + s504 + other + connect_errors + timeouts + io_errors;
  }
};

// The asynchronous HTTP client behind `tailbatch-load --url`. Owns one I/O thread (started
// by the constructor, joined by the destructor) that runs every connection; all connection
// state lives on that thread. target() returns an AsyncLoadTarget for run_load().
// Thread-safety: target()'s callable, take_counts() and url() are thread-safe; construction
// and destruction are not. Exceptions: only the constructor throws (strong guarantee).
class HttpClient {
 public:
  // Resolves the host (blocking) and starts the I/O thread. Allocates. Throws
  // std::invalid_argument for a bad URL, a non-loopback host without allow_remote or zero
  // connections, std::runtime_error when the host does not resolve. Not thread-safe: one
  // owner constructs and destroys it.
  explicit HttpClient(HttpTargetOptions o) : o_(std::move(o)), url_(parse_url(o_.url)) {
    if (!o_.allow_remote && !is_loopback_host(url_.host))
      throw std::invalid_argument("--url: host \"" + url_.host +
                                  "\" is not a loopback address (127.0.0.0/8, ::1, localhost); pass --allow-remote "
                                  "to load another machine");
    if (o_.connections == 0) throw std::invalid_argument("--connections must be >= 1");
    boost::system::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(url_.host, url_.port, ec);
    if (ec) throw std::runtime_error("--url: cannot resolve " + url_.host + ": " + ec.message());
    for (const auto& r : results) endpoints_.push_back(r.endpoint());
    // One serialized request per body (and tenant): writing is a single buffer, no
    // per-request formatting.
    const std::size_t n = std::max<std::size_t>(1, o_.bodies.size());
    bodies_ = n;
    for (std::size_t k = 0; k < std::max<std::size_t>(1, o_.tenants.size()) * n; ++k) {
      const std::size_t i = k % n;
      std::string req = o_.method + " " + url_.target + " HTTP/1.1\r\nHost: " + url_.host + ":" + url_.port +
                        "\r\nUser-Agent: tailbatch-load\r\n";
      if (!o_.tenants.empty()) req += "X-Tenant: " + o_.tenants[k / n] + "\r\n";
      bool has_type = false;
      for (const auto& h : o_.headers) {
        if (h.size() >= 13 && strncasecmp(h.c_str(), "content-type:", 13) == 0) has_type = true;
        req += h + "\r\n";
      }
      if (!o_.bodies.empty()) {
        if (!has_type) req += "Content-Type: application/json\r\n";
        req += "Content-Length: " + std::to_string(o_.bodies[i].size()) + "\r\n\r\n" + o_.bodies[i];
      } else {
        req += "\r\n";
      }
      wire_.push_back(std::move(req));
    }
    reset_counts();
    work_.emplace(asio::make_work_guard(ioc_));
    thread_ = std::thread([this] { ioc_.run(); });
  }

  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Closes every connection and joins the I/O thread; requests still open are dropped
  // without completing (run_load() has already counted them as timed out). Blocks briefly.
  // Not thread-safe: no run may be in progress.
  ~HttpClient() {
    work_.reset();
    asio::post(ioc_, [this] {
      for (auto& c : conns_) {
        boost::system::error_code ec;
        c->timer.cancel();
        c->socket.close(ec);
      }
    });
    ioc_.stop();
    if (thread_.joinable()) thread_.join();
  }

  // An AsyncLoadTarget: hands request `index` to the I/O thread and returns at once; the
  // LoadCompletion is called on the I/O thread. Allocates one small handler per request;
  // never blocks. The callable is thread-safe (asio::post); the client must outlive it.
  [[nodiscard]] auto target() {
    return [this](std::uint64_t index, tailbatch::LoadCompletion done) {
      asio::post(ioc_, [this, index, done = std::move(done)]() mutable { start(index, std::move(done)); });
    };
  }

  // The counts since the last call (or since construction) and resets them. Blocks until
  // the I/O thread has answered; allocates. Thread-safe, but meant for between runs: during
  // one the counts are a moving snapshot.
  [[nodiscard]] HttpCounts take_counts() {
    HttpCounts out;
    std::mutex mu;
    std::condition_variable cv;
    bool ready = false;
    asio::post(ioc_, [&] {
      out = counts_;
      out.from_send = from_send_->snapshot();
      out.dispatch_lag = dispatch_lag_->snapshot();
      out.write_lag = write_lag_->snapshot();
      out.max_connections_open = max_open_;
      reset_counts();
      std::lock_guard lock(mu);
      ready = true;
      cv.notify_one();
    });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return ready; });
    return out;
  }

  // Counts latency from the actual send (HttpCounts::from_send) only for requests intended
  // at or after `t`, as run_load() counts only those after its warm-up. Applies to requests
  // handed over after this call. Allocates one handler. Thread-safe.
  void measure_from(std::chrono::steady_clock::time_point t) {
    asio::post(ioc_, [this, t] { measure_from_ = t; });
  }

  // Per-tenant counts go to `tally` for requests handed over after this call (null: none).
  // Allocates one handler. Thread-safe.
  void count_tenants_in(std::shared_ptr<tailbatch_load::TenantTally> tally) {
    asio::post(ioc_, [this, tally = std::move(tally)]() mutable { tally_ = std::move(tally); });
  }

  // The parsed --url. Thread-safe.
  [[nodiscard]] const Url& url() const noexcept { return url_; }

 private:
  struct Pending {
    std::uint64_t index;
    tailbatch::LoadCompletion done;
  };
  struct Conn {
    explicit Conn(asio::io_context& ioc) : socket(ioc), timer(ioc) {}
    tcp::socket socket;
    asio::steady_timer timer;
    beast::flat_buffer buffer;
    std::optional<http::response_parser<http::string_body>> parser;
    bool connected = false;
    bool busy = false;
    std::optional<Pending> req;
    std::chrono::steady_clock::time_point written{};
    std::uint64_t generation = 0;  // bumped per request: stale timer callbacks ignore themselves
  };

  // Runs on the I/O thread only; so do all the following.
  void reset_counts() {
    counts_ = HttpCounts{};
    tailbatch::LatencyHistogramConfig ho;
    from_send_.emplace(ho);
    dispatch_lag_.emplace(ho);
    write_lag_.emplace(ho);
    max_open_ = 0;
  }

  void start(std::uint64_t index, tailbatch::LoadCompletion done) {
    ++counts_.sent;
    const auto now = std::chrono::steady_clock::now();
    dispatch_lag_->record(std::max(std::chrono::nanoseconds(0), std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                                     now - done.intended())));
    Pending p{index, std::move(done)};
    for (auto& c : conns_) {
      if (!c->busy) return assign(*c, std::move(p));
    }
    if (conns_.size() < o_.connections) {
      conns_.push_back(std::make_unique<Conn>(ioc_));
      max_open_ = std::max(max_open_, conns_.size());
      return assign(*conns_.back(), std::move(p));
    }
    queue_.push_back(std::move(p));
  }

  void assign(Conn& c, Pending p) {
    c.busy = true;
    c.req.emplace(std::move(p));
    ++c.generation;
    const auto gen = c.generation;
    c.timer.expires_at(c.req->done.intended() + o_.timeout);
    c.timer.async_wait([this, &c, gen](boost::system::error_code ec) {
      if (ec || gen != c.generation || !c.busy) return;
      finish(c, 0, kTimeout);
    });
    if (!c.connected) {
      asio::async_connect(c.socket, endpoints_, [this, &c, gen](boost::system::error_code ec, const tcp::endpoint&) {
        if (gen != c.generation || !c.busy) return;
        if (ec) return finish(c, 0, kConnect);
        c.connected = true;
        boost::system::error_code ignored;
        c.socket.set_option(tcp::no_delay(true), ignored);
        write(c);
      });
      return;
    }
    write(c);
  }

  void write(Conn& c) {
    const auto gen = c.generation;
    const std::size_t tenant = o_.tenant_of && !o_.tenants.empty() ? o_.tenant_of(c.req->index) : 0;
    const std::string& bytes = wire_[(tenant * bodies_ + c.req->index % bodies_) % wire_.size()];
    c.written = std::chrono::steady_clock::now();
    write_lag_->record(std::max(std::chrono::nanoseconds(0),
                                std::chrono::duration_cast<std::chrono::nanoseconds>(c.written - c.req->done.intended())));
    asio::async_write(c.socket, asio::buffer(bytes), [this, &c, gen](boost::system::error_code ec, std::size_t) {
      if (gen != c.generation || !c.busy) return;
      if (ec) return finish(c, 0, kIo);
      c.parser.emplace();
      c.parser->body_limit(64u << 20);
      http::async_read(c.socket, c.buffer, *c.parser, [this, &c, gen](boost::system::error_code ec2, std::size_t) {
        if (gen != c.generation || !c.busy) return;
        if (ec2) return finish(c, 0, kIo);
        const auto& res = c.parser->get();
        if (!res.keep_alive()) c.connected = false;
        finish(c, static_cast<int>(res.result_int()), kNone);
      });
    });
  }

  enum ErrorKind { kNone, kConnect, kTimeout, kIo };

  void finish(Conn& c, int code, ErrorKind err) {
    using tailbatch::Status;
    const auto now = std::chrono::steady_clock::now();
    Status s = Status::failed;
    switch (err) {
      case kConnect: ++counts_.connect_errors; break;
      case kTimeout: ++counts_.timeouts; break;
      case kIo: ++counts_.io_errors; break;
      case kNone:
        if (code >= 200 && code < 300) {
          ++counts_.s2xx;
          s = Status::ok;
          if (c.req->done.intended() >= measure_from_)
            from_send_->record(std::chrono::duration_cast<std::chrono::nanoseconds>(now - c.written));
        } else if (code == 429) {
          ++counts_.s429;
          s = Status::rejected;
        } else if (code == 503) {
          ++counts_.s503;
          s = Status::rejected;
        } else if (code == 504) {
          ++counts_.s504;
          s = Status::deadline_exceeded;
        } else {
          ++counts_.other;
        }
        break;
    }
    if (err != kNone) {
      // The connection's state is unknown: close it; the next request reconnects.
      boost::system::error_code ignored;
      c.socket.close(ignored);
      c.buffer.clear();
      c.connected = false;
    } else if (!c.connected) {
      boost::system::error_code ignored;
      c.socket.shutdown(tcp::socket::shutdown_both, ignored);
      c.socket.close(ignored);
      c.buffer.clear();
    }
    c.timer.cancel();
    if (tally_ && c.req->done.intended() >= measure_from_) {
      const std::size_t tenant = o_.tenant_of && !o_.tenants.empty() ? o_.tenant_of(c.req->index) : 0;
      tally_->record(tenant, s, std::chrono::duration_cast<std::chrono::nanoseconds>(now - c.req->done.intended()));
    }
    auto done = std::move(c.req->done);
    c.req.reset();
    c.busy = false;
    ++c.generation;
    done(s);
    if (!queue_.empty()) {
      Pending next = std::move(queue_.front());
      queue_.pop_front();
      assign(c, std::move(next));
    }
  }

  HttpTargetOptions o_;
  Url url_;
  asio::io_context ioc_{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::vector<tcp::endpoint> endpoints_;
  std::vector<std::string> wire_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::deque<Pending> queue_;
  HttpCounts counts_;
  std::optional<tailbatch::LatencyHistogram> from_send_, dispatch_lag_, write_lag_;
  std::size_t max_open_ = 0;
  std::size_t bodies_ = 1;
  std::chrono::steady_clock::time_point measure_from_{};
  std::shared_ptr<tailbatch_load::TenantTally> tally_;
  std::thread thread_;
};

// ---- the --url mode of tailbatch-load -------------------------------------------------

// The HTTP flags (see add_http_options()).
struct HttpCli {
  std::string url;
  std::string method = "GET";
  std::string body;
  std::string body_file;
  std::vector<std::string> headers;
  std::size_t connections = 64;
  double timeout_s = 10.0;
  bool allow_remote = false;
  // Bodies drawn from tailbatch-load's generation workload flags (--output-len,
  // --prompt-len, --shared-prefix, --max-tokens: generation_load.hpp), one per request,
  // cycled; instead of --body / --body-file.
  std::vector<std::string> generated_bodies;
};

// The flags shared with the in-process mode, as tailbatch-load parsed them.
struct CommonRun {
  double rate = 0.0;
  std::vector<double> sweep;
  std::optional<tailbatch::LoadProfile> steps;  // --steps, parsed
  double duration_s = 10.0, warmup_s = 2.0;
  double slo_p95_ms = 100.0;
  std::string arrivals = "poisson";
  std::uint64_t seed = 42;
  std::string out = "tailbatch-load-out";
  bool quiet = false;
  bool json = false;
  std::vector<tailbatch_load::TenantSpec> tenants;  // --tenant-mix
};

// The classifier's batch counters from a tailbatch-serve /v1/stats ("batches" and
// "batched_requests" of its "classify" object), read with a 1 s budget; nullopt when the
// server has no such endpoint or it does not answer. Blocks. Thread-safe.
[[nodiscard]] inline std::optional<std::pair<double, double>> read_batch_counters(const Url& u) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, "/v1/stats", 11};
  req.set(http::field::host, u.host + ":" + u.port);
  http::response<http::string_body> res;
  bool ok = false;
  tcp::resolver resolver(ioc);
  boost::system::error_code ec;
  auto eps = resolver.resolve(u.host, u.port, ec);
  if (ec) return std::nullopt;
  stream.expires_after(std::chrono::seconds(1));
  stream.async_connect(eps, [&](boost::system::error_code e, const tcp::endpoint&) {
    if (e) return;
    http::async_write(stream, req, [&](boost::system::error_code e2, std::size_t) {
      if (e2) return;
      http::async_read(stream, buffer, res, [&](boost::system::error_code e3, std::size_t) { ok = !e3; });
    });
  });
  ioc.run_for(std::chrono::seconds(2));
  if (!ok || res.result_int() != 200) return std::nullopt;
  const std::string& b = res.body();
  const auto cls = b.find("\"classify\"");
  if (cls == std::string::npos) return std::nullopt;
  auto number_after = [&](const char* key) -> std::optional<double> {
    const auto k = b.find(key, cls);
    if (k == std::string::npos) return std::nullopt;
    try {
      return std::stod(b.substr(k + std::strlen(key)));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  auto batches = number_after("\"batches\":");
  auto batched = number_after("\"batched_requests\":");
  if (!batches || !batched) return std::nullopt;
  return std::make_pair(*batches, *batched);
}

namespace tools::detail {

inline double ms(std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); }
inline double pct_ms(const tailbatch::HistogramSnapshot& s, double p) {
  return s.count() ? ms(s.percentile(p)) : 0.0;
}

inline std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

// One run as the JSON object of --json (one line).
inline std::string run_json(const std::string& url, double offered, const tailbatch::LoadResult& r,
                            const HttpCounts& c, std::optional<double> mean_batch, bool meets_slo,
                            std::optional<bool> saturation, double goodput_rps,
                            const std::vector<tailbatch_load::TenantRow>& tenants) {
  std::string j = "{";
  j += "\"url\":\"" + json_escape(url) + "\"";
  j += ",\"offered_rps\":" + json_number(offered);
  j += ",\"achieved_rps\":" + json_number(r.throughput_rps);
  j += ",\"p50_ms\":" + json_number(ms(r.p50));
  j += ",\"p95_ms\":" + json_number(ms(r.p95));
  j += ",\"p99_ms\":" + json_number(ms(r.p99));
  j += ",\"p999_ms\":" + json_number(ms(r.p999));
  j += ",\"max_ms\":" + json_number(ms(r.max));
  j += ",\"mean_batch\":" + (mean_batch ? json_number(*mean_batch) : std::string("null"));
  j += ",\"requests\":" + std::to_string(c.sent);
  j += ",\"measured\":" + std::to_string(r.due);
  j += ",\"errors\":" + std::to_string(c.connect_errors + c.timeouts + c.io_errors);
  j += ",\"connect_errors\":" + std::to_string(c.connect_errors);
  j += ",\"timeouts\":" + std::to_string(c.timeouts);
  j += ",\"io_errors\":" + std::to_string(c.io_errors);
  j += ",\"status\":{\"2xx\":" + std::to_string(c.s2xx) + ",\"429\":" + std::to_string(c.s429) +
       ",\"503\":" + std::to_string(c.s503) + ",\"504\":" + std::to_string(c.s504) +
       ",\"other\":" + std::to_string(c.other) + "}";
  j += ",\"p50_from_send_ms\":" + json_number(pct_ms(c.from_send, 50));
  j += ",\"p99_from_send_ms\":" + json_number(pct_ms(c.from_send, 99));
  j += ",\"send_lag_ms\":{\"p50\":" + json_number(pct_ms(c.dispatch_lag, 50)) +
       ",\"p99\":" + json_number(pct_ms(c.dispatch_lag, 99)) + ",\"p999\":" + json_number(pct_ms(c.dispatch_lag, 99.9)) +
       ",\"max\":" + json_number(c.dispatch_lag.count() ? ms(c.dispatch_lag.max()) : 0.0) + "}";
  j += ",\"write_lag_ms\":{\"p50\":" + json_number(pct_ms(c.write_lag, 50)) +
       ",\"p99\":" + json_number(pct_ms(c.write_lag, 99)) +
       ",\"max\":" + json_number(c.write_lag.count() ? ms(c.write_lag.max()) : 0.0) + "}";
  j += ",\"connections_used\":" + std::to_string(c.max_connections_open);
  j += std::string(",\"meets_slo\":") + (meets_slo ? "true" : "false");
  if (saturation) j += std::string(",\"saturation\":") + (*saturation ? "true" : "false");
  j += ",\"goodput_rps\":" + json_number(goodput_rps);
  j += ",\"tenants\":" + tailbatch_load::tenants_json(tenants);
  j += "}";
  return j;
}

inline std::string http_table_header() {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%10s %8s %6s %6s %6s %6s %8s %8s %12s %10s %10s %6s\n", "offered", "2xx", "429",
                "503", "504", "other", "connect", "tmout+io", "p99 fr.send", "lag p99", "lag max", "batch");
  std::string out = buf;
  std::snprintf(buf, sizeof buf, "%10s %8s %6s %6s %6s %6s %8s %8s %12s %10s %10s %6s\n", "rps", "", "", "", "", "",
                "errors", "errors", "ms", "ms", "ms", "mean");
  return out + buf;
}

inline std::string http_table_row(double offered, const HttpCounts& c, std::optional<double> mean_batch) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%10.0f %8llu %6llu %6llu %6llu %6llu %8llu %8llu %12.2f %10.2f %10.2f %6s\n",
                offered, static_cast<unsigned long long>(c.s2xx), static_cast<unsigned long long>(c.s429),
                static_cast<unsigned long long>(c.s503), static_cast<unsigned long long>(c.s504),
                static_cast<unsigned long long>(c.other), static_cast<unsigned long long>(c.connect_errors),
                static_cast<unsigned long long>(c.timeouts + c.io_errors), pct_ms(c.from_send, 99),
                pct_ms(c.dispatch_lag, 99), c.dispatch_lag.count() ? ms(c.dispatch_lag.max()) : 0.0,
                mean_batch ? json_number(*mean_batch).substr(0, 5).c_str() : "-");
  return buf;
}

}  // namespace tools::detail

// Reads --body / --body-file into the bodies to cycle. Throws std::invalid_argument naming
// the flag when the file cannot be read or is empty. Allocates. Thread-safe.
[[nodiscard]] inline std::vector<std::string> load_bodies(const HttpCli& h) {
  if (!h.generated_bodies.empty()) {
    if (!h.body.empty() || !h.body_file.empty())
      throw std::invalid_argument(
          "--body/--body-file and the generation workload flags (--output-len, --prompt-len, --shared-prefix, "
          "--max-tokens) both make the bodies: give one or the other");
    if (h.method != "POST")
      throw std::invalid_argument("the generation workload flags send /v1/completions bodies: add --method POST");
    return h.generated_bodies;
  }
  std::vector<std::string> bodies;
  if (!h.body.empty()) bodies.push_back(h.body);
  if (!h.body_file.empty()) {
    std::ifstream in(h.body_file);
    if (!in) throw std::invalid_argument("--body-file: cannot read " + h.body_file);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) bodies.push_back(line);
    }
    if (bodies.empty()) throw std::invalid_argument("--body-file: " + h.body_file + " holds no body");
  }
  return bodies;
}

// Runs tailbatch-load's --url mode: one run (--rate/--steps) or a sweep, printed as tables
// (or JSON lines with --json, the tables then going to stderr) with SVG plots in --out.
// Blocks for the whole run. Returns the exit status. Throws std::invalid_argument for bad
// flags (a non-loopback host without --allow-remote among them), std::runtime_error when
// the host does not resolve. Owns one I/O thread for the run (HttpClient). Thread-safe (a
// run shares nothing with another).
[[nodiscard]] inline int run_http(const HttpCli& h, const CommonRun& o) {
  using namespace std::chrono;
  HttpTargetOptions t;
  t.url = h.url;
  t.method = h.method;
  t.bodies = load_bodies(h);
  t.headers = h.headers;
  for (const auto& hd : t.headers)
    if (hd.find(':') == std::string::npos) throw std::invalid_argument("--header: \"" + hd + "\" is not Name: value");
  t.connections = h.connections;
  if (!(h.timeout_s > 0.0)) throw std::invalid_argument("--timeout-s must be > 0");
  t.timeout = duration_cast<nanoseconds>(duration<double>(h.timeout_s));
  t.allow_remote = h.allow_remote;
  for (const auto& spec : o.tenants) t.tenants.push_back(spec.name);
  const tailbatch_load::TenantSplit split(o.tenants, o.seed);
  if (!o.tenants.empty()) t.tenant_of = [&split](std::uint64_t i) { return split.tenant_of(i); };
  HttpClient client(t);
  auto target = client.target();
  const auto process = o.arrivals == "constant" ? tailbatch::ArrivalProcess::constant : tailbatch::ArrivalProcess::poisson;
  auto from_s = [](double s) { return duration_cast<nanoseconds>(duration<double>(s)); };
  tailbatch::LoadConfig base;
  base.seed = o.seed;
  // Every request ends by its own timeout first, so run_load() never gives up on one.
  base.drain_timeout = t.timeout + seconds(2);
  base.label = "http";
  if (!o.quiet) {
    base.progress = tailbatch::progress_to(std::cerr);
    base.progress_interval = std::min<nanoseconds>(seconds(1), from_s(o.duration_s / 2.0));
  }
  const std::string sub = h.method + " " + h.url + "; " + std::to_string(h.connections) + " connections at most; " +
                          o.arrivals + " arrivals";
  std::FILE* table_out = o.json ? stderr : stdout;
  std::filesystem::create_directories(o.out);
  std::vector<std::string> written;

  // The goodput and per-tenant rows of each run, in order.
  std::vector<std::pair<double, std::vector<tailbatch_load::TenantRow>>> goodputs;
  auto one_run = [&](tailbatch::LoadConfig lo) {
    const auto before = read_batch_counters(client.url());
    auto tally = std::make_shared<tailbatch_load::TenantTally>(std::max<std::size_t>(1, o.tenants.size()),
                                                               from_s(o.slo_p95_ms / 1000.0));
    client.count_tenants_in(tally);
    // run_load() starts its clock a few microseconds later: the boundaries agree to that.
    client.measure_from(std::chrono::steady_clock::now() + lo.warmup);
    auto r = tailbatch::run_load(lo, target);
    auto c = client.take_counts();  // after the I/O thread's last record into the tally
    client.count_tenants_in(nullptr);
    const double window_s = duration<double>(r.measured_window).count();
    const double offered_s = std::max(duration<double>(lo.profile.duration() - lo.warmup).count(), 1e-9);
    goodputs.emplace_back(window_s > 0 ? static_cast<double>(tally->good()) / window_s : 0.0,
                          o.tenants.empty() ? std::vector<tailbatch_load::TenantRow>{}
                                            : tally->rows(o.tenants, offered_s, window_s));
    std::optional<double> mean_batch;
    if (before) {
      if (const auto after = read_batch_counters(client.url()); after && after->first > before->first)
        mean_batch = (after->second - before->second) / (after->first - before->first);
    }
    return std::make_tuple(std::move(r), std::move(c), mean_batch);
  };

  if (!o.sweep.empty()) {
    std::vector<double> rates = o.sweep;
    std::sort(rates.begin(), rates.end());
    tailbatch::SweepResult sweep;
    sweep.slo_p95_ms = o.slo_p95_ms;
    std::vector<HttpCounts> counts;
    std::vector<std::optional<double>> batches;
    bool all_ok = true;
    for (std::size_t i = 0; i < rates.size(); ++i) {
      tailbatch::LoadConfig lo = base;
      lo.profile = tailbatch::LoadProfile::steady(process, rates[i], from_s(o.duration_s));
      lo.warmup = from_s(o.warmup_s);
      lo.seed = o.seed + i;
      lo.label = "http " + std::to_string(static_cast<long long>(rates[i])) + " rps " + std::to_string(i + 1) + "/" +
                 std::to_string(rates.size());
      auto [r, c, mb] = one_run(lo);
      tailbatch::SweepPoint p;
      p.offered_rps = rates[i];
      p.result = std::move(r);
      p.verdict = tailbatch::tools::detail::sweep_verdict(p.result, o.slo_p95_ms, sweep.max_error_rate, p.meets_slo);
      if (p.meets_slo && all_ok) sweep.saturation = i;
      if (!p.meets_slo) all_ok = false;
      sweep.points.push_back(std::move(p));
      counts.push_back(std::move(c));
      batches.push_back(mb);
      if (!all_ok) break;  // past saturation more load only queues
      if (i + 1 < rates.size()) std::this_thread::sleep_for(milliseconds(200));
    }
    std::fprintf(table_out, "%s\n\n%s\n%s", sub.c_str(), tailbatch::format_sweep_table(sweep).c_str(),
                 tools::detail::http_table_header().c_str());
    for (std::size_t i = 0; i < sweep.points.size(); ++i)
      std::fputs(tools::detail::http_table_row(sweep.points[i].offered_rps, counts[i], batches[i]).c_str(), table_out);
    if (o.json) {
      for (std::size_t i = 0; i < sweep.points.size(); ++i)
        std::printf("%s\n", tools::detail::run_json(h.url, sweep.points[i].offered_rps, sweep.points[i].result, counts[i],
                                             batches[i], sweep.points[i].meets_slo,
                                             sweep.saturation && *sweep.saturation == i, goodputs[i].first,
                                             goodputs[i].second)
                                .c_str());
    }
    const std::string lat = (std::filesystem::path(o.out) / "latency_vs_load.svg").string();
    tailbatch::write_svg(lat, tailbatch::latency_vs_load_plot(sweep, "Latency vs offered load (HTTP)", sub));
    written.push_back(lat);
    const std::string thr = (std::filesystem::path(o.out) / "throughput_vs_load.svg").string();
    tailbatch::write_svg(thr, tailbatch::throughput_vs_load_plot({&sweep}, {"achieved (2xx)"},
                                                                 "Throughput vs offered load (HTTP)", sub));
    written.push_back(thr);
    const auto& shown = sweep.saturation_point() ? *sweep.saturation_point() : sweep.points.front();
    const std::string over = (std::filesystem::path(o.out) / "p95_over_time.svg").string();
    char title[96];
    std::snprintf(title, sizeof title, "Latency over time at %.0f rps offered (HTTP)", shown.offered_rps);
    tailbatch::write_svg(over, tailbatch::latency_over_time_plot(shown.result, o.slo_p95_ms, title, sub));
    written.push_back(over);
  } else {
    tailbatch::LoadConfig lo = base;
    lo.profile = o.steps ? *o.steps : tailbatch::LoadProfile::steady(process, o.rate, from_s(o.duration_s));
    lo.warmup = from_s(o.warmup_s) < lo.profile.duration() ? from_s(o.warmup_s) : nanoseconds(0);
    auto [r, c, mb] = one_run(lo);
    bool meets = false;
    const std::string verdict = tailbatch::tools::detail::sweep_verdict(r, o.slo_p95_ms, 0.01, meets);
    std::fprintf(table_out, "%s\n\n%s%s\n%s%s", sub.c_str(), tailbatch::format_load_result(r).c_str(),
                 ("verdict: " + verdict).c_str(), tools::detail::http_table_header().c_str(),
                 tools::detail::http_table_row(r.offered_rps, c, mb).c_str());
    if (!o.tenants.empty())
      std::fputs(tailbatch_load::tenants_table(goodputs.back().second, o.slo_p95_ms).c_str(), table_out);
    std::fprintf(table_out, "goodput (2xx within %g ms): %.1f requests/s\n", o.slo_p95_ms, goodputs.back().first);
    if (o.json)
      std::printf("%s\n", tools::detail::run_json(h.url, r.offered_rps, r, c, mb, meets, std::nullopt,
                                                   goodputs.back().first, goodputs.back().second)
                             .c_str());
    const std::string over = (std::filesystem::path(o.out) / "p95_over_time.svg").string();
    tailbatch::write_svg(over, tailbatch::latency_over_time_plot(r, o.slo_p95_ms, "Latency over time (HTTP)", sub));
    written.push_back(over);
  }
  std::fprintf(table_out, "\nplots:\n");
  for (const auto& w : written) std::fprintf(table_out, "  %s\n", w.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace tailbatch_load_http
