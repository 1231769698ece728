/* dprec internal (shared with the aggregator) — the privacy accountant.
 *
 * Tracks the composition of the mechanisms a job runs and converts it to (epsilon, delta):
 *   - pure epsilon-DP steps (randomized response, Laplace): basic composition (sum), and advanced
 *     composition (Dwork, Rothblum, Vadhan 2010, Thm III.3) as an alternative;
 *   - Renyi DP (Mironov 2017) of the Gaussian mechanism, alpha * Delta^2 / (2 sigma^2), and of the
 *     Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019), integer and fractional orders;
 *   - the discrete Gaussian (Canonne, Kamath, Steinke 2020: the same alpha * Delta^2 / (2 sigma^2)) and, under
 *     Poisson subsampling, the general upper bound of Zhu, Wang 2019 for any mechanism with that RDP curve, at
 *     integer orders only (+inf at the fractional ones);
 *   - rho-zCDP (Bun, Steinke 2016): RDP alpha * rho;
 * over the fixed order grid DPREC_RDP_ORDERS (1.1, 1.2, ..., 10.9, 11, 12, ..., 63, 72, 80, 88, 96, 112, 128,
 * 144, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024),
 * and converts RDP to (epsilon, delta) by
 *   epsilon = min_alpha  r(alpha) + log1p(-1/alpha) - log(delta * alpha) / (alpha - 1)
 * (Canonne, Kamath, Steinke 2020, Prop. 12; Balle et al. 2020, Thm. 21), or classically by
 *   epsilon = min_alpha  r(alpha) + log(1/delta) / (alpha - 1)   (Mironov 2017, Prop. 3).
 * Pure-epsilon steps enter the RDP curve as r(alpha) = min(eps, alpha eps^2 / 2) per step (eps-DP implies
 * (eps^2/2)-zCDP, Bun-Steinke Prop. 1.4) when a job mixes them with Gaussian steps.
 *
 * Composition is only meaningful if every step is private with respect to the same neighbouring relation and
 * the same unit (e.g. add/remove one rating, or one user); the subsampled-Gaussian RDP of Mironov-Talwar-Zhang
 * and the Zhu-Wang bound are for add/remove-one neighbours under Poisson sampling at rate q.
 *
 * Every int function returns DPREC_OK or a negative dprec_status (dprec/status.h): INVALID_ARGUMENT for a
 * NULL pointer, steps = 0, or a value outside its stated range (NaN included). An add_* call that fails leaves
 * the accountant unchanged. Values too large for a double become +inf (a valid, if useless, bound), never NaN.
 * common/accountant.c cites the source of every formula; tests/accountant_reference.py recomputes them. */
#ifndef DPREC_ACCOUNTANT_H
#define DPREC_ACCOUNTANT_H

#include <stddef.h>
#include <stdint.h>
#include "config_check.h"

#define DPREC_RDP_ORDERS 171 /* 99 orders 1.1..10.9, 53 orders 11..63, then 19 integers 72 .. 1024 */

/* The order grid, ascending; NaN for an index outside [0, DPREC_RDP_ORDERS). */
double dprec_rdp_order(int index);

typedef struct dprec_accountant {
    double rdp[DPREC_RDP_ORDERS]; /* accumulated RDP epsilon at each order */
    double pure_eps;              /* sum of pure epsilon over pure steps */
    double pure_delta;            /* sum of delta over approximate-DP steps added with add_approx */
    double approx_eps;            /* sum of epsilon over approximate-DP steps added with add_approx */
    double max_step_eps;          /* largest single pure step (advanced composition) */
    uint64_t pure_steps;
    uint64_t rdp_steps;
    int has_approx;               /* an (eps, delta>0) step was added: only basic composition applies */
} dprec_accountant;

void dprec_accountant_init(dprec_accountant *a);

/* `steps` (>= 1) compositions of an epsilon-DP mechanism (epsilon > 0). */
int dprec_accountant_add_pure(dprec_accountant *a, double epsilon, uint64_t steps);
/* `steps` compositions of an (epsilon, delta)-DP mechanism, epsilon >= 0, 0 < delta < 1: accounted by basic
 * composition only (it has no RDP curve). */
