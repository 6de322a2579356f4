// tailbatch/metrics.hpp: the registry's kinds, labels, validation and escaping, the exact
// Prometheus text it writes, its JSON, callback gauges, concurrent updates (exact totals,
// run under TSan in CI).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tailbatch/metrics.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::Labels;
using tailbatch::MetricsRegistry;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const auto end = text.find('\n', start);
    REQUIRE(end != std::string::npos);  // every line ends in a newline
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// The value of the sample line that starts with `prefix` (name and labels), parsed the
// way Prometheus parses it.
double sample_value(const std::string& text, const std::string& prefix) {
  for (const auto& line : lines_of(text)) {
    if (line.rfind(prefix + " ", 0) == 0) {
      const std::string v = line.substr(prefix.size() + 1);
      if (v == "NaN") return std::nan("");
      if (v == "+Inf") return INFINITY;
      if (v == "-Inf") return -INFINITY;
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      REQUIRE(*end == '\0');
      return d;
    }
  }
  FAIL("no sample line starts with " << prefix);
  return 0.0;
}

// A minimal strict JSON parser: enough to prove json() is valid JSON and to walk it.
struct Json {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::string> keys;  // an object's keys, in order; values in `array`

  const Json& operator[](std::string_view key) const {
    REQUIRE(kind == Kind::object);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return array[i];
    }
    FAIL("no key " << key);
    return *this;
  }
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}

  Json parse_document() {
    Json v = parse_value();
    skip_ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) {
    throw std::runtime_error(std::string("JSON: ") + what + " at offset " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  char peek() {
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail("unexpected character");
    ++i_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }
  Json parse_value() {
    skip_ws();
    Json v;
    const char c = peek();
    if (c == '{' || c == '[') {
      // An object's members are kept as parallel keys and values.
      const bool object = c == '{';
      const char close = object ? '}' : ']';
      v.kind = object ? Json::Kind::object : Json::Kind::array;
      ++i_;
      skip_ws();
      if (peek() == close) {
        ++i_;
        return v;
      }
      for (;;) {
        if (object) {
          skip_ws();
          std::string key = parse_string();
          skip_ws();
          expect(':');
          v.keys.push_back(std::move(key));
        }
        v.array.push_back(parse_value());
        skip_ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(close);
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::string;
      v.string = parse_string();
      return v;
    }
    if (literal("null")) return v;
    if (literal("true") || literal("false")) {
      v.kind = Json::Kind::boolean;
      v.boolean = s_[i_ - 1] == 'e' && s_[i_ - 2] == 'u';
      return v;
    }
    v.kind = Json::Kind::number;
    v.number = parse_number();
    return v;
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      const char c = peek();
      ++i_;
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      ++i_;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          if (s_.size() - i_ < 4) fail("short \\u escape");
          const unsigned cp =
              static_cast<unsigned>(std::stoul(std::string(s_.substr(i_, 4)), nullptr, 16));
          i_ += 4;
          if (cp >= 0x80) fail("test parser handles \\u escapes below 0x80 only");
          out += static_cast<char>(cp);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }
  double parse_number() {
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == d) fail("digits expected");
    };
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (peek() == '0') {
      ++i_;
    } else {
      digits();
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      digits();
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      digits();
    }
    return std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

Json parse_json(const std::string& text) { return JsonParser(text).parse_document(); }

}  // namespace

TEST_CASE("counters and gauges are exposed in the exact 0.0.4 text format", "[metrics]") {
  MetricsRegistry r;
  auto& ok =
      r.counter("tailbatch_requests_total", "Requests completed, by status.", {{"status", "ok"}});
  auto& rejected = r.counter("tailbatch_requests_total", "Requests completed, by status.",
                             {{"status", "rejected"}});
  auto& depth = r.gauge("tailbatch_queue_depth", "Requests waiting in the queue.");
  auto& rate = r.gauge("tailbatch_tokens_per_second", "Generated tokens per second.");
  ok.inc(3);
  rejected.inc();
  depth.set(5);
  depth.add(2);
  depth.add(-1);
  rate.set(1234.5);

  CHECK(ok.value() == 3);
  CHECK(rejected.value() == 1);
  CHECK(depth.value() == 6.0);
  CHECK(r.prometheus() ==
        "# HELP tailbatch_queue_depth Requests waiting in the queue.\n"
        "# TYPE tailbatch_queue_depth gauge\n"
        "tailbatch_queue_depth 6\n"
        "# HELP tailbatch_requests_total Requests completed, by status.\n"
        "# TYPE tailbatch_requests_total counter\n"
        "tailbatch_requests_total{status=\"ok\"} 3\n"
        "tailbatch_requests_total{status=\"rejected\"} 1\n"
        "# HELP tailbatch_tokens_per_second Generated tokens per second.\n"
        "# TYPE tailbatch_tokens_per_second gauge\n"
        "tailbatch_tokens_per_second 1234.5\n");
}

TEST_CASE("an empty registry exposes nothing", "[metrics]") {
  MetricsRegistry r;
  CHECK(r.prometheus().empty());
  CHECK(r.json() == "{\"families\":[]}");
}

TEST_CASE("gauge values use Prometheus' spelling of special and large values", "[metrics]") {
  MetricsRegistry r;
  r.gauge("g", "h", {{"v", "a_nan"}}).set(std::nan(""));
  r.gauge("g", "h", {{"v", "b_pinf"}}).set(INFINITY);
  r.gauge("g", "h", {{"v", "c_ninf"}}).set(-INFINITY);
  r.gauge("g", "h", {{"v", "d_big"}}).set(1e6);
  r.gauge("g", "h", {{"v", "e_small"}}).set(0.000125);
  r.gauge("g", "h", {{"v", "f_neg"}}).set(-2.5);
  CHECK(r.prometheus() ==
        "# HELP g h\n# TYPE g gauge\n"
        "g{v=\"a_nan\"} NaN\n"
        "g{v=\"b_pinf\"} +Inf\n"
        "g{v=\"c_ninf\"} -Inf\n"
        "g{v=\"d_big\"} 1e+06\n"
        "g{v=\"e_small\"} 0.000125\n"
        "g{v=\"f_neg\"} -2.5\n");
}

TEST_CASE("label values and help text are escaped", "[metrics]") {
  MetricsRegistry r;
  r.counter("tailbatch_odd_total", "Backslash \\ newline\nand \"quotes\" stay.",
            {{"path", "C:\\dir\\\"q\"\nnext"}, {"unicode", "caf\xc3\xa9"}})
      .inc(7);
  CHECK(r.prometheus() ==
        "# HELP tailbatch_odd_total Backslash \\\\ newline\\nand \"quotes\" stay.\n"
        "# TYPE tailbatch_odd_total counter\n"
        "tailbatch_odd_total{path=\"C:\\\\dir\\\\\\\"q\\\"\\nnext\",unicode=\"caf\xc3\xa9\"} 7\n");

  const Json doc = parse_json(r.json());
  const Json& fam = doc["families"].array.at(0);
  CHECK(fam["help"].string == "Backslash \\ newline\nand \"quotes\" stay.");
  CHECK(fam["samples"].array.at(0)["labels"]["path"].string == "C:\\dir\\\"q\"\nnext");
  CHECK(fam["samples"].array.at(0)["labels"]["unicode"].string == "caf\xc3\xa9");
}

TEST_CASE("labels are sorted by name and their order does not name a new series", "[metrics]") {
  MetricsRegistry r;
  auto& a = r.counter("c_total", "h", {{"zone", "b"}, {"app", "x"}});
  auto& b = r.counter("c_total", "h", {{"app", "x"}, {"zone", "b"}});
  auto& other = r.counter("c_total", "h", {{"app", "x"}, {"zone", "a"}});
  CHECK(&a == &b);
  CHECK(&a != &other);
  a.inc(2);
  other.inc(1);
  CHECK(r.prometheus() ==
        "# HELP c_total h\n# TYPE c_total counter\n"
        "c_total{app=\"x\",zone=\"a\"} 1\n"
        "c_total{app=\"x\",zone=\"b\"} 2\n");
  CHECK(tailbatch::join_labels({{"pipeline", "p"}}, {{"reason", "queue_full"}}) ==
        Labels{{"pipeline", "p"}, {"reason", "queue_full"}});
}

TEST_CASE("registering the same (name, labels) returns the same metric", "[metrics]") {
  MetricsRegistry r;
  auto& c1 = r.counter("x_total", "first help");
  auto& c2 = r.counter("x_total", "second help is ignored");
  CHECK(&c1 == &c2);
  auto& g1 = r.gauge("y", "h", {{"k", "v"}});
  auto& g2 = r.gauge("y", "h", {{"k", "v"}});
  CHECK(&g1 == &g2);
  auto& h1 = r.histogram("z_seconds", "h");
  auto& h2 = r.histogram("z_seconds", "h");
  CHECK(&h1 == &h2);
  c1.inc();
  CHECK(contains(r.prometheus(), "# HELP x_total first help\n"));

  tailbatch::LatencyHistogramConfig precise;
  precise.significant_digits = 3;
  CHECK_THROWS_MATCHES((void)r.histogram("z_seconds", "h", {}, precise), std::invalid_argument,
                       MessageContains("z_seconds") && MessageContains("different LatencyHistogramConfig"));
  auto& p1 = r.histogram("p_seconds", "h", {}, precise);
  auto& p2 = r.histogram("p_seconds", "h", {}, precise);
  CHECK(&p1 == &p2);
}

TEST_CASE("the same name with another kind throws, naming both kinds", "[metrics]") {
  MetricsRegistry r;
  (void)r.gauge("tailbatch_depth", "h");
  CHECK_THROWS_MATCHES((void)r.histogram("tailbatch_depth", "h"), std::invalid_argument,
                       MessageContains("tailbatch_depth") && MessageContains("already registered as a gauge") && MessageContains("histogram"));

  (void)r.histogram("tailbatch_wait_seconds", "h");
  CHECK_THROWS_MATCHES((void)r.gauge("tailbatch_wait_seconds", "h", {{"a", "b"}}), std::invalid_argument,
                       MessageContains("already registered as a histogram"));
  CHECK_THROWS_MATCHES(([&] { (void)r.gauge_callback("tailbatch_wait_seconds", "h", {}, [] { return 1.0; }); }()), std::invalid_argument,
                       MessageContains("already registered as a histogram"));
}

TEST_CASE("invalid names, labels and help are rejected and change nothing", "[metrics]") {
  MetricsRegistry r;
  r.counter("kept_total", "h").inc();
  const std::string before = r.prometheus();

  struct Case {
    std::function<void()> call;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {[&] { (void)r.counter("requests", "h"); }, "must end in _total"},
      {[&] { (void)r.histogram("wait_total", "h"); }, "reserved for counters"},
      {[&] { (void)r.histogram("x_bucket", "h"); }, "_sum, _count or _bucket"},
      {[&] { (void)r.gauge("g", ""); }, "non-empty help"},
      {[&] { (void)r.gauge("g", "bad \xff utf-8"); }, "help text that is not valid UTF-8"},
      {[&] {
         (void)r.histogram("s_seconds", "h", {{"quantile", "0.5"}});
       },
       "label name \"quantile\" is reserved for the buckets (le) and quantiles (quantile)"},
      {[&] {
         (void)r.windowed_histogram("s_seconds", "h", {{"le", "1"}}, 60s);
       },
       "label name \"le\" is reserved"},
      {[&] { (void)r.gauge_callback("cb", "h", {}, {}); }, "fn is empty"},
      {[&] {
         tailbatch::LatencyHistogramConfig bad;
         bad.significant_digits = 0;
         (void)r.histogram("bad_seconds", "h", {}, bad);
       },
       ""},
  };
  for (const auto& c : cases) {
    CHECK_THROWS_MATCHES((c.call()), std::invalid_argument,
                       MessageContains(c.expected));
  }
  // Gauge names that are refused, and what the message says.
  const std::vector<std::pair<std::string, const char*>> bad_names = {
      {"", "not a valid metric name"},
      {"1abc", "not a valid metric name"},
      {"a-b", "not a valid metric name"},
      {"a b", "not a valid metric name"},
      {"job:rate", "colons are reserved"},
      {"depth_total", "reserved for counters"},
      {"x_sum", "_sum, _count or _bucket"},
      {"x_count", "_sum, _count or _bucket"},
  };
  for (const auto& [name, expected] : bad_names) {
    CHECK_THROWS_MATCHES((void)r.gauge(name, "h"), std::invalid_argument,
                         MessageContains(expected));
  }
  // A gauge's label sets that are refused, and what the message says.
  const std::vector<std::pair<tailbatch::Labels, const char*>> bad_labels = {
      {{{"1a", "v"}}, "label name \"1a\""},
      {{{"a-b", "v"}}, "label name \"a-b\""},
      {{{"", "v"}}, "label name \"\""},
      {{{"__name__", "v"}}, "reserved"},
      {{{"a", "1"}, {"a", "2"}}, "twice"},
      {{{"a", "\xc0\xaf"}}, "not valid UTF-8"},  // overlong '/'
      {{{"a", "\xed\xa0\x80"}}, "not valid UTF-8"},  // surrogate
      {{{"a", "\xe2\x82"}}, "not valid UTF-8"},  // truncated
  };
  for (const auto& [labels, expected] : bad_labels) {
    CHECK_THROWS_MATCHES((void)r.gauge("g", "h", labels), std::invalid_argument,
                         MessageContains(expected));
  }
  CHECK(r.prometheus() == before);
  // `le` and `quantile` labels are fine outside histograms, a name may start with an underscore.
  CHECK_NOTHROW(r.gauge("_private", "h", {{"quantile", "x"}, {"le", "y"}, {"_a", ""}}));
}

TEST_CASE("with LatencyExport::summary, histograms are exposed as summaries in seconds", "[metrics]") {
  MetricsRegistry r(tailbatch::MetricsRegistryConfig{.latency_export = tailbatch::LatencyExport::summary});
  auto& h =
      r.histogram("tailbatch_end_to_end_seconds", "End-to-end latency.", {{"pipeline", "p1"}});

  SECTION("empty: NaN quantiles, zero sum and count, exact text") {
    CHECK(r.prometheus() ==
          "# HELP tailbatch_end_to_end_seconds End-to-end latency.\n"
          "# TYPE tailbatch_end_to_end_seconds summary\n"
          "tailbatch_end_to_end_seconds{pipeline=\"p1\",quantile=\"0.5\"} NaN\n"
          "tailbatch_end_to_end_seconds{pipeline=\"p1\",quantile=\"0.9\"} NaN\n"
          "tailbatch_end_to_end_seconds{pipeline=\"p1\",quantile=\"0.95\"} NaN\n"
          "tailbatch_end_to_end_seconds{pipeline=\"p1\",quantile=\"0.99\"} NaN\n"
          "tailbatch_end_to_end_seconds{pipeline=\"p1\",quantile=\"0.999\"} NaN\n"
          "tailbatch_end_to_end_seconds_sum{pipeline=\"p1\"} 0\n"
          "tailbatch_end_to_end_seconds_count{pipeline=\"p1\"} 0\n");
  }

  SECTION("1..1000 ms: quantiles within the histogram's 1 %, exact count and sum") {
    for (int ms = 1; ms <= 1000; ++ms) h.record(std::chrono::milliseconds(ms));
    const std::string text = r.prometheus();
    const auto lines = lines_of(text);
    REQUIRE(lines.size() == 9);
    CHECK(lines[0] == "# HELP tailbatch_end_to_end_seconds End-to-end latency.");
    CHECK(lines[1] == "# TYPE tailbatch_end_to_end_seconds summary");
    const std::vector<std::pair<const char*, double>> expected = {
        {"0.5", 0.5}, {"0.9", 0.9}, {"0.95", 0.95}, {"0.99", 0.99}, {"0.999", 0.999}};
    for (const auto& [q, seconds] : expected) {
      const double v = sample_value(
          text,
          std::string("tailbatch_end_to_end_seconds{pipeline=\"p1\",quantile=\"") + q + "\"}");
      INFO("quantile " << q << " = " << v);
      // Rank definitions differ by one sample (1 ms) at most; the histogram adds 1 %.
      CHECK(std::fabs(v - seconds) <= 0.011 * seconds + 0.001);
    }
    CHECK(sample_value(text, "tailbatch_end_to_end_seconds_count{pipeline=\"p1\"}") == 1000.0);
    CHECK(sample_value(text, "tailbatch_end_to_end_seconds_sum{pipeline=\"p1\"}") ==
          Approx(500.5).epsilon(1e-9));
  }
}

TEST_CASE("callback gauges are read at exposition and removed by their handle", "[metrics]") {
  MetricsRegistry r;
  std::atomic<int> depth{4};
  std::atomic<int> calls{0};
  auto& plain = r.gauge("tailbatch_queue_depth", "Requests waiting.", {{"pipeline", "a"}});
  plain.set(1);
  {
    auto reg =
        r.gauge_callback("tailbatch_queue_depth", "Requests waiting.", {{"pipeline", "b"}}, [&] {
          calls.fetch_add(1);
          return static_cast<double>(depth.load());
        });
    CHECK(static_cast<bool>(reg));
    CHECK(r.prometheus() ==
          "# HELP tailbatch_queue_depth Requests waiting.\n"
          "# TYPE tailbatch_queue_depth gauge\n"
          "tailbatch_queue_depth{pipeline=\"a\"} 1\n"
          "tailbatch_queue_depth{pipeline=\"b\"} 4\n");
    depth = 9;
    CHECK(sample_value(r.prometheus(), "tailbatch_queue_depth{pipeline=\"b\"}") == 9.0);
    CHECK(calls.load() == 2);

    // A second callback or a plain gauge on the same series is refused.
    CHECK_THROWS_MATCHES(([&] {
      (void)r.gauge_callback("tailbatch_queue_depth", "h", {{"pipeline", "b"}}, [] { return 0.0; });
    }()), std::invalid_argument,
                       MessageContains("already registered"));
    CHECK_THROWS_MATCHES((void)r.gauge("tailbatch_queue_depth", "h", {{"pipeline", "b"}}), std::invalid_argument,
                       MessageContains("callback gauge"));
    CHECK_THROWS_MATCHES(([&] {
      (void)r.gauge_callback("tailbatch_queue_depth", "h", {{"pipeline", "a"}}, [] { return 0.0; });
    }()), std::invalid_argument,
                       MessageContains("already registered"));
  }
  // The handle is gone: the series is gone and the callback is never called again.
  const int calls_before = calls.load();
  CHECK(r.prometheus() ==
        "# HELP tailbatch_queue_depth Requests waiting.\n"
        "# TYPE tailbatch_queue_depth gauge\n"
        "tailbatch_queue_depth{pipeline=\"a\"} 1\n");
  CHECK(calls.load() == calls_before);

  SECTION("a family of callbacks only disappears with its last callback, and comes back") {
    auto in_flight = r.gauge_callback("tailbatch_in_flight", "In flight.", {}, [] { return 2.0; });
    CHECK(contains(r.prometheus(), "tailbatch_in_flight 2\n"));
    in_flight.reset();
    CHECK(!in_flight);
    CHECK(!contains(r.prometheus(), "tailbatch_in_flight"));
    // With the family gone the name is free again, even for another kind.
    (void)r.histogram("tailbatch_in_flight", "Now a histogram.");
    CHECK(contains(r.prometheus(), "# TYPE tailbatch_in_flight histogram\n"));
  }

  SECTION("handles move; the moved-from handle unregisters nothing") {
    tailbatch::CallbackRegistration outer;
    CHECK(!outer);
    {
      auto inner = r.gauge_callback("tailbatch_moved", "h", {}, [] { return 3.0; });
      outer = std::move(inner);
      CHECK(!inner);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    }
    CHECK(contains(r.prometheus(), "tailbatch_moved 3\n"));
    tailbatch::CallbackRegistration other = std::move(outer);
    CHECK(contains(r.prometheus(), "tailbatch_moved 3\n"));
    // Move-assigning over a live handle unregisters what it held.
    other = r.gauge_callback("tailbatch_moved_again", "h", {}, [] { return 4.0; });
    CHECK(!contains(r.prometheus(), "tailbatch_moved 3\n"));
    CHECK(contains(r.prometheus(), "tailbatch_moved_again 4\n"));
  }

  SECTION("a callback that throws reads NaN (null in JSON) and the scrape goes on") {
    auto bad = r.gauge_callback("tailbatch_broken", "h", {},
                                []() -> double { throw std::runtime_error("backend gone"); });
    const std::string text = r.prometheus();
    CHECK(contains(text, "tailbatch_broken NaN\n"));
    CHECK(contains(text, "tailbatch_queue_depth{pipeline=\"a\"} 1\n"));
    const Json doc = parse_json(r.json());
    bool found = false;
    for (const auto& fam : doc["families"].array) {
      if (fam["name"].string == "tailbatch_broken") {
        found = true;
        CHECK(fam["samples"].array.at(0)["value"].kind == Json::Kind::null);
      }
    }
    CHECK(found);
  }
}

TEST_CASE("a callback handle may outlive its registry", "[metrics]") {
  tailbatch::CallbackRegistration reg;
  {
    MetricsRegistry r;
    reg = r.gauge_callback("g", "h", {}, [] { return 1.0; });
  }
  CHECK(static_cast<bool>(reg));
  reg.reset();  // the registry is gone: nothing to do, nothing to crash
  CHECK(!reg);
}

TEST_CASE("the callback's captures are destroyed outside the registry's lock", "[metrics]") {
  // A capture whose destructor uses the registry would deadlock if it ran under the lock.
  MetricsRegistry r;
  struct UsesRegistryOnDestruction {
    MetricsRegistry* registry = nullptr;
    ~UsesRegistryOnDestruction() {
      if (registry != nullptr) registry->counter("destroyed_total", "h").inc();
    }
  };
  auto capture = std::make_shared<UsesRegistryOnDestruction>();
  capture->registry = &r;
  auto reg = r.gauge_callback("g", "h", {}, [capture] { return 1.0; });
  capture.reset();
  reg.reset();
  CHECK(r.counter("destroyed_total", "h").value() == 1);
}

TEST_CASE("json() is valid JSON with the same content as the text format", "[metrics]") {
  MetricsRegistry r;
  r.counter("tailbatch_rejected_total", "Rejections by reason.", {{"reason", "queue_full"}}).inc(2);
  r.counter("tailbatch_rejected_total", "Rejections by reason.", {{"reason", "overloaded"}}).inc(5);
  r.gauge("tailbatch_batch_size", "Last batch size.").set(16);
  auto& h = r.histogram("tailbatch_model_seconds", "Model time.\nPer batch.");
  for (int i = 0; i < 100; ++i) h.record(10ms);
  auto reg = r.gauge_callback("tailbatch_in_flight", "In flight.", {{"pipeline", "p"}},
                              [] { return 0.25; });

  const std::string text = r.json();
  const Json doc = parse_json(text);
  const auto& families = doc["families"].array;
  REQUIRE(families.size() == 4);
  // Sorted by name, as in the text format.
  CHECK(families[0]["name"].string == "tailbatch_batch_size");
  CHECK(families[1]["name"].string == "tailbatch_in_flight");
  CHECK(families[2]["name"].string == "tailbatch_model_seconds");
  CHECK(families[3]["name"].string == "tailbatch_rejected_total");

  CHECK(families[0]["type"].string == "gauge");
  CHECK(families[0]["samples"].array.at(0)["value"].number == 16.0);
  CHECK(families[0]["samples"].array.at(0)["labels"].keys.empty());

  CHECK(families[1]["samples"].array.at(0)["labels"]["pipeline"].string == "p");
  CHECK(families[1]["samples"].array.at(0)["value"].number == 0.25);

  const Json& histogram = families[2];
  CHECK(histogram["type"].string == "histogram");
  CHECK(histogram["help"].string == "Model time.\nPer batch.");
  const Json& s = histogram["samples"].array.at(0);
  CHECK(s["count"].number == 100.0);
  CHECK(s["sum"].number == Approx(1.0).epsilon(1e-9));
  // The buckets as in the text format: every `le` bound, cumulative, then +Inf.
  const Json& buckets = s["buckets"];
  const auto bounds = r.exported_buckets().upper_bounds_seconds;
  REQUIRE(buckets.keys.size() == bounds.size() + 1);
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    CHECK(std::strtod(buckets.keys[i].c_str(), nullptr) == bounds[i]);
    CHECK(buckets.array[i].number == (bounds[i] > 0.010 ? 100.0 : 0.0));
  }
  CHECK(buckets.keys.back() == "+Inf");
  CHECK(buckets.array.back().number == 100.0);
  const Json& quantiles = s["quantiles"];
  REQUIRE(quantiles.keys.size() == 5);
  const char* names[] = {"0.5", "0.9", "0.95", "0.99", "0.999"};
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(quantiles.keys[i] == names[i]);
    CHECK(quantiles.array[i].number == Approx(0.010).epsilon(0.01));
  }

  const Json& rejected = families[3];
  CHECK(rejected["type"].string == "counter");
  REQUIRE(rejected["samples"].array.size() == 2);
  CHECK(rejected["samples"].array[0]["labels"]["reason"].string == "overloaded");
  CHECK(rejected["samples"].array[0]["value"].number == 5.0);
  CHECK(rejected["samples"].array[1]["labels"]["reason"].string == "queue_full");
  CHECK(rejected["samples"].array[1]["value"].number == 2.0);

  // Control characters are escaped, never written raw.
  r.gauge("tailbatch_ctl", "tab\there", {{"v", std::string("nul\x01") + "\x1f"}}).set(1);
  const Json again = parse_json(r.json());
  bool found = false;
  for (const auto& fam : again["families"].array) {
    if (fam["name"].string == "tailbatch_ctl") {
      found = true;
      CHECK(fam["help"].string == "tab\there");
      CHECK(fam["samples"].array.at(0)["labels"]["v"].string == std::string("nul\x01") + "\x1f");
    }
  }
  CHECK(found);
  CHECK(contains(r.json(), "\\u0001"));
}

