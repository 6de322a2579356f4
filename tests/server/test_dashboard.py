#!/usr/bin/env python3
"""Browser test of tailbatch-serve's /dashboard (ctest label `browser`).

    test_dashboard.py TAILBATCH-LOAD TAILBATCH-SERVE [--screenshot PATH] [--rate RPS]

--rate: the classify load in requests/s (default 25, which a Debug build keeps up with).

Starts tailbatch-serve --port 0 (127.0.0.1), puts open-loop load on /v1/classify and
/v1/generate with tailbatch-load --url, opens /dashboard in headless Chromium
(--dump-dom) and checks that the rendered page holds live numbers (a p95 that is neither
empty nor zero, a request rate above zero) and that Chart.js drew every chart (each
canvas sets data-rendered="1" once drawn with data). With --screenshot it also saves a
PNG of the page under load (docs/img/dashboard.png is made this way).

Bounded: about 25 s, 55 s at most. Every process it starts (server, load generators,
browser) is killed when it ends, however it ends. Exits 0 on success, 1 on a failed check,
77 (skipped) when Chromium is missing.
"""
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import harness
from harness import check, fail, left

LOAD, SERVE = sys.argv[1], sys.argv[2]
SHOT = sys.argv[sys.argv.index("--screenshot") + 1] if "--screenshot" in sys.argv else None
RATE = sys.argv[sys.argv.index("--rate") + 1] if "--rate" in sys.argv else "25"
def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browser(url, *args, budget_ms):
    # A fresh profile each time; no network but loopback is ever asked for.
    profile = tempfile.mkdtemp(prefix="tailbatch-chromium-")
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
           "--no-first-run", "--user-data-dir=" + profile, "--window-size=1600,1000",
           "--virtual-time-budget=%d" % budget_ms, *args, url]
    p = harness.watch(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    try:
        out, _ = p.communicate(timeout=min(40, left(1.0)))
    except subprocess.TimeoutExpired:
        fail("chromium did not finish in time")
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return out


class SlowStatsProxy(http.server.BaseHTTPRequestHandler):
    """Forwards GETs to the server, holding /v1/stats answers for 0.6 s of real time.

    Under --virtual-time-budget Chromium runs the page's timers on a virtual clock that
    stops while a fetch is outstanding, so without this the page's once-a-second polls
    would all happen within a fraction of a real second; with it, each poll spans about a
    real second and the page sees the load move as it would on a screen.
    """
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    upstream = None

    def do_GET(self):
        if self.path.startswith("/v1/stats"):
            time.sleep(0.6)
        try:
            with urllib.request.urlopen(self.upstream + self.path, timeout=5) as r:
                body, code, ctype = r.read(), r.status, r.headers.get("Content-Type", "text/plain")
        except urllib.error.HTTPError as e:
            body, code, ctype = e.read(), e.code, e.headers.get("Content-Type", "text/plain")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def attr(dom, element_id, name):
    m = re.search(r'<[^>]*id="%s"[^>]*>' % element_id, dom)
    if not m:
        return None
    a = re.search(r'%s="([^"]*)"' % name, m.group(0))
    return a.group(1) if a else None


BROWSER = chromium()
if not BROWSER:
    print("SKIP: no chromium (Debian: chromium; scripts/deps.sh --test installs it)")
    raise SystemExit(77)


def main():
    base = harness.Server(SERVE, "--stats-window-s", "5", "--slo-p95-ms", "100").base
    html = urllib.request.urlopen(base + "/dashboard", timeout=5).read().decode()
    check("<canvas" in html and "/static/chart.js" in html, "GET /dashboard serves the page")
    js = urllib.request.urlopen(base + "/static/chart.js", timeout=5)
    check(js.status == 200 and b"Chart" in js.read(), "GET /static/chart.js serves Chart.js")

    out = tempfile.mkdtemp(prefix="tailbatch-dashboard-load-")
    bodies = os.path.join(out, "bodies.txt")
    with open(bodies, "w") as f:
        for text in ["a fine film", "the worst service I have had", "it was fine, I suppose",
                     "great value and friendly staff", "never again", "an average evening"]:
            f.write('{"text": "%s"}\n' % text)
    for args in (["--url", base + "/v1/classify", "--method", "POST", "--body-file", bodies, "--rate", RATE],
                 ["--url", base + "/v1/generate", "--method", "POST", "--body",
                  '{"prompt": "once upon a time", "max_tokens": 24}', "--rate", "4"]):
        harness.watch(subprocess.Popen([LOAD, *args, "--duration", "30", "--warmup", "0", "--quiet", "--out", out],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowStatsProxy)
    SlowStatsProxy.upstream = base
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    page = "http://127.0.0.1:%d/dashboard" % proxy.server_address[1]
    time.sleep(3)  # let the latency window fill

    shot = []
    if SHOT:
        os.makedirs(os.path.dirname(os.path.abspath(SHOT)), exist_ok=True)
        if os.path.exists(SHOT):
            os.remove(SHOT)
        shot = ["--screenshot=" + os.path.abspath(SHOT)]
    t0 = time.monotonic()
    dom = browser(page, "--dump-dom", *shot, budget_ms=8000)
    print("     chromium took %.1f s" % (time.monotonic() - t0))
    p95 = attr(dom, "p95", "data-value")
    print("     p95 %s ms, %s requests/s, %s polls, %s charts drawn" %
          (p95, attr(dom, "rps", "data-value"), re.search(r'data-polls="(\d+)"', dom) and
           re.search(r'data-polls="(\d+)"', dom).group(1), re.search(r'data-charts-rendered="(\d+)"', dom) and
           re.search(r'data-charts-rendered="(\d+)"', dom).group(1)))
    check(p95 not in (None, "") and float(p95) > 0, "the rendered DOM shows a live p95 (%r ms), not empty or zero" % p95)
    rps = attr(dom, "rps", "data-value")
    check(rps not in (None, "") and float(rps) > 0, "requests/s is live (%r)" % rps)
    for chart in ("c-latency", "c-status", "c-queue", "c-batches", "c-reasons", "c-gen"):
        check(attr(dom, chart, "data-rendered") == "1", "Chart.js drew %s" % chart)
    check("Chart.js did not load" not in dom or 'id="nochart" class="hidden"' in dom, "no missing-Chart.js notice")

    if SHOT:
        check(os.path.exists(SHOT) and os.path.getsize(SHOT) > 10000, "screenshot written to %s" % SHOT)


harness.run(main, seconds=55)  # ctest allows 60 s
print("PASS")
