#!/usr/bin/env python3
"""Tests of `tailbatch-load --url` (open-loop HTTP load).

    test_http_load.py /path/to/tailbatch-load /path/to/tailbatch-serve

1. A short sweep against `tailbatch-serve --port 0`: one JSON object per rate with the
   documented fields, the status counts and errors adding up to the requests sent, a
   non-loopback host refused without --allow-remote; a generation workload's
   /v1/completions bodies (--shared-prefix, --prompt-len, --output-len) all answered 2xx.
2. Coordinated omission: a tiny HTTP server started here (127.0.0.1, port 0) answers at
   once except for one request, 1 s into the run, which it holds for 300 ms. Over one
   connection at 200 requests/s the requests due during the stall wait for it, so the
   open-loop p99 (from intended send times) must show the stall (>= 150 ms), while the
   latency of the very same requests counted from when they were actually written (what
   a closed-loop tool such as wrk reports, `p99_from_send_ms`) must not (< 100 ms): the
   stall is charged to one request there.

Every server started here is killed at the end, however the test ends. Exits 0 on
success, 1 on the first failed check.
"""
import http.server
import json
import subprocess
import sys
import tempfile
import threading
import time

import harness
from harness import check

LOAD = sys.argv[1]
SERVE = sys.argv[2] if len(sys.argv) > 2 else None


def run_load(*args, timeout=40):
    out = tempfile.mkdtemp(prefix="tailbatch-http-load-")
    p = subprocess.run([LOAD, "--quiet", "--json", "--out", out, *args], capture_output=True, text=True,
                       timeout=timeout)
    return p


def runs_of(p):
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


FIELDS = ["offered_rps", "achieved_rps", "p50_ms", "p95_ms", "p99_ms", "mean_batch", "errors", "status",
          "requests", "connect_errors", "timeouts", "io_errors", "p99_from_send_ms", "send_lag_ms"]


