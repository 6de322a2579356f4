#!/usr/bin/env python3
"""examples/minimal_server.cpp answers its one route (ctest minimal_server, label server):
starts it on 127.0.0.1 with port 0, classifies a text, checks the 404 and 405 and the
400 for a bad body, and kills it. Bounded: 30 s.

    python3 test_minimal_server.py /path/to/minimal_server
"""
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request

proc = subprocess.Popen([sys.argv[1], "0"], stdout=subprocess.PIPE, text=True)
try:
    m = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", proc.stdout.readline())
    assert m, "no 'listening on' line"
    base = "http://127.0.0.1:%s" % m.group(1)

    def call(method, path, body=None):
        req = urllib.request.Request(base + path, method=method, data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    s, j = call("POST", "/classify", b'{"text": "a great, moving film with superb acting"}')
    assert s == 200 and j["label"] == "positive" and 0 < j["score"] <= 1, (s, j)
    print("ok   POST /classify -> 200 positive")
    assert call("GET", "/nowhere")[0] == 404
    assert call("GET", "/classify")[0] == 405
    assert call("POST", "/classify", b'{"txt": 1}')[0] == 400
    print("ok   404, 405 and 400")
finally:
    proc.kill()
    proc.wait()
