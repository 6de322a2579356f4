#!/usr/bin/env bash
# The goals of fair scheduling and queue policies (docs/performance.md, "Tenants and
# overload"), on the field guide's Example 1 profile (L(b) = 20 ms + 3 ms x (b - 1), 2
# lanes, max_batch 16, window 8 ms, p95 target 150 ms; capacity about 490 requests/s, 450
# within the target), with tailbatch-load:
#
#   benchmarks/fairness/run.sh [LOAD] [simulate|live] [SECONDS]
#     LOAD     tailbatch-load (default: build/default/tools/cli/tailbatch-load)
#     mode     simulate (default: the simulator, exact for the seed) or live (in-process,
#              the sleeping model on real threads)
#     SECONDS  per run (default 20; the first 5 are warm-up)
#
# 1. Noisy neighbour: tenant a at its fair share (a third of 480: 160 requests/s), then at
#    four times it (640), beside b and c at 20 % of capacity (96 each); fifo and fair, every
#    tenant's queue quota 1000 (--tenant-max-queued), so that a's excess is refused as its
#    own (quota_exceeded) instead of filling the queue for everyone.
# 2. Overload at 2x capacity (980 requests/s) with the default queue (4096), each queue
#    policy, clients that give up after 1 s (--request-timeout-ms 1000); CoDel's target
#    (also adaptive LIFO's) from CODEL_TARGET_MS (default 5, the library's default).
# Each line: the run's JSON (--json), reduced to the figures the goals read.
set -euo pipefail
cd "$(dirname "$0")/../.."
load=${1:-build/default/tools/cli/tailbatch-load}
mode=${2:-simulate}
secs=${3:-20}
[[ -x $load ]] || { echo "no tailbatch-load at $load: build the tailbatch-load target" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(--duration "$secs" --warmup 5 --slo-p95-ms 150 --quiet --json --out "$out")
[[ $mode == simulate ]] && flags+=(--simulate)
show() {  # the goals' figures of one JSON line
  python3 -c '
import json, sys
for line in sys.stdin:
    j = json.loads(line)
    t = " ".join("%s: offered %.0f p95 %.1f ms err %d" % (x["name"], x["offered_rps"], x["p95_ms"], x["errors"]) for x in j["tenants"])
    print("  achieved %.1f goodput %.1f p95 %.1f p99 %.1f errors %d %s" % (j["achieved_rps"], j["goodput_rps"], j["p95_ms"], j["p99_ms"], j["errors"], t))'
}
echo "noisy neighbour ($mode, $secs s)"
for sch in fifo fair; do
  for a in 160 640; do
    echo "$sch, a at $a/s:"
    "$load" "${flags[@]}" --tenant-mix "a:$a,b:96,c:96" --scheduling "$sch" --tenant-max-queued 1000 | show
  done
done
echo "overload at 2x capacity, 980/s ($mode, $secs s, codel target ${CODEL_TARGET_MS:-5} ms)"
for q in reject-newest shed-oldest adaptive-lifo codel; do
  echo "$q:"
  "$load" "${flags[@]}" --rate 980 --queue-policy "$q" --request-timeout-ms 1000 \
    --codel-target-ms "${CODEL_TARGET_MS:-5}" | show
done
