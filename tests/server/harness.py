"""What the tests under tests/server/ share: the "ok   ..." / "FAIL: ..." lines, one deadline
for the whole test, and the processes a test starts (tailbatch-serve on 127.0.0.1 with
--port 0, load generators, a browser), every one of them killed when the test ends, however
it ends.

    import harness
    from harness import check, fail

    def main():
        srv = harness.Server(SERVE, "--max-batch", "8")   # started, port read, /readyz 200
        status, body = srv.http("GET", "/v1/stats")
        check(status == 200, "/v1/stats answers 200")

    harness.run(main, seconds=55)

A script run as `python3 tests/server/test_x.py` finds this module next to it.
"""
import http.client
import json
import re
import subprocess
import tempfile
import threading
import time
import traceback

_deadline = time.monotonic() + 60
_procs = []  # every process started here or handed to watch(), killed by kill_all()
_servers = []  # the Servers among them, whose stderr a failure prints


def set_deadline(seconds):
    """The whole test must end within `seconds` from now; left() counts down to it."""
    global _deadline
    _deadline = time.monotonic() + seconds


def left(floor=0.5):
    """Seconds to the deadline, never below `floor` (a wait bounded by it still waits a little)."""
    return max(floor, _deadline - time.monotonic())


def fail(msg):
    """Prints FAIL and the last of every server's stderr, and exits 1."""
    print("FAIL: " + msg, flush=True)
    for srv in _servers:
        print("--- stderr of %s (exit %s), last 4000 characters:\n%s" %
              (" ".join(srv.args), srv.proc.poll(), srv.stderr_text()[-4000:]))
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok   " + msg, flush=True)


def watch(proc):
    """Has kill_all() kill proc (a subprocess.Popen) too; returns it."""
    _procs.append(proc)
    return proc


def kill_all():
    for p in reversed(_procs):
        try:
            if p.poll() is None:
                p.kill()
            p.wait()
        except Exception:
            pass


def run(main, seconds):
    """Runs main() within a deadline of `seconds`: an exception it did not expect is a
    failure (with its traceback), and every process started is killed at the end."""
    set_deadline(seconds)
    try:
        main()
    except SystemExit:
        raise
    except BaseException as ex:
        traceback.print_exc()
        fail("unexpected exception: %r" % ex)
    finally:
        kill_all()


def listening_port(proc, what):
    """The port of the first stdout line, `listening on 127.0.0.1:PORT` (tailbatch-serve's and
    the examples'), waiting at most 20 s for it; fails naming `what` otherwise."""
    box = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(min(20, left()))
    line = box[0] if box else None
    m = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", line or "")
    if not m:
        fail("first stdout line of %s is %r, not 'listening on 127.0.0.1:PORT'" % (what, line))
    return int(m.group(1))


class Server:
    """tailbatch-serve (the program `serve`) started with --port 0 and `args`, its port read
    from its first line and, unless ready=False, waited for until /readyz answers 200. Its
    stderr goes to a file (a pipe could fill and block it) that fail() prints."""

    def __init__(self, serve, *args, ready=True, preexec=None):
        self.args = [serve, "--port", "0", *args]
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = watch(subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                           preexec_fn=preexec))
        _servers.append(self)
        self.port = listening_port(self.proc, self.args)
        self.base = "http://127.0.0.1:%d" % self.port
        if ready:
            self.wait_ready()

    def http(self, method, path, body=None, headers=None, timeout=10):
        """One request on a fresh connection: (status, body bytes). body: bytes or text."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=min(timeout, left(1.0)))
        try:
            conn.request(method, path, body, headers or {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def stats(self):
        """GET /v1/stats, parsed; fails unless it answers 200."""
        status, body = self.http("GET", "/v1/stats")
        if status != 200:
            fail("/v1/stats answered %d: %r" % (status, body[:300]))
        return json.loads(body)

    def wait_ready(self, seconds=20):
        end = time.monotonic() + min(seconds, left())
        while time.monotonic() < end:
            try:
                if self.http("GET", "/readyz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        fail("%s never became ready" % self.args)

    def wait_exit(self, seconds=15):
        """Its exit status, waiting at most `seconds` (and never past the deadline); fails if it
        is still running then."""
        try:
            return self.proc.wait(timeout=min(seconds, left()))
        except subprocess.TimeoutExpired:
            fail("%s did not exit within %g s" % (" ".join(self.args), seconds))

    def terminate(self, seconds=15):
        """SIGTERM (the drain), then wait_exit(seconds): the exit status."""
        self.proc.terminate()
        return self.wait_exit(seconds)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stderr_text(self):
        self.err.seek(0)
        return self.err.read()
