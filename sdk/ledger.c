/* dprec — the device's privacy ledger and its pending reports (include/dprec/privacy.h).
 *
 * Order of events for one report, and why:
 *   1. check the charge against the unit's cap and the job's last round   -> refuse before anything is built
 *   2. build (randomize) the report into a free pending slot
 *   3. write ledger + pending report as the next store generation          -> durable before it can be sent
 *   4. write them again as the generation after                            -> both generations hold the charge,
 *                                                                             so a later damaged file cannot lose it
 *   5. the app sends dprec_report_pending_at's bytes, re-sending the same bytes on every retry
 *   6. dprec_report_ack removes the report (the charge stays)
 * A crash anywhere in 1-3 charges nothing and sends nothing; after 3 the report is charged once and pending,
 * and a second prepare for the same job and round is refused, so a retry never re-randomizes.
 *
 * Store sections (little-endian, inside the store file of store.c):
 *   ledger (type 2):  [count u32][reserved u32] then count lines
 *                     [job u64][last round u64][epsilon f64][delta f64][reports u32][unit u8][model u8][0 u16][0 u32]
 *   pending (type 3): [count u32][reserved u32] then count reports
 *                     [id 16][job u64][round u64][len u32][0 u32][bytes, padded with zeros to a multiple of 8] */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"

#define LEDGER_LINE_SIZE 48u
#define SECTION_CRITICAL 0x0001u

static size_t pad8(size_t n) {
    return (n + 7u) & ~(size_t)7u;
}

size_t dprec_pending_stride(const dprec_config *cfg) {
    return DPREC_PENDING_HEADER + pad8(cfg->max_report_bytes);
}

size_t dprec_ledger_section_max(const dprec_config *cfg) {
    return DPREC_STORE_SECTION_HEADER + 8u + (size_t)cfg->ledger_jobs * LEDGER_LINE_SIZE;
}

size_t dprec_pending_section_max(const dprec_config *cfg) {
    return DPREC_STORE_SECTION_HEADER + 8u + (size_t)cfg->pending_slots * dprec_pending_stride(cfg);
}

static unsigned char *slot(const dprec_client *c, uint32_t i) {
    return c->pending + (size_t)i * c->pending_stride;
}

/* ---- encoding --------------------------------------------------------------------------------------- */

static void put_f64(unsigned char *p, double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    dprec_st64(p, u);
}

