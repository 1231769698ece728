/* dprec — the `private-fw` protocol, device side (seed 002, Jain, Thakkar, Thakurta, ICML 2018: A_local of
 * Algorithm 1; docs/privacy.md "private-fw", docs/protocol.md "private-fw"). Joint DP at user level.
 *
 * The device keeps, for one job, its sample Omega_i of at most xi of its ratings (drawn once, uniformly with
 * its CSPRNG among its ratings of the job's item subset, which the release marks with item bias 1) and the
 * coefficients g of its row Y_i = sum_c g_c v_c over the release's columns (common/protocols/fw.h). Each round, on the
 * release of version r (column r - 2 holds the newest direction v, global_mean holds lambda-hat; release 1
 * has v = 0), it takes one local Frank-Wolfe step (dprec_fw_local_step: u_i = A_i v / lambda,
 * Y_i <- Pi_{L,Omega}((1 - 1/T) Y_i - (k/T) u_i v^T)), keeps the new g, and reports its new residual
 * A_i = P_Omega(Y_i - Y*_i), clipped to ||A_i|| <= 2L. Y*_i are its ratings minus the job's public offset
 * (params.offset, default the middle of the rating scale). No noise is added here: the aggregator's noisy
 * sum protects every other user's outputs; this user's own Y_i depends on their data, which joint DP allows.
 *
 * The state is this protocol's block of the client's arena and its store section (type 5, non-critical),
 * saved with the report (dprec_report_prepare saves the store before the report can leave). A build works on
 * scratch and changes the state only once the report is complete, so a build that fails (and is replaced by
 * sync.c's data-independent fallback) leaves the state as it was; a step already applied for this round (a
 * retry) is not applied twice.
 *
 * Policy: each round is the Gaussian mechanism the aggregator publishes as privacy.rho_per_round (zCDP; the
 * trusted curator adds the noise), user level, charged per report; never more rounds than the job declares.
 *
 * Payload (common/protocols/fw.h): [n u32][0 u32] then n = xi pairs [item u32][a float32]: the real ones first (items
 * increasing), then padding pairs (DPREC_PAD_ITEM, +0.0; report.h), so that the length never tells how many
 * of the subset's items the user rated. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "fw.h"
#include "noise.h"
#include "protocol.h"
#include "report.h"

#define FW_PREFIX 32u

/* The block: the header, the sample's items (xi), g (d floats), and scratch for a build: the staged items
 * (xi) and Y_i, Y*_i, v on them (3 xi floats). */
typedef struct fw_state {
    uint64_t job; /* 0: no state */
    uint64_t round;
    uint32_t n;
    float offset; /* the centre of this user's targets Y*_i for the job (NaN: the job's public offset) */
} fw_state;

static fw_state *st(const dprec_client *c) {
    return (fw_state *)(void *)dprec_proto_state_mem(c, &dprec_proto_private_fw);
}

static uint32_t *st_items(const dprec_client *c) {
    return (uint32_t *)(void *)(dprec_proto_state_mem(c, &dprec_proto_private_fw) + sizeof(fw_state));
}

static float *st_g(const dprec_client *c) {
    return (float *)(void *)(st_items(c) + c->cfg.fw_max_ratings);
}

static uint32_t *st_staged(const dprec_client *c) {
    return (uint32_t *)(void *)(st_g(c) + c->cfg.dim);
}

static float *st_scratch(const dprec_client *c) {
    return (float *)(void *)(st_staged(c) + c->cfg.fw_max_ratings);
}

static size_t fw_memory(const dprec_config *cfg) {
    if (cfg->fw_max_ratings == 0) return 0;
    return sizeof(fw_state) + 20u * (size_t)cfg->fw_max_ratings + 4u * (size_t)cfg->dim;
}

static size_t fw_section_max(const dprec_config *cfg) {
    if (cfg->fw_max_ratings == 0) return 0;
    return DPREC_STORE_SECTION_HEADER + FW_PREFIX + 4u * (size_t)cfg->fw_max_ratings + 4u * (size_t)cfg->dim;
}

