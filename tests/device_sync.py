#!/usr/bin/env python3
"""A device syncs with a real aggregator over pinned HTTPS on loopback, end to end (run by ctest).

Starts `dprec-aggregator serve` (a native binary, also for the cross builds, whose device programs run under
qemu-user), creates a job of the private bias model (dpals at d = 1, two rounds, user-level budget 1), and then:

  device MODE: drives dprec-device (the command after --, e.g. "qemu-aarch64 -L ... dprec-device"): a store with
    three ratings; a sync with a wrong pin and one trusting only the system's CAs are refused (TLS) and reach
    nothing; a sync with the aggregator's CA file and its pin read from tls-pin.txt (final newline and all) registers
    the device, verifies release 1, charges the ledger and has its report acknowledged (the aggregator counts it);
    the same sync again has nothing to do; after the operator closes round 1, the next verifies release 2 and
    reports round 2. Checked on both sides: dprec-device's output and the aggregator's job status and counters.
  consumer MODE: runs the command after -- (tests/consumer.cmake: an app built against an installed SDK, both ways)
    with DPREC_TEST_URL, DPREC_TEST_CA, DPREC_TEST_PIN_FILE, DPREC_TEST_JOB, DPREC_TEST_RELEASE_KEY and
    DPREC_TEST_ITEMS set, and then requires the aggregator to hold --expect-reports reports of the round.

Without an aggregator (a path that does not exist, "none": a cross build configured without
DPREC_NATIVE_AGGREGATOR) it says so and exits 77, which ctest shows as skipped, never as passed; with
DPREC_REQUIRE_AGGREGATOR set in the environment (scripts/test.sh) it fails instead.

  serve MODE: runs the command after -- (a test program that brings its own checks: tests/test_transport_https.c,
    native or under qemu-user, which cannot start a native server itself) with DPREC_TEST_STATE naming the server's
    state directory (ports.json, tls-cert.pem, tls-pin.txt, admin-token); the options before -- go to the server.
    Exits with the command's status (77 if it passed without a server to test against).

usage: device_sync.py device|consumer AGGREGATOR [--expect-reports N] -- COMMAND...
       device_sync.py serve AGGREGATOR [SERVER OPTIONS...] -- COMMAND...
"""
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402  (waiting for ports.json)

SKIP = 77
ITEMS = 20
FAILS = []


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what + ("" if cond or not detail else "\n     " + detail.replace("\n", "\n     ")))
    if not cond:
        FAILS.append(what)
    return cond


class Aggregator:
    def __init__(self, binary, workdir, extra=()):
        self.state = os.path.join(workdir, "state")
        self.log = open(os.path.join(workdir, "server.log"), "ab")
        env = dict(os.environ)
        env.pop("LD_LIBRARY_PATH", None)
        self.proc = subprocess.Popen(
            [binary, "serve", "--state-dir", self.state, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
             "--threads", "2"] + list(extra), stdout=self.log, stderr=self.log, env=env)
        ports = serve_util.wait_for_ports(self.proc, self.state, 60, self.log.name, what="dprec-aggregator")
        self.device_port, self.admin_port = ports["device"], ports["admin"]
        self.url = "https://127.0.0.1:%d" % self.device_port
        self.ca = os.path.join(self.state, "tls-cert.pem")
        self.pin_file = os.path.join(self.state, "tls-pin.txt")
        self.release_key = os.path.join(self.state, "release-key.der")
        with open(os.path.join(self.state, "admin-token")) as f:
            self.token = f.read().strip()
        self.ctx = ssl.create_default_context(cafile=self.ca)

    def admin(self, method, path, body=None):
        conn = http.client.HTTPSConnection("127.0.0.1", self.admin_port, context=self.ctx, timeout=30)
        headers = {"Authorization": "Bearer " + self.token}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        if path == "/metrics":
            return r.status, data.decode()
        return r.status, json.loads(data.decode()) if data else None

    def count(self, route, status):
        _, text = self.admin("GET", "/metrics")
        m = re.search(r'^dprec_requests_total\{route="%s",status="%s"\} (\d+)$' % (route, status), text, re.M)
        return int(m.group(1)) if m else 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def bias_job(agg):
    spec = {"protocol": "dpals", "d": 1, "m": ITEMS, "rating_min": 1, "rating_max": 5, "rounds": 2, "min_reports": 1,
            "round_seconds": 3600, "participation": 1,
            "params": {"max_items": 10, "u_clip": 2, "init_scale": 0.1, "seed": 1},
            "budget": {"epsilon": 1, "delta": 1e-6}}
    status, body = agg.admin("POST", "/v1/admin/jobs", spec)
    if not check(status == 201 and isinstance(body, dict) and "job" in body, "create a bias job (dpals, d = 1)",
                 "%s %s" % (status, body)):
        raise SystemExit(1)
    return body["job"]


