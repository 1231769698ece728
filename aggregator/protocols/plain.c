/* dprec aggregator — protocol `plain`: exact, non-private alternating least squares with biases.
 *
 * No privacy at all (the utility ceiling and the reference for the private protocols). Each device sends
 * its user vector u_i (fitted on release r by regularized least squares after subtracting mu and b_j,
 * sdk/recommend.c) and its ratings; the aggregator runs the item half of ALS with biases:
 *   mu   = mean of all reported ratings
 *   b_j  = sum_i (r_ij - mu - u_i . v_j_old) / (n_j + lambda_bias)
 *   v_j  = (lambda_j I + sum_i u_i u_i^T)^-1  sum_i (r_ij - mu - b_j) u_i
 * with lambda_j = lambda, or lambda * n_j when params.weighted_lambda is true (Zhou et al. 2008).
 * params.user_bias: v_j[0] is pinned to 1 in every release, so coordinate 0 of the device's least-squares
 * u_i acts as a (ridge-regularized) user bias, with no change on the device; the item step then solves the
 * other d - 1 coordinates with u_i[0] subtracted from the target.
 * (Koren, Bell, Volinsky 2009; Zhou et al. 2008 for the weighted-lambda ALS item step). Items nobody rated
 * this round keep v_j and b_j of release r.
 *
 * Bounded poisoning (issue 36; docs/privacy.md "Poisoning"). Nothing here is private, but what one device can move
 * is bounded by two public numbers of the job, applied whatever the device sent:
 *   U    = params.u_clip (default 16 (rating_max - rating_min)): u_i is scaled to ||u_i|| <= U;
 *   beta = params.residual_clip (default 2 (rating_max - rating_min)): each residual r_ij - mu - u_i . v_j of the
 *          bias step is clamped to [-beta, beta].
 * Hence one device adds at most beta to the numerator of each b_j, and every bias the round computes is a damped
 * mean of clamped residuals: |b_j| <= beta n_j / (n_j + lambda_bias) < beta, whatever every device sent; with
 * mu in the scale (the mean of ratings the payload check holds within it), every target of the item step is at most
 * tau + beta + U (tau = rating_max - rating_min), so one device adds at most U^2 to ||sum u u^T|| and
 * (tau + beta + U) U to ||sum t u|| of each item it rated, and ||v_j|| <= sqrt(n_j) (tau + beta + U) / (2 sqrt(lambda_j))
 * (the ridge solution's norm: ||(lambda I + A^T A)^-1 A^T t|| <= ||t|| max_s s / (s^2 + lambda) = ||t|| / (2 sqrt(lambda))).
 * The defaults never bind on an honest report we measured (ml-100k, fleet defaults: ||u|| <= 2.4, |residual| <= 4.2
 * on tau = 4; with a fixed device ridge of 0.01, ||u|| <= 27.4, |residual| <= 4.6), so an honest job's releases are
 * what they were without the clip, bit for bit.
 *
 * Memory of a global step: O(N + n d + m d + d^2) for N reported ratings of n devices (the ratings are
 * bucketed by item with a counting sort; one d x d system at a time). Jobs are limited to releases of at
 * most PLAIN_MAX_CELLS floats (m (d + 1) <= 2^26, a 256 MiB release). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_protocol.h"
#include "bytes.h"
#include "dprec/release.h"
#include "dprec/status.h"
#include "linalg.h"

#define PLAIN_MAX_CELLS ((uint64_t)1 << 26)
#define PLAIN_DEFAULT_LAMBDA 0.1
#define PLAIN_DEFAULT_LAMBDA_BIAS 5.0
#define PLAIN_DEFAULT_SEED 1.0
#define PLAIN_DEFAULT_U_CLIP_SCALES 16.0        /* U = 16 tau: far above an honest fit's ||u|| (the file's head) */
#define PLAIN_DEFAULT_RESIDUAL_CLIP_SCALES 2.0  /* beta = 2 tau: an honest residual is about tau at most */
#define PLAIN_MAX_CLIP 1e6

