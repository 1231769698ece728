#!/usr/bin/env python3
"""Independent reference values for the privacy audit's statistics, examples/fleet/fleet_audit_bound.c (python3
standard library only).

Run:  python3 tests/audit_reference.py            (prints every value tests/test_audit_bound.c embeds, as C)
      python3 tests/audit_reference.py --check    (also checks the closed forms and textbook values below)

The C code sums binomial terms in floating point through lgamma; this script computes the same quantities in exact
arithmetic instead, so that an error in one is unlikely to be repeated in the other:

  * binomial probabilities with exact integer binomial coefficients and 60-digit decimals;
  * the one-run p-value of Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023,
    arXiv 2305.08846), its main theorem in the (eps, delta) form:
        p = P[Bin(r, q) >= v] + 2 m delta max_{i=1..v} P[v - i <= Bin(r, q) < v] / i,   q = e^eps / (1 + e^eps),
    and the lower bound = the largest eps with p <= beta, by bisection to 1e-12;
  * Clopper-Pearson (1934) ends: P[Bin(n, p+) <= k] = a and P[Bin(n, p-) >= k] = a, by bisection to 1e-15;
  * the two-world bound: max(log((1 - delta - FNR+) / FPR+), log((1 - delta - FPR+) / FNR+)) with each rate's
    Clopper-Pearson upper end at (1 - confidence) / 2 (Kairouz, Oh, Viswanath 2015, Thm. 2.1; Jagielski, Ullman,
    Oprea 2020).

--check confirms, besides: with delta = 0 and v = r the bound has the closed form log(q / (1 - q)), q = beta^(1/r)
(all r guesses right has probability q^r under eps-DP; 0 when q < 1/2); the two-sided 95% Clopper-Pearson intervals of textbook tables
(0 of 10: [0, 0.3085]; 5 of 10: [0.1871, 0.8129]; 50 of 100: [0.3983, 0.6017]); and that a larger delta never raises
the bound.
"""
import math
import sys
from decimal import Decimal, getcontext

getcontext().prec = 60


def binom(n, k):
    return math.comb(n, k)


def pmf_table(r, q):
    """Exact P[Bin(r, q) = k] for k = 0..r, q a Decimal."""
    one = Decimal(1)
    return [Decimal(binom(r, k)) * q ** k * (one - q) ** (r - k) for k in range(r + 1)]


def q_of(eps):
    e = Decimal(eps).exp()
    return e / (1 + e)


def pvalue(m, r, v, eps, delta):
    if v == 0:
        return Decimal(1)
    t = pmf_table(r, q_of(eps))
    p = sum(t[v:], Decimal(0))
    if delta > 0:
        alpha, s = Decimal(0), Decimal(0)
        for i in range(1, v + 1):
            s += t[v - i]
            alpha = max(alpha, s / i)
        p += 2 * m * Decimal(delta) * alpha
    return min(p, Decimal(1))


def bound(m, r, v, delta, beta):
    beta = Decimal(beta)
    if v == 0 or pvalue(m, r, v, 0, delta) > beta:
        return 0.0
    lo, hi = Decimal(0), Decimal(1)
    while pvalue(m, r, v, hi, delta) <= beta:
        lo, hi = hi, hi * 2
    while hi - lo > Decimal("1e-12"):
        mid = (lo + hi) / 2
        if pvalue(m, r, v, mid, delta) <= beta:
            lo = mid
        else:
            hi = mid
    return float(lo)


def cdf(k, n, p):
    """P[Bin(n, p) <= k], exactly for the Decimal p."""
    one = Decimal(1)
    return sum((Decimal(binom(n, j)) * p ** j * (one - p) ** (n - j) for j in range(k + 1)), Decimal(0))


def cp_upper(k, n, a):
    if k >= n:
        return 1.0
    a = Decimal(a)
    lo, hi = Decimal(k) / n, Decimal(1)
    while hi - lo > Decimal("1e-15"):
        mid = (lo + hi) / 2
        if cdf(k, n, mid) <= a:
            hi = mid
        else:
            lo = mid
    return float(hi)


def cp_lower(k, n, a):
    if k == 0:
        return 0.0
    return 1.0 - cp_upper(n - k, n, a)


def two_world(fp, n_out, fn, n_in, delta, conf):
    a = (1 - conf) / 2
    fpr, fnr = cp_upper(fp, n_out, a), cp_upper(fn, n_in, a)
    best = 0.0
    if fpr > 0 and 1 - delta - fnr > 0:
        best = max(best, math.log((1 - delta - fnr) / fpr))
    if fnr > 0 and 1 - delta - fpr > 0:
        best = max(best, math.log((1 - delta - fpr) / fnr))
    return best


