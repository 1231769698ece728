/* dprec aggregator — the local-DP protocols of seed 000 (Shin, Kim, Shin, Xiao, TKDE 2018), global step:
 * ldp-gd (Private GD, Algorithm 1), ldp-gddr (GD-DR, Algorithm 2) and ldp-rr (randomized response + Laplace).
 * The device side and the payloads are sdk/protocols/ldp.c and common/protocols/ldp.h; docs/privacy.md derives the
 * guarantees. Nothing here needs to be trusted: every report was randomized on its device.
 *
 * Each round t (t = 1, 2, ...; the release it produces is t + 1):
 *   grad = the unbiased average of the round's n reports (below, per protocol)
 *   V    <- V - gamma_t (grad + 2 lambda V)            (Alg. 1 line 18; Alg. 2 line 22)
 *   gamma_t = lr / t ("inverse", the paper's O(1/t)) or lr ("constant").
 * Item biases stay 0 and mu is the public params.mu (default the middle of the rating scale). With
 * params.user_bias (default true) v_j[0] is pinned to 1 and never updated, so each device's least-squares
 * u[0] is its own offset, learned where its data is at no privacy cost; the devices then sample and report
 * only the d - 1 learned coordinates (cells = m (d - 1), resp. q (d - 1)). user_bias false is the paper's
 * plain r ~ u . v.
 *
 *   ldp-gd:   a report (j, l, +-B), B = m d (e^eps + 1)/(e^eps - 1): grad_jl = (sum of the reports at (j, l)) / n.
 *             E[report at (j, l)] = x_jl: the cell is hit with probability 1/(m d) and then the sign's mean is
 *             x (e^eps - 1)/(e^eps + 1), so the average is unbiased (seed 000, Theorem 2's proof).
 *   ldp-gddr: the same on B = Phi V (q x d cells, B = q d (...)); grad_V = Phi^+ grad_B with the exact
 *             pseudo-inverse Phi^+ = Phi^T (Phi Phi^T)^-1 (Phi is q x m with q <= m, full row rank with
 *             probability 1), applied by a Cholesky factorization of Phi Phi^T computed once per Phi.
 *   ldp-rr:   grad_j = (1/n) sum_i ((y*_ij - p/2) / (1 - p)) g*_ij (seed 000's debiased estimate; E[(y* - p/2) /
 *             (1 - p)] = y_ij, independent of the Laplace noise in g*). With user_bias the pinned g*_j0 is 0.
 * The round's privacy: pure eps/k-DP per device and round, eps the job's budget, k = params.k >= rounds. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_protocol.h"
#include "bytes.h"
#include "ldp.h"
#include "noise.h"

#define LDP_DEFAULT_LAMBDA 1e-8 /* lambda_u = lambda_v = 1e-8 in seed 000's experiments */
#define LDP_DEFAULT_LR 0.001
#define LDP_DEFAULT_INIT 0.1
#define LDP_MAX_CELLS ((uint64_t)1 << 26) /* m d: the release and the gradient accumulator */
#define LDP_MAX_PHI ((uint64_t)1 << 25)   /* q m doubles of Phi (256 MiB) */
#define LDP_MAX_RR_CELLS ((uint64_t)1 << 22) /* m d of one ldp-rr report (16 MiB of floats) */

typedef struct ldp_params {
    uint64_t k;            /* the rounds the budget is split over */
    double lr, lambda, init_scale, mu;
    int constant_lr;
    int user_bias;         /* v_j[0] pinned to 1: u[0] is each device's own offset (default on) */
    uint64_t seed;         /* V's initialization */
    uint32_t q;            /* gddr */
    uint64_t phi_seed;     /* gddr */
    dprec_rr_unit rr_unit; /* rr */
    double rr_split;       /* rr */
} ldp_params;

static int integer_in(const cJSON *it, double lo, double hi, double *out) {
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || floor(it->valuedouble) != it->valuedouble ||
        it->valuedouble < lo || it->valuedouble > hi)
        return 0;
    *out = it->valuedouble;
    return 1;
}

