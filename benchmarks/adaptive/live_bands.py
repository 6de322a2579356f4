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
  size, where both met the SLO in that run;
  and, where the runs carry the planner's figures (the demo's "planner vs measured"), per
  band: the geometric means (10th-90th percentiles) of predicted over measured p95 for the
  fixed window and for the adaptive window's plan, the median of how far the plan's rate was from the offered
  one, in how many run-rates the plan's window was longer than the fixed window's
  (0.5 ms, or --window-ms=X before the folders when the demo ran with another), and the
  p95 and CPU ratios (geometric means) of those run-rates and of the others;
  with --per-rate, per rate across the runs: the range of the planner's predicted p95
  for the fixed window, of the fixed window's measured p95, and of the plan's window and
  batch size (and of the cost of a batch of one the planner had learned, where the runs
  carry it); and the correlation across runs of the predicted and the measured p95 of the
  fixed window per band (logs, each over its rate's mean, at the rates where the fixed
  window met the SLO in every run), and of each with the learned cost; and, where both
  met the SLO, the correlation of the learned cost's move with the plan's window and with
  the adaptive-to-fixed p95 and CPU ratios.
"""
import glob
import json
import math
import statistics
import sys

BANDS = (("<= 1100 rps", 0, 1100), ("1100-3000", 1100, 3000), ("> 3000", 3000, math.inf))


def corr(xs, ys):
    """Pearson's correlation, or nan where one side does not vary."""
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return float("nan")


def centred(xs):
    """Each value less the mean of them all: a run's move over its rate's mean."""
    mean = statistics.mean(xs)
    return [x - mean for x in xs]


