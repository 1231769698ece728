/* dprec — the `gauss-gd` protocol, device side (seed 001, central DP; docs/privacy.md "gauss-gd").
 *
 * The device fits u by exact least squares on the round's release (sync.c), then sends its clipped
 * contribution to the gradient of the item side [V | b] (common/protocols/gauss.h): x = [u; 1] (clipped) and, per rated
 * item, the (clipped) residual coef_j = mu + b_j + u.v_j - r_j. No rating leaves the device; the trusted
 * aggregator sums the contributions and adds Gaussian noise (aggregator/protocols/gauss.c).
 *
 * Fixed size: every report carries exactly params.max_ratings (item, coef) pairs (default 1000), the real
 * ones first (items increasing), then padding pairs (DPREC_PAD_ITEM, +0.0: report.h), so that its length
 * never tells how many ratings the user has. A user with more ratings than that reports a uniform sample of
 * them, drawn afresh each round from the CSPRNG (selection sampling, Knuth TAOCP vol. 2, 3.4.2, Algorithm S).
 *
 * The policy (what the device charges; docs/privacy.md "gauss-gd"):
 *   unit "user" (default): each round is the Poisson-subsampled discrete Gaussian with the published noise
 *     multiplier z (privacy.noise_multiplier: the aggregator adds the noise, the trusted party of this model)
 *     at the job's participation rate q; every round the device draws for is charged, sat out or not.
 *   unit "rating" (seed 001): the paper's sensitivity tau C holds only with the factor x fixed, but u is fitted
 *     from all of the user's ratings, so one rating moves every row. The device charges the group bound over
 *     its report's rows: a report's rows are clipped to tau C each and at most max_ratings of them carry data,
 *     so one rating moves the sum by at most 2 tau C sqrt(max_ratings) (z = z_paper / (2 sqrt(max_ratings)),
 *     z_paper = sqrt(2 ln(1.25/delta_i)) / eps_i, seed 001 Alg. 1 line 7) and one user by tau C
 *     sqrt(max_ratings) (the user-level figure charged against the user cap). No amplification: q = 1.
 *
 * The u in the report: by default (params.u_update "lsq") the exact least-squares fit on the round's release,
 * which costs no privacy and is never worse. params.u_update "gradient" is seed 001's alternating gradient
 * descent instead: the device keeps its own u across the job's rounds (this protocol's state, memory only),
 * starts it as a random unit vector (seed 001 Alg. 1, line 1), and in each round it reports in first moves it
 * one step, u <- u - u_lr (sum_j e_j v_j + lambda u) on that round's release (params.u_lr, default params.lr;
 * params.lambda, default 0), then reports with it. Recommendations still come from the least-squares fit.
 *
 * Payload: [d u32][n u32] then x (d + 1 float32) then n pairs [item u32][coef float32], n = max_ratings. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "crypto.h"
#include "gauss.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"
#include "secure.h"

#define GAUSS_DEFAULT_CLIP 1.0
#define GAUSS_DEFAULT_LR 5e-4 /* seed 001's step size, as the aggregator's default (aggregator/protocols/gauss.c) */
#define GAUSS_DEFAULT_MAX_RATINGS 1000u
#define GAUSS_MAX_MAX_RATINGS 65535u
#define GAUSS_MAX_NOISE_MULTIPLIER 1e6

/* ---- the state of params.u_update "gradient" (memory only) ---------------------------------------------- */

typedef struct gauss_state {
    uint64_t job, round; /* of the last step (job 0: none) */
} gauss_state;

static size_t gauss_memory(const dprec_config *cfg) {
    return sizeof(gauss_state) + 8u * (size_t)cfg->dim + 4u * (size_t)cfg->dim; /* header, gradient, u */
}

static gauss_state *state_of(const dprec_client *c) {
    return (gauss_state *)(void *)dprec_proto_state_mem(c, &dprec_proto_gauss_gd);
}

static double *state_grad(const dprec_client *c) {
    return (double *)(void *)(dprec_proto_state_mem(c, &dprec_proto_gauss_gd) + sizeof(gauss_state));
}

static float *state_u(const dprec_client *c) {
    return (float *)(void *)(dprec_proto_state_mem(c, &dprec_proto_gauss_gd) + sizeof(gauss_state) +
                             8u * (size_t)c->cfg.dim);
}

