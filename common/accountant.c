/* dprec internal — the privacy accountant (see accountant.h for the contract).
 *
 * Sources, cited at each formula below:
 *   [M17]   I. Mironov, "Renyi Differential Privacy", CSF 2017 (arXiv:1702.07476).
 *   [MTZ19] I. Mironov, K. Talwar, L. Zhang, "Renyi Differential Privacy of the Sampled Gaussian Mechanism",
 *           arXiv:1908.10530, 2019.
 *   [BS16]  M. Bun, T. Steinke, "Concentrated Differential Privacy: Simplifications, Extensions, and Lower
 *           Bounds", TCC 2016 (arXiv:1605.02065).
 *   [CKS20] C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020
 *           (arXiv:2004.00010 v4); [B+20] B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato, "Hypothesis
 *           Testing Interpretations and Renyi Differential Privacy", AISTATS 2020.
 *   [DRV10] C. Dwork, G. Rothblum, S. Vadhan, "Boosting and Differential Privacy", FOCS 2010.
 *   [DR14]  C. Dwork, A. Roth, "The Algorithmic Foundations of Differential Privacy", 2014.
 *   [ZW19]  Y. Zhu, Y.-X. Wang, "Poisson Subsampled Renyi Differential Privacy", ICML 2019 (PMLR 97).
 *   [AS64]  M. Abramowitz, I. Stegun, "Handbook of Mathematical Functions", 1964.
 *   van Erven, Harremoes, "Renyi Divergence and Kullback-Leibler Divergence", IEEE Trans. IT 60(7), 2014.
 *
 * The subsampled-Gaussian series follow MTZ19 Sec. 3.3 as implemented in TF-Privacy's rdp_accountant.py
 * (_compute_log_a_int, _compute_log_a_frac), with two changes that only improve accuracy, each derived below:
 * the integer-order sum is taken over A_alpha - 1 (no cancellation when A_alpha is close to 1), and the
 * binomial coefficients are built by their product recurrence instead of lgamma (lgamma writes the global
 * signgam on POSIX systems, so it is not reentrant).
 *
 * Numbers that cannot be represented are never silently dropped: an RDP value too large for a double becomes
 * +inf, which is a valid (if useless) upper bound; a NaN is never stored. Every add_* call either succeeds
 * completely or leaves the accountant untouched. No allocation, no I/O, no global state. */
#include "accountant.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "dprec/status.h"

#define ACCOUNTANT_LOG_HALF (-0.69314718055994530942)    /* log(1/2) */
#define ACCOUNTANT_LOG_SQRT_PI (0.57236494292470008707) /* log(sqrt(pi)) */
#define ACCOUNTANT_SQRT2 (1.41421356237309504880)

/* The largest order dprec_rdp_subsampled_gaussian accepts: both series need about alpha terms, so this bounds
 * the work of one call (the grid stops at 1024). */
#define ACCOUNTANT_MAX_ORDER 65536.0

/* The fractional-order series stops when both new terms are below e^-30 (TF-Privacy's rule). Past i = alpha
 * the terms alternate in sign and shrink, so the truncation error in A_alpha is about the size of the last
 * terms, below 2 e^-30 = 1.9e-13 (either sign): at most about 1.9e-13 / (alpha - 1) in the RDP of one step
 * (1.9e-12 at alpha = 1.1), which matters only when the per-step RDP is itself that small (q = 1/2 with
 * z > 1e5) or over millions of steps. Integer orders have no truncation. The terms decay only polynomially
 * past i = alpha, slowest at q = 1/2 with large z: 4,279 terms at z = 1, 19,676 at z = 100 and 170,404 at
 * z = 1e5 (q = 1/2, alpha = 1.1). Past ACCOUNTANT_MAX_TERMS the call fails rather than return an
 * unconverged sum. */
#define ACCOUNTANT_LOG_TERM_STOP (-30.0)
#define ACCOUNTANT_MAX_TERMS 2000000u

/* ---- the order grid --------------------------------------------------------------------------------------- */

