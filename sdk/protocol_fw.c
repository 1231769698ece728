/* dprec — the `private-fw` protocol, device side (seed 002, Jain, Thakkar, Thakurta, ICML 2018: A_local of
 * Algorithm 1; docs/privacy.md "private-fw", docs/protocol.md "private-fw"). Joint DP at user level.
 *
 * The device keeps, for one job, its sample Omega_i of at most xi of its ratings (drawn once, uniformly with
 * its CSPRNG among its ratings of the job's item subset, which the release marks with item bias 1) and the
 * coefficients g of its row Y_i = sum_c g_c v_c over the release's columns (sdk/fw.h). Each round, on the
 * release of version r (column r - 2 holds the newest direction v, global_mean holds lambda-hat; release 1
 * has v = 0), it takes one local Frank-Wolfe step (dprec_fw_local_step: u_i = A_i v / lambda,
 * Y_i <- Pi_{L,Omega}((1 - 1/T) Y_i - (k/T) u_i v^T)), keeps the new g, and reports its new residual
 * A_i = P_Omega(Y_i - Y*_i), clipped to ||A_i|| <= 2L. Y*_i are its ratings minus the job's public offset
 * (params.offset, default the middle of the rating scale). No noise is added here: the aggregator's noisy
 * sum protects every other user's outputs; this user's own Y_i depends on their data, which joint DP allows.
 *
 * The state is saved with the report (dprec_report_prepare saves the store before the report can leave), in
 * store section 5; a step already applied for this round (a retry) is not applied twice.
 *
 * Payload (sdk/fw.h): [n u32][0 u32] then n pairs [item u32][a float32], items strictly increasing. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "fw.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"

#define FW_PREFIX 32u

size_t dprec_fw_state_bytes(const dprec_config *cfg) {
    if (cfg->fw_max_ratings == 0) return 0;
    /* items (4 xi), g (4 d), and the step's scratch: Y_i, Y*_i, v on Omega_i (12 xi) */
    return 16u * (size_t)cfg->fw_max_ratings + 4u * (size_t)cfg->dim;
}

size_t dprec_fw_section_max(const dprec_config *cfg) {
    if (cfg->fw_max_ratings == 0) return 0;
    return DPREC_STORE_SECTION_HEADER + FW_PREFIX + 4u * (size_t)cfg->fw_max_ratings + 4u * (size_t)cfg->dim;
}

void dprec_fw_reset(dprec_client *c) {
    c->fw_job = 0;
    c->fw_round = 0;
    c->fw_n = 0;
    if (c->fw_g != NULL) memset(c->fw_g, 0, sizeof(float) * c->cfg.dim);
}

/* [job u64][round u64][n u32][dim u32][reserved u64 = 0] then n items u32, then dim floats g */
unsigned char *dprec_fw_encode(const dprec_client *c, unsigned char *p) {
    if (c->cfg.fw_max_ratings == 0 || c->fw_job == 0) return p;
    uint32_t len = FW_PREFIX + 4u * c->fw_n + 4u * c->cfg.dim;
    dprec_st16(p, DPREC_SECTION_FW);
    dprec_st16(p + 2, 0); /* non-critical */
    dprec_st32(p + 4, len);
    unsigned char *d = p + DPREC_STORE_SECTION_HEADER;
    dprec_st64(d, c->fw_job);
    dprec_st64(d + 8, c->fw_round);
    dprec_st32(d + 16, c->fw_n);
    dprec_st32(d + 20, c->cfg.dim);
    dprec_st64(d + 24, 0);
    d += FW_PREFIX;
    for (uint32_t i = 0; i < c->fw_n; i++, d += 4) dprec_st32(d, c->fw_items[i]);
    for (uint32_t k = 0; k < c->cfg.dim; k++, d += 4) dprec_stf32(d, c->fw_g[k]);
    return d;
}

