#!/usr/bin/env bash
# tailbatch-serve under wrk, batching off (--max-batch 1) against batching on (the
# defaults: --max-batch 32, --window-us 2000), at a few connection counts, on 127.0.0.1.
#
#   benchmarks/server/run.sh [SERVER] [SECONDS] [CONNECTIONS...]
#     SERVER       tailbatch-serve to run (default: build/default/examples/tailbatch-serve)
#     SECONDS      wrk run per row (default 10)
#     CONNECTIONS  connection counts (default: 8 32 128)
#   SERVE_ARGS     extra flags for both servers (environment)
#
# Every request is POST /v1/classify with one short text. Columns: requests/s and the
# latency percentiles as wrk measures them (connection-count closed loop; wrk's own
# coordinated omission applies), non-2xx answers, the mean batch over the row (from
# /v1/stats: requests batched / batches), and the server's CPU time per request (user +
# system from /proc/PID/stat over the row). Each server is stopped with SIGTERM at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."

default_conns=(8 32 128)
source benchmarks/support/wrk_args.sh "$@"
source benchmarks/support/serve.sh

clk_tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
stat_field() {  # stat_field PORT python-expression-over-j
  curl -s "http://127.0.0.1:$1/v1/stats" | python3 -c "import json,sys; j=json.load(sys.stdin); print($2)"
}

printf '%-8s %6s %10s %9s %9s %9s %8s %10s %12s\n' batching conns "req/s" "p50 ms" "p90 ms" "p99 ms" non-2xx \
  "mean batch" "CPU ms/req"
for mode in off on; do
  if [[ $mode == off ]]; then start_server --max-batch 1; else start_server; fi
  for c in "${conns[@]}"; do
    b0=$(stat_field "$port" 'j["classify"]["batches"], j["classify"]["batched_requests"]')
    t0=$(cpu_ticks "$pid")
    wrk -t2 -c"$c" -d"${seconds}s" --latency -s "$work/post.lua" "http://127.0.0.1:$port/v1/classify" >"$work/wrk"
    t1=$(cpu_ticks "$pid")
    b1=$(stat_field "$port" 'j["classify"]["batches"], j["classify"]["batched_requests"]')
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$work/wrk")
    total=$(awk '/requests in/ {print $1}' "$work/wrk")
    non2xx=$(awk '/Non-2xx/ {print $NF}' "$work/wrk")
    read -r bat0 req0 <<<"$b0"
    read -r bat1 req1 <<<"$b1"
    mean=$(awk -v b=$((bat1 - bat0)) -v r=$((req1 - req0)) 'BEGIN {printf "%.1f", b ? r / b : 0}')
    cpu=$(awk -v t=$((t1 - t0)) -v n="$total" -v hz="$clk_tck" 'BEGIN {printf "%.3f", n ? t * 1000 / hz / n : 0}')
    printf '%-8s %6s %10s %9s %9s %9s %8s %10s %12s\n' "$mode" "$c" "$rps" "$(wrk_ms 50% "$work/wrk")" \
      "$(wrk_ms 90% "$work/wrk")" "$(wrk_ms 99% "$work/wrk")" "${non2xx:-0}" "$mean" "$cpu"
  done
  stop_server
done