TEST_CASE("concurrent updates, registrations and scrapes give exact totals", "[metrics][threads]") {
  const int per_thread = 50000 / tailbatch::test::sanitizer_slowdown;
  for (const int threads : {1, 2, 3, 7, 16}) {
    INFO(threads << " threads");
    MetricsRegistry r;
    std::atomic<bool> stop{false};
    std::atomic<int> ready{0};
    std::atomic<int> malformed{0};  // Catch2 assertions are not thread-safe: count, check later

    // A scraper and a thread that keeps registering and dropping a callback gauge run
    // alongside the writers.
    std::thread scraper([&] {
      while (!stop.load()) {
        const std::string text = r.prometheus();
        const std::string json = r.json();
        if (!(text.empty() || text.back() == '\n') || json.back() != '}') malformed.fetch_add(1);
      }
    });
    std::thread churn([&] {
      int i = 0;
      while (!stop.load()) {
        auto reg = r.gauge_callback("tailbatch_churn", "h", {{"i", std::to_string(i++ % 4)}},
                                    [&ready] { return static_cast<double>(ready.load()); });
      }
    });

    on_threads(threads, [&](int t) {
      // Every writer registers the same series: all must get the same objects.
      auto& requests = r.counter("tailbatch_requests_total", "h", {{"status", "ok"}});
      auto& mine = r.counter("tailbatch_by_thread_total", "h", {{"thread", std::to_string(t)}});
      auto& in_flight = r.gauge("tailbatch_in_flight", "h");
      auto& level = r.gauge("tailbatch_level", "h");
      auto& latency = r.histogram("tailbatch_latency_seconds", "h");
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      for (int i = 0; i < per_thread; ++i) {
        in_flight.add(1);
        requests.inc();
        mine.inc(2);
        latency.record(std::chrono::microseconds(100 + i % 900));
        in_flight.add(-1);
        level.add(1);
      }
    });
    stop = true;
    scraper.join();
    churn.join();
    CHECK(malformed.load() == 0);

    const auto total = static_cast<std::uint64_t>(threads) * static_cast<std::uint64_t>(per_thread);
    CHECK(r.counter("tailbatch_requests_total", "h", {{"status", "ok"}}).value() == total);
    for (int t = 0; t < threads; ++t) {
      CHECK(r.counter("tailbatch_by_thread_total", "h", {{"thread", std::to_string(t)}}).value() ==
            2u * static_cast<std::uint64_t>(per_thread));
    }
    CHECK(r.gauge("tailbatch_in_flight", "h").value() == 0.0);
    CHECK(r.gauge("tailbatch_level", "h").value() == static_cast<double>(total));
    CHECK(r.histogram("tailbatch_latency_seconds", "h").snapshot().count() == total);
    const std::string text = r.prometheus();
    CHECK(sample_value(text, "tailbatch_requests_total{status=\"ok\"}") ==
          static_cast<double>(total));
    CHECK(sample_value(text, "tailbatch_latency_seconds_count") == static_cast<double>(total));
    CHECK(!contains(text, "tailbatch_churn"));  // every churned handle unregistered
  }
}

