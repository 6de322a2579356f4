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

server=${1:-build/default/examples/tailbatch-serve}
seconds=${2:-10}
shift $(( $# > 2 ? 2 : $# )) || true
conns=("$@")
[[ ${#conns[@]} -eq 0 ]] && conns=(8 32 128)
for tool in wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "run.sh needs $tool (scripts/deps.sh --test installs it)" >&2; exit 1; }
done
[[ -x $server ]] || { echo "no server at $server: build the tailbatch-serve target first" >&2; exit 1; }

work=$(mktemp -d)
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/post.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"text": "a great, moving film with a brilliant script and superb acting"}'
EOF

clk_tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
stat_field() {  # stat_field PORT python-expression-over-j
  curl -s "http://127.0.0.1:$1/v1/stats" | python3 -c "import json,sys; j=json.load(sys.stdin); print($2)"
}

start_server() {
  "$server" --port 0 "$@" ${SERVE_ARGS:-} >"$work/out" 2>"$work/err" &
  pid=$!
  for _ in $(seq 200); do
    [[ -s $work/out ]] && break
    sleep 0.05
  done
  port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$work/out" | head -1)
  [[ -n $port ]] || { echo "server did not start:" >&2; cat "$work/err" >&2; exit 1; }
  for _ in $(seq 400); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz") == 200 ]] && return
    sleep 0.05
  done
  echo "server never became ready" >&2
  exit 1
}

stop_server() {
  kill -TERM "$pid"
  wait "$pid" || { echo "server exited non-zero" >&2; exit 1; }
  pid=
}

# wrk's latency lines read "50%  1.23ms"; print milliseconds.
wrk_ms() {
  awk -v p="$1" '$1 == p {v=$2; u=v; gsub(/[0-9.]/, "", u); sub(/[a-z]+$/, "", v);
    if (u == "us") v /= 1000; else if (u == "s") v *= 1000; else if (u == "m") v *= 60000; printf "%.2f", v}' "$2"
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
