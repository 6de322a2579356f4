#!/usr/bin/env python3
"""tailbatch-serve's wire-level checks (ctest tailbatch_serve_openai_wire, labels openai and
server): what an SDK hides. The SSE framing of the OpenAI routes ([DONE], the usage chunk,
keep-alive comments), x-request-id, and the hardening of issue 25: write timeout, accept()
backoff on EMFILE and --max-connections, a client that leaves mid-generation, HTTP/1.0
streams, SIGHUP and a second SIGTERM, absolute-form targets and HEAD, Transfer-Encoding,
NUL bytes, the Host check, Content-Type, the 404 message; and the server items: the live
Little's-law check, long prompts refused, X-Request-Timeout-Ms: 0, the SLO bucket.

Every server binds 127.0.0.1 with --port 0 and is killed at the end; the run is bounded
(80 s; ctest allows 90).

    python3 test_openai_wire.py /path/to/tailbatch-serve
"""
import json
import os
import re
import resource
import signal
import socket
import sys
import threading
import time

import harness
from harness import check, kill_all

SERVE = sys.argv[1]
GEN = "tailbatch-reference-generator"


def Server(*args, preexec=None):
    """tailbatch-serve with one warm-up round, ready."""
    return harness.Server(SERVE, "--warmup-rounds", "1", *args, preexec=preexec)


def connect(srv, timeout=5):
    return socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)


def read_all(s):
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        buf += chunk
    return buf


def request(srv, method, path, body=None, headers=None, version="1.1", raw_body=None):
    """One request on a fresh connection closed after it: (status, {header: value}, body bytes as text, raw)."""
    h = {"Host": "127.0.0.1", "Connection": "close"}
    data = raw_body if raw_body is not None else (json.dumps(body).encode() if body is not None else b"")
    if body is not None or raw_body is not None:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(data))
    h.update(headers or {})
    head = "%s %s HTTP/%s\r\n" % (method, path, version) + "".join("%s: %s\r\n" % kv for kv in h.items() if kv[1] is not None)
    s = connect(srv, timeout=10)
    s.sendall(head.encode() + b"\r\n" + data)
    raw = read_all(s)
    s.close()
    return parse(raw) + (raw,)


def parse(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d+)", lines[0]) if lines else None
    hdrs = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    if hdrs.get("transfer-encoding") == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return (int(m.group(1)) if m else 0), hdrs, body.decode("utf-8", "replace")


def events(body):
    return [e for e in body.split("\n\n") if e]


