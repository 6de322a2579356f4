// What the request handlers include: a small interface of the server's own, with no
// tailbatch header behind it. The Pipeline's type is named only in square_service.cpp, so
// that one file pays the cost of compiling a Pipeline (docs/pipeline.md, "Build time") and
// a handler file compiles as fast as any file with <future> and <string>.
//
// Thread safety: submit() and shutdown() may be called from any number of threads at once
// (the Pipeline's guarantees); a submit() after shutdown() gets a reply that is not ok and
// says why. The destructor must not run concurrently with either.
#pragma once

#include <chrono>
#include <cstddef>
#include <future>
#include <memory>
#include <string>

namespace example {

class SquareService {
 public:
  struct Reply {
    bool ok = false;
    int value = 0;
    std::string error;  // why, when !ok (rejected, timed out, the model threw, shut down)
  };

  // Batches of up to max_batch, each leaving at most `window` after its first request.
  // Throws std::invalid_argument for max_batch == 0 (the Pipeline's own check).
  SquareService(std::size_t max_batch, std::chrono::microseconds window);
  ~SquareService();  // drains what is queued, then stops the worker
  SquareService(const SquareService&) = delete;
  SquareService& operator=(const SquareService&) = delete;

  [[nodiscard]] std::future<Reply> submit(int x, std::chrono::milliseconds timeout);
  void shutdown() noexcept;

 private:
  struct Impl;  // holds the Pipeline; defined in square_service.cpp
  std::unique_ptr<Impl> impl_;
};

}  // namespace example
