/* dprec aggregator — secure aggregation as a job option (agg_secure.h): one SecAgg+ round in memory per open round of
 * a secure job, its phases, the devices' messages and the unmasked sum the finalizer takes.
 *
 * On a state several instances share, the round in memory is each instance's copy of a log in the state
 * (agg_store_secagg_read): every message that changes the round (a device's keys, shares, masked input, attestation,
 * reveals; a phase the operator or a deadline closed; the round's opening with its seed) is checked against the copy
 * brought up to the log, under the job's row, and appended in the same transaction; each instance applies the log's
 * entries in order with the same code (apply), so every copy passes through the same states, and the phases that
 * close by themselves close at the same entry everywhere. A device may thus send each step to any instance, and an
 * instance that starts or takes a job's lease rebuilds its copy from the log. On a single-instance state the copy is
 * the round: nothing is logged.
 *
 * In rounds/ because a secure round is part of the round engine's: the writer's tick closes its phases, the finalizer
 * takes its sum. The job's parameters and noise plan are the protocols' (protocols/agg_secure_spec.c); the answers
 * to the devices' messages are the base's JSON answers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_secagg.h"
#include "agg_secure.h"
#include "bytes.h"
#include "state/agg_store.h"
#include "dprec/status.h"

enum { SP_ADVERTISE = 0, SP_SHARE, SP_MASK, SP_CONSISTENCY, SP_UNMASK, SP_DONE, SP_ABORTED };
static const char *const phase_names[] = {"advertise", "share", "mask", "consistency", "unmask", "closed", "aborted"};
enum { STEP_KEYS = 0, STEP_SHARES, STEP_ATTEST, STEP_REVEALS, STEPS };
/* A log entry's kind (a shared state's secagg_log.kind: never renumbered). OPEN: the round's seed (32 bytes); KEYS:
 * the keys message, then the identity the device enrolled [65] [token_len u8][token]; SHARES, ATTEST, REVEALS: the
 * message; MASKED: the masked input (the report's payload); CLOSE: the phase closed [u8]. */
enum { E_OPEN = 1, E_KEYS, E_SHARES, E_MASKED, E_ATTEST, E_REVEALS, E_CLOSE };

typedef struct secure_round {
    struct secure_round *next;
    int64_t job, round;
    int phase;
    agg_secure_spec spec;
    uint32_t expected;           /* devices whose keys close the first phase by themselves */
    uint32_t n_adv, n_shared, n_masked, n_attested, n_revealed;
    unsigned char seed[32];      /* the rotation's public seed (and the graph's) */
    agg_secagg *sa;
    double *sum;                 /* the decoded noisy sum, once unmasked */
    uint32_t survivors;
    /* who completed each step (keys, shares, attestation, reveals), n_max each: a device that re-sends a message whose
     * answer it lost is answered 200 again, and nothing is applied twice */
    uint32_t *done_ids[STEPS];
    /* a shared state: the last log entry applied; replaying: applying the log (no event logged); broken: a change
     * applied here that the log did not take (the copy is made again from the log before its next use) */
    int shared, replaying, broken;
    int64_t applied;
} secure_round;

static uint32_t *step_count(secure_round *r, int step) {
    return step == STEP_KEYS ? &r->n_adv : step == STEP_SHARES ? &r->n_shared
         : step == STEP_ATTEST ? &r->n_attested : &r->n_revealed;
}

static int step_done(secure_round *r, int step, uint32_t id) {
    uint32_t n = *step_count(r, step);
    for (uint32_t i = 0; i < n; i++)
        if (r->done_ids[step][i] == id) return 1;
    return 0;
}

static void step_mark(secure_round *r, int step, uint32_t id) {
    uint32_t *n = step_count(r, step);
    if (*n < r->spec.plan.n_max) r->done_ids[step][*n] = id;
    (*n)++;
}

struct agg_secure_registry {
    pthread_mutex_t mu;
    secure_round *head;
};

/* ---- the registry ---------------------------------------------------------------------------------------------- */

int agg_secure_init(dprec_agg *a) {
    a->secure = calloc(1, sizeof *a->secure);
    if (a->secure == NULL) return -1;
    pthread_mutex_init(&a->secure->mu, NULL);
    return 0;
}

static void round_free(secure_round *r) {
    for (int i = 0; i < STEPS; i++) free(r->done_ids[i]);
    agg_secagg_free(r->sa);
    free(r->sum);
    free(r);
}

void agg_secure_free(dprec_agg *a) {
    if (a == NULL || a->secure == NULL) return;
    for (secure_round *r = a->secure->head, *n; r != NULL; r = n) {
        n = r->next;
        round_free(r);
    }
    pthread_mutex_destroy(&a->secure->mu);
    free(a->secure);
    a->secure = NULL;
}

/* The round's SecAgg+ state from its public seed (the rotation's and the graph's). 0 or -1. */
static int round_start(secure_round *r, const unsigned char seed[32]) {
    memcpy(r->seed, seed, sizeof r->seed);
    agg_secagg_config sc;
    memset(&sc, 0, sizeof sc);
    sc.job = (uint64_t)r->job;
    sc.round = (uint64_t)r->round;
    sc.n_max = r->spec.plan.n_max;
    sc.n_min = r->spec.plan.n_min;
    sc.k = r->spec.k;
    sc.threshold = r->spec.threshold;
    sc.bits = r->spec.plan.bits;
    sc.dim = r->spec.plan.dim;
    memcpy(sc.graph_seed, r->seed, sizeof sc.graph_seed);
    return agg_secagg_new(&sc, &r->sa) == DPREC_OK ? 0 : -1;
}

static int catch_up(dprec_agg *a, secure_round *r, int lock);
static int apply(dprec_agg *a, secure_round *r, int kind, uint32_t id, const unsigned char *body, size_t len,
                 dprec_agg_response *resp);

