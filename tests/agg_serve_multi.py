#!/usr/bin/env python3
"""Two `dprec-aggregator serve` instances on one PostgreSQL database (docs/notes/multi-instance.md).

1. Instance A starts on a new database; instance B starts on the same one with A's signing key (another key is
   refused: agg_serve_postgresql.py). A plain job closing at 4 reports is created on A; B serves it too.
2. Round 1: two devices report to A, two to B. The round is finalized exactly once (one round_finalized event in the
   two logs, releases 1 and 2 only), both instances serve release 2 byte for byte as the database holds it, and its
   signature verifies against the one release key.
3. Round 2: two devices report to the lease holder, which is then killed with SIGKILL; the two others report to the
   survivor. After the lease expires (--lease-seconds 3) the survivor takes it and finalizes round 2 once, counting
   the dead instance's acknowledged reports: release 3 holds, round 2 has 4 report rows.

usage: agg_serve_multi.py PATH/TO/dprec-aggregator (cluster: DPREC_TEST_PG_DIR, as agg_serve_postgresql.py)."""
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agg_serve_postgresql as base  # noqa: E402  (its cluster, psql and Server)

check, sql, uri, Server = base.check, base.sql, base.uri, base.Server


def job_round(srv, job):
    status, body = srv.json("admin", "GET", f"/v1/admin/jobs/{job}", token=srv.admin_token)
    return body.get("round") if status == 200 and body else None


