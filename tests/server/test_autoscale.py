#!/usr/bin/env python3
"""tailbatch-serve evaluates its Autoscaler live: starts the server (--port 0, 127.0.0.1
only) with a 0.2 s --autoscale-interval-s, puts classify requests on it, scrapes /metrics
and checks the decision and the inputs it used.

    test_autoscale.py /path/to/tailbatch-serve

A. --capacity-rps 1 and TAILBATCH_REPLICAS=3 (the environment, not the flag): the
   tailbatch_autoscaler_* series carry the Pipeline's labels ({pipeline="classify"});
   before any request the arrival input is 0 and 1 replica is recommended; under load the
   arrival rate, utilisation and p95 inputs move, and the desired count rises above the 3
   provisioned, at ceil(demand / (capacity x 0.7)); promtool
   accepts the exposition; SIGTERM stops the timer with the drain and the server exits 0.
   Rising, the desired count is the formula's recommendation at once: the server leaves
   HPA's rate limits to the HPA or KEDA object that follows it.
B. No --capacity-rps, --model-delay-ms 50 and batches of 4: the capacity used is the
   warm-up's measurement, above 0 and at most 4 / 0.05 s = 80 requests/s.
C. --autoscale-interval-s 0: no tailbatch_autoscaler_* series at all.

Every server it starts is killed when the test ends. Exits 0 on success, 1 on the first
failed check.
"""
import http.client
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import harness
from harness import check, fail, left

SERVE = sys.argv[1]


def series(body, name):
    """{labels text: value} of every sample of `name` in a Prometheus exposition."""
    out = {}
    for m in re.finditer(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name), body, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def value(body, name):
    s = series(body, name)
    if len(s) != 1:
        fail("expected one sample of %s, found %r" % (name, s))
    return next(iter(s.values()))


def scrape(srv):
    s, b = srv.http("GET", "/metrics")
    if s != 200:
        fail("/metrics answered %d" % s)
    return b.decode()


def wait_metrics(srv, pred, what, seconds=10):
    end = time.monotonic() + min(seconds, left())
    while time.monotonic() < end:
        b = scrape(srv)
        if pred(b):
            return b
        time.sleep(0.1)
    fail(what + "; last /metrics autoscaler lines:\n" +
         "\n".join(l for l in scrape(srv).splitlines() if l.startswith("tailbatch_autoscaler")))


def evaluations(b):
    s = series(b, "tailbatch_autoscaler_evaluations_total")
    return next(iter(s.values())) if s else 0.0


