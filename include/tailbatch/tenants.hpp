// Tenants: sharing one server fairly between its clients.
//
// A request names its tenant in SubmitOptions::tenant (a TenantId; TenantNames interns a
// server's tenant names into ids under a bound). TenantsConfig says how the Pipeline and
// the ContinuousBatcher treat them:
//
//   Scheduling::fifo  (the default) tenants are ignored when choosing the next request.
//   Scheduling::fair  the next request comes from the backlogged tenant with the smallest
//                     virtual counter: each tenant's counter grows by the cost of what it
//                     was served divided by its weight, and a tenant that becomes active is
//                     lifted to the smallest counter among the active ones, so that idle
//                     time banks no credit (the Virtual Token Counter of "Fairness in
//                     Serving Large Language Models", Sheng et al., OSDI 2024). Work-
//                     conserving: a request is never held back while the server has room.
//
// Quotas (TenantQuota::max_queued, max_in_flight) bound each tenant under either
// scheduling: a request past its tenant's quota completes at once with
// rejected/quota_exceeded and a retry-after hint (HTTP 429: this client sent too much).
// docs/fairness.md has the order, the reasoning and the fairness bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/submit_options.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tailbatch {

// How the next request is chosen across tenants (see the file comment).
enum class Scheduling : std::uint8_t { fifo, fair };

// "fifo" or "fair". Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(Scheduling s) noexcept {
  switch (s) {
    case Scheduling::fifo:
      return "fifo";
    case Scheduling::fair:
      return "fair";
  }
  return "unknown";
}

// The scheduling named "fifo" or "fair"; nullopt for any other text. Never allocates.
// Thread-safe.
[[nodiscard]] constexpr std::optional<Scheduling> parse_scheduling(std::string_view name) noexcept {
  if (name == "fifo") return Scheduling::fifo;
  if (name == "fair") return Scheduling::fair;
  return std::nullopt;
}

// One tenant's share and limits. A plain value. Thread-safety: as for any value type.
struct TenantQuota {
  // Its share relative to the other tenants' weights (fair scheduling): a tenant of
  // weight 2 is served twice the cost of one of weight 1 while both are backlogged.
  // Finite and > 0.
  double weight = 1.0;
  // The most of its requests waiting in the queue at once; 0: no limit beyond the queue's.
  std::size_t max_queued = 0;
  // The most of its requests queued or executing at once (Pipeline: submitted and not yet
  // completed; ContinuousBatcher: waiting or active); 0: no limit.
  std::size_t max_in_flight = 0;
};

// PipelineConfig::tenants and ContinuousBatcherConfig::tenants. A plain value.
// Thread-safety: as for any value type.
struct TenantsConfig {
  Scheduling scheduling = Scheduling::fifo;
  // The quota of every tenant not listed in `tenants` (the default tenant 0 included).
  TenantQuota defaults{};
  // Tenants with their own quota. Each id at most once.
  std::vector<std::pair<TenantId, TenantQuota>> tenants{};

  // The quota of tenant t. Linear in tenants.size(); front doors look it up once per
  // tenant, not per request. Never throws.
  [[nodiscard]] const TenantQuota& quota(TenantId t) const noexcept {
    for (const auto& [id, q] : tenants) {
      if (id == t) return q;
    }
    return defaults;
  }
  // Whether any quota limits anything (then the front door counts per tenant).
  [[nodiscard]] bool has_limits() const noexcept {
    if (defaults.max_queued != 0 || defaults.max_in_flight != 0) return true;
    for (const auto& [id, q] : tenants) {
      if (q.max_queued != 0 || q.max_in_flight != 0) return true;
    }
    return false;
  }
  // Whether the front door must track tenants at all.
  [[nodiscard]] bool enabled() const noexcept {
    return scheduling == Scheduling::fair || has_limits();
  }
};

namespace detail {

// Throws std::invalid_argument naming the field ("Pipeline: tenants.defaults.weight must
// be finite and > 0") for a bad TenantsConfig. who: "Pipeline" or "ContinuousBatcher".
[[gnu::cold]] inline void validate_tenants(const TenantsConfig& c, std::string_view who) {
  auto check = [&](const TenantQuota& q, const std::string& field) {
    if (!(detail::is_finite(q.weight) && q.weight > 0.0)) {
      throw_invalid_argument(std::string(who) + ": " + field + ".weight must be finite and > 0");
    }
    if (q.max_in_flight != 0 && q.max_queued > q.max_in_flight) {
      throw_invalid_argument(std::string(who) + ": " + field +
                             ".max_queued must be <= max_in_flight (0: no limit)");
    }
  };
  check(c.defaults, "tenants.defaults");
  for (std::size_t i = 0; i < c.tenants.size(); ++i) {
    check(c.tenants[i].second, "tenants.tenants[" + std::to_string(i) + "]");
    for (std::size_t j = 0; j < i; ++j) {
      if (c.tenants[j].first == c.tenants[i].first) {
        throw_invalid_argument(std::string(who) + ": tenants.tenants lists tenant " +
                               std::to_string(c.tenants[i].first) + " twice");
      }
    }
  }
}

}  // namespace detail

// Interns tenant names (an API key's owner, a `user` field) into TenantIds, under a bound:
// the default tenant is 0 (the empty name), the first `capacity` distinct names get ids
// 1, 2, ... in the order first seen, and every later name gets other_id(), one id shared
// by all of them, so that a server's tenant set (and its metrics' label values) stays
// bounded however many names clients send. Ids are never reused or forgotten.
// Thread-safe: every member may be called from any thread (one mutex; id() allocates only
// for a new name).
class TenantNames {
 public:
  // capacity: how many distinct names get their own id (>= 1).
  explicit TenantNames(std::size_t capacity = 1000) : capacity_(capacity) {
    if (capacity_ < 1) detail::throw_invalid_argument("TenantNames: capacity must be >= 1");
    names_.emplace_back("");
  }

  // The id of name: 0 for "", its own id, a new one while fewer than capacity() names
  // have one, else other_id(). May allocate (std::bad_alloc).
  [[nodiscard]] TenantId id(std::string_view name) {
    if (name.empty()) return 0;
    std::lock_guard lock(mu_);
    if (auto it = ids_.find(std::string(name)); it != ids_.end()) return it->second;
    if (ids_.size() >= capacity_) return other_id();
    const auto id = static_cast<TenantId>(names_.size());
    names_.emplace_back(name);
    ids_.emplace(std::string(name), id);
    return id;
  }
  // The id of name if it has one of its own (or is ""), without adding it. Never blocks
  // for long; may allocate.
  [[nodiscard]] std::optional<TenantId> find(std::string_view name) const {
    if (name.empty()) return TenantId{0};
    std::lock_guard lock(mu_);
    if (auto it = ids_.find(std::string(name)); it != ids_.end()) return it->second;
    return std::nullopt;
  }
  // The name of id: "" for 0, "other" for other_id() and any id not handed out. A copy.
  [[nodiscard]] std::string name(TenantId id) const {
    std::lock_guard lock(mu_);
    if (id < names_.size()) return names_[id];
    return "other";
  }
  // The id every name past the capacity shares.
  [[nodiscard]] TenantId other_id() const noexcept { return static_cast<TenantId>(capacity_ + 1); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  // Names with an id of their own (the default tenant's "" excluded).
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mu_);
    return ids_.size();
  }

 private:
  std::size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, TenantId> ids_;
  std::vector<std::string> names_;  // index: id
};

}  // namespace tailbatch