const float *dprec_gauss_state_u(const dprec_client *c, uint64_t *job, uint64_t *round) {
    const gauss_state *s = state_of(c);
    if (job != NULL) *job = s->job;
    if (round != NULL) *round = s->round;
    return state_u(c);
}

static void gauss_reset(dprec_client *c) {
    gauss_state *s = state_of(c);
    s->job = s->round = 0;
}

static size_t no_section(const dprec_config *cfg) {
    (void)cfg;
    return 0;
}

static unsigned char *gauss_encode(const dprec_client *c, unsigned char *p) {
    (void)c;
    return p;
}

static int gauss_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit) {
    (void)c, (void)d, (void)len, (void)commit;
    return DPREC_ERR_STORE_CORRUPT; /* never called: the state has no section */
}

static const dprec_proto_state gauss_state_desc = {0, 0, gauss_memory, no_section, gauss_reset, gauss_encode,
                                                   gauss_decode};

/* ---- the job's parameters ----------------------------------------------------------------------------- */

typedef struct gauss_job {
    dprec_unit unit;
    double clip;
    uint32_t max_ratings;
    int gradient; /* u_update "gradient" */
    double u_lr, lambda;
} gauss_job;

static int job_params(const dprec_sync_job *job, gauss_job *g) {
    const dprec_json_doc *doc = job->doc;
    char p[16], pub[16];
    if (dprec_json_get_string(doc, 0, "params.unit", p, sizeof p, NULL) != DPREC_OK) strcpy(p, "user");
    if (dprec_json_get_string(doc, 0, "privacy.unit", pub, sizeof pub, NULL) != DPREC_OK || strcmp(p, pub) != 0)
        return DPREC_ERR_JOB_PARAMS;
    if (strcmp(p, "rating") == 0) g->unit = DPREC_UNIT_RATING;
    else if (strcmp(p, "user") == 0) g->unit = DPREC_UNIT_USER;
    else return DPREC_ERR_JOB_PARAMS;
    g->clip = GAUSS_DEFAULT_CLIP;
    int rc = dprec_json_get_number(doc, 0, "params.clip", &g->clip);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || !(g->clip > 0.0 && g->clip <= 1e6)) return DPREC_ERR_JOB_PARAMS;
    uint64_t mr = GAUSS_DEFAULT_MAX_RATINGS;
    rc = dprec_json_get_u64(doc, 0, "params.max_ratings", &mr);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || mr < 1 || mr > GAUSS_MAX_MAX_RATINGS)
        return DPREC_ERR_JOB_PARAMS;
    g->max_ratings = (uint32_t)mr;
    char mode[16];
    rc = dprec_json_get_string(doc, 0, "params.u_update", mode, sizeof mode, NULL);
    if (rc == DPREC_ERR_NOT_FOUND) strcpy(mode, "lsq");
    else if (rc != DPREC_OK) return DPREC_ERR_JOB_PARAMS;
    if (strcmp(mode, "lsq") != 0 && strcmp(mode, "gradient") != 0) return DPREC_ERR_JOB_PARAMS;
    g->gradient = strcmp(mode, "gradient") == 0;
    g->u_lr = GAUSS_DEFAULT_LR;
    g->lambda = 0.0;
    if (dprec_json_get_number(doc, 0, "params.u_lr", &g->u_lr) != DPREC_OK &&
        dprec_json_get_number(doc, 0, "params.lr", &g->u_lr) != DPREC_OK)
        g->u_lr = GAUSS_DEFAULT_LR;
    if (dprec_json_get_number(doc, 0, "params.lambda", &g->lambda) != DPREC_OK) g->lambda = 0.0;
    if (!(g->u_lr > 0.0) || !isfinite(g->u_lr) || !(g->lambda >= 0.0) || !isfinite(g->lambda))
        return DPREC_ERR_JOB_PARAMS;
    return DPREC_OK;
}

static void gaussian_step(dprec_step *s, double z, double q) {
    memset(s, 0, sizeof *s);
    s->kind = DPREC_STEP_GAUSSIAN;
    s->noise_multiplier = z;
    s->q = q;
    s->steps = 1;
    s->discrete = 1; /* common/noise.c: every Gaussian is the discrete Gaussian on a grid */
}

