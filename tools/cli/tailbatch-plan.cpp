// tailbatch-plan: the capacity planner on the command line.
//
//   From a latency profile (the latency field guide's Example 1):
//     tailbatch-plan --base-ms 20 --per-item-ms 3 --network-ms 5 --window-ms 8
//                    --streams 2 --slo-p95-ms 150 --preferred 8,16
//   From a measured table:        --profile 1:20,8:41,16:65   (or --profile FILE)
//   From a measured instance (the latency field guide's Example 3):
//     tailbatch-plan --instance-rps 350 --p95-ms 120 --target-rps 2000 --headroom 0.3
//
// Prints a table, or JSON with --json. Exit status: 0 with a recommendation, 1 for bad
// arguments (with a message naming the flag: a number that is not one, an empty value, a
// missing --profile file) or a count beyond the planner's range, 3 when no candidate
// meets the SLO.
#include <tailbatch/detail/metrics/text.hpp>
#include <tailbatch/tools/planner.hpp>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

// A JSON string literal, quotes included (the library's escaping, as /metrics.json writes).
std::string json_string(std::string_view s) {
  std::string out;
  tailbatch::detail::append_json_string(out, s);
  return out;
}

std::string json_number(double v) { return fmt::format("{:.6g}", v); }
std::string json_opt(const std::optional<std::int64_t>& v) { return v ? std::to_string(*v) : "null"; }
std::string json_opt(const std::optional<double>& v) { return v ? json_number(*v) : "null"; }

std::string candidate_json(const tailbatch::BatchPlan& c) {
  return fmt::format(
      "{{\"batch_size\": {}, \"model_ms\": {}, \"request_ms\": {}, \"p95_ms\": {}, "
      "\"stream_rps\": {}, \"instance_rps\": {}, \"replicas\": {}, \"replicas_with_headroom\": {}, "
      "\"concurrency\": {}, \"max_in_flight\": {}, \"meets_slo\": {}}}",
      c.batch_size, json_number(c.model_ms), json_number(c.request_ms), json_number(c.p95_ms),
      json_number(c.stream_rps), json_number(c.instance_rps), json_opt(c.replicas),
      json_opt(c.replicas_with_headroom), json_number(c.concurrency), c.max_in_flight,
      c.meets_slo ? "true" : "false");
}

std::string fixed(double v, int decimals) { return fmt::format("{:.{}f}", v, decimals); }

// The rows worth reading when every size 1..64 is a candidate: 1, the powers of two, the
// largest, the recommendation, its same-cost alternative and the first size over the SLO.
std::vector<bool> rows_to_show(const tailbatch::CapacityPlan& plan, bool all) {
  const auto& cs = plan.candidates;
  std::vector<bool> show(cs.size(), all || cs.size() <= 16);
  if (all || cs.size() <= 16) return show;
  bool first_over_marked = false;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    int b = cs[i].batch_size;
    if ((b & (b - 1)) == 0 || i + 1 == cs.size()) show[i] = true;
    if (!cs[i].meets_slo && !first_over_marked) {
      show[i] = true;
      first_over_marked = true;
    }
  }
  if (plan.recommended) show[*plan.recommended] = true;
  if (plan.same_replicas_lower_p95) show[*plan.same_replicas_lower_p95] = true;
  show[plan.lowest_p95] = true;
  return show;
}

