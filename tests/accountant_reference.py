#!/usr/bin/env python3
"""Independent reference values for common/accountant.c (python3 standard library only).

Run:  python3 tests/accountant_reference.py            (prints every value tests/test_accountant.c embeds)
      python3 tests/accountant_reference.py --check    (also checks the two methods below against each other)

The C accountant computes the Renyi DP (RDP) of the Poisson-subsampled Gaussian with the series of Mironov,
Talwar, Zhang, "Renyi Differential Privacy of the Sampled Gaussian Mechanism" (2019), in double precision:
the binomial sum at integer orders and the two erfc series at fractional orders. This script gets the same
quantities a different way, so that an error in one is unlikely to be repeated in the other:

  * integer orders: the binomial sum of MTZ 2019 Sec. 3.3,
        A_alpha = sum_{k=0}^{alpha} C(alpha, k) q^k (1-q)^(alpha-k) exp((k^2 - k) / (2 z^2)),
    evaluated in 60-digit decimal arithmetic with exact integer binomials (no log-space tricks at all);
  * fractional orders: A_alpha straight from its definition (MTZ 2019 Sec. 3.3),
        A_alpha = E_{x ~ N(0, z^2)} [ ((1-q) + q exp((2x - 1) / (2 z^2)))^alpha ],
    by the trapezoidal rule on a fine grid (exponentially accurate for this smooth, fast-decaying integrand;
    --check confirms it against the exact integer-order sums to about 1e-12 relative).

The discrete Gaussian under Poisson sampling (accountant.c, dprec_rdp_subsampled_discrete_gaussian) is checked
against the general upper bound of Zhu, Wang, "Poisson Subsampled Renyi Differential Privacy" (ICML 2019),
written term by term as printed there in 60-digit decimals (rdp_zw_exact); --check also confirms, as a sanity
check, that it lies above the exact Renyi divergence of the 1-D subsampled discrete Gaussian.

Then RDP = log(A_alpha) / (alpha - 1), and the RDP -> (epsilon, delta) conversions are taken as printed in
their sources:
  classical: eps = r + log(1/delta) / (alpha - 1)                       (Mironov 2017, Prop. 3)
  CKS:       eps = r + log1p(-1/alpha) - log(delta * alpha) / (alpha - 1)
             (Canonne, Kamath, Steinke 2020, Prop. 12; Balle et al. 2020, Thm. 21), clamped at 0.
"""
import math
import sys
from decimal import Decimal, getcontext
from fractions import Fraction

getcontext().prec = 60

# The order grid of accountant.h: 1.1 .. 10.9 (step 0.1), 11 .. 63, then 19 integers 72 .. 1024.
TAIL = (72, 80, 88, 96, 112, 128, 144, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024)
ORDERS = [Fraction(11 + i, 10) for i in range(99)] + [Fraction(k) for k in range(11, 64)] + \
         [Fraction(k) for k in TAIL]
assert len(ORDERS) == 171


def order_str(a):
    return str(a.numerator) if a.denominator == 1 else "%g" % float(a)


# ---- RDP of the subsampled Gaussian -----------------------------------------------------------------------

def to_dec(v):
    """An exact decimal for an int, a decimal string or a Fraction (a float goes through its repr)."""
    if isinstance(v, Fraction):
        return Decimal(v.numerator) / Decimal(v.denominator)
    if isinstance(v, float):
        return Decimal(repr(v))
    return Decimal(v)


def rdp_int_exact(q, z, alpha):
    """RDP at integer alpha: the binomial sum in 60-digit decimals. q, z: int, str, Fraction or Decimal."""
    q = to_dec(q)
    z = to_dec(z)
    if q == 1:
        return Decimal(alpha) / (2 * z * z)
    two_z2 = 2 * z * z
    a = Decimal(0)
    for k in range(alpha + 1):
        a += Decimal(math.comb(alpha, k)) * q ** k * (1 - q) ** (alpha - k) * (Decimal(k * k - k) / two_z2).exp()
    return a.ln() / (alpha - 1)


