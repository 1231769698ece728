#!/usr/bin/env python3
"""The aggregator as an operator and an attacker see it (issue "Aggregator under attack and at scale"), over real
HTTPS on loopback against `dprec-aggregator serve`. One check per point of the issue; ctest runs each as its own
test, with small bounded numbers (a few hundred connections at most, no timing assertions: a bound on a wait is a
failure bound, never a measurement).

usage: agg_hardening.py PATH/TO/dprec-aggregator CHECK      (CHECK: one of the names in CHECKS, or "all")
Exits 0 when every check passed, 1 with the failed ones listed.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "dprec-aggregator"
FAILS = []
SERVERS = []  # every server started, stopped (by its pid) when a check ends


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


class Server:
    """A `dprec-aggregator serve` in a state directory of its own, on ephemeral loopback ports."""

    def __init__(self, tmp, name="state", args=(), config=None):
        self.dir = tmp
        self.state = os.path.join(tmp, name)
        self.args = list(args)
        self.config = config
        self.proc = None
        self.ports = None
        self.log_path = os.path.join(tmp, name + ".log")

    def start(self, wait=True):
        ports_path = os.path.join(self.state, "ports.json")
        if wait and os.path.exists(ports_path):
            os.unlink(ports_path)
        argv = [BIN, "serve", "--state-dir", self.state, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                "--threads", "2"] + self.args
        if self.config is not None:
            cpath = self.state + ".json"
            with open(cpath, "w") as f:
                json.dump(self.config, f)
            argv += ["--config", cpath]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log)
        SERVERS.append(self.proc)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self):
        ports_path = os.path.join(self.state, "ports.json")
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("server exited early with status %d; see %s:\n%s" %
                                 (self.proc.returncode, self.log_path, self.log_text()[-3000:]))
            try:
                with open(ports_path) as f:
                    self.ports = json.load(f)
                if self.ports.get("pid") == self.proc.pid:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        else:
            raise SystemExit("no ports.json after 30 s")
        self.ctx = ssl.create_default_context(cafile=os.path.join(self.state, "tls-cert.pem"))
        with open(os.path.join(self.state, "admin-token")) as f:
            self.admin_token = f.read().strip()

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_lines(self):
        return [l for l in self.log_text().split("\n") if l.strip()]

    def port(self, listener):
        return self.ports["device" if listener == "device" else "admin"]

    def conn(self, listener="device", timeout=30, source=None):
        return http.client.HTTPSConnection("127.0.0.1", self.port(listener), context=self.ctx, timeout=timeout,
                                           source_address=(source, 0) if source else None)

    def request(self, listener, method, path, body=None, token=None, ctype=None, headers=None, timeout=30,
                source=None):
        c = self.conn(listener, timeout, source)
        h = dict(headers or {})
        if token:
            h["Authorization"] = "Bearer " + token
        if ctype:
            h["Content-Type"] = ctype
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, r.getheader("Content-Type"), data
        finally:
            c.close()

    def json(self, *a, **kw):
        status, ctype, data = self.request(*a, **kw)
        try:
            return status, json.loads(data.decode()) if data else None
        except ValueError:
            return status, {"_raw": data[:300]}

    def admin(self, method, path, body=None, timeout=30):
        return self.json("admin", method, path, body=body, token=self.admin_token, timeout=timeout,
                         ctype="application/json" if body is not None else None)

    def register(self):
        status, body = self.json("device", "POST", "/v1/register", body=b"{}", ctype="application/json")
        if status != 201:
            raise SystemExit("register failed: %s %s" % (status, body))
        return body["token"]

    def create_job(self, d=4, m=10, min_reports=100, rounds=3, round_seconds=3600, protocol="plain", params=None):
        spec = {"protocol": protocol, "d": d, "m": m, "rating_min": 1, "rating_max": 5, "rounds": rounds,
                "min_reports": min_reports, "round_seconds": round_seconds, "participation": 1.0,
                "params": params if params is not None else {"lambda": 0.1, "seed": 1}}
        status, body = self.admin("POST", "/v1/admin/jobs", body=json.dumps(spec).encode())
        if status != 201:
            raise SystemExit("create job failed: %s %s" % (status, body))
        return body["job"]

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1


def plain_report(job, rnd, d, items, report_id=None, release_version=None):
    payload = struct.pack("<II", d, len(items))
    payload += struct.pack("<%df" % d, *[0.1 * (k + 1) for k in range(d)])
    for item, rating in items:
        payload += struct.pack("<If", item, rating)
    rid = report_id if report_id is not None else os.urandom(16)
    rv = release_version if release_version is not None else rnd
    header = b"DPRR" + struct.pack("<HHQQ", 1, 1, job, rnd) + rid + struct.pack("<QII", rv, len(payload), 0)
    return header + payload


def tls_socket(srv, listener="device", source=None, timeout=10):
    raw = socket.create_connection(("127.0.0.1", srv.port(listener)), timeout=timeout,
                                   source_address=(source, 0) if source else None)
    return srv.ctx.wrap_socket(raw, server_hostname="localhost")


def read_http_response(s, limit=1 << 16):
    """Reads one HTTP/1.1 response (status line, headers, Content-Length body) from a TLS socket."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
        if len(buf) > limit:
            break
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = s.recv(4096)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:n]


