/* dprec — the device's privacy ledger and its pending reports (include/dprec/privacy.h).
 *
 * One line per job: what the device decided for the job's latest round (took part, sat out, reported), how
 * many rounds were charged, and the job's cumulative guarantee at its unit and at user level. Rounds only go
 * forward, so the line is also the durable record of the participation draws: a decision can never be drawn
 * again, however many jobs the device takes part in (a memo of a few decisions could be evicted and redrawn).
 *
 * Order of events for one report, and why:
 *   1. check the charge: fingerprint, rounds, caps                        -> refuse before anything is built
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
 *   ledger (type 2):  [count u32][line format u32 = 1] then count lines of 88 bytes
 *                     [job u64][last round u64][epsilon f64][delta f64][user epsilon f64][user delta f64]
 *                     [reports u32][rounds u32][max rounds u64][unit u8][model u8][state u8][0 u8][0 u32]
 *                     [pin 16 bytes]
 *                     (format 0, written by SDK 0.1.0: [job u64][last round u64][epsilon f64][delta f64]
 *                     [reports u32][unit u8][model u8][0 u16][0 u32], 48 bytes; read and converted)
 *   pending (type 3): [count u32][reserved u32] then count reports
 *                     [id 16][job u64][round u64][len u32][0 u32][bytes, padded with zeros to a multiple of 8] */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "client_priv.h"

#define LEDGER_LINE_SIZE 88u
#define LEDGER_LINE_SIZE_V0 48u
#define LEDGER_FORMAT 1u
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
    dprec_st32(d + 4, LEDGER_FORMAT);
    d += 8;
    for (uint32_t i = 0; i < c->ledger_count; i++, d += LEDGER_LINE_SIZE) {
        const ledger_line *l = &c->ledger[i];
        memset(d, 0, LEDGER_LINE_SIZE);
        dprec_st64(d, l->job_id);
        dprec_st64(d + 8, l->last_round);
        put_f64(d + 16, l->epsilon);
        put_f64(d + 24, l->delta);
        put_f64(d + 32, l->user_epsilon);
        put_f64(d + 40, l->user_delta);
        dprec_st32(d + 48, l->reports);
        dprec_st32(d + 52, l->rounds);
        dprec_st64(d + 56, l->max_rounds);
        d[64] = l->unit;
        d[65] = l->model;
        d[66] = l->state;
        memcpy(d + 72, l->pin, DPREC_JOB_PIN_SIZE);
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
    return m <= DPREC_MODEL_SECURE_AGGREGATION;
}

/* epsilon is +inf only for non-private jobs; never NaN or negative; delta in [0, 1]. */
static int valid_cost(double eps, double delta, int model_none) {
    return eps >= 0.0 && (!isinf(eps) || model_none) && delta >= 0.0 && delta <= 1.0;
}

/* A line written by SDK 0.1.0 (format 0), converted. It charged the job's published total with its first
 * report and kept no user-level figure: a rating-level line gets the group-privacy bound over the device's
 * capacity k ratings (k eps, k e^((k-1) eps) delta; Dwork, Roth 2014, Thm. 2.2 and its approximate form), capped
 * at delta 1, so it is never under-counted at user level. Its fingerprint is unknown (all zero): the job's next
 * charge sets it. */
static void line_from_v0(const dprec_client *c, const unsigned char *l, ledger_line *o) {
    memset(o, 0, sizeof *o);
    o->job_id = dprec_ld64(l);
    o->last_round = dprec_ld64(l + 8);
    o->epsilon = get_f64(l + 16);
    o->delta = get_f64(l + 24);
    o->reports = dprec_ld32(l + 32);
    o->rounds = o->reports;
    o->unit = l[36];
    o->model = l[37];
    o->state = DPREC_LINE_REPORTED;
    o->user_epsilon = o->epsilon;
    o->user_delta = o->delta;
    if (o->unit == DPREC_UNIT_RATING && o->model != DPREC_MODEL_NONE) {
        double k = (double)c->cfg.rating_capacity;
        o->user_epsilon = k * o->epsilon;
        double d = k * exp((k - 1.0) * o->epsilon) * o->delta;
        o->user_delta = d < 1.0 ? d : 1.0;
    }
}

