// Per-tenant quotas (TenantQuota::max_queued, max_in_flight): how many of a tenant's
// requests wait and are in flight, and the refusal when a new one would exceed either.
//
// Shared by the Pipeline (submitters acquire, its leader and completions release) and the
// ContinuousBatcher. Thread-safe: one mutex around a small map; taken once per submit and
// once per request leaving the queue or completing, and only when some quota is set
// (TenantsConfig::has_limits()).
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <tailbatch/detail/service_rate.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/tenants.hpp>
#include <unordered_map>
#include <utility>

namespace tailbatch::detail {

class TenantQuotas {
 public:
  explicit TenantQuotas(const TenantsConfig& config)
      : config_(&config), enabled_(config.has_limits()) {}

  [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  // Counts one request of tenant t as queued and in flight, or refuses (false) when that
  // would pass its max_queued or max_in_flight; `queued` then holds its queued count (for
  // the retry hint). May throw std::bad_alloc (a tenant never seen).
  bool try_acquire(TenantId t, std::size_t& queued) {
    std::lock_guard lock(mu_);
    Counts& c = counts_[t];
    const TenantQuota& q = config_->quota(t);
    queued = c.queued;
    if ((q.max_queued != 0 && c.queued >= q.max_queued) ||
        (q.max_in_flight != 0 && c.in_flight >= q.max_in_flight)) {
      if (c.queued == 0 && c.in_flight == 0) counts_.erase(t);
      return false;
    }
    ++c.queued;
    ++c.in_flight;
    return true;
  }

  // try_acquire for a submit: nullopt when the request took its place, else the error to
  // complete it with (rejected/quota_exceeded, with the time drain_rate, in requests per
  // second, needs for the tenant's queued requests; or failed, out of memory). Never throws.
  [[nodiscard]] std::optional<Error> refusal(TenantId t, double drain_rate) noexcept {
    std::size_t queued = 0;
    bool ok = false;
    if (call_guarded([&] { ok = try_acquire(t, queued); }, [](const char*) {})) {
      return Error{Status::failed, RejectReason::none, "tailbatch: out of memory", {}};
    }
    if (ok) return std::nullopt;
    return Error{Status::rejected, RejectReason::quota_exceeded,
                 "tailbatch: the tenant's quota is exceeded",
                 ServiceRate::retry_after(drain_rate, queued + 1)};
  }

  // One of tenant t's requests left the queue (into a batch or the active set, or dropped:
  // then done() follows). Never throws.
  void dequeued(TenantId t) noexcept {
    std::lock_guard lock(mu_);
    auto it = counts_.find(t);
    if (it != counts_.end() && it->second.queued > 0) --it->second.queued;
  }

  // One of tenant t's requests completed (any status). Never throws.
  void done(TenantId t) noexcept {
    std::lock_guard lock(mu_);
    auto it = counts_.find(t);
    if (it == counts_.end()) return;
    if (it->second.in_flight > 0) --it->second.in_flight;
    if (it->second.in_flight == 0 && it->second.queued == 0) counts_.erase(it);
  }

  // Both at once: a request refused after acquire() (never queued). Never throws.
  void release(TenantId t) noexcept {
    dequeued(t);
    done(t);
  }

  // Tenant t's (queued, in flight) now. For tests and stats.
  [[nodiscard]] std::pair<std::size_t, std::size_t> counts(TenantId t) const {
    std::lock_guard lock(mu_);
    auto it = counts_.find(t);
    return it == counts_.end()
               ? std::pair<std::size_t, std::size_t>{0, 0}
               : std::pair<std::size_t, std::size_t>{it->second.queued, it->second.in_flight};
  }

 private:
  struct Counts {
    std::size_t queued = 0;
    std::size_t in_flight = 0;
  };
  const TenantsConfig* config_;
  bool enabled_;
  mutable std::mutex mu_;
  std::unordered_map<TenantId, Counts> counts_;
};

}  // namespace tailbatch::detail
