// tailbatch-serve, its flags: every option, its default and its --help text (options.hpp). One of
// the parts tailbatch_serve.cpp includes, in this order: options.hpp, server.hpp, connection.hpp,
// models.hpp, classic_routes.hpp, openai_routes.hpp; not a header to include elsewhere.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace tailbatch_serve {

struct Options {
  std::string host = "127.0.0.1";
  unsigned port = 8080;
  unsigned io_threads = 1;
  int backlog = 4096;
  std::size_t max_body_bytes = 1 << 20;
  unsigned idle_timeout_ms = 30'000;

  std::size_t max_batch = 32;
  unsigned window_us = 2000;
  std::size_t lanes = 1;
  std::size_t queue_capacity = 4096;
  unsigned limit = 256;        // with --limit: a static ConcurrencyLimiter limit
  bool limit_from_slo = true;  // no --limit: admission from the SLO (SloLimit, server.hpp)
  unsigned default_timeout_ms = 2000;
  bool default_timeout_from_slo = true;  // no --default-timeout-ms: classify's comes from the SLO
  unsigned warmup_rounds = 2;
  unsigned drain_timeout_ms = 5000;
  unsigned stats_window_s = 60;
  double slo_p95_ms = 100.0;  // drawn on the dashboard; reported in /v1/stats; the Autoscaler's SLO

  double autoscale_interval_s = 5.0;  // 0: no Autoscaler
  double capacity_rps = 0.0;          // per replica; 0: measured by the warm-up
  int replicas = 1;  // the fleet this replica sees itself in (--replicas, TAILBATCH_REPLICAS)

  std::size_t gen_max_active = 16;
  std::size_t gen_queue_capacity = 256;
  std::size_t gen_max_tokens = 1024;
  std::size_t gen_token_budget = 65536;

  std::size_t gen_max_prompt_tokens = 256;  // longer prompts get 400 (context_length_exceeded)

  // The generator's KV cache (docs/kv-cache.md): blocks in the pool (0: none, the token
  // budget decides), tokens per block, and the mode ("grow" or "reserve").
  std::size_t kv_blocks = 0;
  std::size_t kv_block_size = 16;
  std::string kv_mode = "grow";

  std::string api_key;  // --api-key / TAILBATCH_API_KEY; empty: open

  // Tenants (docs/serving.md, "Tenants"): who a request is served for, and how they share.
  std::string api_keys_file;        // --api-keys: "KEY TENANT [WEIGHT [MAX_IN_FLIGHT]]" per line
  bool tenant_header = false;       // --tenant-header: X-Tenant names the tenant (after key, user)
  std::string scheduling = "fair";  // --scheduling fair|fifo
  std::string queue_policy = "reject-newest";  // --queue-policy (the classify queue)
  double codel_target_ms = 0;  // --codel-target-ms; 0: a tenth of --slo-p95-ms (at most 50 ms)
  std::size_t tenant_max_in_flight = 0;        // --tenant-max-in-flight: default quota; 0: none
  unsigned sse_keepalive_ms =
      10'000;  // a ": keep-alive" comment on a stream idle this long; 0: none
  double littles_law_interval_s = 10.0;  // the Pipeline's Little's-law check; 0: off
  bool access_log = false;               // one stderr line per response (errors are always logged)
  unsigned max_connections = 10'000;  // open client connections; more wait in the kernel's backlog
  unsigned write_timeout_ms =
      30'000;  // a response (or stream chunk) not written in this long closes

  // /v1/embeddings' model: "reference" (the reference classifier's embedding table) or
  // "libtorch" (examples/libtorch's encoder; only where the build found libtorch).
  std::string embed_model = "reference";
  std::string embed_weights;  // the libtorch encoder's weights; empty: the file the build wrote

  // Testing and demos only: wrapped around the model callables, never inside them.
  std::string fail_on_text;
  unsigned model_delay_ms = 0;
  unsigned decode_delay_ms = 0;
};

