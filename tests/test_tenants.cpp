// Tenants: the vocabulary (Scheduling, TenantQuota, TenantsConfig, TenantNames), the
// validation both front doors run, and fair scheduling and quotas in the Pipeline and the
// ContinuousBatcher on the manual clock.
#include <array>
#include <string>
#include <tailbatch/tenants.hpp>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using tailbatch::Scheduling;
using tailbatch::TenantId;
using tailbatch::TenantNames;
using tailbatch::TenantQuota;
using tailbatch::TenantsConfig;

TEST_CASE("Scheduling names round-trip", "[tenants]") {
  STATIC_REQUIRE(tailbatch::to_string(Scheduling::fair) == "fair");
  REQUIRE(tailbatch::to_string(Scheduling::fifo) == "fifo");
  REQUIRE(tailbatch::parse_scheduling("fair") == Scheduling::fair);
  REQUIRE(tailbatch::parse_scheduling("fifo") == Scheduling::fifo);
  REQUIRE_FALSE(tailbatch::parse_scheduling("FAIR").has_value());
  REQUIRE_FALSE(tailbatch::parse_scheduling("").has_value());
}

TEST_CASE("TenantsConfig: quota lookup falls back to the defaults", "[tenants]") {
  TenantsConfig c;
  REQUIRE_FALSE(c.enabled());
  c.defaults.max_queued = 4;
  c.tenants.push_back({7, TenantQuota{3.0, 0, 10}});
  REQUIRE(c.quota(7).weight == 3.0);
  REQUIRE(c.quota(7).max_in_flight == 10);
  REQUIRE(c.quota(0).max_queued == 4);
  REQUIRE(c.quota(8).weight == 1.0);
  REQUIRE(c.has_limits());
  REQUIRE(c.enabled());
}

TEST_CASE("TenantsConfig validation names the field", "[tenants]") {
  using tailbatch::detail::validate_tenants;
  TenantsConfig c;
  REQUIRE_NOTHROW(validate_tenants(c, "Pipeline"));
  c.defaults.weight = 0.0;
  REQUIRE_THROWS_WITH(validate_tenants(c, "Pipeline"),
                      "Pipeline: tenants.defaults.weight must be finite and > 0");
  c.defaults.weight = 1.0;
  c.tenants.push_back({1, TenantQuota{-1.0, 0, 0}});
  REQUIRE_THROWS_WITH(validate_tenants(c, "X"),
                      "X: tenants.tenants[0].weight must be finite and > 0");
  c.tenants[0].second.weight = 1.0 / 0.0 * 0.0 + 1.0;  // NaN
  REQUIRE_THROWS(validate_tenants(c, "X"));
  c.tenants[0].second = TenantQuota{1.0, 5, 2};
  REQUIRE_THROWS_WITH(validate_tenants(c, "X"),
                      "X: tenants.tenants[0].max_queued must be <= max_in_flight (0: no limit)");
  c.tenants[0].second = TenantQuota{};
  c.tenants.push_back({1, TenantQuota{}});
  REQUIRE_THROWS_WITH(validate_tenants(c, "X"), "X: tenants.tenants lists tenant 1 twice");
}

TEST_CASE("TenantNames interns names under a bound", "[tenants]") {
  TenantNames names(2);
  REQUIRE(names.id("") == 0);
  const TenantId a = names.id("alice");
  const TenantId b = names.id("bob");
  REQUIRE(a == 1);
  REQUIRE(b == 2);
  REQUIRE(names.id("alice") == a);
  REQUIRE(names.id("carol") == names.other_id());
  REQUIRE(names.id("dave") == names.other_id());
  REQUIRE(names.other_id() != a);
  REQUIRE(names.other_id() != b);
  REQUIRE(names.size() == 2);
  REQUIRE(names.name(a) == "alice");
  REQUIRE(names.name(names.other_id()) == "other");
  REQUIRE(names.name(0).empty());
  REQUIRE(names.find("bob") == b);
  REQUIRE_FALSE(names.find("carol").has_value());
  REQUIRE_THROWS(TenantNames(0));
}

