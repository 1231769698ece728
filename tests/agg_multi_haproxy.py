#!/usr/bin/env python3
"""Three `dprec-aggregator serve` instances on one PostgreSQL database behind haproxy (deploy/haproxy.cfg, as shipped:
its addresses from the environment), a fleet of 2,000 SDK devices through a `dpals` job over HTTPS, and two kill -9s.

0. The front end: haproxy passes TLS through, so the instances' strict framing answers through it (two
   Content-Length headers: 400 bad_framing); a connection that sends no TLS ClientHello is closed by haproxy; one
   address holds at most DPREC_PER_SOURCE connections; the admin API is not on the devices' address (403 admin_only).
   A secure-aggregation job (40 devices, 2 rounds) runs through the three instances: a round's steps land on any of
   them (its state is a log in the database that every instance applies); the job completes, no masked input is a
   stored report, each round is finalized once, and each round's log is gone with its commit.
1. dprec-fleet (3 rounds; admin calls through haproxy's loopback admin front end) runs while
   - in round 1, once 600 of its reports are in, the job's lease holder is killed with SIGKILL (mid-round), and
     started again on its directory once another instance took the lease;
   - in round 2, the lease holder is killed inside its finalization: after the round was marked closing and its
     release computed, before the commit (DPREC_TEST_FINALIZE_PAUSE_MS, the test-only pause, logs
     `test_finalize_pause` and holds the window 3 s).
2. Then: the fleet ran every round with every device synced (exit 0); the job is done and its releases are 1..4,
   contiguous; each round has exactly one `round_finalized` across all logs, with the round's report count; every live
   instance serves every release byte for byte as the database holds it, signed (openssl); the reports the devices saw
   acknowledged (the fleet's CSV) equal the database's rows, round by round (2,000 each: every device in every round);
   every device's ledger equals the aggregator's figure (the least and the most); the killed finalizer logged its
   pause and never its round_finalized.
3. RMSE: the run's final test RMSE is within the spread of one-instance runs of the same fleet (the same seed, so the
   same data and device noise; the aggregator's noise differs run to run): this test runs REFS references (the
   fleet's own `serve` on SQLite over HTTPS) and accepts [min - 3 sd, max + 3 sd], sd the standard deviation over 10
   one-instance runs measured once and stated in docs/operations.md "Scaling out" (SD below), since three runs alone
   estimate a spread poorly.

usage: agg_multi_haproxy.py PATH/TO/dprec-aggregator PATH/TO/dprec-fleet   (cluster: DPREC_TEST_PG_DIR, as
agg_serve_postgresql.py). Exit 0 all checks passed, 1 a check failed, 77 skipped: haproxy is not installed (said on
stdout; CI installs it with scripts/setup.sh). Nothing is timed: each wait has a bound past which the check fails."""
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
if HAPROXY is None:
    print("SKIPPED: haproxy is not installed (Debian package haproxy; bash scripts/setup.sh installs it)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agg_serve_postgresql as base  # noqa: E402  (its cluster, psql, checks)

check, sql, uri = base.check, base.sql, base.uri
AGG, FLEET = base.AGG, base.FLEET
HERE = os.path.dirname(os.path.abspath(__file__))
CFG = os.path.join(os.path.dirname(HERE), "deploy", "haproxy.cfg")
DEVICES, ROUNDS, REFS = 2000, 3, 3
SD = 0.0286  # sd of the final RMSE over 10 one-instance runs (docs/operations.md "Scaling out": the figures, the command)
PAUSE_MS = 3000
FLEET_ARGS = ["--synthetic", f"{DEVICES},100,40000,3", "--protocol", "dpals", "--epsilon", "8", "--delta", "1e-6",
              "--rank", "4", "--rounds", str(ROUNDS), "--max-items", "20", "--seed", "7", "--quiet", "--compare", "none"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def events(path, name=None):
    out = []
    try:
        with open(path, "rb") as f:
            for line in f.read().decode(errors="replace").splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and (name is None or e.get("event") == name):
                    out.append(e)
    except FileNotFoundError:
        pass
    return out


def wait_for(what, cond, limit):
    end = time.time() + limit
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    check(False, f"{what} (gave up after {limit} s)")
    return None


class Instance:
    """One serve process from one config file; the same ports across restarts (haproxy names them)."""

    def __init__(self, tmp, name, db_uri, shared=None):
        self.name, self.state = name, os.path.join(tmp, name)
        self.log = os.path.join(tmp, name + ".log")
        self.port, self.admin = free_port(), free_port()
        self.config = os.path.join(tmp, name + ".json")
        cfg = {"state_dir": self.state, "state": db_uri, "listen": f"127.0.0.1:{self.port}",
               "admin_listen": f"127.0.0.1:{self.admin}", "connections_per_address": 0, "register_per_minute": 0,
               "threads": 2, "lease_seconds": 3}
        if shared is not None:  # the first instance's certificate, key and admin token; its signing key copied
            cfg.update(cert=os.path.join(shared, "tls-cert.pem"), key=os.path.join(shared, "tls-key.pem"),
                       admin_token_file=os.path.join(shared, "admin-token"))
            os.makedirs(self.state, mode=0o700)
            shutil.copy2(os.path.join(shared, "signing-key.pem"), os.path.join(self.state, "signing-key.pem"))
        with open(self.config, "w") as f:
            json.dump(cfg, f)
        self.proc = None

    def start(self):
        ports = os.path.join(self.state, "ports.json")
        if os.path.exists(ports):
            os.unlink(ports)
        env = dict(os.environ, DPREC_TEST_FINALIZE_PAUSE_MS=str(PAUSE_MS))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([AGG, "serve", "--config", self.config], stdout=log, stderr=log, env=env)

        def up():
            if self.proc.poll() is not None:
                raise SystemExit(f"instance {self.name} exited ({self.proc.returncode}); see {self.log}")
            try:
                with open(ports) as f:
                    return json.load(f).get("pid") == self.proc.pid
            except (OSError, ValueError):
                return False
        if not wait_for(f"instance {self.name} starts", up, 60):
            raise SystemExit(1)
        self.id = events(self.log, "state_opened")[-1].get("instance")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


def tls_get(port, cafile, path, token=None, raw=None):
    """One request on a new TLS connection to 127.0.0.1:port; the raw response bytes."""
    ctx = ssl.create_default_context(cafile=cafile)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s, \
            ctx.wrap_socket(s, server_hostname="localhost") as t:
        if raw is None:
            auth = f"Authorization: Bearer {token}\r\n" if token else ""
            raw = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n".encode()
        t.sendall(raw)
        out = b""
        while True:
            try:
                chunk = t.recv(65536)
            except (ssl.SSLError, OSError):
                break
            if not chunk:
                break
            out += chunk
        return out


def body_of(resp):
    return resp.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in resp else b""


def front_end(front, admin_token, cafile):
    r = tls_get(front, cafile, "/healthz")
    check(r.startswith(b"HTTP/1.1 200"), f"GET /healthz through haproxy: 200 ({r[:40]!r})")
    smuggle = (b"POST /v1/register HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}")
    r = tls_get(front, cafile, None, raw=smuggle)
    check(r.startswith(b"HTTP/1.1 400") and b"bad_framing" in r,
          f"two Content-Length headers through haproxy: the instance's 400 bad_framing ({r[:60]!r})")
    r = tls_get(front, cafile, "/v1/admin/jobs", token=admin_token)
    check(r.startswith(b"HTTP/1.1 403") and b"admin_only" in r,
          f"the admin API is not on the devices' address: 403 admin_only ({r[:40]!r})")
    # no ClientHello: haproxy closes the connection itself (inspect-delay 5 s), no instance sees it
    s = socket.create_connection(("127.0.0.1", front), timeout=20)
    t0 = time.time()
    try:
        closed = s.recv(1) == b""
    except OSError:
        closed = True
    s.close()
    check(closed and time.time() - t0 < 15, "a connection that sends no TLS ClientHello is closed by haproxy")
    # one address: at most DPREC_PER_SOURCE (set to 16 here) at once; the next is refused at accept
    held = [socket.create_connection(("127.0.0.1", front), timeout=5) for _ in range(16)]
    extra = None
    try:
        extra = socket.create_connection(("127.0.0.1", front), timeout=5)
        refused = extra.recv(1) == b""
    except OSError:  # reset at accept, or on the first read
        refused = True
    for s in held + ([extra] if extra is not None else []):
        s.close()
    check(refused, "the 17th connection from one address is refused (DPREC_PER_SOURCE 16)")


def reference_rmse(tmp):
    vals = []
    for i in range(REFS):
        # the fleet's own one-instance aggregator: `dprec-aggregator serve` on SQLite over HTTPS, as many threads
        out = subprocess.run([FLEET] + FLEET_ARGS + ["--threads", "6"], capture_output=True, text=True, timeout=900,
                             env=dict(os.environ, DPREC_AGGREGATOR=AGG))
        last = (out.stdout.strip().splitlines() or [""])[-1]
        if out.returncode != 0 or "test_rmse=" not in last:
            check(False, f"one-instance reference run {i + 1} ({out.returncode}: {last!r} {out.stderr[-500:]})")
            return None
        vals.append(float(last.split("test_rmse=")[1].split()[0]))
    return vals


def main():
    db = f"dprec_haproxy_{os.getpid()}"
    sql("postgres", f"CREATE DATABASE {db}")
    tmp = tempfile.mkdtemp(prefix="dprec-haproxy-")
    a = Instance(tmp, "a", uri(db))
    insts, hap = [a], None
    try:
        a.start()
        insts += [Instance(tmp, "b", uri(db), shared=a.state), Instance(tmp, "c", uri(db), shared=a.state)]
        for i in insts[1:]:
            i.start()
        cafile = os.path.join(a.state, "tls-cert.pem")
        with open(os.path.join(a.state, "admin-token")) as f:
            admin_token = f.read().strip()
        front, admin_front = free_port(), free_port()
        env = dict(os.environ, DPREC_FRONT=f"127.0.0.1:{front}", DPREC_ADMIN_FRONT=f"127.0.0.1:{admin_front}",
                   DPREC_CA=cafile, DPREC_CHECK_HOST="localhost", DPREC_MAXCONN="2000", DPREC_PER_SOURCE="16")
        for n, i in zip("ABC", insts):
            env[f"DPREC_{n}"] = f"127.0.0.1:{i.port}"
            env[f"DPREC_{n}_ADMIN"] = f"127.0.0.1:{i.admin}"
        hlog = open(os.path.join(tmp, "haproxy.log"), "ab")
        hap = subprocess.Popen([HAPROXY, "-f", CFG, "-db"], stdout=hlog, stderr=hlog, env=env)

        def front_up():
            try:
                return tls_get(front, cafile, "/healthz").startswith(b"HTTP/1.1 200")
            except OSError:
                return False
        if not wait_for("haproxy answers /healthz", front_up, 30):
            return
        front_end(front, admin_token, cafile)

        # a secure-aggregation job through the three instances: haproxy spreads the devices' connections, so a round's
        # steps land on all of them; each applies the round's log in the database (aggregator/rounds/agg_secure.c)
        out = subprocess.run([FLEET, "--synthetic", "40,20,400", "--protocol", "gauss-gd", "--secure-agg", "--rounds", "2",
                              "--quiet", "--compare", "none", "--threads", "4", "--aggregator",
                              f"https://127.0.0.1:{front}", "--admin-url", f"https://127.0.0.1:{admin_front}",
                              "--admin-token", os.path.join(a.state, "admin-token"), "--release-key",
                              os.path.join(a.state, "release-key.der"), "--cacert", cafile],
                             capture_output=True, text=True, timeout=600)
        check(out.returncode == 0, f"a secure-aggregation job runs on three instances of one database "
                                   f"({out.returncode}: {out.stderr.strip()[-300:]!r})")
        sjob = int(sql(db, "SELECT coalesce(max(id), 0) FROM jobs"))
        check(sql(db, f"SELECT state || ' ' || round FROM jobs WHERE id = {sjob}") == "done 3",
              "the secure job is done after its 2 rounds")
        check(sql(db, f"SELECT count(*) FROM reports WHERE job = {sjob}") == "0",
              "no masked input was stored as a report")
        check(sql(db, "SELECT count(*) FROM secagg_log") == "0", "each secure round's log went with its commit")
        closed = [sum(1 for e in events(i.log, "secagg_phase_closed") if e.get("job") == sjob) for i in insts]
        check(sum(1 for c in closed if c > 0) >= 2,
              f"the secure rounds' phases closed on more than one instance, where the message that completed each "
              f"landed ({closed})")
        for r in (1, 2):
            logs = [i.log for i in insts]
            fins = [e for lg in logs for e in events(lg, "round_finalized") if e.get("job") == sjob and e.get("round") == r]
            check(len(fins) == 1, f"secure round {r} finalized exactly once across the three logs ({len(fins)})")

        csv = os.path.join(tmp, "fleet.csv")
        flog = open(os.path.join(tmp, "fleet.log"), "w+")
        fleet = subprocess.Popen([FLEET] + FLEET_ARGS + [
            "--threads", "6", "--csv", csv, "--aggregator", f"https://127.0.0.1:{front}",
            "--admin-url", f"https://127.0.0.1:{admin_front}", "--admin-token", os.path.join(a.state, "admin-token"),
            "--release-key", os.path.join(a.state, "release-key.der"), "--cacert", cafile],
            stdout=flog, stderr=subprocess.STDOUT)
        job = wait_for("the fleet creates its job",
                       lambda: (lambda m: m if m > sjob else 0)(int(sql(db, "SELECT coalesce(max(id), 0) FROM jobs"))), 120)
        by_id = {i.id: i for i in insts}

        def holder():
            return by_id.get(sql(db, f"SELECT holder FROM leases WHERE job = {job}"))

        # round 1: the holder killed mid-round, restarted once another holds the lease
        wait_for("600 reports in round 1", lambda: int(sql(db, f"SELECT count(*) FROM reports WHERE job = {job} "
                                                               "AND round = 1")) >= 600, 300)
        first = holder()
        check(first is not None and sql(db, f"SELECT round FROM jobs WHERE id = {job}") == "1",
              f"round 1 is open and instance {first and first.name} holds the lease")
        first.kill9()
        n1 = int(sql(db, f"SELECT count(*) FROM reports WHERE job = {job} AND round = 1"))
        print(f"info: instance {first.name} (the holder) killed with SIGKILL in round 1, {n1} reports in")
        second = wait_for("another instance takes the lease", lambda: (holder() not in (None, first)) and holder(), 60)
        first.start()
        print(f"info: instance {second and second.name} took the lease; {first.name} started again")

        # round 2: the holder killed inside its finalization (closing mark set, release computed, not committed)
        def pausing():
            h = holder()
            if h is None or not h.alive():
                return None
            return h if any(e.get("job") == job and e.get("round") == 2 and e.get("ms")
                            for e in events(h.log, "test_finalize_pause")) else None
        fin = wait_for("round 2's finalization reaches its pause", pausing, 600)
        if fin is None:
            return
        fin.kill9()
        check(sql(db, f"SELECT round || ' ' || closing_round FROM jobs WHERE id = {job}") == "2 2",
              "killed inside the window: round 2 marked closing, not committed")
        print(f"info: instance {fin.name} killed with SIGKILL while finalizing round 2")
        check(fin is not first, "the two kills hit two different instances")

        rc = fleet.wait(timeout=900)
        flog.seek(0)
        out = flog.read()
        lines = out.strip().splitlines()
        if not check(rc == 0 and lines and lines[-1].startswith(f"final: protocol=dpals rounds={ROUNDS} "),
                     f"the fleet ran every round, every device synced (exit {rc}: {(lines or [''])[-1]!r})"):
            print(out[-3000:])
        fin.start()  # back to three, so that every instance serves the releases below

        check(sql(db, f"SELECT state || ' ' || round FROM jobs WHERE id = {job}") == f"done {ROUNDS + 1}",
              "the job is done in the database")
        versions = ",".join(str(v) for v in range(1, ROUNDS + 2))
        check(sql(db, f"SELECT string_agg(version::text, ',' ORDER BY version) FROM releases WHERE job = {job}")
              == versions, f"its releases are {versions}: contiguous")
        with open(csv) as f:
            rows = {int(r.split(",")[0]): int(r.split(",")[1]) for r in f.read().strip().splitlines()[1:]}
        logs = [i.log for i in insts]
        for r in range(1, ROUNDS + 1):
            fins = [e for lg in logs for e in events(lg, "round_finalized") if e.get("job") == job and e.get("round") == r]
            stored = int(sql(db, f"SELECT count(*) FROM reports WHERE job = {job} AND round = {r}"))
            check(len(fins) == 1, f"round {r} finalized exactly once across the three logs ({len(fins)})")
            check(rows.get(r) == stored == DEVICES,
                  f"round {r}: the devices' acknowledged reports ({rows.get(r)}) = the database's rows ({stored}) = "
                  f"{DEVICES}")
            check(len(fins) == 1 and fins[0].get("reports") == stored,
                  f"round {r}'s global step counted every row ({fins[0].get('reports') if fins else None})")
        check(not any(e.get("job") == job and e.get("round") == 2 for e in events(fin.log, "round_finalized")),
              "the instance killed in its finalization never logged round 2 finalized")
        for v in range(1, ROUNDS + 2):
            stored = sql(db, f"SELECT encode(bytes, 'hex') FROM releases WHERE job = {job} AND version = {v}")
            served = []
            for i in insts:
                r = tls_get(i.port, cafile, f"/v1/jobs/{job}/releases/{v}", token=device_token(tmp, i, cafile))
                served.append(body_of(r).hex() if r.startswith(b"HTTP/1.1 200") else None)
            check(all(s == stored for s in served), f"release {v}: byte for byte the database's on all three instances")
            check(base.signature_verifies(bytes.fromhex(stored), os.path.join(a.state, "release-key.der"), tmp),
                  f"release {v}'s signature verifies (openssl)")
        led = [ln for ln in lines if ln.startswith("ledgers: ")]
        want = f"ledgers: {DEVICES} devices charged this job, at most epsilon = "
        if check(len(led) == 1 and led[0].startswith(want), f"every device charged the job ({led})"):
            most = led[0][len(want):].split()[0]
            least = led[0].split("the least ")[1].split(")")[0]
            agg = led[0].rsplit(": ", 1)[1]
            check(most == least == agg, f"every device's ledger equals the aggregator's figure ({least} .. {most} = {agg})")

        rmse = float(lines[-1].split("test_rmse=")[1].split()[0]) if lines and "test_rmse=" in lines[-1] else None
        refs = reference_rmse(tmp)
        if rmse is not None and refs:
            lo, hi = min(refs) - 3 * SD, max(refs) + 3 * SD
            check(lo <= rmse <= hi, f"final RMSE {rmse:.4f} within the one-instance spread [{lo:.4f}, {hi:.4f}] "
                                    f"(references {', '.join(f'{x:.4f}' for x in refs)}, mean "
                                    f"{statistics.mean(refs):.4f}; sd {SD})")
    finally:
        if hap is not None and hap.poll() is None:
            hap.terminate()
            hap.wait()
        for i in insts:
            if i.alive():
                i.proc.send_signal(signal.SIGTERM)
                try:
                    i.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    i.proc.kill()
                    i.proc.wait()
        if base.FAILS:
            for name in ("a.log", "b.log", "c.log", "haproxy.log", "fleet.log"):
                p = os.path.join(tmp, name)
                if os.path.exists(p):
                    with open(p, "rb") as f:
                        sys.stdout.write(f"---- {name} (tail) ----\n" + f.read()[-2500:].decode(errors="replace"))
        shutil.rmtree(tmp, ignore_errors=True)
        sql("postgres", f"DROP DATABASE IF EXISTS {db}")
    if base.FAILS:
        print(f"{len(base.FAILS)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


_TOKENS = {}


def device_token(tmp, inst, cafile):
    """A device registered (once, on the first instance asked) to read releases with."""
    if "t" not in _TOKENS:
        ctx = ssl.create_default_context(cafile=cafile)
        with socket.create_connection(("127.0.0.1", inst.port), timeout=30) as s, \
                ctx.wrap_socket(s, server_hostname="localhost") as t:
            t.sendall(b"POST /v1/register HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
            out = b""
            while True:
                c = t.recv(65536)
                if not c:
                    break
                out += c
        _TOKENS["t"] = json.loads(body_of(out).decode())["token"]
    return _TOKENS["t"]


if __name__ == "__main__":
    main()