def rdp_frac_quad(q, z, alpha, per_sigma=64):
    """RDP at any alpha > 1 by integrating A_alpha - 1 = E[((1-q) + q L(x))^alpha - 1] numerically (float).

    Integrating A - 1 rather than A keeps full relative precision when A is close to 1 (small q)."""
    q = float(q)
    z = float(z)
    alpha = float(alpha)
    h = z / per_sigma
    lo = -40.0 * z - 1.0
    hi = alpha + 40.0 * z + 1.0
    n = int(math.ceil((hi - lo) / h))
    log_norm = -math.log(z * math.sqrt(2.0 * math.pi))
    logs = []  # log of (weight * density * ((1-q) + q e^u)^alpha) at each node
    for m in range(n + 1):
        x = lo + m * h
        u = (2.0 * x - 1.0) / (2.0 * z * z)
        if u < 700.0:
            lmix = math.log1p(q * math.expm1(u))  # log((1-q) + q e^u)
        else:
            lmix = u + math.log(q) + math.log1p((1.0 - q) / q * math.exp(-u))
        w = 0.5 if m in (0, n) else 1.0
        logs.append((math.log(w) + log_norm - x * x / (2.0 * z * z), alpha * lmix))
    if max(lp + hp for lp, hp in logs) < 600.0:
        # A - 1 = sum w phi(x) (((1-q) + q e^u)^alpha - 1) h: no cancellation against the 1 when A is near 1.
        a_minus_1 = math.fsum(math.exp(lp) * math.expm1(hp) if hp < 50.0 else math.exp(lp + hp) - math.exp(lp)
                              for lp, hp in logs) * h
        log_a = math.log1p(a_minus_1)
    else:
        # A is huge: log-sum-exp of the terms; the "- 1" is far below double precision.
        top = max(lp + hp for lp, hp in logs)
        log_a = top + math.log(math.fsum(math.exp(lp + hp - top) for lp, hp in logs)) + math.log(h)
    return log_a / (alpha - 1.0)


def rdp(q, z, alpha):
    """RDP of one step at a grid order: exact decimal sum at integer orders, quadrature otherwise."""
    a = Fraction(alpha)
    if Fraction(q) == 1:
        return float(a / (2 * Fraction(z) ** 2))
    if a.denominator == 1:
        return float(rdp_int_exact(q, z, int(a)))
    return rdp_frac_quad(q, z, a)


# ---- the discrete Gaussian under Poisson sampling ---------------------------------------------------------

def rdp_zw_exact(q, z, alpha):
    """Zhu, Wang 2019 (ICML), general upper bound for Poisson subsampling of a mechanism with RDP curve eps(l),
    at integer alpha >= 2, with the discrete Gaussian's eps(l) = l / (2 z^2) (Canonne, Kamath, Steinke 2020),
    as printed there:
        1/(alpha-1) log[ (1-q)^(alpha-1) (alpha q - q + 1) + C(alpha,2) q^2 (1-q)^(alpha-2) e^eps(2)
                         + 3 sum_{l=3}^{alpha} C(alpha,l) (1-q)^(alpha-l) q^l e^((l-1) eps(l)) ],
    then the smaller of that and the unsubsampled eps(alpha). 60-digit decimals, exact integer binomials; term
    by term as in the theorem (the C regroups it as 1 + a sum of positive terms)."""
    q = to_dec(q)
    z = to_dec(z)
    unsampled = Decimal(alpha) / (2 * z * z)
    if q == 1:
        return unsampled

    def eps(l):
        return Decimal(l) / (2 * z * z)

    s = (1 - q) ** (alpha - 1) * (alpha * q - q + 1)
    s += Decimal(math.comb(alpha, 2)) * q ** 2 * (1 - q) ** (alpha - 2) * eps(2).exp()
    for l in range(3, alpha + 1):
        s += 3 * Decimal(math.comb(alpha, l)) * (1 - q) ** (alpha - l) * q ** l * ((l - 1) * eps(l)).exp()
    return min(s.ln() / (alpha - 1), unsampled)


def rdp_discrete(q, z, alpha):
    """One discrete-Gaussian step at a grid order: the ZW bound at integers, +inf at fractional orders under
    sampling (the theorem is for integer orders), alpha / (2 z^2) everywhere without sampling."""
    a = Fraction(alpha)
    if Fraction(q) == 1:
        return float(a / (2 * Fraction(z) ** 2))
    if a.denominator != 1:
        return math.inf
    return float(rdp_zw_exact(q, z, int(a)))


