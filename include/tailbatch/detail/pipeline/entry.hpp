// What a queued request is: the record a submit appends to its shard (ingress) and that the
// batch leader stages, forms into a batch, or completes early.
//
// A request travels as a PipelineEntry: the request itself, its PipelineMeta (the completion
// to call, its arrival and deadline, its cancellation hook and admission ticket) and, for
// policies that read it, its cost. The entry depends on the request, response and ticket
// types only (not on the Pipeline's policy, lanes or clock), so Pipelines that share them
// share the queue's code. A CancelHook is what a cancellable request registers on its
// token: it marks the request and wakes the leader through a plain function pointer.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <stop_token>
#include <tailbatch/detail/pipeline/completion.hpp>
#include <tailbatch/submit_options.hpp>
#include <type_traits>
#include <utility>

namespace tailbatch::detail {

// Registered on a request's cancellation token: marks it and wakes the batch leader.
struct CancelHook {
  struct Fire {
    CancelHook* self;
    void operator()() const noexcept {
      self->fired.store(true, std::memory_order_release);
      self->notify(self->owner);
    }
  };
  CancelHook(void (*n)(void*) noexcept, void* o) noexcept : notify(n), owner(o) {}
  std::atomic<bool> fired{false};
  void (*notify)(void*) noexcept;
  void* owner;
  std::optional<std::stop_callback<Fire>> callback;  // last: unregistered first
};

// Everything about a request but the request itself; moves into the batch with it.
template <class Resp, class Ticket>
struct PipelineMeta {
  Completion<Resp> done;
  BatchTime arrival;
  BatchTime deadline;  // the latest start
  std::unique_ptr<CancelHook> cancel;
  [[no_unique_address]] Ticket ticket;

  [[nodiscard]] bool cancelled() const noexcept {
    return cancel && cancel->fired.load(std::memory_order_acquire);
  }
};

struct NoCost {};

template <class Req, class Meta, bool WithCost>
struct PipelineEntryFields {
  Req req;
  TenantId tenant;
  Meta meta;
  [[no_unique_address]] std::conditional_t<WithCost, std::size_t, NoCost> cost;
};

// One cache line per entry when it fits in one: submitters on different cores then never
// write the same line, and the leader reads each entry with one miss.
template <class Req, class Meta, bool WithCost>
inline constexpr std::size_t pipeline_entry_align =
    sizeof(PipelineEntryFields<Req, Meta, WithCost>) <= 64
        ? 64
        : alignof(PipelineEntryFields<Req, Meta, WithCost>);

// A queued request. Its priority and bucket are those of the sub-queue holding it. The
// request's cost is stored only when WithCost (policies that read it).
template <class Req, class Resp, class Ticket, bool WithCost>
struct alignas(pipeline_entry_align<Req, PipelineMeta<Resp, Ticket>, WithCost>) PipelineEntry {
  using Meta = PipelineMeta<Resp, Ticket>;
  using CostField = std::conditional_t<WithCost, std::size_t, NoCost>;

  Req req;
  // Its tenant: beside the request, where a small request leaves padding before the meta,
  // so that the entry stays one cache line.
  TenantId tenant;
  Meta meta;
  [[no_unique_address]] CostField cost;

  PipelineEntry(Req&& r, Completion<Resp>&& d, BatchTime arrival, std::unique_ptr<CancelHook>&& h,
                Ticket&& t, BatchTime dl, [[maybe_unused]] std::size_t c, TenantId tenant = 0)
      : req(std::move(r)),
        tenant(tenant),
        meta{std::move(d), arrival, dl, std::move(h), std::move(t)} {
    if constexpr (WithCost) cost = c;
  }

  [[nodiscard]] std::size_t cost_value() const noexcept {
    if constexpr (WithCost) {
      return cost;
    } else {
      return 1;
    }
  }
};

// How the staged queue and the batch former read an entry. A taken or completed entry has
// given its completion away.
template <class Entry>
struct PipelineEntryTraits {
  static bool gone(const Entry& e) noexcept { return !e.meta.done; }
  static BatchTime deadline(const Entry& e) noexcept { return e.meta.deadline; }
  static BatchTime arrival(const Entry& e) noexcept { return e.meta.arrival; }
  static bool cancelled(const Entry& e) noexcept { return e.meta.cancelled(); }
  static std::size_t cost(const Entry& e) noexcept { return e.cost_value(); }
  static TenantId tenant(const Entry& e) noexcept { return e.tenant; }
};

}  // namespace tailbatch::detail