TEST_CASE("TenantNames is thread-safe: every thread sees one id per name", "[tenants]") {
  TenantNames names(64);
  std::vector<std::vector<TenantId>> seen(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) seen[t].push_back(names.id("tenant-" + std::to_string(i % 80)));
    });
  }
  for (auto& th : threads) th.join();
  for (std::size_t t = 1; t < seen.size(); ++t) REQUIRE(seen[t] == seen[0]);
  REQUIRE(names.size() == 64);
}

// ---- Fair scheduling and quotas in the Pipeline, stepped by hand on the manual clock ----

#include <algorithm>
#include <map>
#include <tailbatch/pipeline.hpp>

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

// A request: its tenant and id (and, for the cost-reading policy, its cost).
struct Req {
  TenantId tenant = 0;
  int id = 0;
  std::size_t cost = 1;
};

template <class Policy = FixedWindow>
using TenantPipeline = Pipeline<Req, int, Policy, HostLanes, AdmitAll, ManualClock>;

struct Served {
  std::vector<Req> order;
  std::map<int, std::vector<Status>> status;
  std::map<int, RejectReason> reason;
  auto model() {
    return [this](std::span<const Req> in, std::span<int> out, HostLane&) {
      for (std::size_t i = 0; i < in.size(); ++i) {
        order.push_back(in[i]);
        out[i] = in[i].id;
      }
    };
  }
  template <class P>
  void submit(P& p, TenantId t, int id, std::size_t cost = 1) {
    SubmitOptions o;
    o.tenant = t;
    p.submit(Req{t, id, cost}, std::move(o), [this, id](Outcome<int> out) {
      status[id].push_back(out.status());
      reason[id] = out.reason();
    });
  }
  [[nodiscard]] std::vector<TenantId> tenants() const {
    std::vector<TenantId> out;
    for (const Req& r : order) out.push_back(r.tenant);
    return out;
  }
};

PipelineConfig<Req> fair_config() {
  PipelineConfig<Req> c;
  c.tenants.scheduling = Scheduling::fair;
  return c;
}

}  // namespace

TEST_CASE("Pipeline fair scheduling: tenants alternate where FIFO serves the first flood first",
          "[tenants][pipeline]") {
  for (const Scheduling scheduling : {Scheduling::fifo, Scheduling::fair}) {
    ManualClock clock;
    Served s;
    auto c = fair_config();
    c.tenants.scheduling = scheduling;
    TenantPipeline<> p(s.model(), FixedWindow{1, 1ms}, c, clock);
    for (int i = 0; i < 6; ++i) s.submit(p, 1, i);
    for (int i = 0; i < 3; ++i) s.submit(p, 2, 100 + i);
    (void)p.poll();
    if (scheduling == Scheduling::fifo) {
      CHECK(s.tenants() == std::vector<TenantId>{1, 1, 1, 1, 1, 1, 2, 2, 2});
    } else {
      CHECK(s.tenants() == std::vector<TenantId>{1, 2, 1, 2, 1, 2, 1, 1, 1});
      // Within a tenant: arrival order.
      std::vector<int> ones;
      for (const Req& r : s.order) {
        if (r.tenant == 1) ones.push_back(r.id);
      }
      CHECK(ones == std::vector<int>{0, 1, 2, 3, 4, 5});
    }
  }
}

TEST_CASE("Pipeline fair scheduling: weights share the server in proportion",
          "[tenants][pipeline]") {
  ManualClock clock;
  Served s;
  auto c = fair_config();
  c.tenants.tenants.push_back({1, TenantQuota{2.0, 0, 0}});
  TenantPipeline<> p(s.model(), FixedWindow{3, 1ms}, c, clock);
  for (int i = 0; i < 30; ++i) s.submit(p, 1, i);
  for (int i = 0; i < 30; ++i) s.submit(p, 2, 100 + i);
  (void)p.poll(5);  // 15 requests
  REQUIRE(s.order.size() == 15);
  const std::vector<TenantId> order = s.tenants();
  const auto a = std::count(order.begin(), order.end(), TenantId{1});
  CHECK(a == 10);
}