void print_table(const tailbatch::PlannerConfig& cfg, const tailbatch::CapacityPlan& plan, bool all) {
  if (cfg.profile.is_measured()) {
    std::string pts;
    for (const auto& p : cfg.profile.points())
      pts += fmt::format("{}{}:{}", pts.empty() ? "" : ",", p.batch_size, p.model_ms);
    fmt::print("profile: measured {} ms", pts);
  } else {
    fmt::print("profile: {} ms + {} ms per extra item", cfg.profile.base_ms(), cfg.profile.per_item_ms());
  }
  fmt::print(", network {} ms, window {} ms (batch > 1), {} stream{}, p95 = {} x request time\n",
             cfg.network_ms, cfg.window_ms, cfg.streams, cfg.streams == 1 ? "" : "s", cfg.tail);
  fmt::print("SLO: {}; target: {}; headroom {} %\n\n",
             cfg.slo_p95_ms ? fmt::format("p95 <= {} ms", *cfg.slo_p95_ms) : std::string("none"),
             cfg.target_rps ? fmt::format("{} rps", *cfg.target_rps) : std::string("none"),
             cfg.headroom * 100.0);
  fmt::print("  {:>5} {:>8} {:>10} {:>8} {:>10} {:>12} {:>8} {:>9} {:>9} {:>8}  {}\n", "batch",
             "model", "request", "p95", "rps per", "rps per", "replicas", "replicas", "in flight",
             "max in", "SLO");
  fmt::print("  {:>5} {:>8} {:>10} {:>8} {:>10} {:>12} {:>8} {:>9} {:>9} {:>8}\n", "", "ms", "ms",
             "ms", "stream", "instance", "", "+headroom", "(Little)", "flight");
  auto show = rows_to_show(plan, all);
  std::size_t shown = 0;
  for (std::size_t i = 0; i < plan.candidates.size(); ++i) {
    if (!show[i]) continue;
    ++shown;
    const auto& c = plan.candidates[i];
    const char* mark = plan.recommended && *plan.recommended == i ? "*"
                       : plan.same_replicas_lower_p95 && *plan.same_replicas_lower_p95 == i ? "+"
                                                                                            : " ";
    fmt::print("{} {:>5} {:>8} {:>10} {:>8} {:>10} {:>12} {:>8} {:>9} {:>9} {:>8}  {}\n", mark,
               c.batch_size, fixed(c.model_ms, 1), fixed(c.request_ms, 1), fixed(c.p95_ms, 1),
               fixed(c.stream_rps, 1), fixed(c.instance_rps, 1),
               c.replicas ? std::to_string(*c.replicas) : "-",
               c.replicas_with_headroom ? std::to_string(*c.replicas_with_headroom) : "-",
               fixed(c.concurrency, 1), c.max_in_flight, c.meets_slo ? "ok" : "over");
  }
  if (shown < plan.candidates.size())
    fmt::print("  ({} of {} candidates shown; --all prints every one, --json lists them all)\n",
               shown, plan.candidates.size());
  fmt::print("\n");
  if (const auto* rec = plan.recommendation()) {
    fmt::print("recommended (*): batch {}, estimated p95 {} ms, {} rps per instance", rec->batch_size,
               fixed(rec->p95_ms, 1), fixed(rec->instance_rps, 1));
    if (rec->replicas)
      fmt::print(", {} replica{} ({} with headroom)", *rec->replicas, *rec->replicas == 1 ? "" : "s",
                 *rec->replicas_with_headroom);
    fmt::print(", max in-flight {} per instance\n", rec->max_in_flight);
  } else {
    fmt::print("no recommendation: no candidate meets the SLO\n");
  }
  fmt::print("why: {}\n", plan.reason);
}

void print_json(const tailbatch::PlannerConfig& cfg, const tailbatch::CapacityPlan& plan) {
  std::string out = "{\n  \"mode\": \"profile\",\n  \"inputs\": {";
  if (cfg.profile.is_measured()) {
    out += "\"profile\": [";
    bool first = true;
    for (const auto& p : cfg.profile.points()) {
      out += fmt::format("{}{{\"batch_size\": {}, \"model_ms\": {}}}", first ? "" : ", ", p.batch_size,
                         json_number(p.model_ms));
      first = false;
    }
    out += "]";
  } else {
    out += fmt::format("\"base_ms\": {}, \"per_item_ms\": {}", json_number(cfg.profile.base_ms()),
                       json_number(cfg.profile.per_item_ms()));
  }
  out += fmt::format(
      ", \"network_ms\": {}, \"window_ms\": {}, \"streams\": {}, \"tail\": {}, \"slo_p95_ms\": {}, "
      "\"target_rps\": {}, \"headroom\": {}, \"max_batch\": {}}},\n",
      json_number(cfg.network_ms), json_number(cfg.window_ms), cfg.streams, json_number(cfg.tail),
      json_opt(cfg.slo_p95_ms), json_opt(cfg.target_rps), json_number(cfg.headroom), cfg.max_batch);
  out += "  \"recommended\": ";
  out += plan.recommendation() ? candidate_json(*plan.recommendation()) : "null";
  out += ",\n  \"same_replicas_lower_p95\": ";
  out += plan.same_replicas_lower_p95 ? candidate_json(plan.candidates[*plan.same_replicas_lower_p95])
                                      : "null";
  out += fmt::format(",\n  \"reason\": {},\n  \"candidates\": [\n", json_string(plan.reason));
  for (std::size_t i = 0; i < plan.candidates.size(); ++i)
    out += "    " + candidate_json(plan.candidates[i]) + (i + 1 < plan.candidates.size() ? ",\n" : "\n");
  out += "  ]\n}\n";
  fmt::print("{}", out);
}

