/* dprec internal (shared by the device and the aggregator) — the math of the `gauss-gd` protocol (seed 001,
 * Mugdho & Imtiaz; docs/privacy.md "gauss-gd"): one device's clipped contribution to the item-side gradient,
 * the per-step noise of seed 001, and the noise multiplier that meets a user-level budget.
 *
 * A device's contribution to the gradient of the released item side W = [V | b] (m x (d+1)) is the sparse
 * rank-one matrix G_i = sum_j coef_j e_j x^T, with x = [u_i; 1] (clipped) and coef_j the (clipped) residual
 * mu + b_j + u_i.v_j - r_ij of each rated item j: the gradient of (1/2)(r_ij - mu - x.w_j)^2 with respect to w_j
 * (seed 001 eq. (5), with the bias trick of Koren, Bell, Volinsky 2009). The device sends x and the coefs; the
 * aggregator forms the rows. */
#ifndef DPREC_GAUSS_H
#define DPREC_GAUSS_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/dprec.h"
#include "dprec/privacy.h"

/* Computes the clipped contribution of one device:
 *   unit RATING (seed 001): x = [u; 1] / max(1, ||[u; 1]|| / clip)  (the factor row-clipped to norm C, seed 001
 *     Alg. 1 line 6) and coef_j = clamp(mu + b_j + u.v_j - r_j, -tau, tau) with tau = rating_max - rating_min.
 *     For a fixed x, changing one rating moves one row by |coef - coef'| ||x|| <= tau C (seed 001 eq. (6);
 *     the clamp is 1-Lipschitz and bounds every row by tau C as well).
 *   unit USER: x = [u; 1], coef_j = mu + b_j + u.v_j - r_j, then the coefs are scaled by
 *     1 / max(1, ||x|| ||coef|| / clip), so that ||G_i||_F = ||x|| ||coef|| <= C whatever the user's data
 *     (Abadi et al. 2016 per-example clipping, applied per user as in McMahan et al. 2018, DP-FedAvg).
 * u: d floats; rows: n (d + 1) floats (row k = v_j then b_j of the k-th rated item, sdk/client_priv.h);
 * values: the n ratings. Writes x (d + 1 floats) and coef (n floats). DPREC_ERR_INVALID_ARGUMENT for NULL
 * pointers, clip <= 0, tau <= 0 or a non-finite result. */
int dprec_gauss_contribution(dprec_unit unit, const float *u, uint32_t d, const float *rows, const float *values,
                             uint32_t n, float mu, double clip, double tau, float *x, float *coef);

/* The same in two passes without scratch memory (the device writes straight into its report buffer):
 * dprec_gauss_residual gives coef_j before the user-level scaling (clamped for unit RATING), and
 * dprec_gauss_scales the factors xs (for x = xs [u; 1]) and cs (for the coefs) from ||u|| and sum_j coef_j^2. */
double dprec_gauss_residual(dprec_unit unit, const float *u, uint32_t d, const float *row, float value, float mu,
                            double tau);
void dprec_gauss_scales(dprec_unit unit, const float *u, uint32_t d, double coef_sq_sum, double clip, double *xs,
                        double *cs);

/* Seed 001's gradient step on the user side, for a device that keeps u across rounds (params.u_update
 * "gradient"): seed 001 eq. (4) for one user's row, u <- u - lr (sum_j e_j v_j + lambda u) with
 * e_j = mu + b_j + u.v_j - r_j (unclamped: u never leaves the device, so no clipping is needed for privacy).
 * dprec_gauss_u_grad_add adds e_j v_j for one rated item (row: v_j then b_j) to g (d doubles), with u as it was
 * before the step; dprec_gauss_u_apply then moves u. */
void dprec_gauss_u_grad_add(const float *u, uint32_t d, const float *row, float value, float mu, double *g);
void dprec_gauss_u_apply(float *u, uint32_t d, const double *g, double lr, double lambda);

/* Seed 001's per-step noise standard deviation, sigma = tau C / eps_i * sqrt(2 ln(1.25 / delta)) (Alg. 1 line 7;
 * Dwork-Roth 2014 Thm. A.1 for eps_i < 1). NaN outside tau, clip > 0, 0 < eps_i < 1, 0 < delta < 1. */
double dprec_gauss_sigma_seed001(double tau, double clip, double eps_i, double delta);

/* The smallest noise multiplier z (to a relative 1e-6, rounded up) such that `steps` compositions of the
 * Poisson-subsampled discrete Gaussian at rate q in (0, 1] and multiplier z give at most `epsilon` at `delta`
 * under the accountant (common/accountant.h, dprec_accountant_add_discrete_gaussian, CKS conversion): the inversion
 * of the accountant, with the mechanism the device charges. Searches z in
 * [0.3, 1e6]; DPREC_ERR_BUDGET_EXCEEDED if even z = 1e6 does not fit, DPREC_ERR_INVALID_ARGUMENT for bad
 * arguments. Costs about 40 accountant evaluations (tens of ms). */
int dprec_gauss_noise_multiplier(double epsilon, double delta, uint64_t steps, double q, double *z);

/* Payload size of a gauss-gd report with n rated items (docs/protocol.md): [d u32][n u32] x (d+1 f32)
 * n x [item u32][coef f32]. */
static inline size_t dprec_gauss_payload_size(uint32_t d, uint32_t n) {
    return 8u + 4u * ((size_t)d + 1u) + 8u * (size_t)n;
}

#endif /* DPREC_GAUSS_H */
