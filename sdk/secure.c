/* dprec — a device's part in a secure-aggregation job: the checks of the published plan, the report (encode, then
 * mask), and the memory it takes. sdk/secure.h says what is checked and why; sync_secure.c runs the round's steps. */
#include <math.h>
#include <string.h>

#include "alloc.h"
#include "bytes.h"
#include "client_priv.h"
#include "report.h"
#include "secure.h"

_Static_assert(sizeof(dprec_secure_state) <= DPREC_SECURE_FIXED_BYTES, "the documented fixed part holds the state");

static uint32_t pow2_at_least(uint32_t n) {
    uint32_t p = 1;
    while (p < n && p < (1u << 30)) p <<= 1;
    return p;
}

size_t dprec_secure_memory(const dprec_config *cfg) {
    uint32_t n = cfg->secagg_max_len;
    if (n == 0) return 0;
    size_t D = pow2_at_least(n);
    return DPREC_SECURE_FIXED_BYTES + dprec_heap_round(8u * (size_t)n) + 32u * D;
}

dprec_secure_state *dprec_secure_of(const dprec_client *c) {
    return (dprec_secure_state *)(void *)c->secure;
}

double *dprec_secure_input(const dprec_client *c) {
    return c->secure != NULL ? (double *)(void *)(c->secure + DPREC_SECURE_FIXED_BYTES) : NULL;
}

int dprec_secure_requested(const dprec_sync_job *job) {
    char a[16];
    int rc = dprec_json_get_string(job->doc, 0, "params.aggregation", a, sizeof a, NULL);
    if (rc == DPREC_ERR_NOT_FOUND) return 0;
    if (rc != DPREC_OK) return -1;
    if (strcmp(a, "secure") == 0) return 1;
    return strcmp(a, "trusted") == 0 ? 0 : -1;
}

static int get_u32(const dprec_json_doc *doc, const char *path, uint32_t *out) {
    uint64_t v;
    if (dprec_json_get_u64(doc, 0, path, &v) != DPREC_OK || v > UINT32_MAX) return DPREC_ERR_JOB_PARAMS;
    *out = (uint32_t)v;
    return DPREC_OK;
}

static int hex_byte(const char *s, unsigned char *out) {
    int v = 0;
    for (int i = 0; i < 2; i++) {
        char ch = s[i];
        int n = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (n < 0) return -1;
        v = v * 16 + n;
    }
    *out = (unsigned char)v;
    return 0;
}