int dprec_accountant_add_approx(dprec_accountant *a, double epsilon, double delta, uint64_t steps);
/* `steps` compositions of the Gaussian mechanism with noise multiplier z = sigma / sensitivity > 0, each
 * applied to a Poisson sample at rate q in (0, 1] (q = 1: no subsampling). Fails, adding nothing, if any order
 * of the grid fails in dprec_rdp_subsampled_gaussian. */
int dprec_accountant_add_gaussian(dprec_accountant *a, double noise_multiplier, double q, uint64_t steps);
/* The same for the discrete Gaussian (common/noise.c): q = 1 is its zCDP curve alpha / (2 z^2) at every order;
 * q < 1 is the Zhu-Wang general upper bound for Poisson subsampling at the integer orders of the grid and +inf
 * at the fractional ones (dprec_rdp_subsampled_discrete_gaussian). */
int dprec_accountant_add_discrete_gaussian(dprec_accountant *a, double noise_multiplier, double q, uint64_t steps);
/* `steps` compositions of a rho-zCDP mechanism (rho > 0). */
int dprec_accountant_add_zcdp(dprec_accountant *a, double rho, uint64_t steps);

typedef enum dprec_conversion {
    DPREC_CONVERSION_CKS = 0,      /* the tighter Canonne-Kamath-Steinke / Balle et al. conversion (default) */
    DPREC_CONVERSION_CLASSICAL = 1 /* Mironov 2017 Prop. 3 */
} dprec_conversion;

/* The (epsilon, delta) guarantee of everything added, 0 < delta < 1. order may be NULL.
 *  - No Gaussian or zCDP step (pure and/or approximate steps only): basic composition, epsilon = the sum of
 *    all epsilons, *order = 0 (no order applies). The guarantee is (epsilon, sum of deltas), so INVALID_ARGUMENT
 *    if delta < pure_delta; for pure-only accountants delta is only checked to be in (0, 1).
 *  - Otherwise: the minimum over the grid of the chosen RDP conversion, clamped at 0, *order the minimizing
 *    alpha (the smallest on a tie; 0 if every order gives +inf, and then epsilon = +inf). Pure steps are on the RDP curve at min(eps, alpha eps^2/2) <= eps, so this
 *    is never looser than adding their sum to the RDP part. With approximate steps too, the RDP part is
 *    converted at delta - pure_delta (INVALID_ARGUMENT unless delta > pure_delta) and approx_eps is added
 *    (basic composition), so the total delta is still the delta asked for. */
int dprec_accountant_epsilon(const dprec_accountant *a, double delta, dprec_conversion method, double *epsilon,
                             double *order);

/* Advanced composition of the pure steps added (all assumed at max_step_eps): for k steps of eps-DP and
 * slack delta' in (0, 1): eps_total = sqrt(2 k ln(1/delta')) eps + k eps (e^eps - 1), delta_total = delta'.
 * DPREC_ERR_STATE if approximate, Gaussian or zCDP steps were added (the theorem is applied to pure steps
 * only here). No pure step: epsilon = 0. */
int dprec_accountant_advanced(const dprec_accountant *a, double delta_slack, double *epsilon);

/* RDP of one Poisson-subsampled Gaussian step at order alpha in (1, 65536] (integer or fractional), noise
 * multiplier z > 0, rate q in (0, 1]; exposed for tests and the planning command. INVALID_ARGUMENT also if the
 * fractional-order series does not converge in 2,000,000 terms (only at extreme parameters: q = 1/2 needs
 * about 20,000 at z = 100 and 170,000 at z = 1e5). */
int dprec_rdp_subsampled_gaussian(double q, double noise_multiplier, double alpha, double *rdp);

