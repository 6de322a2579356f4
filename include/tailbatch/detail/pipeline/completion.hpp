// A request's completion: the caller's callback (or the promise behind its future),
// type-erased with a small inline buffer so that the callback path never allocates for
// callables up to `inline_size` bytes.
#pragma once

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include <tailbatch/outcome.hpp>

namespace tailbatch::detail {

template <class Resp>
class Completion {
 public:
  static constexpr std::size_t inline_size = 24;

  template <class Fn>
  static constexpr bool fits_inline = sizeof(Fn) <= inline_size && alignof(Fn) <= alignof(void*) &&
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

  Completion(Completion&& other) noexcept : ops_(other.ops_) { take(other); }
  Completion& operator=(Completion&& other) noexcept {
    if (this != &other) {
      reset();
      ops_ = other.ops_;
      take(other);
    }
    return *this;
  }
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  ~Completion() { reset(); }

  [[nodiscard]] explicit operator bool() const noexcept { return ops_ != nullptr; }

  // Calls the callable once with the outcome, then destroys it, leaving this empty (also
  // when it throws; the exception propagates). Precondition: not empty.
  void operator()(Outcome<Resp>&& outcome) {
    const Ops* ops = std::exchange(ops_, nullptr);
    ops->consume(buf_, std::move(outcome));
  }

  // Whether this holds a callable of type Fn (as constructed from an Fn). Never throws.
  template <class Fn>
  [[nodiscard]] bool holds() const noexcept {
    return ops_ != nullptr && (ops_ == &inline_ops<Fn> || ops_ == &heap_ops<Fn>);
  }

  void reset() noexcept {
    if (ops_ != nullptr) {
      if (ops_->destroy != nullptr) ops_->destroy(buf_);
      ops_ = nullptr;
    }
  }

 private:
  // Completions move twice per request (into the queue, into the batch): a callable that
  // is trivially copyable moves as plain bytes, without an indirect call.
  void take(Completion& other) noexcept {
    if (ops_ == nullptr) return;
    if (ops_->relocate != nullptr) {
      ops_->relocate(other.buf_, buf_);
    } else {
      std::memcpy(buf_, other.buf_, inline_size);
    }
    other.ops_ = nullptr;
  }

  template <class Fn>
  static constexpr bool trivial = std::is_trivially_copyable_v<Fn> && std::is_trivially_destructible_v<Fn>;

  struct Ops {
    // Invokes, then destroys (also when the call throws).
    void (*consume)(void* self, Outcome<Resp>&& outcome);
    void (*relocate)(void* from, void* to) noexcept;  // nullptr: copy the bytes
    void (*destroy)(void* self) noexcept;              // nullptr: nothing to do
  };

  template <class Fn>
  static constexpr Ops inline_ops{
      [](void* self, Outcome<Resp>&& o) {
        struct Destroy {
          Fn* f;
          ~Destroy() { std::destroy_at(f); }
        } guard{static_cast<Fn*>(self)};
        std::invoke(*guard.f, std::move(o));
      },
      trivial<Fn> ? nullptr
                  : +[](void* from, void* to) noexcept {
                      ::new (to) Fn(std::move(*static_cast<Fn*>(from)));
                      static_cast<Fn*>(from)->~Fn();
                    },
      trivial<Fn> ? nullptr : +[](void* self) noexcept { static_cast<Fn*>(self)->~Fn(); },
  };

  template <class Fn>
  static constexpr Ops heap_ops{
      [](void* self, Outcome<Resp>&& o) {
        struct Destroy {
          Fn* f;
          ~Destroy() { delete f; }
        } guard{*static_cast<Fn**>(self)};
        std::invoke(*guard.f, std::move(o));
      },
      nullptr,  // the pointer moves as bytes
      [](void* self) noexcept { delete *static_cast<Fn**>(self); },
  };

  // Pointer-aligned, so that the whole is 32 bytes (a promise fits; so does a lambda
  // holding a pointer and an id or a shared_ptr). Zeroed: the bytes a small callable
  // leaves unwritten are copied too.
  alignas(void*) unsigned char buf_[inline_size]{};
  const Ops* ops_ = nullptr;
};

}  // namespace tailbatch::detail