int dprec_ledger_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit) {
    if (len < 8u) return DPREC_ERR_STORE_CORRUPT;
    uint32_t n = dprec_ld32(d), format = dprec_ld32(d + 4);
    if (format > LEDGER_FORMAT) return DPREC_ERR_STORE_CORRUPT;
    size_t size = format == 0 ? LEDGER_LINE_SIZE_V0 : LEDGER_LINE_SIZE;
    if (n > c->cfg.ledger_jobs) return DPREC_ERR_STORE_MISMATCH; /* written with more ledger lines */
    if ((size_t)len != 8u + (size_t)n * size) return DPREC_ERR_STORE_CORRUPT;
    const unsigned char *l = d + 8;
    for (uint32_t i = 0; i < n; i++, l += size) {
        ledger_line line;
        if (format == 0) {
            if (dprec_ld16(l + 38) != 0 || dprec_ld32(l + 40) != 0) return DPREC_ERR_STORE_CORRUPT;
            line_from_v0(c, l, &line);
        } else {
            if (l[67] != 0 || dprec_ld32(l + 68) != 0) return DPREC_ERR_STORE_CORRUPT;
            memset(&line, 0, sizeof line);
            line.job_id = dprec_ld64(l);
            line.last_round = dprec_ld64(l + 8);
            line.epsilon = get_f64(l + 16);
            line.delta = get_f64(l + 24);
            line.user_epsilon = get_f64(l + 32);
            line.user_delta = get_f64(l + 40);
            line.reports = dprec_ld32(l + 48);
            line.rounds = dprec_ld32(l + 52);
            line.max_rounds = dprec_ld64(l + 56);
            line.unit = l[64];
            line.model = l[65];
            line.state = l[66];
            memcpy(line.pin, l + 72, DPREC_JOB_PIN_SIZE);
        }
        int none = line.model == DPREC_MODEL_NONE;
        if (!valid_cost(line.epsilon, line.delta, none) || !valid_cost(line.user_epsilon, line.user_delta, none) ||
            !valid_unit(line.unit) || !valid_model(line.model) || line.state < DPREC_LINE_TAKE_PART ||
            line.state > DPREC_LINE_REPORTED || line.reports > line.rounds)
            return DPREC_ERR_STORE_CORRUPT;
        for (uint32_t j = 0; j < i; j++) /* one line per job */
            if (dprec_ld64(d + 8 + (size_t)j * size) == line.job_id) return DPREC_ERR_STORE_CORRUPT;
        if (commit) c->ledger[i] = line;
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

const ledger_line *dprec_ledger_line(const dprec_client *c, uint64_t job_id) {
    return find_job(c, job_id);
}

static void to_entry(const ledger_line *l, dprec_ledger_entry *out) {
    memset(out, 0, sizeof *out);
    out->job_id = l->job_id;
    out->unit = (dprec_unit)l->unit;
    out->model = (dprec_model)l->model;
    out->reports = l->reports;
    out->rounds = l->rounds;
    out->last_round = l->last_round;
    out->epsilon = l->epsilon;
    out->delta = l->delta;
    out->user_epsilon = l->user_epsilon;
    out->user_delta = l->user_delta;
    out->max_rounds = l->max_rounds;
}

/* Basic composition over the jobs (Dwork, Roth 2014, Thm. 3.16 and its (eps, delta) form): for unit USER every
 * job's user-level figures, for unit RATING the rating-level jobs' own. With `with` != NULL, the line `replace`
 * counts as `with` instead (replace NULL: `with` is a new line, counted in addition). */
static void unit_totals(const dprec_client *c, dprec_unit unit, const ledger_line *replace, const ledger_line *with,
                        double *eps_total, double *delta_total) {
    double e = 0.0, d = 0.0;
    for (uint32_t i = 0; i <= c->ledger_count; i++) {
        const ledger_line *l = i < c->ledger_count ? &c->ledger[i] : NULL;
        if (l == NULL) { /* past the last line: a new one */
            if (with == NULL || replace != NULL) break;
            l = with;
        } else if (with != NULL && l == replace) {
            l = with;
        }
        if (unit == DPREC_UNIT_USER) {
            e += l->user_epsilon;
            d += l->user_delta;
        } else if (l->unit == DPREC_UNIT_RATING) {
            e += l->epsilon;
            d += l->delta;
        }
    }
    *eps_total = e;
    *delta_total = d;
}

static int private_cost(double eps, double delta) {
    return eps > 0.0 && !isinf(eps) && delta >= 0.0 && delta < 1.0; /* NaN fails every comparison */
}

static int check_charge(const dprec_client *c, const dprec_charge *ch) {
    if (!valid_unit((unsigned)ch->unit) || !valid_model((unsigned)ch->model)) return DPREC_ERR_INVALID_ARGUMENT;
    if (ch->model == DPREC_MODEL_NONE) return c->cfg.allow_non_private ? DPREC_OK : DPREC_ERR_NON_PRIVATE;
    if (!private_cost(ch->job_epsilon, ch->job_delta)) return DPREC_ERR_INVALID_ARGUMENT;
    if (ch->unit == DPREC_UNIT_RATING && !private_cost(ch->user_epsilon, ch->user_delta))
        return DPREC_ERR_INVALID_ARGUMENT;
    return DPREC_OK;
}

static int pin_set(const unsigned char pin[DPREC_JOB_PIN_SIZE]) {
    unsigned char any = 0;
    for (size_t i = 0; i < DPREC_JOB_PIN_SIZE; i++) any |= pin[i];
    return any != 0;
}

/* The checks every decision and charge of (job, round) passes, in order; on success *line is the job's line
 * (NULL: none yet) and *next what it becomes if `charging` (or only records the round when not): never more
 * than the job's rounds, a cumulative figure never below what was charged before (protects the user against
 * an accountant bug or a replayed round), and both caps. */
static int admit(const dprec_client *c, const dprec_charge *ch, int charging, unsigned state, ledger_line **line,
                 ledger_line *next) {
    int rc = check_charge(c, ch);
    if (rc != DPREC_OK) return rc;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    if (!c->loaded) return dprec_diag_unloaded(c);
    if (c->ledger_lost) return DPREC_ERR_LEDGER_LOST;
    ledger_line *l = find_job(c, ch->job_id);
    if (l != NULL) {
        if (l->unit != (uint8_t)ch->unit || l->model != (uint8_t)ch->model) return DPREC_ERR_JOB_CHANGED;
        if (pin_set(l->pin) && memcmp(l->pin, ch->pin, DPREC_JOB_PIN_SIZE) != 0) return DPREC_ERR_JOB_CHANGED;
        if (ch->round < l->last_round) return DPREC_ERR_ALREADY_REPORTED;
        if (ch->round == l->last_round && l->state != DPREC_LINE_TAKE_PART) return DPREC_ERR_ALREADY_REPORTED;
        *next = *l;
    } else {
        if (c->ledger_count == c->cfg.ledger_jobs) return DPREC_ERR_LEDGER_FULL;
        memset(next, 0, sizeof *next);
        next->job_id = ch->job_id;
        next->unit = (uint8_t)ch->unit;
        next->model = (uint8_t)ch->model;
    }
    /* a new line, or one from SDK 0.1.0: this charge's job is the one it keeps */
    if (!pin_set(next->pin)) memcpy(next->pin, ch->pin, DPREC_JOB_PIN_SIZE);
    /* the job's rounds may go down (an operator closes it early), never up */
    if (ch->max_rounds != 0 && (next->max_rounds == 0 || ch->max_rounds < next->max_rounds))
        next->max_rounds = ch->max_rounds;
    next->last_round = ch->round;
    next->state = (uint8_t)state;
    *line = l;
    if (!charging) return DPREC_OK;

    if (next->max_rounds != 0 && next->rounds >= next->max_rounds) return DPREC_ERR_JOB_ROUNDS;
    next->rounds++;
    if (ch->model == DPREC_MODEL_NONE) {
        next->epsilon = next->user_epsilon = INFINITY;
        return DPREC_OK;
    }
    double ue = ch->unit == DPREC_UNIT_USER ? ch->job_epsilon : ch->user_epsilon;
    double ud = ch->unit == DPREC_UNIT_USER ? ch->job_delta : ch->user_delta;
    next->epsilon = fmax(next->epsilon, ch->job_epsilon);
    next->delta = fmax(next->delta, ch->job_delta);
    next->user_epsilon = fmax(next->user_epsilon, ue);
    next->user_delta = fmax(next->user_delta, ud);
    double e_tot, d_tot;
    unit_totals(c, DPREC_UNIT_USER, l, next, &e_tot, &d_tot);
    if (!(e_tot <= c->cfg.cap_user_epsilon) || !(d_tot <= c->cfg.cap_user_delta)) return DPREC_ERR_BUDGET_EXCEEDED;
    if (ch->unit == DPREC_UNIT_RATING) {
        unit_totals(c, DPREC_UNIT_RATING, l, next, &e_tot, &d_tot);
        if (!(e_tot <= c->cfg.cap_rating_epsilon) || !(d_tot <= c->cfg.cap_rating_delta))
            return DPREC_ERR_BUDGET_EXCEEDED;
    }
    return DPREC_OK;
}

/* Replaces (or adds) the job's line by `next` in memory; *undo gets what is needed to take it back. */
typedef struct line_undo {
    ledger_line *line;
    ledger_line saved;
    int added;
} line_undo;

static void line_apply(dprec_client *c, ledger_line *l, const ledger_line *next, line_undo *undo) {
    undo->added = l == NULL;
    if (l == NULL) l = &c->ledger[c->ledger_count++];
    undo->line = l;
    undo->saved = *l;
    *l = *next;
}

static void line_undo_apply(dprec_client *c, const line_undo *undo) {
    if (undo->added) c->ledger_count--;
    else *undo->line = undo->saved;
}

int dprec_ledger_check(const dprec_client *c, const dprec_charge *ch) {
    if (c == NULL || ch == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    ledger_line *l, next;
    return admit(c, ch, 1, DPREC_LINE_REPORTED, &l, &next);
}

int dprec_ledger_decide(dprec_client *c, const dprec_charge *ch, unsigned decision, int charge) {
    if (c == NULL || ch == NULL || (decision != DPREC_LINE_TAKE_PART && decision != DPREC_LINE_SAT_OUT) ||
        (charge && decision != DPREC_LINE_SAT_OUT))
        return DPREC_ERR_INVALID_ARGUMENT;
    ledger_line *l, next;
    int rc = admit(c, ch, charge, decision, &l, &next);
    if (rc != DPREC_OK) return rc;
    line_undo undo;
    line_apply(c, l, &next, &undo);
    rc = dprec_store_save(c);
    if (rc != DPREC_OK) {
        line_undo_apply(c, &undo);
        return rc;
    }
    if (!charge) return DPREC_OK;
    /* a charge: the mirror copy, as for a report (both generations hold it) */
    return dprec_store_save(c);
}

int dprec_report_prepare(dprec_client *c, const dprec_charge *ch, dprec_report_build_fn build, void *user,
                         unsigned char report_id[DPREC_REPORT_ID_SIZE]) {
    dprec_diag_begin(c);
    if (c == NULL || ch == NULL || build == NULL || report_id == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    ledger_line *line, next;
    int rc = admit(c, ch, 1, DPREC_LINE_REPORTED, &line, &next);
    if (rc != DPREC_OK) return rc;
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

    next.reports++;
    line_undo undo;
    line_apply(c, line, &next, &undo);
    c->pending_count++;

    rc = dprec_store_save(c);
    if (rc != DPREC_OK) { /* nothing durable: undo, and destroy the report */
        c->pending_count--;
        dprec_wipe(s, c->pending_stride);
        line_undo_apply(c, &undo);
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
    dprec_diag_begin(c);
    if (c == NULL || out == NULL || index >= c->pending_count) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->mirror_needed) /* the bytes are withheld until both generations hold the charge */
        return dprec_diag_fail(c, DPREC_ERR_STATE,
                               "the report's charge is in one store generation only: call dprec_store_flush first",
                               NULL, NULL);
    const unsigned char *s = slot(c, index);
    memcpy(out->report_id, s, DPREC_REPORT_ID_SIZE);
    out->job_id = dprec_ld64(s + 16);
    out->round = dprec_ld64(s + 24);
    out->len = dprec_ld32(s + 32);
    out->bytes = s + DPREC_PENDING_HEADER;
    return DPREC_OK;
}

int dprec_report_ack(dprec_client *c, const unsigned char report_id[DPREC_REPORT_ID_SIZE]) {
    dprec_diag_begin(c);
    if (c == NULL || report_id == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    if (!c->loaded) return dprec_diag_unloaded(c);
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
    dprec_diag_begin(c);
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
    dprec_diag_begin(c);
    if (c == NULL || out == NULL || index >= c->ledger_count) return DPREC_ERR_INVALID_ARGUMENT;
    to_entry(&c->ledger[index], out);
    return DPREC_OK;
}

int dprec_ledger_total(const dprec_client *c, dprec_unit unit, double *epsilon, double *delta) {
    dprec_diag_begin(c);
    if (c == NULL || epsilon == NULL || delta == NULL || !valid_unit((unsigned)unit)) return DPREC_ERR_INVALID_ARGUMENT;
    unit_totals(c, unit, NULL, NULL, epsilon, delta);
    return DPREC_OK;
}

int dprec_ledger_reset_after_loss(dprec_client *c) {
    dprec_diag_begin(c);
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (!c->ledger_lost)
        return dprec_diag_fail(c, DPREC_ERR_STATE, "the ledger is not lost: there is nothing to reset", NULL, NULL);
    c->ledger_lost = 0;
    c->ledger_count = 0;
    c->pending_count = 0;
    return DPREC_OK;
}
