/* dprec — the local-DP protocols of seed 000, device side: ldp-gd (Private GD, Algorithm 1), ldp-gddr
 * (GD-DR, Algorithm 2) and ldp-rr (randomized response + Laplace, the paper's first scheme). The mechanisms
 * are in common/protocols/ldp.c; docs/privacy.md ("Local DP") derives the guarantees and docs/protocol.md the payloads.
 *
 * Every protocol here runs after the fit on the round's release: c->u is the user's least-squares vector
 * (the minimizer of the objective of which seed 000's eq. (4) takes one gradient step; it never leaves the
 * device) and c->rows holds v_j and b_j of every rated item, so the residual of rating i is
 *   e_i = r_i - mu - b_j - u . v_j
 * and the user's gradient for V at (j, l) is x_jl = -2 y_ij u_l e_ij (Alg. 1 line 8; y_ij = 0 for an unrated j).
 * Each round is pure (eps / k)-LDP; the aggregator publishes eps / k as privacy.round_epsilon and the device
 * randomizes with exactly that value. The device charges each report's own round epsilon (basic composition
 * over the reports it actually sends), never more rounds than the job declared, against the user's cap: an
 * aggregator that publishes a small total and opens more rounds gets nothing past the device's own count. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "ldp.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"

/* The policy of every local protocol: each round is one pure report at the published round epsilon, which the
 * device randomizes with; unit user (a user's whole data), delta 0. payload is the report's fixed size. */
static int ldp_policy(const dprec_sync_job *job, size_t payload, dprec_job_policy *out) {
    char unit[16];
    if (dprec_json_get_string(job->doc, 0, "privacy.unit", unit, sizeof unit, NULL) == DPREC_OK &&
        strcmp(unit, "user") != 0)
        return DPREC_ERR_JOB_PARAMS;
    if (!(job->round_epsilon > 0.0) || !isfinite(job->round_epsilon) || !(job->delta == 0.0))
        return DPREC_ERR_JOB_PARAMS;
    memset(out, 0, sizeof *out);
    out->unit = DPREC_UNIT_USER;
    out->model = DPREC_MODEL_LOCAL;
    out->round.kind = DPREC_STEP_PURE;
    out->round.epsilon = job->round_epsilon;
    out->round.steps = 1;
    out->user_round = out->round;
    out->delta = 0.0;
    out->rounds = job->rounds;
    out->charge_sit_outs = 0; /* no amplification is claimed: a round sat out sends nothing and costs nothing */
    out->report_bytes = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
}

/* params.user_bias (default true): the aggregator pins v_j[0] = 1 and never updates it, so u[0] is the user's
 * own offset, fitted on the device at no privacy cost; only coordinates 1..d-1 are learned and reported. */
static uint32_t first_free(const dprec_sync_job *job, uint32_t d) {
    int ub = 1;
    if (dprec_json_get_bool(job->doc, 0, "params.user_bias", &ub) != DPREC_OK) ub = 1;
    return ub && d >= 2 ? 1u : 0u;
}

static double residual(const dprec_client *c, uint32_t i) {
    uint32_t d = c->cfg.dim;
    const float *row = c->rows + (size_t)i * (d + 1u);
    double e = (double)c->ratings[i].value - (double)c->fitted_mu - (double)row[d];
    for (uint32_t k = 0; k < d; k++) e -= (double)c->u[k] * (double)row[k];
    return e;
}

static int sign_payload(const dprec_sync_job *job, uint16_t proto, const unsigned char id[DPREC_REPORT_ID_SIZE],
                        uint32_t cell, uint32_t l, int plus, unsigned char *out, size_t cap, size_t *len) {
    if (cap < DPREC_ENVELOPE_HEADER + DPREC_LDP_SIGN_PAYLOAD) return DPREC_ERR_REPORT_TOO_LARGE;
    dprec_proto_write_header(job, proto, id, DPREC_LDP_SIGN_PAYLOAD, out);
    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(p, cell);
    dprec_st32(p + 4, l);
    p[8] = (unsigned char)(plus ? 1 : 0);
    p[9] = p[10] = p[11] = 0;
    *len = DPREC_ENVELOPE_HEADER + DPREC_LDP_SIGN_PAYLOAD;
    return DPREC_OK;
}

/* ---- ldp-gd: Algorithm 1 -------------------------------------------------------------------------------- */

static int user_bias_param(const dprec_sync_job *job) {
    int ub = 1;
    int rc = dprec_json_get_bool(job->doc, 0, "params.user_bias", &ub);
    return rc == DPREC_OK || rc == DPREC_ERR_NOT_FOUND ? DPREC_OK : DPREC_ERR_JOB_PARAMS;
}

static int gd_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    (void)c;
    int rc = user_bias_param(job);
    return rc == DPREC_OK ? ldp_policy(job, DPREC_LDP_SIGN_PAYLOAD, out) : rc;
}

