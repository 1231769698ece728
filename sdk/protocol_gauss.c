/* dprec — the `gauss-gd` protocol, device side (seed 001, central DP; docs/privacy.md "gauss-gd").
 *
 * The device fits u by exact least squares on the round's release (sync.c), then sends its clipped
 * contribution to the gradient of the item side [V | b] (sdk/gauss.h): x = [u; 1] (clipped) and, per rated
 * item, the (clipped) residual coef_j = mu + b_j + u.v_j - r_j. No rating leaves the device; the trusted
 * aggregator sums the contributions and adds Gaussian noise (aggregator/core/proto_gauss.c).
 *
 * Unit: the job's params.unit ("rating" as in seed 001, or "user"; default "user"), which the job view also
 * publishes as privacy.unit; the device refuses a job whose two disagree, and charges its ledger under that
 * unit. The charge is the job's published total (privacy.epsilon, privacy.delta): every round of the job is
 * the same mechanism and the aggregator never opens a round past the budget.
 *
 * The u in the report: by default (params.u_update "lsq") the exact least-squares fit on the round's release,
 * which costs no privacy and is never worse. params.u_update "gradient" is seed 001's alternating gradient
 * descent instead: the device keeps its own u across the job's rounds (c->gu), starts it as a random unit
 * vector (seed 001 Alg. 1, line 1), and in each round it reports in first moves it one step, u <- u - u_lr
 * (sum_j e_j v_j + lambda u) on that round's release (params.u_lr, default params.lr; params.lambda, default
 * 0), then reports with it. Recommendations still come from the least-squares fit. The state is in memory only.
 *
 * Payload: [d u32][n u32] then x (d + 1 float32) then n pairs [item u32][coef float32], items strictly
 * increasing. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "crypto.h"
#include "gauss.h"
#include "protocol.h"
#include "report.h"

#define GAUSS_DEFAULT_CLIP 1.0
#define GAUSS_DEFAULT_LR 5e-4 /* seed 001's step size, as the aggregator's default (proto_gauss.c) */

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

/* The user vector for this round's report (see the top of the file): c->u, or with params.u_update
 * "gradient" the device's own iterate c->gu, started and stepped here at most once per round. */
static int report_u(dprec_client *c, const dprec_sync_job *job, const float **u) {
    char mode[16];
    if (dprec_json_get_string(job->doc, 0, "params.u_update", mode, sizeof mode, NULL) != DPREC_OK) strcpy(mode, "lsq");
    if (strcmp(mode, "lsq") == 0) {
        *u = c->u;
        return DPREC_OK;
    }
    if (strcmp(mode, "gradient") != 0) return DPREC_ERR_PROTOCOL;
    uint32_t d = c->cfg.dim;
    double lr = GAUSS_DEFAULT_LR, lambda = 0.0;
    if (dprec_json_get_number(job->doc, 0, "params.u_lr", &lr) != DPREC_OK &&
        dprec_json_get_number(job->doc, 0, "params.lr", &lr) != DPREC_OK)
        lr = GAUSS_DEFAULT_LR;
    if (dprec_json_get_number(job->doc, 0, "params.lambda", &lambda) != DPREC_OK) lambda = 0.0;
    if (!(lr > 0.0) || !isfinite(lr) || !(lambda >= 0.0) || !isfinite(lambda)) return DPREC_ERR_PROTOCOL;
    if (c->gu_job != job->job_id) {
        /* seed 001 Alg. 1 line 1: entries i.i.d. N(0, 1), then scaled to unit norm */
        double n2 = 0.0;
        for (uint32_t k = 0; k < d; k++) {
            double z;
            int rc = std_normal(c, &z);
            if (rc != DPREC_OK) return rc;
            c->gu[k] = (float)z;
            n2 += z * z;
        }
        double s = n2 > 0.0 ? 1.0 / sqrt(n2) : 0.0;
        for (uint32_t k = 0; k < d; k++) c->gu[k] = (float)((double)c->gu[k] * s);
        c->gu_job = job->job_id;
        c->gu_round = 0;
    }
    if (c->gu_round != job->round) {
        memset(c->gu_grad, 0, sizeof(double) * d);
        for (uint32_t i = 0; i < c->count; i++)
            dprec_gauss_u_grad_add(c->gu, d, c->rows + (size_t)i * (d + 1u), c->ratings[i].value, c->fitted_mu,
                                   c->gu_grad);
        dprec_gauss_u_apply(c->gu, d, c->gu_grad, lr, lambda);
        for (uint32_t k = 0; k < d; k++)
            if (!isfinite(c->gu[k])) return DPREC_ERR_INVALID_ARGUMENT; /* a diverging step size */
        c->gu_round = job->round;
    }
    *u = c->gu;
    return DPREC_OK;
}

