#!/usr/bin/env python3
"""tailbatch-serve --embed-model libtorch (ctest tailbatch_serve_embed_libtorch, labels libtorch
and server; registered only where the build found libtorch): /v1/models lists the libtorch
embedder, /v1/embeddings with 3 inputs answers 3 unit-length float vectors of the encoder's
dimension (64 for the weights the build writes), and an input embedded alone and batched
with others gives the same vector within 1e-5. The server binds 127.0.0.1 with --port 0,
is stopped with SIGTERM at the end (killed if it does not exit); the run is bounded (60 s;
ctest allows 90).

    python3 test_embed_libtorch.py /path/to/tailbatch-serve
"""
import json
import math
import sys
import threading

import harness
from harness import check, fail

SERVE = sys.argv[1]
MODEL = "tailbatch-embed-libtorch"
DIM = 64


def request(srv, method, path, body=None):
    """(status, body bytes), waiting up to the deadline; body: a JSON value."""
    if body is None:
        return srv.http(method, path, timeout=60)
    return srv.http(method, path, json.dumps(body), {"Content-Type": "application/json"}, timeout=60)


def embed(srv, inputs):
    status, data = request(srv, "POST", "/v1/embeddings", {"model": MODEL, "input": inputs})
    if status != 200:
        fail("POST /v1/embeddings %r: %d %r" % (inputs, status, data[:300]))
    body = json.loads(data)
    return [item["embedding"] for item in sorted(body["data"], key=lambda d: d["index"])], body


def main():
    watchdog = threading.Timer(harness.left(), lambda: (print("FAIL: timed out", flush=True), harness.kill_all()))
    watchdog.daemon = True
    watchdog.start()
    srv = harness.Server(SERVE, "--embed-model", "libtorch", "--warmup-rounds", "1")
    check(True, "tailbatch-serve --embed-model libtorch ready on port %d" % srv.port)

    status, data = request(srv, "GET", "/v1/models")
    ids = [m["id"] for m in json.loads(data)["data"]]
    check(status == 200 and MODEL in ids and "tailbatch-reference-embedder" not in ids,
          "/v1/models lists %s (and not the reference embedder): %s" % (MODEL, ids))

    texts = ["the service was slow but the food excellent",
             "lovely view",
             "would never return: rude staff, noisy room, and the room was not clean at all"]
    vectors, body = embed(srv, texts)
    check(body["model"] == MODEL and len(vectors) == 3, "3 inputs give 3 embeddings from %s" % MODEL)
    for k, v in enumerate(vectors):
        check(len(v) == DIM and all(isinstance(x, float) for x in v), "embedding %d: %d floats" % (k, len(v)))
        norm = math.sqrt(sum(x * x for x in v))
        check(abs(norm - 1.0) < 1e-4, "embedding %d is L2-normalised (norm %.6f)" % (k, norm))
    check(max(abs(a - b) for a, b in zip(vectors[0], vectors[1])) > 1e-3, "different inputs, different vectors")

    # The same input alone, and in a batch with longer and shorter neighbours (padding must
    # not change it).
    alone, _ = embed(srv, [texts[1], "good"])
    alone_good, _ = embed(srv, ["good"])
    batched, _ = embed(srv, [texts[2], texts[1], texts[0], "good", texts[1], "the food was good"])
    for name, v in (("alone", alone[0]), ("batched", batched[1]), ("batched again", batched[4]),
                    ("in the first request", vectors[1])):
        diff = max(abs(a - b) for a, b in zip(alone[0], v))
        check(diff <= 1e-5, "'%s' %s matches alone within 1e-5 (max diff %.2e)" % (texts[1], name, diff))
    for name, v in (("next to a longer text", alone[1]), ("batched", batched[3])):
        diff = max(abs(a - b) for a, b in zip(alone_good[0], v))
        check(diff <= 1e-5, "'good' %s matches alone within 1e-5 (max diff %.2e)" % (name, diff))

    status, data = request(srv, "POST", "/v1/embeddings", {"model": "tailbatch-reference-embedder", "input": "x"})
    check(status == 404, "the reference embedder's id is not served with --embed-model libtorch (%d)" % status)

    rc = srv.terminate()
    check(rc == 0, "SIGTERM drains and exits 0")
    watchdog.cancel()
    print("PASS")


if __name__ == "__main__":
    harness.run(main, seconds=60)  # ctest allows 90 s