/* The vector of params.aggregation "secure": the dense gradient contribution G_i (m rows of d + 1), whose
 * Frobenius norm the user-level clipping bounds by clip (common/protocols/gauss.h). 0 if longer than secure aggregation takes. */
static uint32_t secure_len(const dprec_client *c) {
    uint64_t n = (uint64_t)c->cfg.num_items * (c->cfg.dim + 1u);
    return n <= DPREC_DDG_MAX_DIM ? (uint32_t)n : 0u;
}

static int gauss_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    gauss_job g;
    int rc = job_params(job, &g);
    if (rc != DPREC_OK) return rc;
    if (!(job->delta > 0.0 && job->delta < 1.0)) return DPREC_ERR_JOB_PARAMS;
    int secure = dprec_secure_requested(job);
    if (secure < 0) return DPREC_ERR_JOB_PARAMS;
    if (secure) { /* the aggregator is not trusted: the devices' shares make the noise (sdk/secure.h) */
        if (g.unit != DPREC_UNIT_USER || secure_len(c) == 0) return DPREC_ERR_JOB_PARAMS;
        return dprec_secure_policy(c, job, secure_len(c), g.clip, out);
    }
    memset(out, 0, sizeof *out);
    out->unit = g.unit;
    out->model = DPREC_MODEL_CENTRAL;
    out->delta = job->delta;
    out->rounds = job->rounds;
    out->report_bytes = DPREC_ENVELOPE_HEADER + dprec_gauss_payload_size(c->cfg.dim, g.max_ratings);
    if (g.unit == DPREC_UNIT_USER) {
        double z = NAN, zp;
        if (dprec_json_get_number(job->doc, 0, "privacy.noise_multiplier", &z) != DPREC_OK || !(z > 0.0) ||
            !(z <= GAUSS_MAX_NOISE_MULTIPLIER))
            return DPREC_ERR_JOB_PARAMS;
        if (dprec_json_get_number(job->doc, 0, "params.noise_multiplier", &zp) == DPREC_OK && zp != z)
            return DPREC_ERR_JOB_PARAMS; /* the job asked for one noise level and the aggregator claims another */
        if (!(job->participation > 0.0 && job->participation <= 1.0)) return DPREC_ERR_JOB_PARAMS;
        gaussian_step(&out->round, z, job->participation);
        out->user_round = out->round;
        out->charge_sit_outs = job->participation < 1.0; /* the accounting spreads the cost over every draw */
        return DPREC_OK;
    }
    double eps_i = 0.0, delta_i = 0.01;
    if (dprec_json_get_number(job->doc, 0, "params.eps_i", &eps_i) != DPREC_OK || !(eps_i > 0.0 && eps_i < 1.0))
        return DPREC_ERR_JOB_PARAMS;
    rc = dprec_json_get_number(job->doc, 0, "params.delta_i", &delta_i);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || !(delta_i > 0.0 && delta_i < 1.0)) return DPREC_ERR_JOB_PARAMS;
    /* seed 001 Alg. 1 line 7: sigma = tau C z_paper; the true sensitivities of the sum with u refitted are
     * 2 tau C sqrt(n) (one rating changed) and tau C sqrt(n) (one user added or removed), n = max_ratings */
    double zp = sqrt(2.0 * log(1.25 / delta_i)) / eps_i, rn = sqrt((double)g.max_ratings);
    gaussian_step(&out->round, zp / (2.0 * rn), 1.0);
    gaussian_step(&out->user_round, zp / rn, 1.0);
    out->charge_sit_outs = 0;
    return DPREC_OK;
}

/* ---- the report ---------------------------------------------------------------------------------------- */

/* A standard normal draw from the client's CSPRNG (Box-Muller); only for the random start of u, which
 * protects nothing and need not be exact. */