def wait_round(servers, job, want, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if all(job_round(s, job) == want for s in servers):
            return True
        time.sleep(0.2)
    return False


def finalized_events(servers, job, rnd):
    n = 0
    for s in servers:
        with open(s.logname, "rb") as f:
            for line in f.read().decode(errors="replace").splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("event") == "round_finalized" and e.get("job") == job and e.get("round") == rnd:
                    n += 1
    return n


def instance_of(srv):
    with open(srv.logname, "rb") as f:
        for line in f.read().decode(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "state_opened":
                inst = e.get("instance")
    return inst


def same_release(servers, db, job, version, token, tmp):
    rels = []
    for s in servers:
        status, rel = s.request("device", "GET", f"/v1/jobs/{job}/releases/{version}", token=token)
        check(status == 200, f"release {version} is served on {os.path.basename(s.state)} ({status})")
        rels.append(rel)
    stored = sql(db, f"SELECT encode(bytes, 'hex') FROM releases WHERE job = {job} AND version = {version}")
    check(all(r.hex() == stored for r in rels), f"every instance serves release {version} as the database holds it")
    check(base.signature_verifies(rels[0], os.path.join(servers[0].state, "release-key.der"), tmp),
          f"release {version}'s signature verifies against the one release key (openssl)")


def main():
    db = f"dprec_multi_{os.getpid()}"
    sql("postgres", f"CREATE DATABASE {db}")
    tmp = tempfile.mkdtemp(prefix="dprec-pg-multi-")
    a = Server(os.path.join(tmp, "a"), uri(db))
    b = Server(os.path.join(tmp, "b"), uri(db))
    a.extra = b.extra = ["--lease-seconds", "3"]
    try:
        a.start()
        os.makedirs(b.state, mode=0o700)
        shutil.copy2(os.path.join(a.state, "signing-key.pem"), os.path.join(b.state, "signing-key.pem"))
        b.start()
        check(instance_of(a) != instance_of(b), "the two instances have their own holder ids")
        with open(os.path.join(a.state, "release-key.der"), "rb") as f, \
                open(os.path.join(b.state, "release-key.der"), "rb") as g:
            check(f.read() == g.read(), "both publish the same release key")

        d, m = 4, 10
        spec = {"protocol": "plain", "d": d, "m": m, "rating_min": 1, "rating_max": 5, "rounds": 3, "min_reports": 4,
                "round_seconds": 3600, "participation": 1.0, "params": {"lambda": 0.1, "seed": 1}}
        status, body = a.json("admin", "POST", "/v1/admin/jobs", body=spec, token=a.admin_token)
        if not check(status == 201, f"a job created on A ({status} {body})"):
            return
        job = body["job"]
        status, body = b.json("admin", "POST", "/v1/admin/jobs", body=spec, token=b.admin_token)
        check(status == 201 and body["job"] != job, f"a job created on B gets another id ({status} {body})")
        tokens = []
        for i in range(4):
            srv = a if i % 2 == 0 else b
            status, body = srv.json("device", "POST", "/v1/register", body={})
            check(status == 201, f"device {i} registers on {os.path.basename(srv.state)} ({status})")
            tokens.append(body["token"])
        status, body = b.json("device", "GET", f"/v1/jobs/{job}", token=tokens[1])
        check(status == 200 and body.get("round") == 1, f"B serves the job A created ({status} {body})")

        # round 1: devices 0, 1 report to A, 2, 3 to B (a device's token works on either instance)
        for i in range(4):
            srv = a if i < 2 else b
            status, body = srv.report(job, tokens[i], base.plain_report(job, 1, bytes([0x10 + i]) * 16, d,
                                                                      [(i, 4.0)]))
            check(status == 200 and body.get("duplicate") is False,
                  f"device {i} reports round 1 to {os.path.basename(srv.state)} ({status} {body})")
        check(wait_round([a, b], job, 2, 20), "both instances see round 2 (round 1 finalized)")
        check(finalized_events([a, b], job, 1) == 1, "round 1 was finalized once (one round_finalized in both logs)")
        check(sql(db, f"SELECT string_agg(version::text, ',' ORDER BY version) FROM releases WHERE job = {job}")
              == "1,2", "releases 1 and 2 only")
        check(sql(db, f"SELECT count(*) FROM reports WHERE job = {job} AND round = 1") == "4", "round 1 has 4 reports")
        same_release([a, b], db, job, 2, tokens[0], tmp)

        # round 2: the lease holder takes two reports and is killed; the survivor takes the rest and the lease
        holder_id = sql(db, f"SELECT holder FROM leases WHERE job = {job}")
        holder, other = (a, b) if holder_id == instance_of(a) else (b, a)
        check(holder_id in (instance_of(a), instance_of(b)), f"one instance holds the job's lease ({holder_id})")
        for i in range(2):
            status, body = holder.report(job, tokens[i], base.plain_report(job, 2, bytes([0x20 + i]) * 16, d,
                                                                         [(i, 3.0)]))
            check(status == 200, f"device {i} reports round 2 to the holder ({status} {body})")
        holder.kill9()
        for i in range(2, 4):
            status, body = other.report(job, tokens[i], base.plain_report(job, 2, bytes([0x20 + i]) * 16, d,
                                                                        [(i, 3.0)]))
            check(status == 200, f"device {i} reports round 2 to the survivor ({status} {body})")
        check(wait_round([other], job, 3, 30), "the survivor finalizes round 2 after the lease expired")
        check(sql(db, f"SELECT holder FROM leases WHERE job = {job}") == instance_of(other),
              "the survivor holds the lease now")
        check(finalized_events([a, b], job, 2) == 1, "round 2 was finalized once")
        check(sql(db, f"SELECT string_agg(version::text, ',' ORDER BY version) FROM releases WHERE job = {job}")
              == "1,2,3", "releases 1, 2, 3: contiguous")
        check(sql(db, f"SELECT count(*) FROM reports WHERE job = {job} AND round = 2") == "4",
              "round 2 counts the dead instance's acknowledged reports too (4)")
        same_release([other], db, job, 3, tokens[2], tmp)
        check(other.stop() == 0, "SIGTERM stops the survivor cleanly")
    finally:
        for s in (a, b):
            if s.proc is not None and s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
        if base.FAILS:
            for s in (a, b):
                if getattr(s, "logname", None) and os.path.exists(s.logname):
                    with open(s.logname, "rb") as f:
                        sys.stdout.write(f"---- {s.logname} (tail) ----\n" + f.read()[-3000:].decode(errors="replace"))
        shutil.rmtree(tmp, ignore_errors=True)
        sql("postgres", f"DROP DATABASE IF EXISTS {db}")
    if base.FAILS:
        print(f"{len(base.FAILS)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
