/* dprec — the `dpmf` protocol, device side: seed 004 (Hua, Xia, Zhong, IJCAI 2015); common/protocols/dpmf.h has the model and the
 * mechanism, docs/privacy.md "dpmf" the guarantee, aggregator/protocols/dpmf.c the recommender, relay/ the relay.
 *
 * The device fits u by least squares on the round's release (sync.c; column 0 of V is 1, so u[0] is its own bias and
 * never leaves it), then, for at most k = params.max_items of its ratings (a uniform sample drawn afresh each round
 * from the CSPRNG: selection sampling, Knuth TAOCP vol. 2, 3.4.2, Algorithm S):
 *
 *   mode "trusted" (Scenario 1, central DP): sends x = [w; 1] (w = u[1 .. d-1] clipped to Gamma_u) and the targets
 *     t_j = r_j - mu - u[0] to the aggregator, which minimizes the perturbed objective. The aggregator is trusted to
 *     add the noise it publishes (privacy.laplace_scale, which the device checks against its own figure).
 *   modes "relay" and "dynamic" (Scenarios 2 and 3, the distributed model): computes, for EVERY item j (rated or not,
 *     so that which items it rated stays hidden) and every coordinate, its gradient -psi(e_j) x (0 for an item not in
 *     its sample) and a count (1 for a sampled item), in fixed point; draws its noise share (b / g) sqrt(2 H) C with
 *     C ~ N(0, 1 / K) (common/protocols/dpmf.h: the exact discrete Gaussian given H), H from the seed the relay gave for this round
 *     and K the relay's share count; draws a fresh 32-byte seed s from its CSPRNG and masks every number with the
 *     AES-CTR stream of s, mod 2^64. Its report has two parts, stored together and sent in order by sync.c: the head
 *     (to the aggregator: the report id and s, so that the recommender can take the masks off the relay's sum) and the
 *     tail (to the relay: the masked share). Static mode: one vector Phi = grad + share + Psi(s). Dynamic: Phi =
 *     grad + Psi(s) and tau = share + beta(s); the relay sums the tau of the round's first K shares only.
 *     The device never takes K, H or b from the recommender: K and H come from the relay (pinned by the app), b from
 *     the round's epsilon, which the device charges.
 *
 * Fixed size: trusted reports carry exactly k (item, target) pairs (padding after the real ones); relay reports are
 * m (d + 1) numbers whatever the user rated. The fallback (sync.c: a build that fails on the user's data) is the same
 * report for a user with no ratings: no gradient, the same noise share.
 *
 * The policy: every round is pure epsilon-DP at user level with the round's epsilon (privacy.round_epsilon, the
 * budget over the rounds), charged per report; the published total must cover the rounds (policy.c). */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "dpals.h"
#include "dpmf.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"

typedef struct dpmf_job {
    int mode;
    uint32_t k, shares; /* shares: the relay's K (cohort or noise_shares) */
    double u_clip, huber, lambda;
    dprec_dpmf_mech mech;
} dpmf_job;

static int num_param(const dprec_json_doc *doc, const char *path, double dflt, double lo, double hi, double *out) {
    *out = dflt;
    int rc = dprec_json_get_number(doc, 0, path, out);
    if (rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) return DPREC_ERR_JOB_PARAMS;
    return *out > lo && *out <= hi ? DPREC_OK : DPREC_ERR_JOB_PARAMS;
}

