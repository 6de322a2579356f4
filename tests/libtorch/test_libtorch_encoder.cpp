// The libtorch encoder behind a Pipeline (examples/libtorch/): padding never changes a
// request's output (alone vs inside a batch of longer neighbours, to 1e-5), every request
// gets its own row back exactly once, a missing or corrupt weights file fails with a clear
// error, the threads helper and its warning, warm-up and readiness. ctest label libtorch.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tailbatch/warmup.hpp>
#include <thread>
#include <vector>

#include "encoder_pipeline.hpp"
#include "tailbatch_test.hpp"

namespace tl = tailbatch_libtorch;
using namespace std::chrono_literals;
using tailbatch::test::MessageContains;

namespace {

// A weights file written by this test (the test step's torch::save), once per process.
const std::filesystem::path& weights_file() {
  static const std::filesystem::path path = [] {
    const auto dir =
        std::filesystem::temp_directory_path() /
        ("tailbatch_libtorch_test_" + std::to_string(static_cast<unsigned long>(::getpid())));
    std::filesystem::create_directories(dir);
    const auto p = dir / "encoder.pt";
    tl::save_encoder(tl::make_encoder(tl::EncoderConfig{}, 7), p);
    return p;
  }();
  return path;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0.0F;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

float max_abs_diff(const tl::Encoding& a, const tl::Encoding& b) {
  return std::max(max_abs_diff(a.embedding, b.embedding), max_abs_diff(a.logits, b.logits));
}

tl::Encoding alone(tl::TorchLane& lane, const tl::TokenizedText& r) {
  std::vector<tl::Encoding> out(1);
  tl::encode_batch(lane.module(), std::span(&r, 1), out, lane.scratch());
  return out[0];
}

std::string words(std::size_t n) {
  static const char* const w[] = {"clean",  "room", "rude", "staff",
                                  "lovely", "view", "slow", "service"};
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += std::string(w[(i * 5 + n) % 8]) + " ";
  return s;
}

}  // namespace

TEST_CASE("a request alone and inside a padded batch with longer neighbours agree to 1e-5") {
  tl::TorchLanes lanes(1, weights_file());
  tl::TorchLane& lane = lanes.lane(0);
  const tl::TextTokenizer tokenize(lane.module()->config);
  const auto max_len = static_cast<std::size_t>(lane.module()->config.max_tokens);
  for (std::size_t len : {0UL, 1UL, 3UL, 7UL, 20UL}) {
    const tl::TokenizedText r = tokenize(words(len));
    REQUIRE(r.ids.size() == len + 1);  // [CLS] and the words
    const tl::Encoding a = alone(lane, r);
    // The request between two longer ones (one of the model's full length), and last.
    std::vector<tl::TokenizedText> batch = {tokenize(words(30)), r, tokenize(words(max_len + 10)),
                                            tokenize("x y"), r};
    REQUIRE(batch[2].ids.size() == max_len);
    std::vector<tl::Encoding> out(batch.size());
    tl::encode_batch(lane.module(), batch, out, lane.scratch());
    INFO("request of " << r.ids.size() << " tokens in a batch padded to " << max_len);
    CHECK(max_abs_diff(a, out[1]) <= 1e-5F);
    CHECK(max_abs_diff(a, out[4]) <= 1e-5F);
    CHECK(a.embedding.size() == 64);
    CHECK(a.logits.size() == 3);
    CHECK(out[1].label == a.label);
  }
}

TEST_CASE(
    "through the Pipeline, a request batched with longer neighbours gets what it gets alone") {
  tl::TorchLanes lanes(1, weights_file());
  const tl::TextTokenizer tokenize(lanes.lane(0).module()->config);
  std::vector<tl::TokenizedText> reqs;
  for (std::size_t len : {2UL, 9UL, 5UL, 30UL, 1UL, 14UL})
    reqs.push_back(tokenize(words(len), len));
  std::vector<tl::Encoding> expected;
  for (const auto& r : reqs) expected.push_back(alone(lanes.lane(0), r));

  // One bucket for every length and a long window: all six leave in one padded batch.
  std::vector<std::size_t> sizes;
  std::mutex mu;
  tl::EncoderPipeline pipeline(
      [&](std::span<const tl::TokenizedText> in, std::span<tl::Encoding> out, tl::TorchLane& lane) {
        {
          std::lock_guard lock(mu);
          sizes.push_back(in.size());
        }
        tl::EncoderModel{}(in, out, lane);
      },
      tailbatch::TokenBudget(
          {.budget = 4096, .max_batch = 6, .max_wait = 10s, .bucket_bounds = {64}}),
      tl::encoder_pipeline_config(), lanes);
  std::vector<std::future<tailbatch::Outcome<tl::Encoding>>> f;
  for (const auto& r : reqs) f.push_back(pipeline.submit(r));
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto o = f[i].get();
    REQUIRE(o.ok());
    CHECK(o.value().id == reqs[i].id);
    CHECK(max_abs_diff(o.value(), expected[i]) <= 1e-5F);
  }
  std::lock_guard lock(mu);
  CHECK(sizes == std::vector<std::size_t>{6});
}