/* Reads and checks params for protocol id (already validated at job creation when called later). */
static int parse_params(const agg_job *job, uint16_t id, const cJSON *params, ldp_params *pp, char *err,
                        size_t errcap) {
    memset(pp, 0, sizeof *pp);
    pp->lr = LDP_DEFAULT_LR;
    pp->lambda = LDP_DEFAULT_LAMBDA;
    pp->init_scale = LDP_DEFAULT_INIT;
    pp->mu = (job->rating_min + job->rating_max) / 2.0;
    pp->seed = 1;
    pp->q = job->m < DPREC_LDP_DEFAULT_Q ? job->m : DPREC_LDP_DEFAULT_Q;
    pp->phi_seed = 1;
    pp->rr_unit = DPREC_RR_USER;
    pp->rr_split = 0.5;
    pp->user_bias = 1;
    const cJSON *it;
    double v;
    cJSON_ArrayForEach(it, params) {
        const char *key = it->string != NULL ? it->string : "?";
        if (strcmp(key, "k") == 0) {
            if (!integer_in(it, 1, 1e6, &v)) goto bad_k;
            pp->k = (uint64_t)v;
        } else if (strcmp(key, "lr") == 0) {
            if (!cJSON_IsNumber(it) || !(it->valuedouble > 0.0 && it->valuedouble <= 1e9)) {
                snprintf(err, errcap, "params.lr must be in (0, 1e9]");
                return -1;
            }
            pp->lr = it->valuedouble;
        } else if (strcmp(key, "lr_schedule") == 0) {
            if (cJSON_IsString(it) && strcmp(it->valuestring, "inverse") == 0) pp->constant_lr = 0;
            else if (cJSON_IsString(it) && strcmp(it->valuestring, "constant") == 0) pp->constant_lr = 1;
            else {
                snprintf(err, errcap, "params.lr_schedule must be \"inverse\" (lr / t) or \"constant\"");
                return -1;
            }
        } else if (strcmp(key, "user_bias") == 0) {
            if (!cJSON_IsBool(it)) {
                snprintf(err, errcap, "params.user_bias must be true or false");
                return -1;
            }
            pp->user_bias = cJSON_IsTrue(it);
        } else if (strcmp(key, "lambda") == 0) {
            if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0.0 && it->valuedouble <= 1e6)) {
                snprintf(err, errcap, "params.lambda must be in [0, 1e6]");
                return -1;
            }
            pp->lambda = it->valuedouble;
        } else if (strcmp(key, "init_scale") == 0) {
            if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0.0 && it->valuedouble <= 1e3)) {
                snprintf(err, errcap, "params.init_scale must be in [0, 1e3]");
                return -1;
            }
            pp->init_scale = it->valuedouble;
        } else if (strcmp(key, "mu") == 0) {
            if (!cJSON_IsNumber(it) || !(it->valuedouble >= job->rating_min && it->valuedouble <= job->rating_max)) {
                snprintf(err, errcap, "params.mu must be a number within the rating scale");
                return -1;
            }
            pp->mu = it->valuedouble;
        } else if (strcmp(key, "seed") == 0) {
            if (!integer_in(it, 0, 9007199254740992.0, &v)) {
                snprintf(err, errcap, "params.seed must be an integer in [0, 2^53]");
                return -1;
            }
            pp->seed = (uint64_t)v;
        } else if (id == DPREC_PROTO_LDP_GDDR && strcmp(key, "q") == 0) {
            if (!integer_in(it, 1, job->m, &v)) {
                snprintf(err, errcap, "params.q must be an integer in 1..m (m = %u)", job->m);
                return -1;
            }
            pp->q = (uint32_t)v;
        } else if (id == DPREC_PROTO_LDP_GDDR && strcmp(key, "phi_seed") == 0) {
            if (!integer_in(it, 0, 9007199254740992.0, &v)) {
                snprintf(err, errcap, "params.phi_seed must be an integer in [0, 2^53]");
                return -1;
            }
            pp->phi_seed = (uint64_t)v;
        } else if (id == DPREC_PROTO_LDP_RR && strcmp(key, "rr_unit") == 0) {
            /* "rating" (seed 000's per-item setting) is refused: the device's u is fitted from all of its
             * ratings, so one rating changes every row of the report and the rating-level epsilon it would
             * print is false (about (1 + n_i) / 2 times too small; docs/privacy.md "Why not rr_unit: rating").
             * The devices refuse it too (sdk/protocols/ldp.c). */
            if (cJSON_IsString(it) && strcmp(it->valuestring, "user") == 0) pp->rr_unit = DPREC_RR_USER;
            else {
                snprintf(err, errcap, "params.rr_unit must be \"user\": \"rating\" is refused, since u is fitted from "
                         "all of a user's ratings and one rating changes every row of the report");
                return -1;
            }
        } else if (id == DPREC_PROTO_LDP_RR && strcmp(key, "rr_split") == 0) {
            if (!cJSON_IsNumber(it) || !(it->valuedouble > 0.0 && it->valuedouble < 1.0)) {
                snprintf(err, errcap, "params.rr_split (epsilon_1 / epsilon) must be in (0, 1)");
                return -1;
            }
            pp->rr_split = it->valuedouble;
        } else {
            snprintf(err, errcap, "params.%s is not a parameter of %s (k, lr, lr_schedule, lambda, init_scale, mu, seed, user_bias%s)",
                     key, dprec_protocol_name(id),
                     id == DPREC_PROTO_LDP_GDDR ? ", q, phi_seed" : id == DPREC_PROTO_LDP_RR ? ", rr_unit, rr_split" : "");
            return -1;
        }
    }
    if (pp->k == 0 || pp->k < (uint64_t)job->rounds) goto bad_k;
    if (job->d < 2) pp->user_bias = 0;
    return 0;
