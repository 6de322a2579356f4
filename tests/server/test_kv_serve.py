#!/usr/bin/env python3
"""tailbatch-serve's generation on a KV cache (ctest tailbatch_serve_kv, label server):
starts the server three times on 127.0.0.1 with --port 0 (no KV cache; --kv-mode grow in
a cache small enough that concurrent requests preempt one another; --kv-mode reserve),
sends the same greedy /v1/completions requests concurrently to each, and checks that the
texts are identical, that grow preempted and reused prefixes (its /metrics), that reserve
never preempted, and that a prompt larger than the cache gets 413 too_large. Kills every
server it started. Bounded: 60 s.

    python3 test_kv_serve.py /path/to/tailbatch-serve
"""
import concurrent.futures
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

SERVE = sys.argv[1]
DEADLINE = time.monotonic() + 55
servers = []


def fail(msg):
    print("FAIL " + msg, flush=True)
    for s in servers:
        s.stop()
        s.err.seek(0)
        print("---- stderr of %s\n%s" % (s.args, s.err.read()[-2000:]), flush=True)
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok   " + msg, flush=True)


class Server:
    def __init__(self, *args):
        self.args = [SERVE, "--port", "0", "--warmup-rounds", "0", *args]
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.err, text=True)
        servers.append(self)
        box = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(20)
        m = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", box[0] if box else "")
        if not m:
            fail("no 'listening on' line from %s" % self.args)
        self.base = "http://127.0.0.1:%s" % m.group(1)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(self.base + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        fail("%s never became ready" % self.args)

    def complete(self, prompt, n):
        body = json.dumps({"model": "tailbatch-reference-generator", "prompt": prompt,
                           "max_tokens": n, "temperature": 0}).encode()
        req = urllib.request.Request(self.base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=max(1, DEADLINE - time.monotonic())) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def metric(self, name):
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        m = re.search(r"^%s\{[^}]*\} (\S+)$" % re.escape(name), text, re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# Requests that share prefixes (a repeated sentence), all sent at once.
PROMPTS = [("the cat sat on the mat and " * (1 + i % 4)) + "word %d" % i for i in range(24)]


def run(server):
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as ex:
        got = list(ex.map(lambda p: server.complete(p, 40), PROMPTS))
    for status, body in got:
        if status != 200:
            fail("%s: %s %s" % (server.args, status, body))
    return [body["choices"][0]["text"] for _, body in got]


try:
    plain = Server()
    expected = run(plain)
    plain.stop()
    check(len(expected) == len(PROMPTS), "no KV cache: %d completions" % len(expected))

    # Slow steps (2 ms each), so that all the requests are in flight together.
    grow = Server("--kv-blocks", "24", "--kv-block-size", "4", "--kv-mode", "grow", "--decode-delay-ms", "2")
    check(run(grow) == expected, "--kv-mode grow: the same texts, preempted or not")
    preempted = grow.metric("tailbatch_generation_preemptions_total")
    check(preempted is not None and preempted > 0, "--kv-mode grow preempted (%s times)" % preempted)
    hits = grow.metric("tailbatch_kv_prefix_cache_hits_total")
    check(hits is not None and hits > 0, "--kv-mode grow reused cached prefixes (%s tokens)" % hits)
    check(grow.metric("tailbatch_kv_blocks_capacity") == 24, "tailbatch_kv_blocks_capacity is 24")
    status, body = grow.complete("word " * 200, 4)
    check(status == 413 and body.get("error", {}).get("code") == "too_large",
          "a prompt larger than the cache: 413 too_large (%s)" % body.get("error", {}).get("message"))
    status, _ = grow.complete("", 4)
    check(status == 200, "an empty prompt is served (as the start token)")
    grow.stop()

    reserve = Server("--kv-blocks", "200", "--kv-block-size", "4", "--kv-mode", "reserve")
    check(run(reserve) == expected, "--kv-mode reserve: the same texts")
    check(reserve.metric("tailbatch_generation_preemptions_total") == 0, "--kv-mode reserve never preempted")
    reserve.stop()
finally:
    for s in servers:
        s.stop()
