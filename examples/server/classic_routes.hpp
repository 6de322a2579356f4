// tailbatch-serve, routing and the classic routes: /v1/classify, /v1/generate, /v1/stats, /metrics,
// probes, the dashboard (classic_routes.hpp). One of the parts tailbatch_serve.cpp includes, in
// this order: options.hpp, server.hpp, connection.hpp, models.hpp, classic_routes.hpp,
// openai_routes.hpp; not a header to include elsewhere.
#pragma once

namespace tailbatch_serve {

// examples/server/dashboard.html, embedded by examples/server_dashboard.cmake.
constexpr const char* dashboard_html =
#include "dashboard_html.inc"
    ;

void Server::count_response(std::string_view route, int code, SteadyTime arrival) {
  const auto now = std::chrono::steady_clock::now();
  if (route == "classify") {
    classify_latency_->record(now - arrival);
    if (code == 200) classify_rate_.add(1, now);
  } else if (route == "generate") {
    generate_latency_->record(now - arrival);
  }
  std::lock_guard lock(counters_mu_);
  auto key = std::make_pair(std::string(route), code);
  auto it = responses_.find(key);
  if (it == responses_.end()) {
    tb::Counter& c = registry_.counter(
        "tailbatch_serve_responses_total", "HTTP responses, by route and status code",
        {{"route", std::string(route)}, {"code", std::to_string(code)}});
    it = responses_.emplace(std::move(key), &c).first;
  }
  it->second->inc();
}

std::chrono::nanoseconds Server::classify_default_budget() const noexcept {
  if (!opt_.default_timeout_from_slo) return std::chrono::milliseconds(opt_.default_timeout_ms);
  return std::chrono::nanoseconds(slo_inputs_->wait_budget_ns.load(std::memory_order_relaxed));
}

std::optional<SteadyTime> Server::deadline_of(const std::shared_ptr<Connection>& c,
                                              const http::request<http::string_body>& req,
                                              bool classify) {
  const auto h = req.find(beast::string_view(tailbatch_serve::timeout_header.data(),
                                             tailbatch_serve::timeout_header.size()));
  std::chrono::nanoseconds budget =
      classify ? classify_default_budget() : std::chrono::milliseconds(opt_.default_timeout_ms);
  if (h != req.end()) {
    std::string error;
    auto t = tailbatch_serve::decode_timeout(std::string_view(h->value().data(), h->value().size()),
                                             limits_, error);
    if (!t) {
      c->respond_error(400, "bad_request", error);
      return std::nullopt;
    }
    budget = *t;
    if (budget.count() == 0) return SteadyTime::max();  // 0: no budget, as in SubmitOptions
  } else if (budget.count() == 0) {
    return SteadyTime::max();
  }
  return c->context().arrival + budget;
}

bool Server::authorize(const std::shared_ptr<Connection>& c,
                       const http::request<http::string_body>& req) {
  if (opt_.api_key.empty() && tenant_keys_.empty()) return true;
  const auto h = req.find(http::field::authorization);
  if (h == req.end()) return false;
  const std::string_view v(h->value().data(), h->value().size());
  constexpr std::string_view bearer = "Bearer ";
  if (v.size() < bearer.size() || !iequal(v.substr(0, bearer.size()), bearer)) return false;
  const std::string_view token = v.substr(bearer.size());
  // Every key is compared (in constant time each), so that the time taken does not tell
  // which key came close.
  bool ok = !opt_.api_key.empty() && tailbatch_serve::constant_time_equal(token, opt_.api_key);
  for (const TenantKey& k : tenant_keys_) {
    if (tailbatch_serve::constant_time_equal(token, k.key)) {
      ok = true;
      c->context().key_tenant = k.tenant;
    }
  }
  return ok;
}

tb::TenantId Server::tenant_of(const std::shared_ptr<Connection>& c,
                               const http::request<http::string_body>& req, std::string_view user) {
  if (c->context().key_tenant) return *c->context().key_tenant;
  try {
    if (!user.empty()) return tenant_names_.id(tailbatch_serve::loggable(user));
    if (opt_.tenant_header) {
      const auto h = req.find("x-tenant");
      if (h != req.end() && !h->value().empty())
        return tenant_names_.id(
            tailbatch_serve::loggable(std::string_view(h->value().data(), h->value().size())));
    }
  } catch (const std::bad_alloc&) {
  }
  return 0;
}

namespace {
bool is_loopback_host(std::string_view host) {
  // Host: name[:port]; [v6]:port.
  if (host.starts_with("[")) {
    const auto close = host.find(']');
    host = close == std::string_view::npos ? host : host.substr(1, close - 1);
  } else if (const auto colon = host.rfind(':'); colon != std::string_view::npos) {
    host = host.substr(0, colon);
  }
  return iequal(host, "localhost") || host == "::1" || host.starts_with("127.");
}
}  // namespace

void Server::handle(const std::shared_ptr<Connection>& c, http::request<http::string_body>&& req) {
  std::string_view target(req.target().data(), req.target().size());
  // Absolute-form targets (RFC 9112 3.2.2: "http://host/path") name the path after the authority.
  if (target.starts_with("http://") || target.starts_with("https://")) {
    const auto slash = target.find('/', target.find("//") + 2);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  target = target.substr(0, target.find('?'));
  struct Route {
    std::string_view path, label;
    http::verb method;
  };
  static constexpr std::array<Route, 12> routes = {
      {{"/v1/classify", "classify", http::verb::post},
       {"/v1/generate", "generate", http::verb::post},
       {"/v1/models", "models", http::verb::get},
       {"/v1/completions", "completions", http::verb::post},
       {"/v1/chat/completions", "chat_completions", http::verb::post},
       {"/v1/embeddings", "embeddings", http::verb::post},
       {"/metrics", "metrics", http::verb::get},
       {"/v1/stats", "stats", http::verb::get},
       {"/healthz", "healthz", http::verb::get},
       {"/readyz", "readyz", http::verb::get},
       {"/dashboard", "dashboard", http::verb::get},
       {"/static/chart.js", "static", http::verb::get}}};
  // DNS rebinding: a server bound to loopback answers only requests addressed to loopback.
  if (loopback_bind_) {
    const auto host = req.find(http::field::host);
    if (host != req.end() &&
        !is_loopback_host(std::string_view(host->value().data(), host->value().size()))) {
      return c->respond_error(400, "bad_request",
                              "the Host header must name a loopback address on this server", {}, "",
                              "invalid_host");
    }
  }
  const Route* route = nullptr;
  for (const auto& r : routes) {
    if (r.path == target) route = &r;
  }
  // The message does not echo the path: a reflected string is the start of many attacks.
  if (!route)
    return c->respond_error(404, "not_found", "no such route; see docs/serving.md for the routes");
  c->context().route = std::string(route->label);
  const bool api = target.starts_with("/v1/");
  if (api && !authorize(c, req)) {
    return c->respond_error(401, "unauthorized",
                            "a valid API key is required: Authorization: Bearer <key>",
                            {{"WWW-Authenticate", "Bearer"}}, "", "invalid_api_key");
  }
  const bool head_ok = req.method() == http::verb::head && route->method == http::verb::get;
  if (req.method() != route->method && !head_ok) {
    return c->respond_error(405, "method_not_allowed",
                            "use " + std::string(http::to_string(route->method)),
                            {{"Allow", std::string(http::to_string(route->method)) +
                                           (route->method == http::verb::get ? ", HEAD" : "")}});
  }
  if (route->method == http::verb::post) {
    // A cross-site form or fetch without a preflight can send text/plain, never
    // application/json: requiring it keeps web pages from forging requests.
    const auto ct = req.find(http::field::content_type);
    const std::string_view type = ct == req.end()
                                      ? std::string_view()
                                      : std::string_view(ct->value().data(), ct->value().size());
    const std::string_view media = type.substr(0, type.find(';'));
    if (!iequal(media.substr(0, media.find_last_not_of(" \t") + 1), "application/json")) {
      return c->respond_error(415, "unsupported_media_type",
                              "POST bodies must be Content-Type: application/json", {}, "",
                              "unsupported_media_type");
    }
  }
  if (route->label == "classify") return classify(c, req);
  if (route->label == "generate") return generate(c, req);
  if (route->label == "models") return models(c);
  if (route->label == "completions") return completions(c, req, false);
  if (route->label == "chat_completions") return completions(c, req, true);
  if (route->label == "embeddings") return embeddings(c, req);
  if (route->label == "metrics")
    return c->respond(200, registry_.prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  if (route->label == "stats") return c->respond(200, stats_json());
  if (route->label == "healthz") return c->respond(200, R"({"status":"alive"})");
  if (route->label == "dashboard")
    return c->respond(200, dashboard_html, "text/html; charset=utf-8");
  if (route->label == "static") {
    // Read per request (about 200 kB, from the page cache): the package may be installed
    // or upgraded while the server runs.
    std::ifstream in(TAILBATCH_SERVE_CHART_JS, std::ios::binary);
    if (!in)
      return c->respond_error(404, "not_found",
                              "Chart.js not found at " TAILBATCH_SERVE_CHART_JS
                              "; install libjs-chart.js");
    std::string js((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return c->respond(200, std::move(js), "text/javascript; charset=utf-8",
                      {{"Cache-Control", "max-age=3600"}});
  }
  if (ready()) return c->respond(200, R"({"status":"ready"})");
  return c->respond(503, draining() ? R"({"status":"draining"})" : R"({"status":"warming_up"})");
}

// A classic route's body, decoded by decode (decode_classify or decode_generate); else
// nullopt, the request answered 400 with what is wrong.
template <class Decode>
auto decode_or_400(Connection& c, Decode decode, std::string_view body,
                   const DecodeLimits& limits) {
  std::string error;
  auto decoded = decode(body, limits, error);
  if (!decoded) c.respond_error(400, "bad_request", error);
  return decoded;
}

void Server::classify(const std::shared_ptr<Connection>& c,
                      const http::request<http::string_body>& req) {
  auto decoded = decode_or_400(*c, tailbatch_serve::decode_classify, req.body(), limits_);
  if (!decoded) return;
  const auto deadline = deadline_of(c, req, true);
  if (!deadline) return;
  auto job = std::make_shared<Connection::ClassifyJob>();
  const std::size_t n = decoded->texts.size();
  job->conn = c;
  job->batch_form = decoded->batch_form;
  job->outcomes.resize(n);
  job->remaining.store(n, std::memory_order_relaxed);
  c->set_classify_job(job);
  c->work_started();
  tb::SubmitOptions so;
  so.deadline = *deadline;
  so.arrival = c->context().arrival;  // queue wait and latency count from the headers' arrival
  so.cancel = job->cancel.get_token();
  so.tenant = tenant_of(c, req);
  for (std::size_t i = 0; i < n; ++i) {
    pipeline_->submit(std::move(decoded->texts[i]), so, [job, i](tb::Outcome<ref::Prediction>&& o) {
      job->outcomes[i].emplace(std::move(o));
      if (job->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        auto conn = job->conn;
        asio::post(conn->executor(), [conn] { conn->finish_classify(); });
      }
    });
  }
}

SteadyTime Server::completion_deadline_of(const http::request<http::string_body>& req,
                                          SteadyTime arrival) const {
  const auto h = req.find(beast::string_view(tailbatch_serve::timeout_header.data(),
                                             tailbatch_serve::timeout_header.size()));
  if (h == req.end()) return SteadyTime::max();
  std::string error;
  const auto t = tailbatch_serve::decode_timeout(
      std::string_view(h->value().data(), h->value().size()), limits_, error);
  if (!t || t->count() == 0)
    return SteadyTime::max();  // malformed: already answered 400; 0: no budget
  return arrival + *t;
}

namespace {
// The batcher's callbacks for one generation: tokens and the end are appended to the job
// under its lock (on the decode thread) and one flush at a time is posted to the strand.
void post_flush(const std::shared_ptr<Connection::GenerateJob>& j) {
  if (j->posted) return;
  j->posted = true;
  auto conn = j->conn;
  asio::post(conn->executor(), [conn, j] { conn->flush_generate(j); });
}

// Submits a generation whose job and callbacks are ready (/v1/generate and the OpenAI
// completions alike), and hands its stream to the connection.
void submit_generate(Batcher& batcher, const std::shared_ptr<Connection>& c,
                     const std::shared_ptr<Connection::GenerateJob>& job, Batcher::Request r,
                     const tb::SubmitOptions& so, tb::StreamCallbacks<std::int32_t> cb) {
  c->work_started();
  // Registered before submit: a rejection ends the stream inside submit.
  c->set_generate(job, nullptr);
  // An empty prompt is the start token (the same computation), which the KV cache can hold.
  if (r.prompt.empty()) r.prompt.push_back(ref::TextVocabulary::period);
  auto stream = batcher.submit(std::move(r), so, std::move(cb));
  c->set_generate(job, std::move(stream));
}
}  // namespace

void Server::generate(const std::shared_ptr<Connection>& c,
                      const http::request<http::string_body>& req) {
  auto decoded = decode_or_400(*c, tailbatch_serve::decode_generate, req.body(), limits_);
  if (!decoded) return;
  const auto deadline = deadline_of(c, req);
  if (!deadline) return;
  Batcher::Request r;
  vocab_.encode(decoded->prompt, r.prompt);
  if (r.prompt.size() > opt_.gen_max_prompt_tokens) {
    return c->respond_error(400, "bad_request",
                            "the prompt has " + std::to_string(r.prompt.size()) +
                                " tokens; at most " + std::to_string(opt_.gen_max_prompt_tokens) +
                                " (--gen-max-prompt-tokens)",
                            {}, "prompt", "context_length_exceeded");
  }
  r.max_new_tokens = decoded->max_tokens;
  r.state = text_generator_.new_state({}, next_seed_.fetch_add(1, std::memory_order_relaxed));
  r.completion_deadline = completion_deadline_of(req, c->context().arrival);
  tb::SubmitOptions so;
  so.deadline = *deadline;
  so.arrival = c->context().arrival;  // queue wait counts from the headers' arrival
  so.tenant = tenant_of(c, req);
  auto job = std::make_shared<Connection::GenerateJob>();
  job->conn = c;
  job->stream = decoded->stream;
  tb::StreamCallbacks<std::int32_t> cb;
  cb.on_tokens = [job, ttft = ttft_,
                  arrival = c->context().arrival](std::span<const std::int32_t> t) {
    std::lock_guard lock(job->mu);
    if (!job->any_tokens) ttft->record(std::chrono::steady_clock::now() - arrival);
    job->any_tokens = true;
    if (job->stream) {
      job->encoder.append_tokens(job->outbox, t);
    } else {
      job->tokens.insert(job->tokens.end(), t.begin(), t.end());
    }
    post_flush(job);
  };
  cb.on_end = [job](const tb::StreamEnd& e) {
    std::lock_guard lock(job->mu);
    job->end = e;
    if (job->stream && (job->any_tokens || e.ok())) job->encoder.append_end(job->outbox, e);
    post_flush(job);
  };
  submit_generate(*batcher_, c, job, std::move(r), so, std::move(cb));
}

std::string Server::stats_json() {
  const auto now = std::chrono::steady_clock::now();
  const tb::PipelineStats ps = pipeline_->stats();
  const auto cs = batcher_->stats();
  auto pct = [](const tb::HistogramSnapshot& s) {
    auto ms = [&](double p) {
      return s.count() ? static_cast<double>(s.percentile(p).count()) / 1e6 : 0.0;
    };
    return json{{"count", s.count()}, {"p50", ms(50)}, {"p95", ms(95)}, {"p99", ms(99)}};
  };
  json reasons = json::object(), responses = json::object();
  for (std::size_t i = 0; i < tb::dispatch_reason_count; ++i) {
    const auto r = static_cast<tb::DispatchReason>(i);
    reasons[std::string(tb::to_string(r))] = ps.count(r);
  }
  {
    std::lock_guard lock(counters_mu_);
    for (const auto& [key, counter] : responses_)
      responses[key.first][std::to_string(key.second)] = counter->value();
  }
  json sizes = json::object();
  for (std::size_t i = 0; i < batch_sizes_.size(); ++i) {
    const auto v = batch_sizes_[i].load(std::memory_order_relaxed);
    if (v) sizes[std::to_string(i + 1)] = v;
  }
  json decode_sizes = json::object();
  for (std::size_t i = 0; i < decode_batch_sizes_.size(); ++i) {
    const auto v = decode_batch_sizes_[i].load(std::memory_order_relaxed);
    if (v) decode_sizes[std::to_string(i + 1)] = v;
  }
  json by_status = json::object(), rejections = json::object();
  for (auto s : {tb::Status::ok, tb::Status::rejected, tb::Status::deadline_exceeded,
                 tb::Status::cancelled, tb::Status::failed}) {
    by_status[std::string(tb::to_string(s))] = ps.count(s);
  }
  for (auto r :
       {tb::RejectReason::queue_full, tb::RejectReason::overloaded, tb::RejectReason::shutting_down,
        tb::RejectReason::too_large, tb::RejectReason::quota_exceeded, tb::RejectReason::shed}) {
    rejections[std::string(tb::to_string(r))] = ps.count(r);
  }
  json j;
  j["ready"] = ready();
  j["draining"] = draining();
  j["uptime_s"] = std::chrono::duration<double>(now - started_).count();
  j["window_s"] = opt_.stats_window_s;
  j["slo_p95_ms"] = opt_.slo_p95_ms;
  j["classify"] = {{"latency_ms", pct(classify_latency_->snapshot())},
                   {"queue_depth", pipeline_->queued_approx()},
                   {"in_flight", pipeline_->in_flight_approx()},
                   {"batches", ps.batches()},
                   {"batched_requests", ps.batched_requests},
                   {"mean_batch", ps.batches() ? static_cast<double>(ps.batched_requests) /
                                                     static_cast<double>(ps.batches())
                                               : 0.0},
                   {"batch_sizes", sizes},
                   {"requests", by_status},
                   {"rejections", rejections},
                   {"requests_per_s", classify_rate_.per_second(now)},
                   {"max_batch", opt_.max_batch},
                   {"limit", opt_.limit_from_slo ? json("slo") : json(opt_.limit)},
                   {"default_deadline_ms",
                    std::chrono::duration<double, std::milli>(classify_default_budget()).count()},
                   {"limit_current", limiter_ ? limiter_->limit() : 0u},
                   {"dispatch_reasons", reasons}};
  j["generate"] = {{"latency_ms", pct(generate_latency_->snapshot())},
                   {"ttft_ms", pct(ttft_->snapshot())},
                   {"active", batcher_->active_approx()},
                   {"waiting", batcher_->waiting_approx()},
                   {"submitted", cs.submitted},
                   {"steps", cs.steps},
                   {"tokens", cs.tokens},
                   {"tokens_per_s", token_rate_.per_second(now)},
                   {"decode_batch_sizes", decode_sizes},
                   {"requests",
                    {{"ok", cs.count(tb::Status::ok)},
                     {"rejected", cs.count(tb::Status::rejected)},
                     {"deadline_exceeded", cs.count(tb::Status::deadline_exceeded)},
                     {"cancelled", cs.count(tb::Status::cancelled)},
                     {"failed", cs.count(tb::Status::failed)}}}};
  j["http"] = {{"in_flight", in_flight_.load()},
               {"connections", connections_.load()},
               {"client_disconnects", disconnects_->value()},
               {"responses", responses}};
  return dump(j);
}

}  // namespace tailbatch_serve