bad_k:
    snprintf(err, errcap, "params.k (the rounds the budget is split over, epsilon / k each) must be an integer "
                          "in rounds..1e6 (rounds = %lld)", (long long)job->rounds);
    return -1;
}

static int load_params(const agg_job *job, ldp_params *pp, char *err, size_t errcap) {
    cJSON *params = cJSON_Parse(job->params);
    if (params == NULL) {
        snprintf(err, errcap, "the job's params are not JSON");
        return -1;
    }
    int rc = parse_params(job, job->proto->id, params, pp, err, errcap);
    cJSON_Delete(params);
    return rc;
}

/* The round's epsilon: the budget over k, rounded down until k copies add up to at most the budget in
 * floating point (the budget gate and the device compose by the same sum). */
static double round_epsilon(const agg_job *job, uint64_t k) {
    double e = job->budget_epsilon / (double)k;
    while (e > 0.0 && (double)k * e > job->budget_epsilon) e = nextafter(e, 0.0);
    return e;
}

static int ldp_round_step(const agg_job *job, dprec_step *step) {
    ldp_params pp;
    char err[AGG_ERRMSG];
    if (!job->has_budget || load_params(job, &pp, err, sizeof err) != 0) return -1;
    memset(step, 0, sizeof *step);
    step->kind = DPREC_STEP_PURE;
    step->epsilon = round_epsilon(job, pp.k);
    step->steps = 1;
    return step->epsilon > 0.0 ? 0 : -1;
}

static int ldp_validate_job(const agg_job *shape, const cJSON *params, char *err, size_t errcap) {
    ldp_params pp;
    uint16_t id = shape->proto->id;
    if ((uint64_t)shape->m * (shape->d + 1u) > LDP_MAX_CELLS) {
        snprintf(err, errcap, "%s supports m (d + 1) <= %llu", shape->proto->name, (unsigned long long)LDP_MAX_CELLS);
        return -1;
    }
    if (parse_params(shape, id, params, &pp, err, errcap) != 0) return -1;
    if (id == DPREC_PROTO_LDP_GDDR && (uint64_t)pp.q * shape->m > LDP_MAX_PHI) {
        snprintf(err, errcap, "ldp-gddr keeps Phi (q x m doubles): q m must be <= %llu", (unsigned long long)LDP_MAX_PHI);
        return -1;
    }
    if (id == DPREC_PROTO_LDP_RR && (uint64_t)shape->m * shape->d > LDP_MAX_RR_CELLS) {
        snprintf(err, errcap, "an ldp-rr report holds m d floats: m d must be <= %llu", (unsigned long long)LDP_MAX_RR_CELLS);
        return -1;
    }
    if (!shape->has_budget || shape->budget_delta != 0.0) {
        snprintf(err, errcap, "%s is pure epsilon-DP: give budget {\"epsilon\": E, \"delta\": 0}", shape->proto->name);
        return -1;
    }
    return 0;
}

