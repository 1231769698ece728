#!/usr/bin/env python3
"""End-to-end check of `dprec-aggregator serve` over real HTTPS on loopback (run by ctest).

Starts the server with ephemeral ports in a temporary state directory, trusts its generated self-signed
certificate, and walks through the protocol of docs/protocol.md: health, listener separation, version and size
errors, a plain job, a device registering, fetching the job and its release, posting a report (and the same
report again), then SIGKILL in the middle of the round and a restart on the same state: the acknowledged report
must still be counted. Exits 0 on success, 1 with a message on the first failed check.

usage: agg_server_https.py PATH/TO/dprec-aggregator
The state is on SQLite, or on PostgreSQL with DPREC_TEST_STATE=postgresql (tests/serve_util.py; ctest's
aggregator_serve_https_postgresql).
"""
import http.client
import json
import os
import shutil
import signal
import ssl
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402  (waiting for ports.json; the state engine)

BIN = sys.argv[1] if len(sys.argv) > 1 else "dprec-aggregator"
MAX_REPORT = 65536
FAILS = []


def check(cond, what):
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what)
        FAILS.append(what)
    return cond


class Server:
    def __init__(self, state):
        self.state = state
        self.proc = None
        self.ports = None

    def start(self):
        serve_util.remove_ports(self.state)
        self.log = open(os.path.join(os.path.dirname(self.state), "server.log"), "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--state-dir", self.state, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
             "--threads", "2", "--max-report-bytes", str(MAX_REPORT), "--log-level", "debug"] +
            serve_util.state_args(self.state), stdout=self.log, stderr=self.log)
        self.ports = serve_util.wait_for_ports(self.proc, self.state, 30, self.log.name)
        self.ctx = ssl.create_default_context(cafile=os.path.join(self.state, "tls-cert.pem"))
        with open(os.path.join(self.state, "admin-token")) as f:
            self.admin_token = f.read().strip()

    def request(self, listener, method, path, body=None, token=None, ctype=None, headers=None):
        port = self.ports["device" if listener == "device" else "admin"]
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=self.ctx, timeout=30)
        h = dict(headers or {})
        if token:
            h["Authorization"] = "Bearer " + token
        if ctype:
            h["Content-Type"] = ctype
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, r.getheader("Content-Type"), data

    def json(self, *a, **kw):
        status, _, data = self.request(*a, **kw)
        try:
            return status, json.loads(data.decode()) if data else None
        except ValueError:
            return status, {"_raw": data[:200]}

    def admin(self, method, path, body=None):
        return self.json("admin", method, path, body=body, token=self.admin_token,
                         ctype="application/json" if body is not None else None)


def plain_report(job, rnd, release_version, report_id, d, items):
    payload = struct.pack("<II", d, len(items))
    payload += struct.pack("<%df" % d, *[0.1 * (k + 1) for k in range(d)])
    for item, rating in items:
        payload += struct.pack("<If", item, rating)
    header = b"DPRR" + struct.pack("<HHQQ", 1, 1, job, rnd) + report_id + struct.pack("<QII", release_version,
                                                                                    len(payload), 0)
    assert len(header) == 56
    return header + payload


