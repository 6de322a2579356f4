#!/usr/bin/env python3
"""Summarises sets of benchmarks/adaptive/live.sh beyond its medians.

live.sh keeps each set's runs (run1.jsonl, run2.jsonl, ...) in a folder it makes under
$TMPDIR; give each set a TMPDIR of its own and pass those:

    TMPDIR=/tmp/sets/a benchmarks/adaptive/live.sh --runs 7
    benchmarks/adaptive/live_bands.py /tmp/sets/a [/tmp/sets/b ...]

For each set it prints:
  paired   rates meeting all goals when each rate is judged by the median of the runs'
           own adaptive-to-fixed ratios (live.sh judges the ratio of the medians);
  lower    runs whose adaptive saturation was below the fixed window's;
  and, per load band (up to 1100 rps, 1100-3000, above 3000), the geometric means over
  runs and rates of the adaptive-to-fixed ratios of p95, CPU per request and mean batch
  size, where both met the SLO in that run.
"""
import glob
import json
import math
import statistics
import sys

BANDS = (("<= 1100 rps", 0, 1100), ("1100-3000", 1100, 3000), ("> 3000", 3000, math.inf))


def gmean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def summarise(folder):
    files = sorted(glob.glob(f"{folder}/*/run*.jsonl"))
    if not files:
        sys.exit(f"live_bands.py: no run*.jsonl under {folder}/*/")
    runs = [[json.loads(l) for l in open(f) if l.strip()] for f in files]
    rates = [o["rate"] for o in runs[0] if "rate" in o]
    met = judged = 0
    for rate in rates:
        per = [o for r in runs for o in r if o.get("rate") == rate]
        fixed_ok = sum(o["fixed_ok"] for o in per) * 2 > len(per)
        adaptive_ok = sum(o["adaptive_ok"] for o in per) * 2 > len(per)
        if not fixed_ok and not adaptive_ok:
            continue
        judged += 1
        both = [o for o in per if o["fixed_ok"] and o["adaptive_ok"]]
        p95 = [o["adaptive_p95_ms"] / o["fixed_p95_ms"] for o in both]
        cpu = [o["adaptive_cpu_ms_per_request"] / o["fixed_cpu_ms_per_request"] for o in per
               if o["adaptive_cpu_ms_per_request"] and o["fixed_cpu_ms_per_request"]]
        ok = adaptive_ok or not fixed_ok
        if fixed_ok and adaptive_ok and p95 and statistics.median(p95) > 1.10:
            ok = False
        if cpu and statistics.median(cpu) > 1.05:
            ok = False
        met += ok
    sat = [next(o for o in r if "fixed_saturation_rps" in o) for r in runs]
    lower = sum(o["adaptive_saturation_rps"] < o["fixed_saturation_rps"] for o in sat)
    print(f"{folder}: {len(runs)} runs; paired: all goals met at {met} of {judged} rates; "
          f"lower saturation in {lower} of {len(sat)} runs")
    for name, lo, hi in BANDS:
        both = [o for r in runs for o in r
                if "rate" in o and lo < o["rate"] <= hi and o["fixed_ok"] and o["adaptive_ok"]]
        ratio = lambda k: gmean([o[f"adaptive_{k}"] / o[f"fixed_{k}"] for o in both])
        print(f"  {name:>11}: {len(both):3d} run-rates  p95 {ratio('p95_ms'):.3f}  "
              f"CPU {ratio('cpu_ms_per_request'):.3f}  batch {ratio('mean_batch'):.3f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for folder in sys.argv[1:]:
        summarise(folder)