static int ldp_validate_payload(const agg_job *job, const unsigned char *p, size_t len, char *err, size_t errcap) {
    if (job->proto->id == DPREC_PROTO_LDP_RR) {
        size_t want = dprec_ldp_rr_payload(job->m, job->d);
        if (len != want || dprec_ld32(p) != job->m || dprec_ld32(p + 4) != job->d) {
            snprintf(err, errcap, "an ldp-rr payload is [m][d] + bits + m d floats (%zu bytes for this job)", want);
            return -1;
        }
        size_t bits = (((size_t)job->m + 7u) / 8u + 3u) & ~(size_t)3u;
        for (size_t b = job->m; b < 8u * bits; b++)
            if ((unsigned)p[8 + b / 8u] & (1u << (b % 8u))) {
                snprintf(err, errcap, "padding bits of y* must be zero");
                return -1;
            }
        const unsigned char *g = p + 8 + bits;
        ldp_params pp;
        if (load_params(job, &pp, err, errcap) != 0) return -1;
        for (size_t k = 0; k < (size_t)job->m * job->d; k++) {
            float v = dprec_ldf32(g + 4 * k);
            if (!isfinite(v)) {
                snprintf(err, errcap, "g*[%zu] is not finite", k);
                return -1;
            }
            if (pp.user_bias && k % job->d == 0 && v != 0.0f) { /* the pinned coordinate carries nothing */
                snprintf(err, errcap, "g*[%zu] is the pinned coordinate of user_bias and must be 0", k);
                return -1;
            }
        }
        return 0;
    }
    if (len != DPREC_LDP_SIGN_PAYLOAD) {
        snprintf(err, errcap, "a %s payload is 12 bytes", job->proto->name);
        return -1;
    }
    uint32_t cell = dprec_ld32(p), l = dprec_ld32(p + 4);
    ldp_params pp;
    if (load_params(job, &pp, err, errcap) != 0) return -1;
    uint32_t cells = job->proto->id == DPREC_PROTO_LDP_GDDR ? pp.q : job->m;
    uint32_t lmin = pp.user_bias ? 1u : 0u;
    if (cell >= cells || l < lmin || l >= job->d || p[8] > 1 || p[9] != 0 || p[10] != 0 || p[11] != 0) {
        snprintf(err, errcap, "cell %u (< %u), l %u (in %u..%u), sign byte 0/1 and zero padding expected", cell, cells, l, lmin,
                 job->d - 1);
        return -1;
    }
    return 0;
}

static int ldp_initial_model(const agg_job *job, agg_model *out, char *err, size_t errcap) {
    ldp_params pp;
    if (load_params(job, &pp, err, errcap) != 0) return -1;
    if (agg_model_random(job, pp.seed, pp.init_scale, pp.mu, out, err, errcap) != 0) return -1;
    if (pp.user_bias)
        for (uint32_t j = 0; j < job->m; j++) out->v[(size_t)j * job->d] = 1.0f;
    return 0;
}

/* ---- Phi and its pseudo-inverse (ldp-gddr) ----------------------------------------------------------- */

/* One factored Phi, kept between rounds (Phi is fixed per job: seed 000 Alg. 2 line 1 draws it once). */
static pthread_mutex_t phi_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int valid;
    unsigned char seed[32];
    uint32_t q, m;
    double *phi;  /* q x m, row-major: exactly dprec_phi_entry(seed, q, s, j), as the devices compute it */
    double *chol; /* q x q, the lower Cholesky factor of Phi Phi^T */
} phi_cache;

/* In-place Cholesky of the n x n SPD matrix a (lower triangle). 0, or -1 if not positive definite. */
static int cholesky(double *a, uint32_t n) {
    for (uint32_t j = 0; j < n; j++) {
        double s = a[(size_t)j * n + j];
        for (uint32_t k = 0; k < j; k++) s -= a[(size_t)j * n + k] * a[(size_t)j * n + k];
        if (!(s > 0.0)) return -1;
        double ljj = sqrt(s);
        a[(size_t)j * n + j] = ljj;
        for (uint32_t i = j + 1; i < n; i++) {
            double t = a[(size_t)i * n + j];
            const double *ri = a + (size_t)i * n, *rj = a + (size_t)j * n;
            for (uint32_t k = 0; k < j; k++) t -= ri[k] * rj[k];
            a[(size_t)i * n + j] = t / ljj;
        }
    }
    return 0;
}

/* Solves (L L^T) x = b in place for one right-hand side of length n. */
static void chol_solve(const double *l, uint32_t n, double *b) {
    for (uint32_t i = 0; i < n; i++) {
        double t = b[i];
        for (uint32_t k = 0; k < i; k++) t -= l[(size_t)i * n + k] * b[k];
        b[i] = t / l[(size_t)i * n + i];
    }
    for (uint32_t i = n; i-- > 0;) {
        double t = b[i];
        for (uint32_t k = i + 1; k < n; k++) t -= l[(size_t)k * n + i] * b[k];
        b[i] = t / l[(size_t)i * n + i];
    }
}

