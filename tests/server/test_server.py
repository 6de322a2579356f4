#!/usr/bin/env python3
"""End-to-end test of tailbatch-serve: starts it with --port 0 (127.0.0.1 only), drives
every route with curl and with raw sockets, forces each outcome and checks its HTTP status,
checks SSE framing, that a disconnect cancels, that promtool accepts /metrics, and that
SIGTERM with requests in flight answers every one and exits 0.

    test_server.py /path/to/tailbatch-serve

Every server it starts is killed when the test ends, however it ends. Exits 0 on success,
1 on the first failed check (printing what was expected and what came back).
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import harness
from harness import check, fail, left

SERVE = sys.argv[1] if len(sys.argv) > 1 else "tailbatch-serve"


def curl(srv, method, path, body=None, headers=None, timeout=10):
    """One request with curl; returns (status, {lower-case header: value}, body text)."""
    cmd = ["curl", "-s", "-i", "--max-time", str(timeout), "-X", method, "http://127.0.0.1:%d%s" % (srv.port, path)]
    for k, v in (headers or {}).items():
        cmd += ["-H", "%s: %s" % (k, v)]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    r = subprocess.run(cmd, input=(body or "").encode(), capture_output=True, timeout=timeout + 5)
    raw = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0 or not raw.startswith("HTTP/"):
        return (0, {}, "curl exit %d: %s" % (r.returncode, r.stderr.decode()))
    interim = []
    while re.match(r"HTTP/1\.1 1\d\d ", raw):  # interim responses: 100 Continue
        interim.append(raw.split()[1])
        raw = raw.partition("\r\n\r\n")[2]
    head, _, rest = raw.partition("\r\n\r\n")
    lines = head.split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    hdrs[":interim"] = interim
    return status, hdrs, rest


def post_json(srv, path, obj, headers=None, timeout=10):
    return curl(srv, "POST", path, json.dumps(obj), headers, timeout)


def parse_sse(text):
    """The event-stream interpretation of the HTML Living Standard: (events, comments)."""
    events, comments = [], []
    data, etype, last_id, have = "", "", "", False
    for line in re.split(r"\r\n|\r|\n", text):
        if line == "":
            if have:
                events.append({"id": last_id, "event": etype or "message", "data": data[:-1] if data.endswith("\n") else data})
            data, etype, have = "", "", False
            continue
        if line.startswith(":"):
            comments.append(line[1:].lstrip(" "))
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data += value + "\n"
            have = True
        elif field == "event":
            etype = value
        elif field == "id":
            last_id = value
    return events, comments


def raw_request(srv, method, path, body=b"", extra=b""):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    req = b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n" % (
        method.encode(), path.encode(), len(body), extra)
    s.sendall(req + body)
    return s


def read_response(s):
    """Reads one response with Content-Length from socket s: (status, headers, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return 0, {}, buf
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    hdrs = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:]}
    n = int(hdrs.get("content-length", "0"))
    while len(body) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), hdrs, body[:n].decode("utf-8", "replace")


def wait_for(pred, what, seconds=5):
    end = time.monotonic() + min(seconds, left())
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    fail(what)


def error_of(body):
    return json.loads(body)["error"]