def run(cmd, timeout=300):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def job_status(agg, job):
    status, body = agg.admin("GET", "/v1/admin/jobs/%d" % job)
    return body if status == 200 else {}


def device_mode(agg, device, work):
    job = bias_job(agg)
    store = os.path.join(work, "device")
    d = device + ["--dir", store]
    rc, out, err = run(d + ["init", "--items", str(ITEMS)])
    check(rc == 0, "dprec-device init", out + err)
    for item, value in ((3, "5"), (7, "2"), (11, "4.5")):
        rc, out, err = run(d + ["rate", str(item), value])
        check(rc == 0, "dprec-device rate %d %s" % (item, value), out + err)
    sync = d + ["sync", "--url", agg.url, "--job", str(job), "--key", agg.release_key, "--budget", "2", "1e-5"]

    rc, out, err = run(sync + ["--ca-file", agg.ca, "--pin", "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="])
    check(rc == 1 and "DPREC_ERR_TLS" in err and "pinned" in err, "a wrong pin: refused (DPREC_ERR_TLS)", out + err)
    rc, out, err = run(sync)
    check(rc == 1 and ("DPREC_ERR_TLS" in err or "no CA" in err),
          "the system's CAs only: the self-signed certificate is refused", out + err)
    check(agg.count("register", "201") == 0 and job_status(agg, job).get("reports_in_round") == 0,
          "neither reached the aggregator (no registration, no report)")

    good = sync + ["--ca-file", agg.ca, "--pin-file", agg.pin_file]
    with open(agg.pin_file, "rb") as f:
        check(f.read().endswith(b"\n"), "tls-pin.txt ends with a newline (the transport trims it where it reads it)")
    rc, out, err = run(good)
    check(rc == 0 and re.search(r"^sync job %d: reported \(round 1, release v1\)$" % job, out, re.M) is not None,
          "pinned sync: round 1 reported", out + err)
    check(re.search(r"^release v1 of job %d verified .*report acknowledged$" % job, out, re.M) is not None,
          "release 1 verified (digest and ECDSA signature under release-key.der)", out)
    m = re.search(r"^ledger job %d: 1 report\(s\), 1 round\(s\) charged: epsilon = ([0-9.e+-]+), delta = ([0-9.e+-]+) "
                  r"at user level \(joint\)" % job, out, re.M)
    check(m is not None and 0 < float(m.group(1)) <= 1 and 0 < float(m.group(2)) <= 1e-6,
          "the ledger is charged (user level, joint DP, within the budget)", out)
    st = job_status(agg, job)
    check(agg.count("register", "201") == 1, "the aggregator registered the device once")
    check(st.get("reports_in_round") == 1 and agg.count("reports", "200") == 1,
          "the aggregator acknowledged and counts the report", json.dumps(st))

    rc, out, err = run(good)
    check(rc == 0 and re.search(r"^sync job %d: nothing to do \(round 1" % job, out, re.M) is not None,
          "the same sync again: nothing to do (reported already)", out + err)

    status, _ = agg.admin("POST", "/v1/admin/jobs/%d/round/close" % job)
    check(status == 200, "the operator closes round 1")
    deadline = time.time() + 60
    while job_status(agg, job).get("release_version") != 2 and time.time() < deadline:
        time.sleep(0.2)
    rc, out, err = run(good)
    check(rc == 0 and re.search(r"^sync job %d: reported \(round 2, release v2\)$" % job, out, re.M) is not None,
          "round 2 reported", out + err)
    check(re.search(r"^release v2 of job %d verified" % job, out, re.M) is not None,
          "release 2, the aggregator's private step on round 1, verified", out)
    m = re.search(r"^ledger job %d: 2 report\(s\), 2 round\(s\) charged: epsilon = ([0-9.e+-]+)" % job, out, re.M)
    check(m is not None and float(m.group(1)) <= 1.0001, "two rounds charged, within the job's budget", out)
    st = job_status(agg, job)
    check(st.get("rounds_done") == 1 and st.get("reports_in_round") == 1 and agg.count("register", "201") == 1,
          "the aggregator: round 1 done, round 2's report counted, no second registration", json.dumps(st))


