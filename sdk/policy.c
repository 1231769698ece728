/* dprec — what a job may cost, computed on the device (sdk/protocol.h; docs/privacy.md, "The device's policy").
 *
 * The device never takes the aggregator's word for what a report costs. Each protocol's policy reads the
 * job's public parameters, checks them against public bounds, and names the mechanism of one round; the
 * functions here compose that mechanism over the rounds with the device's own accountant (common/accountant.c),
 * fingerprint the job so that it cannot change under the device, and refuse a job whose published guarantee
 * understates the device's own figure. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "crypto.h"
#include "protocol.h"

/* One mechanism composed `rounds` times: pure rounds add up (basic composition, Dwork, Roth 2014, Thm. 3.16),
 * the others compose as RDP at every order of the accountant's grid and convert at delta (Canonne, Kamath,
 * Steinke 2020, Prop. 12). */
static int compose(const dprec_step *round, uint64_t rounds, double delta, double *eps) {
    if (rounds == 0) {
        *eps = 0.0;
        return DPREC_OK;
    }
    if (round->kind == DPREC_STEP_PURE) {
        *eps = (double)rounds * round->epsilon;
        return DPREC_OK;
    }
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    dprec_step s = *round;
    s.steps = rounds;
    int rc = dprec_accountant_add_step(&acc, &s);
    if (rc == DPREC_OK) rc = dprec_accountant_epsilon(&acc, delta, DPREC_CONVERSION_CKS, eps, NULL);
    return rc == DPREC_OK ? DPREC_OK : DPREC_ERR_JOB_PARAMS;
}

int dprec_policy_cost(const dprec_job_policy *pol, uint64_t rounds, double *eps, double *delta, double *user_eps,
                      double *user_delta) {
    if (pol->model == DPREC_MODEL_NONE) {
        *eps = *user_eps = INFINITY;
        *delta = *user_delta = 0.0;
        return DPREC_OK;
    }
    int rc = compose(&pol->round, rounds, pol->delta, eps);
    if (rc == DPREC_OK) rc = compose(&pol->user_round, rounds, pol->delta, user_eps);
    *delta = *user_delta = rounds > 0 ? pol->delta : 0.0;
    return rc;
}

int dprec_policy_check_published(const dprec_sync_job *job, const dprec_job_policy *pol) {
    if (pol->model == DPREC_MODEL_NONE) return DPREC_OK;
    double eps, delta, ueps, udelta;
    int rc = dprec_policy_cost(pol, pol->rounds, &eps, &delta, &ueps, &udelta);
    if (rc != DPREC_OK) return rc;
    const double slack = 1.0 - 1e-9;
    if (!(job->epsilon >= eps * slack) || !(job->delta >= delta * slack)) return DPREC_ERR_JOB_PARAMS;
    /* an aggregator that does not publish the user-level figure (older ones) is not refused for it: the device
     * charges its own figure either way */
    if (!isnan(job->user_epsilon) && !(job->user_epsilon >= ueps * slack)) return DPREC_ERR_JOB_PARAMS;
    return DPREC_OK;
}

static unsigned char *put_step(unsigned char *p, const dprec_step *s) {
    double f[5] = {s->epsilon, s->delta, s->noise_multiplier, s->q, s->rho};
    dprec_st32(p, (uint32_t)s->kind);
    dprec_st32(p + 4, (uint32_t)s->discrete);
    p += 8;
    for (int i = 0; i < 5; i++, p += 8) {
        uint64_t u;
        memcpy(&u, &f[i], sizeof u);
        dprec_st64(p, u);
    }
    return p;
}

void dprec_policy_pin(const char *protocol, const dprec_job_policy *pol, unsigned char pin[DPREC_JOB_PIN_SIZE]) {
    unsigned char buf[16 + DPREC_SYNC_PROTOCOL_NAME_MAX + 2 * 48 + 48];
    memset(buf, 0, sizeof buf);
    memcpy(buf, "dprec pin v1", 12);
    size_t n = strlen(protocol);
    memcpy(buf + 16, protocol, n < DPREC_SYNC_PROTOCOL_NAME_MAX ? n : DPREC_SYNC_PROTOCOL_NAME_MAX);
    unsigned char *p = buf + 16 + DPREC_SYNC_PROTOCOL_NAME_MAX;
    p = put_step(p, &pol->round);
    p = put_step(p, &pol->user_round);
    uint64_t du;
    memcpy(&du, &pol->delta, sizeof du);
    dprec_st64(p, du);
    dprec_st64(p + 16, (uint64_t)pol->report_bytes);
    dprec_st32(p + 24, (uint32_t)pol->unit);
    dprec_st32(p + 28, (uint32_t)pol->model);
    dprec_st32(p + 32, (uint32_t)pol->charge_sit_outs);
    unsigned char digest[32];
    if (dprec_sha256(buf, sizeof buf, digest) != 0) memset(digest, 0xff, sizeof digest); /* never all zero */
    memcpy(pin, digest, DPREC_JOB_PIN_SIZE);
}

int dprec_policy_check_job(const dprec_client *c, const dprec_sync_job *job) {
    if (job->d != c->cfg.dim || job->m != c->cfg.num_items || (float)job->rating_min != c->cfg.rating_min ||
        (float)job->rating_max != c->cfg.rating_max)
        return DPREC_ERR_RELEASE_MISMATCH;
    if (job->rounds < 1) return DPREC_ERR_JOB_PARAMS;
    if (job->round < 1 || job->round > job->rounds) return DPREC_ERR_JOB_ROUNDS;
    return DPREC_OK;
}
