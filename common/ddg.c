/* dprec — the distributed discrete Gaussian encoding and its planner (common/ddg.h; docs/privacy.md "Secure
 * aggregation"). Kairouz, Liu, Steinke, ICML 2021 ("KLS").
 *
 * Privacy rests on three facts this file enforces with integers, not floating point:
 *   (a) every device's rounded vector z has ||z||^2 <= norm2_bound (checked exactly, in uint64, before any noise
 *       is added; the conditional rounding redraws until it holds, and the fallback truncates toward zero);
 *   (b) every noise share is N_Z(0, share_num / 1024) from the exact sampler (common/noise.c), clamped to
 *       [-clamp, clamp], which changes its law by at most 2 exp(-clamp^2 / (2 s^2)) in total variation (the
 *       discrete Gaussian is s^2-subgaussian: Canonne, Kamath, Steinke 2020, Sec. 2.3);
 *   (c) the sum of any n <= n_max devices' values never wraps modulo 2^b (each |y_j| <= isqrt(norm2_bound) +
 *       clamp, and 2^(b-1) > n_max (isqrt(norm2_bound) + clamp)), so the aggregator decodes the exact integer
 *       sum, and the sum of n in [n_min, n_max] shares is KLS Theorem 1's distributed discrete Gaussian.
 * The accounting (KLS Theorem 1 with Prop. 14, dprec_ddg_rdp_x) is then a function of the plan's integers. */
#include <math.h>
#include <string.h>

#include "accountant.h"
#include "ddg.h"
#include "gauss.h"
#include "mbedtls_compat.h"
#include "noise.h"

static uint64_t isqrt_u64(uint64_t x) {
    uint64_t r = (uint64_t)sqrt((double)x);
    while (r > 0 && (r > UINT32_MAX || r * r > x)) r--;
    while (r < UINT32_MAX && (r + 1) * (r + 1) <= x) r++;
    return r;
}

#define DDG_PI 3.14159265358979323846

static int is_pow2(uint32_t x) { return x != 0 && (x & (x - 1)) == 0; }

static uint64_t mask_of(uint32_t bits) { return bits >= 64 ? UINT64_MAX : (((uint64_t)1 << bits) - 1); }

/* ---- public signs and the rotation ----------------------------------------------------------------------- */

static void sign_block(const unsigned char seed[DPREC_DDG_SEED_SIZE], uint32_t block, unsigned char h[32]) {
    static const char tag[] = "dprec ddg signs v1";
    unsigned char msg[sizeof tag - 1 + DPREC_DDG_SEED_SIZE + 4];
    memcpy(msg, tag, sizeof tag - 1);
    memcpy(msg + sizeof tag - 1, seed, DPREC_DDG_SEED_SIZE);
    for (int i = 0; i < 4; i++) msg[sizeof tag - 1 + DPREC_DDG_SEED_SIZE + (unsigned)i] = (unsigned char)(block >> (8 * i));
    if (dprec_sha256(msg, sizeof msg, h) != 0) memset(h, 0, 32); /* SHA-256 on a buffer cannot fail */
}

int dprec_ddg_sign(const unsigned char seed[DPREC_DDG_SEED_SIZE], uint32_t j) {
    unsigned char h[32];
    sign_block(seed, j / 256u, h);
    return (h[(j % 256u) / 8u] >> (j % 8u)) & 1;
}

static void apply_signs(const unsigned char seed[DPREC_DDG_SEED_SIZE], double *v, uint32_t dim) {
    unsigned char h[32];
    for (uint32_t j = 0; j < dim; j++) {
        if (j % 256u == 0) sign_block(seed, j / 256u, h);
        if ((h[(j % 256u) / 8u] >> (j % 8u)) & 1) v[j] = -v[j];
    }
}