double dprec_rdp_order(int index)
{
    if (index < 0 || index >= DPREC_RDP_ORDERS) {
        return NAN;
    }
    if (index < 99) {
        /* 1.1, 1.2, ..., 10.9 as (11 + i) / 10: one correctly rounded division, so each order is the double
         * nearest its decimal value (repeated addition of 0.1 would drift). (11 + 9) / 10 = 2 exactly, so the
         * integers 2 .. 10 are in this part of the grid too and take the integer-order formula. */
        return (double)(11 + index) / 10.0;
    }
    if (index < 152) {
        return (double)(11 + (index - 99)); /* 11, 12, ..., 63 */
    }
    /* Past 63, integers about an eighth of an octave apart (ratio 1.11 to 1.25). The discrete Gaussian under
     * Poisson sampling is bounded at integer orders only, and where the best order is large (little privacy
     * loss: z = 5, q = 0.01, 10 steps, delta = 1e-6 is best near alpha = 100) the powers of two alone left
     * its epsilon 32% above the all-integer optimum (0.0871 against 0.0661, tests/accountant_reference.py);
     * with these it is within 1%. */
    static const uint16_t tail[DPREC_RDP_ORDERS - 152] = {72,  80,  88,  96,  112, 128, 144, 160, 192,
                                                          224, 256, 320, 384, 448, 512, 640, 768, 896, 1024};
    return (double)tail[index - 152];
}

/* ---- log-space arithmetic --------------------------------------------------------------------------------- */

/* log(e^x + e^y); -inf stands for 0. */
static double log_add(double x, double y)
{
    double hi = x > y ? x : y;
    double lo = x > y ? y : x;
    if (lo == -INFINITY || hi == INFINITY) {
        return hi;
    }
    return hi + log1p(exp(lo - hi)); /* e^hi (1 + e^(lo - hi)) */
}

/* log(e^x - e^y) for x >= y; returns -1 if x < y (the difference would be negative). */
static int log_sub(double x, double y, double *out)
{
    if (y == -INFINITY) {
        *out = x;
        return 0;
    }
    if (!(x >= y) || y == INFINITY) { /* negative, or inf - inf */
        return -1;
    }
    if (x == y) {
        *out = -INFINITY;
        return 0;
    }
    *out = x + log(-expm1(y - x)); /* e^x (1 - e^(y - x)), with y - x < 0 */
    return 0;
}

/* log(e^t - 1) for t > 0. */
static double log_expm1(double t)
{
    if (t > 40.0) {
        return t + log1p(-exp(-t)); /* e^t (1 - e^-t); expm1 would overflow for t > 709 */
    }
    return log(expm1(t));
}

/* log(erfc(x)), accurate where erfc(x) itself underflows. */
static double log_erfc(double x)
{
    if (x < 25.0) {
        return log(erfc(x)); /* erfc(25) = 8.3e-274: still a normal double, computed to a few ulp by libm */
    }
    /* AS64 7.1.23: erfc x ~ e^(-x^2) / (x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) - 15/(8x^6) + 105/(16x^8) - ...).
     * Taking the log and expanding log(1 + u) in t = 1/x^2 gives
     *   log erfc x ~ -x^2 - log x - log sqrt(pi) - t/2 + 5t^2/8 - 37t^3/24 + 353t^4/64
     * (the same coefficients as TF-Privacy's _log_erfc). At x >= 25, t <= 1.6e-3 and the first omitted term,
     * O(t^5), is below 1e-12: far under the size of the result (about 625). */
    double t = 1.0 / (x * x);
    return -x * x - log(x) - ACCOUNTANT_LOG_SQRT_PI +
           t * (-0.5 + t * (0.625 + t * (-37.0 / 24.0 + t * (353.0 / 64.0))));
}

/* (k^2 - k) / (2 z^2), arranged so that k = 0, 1 give exactly 0 even when z^2 underflows (no 0 * inf). */
static double gauss_exponent(double k, double z)
{
    return ((k * k - k) * 0.5) / z / z;
}

/* ---- RDP of the Poisson-subsampled Gaussian, 0 < q < 1 ------------------------------------------------------ */

/* The binomial sum shared by the two integer-order bounds below, at an integer alpha >= 2, 0 < q < 1:
 *   log S,  S = sum_{k=0}^{alpha} C(alpha, k) q^k (1-q)^(alpha-k) c_k exp((k^2 - k) / (2 z^2)),
 * with c_0 = c_1 = c_2 = 1 and c_k = e^log_c3 for k >= 3 (log_c3 >= 0). The k = 0 and k = 1 terms have
 * exponent 0, and sum_k C(alpha, k) q^k (1-q)^(alpha-k) = 1 (binomial theorem), so
 *   S - 1 = sum_{k=2}^{alpha} C(alpha, k) q^k (1-q)^(alpha-k) (c_k exp((k^2 - k) / (2 z^2)) - 1),
 * a sum of positive terms (c_k e^x - 1 = e^(x + log c_k) - 1 > 0 for x > 0). Summing it in log space and
 * returning log1p(S - 1) keeps full relative precision when S is close to 1 (small q), where summing S itself
 * would leave only the rounding of the 1 (for q = 1e-6, S - 1 is about 1e-12 and a direct sum would keep 4
 * digits of it). C(alpha, k) comes from C(alpha, k) = C(alpha, k-1) (alpha - k + 1) / k, in log space. */