TEST_CASE("Pipeline fair scheduling: an idle tenant banks no credit", "[tenants][pipeline]") {
  ManualClock clock;
  Served s;
  TenantPipeline<> p(s.model(), FixedWindow{1, 1ms}, fair_config(), clock);
  for (int i = 0; i < 20; ++i) s.submit(p, 1, i);
  (void)p.poll(10);  // tenant 1 alone: served 10
  for (int i = 0; i < 10; ++i) s.submit(p, 2, 100 + i);
  (void)p.poll(10);
  // Tenant 2 joins at tenant 1's counter, not at 0: they alternate rather than tenant 2
  // taking the next 10.
  const std::vector<TenantId> order = s.tenants();
  const std::vector<TenantId> next(order.begin() + 10, order.end());
  CHECK(next == std::vector<TenantId>{1, 2, 1, 2, 1, 2, 1, 2, 1, 2});
}

TEST_CASE("Pipeline fair scheduling: priority classes come before fairness",
          "[tenants][pipeline]") {
  ManualClock clock;
  Served s;
  TenantPipeline<> p(s.model(), FixedWindow{1, 1ms}, fair_config(), clock);
  for (int i = 0; i < 3; ++i) s.submit(p, 1, i);
  SubmitOptions high;
  high.tenant = 1;
  high.priority = Priority::high;
  p.submit(Req{1, 50, 1}, high, [](Outcome<int>) {});
  s.submit(p, 2, 100);
  (void)p.poll();
  REQUIRE(s.order.size() == 5);
  CHECK(s.order[0].id == 50);
  // The high-priority request counts towards tenant 1's share: tenant 2 is next.
  CHECK(s.tenants() == std::vector<TenantId>{1, 2, 1, 1, 1});
}

TEST_CASE(
    "Pipeline fair scheduling: backlogged tenants' served cost / weight differ by at most max cost "
    "/ weight",
    "[tenants][pipeline]") {
  ManualClock clock;
  Served s;
  PipelineConfig<Req> c = fair_config();
  c.request_cost = [](const Req& r) { return r.cost; };
  c.tenants.tenants.push_back({2, TenantQuota{2.0, 0, 0}});
  TenantPipeline<TokenBudget> p(
      s.model(),
      TokenBudget({.budget = 64, .max_batch = 4, .max_wait = 1ms, .bucket_bounds = {1000}}), c,
      clock);
  // Three tenants, always backlogged, with costs from 1 to 8.
  int id = 0;
  for (int i = 0; i < 200; ++i) {
    for (TenantId t = 1; t <= 3; ++t)
      s.submit(p, t, ++id, 1 + static_cast<std::size_t>((i * 7 + t * 3) % 8));
  }
  std::map<TenantId, double> weight{{1, 1.0}, {2, 2.0}, {3, 1.0}};
  std::map<TenantId, double> served;
  double worst = 0.0;
  std::size_t seen = 0;
  for (int b = 0; b < 60; ++b) {
    (void)p.poll(1);
    for (; seen < s.order.size(); ++seen) {
      served[s.order[seen].tenant] +=
          static_cast<double>(s.order[seen].cost) / weight[s.order[seen].tenant];
    }
    for (TenantId x = 1; x <= 3; ++x) {
      for (TenantId y = 1; y <= 3; ++y) worst = std::max(worst, served[x] - served[y]);
    }
  }
  REQUIRE(seen > 100);
  const double bound = 8.0 / 1.0;  // the largest cost over the smallest weight
  CHECK(worst <= bound);
  CHECK(worst > 0.0);
}