int dprec_secure_policy(const dprec_client *c, const dprec_sync_job *job, uint32_t len, double clip,
                        dprec_job_policy *pol) {
    if (c->secure == NULL || len > c->cfg.secagg_max_len) return DPREC_ERR_CONFIG;
    const dprec_json_doc *doc = job->doc;
    dprec_secure_job own, *sj = &own;
    memset(sj, 0, sizeof *sj);
    dprec_ddg_plan *p = &sj->plan;
    uint64_t norm2 = 0, share = 0;
    double gamma = NAN, pclip = NAN;
    uint32_t log2_dim = 0;
    if (get_u32(doc, "privacy.secagg.neighbours", &sj->k) != DPREC_OK ||
        get_u32(doc, "privacy.secagg.threshold", &sj->threshold) != DPREC_OK ||
        get_u32(doc, "privacy.secagg.n_min", &p->n_min) != DPREC_OK ||
        get_u32(doc, "privacy.secagg.n_max", &p->n_max) != DPREC_OK ||
        get_u32(doc, "privacy.secagg.bits", &p->bits) != DPREC_OK ||
        get_u32(doc, "privacy.secagg.d", &p->d) != DPREC_OK || get_u32(doc, "privacy.secagg.dim", &p->dim) != DPREC_OK ||
        dprec_json_get_u64(doc, 0, "privacy.secagg.norm2_bound", &norm2) != DPREC_OK ||
        dprec_json_get_u64(doc, 0, "privacy.secagg.share_num", &share) != DPREC_OK ||
        dprec_json_get_number(doc, 0, "privacy.secagg.gamma_log2", &gamma) != DPREC_OK ||
        dprec_json_get_number(doc, 0, "privacy.secagg.clip", &pclip) != DPREC_OK)
        return DPREC_ERR_JOB_PARAMS;
    char seed[2 * DPREC_DDG_SEED_SIZE + 1];
    size_t seed_len = 0;
    if (dprec_json_get_string(doc, 0, "secagg.seed", seed, sizeof seed, &seed_len) != DPREC_OK ||
        seed_len != 2 * DPREC_DDG_SEED_SIZE)
        return DPREC_ERR_JOB_PARAMS;
    for (uint32_t i = 0; i < DPREC_DDG_SEED_SIZE; i++)
        if (hex_byte(seed + 2 * i, &sj->seed[i]) != 0) return DPREC_ERR_JOB_PARAMS;
    /* the vector is the protocol's, its bound the protocol's clip: the device's own figures, not the job's */
    /* (the clip compared within the rounding of a JSON number: the device encodes with its own; the enforced bound is
     * the plan's integer norm2_bound) */
    if (p->d != len || !(fabs(pclip - clip) <= 1e-9 * clip) || !(gamma == floor(gamma)) || fabs(gamma) > 200.0)
        return DPREC_ERR_JOB_PARAMS;
    while (log2_dim < 25 && (1u << log2_dim) < p->dim) log2_dim++;
    p->log2_dim = log2_dim;
    p->gamma_log2 = (int)gamma;
    p->clip = clip;
    p->beta = exp(-0.5);
    p->norm2_bound = norm2;
    p->share_num = share;
    p->clamp = (int64_t)ceil(DPREC_DDG_CLAMP_SDS * sqrt((double)share / (double)DPREC_DDG_SHARE_DEN)) + 1;
    if (share > ((uint64_t)1 << 53)) return DPREC_ERR_JOB_PARAMS;
    /* SecAgg+: a secret needs more than half of the holders (two disjoint sets of neighbours could otherwise recover
     * both of a device's secrets, self-mask and pairwise key); the round unmasks only with at least n_min survivors,
     * and the noise is sized for n_min shares */
    if (sj->k < 2 || sj->k > DPREC_SECAGG_MAX_NEIGHBOURS || sj->k % 2 != 0 || sj->threshold > sj->k ||
        2u * sj->threshold <= sj->k || p->n_min < sj->threshold || p->n_min < DPREC_SECURE_MIN_SURVIVORS ||
        p->n_max < p->n_min)
        return DPREC_ERR_JOB_PARAMS;
    /* against an active server: with c colluding enrolled devices among its k neighbours, the server holds t shares of
     * both of its secrets once (k - c) + 2c >= 2t; the plan tolerates 2t - k - 1 and the device asks for at least
     * cfg.secagg_min_colluders (docs/privacy.md); a published tolerance must be the plan's own */
    uint32_t colluders = 2u * sj->threshold - sj->k - 1u;
    uint64_t pub_colluders = 0;
    if (colluders < c->cfg.secagg_min_colluders) return DPREC_ERR_JOB_PARAMS;
    int has_pub = dprec_json_get_u64(doc, 0, "privacy.secagg.colluders", &pub_colluders);
    if (has_pub != DPREC_ERR_NOT_FOUND && (has_pub != DPREC_OK || pub_colluders != colluders)) return DPREC_ERR_JOB_PARAMS;
    if (p->dim != pow2_at_least(len) || job->rounds < 1) return DPREC_ERR_JOB_PARAMS;
    if (dprec_ddg_plan_check(p, job->rounds) != DPREC_OK) return DPREC_ERR_JOB_PARAMS; /* wrapping b, bad integers */
    /* participation must be 1: the aggregator, the adversary here, sees which devices join a round (their keys), so
     * Poisson sampling amplifies nothing against it; a job that claims the amplification is refused */
    if (!(job->participation == 1.0) || !(job->delta > 0.0 && job->delta < 1.0) ||
        !(job->epsilon > 0.0) || !isfinite(job->epsilon))
        return DPREC_ERR_JOB_PARAMS;
    double conv = job->delta - (1.0 + exp(job->epsilon < 700.0 ? job->epsilon : 700.0)) * p->delta_clamp;
    if (!(conv > 0.0)) return DPREC_ERR_JOB_PARAMS;
    /* a published figure that claims more noise than the integers give is refused too */
    double z_pub = NAN;
    if (dprec_json_get_number(doc, 0, "privacy.noise_multiplier", &z_pub) == DPREC_OK &&
        !(z_pub <= p->noise_multiplier * (1.0 + 1e-9)))
        return DPREC_ERR_JOB_PARAMS;
    memset(pol, 0, sizeof *pol);
    pol->unit = DPREC_UNIT_USER;
    pol->model = DPREC_MODEL_SECURE_AGGREGATION;
    pol->round.kind = DPREC_STEP_GAUSSIAN;
    pol->round.noise_multiplier = p->noise_multiplier;
    pol->round.q = 1.0;
    pol->round.steps = 1;
    pol->round.discrete = 1;
    pol->user_round = pol->round;
    pol->delta = conv;
    pol->rounds = job->rounds;
    pol->charge_sit_outs = 0;
    pol->report_bytes = dprec_secure_report_size(sj);
    pol->secure = 1;
    pol->secure_job = own;
    return DPREC_OK;
}