/* A new round's public seed, from the aggregator's CSPRNG. 0 or -1. */
static int draw_seed(dprec_agg *a, unsigned char seed[32]) {
    pthread_mutex_lock(&a->rng_mu);
    int rc = dprec_rng_bytes(&a->rng, seed, 32);
    pthread_mutex_unlock(&a->rng_mu);
    return rc == DPREC_OK ? 0 : -1;
}

/* Why round_of gave no round: the job's open round is another one (a shared state: this caller's view of the job is
 * behind), or memory or the state failed. */
enum { NO_ROUND_CLOSED = 1, NO_ROUND_FAILED };

/* A new round's copy (shared state: from its log, whose first entry, the seed, the first instance to see the round
 * appends). NULL with *why. Under mu. */
static secure_round *round_new(dprec_agg *a, const agg_job *job, int *why) {
    *why = NO_ROUND_FAILED;
    secure_round *r = calloc(1, sizeof *r);
    if (r == NULL) return NULL;
    r->job = job->id;
    r->round = job->round;
    r->shared = agg_store_shared(a);
    if (!agg_secure_job(job, &r->spec)) {
        free(r);
        return NULL;
    }
    r->expected = job->min_reports > 0 && (uint64_t)job->min_reports <= r->spec.plan.n_max ? (uint32_t)job->min_reports
                                                                                          : r->spec.plan.n_max;
    int ok = 1;
    for (int i = 0; i < STEPS; i++) {
        r->done_ids[i] = calloc(r->spec.plan.n_max, sizeof(uint32_t));
        ok &= r->done_ids[i] != NULL;
    }
    unsigned char seed[32];
    if (ok && !r->shared) ok = draw_seed(a, seed) == 0 && round_start(r, seed) == 0;
    else if (ok) {
        /* the log's seed if another instance opened the round; else this one's, drawn and appended first */
        int rc = catch_up(a, r, 0);
        if (rc == 0 && r->sa == NULL && r->applied == 0) {
            rc = catch_up(a, r, 1);
            if (rc == 0) {
                int opened = r->sa == NULL && r->applied == 0 && draw_seed(a, seed) == 0 &&
                             apply(a, r, E_OPEN, 0, seed, sizeof seed, NULL);
                agg_store_secagg_entry e = {1, E_OPEN, 0, seed, sizeof seed};
                if (agg_store_secagg_unlock(a, r->job, r->round, opened ? &e : NULL) != 0) rc = -1;
                else if (opened) r->applied = 1;
            }
        }
        if (rc == AGG_STORE_ROUND_CLOSED) *why = NO_ROUND_CLOSED;
        ok = rc == 0 && r->sa != NULL;
    }
    if (!ok) {
        round_free(r);
        return NULL;
    }
    return r;
}

/* The job's open round's copy (created on first sight; an older round's, and a broken one, dropped). Under mu. NULL
 * with *why. */
static secure_round *round_of(dprec_agg *a, const agg_job *job, int *why) {
    secure_round **pp = &a->secure->head;
    *why = NO_ROUND_CLOSED;
    for (; *pp != NULL; pp = &(*pp)->next) {
        secure_round *r = *pp;
        if (r->job != job->id) continue;
        if (r->round == job->round && !r->broken) return r;
        if (r->round > job->round) return NULL;
        *pp = r->next; /* an older round, or a copy the log did not follow: gone */
        round_free(r);
        break;
    }
    secure_round *r = round_new(a, job, why);
    if (r == NULL) return NULL;
    r->next = a->secure->head;
    a->secure->head = r;
    return r;
}

void agg_secure_forget(dprec_agg *a, int64_t job, int64_t round) {
    if (a->secure == NULL) return;
    pthread_mutex_lock(&a->secure->mu);
    for (secure_round **pp = &a->secure->head; *pp != NULL;) {
        secure_round *r = *pp;
        if (r->job == job && r->round < round) {
            *pp = r->next;
            round_free(r);
        } else {
            pp = &r->next;
        }
    }
    pthread_mutex_unlock(&a->secure->mu);
}

/* A shared state: the log's entries after r->applied applied to r, in order, as they were when taken (lock 0: read;
 * lock 1: the job's row then held until agg_store_secagg_unlock). 0; AGG_STORE_ROUND_CLOSED (lock 1: the round is no
 * longer the job's open one; nothing held); -1 (the state failed; nothing held). A single-instance state: 0. */
static int catch_up(dprec_agg *a, secure_round *r, int lock) {
    if (!r->shared) return 0;
    agg_store_secagg_entry *e = NULL;
    size_t n = 0;
    int rc = agg_store_secagg_read(a, r->job, r->round, r->applied, lock, &e, &n);
    if (rc != 0) return rc;
    r->replaying = 1;
    for (size_t i = 0; i < n; i++) {
        if (e[i].seq != r->applied + 1 || (r->sa == NULL && e[i].kind != E_OPEN)) {
            r->broken = 1; /* a gap, or a round with no seed first: not a log this code wrote */
            break;
        }
        dprec_agg_response scratch;
        memset(&scratch, 0, sizeof scratch);
        if (!apply(a, r, e[i].kind, (uint32_t)e[i].device, e[i].body, e[i].len, &scratch)) {
            /* every entry changed the copy of the instance that appended it, in this same state: one that changes
             * nothing here means this copy went another way */
            cJSON *o = cJSON_CreateObject();
            if (o != NULL) {
                cJSON_AddNumberToObject(o, "job", (double)r->job);
                cJSON_AddNumberToObject(o, "round", (double)r->round);
                cJSON_AddNumberToObject(o, "seq", (double)e[i].seq);
                cJSON_AddNumberToObject(o, "status", scratch.status);
            }
            agg_log(a, "error", "secagg_log_diverged", o);
            r->broken = 1;
        }
        dprec_agg_response_free(&scratch);
        if (r->broken) break;
        r->applied = e[i].seq;
    }
    r->replaying = 0;
    agg_store_secagg_entries_free(e, n);
    if (r->broken) {
        if (lock) agg_store_secagg_unlock(a, r->job, r->round, NULL);
        return -1;
    }
    return 0;
}