static int gd_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                    const unsigned char id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    if (!c->fitted && !c->fallback) return DPREC_ERR_STATE;
    uint32_t m = c->cfg.num_items, d = c->cfg.dim, off = first_free(job, d);
    uint64_t j = 0, l = 0;
    /* lines 6-7: (j, l) uniform over all m d cells (the learned coordinates), whatever the user rated */
    int rc = dprec_sample_uniform(&c->rng, m, &j);
    if (rc == DPREC_OK) rc = dprec_sample_uniform(&c->rng, d - off, &l);
    if (rc != DPREC_OK) return rc;
    l += off;
    double x = 0.0; /* line 8: y_ij = 0 unless rated */
    int64_t at = dprec_store_find(c, (uint32_t)j);
    if (at >= 0) x = -2.0 * (double)c->u[l] * residual(c, (uint32_t)at);
    int plus = 0;
    rc = dprec_ldp_sign(&c->rng, x, pol->round.epsilon, &plus); /* lines 9-13 */
    if (rc != DPREC_OK) return rc;
    return sign_payload(job, DPREC_PROTO_LDP_GD, id, (uint32_t)j, (uint32_t)l, plus, out, cap, len);
}

/* ---- ldp-gddr: Algorithm 2 ------------------------------------------------------------------------------ */

/* q (default min(2700, m)) and the public Phi seed (params.phi_seed, default 1), as the aggregator reads them. */
static int gddr_params(const dprec_sync_job *job, uint32_t m, uint32_t *q, unsigned char seed[32]) {
    double qd = 0.0;
    int rc = dprec_json_get_number(job->doc, 0, "params.q", &qd);
    if (rc == DPREC_ERR_NOT_FOUND) qd = m < DPREC_LDP_DEFAULT_Q ? m : DPREC_LDP_DEFAULT_Q;
    else if (rc != DPREC_OK) return DPREC_ERR_PROTOCOL;
    if (!(qd >= 1.0 && qd <= (double)m) || floor(qd) != qd) return DPREC_ERR_PROTOCOL;
    uint64_t s = 1;
    rc = dprec_json_get_u64(job->doc, 0, "params.phi_seed", &s);
    if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return DPREC_ERR_PROTOCOL;
    if (rc == DPREC_ERR_NOT_FOUND) s = 1;
    *q = (uint32_t)qd;
    dprec_phi_seed(s, seed);
    return DPREC_OK;
}

static int gddr_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    uint32_t q;
    unsigned char seed[32];
    int rc = user_bias_param(job);
    if (rc == DPREC_OK && gddr_params(job, c->cfg.num_items, &q, seed) != DPREC_OK) rc = DPREC_ERR_JOB_PARAMS;
    return rc == DPREC_OK ? ldp_policy(job, DPREC_LDP_SIGN_PAYLOAD, out) : rc;
}

static int gddr_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                      const unsigned char id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    if (!c->fitted && !c->fallback) return DPREC_ERR_STATE;
    uint32_t m = c->cfg.num_items, d = c->cfg.dim, q = 0, off = first_free(job, d);
    unsigned char seed[32];
    int rc = gddr_params(job, m, &q, seed);
    if (rc != DPREC_OK) return rc;
    uint64_t s = 0, l = 0;
    /* lines 9-10: (s, l) uniform over the q d cells of x_i = Phi grad_V^i (the learned coordinates) */
    rc = dprec_sample_uniform(&c->rng, q, &s);
    if (rc == DPREC_OK) rc = dprec_sample_uniform(&c->rng, d - off, &l);
    if (rc != DPREC_OK) return rc;
    l += off;
    /* line 8, one entry: (Phi grad_V^i)_{s,l} = sum_j Phi_sj (-2 y_ij u_l e_ij); only rated j contribute, and
     * only their Phi entries are regenerated (never the q x m matrix) */
    double x = 0.0;
    for (uint32_t i = 0; i < c->count; i++)
        x += dprec_phi_entry(seed, q, (uint32_t)s, c->ratings[i].item) * residual(c, i);
    x *= -2.0 * (double)c->u[l];
    if (isnan(x)) return DPREC_ERR_INTERNAL;
    int plus = 0;
    rc = dprec_ldp_sign(&c->rng, x, pol->round.epsilon, &plus); /* lines 11-15 */
    if (rc != DPREC_OK) return rc;
    return sign_payload(job, DPREC_PROTO_LDP_GDDR, id, (uint32_t)s, (uint32_t)l, plus, out, cap, len);
}

/* ---- ldp-rr: randomized response on the indicators + Laplace on the gradients --------------------------- */

/* rr_unit: only "user" (the default). "rating" claimed that one rating is eps-DP per round, but u is fitted from
 * all of the user's ratings, so changing one rating changes every row of the report (about (1 + n_i) / 2 times
 * the claim, docs/privacy.md): the device refuses such a job, as the aggregator does. */
