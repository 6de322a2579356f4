#!/usr/bin/env python3
"""Two tailbatch-serve replicas scraped by a real Prometheus server (ctest prometheus_fleet,
label prometheus).

    fleet_test.py --serve SERVE --load LOAD --rules RULES.yaml --dashboard DASH.json --work DIR
                  [--prometheus PROMETHEUS] [--seconds 8]

1. Starts two tailbatch-serve replicas (127.0.0.1, --port 0) and Debian's `prometheus` on
   127.0.0.1 with a generated configuration that scrapes both every second and loads the
   recording and alerting rules of deploy/prometheus/.
2. Puts open-loop load on both with `tailbatch-load --url`: Poisson classify requests on
   each replica, and a little generation (POST /v1/generate) so that time to first token
   and tokens per second have data.
3. Once Prometheus has scraped the final counts, queries its HTTP API and checks, for the
   server's per-route request duration (tailbatch_serve_request_duration_seconds, where
   it is exported) and the Pipeline's end-to-end latency (which counts from the same
   arrival, the headers read):
   - request counts: each replica's responses_total, and what each latency family's
     `_count` grew by during the load (`x - x @ t0`), equal the responses its load
     generator received, and their sums over the fleet the total;
   - the fleet's p99 from summed buckets, histogram_quantile(0.99, sum by (le)
     (rate(..._bucket[1m]))) and the same over the counters' growth during the load,
     against the load generators' own p99s: a server sees each request for less time than its client (from
     the moment the request was written), so the server's true p99 lies at or below the
     client's; the estimate is within the buckets' error e of the server's true p99. Each
     replica's p99 is checked against its own generator; the fleet's, whose true value
     lies between the replicas', against both. Upper bound: (1 + e) x client p99 (what
     the server measures is part of what the client measures). Lower: (1 - e) x (client
     p99 - d), d = 3 ms + 15 % of it for the time a request spends on its way in and out of
     the server (on a loaded 2-core machine the load generators, the replicas and
     Prometheus share the cores, and a request's wait for one shows in the client's time
     only). e is computed from the `le` bounds the replicas really export;
   - the Autoscaler's tailbatch_autoscaler_desired_replicas is visible for each replica;
   - every rule group loaded and evaluates without error, and the recorded fleet p99 has
     data;
   - every PromQL expression of the Grafana dashboard parses and returns data (at least
     one finite sample), with $__rate_interval as 1m and $slo_le as the exported bound at
     the replicas' SLO (or the largest one below it).
Everything it starts binds 127.0.0.1 only, runs a bounded time (the whole test gives up
after 150 s) and is stopped by it, whatever happens. Exits 0 when every check passes, 1
otherwise, listing each failure.
"""
import argparse
import atexit
import json
import math
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

DEADLINE = time.monotonic() + 150
SLO_MS = 100.0       # the replicas' --slo-p95-ms
DELTA_S = 0.003      # a request's way in and out of the server, beyond what it measures,
DELTA_SHARE = 0.15   # ... plus this share of the client's p99
failures = []
procs = []


def left():
    return DEADLINE - time.monotonic()


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def give_up(why):
    print("FAIL " + why, flush=True)
    failures.append(why)
    raise SystemExit(1)


def stop_all():
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


atexit.register(stop_all)
signal.signal(signal.SIGTERM, lambda *_: give_up("terminated (ctest timeout?)"))


def start(args, **kw):
    p = subprocess.Popen(args, start_new_session=True, **kw)
    procs.append(p)
    return p


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replica(serve, name):
    p = start([serve, "--host", "127.0.0.1", "--port", "0", "--warmup-rounds", "1",
               "--autoscale-interval-s", "0.5", "--replicas", "2", "--slo-p95-ms", str(SLO_MS),
               "--stats-window-s", "60"],
              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    if not sel.select(timeout=min(20, left())):
        give_up("%s: tailbatch-serve printed no 'listening on' line within 20 s" % name)
    line = p.stdout.readline()
    m = re.match(r"listening on 127\.0\.0\.1:(\d+)", line)
    if not m:
        give_up("%s: unexpected first line %r" % (name, line))
    port = int(m.group(1))
    end = time.monotonic() + min(30, left())
    while time.monotonic() < end:
        try:
            if http_get("http://127.0.0.1:%d/readyz" % port, timeout=2)[0] == 200:
                print("%s: tailbatch-serve ready on 127.0.0.1:%d" % (name, port), flush=True)
                return port
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.1)
    give_up("%s: tailbatch-serve not ready within 30 s" % name)


