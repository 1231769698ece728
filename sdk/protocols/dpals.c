/* dprec — the `dpals` protocol, device side: private alternating least squares (Chien et al., ICML 2021),
 * user-level joint DP (common/protocols/dpals.h; docs/privacy.md "dpals"; the aggregator: aggregator/protocols/dpals.c).
 *
 * The device fits u by exact least squares on the round's release (sync.c; column 0 of V is pinned to 1, so
 * u[0] is the user's own bias c_i) and never sends u[0]. It reports w = u[1 .. d-1] clipped to norm Gamma_u
 * (params.u_clip) and, for at most k = params.max_items of its ratings (a uniform sample drawn afresh each round
 * from the CSPRNG: selection sampling, Knuth TAOCP vol. 2, 3.4.2, Algorithm S), the target
 * t_j = clamp(r_j - mu - c_i, -Gamma_r, Gamma_r) (params.rating_clip, default 1 or half the scale's width if less),
 * or with params.residual the residual of the device's whole prediction on the release, r_j - mu - b_j - u . v_j,
 * clamped the same way (the bound does not depend on the release, which a malicious aggregator chooses). The
 * trusted aggregator forms x x^T and t_j x per item (x = [w; 1]), scaled by sqrt(k / n) for n < k pairs with
 * params.reweight (common/protocols/dpals.h), re-clips, and adds the noise. The report
 * carries the same information as the per-item statistics DPALS describes (x x^T and t_j x, from which t_j and
 * x are read back) in d - 1 + 2k numbers instead of k (d (d + 3) / 2).
 *
 * Fixed size: exactly k (item, target) pairs, the real ones first (items increasing), then padding pairs
 * (DPREC_PAD_ITEM, +0.0: report.h), so that its length never tells how many ratings the user has.
 *
 * The policy: each round is the Poisson-subsampled discrete Gaussian with the published noise multiplier z
 * (privacy.noise_multiplier, over the sensitivity sqrt(k (1 + alpha^2)) of the normalized statistics) at the job's
 * participation rate q; every round the device draws for is charged, sat out or not (when q < 1).
 *
 * Payload: [d u32][k u32] then w (d - 1 float32) then k pairs [item u32][target float32]. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "dpals.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"
#include "secure.h"

#define DPALS_MAX_NOISE_MULTIPLIER 1e6
#define DPALS_MAX_D 64u /* as the aggregator (aggregator/protocols/dpals.c) */

typedef struct dpals_job {
    uint32_t max_items;
    double u_clip, rating_clip, bias_scale, gram_weight;
    int residual; /* params.residual: utility only (the aggregator re-clamps every target whatever it is) */
    int reweight; /* params.reweight: only the secure report, which carries the statistics, scales them */
} dpals_job;

static int job_params(const dprec_client *c, const dprec_sync_job *job, dpals_job *p) {
    const dprec_json_doc *doc = job->doc;
    uint64_t k = DPREC_DPALS_DEFAULT_MAX_ITEMS;
    int rc = dprec_json_get_u64(doc, 0, "params.max_items", &k);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || k < 1 || k > DPREC_DPALS_MAX_MAX_ITEMS) return DPREC_ERR_JOB_PARAMS;
    p->max_items = (uint32_t)k;
    p->u_clip = DPREC_DPALS_DEFAULT_U_CLIP;
    rc = dprec_json_get_number(doc, 0, "params.u_clip", &p->u_clip);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || !(p->u_clip > 0.0 && p->u_clip <= DPREC_DPALS_MAX_CLIP))
        return DPREC_ERR_JOB_PARAMS;
    p->rating_clip = dprec_dpals_default_rating_clip((double)c->cfg.rating_min, (double)c->cfg.rating_max);
    rc = dprec_json_get_number(doc, 0, "params.rating_clip", &p->rating_clip);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) ||
        !(p->rating_clip > 0.0 && p->rating_clip <= DPREC_DPALS_MAX_CLIP))
        return DPREC_ERR_JOB_PARAMS;
    if (c->cfg.dim < 1 || c->cfg.dim > DPALS_MAX_D) return DPREC_ERR_JOB_PARAMS;
    p->residual = 0;
    rc = dprec_json_get_bool(doc, 0, "params.residual", &p->residual);
    if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return DPREC_ERR_JOB_PARAMS;
    /* a report of n < k ratings scaled by sqrt(k / n) (common/protocols/dpals.h): its norm stays within the sensitivity either way */
    p->reweight = DPREC_DPALS_DEFAULT_REWEIGHT;
    rc = dprec_json_get_bool(doc, 0, "params.reweight", &p->reweight);
    if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return DPREC_ERR_JOB_PARAMS;
    /* the bias feature, as the aggregator's (params.bias_scale, default u_clip, or 1 at d = 1): only the secure
     * report carries the statistics themselves */
    p->bias_scale = 0.0;
    rc = dprec_json_get_number(doc, 0, "params.bias_scale", &p->bias_scale);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || !(p->bias_scale >= 0.0 && p->bias_scale <= DPREC_DPALS_MAX_CLIP))
        return DPREC_ERR_JOB_PARAMS;
    if (!(p->bias_scale > 0.0)) p->bias_scale = c->cfg.dim > 1 ? p->u_clip : 1.0;
    /* the Gram statistics' weight (common/protocols/dpals.h): only the secure report, which the device noises itself, uses it,
     * and the device computes its sensitivity from it, so no value of it weakens the device's guarantee */
    p->gram_weight = DPREC_DPALS_DEFAULT_GRAM_WEIGHT;
    rc = dprec_json_get_number(doc, 0, "params.gram_weight", &p->gram_weight);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) ||
        !(p->gram_weight > 0.0 && p->gram_weight <= DPREC_DPALS_MAX_GRAM_WEIGHT))
        return DPREC_ERR_JOB_PARAMS;
    return DPREC_OK;
}

