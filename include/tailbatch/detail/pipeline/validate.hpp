// The Pipeline's construction-time checks: every bad configuration value is refused with
// std::invalid_argument naming the field ("Pipeline: queue_capacity must be >= 1"), or a
// message and abort without exceptions (detail/throw.hpp). Run once, by the constructor.
// With them, what the Pipeline asks of its policy's optional members (buckets, padding).
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <tailbatch/batch_policy.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/pipeline_config.hpp>
#include <type_traits>

namespace tailbatch::detail {

template <class C>
inline constexpr bool is_real_time_clock = std::is_same_v<C, SteadyClock>;

// The admission policy's limit, when it has an observer for one.
template <class A>
std::optional<std::uint64_t> admission_limit(const A& a) noexcept {
  if constexpr (requires {
                  { a.max_limit() } -> std::convertible_to<std::uint64_t>;
                }) {
    return static_cast<std::uint64_t>(a.max_limit());
  } else if constexpr (requires {
                         { a.limit() } -> std::convertible_to<std::uint64_t>;
                       }) {
    return static_cast<std::uint64_t>(a.limit());
  } else {
    return std::nullopt;
  }
}

// The policy's length buckets (at least one).
template <class Policy>
[[nodiscard]] std::size_t policy_bucket_count(const Policy& p) noexcept {
  if constexpr (BucketedBatchPolicy<Policy>) {
    return p.bucket_count() > 1 ? p.bucket_count() : 1;
  } else {
    return 1;
  }
}

// Whether the policy pads batches (a batch that loses requests as it starts keeps its size).
template <class Policy>
[[nodiscard]] bool policy_pads(const Policy& p) noexcept {
  if constexpr (requires {
                  { p.may_pad() } -> std::convertible_to<bool>;
                }) {
    return p.may_pad();
  } else {
    return false;
  }
}

// Checks a Pipeline's configuration (see PipelineConfig) against its policy, lanes and
// admission policy. model_set: the model callable is not empty. submit_shards_max: the
// submit shards' limit.
template <class C, class Req, class Policy, class Lanes, class Admission>
[[gnu::cold]] void validate_pipeline(const PipelineConfig<Req>& config, bool model_set,
                                     const Policy& policy, const Lanes* lanes,
                                     const Admission* admission, std::size_t max_batch,
                                     std::size_t submit_shards_max) {
  if (!model_set) throw_invalid_argument("Pipeline: model must be set");
  if (lanes == nullptr) throw_invalid_argument("Pipeline: lanes must be set");
  if (admission == nullptr) throw_invalid_argument("Pipeline: admission must be set");
  if (max_batch < 1) throw_invalid_argument("Pipeline: policy max_batch must be >= 1");
  if (config.queue_capacity < 1) throw_invalid_argument("Pipeline: queue_capacity must be >= 1");
  if (config.drain_timeout < std::chrono::nanoseconds::zero()) {
    throw_invalid_argument("Pipeline: drain_timeout must be >= 0");
  }
  if (config.starvation_limit <= std::chrono::nanoseconds::zero()) {
    throw_invalid_argument("Pipeline: starvation_limit must be > 0");
  }
  if (config.dispatch_spin < std::chrono::nanoseconds::zero()) {
    throw_invalid_argument("Pipeline: dispatch_spin must be >= 0");
  }
  if (config.submit_shards > submit_shards_max) {
    throw_invalid_argument("Pipeline: submit_shards must be at most 64 (0: automatic)");
  }
  validate_tenants(config.tenants, "Pipeline");
  if (config.queue.codel_target <= BatchDuration::zero()) {
    throw_invalid_argument("Pipeline: queue.codel_target must be > 0");
  }
  if (config.queue.codel_interval <= config.queue.codel_target) {
    throw_invalid_argument("Pipeline: queue.codel_target must be < queue.codel_interval");
  }
  if (lanes->size() < 1) throw_invalid_argument("Pipeline: lanes must have size() >= 1");
  if (lanes->lane_capacity() < 1)
    throw_invalid_argument("Pipeline: lanes must have lane_capacity() >= 1");
  if constexpr (!is_real_time_clock<C>) {
    if (config.workers.value_or(0) != 0) {
      throw_invalid_argument("Pipeline: workers must be 0 with a clock other than SteadyClock");
    }
  }
  if constexpr (policy_uses_cost<Policy>()) {
    if (!config.request_cost) {
      throw_invalid_argument(
          "Pipeline: request_cost must be set for a policy that reads request cost");
    }
  }
  if constexpr (requires {
                  { policy.may_pad() } -> std::convertible_to<bool>;
                }) {
    if (!std::copy_constructible<Req> && policy.may_pad()) {
      throw_invalid_argument(
          "Pipeline: a padding policy needs a copy-constructible request type (or Fill::exact)");
    }
  }
  if (config.check_admission_limit) {
    if (const auto limit = admission_limit(*admission)) {
      const std::uint64_t need = static_cast<std::uint64_t>(max_batch) * lanes->size();
      if (*limit < need) {
        throw_invalid_argument(
            "Pipeline: the admission limit is below max_batch x lanes, so batches could never fill "
            "every "
            "lane; raise the limit, lower max_batch, or set check_admission_limit = false");
      }
    }
  }
}

}  // namespace tailbatch::detail