/* Makes the cache hold Phi(seed, q, m). Called with phi_mu held. 0 or -1. */
static int phi_prepare(const unsigned char seed[32], uint32_t q, uint32_t m, char *err, size_t errcap) {
    if (phi_cache.valid && phi_cache.q == q && phi_cache.m == m && memcmp(phi_cache.seed, seed, 32) == 0) return 0;
    free(phi_cache.phi);
    free(phi_cache.chol);
    memset(&phi_cache, 0, sizeof phi_cache);
    double *phi = malloc(sizeof(double) * (size_t)q * m);
    double *g = malloc(sizeof(double) * (size_t)q * q);
    if (phi == NULL || g == NULL) {
        free(phi);
        free(g);
        snprintf(err, errcap, "out of memory for Phi (%u x %u)", q, m);
        return -1;
    }
    for (uint32_t s = 0; s < q; s++)
        for (uint32_t j = 0; j < m; j++) phi[(size_t)s * m + j] = dprec_phi_entry(seed, q, s, j);
    for (uint32_t a = 0; a < q; a++) /* G = Phi Phi^T, lower triangle */
        for (uint32_t b = 0; b <= a; b++) {
            const double *ra = phi + (size_t)a * m, *rb = phi + (size_t)b * m;
            double t = 0.0;
            for (uint32_t j = 0; j < m; j++) t += ra[j] * rb[j];
            g[(size_t)a * q + b] = t;
        }
    if (cholesky(g, q) != 0) {
        free(phi);
        free(g);
        snprintf(err, errcap, "Phi Phi^T is not positive definite (q = %u, m = %u)", q, m);
        return -1;
    }
    memcpy(phi_cache.seed, seed, 32);
    phi_cache.q = q;
    phi_cache.m = m;
    phi_cache.phi = phi;
    phi_cache.chol = g;
    phi_cache.valid = 1;
    return 0;
}