TEST_CASE("Pipeline quotas: max_queued and max_in_flight reject with quota_exceeded",
          "[tenants][pipeline]") {
  ManualClock clock;
  Served s;
  PipelineConfig<Req> c;
  c.tenants.tenants.push_back({1, TenantQuota{1.0, 2, 0}});
  c.tenants.tenants.push_back({2, TenantQuota{1.0, 0, 3}});
  TenantPipeline<> p(s.model(), FixedWindow{1, 1ms}, c, clock);
  for (int i = 0; i < 3; ++i) s.submit(p, 1, i);
  for (int i = 0; i < 4; ++i) s.submit(p, 2, 100 + i);
  s.submit(p, 3, 200);  // the default tenant quota: no limit
  REQUIRE(s.status[2].size() == 1);
  CHECK(s.status[2][0] == Status::rejected);
  CHECK(s.reason[2] == RejectReason::quota_exceeded);
  CHECK(s.reason[103] == RejectReason::quota_exceeded);
  CHECK(s.status.count(200) == 0);
  (void)p.poll();
  // Served and completed: the places are free again.
  s.submit(p, 1, 10);
  s.submit(p, 2, 110);
  (void)p.poll();
  CHECK(s.status[10][0] == Status::ok);
  CHECK(s.status[110][0] == Status::ok);
  CHECK(p.stats().count(RejectReason::quota_exceeded) == 2);
  for (const auto& [id, st] : s.status) CHECK(st.size() == 1);
}

TEST_CASE("Pipeline fair + shed-oldest: the heavy tenant's requests are shed, not the light ones'",
          "[tenants][pipeline]") {
  ManualClock clock;
  Served s;
  PipelineConfig<Req> c = fair_config();
  c.queue_capacity = 4;
  c.queue.policy = QueuePolicy::shed_oldest;
  TenantPipeline<> p(s.model(), FixedWindow{1, 1ms}, c, clock);
  for (int i = 0; i < 6; ++i) s.submit(p, 1, i);
  s.submit(p, 2, 100);
  s.submit(p, 3, 200);
  (void)p.poll();
  for (int i = 0; i < 4; ++i) CHECK(s.reason[i] == RejectReason::shed);  // tenant 1's oldest
  CHECK(s.status[100][0] == Status::ok);
  CHECK(s.status[200][0] == Status::ok);
  for (const auto& [id, st] : s.status) CHECK(st.size() == 1);
}

// ---- Fair scheduling and quotas in the ContinuousBatcher ---------------------------------

#include <tailbatch/continuous_batcher.hpp>

namespace {

using CBatcher = ContinuousBatcher<int, NoSequenceState, ManualClock>;

ContinuousBatcherConfig cb_config(Scheduling scheduling) {
  ContinuousBatcherConfig c;
  c.max_active = 1;
  c.tenants.scheduling = scheduling;
  return c;
}

CBatcher::Request cb_request(std::size_t prompt, std::size_t max_new) {
  CBatcher::Request r;
  r.prompt.assign(prompt, 1);
  r.max_new_tokens = max_new;
  return r;
}

// Submits (tenant, prompt, max_new) and returns the tenants in the order they were first stepped.
std::vector<TenantId> cb_order(Scheduling scheduling,
                               const std::vector<std::array<std::size_t, 3>>& reqs,
                               double output_cost = 2.0) {
  ManualClock clock;
  std::vector<TenantId> order;
  std::vector<std::uint64_t> seen;
  auto c = cb_config(scheduling);
  c.output_token_cost = output_cost;
  CBatcher b(
      [&](std::span<CBatcher::Sequence> batch) {
        for (auto& s : batch) {
          if (std::find(seen.begin(), seen.end(), s.id()) == seen.end()) {
            seen.push_back(s.id());
            order.push_back(s.tenant());
          }
          if (s.emits()) s.emit(1);
        }
      },
      c, clock);
  std::vector<std::shared_ptr<CBatcher::Stream>> streams;
  for (const auto& [t, prompt, out] : reqs) {
    SubmitOptions o;
    o.tenant = static_cast<TenantId>(t);
    streams.push_back(b.submit(cb_request(prompt, out), o));
  }
  while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
  for (auto& s : streams) CHECK(s->end()->ok());
  return order;
}

}  // namespace

