#!/usr/bin/env bash
# The AdaptiveWindow on the real clock: runs before_after_demo (its three setups: batching
# off, the fixed window, the AdaptiveWindow) three times at the same rates, and prints the
# medians per rate with the goals' met/missed verdict (docs/adaptive-window.md):
#   - p95: adaptive <= 1.10 x the fixed window's, where both meet the SLO;
#   - CPU per request: adaptive <= 1.05 x the fixed window's, at every rate both ran;
#   - saturation: adaptive >= the fixed window's.
#
#   benchmarks/adaptive/live.sh [--json] [--runs 3] [--quick] [--control] [--build build/default]
#                               [-- DEMO ARGS]
#
# The first run picks the rates (from the measured capacity); the others run the same
# rates (--rates). Each demo run interleaves its setups (at each rate: batching off, then
# the fixed and the adaptive window back to back, taking turns to go first); the runs
# alternate which of the two goes first at the first rate (--adaptive-first in runs 2, 4,
# ...), so that neither always goes first at a rate. --json prints one object per rate
# {rate, fixed_p95_ms, adaptive_p95_ms, fixed_cpu_ms_per_request,
# adaptive_cpu_ms_per_request, fixed_ok, adaptive_ok} and a last {fixed_saturation_rps,
# adaptive_saturation_rps}. A rate a setup did not reach (its sweep stopped at an earlier
# miss) counts as missed for it. LIVE_RUN_PREFIX, when set, is put
# before each demo run (e.g. a command that waits for a quiet machine). Exit status 1 when
# a goal is missed.
#
# --control is the A/A run: the demo's --control puts a second fixed window in the adaptive
# window's place, and the same goals are applied to it. Two runs of one setup differ by
# the machine's noise alone, so what a control run misses is the floor under what the
# adaptive run can be held to here (the "adapt" columns then hold the control's figures).
# -- DEMO ARGS go to every demo run, e.g. -- --step-s 6 for longer measured steps.
#
# The runs' results stay in ${TMPDIR:-/tmp}/tailbatch-live.*/run*.jsonl;
# benchmarks/adaptive/live_bands.py summarises sets of them further (paired ratios, bands).
set -euo pipefail
cd "$(dirname "$0")/../.."
json=0 runs=3 build=build/default quick=() control=()
demo_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --json) json=1; shift ;;
    --runs) runs=$2; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --control) control=(--control); shift ;;
    --build) build=$2; shift 2 ;;
    --) shift; demo_args=("$@"); break ;;
    *) echo "live.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
demo=$build/examples/before_after_demo
[[ -x $demo ]] || { echo "live.sh: build before_after_demo first ($demo)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tailbatch-live.XXXXXX")
prefix=()
[[ -n ${LIVE_RUN_PREFIX:-} ]] && read -r -a prefix <<<"$LIVE_RUN_PREFIX"