int agg_ldp_pinv_apply(uint64_t phi_seed, uint32_t q, uint32_t m, uint32_t d, const double *gb, double *gv, char *err,
                       size_t errcap) {
    unsigned char seed[32];
    dprec_phi_seed(phi_seed, seed);
    double *y = malloc(sizeof(double) * ((size_t)q > 0 ? q : 1));
    if (y == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    pthread_mutex_lock(&phi_mu);
    int rc = phi_prepare(seed, q, m, err, errcap);
    if (rc == 0) {
        memset(gv, 0, sizeof(double) * (size_t)m * d);
        for (uint32_t l = 0; l < d; l++) {
            for (uint32_t s = 0; s < q; s++) y[s] = gb[(size_t)s * d + l];
            chol_solve(phi_cache.chol, q, y); /* y = (Phi Phi^T)^-1 gb[:, l] */
            for (uint32_t s = 0; s < q; s++) {
                const double *row = phi_cache.phi + (size_t)s * m;
                for (uint32_t j = 0; j < m; j++) gv[(size_t)j * d + l] += row[j] * y[s]; /* Phi^T y */
            }
        }
    }
    pthread_mutex_unlock(&phi_mu);
    free(y);
    return rc;
}

int agg_ldp_phi_entry(uint64_t phi_seed, uint32_t q, uint32_t m, uint32_t s, uint32_t j, double *out) {
    unsigned char seed[32];
    char err[AGG_ERRMSG];
    dprec_phi_seed(phi_seed, seed);
    pthread_mutex_lock(&phi_mu);
    int rc = phi_prepare(seed, q, m, err, sizeof err);
    if (rc == 0) *out = phi_cache.phi[(size_t)s * m + j];
    pthread_mutex_unlock(&phi_mu);
    return rc;
}

/* ---- the global step ----------------------------------------------------------------------------------- */

/* ldp-rr's bound on a reported g* coordinate (issue 36; docs/privacy.md "Poisoning"): the device sends the clipped
 * gradient (|g| <= Delta / 2, rp.clip) plus the Laplace plan's noise on the grid g = 2^k, t grid steps of scale, so an
 * honest |g*| exceeds clip + g + T t g with probability P(|DLap(t)| > T t) <= 2 e^-T = 2^-39 at T = 40 ln 2 (the
 * discrete Laplace's tail, common/noise.h). The aggregator clamps every coordinate to that bound: post-processing of
 * the randomized report (no privacy cost), which changes an honest report with probability below 2^-39 a coordinate,
 * and bounds what one device can send. */
#define LDP_RR_TAIL (40.0 * 0.69314718055994530942)
static int rr_bounds(const agg_job *job, const ldp_params *pp, dprec_rr_params *rp, double *gmax) {
    dprec_laplace_plan plan;
    const uint32_t dl = job->d - (pp->user_bias ? 1u : 0u);
    if (dprec_rr_params_init(rp, pp->rr_unit, round_epsilon(job, pp->k), pp->rr_split, job->m, dl,
                             job->rating_max - job->rating_min) != 0 ||
        dprec_laplace_plan_init(&plan, rp->l1, rp->n, rp->eps2) != DPREC_OK)
        return -1;
    *gmax = rp->clip + ldexp(1.0, plan.k) + LDP_RR_TAIL * dprec_laplace_plan_scale(&plan);
    return 0;
}

/* One report's contribution to the round's sum (gcells coordinates: cells x d, item- or row-major), each coordinate
 * once, handed to put (added to a double sum, or folded into the round's fixed-point sum): ldp-gd, ldp-gddr, +-B in
 * one cell; ldp-rr, (y* - p/2) / (1 - p) g* with every g* clamped to rr_bounds. 0 or -1. */
typedef void (*ldp_put)(void *ctx, uint64_t i, double v);

static int contribute(const agg_job *job, const ldp_params *pp, const unsigned char *payload, ldp_put put, void *ctx) {
    const uint32_t m = job->m, d = job->d;
    if (job->proto->id == DPREC_PROTO_LDP_RR) {
        dprec_rr_params rp;
        double gmax;
        if (rr_bounds(job, pp, &rp, &gmax) != 0) return -1;
        size_t bits = (((size_t)m + 7u) / 8u + 3u) & ~(size_t)3u;
        const double lo = (0.0 - rp.p / 2.0) / (1.0 - rp.p), hi = (1.0 - rp.p / 2.0) / (1.0 - rp.p);
        const unsigned char *yb = payload + 8, *g = yb + bits;
        for (uint32_t j = 0; j < m; j++) {
            double f = ((unsigned)yb[j / 8u] >> (j % 8u)) & 1u ? hi : lo; /* (y* - p/2) / (1 - p) */
            for (uint32_t l = 0; l < d; l++) {
                double x = (double)dprec_ldf32(g + 4u * ((size_t)j * d + l));
                put(ctx, (uint64_t)j * d + l, f * (x > gmax ? gmax : (x < -gmax ? -gmax : x)));
            }
        }
        return 0;
    }
    uint64_t cells = (uint64_t)(job->proto->id == DPREC_PROTO_LDP_GDDR ? pp->q : m) * (d - (pp->user_bias ? 1u : 0u));
    const double b = dprec_ldp_magnitude(cells, round_epsilon(job, pp->k));
    put(ctx, (uint64_t)dprec_ld32(payload) * d + dprec_ld32(payload + 4), payload[8] ? b : -b);
    return 0;
}

static void put_double(void *ctx, uint64_t i, double v) {
    ((double *)ctx)[i] += v;
}

static void put_sum(void *ctx, uint64_t i, double v) {
    agg_sum_put(ctx, i, v);
}

/* The round's sum of the reports in doubles (the statistic hook's). 0 or -1. */
static int ldp_sum(const agg_job *job, const ldp_params *pp, const agg_report *reports, size_t n, double *grad) {
    for (size_t i = 0; i < n; i++)
        if (contribute(job, pp, reports[i].payload, put_double, grad) != 0) return -1;
    return 0;
}

static size_t grad_cells(const agg_job *job, const ldp_params *pp) {
    return (size_t)(job->proto->id == DPREC_PROTO_LDP_GDDR ? pp->q : job->m) * job->d;
}

/* Every job folds (the reports were randomized on the devices; the step is their average): gcells coordinates, each
 * moved by one report by at most B (ldp-gd, ldp-gddr) or (1 - p/2) / (1 - p) G (ldp-rr, rr_bounds). Rounding toward
 * zero is post-processing of randomized reports: it costs no privacy. */
static int ldp_fold_spec(const agg_job *job, agg_fold_spec *spec) {
    ldp_params pp;
    char err[AGG_ERRMSG];
    if (load_params(job, &pp, err, sizeof err) != 0) return 0;
    spec->coords = grad_cells(job, &pp);
    if (job->proto->id == DPREC_PROTO_LDP_RR) {
        dprec_rr_params rp;
        double gmax;
        if (rr_bounds(job, &pp, &rp, &gmax) != 0) return 0;
        spec->bound = (1.0 - rp.p / 2.0) / (1.0 - rp.p) * gmax;
    } else {
        uint64_t cells = (uint64_t)(job->proto->id == DPREC_PROTO_LDP_GDDR ? pp.q : job->m) *
                         (job->d - (pp.user_bias ? 1u : 0u));
        spec->bound = dprec_ldp_magnitude(cells, round_epsilon(job, pp.k));
    }
    return spec->coords > 0;
}

static int ldp_fold(const agg_job *job, const unsigned char *payload, size_t len, agg_sum *sum) {
    ldp_params pp;
    char err[AGG_ERRMSG];
    (void)len; /* validated at intake */
    if (load_params(job, &pp, err, sizeof err) != 0 || sum->coords != grad_cells(job, &pp)) return -1;
    return contribute(job, &pp, payload, put_sum, sum);
}

/* The average of the round's sum (sum->count reports), then the GD step (ldp-gddr through Phi^+). */
static int ldp_sum_step(const agg_job *job, const agg_model *prev, const agg_sum *sum, dprec_rng *rng,
                        agg_model *next, char *err, size_t errcap) {
    (void)rng; /* the reports were randomized on the devices: the aggregator adds no noise */
    const size_t n = (size_t)sum->count;
    ldp_params pp;
    if (load_params(job, &pp, err, errcap) != 0) return -1;
    const uint32_t m = job->m, d = job->d;
    if (prev->d != d || prev->m != m) {
        snprintf(err, errcap, "release shape differs from the job");
        return -1;
    }
    memset(next, 0, sizeof *next);
    next->m = m;
    next->d = d;
    next->mu = prev->mu;
    next->v = malloc(sizeof(float) * (size_t)m * d);
    next->bias = calloc(m, sizeof(float));
    if (next->bias != NULL && prev->bias != NULL) memcpy(next->bias, prev->bias, sizeof(float) * m); /* not learned */
    size_t gcells = (size_t)(job->proto->id == DPREC_PROTO_LDP_GDDR ? pp.q : m) * d;
    double *grad = calloc(gcells > 0 ? gcells : 1, sizeof(double));
    double *gv = NULL;
    if (next->v == NULL || next->bias == NULL || grad == NULL) goto oom;
    memcpy(next->v, prev->v, sizeof(float) * (size_t)m * d);
    if (n == 0) { /* nothing reported: V stays */
        free(grad);
        return 0;
    }
    if (sum->coords != gcells) {
        snprintf(err, errcap, "%s: the round's sum does not match the job", job->proto->name);
        goto fail;
    }
    for (size_t k = 0; k < gcells; k++) grad[k] = agg_sum_value(sum, k) / (double)n;
    const double *gvv = grad;
    if (job->proto->id == DPREC_PROTO_LDP_GDDR) {
        gv = malloc(sizeof(double) * (size_t)m * d);
        if (gv == NULL) goto oom;
        if (agg_ldp_pinv_apply(pp.phi_seed, pp.q, m, d, grad, gv, err, errcap) != 0) goto fail;
        gvv = gv;
    }
    const double t = (double)(job->round > 0 ? job->round : 1);
    const double gamma = pp.constant_lr ? pp.lr : pp.lr / t;
    for (size_t k = 0; k < (size_t)m * d; k++) {
        if (pp.user_bias && k % d == 0) continue; /* pinned at 1 */
        double v = (double)prev->v[k];
        double nv = v - gamma * (gvv[k] + 2.0 * pp.lambda * v);
        /* a non-finite or float-overflowing step keeps the old entry (only reachable with absurd lr) */
        if (isfinite(nv) && fabs(nv) < 3e38) next->v[k] = (float)nv;
    }
    free(grad);
    free(gv);
    return 0;
oom:
    snprintf(err, errcap, "out of memory in the %s global step", job->proto->name);
fail:
    free(grad);
    free(gv);
    agg_model_free(next);
    return -1;
}

/* The reports folded into the round's fixed-point sum first (agg_fold_step), as the streaming path folds them. */
static int ldp_global_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                           dprec_rng *rng, agg_model *next, char *err, size_t errcap) {
    return agg_fold_step(job, prev, reports, n, rng, next, err, errcap);
}