int dprec_fw_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit) {
    if (len < FW_PREFIX) return DPREC_ERR_STORE_CORRUPT;
    uint64_t job = dprec_ld64(d), round = dprec_ld64(d + 8);
    uint32_t n = dprec_ld32(d + 16), dim = dprec_ld32(d + 20);
    if (job == 0 || dprec_ld64(d + 24) != 0 || n > 65535u || dim > DPREC_MAX_DIM ||
        (uint64_t)len != FW_PREFIX + 4u * (uint64_t)n + 4u * (uint64_t)dim)
        return DPREC_ERR_STORE_CORRUPT;
    const unsigned char *it = d + FW_PREFIX, *gs = it + 4u * (size_t)n;
    int64_t prev = -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t item = dprec_ld32(it + 4u * (size_t)i);
        if (item >= c->cfg.num_items || (int64_t)item <= prev) return DPREC_ERR_STORE_CORRUPT;
        prev = item;
    }
    for (uint32_t k = 0; k < dim; k++)
        if (!isfinite(dprec_ldf32(gs + 4u * (size_t)k))) return DPREC_ERR_STORE_CORRUPT;
    /* A configuration that no longer holds the state (fw_max_ratings lowered, another d) drops it: the job
     * then starts over from Y_i = 0 on this device (accuracy only; every report stays bounded). */
    if (!commit || c->cfg.fw_max_ratings == 0 || n > c->cfg.fw_max_ratings || dim != c->cfg.dim) return DPREC_OK;
    c->fw_job = job;
    c->fw_round = round;
    c->fw_n = n;
    for (uint32_t i = 0; i < n; i++) c->fw_items[i] = dprec_ld32(it + 4u * (size_t)i);
    for (uint32_t k = 0; k < dim; k++) c->fw_g[k] = dprec_ldf32(gs + 4u * (size_t)k);
    return DPREC_OK;
}

int dprec_fw_user_vector(const dprec_client *c, uint64_t job_id, float *g, uint32_t dim) {
    if (c == NULL || g == NULL || dim != c->cfg.dim) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->cfg.fw_max_ratings == 0 || c->fw_job == 0 || c->fw_job != job_id) return DPREC_ERR_NOT_FOUND;
    memcpy(g, c->fw_g, sizeof(float) * dim);
    return DPREC_OK;
}

typedef struct fw_job_params {
    double k, L, offset;
    uint64_t T, xi;
} fw_job_params;

static int job_params(const dprec_client *c, const dprec_sync_job *job, fw_job_params *p) {
    if (dprec_json_get_number(job->doc, 0, "params.k", &p->k) != DPREC_OK ||
        dprec_json_get_number(job->doc, 0, "params.L", &p->L) != DPREC_OK ||
        dprec_json_get_u64(job->doc, 0, "params.xi", &p->xi) != DPREC_OK)
        return DPREC_ERR_PROTOCOL;
    p->T = job->d; /* the job's iterations: the aggregator requires d = rounds (one release column each) */
    if (dprec_json_get_number(job->doc, 0, "params.offset", &p->offset) != DPREC_OK)
        p->offset = (job->rating_min + job->rating_max) / 2.0;
    if (!(isfinite(p->k) && p->k > 0.0 && isfinite(p->L) && p->L > 0.0 && isfinite(p->offset)) || p->T < 1 ||
        p->T > c->cfg.dim || p->xi < 1 || p->xi > c->cfg.fw_max_ratings)
        return DPREC_ERR_PROTOCOL;
    return DPREC_OK;
}

static int fw_charge(const dprec_sync_job *job, dprec_charge *out) {
    /* the job's published total over all its rounds (seed 002 Thm. 3.1), never a per-round share */
    if (!(isfinite(job->epsilon) && job->epsilon > 0.0 && isfinite(job->delta) && job->delta > 0.0 &&
          job->delta < 1.0))
        return DPREC_ERR_PROTOCOL;
    out->job_epsilon = job->epsilon;
    out->job_delta = job->delta;
    return DPREC_OK;
}

/* Draws the sample Omega_i once: reservoir sampling (Vitter's Algorithm R) over the rated items of the
 * subset, then sorted by item. */
static int fw_sample(dprec_client *c, uint32_t xi) {
    uint32_t d = c->cfg.dim, filled = 0;
    uint64_t seen = 0;
    for (uint32_t i = 0; i < c->count; i++) {
        if (c->rows[(size_t)i * (d + 1u) + d] != 1.0f) continue; /* outside the job's item subset */
        seen++;
        if (filled < xi) {
            c->fw_items[filled++] = c->ratings[i].item;
            continue;
        }
        uint64_t j;
        int rc = dprec_sample_uniform(&c->rng, seen, &j);
        if (rc != DPREC_OK) return rc;
        if (j < xi) c->fw_items[j] = c->ratings[i].item;
    }
    for (uint32_t a = 1; a < filled; a++) { /* insertion sort, xi is small */
        uint32_t v = c->fw_items[a], b = a;
        for (; b > 0 && c->fw_items[b - 1] > v; b--) c->fw_items[b] = c->fw_items[b - 1];
        c->fw_items[b] = v;
    }
    c->fw_n = filled;
    return DPREC_OK;
}