def discrete_plan(q, z, steps, delta, conv):
    tot = [steps * rdp_discrete(q, z, a) for a in ORDERS]
    return best(tot, delta, conv)


def renyi_subsampled_discrete_gaussian_1d(q, z, alpha):
    """Sanity check, not a proof: the exact Renyi divergence, both directions, between the 1-D discrete
    Gaussian N_Z(0, z^2) and its Poisson-sampled neighbour (1-q) N_Z(0, z^2) + q N_Z(1, z^2) (sensitivity 1),
    summed over the integers in float log space. The larger direction is returned."""
    q, z = float(q), float(z)
    lim = int(60 * z + alpha + 10)
    ks = range(-lim, lim + 1)
    lp0 = [-(k * k) / (2 * z * z) for k in ks]
    lp1 = [-((k - 1) ** 2) / (2 * z * z) for k in ks]

    def lse(v):
        m = max(v)
        return m + math.log(math.fsum(math.exp(x - m) for x in v))

    n0, n1 = lse(lp0), lse(lp1)  # the two normalizers are equal; computed anyway
    lq = [a - n0 for a in lp0]
    lm = [lse([math.log1p(-q) + a - n0, math.log(q) + b - n1]) for a, b in zip(lp0, lp1)]
    d1 = lse([alpha * m + (1 - alpha) * x for m, x in zip(lm, lq)]) / (alpha - 1)
    d2 = lse([alpha * x + (1 - alpha) * m for m, x in zip(lm, lq)]) / (alpha - 1)
    return max(d1, d2)


# ---- conversions --------------------------------------------------------------------------------------------

def eps_classical(r, alpha, delta):
    return r + math.log(1.0 / delta) / (alpha - 1.0)


def eps_cks(r, alpha, delta):
    return max(0.0, r + math.log1p(-1.0 / alpha) - math.log(delta * alpha) / (alpha - 1.0))


def best(rdps, delta, conv):
    vals = [(conv(r, float(a), delta), a) for r, a in zip(rdps, ORDERS)]
    e, a = min(vals, key=lambda t: t[0])  # first minimum: smallest order on ties
    return e, a


def gaussian_plan(q, z, steps, delta):
    one = [rdp(q, z, a) for a in ORDERS]
    tot = [steps * r for r in one]
    return best(tot, delta, eps_cks), best(tot, delta, eps_classical)


def show_plan(label, q, z, steps, delta):
    (e1, a1), (e2, a2) = gaussian_plan(q, z, steps, delta)
    print("%s\n    cks       eps = %.17g at order %s\n    classical eps = %.17g at order %s"
          % (label, e1, order_str(a1), e2, order_str(a2)))
    return e1, a1, e2, a2


# ---- closed forms ------------------------------------------------------------------------------------------

def eps_opt_seed001(J, eps_i, delta, delta_r):
    """Mugdho, Imtiaz, eq. (9), in 60-digit decimals."""
    J, eps_i, delta, delta_r = (Decimal(str(v)) for v in (J, eps_i, delta, delta_r))
    den = 4 * (Decimal("1.25") / delta).ln()
    rho = J * eps_i * eps_i / den
    return rho + 2 * (J * eps_i * eps_i * (1 / delta_r).ln() / den).sqrt(), rho


def advanced(k, eps, delta_slack):
    """Dwork, Rothblum, Vadhan 2010, Thm. III.3, in 60-digit decimals."""
    k, eps, d = (Decimal(str(v)) for v in (k, eps, delta_slack))
    return (2 * k * (1 / d).ln()).sqrt() * eps + k * eps * (eps.exp() - 1)


# ---- main ----------------------------------------------------------------------------------------------------

