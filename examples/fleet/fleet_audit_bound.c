/* dprec-fleet — the audit's statistics: the one-run bound of Steinke, Nasr, Jagielski (2023), Clopper-Pearson bounds
 * and the two-world bound (fleet_audit_bound.h states each with its source).
 *
 * Every binomial probability is summed from its terms in log space (lgamma), so that tails far below 1e-300 and counts
 * of millions stay exact to about 1e-12 relative; nothing here approximates a binomial by a normal. A bound is found by
 * bisection that keeps the side that has been tested: the one-run bound returned has a p-value at most beta itself, a
 * Clopper-Pearson end is on the conservative side of its equation. tests/audit_reference.py recomputes every value in
 * exact rational arithmetic, and tests/test_audit_bound.c holds this file to it. */
#include "fleet_audit_bound.h"

#include <math.h>
#include <stdlib.h>

/* log P[Bin(n, p) = k], from log p and log(1 - p) */
static double log_pmf(uint64_t n, uint64_t k, double lp, double lq) {
    double c = lgamma((double)n + 1.0) - lgamma((double)k + 1.0) - lgamma((double)(n - k) + 1.0);
    double a = k > 0 ? (double)k * lp : 0.0, b = n > k ? (double)(n - k) * lq : 0.0;
    return c + a + b;
}

/* log of sum_{k = lo..hi} P[Bin(n, p) = k] (-inf when empty or every term is 0) */
static double log_sum_pmf(uint64_t n, uint64_t lo, uint64_t hi, double lp, double lq) {
    if (lo > hi || lo > n) return -INFINITY;
    if (hi > n) hi = n;
    double mx = -INFINITY;
    for (uint64_t k = lo; k <= hi; k++) {
        double t = log_pmf(n, k, lp, lq);
        if (t > mx) mx = t;
    }
    if (!(mx > -INFINITY)) return -INFINITY;
    double s = 0.0;
    for (uint64_t k = lo; k <= hi; k++) s += exp(log_pmf(n, k, lp, lq) - mx);
    return mx + log(s);
}

/* log p and log(1 - p) of p = e^eps / (1 + e^eps), without cancellation at large eps */
static void rr_logs(double eps, double *lp, double *lq) {
    double t = log1p(exp(-eps));
    *lp = -t;
    *lq = -eps - t;
}

double fleet_audit_one_run_pvalue(uint64_t m, uint64_t r, uint64_t v, double eps, double delta) {
    if (v > r || r > m || !(eps >= 0.0) || !(delta >= 0.0)) return 1.0;
    if (v == 0) return 1.0;
    double lp, lq;
    rr_logs(eps, &lp, &lq);
    double p = exp(log_sum_pmf(r, v, r, lp, lq)); /* P[Bin(r, q) >= v] */
    if (delta > 0.0) {
        /* alpha = max_i P[v - i <= W < v] / i, the running sum taken from k = v - 1 down */
        double alpha = 0.0, s = 0.0;
        for (uint64_t i = 1; i <= v; i++) {
            s += exp(log_pmf(r, v - i, lp, lq));
            if (s / (double)i > alpha) alpha = s / (double)i;
        }
        p += 2.0 * (double)m * delta * alpha;
    }
    return p < 1.0 ? p : 1.0;
}

