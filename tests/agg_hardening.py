#!/usr/bin/env python3
"""The aggregator as an operator and an attacker see it (issue "Aggregator under attack and at scale"), over real
HTTPS on loopback against `dprec-aggregator serve`. One check per point of the issue; ctest runs each as its own
test, with small bounded numbers (a few hundred connections at most, no timing assertions: a bound on a wait is a
failure bound, never a measurement).

usage: agg_hardening.py PATH/TO/dprec-aggregator CHECK      (CHECK: one of the names in CHECKS, or "all")
The aggregator's state is on SQLite, or on PostgreSQL with DPREC_TEST_STATE=postgresql (tests/serve_util.py; ctest's
aggregator_CHECK_postgresql): the checks that touch the state run on both, and the parts of a check that look at what
only SQLite has (its files' modes, an older SQLite schema) say so and run on SQLite only.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402  (waiting for ports.json; the state engine)

BIN = sys.argv[1] if len(sys.argv) > 1 else "dprec-aggregator"
RELAY = "relay" in os.path.basename(BIN)  # front_end_attacks.py runs this harness on dprec-relay too: SQLite only
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
        if wait:
            serve_util.remove_ports(self.state)
        argv = [BIN, "serve", "--state-dir", self.state, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                "--threads", "2"] + (serve_util.state_args(self.state) if not RELAY else []) + self.args
        if self.config is not None:
            cpath = self.state + ".json"
            with open(cpath, "w") as f:
                json.dump(self.config, f)
            argv += ["--config", cpath]
        self.log = open(self.log_path, "ab")
        env = dict(os.environ)
        # under AddressSanitizer (the --asan build), freed memory waits in a quarantine of up to 256 MB: keep it small
        # so that the RSS of a server that holds nothing stays small too (ignored by a build without ASan)
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=8").lstrip(":")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        SERVERS.append(self.proc)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self):
        self.ports = serve_util.wait_for_ports(self.proc, self.state, 30, self.log_path)
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

    def create_job(self, d=4, m=10, min_reports=100, rounds=3, round_seconds=3600, protocol="plain", params=None,
                   timeout=30):
        spec = {"protocol": protocol, "d": d, "m": m, "rating_min": 1, "rating_max": 5, "rounds": rounds,
                "min_reports": min_reports, "round_seconds": round_seconds, "participation": 1.0,
                "params": params if params is not None else {"lambda": 0.1, "seed": 1}}
        status, body = self.admin("POST", "/v1/admin/jobs", body=json.dumps(spec).encode(), timeout=timeout)
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


def raw_request(srv, head, listener="device", source=None, timeout=15, body=b""):
    """Sends a request head (and body) on a fresh TLS connection; returns (status, headers, body) or None."""
    s = tls_socket(srv, listener, source, timeout)
    try:
        s.sendall(head.encode() + body)
        return read_http_response(s)
    except (OSError, ValueError):
        return None
    finally:
        s.close()


def metric(text, name):
    """The value of one series (name with its labels, exactly as printed), or None."""
    for line in text.split("\n"):
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def check_body_before_auth(tmp):
    """1. The token and the job's cap are checked from the headers, before a byte of the body is read; the bodies
    held in memory at once are bounded."""
    srv = Server(tmp).start()  # the defaults (max_report_bytes 16 MiB)
    job = srv.create_job(d=4, m=10, min_reports=100)
    token = srv.register()
    # 20 uploads of 16 MB announced with a wrong token, their bodies never sent: each is answered at once
    results = [None] * 20

    def bad(i):
        results[i] = raw_request(srv, "POST /v1/jobs/%d/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                                      "Content-Type: application/octet-stream\r\nContent-Length: 16000000\r\n\r\n"
                                 % (job, "f" * 64), timeout=20)

    ts = [threading.Thread(target=bad, args=(i,)) for i in range(20)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ok = [r for r in results if r is not None and r[0] == 401 and b"unauthorized" in r[2]]
    check(len(ok) == 20, "20 announced 16 MB bodies with a wrong token: 401 from the headers alone (%d of 20)" % len(ok))
    # a valid token, a body longer than the job's own cap (plain, d = 4, m = 10: 56 + 8 + 16 + 80 = 160 bytes)
    r = raw_request(srv, "POST /v1/jobs/%d/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                         "Content-Length: 2000000\r\n\r\n" % (job, token))
    check(r is not None and r[0] == 413 and b"too_large" in r[2],
          "a body above the job's cap (160 bytes) is 413 before it is sent (%s)" % (r[:1] if r else r,))
    r = raw_request(srv, "POST /v1/jobs/%d/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                         "Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n" % (job, token))
    check(r is not None and r[0] == 413 and b"too_large" in r[2],
          "and with Expect: 100-continue, a small one too (%s)" % (r[:1] if r else r,))
    r = raw_request(srv, "POST /v1/jobs/%d/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                         "Content-Length: 1000\r\n\r\n" % (job, token), body=b"\0" * 1000)
    check(r is not None and r[0] == 413 and b"too_large" in r[2],
          "a small body sent whole is read, dropped and answered 413 (%s)" % (r[:1] if r else r,))
    # and memory stays flat: 20 concurrent 16 MB uploads with a wrong token, bodies sent for real
    rss0 = srv.rss_kb()

    def upload(i):
        try:
            raw_request(srv, "POST /v1/jobs/%d/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                             "Content-Length: 16000000\r\n\r\n" % (job, "e" * 64), body=b"\0" * 16000000, timeout=30)
        except Exception:  # the server hangs up on a refused upload: expected
            pass

    ts = [threading.Thread(target=upload, args=(i,)) for i in range(20)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rss1 = srv.rss_kb()
    text = srv.request("admin", "GET", "/metrics")[2].decode()
    peak = metric(text, "dprec_http_inflight_body_bytes_max")
    # What is reserved is a small JSON body's buffer (1,024 bytes), at times two of them at once: a request keeps its
    # reservation until libmicrohttpd reports it completed, after its response was sent, and the client's next
    # request can arrive first (seen on a loaded machine: 1,026). One of the uploads would show as its 16,000,000.
    check(peak is not None and peak <= 4 * 1024, "no byte of those bodies was reserved or buffered (in-flight peak %s: "
          "the small JSON bodies of the job and the registration)" % peak)
    check(rss1 - rss0 < 64 * 1024, "20 x 16 MB uploads with a wrong token: RSS grew %d KB (< 64 MB; the landed server "
          "buffered them: 2.5 GB for 200)" % (rss1 - rss0))
    status, body = srv.json("device", "GET", "/healthz")
    check(status == 200, "the server still answers (%s)" % status)
    check(srv.stop() == 0, "and stops cleanly")
    # the in-flight budget: two bodies of 150,000 bytes announced (within the big job's cap, 160,080) do not both fit
    # in 200,000
    srv = Server(tmp, name="state2", args=["--max-inflight-bytes", "200000"]).start()
    big = srv.create_job(d=4, m=20000, min_reports=100)  # a plain report: up to 8 + 16 + 8 m bytes
    token = srv.register()
    holders = []
    statuses = []
    for i in range(2):
        s = tls_socket(srv)
        s.sendall(("POST /v1/jobs/%d/reports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                   "Content-Length: 150000\r\n\r\n" % (big, token)).encode())
        holders.append(s)
        time.sleep(0.5)  # the first one's reservation is made before the second one's headers arrive
    holders[1].settimeout(10)
    try:
        st = read_http_response(holders[1])
    except OSError:
        st = None
    check(st is not None and st[0] == 503 and b"busy" in st[2] and st[1].get("retry-after") == "1",
          "the second body past --max-inflight-bytes is 503 busy with Retry-After before it is read (%s)" %
          (st[:2] if st else st,))
    for h in holders:
        h.close()
    status, _, text = srv.request("admin", "GET", "/metrics")
    peak = metric(text.decode(), "dprec_http_inflight_body_bytes_max")
    check(peak is not None and 150000 <= peak <= 200000, "in-flight body bytes never passed the budget (peak %s)" % peak)
    check(srv.stop() == 0, "and the server stops cleanly")


def check_connections(tmp):
    """3. One address cannot take every connection: a per-address limit, a handshake timeout, and one log line for a
    flood of refusals."""
    srv = Server(tmp, config={"connection_limit": 100}).start()  # the defaults, and a small listener limit
    port = srv.port("device")
    idle = []
    for i in range(150):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    time.sleep(0.3)
    try:
        status, _, _ = srv.request("device", "GET", "/healthz", source="127.0.0.2", timeout=10)
    except Exception as e:  # refused or timed out: the flood took every slot
        status = repr(e)
    check(status == 200, "with 150 idle connections from 127.0.0.1, a client from 127.0.0.2 is served (%s)" % status)
    lines = [json.loads(l) for l in srv.log_lines() if l.startswith("{")]
    refused = [l for l in lines if l.get("event") == "connection_refused"]
    check(1 <= len(refused) <= 3 and refused[0].get("client") == "127.0.0.1",
          "the refusals are logged once (rate-limited), with the client's address (%d lines: %s)" %
          (len(refused), refused[:1]))
    http_lines = [l for l in lines if l.get("event") == "http"]
    check(len(http_lines) <= 10, "no flood of libmicrohttpd warnings (%d lines)" % len(http_lines))
    status, _, text = srv.request("admin", "GET", "/metrics")
    n = metric(text.decode(), 'dprec_http_refused_total{limit="connections_per_address"}')
    check(n is not None and n >= 50, "dprec_http_refused_total counts them (%s)" % n)
    for s_ in idle:
        s_.close()
    srv.stop()
    # connections that never start TLS are closed after handshake_timeout (2 s here; 10 by default)
    srv = Server(tmp, name="state2", args=["--handshake-timeout", "2"]).start()
    idle = [socket.create_connection(("127.0.0.1", srv.port("device")), timeout=5) for i in range(20)]
    deadline = time.time() + 15
    open_ = list(idle)
    while open_ and time.time() < deadline:
        still = []
        for s in open_:
            s.settimeout(0.05)
            try:
                if s.recv(1) != b"":
                    still.append(s)
            except socket.timeout:
                still.append(s)
            except OSError:
                pass
        open_ = still
        time.sleep(0.2)
    check(not open_, "every idle connection was closed by the server within the handshake timeout (%d left)" %
          len(open_))
    for s_ in idle:
        s_.close()
    srv.stop()


def slow_round(srv):
    """A job whose round takes a while to finalize (m = 200,000, d = 64: a 51 MB release) with one report in it.
    Its creation builds and signs release 1 (51 MB): on a loaded 2-core machine that took more than 30 s (CI of
    branch dpmf, beside four other engineers' fleets), so its calls wait up to 120 s."""
    job = srv.create_job(d=64, m=200000, min_reports=1000, rounds=2, timeout=120)
    token = srv.register()
    report = plain_report(job, 1, 64, [(5, 4.0), (1000, 3.0)])
    status, body = srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=report, token=token,
                            ctype="application/octet-stream", timeout=120)
    if status != 200:
        raise SystemExit("report to the big job: %s %s" % (status, body))
    return job, token