class Prometheus:
    def __init__(self, binary, work, targets, rules):
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                    "rule_files:\n  - %s\n"
                    "scrape_configs:\n  - job_name: tailbatch-serve\n    static_configs:\n"
                    "      - targets: [%s]\n" % (json.dumps(rules), ", ".join('"%s"' % t for t in targets)))
        self.log = open(os.path.join(work, "prometheus.log"), "w")
        self.proc = start([binary, "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(work, "data"),
                           "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn"],
                          stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + min(30, left())
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                give_up("prometheus exited (%d); its log: %s" % (self.proc.returncode, self.log.name))
            try:
                if http_get(self.base + "/-/ready", timeout=2)[0] == 200:
                    print("prometheus ready on 127.0.0.1:%d, scraping %s every 1 s" % (self.port, ", ".join(targets)),
                          flush=True)
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        give_up("prometheus not ready within 30 s (log: %s)" % self.log.name)

    def api(self, path, **params):
        url = self.base + "/api/v1/" + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read().decode())
        except urllib.error.HTTPError as e:  # 400 bad_data: a query that does not parse
            return json.loads(e.read().decode())

    def query(self, expr):
        """The instant vector of expr: [(labels, value)], or raises with Prometheus' error."""
        r = self.api("query", query=expr)
        if r.get("status") != "success":
            raise ValueError("%s: %s" % (r.get("errorType"), r.get("error")))
        if r["data"]["resultType"] == "scalar":
            return [({}, float(r["data"]["result"][1]))]
        return [(s["metric"], float(s["value"][1])) for s in r["data"]["result"]]

    def scalar(self, expr):
        v = self.query(expr)
        return v[0][1] if len(v) == 1 else float("nan")