static int std_normal(dprec_client *c, double *out) {
    uint64_t w[2];
    int rc = dprec_rng_bytes(&c->rng, w, sizeof w);
    if (rc != DPREC_OK) return rc;
    double u1 = ((double)(w[0] >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
    double u2 = (double)(w[1] >> 11) * 0x1p-53;         /* [0, 1) */
    *out = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    return DPREC_OK;
}

/* The user vector for this round's report: c->u, or with u_update "gradient" the device's own iterate, started
 * and stepped here at most once per round. A step that would leave it non-finite is not taken (the build then
 * fails and sync.c sends the data-independent fallback). The fallback build uses c->u, which sync.c zeroed. */
static int report_u(dprec_client *c, const dprec_sync_job *job, const gauss_job *g, const float **u) {
    if (!g->gradient || c->fallback) {
        *u = c->u;
        return DPREC_OK;
    }
    uint32_t d = c->cfg.dim;
    gauss_state *s = state_of(c);
    float *gu = state_u(c);
    double *grad = state_grad(c);
    if (s->job != job->job_id) {
        /* seed 001 Alg. 1 line 1: entries i.i.d. N(0, 1), then scaled to unit norm */
        double n2 = 0.0;
        for (uint32_t k = 0; k < d; k++) {
            double z;
            int rc = std_normal(c, &z);
            if (rc != DPREC_OK) return rc;
            gu[k] = (float)z;
            n2 += z * z;
        }
        double sc = n2 > 0.0 ? 1.0 / sqrt(n2) : 0.0;
        for (uint32_t k = 0; k < d; k++) gu[k] = (float)((double)gu[k] * sc);
        s->job = job->job_id;
        s->round = 0;
    }
    if (s->round != job->round) {
        float next[DPREC_MAX_DIM];
        memcpy(next, gu, sizeof(float) * d);
        memset(grad, 0, sizeof(double) * d);
        for (uint32_t i = 0; i < c->count; i++)
            dprec_gauss_u_grad_add(gu, d, c->rows + (size_t)i * (d + 1u), c->ratings[i].value, c->fitted_mu, grad);
        dprec_gauss_u_apply(next, d, grad, g->u_lr, g->lambda);
        for (uint32_t k = 0; k < d; k++)
            if (!isfinite(next[k])) return DPREC_ERR_INVALID_ARGUMENT; /* a diverging step size */
        memcpy(gu, next, sizeof(float) * d);
        s->round = job->round;
    }
    *u = gu;
    return DPREC_OK;
}

static double rating_residual(const dprec_client *c, dprec_unit unit, const float *u, uint32_t i, double tau) {
    uint32_t d = c->cfg.dim;
    return dprec_gauss_residual(unit, u, d, c->rows + (size_t)i * (d + 1u), c->ratings[i].value, c->fitted_mu, tau);
}

/* params.aggregation "secure": the same contribution (the same sample of at most max_ratings items, the same
 * user-level clipping), written densely into the secure area's input, then encoded and masked (sdk/secure.c). */
static int build_secure(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol, const gauss_job *g,
                        const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap,
                        size_t *len) {
    const uint32_t d = c->cfg.dim, n = c->count, k = n < g->max_ratings ? n : g->max_ratings, w = d + 1u;
    const uint32_t vlen = secure_len(c);
    double *x = dprec_secure_input(c);
    if (x == NULL || vlen == 0 || pol->secure_job.plan.d != vlen) return DPREC_ERR_STATE;
    const double tau = (double)c->cfg.rating_max - (double)c->cfg.rating_min;
    const float *u;
    int rc = report_u(c, job, g, &u);
    if (rc != DPREC_OK) return rc;
    memset(x, 0, sizeof(double) * vlen);
    double sq = 0.0;
    uint32_t chosen = 0;
    for (uint32_t i = 0; i < n && chosen < k; i++) { /* Algorithm S, as the trusted report; x holds e_j in column 0 */
        int take = 1;
        if (k < n) {
            rc = dprec_sample_bernoulli_rational(&c->rng, k - chosen, n - i, &take);
            if (rc != DPREC_OK) return rc;
        }
        if (!take) continue;
        double e = rating_residual(c, g->unit, u, i, tau);
        sq += e * e;
        x[(size_t)c->ratings[i].item * w] = e;
        chosen++;
    }
    if (chosen != k) return DPREC_ERR_INTERNAL;
    double xs, cs, xv[DPREC_MAX_DIM + 1];
    dprec_gauss_scales(g->unit, u, d, sq, g->clip, &xs, &cs);
    for (uint32_t a = 0; a < d; a++) xv[a] = (double)u[a] * xs;
    xv[d] = xs;
    for (uint32_t j = 0; j < c->cfg.num_items; j++) {
        double *row = x + (size_t)j * w, e = row[0];
        if (e == 0.0) continue;
        for (uint32_t a = 0; a < w; a++) row[a] = e * cs * xv[a];
    }
    for (uint32_t i = 0; i < vlen; i++)
        if (!isfinite(x[i])) return DPREC_ERR_INVALID_ARGUMENT;
    return dprec_secure_build(c, job, pol, DPREC_PROTO_GAUSS_GD, report_id, out, cap, len);
}

static int gauss_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                       const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    if (!c->fitted && !c->fallback) return DPREC_ERR_STATE;
    gauss_job g;
    int rc = job_params(job, &g);
    if (rc != DPREC_OK) return rc;
    if (pol->secure) return build_secure(c, job, pol, &g, report_id, out, cap, len);
    uint32_t d = c->cfg.dim, n = c->count, k = n < g.max_ratings ? n : g.max_ratings;
    size_t payload = dprec_gauss_payload_size(d, g.max_ratings);
    if (cap < pol->report_bytes || pol->report_bytes != DPREC_ENVELOPE_HEADER + payload) return DPREC_ERR_REPORT_TOO_LARGE;
    double tau = (double)c->cfg.rating_max - (double)c->cfg.rating_min;
    const float *u;
    rc = report_u(c, job, &g, &u);
    if (rc != DPREC_OK) return rc;

    dprec_proto_write_header(job, DPREC_PROTO_GAUSS_GD, report_id, (uint32_t)payload, out);
    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(p, d);
    dprec_st32(p + 4, g.max_ratings);
    unsigned char *xp = p + 8, *pairs = xp + 4u * ((size_t)d + 1u);

    /* Pass 1: the rated items reported (all, or a uniform sample of k: Algorithm S selects item i with
     * probability (k - chosen) / (n - i), exactly), written in item order; the sum of their squared residuals. */
    double sq = 0.0;
    uint32_t chosen = 0;
    for (uint32_t i = 0; i < n && chosen < k; i++) {
        int take = 1;
        if (k < n) {
            rc = dprec_sample_bernoulli_rational(&c->rng, k - chosen, n - i, &take);
            if (rc != DPREC_OK) return rc;
        }
        if (!take) continue;
        double e = rating_residual(c, g.unit, u, i, tau);
        sq += e * e;
        dprec_st32(pairs + 8u * (size_t)chosen, c->ratings[i].item);
        chosen++;
    }
    if (chosen != k) return DPREC_ERR_INTERNAL;
    double xs, cs;
    dprec_gauss_scales(g.unit, u, d, sq, g.clip, &xs, &cs);
    for (uint32_t j = 0; j < d; j++) dprec_stf32(xp + 4u * j, (float)((double)u[j] * xs));
    dprec_stf32(xp + 4u * d, (float)xs);
    /* Pass 2: the scaled residuals of the items chosen, then the padding. */
    for (uint32_t s = 0; s < k; s++) {
        unsigned char *pr = pairs + 8u * (size_t)s;
        int64_t at = dprec_store_find(c, dprec_ld32(pr));
        if (at < 0) return DPREC_ERR_INTERNAL;
        float v = (float)(rating_residual(c, g.unit, u, (uint32_t)at, tau) * cs);
        if (!isfinite(v)) return DPREC_ERR_INVALID_ARGUMENT;
        dprec_stf32(pr + 4, v);
    }
    for (uint32_t s = k; s < g.max_ratings; s++) {
        dprec_st32(pairs + 8u * (size_t)s, DPREC_PAD_ITEM);
        dprec_st32(pairs + 8u * (size_t)s + 4, 0u);
    }
    for (uint32_t j = 0; j <= d; j++)
        if (!isfinite(dprec_ldf32(xp + 4u * j))) return DPREC_ERR_INVALID_ARGUMENT;
    *len = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
}

const dprec_proto dprec_proto_gauss_gd = {"gauss-gd", DPREC_PROTO_GAUSS_GD, gauss_policy, gauss_build,
                                          &gauss_state_desc};