static void fw_reset(dprec_client *c) {
    fw_state *s = st(c);
    if (s == NULL) return;
    s->job = s->round = 0;
    s->n = 0;
    s->offset = NAN;
    memset(st_g(c), 0, sizeof(float) * c->cfg.dim);
}

/* [job u64][round u64][n u32][dim u32][offset f32][flags u32] then n items u32, then dim floats g; flags 1: the
 * offset is this user's centre, flags 0 (and offset 0: SDK 0.1 and 0.2): the job's public offset */
static unsigned char *fw_encode(const dprec_client *c, unsigned char *p) {
    const fw_state *s = st(c);
    if (s == NULL || s->job == 0) return p;
    uint32_t len = FW_PREFIX + 4u * s->n + 4u * c->cfg.dim;
    dprec_st16(p, DPREC_SECTION_FW);
    dprec_st16(p + 2, 0); /* non-critical */
    dprec_st32(p + 4, len);
    unsigned char *d = p + DPREC_STORE_SECTION_HEADER;
    dprec_st64(d, s->job);
    dprec_st64(d + 8, s->round);
    dprec_st32(d + 16, s->n);
    dprec_st32(d + 20, c->cfg.dim);
    dprec_stf32(d + 24, isnan(s->offset) ? 0.0f : s->offset);
    dprec_st32(d + 28, isnan(s->offset) ? 0u : 1u);
    d += FW_PREFIX;
    const uint32_t *items = st_items(c);
    const float *g = st_g(c);
    for (uint32_t i = 0; i < s->n; i++, d += 4) dprec_st32(d, items[i]);
    for (uint32_t k = 0; k < c->cfg.dim; k++, d += 4) dprec_stf32(d, g[k]);
    return d;
}

