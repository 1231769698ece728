#!/usr/bin/env python3
"""The seed-003 solver against LIBMF on the same data, the same objective and the same machine, in the same run
(docs/benchmarks.md, "The MF solver").

    python3 bench/bench_mf.py --libmf DIR [--spec U,I,N] [--work DIR] [--ks 16,32,64] [--threads 1,2]
                              [--iterations 20] [--lambda 0.05] [--rmse-configs 32:1,32:2,64:2] [--rmse-iterations 40]
                              [--targets 0.80,0.70,0.66,0.64,0.63] [--sgld-epsilon E] [--repeat R] [--out FILE]

DIR is a built LIBMF (https://github.com/cjlin1/libmf, outside this repository; its AVX build:
`make DFLAG="-DUSEAVX -DUSEOMP" CXXFLAGS="-Wall -O3 -pthread -std=c++0x -march=native -mavx -fopenmp"`, or its default
SSE build on a CPU without AVX) holding mf-train. The data: `dprec-aggregator train --synthetic SPEC --write-train
--write-test` writes plain `user item rating` lines (0-based ids) once into --work, and both tools read those files.

What each tool is given (every flag is passed explicitly, so the commands printed are the whole configuration):
  - LIBMF: `mf-train -f 0 -l1 0 -l2 LAMBDA -r ETA -k K -s T -t N` (squared loss, no L1, ETA = --libmf-eta, 0.1, its
    default). Its model is r ~ p_u . q_v with no offset and no biases; its update for one rating is
    p_u -= eta_u (lambda p_u - e q_v), q_v likewise (e = r - p_u . q_v), i.e. SGD on
        sum over ratings of (r - p_u . q_v)^2 + lambda |p_u|^2 + lambda |q_v|^2
    (each row penalized once per rating of it). It trains on the ratings divided by their standard deviation s with
    lambda / s, which is the same objective in the ratings' own units, so -l2 means what dprec's --lambda means.
    Its rate is adaptive per row (AdaGrad): eta_u = ETA / sqrt(G_u), G_u = 1 plus the mean squared gradient
    coordinate of every update of row u so far, one G for the row's first 8 coordinates and one for the rest; its first
    iteration updates only those first 8 coordinates (its "slow-only" pass). 20 x 20 blocks (more above 9 threads).
  - dprec: `dprec-aggregator train --lambda LAMBDA --lambda-bias LB --lr LR --lr-decay D --init-scale S`: the model
    r ~ mu + b_u + c_v + u . v with mu the training mean (fixed), the same per-rating update of the factors (SGD on
    half the objective above: u += lr (e v - lambda u)) and of the biases (b += lr (e - LB b)), at one rate for every
    row, lr / (1 + D t) in pass t = 0, 1, ...; 2T + 1 user and item groups.
  - Where they cannot match: LIBMF has no offset and no biases. dprec's offset is free and its biases pay LB (0.01),
    while LIBMF's factors must carry the whole rating (about 3 here) and pay LAMBDA on it. So at the same LAMBDA the
    two minimize different objectives over different models; the accuracy table compares where each gets, and how
    fast, not the same optimum. The rates cannot match either (one adaptive per row, one scheduled per pass): both
    run at their defaults, untuned for this data.

Speed: for each k and thread count, LIBMF and dprec run back to back (LIBMF first), so both see the same load:
  - LIBMF without validation; each iteration's wall time is the time between its output lines (one line per
    iteration: the training loss it accumulates during the pass, and the objective, whose regularizer costs one
    O((m + n) k) sum). Its iteration 0 (the slow-only pass) is left out of the median, and so is its first full pass.
  - dprec: `dprec-aggregator train`, which times each pass alone (the test RMSE after it is computed outside the timed
    part). Its first pass is left out.
The per-pass time reported is the median over the remaining passes (robust to other processes on a shared machine);
for SGLD over its sampling passes only (after its 5 warm-up passes, which draw no noise and would pull its median
down), and rating updates per second = training ratings / that time. Beside it, the CPU time per pass of all the
process's threads (dprec: CLOCK_PROCESS_CPUTIME_ID around the pass; LIBMF: /proc/PID/stat at each of its lines, 10 ms
resolution), which does not count the waits for a core that a loaded machine adds to the wall time. SGLD (dprec only)
runs at the same k and T.

Accuracy (--rmse-configs, k:threads pairs): LIBMF runs once with `-p test` for its test RMSE after every iteration
(iteration 0 is pass 1) and once without it for its times (its validation would be timed otherwise; with more than
one thread the two runs' block orders differ, so the passes come from the first and the seconds from the second);
dprec runs once, printing both. For every target test RMSE (--targets) each tool's row gives the first pass at or
below it and the wall and CPU seconds of training up to the end of that pass (LIBMF: from its header line, after
loading and gridding; dprec: the sum of its timed passes, after its layout), and "—" when it is not reached in
--rmse-iterations passes; then each tool's lowest test RMSE and the pass it came at. A target both reach is a like-for-
like comparison: equal test RMSE, the same lambda, the same data, the same threads.

With --repeat R each configuration's tools run R times in turn (LIBMF, SGD, SGLD, LIBMF, ...), and each figure is the
median of the R runs' figures: a virtual machine's speed drifts by tens of percent over minutes, which one back-to-back
run per tool cannot tell from a real difference. Prints markdown tables and appends CSV rows to --out (speed) and
--out-rmse (accuracy).
"""
import argparse
import math
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
SGLD_WARMUP = 5  # SGLD's descent passes before sampling; its timed passes are the ones after them


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


