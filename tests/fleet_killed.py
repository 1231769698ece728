#!/usr/bin/env python3
"""dprec-fleet killed outright (SIGKILL, as the OOM killer does) leaves nothing behind: its throw-away
aggregator state (in $TMPDIR, else /dev/shm, where it is memory) is removed by the fleet's watchdog, and in
HTTPS mode the `dprec-aggregator serve` child it started exits too. With DPREC_FLEET_KEEP_STATE the state
stays. Usage: fleet_killed.py DPREC_FLEET [DPREC_AGGREGATOR]. Waits for conditions, never times anything:
each wait gives up after 60 s and fails the test."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def wait_for(what, cond, limit=60.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    sys.exit(f"fleet_killed: gave up waiting for {what}")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def state_dirs(tmp):
    return [d for d in os.listdir(tmp) if d.startswith("dprec-fleet-")]


def run(fleet, mode, keep):
    tmp = tempfile.mkdtemp(prefix="fleet-killed-")
    env = dict(os.environ, TMPDIR=tmp)
    if keep:
        env["DPREC_FLEET_KEEP_STATE"] = "1"
    else:
        env.pop("DPREC_FLEET_KEEP_STATE", None)
    args = [fleet, "--synthetic", "3000,200,30000,5", "--protocol", "plain", "--rounds", "100000"]
    if mode == "in-process":
        args.insert(1, "--in-process")
    log = open(os.path.join(tmp, "fleet.log"), "w+")
    p = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def running():
            log.seek(0)
            return "round " in log.read() or p.poll() is not None
        wait_for(f"{mode}: the fleet's first round", running)
        if p.poll() is not None:
            log.seek(0)
            sys.exit(f"fleet_killed: the fleet exited early ({p.returncode}):\n{log.read()}")
        dirs = state_dirs(tmp)
        if len(dirs) != 1 or not os.listdir(os.path.join(tmp, dirs[0])):
            sys.exit(f"fleet_killed: {mode}: expected one non-empty state dir in {tmp}, found {dirs}")
        log.seek(0)
        m = re.search(r"started by the fleet, pid (\d+)", log.read())
        child = int(m.group(1)) if m else None
        if mode == "https" and child is None:
            sys.exit("fleet_killed: https: the fleet did not name its aggregator's pid")
        p.send_signal(signal.SIGKILL)
        p.wait()
        if keep:
            time.sleep(2)  # a watchdog would have acted by now; there must be none
            if state_dirs(tmp) != dirs:
                sys.exit(f"fleet_killed: {mode}: DPREC_FLEET_KEEP_STATE set, but the state dir went")
        else:
            wait_for(f"{mode}: the state dir to be removed", lambda: not state_dirs(tmp))
        if child is not None:
            wait_for(f"{mode}: the aggregator child {child} to exit", lambda: not alive(child))
        print(f"fleet_killed: {mode}{' (keep state)' if keep else ''}: ok")
    finally:
        if p.poll() is None:
            p.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    fleet = sys.argv[1]
    if len(sys.argv) > 2:
        os.environ["DPREC_AGGREGATOR"] = sys.argv[2]
    run(fleet, "in-process", keep=False)
    run(fleet, "in-process", keep=True)
    if len(sys.argv) > 2:
        run(fleet, "https", keep=False)


if __name__ == "__main__":
    main()