/* RDP bound of one Poisson-subsampled discrete Gaussian step at order alpha in (1, 65536], z > 0, q in (0, 1]:
 * q = 1: alpha / (2 z^2) (Canonne, Kamath, Steinke 2020); q < 1: min(alpha / (2 z^2), the general upper bound
 * of Zhu, Wang 2019 for any mechanism with that RDP curve) at integer alpha, +inf at fractional alpha (the
 * bound has no fractional form). Never below dprec_rdp_subsampled_gaussian at the same arguments. */
int dprec_rdp_subsampled_discrete_gaussian(double q, double noise_multiplier, double alpha, double *rdp);

/* Test hook, not for accounting: log A_alpha (RDP = log A_alpha / (alpha - 1)) by the fractional-order series
 * of Mironov-Talwar-Zhang at any alpha in (1, 65536], integers included, 0 < q < 1, so that a test can check
 * it against the integer-order sum that dprec_rdp_subsampled_gaussian uses at integer orders. */
int dprec_rdp_log_a_fractional_series(double q, double noise_multiplier, double alpha, double *log_a);

/* Seed 001's closed form (Mugdho, Imtiaz): J steps of the classical Gaussian mechanism at eps_i each,
 * sigma = Delta/eps_i * sqrt(2 ln(1.25/delta)), total
 *   eps_opt = J eps_i^2 / (4 ln(1.25/delta)) + 2 sqrt(J eps_i^2 ln(1/delta_r) / (4 ln(1.25/delta))),
 * i.e. zCDP rho = J eps_i^2 / (4 ln(1.25/delta)) converted by rho + 2 sqrt(rho ln(1/delta_r)).
 * The guarantee is (eps_opt, delta_r). NaN if steps = 0, eps_i <= 0 or a delta is outside (0, 1). */
double dprec_eps_opt_seed001(uint64_t steps, double eps_i, double delta, double delta_r);

/* rho-zCDP to (epsilon, delta) by Bun-Steinke Prop. 1.3: rho + 2 sqrt(rho ln(1/delta)), rho >= 0.
 * NaN if rho is negative or not finite or delta is outside (0, 1): compare as !(eps <= budget). */
double dprec_zcdp_to_dp(double rho, double delta);

/* One round's mechanism, for the budget gate below. */
typedef enum dprec_step_kind {
    DPREC_STEP_PURE = 0,     /* epsilon-DP */
    DPREC_STEP_APPROX = 1,   /* (epsilon, delta)-DP */
    DPREC_STEP_GAUSSIAN = 2, /* Gaussian, noise multiplier, Poisson rate q */
    DPREC_STEP_ZCDP = 3      /* rho-zCDP */
} dprec_step_kind;

typedef struct dprec_step {
    dprec_step_kind kind;
    double epsilon, delta;   /* PURE, APPROX */
    double noise_multiplier; /* GAUSSIAN */
    double q;                /* GAUSSIAN: sampling rate in (0, 1] */
    double rho;              /* ZCDP */
    uint64_t steps;
    /* GAUSSIAN: 1 when the noise is the discrete Gaussian (common/noise.c samples every Gaussian so). The
     * Poisson-subsampled bound is then taken at integer orders only, by a bound that holds for any mechanism
     * with the discrete Gaussian's RDP (accountant.c); 0 is the continuous Gaussian of Mironov-Talwar-Zhang. */
    int discrete;
} dprec_step;

/* Adds a step of any kind (the matching dprec_accountant_add_* call). */
int dprec_accountant_add_step(dprec_accountant *a, const dprec_step *step);

/* The aggregator's gate before it opens a round: adds `step` only if the job's guarantee afterwards is within
 * (epsilon_budget, delta); otherwise returns DPREC_ERR_BUDGET_EXCEEDED and leaves the accountant unchanged.
 * *epsilon_after (may be NULL) gets the epsilon the job would have after the step, either way. */
int dprec_accountant_try_add(dprec_accountant *a, const dprec_step *step, double epsilon_budget, double delta,
                             dprec_conversion method, double *epsilon_after);

#endif /* DPREC_ACCOUNTANT_H */
