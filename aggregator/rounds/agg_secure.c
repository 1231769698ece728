/* dprec aggregator — secure aggregation as a job option (agg_secure.h): one SecAgg+ round in memory per open round of
 * a secure job, its phases, the devices' messages and the unmasked sum the finalizer takes.
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

/* The job's open round's state (created on first sight; an older round's is dropped). Under mu. */
static secure_round *round_of(dprec_agg *a, const agg_job *job) {
    secure_round **pp = &a->secure->head;
    for (; *pp != NULL; pp = &(*pp)->next) {
        secure_round *r = *pp;
        if (r->job != job->id) continue;
        if (r->round == job->round) return r;
        if (r->round > job->round) return NULL;
        *pp = r->next; /* an older round: gone */
        round_free(r);
        break;
    }
    secure_round *r = calloc(1, sizeof *r);
    if (r == NULL) return NULL;
    r->job = job->id;
    r->round = job->round;
    if (!agg_secure_job(job, &r->spec)) {
        free(r);
        return NULL;
    }
    r->expected = job->min_reports > 0 && (uint64_t)job->min_reports <= r->spec.plan.n_max ? (uint32_t)job->min_reports
                                                                                          : r->spec.plan.n_max;
    pthread_mutex_lock(&a->rng_mu);
    int rc = dprec_rng_bytes(&a->rng, r->seed, sizeof r->seed);
    pthread_mutex_unlock(&a->rng_mu);
    agg_secagg_config sc;
    memset(&sc, 0, sizeof sc);
    sc.job = (uint64_t)job->id;
    sc.round = (uint64_t)job->round;
    sc.n_max = r->spec.plan.n_max;
    sc.n_min = r->spec.plan.n_min;
    sc.k = r->spec.k;
    sc.threshold = r->spec.threshold;
    sc.bits = r->spec.plan.bits;
    sc.dim = r->spec.plan.dim;
    memcpy(sc.graph_seed, r->seed, sizeof sc.graph_seed);
    int ok = rc == DPREC_OK;
    for (int i = 0; i < STEPS; i++) {
        r->done_ids[i] = calloc(sc.n_max, sizeof(uint32_t));
        ok &= r->done_ids[i] != NULL;
    }
    if (!ok || agg_secagg_new(&sc, &r->sa) != DPREC_OK) {
        round_free(r);
        return NULL;
    }
    r->next = a->secure->head;
    a->secure->head = r;
    return r;
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
    cJSON *o = cJSON_CreateObject();
    if (o != NULL) {
        cJSON_AddNumberToObject(o, "job", (double)r->job);
        cJSON_AddNumberToObject(o, "round", (double)r->round);
        cJSON_AddStringToObject(o, "phase", phase_names[r->phase]);
        cJSON_AddNumberToObject(o, "devices", r->phase == SP_ADVERTISE ? r->n_adv : r->phase == SP_SHARE ? r->n_shared
                                                                 : r->phase == SP_MASK ? r->n_masked
                                                                 : r->phase == SP_CONSISTENCY ? r->n_attested : r->n_revealed);
        if (rc != DPREC_OK) cJSON_AddStringToObject(o, "aborted", dprec_status_name(rc));
    }
    agg_log(a, rc == DPREC_OK ? "info" : "warn", "secagg_phase_closed", o);
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

void agg_secure_view(dprec_agg *a, const agg_job *job, cJSON *view) {
    if (view == NULL || job->done || !agg_secure_job(job, NULL)) return;
    pthread_mutex_lock(&a->secure->mu);
    secure_round *r = round_of(a, job);
    cJSON *o = cJSON_AddObjectToObject(view, "secagg");
    if (o != NULL) {
        char seed[65];
        cJSON_AddNumberToObject(o, "round", (double)job->round);
        cJSON_AddStringToObject(o, "phase", r != NULL ? phase_names[r->phase] : "aborted");
        if (r != NULL) {
            hex_of(r->seed, sizeof r->seed, seed);
            cJSON_AddStringToObject(o, "seed", seed);
        }
    }
    pthread_mutex_unlock(&a->secure->mu);
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

static int handle_locked(dprec_agg *a, secure_round *r, uint32_t id, const char *what, int is_post,
                         const unsigned char *body, size_t len, const agg_enrollment *en, dprec_agg_response *resp) {
    int post = 0;
    const int want_phase = route_phase(what, &post);
    if (want_phase < 0) return agg_respond_error(resp, 404, "not_found", "unknown secure-aggregation step");
    if (post != is_post) return agg_respond_error(resp, 405, "method_not_allowed", "wrong method for this path");
    if (r->phase != want_phase)
        return agg_respond_error(resp, 409, "wrong_phase", "the round's secure aggregation is in another phase");
    if (is_post && (len < 12 || dprec_ld64(body) != (uint64_t)r->round))
        return agg_respond_error(resp, 400, "bad_request", "the message is not for the open round");
    if (is_post && step_done(r, step_of(want_phase), id))
        return agg_respond_json(resp, 200, cJSON_CreateObject()); /* a re-send: taken already, nothing re-applied */
    int rc;
    if (strcmp(what, "keys") == 0) {
        if (len != DPREC_SECURE_KEYS_WIRE || dprec_ld32(body + 8) != id)
            return agg_respond_error(resp, 400, "bad_request",
                                     "keys: [round u64][id u32][c_pk 32][s_pk 32][sig 64], id = device");
        dprec_secagg_pub pub;
        pub.id = id;
        memcpy(pub.c_pk, body + 12, DPREC_SECAGG_KEY_SIZE);
        memcpy(pub.s_pk, body + 12 + DPREC_SECAGG_KEY_SIZE, DPREC_SECAGG_KEY_SIZE);
        agg_secagg_ident who;
        memset(&who, 0, sizeof who);
        memcpy(who.identity, en->identity, DPREC_IDENTITY_PK_SIZE);
        memcpy(who.sig, body + 12 + 2 * DPREC_SECAGG_KEY_SIZE, DPREC_IDENTITY_SIG_SIZE);
        who.token_len = en->token_len <= sizeof who.token ? en->token_len : 0;
        memcpy(who.token, en->token, who.token_len);
        rc = agg_secagg_advertise(r->sa, &pub, &who);
        if (rc == DPREC_ERR_CRYPTO)
            return agg_respond_error(resp, 400, "bad_signature",
                                     "keys: the signature does not verify under the device's enrolled identity");
        if (rc != DPREC_OK)
            return agg_respond_error(resp, 409, "refused", "keys refused (the round is full, or has this identity)");
        step_mark(r, STEP_KEYS, id);
        maybe_advance(a, r);
        return agg_respond_json(resp, 200, cJSON_CreateObject());
    }
    if (strcmp(what, "neighbours") == 0) return answer_neighbours(r, id, resp);
    if (strcmp(what, "shares") == 0) {
        uint32_t k = len >= 12 ? dprec_ld32(body + 8) : 0;
        if (k > DPREC_SECAGG_MAX_NEIGHBOURS || len != 12 + (size_t)k * DPREC_SECURE_ENVELOPE_WIRE)
            return agg_respond_error(resp, 400, "bad_request", "shares: [round u64][k u32] then k envelopes");
        dprec_secagg_envelope env[DPREC_SECAGG_MAX_NEIGHBOURS];
        for (uint32_t j = 0; j < k; j++) get_env(body + 12 + (size_t)j * DPREC_SECURE_ENVELOPE_WIRE, &env[j]);
        if (agg_secagg_put_shares(r->sa, id, env, k) != DPREC_OK)
            return agg_respond_error(resp, 409, "refused", "shares refused (not one per neighbour in order, or repeated)");
        step_mark(r, STEP_SHARES, id);
        maybe_advance(a, r);
        return agg_respond_json(resp, 200, cJSON_CreateObject());
    }
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
    if (strcmp(what, "survivors") == 0) {
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
    if (strcmp(what, "consistency") == 0) {
        if (len != DPREC_SECURE_CONSISTENCY_WIRE || dprec_ld32(body + 8) != id)
            return agg_respond_error(resp, 400, "bad_request", "consistency: [round u64][id u32][sig 64], id = device");
        rc = agg_secagg_attest(r->sa, id, body + 12);
        if (rc == DPREC_ERR_CRYPTO)
            return agg_respond_error(resp, 400, "bad_signature",
                                     "consistency: the signature of the survivor set does not verify");
        if (rc != DPREC_OK)
            return agg_respond_error(resp, 409, "not_in_round", "this device is not a survivor of this round");
        step_mark(r, STEP_ATTEST, id);
        maybe_advance(a, r);
        return agg_respond_json(resp, 200, cJSON_CreateObject());
    }
    if (strcmp(what, "requests") == 0) return answer_requests(r, id, resp);
    /* reveals */
    const size_t item = 16 + 4 * DPREC_SECAGG_CHUNKS;
    uint32_t n = len >= 12 ? dprec_ld32(body + 8) : 0;
    if (n > DPREC_SECAGG_MAX_NEIGHBOURS || len != 12 + (size_t)n * item)
        return agg_respond_error(resp, 400, "bad_request", "reveals: [round u64][n u32] then n reveals");
    dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS];
    for (uint32_t j = 0; j < n; j++) {
        const unsigned char *q = body + 12 + (size_t)j * item;
        rv[j].owner = dprec_ld32(q);
        rv[j].holder = dprec_ld32(q + 4);
        rv[j].kind = (dprec_secagg_kind)dprec_ld32(q + 8);
        rv[j].share.x = dprec_ld32(q + 12);
        for (uint32_t c = 0; c < DPREC_SECAGG_CHUNKS; c++) rv[j].share.y[c] = dprec_ld32(q + 16 + 4 * c);
    }
    if (agg_secagg_put_reveals(r->sa, id, rv, n) != DPREC_OK)
        return agg_respond_error(resp, 409, "refused", "reveals refused (not what was asked, or repeated)");
    step_mark(r, STEP_REVEALS, id);
    return agg_respond_json(resp, 200, cJSON_CreateObject());
}

int agg_secure_handle(dprec_agg *a, const agg_job *job, int64_t device, const char *what, int is_post,
                      const unsigned char *body, size_t len, dprec_agg_response *resp) {
    if (job->done) return agg_respond_error(resp, 409, "job_done", "the job has finished");
    if (!agg_secure_job(job, NULL)) return agg_respond_error(resp, 404, "not_found", "the job is not a secure one");
    if (device <= 0 || device > (int64_t)UINT32_MAX)
        return agg_respond_error(resp, 400, "bad_request", "device ids past 2^32 cannot take part");
    /* a device takes part only under the identity it enrolled: its keys are signed with it, and its neighbours check
     * that signature (and, with the app's enrollment key, its token) before they share anything */
    agg_enrollment en;
    memset(&en, 0, sizeof en);
    if (is_post && strcmp(what, "keys") == 0) {
        int found = agg_store_device_enrollment(a, device, &en);
        if (found < 0) return agg_respond_error(resp, 500, "internal", "state database error");
        if (found == 0 || !en.has_identity)
            return agg_respond_error(resp, 403, "identity_required",
                                     "a secure round takes only devices registered with an identity key");
    }
    pthread_mutex_lock(&a->secure->mu);
    secure_round *r = round_of(a, job);
    int rc = r == NULL ? agg_respond_error(resp, 500, "internal", "out of memory")
                       : handle_locked(a, r, (uint32_t)device, what, is_post, body, len, &en, resp);
    pthread_mutex_unlock(&a->secure->mu);
    return rc;
}

int agg_secure_report(dprec_agg *a, const agg_job *job, int64_t device, const dprec_envelope *e,
                      dprec_agg_response *resp) {
    if (job->done) return agg_respond_error(resp, 409, "job_done", "the job has finished");
    if (device <= 0 || device > (int64_t)UINT32_MAX)
        return agg_respond_error(resp, 400, "bad_report", "device ids past 2^32 cannot take part");
    pthread_mutex_lock(&a->secure->mu);
    secure_round *r = round_of(a, job);
    int rc;
    const unsigned char *p = e->payload;
    if (r == NULL) rc = agg_respond_error(resp, 500, "internal", "out of memory");
    else if (e->round == (uint64_t)r->round && r->phase >= SP_MASK && r->phase <= SP_DONE &&
             agg_secagg_masked_input(r->sa, (uint32_t)device) != NULL)
        rc = agg_respond_json(resp, 200, cJSON_CreateObject()); /* a re-sent report: taken already */
    else if (e->round != (uint64_t)r->round || r->phase != SP_MASK)
        rc = agg_respond_error(resp, 409, "round_closed", "the round takes no masked input now");
    else if (e->payload_len != DPREC_SECURE_PAYLOAD_SIZE(r->spec.plan.dim, r->spec.k) ||
             memcmp(p, DPREC_SECURE_PAYLOAD_MAGIC, 4) != 0 || dprec_ld32(p + 4) != (uint32_t)device ||
             dprec_ld32(p + 8) != r->spec.plan.dim || dprec_ld32(p + 12) != r->spec.plan.bits)
        rc = agg_respond_error(resp, 400, "bad_report",
                               "a secure job's report is [\"DSA2\"][id][dim][bits], dim residues and the signed "
                               "neighbours it masked with [m][k ids][sig]");
    else {
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
        int prc = DPREC_ERR_INVALID_ARGUMENT;
        if (y != NULL && ok && st_ok)
            prc = agg_secagg_put_masked(r->sa, (uint32_t)device, y, ids, m, tr + 4 + 4 * (size_t)r->spec.k);
        if (y == NULL) rc = agg_respond_error(resp, 500, "internal", "out of memory");
        else if (!ok) rc = agg_respond_error(resp, 400, "bad_report", "a residue is not below 2^bits");
        else if (prc == DPREC_ERR_INVALID_ARGUMENT)
            rc = agg_respond_error(resp, 400, "bad_report",
                                   "the neighbours it masked with are not its neighbours that shared, in increasing order");
        else if (prc == DPREC_ERR_CRYPTO)
            rc = agg_respond_error(resp, 400, "bad_signature",
                                   "the neighbours it masked with: the signature does not verify under its identity");
        else if (prc == DPREC_ERR_NO_MEMORY) rc = agg_respond_error(resp, 500, "internal", "out of memory");
        else if (prc != DPREC_OK)
            rc = agg_respond_error(resp, 409, "already_reported", "no masked input expected from this device");
        else {
            r->n_masked++;
            maybe_advance(a, r);
            rc = agg_respond_json(resp, 200, cJSON_CreateObject());
        }
        free(y);
    }
    pthread_mutex_unlock(&a->secure->mu);
    return rc;
}

int agg_secure_close(dprec_agg *a, const agg_job *job) {
    pthread_mutex_lock(&a->secure->mu);
    secure_round *r = round_of(a, job);
    int ready = 1;
    if (r != NULL && r->phase < SP_DONE) {
        close_phase(a, r);
        ready = r->phase >= SP_DONE;
    }
    pthread_mutex_unlock(&a->secure->mu);
    return ready;
}

int agg_secure_deadline(dprec_agg *a, const agg_job *job) {
    /* no state for the open round (nobody has looked at it since a restart): nobody can take part in it, and it is
     * finalized with no sum, the model unchanged */
    int ready = 1;
    pthread_mutex_lock(&a->secure->mu);
    secure_round *r = a->secure->head;
    while (r != NULL && !(r->job == job->id && r->round == job->round)) r = r->next;
    if (r != NULL) {
        /* whatever the count: the advertise phase with fewer than max(t, n_min) devices (none included) aborts, and
         * the round is then finalized with no sum; each later phase closes or aborts at its own deadline */
        if (r->phase < SP_DONE) close_phase(a, r);
        ready = r->phase >= SP_DONE;
    }
    pthread_mutex_unlock(&a->secure->mu);
    return ready;
}

double *agg_secure_take_sum(dprec_agg *a, int64_t job, int64_t round, uint32_t *survivors) {
    double *out = NULL;
    *survivors = 0;
    pthread_mutex_lock(&a->secure->mu);
    for (secure_round *r = a->secure->head; r != NULL; r = r->next) {
        if (r->job != job || r->round != round) continue;
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
    return out;
}