static int job_params(const dprec_client *c, const dprec_sync_job *job, dpmf_job *p) {
    const dprec_json_doc *doc = job->doc;
    memset(p, 0, sizeof *p);
    char mode[16];
    int rc = dprec_json_get_string(doc, 0, "params.mode", mode, sizeof mode, NULL);
    if (rc == DPREC_ERR_NOT_FOUND) strcpy(mode, "trusted");
    else if (rc != DPREC_OK) return DPREC_ERR_JOB_PARAMS;
    p->mode = dprec_dpmf_mode_of(mode);
    if (p->mode == 0) return DPREC_ERR_JOB_PARAMS;
    uint64_t k = DPREC_DPMF_DEFAULT_MAX_ITEMS;
    rc = dprec_json_get_u64(doc, 0, "params.max_items", &k);
    if ((rc != DPREC_OK && rc != DPREC_ERR_NOT_FOUND) || k < 1 || k > DPREC_DPMF_MAX_MAX_ITEMS) return DPREC_ERR_JOB_PARAMS;
    p->k = (uint32_t)k;
    if (num_param(doc, "params.u_clip", DPREC_DPMF_DEFAULT_U_CLIP, 0.0, DPREC_DPMF_MAX_PARAM, &p->u_clip) != DPREC_OK ||
        num_param(doc, "params.huber", DPREC_DPMF_DEFAULT_HUBER, 0.0, DPREC_DPMF_MAX_PARAM, &p->huber) != DPREC_OK)
        return DPREC_ERR_JOB_PARAMS;
    if (p->mode != DPREC_DPMF_TRUSTED) {
        uint64_t K = 0;
        rc = dprec_json_get_u64(doc, 0, p->mode == DPREC_DPMF_RELAY ? "params.cohort" : "params.noise_shares", &K);
        if (rc != DPREC_OK || K < 1 || K > DPREC_DPMF_MAX_SHARES) return DPREC_ERR_JOB_PARAMS;
        p->shares = (uint32_t)K;
    }
    /* the round's epsilon: the device charges it, and in the relay modes its own noise is calibrated to it */
    double eps = job->round_epsilon;
    if (!(eps > 0.0 && eps <= DPREC_DPMF_MAX_ROUND_EPSILON)) return DPREC_ERR_JOB_PARAMS;
    if (p->mode == DPREC_DPMF_TRUSTED) {
        double dflt = dprec_dpmf_default_lambda(c->cfg.dim, p->k, p->huber, p->u_clip, eps);
        if (num_param(doc, "params.lambda", dflt, 0.0, 1e12, &p->lambda) != DPREC_OK) return DPREC_ERR_JOB_PARAMS;
    }
    if (c->cfg.dim < 1 || c->cfg.dim > DPREC_DPMF_MAX_D) return DPREC_ERR_JOB_PARAMS;
    if (dprec_dpmf_mechanism(p->mode, c->cfg.dim, p->k, p->huber, p->u_clip, p->lambda, eps, &p->mech) != DPREC_OK)
        return DPREC_ERR_JOB_PARAMS;
    return DPREC_OK;
}

static size_t head_bytes(void) {
    return DPREC_ENVELOPE_HEADER + DPREC_DPMF_HEAD_SIZE;
}

static size_t report_size(const dprec_client *c, const dpmf_job *p) {
    if (p->mode == DPREC_DPMF_TRUSTED) return DPREC_ENVELOPE_HEADER + dprec_dpmf_trusted_size(c->cfg.dim, p->k);
    return head_bytes() + DPREC_ENVELOPE_HEADER + dprec_dpmf_share_size(p->mode, c->cfg.num_items, c->cfg.dim + 1u);
}

static int dpmf_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    dpmf_job p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    if (!(job->participation > 0.0 && job->participation <= 1.0) ||
        (p.mode == DPREC_DPMF_RELAY && job->participation != 1.0))
        return DPREC_ERR_JOB_PARAMS;
    if (p.mode != DPREC_DPMF_TRUSTED && (uint64_t)c->cfg.num_items * (c->cfg.dim + 1u) > ((uint64_t)1 << 20))
        return DPREC_ERR_JOB_PARAMS;
    /* trusted: the aggregator adds the noise; it must declare at least the scale the device computes */
    if (p.mode == DPREC_DPMF_TRUSTED) {
        double b;
        if (dprec_json_get_number(job->doc, 0, "privacy.laplace_scale", &b) != DPREC_OK || !(b >= p.mech.b * (1.0 - 1e-9)))
            return DPREC_ERR_JOB_PARAMS;
    }
    memset(out, 0, sizeof *out);
    out->unit = DPREC_UNIT_USER;
    out->model = p.mode == DPREC_DPMF_TRUSTED ? DPREC_MODEL_CENTRAL : DPREC_MODEL_DISTRIBUTED;
    out->round.kind = DPREC_STEP_PURE;
    out->round.epsilon = p.mech.eps_round;
    out->round.steps = 1;
    out->user_round = out->round;
    out->delta = 0.0;
    out->rounds = job->rounds;
    out->charge_sit_outs = 0; /* no amplification by sampling is claimed: a round costs when a report is sent */
    out->report_bytes = report_size(c, &p);
    out->relay = p.mode != DPREC_DPMF_TRUSTED;
    return DPREC_OK;
}