def main():
    # ---- A: the routes, and the outcomes that need no special configuration -------------
    a = harness.Server(SERVE, "--io-threads", "2", "--max-batch", "8", "--warmup-rounds", "1", "--max-body-bytes", "4096",
                       "--fail-on-text", "please fail", "--gen-token-budget", "50000", "--gen-max-tokens", "100000")
    check(curl(a, "GET", "/healthz")[0] == 200, "/healthz is 200 from the start")
    a.wait_ready()
    st = a.stats()
    check(st["ready"] and st["classify"]["batch_sizes"].get("8", 0) >= 1,
          "/readyz turned 200 after warm-up batches of every size up to --max-batch")
    check(all(str(n) in st["classify"]["batch_sizes"] for n in range(1, 9)), "warm-up ran batch sizes 1..8")

    s, h, b = post_json(a, "/v1/classify", {"text": "a great, moving film"})
    j = json.loads(b) if s == 200 else {}
    check(s == 200 and j.get("label") == "positive" and isinstance(j.get("score"), float)
          and j.get("truncated") is False and h.get("content-type") == "application/json",
          "classify one text -> 200 {label, score, truncated}")
    s, _, b = post_json(a, "/v1/classify", {"texts": ["awful, boring plot", "The train leaves at noon", "superb acting"]})
    j = json.loads(b) if s == 200 else {}
    check(s == 200 and [r["label"] for r in j.get("results", [])] == ["negative", "neutral", "positive"],
          "classify several texts -> 200 {results: [...]} in order")
    s, h, b = post_json(a, "/v1/classify", {"texts": ["a fine day out, " * 20] * 6}, {"Expect": "100-continue"})
    check(s == 200 and h[":interim"] == ["100"] and len(json.loads(b)["results"]) == 6,
          "Expect: 100-continue is answered 100 before the body is sent, then 200")
    s, _, b = post_json(a, "/v1/classify", {"text": " ".join(["word%d" % i for i in range(300)])})
    check(s == 200 and json.loads(b)["truncated"] is True, "a text longer than the model reads -> truncated: true")

    s, _, b = curl(a, "POST", "/v1/classify", '{"text": ')
    check(s == 400 and "malformed JSON" in error_of(b)["message"], "malformed JSON -> 400 with a message")
    s, _, b = post_json(a, "/v1/classify", {"txt": "x"})
    check(s == 400 and "text" in error_of(b)["message"], "a body without text or texts -> 400")
    s, _, b = post_json(a, "/v1/classify", {"texts": []})
    check(s == 400, "an empty texts array -> 400")
    s, h, _ = curl(a, "GET", "/v1/classify")
    check(s == 405 and h.get("allow") == "POST", "GET /v1/classify -> 405 with Allow: POST")
    s, h, _ = curl(a, "POST", "/metrics", "{}")
    check(s == 405 and h.get("allow") == "GET, HEAD", "POST /metrics -> 405 with Allow: GET, HEAD")
    check(curl(a, "GET", "/no/such/route")[0] == 404, "unknown route -> 404")
    s, _, b = curl(a, "POST", "/v1/classify", json.dumps({"text": "x" * 5000}))
    check(s == 413, "a body over --max-body-bytes -> 413")

    # X-Request-Timeout-Ms: 0 means no budget (as SubmitOptions::timeout = 0 in the library).
    s, _, b = post_json(a, "/v1/classify", {"text": "x"}, {"X-Request-Timeout-Ms": "0"})
    check(s == 200, "X-Request-Timeout-Ms: 0 is no budget -> 200")
    # A budget spent before submit: the headers arrive, the body 100 ms later, the budget is 1 ms.
    body = json.dumps({"text": "x"}).encode()
    sock = socket.create_connection(("127.0.0.1", a.port), timeout=5)
    sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"X-Request-Timeout-Ms: 1\r\nContent-Length: %d\r\n\r\n" % len(body))
    time.sleep(0.1)
    sock.sendall(body)
    s, _, b = read_response(sock)
    sock.close()
    check(s == 504 and error_of(b)["status"] == "deadline_exceeded", "an expired deadline -> 504")
    s, _, b = post_json(a, "/v1/classify", {"text": "x"}, {"X-Request-Timeout-Ms": "soon"})
    check(s == 400 and "X-Request-Timeout-Ms" in error_of(b)["message"], "a malformed X-Request-Timeout-Ms -> 400")
    s, _, b = post_json(a, "/v1/classify", {"text": "x"}, {"X-Request-Timeout-Ms": "5000"})
    check(s == 200, "a generous X-Request-Timeout-Ms -> 200")
    s, _, b = post_json(a, "/v1/classify", {"text": "please fail"})
    check(s == 500 and error_of(b)["status"] == "failed" and "--fail-on-text" in error_of(b)["message"],
          "a model error -> 500 with the model's message")

    # keep-alive: two requests on one connection
    sock = raw_request(a, "GET", "/healthz")
    r1 = read_response(sock)
    sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    r2 = read_response(sock)
    sock.close()
    check(r1[0] == 200 and r2[0] == 200, "keep-alive: two requests answered on one connection")

    # generate
    s, _, b = post_json(a, "/v1/generate", {"prompt": "hello there", "max_tokens": 7})
    j = json.loads(b) if s == 200 else {}
    check(s == 200 and len(j.get("tokens", [])) == 7 and j.get("status") == "ok", "generate, not streaming -> 200, 7 tokens")
    s, _, b = post_json(a, "/v1/generate", {"prompt": "x", "max_tokens": 0})
    check(s == 400, "generate with max_tokens 0 -> 400")
    s, _, b = post_json(a, "/v1/generate", {"prompt": "x", "max_tokens": 60000})
    check(s == 413 and error_of(b)["reason"] == "too_large", "generate beyond the token budget -> 413 too_large")
    s, h, b = post_json(a, "/v1/generate", {"prompt": "hello there", "max_tokens": 12, "stream": True})
    events, _ = parse_sse(b)
    tok = [e for e in events if e["event"] == "token"]
    ends = [e for e in events if e["event"] == "end"]
    ids = [int(e["id"]) for e in tok]
    got = sum((json.loads(e["data"]) for e in tok), [])
    check(s == 200 and h.get("content-type") == "text/event-stream" and b.endswith("\n\n"),
          "generate, streaming -> 200 text/event-stream, ends with an empty line")
    check(len(got) == 12 and ids == sorted(ids) and ids[-1] == 12 and len(ends) == 1 and events[-1] is ends[0],
          "SSE: token events carry every token once, ids count tokens, one end event last")
    end = json.loads(ends[0]["data"])
    check(end["status"] == "ok" and end["http_status"] == 200 and end["tokens"] == 12 and ends[0]["id"] == "12",
          "SSE: the end event carries the final status and the token count")
    check(re.fullmatch(r"(id: \d+\nevent: (token|end)\ndata: [^\n]*\n\n)+", b) is not None,
          "SSE: every event is id, event, data lines and one empty line")
    s, _, b = post_json(a, "/v1/generate", {"prompt": "x", "max_tokens": 60000, "stream": True})
    check(s == 413, "a streaming request rejected before its first token gets a real HTTP status (413), not a stream")

    # a client that disconnects mid-stream cancels its sequence
    before = a.stats()
    sock = raw_request(a, "POST", "/v1/generate", json.dumps({"prompt": "long", "max_tokens": 40000, "stream": True}).encode())
    got = b""
    while got.count(b"event: token") < 3:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    sock.close()
    wait_for(lambda: a.stats()["generate"]["requests"]["cancelled"] > before["generate"]["requests"]["cancelled"],
             "a disconnect mid-stream did not cancel the sequence")
    st = a.stats()
    check(st["http"]["client_disconnects"] > before["http"]["client_disconnects"] and st["generate"]["active"] == 0,
          "a disconnect mid-stream cancels the sequence (generate.cancelled, http.client_disconnects in /v1/stats)")
    check(st["generate"]["tokens"] < 40000, "the cancelled sequence stopped early")

    # /metrics and /v1/stats
    s, h, b = curl(a, "GET", "/metrics")
    check(s == 200 and h.get("content-type", "").startswith("text/plain; version=0.0.4"), "/metrics -> 200 Prometheus text")
    for name in ["tailbatch_pipeline_queue_depth", "tailbatch_pipeline_batch_size_total",
                 "tailbatch_serve_responses_total", "tailbatch_serve_client_disconnects_total",
                 "tailbatch_serve_request_duration_seconds", "tailbatch_generation_tokens_total",
                 "tailbatch_limiter_in_flight"]:
        check(re.search(r"^%s(_bucket)?[{ ]" % name, b, re.M) is not None, "/metrics exports %s" % name)
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=b.encode(), capture_output=True, timeout=20)
        check(r.returncode == 0, "promtool check metrics accepts /metrics (%s)" % (r.stdout + r.stderr).decode().strip())
    else:
        print("skip promtool not found (Debian package prometheus; scripts/deps.sh --test)")
    st = a.stats()
    c = st["classify"]
    check(all(k in c["latency_ms"] for k in ("p50", "p95", "p99")) and c["latency_ms"]["count"] > 0
          and "queue_depth" in c and "in_flight" in c and c["mean_batch"] > 0 and "tokens_per_s" in st["generate"]
          and "overloaded" in c["rejections"] and c["requests"]["failed"] >= 1,
          "/v1/stats: rolling p50/p95/p99, queue depth, in-flight, batch sizes, tokens/s, rejections")
    check(c["limit"] == "slo" and 0 < c["default_deadline_ms"] < 100 and c["limit_current"] >= 16
          and "quota_exceeded" in c["rejections"],
          "without --limit and --default-timeout-ms classify admission comes from the SLO (deadline %.1f ms, limit %d)"
          % (c["default_deadline_ms"], c["limit_current"]))

    # ---- B: a tiny queue -> queue_full; a disconnect while the model runs ---------------
    bsrv = harness.Server(SERVE, "--max-batch", "1", "--queue-capacity", "1", "--model-delay-ms", "400", "--warmup-rounds", "1")
    results = [None] * 3

    def one(i):
        results[i] = post_json(bsrv, "/v1/classify", {"text": "t%d" % i})

    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        time.sleep(0.1)
    for t in threads:
        t.join(left())
    codes = sorted(r[0] for r in results)
    full = [r for r in results if r[0] == 503]
    check(codes == [200, 200, 503] and error_of(full[0][2])["reason"] == "queue_full",
          "one running, one queued (capacity 1), the third -> 503 queue_full (%s)" % codes)
    check(full[0][1].get("retry-after", "").isdigit() and int(full[0][1]["retry-after"]) >= 1
          and int(full[0][1].get("retry-after-ms", "0")) >= 1, "queue_full carries Retry-After >= 1 and retry-after-ms")
    before = bsrv.stats()
    sock = raw_request(bsrv, "POST", "/v1/classify", b'{"text": "leaving"}')
    time.sleep(0.15)
    sock.close()
    wait_for(lambda: bsrv.stats()["classify"]["requests"]["cancelled"] > before["classify"]["requests"]["cancelled"],
             "a classify client that left was not cancelled")
    check(bsrv.stats()["http"]["client_disconnects"] > before["http"]["client_disconnects"],
          "a classify client that disconnects cancels its request (classify.requests.cancelled)")
    bsrv.stop()

    # ---- C: a zero limit -> overloaded --------------------------------------------------
    csrv = harness.Server(SERVE, "--limit", "0", "--max-batch", "2", "--warmup-rounds", "1")
    s, h, b = post_json(csrv, "/v1/classify", {"text": "x"})
    check(s == 503 and error_of(b)["reason"] == "overloaded" and h.get("retry-after", "").isdigit(),
          "the limiter refuses (--limit 0) -> 503 overloaded with Retry-After")
    csrv.stop()

    # ---- C2: tenants: the keys file, the user field, X-Tenant; quotas -> 429 ----------------
    # Batches of one that take 300 ms, one request in flight per tenant (quota_exceeded).
    keys = tempfile.NamedTemporaryFile(mode="w", suffix=".keys", delete=False)
    keys.write("# KEY TENANT [WEIGHT [MAX_IN_FLIGHT]]\nk-alpha alpha 2\nk-beta beta 1 1\n")
    keys.close()
    t = harness.Server(SERVE, "--api-keys", keys.name, "--api-key", "legacy", "--tenant-header",
                       "--tenant-max-in-flight", "1", "--max-batch", "1", "--model-delay-ms", "300",
                       "--decode-delay-ms", "100", "--warmup-rounds", "1", "--default-timeout-ms", "5000")
    os.unlink(keys.name)
    s, _, _ = post_json(t, "/v1/classify", {"text": "x"})
    check(s == 401, "with --api-keys a request without a key -> 401")
    s, _, _ = post_json(t, "/v1/classify", {"text": "x"}, {"Authorization": "Bearer legacy"})
    check(s == 200, "--api-key's key still works beside --api-keys")

    def pair(path, first, second):
        """Two requests, the second 100 ms after the first: their statuses and the second's answer."""
        out = [None, None]

        def go(i, obj, hdr):
            out[i] = post_json(t, path, obj, hdr)
        a1 = threading.Thread(target=go, args=(0,) + first)
        a1.start()
        time.sleep(0.1)
        go(1, *second)
        a1.join(left())
        return out[0][0], out[1]

    beta = {"Authorization": "Bearer k-beta"}
    s1, (s2, h2, b2) = pair("/v1/classify", ({"text": "b1"}, beta), ({"text": "b2"}, beta))
    check(s1 == 200 and s2 == 429 and error_of(b2)["reason"] == "quota_exceeded"
          and error_of(b2)["type"] == "rate_limit_error" and h2.get("retry-after", "").isdigit(),
          "a tenant past its quota (key k-beta, 1 in flight) -> 429 quota_exceeded with Retry-After (%d, %d)" % (s1, s2))
    s1, (s2, _, _) = pair("/v1/classify", ({"text": "a1"}, beta), ({"text": "a2"}, {"Authorization": "Bearer k-alpha"}))
    check(s1 == 200 and s2 == 200, "another key's tenant is not held to beta's quota (%d, %d)" % (s1, s2))
    legacy = {"Authorization": "Bearer legacy"}
    s1, (s2, _, _) = pair("/v1/classify", ({"text": "h1"}, dict(legacy, **{"X-Tenant": "h"})),
                          ({"text": "h2"}, dict(legacy, **{"X-Tenant": "h"})))
    check(s1 == 200 and s2 == 429, "--tenant-header: the same X-Tenant twice at once -> 429 (%d, %d)" % (s1, s2))
    s1, (s2, _, _) = pair("/v1/classify", ({"text": "h3"}, dict(legacy, **{"X-Tenant": "h"})),
                          ({"text": "h4"}, dict(legacy, **{"X-Tenant": "other-h"})))
    check(s1 == 200 and s2 == 200, "--tenant-header: another X-Tenant -> 200 (%d, %d)" % (s1, s2))
    comp = {"model": "tailbatch-reference-generator", "prompt": "hello", "max_tokens": 3, "user": "u1"}
    s1, (s2, _, b2) = pair("/v1/completions", (comp, legacy), (comp, dict(legacy, **{"X-Tenant": "u-other"})))
    check(s1 == 200 and s2 == 429 and error_of(b2)["code"] == "quota_exceeded",
          "an OpenAI request's user field names its tenant before X-Tenant (%d, %d)" % (s1, s2))
    t.stop()

    # ---- D: SIGTERM with requests in flight ---------------------------------------------
    # Batches of 4 take 300 ms; the drain gives queued work 250 ms: the batch in the model
    # at SIGTERM completes, what is still queued then is answered 503 shutting_down.
    # --default-timeout-ms 2000: the deadline from the SLO (600 ms with these batches) would
    # end the queued requests before the drain does.
    d = harness.Server(SERVE, "--max-batch", "4", "--model-delay-ms", "300", "--warmup-rounds", "1",
                       "--drain-timeout-ms", "250", "--default-timeout-ms", "2000")
    idle = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    check(read_response(idle)[0] == 200, "a keep-alive connection is open before SIGTERM")
    n = 12
    answers = [None] * n

    def ask(i):
        answers[i] = post_json(d, "/v1/classify", {"text": "in flight %d" % i}, timeout=20)

    base_ok = d.stats()["classify"]["requests"]["ok"]
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()

    def all_arrived():
        st = d.stats()
        return st["http"]["in_flight"] + st["classify"]["requests"]["ok"] - base_ok >= n and st["classify"]["in_flight"] > 0

    # SIGTERM once every request has reached the server and a batch is in the model.
    wait_for(all_arrived, "the requests did not all reach the server", 10)
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    idle.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    s, h, b = read_response(idle)
    idle.close()
    check(s == 503 and "draining" in b, "after SIGTERM /readyz is 503 (draining)")
    for t in threads:
        t.join(left())
    codes = [x[0] for x in answers]
    check(all(c in (200, 503) for c in codes) and codes.count(200) >= 1,
          "every request in flight at SIGTERM got its answer (200 or 503): %s" % codes)
    late = [x for x in answers if x[0] == 503]
    check(len(late) >= 1 and all(error_of(x[2])["reason"] == "shutting_down" for x in late),
          "work still queued when the drain timeout passed -> 503 shutting_down")
    rc = d.wait_exit()
    check(rc == 0, "tailbatch-serve exits 0 after draining (exit %d)" % rc)

    rc = a.terminate()
    check(rc == 0, "an idle server exits 0 on SIGTERM (exit %d)" % rc)


if __name__ == "__main__":
    harness.run(main, seconds=55)  # ctest's timeout is 60 s
    print("all checks passed")