TEST_CASE("ContinuousBatcher fair scheduling: tenants alternate; FIFO serves the flood first",
          "[tenants][continuous]") {
  const std::vector<std::array<std::size_t, 3>> reqs{{1, 2, 2}, {1, 2, 2}, {1, 2, 2},
                                                     {1, 2, 2}, {2, 2, 2}, {2, 2, 2}};
  CHECK(cb_order(Scheduling::fifo, reqs) == std::vector<TenantId>{1, 1, 1, 1, 2, 2});
  CHECK(cb_order(Scheduling::fair, reqs) == std::vector<TenantId>{1, 2, 1, 2, 1, 1});
}

TEST_CASE("ContinuousBatcher fair scheduling: cost is prompt + factor x output tokens",
          "[tenants][continuous]") {
  // Tenant 1's sequences cost 1 + 2 x 8 = 17; tenant 2's 16 + 2 x 1 = 18. With the
  // factor 0, tenant 1's cost 1 against 16: tenant 1 is served many times per tenant 2.
  const std::vector<std::array<std::size_t, 3>> reqs{{1, 1, 8},  {1, 1, 8},  {1, 1, 8}, {1, 1, 8},
                                                     {2, 16, 1}, {2, 16, 1}, {2, 16, 1}};
  CHECK(cb_order(Scheduling::fair, reqs) == std::vector<TenantId>{1, 2, 1, 2, 1, 2, 1});
  CHECK(cb_order(Scheduling::fair, reqs, 0.0) == std::vector<TenantId>{1, 2, 1, 1, 1, 2, 2});
}

TEST_CASE("ContinuousBatcher quotas: max_queued and max_in_flight reject with quota_exceeded",
          "[tenants][continuous]") {
  ManualClock clock;
  ContinuousBatcherConfig c = cb_config(Scheduling::fifo);
  c.tenants.tenants.push_back({1, TenantQuota{1.0, 1, 0}});
  c.tenants.tenants.push_back({2, TenantQuota{1.0, 0, 2}});
  CBatcher b(
      [](std::span<CBatcher::Sequence> batch) {
        for (auto& s : batch)
          if (s.emits()) s.emit(1);
      },
      c, clock);
  SubmitOptions one, two;
  one.tenant = 1;
  two.tenant = 2;
  auto a1 = b.submit(cb_request(1, 1), one);
  auto a2 = b.submit(cb_request(1, 1), one);
  auto b1 = b.submit(cb_request(1, 1), two);
  auto b2 = b.submit(cb_request(1, 1), two);
  auto b3 = b.submit(cb_request(1, 1), two);
  REQUIRE(a2->end().has_value());
  CHECK(a2->end()->reason == RejectReason::quota_exceeded);
  REQUIRE(b3->end().has_value());
  CHECK(b3->end()->reason == RejectReason::quota_exceeded);
  while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
  CHECK(a1->end()->ok());
  CHECK(b2->end()->ok());
  auto a3 = b.submit(cb_request(1, 1), one);  // places free again
  while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
  CHECK(a3->end()->ok());
  CHECK(b.stats().count(RejectReason::quota_exceeded) == 2);
}

TEST_CASE("Per-tenant metrics: the busiest tenants get their own series, the rest `other`",
          "[tenants][metrics]") {
  ManualClock clock;
  Served s;
  MetricsRegistry registry;
  PipelineConfig<Req> c = fair_config();
  c.metrics = &registry;
  c.tenants.metric_tenants = 2;
  c.tenants.tenant_name = [](TenantId t) { return "t" + std::to_string(t); };
  c.tenants.tenants.push_back({9, TenantQuota{1.0, 1, 0}});
  TenantPipeline<> p(s.model(), FixedWindow{4, 1ms}, c, clock);
  int id = 0;
  for (int i = 0; i < 10; ++i) s.submit(p, 1, ++id);
  for (int i = 0; i < 5; ++i) s.submit(p, 2, ++id);
  (void)p.poll();
  for (int i = 0; i < 3; ++i) s.submit(p, 3, ++id);  // a third tenant: `other`
  s.submit(p, 9, ++id);
  s.submit(p, 9, ++id);  // over its quota: rejected, counted under `other`
  clock.advance(1ms);
  (void)p.poll();
  const std::string text = registry.prometheus();
  CHECK(text.find("tailbatch_pipeline_tenant_requests_total{status=\"ok\",tenant=\"t1\"} 10") !=
        std::string::npos);
  CHECK(text.find("tailbatch_pipeline_tenant_requests_total{status=\"ok\",tenant=\"t2\"} 5") !=
        std::string::npos);
  CHECK(text.find("tailbatch_pipeline_tenant_requests_total{status=\"ok\",tenant=\"other\"} 4") !=
        std::string::npos);
  CHECK(text.find(
            "tailbatch_pipeline_tenant_requests_total{status=\"rejected\",tenant=\"other\"} 1") !=
        std::string::npos);
  CHECK(text.find("tenant=\"t3\"") == std::string::npos);
  CHECK(text.find("tailbatch_pipeline_tenant_latency_seconds_count{tenant=\"t1\"} 10") !=
        std::string::npos);
}

