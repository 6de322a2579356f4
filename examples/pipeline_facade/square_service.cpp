// The one file that names the Pipeline's type: its instantiation and code generation are
// compiled here, once, and nowhere else in the program.
#include "square_service.hpp"

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/pipeline.hpp>

namespace example {

struct SquareService::Impl {
  Impl(std::size_t max_batch, std::chrono::microseconds window)
      : pipeline([](std::span<const int> in, std::span<int> out,
                    tailbatch::HostLane&) {
                   for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * in[i];
                 },
                 tailbatch::FixedWindow(max_batch, window)) {}

  tailbatch::Pipeline<int, int> pipeline;
};

SquareService::SquareService(std::size_t max_batch, std::chrono::microseconds window)
    : impl_(std::make_unique<Impl>(max_batch, window)) {}

SquareService::~SquareService() = default;

std::future<SquareService::Reply> SquareService::submit(int x, std::chrono::milliseconds timeout) {
  std::promise<Reply> promise;
  std::future<Reply> reply = promise.get_future();
  impl_->pipeline.submit(x, {.timeout = timeout},
                         [p = std::move(promise)](tailbatch::Outcome<int>&& o) mutable {
                           if (o.ok()) {
                             p.set_value({true, o.value(), {}});
                           } else {
                             p.set_value({false, 0,
                                          std::string(tailbatch::to_string(o.error().status)) +
                                              ": " + o.error().message});
                           }
                         });
  return reply;
}

void SquareService::shutdown() noexcept { impl_->pipeline.shutdown(); }

}  // namespace example