def main():
    check = "--check" in sys.argv[1:]

    print("== Gaussian, no subsampling: z = 1, one step, delta = 1e-5 (rdp(alpha) = alpha / 2) ==")
    tot = [float(a / 2) for a in ORDERS]
    e, a = best(tot, 1e-5, eps_classical)
    print("classical: min over the grid at order %s: %.17g = %s/2 + ln(1e5)/(%s - 1)"
          % (order_str(a), e, order_str(a), order_str(a)))
    print("           continuous optimum 1/2 + 2 sqrt(ln(1e5)/2) = %.15g at alpha = 1 + sqrt(2 ln 1e5) = %.6g"
          % (0.5 + 2 * math.sqrt(math.log(1e5) / 2), 1 + math.sqrt(2 * math.log(1e5))))
    e, a = best(tot, 1e-5, eps_cks)
    print("cks:       min over the grid at order %s: %.17g" % (order_str(a), e))

    print("\n== zCDP rho = 0.5 is RDP alpha/2, the Gaussian with z = 1/sqrt(2 rho) = 1: same values as above ==")

    print("\n== single-order RDP values (TF-Privacy rdp_accountant_test.py published values in brackets) ==")
    print("q=0.1  z=2   alpha=5   steps=10: %.17g  [0.07737, places=5]" % (10 * rdp(Decimal("0.1"), 2, 5)))
    for a, pub in ((Fraction(3, 2), "0.00065"), (Fraction(5, 2), "0.001085"), (Fraction(5), "0.00218075"),
                   (Fraction(50), "0.023846"), (Fraction(100), "167.416307")):
        v = 50 * (rdp_frac_quad(0.01, 2.5, a) if a.denominator != 1 else float(rdp_int_exact("0.01", "2.5", int(a))))
        print("q=0.01 z=2.5 alpha=%-4s steps=50: %.17g  [%s, delta=1e-5]" % (order_str(a), v, pub))

    print("\n== consistency points: one step, integer orders by the exact sum ==")
    for q, z in (("0.01", "1.1"), ("0.1", "0.8"), ("0.5", "2")):
        for a in (2, 3, 10):
            print("q=%-4s z=%-3s alpha=%-2d rdp=%.17g" % (q, z, a, float(rdp_int_exact(q, z, a))))

    print("\n== a fractional order far from the grid: q = 0.1, z = 9, alpha = 350.5, one step ==")
    print("quadrature %.17g; exact sums at 350: %.17g, at 351: %.17g"
          % (rdp_frac_quad(0.1, 9, Fraction(701, 2)), float(rdp_int_exact("0.1", "9", 350)),
             float(rdp_int_exact("0.1", "9", 351))))

    print("\n== published DP-SGD examples (TF-Privacy compute_dp_sgd_privacy_test.py, CKS conversion) ==")
    show_plan("n=60000 batch=150 z=1.3 epochs=15: q=0.0025 steps=6000 delta=1e-5 "
              "[published 0.7242234026109595 at order 19]", Fraction(150, 60000), Fraction(13, 10), 6000, 1e-5)
    show_plan("n=100000 batch=100 z=1.0 epochs=30: q=0.001 steps=30000 delta=1e-7 "
              "[published 1.4154988495444842 at order 13]", Fraction(100, 100000), 1, 30000, 1e-7)
    print("\n== TF-Privacy tutorials/README.md (MNIST, 60000 examples, batch 256, noise multiplier 1.12, "
          "delta = 1e-5): published eps 1.00 after 1 epoch, 1.04 after 2, 2.92 after 60, with the classical "
          "conversion of the time; steps = epochs * 60000 // 256 ==")
    for epochs in (1, 2, 60):
        steps = epochs * 60000 // 256
        show_plan("epochs = %d, steps = %d" % (epochs, steps), Fraction(256, 60000), Fraction(112, 100), steps, 1e-5)
    print("(the same with noise multiplier 1.1, 14063 = ceil(60 * 60000 / 256) steps, for comparison)")
    show_plan("z = 1.1, steps = 14063", Fraction(256, 60000), Fraction(11, 10), 14063, 1e-5)

    print("\n== planning examples for the aggregator's account command ==")
    show_plan("gaussian sigma=1 C=1 steps=1 delta=1e-5", 1, 1, 1, 1e-5)
    show_plan("gaussian sigma=4 C=1 steps=100 delta=1e-6", 1, 4, 100, 1e-6)
    show_plan("gaussian sigma=2 C=0.5 (z=4) steps=100 delta=1e-6", 1, 4, 100, 1e-6)
    show_plan("gaussian sigma=0.8 C=1 q=0.01 steps=5000 delta=1e-6", Fraction(1, 100), Fraction(4, 5), 5000, 1e-6)
    print("laplace/rr eps=0.1 steps=10: basic composition = 1 (exactly 10 * 0.1)")
    print("laplace eps=0.1 steps=1000 delta'=1e-5: basic = 100, advanced = %.15g" % advanced(1000, 0.1, 1e-5))
    print("laplace eps=0.5 steps=10 delta'=1e-5: basic = 5, advanced = %.15g" % advanced(10, 0.5, 1e-5))

    print("\n== discrete Gaussian, Poisson-sampled: Zhu-Wang general upper bound at integer orders ==")
    for q, z, a in (("0.1", "1", 3), ("0.01", "2.5", 50), ("0.5", "2", 10), ("0.0025", "1.3", 19)):
        print("q=%-6s z=%-3s alpha=%-2d one step: zw=%.17g  (continuous MTZ exact sum %.17g)"
              % (q, z, a, float(rdp_zw_exact(q, z, a)), float(rdp_int_exact(q, z, a))))
    for label, q, z, steps, delta in (
            ("z=1 q=0.1 steps=100 delta=1e-5", Fraction(1, 10), 1, 100, 1e-5),
            ("z=1.3 q=0.0025 steps=6000 delta=1e-5 (TF-Privacy DP-SGD example)", Fraction(1, 400),
             Fraction(13, 10), 6000, 1e-5),
            ("z=0.8 q=0.01 steps=5000 delta=1e-6 (account planning example)", Fraction(1, 100),
             Fraction(4, 5), 5000, 1e-6),
            ("z=5 q=0.01 steps=10 delta=1e-6 (best order large)", Fraction(1, 100), 5, 10, 1e-6)):
        e, a = discrete_plan(q, z, steps, delta, eps_cks)
        (ec, ac), _ = gaussian_plan(q, z, steps, delta)
        print("%s\n    discrete  cks eps = %.17g at order %s\n    continuous cks eps = %.17g at order %s"
              % (label, e, order_str(a), ec, order_str(ac)))

    e, a = discrete_plan(Fraction(256, 60000), Fraction(112, 100), 14062, 1e-5, eps_classical)
    print("MNIST tutorial, discrete, classical conversion (account CLI test): z=1.12 q=256/60000 steps=14062 "
          "delta=1e-5: eps = %.17g at order %s" % (e, order_str(a)))

    print("\n== closed forms ==")
    v, rho = eps_opt_seed001(10, 0.5, 0.01, 1e-5)
    print("seed 001 eps_opt J=10 eps_i=0.5 delta=0.01 delta_r=1e-5: rho = %.17g, eps_opt = %.17g" % (rho, v))
    print("zcdp_to_dp rho=0.5 delta=1e-5: %.17g" % (Decimal("0.5") + 2 * (Decimal("0.5") * Decimal(100000).ln()).sqrt()))
    print("advanced k=100 eps=0.1 delta'=1e-5: %.17g" % advanced(100, 0.1, 1e-5))

    if check:
        print("\n== --check: quadrature vs exact decimal sum at integer orders ==")
        worst = 0.0
        for q, z in (("0.0025", "1.3"), ("0.01", "1.1"), ("0.1", "0.8"), ("0.5", "2"), ("0.9", "1"), ("1e-4", "3")):
            for a in (2, 3, 7, 10, 11, 20, 63):
                ex = float(rdp_int_exact(q, z, a))
                qu = rdp_frac_quad(float(q), float(z), a)
                rel = abs(qu - ex) / ex
                worst = max(worst, rel)
                print("q=%-6s z=%-3s alpha=%-2d exact=%.15g quad=%.15g rel=%.1e" % (q, z, a, ex, qu, rel))
        print("worst relative difference: %.2e" % worst)
        if worst > 1e-10:
            sys.exit(1)

        print("\n== --check: the ZW bound is above the exact 1-D subsampled discrete Gaussian divergence ==")
        for q, z in (("0.01", "0.8"), ("0.1", "1"), ("0.5", "2"), ("0.05", "0.5")):
            for a in (2, 3, 5, 10, 20):
                bound = float(rdp_zw_exact(q, z, a))
                exact = renyi_subsampled_discrete_gaussian_1d(q, z, a)
                print("q=%-4s z=%-3s alpha=%-2d exact 1-D=%.12g zw bound=%.12g" % (q, z, a, exact, bound))
                if not exact <= bound * (1 + 1e-12):
                    print("FAILED: the bound is below the divergence")
                    sys.exit(1)


if __name__ == "__main__":
    main()