def main():
    a = Server("--sse-keepalive-ms", "150", "--littles-law-interval-s", "0.2", "--slo-p95-ms", "150")
    comp = {"model": GEN, "prompt": "hello there", "max_tokens": 5, "seed": 1, "stream": True,
            "stream_options": {"include_usage": True}}

    # SSE framing of a completion: chunks, the usage chunk, then [DONE].
    s, h, b, _ = request(a, "POST", "/v1/completions", comp)
    ev = events(b)
    check(s == 200 and h.get("content-type") == "text/event-stream" and h.get("transfer-encoding") == "chunked",
          "a streamed completion is a chunked text/event-stream")
    check(all(e.startswith("data: ") for e in ev) and ev[-1] == "data: [DONE]", "every event is 'data: ...' and the last is [DONE]")
    usage = json.loads(ev[-2][6:])
    check(usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7},
          "include_usage: the chunk before [DONE] has empty choices and the usage")
    fin = json.loads(ev[-3][6:])
    check(fin["choices"][0]["finish_reason"] == "length", "the last text chunk carries finish_reason")

    # x-request-id: the client's, or a generated one, on every response (errors too).
    s, h, _, _ = request(a, "GET", "/v1/models", headers={"x-request-id": "client-id-123"})
    check(h.get("x-request-id") == "client-id-123", "x-request-id: the client's is echoed")
    s, h, _, _ = request(a, "POST", "/v1/completions", {"model": "nope", "prompt": "x"})
    check(s == 404 and re.fullmatch(r"req-[0-9a-f]{24}", h.get("x-request-id", "")), "x-request-id: generated on an error")
    s, h, _, _ = request(a, "POST", "/v1/completions", comp, headers={"x-request-id": "stream-id"})
    check(h.get("x-request-id") == "stream-id", "x-request-id on an event stream")
    s, h, _, _ = request(a, "GET", "/healthz", headers={"x-request-id": "bad id with spaces"})
    check(h.get("x-request-id", "").startswith("req-"), "an unusable x-request-id is replaced")

    # Keep-alive comments on an idle stream.
    k = Server("--sse-keepalive-ms", "100", "--decode-delay-ms", "350")
    s, h, b, _ = request(k, "POST", "/v1/chat/completions",
                         {"model": GEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True})
    ev = events(b)
    check(s == 200 and ev.count(": keep-alive") >= 2 and ev[-1] == "data: [DONE]",
          "': keep-alive' comments while a stream is idle past --sse-keepalive-ms (%d seen)" % ev.count(": keep-alive"))
    check('"role":"assistant"' in ev[0], "chat's first event carries the role")

    # HTTP/1.0: the stream is not chunked and the connection closes at its end.
    s, h, b, raw = request(a, "POST", "/v1/completions", comp, version="1.0")
    check(s == 200 and raw.startswith(b"HTTP/1.0 200") and "transfer-encoding" not in h and
          h.get("connection", "").lower() == "close" and b.rstrip().endswith("data: [DONE]"),
          "an HTTP/1.0 client gets a plain (not chunked) event stream ended by closing")

    # Absolute-form targets and HEAD.
    s, _, b, _ = request(a, "GET", "http://127.0.0.1:%d/healthz" % a.port)
    check(s == 200 and "alive" in b, "an absolute-form target is served")
    s, h, b, _ = request(a, "HEAD", "/healthz")
    check(s == 200 and b == "" and int(h.get("content-length", "0")) > 0, "HEAD gets the GET's headers and no body")

    # Transfer-Encoding other than chunked alone; NUL bytes; Content-Type; Host; 404 message.
    sock = connect(a)
    sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: gzip, chunked\r\n\r\nd\r\n{\"text\": \"x\"}\r\n0\r\n\r\n")
    s, _, b = parse(read_all(sock))
    sock.close()
    check(s == 501, "Transfer-Encoding: gzip, chunked -> 501 (the body is not read as plain)")
    s, _, b, _ = request(a, "POST", "/v1/classify", raw_body=b'{"text": "x"}\x00 trailing junk')
    check(s == 400 and "NUL" in json.loads(b)["error"]["message"], "a NUL byte in the body -> 400")
    s, _, b, _ = request(a, "POST", "/v1/classify", raw_body=b'{"text": "x"}', headers={"Content-Type": "text/plain"})
    check(s == 415, "a text/plain POST -> 415")
    s, _, b, _ = request(a, "GET", "/healthz", headers={"Host": "evil.example"})
    check(s == 400 and json.loads(b)["error"]["code"] == "invalid_host", "a non-loopback Host on a loopback server -> 400")
    s, _, b, _ = request(a, "GET", "/healthz", headers={"Host": "localhost:%d" % a.port})
    check(s == 200, "Host: localhost:PORT is served")
    s, _, b, _ = request(a, "GET", "/secret-<script>")
    check(s == 404 and "secret" not in b and "script" not in b, "the 404 message does not echo the path")

    # /v1/generate refuses a prompt over --gen-max-prompt-tokens (256) instead of cutting it.
    s, _, b, _ = request(a, "POST", "/v1/generate", {"prompt": "word " * 300, "max_tokens": 2})
    check(s == 400 and json.loads(b)["error"]["code"] == "context_length_exceeded", "/v1/generate: a 300-token prompt -> 400")
    s, _, b, _ = request(a, "POST", "/v1/generate", {"prompt": "word " * 256, "max_tokens": 2})
    check(s == 200, "/v1/generate: a 256-token prompt -> 200")
    # X-Request-Timeout-Ms: 0 is no budget.
    s, _, _, _ = request(a, "POST", "/v1/classify", {"text": "x"}, headers={"X-Request-Timeout-Ms": "0"})
    check(s == 200, "X-Request-Timeout-Ms: 0 means no budget -> 200")

    # The live Little's-law check and the SLO bucket.
    # Load for 1.5 s from 4 clients while /metrics is read: with load in the window the
    # check's deviation is some non-zero number (never exactly 0 with real timings).
    stop_at = time.monotonic() + 1.5

    def load():
        i = 0
        while time.monotonic() < stop_at:
            request(a, "POST", "/v1/classify", {"text": "some load %d" % i})
            i += 1
    loaders = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in loaders:
        t.start()
    seen = []
    while time.monotonic() < stop_at:
        m = request(a, "GET", "/metrics")[2]
        dev = re.search(r'^tailbatch_pipeline_littles_law_deviation\{pipeline="classify"\} (\S+)', m, re.M)
        if dev:
            seen.append(float(dev.group(1)))
        time.sleep(0.1)
    for t in loaders:
        t.join()
    checks = re.search(r"^tailbatch_serve_littles_law_checks_total (\d+)", m, re.M)
    sus = re.search(r'^tailbatch_pipeline_hidden_queue_suspected\{pipeline="classify"\} (\S+)', m, re.M)
    check(checks and int(checks.group(1)) >= 5 and any(d != 0.0 for d in seen) and sus,
          "the Little's-law check runs live (%s checks; deviations seen under load %s; suspected %s)" %
          (checks and checks.group(1), sorted(set(round(d, 3) for d in seen))[:6], sus and sus.group(1)))
    check('le="0.15"' in m, "--slo-p95-ms 150 gives the histograms an exact le=\"0.15\" bucket")

    # A client that sends one byte after its request and leaves is noticed: its generation is cancelled.
    slow = Server("--decode-delay-ms", "20")
    before = slow.stats()["generate"]["requests"]["cancelled"]
    body = json.dumps({"model": GEN, "prompt": "x", "max_tokens": 500}).encode()
    sock = connect(slow)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.2)
    sock.sendall(b"x")
    time.sleep(0.1)
    sock.close()
    end = time.monotonic() + 5
    while time.monotonic() < end and slow.stats()["generate"]["requests"]["cancelled"] == before:
        time.sleep(0.05)
    check(slow.stats()["generate"]["requests"]["cancelled"] == before + 1,
          "a client that sends a byte after its request and leaves cancels its generation")

    # Write timeout: a client that never reads a long stream loses its connection.
    w = Server("--write-timeout-ms", "300", "--gen-max-tokens", "100000", "--gen-token-budget", "200000")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", w.port))
    body = json.dumps({"model": GEN, "prompt": "x", "max_tokens": 50000, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    end = time.monotonic() + 15
    while time.monotonic() < end and w.stats()["http"]["client_disconnects"] == 0:
        time.sleep(0.1)
    st = w.stats()
    check(st["http"]["client_disconnects"] == 1 and st["generate"]["requests"]["cancelled"] == 1,
          "a client that never reads is dropped after --write-timeout-ms and its generation cancelled")
    sock.close()

    # --max-connections: the third connection waits until one of two closes.
    mc = Server("--max-connections", "2")
    c1, c2 = connect(mc), connect(mc)
    time.sleep(0.2)
    c3 = connect(mc, timeout=0.5)
    c3.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    try:
        waited = c3.recv(100) == b""
    except socket.timeout:
        waited = True
    check(waited, "--max-connections 2: a third connection is not served while two are open")
    c1.close()
    c3.settimeout(5)
    check(c3.recv(100).startswith(b"HTTP/1.1 200"), "--max-connections: it is served once one closes")
    for c in (c2, c3):
        c.close()

    # accept() does not spin when file descriptors run out.
    def low_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    e = Server("--io-threads", "1", preexec=low_fds)
    held = []
    try:
        for _ in range(80):
            held.append(connect(e, timeout=2))
    except OSError:
        pass
    time.sleep(0.3)
    with open("/proc/%d/stat" % e.proc.pid) as f:
        f0 = f.read().split()
    time.sleep(1.0)
    with open("/proc/%d/stat" % e.proc.pid) as f:
        f1 = f.read().split()
    ticks = (int(f1[13]) + int(f1[14])) - (int(f0[13]) + int(f0[14]))
    cpu_s = ticks / os.sysconf("SC_CLK_TCK")
    for c in held:
        c.close()
    check(cpu_s < 0.3, "out of file descriptors with clients waiting: %.2f s of CPU in 1 s (no accept spin)" % cpu_s)
    time.sleep(0.3)
    metrics = request(e, "GET", "/metrics")[2]
    errs = re.search(r"^tailbatch_serve_accept_errors_total (\d+)", metrics, re.M)
    check(errs and int(errs.group(1)) >= 1, "accept errors counted (%s)" % (errs and errs.group(1)))

    # SIGHUP drains (exit 0); a second signal while draining exits at once.
    h1 = Server()
    h1.proc.send_signal(signal.SIGHUP)
    check(h1.proc.wait(timeout=15) == 0, "SIGHUP drains and exits 0")
    h2 = Server("--decode-delay-ms", "50", "--drain-timeout-ms", "20000")
    holder = threading.Thread(target=lambda: request(h2, "POST", "/v1/completions", {"model": GEN, "prompt": "x", "max_tokens": 1000}),
                              daemon=True)
    holder.start()
    time.sleep(0.5)
    h2.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    check(h2.proc.poll() is None, "SIGTERM with a long generation in flight: still draining")
    t = time.monotonic()
    h2.proc.send_signal(signal.SIGTERM)
    rc = h2.proc.wait(timeout=5)
    check(rc != 0 and time.monotonic() - t < 2, "a second SIGTERM forces the exit (rc %d)" % rc)

    kill_all()
    print("all wire checks passed")


harness.run(main, seconds=80)  # ctest allows 90 s