TEST_CASE("windowed histograms as summaries: recent quantiles, cumulative count and sum",
          "[metrics][windowed]") {
  tailbatch::ManualClock clock;
  MetricsRegistry r(tailbatch::MetricsRegistryConfig{.latency_export = tailbatch::LatencyExport::summary});
  auto& w = r.windowed_histogram("tailbatch_end_to_end_seconds", "End-to-end latency.",
                                 {{"pipeline", "p"}}, 60s, 6, {}, clock);
  CHECK(w.window() == 60s);
  CHECK(w.slots() == 6);
  const std::string prefix = "tailbatch_end_to_end_seconds";
  const std::string labels = "{pipeline=\"p\"";

  // Empty: NaN quantiles, zeros.
  CHECK(std::isnan(sample_value(r.prometheus(), prefix + labels + ",quantile=\"0.99\"}")));
  CHECK(sample_value(r.prometheus(), prefix + "_count" + labels + "}") == 0.0);

  for (int i = 0; i < 100; ++i) w.record(10ms);
  std::string text = r.prometheus();
  CHECK(sample_value(text, prefix + labels + ",quantile=\"0.5\"}") == Approx(0.010).epsilon(0.01));
  CHECK(sample_value(text, prefix + "_count" + labels + "}") == 100.0);
  CHECK(sample_value(text, prefix + "_sum" + labels + "}") == Approx(1.0).epsilon(1e-9));

  // Two minutes later the 10 ms samples have left the window; the totals keep them.
  clock.advance(120s);
  for (int i = 0; i < 100; ++i) w.record(50ms);
  text = r.prometheus();
  for (const char* q : {"0.5", "0.9", "0.99", "0.999"}) {
    CHECK(sample_value(text, prefix + labels + ",quantile=\"" + q + "\"}") ==
          Approx(0.050).epsilon(0.01));
  }
  CHECK(sample_value(text, prefix + "_count" + labels + "}") == 200.0);
  CHECK(sample_value(text, prefix + "_sum" + labels + "}") == Approx(6.0).epsilon(1e-9));
  CHECK(w.count() == 200);
  CHECK(w.snapshot().count() == 100);

  const Json doc = parse_json(r.json());
  const Json& sample = doc["families"].array.at(0)["samples"].array.at(0);
  CHECK(sample["count"].number == 200.0);
  CHECK(sample["quantiles"]["0.5"].number == Approx(0.050).epsilon(0.01));

  // Nothing recorded for a whole window: NaN quantiles again, totals unchanged.
  clock.advance(61s);
  text = r.prometheus();
  CHECK(std::isnan(sample_value(text, prefix + labels + ",quantile=\"0.5\"}")));
  CHECK(sample_value(text, prefix + "_count" + labels + "}") == 200.0);
}