typedef struct plain_params {
    double lambda, lambda_bias;
    double u_clip, residual_clip; /* 0 in params: the defaults from the rating scale (job_params) */
    int user_bias;      /* 1: v_j[0] is fixed at 1, so the devices' u_i[0] is their user bias */
    int weighted;       /* 1: item j's ridge is lambda * n_j (Zhou et al. 2008, weighted-lambda regularization) */
    uint64_t seed;
} plain_params;

/* Reads params (already validated at job creation, so errors here only mean defaults). */
static int parse_params(const cJSON *params, plain_params *pp, char *err, size_t errcap) {
    pp->lambda = PLAIN_DEFAULT_LAMBDA;
    pp->lambda_bias = PLAIN_DEFAULT_LAMBDA_BIAS;
    pp->seed = (uint64_t)PLAIN_DEFAULT_SEED;
    pp->u_clip = pp->residual_clip = 0.0;
    pp->weighted = 0;
    pp->user_bias = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        if (cJSON_IsBool(it) && it->string != NULL && strcmp(it->string, "weighted_lambda") == 0) {
            pp->weighted = cJSON_IsTrue(it);
            continue;
        }
        if (cJSON_IsBool(it) && it->string != NULL && strcmp(it->string, "user_bias") == 0) {
            pp->user_bias = cJSON_IsTrue(it);
            continue;
        }
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
            snprintf(err, errcap, "params.%s must be a finite number", it->string ? it->string : "?");
            return -1;
        }
        double v = it->valuedouble;
        if (strcmp(it->string, "lambda") == 0) {
            if (!(v > 0.0 && v <= 1e6)) {
                snprintf(err, errcap, "params.lambda must be in (0, 1e6]");
                return -1;
            }
            pp->lambda = v;
        } else if (strcmp(it->string, "lambda_bias") == 0) {
            if (!(v >= 0.0 && v <= 1e6)) {
                snprintf(err, errcap, "params.lambda_bias must be in [0, 1e6]");
                return -1;
            }
            pp->lambda_bias = v;
        } else if (strcmp(it->string, "u_clip") == 0 || strcmp(it->string, "residual_clip") == 0) {
            if (!(v > 0.0 && v <= PLAIN_MAX_CLIP)) {
                snprintf(err, errcap, "params.%s must be in (0, 1e6]", it->string);
                return -1;
            }
            *(strcmp(it->string, "u_clip") == 0 ? &pp->u_clip : &pp->residual_clip) = v;
        } else if (strcmp(it->string, "weighted_lambda") == 0) {
            if (v != 0.0 && v != 1.0) {
                snprintf(err, errcap, "params.weighted_lambda must be 0 or 1");
                return -1;
            }
            pp->weighted = v == 1.0;
        } else if (strcmp(it->string, "user_bias") == 0) {
            if (v != 0.0 && v != 1.0) {
                snprintf(err, errcap, "params.user_bias must be 0 or 1");
                return -1;
            }
            pp->user_bias = v == 1.0;
        } else if (strcmp(it->string, "seed") == 0) {
            if (!(v >= 0.0 && v <= 9007199254740992.0) || floor(v) != v) {
                snprintf(err, errcap, "params.seed must be an integer in [0, 2^53]");
                return -1;
            }
            pp->seed = (uint64_t)v;
        } else {
            snprintf(err, errcap, "params.%s is not a parameter of plain (lambda, lambda_bias, u_clip, residual_clip, weighted_lambda, user_bias, seed)", it->string);
            return -1;
        }
    }
    return 0;
}

/* The clips' defaults from the job's rating scale (the file's head). */
static void default_clips(const agg_job *job, plain_params *pp) {
    const double tau = job->rating_max - job->rating_min;
    if (!(pp->u_clip > 0.0)) pp->u_clip = PLAIN_DEFAULT_U_CLIP_SCALES * tau;
    if (!(pp->residual_clip > 0.0)) pp->residual_clip = PLAIN_DEFAULT_RESIDUAL_CLIP_SCALES * tau;
}