static double get_f64(const unsigned char *p) {
    uint64_t u = dprec_ld64(p);
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

unsigned char *dprec_ledger_encode(const dprec_client *c, unsigned char *p) {
    size_t len = 8u + (size_t)c->ledger_count * LEDGER_LINE_SIZE;
    dprec_st16(p, DPREC_SECTION_LEDGER);
    dprec_st16(p + 2, SECTION_CRITICAL);
    dprec_st32(p + 4, (uint32_t)len);
    unsigned char *d = p + DPREC_STORE_SECTION_HEADER;
    dprec_st32(d, c->ledger_count);
    dprec_st32(d + 4, 0);
    d += 8;
    for (uint32_t i = 0; i < c->ledger_count; i++, d += LEDGER_LINE_SIZE) {
        const ledger_line *l = &c->ledger[i];
        memset(d, 0, LEDGER_LINE_SIZE);
        dprec_st64(d, l->job_id);
        dprec_st64(d + 8, l->last_round);
        put_f64(d + 16, l->epsilon);
        put_f64(d + 24, l->delta);
        dprec_st32(d + 32, l->reports);
        d[36] = l->unit;
        d[37] = l->model;
    }
    return d;
}

unsigned char *dprec_pending_encode(const dprec_client *c, unsigned char *p) {
    unsigned char *d = p + DPREC_STORE_SECTION_HEADER + 8u;
    uint32_t written = 0;
    for (uint32_t i = 0; i < c->pending_count; i++) {
        if (i == c->pending_skip) continue; /* being acknowledged */
        written++;
        const unsigned char *s = slot(c, i);
        uint32_t len = dprec_ld32(s + 32);
        size_t n = DPREC_PENDING_HEADER + pad8(len);
        memcpy(d, s, DPREC_PENDING_HEADER + len);
        memset(d + DPREC_PENDING_HEADER + len, 0, n - DPREC_PENDING_HEADER - len);
        d += n;
    }
    dprec_st16(p, DPREC_SECTION_PENDING);
    dprec_st16(p + 2, SECTION_CRITICAL);
    dprec_st32(p + 4, (uint32_t)((size_t)(d - p) - DPREC_STORE_SECTION_HEADER));
    dprec_st32(p + 8, written);
    dprec_st32(p + 12, 0);
    return d;
}

static int valid_unit(unsigned u) {
    return u == DPREC_UNIT_RATING || u == DPREC_UNIT_USER;
}

static int valid_model(unsigned m) {
    return m <= DPREC_MODEL_POSTERIOR_HEURISTIC;
}

int dprec_ledger_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit) {
    if (len < 8u) return DPREC_ERR_STORE_CORRUPT;
    uint32_t n = dprec_ld32(d);
    if (dprec_ld32(d + 4) != 0) return DPREC_ERR_STORE_CORRUPT;
    if (n > c->cfg.ledger_jobs) return DPREC_ERR_STORE_MISMATCH; /* written with more ledger lines */
    if ((size_t)len != 8u + (size_t)n * LEDGER_LINE_SIZE) return DPREC_ERR_STORE_CORRUPT;
    const unsigned char *l = d + 8;
    for (uint32_t i = 0; i < n; i++, l += LEDGER_LINE_SIZE) {
        double eps = get_f64(l + 16), delta = get_f64(l + 24);
        int model_none = l[37] == DPREC_MODEL_NONE;
        /* epsilon is +inf only for non-private jobs; never NaN or negative. */
        if (!(eps >= 0.0) || (isinf(eps) && !model_none) || !(delta >= 0.0 && delta <= 1.0)) return DPREC_ERR_STORE_CORRUPT;
        if (!valid_unit(l[36]) || !valid_model(l[37]) || dprec_ld16(l + 38) != 0 || dprec_ld32(l + 40) != 0)
            return DPREC_ERR_STORE_CORRUPT;
        for (uint32_t j = 0; j < i; j++) /* one line per job */
            if (dprec_ld64(d + 8 + (size_t)j * LEDGER_LINE_SIZE) == dprec_ld64(l)) return DPREC_ERR_STORE_CORRUPT;
        if (commit) {
            ledger_line *o = &c->ledger[i];
            memset(o, 0, sizeof *o);
            o->job_id = dprec_ld64(l);
            o->last_round = dprec_ld64(l + 8);
            o->epsilon = eps;
            o->delta = delta;
            o->reports = dprec_ld32(l + 32);
            o->unit = l[36];
            o->model = l[37];
        }
    }
    if (commit) c->ledger_count = n;
    return DPREC_OK;
}

int dprec_pending_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit) {
    if (len < 8u) return DPREC_ERR_STORE_CORRUPT;
    uint32_t n = dprec_ld32(d);
    if (dprec_ld32(d + 4) != 0) return DPREC_ERR_STORE_CORRUPT;
    if (n > c->cfg.pending_slots) return DPREC_ERR_STORE_MISMATCH;
    size_t off = 8;
    for (uint32_t i = 0; i < n; i++) {
        if (len - off < DPREC_PENDING_HEADER) return DPREC_ERR_STORE_CORRUPT;
        const unsigned char *r = d + off;
        uint32_t rlen = dprec_ld32(r + 32);
        if (dprec_ld32(r + 36) != 0) return DPREC_ERR_STORE_CORRUPT;
        if (rlen > c->cfg.max_report_bytes) return DPREC_ERR_STORE_MISMATCH;
        size_t n8 = DPREC_PENDING_HEADER + pad8(rlen);
        if (len - off < n8) return DPREC_ERR_STORE_CORRUPT;
        if (commit) memcpy(slot(c, i), r, DPREC_PENDING_HEADER + rlen);
        off += n8;
    }
    if (off != len) return DPREC_ERR_STORE_CORRUPT;
    if (commit) c->pending_count = n;
    return DPREC_OK;
}

/* ---- the ledger ------------------------------------------------------------------------------------- */

static ledger_line *find_job(const dprec_client *c, uint64_t job_id) {
    for (uint32_t i = 0; i < c->ledger_count; i++)
        if (c->ledger[i].job_id == job_id) return &c->ledger[i];
    return NULL;
}

static void to_entry(const ledger_line *l, dprec_ledger_entry *out) {
    out->job_id = l->job_id;
    out->unit = (dprec_unit)l->unit;
    out->model = (dprec_model)l->model;
    out->reports = l->reports;
    out->last_round = l->last_round;
    out->epsilon = l->epsilon;
    out->delta = l->delta;
}