TEST_CASE("windowed histograms: duplicate and conflicting registrations", "[metrics][windowed]") {
  tailbatch::ManualClock clock;
  MetricsRegistry r;
  auto& a = r.windowed_histogram("w_seconds", "h", {}, 60s, 6, {}, clock);
  auto& b = r.windowed_histogram("w_seconds", "h", {}, 60s, 6, {}, clock);
  CHECK(&a == &b);

  CHECK_THROWS_MATCHES((void)r.windowed_histogram("w_seconds", "h", {}, 30s, 6, {}, clock), std::invalid_argument,
                       MessageContains("different window"));
  CHECK_THROWS_MATCHES((void)r.windowed_histogram("w_seconds", "h", {}, 60s, 6), std::invalid_argument,
                       MessageContains("another clock type"));
  CHECK_THROWS_MATCHES((void)r.histogram("w_seconds", "h"), std::invalid_argument,
                       MessageContains("windowed histogram"));
  (void)r.histogram("plain_seconds", "h");
  CHECK_THROWS_MATCHES((void)r.windowed_histogram("plain_seconds", "h", {}, 60s), std::invalid_argument,
                       MessageContains("without a window"));
  CHECK_THROWS_MATCHES((void)r.windowed_histogram("bad_seconds", "h", {}, 0s), std::invalid_argument,
                       MessageContains("window"));
  CHECK_THROWS_MATCHES((void)r.windowed_histogram("w_total", "h", {}, 60s), std::invalid_argument,
                       MessageContains("reserved for counters"));
  // A windowed and a cumulative series may share a family: both are summaries.
  CHECK_NOTHROW(r.windowed_histogram("plain_seconds", "h", {{"k", "v"}}, 60s));
}

