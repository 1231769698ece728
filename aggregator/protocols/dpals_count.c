/* dprec aggregator — dpals's bias model with each item's count integrated out (docs/privacy.md "The private bias
 * model", "The count posterior"; agg_protocol.h declares these two for dpals.c and the tests).
 *
 * At the statistics' d = 1 (the bias model, `bias`, and `dpals` when the population rule chooses d = 1) an item's
 * released statistics are its weighted count and its right-hand side, both with the noise the aggregator adds:
 *     ghat = g + e_g,  e_g ~ N(0, sigma_g^2);    h = g s + e_r + e_h,  Var e_r = lambda tau^2 g,  Var e_h = kappa tau^2,
 * s ~ N(0, tau^2) the item's coefficient (dpals.c's head: lambda = sigma_r^2 / tau^2, kappa = sigma_h^2 / tau^2). Given
 * g, h ~ N(0, tau^2 (g^2 + lambda g + kappa)) and the posterior mean is E[s | g, h] = g h / (g^2 + lambda g + kappa),
 * which the plug-in solve evaluates at g = ghat. Where the count's noise is as large as the counts themselves (a small
 * population, or a small epsilon: on MovieLens 100K at epsilon 0.5 sigma_g is 5.5 times the mean count) the plug-in
 * divides by noise: a rare item given a large ghat is shrunk to nothing, a popular one given a small ghat is amplified.
 * Here g is integrated out instead:
 *     E[s | ghat, h] = int E[s | g, h] p(g | ghat, h) dg,   p(g | ghat, h) ~ p(g) N(ghat; g, sigma_g^2) N(h; 0, v(g)),
 * v(g) = tau^2 (g^2 + lambda g + kappa): the count's own noisy measurement and what the size of h says about it (a
 * large |h| is unlikely from a rare item) both weigh in. With a well measured count (sigma_g small against g) this is
 * the plug-in solve; with none it is a count-free filter that cannot overshoot: every term is at most
 * |h| / (lambda + 2 sqrt(kappa)), so the average is too.
 *
 * The prior p(g), one for all items, is a gamma distribution fitted by moments across the items' noisy counts (their
 * mean, and their variance less sigma_g^2, the method of moments of empirical Bayes: Efron and Morris, JASA 1973), with
 * two floors where the noise hides the moments: the mean at least sigma_g / sqrt(m), what the statistics can tell from
 * 0, and the spread at least twice the mean (a coefficient of variation of 2: item popularity in rating data is long
 * tailed, 1.5 on MovieLens 100K's weighted counts and 1.9-2.2 on the synthetic apps; a floor that widens the prior lets
 * the item's own statistics decide, and 1 instead of 2 left the small app at epsilon 0.5 above the user mean in one run
 * of three; docs/results.md). Everything here is a function of the noisy statistics and public parameters:
 * post-processing, no privacy cost.
 *
 * The integral is a quadrature: on g in [ghat - 8 sigma_g, ghat + 8 sigma_g] (linear, 161 nodes) when that interval is
 * positive (the count's own likelihood confines the posterior there), else on a log grid from mean 10^-4 to
 * max(100 mean, ghat + 8 sigma_g) (256 nodes, where sigma_g >= ghat / 8 so that the grid's steps resolve the
 * likelihood), with the prior's mass below the grid, lo^a / a for shape a, as one node at g = 0 (E[s | 0, h] = 0).
 * Weights in logs (log-sum-exp). O(1) memory, no allocation. */
#include <math.h>

#include "agg_protocol.h"

#define COUNT_LINEAR_NODES 161
#define COUNT_LOG_NODES 256
#define COUNT_WINDOW 8.0     /* the count likelihood's half-width in sigma_g */
#define COUNT_MIN_CV 2.0     /* the prior's spread at least this times its mean (above) */

void agg_dpals_count_prior_fit(double sum, double sum2, uint32_t m, double sigma_g, agg_dpals_count_prior *out) {
    const double n = m > 0 ? (double)m : 1.0;
    double mean = sum / n, var = sum2 / n - mean * mean - sigma_g * sigma_g;
    const double floor_mean = sigma_g > 0.0 ? sigma_g / sqrt(n) : 1e-9;
    if (!(mean > floor_mean)) mean = floor_mean; /* NaN too */
    const double floor_var = (COUNT_MIN_CV * mean) * (COUNT_MIN_CV * mean);
    if (!(var > floor_var)) var = floor_var;
    out->mean = mean;
    out->var = var;
}

/* The log of the posterior weight of count g (up to a constant), its prior density in the unit of dg. */
static double log_like(double g, double ghat, double sigma_g, double h, double lambda, double kappa, double tau2) {
    const double e = (ghat - g) / sigma_g, v = tau2 * (g * g + lambda * g + kappa);
    return -0.5 * e * e - 0.5 * log(v) - 0.5 * h * h / v;
}

double agg_dpals_count_posterior(const agg_dpals_count_prior *prior, double ghat, double sigma_g, double h,
                                 double lambda, double kappa, double tau2, double *gbar) {
    if (!(sigma_g > 0.0)) { /* an exact count: the plug-in solve */
        const double g = ghat > 0.0 ? ghat : 0.0;
        *gbar = g;
        return g > 0.0 ? g * h / (g * g + lambda * g + kappa) : 0.0;
    }
    const double a = prior->mean * prior->mean / prior->var, theta = prior->var / prior->mean; /* shape, scale */
    double lw_max = -INFINITY;
    /* two passes over the same nodes (the first finds the largest log weight): no arrays, no allocation */
    const int linear = ghat - COUNT_WINDOW * sigma_g > 0.0;
    const int nodes = linear ? COUNT_LINEAR_NODES : COUNT_LOG_NODES;
    double lo, hi, zero_lw = -INFINITY;
    if (linear) {
        lo = ghat - COUNT_WINDOW * sigma_g;
        hi = ghat + COUNT_WINDOW * sigma_g;
    } else {
        lo = log(prior->mean * 1e-4);
        hi = log(fmax(prior->mean * 100.0, ghat + COUNT_WINDOW * sigma_g));
        /* the prior's mass on [0, e^lo], int g^(a-1) dg = e^(a lo) / a, at the likelihood of g = 0 */
        zero_lw = a * lo - log(a) + log_like(0.0, ghat, sigma_g, h, lambda, kappa, tau2);
        lw_max = zero_lw;
    }
    const double step = (hi - lo) / (nodes - 1);
    for (int pass = 0; pass < 2; pass++) {
        double w_sum = 0.0, s_sum = 0.0, g_sum = 0.0;
        if (pass == 1 && !linear) w_sum = exp(zero_lw - lw_max); /* its s and g are 0 */
        for (int i = 0; i < nodes; i++) {
            const double x = lo + step * i, g = linear ? x : exp(x);
            /* the prior g^(a-1) e^(-g / theta) dg; on the log grid dg = g dx */
            const double lw = (linear ? (a - 1.0) * log(g) : a * x) - g / theta +
                              log_like(g, ghat, sigma_g, h, lambda, kappa, tau2);
            if (pass == 0) {
                if (lw > lw_max) lw_max = lw;
                continue;
            }
            const double w = exp(lw - lw_max);
            w_sum += w;
            s_sum += w * g * h / (g * g + lambda * g + kappa);
            g_sum += w * g;
        }
        if (pass == 1) {
            if (!(w_sum > 0.0) || !isfinite(s_sum)) break;
            *gbar = g_sum / w_sum;
            return s_sum / w_sum;
        }
    }
    /* not reached for finite inputs; with non-finite ones nothing is learned */
    *gbar = 0.0;
    return 0.0;
}