/* How far k of a round's n reports move it (docs/privacy.md "Poisoning"). ldp-gd, ldp-gddr: a report is +-B in one
 * cell, whatever its device holds, so one moves the sum by B and k by k B. The step averages: with S_h the other n - k
 * reports' sum (||S_h|| <= (n - k) B), the average moves by ||S_k / n - k S_h / (n (n - k))|| <= 2 k B / n, and V by
 * gamma_t times that (ldp-gd; ldp-gddr multiplies by Phi^+'s operator norm, which the step does not compute: no
 * release bound stated). ldp-rr: every g* clamped to rr_bounds' G and each factor (y* - p/2) / (1 - p) at most
 * (1 - p/2) / (1 - p), so one report moves the sum by at most sqrt(m d') (1 - p/2) / (1 - p) G (d' = the learned
 * coordinates; the pinned ones are refused unless 0), and V by gamma_t 2 k that / n. Item biases are not learned. */
static int ldp_influence(const agg_job *job, uint64_t k, uint64_t n, agg_influence *out) {
    ldp_params pp;
    char err[AGG_ERRMSG];
    out->per_report = out->stat = out->release = out->bias_abs = NAN;
    if (load_params(job, &pp, err, sizeof err) != 0) return -1;
    const uint32_t dl = job->d - (pp.user_bias ? 1u : 0u);
    if (job->proto->id == DPREC_PROTO_LDP_RR) {
        dprec_rr_params rp;
        double gmax;
        if (rr_bounds(job, &pp, &rp, &gmax) != 0) return -1;
        out->per_report = sqrt((double)job->m * dl) * (1.0 - rp.p / 2.0) / (1.0 - rp.p) * gmax;
    } else {
        uint64_t cells = (uint64_t)(job->proto->id == DPREC_PROTO_LDP_GDDR ? pp.q : job->m) * dl;
        out->per_report = dprec_ldp_magnitude(cells, round_epsilon(job, pp.k));
    }
    out->stat = (double)k * out->per_report;
    const double t = (double)(job->round > 0 ? job->round : 1);
    const double gamma = pp.constant_lr ? pp.lr : pp.lr / t;
    if (job->proto->id != DPREC_PROTO_LDP_GDDR && n > 0) out->release = gamma * 2.0 * out->stat / (double)n;
    return 0;
}