TEST_CASE("windowed histograms record from many threads with exact totals",
          "[metrics][windowed][threads]") {
  const int per_thread = 20000 / tailbatch::test::sanitizer_slowdown;
  for (const int threads : {1, 2, 3, 7, 16}) {
    INFO(threads << " threads");
    MetricsRegistry r;
    auto& w = r.windowed_histogram("w_seconds", "h", {}, 600s);
    std::atomic<bool> stop{false};
    std::thread scraper([&] {
      while (!stop.load()) (void)r.prometheus();
    });
    std::vector<std::thread> writers;
    for (int t = 0; t < threads; ++t) {
      writers.emplace_back([&] {
        for (int i = 0; i < per_thread; ++i) w.record(1ms);
      });
    }
    for (auto& t : writers) t.join();
    stop = true;
    scraper.join();
    const auto total = static_cast<std::uint64_t>(threads) * static_cast<std::uint64_t>(per_thread);
    CHECK(w.count() == total);
    CHECK(w.sum_seconds() == Approx(static_cast<double>(total) * 1e-3).epsilon(1e-9));
  }
}

// ---- Prometheus histograms ---------------------------------------------------------------

namespace {

// One `_bucket` series as Prometheus reads it: (le, cumulative count), +Inf last.
using Buckets = std::vector<std::pair<double, double>>;

// The `_bucket` lines of `name` whose labels (without le) are exactly `labels`, in order.
Buckets buckets_of(const std::string& text, const std::string& name, const std::string& labels) {
  Buckets out;
  const std::string prefix = name + "_bucket{" + (labels.empty() ? "" : labels + ",") + "le=\"";
  for (const auto& line : lines_of(text)) {
    if (line.rfind(prefix, 0) != 0) continue;
    const auto close = line.find("\"} ", prefix.size());
    REQUIRE(close != std::string::npos);
    const std::string le = line.substr(prefix.size(), close - prefix.size());
    const double bound = le == "+Inf" ? INFINITY : std::strtod(le.c_str(), nullptr);
    out.emplace_back(bound, std::strtod(line.c_str() + close + 3, nullptr));
  }
  return out;
}

// Prometheus' histogram_quantile() over classic buckets (promql/quantile.go, bucketQuantile):
// the bucket where the cumulative count reaches q * total, linear interpolation inside it,
// the lower bound of the first bucket 0, and the +Inf bucket answered by the bound below it.
double histogram_quantile(double q, const Buckets& b) {
  if (b.size() < 2 || !std::isinf(b.back().first)) return std::nan("");
  const double total = b.back().second;
  if (total == 0) return std::nan("");
  double rank = q * total;
  std::size_t i = 0;
  while (i < b.size() - 1 && b[i].second < rank) ++i;
  if (i == b.size() - 1) return b[b.size() - 2].first;
  double start = 0.0;
  double count = b[i].second;
  if (i > 0) {
    start = b[i - 1].first;
    count -= b[i - 1].second;
    rank -= b[i - 1].second;
  }
  return start + (b[i].first - start) * (rank / count);
}

// sum by (le): the buckets of several replicas added up (same bounds).
Buckets sum_by_le(const std::vector<Buckets>& replicas) {
  Buckets out = replicas.at(0);
  for (std::size_t r = 1; r < replicas.size(); ++r) {
    REQUIRE(replicas[r].size() == out.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      REQUIRE(replicas[r][i].first == out[i].first);
      out[i].second += replicas[r][i].second;
    }
  }
  return out;
}

// The exact q-quantile of samples by nearest rank, as LatencyHistogram defines it.
double exact_quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::max<std::size_t>(rank, 1) - 1];
}

}  // namespace