def main():
    tmp = tempfile.mkdtemp(prefix="dprec-srv-test-")
    state = os.path.join(tmp, "state")
    srv = Server(state)
    try:
        srv.start()
        check(srv.ports["device"] > 0 and srv.ports["admin"] > 0, "ports.json holds the ephemeral ports")
        key_mode = os.stat(os.path.join(state, "tls-key.pem")).st_mode & 0o777
        check(key_mode == 0o600, "the generated TLS key is 0600 (got %o)" % key_mode)
        check(os.path.getsize(os.path.join(state, "release-key.der")) > 0, "release-key.der is written")

        status, body = srv.json("device", "GET", "/healthz")
        check(status == 200 and body.get("status") == "ok", "/healthz is 200 ok (%s %s)" % (status, body))

        status, body = srv.json("device", "POST", "/v1/admin/jobs", body=b"{}", token=srv.admin_token,
                                ctype="application/json")
        check(status == 403 and body.get("error") == "admin_only", "an admin path on the device listener is 403 "
              "(%s %s)" % (status, body))

        status, body = srv.json("device", "GET", "/v2/jobs/1")
        check(status == 400 and body.get("error") == "unsupported_version", "/v2 is 400 unsupported_version "
              "(%s %s)" % (status, body))

        status, body = srv.json("device", "POST", "/v1/register", body=b"{" + b" " * 5000 + b"}",
                                ctype="application/json")
        check(status == 413 and body.get("error") == "too_large", "a 5000-byte JSON body is 413 (%s %s)" %
              (status, body))

        status, body = srv.json("device", "POST", "/v1/jobs/1/reports", body=b"\0" * (MAX_REPORT + 1),
                                ctype="application/octet-stream")
        check(status == 401, "a report without a token is 401 before its body matters (%s %s)" % (status, body))

        status, body = srv.json("admin", "POST", "/v1/admin/jobs", body=b"{}", ctype="application/json")
        check(status == 401, "admin without a token is 401 (%s %s)" % (status, body))

        status, body = srv.admin("POST", "/v1/admin/jobs", body=b'{"protocol": "plain", "d": ')
        check(status == 400 and body.get("error") == "bad_json", "malformed JSON on create-job is 400 bad_json "
              "(%s %s)" % (status, body))

        d, m = 4, 10
        spec = {"protocol": "plain", "d": d, "m": m, "rating_min": 1, "rating_max": 5, "rounds": 3,
                "min_reports": 100, "round_seconds": 3600, "participation": 1.0, "params": {"lambda": 0.1, "seed": 1}}
        status, body = srv.admin("POST", "/v1/admin/jobs", body=json.dumps(spec).encode())
        if not check(status == 201 and isinstance(body.get("job"), int), "create a plain job (%s %s)" %
                     (status, body)):
            return
        job = body["job"]

        status, body = srv.json("device", "POST", "/v1/register", body=b"{}", ctype="application/json")
        if not check(status == 201 and len(body.get("token", "")) == 64, "register a device (%s)" % status):
            return
        token = body["token"]

        status, body = srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=b"\0" * (MAX_REPORT + 1),
                                token=token, ctype="application/octet-stream")
        check(status == 413 and body.get("error") == "too_large", "a report above --max-report-bytes is 413 "
              "(%s %s)" % (status, body))
        status, body = srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=b"\0" * 1000, token=token,
                                ctype="application/octet-stream")
        check(status == 413 and body.get("error") == "too_large", "a report above its job's cap (plain, d = 4, "
              "m = 10: 160 bytes) is 413 (%s %s)" % (status, body))

        status, jobv = srv.json("device", "GET", "/v1/jobs/%d" % job, token=token)
        check(status == 200 and jobv.get("protocol") == "plain" and jobv.get("d") == d, "fetch the job (%s %s)" %
              (status, jobv))
        rnd = jobv.get("round", 1)
        relv = jobv.get("release_version", 1)

        status, ctype, rel = srv.request("device", "GET", "/v1/jobs/%d/releases/latest" % job, token=token)
        check(status == 200 and ctype == "application/octet-stream" and rel[:4] == b"DPRV",
              "fetch the latest release (%s %s %d bytes)" % (status, ctype, len(rel)))

        report = plain_report(job, rnd, relv, os.urandom(16), d, [(0, 4.0), (3, 2.5), (9, 5.0)])
        status, body = srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=report, token=token,
                                ctype="application/octet-stream")
        check(status == 200 and body.get("accepted") is True and body.get("duplicate") is False,
              "post a plain report (%s %s)" % (status, body))
        status, body = srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=report, token=token,
                                ctype="application/octet-stream")
        check(status == 200 and body.get("duplicate") is True, "the same report again is a duplicate (%s %s)" %
              (status, body))

        status, body = srv.admin("GET", "/v1/admin/jobs/%d" % job)
        check(status == 200 and body.get("reports_in_round") == 1, "admin job status counts 1 report (%s %s)" %
              (status, body))

        status, ctype, text = srv.request("admin", "GET", "/metrics")
        check(status == 200 and b"dprec_http_requests_total" in text and
              b"dprec_http_request_duration_seconds_bucket" in text and
              b'dprec_job_reports_in_round{job="%d"} 1' % job in text,
              "/metrics on the admin listener has the HTTP counters and the round's report count")
        status, ctype, text = srv.request("device", "GET", "/metrics")
        check(status == 404 and b"dprec_job_reports_in_round" not in text and b"dprec_reports_accepted" not in text,
              "/metrics is not served on the device listener (%s)" % status)

        # kill -9 in the middle of the round, restart on the same state
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
        srv.start()
        status, body = srv.admin("GET", "/v1/admin/jobs/%d" % job)
        check(status == 200 and body.get("reports_in_round") == 1 and body.get("round") == rnd,
              "after kill -9 and restart the report is still counted (%s %s)" % (status, body))
        status, body = srv.json("device", "POST", "/v1/jobs/%d/reports" % job, body=report, token=token,
                                ctype="application/octet-stream")
        check(status == 200 and body.get("duplicate") is True, "after restart the same report is a duplicate "
              "(%s %s)" % (status, body))

        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "SIGTERM stops the server cleanly (exit %s)" % rc)
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
        if FAILS:
            try:
                with open(os.path.join(tmp, "server.log"), "rb") as f:
                    sys.stdout.write("---- server log (tail) ----\n")
                    sys.stdout.write(f.read()[-4000:].decode(errors="replace"))
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
