/* dprec — the `sgld` protocol, device side: one posterior sample as the private release (seed 003, Liu, Wang, Smola,
 * RecSys 2015; common/protocols/sgld.h has the arithmetic, docs/privacy.md "sgld" the guarantee; the aggregator:
 * aggregator/protocols/sgld.c).
 *
 * Trust: the curator (the aggregator) receives the device's ratings themselves, trimmed, once per job; it is trusted
 * to keep them and to release only one sample of V from the tempered posterior. So the device takes part only if its
 * app consented (cfg.sgld_max_ratings > 0) and never sends more than that many ratings.
 *
 * What the device decides for itself, never from the job: its epsilon_i (cfg.sgld_epsilon, at most the job's
 * epsilon; 0 means the job's), its weight w_i = (eps_i / eps) min(rho, tau / n) (common/protocols/sgld.h: so that its personalized
 * guarantee is eps_i whatever its number of ratings), and which ratings it sends: a uniform random subset of
 * n = min(tau, m_i) of them, drawn from the CSPRNG (selection sampling, Knuth TAOCP vol. 2, 3.4.2, Algorithm S). It
 * recomputes B = tau (r_max - r_min + kappa)^2 and beta = eps / (4B) itself and refuses a job that publishes other
 * values (the temperature the curator promises to sample at), a job of more than one round (one upload per job), and
 * a published delta other than 0 (the unknown delta' of the chain is not a budget).
 *
 * The charge: eps_i, pure, user level, model "posterior-sampling heuristic" (its caveat printed wherever it is shown).
 *
 * Fixed size: exactly tau pairs, the real ones first (items increasing), then padding pairs (DPREC_PAD_ITEM, +0.0:
 * report.h), so that the report's length never tells how many ratings the user has.
 *
 * Payload: [tau u32][w float32] then tau pairs [item u32][rating float32]. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"
#include "sgld.h"

typedef struct sgld_job {
    uint32_t tau;
    double kappa, rho;
    double epsilon;   /* the job's (published) */
    double eps_i;     /* the device's own, at most epsilon */
} sgld_job;

/* A published number that must equal the device's own figure (a relative 1e-9 for the JSON's rounding); absent is
 * fine. */
static int published_matches(const dprec_json_doc *doc, const char *path, double mine) {
    double v;
    int rc = dprec_json_get_number(doc, 0, path, &v);
    if (rc == DPREC_ERR_NOT_FOUND) return 1;
    return rc == DPREC_OK && fabs(v - mine) <= 1e-9 * fabs(mine);
}

static int job_params(const dprec_client *c, const dprec_sync_job *job, sgld_job *p) {
    const dprec_json_doc *doc = job->doc;
    uint64_t tau = DPREC_SGLD_DEFAULT_TAU;
    int rc = dprec_json_get_u64(doc, 0, "params.tau", &tau);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || tau < 1 || tau > DPREC_SGLD_MAX_TAU) return DPREC_ERR_JOB_PARAMS;
    if (c->cfg.sgld_max_ratings == 0) return DPREC_ERR_CONFIG; /* the app never consented to a curator */
    if (tau > c->cfg.sgld_max_ratings) return DPREC_ERR_JOB_PARAMS; /* more ratings than the app agreed to share */
    p->tau = (uint32_t)tau;
    p->kappa = 0.0;
    rc = dprec_json_get_number(doc, 0, "params.kappa", &p->kappa);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || !(p->kappa >= 0.0 && p->kappa <= DPREC_SGLD_MAX_KAPPA))
        return DPREC_ERR_JOB_PARAMS;
    p->rho = dprec_sgld_default_rho(p->tau);
    rc = dprec_json_get_number(doc, 0, "params.max_weight", &p->rho);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || !(p->rho > 0.0 && p->rho <= DPREC_SGLD_MAX_WEIGHT))
        return DPREC_ERR_JOB_PARAMS;
    p->epsilon = job->epsilon;
    if (!(p->epsilon > 0.0) || !isfinite(p->epsilon)) return DPREC_ERR_JOB_PARAMS;
    double own = c->cfg.sgld_epsilon;
    p->eps_i = own > 0.0 && own < p->epsilon ? own : p->epsilon;
    return DPREC_OK;
}

static int sgld_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    sgld_job p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    if (job->rounds != 1 || !(job->delta == 0.0)) return DPREC_ERR_JOB_PARAMS;
    const double range = (double)c->cfg.rating_max - (double)c->cfg.rating_min;
    const double bound = dprec_sgld_bound(p.tau, range, p.kappa);
    if (!published_matches(job->doc, "privacy.bound", bound) ||
        !published_matches(job->doc, "privacy.beta", dprec_sgld_beta(p.epsilon, bound)))
        return DPREC_ERR_JOB_PARAMS; /* the curator would sample at another temperature than the job's epsilon says */
    memset(out, 0, sizeof *out);
    out->unit = DPREC_UNIT_USER;
    out->model = DPREC_MODEL_POSTERIOR_HEURISTIC;
    out->round.kind = DPREC_STEP_PURE;
    out->round.epsilon = p.eps_i; /* the device's personalized guarantee (common/protocols/sgld.h) */
    out->round.steps = 1;
    out->user_round = out->round;
    out->delta = 0.0;
    out->rounds = job->rounds;
    out->charge_sit_outs = 0;
    out->report_bytes = DPREC_ENVELOPE_HEADER + dprec_sgld_payload_size(p.tau);
    return DPREC_OK;
}

static int sgld_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                      const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    sgld_job p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    const uint32_t n = c->count, tau = p.tau, keep = n < tau ? n : tau;
    const size_t payload = dprec_sgld_payload_size(tau);
    if (cap < pol->report_bytes || pol->report_bytes != DPREC_ENVELOPE_HEADER + payload) return DPREC_ERR_REPORT_TOO_LARGE;
    float w = dprec_sgld_weight(p.eps_i, p.epsilon, tau, keep, p.rho);
    if (!(w > 0.0f)) return DPREC_ERR_INVALID_ARGUMENT;
    dprec_proto_write_header(job, DPREC_PROTO_SGLD, report_id, (uint32_t)payload, out);
    unsigned char *pl = out + DPREC_ENVELOPE_HEADER, *pairs = pl + 8;
    dprec_st32(pl, tau);
    dprec_stf32(pl + 4, w);
    uint32_t chosen = 0;
    for (uint32_t i = 0; i < n && chosen < keep; i++) {
        int take = 1;
        if (keep < n) { /* Algorithm S: rating i is kept with probability (keep - chosen) / (n - i), exactly */
            rc = dprec_sample_bernoulli_rational(&c->rng, keep - chosen, n - i, &take);
            if (rc != DPREC_OK) return rc;
        }
        if (!take) continue;
        float r = c->ratings[i].value;
        if (!isfinite(r)) return DPREC_ERR_INVALID_ARGUMENT;
        dprec_st32(pairs + 8u * (size_t)chosen, c->ratings[i].item);
        dprec_stf32(pairs + 8u * (size_t)chosen + 4, r);
        chosen++;
    }
    if (chosen != keep) return DPREC_ERR_INTERNAL;
    for (uint32_t s = keep; s < tau; s++) {
        dprec_st32(pairs + 8u * (size_t)s, DPREC_PAD_ITEM);
        dprec_st32(pairs + 8u * (size_t)s + 4, 0u);
    }
    *len = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
}

const dprec_proto dprec_proto_sgld = {"sgld", DPREC_PROTO_SGLD, sgld_policy, sgld_build, NULL};