static double log_binomial_sum(double q, double z, double alpha, double log_c3)
{
    const double log_q = log(q);
    const double log_1mq = log1p(-q);
    double log_binom = log(alpha); /* log C(alpha, 1) */
    double log_s_minus_1 = -INFINITY;
    for (double k = 2.0; k <= alpha; k += 1.0) {
        log_binom += log(alpha - k + 1.0) - log(k); /* now log C(alpha, k) */
        const double x = gauss_exponent(k, z) + (k >= 3.0 ? log_c3 : 0.0);
        log_s_minus_1 = log_add(log_s_minus_1, log_binom + k * log_q + (alpha - k) * log_1mq + log_expm1(x));
    }
    return log_add(0.0, log_s_minus_1); /* log(1 + (S - 1)) */
}

/* log A_alpha at an integer order alpha >= 2. MTZ19 Sec. 3.3:
 *   A_alpha = sum_{k=0}^{alpha} C(alpha, k) q^k (1-q)^(alpha-k) exp((k^2 - k) / (2 z^2)),
 * the binomial sum above with every c_k = 1. */
static double log_a_int(double q, double z, double alpha)
{
    return log_binomial_sum(q, z, alpha, 0.0);
}

/* log A_alpha at any order alpha > 1 by the two series of MTZ19 Sec. 3.3 (TF-Privacy _compute_log_a_frac):
 * with z0 = z^2 log(1/q - 1) + 1/2, the point where the mixture's two parts, (1-q) N(0, z^2) and q N(1, z^2),
 * have equal density (the integral of A_alpha is split there),
 *   A_alpha = sum_{i>=0} C(alpha, i) q^i (1-q)^(alpha-i) exp((i^2 - i)/(2 z^2)) (1/2) erfc((i - z0)/(sqrt2 z))
 *           + sum_{i>=0} C(alpha, i) q^(alpha-i) (1-q)^i exp((j^2 - j)/(2 z^2)) (1/2) erfc((z0 - j)/(sqrt2 z)),
 * j = alpha - i, with the generalized binomial C(alpha, i) = alpha (alpha-1) ... (alpha-i+1) / i!, whose sign
 * alternates once i > alpha. Each series is kept in log space as a running sum of signed terms.
 * At an integer alpha the coefficients vanish past i = alpha and, with k = alpha - i in the second series
 * and erfc(x) + erfc(-x) = 2, the two series add up to the integer-order sum term by term; the tests use this.
 * Returns 0, or -1 if the series did not converge within ACCOUNTANT_MAX_TERMS terms or a partial sum went
 * negative (which would mean the arithmetic, not the mathematics, broke down). */
