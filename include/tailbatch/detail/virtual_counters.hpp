// Virtual counters: the fair share between tenants that the Pipeline's batch former and the
// ContinuousBatcher's waiting queue both keep (the Virtual Token Counter of Sheng et al.,
// "Fairness in Serving Large Language Models", OSDI 2024).
//
// Each tenant has a counter of the service it received, in cost divided by its weight. The
// next request comes from the active tenant (one with requests queued) whose counter is
// smallest. A tenant that becomes active is lifted to the smallest counter among the
// active ones (or, with none active, to the counter of the last tenant that left), so
// that idle time banks no credit: a tenant cannot save up service while away and then
// monopolise the server. The bound this gives (docs/fairness.md): while two tenants stay
// backlogged, their counters differ by at most the largest single charge, max cost / weight.
//
// Counters are doubles that only grow; to keep them precise over a long run, every counter
// is rebased (the smallest active one subtracted from all) once they pass 2^40.
//
// Not thread-safe: its owner's lock (the Pipeline's leader, the batcher's mutex) guards it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tailbatch/tenants.hpp>
#include <unordered_map>

namespace tailbatch::detail {

class VirtualCounters {
 public:
  struct Tenant {
    double counter = 0.0;
    double weight = 1.0;
    std::size_t queued = 0;  // requests queued; > 0: active
  };

  explicit VirtualCounters(const TenantsConfig& config) : config_(&config) {}

  // The tenant's record, created (with its configured weight, inactive) on first use.
  // May allocate (std::bad_alloc).
  Tenant& at(TenantId t) {
    auto [it, fresh] = tenants_.try_emplace(t);
    if (fresh) it->second.weight = config_->quota(t).weight;
    return it->second;
  }
  [[nodiscard]] const Tenant* find(TenantId t) const noexcept {
    auto it = tenants_.find(t);
    return it == tenants_.end() ? nullptr : &it->second;
  }

  // n of tenant t's requests joined the queue. Lifts the tenant if it was idle. May
  // allocate (std::bad_alloc) for a tenant never seen.
  void joined(TenantId t, std::size_t n = 1) {
    if (tenants_.size() >= 2 * active_ + 256) prune();
    Tenant& x = at(t);
    if (x.queued == 0 && n > 0) {
      const double floor = active_ > 0 ? min_active() : last_left_;
      x.counter = std::max(x.counter, floor);
      ++active_;
    }
    x.queued += n;
  }

  // One of tenant t's requests left the queue (served or dropped). Never throws.
  void left(TenantId t) noexcept {
    auto it = tenants_.find(t);
    if (it == tenants_.end() || it->second.queued == 0) return;
    if (--it->second.queued == 0) {
      --active_;
      last_left_ = it->second.counter;
    }
  }

  // Charges tenant t for service of this cost: counter += cost / weight. Never throws.
  void charge(TenantId t, double cost) noexcept {
    auto it = tenants_.find(t);
    if (it == tenants_.end()) return;
    it->second.counter += cost / it->second.weight;
    if (it->second.counter > rebase_at) rebase();
  }

  // The counter tenant t would have after a charge of cost (without charging).
  [[nodiscard]] double counter(TenantId t) const noexcept {
    const Tenant* x = find(t);
    return x != nullptr ? x->counter : 0.0;
  }
  [[nodiscard]] double weight(TenantId t) const noexcept {
    const Tenant* x = find(t);
    return x != nullptr ? x->weight : config_->quota(t).weight;
  }
  [[nodiscard]] std::size_t queued(TenantId t) const noexcept {
    const Tenant* x = find(t);
    return x != nullptr ? x->queued : 0;
  }
  [[nodiscard]] std::size_t active() const noexcept { return active_; }

  // The smallest counter among active tenants (0 with none). Linear in the tenants seen.
  [[nodiscard]] double min_active() const noexcept {
    double m = std::numeric_limits<double>::infinity();
    for (const auto& [id, x] : tenants_) {
      if (x.queued > 0) m = std::min(m, x.counter);
    }
    return m == std::numeric_limits<double>::infinity() ? 0.0 : m;
  }

  // The active tenant that would be served last: the largest counter + queued / weight
  // (its backlog counted at one unit of cost per request). Used to choose what to shed.
  // nullopt-like: returns false when none is active.
  [[nodiscard]] bool heaviest(TenantId& out) const noexcept {
    bool any = false;
    double best = 0.0;
    for (const auto& [id, x] : tenants_) {
      if (x.queued == 0) continue;
      const double load = x.counter + static_cast<double>(x.queued) / x.weight;
      if (!any || load > best || (load == best && id < out)) {
        best = load;
        out = id;
        any = true;
      }
    }
    return any;
  }

 private:
  static constexpr double rebase_at = 1099511627776.0;  // 2^40

  // Forgets idle tenants whose counter is at or below the floor a returning tenant is
  // lifted to: they would come back exactly as a new tenant does. Keeps the map bounded by
  // the active tenants, however many distinct ids pass.
  void prune() noexcept {
    const double floor = active_ > 0 ? min_active() : last_left_;
    for (auto it = tenants_.begin(); it != tenants_.end();) {
      if (it->second.queued == 0 && it->second.counter <= floor) {
        it = tenants_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void rebase() noexcept {
    const double base = active_ > 0 ? min_active() : last_left_;
    for (auto& [id, x] : tenants_) x.counter = std::max(0.0, x.counter - base);
    last_left_ = std::max(0.0, last_left_ - base);
  }

  const TenantsConfig* config_;
  std::unordered_map<TenantId, Tenant> tenants_;
  std::size_t active_ = 0;
  double last_left_ = 0.0;
};

}  // namespace tailbatch::detail