def run_load(load, url, body, rate, seconds, seed, out):
    return start([load, "--url", url, "--method", "POST", "--body", body, "--header", "Content-Type: application/json",
                  "--rate", str(rate), "--duration", str(seconds), "--warmup", "0", "--arrivals", "poisson",
                  "--seed", str(seed), "--connections", "32", "--json", "--quiet", "--out", out],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def load_result(p, what):
    try:
        out, err = p.communicate(timeout=max(1, left()))
    except subprocess.TimeoutExpired:
        give_up("%s: tailbatch-load did not finish" % what)
    if p.returncode != 0 or not out.strip():
        give_up("%s: tailbatch-load failed (%d): %s" % (what, p.returncode, err.strip()[-2000:]))
    r = json.loads(out.strip().splitlines()[-1])
    r["responses"] = sum(r["status"].values())
    return r


def finite(x):
    return isinstance(x, float) and math.isfinite(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--load", required=True)
    ap.add_argument("--rules", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--prometheus", default=shutil.which("prometheus"))
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args()
    if not a.prometheus:
        give_up("prometheus not found, so nothing was scraped. Install Debian's prometheus package "
                "(scripts/deps.sh --test) and run the test again.")
    os.makedirs(a.work, exist_ok=True)
    work = tempfile.mkdtemp(prefix="prometheus_fleet.", dir=a.work)
    atexit.register(shutil.rmtree, work, True)

    ports = [start_replica(a.serve, "replica a"), start_replica(a.serve, "replica b")]
    instances = ["127.0.0.1:%d" % p for p in ports]
    prom = Prometheus(a.prometheus, work, instances, os.path.abspath(a.rules))

    # Both targets up: Prometheus parsed each replica's exposition.
    end = time.monotonic() + min(20, left())
    while time.monotonic() < end:
        targets = prom.api("targets")["data"]["activeTargets"]
        if len(targets) == 2 and all(t["health"] == "up" for t in targets):
            break
        time.sleep(0.2)
    check(len(targets) == 2 and all(t["health"] == "up" for t in targets),
          "prometheus scrapes both replicas (%s)" % "; ".join("%s %s %s" % (t["scrapeUrl"], t["health"], t["lastError"])
                                                             for t in targets))

    # The latency families to check: the server's per-route request duration when it
    # exports it, and always the Pipeline's end-to-end latency (from the same arrival).
    families = []
    if prom.query('tailbatch_serve_request_duration_seconds_count{route="classify"}'):
        families.append(("tailbatch_serve_request_duration_seconds", 'route="classify"'))
    else:
        print("tailbatch_serve_request_duration_seconds{route=\"classify\"} is not exported: checking the "
              "Pipeline's histograms only", flush=True)
    families.append(("tailbatch_pipeline_end_to_end_seconds", 'pipeline="classify"'))

    # Before the load: every replica scraped at least once more, and the time noted, so
    # that `x - x @ t0` is exactly what the load added (the Pipeline's counts include its
    # warm-up).
    time.sleep(2.5)
    t0 = time.time()
    time.sleep(0.5)

    # Open-loop load: classify on both replicas, a little generation on both.
    print("load: %g s of Poisson arrivals, 100 classify/s and 5 generate/s on each replica" % a.seconds, flush=True)
    classify, generate = [], []
    for i, port in enumerate(ports):
        classify.append(run_load(a.load, "http://127.0.0.1:%d/v1/classify" % port, '{"text": "the fleet p99"}',
                                 100, a.seconds, 11 + i, os.path.join(work, "load-c%d" % i)))
        generate.append(run_load(a.load, "http://127.0.0.1:%d/v1/generate" % port,
                                 '{"prompt": "hello fleet", "max_tokens": 8}', 5, a.seconds, 21 + i,
                                 os.path.join(work, "load-g%d" % i)))
    c = [load_result(p, "classify load on replica %s" % "ab"[i]) for i, p in enumerate(classify)]
    g = [load_result(p, "generate load on replica %s" % "ab"[i]) for i, p in enumerate(generate)]
    for i in range(2):
        print("replica %s: classify %d responses (%s), p99 %.3f ms, p99 from send %.3f ms; generate %d responses"
              % ("ab"[i], c[i]["responses"], c[i]["status"], c[i]["p99_ms"], c[i]["p99_from_send_ms"],
                 g[i]["responses"]), flush=True)

    # Wait for the scrape that has every response (the load generators are done).
    want = [c[i]["responses"] for i in range(2)]
    responses_expr = 'sum(tailbatch_serve_responses_total{route="classify",instance="%s"})'
    end = time.monotonic() + min(15, left())
    while time.monotonic() < end:
        have = [prom.scalar(responses_expr % inst) for inst in instances]
        if have == want:
            break
        time.sleep(0.25)
    time.sleep(1.5)  # and one more scrape and rule evaluation after it

    # Request counts: per replica, and summed over the fleet.
    for i, inst in enumerate(instances):
        r = prom.scalar(responses_expr % inst)
        check(r == want[i], "replica %s: responses_total %g equals its load generator's %d responses"
              % ("ab"[i], r, want[i]))
        for name, sel in families:
            n = prom.scalar('%s_count{%s,instance="%s"} - %s_count{%s,instance="%s"} @ %.3f'
                            % (name, sel, inst, name, sel, inst, t0))
            check(n == want[i], "replica %s: %s_count grew by %g, its load generator's %d responses"
                  % ("ab"[i], name, n, want[i]))
    fleet_r = prom.scalar('sum(tailbatch_serve_responses_total{route="classify"})')
    check(fleet_r == sum(want), "fleet: responses_total summed over the replicas %g equals the %d responses"
          % (fleet_r, sum(want)))
    for name, sel in families:
        n = prom.scalar('sum(%s_count{%s}) - sum(%s_count{%s} @ %.3f)' % (name, sel, name, sel, t0))
        check(n == sum(want), "fleet: %s_count summed over the replicas grew by %g, the %d responses"
              % (name, n, sum(want)))
    gen_n = prom.scalar('sum(tailbatch_serve_responses_total{route="generate"})')
    check(gen_n == sum(r["responses"] for r in g), "fleet: generate responses_total %g equals its %d responses"
          % (gen_n, sum(r["responses"] for r in g)))

    client = [c[i]["p99_from_send_ms"] / 1e3 for i in range(2)]
    for name, sel in families:
        # The buckets' error, from the bounds the replicas really export.
        les = sorted({float(x[0]["le"]) for x in prom.query('group by (le) (%s_bucket{%s})' % (name, sel))
                      if x[0]["le"] != "+Inf"})
        error = max((hi - lo) / lo for lo, hi in zip(les, les[1:])) if len(les) > 1 else float("nan")
        check(finite(error), "%s: %d bounds from %g to %g s; error of a quantile within one: %.3f"
              % (name, len(les), les[0] if les else 0, les[-1] if les else 0, error))

        def within(estimate, low_client, high_client, what):
            upper = (1 + error) * high_client
            delta = DELTA_S + DELTA_SHARE * low_client
            lower = (1 - error) * (low_client - delta)
            check(finite(estimate) and lower <= estimate <= upper,
                  "%s: %.3f ms within [%.3f, %.3f] ms (client p99 from send %.3f..%.3f ms, error %.2f, d %.3f ms)"
                  % (what, estimate * 1e3, lower * 1e3, upper * 1e3, low_client * 1e3, high_client * 1e3, error,
                     delta * 1e3))

        for i, inst in enumerate(instances):
            est = prom.scalar('histogram_quantile(0.99, sum by (le) (rate(%s_bucket{%s,instance="%s"}[1m])))'
                              % (name, sel, inst))
            within(est, client[i], client[i], "replica %s p99 from its %s buckets" % ("ab"[i], name))
        fleet_rate = prom.scalar('histogram_quantile(0.99, sum by (le) (rate(%s_bucket{%s}[1m])))' % (name, sel))
        within(fleet_rate, min(client), max(client),
               "fleet p99, histogram_quantile(0.99, sum by (le) (rate(%s_bucket[1m])))" % name)
        fleet_delta = prom.scalar('histogram_quantile(0.99, sum by (le) (%s_bucket{%s} - %s_bucket{%s} @ %.3f))'
                                  % (name, sel, name, sel, t0))
        within(fleet_delta, min(client), max(client), "fleet p99 over the summed counters' growth (%s)" % name)
    print("the load generators' open-loop p99s (from intended send): %.3f and %.3f ms"
          % (c[0]["p99_ms"], c[1]["p99_ms"]), flush=True)

    # The Autoscaler's decision, from each replica.
    desired = prom.query('tailbatch_autoscaler_desired_replicas{pipeline="classify"}')
    check(sorted(s[0].get("instance") for s in desired) == sorted(instances) and all(s[1] >= 1 for s in desired),
          "tailbatch_autoscaler_desired_replicas visible for both replicas (%s)"
          % ", ".join("%s: %g" % (s[0].get("instance"), s[1]) for s in desired))

    # The rules: loaded, evaluating without errors, and the recorded fleet p99 has data.
    groups = prom.api("rules")["data"]["groups"]
    bad = [(r.get("name"), r.get("lastError")) for gr in groups for r in gr["rules"] if r.get("health") != "ok"]
    check(len(groups) == 3 and not bad, "prometheus loaded %d rule groups (%d rules), all evaluating without error%s"
          % (len(groups), sum(len(gr["rules"]) for gr in groups), "" if not bad else ": %s" % bad))
    recorded = prom.query('route:tailbatch_serve_request_duration_seconds:p99_rate5m{route="classify"}')
    check(len(recorded) == 1 and finite(recorded[0][1]),
          "the recorded fleet p99 (route:tailbatch_serve_request_duration_seconds:p99_rate5m) has data: %s"
          % [s[1] for s in recorded])

    # Every query of the dashboard.
    slo = SLO_MS / 1e3
    les = sorted({float(x[0]["le"]) for x in prom.query(
        'group by (le) (tailbatch_serve_request_duration_seconds_bucket{route="classify"})') if x[0]["le"] != "+Inf"})
    slo_le = next((le for le in reversed(les) if le <= slo), les[0] if les else slo)
    slo_le_text = next((x[0]["le"] for x in prom.query(
        'group by (le) (tailbatch_serve_request_duration_seconds_bucket{route="classify"})')
        if x[0]["le"] != "+Inf" and float(x[0]["le"]) == slo_le), repr(slo))
    print("dashboard: $slo_le = %s (%s)" % (slo_le_text, "the SLO target itself" if slo_le == slo else
                                            "the largest exported bound below the %g s target" % slo), flush=True)
    with open(a.dashboard) as f:
        dashboard = json.load(f)
    exprs = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    check(len(exprs) > 0, "the dashboard has %d queries" % len(exprs))
    for title, expr in exprs:
        q = expr.replace("$__rate_interval", "1m").replace("${slo_le}", slo_le_text).replace("$slo_le", slo_le_text)
        try:
            result = prom.query(q)
        except ValueError as e:
            check(False, "dashboard %r: %s does not parse: %s" % (title, expr, e))
            continue
        values = [v for _, v in result if finite(v)]
        check(len(values) > 0, "dashboard %r: %s -> %d series%s" % (
            title, expr, len(result), ", e.g. %g" % values[0] if values else ", none finite"))

    print("%d checks failed" % len(failures) if failures else "all checks passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        rc = main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    stop_all()
    sys.exit(rc)
