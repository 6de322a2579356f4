// PolicyVariant: one batch policy type that holds any of several, chosen at run time.
//
// A Pipeline's batch policy is a template parameter, so a program that picks its policy
// from a flag or a config file ("fixed" or "adaptive") would otherwise instantiate one
// Pipeline per policy. PolicyVariant<FixedWindow, AdaptiveWindow> is a BatchPolicy that
// holds one of them (a std::variant) and dispatches every call to the one it holds:
//
//   using Policy = tailbatch::PolicyVariant<tailbatch::FixedWindow, tailbatch::AdaptiveWindow>;
//   Policy p = adaptive ? Policy(tailbatch::AdaptiveWindow(cfg)) :
//   Policy(tailbatch::FixedWindow(16, 2ms)); tailbatch::Pipeline<Req, Resp, Policy> pipeline(model,
//   p, {}, lanes);
//
// What it forwards, per call: max_batch(), order() and decide() to the policy held; and,
// when at least one alternative is a BatchFeedbackPolicy, on_batch_executed() to the
// policy held when it is one (a no-op otherwise), so an AdaptiveWindow inside a variant
// learns as it does alone. Copies share a learning policy's state exactly as copies of
// that policy do. `uses_cost` is true when any alternative reads BatchCandidate::cost (the
// Pipeline then needs a cost function; the others ignore the cost). The optional members
// of cost-limited, bucketed and padding policies (max_cost, bucket_count, bucket_of,
// may_pad) are not forwarded: a variant of such policies is not one of them.
//
// Thread-safety: as the policy held (every shipped policy is safe to call from several
// threads at once). Exceptions: constructing copies the policy (what its copy throws); no
// member throws. Dispatch costs one indirect jump per call, no allocation.
#pragma once

#include <concepts>
#include <cstddef>
#include <tailbatch/batch_window.hpp>
#include <type_traits>
#include <utility>
#include <variant>

namespace tailbatch {

template <BatchPolicy... Policies>
requires(sizeof...(Policies) >= 1) class PolicyVariant {
 public:
  // True when any alternative reads BatchCandidate::cost.
  static constexpr bool uses_cost = (detail::policy_uses_cost<Policies>() || ...);

  // Holds `p`, one of the alternatives. Throws what copying/moving P throws.
  template <class P>
  requires(std::same_as<std::remove_cvref_t<P>, Policies> || ...) PolicyVariant(P&& p)
      : p_(std::in_place_type<std::remove_cvref_t<P>>, std::forward<P>(p)) {}  // NOLINT: implicit

  // The held policy's cap. Thread-safe as the held policy.
  [[nodiscard]] std::size_t max_batch() const noexcept {
    return std::visit([](const auto& p) noexcept { return p.max_batch(); }, p_);
  }
  // The held policy's order. Thread-safe as the held policy.
  [[nodiscard]] BatchOrder order() const noexcept {
    return std::visit([](const auto& p) noexcept { return p.order(); }, p_);
  }
  // The held policy's decision. Thread-safe as the held policy.
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    return std::visit([&v](const auto& p) noexcept { return p.decide(v); }, p_);
  }
  // Forwards an executed batch to the held policy when it learns from them; otherwise does
  // nothing. Present only when some alternative is a BatchFeedbackPolicy.
  void on_batch_executed(const BatchFeedback& f) const noexcept
      requires(BatchFeedbackPolicy<Policies> || ...) {
    std::visit(
        [&f](const auto& p) noexcept {
          if constexpr (BatchFeedbackPolicy<std::remove_cvref_t<decltype(p)>>)
            p.on_batch_executed(f);
        },
        p_);
  }

  // Which alternative is held (its index in Policies). Never throws.
  [[nodiscard]] std::size_t index() const noexcept { return p_.index(); }
  // The held policy if it is a P, else nullptr. Never throws.
  template <class P>
  [[nodiscard]] const P* get_if() const noexcept {
    return std::get_if<P>(&p_);
  }
  // Whether the held policy is a P. Never throws.
  template <class P>
  [[nodiscard]] bool holds() const noexcept {
    return std::holds_alternative<P>(p_);
  }

 private:
  std::variant<Policies...> p_;
};

}  // namespace tailbatch
