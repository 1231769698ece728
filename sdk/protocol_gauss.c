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
 * Payload: [d u32][n u32] then x (d + 1 float32) then n pairs [item u32][coef float32], items strictly
 * increasing. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "gauss.h"
#include "protocol.h"
#include "report.h"

#define GAUSS_DEFAULT_CLIP 1.0

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

    /* two passes, no scratch memory: the sum of squared residuals, then the scaled values */
    double sq = 0.0, xs, cs;
    for (uint32_t i = 0; i < n; i++) {
        double e = dprec_gauss_residual(unit, c->u, d, c->rows + (size_t)i * (d + 1u), c->ratings[i].value,
                                        c->fitted_mu, tau);
        sq += e * e;
    }
    dprec_gauss_scales(unit, c->u, d, sq, clip, &xs, &cs);

    dprec_proto_write_header(job, DPREC_PROTO_GAUSS_GD, report_id, (uint32_t)payload, out);

    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(p, d);
    dprec_st32(p + 4, n);
    p += 8;
    for (uint32_t k = 0; k < d; k++, p += 4) dprec_stf32(p, (float)((double)c->u[k] * xs));
    dprec_stf32(p, (float)xs);
    p += 4;
    for (uint32_t i = 0; i < n; i++, p += 8) {
        double r = dprec_gauss_residual(unit, c->u, d, c->rows + (size_t)i * (d + 1u), c->ratings[i].value,
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