def load(srv, n):
    """n classify requests, one after another on one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    codes = []
    for i in range(n):
        conn.request("POST", "/v1/classify", json.dumps({"text": "a fine film, number %d" % i}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        codes.append(r.status)
    conn.close()
    return codes


def main():
    # ---- A -----------------------------------------------------------------------------
    os.environ["TAILBATCH_REPLICAS"] = "3"
    try:
        a = harness.Server(SERVE, "--autoscale-interval-s", "0.2", "--capacity-rps", "1", "--max-batch", "4",
                           "--warmup-rounds", "1", "--slo-p95-ms", "10000")
    finally:
        del os.environ["TAILBATCH_REPLICAS"]
    b = wait_metrics(a, lambda b: evaluations(b) >= 2, "no Autoscaler evaluation within 10 s of ready")
    desired = series(b, "tailbatch_autoscaler_desired_replicas")
    check(list(desired) == ['{pipeline="classify"}'],
          "/metrics has tailbatch_autoscaler_desired_replicas with the Pipeline's labels (%r)" % desired)
    for name in ["recommended_replicas", "current_replicas", "arrival_rate", "queue_depth", "in_flight",
                 "p95_seconds", "capacity_rps", "utilization", "inputs_consistent"]:
        check(list(series(b, "tailbatch_autoscaler_" + name)) == ['{pipeline="classify"}'],
              "/metrics has tailbatch_autoscaler_%s{pipeline=\"classify\"}" % name)
    check(value(b, "tailbatch_autoscaler_current_replicas") == 3,
          "current replicas come from TAILBATCH_REPLICAS (3)")
    check(value(b, "tailbatch_autoscaler_capacity_rps") == 1, "capacity comes from --capacity-rps (1)")
    check(value(b, "tailbatch_autoscaler_arrival_rate") == 0 and value(b, "tailbatch_autoscaler_recommended_replicas") == 1
          and 1 <= value(b, "tailbatch_autoscaler_desired_replicas") <= 3,
          "idle (the warm-up is not load): arrival rate 0, the minimum (1) recommended, desired in [1, 3]")

    before = evaluations(b)
    codes = load(a, 60)
    check(codes.count(200) == 60, "60 classify requests answered 200")
    # The gauges hold the last interval's readings: look while requests are arriving, so
    # that the scrape shows an interval that saw them. (One I/O thread: a scrape never
    # sees an evaluation half-exported.)
    def busy_interval(b):
        if (evaluations(b) >= before + 2 and value(b, "tailbatch_autoscaler_arrival_rate") > 0
                and value(b, "tailbatch_autoscaler_desired_replicas") > 3):
            return True
        load(a, 10)
        return False

    b = wait_metrics(a, busy_interval, "no evaluation under load saw arrivals and rose above the 3 provisioned")
    check(value(b, "tailbatch_autoscaler_desired_replicas") > 3,
          "under load at 1 request/s of capacity per replica the desired count rose above the 3 provisioned (%g)"
          % value(b, "tailbatch_autoscaler_desired_replicas"))
    check(value(b, "tailbatch_autoscaler_p95_seconds") > 0, "the p95 input moved (%g s)" %
          value(b, "tailbatch_autoscaler_p95_seconds"))
    rate = value(b, "tailbatch_autoscaler_arrival_rate")
    util = value(b, "tailbatch_autoscaler_utilization")
    check(rate > 0, "the arrival-rate input moved under load (%g requests/s for the fleet of 3)" % rate)
    queue = value(b, "tailbatch_autoscaler_queue_depth")
    check(util > 0 and abs(util - (rate + queue / 10.0) / 3.0) <= 1e-9 * util,
          "utilisation = (arrival + queue / 10 s) / (3 replicas x 1 request/s) = %g" % util)
    rec = value(b, "tailbatch_autoscaler_recommended_replicas")
    expected = min(100, max(1, math.ceil(util * 3 / 0.7 - 1e-9)))
    check(rec == expected, "recommended = ceil(demand / (1 request/s x 0.7)) = %d, clamped to [1, 100] (%g)"
          % (expected, rec))
    check(value(b, "tailbatch_autoscaler_desired_replicas") == rec,
          "scaling up, the desired count is the recommendation at once (no rate limit in the server: %g)"
          % value(b, "tailbatch_autoscaler_desired_replicas"))
    check(value(b, "tailbatch_autoscaler_current_replicas") == 3, "the fleet of 3 is still what was passed in")

    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=b.encode(), capture_output=True, timeout=20)
        check(r.returncode == 0, "promtool check metrics accepts /metrics with the autoscaler's series (%s)"
              % (r.stdout + r.stderr).decode().strip())
    else:
        print("skip promtool not found (Debian package prometheus; scripts/deps.sh --test)")

    rc = a.terminate()
    check(rc == 0, "SIGTERM stops the autoscale timer with the drain; exit 0 (exit %d)" % rc)

    # ---- B: the capacity measured by the warm-up ---------------------------------------
    bsrv = harness.Server(SERVE, "--autoscale-interval-s", "0.2", "--max-batch", "4", "--model-delay-ms", "50",
                          "--warmup-rounds", "2")
    b = wait_metrics(bsrv, lambda b: evaluations(b) >= 1, "no evaluation without --capacity-rps")
    cap = value(b, "tailbatch_autoscaler_capacity_rps")
    check(0 < cap <= 80.0, "without --capacity-rps the warm-up measures the capacity: %g requests/s "
                           "(batches of 4 that take >= 50 ms: at most 80)" % cap)
    check(value(b, "tailbatch_autoscaler_current_replicas") == 1 and value(b, "tailbatch_autoscaler_desired_replicas") >= 1,
          "--replicas defaults to 1; desired >= 1")
    bsrv.stop()

    # ---- C: off ------------------------------------------------------------------------
    csrv = harness.Server(SERVE, "--autoscale-interval-s", "0", "--max-batch", "2", "--warmup-rounds", "1")
    load(csrv, 3)
    time.sleep(0.5)
    check("tailbatch_autoscaler_" not in scrape(csrv), "--autoscale-interval-s 0: no tailbatch_autoscaler_* series")
    csrv.stop()


if __name__ == "__main__":
    harness.run(main, seconds=55)  # ctest's timeout is 60 s
    print("all checks passed")
