#!/usr/bin/env python3
"""What a private `bias` release's uncertainty column says of its items against what they carry (docs/results.md,
"Where the release cannot measure its spread"). Reads two per-item dumps of a one-round bias job written by
scripts/experiments/spread_probe.patch (DPREC_EXP_ITEMS=FILE; a line an item: j, the noisy Gram entry g^ of the
bias, the released bias x, the column's gain a and noise N): NOISY, the run under study, and REF, the same seed at a
budget so large that its noise is negligible (its x stands for the item's true value t; its g for the true Gram).

  python3 scripts/experiments/spread_probe.py NOISY REF

Per band of items ranked by their noisy Gram entry g^ (the order the release itself shows): the mean g^ and the true
g, the column's gain a and the measured one, E[x t] / E[t^2] (the regression through 0 of the release on the truth,
the gain of the model x = a t + n, docs/privacy.md "Release uncertainty"), the column's noise N and the measured one,
E[(x - a t)^2] with the measured a. Then the spread: the noiseless release's E[t^2] over items, and what
the column's estimator (eb_spread2: T^2 = max(0, sum(x^2 - N) - 2 sqrt(sum 2 N^2)) / sum a^2) gives on NOISY; and the
same with each gain a_j = f(g^_j) g^_j corrected for the Gram's noise to f(g^_j) E[g_j | g^_j] by Tweedie's formula,
E[g | g^] = g^ + s^2 d log p(g^) / dg^ (Efron, "Tweedie's formula and selection bias", JASA 2011), p the items' g^
density by a Gaussian kernel of Silverman's bandwidth 0.9 min(sd, IQR / 1.34) m^(-1/5), s the Gram's noise measured
as the spread of g^ - g over the items, E[g | g^] at least 0 (with and without the margin)."""
import math
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            j, g, x, a, n = line.split()
            rows[int(j)] = (float(g), float(x), float(a), float(n))
    return rows


def mean(v):
    return sum(v) / len(v) if v else 0.0


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    noisy, ref = load(sys.argv[1]), load(sys.argv[2])
    items = sorted(noisy, key=lambda j: -noisy[j][0])
    m = len(items)
    print("| items by g^ | mean g^ | mean true g | gain a: column | measured | noise N: column | measured |")
    print("|---|---|---|---|---|---|---|")
    bands = [b for b in (0, 20, 50, 100, 200, 400, 800) if b < m] + [m]
    for lo, hi in zip(bands, bands[1:]):
        js = items[lo:hi]
        x = [noisy[j][1] for j in js]
        t = [ref[j][1] for j in js]
        tt = mean([v * v for v in t])
        a_meas = mean([u * v for u, v in zip(x, t)]) / tt if tt > 0 else 0.0
        n_meas = mean([(u - a_meas * v) ** 2 for u, v in zip(x, t)])
        print(f"| {lo + 1}-{hi} | {mean([noisy[j][0] for j in js]):.0f} | {mean([ref[j][0] for j in js]):.0f} "
              f"| {mean([noisy[j][2] for j in js]):.3f} | {a_meas:.3f} | {mean([noisy[j][3] for j in js]):.4f} "
              f"| {n_meas:.4f} |")
    t2 = mean([ref[j][1] ** 2 for j in items])
    num = sum(noisy[j][1] ** 2 - noisy[j][3] for j in items)
    margin = 2.0 * math.sqrt(sum(2.0 * noisy[j][3] ** 2 for j in items))
    den = sum(noisy[j][2] ** 2 for j in items)
    est = max(0.0, num - margin) / den if den > 0 else 0.0
    print(f"\nspread: the noiseless release's E[t^2] = {t2:.4f}; the column's estimate T^2 = {est:.5f} "
          f"(sum(x^2 - N) = {num:.3f}, margin {margin:.3f}, sum a^2 = {den:.1f})")
    gh = [noisy[j][0] for j in items]
    s_g = math.sqrt(mean([(noisy[j][0] - ref[j][0]) ** 2 for j in items]))
    mu_g = mean(gh)
    sd_g = math.sqrt(sum((v - mu_g) ** 2 for v in gh) / (m - 1))
    q = sorted(gh)
    bw = 0.9 * min(sd_g, (q[3 * m // 4] - q[m // 4]) / 1.34) * m ** -0.2

    def posterior_g(y):  # Tweedie: y + s^2 p'(y) / p(y), p the kernel density of the g^
        p = dp = 0.0
        for v in gh:
            k = math.exp(-0.5 * ((y - v) / bw) ** 2)
            p += k
            dp -= (y - v) / (bw * bw) * k
        return max(0.0, y + s_g * s_g * dp / p) if p > 0 else 0.0

    eg = {j: posterior_g(noisy[j][0]) for j in items}
    a_tw = {j: noisy[j][2] * eg[j] / noisy[j][0] if noisy[j][0] > 0 else 0.0 for j in items}
    den_tw = sum(v * v for v in a_tw.values())
    bands3 = ", ".join(f"{mean([eg[j] for j in items[lo:hi]]):.0f} against {mean([ref[j][0] for j in items[lo:hi]]):.0f}"
                       for lo, hi in zip(bands, bands[1:4]))
    print(f"Tweedie: the Gram's noise {s_g:.0f}, bandwidth {bw:.1f}; E[g | g^] in the first three bands {bands3}; "
          f"T^2 with the margin {max(0.0, num - margin) / den_tw:.4f}, without it {max(0.0, num) / den_tw:.4f}")


if __name__ == "__main__":
    main()