def gmean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def summarise(folder, window_ms, per_rate):
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
        planned = [o for o in both if o.get("adaptive_predicted_p95_ms")]
        if planned:
            # The planner's picture against the live run (the demo's "planner vs measured").
            def span(xs):  # geometric mean (10th-90th percentile)
                q = statistics.quantiles(xs, n=10) if len(xs) > 1 else xs * 9
                return f"{gmean(xs):.3f} ({q[0]:.2f}-{q[-1]:.2f})"
            fixed = span([o["predicted_fixed_p95_ms"] / o["fixed_p95_ms"] for o in planned])
            own = span([o["adaptive_predicted_p95_ms"] / o["adaptive_p95_ms"] for o in planned])
            rate = statistics.median(
                [abs(o["adaptive_plan_rate_rps"] / o["rate"] - 1.0) for o in planned])
            wider = [o for o in planned if o["adaptive_plan_window_ms"] > window_ms]
            print(f"  {'':>11}  predicted/measured p95: fixed window {fixed}, adaptive "
                  f"plan {own}; plan rate off by {rate * 100:.1f} % (median); "
                  f"plan window over the fixed window's in {len(wider)} of {len(planned)}")
            narrower = [o for o in planned if o["adaptive_plan_window_ms"] <= window_ms]
            side = lambda rs, k: gmean([o[f"adaptive_{k}"] / o[f"fixed_{k}"] for o in rs])
            print(f"  {'':>11}  plan window longer: p95 {side(wider, 'p95_ms'):.2f} "
                  f"CPU {side(wider, 'cpu_ms_per_request'):.2f}; not longer: p95 "
                  f"{side(narrower, 'p95_ms'):.2f} CPU {side(narrower, 'cpu_ms_per_request'):.2f}")
    if per_rate:
        # Per rate, across the runs: how far the planner's picture moves from run to run
        # against how far the measured p95 does.
        # Per band: predicted, measured, L(1) moves; then, where both met the SLO, the L(1)
        # move, the plan's window and the adaptive-to-fixed p95 and CPU ratios (logs).
        moved = {name: ([], [], []) for name, _, _ in BANDS}
        paired = {name: ([], [], [], []) for name, _, _ in BANDS}
        has_l1 = any(o.get("adaptive_learned_l1_ms") for r in runs for o in r)
        print(f"  {'rate':>6} {'predicted fixed p95':>20} {'measured fixed p95':>19} "
              f"{'plan window ms':>15} {'plan batch':>11}" + (f" {'learned L(1) ms':>16}" if has_l1 else ""))
        for rate in rates:
            per = [o for r in runs for o in r
                   if o.get("rate") == rate and o.get("predicted_fixed_p95_ms")
                   and o.get("fixed_p95_ms")]
            if not per:
                continue
            band = next(name for name, lo, hi in BANDS if lo < rate <= hi)
            rng = lambda k, f="{:.2f}": "-".join(
                f.format(x) for x in (min(o[k] for o in per), max(o[k] for o in per)))
            l1 = f" {rng('adaptive_learned_l1_ms', '{:.3f}'):>16}" if has_l1 else ""
            print(f"  {rate:>6} {rng('predicted_fixed_p95_ms'):>20} {rng('fixed_p95_ms'):>19} "
                  f"{rng('adaptive_plan_window_ms'):>15} {rng('adaptive_plan_batch', '{:.0f}'):>11}{l1}")
            if len(per) > 1 and all(o["fixed_ok"] for o in per):
                # Each run's log over its rate's mean log: a run's move, robust to the one
                # run whose prediction was ten times the others'.
                moves = lambda k: centred([math.log(o[k]) for o in per])
                xs, ys, ls = moved[band]
                xs += moves("predicted_fixed_p95_ms")
                ys += moves("fixed_p95_ms")
                if has_l1 and all((o.get("adaptive_learned_l1_ms") or 0) > 0 for o in per):
                    ls += moves("adaptive_learned_l1_ms")
            both = [o for o in per if o["fixed_ok"] and o["adaptive_ok"]
                    and (o.get("adaptive_learned_l1_ms") or 0) > 0]
            if has_l1 and len(both) > 1:
                l1, win, p95, cpu = paired[band]
                l1 += centred([math.log(o["adaptive_learned_l1_ms"]) for o in both])
                win += centred([o["adaptive_plan_window_ms"] for o in both])
                p95 += centred([math.log(o["adaptive_p95_ms"] / o["fixed_p95_ms"]) for o in both])
                cpu += centred([math.log(o["adaptive_cpu_ms_per_request"] /
                                         o["fixed_cpu_ms_per_request"]) for o in both])
        # Across runs, per band (logs, each over its rate's mean): whether a run the planner
        # saw as slower also measured slower (the machine's state, which both see) or the two
        # move apart (the planner's own noise); and whether both move with the cost of a
        # batch of one the planner had learned.
        for name, (xs, ys, ls) in moved.items():
            if len(xs) < 3:
                continue
            line = (f"  {name:>11}: correlation across runs, predicted and measured fixed-window "
                    f"p95 {corr(xs, ys):.2f} ({len(xs)} run-rates)")
            if len(ls) == len(xs):
                line += (f"; with the learned L(1): predicted {corr(xs, ls):.2f}, "
                         f"measured {corr(ys, ls):.2f}; L(1) over its rate's "
                         f"geometric mean {math.exp(min(ls)):.2f}-{math.exp(max(ls)):.2f}")
            print(line)
            l1, win, p95, cpu = paired[name]
            if len(l1) > 2:
                # A run that learned a slower model: does it plan longer windows, and does
                # that cost p95 or save CPU against the fixed window of the same run?
                print(f"  {'':>11}  with the learned L(1)'s move: plan window "
                      f"{corr(l1, win):.2f}, adaptive/fixed p95 "
                      f"{corr(l1, p95):.2f}, CPU {corr(l1, cpu):.2f} "
                      f"({len(l1)} run-rates)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    args = sys.argv[1:]
    window_ms = 0.5  # the demo's --window-ms default, the fixed window live.sh compares with
    per_rate = False
    while args and args[0].startswith("--"):
        opt = args.pop(0)
        if opt.startswith("--window-ms="):
            window_ms = float(opt.split("=", 1)[1])
        elif opt == "--per-rate":
            per_rate = True
        else:
            sys.exit(f"live_bands.py: unknown option {opt}\n{__doc__}")
    if not args:
        sys.exit(__doc__)
    for folder in args:
        summarise(folder, window_ms, per_rate)