static int log_a_frac(double q, double z, double alpha, double *log_a)
{
    const double log_q = log(q);
    const double log_1mq = log1p(-q);
    const double z0 = z * z * (log_1mq - log_q) + 0.5; /* log(1/q - 1) = log((1-q)/q) */
    const double inv_s = 1.0 / (ACCOUNTANT_SQRT2 * z);
    double log_a0 = -INFINITY;
    double log_a1 = -INFINITY;
    double log_coef = 0.0; /* log |C(alpha, 0)| */
    int negative = 0;      /* sign of C(alpha, i) */
    for (uint32_t n = 0; n < ACCOUNTANT_MAX_TERMS; n++) {
        const double i = (double)n;
        const double j = alpha - i;
        const double log_s0 = log_coef + i * log_q + j * log_1mq + gauss_exponent(i, z) + ACCOUNTANT_LOG_HALF +
                              log_erfc((i - z0) * inv_s);
        const double log_s1 = log_coef + j * log_q + i * log_1mq + gauss_exponent(j, z) + ACCOUNTANT_LOG_HALF +
                              log_erfc((z0 - j) * inv_s);
        if (isnan(log_s0) || isnan(log_s1)) {
            return -1;
        }
        if (!negative) {
            log_a0 = log_add(log_a0, log_s0);
            log_a1 = log_add(log_a1, log_s1);
        } else if (log_sub(log_a0, log_s0, &log_a0) != 0 || log_sub(log_a1, log_s1, &log_a1) != 0) {
            return -1;
        }
        /* Stop once both new terms are negligible, but never before i passes alpha. TF-Privacy stops on the
         * first small pair, which can come before the bulk of the sum: at q = 0.1, z = 9, alpha = 350.5 the
         * i = 0 terms are e^-36.9 and e^-50.8, stopping there gives log A < 0, while the RDP is 0.0439
         * (tests/accountant_reference.py; between the integer sums at 350 and 351). Going on to i > alpha
         * costs at most alpha terms. */
        if (i > alpha && (log_s0 > log_s1 ? log_s0 : log_s1) < ACCOUNTANT_LOG_TERM_STOP) {
            *log_a = log_add(log_a0, log_a1);
            return 0;
        }
        /* C(alpha, i+1) = C(alpha, i) (alpha - i) / (i + 1). */
        const double factor = alpha - i;
        if (factor == 0.0) { /* integer alpha: every later coefficient is 0 */
            *log_a = log_add(log_a0, log_a1);
            return 0;
        }
        if (factor < 0.0) {
            negative = !negative;
        }
        log_coef += log(fabs(factor)) - log(i + 1.0);
    }
    return -1;
}

