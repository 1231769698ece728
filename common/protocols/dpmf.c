/* dprec — the shared math of `dpmf` (common/protocols/dpmf.h; docs/privacy.md "dpmf"). */
#include "dpmf.h"

#include <math.h>
#include <string.h>

#include "bytes.h"
#include "dprec/status.h"

int dprec_dpmf_mode_of(const char *name) {
    if (name == NULL) return 0;
    if (strcmp(name, "trusted") == 0) return DPREC_DPMF_TRUSTED;
    if (strcmp(name, "relay") == 0) return DPREC_DPMF_RELAY;
    if (strcmp(name, "dynamic") == 0) return DPREC_DPMF_DYNAMIC;
    return 0;
}

const char *dprec_dpmf_mode_name(int mode) {
    switch (mode) {
    case DPREC_DPMF_TRUSTED: return "trusted";
    case DPREC_DPMF_RELAY: return "relay";
    case DPREC_DPMF_DYNAMIC: return "dynamic";
    default: return NULL;
    }
}

/* rho(e) = c^2 (sqrt(1 + (e/c)^2) - 1), written as e^2 / (sqrt(1 + (e/c)^2) + 1) to keep its digits near 0 */
double dprec_dpmf_rho(double e, double c) {
    double r = e / c;
    return e * e / (sqrt(1.0 + r * r) + 1.0);
}

double dprec_dpmf_psi(double e, double c) {
    double r = e / c;
    if (!isfinite(r)) return e > 0 ? c : (e < 0 ? -c : 0.0); /* the limit; NaN counts as 0 */
    return e / sqrt(1.0 + r * r);
}

double dprec_dpmf_rho2(double e, double c) {
    double r = e / c;
    if (!isfinite(r)) return 0.0;
    double s = 1.0 + r * r;
    return 1.0 / (s * sqrt(s));
}

static double x2_of(uint32_t d, double u_clip) {
    return (d > 1u ? u_clip * u_clip : 0.0) + 1.0;
}

double dprec_dpmf_privacy_lambda(uint32_t k, double u_clip, double eps_round) {
    double l = x2_of(2, u_clip) / expm1(eps_round / (2.0 * (double)k));
    return l > DPREC_DPMF_MIN_LAMBDA ? l : DPREC_DPMF_MIN_LAMBDA;
}

double dprec_dpmf_default_lambda(uint32_t d, uint32_t k, double huber, double u_clip, double eps_round) {
    double l = dprec_dpmf_privacy_lambda(k, u_clip, eps_round);
    dprec_dpmf_mech m;
    if (dprec_dpmf_mechanism(DPREC_DPMF_TRUSTED, d, k, huber, u_clip, l, eps_round, &m) != DPREC_OK) return l;
    return DPREC_DPMF_LAMBDA_PER_B * m.b > l ? DPREC_DPMF_LAMBDA_PER_B * m.b : l;
}

int dprec_dpmf_mechanism(int mode, uint32_t d, uint32_t k, double huber, double u_clip, double lambda,
                         double eps_round, dprec_dpmf_mech *out) {
    if (out == NULL || dprec_dpmf_mode_name(mode) == NULL || d < 1 || d > DPREC_DPMF_MAX_D || k < 1 ||
        k > DPREC_DPMF_MAX_MAX_ITEMS || !(huber > 0.0 && huber <= DPREC_DPMF_MAX_PARAM) ||
        !(u_clip > 0.0 && u_clip <= DPREC_DPMF_MAX_PARAM) || !(eps_round > 0.0 && eps_round <= DPREC_DPMF_MAX_ROUND_EPSILON))
        return DPREC_ERR_INVALID_ARGUMENT;
    dprec_dpmf_mech m;
    memset(&m, 0, sizeof m);
    m.mode = mode;
    m.d = d;
    m.k = k;
    m.huber = huber;
    m.u_clip = u_clip;
    m.eps_round = eps_round;
    const double x2 = x2_of(d, u_clip);
    /* ||x||_1 <= sqrt(d - 1) ||w|| + 1 (Cauchy-Schwarz on the d - 1 factor coordinates), |psi| < c */
    const double l1_grad = huber * (u_clip * sqrt((double)(d - 1u)) + 1.0);
    if (mode == DPREC_DPMF_TRUSTED) {
        if (!(lambda > 0.0 && lambda <= 1e12)) return DPREC_ERR_INVALID_ARGUMENT;
        m.coords = d;
        m.lambda = lambda;
        m.l1_item = l1_grad;
        m.l1_user = (double)k * l1_grad;
        m.jacobian = (double)k * log1p(x2 / lambda); /* CMS 2011 Thm. 9: log det(H + x x^T) / det(H) <= log(1 + X2/lambda) */
        if (!(m.jacobian <= eps_round / 2.0)) return DPREC_ERR_INVALID_ARGUMENT;
        m.eps_noise = eps_round - m.jacobian;
        /* the grid allowance: every one of the user's k d coordinates may move one more grid step (noise.h) */
        if (dprec_laplace_plan_init(&m.plan, m.l1_user, (uint64_t)k * d, m.eps_noise) != DPREC_OK)
            return DPREC_ERR_INVALID_ARGUMENT;
        m.b = dprec_laplace_plan_scale(&m.plan);
        m.grid_log2 = m.plan.k;
    } else {
        m.coords = d + 1u;
        m.l1_item = l1_grad + 1.0; /* the count coordinate */
        m.l1_user = (double)k * m.l1_item;
        /* rounding to the grid g <= b 2^-19 moves each of the k coords numbers by at most one more step */
        const double allow = (double)k * (double)m.coords * ldexp(1.0, -(DPREC_DPMF_GRID_BITS - 1));
        if (!(allow <= eps_round / 2.0)) return DPREC_ERR_INVALID_ARGUMENT;
        m.eps_noise = eps_round;
        m.b = m.l1_user / (eps_round - allow);
        int e;
        double f = frexp(m.b, &e); /* b = f 2^e, f in [0.5, 1): ceil(log2 b) = e, or e - 1 when f = 0.5 */
        m.grid_log2 = (f == 0.5 ? e - 1 : e) - DPREC_DPMF_GRID_BITS;
        const double g = ldexp(1.0, m.grid_log2);
        if (!((m.l1_user + (double)k * m.coords * g) / m.b <= eps_round * (1.0 + 1e-12)) || !(m.b / g > 0x1p19) ||
            !(m.b / g <= 0x1p20))
            return DPREC_ERR_INTERNAL; /* cannot happen: g <= b 2^-19 */
    }
    m.paper_epsilon = 2.0 * huber * sqrt(x2) * sqrt((double)d) / m.b;
    if (!isfinite(m.b) || !(m.b > 0.0)) return DPREC_ERR_INVALID_ARGUMENT;
    *out = m;
    return DPREC_OK;
}