/* The round's sum of the reports before the average (ldp_sum). */
static int ldp_statistic(const agg_job *job, const agg_report *reports, size_t n, double **out, size_t *len,
                         char *err, size_t errcap) {
    ldp_params pp;
    if (load_params(job, &pp, err, errcap) != 0) return -1;
    *len = (size_t)(job->proto->id == DPREC_PROTO_LDP_GDDR ? pp.q : job->m) * job->d;
    *out = calloc(*len > 0 ? *len : 1, sizeof(double));
    if (*out == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    if (ldp_sum(job, &pp, reports, n, *out) != 0) {
        free(*out);
        *out = NULL;
        snprintf(err, errcap, "%s parameters out of range", job->proto->name);
        return -1;
    }
    return 0;
}

/* ldp-rr: m d floats; the others: one sign (issue 18: the front end caps the body before reading it) */
static uint64_t ldp_max_payload(const agg_job *job) {
    return job->proto->id == DPREC_PROTO_LDP_RR ? (uint64_t)dprec_ldp_rr_payload(job->m, job->d) : DPREC_LDP_SIGN_PAYLOAD;
}

#define LDP_PROTOCOL(sym, nm, wire)                                                                         \
    const agg_protocol sym = {                                                                              \
        .name = nm,                                                                                         \
        .id = wire,                                                                                         \
        .unit = DPREC_UNIT_USER,                                                                            \
        .model = DPREC_MODEL_LOCAL,                                                                         \
        .needs_budget = 1,                                                                                  \
        .validate_job = ldp_validate_job,                                                                   \
        .validate_payload = ldp_validate_payload,                                                           \
        .initial_model = ldp_initial_model,                                                                 \
        .global_step = ldp_global_step,                                                                     \
        .round_step = ldp_round_step,                                                                       \
        .max_payload = ldp_max_payload,                                                                     \
        .influence = ldp_influence,                                                                         \
        .statistic = ldp_statistic,                                                                         \
        .fold_spec = ldp_fold_spec,                                                                         \
        .fold = ldp_fold,                                                                                   \
        .sum_step = ldp_sum_step,                                                                           \
    }

LDP_PROTOCOL(agg_protocol_ldp_gd, "ldp-gd", DPREC_PROTO_LDP_GD);
LDP_PROTOCOL(agg_protocol_ldp_gddr, "ldp-gddr", DPREC_PROTO_LDP_GDDR);
LDP_PROTOCOL(agg_protocol_ldp_rr, "ldp-rr", DPREC_PROTO_LDP_RR);
