#!/usr/bin/env python3
"""A throw-away PostgreSQL cluster for the tests of the aggregator's PostgreSQL engine (aggregator/state/postgresql/).

usage: pg_cluster.py start DIR          initdb + pg_ctl start; writes DIR/host (the socket directory), DIR/user
       pg_cluster.py stop DIR           pg_ctl stop, and the cluster's files removed
       pg_cluster.py run DIR -- CMD...  start, run CMD with DPREC_TEST_PG_DIR=DIR, stop; CMD's exit status

The cluster lives in a new directory under /tmp (a Unix socket's path must stay short), listens on its Unix socket
only (listen_addresses = ''), trusts the local user `dprec` (a superuser), and runs with fsync on, as a server an
operator runs would. initdb refuses to run as root: as root, the cluster runs as the unprivileged user `nobody`
(runuser), which owns its directory. The tests find it through DPREC_TEST_PG_DIR=DIR (tests/CMakeLists.txt: the ctest
fixture pg_cluster). Nothing is skipped: without PostgreSQL's server binaries (Debian's `postgresql`, installed by
scripts/setup.sh) start fails, saying so, and so does every test that needs the cluster."""
import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

USER = "dprec"


def die(msg):
    sys.exit(f"pg_cluster: {msg}")


def bindir():
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if os.path.exists(os.path.join(d, "initdb")) and os.path.exists(os.path.join(d, "pg_ctl")):
            return d
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return os.path.dirname(initdb)
    die("PostgreSQL's server binaries (initdb, pg_ctl) are not installed (looked in /usr/lib/postgresql/*/bin and "
        "PATH): run 'bash scripts/setup.sh' (Debian packages postgresql and libpq-dev)")


def as_owner(cmd):
    """cmd as the cluster's owner: nobody when we are root (initdb and postgres refuse root), else ourselves."""
    if os.geteuid() != 0:
        return cmd
    if not shutil.which("runuser"):
        die("running as root, and runuser (util-linux) is missing to run PostgreSQL as an unprivileged user")
    return ["runuser", "-u", "nobody", "--"] + cmd


def run(cmd, what):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        die(f"{what} failed ({' '.join(cmd)}):\n{out.stdout}{out.stderr}")
    return out


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def stop(state_dir):
    home = read(os.path.join(state_dir, "home"))
    if home and os.path.isdir(home):
        data = os.path.join(home, "data")
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run(as_owner([os.path.join(bindir(), "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"]),
                           capture_output=True, text=True)
        shutil.rmtree(home, ignore_errors=True)
    for name in ("home", "host", "user"):
        try:
            os.remove(os.path.join(state_dir, name))
        except FileNotFoundError:
            pass


def start(state_dir):
    b = bindir()
    os.makedirs(state_dir, exist_ok=True)
    stop(state_dir)  # a cluster left by an interrupted run
    home = tempfile.mkdtemp(prefix="dprec-pg-", dir="/tmp")
    data = os.path.join(home, "data")
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
    os.chmod(home, 0o700)
    with open(os.path.join(state_dir, "home"), "w", encoding="utf-8") as f:
        f.write(home + "\n")
    run(as_owner([os.path.join(b, "initdb"), "-D", data, "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"]),
        "initdb")
    opts = f"-k {home} -c listen_addresses='' -c fsync=on -c synchronous_commit=on -c max_connections=60"
    out = subprocess.run(as_owner([os.path.join(b, "pg_ctl"), "-D", data, "-l", os.path.join(home, "log"), "-w",
                                   "-t", "60", "-o", opts, "start"]), capture_output=True, text=True)
    if out.returncode != 0:
        log = read(os.path.join(home, "log")) or ""
        stop(state_dir)
        die(f"pg_ctl start failed:\n{out.stdout}{out.stderr}\n{log}")
    with open(os.path.join(state_dir, "host"), "w", encoding="utf-8") as f:
        f.write(home + "\n")
    with open(os.path.join(state_dir, "user"), "w", encoding="utf-8") as f:
        f.write(USER + "\n")
    print(f"pg_cluster: PostgreSQL ({b}) on the socket in {home}, user {USER}; stop with: pg_cluster.py stop {state_dir}")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("start", "stop", "run"):
        die(__doc__.split("\n\n")[1])
    cmd, state_dir = sys.argv[1], os.path.abspath(sys.argv[2])
    if cmd == "start":
        start(state_dir)
    elif cmd == "stop":
        stop(state_dir)
    else:
        rest = sys.argv[3:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        if not rest:
            die("run needs a command after --")
        start(state_dir)
        try:
            rc = subprocess.run(rest, env=dict(os.environ, DPREC_TEST_PG_DIR=state_dir)).returncode
        finally:
            stop(state_dir)
        sys.exit(rc)


if __name__ == "__main__":
    main()
