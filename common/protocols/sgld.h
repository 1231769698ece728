/* dprec internal (shared by the device and the aggregator) — the arithmetic of the `sgld` protocol: one posterior
 * sample as the private release, with personalized privacy (seed 003: Liu, Wang, Smola, "Fast Differentially Private
 * Matrix Factorization", RecSys 2015; docs/privacy.md "sgld").
 *
 * The mechanism. A trusted curator holds every device's ratings, each user trimmed to at most tau of them and
 * weighted by w_i, and releases V from one sample of
 *     P(U, V) ~ exp(-eps / (4B) F(U, V)) prior(U, V),   F = sum_i w_i sum_{j in R_i} (r_ij - clamp(pred_ij))^2,
 * pred_ij = mu + b_i + c_j + u_i . v_j clamped to [r_min - kappa, r_max + kappa]. Every term is then at most
 * (r_max - r_min + kappa)^2 on the whole parameter space (the seed's Algorithm 1 reaches the same bound by
 * rejecting samples outside the sublevel set; the clamp makes the rejection unnecessary), so user i's terms add up
 * to at most
 *     B_i = min(tau, m_i) w_i (r_max - r_min + kappa)^2                                   (dprec_sgld_user_bound)
 * and B = max_i B_i (the seed's Algorithm 1, line 1). B must not depend on the data (it sets the temperature, and
 * differential privacy covers users who are not in the data set too), so it is the maximum over every possible
 * user: the aggregator refuses a report whose w_i min(tau, m_i) exceeds tau, hence
 *     B = tau (r_max - r_min + kappa)^2                                                    (dprec_sgld_bound)
 * The prior does not depend on the data, so it may be any fixed Gaussian; dprec does not temper it.
 *
 * The guarantee (seed 003, Theorems 1 and 2). An exact sample is eps-DP at user level (one user's data replaced by
 * another's: Theorem 1, whose constant takes the loss's range as 2B; a loss in [0, B] leaves a factor 2 unclaimed).
 * User i's terms move the exponent by at most eps B_i / (4B) and the normalizer by as much, so adding or removing
 * user i (or replacing its data by a user's whose bound is at most B_i) is eps B_i / (2B)-DP for i (Theorem 2); the
 * device is charged
 *     eps_i = eps B_i / B                                                         (dprec_sgld_personal_epsilon)
 * Theorem 1's constant on i's own bound: twice that, and the job's eps when B_i = B. A device that wants eps_i <= eps chooses its own weight
 *     w_i = (eps_i / eps) min(rho, tau / min(tau, m_i))                                    (dprec_sgld_weight)
 * (the seed's reweighting, Section 6.5: w_i = min(rho, B / (m_i (r_max - r_min + kappa)^2)), scaled by eps_i / eps),
 * so that B_i <= (eps_i / eps) B whatever m_i: its guarantee is eps_i. rho (params.max_weight) caps how much a user
 * with fewer than tau ratings is up-weighted; its default, dprec_sgld_default_rho, is tau itself (at most
 * DPREC_SGLD_MAX_WEIGHT): every user's terms then weigh B, the most its guarantee allows, however few its ratings
 * (docs/results.md, "Defaults": on a fleet of about 10 ratings a user, rho = 1 spent half of each user's budget).
 *
 * What it is not: SGLD gives an approximate sample, at an unknown total-variation distance delta' from the target,
 * so what holds is (eps, (1 + e^eps) delta')-DP (Theorem 1) with delta' unknown: a posterior-sampling heuristic, and
 * every place dprec shows this epsilon says so. */
#ifndef DPREC_SGLD_H
#define DPREC_SGLD_H

#include <math.h>
#include <stdint.h>

/* Defaults and bounds shared by both sides (docs/protocol.md, sgld). */
#define DPREC_SGLD_DEFAULT_TAU 20u
#define DPREC_SGLD_MAX_TAU 65535u
#define DPREC_SGLD_MAX_KAPPA 1e3
#define DPREC_SGLD_MAX_WEIGHT 1e3 /* the largest rho */

/* The default rho of a job at tau: tau, at most DPREC_SGLD_MAX_WEIGHT. */
static inline double dprec_sgld_default_rho(uint32_t tau) {
    return (double)tau < DPREC_SGLD_MAX_WEIGHT ? (double)tau : DPREC_SGLD_MAX_WEIGHT;
}

/* B_i of one user: n = min(tau, m_i) ratings at weight w. */
static inline double dprec_sgld_user_bound(uint32_t n, double w, double range, double kappa) {
    return (double)n * w * (range + kappa) * (range + kappa);
}

/* B = tau (range + kappa)^2: B_i's maximum over every user the aggregator accepts (w_i min(tau, m_i) <= tau). */
static inline double dprec_sgld_bound(uint32_t tau, double range, double kappa) {
    return dprec_sgld_user_bound(tau, 1.0, range, kappa);
}

/* The inverse temperature of the data term: eps / (4B). */
static inline double dprec_sgld_beta(double epsilon, double bound) {
    return epsilon / (4.0 * bound);
}

/* eps_i = eps B_i / B. */
static inline double dprec_sgld_personal_epsilon(double epsilon, double user_bound, double bound) {
    return epsilon * user_bound / bound;
}

/* w_i = (eps_i / eps) min(rho, tau / n) for a device reporting n = min(tau, m_i) ratings (n = 0: rho), rounded down to
 * a float32 (the value on the wire), so that B_i <= (eps_i / eps) B holds for the float the aggregator reads. 0 for
 * eps_i <= 0 or a non-finite input. */
static inline float dprec_sgld_weight(double eps_i, double epsilon, uint32_t tau, uint32_t n, double rho) {
    if (!(eps_i > 0.0) || !(epsilon > 0.0) || !(rho > 0.0) || !isfinite(eps_i / epsilon) || !isfinite(rho)) return 0.0f;
    double cap = n > 0 ? (double)tau / (double)n : rho;
    double w = (eps_i / epsilon) * (rho < cap ? rho : cap);
    float f = (float)w;
    /* B_i / B = f n / tau at most eps_i / eps, checked on the float itself (f n is exact in double) */
    while (f > 0.0f && ((double)f > w || (double)f * (double)n * epsilon > eps_i * (double)tau)) f = nextafterf(f, 0.0f);
    return f;
}

/* Payload: [tau u32][w float32] then tau pairs [item u32][rating float32], the real pairs first (items strictly
 * increasing), then padding pairs (report.h). */
static inline size_t dprec_sgld_payload_size(uint32_t tau) {
    return 8u + 8u * (size_t)tau;
}

#endif /* DPREC_SGLD_H */