static int build_trusted(dprec_client *c, const dprec_sync_job *job, const dpmf_job *p,
                         const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out) {
    const uint32_t d = c->cfg.dim, k = p->k;
    const size_t payload = dprec_dpmf_trusted_size(d, k);
    dprec_proto_write_header(job, DPREC_PROTO_DPMF, report_id, (uint32_t)payload, out);
    unsigned char *pl = out + DPREC_ENVELOPE_HEADER;
    memcpy(pl, DPREC_DPMF_MAGIC_TRUSTED, 4);
    dprec_st32(pl + 4, d);
    dprec_st32(pl + 8, k);
    dprec_st32(pl + 12, 0u);
    double x[DPREC_DPMF_MAX_D];
    dprec_dpals_features(c->u + 1, d, p->u_clip, x); /* the fallback's u is 0: w = 0 */
    for (uint32_t a = 0; a + 1u < d; a++) {
        float v = (float)x[a];
        if (!isfinite(v)) return DPREC_ERR_INVALID_ARGUMENT;
        dprec_stf32(pl + 16 + 4 * (size_t)a, v);
    }
    unsigned char *pairs = pl + 16 + 4 * ((size_t)d - 1u);
    const double base = (double)c->fitted_mu + (double)c->u[0];
    const uint32_t n = c->count, keep = n < k ? n : k;
    uint32_t chosen = 0;
    for (uint32_t i = 0; i < n && chosen < keep; i++) {
        int take = 1;
        if (keep < n) {
            int rc = dprec_sample_bernoulli_rational(&c->rng, keep - chosen, n - i, &take);
            if (rc != DPREC_OK) return rc;
        }
        if (!take) continue;
        float t = (float)((double)c->ratings[i].value - base);
        if (!isfinite(t) || !isfinite(base)) return DPREC_ERR_INVALID_ARGUMENT;
        dprec_st32(pairs + 8u * (size_t)chosen, c->ratings[i].item);
        dprec_stf32(pairs + 8u * (size_t)chosen + 4, t);
        chosen++;
    }
    if (chosen != keep) return DPREC_ERR_INTERNAL;
    for (uint32_t s = keep; s < k; s++) {
        dprec_st32(pairs + 8u * (size_t)s, DPREC_PAD_ITEM);
        dprec_st32(pairs + 8u * (size_t)s + 4, 0u);
    }
    return DPREC_OK;
}