/* The job's params with every default filled in. 0 or -1. */
static int job_params(const agg_job *job, plain_params *pp, char *err, size_t errcap) {
    cJSON *params = cJSON_Parse(job->params != NULL ? job->params : "{}");
    int rc = params != NULL ? parse_params(params, pp, err, errcap) : -1;
    if (params == NULL) snprintf(err, errcap, "params are not JSON");
    cJSON_Delete(params);
    if (rc == 0) default_clips(job, pp);
    return rc;
}

static int plain_validate_job(const agg_job *shape, const cJSON *params, char *err, size_t errcap) {
    plain_params pp;
    if ((uint64_t)shape->m * (shape->d + 1u) > PLAIN_MAX_CELLS) {
        snprintf(err, errcap, "plain supports m * (d + 1) <= %llu (a 256 MiB release)",
                 (unsigned long long)PLAIN_MAX_CELLS);
        return -1;
    }
    if (parse_params(params, &pp, err, errcap) != 0) return -1;
    if (pp.user_bias && shape->d < 2) {
        snprintf(err, errcap, "params.user_bias needs d >= 2");
        return -1;
    }
    return 0;
}

/* [d u32][n u32] u (d float32) then n pairs [item u32][rating float32] */
static int plain_validate_payload(const agg_job *job, const unsigned char *p, size_t len, char *err,
                                  size_t errcap) {
    if (len < 8) {
        snprintf(err, errcap, "plain payload shorter than its 8-byte header");
        return -1;
    }
    uint32_t d = dprec_ld32(p), n = dprec_ld32(p + 4);
    if (d != job->d) {
        snprintf(err, errcap, "payload d = %u, the job's d is %u", d, job->d);
        return -1;
    }
    if (n > job->m) {
        snprintf(err, errcap, "payload has %u ratings, more than the job's m = %u", n, job->m);
        return -1;
    }
    if ((uint64_t)len != 8u + 4u * (uint64_t)d + 8u * (uint64_t)n) {
        snprintf(err, errcap, "payload length %zu does not match d = %u and n = %u", len, d, n);
        return -1;
    }
    const unsigned char *q = p + 8;
    for (uint32_t k = 0; k < d; k++, q += 4)
        if (!isfinite(dprec_ldf32(q))) {
            snprintf(err, errcap, "u[%u] is not finite", k);
            return -1;
        }
    int64_t prev = -1;
    for (uint32_t k = 0; k < n; k++, q += 8) {
        uint32_t item = dprec_ld32(q);
        float r = dprec_ldf32(q + 4);
        if (item >= job->m) {
            snprintf(err, errcap, "item %u out of range (m = %u)", item, job->m);
            return -1;
        }
        if ((int64_t)item <= prev) {
            snprintf(err, errcap, "items must be strictly increasing (item %u after %lld)", item, (long long)prev);
            return -1;
        }
        prev = item;
        if (!isfinite(r) || (double)r < job->rating_min || (double)r > job->rating_max) {
            snprintf(err, errcap, "rating of item %u is not finite or outside [%g, %g]", item, job->rating_min,
                     job->rating_max);
            return -1;
        }
    }
    return 0;
}

