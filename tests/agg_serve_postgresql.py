#!/usr/bin/env python3
"""End to end on PostgreSQL: `dprec-aggregator serve --state postgresql://...` over real HTTPS on loopback.

0. `state` is read from the config file ({"state_dir": ..., "state": "postgresql://..."}); a state that is not a
   postgresql:// URI is a usage error.
1. A plain job that closes at 3 reports: devices register and report (one twice: a duplicate), the server is killed
   with SIGKILL after two reports were acknowledged and started again on the same database: both are still counted and
   their retries are duplicates; the third report closes the round, and release 2 is served, signed (its ECDSA
   signature checked with openssl against release-key.der), byte for byte the row the database holds. A second server
   on the same database with another signing key is refused (tests/agg_serve_multi.py runs two that share one).
2. dprec-fleet (SDK devices, which verify every release against the pinned key before using it) runs a plain job
   of 2 rounds against the same server; the database then holds its 3 contiguous releases, the job done, one row per
   acknowledged report, and no payload of a finalized round.

usage: agg_serve_postgresql.py PATH/TO/dprec-aggregator PATH/TO/dprec-fleet
The cluster is tests/pg_cluster.py's, named by DPREC_TEST_PG_DIR (ctest: the fixture pg_cluster); each run makes a
database of its own. Exits 0 when every check passed, 1 otherwise (and when the cluster is missing: nothing is
skipped)."""
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
import serve_util  # noqa: E402  (waiting for ports.json; the cluster and psql)

AGG = sys.argv[1] if len(sys.argv) > 1 else "dprec-aggregator"
FLEET = sys.argv[2] if len(sys.argv) > 2 else "dprec-fleet"
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)
    return cond


uri = serve_util.pg_uri  # the cluster of DPREC_TEST_PG_DIR (tests/serve_util.py: it exits when there is none)
sql = serve_util.psql
serve_util.pg_cluster()


class Server:
    """serve on state_uri: given in a config file ({"state": URI}, what an operator writes), or with --state."""

    def __init__(self, state_dir, state_uri, flag=False):
        self.state, self.uri, self.flag, self.proc = state_dir, state_uri, flag, None

    def start(self, expect_ok=True):
        serve_util.remove_ports(self.state)
        self.logname = os.path.join(os.path.dirname(self.state), os.path.basename(self.state) + ".log")
        self.log = open(self.logname, "ab")
        if self.flag:
            where = ["--state", self.uri]
        else:
            config = self.state + ".json"
            with open(config, "w") as f:
                json.dump({"state_dir": self.state, "state": self.uri}, f)
            where = ["--config", config]
        self.proc = subprocess.Popen([AGG, "serve"] + where + ["--state-dir", self.state, "--listen", "127.0.0.1:0",
                                      "--admin-listen", "127.0.0.1:0", "--threads", "2", "--connections-per-address",
                                      "0", "--register-per-minute", "0"] + getattr(self, "extra", []),
                                     stdout=self.log, stderr=self.log)
        self.ports = serve_util.wait_for_ports(self.proc, self.state, 30, self.logname, exited_ok=not expect_ok)
        if self.ports is None:
            return self.proc.returncode
        self.ctx = ssl.create_default_context(cafile=os.path.join(self.state, "tls-cert.pem"))
        with open(os.path.join(self.state, "admin-token")) as f:
            self.admin_token = f.read().strip()
        return 0

    def request(self, listener, method, path, body=None, token=None, ctype=None):
        conn = http.client.HTTPSConnection("127.0.0.1", self.ports[listener], context=self.ctx, timeout=60)
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

    def json(self, listener, method, path, body=None, token=None):
        status, data = self.request(listener, method, path, body=json.dumps(body).encode() if body is not None else None,
                                    token=token, ctype="application/json" if body is not None else None)
        return status, json.loads(data.decode()) if data else None

    def report(self, job, token, data):
        status, body = self.request("device", "POST", f"/v1/jobs/{job}/reports", body=data, token=token,
                                    ctype="application/octet-stream")
        return status, json.loads(body.decode()) if body else None

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return None


def plain_report(job, rnd, report_id, d, items):
    payload = struct.pack("<II", d, len(items)) + struct.pack("<%df" % d, *[0.1 * (k + 1) for k in range(d)])
    for item, rating in items:
        payload += struct.pack("<If", item, rating)
    header = b"DPRR" + struct.pack("<HHQQ", 1, 1, job, rnd) + report_id + struct.pack("<QII", rnd, len(payload), 0)
    return header + payload