double fleet_audit_one_run_bound(uint64_t m, uint64_t r, uint64_t v, double delta, double beta) {
    if (!(beta > 0.0 && beta < 1.0) || v == 0 || v > r || r > m) return 0.0;
    if (!(fleet_audit_one_run_pvalue(m, r, v, 0.0, delta) <= beta)) return 0.0;
    double lo = 0.0, hi = 1.0;
    while (fleet_audit_one_run_pvalue(m, r, v, hi, delta) <= beta) { /* v = r right guesses: q^r <= beta holds up to
                                                                       * eps about log(r / log(1 / beta)) */
        lo = hi;
        hi *= 2.0;
        if (hi > 1e6) return lo;
    }
    while (hi - lo > 1e-10) {
        double mid = 0.5 * (lo + hi);
        if (fleet_audit_one_run_pvalue(m, r, v, mid, delta) <= beta) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* log P[Bin(n, p) <= k] */
static double log_cdf(uint64_t k, uint64_t n, double p) {
    if (p <= 0.0) return 0.0;
    if (p >= 1.0) return k >= n ? 0.0 : -INFINITY;
    return log_sum_pmf(n, 0, k, log(p), log1p(-p));
}

double fleet_audit_cp_upper(uint64_t k, uint64_t n, double a) {
    if (n == 0 || k >= n) return 1.0;
    double la = log(a), lo = (double)k / (double)n, hi = 1.0;
    /* P[Bin(n, p) <= k] falls as p grows: keep cdf(hi) <= a, so that hi is never below the exact end */
    for (int it = 0; it < 200 && hi - lo > 1e-13; it++) {
        double mid = 0.5 * (lo + hi);
        if (log_cdf(k, n, mid) <= la) hi = mid;
        else lo = mid;
    }
    return hi;
}

double fleet_audit_cp_lower(uint64_t k, uint64_t n, double a) {
    if (n == 0 || k == 0) return 0.0;
    if (k > n) k = n;
    /* by symmetry: the lower end for k of n is 1 - the upper end for n - k of n */
    return 1.0 - fleet_audit_cp_upper(n - k, n, a);
}

double fleet_audit_two_world_bound(uint64_t fp, uint64_t n_out, uint64_t fn, uint64_t n_in, double delta,
                                   double confidence) {
    if (n_out == 0 || n_in == 0 || !(confidence > 0.0 && confidence < 1.0)) return 0.0;
    double a = (1.0 - confidence) / 2.0;
    double fpr = fleet_audit_cp_upper(fp, n_out, a), fnr = fleet_audit_cp_upper(fn, n_in, a);
    double best = 0.0;
    if (fpr > 0.0 && 1.0 - delta - fnr > 0.0) best = fmax(best, log((1.0 - delta - fnr) / fpr));
    if (fnr > 0.0 && 1.0 - delta - fpr > 0.0) best = fmax(best, log((1.0 - delta - fpr) / fnr));
    return best;
}

/* ---- the guesses ------------------------------------------------------------------------------------------------ */

typedef struct ranked {
    double s;
    uint32_t i;
} ranked;

static int by_score(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return x->i < y->i ? -1 : (x->i > y->i);
}

int fleet_audit_best_guess(const double *score, const unsigned char *in, uint32_t n, double delta, double confidence,
                           fleet_audit_guess *out) {
    static const double fractions[] = FLEET_AUDIT_GUESS_FRACTIONS;
    const size_t nf = sizeof fractions / sizeof fractions[0];
    out->k = out->guesses = out->correct = 0;
    out->tried = 0;
    out->bound = 0.0;
    if (n < 2) return 0;
    ranked *rk = malloc(sizeof *rk * n);
    if (rk == NULL) return -1;
    for (uint32_t i = 0; i < n; i++) {
        rk[i].s = isfinite(score[i]) ? score[i] : 0.0; /* a canary without a score ranks as 0 */
        rk[i].i = i;
    }
    qsort(rk, n, sizeof *rk, by_score);
    uint64_t ks[sizeof fractions / sizeof fractions[0]];
    unsigned nk = 0;
    for (size_t f = 0; f < nf; f++) {
        uint64_t k = (uint64_t)floor(fractions[f] * (double)n);
        if (k == 0 || (nk > 0 && ks[nk - 1] == k)) continue;
        ks[nk++] = k;
    }
    out->tried = nk;
    double beta = (1.0 - confidence) / (double)(nk > 0 ? nk : 1);
    for (unsigned t = 0; t < nk; t++) {
        uint64_t k = ks[t], right = 0;
        for (uint64_t j = 0; j < k; j++) right += in[rk[j].i] ? 1u : 0u;            /* the top k, guessed in */
        for (uint64_t j = 0; j < k; j++) right += in[rk[n - 1 - j].i] ? 0u : 1u;    /* the bottom k, guessed out */
        double b = fleet_audit_one_run_bound(n, 2 * k, right, delta, beta);
        if (t == 0 || b > out->bound) {
            out->k = k;
            out->guesses = 2 * k;
            out->correct = right;
            out->bound = b;
        }
    }
    free(rk);
    return 0;
}
