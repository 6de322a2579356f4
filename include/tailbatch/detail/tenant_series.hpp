// Per-tenant metric series with bounded cardinality, shared by the Pipeline
// (tailbatch_pipeline_tenant_*) and the ContinuousBatcher (tailbatch_generation_tenant_*).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/submit_options.hpp>
#include <unordered_map>
#include <utility>

namespace tailbatch::detail {

// Per-tenant series with bounded cardinality: `<prefix>_tenant_<noun>_total{tenant,
// status}` and `<prefix>_tenant_latency_seconds{tenant}` for at most `top` tenants plus
// `tenant="other"`. Every request is counted in a space-saving sketch of the busiest
// tenants (4 x top entries); a tenant without a series gets one when it ranks in the
// sketch's top `top` while fewer than `top` tenants have one; any other tenant is counted
// under `other`. Series are never taken away (counters stay monotonic), so the label
// values are at most top + 1 however many tenants come and go. Thread-safe: a mutex
// around the lookups; the series themselves are the registry's (atomic).
class TenantSeries {
 public:
  // prefix: "tailbatch_pipeline"; noun: what is counted ("requests", "sequences"). Registers
  // the `other` series (throws what the registry throws).
  TenantSeries(MetricsRegistry& r, Labels base, std::string prefix, std::string noun,
               std::size_t top, std::function<std::string(TenantId)> name)
      : registry_(&r),
        base_(std::move(base)),
        prefix_(std::move(prefix)),
        noun_(std::move(noun)),
        top_(top),
        name_(std::move(name)) {
    other_ = make("other");
  }

  // One request of tenant t completed with status s after latency (end to end). Never
  // throws (a series that cannot be allocated counts under `other`). Thread-safe.
  void record(TenantId t, Status s, std::chrono::nanoseconds latency) noexcept {
    Series* x = nullptr;
    detail::call_guarded([&] { x = lookup(t); }, [](const char*) {});
    if (x == nullptr) x = &other_;
    x->status[static_cast<std::size_t>(s)]->inc();
    x->latency->record(latency);
  }

 private:
  struct Series {
    std::array<Counter*, status_count> status{};
    LatencyHistogram* latency = nullptr;
  };

  Series make(const std::string& tenant) {
    Series x;
    Labels l = base_;
    l.emplace_back("tenant", tenant);
    for (std::size_t i = 0; i < status_count; ++i) {
      Labels ls = l;
      ls.emplace_back("status", std::string(to_string(static_cast<Status>(i))));
      std::string help = noun_ + " completed, by tenant and status";
      if (help[0] >= 'a' && help[0] <= 'z') help[0] = static_cast<char>(help[0] - 'a' + 'A');
      x.status[i] =
          &registry_->counter(prefix_ + "_tenant_" + noun_ + "_total", help, std::move(ls));
    }
    x.latency = &registry_->histogram(prefix_ + "_tenant_latency_seconds",
                                      "Time from submit until completion, by tenant", l);
    return x;
  }

  Series* lookup(TenantId t) {
    std::lock_guard lock(mu_);
    // The space-saving sketch: t's count, or the smallest entry replaced by t.
    auto it = sketch_.find(t);
    if (it != sketch_.end()) {
      ++it->second;
    } else if (sketch_.size() < 4 * top_) {
      it = sketch_.emplace(t, 1).first;
    } else {
      auto least =
          std::min_element(sketch_.begin(), sketch_.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
      const std::uint64_t c = least->second + 1;
      sketch_.erase(least);
      it = sketch_.emplace(t, c).first;
    }
    if (auto s = series_.find(t); s != series_.end()) return &s->second;
    if (series_.size() >= top_) return nullptr;
    // Its rank in the sketch.
    std::size_t above = 0;
    for (const auto& [id, c] : sketch_) above += c > it->second ? std::size_t{1} : std::size_t{0};
    if (above >= top_) return nullptr;
    const std::string label = name_ ? name_(t) : std::to_string(t);
    return &series_.emplace(t, make(label)).first->second;
  }

  MetricsRegistry* registry_;
  Labels base_;
  std::string prefix_;
  std::string noun_;
  std::size_t top_;
  std::function<std::string(TenantId)> name_;
  std::mutex mu_;
  std::unordered_map<TenantId, std::uint64_t> sketch_;
  std::unordered_map<TenantId, Series> series_;
  Series other_;
};

}  // namespace tailbatch::detail
