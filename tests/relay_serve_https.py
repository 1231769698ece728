#!/usr/bin/env python3
"""End-to-end check of `dprec-relay serve` over real HTTPS on loopback (run by ctest).

The relay runs on the same HTTPS front end as the aggregator, with its own state directory and key. This walks the
relay's routes (docs/protocol.md, "The relay"): --help and --version, health on both listeners, metrics on the admin
listener only, its public key written where an operator finds it, one server per state directory, a dpmf job created
on the admin listener, two devices registering, fetching the open round (its seed) and sending masked shares, a
malformed share refused, SIGKILL between the two shares and a restart on the same state (the acknowledged share is
still there: the round closes only with both, and its signed sum lists both report ids). Exits 0 on success, 1 with
the failed checks.

usage: relay_serve_https.py PATH/TO/dprec-relay
"""
import http.client
import json
import os
import shutil
import ssl
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402  (waiting for ports.json)

BIN = sys.argv[1] if len(sys.argv) > 1 else "dprec-relay"
FAILS = []
M, D = 10, 2
C = D + 1


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)
    return cond


class Relay:
    def __init__(self, state):
        self.state = state
        self.proc = None

    def start(self):
        serve_util.remove_ports(self.state)
        self.log = open(os.path.join(os.path.dirname(self.state), "relay.log"), "ab")
        self.proc = subprocess.Popen([BIN, "serve", "--state-dir", self.state, "--listen", "127.0.0.1:0",
                                      "--admin-listen", "127.0.0.1:0"], stdout=self.log, stderr=self.log)
        self.ports = serve_util.wait_for_ports(self.proc, self.state, 30, self.log.name, what="relay")
        self.ctx = ssl.create_default_context(cafile=os.path.join(self.state, "tls-cert.pem"))
        with open(os.path.join(self.state, "admin-token")) as f:
            self.admin = f.read().strip()

    def req(self, listener, method, path, body=None, token=None, ctype=None):
        conn = http.client.HTTPSConnection("127.0.0.1", self.ports["device" if listener == "device" else "admin"],
                                           context=self.ctx, timeout=30)
        h = {}
        if token:
            h["Authorization"] = "Bearer " + token
        if ctype:
            h["Content-Type"] = ctype
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def share(job, rnd, rid, mode=2):
    """A masked share as a device sends it: the envelope (docs/protocol.md) and the payload of common/protocols/dpmf.h."""
    payload = b"DPMR" + struct.pack("<III", mode, C, M) + bytes((i * 7 + rid[0]) & 255 for i in range(8 * M * C))
    head = b"DPRR" + struct.pack("<HHQQ", 1, 8, job, rnd) + rid + struct.pack("<QII", rnd, len(payload), 0)
    return head + payload