TEST_CASE("every request gets its own row back, in order, exactly once") {
  constexpr std::size_t n = 600;
  tl::TorchLanes lanes(2, weights_file());
  const tl::TextTokenizer tokenize(lanes.lane(0).module()->config);
  const std::vector<std::string> texts = tl::sample_texts(n, 99);
  std::vector<tl::TokenizedText> reqs;
  for (std::size_t i = 0; i < n; ++i) reqs.push_back(tokenize(texts[i], i));
  std::vector<tl::Encoding> expected;
  for (const auto& r : reqs) expected.push_back(alone(lanes.lane(0), r));

  SECTION("one batch, called directly: row i is request i") {
    std::vector<tl::Encoding> out(64);
    tl::encode_batch(lanes.lane(1).module(), std::span(reqs.data(), 64), out,
                     lanes.lane(1).scratch());
    for (std::size_t i = 0; i < 64; ++i) {
      CHECK(out[i].id == i);
      CHECK(max_abs_diff(out[i], expected[i]) <= 1e-5F);
    }
  }

  SECTION("through a Pipeline on two lanes, from three threads") {
    tl::set_intra_op_threads(2, 1);
    std::mutex mu;
    std::map<std::uint64_t, int> seen_by_model;
    std::vector<std::atomic<int>> completions(n);
    std::vector<tl::Encoding> got(n);
    std::atomic<std::size_t> bad{0};
    {
      tl::EncoderPipeline pipeline(
          [&](std::span<const tl::TokenizedText> in, std::span<tl::Encoding> out,
              tl::TorchLane& lane) {
            {
              std::lock_guard lock(mu);
              for (const auto& r : in) ++seen_by_model[r.id];
            }
            tl::EncoderModel{}(in, out, lane);
          },
          tl::encoder_policy(32, 1ms), tl::encoder_pipeline_config(), lanes);
      std::vector<std::thread> clients;
      for (std::size_t c = 0; c < 3; ++c) {
        clients.emplace_back([&, c] {
          for (std::size_t i = c; i < n; i += 3) {
            pipeline.submit(reqs[i], [&, i](tailbatch::Outcome<tl::Encoding>&& o) {
              if (!o.ok()) {
                bad.fetch_add(1);
              } else {
                got[i] = std::move(o).value();
              }
              completions[i].fetch_add(1);
            });
          }
        });
      }
      for (auto& t : clients) t.join();
      pipeline.shutdown();  // drains: every callback has run when it returns
    }
    CHECK(bad.load() == 0);
    CHECK(seen_by_model.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      INFO("request " << i);
      CHECK(completions[i].load() == 1);
      CHECK(seen_by_model[i] == 1);
      CHECK(got[i].id == i);
      CHECK(max_abs_diff(got[i], expected[i]) <= 1e-5F);
    }
  }
}