# ---- the checks -----------------------------------------------------------------------------------------------


def check_state_lock(tmp):
    """2. A second server on the same state directory is refused with a clear message; the first keeps serving."""
    a = Server(tmp).start()
    b = Server(tmp)
    b.log_path = os.path.join(tmp, "second.log")
    b.start(wait=False)
    try:
        rc = b.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = None
    text = b.log_text()
    check(rc is not None and rc != 0, "a second server on the same state directory exits (status %s)" % rc)
    check("another dprec-aggregator" in text and str(a.proc.pid) in text,
          "its message names the running server's pid (%s)" % text.strip().split("\n")[-1:])
    status, body = a.json("device", "GET", "/healthz")
    check(status == 200, "the first server still answers /healthz (%s)" % status)
    with open(os.path.join(a.state, "ports.json")) as f:
        check(json.load(f).get("pid") == a.proc.pid, "ports.json still names the first server")
    b.stop(signal.SIGKILL)
    check(a.stop() == 0, "the first server stops cleanly")
    # the lock dies with its process: a restart after kill -9 is not blocked by a stale lock file
    a2 = Server(tmp).start()
    a2.stop(signal.SIGKILL)
    a3 = Server(tmp).start()
    status, _ = a3.json("device", "GET", "/healthz")
    check(status == 200, "after kill -9 the state directory can be served again (%s)" % status)
    a3.stop()


CHECKS = {
    "state_lock": check_state_lock,
}


def main():
    if len(sys.argv) < 3 or (sys.argv[2] not in CHECKS and sys.argv[2] != "all"):
        print(__doc__)
        print("checks: " + ", ".join(sorted(CHECKS)))
        sys.exit(2)
    names = sorted(CHECKS) if sys.argv[2] == "all" else [sys.argv[2]]
    for name in names:
        tmp = tempfile.mkdtemp(prefix="dprec-hard-")
        before = len(FAILS)
        try:
            print("== " + name, flush=True)
            CHECKS[name](tmp)
        except (SystemExit, Exception) as e:  # an exception is a failed check, never a crash of the runner
            FAILS.append("%s: %r" % (name, e))
            print("FAIL %r" % e)
        finally:
            for f in sorted(os.listdir(tmp)):
                if f.endswith(".log") and len(FAILS) > before:
                    with open(os.path.join(tmp, f), "rb") as fh:
                        print("---- %s (tail) ----" % f)
                        print(fh.read()[-3000:].decode(errors="replace"))
            for p in SERVERS:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            del SERVERS[:]
            shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
