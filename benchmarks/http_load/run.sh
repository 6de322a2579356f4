#!/usr/bin/env bash
# What coordinated omission hides: tailbatch-serve under plain wrk (closed loop) and under
# tailbatch-load --url (open loop) at the same offered rates, on 127.0.0.1; then the load
# generator's own ceiling against a trivial endpoint.
#
#   benchmarks/http_load/run.sh [BUILD_DIR] [SECONDS]
#     BUILD_DIR  where examples/tailbatch-serve and tools/cli/tailbatch-load are
#                (default build/release; configure it with -DCMAKE_BUILD_TYPE=Release)
#     SECONDS    seconds per row (default 8; the first second of each open-loop row is
#                warm-up)
#   CONNS        connections for wrk and tailbatch-load (environment; default 16)
#   CEILING_RPS  the rate of the ceiling run (environment; default 20000)
#
# Part 1: wrk -c CONNS runs POST /v1/classify as fast as its connections allow and reports
# its throughput W and latency percentiles, each measured from when wrk sent the request.
# tailbatch-load then offers 0.5, 0.8, 1.0 and 1.2 x W (Poisson) over at most CONNS
# connections and reports latency from each request's intended send time, and beside it
# the same requests' latency from when they were actually written (the closed-loop view).
# Part 2: tailbatch-load offers CEILING_RPS to GET /healthz and reports what it achieved
# and its send lag: how late after the intended time each request reached the client's I/O
# thread (p50/p99/p99.9/max), and reached a socket.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${1:-build/release}
seconds=${2:-8}
conns=${CONNS:-16}
ceiling=${CEILING_RPS:-20000}
server=$build/examples/tailbatch-serve
load=$build/tools/cli/tailbatch-load
[[ -x $load ]] || { echo "no $load: build the tailbatch-load target first" >&2; exit 1; }
source benchmarks/support/serve.sh
body='{"text": "a great, moving film with a brilliant script and superb acting"}'

field() {  # field FILE python-expression-over-j
  python3 -c "import json,sys; j=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print($2)" "$1"
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
start_server
wrk -t1 -c"$conns" -d"${seconds}s" --latency -s "$work/post.lua" "http://127.0.0.1:$port/v1/classify" >"$work/wrk"
w=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$work/wrk")
echo
echo "POST /v1/classify, $conns connections, ${seconds} s per row"
printf '| %-34s | %10s | %9s | %9s | %9s | %16s |\n' "tool, offered load" "achieved/s" "p50 ms" "p99 ms" "max ms" \
  "p99 from send ms"
printf '|%s|%s|%s|%s|%s|%s|\n' "------------------------------------" "-----------:" "----------:" "----------:" \
  "----------:" "-----------------:"
printf '| %-34s | %10s | %9s | %9s | %9s | %16s |\n' "wrk -c$conns (closed loop)" "$w" "$(wrk_ms 50% "$work/wrk")" \
  "$(wrk_ms 99% "$work/wrk")" "$(to_ms "$(awk '/Latency/ && NF >= 5 {print $4; exit}' "$work/wrk")")" "(the same)"
for f in 0.5 0.8 1.0 1.2; do
  rate=$(awk -v w="$w" -v f="$f" 'BEGIN {printf "%.0f", w * f}')
  sleep 1
  "$load" --url "http://127.0.0.1:$port/v1/classify" --method POST --body "$body" --rate "$rate" \
    --duration "$seconds" --warmup 1 --connections "$conns" --slo-p95-ms 1000000 --json --quiet \
    --out "$work/plots" >"$work/json" 2>/dev/null
  printf '| %-34s | %10.0f | %9.2f | %9.2f | %9.2f | %16.2f |\n' "tailbatch-load, $f x wrk = $rate" \
    "$(field "$work/json" 'j["achieved_rps"]')" "$(field "$work/json" 'j["p50_ms"]')" \
    "$(field "$work/json" 'j["p99_ms"]')" "$(field "$work/json" 'j["max_ms"]')" \
    "$(field "$work/json" 'j["p99_from_send_ms"]')"
done
stop_server

echo
echo "ceiling: GET /healthz, 64 connections, ${seconds} s per row; server --io-threads 2 on the same machine"
start_server --io-threads 2
wrk -t1 -c64 -d"${seconds}s" --latency "http://127.0.0.1:$port/healthz" >"$work/wrk"
echo "wrk -c64 (closed loop, as fast as the server answers): $(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$work/wrk")/s," \
  "p50 $(wrk_ms 50% "$work/wrk") ms, p99 $(wrk_ms 99% "$work/wrk") ms"
printf '| %9s | %9s | %9s | %8s | %13s | %13s | %15s | %13s | %16s |\n' "offered/s" "sent/s" "2xx/s" "errors" \
  "send lag p50" "send lag p99" "send lag p99.9" "send lag max" "write lag p99"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' "----------:" "----------:" "----------:" "---------:" "--------------:" \
  "--------------:" "----------------:" "--------------:" "-----------------:"
for rate in $((ceiling / 4)) $((ceiling / 2)) "$ceiling"; do
  sleep 1
  "$load" --url "http://127.0.0.1:$port/healthz" --rate "$rate" --duration "$seconds" --warmup 1 \
    --connections 64 --slo-p95-ms 1000000 --json --quiet --out "$work/plots" >"$work/json" 2>/dev/null
  python3 - "$work/json" "$seconds" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
s, w = j["send_lag_ms"], j["write_lag_ms"]
print("| %9.0f | %9.0f | %9.0f | %8d | %10.3f ms | %10.3f ms | %12.3f ms | %10.3f ms | %13.3f ms |" %
      (j["offered_rps"], j["requests"] / float(sys.argv[2]), j["achieved_rps"], j["errors"], s["p50"], s["p99"],
       s["p999"], s["max"], w["p99"]))
PY
done
stop_server