/* The target of rating i before the clamp: r - mu - c_i, or with params.residual the residual of the release's
 * whole prediction, r - mu - b_j - u . v_j (v_j[0] = 1: u[0] v_j[0] is c_i), from the rows the fit kept. */
static double target(const dprec_client *c, const dpals_job *p, uint32_t i) {
    const uint32_t d = c->cfg.dim;
    double e = (double)c->ratings[i].value - (double)c->fitted_mu;
    if (!p->residual) return e - (double)c->u[0];
    const float *row = c->rows + (size_t)i * (d + 1u); /* the device's own prediction, as recommend.c makes it */
    e -= (double)row[d];
    for (uint32_t a = 0; a < d; a++) e -= (double)c->u[a] * (double)row[a];
    return e;
}

/* params.aggregation "secure": the vector is the normalized statistics of every item (aggregator/protocols/dpals.c,
 * agg_dpals_accumulate), m (d (d + 1) / 2 + d) numbers of L2 norm <= sqrt(k (1 + alpha^2)). 0 if longer than secure aggregation
 * takes. */
static uint32_t secure_len(const dprec_client *c) {
    uint64_t n = (uint64_t)c->cfg.num_items * dprec_dpals_item_coords(c->cfg.dim);
    return n <= DPREC_DDG_MAX_DIM ? (uint32_t)n : 0u;
}

static int dpals_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    dpals_job p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    int secure = dprec_secure_requested(job), factors = 1;
    if (secure < 0) return DPREC_ERR_JOB_PARAMS;
    rc = dprec_json_get_bool(job->doc, 0, "params.factors", &factors);
    if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return DPREC_ERR_JOB_PARAMS;
    if (secure) { /* the aggregator is not trusted: the devices' shares make the noise (sdk/secure.h) */
        /* the secure report carries the statistics at the job's d; the bias model at d (params.factors false)
         * would need those of d = 1, which the aggregator refuses to combine with secure aggregation */
        if (!factors) return DPREC_ERR_JOB_PARAMS;
        if (secure_len(c) == 0) return DPREC_ERR_JOB_PARAMS;
        return dprec_secure_policy(c, job, secure_len(c), dprec_dpals_sensitivity(p.max_items, p.gram_weight), out);
    }
    double z = NAN, zp;
    if (dprec_json_get_number(job->doc, 0, "privacy.noise_multiplier", &z) != DPREC_OK || !(z > 0.0) ||
        !(z <= DPALS_MAX_NOISE_MULTIPLIER))
        return DPREC_ERR_JOB_PARAMS;
    if (dprec_json_get_number(job->doc, 0, "params.noise_multiplier", &zp) == DPREC_OK && zp != z)
        return DPREC_ERR_JOB_PARAMS; /* the job asked for one noise level and the aggregator claims another */
    if (!(job->participation > 0.0 && job->participation <= 1.0) || !(job->delta > 0.0 && job->delta < 1.0))
        return DPREC_ERR_JOB_PARAMS;
    memset(out, 0, sizeof *out);
    out->unit = DPREC_UNIT_USER;
    out->model = DPREC_MODEL_JOINT;
    out->round.kind = DPREC_STEP_GAUSSIAN;
    out->round.noise_multiplier = z;
    out->round.q = job->participation;
    out->round.steps = 1;
    out->round.discrete = 1; /* common/noise.c: the aggregator's Gaussian is the discrete Gaussian on a grid */
    out->user_round = out->round;
    out->charge_sit_outs = job->participation < 1.0; /* the accounting spreads the cost over every draw */
    out->delta = job->delta;
    out->rounds = job->rounds;
    out->report_bytes = DPREC_ENVELOPE_HEADER + dprec_dpals_payload_size(c->cfg.dim, p.max_items);
    return DPREC_OK;
}

/* The secure report: the same sample of at most k ratings and the same features as the trusted report, turned into
 * the statistics the aggregator would have formed from it, for every item (0 for the others), then encoded and masked
 * (sdk/secure.c). */