TEST_CASE("histograms are exposed as Prometheus histograms in seconds", "[metrics][buckets]") {
  tailbatch::MetricsRegistryConfig config;
  config.buckets.boundaries_seconds = {0.001, 0.0025, 0.01};
  MetricsRegistry r(config);
  auto& h = r.histogram("tailbatch_end_to_end_seconds", "End-to-end latency.", {{"pipeline", "p1"}});

  SECTION("empty: zero buckets, sum and count, exact text") {
    CHECK(r.prometheus() ==
          "# HELP tailbatch_end_to_end_seconds End-to-end latency.\n"
          "# TYPE tailbatch_end_to_end_seconds histogram\n"
          "tailbatch_end_to_end_seconds_bucket{pipeline=\"p1\",le=\"0.001\"} 0\n"
          "tailbatch_end_to_end_seconds_bucket{pipeline=\"p1\",le=\"0.0025\"} 0\n"
          "tailbatch_end_to_end_seconds_bucket{pipeline=\"p1\",le=\"0.01\"} 0\n"
          "tailbatch_end_to_end_seconds_bucket{pipeline=\"p1\",le=\"+Inf\"} 0\n"
          "tailbatch_end_to_end_seconds_sum{pipeline=\"p1\"} 0\n"
          "tailbatch_end_to_end_seconds_count{pipeline=\"p1\"} 0\n");
  }

  SECTION("cumulative counts below each bound, +Inf equal to _count, exact sum") {
    // 0.5, 0.9 and 2 ms are far from every bound; 20 ms is above the last.
    h.record(500us);
    h.record(900us);
    h.record(2ms);
    h.record(2ms);
    h.record(20ms);
    CHECK(r.prometheus() ==
          "# HELP tailbatch_end_to_end_seconds End-to-end latency.\n"
          "# TYPE tailbatch_end_to_end_seconds histogram\n"
          "tailbatch_end_to_end_seconds_bucket{pipeline=\"p1\",le=\"0.001\"} 2\n"
          "tailbatch_end_to_end_seconds_bucket{pipeline=\"p1\",le=\"0.0025\"} 4\n"
          "tailbatch_end_to_end_seconds_bucket{pipeline=\"p1\",le=\"0.01\"} 4\n"
          "tailbatch_end_to_end_seconds_bucket{pipeline=\"p1\",le=\"+Inf\"} 5\n"
          "tailbatch_end_to_end_seconds_sum{pipeline=\"p1\"} 0.0254\n"
          "tailbatch_end_to_end_seconds_count{pipeline=\"p1\"} 5\n");
  }

  SECTION("reset() starts the buckets again (Prometheus reads it as a counter reset)") {
    h.record(500us);
    h.reset();
    h.record(5ms);
    const Buckets b = buckets_of(r.prometheus(), "tailbatch_end_to_end_seconds", "pipeline=\"p1\"");
    REQUIRE(b.size() == 4);
    CHECK(b[0].second == 0);
    CHECK(b[2].second == 1);
    CHECK(b[3].second == 1);
  }
}

TEST_CASE("the default buckets: the histogram's layout, four per power of two, 10 us to 100 s",
          "[metrics][buckets]") {
  MetricsRegistry r;
  const tailbatch::ExportedBuckets b = r.exported_buckets();
  REQUIRE(b.upper_bounds_seconds.size() == 93);
  CHECK(b.max_relative_error == 0.25);
  for (std::size_t i = 0; i < b.upper_bounds_seconds.size(); ++i) {
    const double ns = b.upper_bounds_seconds[i] * 1e9;
    INFO("bound " << i << ": " << ns << " ns");
    CHECK(ns >= 10e3);
    CHECK(ns <= 100e9);
    if (i > 0) CHECK(b.upper_bounds_seconds[i] > b.upper_bounds_seconds[i - 1]);
    // 2^e * (1 + j/4): the mantissa is one of 1, 1.25, 1.5, 1.75.
    const double mantissa = ns / std::exp2(std::floor(std::log2(ns)));
    CHECK((mantissa == 1.0 || mantissa == 1.25 || mantissa == 1.5 || mantissa == 1.75));
  }
  CHECK(b.upper_bounds_seconds.front() == 10240e-9);
  CHECK(b.upper_bounds_seconds.back() == 85899345920e-9);  // 1.25 * 2^36 ns; 1.5 * 2^36 > 100 s

  // The text names exactly these bounds, in this order.
  auto& h = r.histogram("tailbatch_x_seconds", "h");
  h.record(3ms);
  const Buckets text = buckets_of(r.prometheus(), "tailbatch_x_seconds", "");
  REQUIRE(text.size() == 94);
  for (std::size_t i = 0; i < 93; ++i) {
    CHECK(text[i].first == b.upper_bounds_seconds[i]);
    CHECK(text[i].second == (b.upper_bounds_seconds[i] > 0.003 ? 1.0 : 0.0));
  }

  // Eight per octave halves the error; the bounds follow the histogram's own range.
  tailbatch::MetricsRegistryConfig eight;
  eight.buckets.buckets_per_octave = 8;
  CHECK(MetricsRegistry(eight).exported_buckets().max_relative_error == 0.125);
  CHECK(MetricsRegistry(eight).exported_buckets().upper_bounds_seconds.size() == 186);
  tailbatch::LatencyHistogramConfig narrow;
  narrow.lowest = 1ms;
  narrow.highest = 1s;
  const auto nb = r.exported_buckets(narrow).upper_bounds_seconds;
  REQUIRE(!nb.empty());
  CHECK(nb.front() > 0.001);
  CHECK(nb.back() <= 1.0);
}

