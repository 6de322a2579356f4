#!/usr/bin/env python3
"""Checks the Kubernetes manifests under deploy/kubernetes/ against what tailbatch-serve
really exports (ctest `deploy_manifests`, label `deploy`).

    check_manifests.py MANIFESTS_DIR --serve /path/to/tailbatch-serve [--save FILE]
    check_manifests.py MANIFESTS_DIR --program /path/to/deploy_exported_metrics [--save FILE]

1. Every manifest passes `yamllint --strict` with MANIFESTS_DIR/.yamllint.
2. The exposition: with --serve, the live /metrics of tailbatch-serve (started on
   127.0.0.1 with --port 0 and a 0.2 s --autoscale-interval-s, given classify and generate
   requests, scraped once its Autoscaler has evaluated twice, then stopped with SIGTERM);
   with --program (only where the server cannot be built: no Boost, nlohmann-json or CLI11),
   the output of tests/deploy/exported_metrics.cpp, the same components on one registry.
   `promtool check metrics` accepts it, where promtool is installed.
3. Every `tailbatch_*` name a manifest mentions is a family or sample name of it, and every
   label matcher on one (PromQL `name{k="v"}` / `{k!=""}`, an HPA metric's `matchLabels`)
   is satisfied by at least one of its series: a selector that matches nothing would scale
   on nothing.
4. deployment.yaml: probes on /readyz and /healthz, and terminationGracePeriodSeconds
   greater than the preStop sleep plus --drain-timeout-ms.

Without yamllint it prints TAILBATCH_SKIP (ctest reports the test skipped). Exits 0 when
every check passes, 1 otherwise, listing each failure.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import time
import json
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def error(msg):
    print("FAIL: " + msg, flush=True)
    failures.append(msg)


def arg(name):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


def from_server(serve):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "server"))
    import harness  # the server tests' harness: --port 0 on 127.0.0.1, killed at the end

    try:
        srv = harness.Server(serve, "--autoscale-interval-s", "0.2", "--max-batch", "4", "--warmup-rounds", "1",
                             "--capacity-rps", "410")
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        for i in range(20):
            conn.request("POST", "/v1/classify", json.dumps({"text": "request %d" % i}),
                         {"Content-Type": "application/json"})
            conn.getresponse().read()
        conn.request("POST", "/v1/generate", json.dumps({"prompt": "hello", "max_tokens": 4}),
                     {"Content-Type": "application/json"})
        conn.getresponse().read()
        conn.close()
        end = time.monotonic() + 15
        body = ""
        while time.monotonic() < end:
            s, raw = srv.http("GET", "/metrics")
            body = raw.decode()
            m = re.search(r"^tailbatch_autoscaler_evaluations_total\S* (\S+)$", body, re.M)
            if s == 200 and m and float(m.group(1)) >= 2:
                break
            time.sleep(0.1)
        else:
            harness.fail("tailbatch-serve's Autoscaler did not evaluate twice within 15 s")
        if srv.terminate() != 0:
            error("tailbatch-serve did not exit 0 after SIGTERM")
        print("exposition: the live /metrics of %s" % serve)
        return body
    finally:
        harness.kill_all()


def from_program(program):
    r = subprocess.run([program], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        error("%s failed (%d): %s" % (program, r.returncode, r.stderr))
    print("exposition: %s (tailbatch-serve is not built here: its components on one registry instead)" % program)
    return r.stdout


def parse_exposition(text):
    """{metric name: [label dicts]}: every sample, and every family (# TYPE) with no labels."""
    series = {}
    for m in re.finditer(r"^# TYPE (tailbatch_[a-z0-9_]+) ", text, re.M):
        series.setdefault(m.group(1), [])
    for m in re.finditer(r"^(tailbatch_[a-z0-9_]+)(?:\{([^}]*)\})? ", text, re.M):
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        series.setdefault(m.group(1), []).append(labels)
    return series


def matches(labels, matchers):
    for key, op, want in matchers:
        have = labels.get(key, "")
        if (op == "=" and have != want) or (op == "!=" and have == want):
            return False
    return True


def main():
    manifests_dir = sys.argv[1]
    yamllint = shutil.which("yamllint")
    if not yamllint:
        print("TAILBATCH_SKIP: yamllint not found, so the manifests are not checked. "
              "Install Debian's yamllint to run this test.")
        return 0
    manifests = sorted(glob.glob(os.path.join(manifests_dir, "*.yaml")))
    if not manifests:
        error("no manifests under " + manifests_dir)
        return 1
    r = subprocess.run([yamllint, "--strict", "-c", os.path.join(manifests_dir, ".yamllint"), *manifests],
                       capture_output=True, text=True)
    if r.returncode != 0:
        error("yamllint rejected the manifests (exit %d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
    else:
        print("yamllint: %d manifests clean" % len(manifests))

    if arg("--serve"):
        text = from_server(arg("--serve"))
    else:
        text = from_program(arg("--program"))
    if arg("--save"):
        with open(arg("--save"), "w") as f:
            f.write(text)
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        if r.returncode != 0:
            error("promtool check metrics rejected the exposition:\n" + r.stdout + r.stderr)
    series = parse_exposition(text)
    print("exported: %d metric names" % len(series))

    names = refs = 0
    for path in manifests:
        base = os.path.basename(path)
        with open(path) as f:
            text_m = f.read()
        # The names, each looked up.
        for name in sorted(set(re.findall(r"tailbatch_[a-z0-9_]+", text_m))):
            names += 1
            if name not in series:
                error("%s: %s is not a metric tailbatch-serve exports" % (base, name))
        # Label matchers: PromQL selectors, and the HPA's metric selectors.
        selectors = []
        for m in re.finditer(r"(tailbatch_[a-z0-9_]+)\{([^}]*)\}", text_m):
            matchers = re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(!=|=)\s*"([^"]*)"', m.group(2))
            if matchers:
                selectors.append((m.group(1), matchers, m.group(0)))
        for m in re.finditer(r"name: (tailbatch_[a-z0-9_]+)\n\s+selector:\n\s+matchLabels:\n((?:\s+[\w.-]+: \S+\n)+)",
                             text_m):
            matchers = [(k, "=", v.strip('"')) for k, v in re.findall(r"([\w.-]+): (\S+)", m.group(2))]
            selectors.append((m.group(1), matchers, "%s matchLabels %s" % (m.group(1), dict((k, v) for k, _, v in matchers))))
        for name, matchers, shown in selectors:
            refs += 1
            if name in series and not any(matches(l, matchers) for l in series[name]):
                error("%s: %s selects no series tailbatch-serve exports (it has: %s)" %
                      (base, shown, sorted(set(tuple(sorted(l.items())) for l in series[name]))))
    if names == 0:
        error("the manifests reference no tailbatch metric at all")
    print("referenced: %d metric names (counted per file), %d label selectors, each looked up" % (names, refs))

    with open(os.path.join(manifests_dir, "deployment.yaml")) as f:
        dep = f.read()
    for needle in ["path: /readyz", "path: /healthz", "readinessProbe:", "livenessProbe:", "preStop:"]:
        if needle not in dep:
            error("deployment.yaml: no '%s'" % needle)
    grace = re.search(r"terminationGracePeriodSeconds: (\d+)", dep)
    drain = re.search(r"--drain-timeout-ms=(\d+)", dep)
    sleep = re.search(r'command: \["sleep", "(\d+)"\]', dep)
    if not (grace and drain and sleep):
        error("deployment.yaml: terminationGracePeriodSeconds, --drain-timeout-ms and a preStop sleep are all needed")
    else:
        g, d, s = int(grace.group(1)), (int(drain.group(1)) + 999) // 1000, int(sleep.group(1))
        if g <= s + d:
            error("deployment.yaml: terminationGracePeriodSeconds %d does not cover preStop %d s + drain %d s" % (g, s, d))
        else:
            print("drain: preStop %d s + drain %d s < grace %d s" % (s, d, g))
    if failures:
        print("deploy/kubernetes checks failed: %d" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