static int fw_build(dprec_client *c, const dprec_sync_job *job, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                    unsigned char *out, size_t cap, size_t *len) {
    if (!c->fitted || c->cfg.fw_max_ratings == 0) return DPREC_ERR_STATE;
    fw_job_params p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    const uint32_t d = c->cfg.dim;
    if (c->fw_job != job->job_id) { /* a new job: Y_i = 0 and a fresh sample (one job's state at a time) */
        dprec_fw_reset(c);
        rc = fw_sample(c, (uint32_t)p.xi);
        if (rc != DPREC_OK) return rc;
        c->fw_job = job->job_id;
    }
    /* ratings removed since the sample leave it (kept rows exist for rated items only) */
    uint32_t kept = 0;
    for (uint32_t s = 0; s < c->fw_n; s++)
        if (dprec_store_find(c, c->fw_items[s]) >= 0) c->fw_items[kept++] = c->fw_items[s];
    c->fw_n = kept;
    size_t payload = dprec_fw_payload_size(kept);
    if (cap < DPREC_ENVELOPE_HEADER || cap - DPREC_ENVELOPE_HEADER < payload) return DPREC_ERR_REPORT_TOO_LARGE;

    /* Y_i, Y*_i and the newest direction v on Omega_i, in the client's scratch (3 xi floats) */
    float *y = c->fw_scratch, *ys = y + c->cfg.fw_max_ratings, *v = ys + c->cfg.fw_max_ratings, *a = v;
    int64_t col = (int64_t)job->release_version - 2; /* the newest column of release r (none in release 1) */
    for (uint32_t s = 0; s < kept; s++) {
        int64_t ri = dprec_store_find(c, c->fw_items[s]);
        const float *row = c->rows + (size_t)ri * (d + 1u);
        double yy = 0.0;
        for (uint32_t k = 0; k < d; k++) yy += (double)c->fw_g[k] * (double)row[k];
        y[s] = (float)yy;
        ys[s] = (float)((double)c->ratings[ri].value - p.offset);
        v[s] = col >= 0 && col < (int64_t)d ? row[col] : 0.0f;
    }
    if (c->fw_round < job->round) { /* this round's step, once (a retried build reuses it) */
        double u, sc;
        rc = dprec_fw_local_step(kept, y, ys, v, (double)c->fitted_mu, p.k, (double)p.T, p.L, &u, &sc);
        if (rc != DPREC_OK) return DPREC_ERR_PROTOCOL;
        /* the full row: Y_i <- sc ((1 - 1/T) Y_i - (k/T) u v), in coefficients (sdk/fw.h) */
        for (uint32_t k = 0; k < d; k++) c->fw_g[k] = (float)(sc * (1.0 - 1.0 / (double)p.T) * (double)c->fw_g[k]);
        if (col >= 0 && col < (int64_t)d)
            c->fw_g[col] = (float)((double)c->fw_g[col] - sc * p.k / (double)p.T * u);
        c->fw_round = job->round;
    }
    if (dprec_fw_residual(kept, y, ys, p.L, a) < 0.0) return DPREC_ERR_PROTOCOL;

    dprec_proto_write_header(job, DPREC_PROTO_PRIVATE_FW, report_id, (uint32_t)payload, out);
    unsigned char *pl = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(pl, kept);
    dprec_st32(pl + 4, 0);
    for (uint32_t s = 0; s < kept; s++) {
        if (!isfinite(a[s])) return DPREC_ERR_INVALID_ARGUMENT;
        dprec_st32(pl + 8 + 8 * (size_t)s, c->fw_items[s]);
        dprec_stf32(pl + 12 + 8 * (size_t)s, a[s]);
    }
    *len = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
}

const dprec_proto dprec_proto_private_fw = {"private-fw", DPREC_PROTO_PRIVATE_FW, DPREC_UNIT_USER, DPREC_MODEL_JOINT,
                                            fw_charge, fw_build, NULL};