/* Basic composition over the jobs of a unit, with one job's line replaced by (eps, delta) if job != NULL. */
static void unit_totals(const dprec_client *c, dprec_unit unit, const ledger_line *job, double eps, double delta,
                        double *eps_total, double *delta_total) {
    double e = 0.0, d = 0.0;
    int counted = 0;
    for (uint32_t i = 0; i < c->ledger_count; i++) {
        const ledger_line *l = &c->ledger[i];
        if (l->unit != unit) continue;
        if (l == job) {
            e += eps;
            d += delta;
            counted = 1;
        } else {
            e += l->epsilon;
            d += l->delta;
        }
    }
    if (job == NULL || !counted) {
        e += eps;
        d += delta;
    }
    *eps_total = e;
    *delta_total = d;
}

static int check_charge(const dprec_client *c, const dprec_charge *ch) {
    if (!valid_unit((unsigned)ch->unit) || !valid_model((unsigned)ch->model)) return DPREC_ERR_INVALID_ARGUMENT;
    if (ch->model == DPREC_MODEL_NONE) {
        if (!c->cfg.allow_non_private) return DPREC_ERR_NON_PRIVATE;
    } else if (!(ch->job_epsilon > 0.0) || isinf(ch->job_epsilon)) {
        return DPREC_ERR_INVALID_ARGUMENT; /* NaN, zero, negative or infinite for a private model */
    }
    if (!(ch->job_delta >= 0.0 && ch->job_delta < 1.0)) return DPREC_ERR_INVALID_ARGUMENT;
    return DPREC_OK;
}

int dprec_report_prepare(dprec_client *c, const dprec_charge *ch, dprec_report_build_fn build, void *user,
                         unsigned char report_id[DPREC_REPORT_ID_SIZE]) {
    if (c == NULL || ch == NULL || build == NULL || report_id == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = check_charge(c, ch);
    if (rc != DPREC_OK) return rc;
    if (c->stream != STREAM_NONE || !c->loaded) return DPREC_ERR_STATE;
    if (c->ledger_lost) return DPREC_ERR_LEDGER_LOST;

    ledger_line *line = find_job(c, ch->job_id);
    if (line != NULL) {
        if (line->unit != (uint8_t)ch->unit || line->model != (uint8_t)ch->model) return DPREC_ERR_INVALID_ARGUMENT;
        if (line->reports > 0 && ch->round <= line->last_round) return DPREC_ERR_ALREADY_REPORTED;
    } else if (c->ledger_count == c->cfg.ledger_jobs) {
        return DPREC_ERR_LEDGER_FULL;
    }
    /* A job's cumulative guarantee never decreases: a smaller figure than already charged is charged as the
     * old one (protects the user against an accountant bug or a replayed round). */
    double eps = ch->job_epsilon, delta = ch->job_delta;
    if (line != NULL) {
        if (eps < line->epsilon) eps = line->epsilon;
        if (delta < line->delta) delta = line->delta;
    }
    if (ch->model != DPREC_MODEL_NONE) {
        double e_tot, d_tot;
        unit_totals(c, ch->unit, line, eps, delta, &e_tot, &d_tot);
        double cap_e = ch->unit == DPREC_UNIT_USER ? c->cfg.cap_user_epsilon : c->cfg.cap_rating_epsilon;
        double cap_d = ch->unit == DPREC_UNIT_USER ? c->cfg.cap_user_delta : c->cfg.cap_rating_delta;
        if (!(e_tot <= cap_e) || !(d_tot <= cap_d)) return DPREC_ERR_BUDGET_EXCEEDED;
    }
    if (c->pending_count == c->cfg.pending_slots) return DPREC_ERR_PENDING_FULL;

    /* Build into the next free slot; nothing is committed until the store write succeeds. */
    unsigned char *s = slot(c, c->pending_count);
    unsigned char id[DPREC_REPORT_ID_SIZE];
    rc = dprec_rng_bytes(&c->rng, id, sizeof id);
    if (rc != DPREC_OK) return rc;
    size_t len = 0;
    rc = build(user, id, s + DPREC_PENDING_HEADER, c->cfg.max_report_bytes, &len);
    if (rc == DPREC_OK && len > c->cfg.max_report_bytes) rc = DPREC_ERR_REPORT_TOO_LARGE;
    if (rc != DPREC_OK) {
        dprec_wipe(s, c->pending_stride); /* a randomized report that never leaves: destroy it */
        return rc;
    }
    memcpy(s, id, sizeof id);
    dprec_st64(s + 16, ch->job_id);
    dprec_st64(s + 24, ch->round);
    dprec_st32(s + 32, (uint32_t)len);
    dprec_st32(s + 36, 0);

    ledger_line saved;
    int added = line == NULL;
    if (added) {
        line = &c->ledger[c->ledger_count++];
        memset(line, 0, sizeof *line);
        line->job_id = ch->job_id;
        line->unit = (uint8_t)ch->unit;
        line->model = (uint8_t)ch->model;
    }
    saved = *line;
    line->epsilon = ch->model == DPREC_MODEL_NONE ? INFINITY : eps;
    line->delta = delta;
    line->reports++;
    line->last_round = ch->round;
    c->pending_count++;

    rc = dprec_store_save(c);
    if (rc != DPREC_OK) { /* nothing durable: undo, and destroy the report */
        c->pending_count--;
        dprec_wipe(s, c->pending_stride);
        if (added) c->ledger_count--;
        else *line = saved;
        return rc;
    }
    memcpy(report_id, id, sizeof id);
    /* The mirror copy: until it is written, the report's bytes are withheld (dprec_report_pending_at). */
    c->mirror_needed = 1;
    return dprec_store_save(c);
}

uint32_t dprec_report_pending_count(const dprec_client *c) {
    return c ? c->pending_count : 0;
}

int dprec_report_pending_at(const dprec_client *c, uint32_t index, dprec_pending_report *out) {
    if (c == NULL || out == NULL || index >= c->pending_count) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->mirror_needed) return DPREC_ERR_STATE; /* call dprec_store_flush first */
    const unsigned char *s = slot(c, index);
    memcpy(out->report_id, s, DPREC_REPORT_ID_SIZE);
    out->job_id = dprec_ld64(s + 16);
    out->round = dprec_ld64(s + 24);
    out->len = dprec_ld32(s + 32);
    out->bytes = s + DPREC_PENDING_HEADER;
    return DPREC_OK;
}