def libmf_cmd(a, k, t, n, train, test=None):
    cmd = [os.path.join(a.libmf, "mf-train"), "-f", "0", "-l1", "0", "-l2", str(a.lambda_), "-r", str(a.libmf_eta),
           "-k", str(k), "-s", str(t), "-t", str(n)]
    if test:
        cmd += ["-p", test]
    return cmd + [train, os.path.join(os.path.dirname(train), "libmf.model")]


def libmf_run(a, k, t, n, train, test=None):
    """Every pass's wall and CPU seconds (pass 1 is LIBMF's iteration 0, timed from its header line) and, with test,
    the test RMSE after every pass."""
    lines = timed_lines(libmf_cmd(a, k, t, n, train, test))
    head = next(i for i, (_, _, l) in enumerate(lines) if l.split()[:1] == ["iter"])
    marks = [(ts, cpu, l.split()) for ts, cpu, l in lines[head:] if re.match(r"^\s*\d+\s", l)]
    starts = [lines[head][:2]] + [m[:2] for m in marks[:-1]]
    walls = [m[0] - s[0] for m, s in zip(marks, starts)]
    cpus = [m[1] - s[1] for m, s in zip(marks, starts)]
    rmse = [float(f[2]) for _, _, f in marks] if test else []
    return walls, cpus, rmse


def dprec_sgd_flags(a):
    return ["--lambda", str(a.lambda_), "--lambda-bias", str(a.lambda_bias), "--lr", str(a.lr), "--lr-decay",
            str(a.lr_decay), "--init-scale", str(a.init_scale)]


def dprec_cmd(a, k, t, n, train, test, extra):
    return [a.bin, "train", "--data", train, "--test", test, "--rank", str(k), "--threads", str(t),
            "--iterations", str(n)] + extra


def dprec_run(a, k, t, n, train, test, extra):
    """Every pass's wall and CPU seconds and the test RMSE after it."""
    lines = [l for _, _, l in timed_lines(dprec_cmd(a, k, t, n, train, test, extra))]
    rows = [l.split() for l in lines if re.match(r"^\s*\d+\s+\d", l)]
    return [float(r[1]) for r in rows], [float(r[5]) for r in rows], [float(r[4]) for r in rows]


def SGLD(a):
    """SGLD's flags for the timing runs: every rating kept (tau above any user's count), the synthetic ratings' range
    as the scale, priors wide enough for its factors, 5 warm-up passes (counted among the passes), weight 1 for every
    user and mu fixed at the scale's midpoint."""
    return ["--method", "sgld", "--epsilon", str(a.sgld_epsilon), "--scale", "-2", "8", "--tau", "1000",
            "--prior-sd", "0.5", "--bias-prior-sd", "0.5", "--warmup", str(SGLD_WARMUP), "--max-weight", "1",
            "--mu-prior-sd", "0"]


def threads(t):
    return "%d thread%s" % (t, "" if t == 1 else "s")