def consumer_mode(agg, command, expect):
    job = bias_job(agg)
    env = dict(os.environ, DPREC_TEST_URL=agg.url, DPREC_TEST_CA=agg.ca, DPREC_TEST_PIN_FILE=agg.pin_file,
               DPREC_TEST_JOB=str(job), DPREC_TEST_RELEASE_KEY=agg.release_key, DPREC_TEST_ITEMS=str(ITEMS))
    p = subprocess.run(command, env=env)
    check(p.returncode == 0, "the consumer builds and syncs (%s)" % " ".join(command[:3]))
    st = job_status(agg, job)
    check(st.get("reports_in_round") == expect and agg.count("register", "201") == expect,
          "the aggregator registered %d consumer(s) and counts their reports" % expect, json.dumps(st))


def main():
    args = sys.argv[1:]
    if "--" not in args or len(args) < 4 or args[0] not in ("device", "consumer", "serve"):
        sys.exit(__doc__)
    cut = args.index("--")
    mode, binary, opts, command = args[0], args[1], args[2:cut], args[cut + 1:]
    expect = 1
    if mode == "serve":
        pass  # the options are the server's
    elif opts[:1] == ["--expect-reports"] and len(opts) == 2:
        expect = int(opts[1])
    elif opts:
        sys.exit(__doc__)
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        why = ("no native dprec-aggregator to sync with (%r). A cross build takes it from the native build: configure "
               "with -DDPREC_NATIVE_AGGREGATOR=/path/to/build/aggregator/dprec-aggregator, as scripts/test.sh --cross "
               "does." % binary)
        if os.environ.get("DPREC_REQUIRE_AGGREGATOR"):  # scripts/test.sh: CI must run it
            sys.exit("FAIL: " + why)
        if mode == "serve":  # the command's own checks that need no server still run
            rc = subprocess.run(command).returncode
            print("SKIPPED (the server's part): " + why)
            sys.exit(rc if rc != 0 else SKIP)
        print("SKIPPED: " + why)
        sys.exit(SKIP)
    work = tempfile.mkdtemp(prefix="dprec-device-sync-")
    agg = None
    try:
        agg = Aggregator(binary, work, opts if mode == "serve" else ())
        if mode == "device":
            device_mode(agg, command, work)
        elif mode == "consumer":
            consumer_mode(agg, command, expect)
        else:
            rc = subprocess.run(command, env=dict(os.environ, DPREC_TEST_STATE=agg.state)).returncode
            check(rc == 0, " ".join(command[-1:]) + " against the server")
    finally:
        if agg is not None:
            agg.stop()
        if FAILS:
            print("server log: %s" % os.path.join(work, "server.log"))
        else:
            shutil.rmtree(work, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