/* A message that would change the round: applied to the copy, and on a shared state first brought up to the log and
 * then appended to it, under the job's row. The answer in *resp. 0 (resp written). */
static int submit(dprec_agg *a, secure_round *r, int kind, uint32_t id, const unsigned char *body, size_t len,
                  dprec_agg_response *resp) {
    if (!r->shared) {
        (void)apply(a, r, kind, id, body, len, resp);
        return 0;
    }
    int rc = catch_up(a, r, 1);
    if (rc == AGG_STORE_ROUND_CLOSED)
        return agg_respond_error(resp, 409, "round_closed", "the round has closed");
    if (rc != 0) return agg_respond_error(resp, 503, "unavailable", "state database error");
    int changed = apply(a, r, kind, id, body, len, resp);
    agg_store_secagg_entry e = {r->applied + 1, kind, id, (unsigned char *)body, len};
    if (agg_store_secagg_unlock(a, r->job, r->round, changed ? &e : NULL) != 0 && changed) {
        r->broken = 1; /* applied here, not logged: the copy is made again from the log */
        dprec_agg_response_free(resp);
        return agg_respond_error(resp, 503, "unavailable", "state database error");
    }
    if (changed) r->applied = e.seq;
    return 0;
}

/* Closes the open phase; a phase that cannot close (too few devices) aborts the round. Under mu. */
static void close_phase(dprec_agg *a, secure_round *r) {
    int rc = DPREC_OK;
    switch (r->phase) {
    case SP_ADVERTISE: rc = agg_secagg_close_advertise(r->sa); break;
    case SP_SHARE: rc = agg_secagg_close_shares(r->sa); break;
    case SP_MASK: rc = agg_secagg_close_masked(r->sa); break;
    case SP_CONSISTENCY: rc = agg_secagg_close_consistency(r->sa); break;
    case SP_UNMASK: {
        uint64_t *sum = calloc(r->spec.plan.dim, sizeof *sum);
        double *work = calloc(r->spec.plan.dim, sizeof *work);
        r->sum = calloc(r->spec.plan.d, sizeof *r->sum);
        if (sum == NULL || work == NULL || r->sum == NULL) rc = DPREC_ERR_NO_MEMORY;
        if (rc == DPREC_OK) {
            pthread_mutex_lock(&a->rng_mu);
            rc = agg_secagg_finish(r->sa, &a->rng, sum, &r->survivors);
            pthread_mutex_unlock(&a->rng_mu);
        }
        if (rc == DPREC_OK) rc = dprec_ddg_decode(&r->spec.plan, r->seed, sum, work, r->sum);
        free(sum);
        free(work);
        if (rc != DPREC_OK) {
            free(r->sum);
            r->sum = NULL;
        }
        break;
    }
    default: return;
    }
    /* the instance that took the change says so; the others replay it */
    cJSON *o = r->replaying ? NULL : cJSON_CreateObject();
    if (o != NULL) {
        cJSON_AddNumberToObject(o, "job", (double)r->job);
        cJSON_AddNumberToObject(o, "round", (double)r->round);
        cJSON_AddStringToObject(o, "phase", phase_names[r->phase]);
        cJSON_AddNumberToObject(o, "devices", r->phase == SP_ADVERTISE ? r->n_adv : r->phase == SP_SHARE ? r->n_shared
                                                                 : r->phase == SP_MASK ? r->n_masked
                                                                 : r->phase == SP_CONSISTENCY ? r->n_attested : r->n_revealed);
        if (rc != DPREC_OK) cJSON_AddStringToObject(o, "aborted", dprec_status_name(rc));
    }
    if (!r->replaying) agg_log(a, rc == DPREC_OK ? "info" : "warn", "secagg_phase_closed", o);
    r->phase = rc == DPREC_OK ? r->phase + 1 : SP_ABORTED;
}

/* The phases that close by themselves once every device of the previous one acted. Under mu. */
static void maybe_advance(dprec_agg *a, secure_round *r) {
    if (r->phase == SP_ADVERTISE && r->n_adv >= r->expected) close_phase(a, r);
    if (r->phase == SP_SHARE && r->n_shared == r->n_adv) close_phase(a, r);
    if (r->phase == SP_MASK && r->n_masked == r->n_shared) close_phase(a, r);
    if (r->phase == SP_CONSISTENCY && r->n_attested == r->n_masked) close_phase(a, r);
}

static void hex_of(const unsigned char *b, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[2 * n] = '\0';
}

int agg_secure_view(dprec_agg *a, const agg_job *job, cJSON *view) {
    if (view == NULL || job->done || !agg_secure_job(job, NULL)) return 0;
    pthread_mutex_lock(&a->secure->mu);
    int why = 0;
    secure_round *r = round_of(a, job, &why);
    int rc = r != NULL ? catch_up(a, r, 0) : why == NO_ROUND_CLOSED ? 0 : -1;
    cJSON *o = rc == 0 ? cJSON_AddObjectToObject(view, "secagg") : NULL;
    if (o != NULL) {
        char seed[65];
        cJSON_AddNumberToObject(o, "round", (double)job->round);
        cJSON_AddStringToObject(o, "phase", r != NULL ? phase_names[r->phase] : why == NO_ROUND_CLOSED ? "closed" : "aborted");
        if (r != NULL) {
            hex_of(r->seed, sizeof r->seed, seed);
            cJSON_AddStringToObject(o, "seed", seed);
        }
    }
    pthread_mutex_unlock(&a->secure->mu);
    return rc == 0 ? 0 : -1;
}

/* ---- the device routes ----------------------------------------------------------------------------------------- */

static int answer(dprec_agg_response *resp, unsigned char *body, size_t len) {
    resp->status = 200;
    resp->content_type = "application/octet-stream";
    resp->body = body;
    resp->body_len = len;
    return 0;
}