static int build_secure(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol, const dpals_job *p,
                        const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap,
                        size_t *len) {
    const uint32_t d = c->cfg.dim, n = c->count, k = p->max_items, keep = n < k ? n : k;
    const uint32_t cw = dprec_dpals_item_coords(d), vlen = secure_len(c);
    double *st = dprec_secure_input(c);
    if (st == NULL || vlen == 0 || pol->secure_job.plan.d != vlen) return DPREC_ERR_STATE;
    double x[DPALS_MAX_D];
    dprec_dpals_features(c->u + 1, d, p->u_clip, x); /* the fallback's u is 0: w = 0 */
    x[d - 1u] = p->bias_scale;
    const double x2 = dprec_dpals_x2(d, p->u_clip, p->bias_scale), om = dprec_dpals_report_weight(k, keep, p->reweight);
    const double gs = om * p->gram_weight / x2, hs = om / (p->rating_clip * sqrt(x2));
    memset(st, 0, sizeof(double) * vlen);
    uint32_t chosen = 0;
    for (uint32_t i = 0; i < n && chosen < keep; i++) {
        int take = 1;
        if (keep < n) {
            int rc = dprec_sample_bernoulli_rational(&c->rng, keep - chosen, n - i, &take);
            if (rc != DPREC_OK) return rc;
        }
        if (!take) continue;
        /* the target as the trusted report carries it (a float32), clamped again as the aggregator does */
        const double e = target(c, p, i);
        if (!isfinite(e)) return DPREC_ERR_INVALID_ARGUMENT;
        double t = dprec_dpals_clamp((double)(float)dprec_dpals_clamp(e, p->rating_clip), p->rating_clip);
        double *row = st + (size_t)c->ratings[i].item * cw;
        size_t at = 0;
        for (uint32_t a = 0; a < d; a++)
            for (uint32_t b = a; b < d; b++) row[at++] += x[a] * x[b] * gs;
        for (uint32_t a = 0; a < d; a++) row[at++] += t * x[a] * hs;
        chosen++;
    }
    if (chosen != keep) return DPREC_ERR_INTERNAL;
    return dprec_secure_build(c, job, pol, DPREC_PROTO_DPALS, report_id, out, cap, len);
}

static int dpals_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                       const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    if (!c->fitted && !c->fallback) return DPREC_ERR_STATE;
    dpals_job p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    if (pol->secure) return build_secure(c, job, pol, &p, report_id, out, cap, len);
    const uint32_t d = c->cfg.dim, n = c->count, k = p.max_items, keep = n < k ? n : k;
    size_t payload = dprec_dpals_payload_size(d, k);
    if (cap < pol->report_bytes || pol->report_bytes != DPREC_ENVELOPE_HEADER + payload) return DPREC_ERR_REPORT_TOO_LARGE;

    dprec_proto_write_header(job, DPREC_PROTO_DPALS, report_id, (uint32_t)payload, out);
    unsigned char *pl = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(pl, d);
    dprec_st32(pl + 4, k);
    double x[DPALS_MAX_D];
    dprec_dpals_features(c->u + 1, d, p.u_clip, x); /* the fallback's u is 0: w = 0 */
    for (uint32_t a = 0; a + 1u < d; a++) {
        float v = (float)x[a];
        if (!isfinite(v)) return DPREC_ERR_INVALID_ARGUMENT;
        dprec_stf32(pl + 8 + 4 * (size_t)a, v);
    }
    unsigned char *pairs = pl + 8 + 4 * ((size_t)d - 1u);
    uint32_t chosen = 0;
    for (uint32_t i = 0; i < n && chosen < keep; i++) {
        int take = 1;
        if (keep < n) { /* Algorithm S: item i is taken with probability (keep - chosen) / (n - i), exactly */
            rc = dprec_sample_bernoulli_rational(&c->rng, keep - chosen, n - i, &take);
            if (rc != DPREC_OK) return rc;
        }
        if (!take) continue;
        double e = target(c, &p, i);
        float t = (float)dprec_dpals_clamp(e, p.rating_clip);
        if (!isfinite(t) || !isfinite(e)) return DPREC_ERR_INVALID_ARGUMENT;
        unsigned char *pr = pairs + 8u * (size_t)chosen;
        dprec_st32(pr, c->ratings[i].item);
        dprec_stf32(pr + 4, t);
        chosen++;
    }
    if (chosen != keep) return DPREC_ERR_INTERNAL;
    for (uint32_t s = keep; s < k; s++) {
        dprec_st32(pairs + 8u * (size_t)s, DPREC_PAD_ITEM);
        dprec_st32(pairs + 8u * (size_t)s + 4, 0u);
    }
    *len = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
}

const dprec_proto dprec_proto_dpals = {"dpals", DPREC_PROTO_DPALS, dpals_policy, dpals_build, NULL};