def start_round_close(srv, job):
    """Starts an admin round close in a thread; returns once the finalizer says it began (round_finalize_started; at
    most 30 s, or as soon as the call returned). A shorter wait (0.5 s) let a SIGTERM overtake the request itself on
    a loaded 2-core machine, where its TLS handshake alone took longer: the test then saw a connection refused by the
    drain, which is not the drain it checks."""
    out = {}

    def run():
        try:
            out["r"] = srv.admin("POST", "/v1/admin/jobs/%d/round/close" % job, timeout=120)
        except Exception as e:
            out["r"] = ("error", repr(e))

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 30
    while time.time() < deadline and '"event":"round_finalize_started"' not in srv.log_text():
        if not t.is_alive():
            break
        time.sleep(0.01)
    return t, out


def check_finalize_off_requests(tmp):
    """4. While a round's global step runs, /healthz, registrations and reports of other jobs are answered."""
    srv = Server(tmp).start()
    job, token = slow_round(srv)
    other = srv.create_job(d=4, m=10, min_reports=100)
    t, out = start_round_close(srv, job)
    started = '"event":"round_finalize_started"' in srv.log_text()
    status, _ = srv.json("device", "GET", "/healthz", timeout=60)
    alive_h = t.is_alive()
    tok2 = srv.register()
    report = plain_report(other, 1, 4, [(1, 5.0)])
    st2, body2 = srv.json("device", "POST", "/v1/jobs/%d/reports" % other, body=report, token=tok2,
                          ctype="application/octet-stream", timeout=60)
    alive_r = t.is_alive()
    check(started, "the finalizer logged round_finalize_started")
    check(status == 200 and alive_h, "/healthz answered 200 while the round was being finalized (%s, still "
          "finalizing: %s)" % (status, alive_h))
    check(st2 == 200 and alive_r, "a registration and a report of another job answered meanwhile (%s, still "
          "finalizing: %s)" % (st2, alive_r))
    t.join()
    r = out.get("r")
    check(r is not None and r[0] == 200 and r[1].get("round") == 2, "the round close then answered 200, round 2 (%s)" %
          (r[:1] if r else r,))
    srv.stop()