/* splitmix64 (Steele, Lea, Flood 2014): the public, seeded initialization of V, not privacy noise */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int agg_model_random(const agg_job *job, uint64_t seed, double scale, double mu, agg_model *out, char *err,
                     size_t errcap) {
    memset(out, 0, sizeof *out);
    out->m = job->m;
    out->d = job->d;
    out->v = malloc(sizeof(float) * (size_t)job->m * job->d);
    out->bias = calloc(job->m, sizeof(float));
    if (out->v == NULL || out->bias == NULL) {
        agg_model_free(out);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    uint64_t s = seed;
    for (size_t k = 0; k < (size_t)job->m * job->d; k++) {
        double u = (double)(splitmix64(&s) >> 11) / 9007199254740992.0; /* [0, 1) */
        out->v[k] = (float)(scale * (2.0 * u - 1.0));
    }
    out->mu = (float)mu;
    if (job->base != NULL && job->base->m == job->m) { /* a job built on another starts from its biases */
        out->mu = job->base->mu;
        if (job->base->bias != NULL) memcpy(out->bias, job->base->bias, sizeof(float) * job->m);
        if (job->base_factors && job->base->v != NULL && job->base->d == job->d) /* and its factors (checked at creation) */
            memcpy(out->v, job->base->v, sizeof(float) * (size_t)job->m * job->d);
    }
    return 0;
}

int agg_model_unc_exact(agg_model *x) {
    x->unc = malloc((size_t)x->m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
    if (x->unc == NULL) return -1;
    for (size_t j = 0; j < x->m; j++) {
        unsigned char *u = x->unc + j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        u[0] = u[2] = u[3] = u[5] = 0u; /* no noise (keep all), spread not measured */
        u[1] = u[4] = dprec_uncertainty_gain_code(1.0);
    }
    x->unc_flags = 0u;
    return 0;
}

int agg_model_unc_release1(const agg_job *job, uint8_t flags, double factor_sd, agg_model *out, char *err,
                           size_t errcap) {
    out->unc = calloc((size_t)job->m, DPREC_RELEASE_UNCERTAINTY_WIDTH);
    if (out->unc == NULL) {
        agg_model_free(out);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    out->unc_flags = flags;
    const uint8_t factor_code = factor_sd > 0.0 ? dprec_uncertainty_code(factor_sd) : 0u;
    for (size_t j = 0; j < job->m; j++) {
        unsigned char *u = out->unc + j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        u[3] = factor_code;
        if (job->base != NULL && job->base->m == job->m && job->base->unc != NULL) /* the base's biases, its column */
            memcpy(u, job->base->unc + j * DPREC_RELEASE_UNCERTAINTY_WIDTH, job->base_factors ? 6 : 3);
    }
    return 0;
}

/* The spread T of the items' true values around 0 (their prior, as the release shows it), by the method of moments
 * of parametric empirical Bayes (Efron and Morris, "Stein's estimation rule and its competitors", JASA 1973; Morris,
 * "Parametric empirical Bayes inference", JASA 1983): each released value is x_j = a_j t_j + n_j (the protocols'
 * columns: dpals.c's encode_uncertainty, plain_column below),
 * so E[x_j^2] = a_j^2 T^2 + N_j over items whose true values t_j spread as N(0, T^2), and
 *     T^2 = max(0, sum_j (x_j^2 - N_j) - 2 sqrt(sum_j 2 N_j^2)) / sum_j a_j^2,
 * items that carry little of their truth (a_j near 0) weighing little. The two standard errors of the sum under "no
 * spread" (x_j^2 has variance 2 N_j^2 when x_j ~ N(0, N_j); one-sided, about 2.3%) keep a release of noise over a few
 * hundred items from showing a spread by chance, as it otherwise does half the time: conservative, it shrinks a little
 * more, never less. Every input is released (x_j) or published with it: post-processing. */
double agg_model_unc_spread2(const double *x2, const double *gain, const double *noise, uint32_t m) {
    double num = 0.0, den = 0.0, var0 = 0.0;
    for (uint32_t j = 0; j < m; j++) {
        num += x2[j] - noise[j];
        den += gain[j] * gain[j];
        var0 += 2.0 * noise[j] * noise[j];
    }
    num -= 2.0 * sqrt(var0);
    return den > 0.0 && num > 0.0 ? num / den : 0.0;
}

static int plain_initial_model(const agg_job *job, agg_model *out, char *err, size_t errcap) {
    plain_params pp;
    if (job_params(job, &pp, err, errcap) != 0) return -1;
    if (agg_model_random(job, pp.seed, 0.1, (job->rating_min + job->rating_max) / 2.0, out, err, errcap) != 0)
        return -1;
    if (pp.user_bias)
        for (uint32_t j = 0; j < job->m; j++) out->v[(size_t)j * job->d] = 1.0f;
    /* release 1's column: the biases 0 (or a base's, with its column), the factors the public draw's (sd 0.1 / sqrt 3) */
    const uint8_t flags = pp.user_bias ? DPREC_RELEASE_UNC_PINNED0 : 0u;
    if (job->release_uncertainty && agg_model_unc_release1(job, flags, 0.1 / sqrt(3.0), out, err, errcap) != 0)
        return -1;
    return 0;
}

void agg_plain_clip_u(const unsigned char *p, uint32_t d, double u_clip, float *u) {
    double n2 = 0.0;
    for (uint32_t k = 0; k < d; k++) {
        u[k] = dprec_ldf32(p + 4 * k);
        n2 += (double)u[k] * (double)u[k]; /* FLT_MAX^2 d < 2^265: no overflow in a double */
    }
    const double norm = sqrt(n2);
    if (!(norm > u_clip)) return; /* within the bound: the report's own floats, untouched */
    /* scaled a hair inside U, so that rounding each coordinate to a float (a relative 2^-24) stays within U */
    const double s = u_clip * (1.0 - 0x1p-20) / norm;
    for (uint32_t k = 0; k < d; k++) u[k] = (float)((double)u[k] * s);
}

int agg_plain_clips(const agg_job *job, double *u_clip, double *residual_clip) {
    plain_params pp;
    char err[AGG_ERRMSG];
    if (job_params(job, &pp, err, sizeof err) != 0) return -1;
    *u_clip = pp.u_clip;
    *residual_clip = pp.residual_clip;
    return 0;
}

/* A plain release's uncertainty column (job->release_uncertainty; docs/privacy.md "Release uncertainty"): no privacy
 * noise, but each item bias is estimated from its own raters, and a device shrinks the poorly measured ones as it does
 * a private release's (a start that few devices made: docs/privacy.md "An opt-in start"). The model is every
 * protocol's, x = a t + n with Var n = N (dpals.c's encode_uncertainty), for the bias step's ridge estimate
 *     b_j = sum_i e_ij / (n_j + lambda_b):   a = n_j / (n_j + lambda_b),   N = sigma^2 n_j / (n_j + lambda_b)^2,
 * sigma^2 the ratings' residual variance, the round's mean square residual on its new values; the spread T by
 * agg_model_unc_spread2. The factors' part says noise 0, gain 1 (a device keeps them whole, as before the column): the
 * column holds one (a, N) pair for an item's d' factor coordinates, and for a start whose items have fewer raters than
 * coordinates (G_j of low rank) that summary, at G_j's mean eigenvalue, overstates the noise of the directions the
 * raters measured; measured, it took a 600-device fleet's start from 0.9761 to 1.0366 (docs/results.md "An opt-in
 * start"). Items nobody rated this round keep their values and their column (prev's). Post-processing of the round's
 * data; plain publishes its values in the clear anyway. 0, or -1 out of memory. */
static int plain_column(const agg_model *prev, agg_model *next, const size_t *start, double sigma2, plain_params pp) {
    const uint32_t m = next->m;
    double *ga = calloc(m, sizeof(double)), *no = calloc(m, sizeof(double)), *x2 = calloc(m, sizeof(double));
    next->unc = malloc((size_t)m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
    int rc = -1;
    if (ga == NULL || no == NULL || x2 == NULL || next->unc == NULL) goto done;
    next->unc_flags = pp.user_bias ? DPREC_RELEASE_UNC_PINNED0 : 0u;
    for (uint32_t j = 0; j < m; j++) {
        const double nj = (double)(start[j + 1] - start[j]), db = nj + pp.lambda_bias;
        const unsigned char *pu = prev->unc != NULL ? prev->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH : NULL;
        if (nj == 0.0 && pu != NULL) { /* unchanged: the previous column's values */
            double sb = dprec_uncertainty_sd(pu[0]);
            ga[j] = dprec_uncertainty_gain(pu[1]);
            no[j] = isfinite(sb) ? sb * sb : 1e12;
        } else {
            ga[j] = db > 0.0 ? nj / db : 0.0;
            no[j] = db > 0.0 ? sigma2 * nj / (db * db) : 0.0;
        }
        x2[j] = (double)next->bias[j] * (double)next->bias[j];
    }
    const uint8_t ct = dprec_uncertainty_code(sqrt(agg_model_unc_spread2(x2, ga, no, m)));
    for (uint32_t j = 0; j < m; j++) {
        unsigned char *c = next->unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        c[0] = dprec_uncertainty_code(sqrt(no[j]));
        c[1] = dprec_uncertainty_gain_code(ga[j]);
        c[2] = ct;
        c[3] = c[5] = 0u; /* the factors: noise 0, spread not measured, gain 1: kept whole */
        c[4] = dprec_uncertainty_gain_code(1.0);
    }
    rc = 0;
done:
    free(ga);
    free(no);
    free(x2);
    return rc;
}

typedef struct rating_ref {
    uint32_t user; /* index into the round's reports */
    float r;
} rating_ref;

static int plain_global_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                             dprec_rng *rng, agg_model *next, char *err, size_t errcap) {
    (void)rng; /* no privacy, no noise */
    plain_params pp;
    if (job_params(job, &pp, err, errcap) != 0) return -1;
    const uint32_t d = job->d, m = job->m;
    if (prev->d != d || prev->m != m) {
        snprintf(err, errcap, "release shape differs from the job");
        return -1;
    }
    memset(next, 0, sizeof *next);
    next->m = m;
    next->d = d;
    next->v = malloc(sizeof(float) * (size_t)m * d);
    next->bias = malloc(sizeof(float) * m);
    float *u = malloc(sizeof(float) * (n > 0 ? n : 1) * d);
    size_t *start = calloc((size_t)m + 1, sizeof *start);
    double *a = malloc(sizeof(double) * d * d);
    double *b = malloc(sizeof(double) * d);
    rating_ref *refs = NULL;
    double sse = 0.0; /* job->release_uncertainty: the ratings' squared residuals on the new values (plain_column) */
    int result = -1;
    if (next->v == NULL || next->bias == NULL || u == NULL || start == NULL || a == NULL || b == NULL) goto oom;
    memcpy(next->v, prev->v, sizeof(float) * (size_t)m * d);
    for (uint32_t j = 0; j < m; j++) next->bias[j] = prev->bias != NULL ? prev->bias[j] : 0.0f;

    /* pass 1: user vectors (clipped to U), rating counts per item, the global mean */
    size_t total = 0;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = reports[i].payload;
        uint32_t cnt = dprec_ld32(p + 4);
        agg_plain_clip_u(p + 8, d, pp.u_clip, u + i * d);
        const unsigned char *q = p + 8 + 4 * (size_t)d;
        for (uint32_t k = 0; k < cnt; k++, q += 8) {
            start[dprec_ld32(q) + 1]++;
            sum += (double)dprec_ldf32(q + 4);
        }
        total += cnt;
    }
    double mu = total > 0 ? sum / (double)total : (double)prev->mu;
    next->mu = (float)mu;
    for (uint32_t j = 0; j < m; j++) start[j + 1] += start[j];
    refs = malloc(sizeof *refs * (total > 0 ? total : 1));
    size_t *fill = malloc(sizeof *fill * (m > 0 ? m : 1));
    if (refs == NULL || fill == NULL) {
        free(fill);
        goto oom;
    }
    memcpy(fill, start, sizeof *fill * m);
    /* pass 2: bucket the ratings by item (counting sort) */
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = reports[i].payload;
        uint32_t cnt = dprec_ld32(p + 4);
        const unsigned char *q = p + 8 + 4 * (size_t)d;
        for (uint32_t k = 0; k < cnt; k++, q += 8) {
            uint32_t item = dprec_ld32(q);
            refs[fill[item]++] = (rating_ref){(uint32_t)i, dprec_ldf32(q + 4)};
        }
    }
    free(fill);

    /* per item: bias from the old v_j, then the regularized normal equations for the new v_j */
    for (uint32_t j = 0; j < m; j++) {
        size_t lo = start[j], hi = start[j + 1];
        if (lo == hi) continue;
        const float *vj = prev->v + (size_t)j * d;
        double resid = 0.0;
        for (size_t k = lo; k < hi; k++) { /* each residual clamped to [-beta, beta]: one device adds at most beta */
            double e = (double)refs[k].r - mu - dprec_dot_f32(u + (size_t)refs[k].user * d, vj, d);
            resid += e > pp.residual_clip ? pp.residual_clip : (e < -pp.residual_clip ? -pp.residual_clip : e);
        }
        double bj = resid / ((double)(hi - lo) + pp.lambda_bias);
        next->bias[j] = (float)bj;
        /* with user_bias, coordinate 0 is fixed at 1: solve the other d - 1 with u_i[0] moved to the target */
        uint32_t off = pp.user_bias ? 1u : 0u, dd = d - off;
        dprec_normal_init(a, b, dd, pp.weighted ? pp.lambda * (double)(hi - lo) : pp.lambda);
        for (size_t k = lo; k < hi; k++) {
            const float *ui = u + (size_t)refs[k].user * d;
            double target = (double)refs[k].r - mu - bj - (off ? (double)ui[0] : 0.0);
            dprec_normal_add(a, b, dd, ui + off, target);
        }
        if (dprec_cholesky_solve(a, b, dd) == DPREC_OK) {
            int finite = 1;
            for (uint32_t k = 0; k < dd; k++) finite &= isfinite((float)b[k]);
            if (finite) {
                if (off) next->v[(size_t)j * d] = 1.0f;
                for (uint32_t k = 0; k < dd; k++) next->v[(size_t)j * d + off + k] = (float)b[k];
            }
        }
        if (job->release_uncertainty) /* the ratings' residuals on the new values */
            for (size_t k = lo; k < hi; k++) {
                double e = (double)refs[k].r - mu - (double)next->bias[j] -
                           dprec_dot_f32(u + (size_t)refs[k].user * d, next->v + (size_t)j * d, d);
                sse += isfinite(e) ? e * e : 0.0;
            }
    }
    if (!isfinite(next->mu)) next->mu = prev->mu;
    for (uint32_t j = 0; j < m; j++)
        if (!isfinite(next->bias[j])) next->bias[j] = 0.0f;
    if (job->release_uncertainty && plain_column(prev, next, start, total > 0 ? sse / (double)total : 0.0, pp) != 0)
        goto oom;
    result = 0;
    goto out;
oom:
    snprintf(err, errcap, "out of memory in the plain global step");
    agg_model_free(next);
out:
    free(u);
    free(start);
    free(a);
    free(b);
    free(refs);
    return result;
}

/* The bounds of the file's head (docs/privacy.md "Poisoning"): the round's statistic here is the item biases'
 * numerators, one clamped residual per rating, so one report (at most m ratings) moves it by at most beta sqrt(m) in
 * L2 and beta on each item; every bias the round computes is below beta. The release's movement depends on each item's
 * raters n_j and on the global mean's shift (docs/privacy.md gives it per item), so it is not stated as one number. */
static int plain_influence(const agg_job *job, uint64_t k, uint64_t n, agg_influence *out) {
    plain_params pp;
    char err[AGG_ERRMSG];
    (void)n;
    if (job_params(job, &pp, err, sizeof err) != 0) return -1;
    out->per_report = pp.residual_clip * sqrt((double)job->m);
    out->stat = (double)k * out->per_report;
    out->release = NAN;
    out->bias_abs = pp.residual_clip;
    return 0;
}

/* the largest report: all m items rated (issue 18: the front end caps the body before reading it) */
static uint64_t plain_max_payload(const agg_job *job) {
    return 8u + 4u * (uint64_t)job->d + 8u * (uint64_t)job->m;
}

const agg_protocol agg_protocol_plain = {
    .name = "plain",
    .id = DPREC_PROTO_PLAIN,
    .unit = DPREC_UNIT_USER,
    .model = DPREC_MODEL_NONE,
    .needs_budget = 0,
    .releases_biases = 1,
    .releases_uncertainty = 1,
    .validate_job = plain_validate_job,
    .validate_payload = plain_validate_payload,
    .max_payload = plain_max_payload,
    .initial_model = plain_initial_model,
    .global_step = plain_global_step,
    .influence = plain_influence,
};
