/* dprec — the `plain` protocol, device side: the reference without privacy (docs/protocol.md).
 *
 * The report carries the user's least-squares vector u (fitted on the round's release) and every rating,
 * exactly; the aggregator forms u u^T and (r - mu - b_j) u per rated item, the sufficient statistics of
 * the item step of alternating least squares. Its guarantee is none (model NONE, epsilon infinite): the
 * ledger refuses it unless the app set cfg.allow_non_private.
 *
 * Payload: [d u32][n u32] then u (d float32) then n pairs [item u32][rating float32], items strictly
 * increasing (the store keeps them sorted). */
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "protocol.h"
#include "report.h"

void dprec_proto_write_header(const dprec_sync_job *job, uint16_t protocol, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                              uint32_t payload_len, unsigned char *out) {
    dprec_envelope e;
    memset(&e, 0, sizeof e);
    e.protocol = protocol;
    e.job_id = job->job_id;
    e.round = job->round;
    memcpy(e.report_id, report_id, DPREC_REPORT_ID_SIZE);
    e.release_version = job->release_version;
    e.payload_len = payload_len;
    dprec_envelope_write_header(out, &e);
}

/* No privacy: nothing to check but the job's own fields; the ledger records an infinite epsilon and refuses the
 * report unless the app allows non-private reports. */
static int plain_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    (void)c;
    memset(out, 0, sizeof *out);
    out->unit = DPREC_UNIT_USER;
    out->model = DPREC_MODEL_NONE;
    out->round.kind = out->user_round.kind = DPREC_STEP_PURE;
    out->round.steps = out->user_round.steps = 1;
    out->rounds = job->rounds;
    return DPREC_OK;
}

static int plain_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                       const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    (void)pol;
    uint32_t d = c->cfg.dim, n = c->count;
    size_t payload = 8u + 4u * (size_t)d + 8u * (size_t)n;
    if (!c->fitted && !c->fallback) return DPREC_ERR_STATE;
    if (cap < DPREC_ENVELOPE_HEADER || cap - DPREC_ENVELOPE_HEADER < payload) return DPREC_ERR_REPORT_TOO_LARGE;

    dprec_proto_write_header(job, DPREC_PROTO_PLAIN, report_id, (uint32_t)payload, out);

    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(p, d);
    dprec_st32(p + 4, n);
    p += 8;
    for (uint32_t i = 0; i < d; i++, p += 4) dprec_stf32(p, c->u[i]);
    for (uint32_t i = 0; i < n; i++, p += 8) {
        dprec_st32(p, c->ratings[i].item);
        dprec_stf32(p + 4, c->ratings[i].value);
    }
    *len = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
}

const dprec_proto dprec_proto_plain = {"plain", DPREC_PROTO_PLAIN, plain_policy, plain_build, NULL};