rates=()
for ((i = 1; i <= runs; i++)); do
  extra=()
  [[ ${#rates[@]} -gt 0 ]] && extra=(--rates "$(IFS=,; echo "${rates[*]}")")
  ((i % 2 == 0)) && extra+=(--adaptive-first)
  "${prefix[@]}" "$demo" "${quick[@]}" "${control[@]}" "${demo_args[@]}" "${extra[@]}" --out "$work/plots" \
    --results "$work/run$i.jsonl" >"$work/run$i.txt" 2>"$work/run$i.err"
  if [[ ${#rates[@]} -eq 0 ]]; then
    mapfile -t rates < <(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    if "rate" in o: print(int(o["rate"]))' "$work/run$i.jsonl")
  fi
  [[ $json == 1 ]] || grep -E "^(adaptive|control \(a second fixed window\)) vs the fixed window|^  saturation: (adaptive|control)" "$work/run$i.txt" | sed "s/^/run $i: /"
done

python3 - "$json" "${#control[@]}" "$work"/run*.jsonl <<'PY'
import json, statistics, sys
as_json = sys.argv[1] == "1"
is_control = sys.argv[2] != "0"
runs = [[json.loads(l) for l in open(f) if l.strip()] for f in sys.argv[3:]]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
rates = [o["rate"] for o in runs[0] if "rate" in o]
failed = False
rows = []
for rate in rates:
    per = [next(o for o in r if o.get("rate") == rate) for r in runs]
    row = {"rate": rate}
    for k in ("fixed_p95_ms", "adaptive_p95_ms", "fixed_cpu_ms_per_request", "adaptive_cpu_ms_per_request"):
        row[k] = med([o[k] for o in per])
    # A setup meets the SLO at a rate when it did in most runs.
    row["fixed_ok"] = sum(o["fixed_ok"] for o in per) * 2 > len(per)
    row["adaptive_ok"] = sum(o["adaptive_ok"] for o in per) * 2 > len(per)
    rows.append(row)
sat = [next(o for o in r if "fixed_saturation_rps" in o) for r in runs]
last = {"fixed_saturation_rps": med([o["fixed_saturation_rps"] for o in sat]),
        "adaptive_saturation_rps": med([o["adaptive_saturation_rps"] for o in sat])}
verdicts = []
for row in rows:
    f, a = row["fixed_p95_ms"], row["adaptive_p95_ms"]
    fc, ac = row["fixed_cpu_ms_per_request"], row["adaptive_cpu_ms_per_request"]
    if not row["fixed_ok"] and not row["adaptive_ok"]:
        verdicts.append("neither meets the SLO")
        continue
    why = []
    if row["fixed_ok"] and row["adaptive_ok"]:
        if a > 1.10 * f: why.append(f"p95 {a / f:.2f}x")
    elif not row["adaptive_ok"]:
        why.append("adaptive misses the SLO")
    if fc is not None and ac is not None and ac > 1.05 * fc: why.append(f"CPU {ac / fc:.2f}x")
    failed |= bool(why)
    verdicts.append("met" if not why else "MISSED: " + ", ".join(why))
if last["adaptive_saturation_rps"] < last["fixed_saturation_rps"]: failed = True
if as_json:
    for row in rows: print(json.dumps(row))
    print(json.dumps(last))
else:
    def f(x, d=2): return "-" if x is None else f"{x:.{d}f}"
    print(f"\nmedians of {len(runs)} runs of before_after_demo"
          + (" --control (A/A: the \"adapt\" columns are a second fixed window)" if is_control else ""))
    print(f"{'rate':>7} {'fixed p95':>10} {'adapt p95':>10} {'ratio':>6} {'fixed CPU':>10} {'adapt CPU':>10} {'ratio':>6} {'fixed':>6} {'adapt':>6}  verdict")
    for row, v in zip(rows, verdicts):
        r1 = row["adaptive_p95_ms"] / row["fixed_p95_ms"] if row["adaptive_p95_ms"] and row["fixed_p95_ms"] else None
        r2 = (row["adaptive_cpu_ms_per_request"] / row["fixed_cpu_ms_per_request"]
              if row["adaptive_cpu_ms_per_request"] and row["fixed_cpu_ms_per_request"] else None)
        print(f"{row['rate']:>7.0f} {f(row['fixed_p95_ms']):>10} {f(row['adaptive_p95_ms']):>10} {f(r1):>6} "
              f"{f(row['fixed_cpu_ms_per_request'], 3):>10} {f(row['adaptive_cpu_ms_per_request'], 3):>10} {f(r2):>6} "
              f"{'ok' if row['fixed_ok'] else 'miss':>6} {'ok' if row['adaptive_ok'] else 'miss':>6}  {v}")
    s = "met" if last["adaptive_saturation_rps"] >= last["fixed_saturation_rps"] else "MISSED"
    print(f"saturation: fixed {last['fixed_saturation_rps']:.0f} rps, adaptive {last['adaptive_saturation_rps']:.0f} rps: {s}")
sys.exit(1 if failed else 0)
PY
