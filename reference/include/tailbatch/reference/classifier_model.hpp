// Plugs the reference classifier into a Pipeline as its model call.
//
//   reference::Classifier clf;                     // the weights (shared, immutable)
//   reference::ClassifierModel model(clf);         // the callable
//   Pipeline<std::string, reference::Prediction> pipeline(model, FixedWindow(32, 5ms));
//   auto outcome = pipeline.submit("a great, moving film").get();
//
// Requests are texts (std::string); responses are Predictions. Each batch is tokenized and
// classified on the CPU twin in the worker thread that runs it, so tokenization counts as
// model time, as it does in a real server. On any lane type (HostLanes, or the fallback
// host lanes of tailbatch/cuda/fallback_lanes.hpp); tailbatch/reference/cuda/classifier.hpp
// has the adapter for CUDA lanes (its tests have run on an NVIDIA H200).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tailbatch/reference/classifier.hpp>

namespace tailbatch::reference {

// Scratch for one batch in flight: token ids and the classifier's workspace. Reused.
struct BatchScratch {
  ClassifierWorkspace workspace;
  std::vector<std::uint32_t> ids;
  std::vector<std::size_t> ends;
  std::vector<std::span<const std::uint32_t>> requests;

  // Tokenizes texts into ids (each request's ids end at ends[i]) and points requests at
  // them. Allocates only while growing. Throws std::bad_alloc.
  void tokenize(const Tokenizer& tokenizer, std::span<const std::string> texts) {
    ids.clear();
    ends.clear();
    requests.clear();
    for (const std::string& t : texts) {
      tokenizer.tokenize(t, ids);
      ends.push_back(ids.size());
    }
    std::size_t begin = 0;
    for (std::size_t end : ends) {
      requests.emplace_back(ids.data() + begin, end - begin);
      begin = end;
    }
  }
};

namespace detail {

// A free list of BatchScratch, so that concurrent batches (several lanes, or several
// slots of one lane) never share one and none is allocated per batch once warm.
class ScratchPool {
 public:
  class Handle {
   public:
    Handle(ScratchPool& pool, std::unique_ptr<BatchScratch> s) noexcept : pool_(&pool), scratch_(std::move(s)) {}
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() { pool_->give_back(std::move(scratch_)); }
    BatchScratch& operator*() const noexcept { return *scratch_; }
    BatchScratch* operator->() const noexcept { return scratch_.get(); }

   private:
    ScratchPool* pool_;
    std::unique_ptr<BatchScratch> scratch_;
  };

  Handle take() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        auto s = std::move(free_.back());
        free_.pop_back();
        return Handle(*this, std::move(s));
      }
    }
    return Handle(*this, std::make_unique<BatchScratch>());
  }

 private:
  void give_back(std::unique_ptr<BatchScratch> s) noexcept {
    std::lock_guard lock(mu_);
    try {
      free_.push_back(std::move(s));
    } catch (...) {
      // Out of memory growing the free list: the scratch is simply freed.
    }
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<BatchScratch>> free_;
};

}  // namespace detail

// The classifier as a Pipeline model: model(span<const std::string>, span<Prediction>, Lane&).
//
// A text longer than max_tokens words comes back with Prediction::truncated set (and is
// counted in Classifier::truncated_requests()). Under LongInput::reject it makes forward
// throw, which fails its whole batch: a server that rejects long texts should check them
// before submit (tokenizer().tokenize(text).size() > max_tokens) and answer 413.
//
// Copies share one scratch pool (std::function copies its target). Thread-safety: calls
// may run concurrently from any number of worker threads. Exceptions: a call throws what
// Classifier::forward throws (std::bad_alloc, std::length_error under LongInput::reject);
// the Pipeline turns that into a failed batch.
class ClassifierModel {
 public:
  // model must outlive this object and its copies. Allocates. Throws std::bad_alloc.
  explicit ClassifierModel(const Classifier& model)
      : model_(&model), scratch_(std::make_shared<detail::ScratchPool>()) {}

  // Tokenizes and classifies one batch on the CPU, on whatever lane it was given. Blocks
  // for the batch's compute; allocates only while its scratch grows. Thread-safe.
  template <class Lane>
  void operator()(std::span<const std::string> texts, std::span<Prediction> out, Lane& /*lane*/) const {
    run_on_cpu(texts, out);
  }

  // The same without a lane. Thread-safe.
  void run_on_cpu(std::span<const std::string> texts, std::span<Prediction> out) const {
    auto scratch = scratch_->take();
    scratch->tokenize(model_->tokenizer(), texts);
    model_->forward(scratch->requests, out, scratch->workspace);
  }

  // The classifier behind the adapter. Thread-safe.
  [[nodiscard]] const Classifier& classifier() const noexcept { return *model_; }

 private:
  const Classifier* model_;
  std::shared_ptr<detail::ScratchPool> scratch_;
};

}  // namespace tailbatch::reference
