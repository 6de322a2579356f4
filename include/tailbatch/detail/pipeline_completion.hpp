// A request's completion: the caller's callback (or the promise behind its future),
// type-erased with a small inline buffer so that the callback path never allocates for
// callables up to `inline_size` bytes.
#pragma once

#include <cstddef>
#include <functional>
#include <new>
#include <type_traits>
#include <utility>

#include <tailbatch/outcome.hpp>

namespace tailbatch::detail {

template <class Resp>
class Completion {
 public:
  static constexpr std::size_t inline_size = 48;

  template <class Fn>
  static constexpr bool fits_inline = sizeof(Fn) <= inline_size &&
                                      alignof(Fn) <= alignof(std::max_align_t) &&
                                      std::is_nothrow_move_constructible_v<Fn>;

  Completion() noexcept = default;

  // Stores f inline when it fits, else on the heap (throws std::bad_alloc before f is
  // touched).
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, Completion> &&
             std::is_invocable_v<std::decay_t<F>&, Outcome<Resp>&&>)
  explicit Completion(F&& f) {
    using Fn = std::decay_t<F>;
    if constexpr (fits_inline<Fn>) {
      ::new (static_cast<void*>(buf_)) Fn(std::forward<F>(f));
      ops_ = &inline_ops<Fn>;
    } else {
      Fn* p = new Fn(std::forward<F>(f));
      ::new (static_cast<void*>(buf_)) Fn*(p);
      ops_ = &heap_ops<Fn>;
    }
  }

  Completion(Completion&& other) noexcept : ops_(other.ops_) {
    if (ops_ != nullptr) {
      ops_->relocate(other.buf_, buf_);
      other.ops_ = nullptr;
    }
  }
  Completion& operator=(Completion&& other) noexcept {
    if (this != &other) {
      reset();
      ops_ = other.ops_;
      if (ops_ != nullptr) {
        ops_->relocate(other.buf_, buf_);
        other.ops_ = nullptr;
      }
    }
    return *this;
  }
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  ~Completion() { reset(); }

  [[nodiscard]] explicit operator bool() const noexcept { return ops_ != nullptr; }

  // Calls the callable once with the outcome, then destroys it (even if it throws; the
  // exception propagates). Precondition: not empty.
  void operator()(Outcome<Resp>&& outcome) {
    struct Reset {
      Completion* self;
      ~Reset() { self->reset(); }
    } reset_after{this};
    ops_->invoke(buf_, std::move(outcome));
  }

  void reset() noexcept {
    if (ops_ != nullptr) {
      ops_->destroy(buf_);
      ops_ = nullptr;
    }
  }

 private:
  struct Ops {
    void (*invoke)(void* self, Outcome<Resp>&& outcome);
    void (*relocate)(void* from, void* to) noexcept;
    void (*destroy)(void* self) noexcept;
  };

  template <class Fn>
  static constexpr Ops inline_ops{
      [](void* self, Outcome<Resp>&& o) { std::invoke(*static_cast<Fn*>(self), std::move(o)); },
      [](void* from, void* to) noexcept {
        ::new (to) Fn(std::move(*static_cast<Fn*>(from)));
        static_cast<Fn*>(from)->~Fn();
      },
      [](void* self) noexcept { static_cast<Fn*>(self)->~Fn(); },
  };

  template <class Fn>
  static constexpr Ops heap_ops{
      [](void* self, Outcome<Resp>&& o) { std::invoke(**static_cast<Fn**>(self), std::move(o)); },
      [](void* from, void* to) noexcept { ::new (to) Fn*(*static_cast<Fn**>(from)); },
      [](void* self) noexcept { delete *static_cast<Fn**>(self); },
  };

  const Ops* ops_ = nullptr;
  alignas(std::max_align_t) unsigned char buf_[inline_size];
};

}  // namespace tailbatch::detail