TEST_CASE("a fleet's quantiles from summed buckets are within the stated error of the merged samples",
          "[metrics][buckets]") {
  // Two replicas with different latency distributions, as a fleet with one slow host has:
  // lognormal around 4 ms on one, around 9 ms with a heavier tail on the other, and
  // three times the traffic on the first.
  for (const int per_octave : {4, 8}) {
    for (const unsigned seed : {1u, 2u, 3u}) {
      INFO(per_octave << " buckets per octave, seed " << seed);
      tailbatch::MetricsRegistryConfig config;
      config.buckets.buckets_per_octave = per_octave;
      MetricsRegistry a(config);
      MetricsRegistry b(config);
      auto& ha = a.histogram("tailbatch_serve_request_duration_seconds", "h", {{"route", "classify"}});
      auto& hb = b.histogram("tailbatch_serve_request_duration_seconds", "h", {{"route", "classify"}});
      std::mt19937_64 rng(seed);
      std::lognormal_distribution<double> fast(std::log(4e-3), 0.4);
      std::lognormal_distribution<double> slow(std::log(9e-3), 0.7);
      std::vector<double> all;
      std::vector<double> only_a;
      std::vector<double> only_b;
      for (int i = 0; i < 30000; ++i) {
        const double s = fast(rng);
        ha.record(std::chrono::duration<double>(s));
        // What the histogram holds: whole nanoseconds.
        all.push_back(std::floor(s * 1e9) / 1e9);
        only_a.push_back(all.back());
      }
      for (int i = 0; i < 10000; ++i) {
        const double s = slow(rng);
        hb.record(std::chrono::duration<double>(s));
        all.push_back(std::floor(s * 1e9) / 1e9);
        only_b.push_back(all.back());
      }
      const std::string name = "tailbatch_serve_request_duration_seconds";
      const Buckets ba = buckets_of(a.prometheus(), name, "route=\"classify\"");
      const Buckets bb = buckets_of(b.prometheus(), name, "route=\"classify\"");
      const Buckets fleet = sum_by_le({ba, bb});
      const double error = a.exported_buckets().max_relative_error;
      CHECK(error == Approx(1.0 / per_octave).epsilon(1e-12));
      for (const double q : {0.5, 0.9, 0.95, 0.99, 0.999}) {
        const double truth = exact_quantile(all, q);
        const double estimate = histogram_quantile(q, fleet);
        INFO("q " << q << ": merged samples " << truth << " s, from the summed buckets " << estimate << " s");
        CHECK(std::fabs(estimate - truth) <= error * truth);
      }
      // Each replica's own p99 from its own buckets, as a per-instance panel shows it.
      for (const auto& [samples, buckets] : {std::pair{&only_a, &ba}, std::pair{&only_b, &bb}}) {
        const double truth = exact_quantile(*samples, 0.99);
        CHECK(std::fabs(histogram_quantile(0.99, *buckets) - truth) <= error * truth);
      }
    }
  }
}

TEST_CASE("neither the mean nor the largest of the replicas' p99s is the fleet's p99", "[metrics][buckets]") {
  // One replica takes 0.5 % of the traffic and answers it in 100 ms; the other answers in
  // about 5 ms. The fleet's p99 is about 5 ms: the mean of the two p99s (52 ms) and their
  // maximum (100 ms) are both wrong, while the summed buckets are right.
  MetricsRegistry a;
  MetricsRegistry b;
  auto& ha = a.histogram("tailbatch_x_seconds", "h");
  auto& hb = b.histogram("tailbatch_x_seconds", "h");
  std::mt19937_64 rng(7);
  std::normal_distribution<double> around_5ms(5e-3, 0.5e-3);
  std::vector<double> all;
  std::vector<double> only_a;
  for (int i = 0; i < 19900; ++i) {
    const double s = std::max(1e-3, around_5ms(rng));
    ha.record(std::chrono::duration<double>(s));
    all.push_back(std::floor(s * 1e9) / 1e9);
    only_a.push_back(all.back());
  }
  for (int i = 0; i < 100; ++i) {
    hb.record(100ms);
    all.push_back(0.1);
  }
  const double truth = exact_quantile(all, 0.99);
  const double from_buckets = histogram_quantile(
      0.99, sum_by_le({buckets_of(a.prometheus(), "tailbatch_x_seconds", ""), buckets_of(b.prometheus(), "tailbatch_x_seconds", "")}));
  const double error = a.exported_buckets().max_relative_error;
  CHECK(truth < 0.007);
  CHECK(std::fabs(from_buckets - truth) <= error * truth);
  const double mean_of_p99s = (exact_quantile(only_a, 0.99) + 0.1) / 2;
  const double max_of_p99s = 0.1;
  CHECK(mean_of_p99s > 5 * truth);
  CHECK(max_of_p99s > 10 * truth);
}

