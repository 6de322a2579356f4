// tailbatch-load --tenant-mix: several tenants offering load at once, each at its own rate,
// and what each of them got (tenant_mix.hpp).
//
//   --tenant-mix a:300,b:50,c:50      three tenants offering 300, 50 and 50 requests/s
//   --tenant-mix a:300:2,b:50,c:50    the same, tenant a with weight 2 (fair scheduling)
//
// The run's arrivals are one Poisson (or constant) process at the sum of the rates, and
// each arrival goes to a tenant drawn with probability rate / sum from a hash of the seed
// and the request's index: for Poisson arrivals this splits the process into independent
// Poisson processes at the tenants' rates, and the split is the same in every mode (live,
// --simulate, --url) for the same seed. Tenant i (in the order given) has TenantId i + 1.
//
// TenantTally counts each tenant's measured requests (those intended after the warm-up):
// offered, answered ok, answered ok within the SLO (goodput), and the latency of the ok
// ones. Thread-safe where it says so.
#pragma once

#include <fmt/core.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/outcome.hpp>
#include <vector>

namespace tailbatch_load {

// One tenant of --tenant-mix.
struct TenantSpec {
  std::string name;
  double rate = 0.0;    // requests per second
  double weight = 1.0;  // its share under fair scheduling
};

// Parses "NAME:RATE[:WEIGHT],..." (see the file comment). Names are 1 to 64 characters of
// [A-Za-z0-9_.-], each once; rates finite and > 0; weights finite and > 0. Throws
// std::invalid_argument starting "--tenant-mix: " and naming the item it could not read.
// Allocates. Thread-safe.
[[nodiscard]] inline std::vector<TenantSpec> parse_tenant_mix(std::string_view text) {
  std::vector<TenantSpec> out;
  auto number = [](const std::string& s, double& v) {
    std::size_t used = 0;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      return false;
    }
    return used == s.size() && std::isfinite(v) && v > 0.0;
  };
  if (text.find_first_not_of(" \t") == std::string_view::npos)
    throw std::invalid_argument(
        "--tenant-mix: empty; give NAME:RATE[:WEIGHT] items, as in a:300,b:50");
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string item(text.substr(pos, end - pos));
    const auto bad = [&](const std::string& why) {
      return std::invalid_argument("--tenant-mix: \"" + item + "\": " + why);
    };
    std::vector<std::string> parts;
    std::size_t p = 0;
    for (;;) {
      const std::size_t colon = item.find(':', p);
      parts.push_back(item.substr(p, colon == std::string::npos ? std::string::npos : colon - p));
      if (colon == std::string::npos) break;
      p = colon + 1;
    }
    if (parts.size() < 2 || parts.size() > 3) throw bad("expected NAME:RATE or NAME:RATE:WEIGHT");
    TenantSpec t;
    t.name = parts[0];
    if (t.name.empty() || t.name.size() > 64 ||
        t.name.find_first_not_of(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") !=
            std::string::npos)
      throw bad("a name is 1 to 64 characters of A-Z a-z 0-9 _ . -");
    for (const TenantSpec& o : out) {
      if (o.name == t.name) throw bad("tenant " + t.name + " is named twice");
    }
    if (!number(parts[1], t.rate)) throw bad("RATE must be a number > 0");
    if (parts.size() == 3 && !number(parts[2], t.weight)) throw bad("WEIGHT must be a number > 0");
    out.push_back(std::move(t));
    pos = end + 1;
  }
  return out;
}

// Which tenant request `index` belongs to (0-based, in --tenant-mix order): a draw with
// probability rate / total from a hash of (seed, index). Never allocates after
// construction. Thread-safe (const).
class TenantSplit {
 public:
  TenantSplit(const std::vector<TenantSpec>& tenants, std::uint64_t seed) : seed_(seed) {
    double sum = 0.0;
    for (const TenantSpec& t : tenants) sum += t.rate;
    total_ = sum;
    double acc = 0.0;
    for (const TenantSpec& t : tenants) {
      acc += t.rate;
      cumulative_.push_back(acc / sum);
    }
    if (!cumulative_.empty()) cumulative_.back() = 1.0;
  }
  [[nodiscard]] std::size_t tenant_of(std::uint64_t index) const noexcept {
    // splitmix64 of (seed, index): uniform in [0, 1).
    std::uint64_t z = seed_ * 0x9e3779b97f4a7c15ULL + index + 0x632be59bd9b4e019ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
    for (std::size_t i = 0; i < cumulative_.size(); ++i) {
      if (u < cumulative_[i]) return i;
    }
    return cumulative_.empty() ? 0 : cumulative_.size() - 1;
  }
  // The sum of the tenants' rates.
  [[nodiscard]] double total_rate() const noexcept { return total_; }

 private:
  std::uint64_t seed_;
  double total_ = 0.0;
  std::vector<double> cumulative_;
};

// One tenant's figures over a run (and, with the name "", the run's).
struct TenantRow {
  std::string name;
  double offered_rps = 0.0, achieved_rps = 0.0, goodput_rps = 0.0;
  double p50_ms = 0.0, p95_ms = 0.0, p99_ms = 0.0;
  std::uint64_t offered = 0, ok = 0, good = 0, errors = 0;
};