def check_drain_on_sigterm(tmp):
    """5. SIGTERM in the middle of an admin round close: the caller gets its answer, then the server exits 0."""
    srv = Server(tmp).start()
    job, token = slow_round(srv)
    t, out = start_round_close(srv, job)
    srv.proc.send_signal(signal.SIGTERM)
    t.join()
    try:
        rc = srv.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    r = out.get("r")
    check(r is not None and r[0] == 200 and r[1].get("round") == 2,
          "the round close in flight at SIGTERM got its answer: 200, round 2 (%s)" % (r,) if r is None or r[0] != 200
          else "the round close in flight at SIGTERM got its answer: 200, round %s" % r[1].get("round"))
    check(rc == 0, "the server exited 0 after draining (exit %s)" % rc)
    srv2 = Server(tmp).start()
    status, body = srv2.admin("GET", "/v1/admin/jobs/%d" % job, timeout=120)
    check(status == 200 and body.get("round") == 2, "after a restart the round is closed, once (%s)" %
          (body.get("round") if body else None))
    srv2.stop()


ISO = __import__("re").compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def check_logs(tmp):
    """6. One log format and schema for the server and the core; the client's address on request lines; a failed
    admin login logged at warn."""
    srv = Server(tmp, args=["--log-level", "debug"]).start()
    job = srv.create_job(d=4, m=10, min_reports=1)
    token = srv.register()
    status, _ = srv.json("admin", "GET", "/v1/admin/jobs", token="wrong-token-0123456789")
    check(status == 401, "a wrong admin token is 401 (%s)" % status)
    report = plain_report(job, 1, 4, [(1, 5.0)])
    srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=report, token=token, ctype="application/octet-stream")
    srv.stop()
    bad, objs = [], []
    for line in srv.log_lines():
        try:
            o = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        objs.append(o)
        if not (isinstance(o, dict) and isinstance(o.get("ts"), str) and ISO.match(o["ts"]) and
                o.get("level") in ("debug", "info", "warn", "error") and isinstance(o.get("event"), str)):
            bad.append(line)
    check(not bad and len(objs) > 5, "every line is {ts: ISO 8601, level, event, ...} (%d lines, bad: %s)" %
          (len(objs), bad[:2]))
    events = {o.get("event") for o in objs}
    check({"state_opened", "job_created", "round_finalized", "request"} <= events,
          "the core's events and the server's share that schema (%s)" % sorted(events))
    reqs = [o for o in objs if o.get("event") == "request"]
    check(reqs and all(o.get("client") == "127.0.0.1" for o in reqs), "request lines carry the client address")
    fails = [o for o in objs if o.get("event") == "admin_auth_failed"]
    check(len(fails) == 1 and fails[0].get("level") == "warn" and fails[0].get("client") == "127.0.0.1" and
          "wrong-token" not in json.dumps(fails[0]),
          "a failed admin login: one warn line with the client's address, never the token (%s)" % fails)