int64_t dprec_dpmf_encode(double v, int grid_log2) {
    double y = ldexp(v, -grid_log2);
    if (!(fabs(y) < 0x1p62)) return 0; /* out of the stated range (callers never pass one): no value */
    return (int64_t)llround(y);
}

double dprec_dpmf_decode(uint64_t s, int grid_log2) {
    return ldexp((double)(int64_t)s, grid_log2);
}

int dprec_dpmf_prg_init(dprec_dpmf_prg *p, const unsigned char seed[DPREC_DPMF_SEED_SIZE], uint32_t domain) {
    mbedtls_aes_init(&p->aes);
    p->domain = domain;
    p->block = UINT64_MAX;
    return mbedtls_aes_setkey_enc(&p->aes, seed, 256) == 0 ? 0 : -1;
}

int dprec_dpmf_prg_u64(dprec_dpmf_prg *p, uint64_t index, uint64_t *out) {
    uint64_t block = index >> 1;
    if (block != p->block) {
        unsigned char in[16], o[16];
        dprec_st32(in, p->domain);
        dprec_st32(in + 4, 0u);
        dprec_st64(in + 8, block);
        if (mbedtls_aes_crypt_ecb(&p->aes, MBEDTLS_AES_ENCRYPT, in, o) != 0) return -1;
        p->buf[0] = dprec_ld64(o);
        p->buf[1] = dprec_ld64(o + 8);
        p->block = block;
        dprec_wipe(o, sizeof o);
    }
    *out = p->buf[index & 1u];
    return 0;
}

void dprec_dpmf_prg_free(dprec_dpmf_prg *p) {
    mbedtls_aes_free(&p->aes);
    dprec_wipe(p->buf, sizeof p->buf);
    p->block = UINT64_MAX;
}

int dprec_dpmf_h(dprec_dpmf_prg *p, uint64_t x, double *h) {
    uint64_t w;
    if (dprec_dpmf_prg_u64(p, x, &w) != 0) return -1;
    double u = ((double)(w >> 11) + 1.0) * 0x1p-53; /* (0, 1], exactly representable */
    *h = -log(u);
    return 0;
}

int dprec_dpmf_share(dprec_noise_stream *s, double h, double b_over_g, uint32_t K, int64_t *out) {
    if (s == NULL || out == NULL || !(h >= 0.0 && h <= 64.0) || !(b_over_g > 0x1p19 && b_over_g <= 0x1p20) || K < 1 ||
        K > DPREC_DPMF_MAX_SHARES)
        return DPREC_ERR_INVALID_ARGUMENT;
    const double s2 = 2.0 * h * b_over_g * b_over_g / (double)K; /* <= 2^47: the variance in grid steps */
    if (!(s2 > 0.0)) { /* h = 0 (U = 1, probability 2^-53): no noise from this coordinate's shares */
        *out = 0;
        return DPREC_OK;
    }
    /* s2 as num / 2^j: the largest j <= 63 with num = round(s2 2^j) <= 2^53 and num 2^j < 2^64 (dgauss's bounds) */
    int e;
    (void)frexp(s2, &e); /* s2 < 2^e */
    int j = 53 - e;
    if (j > (63 - e) / 2) j = (63 - e) / 2;
    if (j > 63) j = 63;
    if (j < 0) j = 0;
    double n = nearbyint(ldexp(s2, j));
    if (n < 1.0) n = 1.0;
    uint64_t num = (uint64_t)n, den = (uint64_t)1 << j;
    while (num > ((uint64_t)1 << 53) || (den > 1 && num > UINT64_MAX / den)) { /* never, by the choice of j */
        if (den == 1) return DPREC_ERR_INTERNAL;
        num = (num + 1) / 2;
        den /= 2;
    }
    int64_t y;
    int rc = dprec_sample_discrete_gaussian_stream(s, num, den, &y);
    if (rc != DPREC_OK) return rc;
    if (y > DPREC_DPMF_SHARE_MAX) y = DPREC_DPMF_SHARE_MAX; /* |y| > 2^40 has probability below exp(-2^32) */
    if (y < -DPREC_DPMF_SHARE_MAX) y = -DPREC_DPMF_SHARE_MAX;
    *out = y;
    return DPREC_OK;
}