/* In-place fast Walsh-Hadamard transform (natural order), then the 1/sqrt(dim) that makes it orthonormal. */
static void fwht(double *v, uint32_t dim) {
    for (uint32_t h = 1; h < dim; h *= 2)
        for (uint32_t i = 0; i < dim; i += 2 * h)
            for (uint32_t j = i; j < i + h; j++) {
                double a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    double s = 1.0 / sqrt((double)dim);
    for (uint32_t j = 0; j < dim; j++) v[j] *= s;
}

int dprec_ddg_rotate(const unsigned char seed[DPREC_DDG_SEED_SIZE], double *v, uint32_t dim) {
    if (seed == NULL || v == NULL || !is_pow2(dim) || dim > DPREC_DDG_MAX_DIM) return DPREC_ERR_INVALID_ARGUMENT;
    apply_signs(seed, v, dim);
    fwht(v, dim);
    return DPREC_OK;
}

int dprec_ddg_unrotate(const unsigned char seed[DPREC_DDG_SEED_SIZE], double *v, uint32_t dim) {
    if (seed == NULL || v == NULL || !is_pow2(dim) || dim > DPREC_DDG_MAX_DIM) return DPREC_ERR_INVALID_ARGUMENT;
    fwht(v, dim); /* H / sqrt(dim) is symmetric and orthonormal: its own inverse */
    apply_signs(seed, v, dim);
    return DPREC_OK;
}

/* ---- accounting: KLS Theorem 1 with Prop. 14 ---------------------------------------------------------- */

static double share_var(const dprec_ddg_plan *p) { return (double)p->share_num / (double)DPREC_DDG_SHARE_DEN; }

/* KLS Theorem 1's tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 s^2 k / (k + 1)), bounded above by 10 (n - 1)
 * exp(-pi^2 s^2) (k / (k + 1) >= 1/2); a larger tau only weakens the bound, so the bound is safe. */
static double tau_bound(double s2, uint32_t n) {
    if (n <= 1) return 0.0;
    return 10.0 * (double)(n - 1) * exp(-DDG_PI * DDG_PI * s2);
}

/* X with RDP(alpha) <= alpha X / 2 for the sum of n shares of variance s2 (integer units) on vectors of L2 norm
 * <= d2 and L1 norm <= d1 in dimension dim. KLS Prop. 14 (as in Theorem 1) bounds the RDP by the minimum of
 *   alpha/2 l2^2 + tau dim,   alpha/2 (l2^2 + 2 l1 tau + tau^2 dim),   alpha/2 (l2 + sqrt(dim) tau)^2,
 * l2 = d2 / (sqrt(n) s), l1 = d1 / (sqrt(n) s). We keep the last two (each alone is a valid bound, and both
 * are zCDP curves, so the existing accountant composes them as a discrete Gaussian of multiplier 1/sqrt(X),
 * Poisson subsampling included: Zhu-Wang's bound holds for any mechanism with that RDP curve). The first term
 * is dropped: it matters only when tau is not negligible, and the 1% rule of the planner implies s^2 >= 25
 * (gamma^2/4 <= 0.01 gamma^2 s^2), where tau dim <= 10 n dim e^-246. */
static double rdp_x_of(double d2, double d1, double s2, uint32_t n_l, uint32_t n_tau, uint32_t dim) {
    double sd = sqrt((double)n_l * s2);
    double l2 = d2 / sd, l1 = d1 / sd, tau = tau_bound(s2, n_tau), sq = sqrt((double)dim);
    double t2 = l2 * l2 + 2.0 * l1 * tau + tau * tau * (double)dim;
    double t3 = (l2 + sq * tau) * (l2 + sq * tau);
    return t2 < t3 ? t2 : t3;
}

/* Delta_2 and Delta_1 of the enforced bound, rounded up. */
static void sens_of(uint64_t norm2_bound, uint32_t dim, double *d2, double *d1) {
    double a = sqrt((double)norm2_bound) * (1.0 + 0x1p-50);
    double sq = sqrt((double)dim);
    *d2 = a;
    *d1 = a * (a < sq ? a : sq); /* ||z||_1 <= sqrt(dim) ||z||_2, and <= ||z||_2^2 for integers */
}

double dprec_ddg_rdp_x(const dprec_ddg_plan *p, uint32_t n) {
    if (p == NULL || n < p->n_min || n > p->n_max || p->n_min < 1 || p->share_num == 0) return NAN;
    double d2, d1;
    sens_of(p->norm2_bound, p->dim, &d2, &d1);
    return rdp_x_of(d2, d1, share_var(p), n, n, p->dim);
}

/* The clamp's allowance: n_max dim shares per round, rounds rounds, each within 2 exp(-clamp^2 / (2 s^2)) in
 * total variation. A mechanism within eta of an (eps, delta)-DP one is (eps, delta + (1 + e^eps) eta)-DP;
 * callers convert the RDP at delta - (1 + e^eps) delta_clamp. */
static double clamp_tv(double s2, int64_t clamp, uint32_t n_max, uint32_t dim, uint64_t rounds) {
    double c = (double)clamp;
    return (double)rounds * (double)n_max * (double)dim * 2.0 * exp(-c * c / (2.0 * s2));
}

static int64_t clamp_of(uint64_t share_num) {
    return (int64_t)ceil(DPREC_DDG_CLAMP_SDS * sqrt((double)share_num / (double)DPREC_DDG_SHARE_DEN)) + 1;
}

/* The smallest b with 2^(b-1) > n_max (isqrt(norm2_bound) + clamp), or 0 if above 62. */
static uint32_t bits_for(uint64_t norm2_bound, int64_t clamp, uint32_t n_max) {
    uint64_t per = isqrt_u64(norm2_bound) + (uint64_t)clamp;
    if (per > (((uint64_t)1 << 61) / n_max)) return 0;
    uint64_t total = per * n_max; /* < 2^61 */
    uint32_t b = 2;
    while (b <= DPREC_DDG_MAX_BITS && ((uint64_t)1 << (b - 1)) <= total) b++;
    return b <= DPREC_DDG_MAX_BITS ? b : 0;
}

int dprec_ddg_plan_check(dprec_ddg_plan *p, uint64_t rounds) {
    if (p == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (p->d < 1 || p->log2_dim > 24 || p->dim != (1u << p->log2_dim) || p->dim < p->d) return DPREC_ERR_JOB_PARAMS;
    if (p->gamma_log2 < -200 || p->gamma_log2 > 200 || !(p->clip > 0.0) || !isfinite(p->clip))
        return DPREC_ERR_JOB_PARAMS;
    if (!(p->beta > 0.0 && p->beta < 1.0)) return DPREC_ERR_JOB_PARAMS;
    if (ldexp(p->clip, -p->gamma_log2) > 0x1p30) return DPREC_ERR_JOB_PARAMS; /* keeps encode's sums in 64 bits */
    if (p->norm2_bound < 1 || p->norm2_bound >= ((uint64_t)1 << 62)) return DPREC_ERR_JOB_PARAMS;
    if (p->share_num < 1 || p->share_num > ((uint64_t)1 << 53)) return DPREC_ERR_JOB_PARAMS;
    if (p->clamp != clamp_of(p->share_num)) return DPREC_ERR_JOB_PARAMS;
    if (p->n_min < 1 || p->n_max < p->n_min || rounds < 1) return DPREC_ERR_JOB_PARAMS;
    uint32_t need = bits_for(p->norm2_bound, p->clamp, p->n_max);
    if (need == 0 || p->bits < need || p->bits > DPREC_DDG_MAX_BITS) return DPREC_ERR_JOB_PARAMS; /* could wrap */
    double d2, d1, s2 = share_var(p);
    sens_of(p->norm2_bound, p->dim, &d2, &d1);
    p->tau = tau_bound(s2, p->n_max);
    p->rdp_x = rdp_x_of(d2, d1, s2, p->n_min, p->n_max, p->dim);
    if (!(p->rdp_x > 0.0) || !isfinite(p->rdp_x)) return DPREC_ERR_JOB_PARAMS;
    p->noise_multiplier = 1.0 / sqrt(p->rdp_x);
    p->delta_clamp = clamp_tv(s2, p->clamp, p->n_max, p->dim, rounds);
    return DPREC_OK;
}

/* ---- the planner ------------------------------------------------------------------------------------ */

/* floor(Delta_2^2) in integer units for L = c / gamma (KLS Theorem 1):
 *   min{ (L + sqrt(D))^2,  L^2 + D/4 + sqrt(2 ln(1/beta)) (L + sqrt(D)/2) }. */
static double delta2_sq(double L, uint32_t dim, double beta) {
    double sq = sqrt((double)dim);
    double a = (L + sq) * (L + sq);
    double b = L * L + (double)dim / 4.0 + sqrt(2.0 * log(1.0 / beta)) * (L + sq / 2.0);
    return a < b ? a : b;
}

int dprec_ddg_plan_make(const dprec_ddg_job *job, dprec_ddg_plan *out) {
    if (job == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (!(job->epsilon > 0.0) || !isfinite(job->epsilon) || !(job->delta > 0.0 && job->delta < 1.0) ||
        !(job->clip > 0.0) || !isfinite(job->clip) || !(job->q > 0.0 && job->q <= 1.0) || job->rounds < 1 ||
        job->d < 1 || job->d > DPREC_DDG_MAX_DIM || job->n_min < 1 || job->n_max < job->n_min ||
        job->bits_max < 2 || job->bits_max > DPREC_DDG_MAX_BITS)
        return DPREC_ERR_INVALID_ARGUMENT;
    dprec_ddg_plan p;
    memset(&p, 0, sizeof p);
    p.d = job->d;
    while ((1u << p.log2_dim) < job->d) p.log2_dim++;
    p.dim = 1u << p.log2_dim;
    p.clip = job->clip;
    p.beta = exp(-0.5); /* KLS's experiments (Sec. 6) */
    p.n_min = job->n_min;
    p.n_max = job->n_max;

    /* The clamp allowance is below 2 e^-98 per share whatever s is (clamp > 14 s); reserve it from delta. */
    double eta = (double)job->rounds * (double)job->n_max * (double)p.dim * 2.0 * exp(-98.0);
    double delta_conv = job->delta - (1.0 + exp(job->epsilon)) * eta;
    if (!(delta_conv > 0.0)) return DPREC_ERR_JOB_PARAMS;
    double z_star;
    int rc = dprec_gauss_noise_multiplier(job->epsilon, delta_conv, job->rounds, job->q, &z_star);
    if (rc != DPREC_OK) return rc;
    double x_target = 1.0 / (z_star * z_star);
    /* the decoded sum's error variance per coordinate and device as gamma -> 0: (c z*)^2 / n_min */
    double e0 = job->clip * z_star * job->clip * z_star / (double)job->n_min;

    int g0 = (int)ceil(log2(job->clip)); /* L = c / gamma <= 1 at the coarsest grid */
    dprec_ddg_plan best_fit;             /* the finest plan whose b fits bits_max */
    int have_fit = 0;
    double best_fit_e = 0.0;
    for (int g = g0; g > g0 - 64; g--) {
        double L = ldexp(job->clip, -g);
        if (L > 0x1p30) break;
        double n2 = floor(delta2_sq(L, p.dim, p.beta));
        if (!(n2 >= 1.0) || n2 >= 0x1p62) break;
        dprec_ddg_plan c = p;
        c.gamma_log2 = g;
        c.norm2_bound = (uint64_t)n2;
        double d2, d1;
        sens_of(c.norm2_bound, c.dim, &d2, &d1);
        /* the smallest share variance s2 (integer units) with X <= x_target: X decreases in s2; bisection */
        double lo = 0x1p-10, hi = 0x1p43;
        if (!(rdp_x_of(d2, d1, hi, c.n_min, c.n_max, c.dim) <= x_target)) continue;
        while (hi / lo > 1.0 + 1e-9) {
            double mid = sqrt(lo * hi);
            if (rdp_x_of(d2, d1, mid, c.n_min, c.n_max, c.dim) <= x_target) hi = mid;
            else lo = mid;
        }
        double num = ceil(hi * DPREC_DDG_SHARE_DEN);
        if (num > 0x1p53) continue;
        c.share_num = (uint64_t)num;
        c.clamp = clamp_of(c.share_num);
        c.bits = bits_for(c.norm2_bound, c.clamp, c.n_max);
        if (c.bits == 0) break; /* finer grids only need more bits */
        if (dprec_ddg_plan_check(&c, job->rounds) != DPREC_OK) continue;
        double e = ldexp(1.0, 2 * g) * (0.25 + share_var(&c)); /* rounding (<= 1/4) plus noise, per device */
        if (c.bits <= job->bits_max) {
            best_fit = c;
            best_fit_e = e;
            have_fit = 1;
            if (e <= 1.01 * e0) break; /* within 1% of the limit: coarsest such grid */
        } else {
            break; /* finer grids only need more bits */
        }
    }
    /* No grid within 1% fits bits_max: the finest that fits, if its error variance is at most twice the limit. */
    if (!have_fit || !(best_fit_e <= 2.0 * e0)) return DPREC_ERR_JOB_PARAMS;

    dprec_accountant a;
    dprec_accountant_init(&a);
    rc = dprec_accountant_add_discrete_gaussian(&a, best_fit.noise_multiplier, job->q, job->rounds);
    if (rc != DPREC_OK) return rc;
    double conv = job->delta - (1.0 + exp(job->epsilon)) * best_fit.delta_clamp;
    rc = dprec_accountant_epsilon(&a, conv, DPREC_CONVERSION_CKS, &best_fit.epsilon, NULL);
    if (rc != DPREC_OK) return rc;
    if (!(best_fit.epsilon <= job->epsilon)) return DPREC_ERR_INTERNAL; /* X <= 1/z*^2 guarantees it */
    *out = best_fit;
    return DPREC_OK;
}

/* ---- encode and decode -------------------------------------------------------------------------------- */

void dprec_ddg_reduce(const dprec_ddg_plan *p, const int64_t *y, uint64_t *out, uint32_t n) {
    uint64_t m = mask_of(p->bits);
    for (uint32_t j = 0; j < n; j++) out[j] = (uint64_t)y[j] & m; /* two's complement: y mod 2^b */
}

void dprec_ddg_add(const dprec_ddg_plan *p, uint64_t *acc, const uint64_t *v, uint32_t n) {
    uint64_t m = mask_of(p->bits);
    for (uint32_t j = 0; j < n; j++) acc[j] = (acc[j] + v[j]) & m;
}

/* One conditional-rounding try: z = floor(v) + Bernoulli(frac); 1 if ||z||^2 <= bound, 0 if not. */
static int round_try(dprec_rng *r, const double *v, uint32_t dim, uint64_t bound, int64_t *z, int *ok) {
    uint64_t sum = 0;
    for (uint32_t j = 0; j < dim; j++) {
        double f = floor(v[j]);
        double frac = v[j] - f; /* exact: v and floor(v) share the exponent range */
        int bit = 0;
        if (frac > 0.0) {
            int rc = dprec_sample_bernoulli(r, frac, &bit);
            if (rc != DPREC_OK) return rc;
        }
        int64_t zj = (int64_t)f + bit;
        z[j] = zj;
        uint64_t a = (uint64_t)(zj < 0 ? -zj : zj);
        sum += a * a; /* a <= 2^30 + 1 and sum <= bound < 2^62 before: no overflow */
        if (sum > bound) {
            *ok = 0;
            return DPREC_OK;
        }
    }
    *ok = 1;
    return DPREC_OK;
}

int dprec_ddg_encode(dprec_rng *r, const dprec_ddg_plan *p, const unsigned char seed[DPREC_DDG_SEED_SIZE],
                     const double *x, double *work, int64_t *z, int64_t *y, uint64_t *out) {
    if (r == NULL || p == NULL || seed == NULL || x == NULL || work == NULL || y == NULL || out == NULL)
        return DPREC_ERR_INVALID_ARGUMENT;
    if (p->dim != (1u << p->log2_dim) || p->dim < p->d || p->dim > DPREC_DDG_MAX_DIM || p->bits < 2 ||
        p->bits > DPREC_DDG_MAX_BITS || p->norm2_bound >= ((uint64_t)1 << 62) ||
        !(ldexp(p->clip, -p->gamma_log2) <= 0x1p30) || !(p->clip > 0.0))
        return DPREC_ERR_INVALID_ARGUMENT;
    double n2 = 0.0;
    for (uint32_t j = 0; j < p->d; j++) {
        if (!isfinite(x[j])) return DPREC_ERR_INVALID_ARGUMENT;
        n2 += x[j] * x[j];
    }
    if (!isfinite(n2)) return DPREC_ERR_INVALID_ARGUMENT;
    double nrm = sqrt(n2), f = nrm > p->clip ? p->clip / nrm : 1.0; /* 1. clip */
    for (uint32_t j = 0; j < p->dim; j++) work[j] = j < p->d ? x[j] * f : 0.0;
    dprec_ddg_rotate(seed, work, p->dim); /* 2. rotate */
    double L = ldexp(p->clip, -p->gamma_log2), v2 = 0.0;
    for (uint32_t j = 0; j < p->dim; j++) {
        work[j] = ldexp(work[j], -p->gamma_log2); /* 3. scale by 1/gamma (exact) */
        v2 += work[j] * work[j];
    }
    if (sqrt(v2) > L) { /* floating-point rounding of the rotation: bring the norm back to L */
        double s = L / sqrt(v2);
        for (uint32_t j = 0; j < p->dim; j++) work[j] *= s;
    }
    int64_t *zz = z != NULL ? z : y; /* 4. conditional randomized rounding */
    int ok = 0;
    for (unsigned t = 0; t < DPREC_DDG_ROUND_TRIES && !ok; t++) {
        int rc = round_try(r, work, p->dim, p->norm2_bound, zz, &ok);
        if (rc != DPREC_OK) return rc;
    }
    if (!ok) {
        /* Each try fails with probability <= beta = e^-1/2 (KLS Prop. 22), so this runs with probability below
         * e^-128. Truncation toward zero keeps |z_j| <= |v_j|, so ||z||^2 <= L^2 <= norm2_bound: the bound (a),
         * which privacy needs, still holds; only the rounding's unbiasedness is lost. */
        uint64_t sum = 0;
        for (uint32_t j = 0; j < p->dim; j++) {
            zz[j] = (int64_t)trunc(work[j]);
            uint64_t a = (uint64_t)(zz[j] < 0 ? -zz[j] : zz[j]);
            sum += a * a;
        }
        if (sum > p->norm2_bound)
            for (uint32_t j = 0; j < p->dim; j++) zz[j] = 0;
    }
    for (uint32_t j = 0; j < p->dim; j++) { /* 5. the noise share */
        int64_t e = 0;
        if (p->share_num > 0) {
            int rc = dprec_sample_discrete_gaussian(r, p->share_num, DPREC_DDG_SHARE_DEN, &e);
            if (rc != DPREC_OK) return rc;
            if (e > p->clamp) e = p->clamp;
            if (e < -p->clamp) e = -p->clamp;
        }
        int64_t zj = zz[j];
        if (z != NULL) z[j] = zj;
        y[j] = zj + e;
    }
    dprec_ddg_reduce(p, y, out, p->dim); /* 6. modulo 2^b */
    dprec_wipe(work, sizeof(double) * p->dim);
    return DPREC_OK;
}

int dprec_ddg_decode(const dprec_ddg_plan *p, const unsigned char seed[DPREC_DDG_SEED_SIZE], const uint64_t *sum,
                     double *work, double *x_out) {
    if (p == NULL || seed == NULL || sum == NULL || work == NULL || x_out == NULL || p->bits < 2 ||
        p->bits > DPREC_DDG_MAX_BITS || p->dim != (1u << p->log2_dim) || p->dim > DPREC_DDG_MAX_DIM ||
        p->dim < p->d)
        return DPREC_ERR_INVALID_ARGUMENT;
    uint64_t m = mask_of(p->bits), half = (uint64_t)1 << (p->bits - 1);
    for (uint32_t j = 0; j < p->dim; j++) {
        uint64_t s = sum[j] & m;
        int64_t v = s >= half ? (int64_t)s - (int64_t)(m + 1) : (int64_t)s; /* the signed residue */
        work[j] = ldexp((double)v, p->gamma_log2);
    }
    dprec_ddg_unrotate(seed, work, p->dim);
    for (uint32_t j = 0; j < p->d; j++) x_out[j] = work[j];
    return DPREC_OK;
}