TEST_CASE("a missing or corrupt weights file fails with a clear error") {
  const auto dir = weights_file().parent_path();
  SECTION("missing") {
    const auto p = dir / "no_such_weights.pt";
    CHECK_THROWS_MATCHES(tl::load_encoder(p), std::runtime_error,
                         MessageContains("libtorch encoder: cannot load weights from '" +
                                         p.string() + "': no such file"));
    CHECK_THROWS_MATCHES(tl::TorchLanes(1, p), std::runtime_error, MessageContains("no such file"));
  }
  SECTION("truncated") {
    const auto p = dir / "truncated.pt";
    std::ifstream in(weights_file(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(p, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    CHECK_THROWS_MATCHES(tl::load_encoder(p), std::runtime_error,
                         MessageContains("cannot load weights from '" + p.string() +
                                         "': not a weights file written by torch::save"));
  }
  SECTION("not an archive at all") {
    const auto p = dir / "garbage.pt";
    std::ofstream(p, std::ios::binary) << std::string(4096, '\x5a');
    CHECK_THROWS_MATCHES(tl::load_encoder(p), std::runtime_error,
                         MessageContains("not a weights file written by torch::save"));
  }
  SECTION("an archive of another module") {
    const auto p = dir / "other.pt";
    torch::save(torch::nn::Linear(4, 2), p.string());
    CHECK_THROWS_MATCHES(tl::load_encoder(p), std::runtime_error,
                         MessageContains("no encoder config in the archive"));
  }
  SECTION("the file's weights are loaded, not fresh ones") {
    const tl::Encoder a = tl::load_encoder(weights_file());
    const tl::Encoder b = tl::make_encoder(tl::EncoderConfig{}, 7);
    const tl::Encoder c = tl::make_encoder(tl::EncoderConfig{}, 8);
    const auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
    REQUIRE(pa.size() == pb.size());
    bool same_seed_equal = true, other_seed_differs = false;
    for (std::size_t i = 0; i < pa.size(); ++i) {
      same_seed_equal = same_seed_equal && torch::equal(pa[i], pb[i]);
      other_seed_differs = other_seed_differs || !torch::equal(pa[i], pc[i]);
    }
    CHECK(same_seed_equal);
    CHECK(other_seed_differs);
  }
}

TEST_CASE("the threads helper sets libtorch's intra-op threads and warns when they oversubscribe") {
  std::vector<std::string> lines;
  auto log = [&](std::string_view l) { lines.emplace_back(l); };
  const tl::ThreadPlan a = tl::set_intra_op_threads(2, 0, 4, log);
  CHECK(a.threads_per_lane == 2);
  CHECK(torch::get_num_threads() == 2);
  CHECK_FALSE(a.oversubscribed());
  CHECK(lines.empty());
  const tl::ThreadPlan b = tl::set_intra_op_threads(2, 2, 2, log);
  CHECK(b.oversubscribed());
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] ==
        "libtorch: 2 lanes x 2 intra-op threads = 4 threads on 2 cores: oversubscribed; use at "
        "most 1 "
        "thread(s) per lane, or fewer lanes");
  const tl::ThreadPlan c = tl::set_intra_op_threads(3, 0, 2, log);
  CHECK(c.threads_per_lane == 1);
  CHECK(c.oversubscribed());
  CHECK(lines.size() == 2);
  tl::set_intra_op_threads(1, 1, 2);
  CHECK(torch::get_num_threads() == 1);
}

TEST_CASE("warmup runs the encoder's batch sizes on its lanes and marks it ready") {
  tl::TorchLanes lanes(2, weights_file());
  const tl::TextTokenizer tokenize(lanes.lane(0).module()->config);
  std::vector<tl::TokenizedText> samples;
  for (const auto& t : tl::sample_texts(16)) samples.push_back(tokenize(t));
  std::mutex mu;
  std::set<std::size_t> lanes_used;
  tl::EncoderPipeline pipeline(
      [&](std::span<const tl::TokenizedText> in, std::span<tl::Encoding> out, tl::TorchLane& lane) {
        {
          std::lock_guard lock(mu);
          lanes_used.insert(lane.index());
        }
        tl::EncoderModel{}(in, out, lane);
      },
      tl::encoder_policy(8), tl::encoder_pipeline_config(), lanes);
  tailbatch::Readiness ready;
  const tailbatch::WarmupReport r = tailbatch::warmup(
      pipeline, std::span<const tl::TokenizedText>(samples), {.readiness = &ready});
  CHECK(r.ok());
  CHECK(ready.is_ready());
  CHECK(r.sizes == std::vector<std::size_t>{1, 2, 4, 8});
  CHECK(r.completed_ok == r.requests);
  std::lock_guard lock(mu);
  CHECK(!lanes_used.empty());
}

TEST_CASE("batching off (max_batch 1) still runs a request of the model's full length") {
  tl::TorchLanes lanes(1, weights_file());
  const tl::TextTokenizer tokenize(lanes.lane(0).module()->config);
  tl::EncoderPipeline pipeline(tl::EncoderModel{}, tl::encoder_policy(1, 0ms),
                               tl::encoder_pipeline_config(), lanes);
  const tl::TokenizedText longest = tokenize(words(100));
  REQUIRE(longest.ids.size() == 64);
  auto o = pipeline.submit(longest).get();
  CHECK(o.ok());
}
