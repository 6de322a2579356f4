// The reference classifier's CUDA kernels against the CPU twin: logits equal bit for bit
// and probabilities within 1e-5 relative; bitwise batch invariance on the device (batches
// 1..64, random positions); the lexicon sentences; several lanes at once; input errors.
// Without a GPU it exits 77 (skipped) with the reason.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <tailbatch/cuda.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/cuda/classifier.hpp>

#include "cuda_test_support.hpp"
#include "reference_test_support.hpp"

using tailbatch::cuda::DeviceClassifier;
using tailbatch::cuda::StreamPool;
using tailbatch::cuda::StreamPoolConfig;
using namespace tailbatch::reference;

namespace {

using Requests = tailbatch::test::TokenRequests;
using tailbatch::test::same_bits;
using tailbatch::test::same_logits;

Requests random_requests(std::size_t count, std::uint32_t vocab, std::size_t max_len, std::uint64_t seed) {
  return tailbatch::test::random_token_requests(count, vocab, max_len, seed);
}

std::vector<Prediction> gpu_run(const DeviceClassifier& gpu, StreamPool& pool, const std::vector<std::span<const std::uint32_t>>& batch) {
  std::vector<Prediction> out(batch.size());
  auto lease = pool.try_acquire();
  CHECK(lease.has_value());
  gpu.forward(batch, out, lease->lane());
  return out;
}

// GPU against the CPU twin on `pool` requests: logits bitwise, probabilities within 1e-5.
void check_against_cpu(const Classifier& cpu, const DeviceClassifier& gpu, StreamPool& pool, const Requests& pool_reqs) {
  const auto batch = tailbatch::test::as_batch(pool_reqs);
  const std::vector<Prediction> got = gpu_run(gpu, pool, batch);
  std::vector<Prediction> want(batch.size());
  ClassifierWorkspace ws;
  cpu.forward(batch, want, ws);
  double worst = 0.0;
  std::size_t logit_mismatch = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    for (std::size_t l = 0; l < 3; ++l) {
      const double rel = std::abs(static_cast<double>(got[i].probabilities[l]) - want[i].probabilities[l]) /
                         std::abs(static_cast<double>(want[i].probabilities[l]));
      worst = rel > worst ? rel : worst;
    }
    logit_mismatch += !same_logits(got[i], want[i]);
    CHECK(got[i].label == want[i].label);
  }
  std::printf("GPU vs CPU twin over %zu requests: worst probability relative error %.3g, logits differing %zu\n",
              got.size(), worst, logit_mismatch);
  CHECK(worst <= 1e-5);
  CHECK(logit_mismatch == 0);
}

void check_batch_invariance(const DeviceClassifier& gpu, StreamPool& pool, const Requests& reqs) {
  std::vector<Prediction> solo;
  for (const auto& r : reqs) solo.push_back(gpu_run(gpu, pool, {std::span<const std::uint32_t>(r)})[0]);
  std::mt19937_64 rng(11);
  std::size_t mismatches = 0;
  std::size_t checked = 0;
  for (std::size_t n = 1; n <= 64; ++n) {
    std::vector<std::size_t> which(n);
    for (auto& w : which) w = rng() % reqs.size();
    std::vector<std::span<const std::uint32_t>> batch;
    for (std::size_t w : which) batch.emplace_back(reqs[w]);
    const std::vector<Prediction> got = gpu_run(gpu, pool, batch);
    for (std::size_t i = 0; i < n; ++i) mismatches += !same_bits(got[i], solo[which[i]]);
    checked += n;
  }
  std::printf("device batch invariance: %zu of %zu results differ from the request alone\n", mismatches, checked);
  CHECK(mismatches == 0);
}

void check_sentences(const Classifier& cpu, const DeviceClassifier& gpu, StreamPool& pool) {
  const char* texts[] = {"a great, moving film", "awful, boring plot", "The package arrived on Tuesday."};
  const Sentiment expected[] = {Sentiment::positive, Sentiment::negative, Sentiment::neutral};
  Requests ids;
  for (const char* t : texts) ids.push_back(cpu.tokenizer().tokenize(t));
  std::vector<std::span<const std::uint32_t>> batch(ids.begin(), ids.end());
  const std::vector<Prediction> got = gpu_run(gpu, pool, batch);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].label == expected[i]);
}

void check_lanes_in_parallel(const Classifier& cpu, const DeviceClassifier& gpu, const Requests& reqs) {
  StreamPool pool(StreamPoolConfig{.lanes = 4, .staging_bytes = gpu.staging_bytes(64), .scratch_bytes = gpu.scratch_bytes(64)});
  std::vector<std::span<const std::uint32_t>> batch(reqs.begin(), reqs.end());
  std::vector<Prediction> want(batch.size());
  ClassifierWorkspace ws;
  cpu.forward(batch, want, ws);
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        auto lease = pool.acquire_for(std::chrono::seconds(10));
        if (!lease) {
          ++bad[t];
          continue;
        }
        std::vector<Prediction> got(batch.size());
        gpu.forward(batch, got, lease->lane());
        for (std::size_t i = 0; i < got.size(); ++i) {
          bad[t] += !same_logits(got[i], want[i]);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad[0] + bad[1] + bad[2] + bad[3] == 0);
}

void check_errors(const DeviceClassifier& gpu, StreamPool& pool) {
  const std::vector<std::uint32_t> bad = {1, 2, 1u << 30};
  const std::vector<std::span<const std::uint32_t>> one = {bad};
  std::vector<Prediction> out(1);
  auto lease = pool.try_acquire();
  CHECK_THROWS_AS(gpu.forward(one, out, lease->lane()), std::out_of_range);
  std::vector<Prediction> two(2);
  CHECK_THROWS_AS(gpu.forward(one, two, lease->lane()), std::invalid_argument);
  // An empty batch does nothing and succeeds.
  gpu.forward({}, {}, lease->lane());
}

}  // namespace

int main() {
  const std::string why = tailbatch::cuda_test::why_no_device();
  if (!why.empty()) tailbatch::cuda_test::skip("the classifier's CUDA kernels need a GPU: " + why);
  try {
    const Classifier cpu{};
    const DeviceClassifier gpu(cpu, 0);
    StreamPool pool(StreamPoolConfig{.lanes = 1, .staging_bytes = gpu.staging_bytes(64), .scratch_bytes = gpu.scratch_bytes(64)});
    std::printf("device: %s; CPU twin kernel: %s\n", pool.device_info().name.c_str(),
                std::string(to_string(cpu.kernel())).c_str());
    Requests reqs = random_requests(64, cpu.config().vocab_size, 200, 10);
    reqs.push_back({});
    check_against_cpu(cpu, gpu, pool, reqs);
    check_batch_invariance(gpu, pool, random_requests(40, cpu.config().vocab_size, 150, 12));
    check_sentences(cpu, gpu, pool);
    check_lanes_in_parallel(cpu, gpu, random_requests(33, cpu.config().vocab_size, 60, 13));
    check_errors(gpu, pool);
    // A smaller, odd-shaped model exercises partial tiles and another embed width.
    const Classifier small(ClassifierConfig{.vocab_size = 1000, .embed_dim = 48, .hidden_dim = 96, .max_tokens = 20});
    const DeviceClassifier small_gpu(small, 0);
    check_against_cpu(small, small_gpu, pool, random_requests(13, 1000, 30, 14));
    check_batch_invariance(small_gpu, pool, random_requests(9, 1000, 30, 15));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    return 1;
  }
  return tailbatch::cuda_test::finish("test_classifier_gpu");
}