def check_metrics(tmp):
    """7. /metrics passes `promtool check metrics`; statuses are counted as sent; a finished job's series go; reports
    per group commit (dprec_commit_reports) count what each commit stored."""
    srv = Server(tmp).start()
    job = srv.create_job(d=4, m=10, min_reports=1, rounds=1)
    token = srv.register()
    srv.json("device", "GET", "/v1/jobs/%d" % job)                                   # 401
    srv.json("device", "POST", "/v1/admin/jobs", body=b"{}", ctype="application/json")  # 403
    srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=b"\0" * 1000, token=token,
             ctype="application/octet-stream")                                       # 413
    status, _, text = srv.request("admin", "GET", "/metrics")
    text = text.decode()
    check(status == 200, "/metrics answers (%s)" % status)
    p = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
    check(p.returncode == 0, "promtool check metrics passes (%d: %s)" % (p.returncode,
                                                                        (p.stdout + p.stderr).decode()[:500]))
    check(metric(text, 'dprec_requests_total{route="job",status="401"}') == 1 and
          metric(text, 'dprec_requests_total{route="admin",status="403"}') == 1 and
          metric(text, 'dprec_http_requests_total{listener="device",route="reports",code="413"}') == 1,
          "401, 403 and 413 are counted as themselves, not as 400")
    check(metric(text, 'dprec_job_round{job="%d"}' % job) == 1, "a running job has its series")
    report = plain_report(job, 1, 4, [(1, 5.0)])
    srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=report, token=token, ctype="application/octet-stream")
    status, body = srv.admin("GET", "/v1/admin/jobs/%d" % job)
    check(body.get("state") == "done", "the one-round job is done (%s)" % body.get("state"))
    text = srv.request("admin", "GET", "/metrics")[2].decode()
    check(('job="%d"' % job) not in text, "its per-job series are retired from /metrics")
    # reports per group commit (one transaction, one fsync): the registration's commit stored none, the report's one
    p = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
    check(p.returncode == 0, "promtool check metrics passes with reports committed (%d: %s)" %
          (p.returncode, (p.stdout + p.stderr).decode()[:500]))
    commits = metric(text, "dprec_commits_total")
    check(metric(text, "dprec_commit_reports_sum") == 1 and metric(text, "dprec_committed_reports_total") == 1 and
          metric(text, "dprec_commit_reports_count") == commits and commits is not None and commits >= 2 and
          metric(text, 'dprec_commit_reports_bucket{le="0"}') == commits - 1 and
          metric(text, 'dprec_commit_reports_bucket{le="1"}') == commits and
          metric(text, 'dprec_commit_reports_bucket{le="+Inf"}') == commits,
          "dprec_commit_reports: %s commits, one of them storing the one report (sum %s, le=0 %s, le=1 %s)" %
          (commits, metric(text, "dprec_commit_reports_sum"), metric(text, 'dprec_commit_reports_bucket{le="0"}'),
           metric(text, 'dprec_commit_reports_bucket{le="1"}')))
    srv.stop()