static int rr_params(const dprec_sync_job *job, double eps_round, uint32_t m, uint32_t d, dprec_rr_params *p) {
    char unit[16];
    int rc = dprec_json_get_string(job->doc, 0, "params.rr_unit", unit, sizeof unit, NULL);
    if (rc == DPREC_ERR_NOT_FOUND) memcpy(unit, "user", 5); /* the default */
    else if (rc != DPREC_OK) return DPREC_ERR_JOB_PARAMS;
    if (strcmp(unit, "user") != 0) return DPREC_ERR_JOB_PARAMS;
    double split = 0.5;
    rc = dprec_json_get_number(job->doc, 0, "params.rr_split", &split);
    if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return DPREC_ERR_JOB_PARAMS;
    if (rc == DPREC_ERR_NOT_FOUND) split = 0.5;
    if (dprec_rr_params_init(p, DPREC_RR_USER, eps_round, split, m, d, job->rating_max - job->rating_min) != DPREC_OK)
        return DPREC_ERR_JOB_PARAMS;
    return DPREC_OK;
}

static int rr_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    uint32_t m = c->cfg.num_items, d = c->cfg.dim;
    int rc = user_bias_param(job);
    if (rc == DPREC_OK) rc = ldp_policy(job, dprec_ldp_rr_payload(m, d), out);
    dprec_rr_params rp;
    if (rc == DPREC_OK) rc = rr_params(job, out->round.epsilon, m, d - first_free(job, d), &rp);
    dprec_laplace_plan plan;
    if (rc == DPREC_OK && dprec_laplace_plan_init(&plan, rp.l1, rp.n, rp.eps2) != DPREC_OK) rc = DPREC_ERR_JOB_PARAMS;
    return rc;
}

static int rr_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                    const unsigned char id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    if (!c->fitted && !c->fallback) return DPREC_ERR_STATE;
    uint32_t m = c->cfg.num_items, d = c->cfg.dim, off = first_free(job, d);
    dprec_rr_params rp;
    int rc = rr_params(job, pol->round.epsilon, m, d - off, &rp); /* the Laplace vector: the d - off learned coordinates */
    if (rc != DPREC_OK) return rc;
    size_t payload = dprec_ldp_rr_payload(m, d);
    if (cap < DPREC_ENVELOPE_HEADER || cap - DPREC_ENVELOPE_HEADER < payload) return DPREC_ERR_REPORT_TOO_LARGE;
    dprec_laplace_plan plan;
    rc = dprec_laplace_plan_init(&plan, rp.l1, rp.n, rp.eps2);
    if (rc != DPREC_OK) return DPREC_ERR_PROTOCOL;
    dprec_proto_write_header(job, DPREC_PROTO_LDP_RR, id, (uint32_t)payload, out);
    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    size_t bits = (((size_t)m + 7u) / 8u + 3u) & ~(size_t)3u;
    dprec_st32(p, m);
    dprec_st32(p + 4, d);
    unsigned char *yb = p + 8;
    unsigned char *g = yb + bits;
    memset(yb, 0, bits);
    dprec_noise_stream ns; /* m + m (d - off) draws in a row: one stream of CSPRNG bits for all of them */
    dprec_noise_stream_init(&ns, &c->rng);
    uint32_t cur = 0; /* ratings are sorted by item: one merge pass */
    for (uint32_t j = 0; j < m; j++) {
        while (cur < c->count && c->ratings[cur].item < j) cur++;
        int rated = cur < c->count && c->ratings[cur].item == j;
        int ystar = 0;
        rc = dprec_rr_bit_stream(&ns, rated, rp.eps1_item, &ystar); /* keeps y w.p. e^eps1/(1+e^eps1) = 1 - p/2 */
        if (rc != DPREC_OK) goto fail;
        if (ystar) yb[j / 8u] |= (unsigned char)(1u << (j % 8u));
        double e = rated ? residual(c, cur) : 0.0;
        for (uint32_t l = 0; l < off; l++) dprec_stf32(g + 4u * ((size_t)j * d + l), 0.0f); /* pinned: no data */
        for (uint32_t l = off; l < d; l++) {
            /* g_ijl = -2 u_l e_ij, clipped to [-Delta/2, Delta/2] so that one coordinate moves by at most Delta
             * (seed 000's sigma = Delta d / eps2 needs that range); 0 for an unrated item */
            double x = rated ? -2.0 * (double)c->u[l] * e : 0.0;
            if (x > rp.clip) x = rp.clip;
            if (x < -rp.clip) x = -rp.clip;
            double noisy = 0.0;
            rc = dprec_laplace_plan_draw(&ns, &plan, x, &noisy);
            if (rc != DPREC_OK) goto fail;
            dprec_stf32(g + 4u * ((size_t)j * d + l), (float)noisy);
        }
    }
    dprec_noise_stream_wipe(&ns);
    *len = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
fail:
    dprec_noise_stream_wipe(&ns);
    dprec_wipe(out, DPREC_ENVELOPE_HEADER + payload);
    return rc;
}

const dprec_proto dprec_proto_ldp_gd = {"ldp-gd", DPREC_PROTO_LDP_GD, gd_policy, gd_build, NULL};
const dprec_proto dprec_proto_ldp_gddr = {"ldp-gddr", DPREC_PROTO_LDP_GDDR, gddr_policy, gddr_build, NULL};
const dprec_proto dprec_proto_ldp_rr = {"ldp-rr", DPREC_PROTO_LDP_RR, rr_policy, rr_build, NULL};
