#!/usr/bin/env bash
# How well the simulator predicts live runs: for each model and rate, a live in-process
# run of tailbatch-load is recorded (--record) and replayed (--simulate --replay), three
# times; prints the medians of measured and predicted p95 (and the simulator alone, with
# nothing measured put back) and whether the prediction is within 15 % of the measurement.
#
#   benchmarks/replay/fidelity.sh [--model sleep|classifier|both] [--runs 3] [--duration 3]
#                                 [--build build/default]
#
# The rates are 20 % to 90 % of each setup's capacity on a 2-core machine (tailbatch-load
# with the same flags, measured: about 490 rps for the sleeping model's setup, about
# 3900 rps for the classifier's); pass --rates-sleep / --rates-classifier to change them.
# Exit status 1 when a median misses the 15 % goal. Traces are left in $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
model=both runs=3 duration=3 build=build/default
rates_sleep="100 190 280 370 440"
rates_classifier="800 1500 2300 3000 3500"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --rates-sleep) rates_sleep=$2; shift 2 ;;
    --rates-classifier) rates_classifier=$2; shift 2 ;;
    *) echo "fidelity.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
tool=$build/tools/cli/tailbatch-load
[[ -x $tool ]] || { echo "fidelity.sh: build tailbatch-load first ($tool)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tailbatch-fidelity.XXXXXX")

status=0
run_model() {  # name, flags, rates
  local name=$1 flags=$2 rates=$3
  echo "### $name: $flags"
  echo
  echo "| rate (rps) | measured p95 (ms) | predicted p95 (ms) | error | simulator alone p95 (ms) | error | within 15 % |"
  echo "|---:|---:|---:|---:|---:|---:|:---|"
  for rate in $rates; do
    local lines=""
    for ((i = 1; i <= runs; i++)); do
      local trace=$work/$name-$rate-$i.trace
      # shellcheck disable=SC2086
      "$tool" $flags --rate "$rate" --duration "$duration" --warmup 1 --seed "$((41 + i))" --quiet \
        --record "$trace" --out "$work/out" >/dev/null 2>&1
      lines+=$("$tool" --simulate --replay "$trace" --json --seed "$i")$'\n'
    done
    python3 - "$rate" <<PY || status=1
import json, statistics, sys
rows = [json.loads(l) for l in """$lines""".splitlines() if l.strip()]
m = statistics.median(r["measured_p95_ms"] for r in rows)
p = statistics.median(r["predicted_p95_ms"] for r in rows)
b = statistics.median(r["plain_p95_ms"] for r in rows)
ok = abs(p - m) <= 0.15 * m
print(f"| {sys.argv[1]} | {m:.2f} | {p:.2f} | {(p - m) / m * 100:+.0f} % | {b:.2f} | {(b - m) / m * 100:+.0f} % | {'yes' if ok else 'NO'} |")
sys.exit(0 if ok else 1)
PY
  done
  echo
}

if [[ $model == sleep || $model == both ]]; then
  run_model sleep "--model sleep --lanes 2 --max-batch 16 --window-ms 8 --slo-p95-ms 100" "$rates_sleep"
fi
if [[ $model == classifier || $model == both ]]; then
  run_model classifier "--model classifier --lanes 1 --max-batch 32 --window-ms 0.5 --slo-p95-ms 50" "$rates_classifier"
fi
echo "($runs runs of ${duration} s per rate, medians; traces in $work)"
exit $status