def gen_cert(dirname, name, days=None, expired=False, key=None):
    """A self-signed P-256 certificate (with openssl(1)); expired: valid in 2020 only. Returns (cert, key)."""
    os.makedirs(dirname, exist_ok=True)
    k = key or os.path.join(dirname, name + "-key.pem")
    c = os.path.join(dirname, name + "-cert.pem")
    if key is None:
        subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", k],
                       check=True, capture_output=True)
    if not expired:
        subprocess.run(["openssl", "req", "-x509", "-key", k, "-out", c, "-days", "30", "-subj", "/CN=localhost"],
                       check=True, capture_output=True)
        return c, k
    csr = os.path.join(dirname, name + ".csr")
    subprocess.run(["openssl", "req", "-new", "-key", k, "-out", csr, "-subj", "/CN=localhost"], check=True,
                   capture_output=True)
    with open(os.path.join(dirname, "ca.cnf"), "w") as f:
        f.write("[ca]\ndefault_ca = c\n[c]\ndatabase = %s/index.txt\nnew_certs_dir = %s\ndefault_md = sha256\n"
                "policy = p\nserial = %s/serial\n[p]\ncommonName = supplied\n" % (dirname, dirname, dirname))
    open(os.path.join(dirname, "index.txt"), "w").close()
    with open(os.path.join(dirname, "serial"), "w") as f:
        f.write("01\n")
    subprocess.run(["openssl", "ca", "-batch", "-config", os.path.join(dirname, "ca.cnf"), "-selfsign", "-keyfile", k,
                    "-in", csr, "-out", c, "-startdate", "20200101000000Z", "-enddate", "20200102000000Z"],
                   check=True, capture_output=True)
    return c, k