static void get_env(const unsigned char *p, dprec_secagg_envelope *e) {
    e->from = dprec_ld32(p);
    e->to = dprec_ld32(p + 4);
    memcpy(e->iv, p + 8, DPREC_GCM_IV_SIZE);
    memcpy(e->sealed, p + 8 + DPREC_GCM_IV_SIZE, DPREC_SECAGG_SEALED_BYTES);
    memcpy(e->tag, p + 8 + DPREC_GCM_IV_SIZE + DPREC_SECAGG_SEALED_BYTES, DPREC_GCM_TAG_SIZE);
}

static void put_env(unsigned char *p, const dprec_secagg_envelope *e) {
    dprec_st32(p, e->from);
    dprec_st32(p + 4, e->to);
    memcpy(p + 8, e->iv, DPREC_GCM_IV_SIZE);
    memcpy(p + 8 + DPREC_GCM_IV_SIZE, e->sealed, DPREC_SECAGG_SEALED_BYTES);
    memcpy(p + 8 + DPREC_GCM_IV_SIZE + DPREC_SECAGG_SEALED_BYTES, e->tag, DPREC_GCM_TAG_SIZE);
}

/* The step a route belongs to (its phase), and whether it is a POST. -1 for an unknown route. */
static int route_phase(const char *what, int *post) {
    static const struct {
        const char *what;
        int phase, post;
    } routes[] = {{"keys", SP_ADVERTISE, 1},      {"neighbours", SP_SHARE, 0},     {"shares", SP_SHARE, 1},
                  {"inbox", SP_MASK, 0},          {"survivors", SP_CONSISTENCY, 0}, {"consistency", SP_CONSISTENCY, 1},
                  {"requests", SP_UNMASK, 0},     {"reveals", SP_UNMASK, 1}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(what, routes[i].what) == 0) {
            *post = routes[i].post;
            return routes[i].phase;
        }
    return -1;
}

static int step_of(int phase) {
    return phase == SP_ADVERTISE ? STEP_KEYS : phase == SP_SHARE ? STEP_SHARES : phase == SP_CONSISTENCY ? STEP_ATTEST
                                                                                                      : STEP_REVEALS;
}

/* The neighbours answer: [round u64][k u32] then k x [id u32][c_pk 32][s_pk 32][sig 64][identity 65][token_len u8]
 * [token] (docs/protocol.md). */