size_t dprec_secure_report_size(const dprec_secure_job *sj) {
    return DPREC_ENVELOPE_HEADER + DPREC_SECURE_PAYLOAD_SIZE(sj->plan.dim, sj->k);
}

int dprec_secure_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol, uint16_t wire_id,
                       const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    dprec_secure_state *s = dprec_secure_of(c);
    const dprec_secure_job *sj = &pol->secure_job;
    if (!pol->secure) return DPREC_ERR_STATE;
    const dprec_ddg_plan *p = &sj->plan;
    size_t want = dprec_secure_report_size(sj);
    if (s == NULL || cap < want) return DPREC_ERR_REPORT_TOO_LARGE;
    if (s->job != job->job_id || s->round != job->round || s->dev.state != DPREC_SECAGG_SHARED ||
        s->dev.p.dim != p->dim || s->dev.p.bits != p->bits)
        return DPREC_ERR_STATE;
    double *x = dprec_secure_input(c);
    size_t D = p->dim;
    double *work = (double *)(void *)((unsigned char *)x + dprec_heap_round(8u * (size_t)c->cfg.secagg_max_len));
    int64_t *y = (int64_t *)(void *)(work + D);
    uint64_t *res = (uint64_t *)(void *)(y + D), *masked = res + D;
    if (c->fallback) memset(x, 0, 8u * (size_t)p->d); /* a user with no ratings contributes 0 (plus its noise) */
    int rc = dprec_ddg_encode(&c->rng, p, sj->seed, x, work, NULL, y, res);
    if (rc == DPREC_OK) rc = dprec_secagg_mask(&s->dev, &c->rng, s->inbox, s->n_inbox, res, masked);
    /* the neighbours it masked with, signed: a holder reveals its self-mask share only if named there */
    uint32_t ids[DPREC_SECAGG_MAX_NEIGHBOURS], m = 0;
    unsigned char stmt[DPREC_SECAGG_MASKED_STATEMENT_MAX];
    size_t stmt_len = 0;
    if (rc == DPREC_OK) rc = dprec_secagg_masked_with(&s->dev, ids, &m);
    if (rc == DPREC_OK && (m > sj->k || (stmt_len = dprec_secagg_masked_statement(job->job_id, job->round, s->dev.p.id,
                                                                                   ids, m, stmt)) == 0))
        rc = DPREC_ERR_STATE; /* more than the plan's k: the share step refuses such a list */
    if (rc == DPREC_OK) {
        dprec_proto_write_header(job, wire_id, report_id, (uint32_t)(want - DPREC_ENVELOPE_HEADER), out);
        unsigned char *pl = out + DPREC_ENVELOPE_HEADER;
        memcpy(pl, DPREC_SECURE_PAYLOAD_MAGIC, 4);
        dprec_st32(pl + 4, s->dev.p.id);
        dprec_st32(pl + 8, p->dim);
        dprec_st32(pl + 12, p->bits);
        for (size_t j = 0; j < D; j++) dprec_st64(pl + 16 + 8 * j, masked[j]);
        unsigned char *tr = pl + 16 + 8 * D;
        memset(tr, 0, DPREC_SECURE_MASKED_WIRE(sj->k));
        dprec_st32(tr, m);
        for (uint32_t j = 0; j < m; j++) dprec_st32(tr + 4 + 4 * j, ids[j]);
        rc = dprec_identity_sign_statement(c, DPREC_SECAGG_MASKED_LABEL, stmt, stmt_len, tr + 4 + 4 * (size_t)sj->k);
        if (rc == DPREC_OK) *len = want;
    }
    /* the unmasked residues and the noise are secrets: nothing of them stays */
    dprec_wipe(x, 8u * (size_t)p->d);
    dprec_wipe(work, 32u * D);
    return rc;
}
