#!/usr/bin/env bash
# tailbatch-serve under closed-loop overload: wrk at a normal connection count and at many
# more, on 127.0.0.1, each row a fresh wrk run against one server.
#
#   benchmarks/server/overload.sh [SERVER] [SECONDS] [CONNECTIONS...]
#     SERVER       tailbatch-serve to run (default: build/default/examples/tailbatch-serve)
#     SECONDS      wrk run per row (default 10)
#     CONNECTIONS  connection counts (default: 64 512)
#   SERVE_ARGS     extra flags for the server (environment)
#
# Every request is POST /v1/classify with one short text (benchmarks/support/status.lua).
# Columns: 2xx answers per second, the p50/p90/p99 of the 2xx answers alone (measured by
# the script from each request's send time), all answers per second, and the status mix.
# The goal of the SLO admission (docs/serving.md): 2xx/s at 512 connections >= 0.9x 2xx/s
# at 64, with the 2xx p99 within the server's --slo-p95-ms.
set -euo pipefail
cd "$(dirname "$0")/../.."

default_conns=(64 512)
source benchmarks/support/wrk_args.sh "$@"
source benchmarks/support/serve.sh

printf '%6s %9s %11s %11s %11s %9s  %s\n' conns "2xx/s" "2xx p50 ms" "2xx p90 ms" "2xx p99 ms" "all/s" statuses
start_server
for c in "${conns[@]}"; do
  wrk -t2 -c"$c" -d"${seconds}s" -s benchmarks/support/status.lua "http://127.0.0.1:$port/v1/classify" >"$work/wrk"
  field() { awk -v k="$1" '$1 == k {print $2}' "$work/wrk"; }
  printf '%6s %9s %11s %11s %11s %9s  %s\n' "$c" "$(field 2xx_rps)" "$(field 2xx_p50_ms)" "$(field 2xx_p90_ms)" \
    "$(field 2xx_p99_ms)" "$(awk '/^Requests\/sec:/ {print $2}' "$work/wrk")" "$(sed -n 's/^status //p' "$work/wrk")"
done
stop_server