def expect_refused_start(tmp, name, args, words):
    srv = Server(tmp, name=name, args=args)
    srv.start(wait=False)
    try:
        rc = srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = None
    text = srv.log_text()
    return rc, all(w in text for w in words), text.strip().split("\n")[-2:]


def check_small_ones(tmp):
    """8. %00 in a path, NUL and invalid UTF-8 in registration fields, 414/431 in JSON, expired and mismatched
    certificates, TLS 1.2 CBC/SHA-1 suites, the state files' mode, the registration rate."""
    srv = Server(tmp).start()
    job = srv.create_job(d=4, m=10, min_reports=100)
    token = srv.register()
    status, ctype, body = srv.request("device", "GET", "/v1/jobs/%d/releases/1%%00" % job, token=token)
    check(status == 404 and ctype == "application/json", "/v1/jobs/%d/releases/1%%00 is 404 JSON, not release 1 "
          "(%s %s)" % (job, status, ctype))

    def devices():
        return int(serve_util.state_query(srv.state, "SELECT count(*) FROM devices"))

    n0 = devices()
    st1, b1 = srv.json("device", "POST", "/v1/register", body=b'{"platform":"and\\u0000roid"}', ctype="application/json")
    st2, b2 = srv.json("device", "POST", "/v1/register", body=b'{"platform":"and\xff\xferoid"}', ctype="application/json")
    st3, b3 = srv.json("device", "POST", "/v1/register", body=b'{"platform":"a\\u0007b"}', ctype="application/json")
    check(st1 == 400 and st2 == 400 and st3 == 400 and devices() == n0,
          "registration refuses NUL, invalid UTF-8 and control characters, and stores nothing (%s %s %s)" %
          (st1, st2, st3))
    st, b = srv.json("device", "POST", "/v1/register", body='{"platform":"Android 14 – Pixel"}'.encode(),
                     ctype="application/json")
    check(st == 201, "valid UTF-8 is accepted (%s)" % st)
    r = raw_request(srv, "GET /v1/jobs/%s HTTP/1.1\r\nHost: x\r\n\r\n" % ("1" * 10000))
    check(r is not None and r[0] == 414 and r[1].get("content-type") == "application/json" and b'"error"' in r[2],
          "a 10,000-byte path is 414 in JSON (%s)" % (r[:2] if r else r,))
    r = raw_request(srv, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n" % ("a" * 20000))
    check(r is not None and r[0] == 431 and r[1].get("content-type") == "application/json" and b'"error"' in r[2],
          "20 KB of headers is 431 in JSON (%s)" % (r[:2] if r else r,))
    for f in ("state.db", "state.db-wal", "state.db-shm") if not serve_util.PG else ():  # SQLite's files only
        mode = os.stat(os.path.join(srv.state, f)).st_mode & 0o777
        check(mode == 0o600, "%s is 0600 (%o)" % (f, mode))
    # TLS 1.2 offers AEAD suites with forward secrecy only
    for cipher, want in (("ECDHE-ECDSA-AES128-SHA", False), ("ECDHE-ECDSA-AES256-SHA384", False),
                         ("ECDHE-ECDSA-AES128-GCM-SHA256", True)):
        ctx = ssl.create_default_context(cafile=os.path.join(srv.state, "tls-cert.pem"))
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(cipher)
        try:
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", srv.port("device")), timeout=10),
                                server_hostname="localhost")
            s.close()
            got = True
        except (ssl.SSLError, OSError):
            got = False
        check(got == want, "TLS 1.2 with %s is %s" % (cipher, "accepted" if want else "refused"))
    # registrations per address: 60 a minute (a burst of 60), then 429 with Retry-After
    conn = srv.conn("device")
    codes = []
    for i in range(70):
        conn.request("POST", "/v1/register", body=b"{}", headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        codes.append((r.status, r.getheader("Retry-After")))
        if r.getheader("Connection", "").lower() == "close":
            conn.close()
            conn = srv.conn("device")
    conn.close()
    limited = [c for c in codes if c[0] == 429]
    check(limited and all(c[1] is not None for c in limited) and codes.count((201, None)) <= 60,
          "registrations from one address past 60 a minute get 429 with Retry-After (%d of 70)" % len(limited))
    srv.stop()
    # certificates: expired, or a key that is not the certificate's: refused at start, saying why
    certs = os.path.join(tmp, "certs")
    c_old, k_old = gen_cert(certs, "old", expired=True)
    rc, said, last = expect_refused_start(tmp, "s-expired", ["--cert", c_old, "--key", k_old], ["expired"])
    check(rc == 1 and said, "an expired certificate is refused at start, exit 1, saying so (%s %s)" % (rc, last))
    c_a, k_a = gen_cert(certs, "a")
    c_b, k_b = gen_cert(certs, "b")
    rc, said, last = expect_refused_start(tmp, "s-mismatch", ["--cert", c_a, "--key", k_b], ["does not belong"])
    check(rc == 1 and said, "a key that is not the certificate's is refused, not reported as 'address in use' (%s %s)"
          % (rc, last))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    rc, said, last = expect_refused_start(tmp, "s-inuse", ["--listen", "127.0.0.1:%d" % busy.getsockname()[1]],
                                          ["Address already in use"])
    busy.close()
    check(rc == 1 and said, "a port in use is reported as such (%s %s)" % (rc, last))


def check_report_reuse(tmp):
    """9. A report id reused with other bytes is 409 report_id_reused, in the open round and after its round dropped
    the payloads (the row keeps the envelope's SHA-256); the same bytes stay a 200 duplicate. A state written before
    digests were kept (schema 1) still opens. Before: 200 "duplicate": true and the new bytes dropped silently."""
    import sqlite3
    srv = Server(tmp).start()
    job = srv.create_job(d=4, m=10, min_reports=100, rounds=3)
    token = srv.register()
    rid = os.urandom(16)
    a = plain_report(job, 1, 4, [(1, 5.0)], report_id=rid)
    b = plain_report(job, 1, 4, [(2, 1.0)], report_id=rid)

    def post(body):
        return srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=body, token=token,
                        ctype="application/octet-stream")

    st, body = post(a)
    check(st == 200 and body.get("duplicate") is False, "a report is accepted (%s %s)" % (st, body))
    st, body = post(a)
    check(st == 200 and body.get("duplicate") is True, "its retry, same bytes: 200 duplicate (%s %s)" % (st, body))
    st, body = post(b)
    check(st == 409 and body.get("error") == "report_id_reused",
          "the same report id with other bytes: 409 report_id_reused (%s %s)" % (st, body))
    status, _ = srv.admin("POST", "/v1/admin/jobs/%d/round/close" % job)
    check(status == 200, "the round is finalized (its payloads dropped) (%s)" % status)
    st, body = post(a)
    check(st == 200 and body.get("duplicate") is True and body.get("round") == 1,
          "after finalization, the same bytes: 200 duplicate, round 1 (%s %s)" % (st, body))
    st, body = post(b)
    check(st == 409 and body.get("error") == "report_id_reused",
          "after finalization, other bytes: 409 report_id_reused (%s %s)" % (st, body))
    check(srv.stop() == 0, "the server stops cleanly")
    if serve_util.PG:
        return  # what follows is SQLite's own: its schema 1 (PostgreSQL's first schema has the digest column)
    # a state from before the digest column (schema 1): it opens, and is brought to schema 4 (2, 3, then 4)
    db = sqlite3.connect(os.path.join(srv.state, "state.db"))
    db.execute("DROP TABLE report_keys")
    db.execute("ALTER TABLE reports DROP COLUMN digest")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    srv = Server(tmp).start()
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(srv.state, "state.db"), uri=True)
    version = db.execute("PRAGMA user_version").fetchone()[0]
    db.close()
    check(version == 4, "a schema-1 state opens and is brought to schema 4 (%s)" % version)
    st, body = post(a)
    check(st == 200 and body.get("duplicate") is True, "its old report's retry is still a duplicate (%s %s)" % (st, body))
    st, body = post(b)
    check(st == 200 and body.get("duplicate") is True,
          "an old row without a digest whose payload is gone cannot be compared: answered as a duplicate, as "
          "documented (%s %s)" % (st, body))
    rid2 = os.urandom(16)
    st, body = post(plain_report(job, 2, 4, [(1, 5.0)], report_id=rid2))
    check(st == 200 and body.get("duplicate") is False, "a new report in round 2 is accepted (%s %s)" % (st, body))
    st, body = post(plain_report(job, 2, 4, [(3, 2.0)], report_id=rid2))
    check(st == 409 and body.get("error") == "report_id_reused",
          "and its id with other bytes is 409 report_id_reused (%s %s)" % (st, body))
    check(srv.stop() == 0, "the server stops cleanly")


