/* dprec — the math of the `gauss-gd` protocol, shared by the device and the aggregator (common/protocols/gauss.h). */
#include <math.h>

#include "accountant.h"
#include "gauss.h"

double dprec_gauss_residual(dprec_unit unit, const float *u, uint32_t d, const float *row, float value, float mu,
                            double tau) {
    /* the residual is taken with the fitted (unclipped) u, as seed 001 forms V^ = X Theta^T before clipping */
    double pred = (double)mu + (double)row[d];
    for (uint32_t k = 0; k < d; k++) pred += (double)u[k] * row[k];
    double e = pred - (double)value;
    if (unit == DPREC_UNIT_RATING) e = e > tau ? tau : (e < -tau ? -tau : e);
    return e;
}

void dprec_gauss_u_grad_add(const float *u, uint32_t d, const float *row, float value, float mu, double *g) {
    double e = (double)mu + (double)row[d] - (double)value;
    for (uint32_t k = 0; k < d; k++) e += (double)u[k] * row[k];
    for (uint32_t k = 0; k < d; k++) g[k] += e * (double)row[k];
}

void dprec_gauss_u_apply(float *u, uint32_t d, const double *g, double lr, double lambda) {
    for (uint32_t k = 0; k < d; k++) u[k] = (float)((double)u[k] - lr * (g[k] + lambda * (double)u[k]));
}

void dprec_gauss_scales(dprec_unit unit, const float *u, uint32_t d, double coef_sq_sum, double clip, double *xs,
                        double *cs) {
    double xn2 = 1.0; /* the bias coordinate */
    for (uint32_t k = 0; k < d; k++) xn2 += (double)u[k] * u[k];
    double xn = sqrt(xn2);
    *xs = 1.0;
    *cs = 1.0;
    if (unit == DPREC_UNIT_RATING) {
        if (xn > clip) *xs = clip / xn; /* seed 001 Alg. 1: theta_j / max(1, ||theta_j|| / C) */
    } else {
        double g = xn * sqrt(coef_sq_sum); /* ||x coef^T||_F = ||x|| ||coef|| for a rank-one matrix */
        if (g > clip) *cs = clip / g;
    }
}

int dprec_gauss_contribution(dprec_unit unit, const float *u, uint32_t d, const float *rows, const float *values,
                             uint32_t n, float mu, double clip, double tau, float *x, float *coef) {
    if (u == NULL || x == NULL || (n > 0 && (rows == NULL || values == NULL || coef == NULL)) || !(clip > 0.0) ||
        !isfinite(clip) || !(tau > 0.0) || !isfinite(tau) || (unit != DPREC_UNIT_RATING && unit != DPREC_UNIT_USER))
        return DPREC_ERR_INVALID_ARGUMENT;
    double cn2 = 0.0, xs, cs;
    for (uint32_t i = 0; i < n; i++) {
        double e = dprec_gauss_residual(unit, u, d, rows + (size_t)i * (d + 1u), values[i], mu, tau);
        coef[i] = (float)e;
        cn2 += e * e;
    }
    dprec_gauss_scales(unit, u, d, cn2, clip, &xs, &cs);
    for (uint32_t k = 0; k < d; k++) x[k] = (float)((double)u[k] * xs);
    x[d] = (float)xs;
    for (uint32_t i = 0; i < n; i++) coef[i] = (float)((double)coef[i] * cs);
    /* float rounding may leave the norms a few ulps above C; the aggregator re-clips in double and accounts
     * for the bound it enforces, so the device's rounding never matters for privacy */
    for (uint32_t k = 0; k <= d; k++)
        if (!isfinite(x[k])) return DPREC_ERR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(coef[i])) return DPREC_ERR_INVALID_ARGUMENT;
    return DPREC_OK;
}

double dprec_gauss_sigma_seed001(double tau, double clip, double eps_i, double delta) {
    if (!(tau > 0.0) || !(clip > 0.0) || !(eps_i > 0.0 && eps_i < 1.0) || !(delta > 0.0 && delta < 1.0) ||
        !isfinite(tau) || !isfinite(clip))
        return NAN;
    /* Mugdho-Imtiaz Alg. 1 line 7 / Thm. 1 (Dwork-Roth 2014 Thm. A.1): Delta_2 = tau C (their eq. (6)) */
    return tau * clip / eps_i * sqrt(2.0 * log(1.25 / delta));
}

/* epsilon (CKS conversion) of `steps` Poisson-subsampled discrete-Gaussian steps, the mechanism gauss-gd runs
 * (common/noise.c) and the device charges; +inf on failure (treated as "does not fit") */
static double eps_of(double z, double q, uint64_t steps, double delta) {
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    double e = INFINITY;
    if (dprec_accountant_add_discrete_gaussian(&acc, z, q, steps) != DPREC_OK) return INFINITY;
    if (dprec_accountant_epsilon(&acc, delta, DPREC_CONVERSION_CKS, &e, NULL) != DPREC_OK) return INFINITY;
    return e;
}

int dprec_gauss_noise_multiplier(double epsilon, double delta, uint64_t steps, double q, double *z) {
    if (z == NULL || !(epsilon > 0.0) || !isfinite(epsilon) || !(delta > 0.0 && delta < 1.0) || steps == 0 ||
        !(q > 0.0 && q <= 1.0))
        return DPREC_ERR_INVALID_ARGUMENT;
    double lo = 0.3, hi = 1e6; /* eps is decreasing in z: find the smallest z with eps(z) <= epsilon */
    if (!(eps_of(hi, q, steps, delta) <= epsilon)) return DPREC_ERR_BUDGET_EXCEEDED;
    if (eps_of(lo, q, steps, delta) <= epsilon) {
        *z = lo;
        return DPREC_OK;
    }
    /* bisection on log z: the invariant is eps(lo) > epsilon >= eps(hi); hi is returned, so the result fits */
    while (hi / lo > 1.0 + 1e-6) {
        double mid = sqrt(lo * hi);
        if (eps_of(mid, q, steps, delta) <= epsilon) hi = mid;
        else lo = mid;
    }
    *z = hi;
    return DPREC_OK;
}