int dprec_report_ack(dprec_client *c, const unsigned char report_id[DPREC_REPORT_ID_SIZE]) {
    if (c == NULL || report_id == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE || !c->loaded) return DPREC_ERR_STATE;
    uint32_t i = 0;
    while (i < c->pending_count && memcmp(slot(c, i), report_id, DPREC_REPORT_ID_SIZE) != 0) i++;
    if (i == c->pending_count) return DPREC_ERR_NOT_FOUND;
    /* Save a generation without the report; only once that is durable, drop it from memory. */
    c->pending_skip = i;
    int rc = dprec_store_save(c);
    c->pending_skip = UINT32_MAX;
    if (rc != DPREC_OK) return rc;
    size_t stride = c->pending_stride;
    memmove(slot(c, i), slot(c, i + 1), (size_t)(c->pending_count - 1 - i) * stride);
    c->pending_count--;
    dprec_wipe(slot(c, c->pending_count), stride);
    return DPREC_OK;
}

int dprec_ledger_job(const dprec_client *c, uint64_t job_id, dprec_ledger_entry *out) {
    if (c == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    const ledger_line *l = find_job(c, job_id);
    if (l == NULL) return DPREC_ERR_NOT_FOUND;
    to_entry(l, out);
    return DPREC_OK;
}

uint32_t dprec_ledger_count(const dprec_client *c) {
    return c ? c->ledger_count : 0;
}

int dprec_ledger_at(const dprec_client *c, uint32_t index, dprec_ledger_entry *out) {
    if (c == NULL || out == NULL || index >= c->ledger_count) return DPREC_ERR_INVALID_ARGUMENT;
    to_entry(&c->ledger[index], out);
    return DPREC_OK;
}

int dprec_ledger_total(const dprec_client *c, dprec_unit unit, double *epsilon, double *delta) {
    if (c == NULL || epsilon == NULL || delta == NULL || !valid_unit((unsigned)unit)) return DPREC_ERR_INVALID_ARGUMENT;
    unit_totals(c, unit, NULL, 0.0, 0.0, epsilon, delta);
    return DPREC_OK;
}

int dprec_ledger_reset_after_loss(dprec_client *c) {
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (!c->ledger_lost) return DPREC_ERR_STATE;
    c->ledger_lost = 0;
    c->ledger_count = 0;
    c->pending_count = 0;
    return DPREC_OK;
}
