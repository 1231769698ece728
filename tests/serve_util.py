"""What the serve tests share (tests/agg_server_https.py, agg_hardening.py, front_end_attacks.py,
agg_serve_postgresql.py, agg_serve_multi.py, relay_serve_https.py, device_sync.py): waiting for a server to listen,
and the state engine the aggregator's tests run on.

A server started with `serve --state-dir DIR --listen 127.0.0.1:0 ...` writes DIR/ports.json ({"device": port,
"admin": port, "pid": its pid}) once both listeners are open (docs/operations.md); wait_for_ports waits for the file
that names the process it started, so that a ports.json left by an earlier server on the same directory is never
taken for this one's.

The engine: DPREC_TEST_STATE=postgresql (ctest sets it on the NAME_postgresql variants, with DPREC_TEST_PG_DIR naming
tests/pg_cluster.py's cluster) runs an aggregator's state on PostgreSQL, one database per state directory; unset or
"sqlite", on SQLite in the state directory, the default. state_args(state_dir) gives the serve options for it, and
state_query runs SQL on it from outside the aggregator. Nothing is skipped: without the cluster, state_args exits
saying how to start it. The C tests choose their engine the same way through tests/test_state.h."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time


def remove_ports(state_dir):
    """Removes state_dir/ports.json (a server about to start writes a new one)."""
    try:
        os.unlink(os.path.join(state_dir, "ports.json"))
    except FileNotFoundError:
        pass


def log_tail(log_path, n=3000):
    try:
        with open(log_path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")
    except (OSError, TypeError):
        return ""


def wait_for_ports(proc, state_dir, timeout=30, log_path=None, what="server", exited_ok=False):
    """Waits until proc (a subprocess.Popen of `serve`) wrote state_dir/ports.json naming its pid, and returns that
    JSON object. If proc exits first: returns None when exited_ok (its status is proc.returncode), otherwise raises
    SystemExit naming the status and the tail of log_path. After timeout seconds: SystemExit."""
    ports_path = os.path.join(state_dir, "ports.json")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            if exited_ok:
                return None
            raise SystemExit("%s exited early with status %d; see %s:\n%s" %
                             (what, proc.returncode, log_path, log_tail(log_path)))
        try:
            with open(ports_path) as f:
                ports = json.load(f)
            if ports.get("pid") == proc.pid:
                return ports
        except (OSError, ValueError):  # not written yet, or being written
            pass
        time.sleep(0.05)
    raise SystemExit("%s wrote no ports.json in %d s; see %s:\n%s" % (what, timeout, log_path, log_tail(log_path)))


# ---- the state engine ---------------------------------------------------------------------------------------------

ENGINE = os.environ.get("DPREC_TEST_STATE", "sqlite") or "sqlite"
if ENGINE not in ("sqlite", "postgresql"):
    sys.exit("DPREC_TEST_STATE=%s: expected sqlite or postgresql" % ENGINE)
PG = ENGINE == "postgresql"
_databases = {}  # state directory -> its PostgreSQL database


def pg_cluster():
    """(socket directory, user) of tests/pg_cluster.py's cluster named by DPREC_TEST_PG_DIR; exits if there is none."""
    d = os.environ.get("DPREC_TEST_PG_DIR")
    if not d:
        sys.exit("%s: DPREC_TEST_PG_DIR is not set: run it through ctest (fixture pg_cluster) or "
                 "python3 tests/pg_cluster.py run DIR -- %s" % (os.path.basename(sys.argv[0]), " ".join(sys.argv)))
    try:
        with open(os.path.join(d, "host")) as f:
            host = f.read().strip()
        with open(os.path.join(d, "user")) as f:
            user = f.read().strip()
    except OSError as e:
        sys.exit("no PostgreSQL cluster in %s (%s): is it started (python3 tests/pg_cluster.py start %s)?" % (d, e, d))
    return host, user


def pg_uri(db):
    host, user = pg_cluster()
    return "postgresql://%s@/%s?host=%s" % (user, db, host)


def psql(db, query):
    """Runs query on database db of the cluster; its output (unaligned, tuples only), stripped. Exits on an error."""
    exe = shutil.which("psql") or sys.exit("psql not found (Debian postgresql-client; scripts/setup.sh installs it)")
    out = subprocess.run([exe, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", pg_uri(db), "-c", query],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("psql: %s: %s" % (query, out.stderr))
    return out.stdout.strip()


def state_args(state_dir):
    """The serve options that put the aggregator's state of state_dir on the engine under test: none for SQLite (its
    file is state_dir/state.db); for PostgreSQL `--state URI` of a database of its own, made the first time (a
    restart on the same state directory finds the same database). Not dropped: PostgreSQL 15's DROP DATABASE forces a
    checkpoint, and the cluster is thrown away after the run (tests/pg_cluster.py)."""
    if not PG:
        return []
    key = os.path.abspath(state_dir)
    if key not in _databases:
        name = "dprec_py_%d_%d" % (os.getpid(), len(_databases) + 1)
        psql("postgres", "CREATE DATABASE %s" % name)
        _databases[key] = name
    return ["--state", pg_uri(_databases[key])]


def state_query(state_dir, query):
    """The first column of the first row of query on the state of state_dir (None: no row), as text, read from outside
    the aggregator (SQLite: read-only, beside the running server; PostgreSQL: psql). Write query in the dialect both
    engines share."""
    if PG:
        state_args(state_dir)
        out = psql(_databases[os.path.abspath(state_dir)], query)
        return out.split("\n")[0] if out else None
    c = sqlite3.connect("file:%s?mode=ro" % os.path.join(state_dir, "state.db"), uri=True)
    try:
        row = c.execute(query).fetchone()
        return None if row is None else str(row[0])
    finally:
        c.close()