def med(x):
    x = [v for v in x if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(x) if x else None


def reach(rmse, walls, cpus, target):
    """The first pass (1-based) whose test RMSE is at or below target, and the wall and CPU seconds up to its end."""
    for i, r in enumerate(rmse):
        if r <= target:
            if i >= len(walls):
                return i + 1, None, None
            return i + 1, sum(walls[:i + 1]), sum(cpus[:i + 1])
    return None, None, None


def speed(a, train, test, ntrain, out):
    rows = []
    for k in [int(x) for x in a.ks.split(",")]:
        for t in [int(x) for x in a.threads.split(",")]:
            load = os.getloadavg()[0]
            runs = {"libmf": [], "libmf_cpu": [], "sgd": [], "sgd_cpu": [], "sgld": [], "sgld_cpu": []}
            for _ in range(max(1, a.repeat)):
                if a.libmf:
                    lw, lc, _ = libmf_run(a, k, t, a.iterations, train)
                    runs["libmf"].append(med(lw[2:])), runs["libmf_cpu"].append(med(lc[2:]))
                dw, dc, drmse = dprec_run(a, k, t, a.iterations, train, test, dprec_sgd_flags(a))
                sw, sc, srmse = dprec_run(a, k, t, a.iterations, train, test, SGLD(a))
                runs["sgd"].append(med(dw[1:])), runs["sgd_cpu"].append(med(dc[1:]))
                runs["sgld"].append(med(sw[SGLD_WARMUP:])), runs["sgld_cpu"].append(med(sc[SGLD_WARMUP:]))
            row = {key: med(v) for key, v in runs.items()}
            row.update({"k": k, "t": t, "load": load,
                        "ratios": [b / c for b, c in zip(runs["sgld_cpu"], runs["sgd_cpu"])],
                        "lib_ratios": [b / c for b, c in zip(runs["libmf_cpu"], runs["sgd_cpu"])]})
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
    print("\nwall time per pass, median of the steady passes (LIBMF: 3..N, dprec SGD: 2..N, SGLD: its sampling passes;"
          " M rating updates/s); CPU s per pass (all threads) after /" +
          (", each the median of %d runs" % a.repeat if a.repeat > 1 else ""))
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
        print("\nrun by run, CPU time: " + "; ".join(
            "k = %d, %s: LIBMF / SGD %s, SGLD / SGD %s" % (
                r["k"], threads(r["t"]), ", ".join("%.2f" % x for x in r["lib_ratios"]) or "—",
                ", ".join("%.2f" % x for x in r["ratios"])) for r in rows))


def accuracy(a, train, test, out):
    targets = [float(x) for x in a.targets.split(",")]
    n = a.rmse_iterations
    for cfg in [c for c in a.rmse_configs.split(",") if c]:
        k, t = (int(x) for x in cfg.split(":"))
        res = {"libmf": [], "dprec": []}  # per repeat: (rmse per pass, walls, cpus)
        for _ in range(max(1, a.repeat)):
            _, _, lrmse = libmf_run(a, k, t, n, train, test)
            lw, lc, _ = libmf_run(a, k, t, n, train)
            res["libmf"].append((lrmse, lw, lc))
            dw, dc, drmse = dprec_run(a, k, t, n, train, test, dprec_sgd_flags(a))
            res["dprec"].append((drmse, dw, dc))
        print("\ntest RMSE targets, k = %d, %s, lambda = %g (LIBMF -l2, dprec --lambda), %d passes at most%s:"
              % (k, threads(t), a.lambda_, n, ", each figure the median of %d runs" % a.repeat if a.repeat > 1 else ""))
        print("| target | LIBMF: pass, wall s, CPU s | dprec SGD: pass, wall s, CPU s | LIBMF ÷ dprec: passes, wall, CPU |")
        print("|---|---|---|---|")
        for target in targets:
            got = {}
            for tool in ("libmf", "dprec"):
                hits = [reach(r, w, c, target) for r, w, c in res[tool]]
                if any(h[0] is None for h in hits):
                    got[tool] = None
                else:
                    got[tool] = tuple(med([h[i] for h in hits]) for i in range(3))
            cell = lambda g: "%g, %.2f, %.2f" % g if g and g[1] is not None else "—"
            both = got["libmf"] and got["dprec"] and got["libmf"][1] is not None and got["dprec"][1] is not None
            ratio = ("%.2f×, %.2f×, %.2f×" % (got["libmf"][0] / got["dprec"][0], got["libmf"][1] / got["dprec"][1],
                                              got["libmf"][2] / got["dprec"][2]) if both else "— (not both reached)")
            print("| %.4f | %s | %s | %s |" % (target, cell(got["libmf"]), cell(got["dprec"]), ratio), flush=True)
            if out:
                for tool in ("libmf", "dprec"):
                    g = got[tool] or (None, None, None)
                    out.write("%s,%d,%d,%g,%.4f,%s,%s,%s\n" % (tool, k, t, a.lambda_, target,
                                                              *("" if x is None else "%.4f" % x for x in g)))
                out.flush()
        for tool, name in (("libmf", "LIBMF"), ("dprec", "dprec SGD")):
            best = [min(range(len(r)), key=lambda i: r[i]) for r, _, _ in res[tool]]
            print("%s: lowest test RMSE %s (at pass %s); after %d passes %s" % (
                name, ", ".join("%.4f" % res[tool][j][0][b] for j, b in enumerate(best)),
                ", ".join(str(b + 1) for b in best), n, ", ".join("%.4f" % r[-1] for r, _, _ in res[tool])))
        r0 = {tool: res[tool][0][0] for tool in res}
        show = [p for p in (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100) if p <= n]
        print("\ntest RMSE after each pass (the first run), k = %d, %s:" % (k, threads(t)))
        print("| pass | " + " | ".join(str(p) for p in show) + " |")
        print("|---|" + "---|" * len(show))
        for tool, name in (("libmf", "LIBMF"), ("dprec", "dprec SGD")):
            print("| %s | " % name + " | ".join("%.4f" % r0[tool][p - 1] for p in show) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libmf", help="a built LIBMF directory (mf-train); without it only dprec runs")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "aggregator", "dprec-aggregator"))
    ap.add_argument("--spec", default="200000,20000,10000000")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-mf"))
    ap.add_argument("--ks", default="16,32,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--iterations", type=int, default=20, help="passes of each speed run")
    ap.add_argument("--lambda", dest="lambda_", type=float, default=0.05,
                    help="the factors' L2 penalty of both tools (LIBMF -l2, dprec --lambda; dprec's default)")
    ap.add_argument("--lambda-bias", type=float, default=0.01, help="dprec's biases' L2 penalty (LIBMF has no biases)")
    ap.add_argument("--lr", type=float, default=0.05, help="dprec's learning rate")
    ap.add_argument("--lr-decay", type=float, default=0.3, help="dprec's rate decay: lr / (1 + decay t) in pass t")
    ap.add_argument("--init-scale", type=float, default=0.1, help="dprec's factors start uniform in [0, this)")
    ap.add_argument("--libmf-eta", type=float, default=0.1, help="LIBMF's -r (its AdaGrad base rate; its default)")
    ap.add_argument("--rmse-configs", default="32:1,32:2,64:2",
                    help="k:threads pairs of the accuracy comparison (empty: none; needs --libmf)")
    ap.add_argument("--rmse-iterations", type=int, default=40, help="passes of each accuracy run")
    ap.add_argument("--targets", default="0.80,0.70,0.66,0.64,0.63", help="test RMSE levels to reach")
    ap.add_argument("--sgld-epsilon", type=float, default=1e6,
                    help="SGLD's epsilon (a timing run: 1e6 puts beta = 2.5, near the ordinary posterior)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each tool per configuration, in turn; each figure is the median of their figures")
    ap.add_argument("--out", default=None, help="CSV of the speed rows (appended)")
    ap.add_argument("--out-rmse", default=None, help="CSV of the accuracy rows (appended)")
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
    print("LIBMF: " + (" ".join(libmf_cmd(a, "K", "T", "N", train)) if a.libmf else "not run (no --libmf)"))
    print("dprec: " + " ".join(dprec_cmd(a, "K", "T", "N", train, test, dprec_sgd_flags(a))))
    print("dprec SGLD: " + " ".join(dprec_cmd(a, "K", "T", "N", train, test, SGLD(a))))
    out = open(a.out, "a") if a.out else None
    if out and out.tell() == 0:
        out.write("tool,method,k,threads,pass_s_median,ratings_per_s,cpu_s_median,rmse_last,load\n")
    if a.ks and a.threads:
        speed(a, train, test, ntrain, out)
    if a.libmf and a.rmse_configs:
        rout = open(a.out_rmse, "a") if a.out_rmse else None
        if rout and rout.tell() == 0:
            rout.write("tool,k,threads,lambda,target_rmse,passes,wall_s,cpu_s\n")
        accuracy(a, train, test, rout)
    print("load average after: %s" % " ".join("%.2f" % x for x in os.getloadavg()))


if __name__ == "__main__":
    main()