static int answer_neighbours(secure_round *r, uint32_t id, dprec_agg_response *resp) {
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    const agg_secagg_ident *who[DPREC_SECAGG_MAX_NEIGHBOURS];
    uint32_t k = 0;
    if (agg_secagg_neighbours(r->sa, id, nb, who, DPREC_SECAGG_MAX_NEIGHBOURS, &k) != DPREC_OK)
        return agg_respond_error(resp, 409, "not_in_round", "this device did not advertise keys in this round");
    size_t n = 12;
    for (uint32_t j = 0; j < k; j++) n += DPREC_SECURE_NEIGHBOUR_FIXED + who[j]->token_len;
    unsigned char *out = malloc(n), *q = out + 12;
    if (out == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
    dprec_st64(out, (uint64_t)r->round);
    dprec_st32(out + 8, k);
    for (uint32_t j = 0; j < k; j++) {
        dprec_st32(q, nb[j].id);
        memcpy(q + 4, nb[j].c_pk, DPREC_SECAGG_KEY_SIZE);
        memcpy(q + 4 + DPREC_SECAGG_KEY_SIZE, nb[j].s_pk, DPREC_SECAGG_KEY_SIZE);
        q += 4 + 2 * DPREC_SECAGG_KEY_SIZE;
        memcpy(q, who[j]->sig, DPREC_IDENTITY_SIG_SIZE);
        memcpy(q + DPREC_IDENTITY_SIG_SIZE, who[j]->identity, DPREC_IDENTITY_PK_SIZE);
        q[DPREC_IDENTITY_SIG_SIZE + DPREC_IDENTITY_PK_SIZE] = (unsigned char)who[j]->token_len;
        q += DPREC_IDENTITY_SIG_SIZE + DPREC_IDENTITY_PK_SIZE + 1;
        memcpy(q, who[j]->token, who[j]->token_len);
        q += who[j]->token_len;
    }
    return answer(resp, out, n);
}

/* The requests answer: [round u64][survivors u32][n u32] then n x [owner u32][kind u32], a self-mask request followed
 * by its owner's signed statement of the neighbours it masked with [m u32][m ids u32][sig 64] (without it the holder
 * reveals nothing), then [U3's hash 32][m u32] and m attestations [id u32][identity 65][token_len u8][token][sig 64]
 * (agg_secagg_attestations: the first max(t, n_min) attesters by identity and the device's neighbours that attested). */
static int answer_requests(secure_round *r, uint32_t id, dprec_agg_response *resp) {
    dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
    uint32_t n = 0, survivors = 0, m = 0, room = r->spec.plan.n_min + r->spec.threshold + DPREC_SECAGG_MAX_NEIGHBOURS;
    agg_secagg_attestation *att = malloc(sizeof *att * room);
    if (att == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
    if (agg_secagg_requests(r->sa, id, req, DPREC_SECAGG_MAX_NEIGHBOURS, &n, &survivors) != DPREC_OK ||
        agg_secagg_attestations(r->sa, id, att, room, &m) != DPREC_OK) {
        free(att);
        return agg_respond_error(resp, 409, "not_in_round", "this device did not attest the survivor set in this round");
    }
    size_t len_out = 16 + 36;
    const uint32_t *mw[DPREC_SECAGG_MAX_NEIGHBOURS];
    const unsigned char *mw_sig[DPREC_SECAGG_MAX_NEIGHBOURS];
    uint32_t n_mw[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t j = 0; j < n; j++) {
        len_out += DPREC_SECURE_REQUEST_FIXED;
        n_mw[j] = 0;
        if (req[j].kind != DPREC_SECAGG_SELF_MASK) continue;
        if (agg_secagg_masked_with(r->sa, req[j].owner, &mw[j], &n_mw[j], &mw_sig[j]) != DPREC_OK) { /* U3 has it */
            free(att);
            return agg_respond_error(resp, 500, "internal", "a survivor without its masked-with statement");
        }
        len_out += 4 + 4 * (size_t)n_mw[j] + DPREC_IDENTITY_SIG_SIZE;
    }
    for (uint32_t i = 0; i < m; i++) len_out += DPREC_SECURE_ATTEST_FIXED + att[i].who->token_len + DPREC_IDENTITY_SIG_SIZE;
    unsigned char *out = malloc(len_out), *q;
    if (out == NULL) {
        free(att);
        return agg_respond_error(resp, 500, "internal", "out of memory");
    }
    dprec_st64(out, (uint64_t)r->round);
    dprec_st32(out + 8, survivors);
    dprec_st32(out + 12, n);
    q = out + 16;
    for (uint32_t j = 0; j < n; j++) {
        dprec_st32(q, req[j].owner);
        dprec_st32(q + 4, (uint32_t)req[j].kind);
        q += DPREC_SECURE_REQUEST_FIXED;
        if (req[j].kind != DPREC_SECAGG_SELF_MASK) continue;
        dprec_st32(q, n_mw[j]);
        for (uint32_t i = 0; i < n_mw[j]; i++) dprec_st32(q + 4 + 4 * (size_t)i, mw[j][i]);
        q += 4 + 4 * (size_t)n_mw[j];
        memcpy(q, mw_sig[j], DPREC_IDENTITY_SIG_SIZE);
        q += DPREC_IDENTITY_SIG_SIZE;
    }
    uint32_t n3 = 0;
    (void)agg_secagg_survivors(r->sa, NULL, 0, &n3, q);
    dprec_st32(q + 32, m);
    q += 36;
    for (uint32_t i = 0; i < m; i++) {
        dprec_st32(q, att[i].id);
        memcpy(q + 4, att[i].who->identity, DPREC_IDENTITY_PK_SIZE);
        q[4 + DPREC_IDENTITY_PK_SIZE] = (unsigned char)att[i].who->token_len;
        q += DPREC_SECURE_ATTEST_FIXED;
        memcpy(q, att[i].who->token, att[i].who->token_len);
        q += att[i].who->token_len;
        memcpy(q, att[i].sig, DPREC_IDENTITY_SIG_SIZE);
        q += DPREC_IDENTITY_SIG_SIZE;
    }
    free(att);
    return answer(resp, out, len_out);
}

/* A masked input (E_MASKED: the report's payload). Under mu. */
static int apply_masked(dprec_agg *a, secure_round *r, uint32_t device, const unsigned char *p, size_t len,
                        dprec_agg_response *resp) {
    if (r->phase >= SP_MASK && r->phase <= SP_DONE && agg_secagg_masked_input(r->sa, device) != NULL) {
        agg_respond_json(resp, 200, cJSON_CreateObject()); /* a re-sent report: taken already */
        return 0;
    }
    if (r->phase != SP_MASK) {
        agg_respond_error(resp, 409, "round_closed", "the round takes no masked input now");
        return 0;
    }
    if (len != DPREC_SECURE_PAYLOAD_SIZE(r->spec.plan.dim, r->spec.k) || memcmp(p, DPREC_SECURE_PAYLOAD_MAGIC, 4) != 0 ||
        dprec_ld32(p + 4) != device || dprec_ld32(p + 8) != r->spec.plan.dim || dprec_ld32(p + 12) != r->spec.plan.bits) {
        agg_respond_error(resp, 400, "bad_report",
                          "a secure job's report is [\"DSA2\"][id][dim][bits], dim residues and the signed "
                          "neighbours it masked with [m][k ids][sig]");
        return 0;
    }
    uint64_t *y = malloc(sizeof(uint64_t) * r->spec.plan.dim);
    uint64_t lim = ((uint64_t)1 << r->spec.plan.bits) - 1;
    int ok = y != NULL;
    for (uint32_t j = 0; ok && j < r->spec.plan.dim; j++) {
        y[j] = dprec_ld64(p + 16 + 8 * (size_t)j);
        if (y[j] > lim) ok = 0;
    }
    /* the statement: m ids in the k slots, the rest zero (one encoding per statement), then the signature */
    const unsigned char *tr = p + 16 + 8 * (size_t)r->spec.plan.dim;
    uint32_t m = dprec_ld32(tr), ids[DPREC_SECAGG_MAX_NEIGHBOURS];
    int st_ok = m >= 1 && m <= r->spec.k && m <= DPREC_SECAGG_MAX_NEIGHBOURS;
    for (uint32_t j = 0; st_ok && j < r->spec.k; j++) {
        uint32_t v = dprec_ld32(tr + 4 + 4 * (size_t)j);
        if (j < m) ids[j] = v;
        else st_ok = v == 0;
    }
    int prc = DPREC_ERR_INVALID_ARGUMENT, changed = 0;
    if (y != NULL && ok && st_ok) prc = agg_secagg_put_masked(r->sa, device, y, ids, m, tr + 4 + 4 * (size_t)r->spec.k);
    if (y == NULL) agg_respond_error(resp, 500, "internal", "out of memory");
    else if (!ok) agg_respond_error(resp, 400, "bad_report", "a residue is not below 2^bits");
    else if (prc == DPREC_ERR_INVALID_ARGUMENT)
        agg_respond_error(resp, 400, "bad_report",
                          "the neighbours it masked with are not its neighbours that shared, in increasing order");
    else if (prc == DPREC_ERR_CRYPTO)
        agg_respond_error(resp, 400, "bad_signature",
                          "the neighbours it masked with: the signature does not verify under its identity");
    else if (prc == DPREC_ERR_NO_MEMORY) agg_respond_error(resp, 500, "internal", "out of memory");
    else if (prc != DPREC_OK) agg_respond_error(resp, 409, "already_reported", "no masked input expected from this device");
    else {
        r->n_masked++;
        maybe_advance(a, r);
        agg_respond_json(resp, 200, cJSON_CreateObject());
        changed = 1;
    }
    free(y);
    return changed;
}

/* One change to the round (a log entry's kind, its device, its body): the round's opening (E_OPEN), a phase closed
 * (E_CLOSE), or a device's message, checked here (its phase, its round, its form, its signatures). 1: the round
 * changed (*resp says 200); 0: nothing changed (a re-send, answered 200 again, or a refusal, in *resp). resp may be
 * NULL for E_OPEN and E_CLOSE, which answer nothing. Under mu. The same function takes a message and replays it
 * (catch_up): what a round is after its log depends on the log only. */
static int apply(dprec_agg *a, secure_round *r, int kind, uint32_t id, const unsigned char *body, size_t len,
                 dprec_agg_response *resp) {
    if (kind == E_OPEN) return r->sa == NULL && len == sizeof r->seed && round_start(r, body) == 0;
    if (kind == E_CLOSE) {
        if (len != 1 || r->phase != body[0] || r->phase >= SP_DONE) return 0;
        close_phase(a, r);
        return 1;
    }
    if (kind == E_MASKED) return apply_masked(a, r, id, body, len, resp);
    const int want_phase = kind == E_KEYS ? SP_ADVERTISE : kind == E_SHARES ? SP_SHARE : kind == E_ATTEST ? SP_CONSISTENCY
                         : kind == E_REVEALS ? SP_UNMASK : -1;
    if (want_phase < 0) {
        agg_respond_error(resp, 500, "internal", "unknown secure-aggregation log entry");
        return 0;
    }
    if (r->phase != want_phase) {
        agg_respond_error(resp, 409, "wrong_phase", "the round's secure aggregation is in another phase");
        return 0;
    }
    if (len < 12 || dprec_ld64(body) != (uint64_t)r->round) {
        agg_respond_error(resp, 400, "bad_request", "the message is not for the open round");
        return 0;
    }
    if (step_done(r, step_of(want_phase), id)) {
        agg_respond_json(resp, 200, cJSON_CreateObject()); /* a re-send: taken already, nothing re-applied */
        return 0;
    }
    int rc;
    if (kind == E_KEYS) {
        /* [keys message][identity 65][token_len u8][token] (agg_secure_handle adds who the device enrolled as) */
        const size_t fixed = DPREC_SECURE_KEYS_WIRE + DPREC_IDENTITY_PK_SIZE + 1;
        size_t token_len = len >= fixed ? body[fixed - 1] : 0;
        if (len < fixed || token_len > DPREC_ENROLL_TOKEN_MAX || len != fixed + token_len ||
            dprec_ld32(body + 8) != id) {
            agg_respond_error(resp, 400, "bad_request", "keys: [round u64][id u32][c_pk 32][s_pk 32][sig 64], id = device");
            return 0;
        }
        dprec_secagg_pub pub;
        pub.id = id;
        memcpy(pub.c_pk, body + 12, DPREC_SECAGG_KEY_SIZE);
        memcpy(pub.s_pk, body + 12 + DPREC_SECAGG_KEY_SIZE, DPREC_SECAGG_KEY_SIZE);
        agg_secagg_ident who;
        memset(&who, 0, sizeof who);
        memcpy(who.sig, body + 12 + 2 * DPREC_SECAGG_KEY_SIZE, DPREC_IDENTITY_SIG_SIZE);
        memcpy(who.identity, body + DPREC_SECURE_KEYS_WIRE, DPREC_IDENTITY_PK_SIZE);
        who.token_len = token_len;
        memcpy(who.token, body + fixed, token_len);
        rc = agg_secagg_advertise(r->sa, &pub, &who);
        if (rc == DPREC_ERR_CRYPTO) {
            agg_respond_error(resp, 400, "bad_signature",
                              "keys: the signature does not verify under the device's enrolled identity");
            return 0;
        }
        if (rc != DPREC_OK) {
            agg_respond_error(resp, 409, "refused", "keys refused (the round is full, or has this identity)");
            return 0;
        }
        step_mark(r, STEP_KEYS, id);
    } else if (kind == E_SHARES) {
        uint32_t k = dprec_ld32(body + 8);
        if (k > DPREC_SECAGG_MAX_NEIGHBOURS || len != 12 + (size_t)k * DPREC_SECURE_ENVELOPE_WIRE) {
            agg_respond_error(resp, 400, "bad_request", "shares: [round u64][k u32] then k envelopes");
            return 0;
        }
        dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
        for (uint32_t j = 0; j < k; j++) get_env(body + 12 + (size_t)j * DPREC_SECURE_ENVELOPE_WIRE, &env[j]);
        if (agg_secagg_put_shares(r->sa, id, env, k) != DPREC_OK) {
            agg_respond_error(resp, 409, "refused", "shares refused (not one per neighbour in order, or repeated)");
            return 0;
        }
        step_mark(r, STEP_SHARES, id);
    } else if (kind == E_ATTEST) {
        if (len != DPREC_SECURE_CONSISTENCY_WIRE || dprec_ld32(body + 8) != id) {
            agg_respond_error(resp, 400, "bad_request", "consistency: [round u64][id u32][sig 64], id = device");
            return 0;
        }
        rc = agg_secagg_attest(r->sa, id, body + 12);
        if (rc == DPREC_ERR_CRYPTO) {
            agg_respond_error(resp, 400, "bad_signature", "consistency: the signature of the survivor set does not verify");
            return 0;
        }
        if (rc != DPREC_OK) {
            agg_respond_error(resp, 409, "not_in_round", "this device is not a survivor of this round");
            return 0;
        }
        step_mark(r, STEP_ATTEST, id);
    } else { /* E_REVEALS */
        const size_t item = 16 + 4 * DPREC_SECAGG_CHUNKS;
        uint32_t n = dprec_ld32(body + 8);
        if (n > DPREC_SECAGG_MAX_NEIGHBOURS || len != 12 + (size_t)n * item) {
            agg_respond_error(resp, 400, "bad_request", "reveals: [round u64][n u32] then n reveals");
            return 0;
        }
        dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS];
        for (uint32_t j = 0; j < n; j++) {
            const unsigned char *q = body + 12 + (size_t)j * item;
            rv[j].owner = dprec_ld32(q);
            rv[j].holder = dprec_ld32(q + 4);
            rv[j].kind = (dprec_secagg_kind)dprec_ld32(q + 8);
            rv[j].share.x = dprec_ld32(q + 12);
            for (uint32_t c = 0; c < DPREC_SECAGG_CHUNKS; c++) rv[j].share.y[c] = dprec_ld32(q + 16 + 4 * c);
        }
        if (agg_secagg_put_reveals(r->sa, id, rv, n) != DPREC_OK) {
            agg_respond_error(resp, 409, "refused", "reveals refused (not what was asked, or repeated)");
            return 0;
        }
        step_mark(r, STEP_REVEALS, id);
    }
    maybe_advance(a, r);
    agg_respond_json(resp, 200, cJSON_CreateObject());
    return 1;
}

/* The routes that only read the round (neighbours, inbox, survivors, requests), on the copy brought up to the log.
 * Under mu. */
static int answer_get(dprec_agg *a, secure_round *r, uint32_t id, const char *what, int want_phase,
                      dprec_agg_response *resp) {
    if (catch_up(a, r, 0) != 0) return agg_respond_error(resp, 503, "unavailable", "state database error");
    if (r->phase != want_phase)
        return agg_respond_error(resp, 409, "wrong_phase", "the round's secure aggregation is in another phase");
    if (strcmp(what, "neighbours") == 0) return answer_neighbours(r, id, resp);
    if (strcmp(what, "requests") == 0) return answer_requests(r, id, resp);
    if (strcmp(what, "inbox") == 0) {
        dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
        uint32_t n = 0;
        if (agg_secagg_inbox(r->sa, id, env, DPREC_SECAGG_MAX_NEIGHBOURS, &n) != DPREC_OK)
            return agg_respond_error(resp, 409, "not_in_round", "this device did not share in this round");
        size_t len_out = 12 + (size_t)n * DPREC_SECURE_ENVELOPE_WIRE;
        unsigned char *out = malloc(len_out);
        if (out == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
        dprec_st64(out, (uint64_t)r->round);
        dprec_st32(out + 8, n);
        for (uint32_t j = 0; j < n; j++) put_env(out + 12 + (size_t)j * DPREC_SECURE_ENVELOPE_WIRE, &env[j]);
        return answer(resp, out, len_out);
    }
    /* survivors */
    if (agg_secagg_masked_input(r->sa, id) == NULL)
        return agg_respond_error(resp, 409, "not_in_round", "this device sent no masked input in this round");
    uint32_t n = 0;
    (void)agg_secagg_survivors(r->sa, NULL, 0, &n, NULL);
    size_t len_out = 12 + 4 * (size_t)n;
    unsigned char *out = malloc(len_out);
    if (out == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
    uint32_t *ids = malloc(sizeof *ids * (n > 0 ? n : 1));
    if (ids == NULL || agg_secagg_survivors(r->sa, ids, n, &n, NULL) != DPREC_OK) {
        free(ids);
        free(out);
        return agg_respond_error(resp, 500, "internal", "out of memory");
    }
    dprec_st64(out, (uint64_t)r->round);
    dprec_st32(out + 8, n);
    for (uint32_t j = 0; j < n; j++) dprec_st32(out + 12 + 4 * (size_t)j, ids[j]);
    free(ids);
    return answer(resp, out, len_out);
}

/* No copy of the round could be had: the answer. */
static int no_round(dprec_agg *a, int why, dprec_agg_response *resp) {
    if (why == NO_ROUND_CLOSED) return agg_respond_error(resp, 409, "round_closed", "the round has closed");
    return agg_store_shared(a) ? agg_respond_error(resp, 503, "unavailable", "state database error")
                               : agg_respond_error(resp, 500, "internal", "out of memory");
}

int agg_secure_handle(dprec_agg *a, const agg_job *job, int64_t device, const char *what, int is_post,
                      const unsigned char *body, size_t len, dprec_agg_response *resp) {
    if (job->done) return agg_respond_error(resp, 409, "job_done", "the job has finished");
    if (!agg_secure_job(job, NULL)) return agg_respond_error(resp, 404, "not_found", "the job is not a secure one");
    if (device <= 0 || device > (int64_t)UINT32_MAX)
        return agg_respond_error(resp, 400, "bad_request", "device ids past 2^32 cannot take part");
    int post = 0;
    const int want_phase = route_phase(what, &post);
    if (want_phase < 0) return agg_respond_error(resp, 404, "not_found", "unknown secure-aggregation step");
    if (post != is_post) return agg_respond_error(resp, 405, "method_not_allowed", "wrong method for this path");
    const uint32_t id = (uint32_t)device;
    int kind = strcmp(what, "keys") == 0 ? E_KEYS : strcmp(what, "shares") == 0 ? E_SHARES
             : strcmp(what, "consistency") == 0 ? E_ATTEST : E_REVEALS;
    unsigned char *msg = NULL;
    if (is_post && kind == E_KEYS) {
        /* a device takes part only under the identity it enrolled: its keys are signed with it, and its neighbours
         * check that signature (and, with the app's enrollment key, its token) before they share anything; the keys
         * entry carries it, so that every instance's copy of the round holds the same */
        agg_enrollment en;
        memset(&en, 0, sizeof en);
        int found = agg_store_device_enrollment(a, device, &en);
        if (found < 0) return agg_respond_error(resp, 500, "internal", "state database error");
        if (found == 0 || !en.has_identity)
            return agg_respond_error(resp, 403, "identity_required",
                                     "a secure round takes only devices registered with an identity key");
        if (len != DPREC_SECURE_KEYS_WIRE || dprec_ld32(body + 8) != id)
            return agg_respond_error(resp, 400, "bad_request",
                                     "keys: [round u64][id u32][c_pk 32][s_pk 32][sig 64], id = device");
        size_t token_len = en.token_len <= DPREC_ENROLL_TOKEN_MAX ? en.token_len : 0;
        msg = malloc(len + DPREC_IDENTITY_PK_SIZE + 1 + token_len);
        if (msg == NULL) return agg_respond_error(resp, 500, "internal", "out of memory");
        memcpy(msg, body, len);
        memcpy(msg + len, en.identity, DPREC_IDENTITY_PK_SIZE);
        msg[len + DPREC_IDENTITY_PK_SIZE] = (unsigned char)token_len;
        memcpy(msg + len + DPREC_IDENTITY_PK_SIZE + 1, en.token, token_len);
        body = msg;
        len += DPREC_IDENTITY_PK_SIZE + 1 + token_len;
    }
    pthread_mutex_lock(&a->secure->mu);
    int why = 0;
    secure_round *r = round_of(a, job, &why);
    int rc = r == NULL ? no_round(a, why, resp)
           : is_post   ? submit(a, r, kind, id, body, len, resp)
                       : answer_get(a, r, id, what, want_phase, resp);
    pthread_mutex_unlock(&a->secure->mu);
    free(msg);
    return rc;
}

int agg_secure_report(dprec_agg *a, const agg_job *job, int64_t device, const dprec_envelope *e,
                      dprec_agg_response *resp) {
    if (job->done) return agg_respond_error(resp, 409, "job_done", "the job has finished");
    if (device <= 0 || device > (int64_t)UINT32_MAX)
        return agg_respond_error(resp, 400, "bad_report", "device ids past 2^32 cannot take part");
    pthread_mutex_lock(&a->secure->mu);
    int why = 0;
    secure_round *r = round_of(a, job, &why);
    int rc = r == NULL ? no_round(a, why, resp)
           : e->round != (uint64_t)r->round
               ? agg_respond_error(resp, 409, "round_closed", "the round takes no masked input now")
               : submit(a, r, E_MASKED, (uint32_t)device, e->payload, e->payload_len, resp);
    pthread_mutex_unlock(&a->secure->mu);
    return rc;
}

/* Closes the open phase, through the log on a shared state. 1: the round is ready to finalize (unmasked, aborted, or
 * no longer the job's open round), 0: it goes on, -1: the state failed (nothing closed). Under mu. */
static int close_open(dprec_agg *a, secure_round *r) {
    if (!r->shared) {
        if (r->phase < SP_DONE) close_phase(a, r);
        return r->phase >= SP_DONE;
    }
    int rc = catch_up(a, r, 1);
    if (rc == AGG_STORE_ROUND_CLOSED) return 1;
    if (rc != 0) return -1;
    unsigned char ph = (unsigned char)r->phase;
    int changed = r->phase < SP_DONE && apply(a, r, E_CLOSE, 0, &ph, 1, NULL);
    agg_store_secagg_entry e = {r->applied + 1, E_CLOSE, 0, &ph, 1};
    if (agg_store_secagg_unlock(a, r->job, r->round, changed ? &e : NULL) != 0 && changed) {
        r->broken = 1;
        return -1;
    }
    if (changed) r->applied = e.seq;
    return r->phase >= SP_DONE;
}

int agg_secure_close(dprec_agg *a, const agg_job *job) {
    pthread_mutex_lock(&a->secure->mu);
    int why = 0;
    secure_round *r = round_of(a, job, &why);
    int ready = r != NULL ? close_open(a, r) : why == NO_ROUND_CLOSED ? 1 : -1;
    pthread_mutex_unlock(&a->secure->mu);
    return ready;
}

int agg_secure_deadline(dprec_agg *a, const agg_job *job) {
    int ready = 1;
    pthread_mutex_lock(&a->secure->mu);
    if (agg_store_shared(a)) { /* the round as its log has it (this instance may have taken the lease just now) */
        int why = 0;
        secure_round *r = round_of(a, job, &why);
        ready = r != NULL ? close_open(a, r) : why == NO_ROUND_CLOSED ? 1 : -1;
    } else {
        /* no state for the open round (nobody has looked at it since a restart): nobody can take part in it, and it
         * is finalized with no sum, the model unchanged */
        secure_round *r = a->secure->head;
        while (r != NULL && !(r->job == job->id && r->round == job->round)) r = r->next;
        /* whatever the count: the advertise phase with fewer than max(t, n_min) devices (none included) aborts, and
         * the round is then finalized with no sum; each later phase closes or aborts at its own deadline */
        if (r != NULL) ready = close_open(a, r);
    }
    pthread_mutex_unlock(&a->secure->mu);
    return ready;
}

int agg_secure_take_sum(dprec_agg *a, const agg_job *job, int64_t round, double **sum, uint32_t *survivors) {
    double *out = NULL;
    int rc = 0;
    *survivors = 0;
    pthread_mutex_lock(&a->secure->mu);
    secure_round *r = a->secure->head;
    while (r != NULL && !(r->job == job->id && r->round == round)) r = r->next;
    if (agg_store_shared(a)) {
        /* the round as its log has it: an instance that took the lease after a finalization began (its holder died)
         * has no copy yet */
        agg_job j = *job;
        j.round = round;
        int why = 0;
        if (r == NULL && (r = round_of(a, &j, &why)) == NULL && why != NO_ROUND_CLOSED) rc = -1;
        else if (r != NULL && r->sa != NULL && catch_up(a, r, 0) != 0) rc = -1;
        if (rc != 0) r = NULL;
    }
    if (r != NULL) {
        if (r->sum != NULL) {
            out = malloc(sizeof(double) * r->spec.plan.d);
            if (out != NULL) memcpy(out, r->sum, sizeof(double) * r->spec.plan.d);
            *survivors = r->survivors;
        }
        /* the round is over: its keys, envelopes and masked inputs (n x D words) go now, not when the job's next round
         * is first seen (never, after its last) */
        if (r->phase >= SP_DONE) {
            agg_secagg_free(r->sa);
            r->sa = NULL;
        }
    }
    pthread_mutex_unlock(&a->secure->mu);
    *sum = out;
    return rc;
}