// Per-tenant counts of one run. record() is thread-safe and lock-free (atomics and
// lock-free histograms); rows() reads a snapshot.
class TenantTally {
 public:
  // n tenants; an ok answer within `slo` counts toward goodput.
  TenantTally(std::size_t n, std::chrono::nanoseconds slo) : slo_(slo), per_(n) {
    for (auto& p : per_) p = std::make_unique<Per>();
  }
  // A measured request of tenant t ended with status s, `latency` after its intended
  // send time. Out-of-range tenants are ignored. Never blocks. Thread-safe.
  void record(std::size_t t, tailbatch::Status s, std::chrono::nanoseconds latency) noexcept {
    if (t >= per_.size()) return;
    Per& p = *per_[t];
    p.offered.fetch_add(1, std::memory_order_relaxed);
    if (s != tailbatch::Status::ok) {
      p.errors.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    p.ok.fetch_add(1, std::memory_order_relaxed);
    if (latency <= slo_) p.good.fetch_add(1, std::memory_order_relaxed);
    p.latency.record(latency);
  }
  // One row per tenant: offered over offered_s seconds (the measured part of the profile),
  // achieved and goodput over window_s (the run's throughput window). Allocates.
  [[nodiscard]] std::vector<TenantRow> rows(const std::vector<TenantSpec>& tenants,
                                            double offered_s, double window_s) const {
    std::vector<TenantRow> out;
    for (std::size_t i = 0; i < per_.size() && i < tenants.size(); ++i) {
      const Per& p = *per_[i];
      TenantRow r;
      r.name = tenants[i].name;
      r.offered = p.offered.load(std::memory_order_relaxed);
      r.ok = p.ok.load(std::memory_order_relaxed);
      r.good = p.good.load(std::memory_order_relaxed);
      r.errors = p.errors.load(std::memory_order_relaxed);
      r.offered_rps = offered_s > 0 ? static_cast<double>(r.offered) / offered_s : 0.0;
      r.achieved_rps = window_s > 0 ? static_cast<double>(r.ok) / window_s : 0.0;
      r.goodput_rps = window_s > 0 ? static_cast<double>(r.good) / window_s : 0.0;
      const tailbatch::HistogramSnapshot h = p.latency.snapshot();
      if (h.count() > 0) {
        r.p50_ms = ms(h.percentile(50));
        r.p95_ms = ms(h.percentile(95));
        r.p99_ms = ms(h.percentile(99));
      }
      out.push_back(std::move(r));
    }
    return out;
  }
  // Requests answered ok within the SLO, all tenants together.
  [[nodiscard]] std::uint64_t good() const noexcept {
    std::uint64_t n = 0;
    for (const auto& p : per_) n += p->good.load(std::memory_order_relaxed);
    return n;
  }

 private:
  static double ms(std::chrono::nanoseconds d) {
    return std::chrono::duration<double, std::milli>(d).count();
  }
  struct Per {
    std::atomic<std::uint64_t> offered{0}, ok{0}, good{0}, errors{0};
    tailbatch::LatencyHistogram latency{};
  };
  std::chrono::nanoseconds slo_;
  std::vector<std::unique_ptr<Per>> per_;
};

// The --json run object's "tenants" value: [{"name", "offered_rps", "achieved_rps",
// "p50_ms", "p95_ms", "p99_ms", "goodput_rps", "errors"}, ...]. Names are [A-Za-z0-9_.-]
// (parse_tenant_mix), so they need no escaping. Allocates. Thread-safe.
[[nodiscard]] inline std::string tenants_json(const std::vector<TenantRow>& rows) {
  std::string j = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const TenantRow& r = rows[i];
    j += fmt::format(
        "{}{{\"name\": \"{}\", \"offered_rps\": {:.3f}, \"achieved_rps\": {:.3f}, \"p50_ms\": "
        "{:.3f}, "
        "\"p95_ms\": {:.3f}, \"p99_ms\": {:.3f}, \"goodput_rps\": {:.3f}, \"errors\": {}}}",
        i ? ", " : "", r.name, r.offered_rps, r.achieved_rps, r.p50_ms, r.p95_ms, r.p99_ms,
        r.goodput_rps, r.errors);
  }
  return j + "]";
}

// The per-tenant table printed after a run. Allocates. Thread-safe.
[[nodiscard]] inline std::string tenants_table(const std::vector<TenantRow>& rows, double slo_ms) {
  std::string out = fmt::format("\n{:<12} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8}\n", "tenant",
                                "offered", "achieved", "goodput", "p50", "p95", "p99", "errors");
  out += fmt::format("{:<12} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8}\n", "", "rps", "rps",
                     fmt::format("<={}ms", slo_ms), "ms", "ms", "ms", "%");
  for (const TenantRow& r : rows) {
    const double err =
        r.offered ? 100.0 * static_cast<double>(r.errors) / static_cast<double>(r.offered) : 0.0;
    out += fmt::format("{:<12} {:>10.1f} {:>10.1f} {:>10.1f} {:>9.2f} {:>9.2f} {:>9.2f} {:>8.2f}\n",
                       r.name, r.offered_rps, r.achieved_rps, r.goodput_rps, r.p50_ms, r.p95_ms,
                       r.p99_ms, err);
  }
  return out;
}

}  // namespace tailbatch_load