# The cases tests/test_audit_bound.c embeds.
PVALUES = [  # m, r, v, eps, delta
    (1000, 100, 80, 1.0, 0.0),
    (1000, 100, 80, 1.0, 1e-6),
    (1000, 200, 180, 2.0, 1e-5),
    (200, 50, 50, 3.0, 1e-5),
    (500, 500, 300, 0.5, 1e-6),
    (100, 20, 0, 1.0, 1e-5),
]
BOUNDS = [  # m, r, v, delta, beta
    (100, 100, 100, 0.0, 0.05),
    (1000, 100, 90, 0.0, 0.05),
    (1000, 100, 90, 1e-5, 0.05),
    (1000, 600, 600, 1e-5, 0.05),
    (1000, 1000, 731, 0.0, 0.05 / 6),
    (200, 50, 49, 1e-6, 0.001 / 6),
    (400, 400, 200, 1e-6, 0.05),
    (64, 8, 8, 0.0, 0.05),
]
CP = [  # k, n, a (one-sided level)
    (0, 10, 0.025),
    (5, 10, 0.025),
    (10, 10, 0.025),
    (50, 100, 0.025),
    (3, 200, 0.025),
    (997, 1000, 0.005),
]
TWO_WORLD = [  # fp, n_out, fn, n_in, delta, confidence
    (0, 100, 0, 100, 0.0, 0.95),
    (5, 100, 10, 100, 1e-5, 0.95),
    (50, 100, 50, 100, 0.0, 0.95),
    (0, 500, 3, 500, 1e-6, 0.95),
]


def main():
    check = "--check" in sys.argv
    print("/* tests/audit_reference.py */")
    print("static const struct { uint64_t m, r, v; double eps, delta, p; } pvalue_cases[] = {")
    for m, r, v, e, d in PVALUES:
        print("    {%d, %d, %d, %r, %r, %.17g}," % (m, r, v, e, d, float(pvalue(m, r, v, e, d))))
    print("};")
    print("static const struct { uint64_t m, r, v; double delta, beta, eps; } bound_cases[] = {")
    for m, r, v, d, b in BOUNDS:
        print("    {%d, %d, %d, %r, %.17g, %.17g}," % (m, r, v, d, b, bound(m, r, v, d, b)))
    print("};")
    print("static const struct { uint64_t k, n; double a, upper, lower; } cp_cases[] = {")
    for k, n, a in CP:
        print("    {%d, %d, %r, %.17g, %.17g}," % (k, n, a, cp_upper(k, n, a), cp_lower(k, n, a)))
    print("};")
    print("static const struct { uint64_t fp, n_out, fn, n_in; double delta, confidence, eps; } two_world_cases[] = {")
    for fp, no, fn, ni, d, c in TWO_WORLD:
        print("    {%d, %d, %d, %d, %r, %r, %.17g}," % (fp, no, fn, ni, d, c, two_world(fp, no, fn, ni, d, c)))
    print("};")
    if not check:
        return 0
    bad = 0
    for r in (1, 10, 100, 1000):  # all r right guesses, delta = 0: q^r = beta
        q = 0.05 ** (1.0 / r)
        want, got = max(0.0, math.log(q / (1 - q))), bound(r, r, r, 0.0, 0.05)
        if abs(want - got) > 1e-9:
            print("closed form r=%d: %.12f != %.12f" % (r, got, want))
            bad += 1
    for k, n, lo, hi in ((0, 10, 0.0, 0.3085), (5, 10, 0.1871, 0.8129), (50, 100, 0.3983, 0.6017)):
        got = (cp_lower(k, n, 0.025), cp_upper(k, n, 0.025))
        if abs(got[0] - lo) > 5e-5 or abs(got[1] - hi) > 5e-5:
            print("Clopper-Pearson %d of %d: [%.4f, %.4f] != [%.4f, %.4f]" % (k, n, got[0], got[1], lo, hi))
            bad += 1
    for m, r, v in ((1000, 100, 90), (1000, 600, 600)):
        if bound(m, r, v, 1e-5, 0.05) > bound(m, r, v, 0.0, 0.05):
            print("a larger delta raised the bound (%d, %d, %d)" % (m, r, v))
            bad += 1
    print("check: %s" % ("ok" if bad == 0 else "%d mismatches" % bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