// The names /v1/models lists.
constexpr std::string_view generator_model_id = "tailbatch-reference-generator";
constexpr std::string_view embedder_model_id = "tailbatch-reference-embedder";
constexpr std::string_view libtorch_embedder_model_id = "tailbatch-embed-libtorch";

// Whether this build has the libtorch encoder (find_package(Torch) succeeded at configure),
// and where the build wrote its weights.
#ifdef TAILBATCH_SERVE_LIBTORCH
constexpr bool built_with_libtorch = true;
constexpr std::string_view default_embed_weights = TAILBATCH_LIBTORCH_WEIGHTS;
#else
constexpr bool built_with_libtorch = false;
constexpr std::string_view default_embed_weights = "";
#endif

// Parses the command line into o. Returns -1 to go on, else the exit code (0 after
// --help, non-zero with CLI11's message for a bad flag).
inline int parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "tailbatch-serve: the reference classifier and generator behind tailbatch, over HTTP.\n"
      "Threads: --io-threads I/O threads (the main thread is one) own the sockets and never wait "
      "for a\n"
      "result; the Pipeline owns --lanes worker threads that form batches and run the classifier; "
      "the\n"
      "ContinuousBatcher owns one decode thread for the generator; a warm-up thread runs until "
      "ready.\n"
      "Prints 'listening on HOST:PORT' as its first line on stdout. SIGTERM drains and exits 0.",
      "tailbatch-serve"};
  app.add_option("--host", o.host, "Address to bind")->capture_default_str();
  app.add_option("--port", o.port, "Port to bind; 0 picks a free one")->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "I/O threads (sockets, parsing, responses)")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_option("--backlog", o.backlog,
                 "listen() backlog (the kernel caps it at net.core.somaxconn)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-body-bytes", o.max_body_bytes, "Largest request body; larger ones get 413")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--idle-timeout-ms", o.idle_timeout_ms,
                 "Close a keep-alive connection idle this long")
      ->check(CLI::Range(1u, 3'600'000u))
      ->capture_default_str();
  app.add_option("--max-batch", o.max_batch, "Largest classify batch (1: batching off)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}))
      ->capture_default_str();
  app.add_option("--window-us", o.window_us,
                 "Longest a classify batch waits to fill, in microseconds")
      ->capture_default_str();
  app.add_option("--lanes", o.lanes,
                 "Host lanes for the classifier (one Pipeline worker thread each)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{256}))
      ->capture_default_str();
  app.add_option("--queue-capacity", o.queue_capacity,
                 "Classify requests that may wait; more get 503 queue_full")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24))
      ->capture_default_str();
  auto* limit = app.add_option(
      "--limit", o.limit,
      "A static ConcurrencyLimiter limit on classify requests admitted (queued and running); "
      "beyond it 503 overloaded. 0 admits none (sheds all classify load). Default: from the "
      "SLO, four times what the Pipeline serves (its drain rate) within the classify deadline");
  auto* timeout = app.add_option(
      "--default-timeout-ms", o.default_timeout_ms,
      "Deadline for requests without an X-Request-Timeout-Ms header (0: none). Default: "
      "2000 for generation; for classify, from --slo-p95-ms (the target less four "
      "full batches' time, measured by the warm-up; 75 % of it until measured)");
  app.add_option("--warmup-rounds", o.warmup_rounds,
                 "Warm-up batches of each size before /readyz says ready")
      ->capture_default_str();
  app.add_option("--drain-timeout-ms", o.drain_timeout_ms,
                 "On SIGTERM, how long in-flight work may take to finish")
      ->capture_default_str();
  app.add_option("--slo-p95-ms", o.slo_p95_ms,
                 "The p95 latency SLO, ms: drawn on /dashboard, in /v1/stats, and the Autoscaler's "
                 "latency trigger "
                 "(a p95 at 80 % of it asks for one more replica)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
         "--autoscale-interval-s", o.autoscale_interval_s,
         "Evaluate the Autoscaler this often (seconds, fractions allowed) and export its decision, "
         "tailbatch_autoscaler_desired_replicas, and its inputs on /metrics; 0: off")
      ->check(CLI::Range(0.0, 3600.0))
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            const double s = std::strtod(v.c_str(), nullptr);
            return s == 0.0 || s >= 0.01 ? std::string() : "must be 0 (off) or at least 0.01";
          },
          "0 or >= 0.01"))
      ->capture_default_str();
  app.add_option("--capacity-rps", o.capacity_rps,
                 "Classify requests per second one replica serves within its SLO (tailbatch-plan's "
                 "instance_rps, or "
                 "tailbatch-load --url's saturation point); the Autoscaler plans 70 % of it. 0: "
                 "the warm-up's fastest "
                 "full batch times the lanes, an upper bound from the model alone")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--replicas", o.replicas,
                 "Replicas the fleet runs, as this replica sees it: the Autoscaler decides for "
                 "that many replicas "
                 "each loaded like this one")
      ->envname("TAILBATCH_REPLICAS")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--stats-window-s", o.stats_window_s,
                 "Window of the latency percentiles in /v1/stats and /metrics")
      ->check(CLI::Range(1u, 3600u))
      ->capture_default_str();
  app.add_option("--gen-max-active", o.gen_max_active, "Sequences decoded together")
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}))
      ->capture_default_str();
  app.add_option("--gen-max-waiting", o.gen_queue_capacity,
                 "Generate requests that may wait; more get 503 queue_full")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--gen-max-tokens", o.gen_max_tokens,
                 "Largest max_tokens a generate request may ask for")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option(
         "--gen-token-budget", o.gen_token_budget,
         "Tokens the active sequences may reserve (prompt + max_tokens each); a request that alone "
         "exceeds it gets 413")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--kv-blocks", o.kv_blocks,
                 "Generation schedules by a KV cache of this many blocks (the generator keeps each "
                 "block's KV: block size x 2 KiB); 0: by --gen-token-budget instead")
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--kv-block-size", o.kv_block_size, "Tokens per KV block")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}))
      ->capture_default_str();
  app.add_option("--kv-mode", o.kv_mode,
                 "grow: blocks as sequences grow, preempting (and recomputing) the newest when "
                 "the cache is full; reserve: prompt + max_tokens booked at admission")
      ->check(CLI::IsMember({"grow", "reserve"}))
      ->capture_default_str();
  app.add_option("--gen-max-prompt-tokens", o.gen_max_prompt_tokens,
                 "Longest prompt, in tokens, a generation may have; longer ones get 400 "
                 "context_length_exceeded")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--api-key", o.api_key,
                 "Require 'Authorization: Bearer KEY' on /v1/* (401 otherwise); /healthz, /readyz, "
                 "/metrics, "
                 "/dashboard stay open. Without a key the server is open")
      ->envname("TAILBATCH_API_KEY");
  // Tenants.
  app.add_option("--api-keys", o.api_keys_file,
                 "A keys file: one 'KEY TENANT [WEIGHT [MAX_IN_FLIGHT]]' per line ('#' starts a "
                 "comment). Each key is accepted as 'Authorization: Bearer KEY' (with --api-key's, "
                 "if any) and names its tenant, its fair-share weight (default 1) and its quota of "
                 "requests in flight (default --tenant-max-in-flight)")
      ->envname("TAILBATCH_API_KEYS");
  app.add_flag("--tenant-header", o.tenant_header,
               "A request's X-Tenant header names its tenant when neither its API key (--api-keys) "
               "nor an OpenAI 'user' field does");
  app.add_option("--scheduling", o.scheduling,
                 "How the next request is chosen across tenants: fair (virtual token counters, "
                 "by weight) or fifo")
      ->check(CLI::IsMember({"fair", "fifo"}))
      ->capture_default_str();
  app.add_option("--queue-policy", o.queue_policy,
                 "The classify queue under overload: reject-newest, adaptive-lifo (oldest first "
                 "until a queue forms, then newest first), shed-oldest or codel "
                 "(docs/pipeline.md)")
      ->check(CLI::IsMember({"reject-newest", "shed-oldest", "adaptive-lifo", "codel"}))
      ->capture_default_str();
  app.add_option("--codel-target-ms", o.codel_target_ms,
                 "The queue wait adaptive-lifo and codel keep the queue's minimum below; a "
                 "standing queue sheds what waited past twice it (0: a tenth of --slo-p95-ms, "
                 "at most 50 ms; the interval is 100 ms)")
      ->check(CLI::Range(0.0, 99.0))
      ->capture_default_str();
  app.add_option("--tenant-max-in-flight", o.tenant_max_in_flight,
                 "Requests one tenant may have queued or running at once, per model; more get 429 "
                 "with Retry-After (quota_exceeded). 0: no quota")
      ->capture_default_str();
  app.add_option("--sse-keepalive-ms", o.sse_keepalive_ms,
                 "Send a ': keep-alive' comment on an event stream idle this long; 0: never")
      ->capture_default_str();
  app.add_option("--littles-law-interval-s", o.littles_law_interval_s,
                 "Run the classify Pipeline's Little's-law check this often "
                 "(tailbatch_pipeline_hidden_queue_suspected); "
                 "0: off")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_flag("--access-log", o.access_log,
               "One stderr line per response (request id, route, status, ms); "
               "error responses are logged always");
  app.add_option("--max-connections", o.max_connections,
                 "Open client connections at most; further ones wait in the listen backlog")
      ->check(CLI::Range(1u, 1'000'000u))
      ->capture_default_str();
  app.add_option(
         "--write-timeout-ms", o.write_timeout_ms,
         "Close a connection whose response (or stream chunk) is not written within this long")
      ->check(CLI::Range(1u, 3'600'000u))
      ->capture_default_str();
  app.add_option(
         "--decode-delay-ms", o.decode_delay_ms,
         "Testing and demos: every decode step takes this much longer, as a slower model would")
      ->capture_default_str();
  app.add_option("--fail-on-text", o.fail_on_text,
                 "Testing: a classify batch holding exactly this text throws in the model (500 for "
                 "its requests)");
  app.add_option(
         "--model-delay-ms", o.model_delay_ms,
         "Testing and demos: every classify batch takes this much longer, as a slower model would")
      ->capture_default_str();
  app.add_option("--embed-model", o.embed_model,
                 "The /v1/embeddings model: reference (the reference classifier's embedding "
                 "table, id tailbatch-reference-embedder) or libtorch (examples/libtorch's "
                 "encoder, id tailbatch-embed-libtorch; only in a build that found libtorch)")
      ->check(CLI::IsMember({"reference", "libtorch"}))
      ->capture_default_str();
  app.add_option("--embed-weights", o.embed_weights,
                 "With --embed-model libtorch: the encoder's weights (torch::save); default: the "
                 "file the build wrote (target libtorch_weights)");
  CLI11_PARSE(app, argc, argv);
  o.limit_from_slo = limit->count() == 0;
  o.default_timeout_from_slo = timeout->count() == 0;
  if (o.embed_model == "libtorch" && !built_with_libtorch) {
    std::fprintf(stderr,
                 "tailbatch-serve: --embed-model libtorch: this build has no libtorch "
                 "(find_package(Torch) failed at configure; scripts/deps.sh --all installs "
                 "libtorch-dev)\n");
    return 2;
  }
  if (o.embed_weights.empty()) o.embed_weights = std::string(default_embed_weights);
  return -1;
}

}  // namespace tailbatch_serve