/* The relay modes' report: the head, then the tail (an envelope to the relay) holding the masked share. */
static int build_relay(dprec_client *c, const dprec_sync_job *job, const dpmf_job *p,
                       const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out) {
    const dprec_relay_round *rr = job->relay;
    if (rr == NULL || rr->round != job->round || rr->shares != p->shares || rr->mode != p->mode)
        return DPREC_ERR_JOB_PARAMS; /* the relay and the job disagree: nothing is built */
    const uint32_t d = c->cfg.dim, m = c->cfg.num_items, C = d + 1u, k = p->k;
    const int dyn = p->mode == DPREC_DPMF_DYNAMIC;
    const dprec_dpmf_mech *mech = &p->mech;
    const double bg = ldexp(mech->b, -mech->grid_log2);

    /* the head: the report id and the seed of this report's masks, for the recommender */
    unsigned char seed[DPREC_DPMF_SEED_SIZE];
    int rc = dprec_rng_bytes(&c->rng, seed, sizeof seed);
    if (rc != DPREC_OK) return rc;
    dprec_proto_write_header(job, DPREC_PROTO_DPMF, report_id, DPREC_DPMF_HEAD_SIZE, out);
    unsigned char *h = out + DPREC_ENVELOPE_HEADER;
    memcpy(h, DPREC_DPMF_MAGIC_HEAD, 4);
    dprec_st32(h + 4, 0u);
    memcpy(h + 8, report_id, DPREC_REPORT_ID_SIZE);
    memcpy(h + 24, seed, sizeof seed);

    /* the tail */
    unsigned char *tail = out + head_bytes();
    const size_t payload = dprec_dpmf_share_size(p->mode, m, C);
    dprec_proto_write_header(job, DPREC_PROTO_DPMF, report_id, (uint32_t)payload, tail);
    unsigned char *pl = tail + DPREC_ENVELOPE_HEADER;
    memcpy(pl, DPREC_DPMF_MAGIC_SHARE, 4);
    dprec_st32(pl + 4, (uint32_t)p->mode);
    dprec_st32(pl + 8, C);
    dprec_st32(pl + 12, m);
    unsigned char *phi = pl + 16, *tau = phi + 8u * (size_t)m * C;

    uint32_t taken = 0;
    const uint32_t n = c->count, keep = n < k ? n : k;
    double x[DPREC_DPMF_MAX_D];
    dprec_dpals_features(c->u + 1, d, p->u_clip, x);
    const double base = (double)c->fitted_mu + (double)c->u[0];
    if (!isfinite(base)) return DPREC_ERR_INVALID_ARGUMENT;

    dprec_dpmf_prg hp, psi, beta;
    dprec_noise_stream ns;
    if (dprec_dpmf_prg_init(&hp, rr->seed, DPREC_DPMF_DOMAIN_H) != 0 || dprec_dpmf_prg_init(&psi, seed, DPREC_DPMF_DOMAIN_PSI) != 0 ||
        dprec_dpmf_prg_init(&beta, seed, DPREC_DPMF_DOMAIN_BETA) != 0) {
        dprec_wipe(seed, sizeof seed);
        return DPREC_ERR_CRYPTO;
    }
    dprec_wipe(seed, sizeof seed);
    dprec_noise_stream_init(&ns, &c->rng);
    uint32_t cursor = 0; /* Algorithm S over the ratings (sorted by item), decided as their items go by */
    for (uint32_t j = 0; j < m && rc == DPREC_OK; j++) {
        double grad[DPREC_DPMF_MAX_D + 1];
        int rated = 0;
        if (cursor < n && c->ratings[cursor].item == j && taken < keep) {
            int take = 1;
            if (keep < n) rc = dprec_sample_bernoulli_rational(&c->rng, keep - taken, n - cursor, &take);
            if (rc == DPREC_OK && take) {
                const float *row = c->rows + (size_t)cursor * (d + 1u); /* v_j (d floats) then b_j */
                double e = (double)c->ratings[cursor].value - base - (double)row[d];
                for (uint32_t a = 0; a + 1u < d; a++) e -= x[a] * (double)row[1u + a];
                double ps = dprec_dpmf_psi(e, p->huber);
                for (uint32_t a = 0; a < d; a++) grad[a] = -ps * x[a];
                grad[d] = 1.0;
                rated = 1;
                taken++;
            }
            cursor++;
        }
        for (uint32_t a = 0; a < C && rc == DPREC_OK; a++) {
            const uint64_t at = (uint64_t)j * C + a;
            double hh;
            int64_t share = 0;
            uint64_t mpsi, mbeta = 0;
            int64_t g = rated ? dprec_dpmf_encode(grad[a], mech->grid_log2) : 0;
            if (dprec_dpmf_h(&hp, at, &hh) != 0 || dprec_dpmf_prg_u64(&psi, at, &mpsi) != 0 ||
                (dyn && dprec_dpmf_prg_u64(&beta, at, &mbeta) != 0)) {
                rc = DPREC_ERR_CRYPTO;
                break;
            }
            rc = dprec_dpmf_share(&ns, hh, bg, p->shares, &share);
            if (rc != DPREC_OK) break;
            if (dyn) {
                dprec_st64(phi + 8u * at, (uint64_t)g + mpsi);
                dprec_st64(tau + 8u * at, (uint64_t)share + mbeta);
            } else {
                dprec_st64(phi + 8u * at, (uint64_t)g + (uint64_t)share + mpsi);
            }
        }
    }
    dprec_noise_stream_wipe(&ns);
    dprec_dpmf_prg_free(&hp);
    dprec_dpmf_prg_free(&psi);
    dprec_dpmf_prg_free(&beta);
    if (rc == DPREC_OK && taken != keep) rc = DPREC_ERR_INTERNAL;
    return rc;
}

static int dpmf_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                      const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    if (!c->fitted && !c->fallback) return DPREC_ERR_STATE;
    dpmf_job p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    size_t want = report_size(c, &p);
    if (cap < want || pol->report_bytes != want) return DPREC_ERR_REPORT_TOO_LARGE;
    rc = p.mode == DPREC_DPMF_TRUSTED ? build_trusted(c, job, &p, report_id, out) : build_relay(c, job, &p, report_id, out);
    if (rc != DPREC_OK) return rc;
    *len = want;
    return DPREC_OK;
}

const dprec_proto dprec_proto_dpmf = {"dpmf", DPREC_PROTO_DPMF, dpmf_policy, dpmf_build, NULL};