/* Test hook (declared in accountant.h): the fractional-order series at any order, integers included. */
int dprec_rdp_log_a_fractional_series(double q, double noise_multiplier, double alpha, double *log_a)
{
    if (log_a == NULL || !(q > 0.0 && q < 1.0) || !(noise_multiplier > 0.0) || !isfinite(noise_multiplier) ||
        !(alpha > 1.0 && alpha <= ACCOUNTANT_MAX_ORDER)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    return log_a_frac(q, noise_multiplier, alpha, log_a) == 0 ? DPREC_OK : DPREC_ERR_INVALID_ARGUMENT;
}

int dprec_rdp_subsampled_gaussian(double q, double noise_multiplier, double alpha, double *rdp)
{
    const double z = noise_multiplier;
    if (rdp == NULL || !(q > 0.0 && q <= 1.0) || !(z > 0.0) || !isfinite(z) ||
        !(alpha > 1.0 && alpha <= ACCOUNTANT_MAX_ORDER)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    if (q == 1.0) {
        /* No subsampling: the Gaussian mechanism is (alpha, alpha Delta^2 / (2 sigma^2))-RDP (M17, Table II;
         * equivalently (Delta^2 / (2 sigma^2))-zCDP, BS16 Prop. 1.6), z = sigma / Delta. Divided in two steps
         * so that a tiny z overflows to +inf, never to NaN. */
        *rdp = alpha * 0.5 / z / z;
        return DPREC_OK;
    }
    double log_a;
    if (alpha == floor(alpha)) {
        log_a = log_a_int(q, z, alpha);
    } else if (log_a_frac(q, z, alpha, &log_a) != 0) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    /* A_alpha >= 1 (it is E[(mu/mu0)^alpha] >= (E[mu/mu0])^alpha = 1 by Jensen). The fractional series may
     * land a rounding or truncation error (about 1e-13) below 1, which is clamped; anything clearly below
     * means the arithmetic broke down, and is reported rather than clamped into a false 0. */
    if (isnan(log_a) || log_a < -1e-9) {
        return DPREC_ERR_INTERNAL;
    }
    /* MTZ19 Sec. 3.3: the sampled Gaussian is (alpha, log(A_alpha) / (alpha - 1))-RDP. */
    const double r = log_a / (alpha - 1.0);
    *rdp = r > 0.0 ? r : 0.0;
    return DPREC_OK;
}

/* ---- RDP of the Poisson-subsampled discrete Gaussian ------------------------------------------------------- */

/* The MTZ19 series above are the Renyi divergence between the continuous Gaussian and its mixture with a
 * shifted copy; they are exact for that mechanism, but their derivation uses its density and has not been shown
 * to hold for the discrete Gaussian that common/noise.c samples. What the discrete Gaussian does have is its RDP curve: with noise
 * multiplier z (sigma / L2 sensitivity) it is (1/(2 z^2))-zCDP (CKS20; common/noise.c applies it to the rounded
 * statistic on its grid), i.e. (l, eps(l))-RDP with eps(l) = l / (2 z^2) at every order l > 1. So the
 * subsampled step is bounded by a theorem that holds for ANY mechanism with a given RDP curve under Poisson
 * sampling:
 *
 *   [ZW19] Y. Zhu, Y.-X. Wang, "Poisson Subsampled Renyi Differential Privacy", ICML 2019 (PMLR 97), the
 *   general upper bound (the one the abstract calls optimal "up to an additive constant of log(3)/(alpha-1)";
 *   Google's implementation below cites it as Thm. 5 and the exact-for-Gaussian sum as Thm. 6): for integer
 *   alpha >= 2 and rate q,
 *     eps_q(alpha) <= 1/(alpha-1) log[ (1-q)^(alpha-1) (alpha q - q + 1)
 *                                      + C(alpha,2) q^2 (1-q)^(alpha-2) e^eps(2)
 *                                      + 3 sum_{l=3}^{alpha} C(alpha,l) (1-q)^(alpha-l) q^l e^((l-1) eps(l)) ].
 *
 * The form was checked against two implementations that apply it to the discrete Gaussian: Google's
 * distributed-DP accountant (google-research/federated, distributed_dp/accounting_utils.py,
 * _compute_rdp_subsampled(upper_bound=True), which its compute_rdp_dgaussian, the code of Kairouz, Liu, Steinke
 * 2021 for the distributed discrete Gaussian, takes the min of with the unsampled curve, as here: weight 3 on
 * e^((l-1) eps(l)) for l >= 3, weight 1 for l = 2) and an independent DDG accountant with the same sum. autodp writes the same exponent as cgf(l-1) with cgf(x) = x eps(x+1), which is where a
 * reading "e^(l eps(l+1))" comes from; it is the same term. The other sum of ZW19 (weight 1 on every l >= 2)
 * is their LOWER bound, tight for the continuous Gaussian; it is not used here.
 *
 * With eps(l) = l / (2 z^2), (l-1) eps(l) = (l^2 - l) / (2 z^2): the MTZ19 exponent. The first two terms are
 * MTZ19's k = 0, 1 and k = 2 terms, so the bound is the binomial sum with c_k = 3 for k >= 3 (log_binomial_sum
 * with log_c3 = log 3), and it is never below the continuous Gaussian's A_alpha at the same order.
 *
 * Only integer orders: the theorem has no fractional form. Every other order is +inf (a valid, if useless,
 * bound), so the accountant's minimum runs over the integer orders of the grid. Subsampling never hurts, so the
 * unsubsampled curve alpha / (2 z^2) is also valid and the smaller of the two is kept. */
#define ACCOUNTANT_LOG_3 (1.09861228866810969140) /* log(3) */

int dprec_rdp_subsampled_discrete_gaussian(double q, double noise_multiplier, double alpha, double *rdp)
{
    const double z = noise_multiplier;
    if (rdp == NULL || !(q > 0.0 && q <= 1.0) || !(z > 0.0) || !isfinite(z) ||
        !(alpha > 1.0 && alpha <= ACCOUNTANT_MAX_ORDER)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    const double unsampled = alpha * 0.5 / z / z; /* CKS20 Thm. 4: (1/(2 z^2))-zCDP, every order */
    if (q == 1.0) {
        *rdp = unsampled;
        return DPREC_OK;
    }
    if (alpha != floor(alpha)) {
        *rdp = INFINITY; /* ZW19 is for integer orders only */
        return DPREC_OK;
    }
    const double log_s = log_binomial_sum(q, z, alpha, ACCOUNTANT_LOG_3);
    if (isnan(log_s) || log_s < 0.0) { /* S >= 1: every term added to the 1 is positive */
        return DPREC_ERR_INTERNAL;
    }
    const double r = log_s / (alpha - 1.0);
    *rdp = r < unsampled ? r : unsampled;
    return DPREC_OK;
}

/* ---- the accountant ----------------------------------------------------------------------------------------- */

void dprec_accountant_init(dprec_accountant *a)
{
    if (a == NULL) {
        return;
    }
    for (int i = 0; i < DPREC_RDP_ORDERS; i++) {
        a->rdp[i] = 0.0;
    }
    a->pure_eps = 0.0;
    a->pure_delta = 0.0;
    a->max_step_eps = 0.0;
    a->approx_eps = 0.0;
    a->pure_steps = 0;
    a->rdp_steps = 0;
    a->has_approx = 0;
}

/* Adds n steps to a step counter, refusing a wrap-around. */
static int counter_fits(uint64_t count, uint64_t steps)
{
    return steps <= UINT64_MAX - count;
}

int dprec_accountant_add_pure(dprec_accountant *a, double epsilon, uint64_t steps)
{
    if (a == NULL || !(epsilon > 0.0) || !isfinite(epsilon) || steps == 0 || !counter_fits(a->pure_steps, steps)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    const double n = (double)steps;
    /* On the RDP curve, used only if the job also has RDP steps (dprec_accountant_epsilon):
     *   eps-DP  =>  (alpha, eps)-RDP for every alpha: eps-DP is D_inf <= eps (M17 Sec. III), and the Renyi
     *               divergence is nondecreasing in its order (van Erven, Harremoes 2014, Thm. 3);
     *   eps-DP  =>  (eps^2 / 2)-zCDP (BS16 Prop. 1.4)  =>  (alpha, alpha eps^2 / 2)-RDP (BS16 Def. 1.1);
     * so each step costs min(eps, alpha eps^2 / 2) at order alpha, and RDP composes by addition (M17 Prop. 1). */
    for (int i = 0; i < DPREC_RDP_ORDERS; i++) {
        const double alpha = dprec_rdp_order(i);
        const double zcdp = alpha * epsilon * epsilon * 0.5;
        a->rdp[i] += n * (epsilon < zcdp ? epsilon : zcdp);
    }
    a->pure_eps += n * epsilon; /* basic composition: epsilons add (DR14 Thm. 3.16) */
    if (epsilon > a->max_step_eps) {
        a->max_step_eps = epsilon;
    }
    a->pure_steps += steps;
    return DPREC_OK;
}

int dprec_accountant_add_approx(dprec_accountant *a, double epsilon, double delta, uint64_t steps)
{
    if (a == NULL || !(epsilon >= 0.0) || !isfinite(epsilon) || !(delta > 0.0 && delta < 1.0) || steps == 0) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    const double n = (double)steps;
    /* Basic composition: epsilons and deltas add (DR14 Thm. 3.16). An (eps, delta>0) step has no RDP curve,
     * so it never enters rdp[]. */
    a->approx_eps += n * epsilon;
    a->pure_delta += n * delta;
    a->has_approx = 1;
    return DPREC_OK;
}

/* The two Gaussian steps differ only in the per-order RDP of one step. */
static int add_gaussian_curve(dprec_accountant *a, double noise_multiplier, double q, uint64_t steps, int discrete)
{
    if (a == NULL || !(noise_multiplier > 0.0) || !isfinite(noise_multiplier) || !(q > 0.0 && q <= 1.0) ||
        steps == 0 || !counter_fits(a->rdp_steps, steps)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    /* Compute every order first, so that a failure leaves the accountant unchanged. */
    double step_rdp[DPREC_RDP_ORDERS];
    for (int i = 0; i < DPREC_RDP_ORDERS; i++) {
        const double alpha = dprec_rdp_order(i);
        int rc = discrete ? dprec_rdp_subsampled_discrete_gaussian(q, noise_multiplier, alpha, &step_rdp[i])
                          : dprec_rdp_subsampled_gaussian(q, noise_multiplier, alpha, &step_rdp[i]);
        if (rc != DPREC_OK) {
            return rc;
        }
    }
    const double n = (double)steps;
    for (int i = 0; i < DPREC_RDP_ORDERS; i++) {
        a->rdp[i] += n * step_rdp[i]; /* RDP composes by addition at each order (M17 Prop. 1); +inf stays +inf */
    }
    a->rdp_steps += steps;
    return DPREC_OK;
}

int dprec_accountant_add_gaussian(dprec_accountant *a, double noise_multiplier, double q, uint64_t steps)
{
    return add_gaussian_curve(a, noise_multiplier, q, steps, 0);
}

int dprec_accountant_add_discrete_gaussian(dprec_accountant *a, double noise_multiplier, double q, uint64_t steps)
{
    return add_gaussian_curve(a, noise_multiplier, q, steps, 1);
}

int dprec_accountant_add_zcdp(dprec_accountant *a, double rho, uint64_t steps)
{
    if (a == NULL || !(rho > 0.0) || !isfinite(rho) || steps == 0 || !counter_fits(a->rdp_steps, steps)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    const double n = (double)steps;
    for (int i = 0; i < DPREC_RDP_ORDERS; i++) {
        a->rdp[i] += n * (dprec_rdp_order(i) * rho); /* rho-zCDP is (alpha, alpha rho)-RDP, BS16 Def. 1.1 */
    }
    a->rdp_steps += steps;
    return DPREC_OK;
}

/* (epsilon, delta) from (alpha, r)-RDP, before the clamp at 0. */
static double rdp_to_dp(double r, double alpha, double delta, dprec_conversion method)
{
    if (method == DPREC_CONVERSION_CLASSICAL) {
        return r + log(1.0 / delta) / (alpha - 1.0); /* M17 Prop. 3 */
    }
    /* CKS20 Prop. 12: (alpha, r)-RDP implies (eps, delta)-DP for
     *   delta = exp((alpha - 1)(r - eps)) / (alpha - 1) * (1 - 1/alpha)^alpha;
     * solved for eps (B+20 Thm. 21 is the same bound):
     *   eps = r + log1p(-1/alpha) - (log(delta) + log(alpha)) / (alpha - 1). */
    return r + log1p(-1.0 / alpha) - (log(delta) + log(alpha)) / (alpha - 1.0);
}

int dprec_accountant_epsilon(const dprec_accountant *a, double delta, dprec_conversion method, double *epsilon,
                             double *order)
{
    if (a == NULL || epsilon == NULL || !(delta > 0.0 && delta < 1.0) ||
        (method != DPREC_CONVERSION_CKS && method != DPREC_CONVERSION_CLASSICAL)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    if (a->rdp_steps == 0) {
        /* Pure and approximate steps only: basic composition, (sum eps, sum delta)-DP (DR14 Thm. 3.16), which
         * is (sum eps, delta)-DP for every delta >= sum delta; a smaller delta cannot be promised. Pure-only
         * accountants have sum delta = 0, so any delta in (0, 1) is accepted and only checked. */
        if (a->has_approx && delta < a->pure_delta) {
            return DPREC_ERR_INVALID_ARGUMENT;
        }
        *epsilon = a->pure_eps + a->approx_eps;
        if (order != NULL) {
            *order = 0.0;
        }
        return DPREC_OK;
    }
    /* RDP steps present. The pure steps are already on the curve (dprec_accountant_add_pure), at
     * min(eps, alpha eps^2/2) <= eps per step, so for every order the curve's conversion is at most the
     * conversion of the RDP steps alone plus the pure sum: this is never looser than composing the pure steps
     * separately, and no separate comparison is needed.
     * Approximate steps have no RDP curve. Split the requested delta: the RDP part is converted at
     * delta_rdp = delta - sum delta > 0, then composed with the approximate steps by basic composition
     * (DR14 Thm. 3.16): (eps_rdp + sum eps_approx, delta_rdp + sum delta)-DP. */
    double delta_rdp = delta;
    if (a->has_approx) {
        if (!(delta > a->pure_delta)) {
            return DPREC_ERR_INVALID_ARGUMENT;
        }
        delta_rdp = delta - a->pure_delta;
        /* The subtraction is rounded to nearest; step down by an ulp or two so that delta_rdp + sum delta
         * never exceeds the delta promised (a correctly rounded difference needs at most one step). */
        for (int k = 0; k < 4 && delta_rdp > 0.0 && delta_rdp + a->pure_delta > delta; k++) {
            delta_rdp = nextafter(delta_rdp, 0.0);
        }
        if (!(delta_rdp > 0.0) || delta_rdp + a->pure_delta > delta) {
            return DPREC_ERR_INVALID_ARGUMENT;
        }
    }
    double best = INFINITY;
    double best_order = 0.0; /* stays 0 if no order gives a finite epsilon */
    for (int i = 0; i < DPREC_RDP_ORDERS; i++) {
        const double alpha = dprec_rdp_order(i);
        const double e = rdp_to_dp(a->rdp[i], alpha, delta_rdp, method);
        if (e < best) { /* strict: on a tie the smaller order is reported */
            best = e;
            best_order = alpha;
        }
    }
    /* The CKS bound can be negative for a tiny r. CKS20 Prop. 12 holds for every eps >= 0 and its delta
     * decreases in eps, so at eps = 0 it gives some delta' <= delta: (0, delta)-DP, and clamping at 0 is
     * still a valid statement. (The classical bound is never negative: r >= 0, log(1/delta) > 0.) */
    if (best < 0.0) {
        best = 0.0;
    }
    *epsilon = best + a->approx_eps;
    if (order != NULL) {
        *order = best_order;
    }
    return DPREC_OK;
}

int dprec_accountant_advanced(const dprec_accountant *a, double delta_slack, double *epsilon)
{
    if (a == NULL || epsilon == NULL || !(delta_slack > 0.0 && delta_slack < 1.0)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    /* The theorem is stated here for pure steps only: approximate steps would add k delta to the total delta,
     * which this signature cannot return, and RDP steps have no single per-step epsilon. */
    if (a->has_approx || a->rdp_steps != 0) {
        return DPREC_ERR_STATE;
    }
    /* DRV10 Thm. III.3 (DR14 Thm. 3.20): k-fold adaptive composition of eps-DP mechanisms is
     * (sqrt(2 k ln(1/delta')) eps + k eps (e^eps - 1), delta')-DP. Steps with a smaller epsilon are also
     * max_step_eps-DP, so using the largest is valid. */
    const double k = (double)a->pure_steps;
    const double e = a->max_step_eps;
    *epsilon = sqrt(2.0 * k * log(1.0 / delta_slack)) * e + k * e * expm1(e);
    return DPREC_OK;
}

double dprec_zcdp_to_dp(double rho, double delta)
{
    if (!(rho >= 0.0) || !isfinite(rho) || !(delta > 0.0 && delta < 1.0)) {
        return NAN;
    }
    return rho + 2.0 * sqrt(rho * log(1.0 / delta)); /* BS16 Prop. 1.3 */
}

double dprec_eps_opt_seed001(uint64_t steps, double eps_i, double delta, double delta_r)
{
    if (steps == 0 || !(eps_i > 0.0) || !isfinite(eps_i) || !(delta > 0.0 && delta < 1.0) ||
        !(delta_r > 0.0 && delta_r < 1.0)) {
        return NAN;
    }
    /* Mugdho, Imtiaz, Thm. 2 / eq. (9): sigma = Delta / eps_i * sqrt(2 ln(1.25/delta)) makes each step the
     * Gaussian mechanism with z^2 = 2 ln(1.25/delta) / eps_i^2, i.e. RDP alpha / (2 z^2) per step (M17) and
     * rho = J / (2 z^2) = J eps_i^2 / (4 ln(1.25/delta)) in total; minimizing the classical conversion
     * alpha rho + ln(1/delta_r) / (alpha - 1) over all real alpha > 1 (their eqs. 7-8) gives
     *   eps_opt = rho + 2 sqrt(rho ln(1/delta_r)),
     * which is also BS16 Prop. 1.3 for rho-zCDP. delta only sets sigma; the guarantee is (eps_opt, delta_r). */
    const double rho = (double)steps * eps_i * eps_i / (4.0 * log(1.25 / delta));
    return dprec_zcdp_to_dp(rho, delta_r);
}

int dprec_accountant_add_step(dprec_accountant *a, const dprec_step *step) {
    if (a == NULL || step == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    switch (step->kind) {
    case DPREC_STEP_PURE: return dprec_accountant_add_pure(a, step->epsilon, step->steps);
    case DPREC_STEP_APPROX: return dprec_accountant_add_approx(a, step->epsilon, step->delta, step->steps);
    case DPREC_STEP_GAUSSIAN:
        return step->discrete ? dprec_accountant_add_discrete_gaussian(a, step->noise_multiplier, step->q, step->steps)
                              : dprec_accountant_add_gaussian(a, step->noise_multiplier, step->q, step->steps);
    case DPREC_STEP_ZCDP: return dprec_accountant_add_zcdp(a, step->rho, step->steps);
    }
    return DPREC_ERR_INVALID_ARGUMENT;
}

int dprec_accountant_try_add(dprec_accountant *a, const dprec_step *step, double epsilon_budget, double delta,
                             dprec_conversion method, double *epsilon_after) {
    if (a == NULL || step == NULL || !(epsilon_budget >= 0.0)) return DPREC_ERR_INVALID_ARGUMENT;
    /* Try on a copy: the job's accountant changes only if the round fits. */
    dprec_accountant next = *a;
    int rc = dprec_accountant_add_step(&next, step);
    if (rc != DPREC_OK) return rc;
    double eps = 0.0;
    rc = dprec_accountant_epsilon(&next, delta, method, &eps, NULL);
    if (rc != DPREC_OK) return rc;
    if (epsilon_after != NULL) *epsilon_after = eps;
    if (!(eps <= epsilon_budget)) return DPREC_ERR_BUDGET_EXCEEDED;
    *a = next;
    return DPREC_OK;
}
