// Tenants: the vocabulary (Scheduling, TenantQuota, TenantsConfig, TenantNames), the
// validation both front doors run, and fair scheduling and quotas in the Pipeline and the
// ContinuousBatcher on the manual clock.
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