TEST_CASE("configured bounds: a list, extra bounds such as an SLO target, and the rounding",
          "[metrics][buckets]") {
  SECTION("a list off the layout's boundaries is counted at the nearest one, within 1/(2M)") {
    tailbatch::MetricsRegistryConfig config;
    config.buckets.boundaries_seconds = {0.005, 0.01, 0.15, 1.0};
    MetricsRegistry r(config);
    const auto b = r.exported_buckets();
    CHECK(b.upper_bounds_seconds == std::vector<double>{0.005, 0.01, 0.15, 1.0});
    // The widest bucket, (0.01, 0.15]: (0.15 - 0.01) / 0.01, plus the rounding of both ends
    // to the layout's boundaries, 1/(2*64) of each at most.
    CHECK(b.max_relative_error >= (0.15 - 0.01) / 0.01);
    CHECK(b.max_relative_error <= (0.15 * (1 + 1.0 / 128) - 0.01 * (1 - 1.0 / 128)) / (0.01 * (1 - 1.0 / 128)));
    auto& h = r.histogram("tailbatch_x_seconds", "h");
    // 150 ms is counted at 150.99 ms, the layout's nearest boundary (64 per octave).
    h.record(148ms);
    h.record(150500us);
    h.record(152ms);
    const Buckets text = buckets_of(r.prometheus(), "tailbatch_x_seconds", "");
    REQUIRE(text.size() == 5);
    CHECK(text[2].first == 0.15);
    CHECK(text[2].second == 2.0);
    CHECK(text[3].second == 3.0);
  }

  SECTION("extra bounds join the coarsened layout") {
    tailbatch::MetricsRegistryConfig config;
    config.buckets.extra_boundaries_seconds = {0.15, 0.1};
    MetricsRegistry r(config);
    const auto b = r.exported_buckets().upper_bounds_seconds;
    CHECK(b.size() == 95);
    CHECK(std::count(b.begin(), b.end(), 0.15) == 1);
    CHECK(std::count(b.begin(), b.end(), 0.1) == 1);
    CHECK(std::is_sorted(b.begin(), b.end()));
    auto& w = r.windowed_histogram("tailbatch_x_seconds", "h", {}, 60s);
    for (int i = 0; i < 99; ++i) w.record(100ms + std::chrono::microseconds(100 * i));  // 100 .. 109.8 ms
    w.record(200ms);
    const std::string text = r.prometheus();
    CHECK(sample_value(text, "tailbatch_x_seconds_bucket{le=\"0.15\"}") == 99.0);
    CHECK(sample_value(text, "tailbatch_x_seconds_bucket{le=\"+Inf\"}") == 100.0);
  }

  SECTION("bounds a histogram cannot count exactly are left out for it") {
    tailbatch::MetricsRegistryConfig config;
    config.buckets.boundaries_seconds = {1e-6, 0.001, 0.5, 99.0, 200.0};
    MetricsRegistry r(config);
    tailbatch::LatencyHistogramConfig options;
    options.lowest = 1us;
    options.highest = 100s;
    // 1 us is the histogram's lowest (underflows are recorded there) and 200 s lies beyond
    // its highest (overflows are recorded there): neither can be told apart.
    CHECK(r.exported_buckets(options).upper_bounds_seconds == std::vector<double>{0.001, 0.5, 99.0});
    options.lowest = 1ms;
    CHECK(r.exported_buckets(options).upper_bounds_seconds == std::vector<double>{0.5, 99.0});
  }

  SECTION("bad configuration throws, naming the field") {
    const auto with = [](auto change) {
      tailbatch::MetricsRegistryConfig c;
      change(c.buckets);
      return c;
    };
    using B = tailbatch::HistogramBucketsConfig;
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.buckets_per_octave = 3; })), std::invalid_argument,
                         MessageIs("MetricsRegistry: config.buckets.buckets_per_octave must be a power of two in [1, 1024]"));
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.buckets_per_octave = 0; })), std::invalid_argument,
                         MessageContains("buckets_per_octave"));
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.buckets_per_octave = 2048; })), std::invalid_argument,
                         MessageContains("buckets_per_octave"));
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.lowest = 0ns; })), std::invalid_argument,
                         MessageContains("config.buckets.lowest"));
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.highest = b.lowest; })), std::invalid_argument,
                         MessageContains("config.buckets.highest"));
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.boundaries_seconds = {0.1, 0.1}; })), std::invalid_argument,
                         MessageContains("strictly increasing"));
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.boundaries_seconds = {0.0}; })), std::invalid_argument,
                         MessageContains("config.buckets.boundaries_seconds"));
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.boundaries_seconds = {0.1, INFINITY}; })), std::invalid_argument,
                         MessageContains("config.buckets.boundaries_seconds"));
    CHECK_THROWS_MATCHES(MetricsRegistry(with([](B& b) { b.extra_boundaries_seconds = {std::nan("")}; })),
                         std::invalid_argument, MessageContains("config.buckets.extra_boundaries_seconds"));
  }
}

TEST_CASE("windowed histograms export cumulative buckets while their snapshot slides",
          "[metrics][windowed][buckets]") {
  tailbatch::ManualClock clock;
  tailbatch::MetricsRegistryConfig config;
  config.buckets.boundaries_seconds = {0.02};
  MetricsRegistry r(config);
  auto& w = r.windowed_histogram("tailbatch_end_to_end_seconds", "End-to-end latency.", {{"pipeline", "p"}}, 60s, 6,
                                 {}, clock);
  for (int i = 0; i < 100; ++i) w.record(10ms);
  clock.advance(120s);
  for (int i = 0; i < 50; ++i) w.record(50ms);
  CHECK(r.prometheus() ==
        "# HELP tailbatch_end_to_end_seconds End-to-end latency.\n"
        "# TYPE tailbatch_end_to_end_seconds histogram\n"
        "tailbatch_end_to_end_seconds_bucket{pipeline=\"p\",le=\"0.02\"} 100\n"
        "tailbatch_end_to_end_seconds_bucket{pipeline=\"p\",le=\"+Inf\"} 150\n"
        "tailbatch_end_to_end_seconds_sum{pipeline=\"p\"} 3.5\n"
        "tailbatch_end_to_end_seconds_count{pipeline=\"p\"} 150\n");
  // In-process readers get the window: only the 50 ms samples.
  CHECK(w.snapshot().count() == 50);
  CHECK(w.total().count() == 150);
  const Json doc = parse_json(r.json());
  const Json& sample = doc["families"].array.at(0)["samples"].array.at(0);
  CHECK(sample["buckets"]["0.02"].number == 100.0);
  CHECK(sample["quantiles"]["0.5"].number == Approx(0.050).epsilon(0.01));
}

TEST_CASE("HistogramSnapshot::count_below counts values below bucket boundaries", "[metrics][buckets]") {
  tailbatch::LatencyHistogram h;
  for (int us = 1; us <= 1000; ++us) h.record(std::chrono::microseconds(us));
  const tailbatch::HistogramSnapshot s = h.snapshot();
  // 256 us and 512 us are boundaries of the layout: exact.
  const std::array<std::chrono::nanoseconds, 5> bounds{0ns, 1us, 256us, 512us, 1h};
  std::array<std::uint64_t, 5> out{};
  s.count_below(bounds, out);
  CHECK(out == std::array<std::uint64_t, 5>{0, 0, 255, 511, 1000});
  // Any order, and a shorter output.
  const std::array<std::chrono::nanoseconds, 2> reversed{512us, 256us};
  std::array<std::uint64_t, 1> one{};
  s.count_below(reversed, one);
  CHECK(one[0] == 511);
  std::array<std::uint64_t, 2> two{};
  s.count_below(reversed, two);
  CHECK(two == std::array<std::uint64_t, 2>{511, 255});
  // An empty snapshot counts nothing.
  tailbatch::HistogramSnapshot empty;
  empty.count_below(bounds, out);
  CHECK(out == std::array<std::uint64_t, 5>{});
}