def test_serve():
    port = harness.Server(SERVE, ready=False).port
    p = run_load("--url", "http://127.0.0.1:%d/healthz" % port, "--sweep", "50,100", "--duration", "1.5",
                 "--warmup", "0.3", "--slo-p95-ms", "1000", "--connections", "8")
    check(p.returncode == 0, "sweep against tailbatch-serve exits 0 (stderr: %s)" % p.stderr[-400:])
    runs = runs_of(p)
    check(len(runs) == 2, "one JSON object per rate (got %d)" % len(runs))
    for r in runs:
        missing = [f for f in FIELDS if f not in r]
        check(not missing, "%s rps: JSON has every field (missing %s)" % (r["offered_rps"], missing))
        s = r["status"]
        total = s["2xx"] + s["429"] + s["503"] + s["504"] + s["other"] + r["errors"]
        check(total == r["requests"] and r["requests"] > 0,
              "%s rps: statuses + errors (%d) add up to the requests sent (%d)" % (r["offered_rps"], total,
                                                                                  r["requests"]))
        check(r["errors"] == r["connect_errors"] + r["timeouts"] + r["io_errors"], "errors are connect + timeout + io")
        check(s["2xx"] == r["requests"], "/healthz answers every request 200")
        check(r["p95_ms"] > 0 and r["achieved_rps"] > 0, "p95 and throughput measured")
        # Null unless classify batches ran meanwhile (the server's warm-up may still run).
        check(r["mean_batch"] is None or r["mean_batch"] >= 1.0, "mean_batch is null or a batch size")
    check(any(r.get("saturation") for r in runs) or not runs[0]["meets_slo"], "the saturation point is marked")
    # --tenant-mix over HTTP: each request names its tenant in X-Tenant; the run object has
    # the goodput and one entry per tenant.
    p = run_load("--url", "http://127.0.0.1:%d/healthz" % port, "--tenant-mix", "a:40,b:20", "--duration", "1.5",
                 "--warmup", "0.3", "--slo-p95-ms", "1000")
    runs = runs_of(p)
    check(p.returncode == 0 and len(runs) == 1, "--tenant-mix with --url: one run (%s)" % p.stderr[-300:])
    r = runs[0]
    ts = r.get("tenants", [])
    check([t["name"] for t in ts] == ["a", "b"] and all(
        set(t) >= {"name", "offered_rps", "achieved_rps", "p50_ms", "p95_ms", "p99_ms", "goodput_rps"} for t in ts),
        "the run object lists each tenant with its figures (%s)" % ts)
    check(ts[0]["offered_rps"] > ts[1]["offered_rps"] > 0 and 0 < r["goodput_rps"] <= r["achieved_rps"] + 1e-9
          and abs(sum(t["goodput_rps"] for t in ts) - r["goodput_rps"]) < 0.01,
          "tenant a offers more than b; the tenants' goodput adds up to the run's (%.1f)" % r["goodput_rps"])
    p = run_load("--url", "http://192.0.2.1:%d/healthz" % port, "--rate", "10", "--duration", "1", "--warmup", "0")
    check(p.returncode == 1 and "not a loopback address" in p.stderr, "a non-loopback host is refused")
    # The batch counters from /v1/stats when classify batches ran.
    p = run_load("--url", "http://localhost:%d/v1/classify" % port, "--method", "POST", "--body",
                 '{"text": "a fine film"}', "--rate", "20", "--duration", "1.5", "--warmup", "0.2",
                 "--slo-p95-ms", "5000")
    runs = runs_of(p)
    check(p.returncode == 0 and len(runs) == 1, "one run against /v1/classify")
    check(runs[0]["status"]["2xx"] > 0, "classify answered 2xx")
    check(runs[0]["mean_batch"] is not None and runs[0]["mean_batch"] >= 1.0,
          "mean_batch from /v1/stats (%s)" % runs[0]["mean_batch"])
    # A generation workload over HTTP: the workload flags make /v1/completions bodies (a shared
    # prefix, words of each request's own, max_tokens drawn from --output-len), and the
    # server answers every one (the prompt stays within its --gen-max-prompt-tokens).
    p = run_load("--url", "http://127.0.0.1:%d/v1/completions" % port, "--method", "POST",
                 "--shared-prefix", "40", "--prompt-len", "8", "--output-len", "geometric:4",
                 "--max-tokens", "8", "--rate", "10", "--duration", "1.5", "--warmup", "0.2",
                 "--slo-p95-ms", "5000")
    runs = runs_of(p)
    check(p.returncode == 0 and len(runs) == 1, "one generation run against /v1/completions (%s)" % p.stderr[-300:])
    check(runs[0]["requests"] > 0 and runs[0]["status"]["2xx"] == runs[0]["requests"],
          "every generated /v1/completions body answered 2xx (%s of %d)" % (runs[0]["status"], runs[0]["requests"]))


class StallHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else Nagle and delayed ACKs add 40 ms to every answer
    first = None
    stalled = False
    lock = threading.Lock()

    def do_GET(self):
        now = time.monotonic()
        with StallHandler.lock:
            if StallHandler.first is None:
                StallHandler.first = now
            stall = not StallHandler.stalled and now - StallHandler.first >= 1.0
            if stall:
                StallHandler.stalled = True
        if stall:
            time.sleep(0.3)
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()  # flushes the headers
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_stall():
    server = http.server.HTTPServer(("127.0.0.1", 0), StallHandler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        port = server.server_address[1]
        p = run_load("--url", "http://127.0.0.1:%d/" % port, "--rate", "200", "--arrivals", "constant",
                     "--duration", "3", "--warmup", "0", "--connections", "1", "--slo-p95-ms", "1000")
        runs = runs_of(p)
        check(p.returncode == 0 and len(runs) == 1, "one run against the stalling server (%s)" % p.stderr[-300:])
        r = runs[0]
        check(StallHandler.stalled, "the server stalled once")
        print("     open loop p99 %.1f ms, from actual send p99 %.1f ms, max %.1f ms" %
              (r["p99_ms"], r["p99_from_send_ms"], r["max_ms"]))
        check(r["max_ms"] >= 250, "the stalled request itself took >= 250 ms")
        check(r["p99_ms"] >= 150, "open loop: the stall shows in p99 (%.1f ms >= 150)" % r["p99_ms"])
        check(r["p99_from_send_ms"] < 100,
              "closed-loop view of the same requests hides it (p99 from actual send %.1f ms < 100)" %
              r["p99_from_send_ms"])
    finally:
        server.shutdown()
        server.server_close()


def main():
    if SERVE:
        test_serve()
    test_stall()


harness.run(main, seconds=80)  # ctest allows 90 s
print("PASS")