def main():
    out = subprocess.run([BIN, "--help"], capture_output=True, text=True)
    check(out.returncode == 0 and "serve" in out.stdout, "dprec-relay --help")
    out = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True)
    check(out.returncode == 0 and "relay-key.der" in out.stdout, "dprec-relay serve --help names its files")
    out = subprocess.run([BIN, "--version"], capture_output=True, text=True)
    check(out.returncode == 0 and out.stdout.startswith("dprec-relay "), "dprec-relay --version")
    out = subprocess.run([BIN, "serve"], capture_output=True, text=True)
    check(out.returncode == 2 and "--state-dir" in out.stderr, "serve without a state directory: usage error")

    tmp = tempfile.mkdtemp(prefix="dprec-relay-test-")
    state = os.path.join(tmp, "state")
    r = Relay(state)
    try:
        r.start()
        check(os.path.getsize(os.path.join(state, "relay-key.der")) > 60, "relay-key.der written (what a job pins)")
        for lst in ("device", "admin"):
            st, body = r.req(lst, "GET", "/healthz")
            check(st == 200 and b"ok" in body, "healthz on the %s listener" % lst)
        st, _ = r.req("device", "GET", "/metrics")
        check(st == 404, "metrics are not served on the device listener")
        st, body = r.req("admin", "GET", "/metrics")
        check(st == 200 and b"dprec_relay_shares_accepted_total" in body and b"dprec_http_requests_total" in body,
              "metrics on the admin listener (the relay's and the front end's)")
        if shutil.which("promtool"):
            pt = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
            check(pt.returncode == 0, "promtool accepts the metrics: %s" % (pt.stdout + pt.stderr).decode()[:300])
        second = subprocess.run([BIN, "serve", "--state-dir", state, "--listen", "127.0.0.1:0", "--admin-listen",
                                 "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
        check(second.returncode != 0 and "another dprec-relay" in second.stderr,
              "a second relay on the same state directory exits, naming the first")

        job = 12
        spec = json.dumps({"job": job, "mode": "relay", "m": M, "d": D, "shares": 2, "rounds": 3})
        st, body = r.req("admin", "POST", "/v1/admin/jobs", spec, r.admin, "application/json")
        check(st == 201, "job created on the admin listener")
        st, _ = r.req("device", "POST", "/v1/admin/jobs", spec, r.admin, "application/json")
        check(st == 403, "admin paths refused on the device listener")
        toks = []
        for i in range(2):
            st, body = r.req("device", "POST", "/v1/register", b"{}", None, "application/json")
            check(st == 201, "device %d registers" % i)
            toks.append(json.loads(body)["token"])
        st, body = r.req("device", "GET", "/v1/jobs/%d/rounds/1" % job, None, toks[0])
        view = json.loads(body) if st == 200 else {}
        check(st == 200 and len(view.get("seed", "")) == 64 and view.get("shares") == 2, "the open round's view")
        st, _ = r.req("device", "GET", "/v1/jobs/%d/rounds/1" % job)
        check(st == 401, "the round's seed is for registered devices only")
        bad = share(job, 1, bytes([1] * 16))[:-8]
        st, _ = r.req("device", "POST", "/v1/jobs/%d/shares" % job, bad, toks[0], "application/octet-stream")
        check(st == 400, "a truncated share is refused")
        ok1 = share(job, 1, bytes([1] * 16))
        st, body = r.req("device", "POST", "/v1/jobs/%d/shares" % job, ok1, toks[0], "application/octet-stream")
        check(st == 200 and json.loads(body).get("accepted"), "a well-formed share is accepted")
        r.kill9()
        r.start()
        st, body = r.req("device", "POST", "/v1/jobs/%d/shares" % job, ok1, toks[0], "application/octet-stream")
        check(st == 200 and json.loads(body).get("duplicate"), "after kill -9 its retry is a duplicate")
        st, _ = r.req("admin", "POST", "/v1/admin/jobs/%d/rounds/1/close" % job, b"{}", r.admin, "application/json")
        check(st == 409, "the round does not close without the whole cohort")
        ok2 = share(job, 1, bytes([2] * 16))
        st, _ = r.req("device", "POST", "/v1/jobs/%d/shares" % job, ok2, toks[1], "application/octet-stream")
        check(st == 200, "the second share is accepted")
        st, body = r.req("admin", "POST", "/v1/admin/jobs/%d/rounds/1/close" % job, b"{}", r.admin, "application/json")
        ok = st == 200 and body[:4] == b"DPMS"
        check(ok, "the round closes with a signed sum")
        if ok:
            n_grad = struct.unpack_from("<I", body, 36)[0]
            ids = body[48 + 8 * M * C: 48 + 8 * M * C + 32]
            check(n_grad == 2 and ids == bytes([1] * 16) + bytes([2] * 16), "the sum lists both shares, in order")
            want = [(struct.unpack_from("<Q", ok1, 72 + 8 * c)[0] + struct.unpack_from("<Q", ok2, 72 + 8 * c)[0])
                    % (1 << 64) for c in range(M * C)]
            got = [struct.unpack_from("<Q", body, 48 + 8 * c)[0] for c in range(M * C)]
            check(got == want, "the sum is the shares added mod 2^64")
        st, body2 = r.req("admin", "GET", "/v1/admin/jobs/%d/rounds/1/sum" % job, None, r.admin)
        check(st == 200 and body2 == body, "the stored sum is served again")
        st, _ = r.req("device", "POST", "/v1/jobs/%d/shares" % job, share(job, 1, bytes([3] * 16)), toks[1],
                      "application/octet-stream")
        check(st == 409, "a share for a closed round is refused")
        r.stop()
        check(r.proc.returncode == 0, "SIGTERM stops the relay cleanly")
        # its log: the one schema's fields (docs/operations.md), job and round as fields, not in free text
        with open(os.path.join(tmp, "relay.log"), "rb") as f:
            lines = [json.loads(l) for l in f.read().decode(errors="replace").split("\n") if l.startswith("{")]
        created = [o for o in lines if o.get("event") == "job_created"]
        check(len(created) == 1 and created[0].get("job") == job and created[0].get("level") == "info" and
              created[0].get("shares") == 2 and created[0].get("rounds") == 3,
              "the relay logs job_created with the job's id and shape as fields (%s)" % created)
        closed = [o for o in lines if o.get("event") == "round_closed"]
        check(len(closed) == 1 and closed[0].get("job") == job and closed[0].get("round") == 1 and
              closed[0].get("shares") == 2, "round_closed carries job, round and shares as fields (%s)" % closed)
    finally:
        r.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