def signature_verifies(release, key_der, tmp):
    """The release's ECDSA P-256 signature over its digest (docs/release-format.md), checked by openssl."""
    sig_alg, sig_len = struct.unpack_from("<HH", release, 44)
    if sig_alg != 1 or not 0 < sig_len <= 128 or len(release) < sig_len + 32 + 64:
        return False
    digest, sig = release[-sig_len - 32:-sig_len], release[-sig_len:]
    dpath, spath = os.path.join(tmp, "digest.bin"), os.path.join(tmp, "sig.der")
    with open(dpath, "wb") as f:
        f.write(digest)
    with open(spath, "wb") as f:
        f.write(sig)
    out = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", key_der, "-keyform", "DER", "-in", dpath,
                          "-sigfile", spath], capture_output=True, text=True)
    return out.returncode == 0 and "Success" in out.stdout


def walk(srv, db, tmp):
    d, m = 4, 10
    spec = {"protocol": "plain", "d": d, "m": m, "rating_min": 1, "rating_max": 5, "rounds": 3, "min_reports": 3,
            "round_seconds": 3600, "participation": 1.0, "params": {"lambda": 0.1, "seed": 1}}
    status, body = srv.json("admin", "POST", "/v1/admin/jobs", body=spec, token=srv.admin_token)
    if not check(status == 201, f"create a plain job closing at 3 reports ({status} {body})"):
        return
    job = body["job"]
    tokens = []
    for _ in range(3):
        status, body = srv.json("device", "POST", "/v1/register", body={})
        check(status == 201, f"register a device ({status})")
        tokens.append(body["token"])
    reports = [plain_report(job, 1, os.urandom(16), d, [(i, 4.0), (i + 3, 2.0)]) for i in range(3)]
    for i in range(2):
        status, body = srv.report(job, tokens[i], reports[i])
        check(status == 200 and body.get("duplicate") is False, f"device {i} reports ({status} {body})")
    status, body = srv.report(job, tokens[0], reports[0])
    check(status == 200 and body.get("duplicate") is True, f"its retry is a duplicate ({status} {body})")
    check(sql(db, f"SELECT count(*) FROM reports WHERE job = {job}") == "2", "the database holds the 2 reports")

    srv.kill9()
    srv.start()
    status, body = srv.json("admin", "GET", f"/v1/admin/jobs/{job}", token=srv.admin_token)
    check(status == 200 and body.get("reports_in_round") == 2 and body.get("round") == 1,
          f"after kill -9 and restart both reports are counted ({status} {body})")
    for i in range(2):
        status, body = srv.report(job, tokens[i], reports[i])
        check(status == 200 and body.get("duplicate") is True, f"after restart device {i}'s retry is a duplicate "
              f"({status} {body})")

    other = Server(os.path.join(tmp, "second"), srv.uri, flag=True)
    rc = other.start(expect_ok=False)
    with open(other.logname, "rb") as f:
        log = f.read().decode(errors="replace")
    check(rc != 0 and "signed with another key" in log,
          f"a second server with another signing key on the same database is refused (exit {rc})")
    other.stop()

    status, body = srv.report(job, tokens[2], reports[2])
    check(status == 200 and body.get("duplicate") is False, f"the third report closes the round ({status} {body})")
    status, body = srv.json("admin", "GET", f"/v1/admin/jobs/{job}", token=srv.admin_token)
    check(status == 200 and body.get("round") == 2 and body.get("rounds_done") == 1,
          f"the round is finalized once: round 2 ({status} {body})")
    status, rel = srv.request("device", "GET", f"/v1/jobs/{job}/releases/latest", token=tokens[0])
    check(status == 200 and rel[:4] == b"DPRV" and struct.unpack_from("<Q", rel, 8)[0] == 2,
          f"release 2 is served ({status}, {len(rel)} bytes)")
    stored = sql(db, f"SELECT encode(bytes, 'hex') FROM releases WHERE job = {job} AND version = 2")
    check(stored == rel.hex(), "the served release is the database's row, byte for byte")
    check(signature_verifies(rel, os.path.join(srv.state, "release-key.der"), tmp),
          "its ECDSA signature verifies against release-key.der (openssl)")
    check(sql(db, f"SELECT count(*) FROM report_payloads p JOIN reports r ON r.id = p.id WHERE r.job = {job}") == "0",
          "the finalized round's payloads were dropped with it")
    check(sql(db, f"SELECT count(*) FROM reports WHERE job = {job} AND round = 1") == "3",
          "its 3 rows stay (retries are still recognized)")