void print_instance(const tailbatch::InstanceMeasurement& m, const tailbatch::InstancePlan& p, bool json) {
  if (json) {
    std::string rec = fmt::format(
        "{{\"batch_size\": {}, \"p95_ms\": {}, \"instance_rps\": {}, \"replicas\": {}, "
        "\"replicas_with_headroom\": {}, \"concurrency\": {}, \"max_in_flight\": {}}}",
        p.batch_size, json_number(p.p95_ms), json_number(p.instance_rps), p.replicas,
        p.replicas_with_headroom, json_number(p.concurrency), p.max_in_flight);
    fmt::print(
        "{{\n  \"mode\": \"instance\",\n  \"inputs\": {{\"instance_rps\": {}, \"p95_ms\": {}, "
        "\"target_rps\": {}, \"headroom\": {}, \"batch_size\": {}, \"streams\": {}}},\n"
        "  \"recommended\": {},\n  \"reason\": {},\n  \"candidates\": [\n    {}\n  ]\n}}\n",
        json_number(m.instance_rps), json_number(m.p95_ms), json_number(m.target_rps),
        json_number(m.headroom), m.batch_size, m.streams, rec, json_string(p.reason), rec);
    return;
  }
  fmt::print("measured instance: {} rps at p95 {} ms; target {} rps; headroom {} %\n\n",
             m.instance_rps, m.p95_ms, m.target_rps, m.headroom * 100.0);
  fmt::print("  replicas (no headroom)      {:>8}   ceil({} / {})\n", p.replicas, m.target_rps, m.instance_rps);
  fmt::print("  replicas with headroom      {:>8}   ceil({} x {} / {})\n", p.replicas_with_headroom,
             m.target_rps, 1.0 + m.headroom, m.instance_rps);
  fmt::print("  in flight per instance      {:>8}   {} rps x {} s (Little's law)\n", fixed(p.concurrency, 1),
             m.instance_rps, m.p95_ms / 1000.0);
  fmt::print("  suggested max in-flight     {:>8}   1.1 x in flight, rounded up (to 1, 5 or 10)\n\n",
             p.max_in_flight);
  fmt::print("why: {}\n", p.reason);
}

// A flag's value that cannot be used: the message names the flag.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --profile is a file when one exists at that path; otherwise the inline form
// "1:20,8:41", which always has a ':' and never a '/'. Anything else is a file that is
// missing, and the message says so.
std::string read_profile_text(const std::string& arg) {
  if (arg.empty()) throw UsageError("--profile: the value is empty: give batch:ms pairs (1:20,8:41) or a file");
  std::error_code ec;
  const bool exists = std::filesystem::exists(arg, ec);
  if (!exists && arg.find(':') != std::string::npos && arg.find('/') == std::string::npos) return arg;
  if (!exists) {
    throw UsageError("--profile: no such file: " + arg +
                       " (an inline table is written as batch:ms pairs, as in 1:20,8:41)");
  }
  if (std::filesystem::is_directory(arg, ec)) throw UsageError("--profile: " + arg + " is a directory, not a file");
  std::ifstream in(arg);
  if (!in) throw UsageError("--profile: cannot open " + arg + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw UsageError("--profile: cannot read " + arg);
  return ss.str();
}

// CLI11 converts an empty value to 0 and accepts "0x10" as 16: every numeric flag is
// checked first, so that "" and "abc" are reported as what they are.
CLI::Validator number_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "the value is empty: give a number";
        double v = 0;
        const char* b = text.data() + (text.front() == '+' ? 1 : 0);
        auto [ptr, ec] = std::from_chars(b, text.data() + text.size(), v);
        if (ptr != text.data() + text.size() || ec == std::errc::invalid_argument)
          return "\"" + text + "\" is not a number";
        if (ec == std::errc::result_out_of_range) return "\"" + text + "\" is out of the range of a double";
        return {};
      },
      "NUMBER");
}

CLI::Validator whole_number_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "the value is empty: give a whole number";
        long long v = 0;
        const char* b = text.data() + (text.front() == '+' ? 1 : 0);
        auto [ptr, ec] = std::from_chars(b, text.data() + text.size(), v);
        if (ptr != text.data() + text.size() || ec == std::errc::invalid_argument)
          return "\"" + text + "\" is not a whole number";
        if (ec == std::errc::result_out_of_range || v < std::numeric_limits<int>::min() ||
            v > std::numeric_limits<int>::max())
          return "\"" + text + "\" is out of range (at most " + std::to_string(std::numeric_limits<int>::max()) + ")";
        return {};
      },
      "INT");
}

