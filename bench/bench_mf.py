#!/usr/bin/env python3
"""The seed-003 solver against LIBMF on the same data, in the same run (docs/benchmarks.md, "The MF solver").

    python3 bench/bench_mf.py --libmf DIR [--spec U,I,N] [--work DIR] [--ks 16,32,64] [--threads 1,2]
                              [--iterations 20] [--sgld-epsilon E] [--repeat R] [--out FILE]

DIR is a built LIBMF (https://github.com/cjlin1/libmf, outside this repository; its AVX build:
`make DFLAG="-DUSEAVX -DUSEOMP" CXXFLAGS="-Wall -O3 -pthread -std=c++0x -march=native -mavx -fopenmp"`) holding
mf-train. The data: `dprec-aggregator train --synthetic SPEC --write-train --write-test` writes plain
`user item rating` lines (0-based ids) once into --work, and both tools read those files.

For each k and thread count, LIBMF and dprec run back to back (LIBMF first), so both see the same load:
  - LIBMF: `mf-train -k K -s T -t N` without validation; each iteration's wall time is the time between its output
    lines (LIBMF prints one line per iteration: its training loss, which it accumulates during the pass, and the
    objective, whose regularizer costs one O((m + n) k) sum). Its iteration 0 updates only the first 8 coordinates
    (LIBMF's "slow_only" first pass), so it is left out.
  - dprec: `dprec-aggregator train --data ... --test ...`, which times each pass alone (the test RMSE after it is
    computed outside the timed part). Its first pass is left out too.
The per-pass time reported is the median over passes 2..N (robust to other processes on a shared machine); for
SGLD over its sampling passes only (after its 5 warm-up passes, which draw no noise and would pull its median down),
and
rating updates per second = training ratings / that time. Beside it, the CPU time per pass of all the process's
threads (dprec: CLOCK_PROCESS_CPUTIME_ID around the pass; LIBMF: /proc/PID/stat at each of its lines, 10 ms
resolution), which does not count the waits for a core that a loaded machine adds to the wall time. With --rmse (default on for k = 32, T = 2) LIBMF runs once
more with `-p test` for its test RMSE per pass, which both tools print. SGLD (dprec only) runs at the same k and T.
With --repeat R each configuration's tools run R times in turn (LIBMF, SGD, SGLD, LIBMF, ...), and each figure is
the median of the R runs' medians: a virtual machine's speed drifts by tens of percent over minutes here (two runs of
the same binary a minute apart), which one back-to-back run per tool cannot tell from a real difference.
Prints a markdown table and appends CSV rows to --out.
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """The CPU time (user + system, every thread) the process has used, from /proc (clock ticks: 10 ms here)."""
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError, ValueError):
        return float("nan")


def timed_lines(cmd):
    """Runs cmd with line-buffered stdout; returns [(monotonic time, process CPU seconds, line)]."""
    p = subprocess.Popen(["stdbuf", "-oL"] + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    for line in p.stdout:
        out.append((time.monotonic(), proc_cpu(p.pid), line.rstrip("\n")))
    if p.wait() != 0:
        sys.exit("bench_mf.py: %s failed:\n%s" % (" ".join(cmd), "\n".join(l for _, _, l in out[-20:])))
    return out


def libmf_run(libmf, k, t, n, train, test=None):
    """Per-iteration wall times (iterations 1..n-1) and, with test, the test RMSE of every iteration."""
    cmd = [os.path.join(libmf, "mf-train"), "-k", str(k), "-s", str(t), "-t", str(n)]
    if test:
        cmd += ["-p", test]
    cmd += [train, os.path.join(os.path.dirname(train), "libmf.model")]
    lines = timed_lines(cmd)
    iters = [(ts, cpu, l.split()) for ts, cpu, l in lines if re.match(r"^\s*\d+\s", l)]
    # line i ends iteration i: times[i - 1] is iteration i's, for i >= 1 (iteration 0, the slow-only pass, has
    # none); iteration 1, the first full pass, is left out as dprec's first pass is
    times = [iters[i][0] - iters[i - 1][0] for i in range(1, len(iters))]
    cpus = [iters[i][1] - iters[i - 1][1] for i in range(1, len(iters))]
    rmse = [float(f[2]) for _, _, f in iters] if test else []
    return times[1:], cpus[1:], rmse


def dprec_run(binary, k, t, n, train, test, extra, skip=1):
    """Per-pass wall and CPU times of passes skip+1..n, the test RMSE of every pass, and the last line."""
    cmd = [binary, "train", "--data", train, "--test", test, "--rank", str(k), "--threads", str(t),
           "--iterations", str(n)] + extra
    lines = [l for _, _, l in timed_lines(cmd)]
    rows = [l.split() for l in lines if re.match(r"^\s*\d+\s+\d", l)]
    times = [float(r[1]) for r in rows]
    rmse = [float(r[4]) for r in rows]
    cpus = [float(r[5]) for r in rows]
    return times[skip:], cpus[skip:], rmse, lines[-1]


def SGLD(a):
    """SGLD's flags for the timing runs: every rating kept (tau above any user's count), the synthetic ratings' range
    as the scale, priors wide enough for its factors, 5 warm-up passes (counted among the passes), weight 1 for every
    user (as before the protocol's default became rho = tau) and mu fixed at the scale's midpoint."""
    return ["--method", "sgld", "--epsilon", str(a.sgld_epsilon), "--scale", "-2", "8", "--tau", "1000",
            "--prior-sd", "0.5", "--bias-prior-sd", "0.5", "--warmup", str(SGLD_WARMUP), "--max-weight", "1",
            "--mu-prior-sd", "0"]


SGLD_WARMUP = 5  # SGLD's descent passes before sampling; its timed passes are the ones after them


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libmf", help="a built LIBMF directory (mf-train); without it only dprec runs")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "aggregator", "dprec-aggregator"))
    ap.add_argument("--spec", default="200000,20000,10000000")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-mf"))
    ap.add_argument("--ks", default="16,32,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--sgld-epsilon", type=float, default=1e6,
                    help="SGLD's epsilon (a timing run: 1e6 puts beta = 2.5, near the ordinary posterior)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each tool per configuration, in turn; each figure is the median of their medians")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    train, test = os.path.join(a.work, "train.txt"), os.path.join(a.work, "test.txt")
    stamp = os.path.join(a.work, "spec")
    if not (os.path.exists(train) and os.path.exists(stamp) and open(stamp).read() == a.spec):
        subprocess.run([a.bin, "train", "--synthetic", a.spec, "--write-train", train, "--write-test", test],
                       check=True)
        open(stamp, "w").write(a.spec)
    ntrain = sum(1 for _ in open(train))
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print("machine: %s, %d CPUs, %s; load average before: %s" % (cpu, os.cpu_count(), platform.platform(),
                                                                  " ".join("%.2f" % x for x in os.getloadavg())))
    print("data: --synthetic %s: %d training ratings (%s)" % (a.spec, ntrain, train))
    out = open(a.out, "a") if a.out else None
    if out and out.tell() == 0:
        out.write("tool,method,k,threads,pass_s_median,ratings_per_s,cpu_s_median,rmse_last,load\n")
    rows = []
    for k in [int(x) for x in a.ks.split(",")]:
        for t in [int(x) for x in a.threads.split(",")]:
            load = os.getloadavg()[0]
            med = lambda x: statistics.median(x) if x else None
            runs = {"libmf": [], "libmf_cpu": [], "sgd": [], "sgd_cpu": [], "sgld": [], "sgld_cpu": []}
            for _ in range(max(1, a.repeat)):
                if a.libmf:
                    lt, lc, _ = libmf_run(a.libmf, k, t, a.iterations, train)
                    runs["libmf"].append(med(lt)), runs["libmf_cpu"].append(med(lc))
                dt, dc, drmse, _ = dprec_run(a.bin, k, t, a.iterations, train, test, [])
                st, sc, srmse, _ = dprec_run(a.bin, k, t, a.iterations, train, test, SGLD(a), skip=SGLD_WARMUP)
                runs["sgd"].append(med(dt)), runs["sgd_cpu"].append(med(dc))
                runs["sgld"].append(med(st)), runs["sgld_cpu"].append(med(sc))
            row = {key: med(v) for key, v in runs.items()}
            row.update({"k": k, "t": t, "load": load, "rmse": drmse[-1],
                        "ratios": [b / c for b, c in zip(runs["sgld_cpu"], runs["sgd_cpu"])]})
            rows.append(row)
            for tool, method, v, c, r in (("libmf", "sgd", row["libmf"], row["libmf_cpu"], ""),
                                          ("dprec", "sgd", row["sgd"], row["sgd_cpu"], drmse[-1]),
                                          ("dprec", "sgld", row["sgld"], row["sgld_cpu"], srmse[-1])):
                if v is None:
                    continue
                line = "%s,%s,%d,%d,%.4f,%.0f,%.4f,%s,%.2f" % (tool, method, k, t, v, ntrain / v, c, r, load)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
                    out.flush()
    print("\nwall time per pass, median of passes 2..N (SGLD: its sampling passes; M rating updates/s); CPU s per pass"
          " (all threads) after /" + (", each the median of %d runs" % a.repeat if a.repeat > 1 else ""))
    print("| k | threads | LIBMF | dprec SGD | dprec SGLD | SGD: dprec / LIBMF, wall / CPU | SGLD / SGD, wall / CPU |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cell = lambda w, c: "%.3f s (%.1f) / %.3f" % (w, ntrain / w / 1e6, c)
        lib = cell(r["libmf"], r["libmf_cpu"]) if r["libmf"] else "—"
        ratio = "%.2f× / %.2f×" % (r["libmf"] / r["sgd"], r["libmf_cpu"] / r["sgd_cpu"]) if r["libmf"] else "—"
        print("| %d | %d | %s | %s | %s | %s | %.2f / %.2f |" % (r["k"], r["t"], lib, cell(r["sgd"], r["sgd_cpu"]),
                                                                 cell(r["sgld"], r["sgld_cpu"]), ratio,
                                                                 r["sgld"] / r["sgd"], r["sgld_cpu"] / r["sgd_cpu"]))
    if a.repeat > 1:
        print("\nSGLD / SGD in CPU time, run by run: " + "; ".join(
            "k = %d, %d threads: %s" % (r["k"], r["t"], ", ".join("%.2f" % x for x in r["ratios"])) for r in rows))
    if a.libmf:
        k, t = (32, 2)
        _, _, lrmse = libmf_run(a.libmf, k, t, a.iterations, train, test)
        _, _, drmse, _ = dprec_run(a.bin, k, t, a.iterations, train, test, [])
        _, _, srmse, _ = dprec_run(a.bin, k, t, a.iterations, train, test, SGLD(a), skip=SGLD_WARMUP)
        print("\ntest RMSE per pass, k = %d, %d threads:" % (k, t))
        print("| pass | " + " | ".join(str(i + 1) for i in range(a.iterations)) + " |")
        print("|---|" + "---|" * a.iterations)
        print("| LIBMF | " + " | ".join("%.4f" % x for x in lrmse) + " |")
        print("| dprec SGD | " + " | ".join("%.4f" % x for x in drmse) + " |")
        print("| dprec SGLD (epsilon %g) | " % a.sgld_epsilon + " | ".join("%.4f" % x for x in srmse) + " |")
    print("load average after: %s" % " ".join("%.2f" % x for x in os.getloadavg()))


if __name__ == "__main__":
    main()
