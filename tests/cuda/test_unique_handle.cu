// UniqueHandle, the RAII template behind Stream, Event, PinnedBuffer and DeviceBuffer, on a
// fake handle whose destroy function counts: each handle is destroyed exactly once, on
// destruction, reset and move-assignment, never for the empty handle, never twice after a
// move. Needs no device (no CUDA call is made), so it runs on every machine with nvcc.
#include <cstdio>
#include <type_traits>
#include <utility>

#include <tailbatch/cuda/resources.hpp>

#include "cuda_test_support.hpp"

namespace {

int destroyed[8] = {};
int destroy_calls = 0;

void destroy_fake(int h) noexcept {
  ++destroy_calls;
  if (h > 0 && h < 8) ++destroyed[h];
}

using Fake = tailbatch::cuda::UniqueHandle<int, destroy_fake>;

static_assert(!std::is_copy_constructible_v<Fake> && !std::is_copy_assignable_v<Fake>);
static_assert(std::is_nothrow_move_constructible_v<Fake> && std::is_nothrow_move_assignable_v<Fake>);
static_assert(!std::is_copy_constructible_v<tailbatch::cuda::Stream>);
static_assert(std::is_nothrow_move_constructible_v<tailbatch::cuda::Stream>);
static_assert(std::is_nothrow_move_constructible_v<tailbatch::cuda::Event>);
static_assert(std::is_nothrow_move_constructible_v<tailbatch::cuda::PinnedBuffer>);
static_assert(std::is_nothrow_move_assignable_v<tailbatch::cuda::DeviceBuffer>);

}  // namespace

int main() {
  {
    Fake empty;
    CHECK(empty.get() == 0);
  }
  CHECK(destroy_calls == 0);  // the empty handle is never destroyed

  {
    Fake a(1);
    CHECK(a.get() == 1);
    Fake b(std::move(a));
    CHECK(a.get() == 0 && b.get() == 1);
    CHECK(destroy_calls == 0);
  }
  CHECK(destroyed[1] == 1 && destroy_calls == 1);  // once, by b; a was empty

  {
    Fake a(2);
    Fake b(3);
    b = std::move(a);  // b's 3 goes, 2 moves in
    CHECK(destroyed[3] == 1 && destroyed[2] == 0);
    CHECK(b.get() == 2 && a.get() == 0);
    b.reset(4);  // 2 goes
    CHECK(destroyed[2] == 1 && b.get() == 4);
    b.reset();
    CHECK(destroyed[4] == 1 && b.get() == 0);
    Fake& self = b;
    b = std::move(self);  // self-move keeps the (empty) state
    CHECK(b.get() == 0);
  }
  CHECK(destroy_calls == 4);

  // Empty owners of the real kinds need no device and release nothing.
  {
    tailbatch::cuda::PinnedBuffer p;
    tailbatch::cuda::DeviceBuffer d;
    CHECK(p.data() == nullptr && p.size() == 0);
    CHECK(d.data() == nullptr && d.size() == 0);
    tailbatch::cuda::PinnedBuffer zero(0);  // zero bytes: nothing allocated
    CHECK(zero.data() == nullptr && zero.size() == 0);
    p = std::move(zero);
    CHECK(p.size() == 0);
  }
  return tailbatch::cuda_test::finish("test_unique_handle");
}