static int fw_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit) {
    if (len < FW_PREFIX) return DPREC_ERR_STORE_CORRUPT;
    uint64_t job = dprec_ld64(d), round = dprec_ld64(d + 8);
    uint32_t n = dprec_ld32(d + 16), dim = dprec_ld32(d + 20);
    uint32_t flags = dprec_ld32(d + 28);
    float offset = dprec_ldf32(d + 24);
    if (job == 0 || flags > 1u || (flags == 0 && dprec_ld32(d + 24) != 0) || !isfinite(offset) || n > 65535u ||
        dim > DPREC_MAX_DIM ||
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
    fw_state *s = st(c);
    if (!commit || s == NULL || n > c->cfg.fw_max_ratings || dim != c->cfg.dim) return DPREC_OK;
    s->job = job;
    s->round = round;
    s->n = n;
    s->offset = flags ? offset : NAN;
    uint32_t *items = st_items(c);
    float *g = st_g(c);
    for (uint32_t i = 0; i < n; i++) items[i] = dprec_ld32(it + 4u * (size_t)i);
    for (uint32_t k = 0; k < dim; k++) g[k] = dprec_ldf32(gs + 4u * (size_t)k);
    return DPREC_OK;
}

static const dprec_proto_state fw_state_desc = {DPREC_SECTION_FW, 0, fw_memory, fw_section_max, fw_reset,
                                                fw_encode, fw_decode};

int dprec_fw_user_vector(const dprec_client *c, uint64_t job_id, float *g, uint32_t dim) {
    dprec_diag_begin(c);
    if (c == NULL || g == NULL || dim != c->cfg.dim) return DPREC_ERR_INVALID_ARGUMENT;
    const fw_state *s = st(c);
    if (s == NULL || s->job == 0 || s->job != job_id) return DPREC_ERR_NOT_FOUND;
    memcpy(g, st_g(c), sizeof(float) * dim);
    return DPREC_OK;
}

int dprec_fw_user_offset(const dprec_client *c, uint64_t job_id, double *offset) {
    dprec_diag_begin(c);
    if (c == NULL || offset == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    const fw_state *s = st(c);
    if (s == NULL || s->job == 0 || s->job != job_id || isnan(s->offset)) return DPREC_ERR_NOT_FOUND;
    *offset = (double)s->offset;
    return DPREC_OK;
}

int dprec_fw_state_set(dprec_client *c, uint64_t job, uint64_t round, const uint32_t *items, uint32_t n,
                       const float *g) {
    fw_state *s = c != NULL ? st(c) : NULL;
    if (s == NULL) return DPREC_ERR_CONFIG;
    if (n > c->cfg.fw_max_ratings || job == 0 || (n > 0 && items == NULL) || g == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    s->job = job;
    s->round = round;
    s->n = n;
    s->offset = NAN;
    if (n > 0) memcpy(st_items(c), items, sizeof(uint32_t) * n);
    memcpy(st_g(c), g, sizeof(float) * c->cfg.dim);
    return DPREC_OK;
}

int dprec_fw_state_get(const dprec_client *c, uint64_t *job, uint64_t *round, uint32_t *items, uint32_t cap,
                       uint32_t *n) {
    const fw_state *s = c != NULL ? st(c) : NULL;
    if (s == NULL) return DPREC_ERR_CONFIG;
    if (job == NULL || round == NULL || n == NULL || (cap > 0 && items == NULL)) return DPREC_ERR_INVALID_ARGUMENT;
    *job = s->job;
    *round = s->round;
    *n = s->n;
    memcpy(items, st_items(c), sizeof(uint32_t) * (s->n < cap ? s->n : cap));
    return DPREC_OK;
}

/* ---- the job ---------------------------------------------------------------------------------------------- */

typedef struct fw_job_params {
    double k, L, offset;
    int center_user; /* params.center "user" (the default): each device centres its targets on its own mean */
    uint64_t T, xi;
} fw_job_params;

static int job_params(const dprec_client *c, const dprec_sync_job *job, fw_job_params *p) {
    if (dprec_json_get_number(job->doc, 0, "params.k", &p->k) != DPREC_OK ||
        dprec_json_get_number(job->doc, 0, "params.L", &p->L) != DPREC_OK ||
        dprec_json_get_u64(job->doc, 0, "params.xi", &p->xi) != DPREC_OK)
        return DPREC_ERR_JOB_PARAMS;
    p->T = job->d; /* the job's iterations: the aggregator requires d = rounds (one release column each) */
    if (dprec_json_get_number(job->doc, 0, "params.offset", &p->offset) != DPREC_OK)
        p->offset = (job->rating_min + job->rating_max) / 2.0;
    char center[16];
    int rc = dprec_json_get_string(job->doc, 0, "params.center", center, sizeof center, NULL);
    if (rc == DPREC_ERR_NOT_FOUND) strcpy(center, "user");
    else if (rc != DPREC_OK) return DPREC_ERR_JOB_PARAMS;
    if (strcmp(center, "user") == 0) p->center_user = 1;
    else if (strcmp(center, "offset") == 0) p->center_user = 0;
    else return DPREC_ERR_JOB_PARAMS;
    if (!(isfinite(p->k) && p->k > 0.0 && isfinite(p->L) && p->L > 0.0 && isfinite(p->offset)) || p->T < 1 ||
        p->T > c->cfg.dim || p->T != job->rounds || p->xi < 1 || p->xi > 65535u)
        return DPREC_ERR_JOB_PARAMS;
    if (p->xi > c->cfg.fw_max_ratings) return DPREC_ERR_CONFIG; /* the app keeps no room for this job's sample */
    return DPREC_OK;
}

static int fw_policy(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out) {
    fw_job_params p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    double rho = NAN;
    if (dprec_json_get_number(job->doc, 0, "privacy.rho_per_round", &rho) != DPREC_OK || !(rho > 0.0) ||
        !isfinite(rho) || !(job->delta > 0.0 && job->delta < 1.0))
        return DPREC_ERR_JOB_PARAMS;
    memset(out, 0, sizeof *out);
    out->unit = DPREC_UNIT_USER;
    out->model = DPREC_MODEL_JOINT;
    out->round.kind = DPREC_STEP_ZCDP; /* seed 002 Thm. 3.1's proof: a Gaussian mechanism a round */
    out->round.rho = rho;
    out->round.steps = 1;
    out->user_round = out->round;
    out->delta = job->delta;
    out->rounds = job->rounds;
    out->report_bytes = DPREC_ENVELOPE_HEADER + dprec_fw_payload_size((uint32_t)p.xi);
    return DPREC_OK;
}

/* ---- the report -------------------------------------------------------------------------------------------- */

/* Draws a sample Omega_i into staged: reservoir sampling (Vitter's Algorithm R) over the rated items of the
 * subset, then sorted by item. Returns its size. */
static int fw_sample(dprec_client *c, uint32_t xi, uint32_t *staged, uint32_t *size) {
    uint32_t d = c->cfg.dim, filled = 0;
    uint64_t seen = 0;
    for (uint32_t i = 0; i < c->count; i++) {
        if (c->rows[(size_t)i * (d + 1u) + d] != 1.0f) continue; /* outside the job's item subset */
        seen++;
        if (filled < xi) {
            staged[filled++] = c->ratings[i].item;
            continue;
        }
        uint64_t j;
        int rc = dprec_sample_uniform(&c->rng, seen, &j);
        if (rc != DPREC_OK) return rc;
        if (j < xi) staged[j] = c->ratings[i].item;
    }
    for (uint32_t a = 1; a < filled; a++) { /* insertion sort, xi is small */
        uint32_t v = staged[a], b = a;
        for (; b > 0 && staged[b - 1] > v; b--) staged[b] = staged[b - 1];
        staged[b] = v;
    }
    *size = filled;
    return DPREC_OK;
}

static void write_padding(unsigned char *pl, uint32_t from, uint32_t to) {
    for (uint32_t s = from; s < to; s++) {
        dprec_st32(pl + 8 + 8 * (size_t)s, DPREC_PAD_ITEM);
        dprec_st32(pl + 12 + 8 * (size_t)s, 0u);
    }
}

static int fw_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                    const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len) {
    if ((!c->fitted && !c->fallback) || st(c) == NULL) return DPREC_ERR_STATE;
    fw_job_params p;
    int rc = job_params(c, job, &p);
    if (rc != DPREC_OK) return rc;
    const uint32_t d = c->cfg.dim, xi = (uint32_t)p.xi;
    size_t payload = dprec_fw_payload_size(xi);
    if (cap < pol->report_bytes || pol->report_bytes != DPREC_ENVELOPE_HEADER + payload) return DPREC_ERR_REPORT_TOO_LARGE;
    dprec_proto_write_header(job, DPREC_PROTO_PRIVATE_FW, report_id, (uint32_t)payload, out);
    unsigned char *pl = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(pl, xi);
    dprec_st32(pl + 4, 0);
    if (c->fallback) { /* the report of a user with none of the subset's items: an empty row, state untouched */
        write_padding(pl, 0, xi);
        *len = DPREC_ENVELOPE_HEADER + payload;
        return DPREC_OK;
    }

    fw_state *s = st(c);
    uint32_t *staged = st_staged(c), kept = 0;
    if (s->job != job->job_id) { /* a new job: Y_i = 0 and a fresh sample (one job's state at a time) */
        rc = fw_sample(c, xi, staged, &kept);
        if (rc != DPREC_OK) return rc;
    } else { /* ratings removed since the sample leave it (kept rows exist for rated items only) */
        const uint32_t *items = st_items(c);
        for (uint32_t i = 0; i < s->n && kept < xi; i++)
            if (dprec_store_find(c, items[i]) >= 0) staged[kept++] = items[i];
    }
    float g[DPREC_MAX_DIM];
    if (s->job == job->job_id) memcpy(g, st_g(c), sizeof(float) * d);
    else memset(g, 0, sizeof(float) * d);
    uint64_t round = s->job == job->job_id ? s->round : 0;
    /* The centre of Y*_i, chosen once per job and kept: the job's public offset, or (params.center "user") the
     * mean of the user's sampled ratings shrunk toward it with the weight of one rating, (sum r + offset) /
     * (n + 1). Only this user's own predictions and residual row depend on it: the residual is clipped to 2L
     * whatever the centre, so the sensitivity and the guarantee are unchanged (joint DP allows a user's own
     * output to use their own data). */
    float offset = s->job == job->job_id ? s->offset : NAN;
    if (isnan(offset)) {
        double sum = p.offset;
        if (p.center_user && s->job != job->job_id)
            for (uint32_t i = 0; i < kept; i++) sum += (double)c->ratings[dprec_store_find(c, staged[i])].value;
        offset = (float)(p.center_user && s->job != job->job_id ? sum / (double)(kept + 1u) : p.offset);
        if (!isfinite(offset)) return DPREC_ERR_INVALID_ARGUMENT;
    }

    /* Y_i, Y*_i and the newest direction v on Omega_i, in the scratch (3 xi floats) */
    float *y = st_scratch(c), *ys = y + c->cfg.fw_max_ratings, *v = ys + c->cfg.fw_max_ratings, *a = v;
    int64_t col = (int64_t)job->release_version - 2; /* the newest column of release r (none in release 1) */
    for (uint32_t i = 0; i < kept; i++) {
        int64_t ri = dprec_store_find(c, staged[i]);
        const float *row = c->rows + (size_t)ri * (d + 1u);
        double yy = 0.0;
        for (uint32_t k = 0; k < d; k++) yy += (double)g[k] * (double)row[k];
        y[i] = (float)yy;
        ys[i] = (float)((double)c->ratings[ri].value - (double)offset);
        v[i] = col >= 0 && col < (int64_t)d ? row[col] : 0.0f;
    }
    if (round < job->round) { /* this round's step, once (a retried build reuses it) */
        double u, sc;
        rc = dprec_fw_local_step(kept, y, ys, v, (double)c->fitted_mu, p.k, (double)p.T, p.L, &u, &sc);
        if (rc != DPREC_OK) return rc;
        /* the full row: Y_i <- sc ((1 - 1/T) Y_i - (k/T) u v), in coefficients (common/protocols/fw.h) */
        for (uint32_t k = 0; k < d; k++) g[k] = (float)(sc * (1.0 - 1.0 / (double)p.T) * (double)g[k]);
        if (col >= 0 && col < (int64_t)d) g[col] = (float)((double)g[col] - sc * p.k / (double)p.T * u);
        round = job->round;
    }
    if (dprec_fw_residual(kept, y, ys, p.L, a) < 0.0) return DPREC_ERR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < kept; i++) {
        if (!isfinite(a[i])) return DPREC_ERR_INVALID_ARGUMENT;
        dprec_st32(pl + 8 + 8 * (size_t)i, staged[i]);
        dprec_stf32(pl + 12 + 8 * (size_t)i, a[i]);
    }
    for (uint32_t k = 0; k < d; k++)
        if (!isfinite(g[k])) return DPREC_ERR_INVALID_ARGUMENT;
    write_padding(pl, kept, xi);

    /* the report is complete: the state moves on */
    s->job = job->job_id;
    s->round = round;
    s->n = kept;
    s->offset = offset;
    memcpy(st_items(c), staged, sizeof(uint32_t) * kept);
    memcpy(st_g(c), g, sizeof(float) * d);
    *len = DPREC_ENVELOPE_HEADER + payload;
    return DPREC_OK;
}

const dprec_proto dprec_proto_private_fw = {"private-fw", DPREC_PROTO_PRIVATE_FW, fw_policy, fw_build, &fw_state_desc};
