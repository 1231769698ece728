/* dprec-fleet internals: the statistics of the privacy audit (fleet_audit.c), apart from the fleet so that a unit test
 * (tests/test_audit_bound.c) can hold them to independent values (tests/audit_reference.py). Host code, not API.
 *
 * Two audits, two bounds:
 *   - one run (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023, arXiv 2305.08846):
 *     m canaries, each in the run with probability 1/2 by an independent coin; the adversary guesses r of the coins
 *     from what it sees and gets v right. Under the null hypothesis "the mechanism is (eps, delta)-DP" the paper's main
 *     theorem bounds the chance of v or more right guesses; eps is rejected where that chance is at most beta, and
 *     the lower bound is the largest eps rejected;
 *   - two worlds (Jagielski, Ullman, Oprea, NeurIPS 2020; Nasr et al., IEEE S&P 2021): T runs with one canary and T
 *     without; an attacker with a fixed threshold has a false-positive rate FPR and a false-negative rate FNR, which
 *     (eps, delta)-DP bounds by FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta (Kairouz, Oh,
 *     Viswanath 2015, Thm. 2.1); with Clopper-Pearson upper bounds on both rates this gives eps >= log((1 - delta -
 *     FNR+) / FPR+) and the same with the rates exchanged. */
#ifndef DPREC_FLEET_AUDIT_BOUND_H
#define DPREC_FLEET_AUDIT_BOUND_H

#include <stdint.h>

/* The main theorem of Steinke, Nasr, Jagielski 2023 (Sec. 3, its (eps, delta) form, as the paper also computes it in
 * code in its appendix): for an (eps, delta)-DP mechanism, m canaries, at most r guesses of which W are right,
 *   P[W >= v] <= P[Bin(r, q) >= v] + 2 m delta alpha,  q = e^eps / (1 + e^eps),
 *   alpha = max_{i = 1..v} P[v - i <= Bin(r, q) < v] / i.
 * Returns that bound (at most 1): the p-value of v right guesses out of r under (eps, delta)-DP. 0 <= v <= r <= m. */
double fleet_audit_one_run_pvalue(uint64_t m, uint64_t r, uint64_t v, double eps, double delta);

/* The largest eps (to 1e-9) whose p-value above is at most beta: the mechanism is not (eps', delta)-DP for any eps' <= it,
 * with confidence 1 - beta (an (eps', delta)-DP mechanism is (eps, delta)-DP for every eps >= eps', so rejecting eps
 * rejects every smaller one). The bisection keeps the invariant p(lo) <= beta, so the value returned has been tested
 * itself: it never overstates, whether or not the p-value is monotone in eps. 0 when even eps = 0 is not rejected. */
double fleet_audit_one_run_bound(uint64_t m, uint64_t r, uint64_t v, double delta, double beta);

/* Clopper-Pearson (1934): for k successes in n trials, the upper end p+ with P[Bin(n, p+) <= k] = a (1 if k = n), and
 * the lower end p- with P[Bin(n, p-) >= k] = a (0 if k = 0). Each is a one-sided bound at confidence 1 - a; the two at
 * a = 0.025 are the two-sided 95% interval. To 1e-12 absolute. */
double fleet_audit_cp_upper(uint64_t k, uint64_t n, double a);
double fleet_audit_cp_lower(uint64_t k, uint64_t n, double a);

/* The two-world lower bound: fp false positives in n_out runs without the canary, fn false negatives in n_in runs with
 * it; each rate's Clopper-Pearson upper end at one-sided level (1 - confidence) / 2 (both hold together with the
 * confidence asked, by the union bound), and eps >= max(log((1 - delta - FNR+) / FPR+), log((1 - delta - FPR+) /
 * FNR+)), at least 0. */
double fleet_audit_two_world_bound(uint64_t fp, uint64_t n_out, uint64_t fn, uint64_t n_in, double delta,
                                   double confidence);

/* The one-run audit's guesses (fleet_audit.c; docs/privacy.md "Empirical audit"). The canaries are ranked by score,
 * highest first (ties: the lower index first, a rule that never looks at a coin); for each k of the fixed list
 * FLEET_AUDIT_GUESS_FRACTIONS (k = floor(f n), duplicates and 0 dropped) the k highest are guessed in and the k lowest
 * out, the rest abstained, and the bound above is computed at beta = (1 - confidence) / (the number of k tried): by the
 * union bound all of them hold together at the confidence asked, so the largest may be reported. in[i]: canary i's
 * coin (1: in), read only to count the right guesses. *out gets the best k and its bound (k = 0, bound 0 with fewer
 * than two canaries). */
#define FLEET_AUDIT_GUESS_FRACTIONS {1.0 / 64, 1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2}
typedef struct fleet_audit_guess {
    uint64_t k;        /* guesses of each side */
    uint64_t guesses;  /* 2 k */
    uint64_t correct;
    unsigned tried;    /* how many k were tried (the Bonferroni divisor) */
    double bound;
} fleet_audit_guess;
int fleet_audit_best_guess(const double *score, const unsigned char *in, uint32_t n, double delta, double confidence,
                           fleet_audit_guess *out);

#endif /* DPREC_FLEET_AUDIT_BOUND_H */