// "8,16,32" -> {8, 16, 32}. CLI11's own splitting drops empty items ("8,,16"); this says
// which item is wrong instead.
std::vector<int> parse_preferred(const std::string& text) {
  std::vector<int> sizes;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    std::string item = text.substr(begin, end - begin);
    std::string why = whole_number_check()(item);
    if (!why.empty()) throw UsageError("--preferred: item " + std::to_string(sizes.size() + 1) + " of \"" + text + "\": " + why);
    sizes.push_back(std::stoi(item));
    if (end == text.size()) break;
    begin = end + 1;
  }
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "tailbatch-plan: batch size, p95, throughput, replicas and in-flight caps from a latency "
      "profile (or from one measured instance), by the capacity math of docs/planner.md."};

  tailbatch::PlannerConfig cfg;
  double base_ms = 0, per_item_ms = 0, slo = 0, target = 0;
  std::string profile_arg;
  bool json = false, all = false;
  tailbatch::InstanceMeasurement inst;

  // A numeric option, checked by number_check (whole: whole_number_check); show_default:
  // --help prints its default.
  auto number = [&app](const char* name, auto& value, const char* what, bool show_default = false) {
    CLI::Option* o = app.add_option(name, value, what)->check(number_check());
    return show_default ? o->capture_default_str() : o;
  };
  auto whole = [&app](const char* name, auto& value, const char* what, bool show_default = true) {
    CLI::Option* o = app.add_option(name, value, what)->check(whole_number_check());
    return show_default ? o->capture_default_str() : o;
  };
  auto* base_opt = number("--base-ms", base_ms, "model time at batch 1, ms");
  auto* per_opt = number("--per-item-ms", per_item_ms, "model time per extra item, ms");
  auto* prof_opt = app.add_option("--profile", profile_arg,
                                  "measured batch:ms table, inline (1:20,8:41,16:65) or a file "
                                  "with one 'batch ms' pair per line");
  auto* net_opt =
      number("--network-ms", cfg.network_ms, "network and serialization per request, ms", true);
  auto* win_opt =
      number("--window-ms", cfg.window_ms, "batch window, added when batch > 1, ms", true);
  whole("--streams", cfg.streams, "streams (lanes) per instance");
  auto* tail_opt =
      number("--tail", cfg.tail, "tail inflation: p95 = tail x per-request time", true);
  auto* slo_opt = number("--slo-p95-ms", slo, "p95 SLO, ms");
  auto* target_opt = number("--target-rps", target, "load to serve, requests per second");
  number("--headroom", cfg.headroom, "spare capacity fraction for replicas", true);
  auto* max_opt = whole("--max-batch", cfg.max_batch, "largest batch size considered");
  std::string preferred_arg;
  auto* pref_opt = app.add_option("--preferred", preferred_arg, "only these batch sizes, e.g. 8,16,32");
  auto* inst_opt = number("--instance-rps", inst.instance_rps,
                          "second mode: one instance's measured throughput, rps");
  auto* p95_opt = number("--p95-ms", inst.p95_ms, "second mode: that instance's p95, ms");
  auto* bs_opt =
      whole("--batch-size", inst.batch_size,
            "second mode: its batch size (the in-flight cap stays >= batch x streams)", false);
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_flag("--all", all, "print every candidate in the table");

  base_opt->excludes(prof_opt);
  per_opt->needs(base_opt);
  inst_opt->needs(p95_opt);
  p95_opt->needs(inst_opt);
  bs_opt->needs(inst_opt);
  for (auto* o : {base_opt, per_opt, prof_opt, net_opt, win_opt, tail_opt, slo_opt, max_opt, pref_opt})
    inst_opt->excludes(o);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 1;
  }

  try {
    if (*inst_opt) {
      if (!*target_opt) {
        fmt::print(stderr, "tailbatch-plan: error: --instance-rps needs --target-rps\n");
        return 1;
      }
      inst.target_rps = target;
      inst.headroom = cfg.headroom;
      inst.streams = cfg.streams;
      auto plan = tailbatch::plan_from_instance(inst);
      print_instance(inst, plan, json);
      return 0;
    }
    if (*prof_opt) {
      cfg.profile = tailbatch::LatencyProfile::parse(read_profile_text(profile_arg));
    } else if (*base_opt) {
      cfg.profile = tailbatch::LatencyProfile::linear(base_ms, per_item_ms);
    } else {
      fmt::print(stderr,
                 "tailbatch-plan: error: give a latency profile (--base-ms and --per-item-ms, or "
                 "--profile) or a measured instance (--instance-rps and --p95-ms)\n"
                 "Run with --help for more information.\n");
      return 1;
    }
    if (*pref_opt) cfg.preferred = parse_preferred(preferred_arg);
    if (*slo_opt) cfg.slo_p95_ms = slo;
    if (*target_opt) cfg.target_rps = target;
    auto plan = tailbatch::plan_capacity(cfg);
    if (json) print_json(cfg, plan);
    else print_table(cfg, plan, all);
    if (!plan.recommendation()) {
      fmt::print(stderr, "tailbatch-plan: no candidate meets the SLO\n");
      return 3;
    }
    return 0;
  } catch (const std::exception& e) {  // std::invalid_argument from the planner, UsageError
    fmt::print(stderr, "tailbatch-plan: error: {}\n", e.what());
    return 1;
  }
}
