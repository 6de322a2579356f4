#!/usr/bin/env bash
# Streamed POST /v1/completions under open-loop load from tailbatch-load --url, at three
# rates: time to first token and inter-token latency (p50/p95/p99), tokens/s, and the
# server's CPU time per token. Each request streams max_tokens 32 (SSE); tailbatch-load
# times the whole response, the token timings come from the server's own
# tailbatch_generation_* histograms (emission by the decode loop, the difference of two
# scrapes around each run, percentiles interpolated within buckets as Prometheus does),
# the CPU from /proc/PID/stat around each run. Run it on a quiet machine (nothing else
# running) when the numbers are to be recorded.
#
#   benchmarks/openai/run.sh [BUILD_DIR] [RATES] [SECONDS]   (build/default, "20 80 200", 8)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/default}
rates=${2:-"20 80 200"}
seconds=${3:-8}
server=$build/examples/tailbatch-serve
load=$build/tools/cli/tailbatch-load
[[ -x $load ]] || { echo "no tailbatch-load at $load: build the tailbatch-load target" >&2; exit 1; }
source benchmarks/support/serve.sh

start_server --gen-max-active 64 --gen-max-waiting 4096 --io-threads 2 --warmup-rounds 1
body='{"model": "tailbatch-reference-generator", "prompt": "the river runs by the old town", "max_tokens": 32, "stream": true, "temperature": 0.8}'
ticks=$(getconf CLK_TCK)
printf '%-8s %-10s %-26s %-26s %-10s %-12s %s\n' rate 2xx/sent "TTFT p50/p95/p99 ms" "inter-token p50/p95/p99 ms" tokens/s "CPU us/token" "e2e p99 ms (client)"
for rate in $rates; do
  curl -s "http://127.0.0.1:$port/metrics" >"$work/m0"
  cpu0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  t0=$(date +%s.%N)
  "$load" --url "http://127.0.0.1:$port/v1/completions" --method POST --body "$body" \
    --header "Content-Type: application/json" --rate "$rate" --duration "$seconds" --warmup 1 \
    --connections 512 --json --quiet --out "$work/plots" >"$work/load.json" 2>/dev/null
  t1=$(date +%s.%N)
  cpu1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  curl -s "http://127.0.0.1:$port/metrics" >"$work/m1"
  python3 - "$work/m0" "$work/m1" "$work/load.json" "$rate" "$cpu0" "$cpu1" "$ticks" "$t0" "$t1" <<'PY'
import json, re, sys
m0, m1, lj, rate, cpu0, cpu1, ticks, t0, t1 = sys.argv[1:]

def scrape(path):
    out = {}
    for line in open(path):
        m = re.match(r'^(tailbatch_generation_\w+)\{model="generate"(?:,le="([^"]+)")?\} (\S+)', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out

a, b = scrape(m0), scrape(m1)

def pct(name, q):
    buckets = sorted(((float("inf") if le == "+Inf" else float(le)), b[(n, le)] - a.get((n, le), 0.0))
                     for (n, le) in b if n == name + "_bucket")
    total = buckets[-1][1]
    if total <= 0:
        return float("nan")
    rank, prev_le, prev_c = q * total, 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le * 1e3
            return (prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)) * 1e3
        prev_le, prev_c = le, c
    return float("nan")

tok = lambda d: d.get(("tailbatch_generation_tokens_total", None), 0.0)
tokens = tok(b) - tok(a)
wall = float(t1) - float(t0)
cpu_s = (float(cpu1) - float(cpu0)) / float(ticks)
r = [json.loads(l) for l in open(lj) if l.strip().startswith("{")][-1]
tt = "/".join("%.2f" % pct("tailbatch_generation_time_to_first_token_seconds", q) for q in (.5, .95, .99))
it = "/".join("%.2f" % pct("tailbatch_generation_inter_token_seconds", q) for q in (.5, .95, .99))
print("%-8s %-10s %-26s %-26s %-10.0f %-12.1f %.1f" % (rate, "%d/%d" % (r["status"]["2xx"], r["requests"]), tt, it,
      tokens / wall, 1e6 * cpu_s / max(tokens, 1), r["p99_ms"]))
PY
done
stop_server