def fleet(srv, db, tmp):
    before = int(sql(db, "SELECT coalesce(max(id), 0) FROM jobs"))
    csv = os.path.join(tmp, "fleet.csv")
    cmd = [FLEET, "--protocol", "plain", "--synthetic", "40,30,1000", "--rounds", "2", "--rank", "4", "--threads", "2",
           "--seed", "7", "--quiet", "--csv", csv,
           "--aggregator", f"https://127.0.0.1:{srv.ports['device']}",
           "--admin-url", f"https://127.0.0.1:{srv.ports['admin']}",
           "--admin-token", os.path.join(srv.state, "admin-token"),
           "--release-key", os.path.join(srv.state, "release-key.der"),
           "--cacert", os.path.join(srv.state, "tls-cert.pem")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    if not check(out.returncode == 0 and lines and lines[-1].startswith("final: protocol=plain rounds=2 "),
                 f"dprec-fleet runs 2 rounds against the server (exit {out.returncode}: "
                 f"{(lines or [''])[-1]!r} {out.stderr[-2000:]})"):
        return
    job = int(sql(db, "SELECT max(id) FROM jobs"))
    check(job > before, f"the fleet's job is stored ({job})")
    check(sql(db, f"SELECT state || ' ' || round FROM jobs WHERE id = {job}") == "done 3",
          "the job is done in the database, at round 3")
    check(sql(db, f"SELECT string_agg(version::text, ',' ORDER BY version) FROM releases WHERE job = {job}") == "1,2,3",
          "its releases are 1, 2, 3")
    with open(csv) as f:
        rows = [r.split(",") for r in f.read().strip().splitlines()[1:]]
    reported = sum(int(r[1]) for r in rows)
    stored = int(sql(db, f"SELECT count(*) FROM reports WHERE job = {job}"))
    check(reported > 0 and stored == reported, f"one row per acknowledged report ({stored} stored, {reported} reported)")
    check(sql(db, f"SELECT count(*) FROM (SELECT round, device FROM reports WHERE job = {job} GROUP BY round, device "
                  "HAVING count(*) > 1) x") == "0", "no device has two reports in a round")
    check(sql(db, f"SELECT count(*) FROM report_payloads p JOIN reports r ON r.id = p.id WHERE r.job = {job}") == "0",
          "no payload of a finalized round is left")


def usage_errors(tmp):
    out = subprocess.run([AGG, "serve", "--state-dir", os.path.join(tmp, "x"), "--state", "/var/lib/dprec/state.db"],
                         capture_output=True, text=True)
    check(out.returncode == 2 and "state must be a postgresql:// URI" in out.stderr,
          f"a state that is not a postgresql:// URI is a usage error (exit {out.returncode})")
    out = subprocess.run([AGG, "serve", "--state-dir", os.path.join(tmp, "x"), "--state", "host=/tmp dbname=x"],
                         capture_output=True, text=True)
    check(out.returncode == 2, f"so is a key=value connection string (exit {out.returncode})")


def main():
    db = f"dprec_e2e_{os.getpid()}"
    sql("postgres", f"CREATE DATABASE {db}")
    tmp = tempfile.mkdtemp(prefix="dprec-pg-e2e-")
    srv = Server(os.path.join(tmp, "state"), uri(db))
    try:
        usage_errors(tmp)
        srv.start()
        with open(srv.logname, "rb") as f:
            log = f.read().decode(errors="replace")
        check('"event":"state_opened","engine":"postgresql"' in log, "the server says its state is PostgreSQL")
        check(sql(db, "SELECT version FROM dprec_schema") == "5", "the schema is created, version 5")
        walk(srv, db, tmp)
        fleet(srv, db, tmp)
        check(srv.stop() == 0, "SIGTERM stops the server cleanly")
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
        if FAILS and os.path.exists(os.path.join(tmp, "state.log")):
            with open(os.path.join(tmp, "state.log"), "rb") as f:
                sys.stdout.write("---- server log (tail) ----\n" + f.read()[-4000:].decode(errors="replace"))
        shutil.rmtree(tmp, ignore_errors=True)
        sql("postgres", f"DROP DATABASE IF EXISTS {db}")
    if FAILS:
        print(f"{len(FAILS)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