/* The job's unit: params.unit, which must agree with the published privacy.unit. */
static int job_unit(const dprec_sync_job *job, dprec_unit *unit) {
    char p[16], pub[16];
    if (dprec_json_get_string(job->doc, 0, "params.unit", p, sizeof p, NULL) != DPREC_OK) strcpy(p, "user");
    if (dprec_json_get_string(job->doc, 0, "privacy.unit", pub, sizeof pub, NULL) != DPREC_OK) return DPREC_ERR_PROTOCOL;
    if (strcmp(p, pub) != 0) return DPREC_ERR_PROTOCOL;
    if (strcmp(p, "rating") == 0) *unit = DPREC_UNIT_RATING;
    else if (strcmp(p, "user") == 0) *unit = DPREC_UNIT_USER;
    else return DPREC_ERR_PROTOCOL;
    return DPREC_OK;
}

static int gauss_charge(const dprec_sync_job *job, dprec_charge *out) {
    dprec_unit unit;
    int rc = job_unit(job, &unit);
    if (rc != DPREC_OK) return rc;
    /* the job's published total guarantee, which this report is part of (never a per-round share of it) */
    if (!(isfinite(job->epsilon) && job->epsilon > 0.0 && isfinite(job->delta) && job->delta > 0.0 &&
          job->delta < 1.0))
        return DPREC_ERR_PROTOCOL;
    out->unit = unit;
    out->job_epsilon = job->epsilon;
    out->job_delta = job->delta;
    return DPREC_OK;
}

static int gauss_build(dprec_client *c, const dprec_sync_job *job, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                       unsigned char *out, size_t cap, size_t *len) {
    uint32_t d = c->cfg.dim, n = c->count;
    size_t payload = dprec_gauss_payload_size(d, n);
    if (!c->fitted) return DPREC_ERR_STATE;
    if (cap < DPREC_ENVELOPE_HEADER || cap - DPREC_ENVELOPE_HEADER < payload) return DPREC_ERR_REPORT_TOO_LARGE;
    dprec_unit unit;
    int rc = job_unit(job, &unit);
    if (rc != DPREC_OK) return rc;
    double clip = GAUSS_DEFAULT_CLIP;
    if (dprec_json_get_number(job->doc, 0, "params.clip", &clip) != DPREC_OK) clip = GAUSS_DEFAULT_CLIP;
    double tau = (double)c->cfg.rating_max - (double)c->cfg.rating_min;
    if (!(clip > 0.0) || !isfinite(clip) || !(tau > 0.0)) return DPREC_ERR_PROTOCOL;
    const float *u;
    rc = report_u(c, job, &u);
    if (rc != DPREC_OK) return rc;

    /* two passes, no scratch memory: the sum of squared residuals, then the scaled values */
    double sq = 0.0, xs, cs;
    for (uint32_t i = 0; i < n; i++) {
        double e = dprec_gauss_residual(unit, u, d, c->rows + (size_t)i * (d + 1u), c->ratings[i].value,
                                        c->fitted_mu, tau);
        sq += e * e;
    }
    dprec_gauss_scales(unit, u, d, sq, clip, &xs, &cs);

    dprec_proto_write_header(job, DPREC_PROTO_GAUSS_GD, report_id, (uint32_t)payload, out);

    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(p, d);
    dprec_st32(p + 4, n);
    p += 8;
    for (uint32_t k = 0; k < d; k++, p += 4) dprec_stf32(p, (float)((double)u[k] * xs));
    dprec_stf32(p, (float)xs);
    p += 4;
    for (uint32_t i = 0; i < n; i++, p += 8) {
        double r = dprec_gauss_residual(unit, u, d, c->rows + (size_t)i * (d + 1u), c->ratings[i].value,
                                        c->fitted_mu, tau);
        float v = (float)(r * cs);
        if (!isfinite(v)) return DPREC_ERR_INVALID_ARGUMENT;
        dprec_st32(p, c->ratings[i].item);
        dprec_stf32(p + 4, v);
    }
    *len = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
}

/* unit is the default; charge() sets the job's unit from params.unit */
const dprec_proto dprec_proto_gauss_gd = {"gauss-gd", DPREC_PROTO_GAUSS_GD, DPREC_UNIT_USER, DPREC_MODEL_CENTRAL,
                                          gauss_charge, gauss_build, NULL};