TEST_CASE("ContinuousBatcher per-tenant metrics: top tenants by traffic plus `other`",
          "[tenants][metrics][continuous]") {
  ManualClock clock;
  MetricsRegistry registry;
  ContinuousBatcherConfig c = cb_config(Scheduling::fair);
  c.max_active = 4;
  c.metrics = &registry;
  c.tenants.metric_tenants = 2;
  c.tenants.tenant_name = [](TenantId t) { return "t" + std::to_string(t); };
  c.tenants.tenants.push_back({9, TenantQuota{1.0, 1, 0}});
  CBatcher b(
      [&](std::span<CBatcher::Sequence> batch) {
        clock.advance(1ms);
        for (auto& s : batch)
          if (s.emits()) s.emit(1);
      },
      c, clock);
  std::vector<std::shared_ptr<CBatcher::Stream>> streams;
  auto submit = [&](TenantId t) {
    SubmitOptions o;
    o.tenant = t;
    streams.push_back(b.submit(cb_request(1, 2), o));
  };
  for (int i = 0; i < 6; ++i) submit(1);
  for (int i = 0; i < 3; ++i) submit(2);
  while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
  for (int i = 0; i < 2; ++i) submit(3);  // a third tenant: `other`
  submit(9);
  submit(9);  // over its quota: rejected at submit, counted under `other`
  while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
  const std::string text = registry.prometheus();
  CHECK(text.find("tailbatch_generation_tenant_sequences_total{status=\"ok\",tenant=\"t1\"} 6") !=
        std::string::npos);
  CHECK(text.find("tailbatch_generation_tenant_sequences_total{status=\"ok\",tenant=\"t2\"} 3") !=
        std::string::npos);
  CHECK(
      text.find("tailbatch_generation_tenant_sequences_total{status=\"ok\",tenant=\"other\"} 3") !=
      std::string::npos);
  CHECK(text.find("tailbatch_generation_tenant_sequences_total{status=\"rejected\",tenant="
                  "\"other\"} 1") != std::string::npos);
  CHECK(text.find("tenant=\"t3\"") == std::string::npos);
  CHECK(text.find("tenant=\"t9\"") == std::string::npos);
  CHECK(text.find("tailbatch_generation_tenant_latency_seconds_count{tenant=\"t1\"} 6") !=
        std::string::npos);
  // Every sequence ended once, and the per-tenant series add up to the batcher's own.
  CHECK(text.find("tailbatch_generation_sequences_total{status=\"ok\"} 12") != std::string::npos);
}

TEST_CASE("ContinuousBatcher without tenants enabled exports no per-tenant series",
          "[tenants][metrics][continuous]") {
  ManualClock clock;
  MetricsRegistry registry;
  ContinuousBatcherConfig c = cb_config(Scheduling::fifo);
  c.metrics = &registry;
  CBatcher b(
      [](std::span<CBatcher::Sequence> batch) {
        for (auto& s : batch)
          if (s.emits()) s.emit(1);
      },
      c, clock);
  auto s = b.submit(cb_request(1, 1));
  while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
  CHECK(s->end()->ok());
  CHECK(registry.prometheus().find("tailbatch_generation_tenant_") == std::string::npos);
}