def check_big_job_off_admin(tmp):
    """10. A job with a large release 1 (plain, m = 1,000,000, d = 64: 260 MB, near the size limit) is built off the admin listener's thread
    (one, by default) and off the writer: while it builds, the admin listener answers other requests (a job list, a
    small job's creation) and devices register. Before: every admin request waited for the build."""
    srv = Server(tmp).start()
    out = {}

    def create():
        try:
            out["big"] = srv.admin("POST", "/v1/admin/jobs", body=json.dumps(
                {"protocol": "plain", "d": 64, "m": 1000000, "rating_min": 1, "rating_max": 5, "rounds": 2,
                 "min_reports": 100, "round_seconds": 3600, "participation": 1.0,
                 "params": {"lambda": 0.1, "seed": 1}}).encode(), timeout=300)
        except Exception as e:
            out["big"] = ("error", repr(e))

    t = threading.Thread(target=create)
    t.start()
    deadline = time.time() + 60
    while time.time() < deadline and '"event":"job_building"' not in srv.log_text() and t.is_alive():
        time.sleep(0.01)
    check('"event":"job_building"' in srv.log_text(), "the big job's build is logged (job_building)")
    status, body = srv.admin("GET", "/v1/admin/jobs", timeout=300)
    alive_list = t.is_alive()
    small = srv.create_job(d=4, m=10, min_reports=100, timeout=300)
    alive_small = t.is_alive()
    token = srv.register()
    alive_reg = t.is_alive()
    check(status == 200 and alive_list, "the job list is answered while release 1 is built (%s, still building: %s)" %
          (status, alive_list))
    check(alive_small and alive_reg, "a small job is created (%s) and a device registers meanwhile (still building: "
          "%s, %s)" % (small, alive_small, alive_reg))
    t.join()
    big = out.get("big")
    check(big is not None and big[0] == 201 and isinstance(big[1], dict) and big[1].get("job", 0) < small,
          "the big job's creation then answers 201 with the id reserved first (%s; the small one: %s)" %
          (big if big is None or big[0] != 201 else big[0], small))
    if big is not None and big[0] == 201:
        for j in (big[1]["job"], small):
            st, view = srv.admin("GET", "/v1/admin/jobs/%d" % j)
            check(st == 200 and view.get("round") == 1, "job %d is served, round 1 (%s)" % (j, st))
        st, view = srv.json("device", "GET", "/v1/jobs/%d" % small, token=token)
        check(st == 200, "devices see the small job (%s)" % st)
    check(srv.stop() == 0, "the server stops cleanly")


CHECKS = {
    "body_before_auth": check_body_before_auth,
    "state_lock": check_state_lock,
    "connections": check_connections,
    "finalize_off_requests": check_finalize_off_requests,
    "drain_on_sigterm": check_drain_on_sigterm,
    "logs": check_logs,
    "metrics": check_metrics,
    "small_ones": check_small_ones,
    "report_reuse": check_report_reuse,
    "big_job_off_admin": check_big_job_off_admin,
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
