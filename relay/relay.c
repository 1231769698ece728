/* dprec relay — the core (relay.h): state, routes, the round's sums. docs/protocol.md "The relay" is the contract.
 *
 * What it holds: its own device registrations (SHA-256 of each token), the jobs an operator created on it (their
 * shape: mode, m, the numbers per item, K, the most shares a round takes, rounds), and per open round the public seed
 * it drew for it (the devices' H, never served to anyone but a registered device) and the running sums mod 2^64 of
 * the shares it accepted, with the report id of each. What it never holds: a gradient in the clear (every number is
 * masked by a key the device drew and gave the recommender only), or anything of the recommender's.
 *
 * Every change goes through one writer thread: a batch of operations (shares, registrations, round openings and
 * closings) is applied in one transaction, and each request is answered only once the transaction committed
 * (synchronous=FULL): a share is acknowledged only when it is durable, a retry of an acknowledged share is recognized by
 * its report id, and a kill -9 loses nothing that was acknowledged. The sums in memory change only after a commit.
 *
 * Static mode ("relay"): a round closes once exactly K shares (K = the job's cohort) arrived; more are refused. Dynamic
 * mode: each share carries a gradient vector Phi and a noise vector tau; the first K shares to commit make the round's
 * noise total (their tau), every share's Phi goes into the gradient sum, and at close the relay adds alpha (its own
 * mask, from a seed it keeps) to the noise sum and takes it off the gradient sum, as the paper's Scenario 3 does.
 * Closing signs the round's sums with the relay's key (common/protocols/dpmf.h has the layout). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <mbedtls/pk.h>
#include <sqlite3.h>

#include "core/agg_priv.h"
#include "bytes.h"
#include "dpmf.h"
#include "dprec/status.h"
#include "mbedtls_compat.h"
#include "relay.h"
#include "report.h"

#define RELAY_SCHEMA_VERSION 1
#define PENDING 1

/* ---- the state in memory ------------------------------------------------------------------------------------- */

typedef struct rjob {
    int64_t id;
    int mode;
    uint32_t m, coords, shares, max_shares;
    int64_t rounds, round; /* round: the open one (rounds + 1 once done) */
    int has_seed;
    unsigned char seed[DPREC_DPMF_SEED_SIZE], alpha_seed[DPREC_DPMF_SEED_SIZE];
    uint64_t *grad, *noise; /* the open round's committed sums (noise: dynamic only) */
    uint32_t n_grad, n_noise; /* committed shares: all of them (gradient), and those whose noise is in the total */
} rjob;

typedef struct tok_slot {
    unsigned char h[32];
    int64_t id; /* 0: empty */
} tok_slot;

typedef enum op_kind { OP_REGISTER, OP_JOB_CREATE, OP_ROUND_OPEN, OP_SHARE, OP_CLOSE } op_kind;

typedef struct relay_op {
    op_kind kind;
    struct relay_op *next;
    int64_t job, round, device;
    unsigned char token_hash[32];
    unsigned char report_id[16];
    const unsigned char *payload; /* OP_SHARE: the share's payload (the request's body) */
    cJSON *spec;                  /* OP_JOB_CREATE */
    dprec_agg_response *resp;
    dprec_agg_done_fn done;
    void *user;
} relay_op;

typedef struct relay_metrics {
    uint64_t shares_accepted, shares_duplicate, registrations, rounds_closed, commits;
    uint64_t refused[8];
} relay_metrics;
static const char *const refusal_names[8] = {"bad_report", "unauthorized", "round_closed", "already_reported",
                                             "cohort_full", "not_found", "too_large", "other"};

struct dprec_relay {
    dprec_relay_config cfg;
    char *admin_token;
    sqlite3 *db;                /* the writer's (and, at open, the loader's) */
    pthread_mutex_t mu;         /* jobs, tokens, metrics */
    rjob **jobs;
    size_t njobs;
    tok_slot *tok;
    size_t tok_cap, tok_n;
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    relay_op *q_head, *q_tail;
    int stopping, writer_running;
    pthread_t writer;
    int64_t seq;                /* the writer's: the last share's sequence number (arrival order within a round) */
    pthread_mutex_t rng_mu, sign_mu;
    dprec_rng rng;
    mbedtls_pk_context key;
    unsigned char pub_der[160];
    size_t pub_der_len;
    relay_metrics met;
};

static void relay_log(dprec_relay *r, const char *level, const char *event, const char *msg) {
    if (r->cfg.log == NULL) return;
    cJSON *o = cJSON_CreateObject();
    char ts[40];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof ts - n, ".%03ldZ", now.tv_nsec / 1000000L);
    cJSON_AddStringToObject(o, "ts", ts);
    cJSON_AddStringToObject(o, "level", level);
    cJSON_AddStringToObject(o, "event", event);
    cJSON_AddStringToObject(o, "message", msg);
    char *line = cJSON_PrintUnformatted(o);
    if (line != NULL) r->cfg.log(r->cfg.log_user, line);
    free(line);
    cJSON_Delete(o);
}

static int relay_random(void *ctx, unsigned char *out, size_t len) {
    dprec_relay *r = ctx;
    pthread_mutex_lock(&r->rng_mu);
    int rc = dprec_rng_bytes(&r->rng, out, len);
    pthread_mutex_unlock(&r->rng_mu);
    return rc == DPREC_OK ? 0 : -1;
}

static rjob *job_find(dprec_relay *r, int64_t id) {
    for (size_t i = 0; i < r->njobs; i++)
        if (r->jobs[i]->id == id) return r->jobs[i];
    return NULL;
}

static void job_free(rjob *j) {
    if (j == NULL) return;
    free(j->grad);
    free(j->noise);
    dprec_wipe(j->seed, sizeof j->seed);
    dprec_wipe(j->alpha_seed, sizeof j->alpha_seed);
    free(j);
}

static size_t cells(const rjob *j) {
    return (size_t)j->m * j->coords;
}

/* ---- device tokens (SHA-256) in memory: open addressing ------------------------------------------------------ */

static size_t tok_index(const unsigned char h[32], size_t cap) {
    uint64_t x = dprec_ld64(h);
    return (size_t)(x % cap);
}

static int tok_put(dprec_relay *r, const unsigned char h[32], int64_t id) {
    if ((r->tok_n + 1) * 2 > r->tok_cap) {
        size_t ncap = r->tok_cap ? r->tok_cap * 2 : 1024;
        tok_slot *nt = calloc(ncap, sizeof *nt);
        if (nt == NULL) return -1;
        for (size_t i = 0; i < r->tok_cap; i++)
            if (r->tok[i].id != 0) {
                size_t k = tok_index(r->tok[i].h, ncap);
                while (nt[k].id != 0) k = (k + 1) % ncap;
                nt[k] = r->tok[i];
            }
        free(r->tok);
        r->tok = nt;
        r->tok_cap = ncap;
    }
    size_t k = tok_index(h, r->tok_cap);
    while (r->tok[k].id != 0) k = (k + 1) % r->tok_cap;
    memcpy(r->tok[k].h, h, 32);
    r->tok[k].id = id;
    r->tok_n++;
    return 0;
}

static int64_t tok_get(dprec_relay *r, const unsigned char h[32]) {
    if (r->tok_cap == 0) return 0;
    size_t k = tok_index(h, r->tok_cap);
    while (r->tok[k].id != 0) {
        if (memcmp(r->tok[k].h, h, 32) == 0) return r->tok[k].id;
        k = (k + 1) % r->tok_cap;
    }
    return 0;
}

/* The device a request's bearer token names (0: none). */
static int64_t device_of(dprec_relay *r, const char *authorization) {
    const char *t = agg_bearer(authorization);
    unsigned char h[32];
    if (t == NULL || dprec_sha256((const unsigned char *)t, strlen(t), h) != 0) return 0;
    pthread_mutex_lock(&r->mu);
    int64_t id = tok_get(r, h);
    pthread_mutex_unlock(&r->mu);
    return id;
}

static int admin_ok(dprec_relay *r, const char *authorization) {
    const char *t = agg_bearer(authorization);
    unsigned char h1[32], h2[32];
    if (t == NULL || dprec_sha256((const unsigned char *)t, strlen(t), h1) != 0 ||
        dprec_sha256((const unsigned char *)r->admin_token, strlen(r->admin_token), h2) != 0)
        return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < 32; i++) diff |= (unsigned char)(h1[i] ^ h2[i]);
    return diff == 0;
}

/* ---- SQLite ------------------------------------------------------------------------------------------------ */

static int exec_sql(sqlite3 *db, const char *sql) {
    return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS devices (id INTEGER PRIMARY KEY, token_hash BLOB NOT NULL UNIQUE, created INTEGER);"
    "CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, mode INTEGER, m INTEGER, coords INTEGER, shares INTEGER,"
    " max_shares INTEGER, rounds INTEGER, round INTEGER);"
    "CREATE TABLE IF NOT EXISTS rounds (job INTEGER, round INTEGER, seed BLOB, alpha_seed BLOB, grad BLOB, noise BLOB,"
    " n_grad INTEGER, n_noise INTEGER, PRIMARY KEY (job, round));"
    "CREATE TABLE IF NOT EXISTS shares (job INTEGER, round INTEGER, report_id BLOB, device INTEGER, noise INTEGER,"
    " seq INTEGER, PRIMARY KEY (job, report_id), UNIQUE (job, round, device));"
    "CREATE TABLE IF NOT EXISTS sums (job INTEGER, round INTEGER, body BLOB, PRIMARY KEY (job, round));";

static int load_state(dprec_relay *r, char *err, size_t errcap) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(r->db, "SELECT id, token_hash FROM devices", -1, &st, NULL) != SQLITE_OK) goto fail;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (sqlite3_column_bytes(st, 1) != 32 || tok_put(r, sqlite3_column_blob(st, 1), sqlite3_column_int64(st, 0)) != 0)
            goto fail;
    }
    sqlite3_finalize(st);
    if (sqlite3_prepare_v2(r->db, "SELECT COALESCE(MAX(seq), 0) FROM shares", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW)
        goto fail;
    r->seq = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (sqlite3_prepare_v2(r->db, "SELECT id, mode, m, coords, shares, max_shares, rounds, round FROM jobs ORDER BY id",
                           -1, &st, NULL) != SQLITE_OK)
        goto fail;
    while (sqlite3_step(st) == SQLITE_ROW) {
        rjob *j = calloc(1, sizeof *j);
        rjob **nj = realloc(r->jobs, (r->njobs + 1) * sizeof *nj);
        if (j == NULL || nj == NULL) {
            free(j);
            goto fail;
        }
        r->jobs = nj;
        r->jobs[r->njobs++] = j;
        j->id = sqlite3_column_int64(st, 0);
        j->mode = sqlite3_column_int(st, 1);
        j->m = (uint32_t)sqlite3_column_int64(st, 2);
        j->coords = (uint32_t)sqlite3_column_int64(st, 3);
        j->shares = (uint32_t)sqlite3_column_int64(st, 4);
        j->max_shares = (uint32_t)sqlite3_column_int64(st, 5);
        j->rounds = sqlite3_column_int64(st, 6);
        j->round = sqlite3_column_int64(st, 7);
        j->grad = calloc(cells(j), sizeof(uint64_t));
        j->noise = j->mode == DPREC_DPMF_DYNAMIC ? calloc(cells(j), sizeof(uint64_t)) : NULL;
        if (j->grad == NULL || (j->mode == DPREC_DPMF_DYNAMIC && j->noise == NULL)) goto fail;
    }
    sqlite3_finalize(st);
    st = NULL;
    for (size_t i = 0; i < r->njobs; i++) { /* the open rounds' sums, as committed */
        rjob *j = r->jobs[i];
        if (sqlite3_prepare_v2(r->db, "SELECT seed, alpha_seed, grad, noise, n_grad, n_noise FROM rounds WHERE job = ? AND round = ?",
                               -1, &st, NULL) != SQLITE_OK)
            goto fail;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        if (sqlite3_step(st) == SQLITE_ROW) {
            size_t v = cells(j) * 8u;
            if (sqlite3_column_bytes(st, 0) != 32 || sqlite3_column_bytes(st, 1) != 32 ||
                (size_t)sqlite3_column_bytes(st, 2) != v ||
                (j->noise != NULL && (size_t)sqlite3_column_bytes(st, 3) != v))
                goto fail;
            memcpy(j->seed, sqlite3_column_blob(st, 0), 32);
            memcpy(j->alpha_seed, sqlite3_column_blob(st, 1), 32);
            const unsigned char *g = sqlite3_column_blob(st, 2);
            for (size_t c = 0; c < cells(j); c++) j->grad[c] = dprec_ld64(g + 8 * c);
            if (j->noise != NULL) {
                const unsigned char *nz = sqlite3_column_blob(st, 3);
                for (size_t c = 0; c < cells(j); c++) j->noise[c] = dprec_ld64(nz + 8 * c);
            }
            j->n_grad = (uint32_t)sqlite3_column_int64(st, 4);
            j->n_noise = (uint32_t)sqlite3_column_int64(st, 5);
            j->has_seed = 1;
        }
        sqlite3_finalize(st);
        st = NULL;
    }
    return 0;
fail:
    if (st != NULL) sqlite3_finalize(st);
    snprintf(err, errcap, "cannot load the relay's state: %s", sqlite3_errmsg(r->db));
    return -1;
}

/* ---- the writer -------------------------------------------------------------------------------------------- */

static void complete(relay_op *op) {
    op->done(op->user);
}

static unsigned char *vec_blob(const uint64_t *v, size_t n) {
    unsigned char *b = malloc(n * 8u > 0 ? n * 8u : 1);
    if (b != NULL)
        for (size_t c = 0; c < n; c++) dprec_st64(b + 8 * c, v[c]);
    return b;
}

/* A batch's view of a job's open round: the sums it will commit (copies of the committed ones, then the batch's
 * shares added). */
typedef struct scratch {
    rjob *job;
    uint64_t *grad, *noise;
    uint32_t n_grad, n_noise;
    int opened; /* the batch opened the round (its seed) */
    unsigned char seed[32], alpha_seed[32];
    int closed; /* the batch closed the round */
} scratch;

static scratch *scratch_of(scratch *sc, size_t *nsc, size_t cap, rjob *j) {
    for (size_t i = 0; i < *nsc; i++)
        if (sc[i].job == j) return &sc[i];
    if (*nsc == cap) return NULL;
    scratch *s = &sc[(*nsc)++];
    memset(s, 0, sizeof *s);
    s->job = j;
    s->n_grad = j->n_grad;
    s->n_noise = j->n_noise;
    return s;
}

static int scratch_vectors(scratch *s) {
    rjob *j = s->job;
    if (s->grad != NULL) return 0;
    s->grad = malloc(cells(j) * sizeof(uint64_t));
    s->noise = j->noise != NULL ? malloc(cells(j) * sizeof(uint64_t)) : NULL;
    if (s->grad == NULL || (j->noise != NULL && s->noise == NULL)) return -1;
    memcpy(s->grad, j->grad, cells(j) * sizeof(uint64_t));
    if (j->noise != NULL) memcpy(s->noise, j->noise, cells(j) * sizeof(uint64_t));
    return 0;
}

static int reply_share(relay_op *op, int status, const char *code, const char *msg, int duplicate, int64_t round) {
    if (code != NULL) return agg_respond_error(op->resp, status, code, msg);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "accepted", 1);
    cJSON_AddBoolToObject(o, "duplicate", duplicate);
    cJSON_AddNumberToObject(o, "round", (double)round);
    return agg_respond_json(op->resp, 200, o);
}

/* The signed sum of a closed round (common/protocols/dpmf.h: DPREC_DPMF_MAGIC_SUM), malloc'd. */
static unsigned char *build_sum(dprec_relay *r, rjob *j, const scratch *s, size_t *len) {
    sqlite3_stmt *st = NULL;
    uint32_t ng = s->n_grad, nn = j->mode == DPREC_DPMF_DYNAMIC ? s->n_noise : s->n_grad;
    size_t total = dprec_dpmf_sum_size(j->mode, j->m, j->coords, ng, nn, DPREC_DPMF_SIG_MAX);
    unsigned char *b = malloc(total);
    if (b == NULL) return NULL;
    memcpy(b, DPREC_DPMF_MAGIC_SUM, 4);
    dprec_st32(b + 4, 1u);
    dprec_st32(b + 8, (uint32_t)j->mode);
    dprec_st32(b + 12, j->coords);
    dprec_st64(b + 16, (uint64_t)j->id);
    dprec_st64(b + 24, (uint64_t)j->round);
    dprec_st32(b + 32, j->m);
    dprec_st32(b + 36, ng);
    dprec_st32(b + 40, nn);
    unsigned char *p = b + DPREC_DPMF_SUM_HEADER;
    dprec_dpmf_prg alpha;
    int dyn = j->mode == DPREC_DPMF_DYNAMIC;
    if (dyn && dprec_dpmf_prg_init(&alpha, s->alpha_seed, DPREC_DPMF_DOMAIN_ALPHA) != 0) {
        free(b);
        return NULL;
    }
    for (size_t c = 0; c < cells(j); c++) { /* dynamic: Phi - alpha, then alpha + tau (the paper's Scenario 3) */
        uint64_t a = 0;
        if (dyn && dprec_dpmf_prg_u64(&alpha, c, &a) != 0) a = 0;
        dprec_st64(p + 8 * c, s->grad[c] - a);
        if (dyn) dprec_st64(p + 8 * (cells(j) + c), s->noise[c] + a);
    }
    if (dyn) dprec_dpmf_prg_free(&alpha);
    p += 8u * cells(j) * (dyn ? 2u : 1u);
    for (int pass = 0; pass < (dyn ? 2 : 1); pass++) {
        const char *sql = pass == 0 ? "SELECT report_id FROM shares WHERE job = ? AND round = ? ORDER BY seq"
                                    : "SELECT report_id FROM shares WHERE job = ? AND round = ? AND noise = 1 ORDER BY seq";
        uint32_t want = pass == 0 ? ng : nn, got = 0;
        if (sqlite3_prepare_v2(r->db, sql, -1, &st, NULL) != SQLITE_OK) goto fail;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        while (sqlite3_step(st) == SQLITE_ROW && got < want) {
            if (sqlite3_column_bytes(st, 0) != 16) goto fail;
            memcpy(p, sqlite3_column_blob(st, 0), 16);
            p += 16;
            got++;
        }
        sqlite3_finalize(st);
        st = NULL;
        if (got != want) goto fail;
    }
    /* the signature covers its own length field: sign until the length written is the length signed */
    unsigned char digest[32];
    size_t signed_len = (size_t)(p - b), sig_len = 0, want = DPREC_DPMF_SIG_MAX;
    for (int pass = 0; pass < 64; pass++) {
        dprec_st32(b + 44, (uint32_t)want);
        if (dprec_sha256(b, signed_len, digest) != 0 ||
            agg_sign_digest(&r->key, &r->sign_mu, relay_random, r, digest, p, DPREC_DPMF_SIG_MAX, &sig_len) != 0)
            goto fail;
        if (sig_len == want) {
            *len = signed_len + sig_len;
            return b;
        }
        want = sig_len;
    }
fail:
    if (st != NULL) sqlite3_finalize(st);
    free(b);
    return NULL;
}

/* Applies one operation inside the batch's transaction. 0, or -1 on a database failure (the batch is rolled back). The
 * answer goes into op->resp either way (a database failure: 500, set by the caller). */
static int apply(dprec_relay *r, relay_op *op, scratch *sc, size_t *nsc, size_t sccap, int64_t *seq) {
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (op->kind == OP_REGISTER) {
        if (sqlite3_prepare_v2(r->db, "INSERT INTO devices (token_hash, created) VALUES (?, ?)", -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_blob(st, 1, op->token_hash, 32, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 2, (int64_t)time(NULL));
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
        op->device = rc == 0 ? sqlite3_last_insert_rowid(r->db) : 0;
        return rc;
    }
    if (op->kind == OP_JOB_CREATE) {
        const cJSON *s = op->spec;
        int64_t id = (int64_t)cJSON_GetObjectItem(s, "job")->valuedouble;
        pthread_mutex_lock(&r->mu);
        int exists = job_find(r, id) != NULL;
        pthread_mutex_unlock(&r->mu);
        if (exists) {
            agg_respond_error(op->resp, 409, "job_exists", "the relay already runs a job with this id");
            return 0;
        }
        if (sqlite3_prepare_v2(r->db, "INSERT INTO jobs (id, mode, m, coords, shares, max_shares, rounds, round) VALUES "
                                      "(?, ?, ?, ?, ?, ?, ?, 1)", -1, &st, NULL) != SQLITE_OK)
            return -1;
        const char *names[] = {"job", "mode", "m", "coords", "shares", "max_shares", "rounds"};
        for (int i = 0; i < 7; i++) sqlite3_bind_int64(st, i + 1, (int64_t)cJSON_GetObjectItem(s, names[i])->valuedouble);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
        if (rc == 0) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "job", (double)id);
            agg_respond_json(op->resp, 201, o);
        }
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    rjob *j = job_find(r, op->job);
    pthread_mutex_unlock(&r->mu);
    scratch *s = j != NULL ? scratch_of(sc, nsc, sccap, j) : NULL;
    if (j == NULL || s == NULL) {
        agg_respond_error(op->resp, j == NULL ? 404 : 503, j == NULL ? "not_found" : "busy", "no such job, or try again");
        return 0;
    }
    int has_seed = j->has_seed || s->opened;
    if (s->closed || op->round != j->round) {
        if (op->kind == OP_CLOSE && op->round < j->round) { /* closed before: its stored sum again (idempotent) */
            if (sqlite3_prepare_v2(r->db, "SELECT body FROM sums WHERE job = ? AND round = ?", -1, &st, NULL) != SQLITE_OK)
                return -1;
            sqlite3_bind_int64(st, 1, j->id);
            sqlite3_bind_int64(st, 2, op->round);
            if (sqlite3_step(st) == SQLITE_ROW) {
                size_t n = (size_t)sqlite3_column_bytes(st, 0);
                unsigned char *b = malloc(n > 0 ? n : 1);
                if (b != NULL) memcpy(b, sqlite3_column_blob(st, 0), n);
                op->resp->status = 200;
                op->resp->content_type = "application/octet-stream";
                op->resp->body = b;
                op->resp->body_len = b != NULL ? n : 0;
            } else {
                agg_respond_error(op->resp, 404, "not_found", "no sum for that round");
            }
            sqlite3_finalize(st);
            return 0;
        }
        agg_respond_error(op->resp, 409, "round_closed", "that round is not the relay's open round for this job");
        return 0;
    }
    if (op->kind == OP_ROUND_OPEN) {
        if (!has_seed) {
            if (relay_random(r, s->seed, 32) != 0 || relay_random(r, s->alpha_seed, 32) != 0) return -1;
            if (sqlite3_prepare_v2(r->db, "INSERT INTO rounds (job, round, seed, alpha_seed, grad, noise, n_grad, n_noise) "
                                          "VALUES (?, ?, ?, ?, zeroblob(?), zeroblob(?), 0, 0)", -1, &st, NULL) != SQLITE_OK)
                return -1;
            sqlite3_bind_int64(st, 1, j->id);
            sqlite3_bind_int64(st, 2, j->round);
            sqlite3_bind_blob(st, 3, s->seed, 32, SQLITE_TRANSIENT);
            sqlite3_bind_blob(st, 4, s->alpha_seed, 32, SQLITE_TRANSIENT);
            sqlite3_bind_int64(st, 5, (int64_t)(cells(j) * 8u));
            sqlite3_bind_int64(st, 6, j->noise != NULL ? (int64_t)(cells(j) * 8u) : 0);
            rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
            sqlite3_finalize(st);
            if (rc != 0) return -1;
            s->opened = 1;
        }
        return 0; /* answered by the caller from the committed seed */
    }
    if (op->kind == OP_SHARE) {
        if (!has_seed) {
            agg_respond_error(op->resp, 409, "round_not_open", "fetch the round (GET /v1/jobs/{job}/rounds/{round}) first");
            return 0;
        }
        /* a retry of a stored share: the same answer; another share of the device in the round: refused */
        if (sqlite3_prepare_v2(r->db, "SELECT device, round FROM shares WHERE job = ? AND report_id = ?", -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_blob(st, 2, op->report_id, 16, SQLITE_TRANSIENT);
        int found = sqlite3_step(st) == SQLITE_ROW;
        int64_t dev = found ? sqlite3_column_int64(st, 0) : 0, rnd = found ? sqlite3_column_int64(st, 1) : 0;
        sqlite3_finalize(st);
        if (found) {
            if (dev == op->device) reply_share(op, 200, NULL, NULL, 1, rnd);
            else agg_respond_error(op->resp, 409, "already_reported", "that report id belongs to another device");
            if (dev == op->device) {
                pthread_mutex_lock(&r->mu);
                r->met.shares_duplicate++;
                pthread_mutex_unlock(&r->mu);
            }
            return 0;
        }
        if (sqlite3_prepare_v2(r->db, "SELECT 1 FROM shares WHERE job = ? AND round = ? AND device = ?", -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        sqlite3_bind_int64(st, 3, op->device);
        found = sqlite3_step(st) == SQLITE_ROW;
        sqlite3_finalize(st);
        if (found) {
            agg_respond_error(op->resp, 409, "already_reported", "this device already sent a share in this round");
            return 0;
        }
        uint32_t cap = j->mode == DPREC_DPMF_RELAY ? j->shares : j->max_shares;
        if (s->n_grad >= cap) {
            agg_respond_error(op->resp, 409, "cohort_full", "the round already has all the shares it takes");
            return 0;
        }
        if (scratch_vectors(s) != 0) return -1;
        const unsigned char *phi = op->payload + 16, *tau = phi + 8u * cells(j);
        for (size_t c = 0; c < cells(j); c++) s->grad[c] += dprec_ld64(phi + 8 * c);
        int noise = j->mode == DPREC_DPMF_RELAY || s->n_noise < j->shares; /* dynamic: the first K shares' noise */
        if (j->mode == DPREC_DPMF_DYNAMIC && noise)
            for (size_t c = 0; c < cells(j); c++) s->noise[c] += dprec_ld64(tau + 8 * c);
        if (sqlite3_prepare_v2(r->db, "INSERT INTO shares (job, round, report_id, device, noise, seq) VALUES (?, ?, ?, ?, ?, ?)",
                               -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        sqlite3_bind_blob(st, 3, op->report_id, 16, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 4, op->device);
        sqlite3_bind_int(st, 5, noise);
        sqlite3_bind_int64(st, 6, ++*seq);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
        if (rc != 0) return -1;
        s->n_grad++;
        if (noise) s->n_noise++;
        reply_share(op, 200, NULL, NULL, 0, j->round);
        return 0;
    }
    /* OP_CLOSE */
    if (!has_seed) {
        agg_respond_error(op->resp, 409, "round_empty", "no device fetched this round yet: nothing to close");
        return 0;
    }
    if ((j->mode == DPREC_DPMF_RELAY && s->n_grad != j->shares) || (j->mode == DPREC_DPMF_DYNAMIC && s->n_noise < j->shares)) {
        char msg[160];
        snprintf(msg, sizeof msg, "the round has %u shares (%u with noise) and needs %u %s", s->n_grad, s->n_noise,
                 j->shares, j->mode == DPREC_DPMF_RELAY ? "(the cohort)" : "with noise");
        agg_respond_error(op->resp, 409, "round_incomplete", msg);
        return 0;
    }
    if (scratch_vectors(s) != 0) return -1;
    if (!s->opened) memcpy(s->alpha_seed, j->alpha_seed, 32); /* the round's alpha (opened in an earlier batch) */
    size_t len = 0;
    unsigned char *sum = build_sum(r, j, s, &len);
    if (sum == NULL) return -1;
    if (sqlite3_prepare_v2(r->db, "INSERT INTO sums (job, round, body) VALUES (?, ?, ?)", -1, &st, NULL) != SQLITE_OK) {
        free(sum);
        return -1;
    }
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int64(st, 2, j->round);
    sqlite3_bind_blob(st, 3, sum, (int)len, SQLITE_TRANSIENT);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
    sqlite3_finalize(st);
    if (rc == 0 && (sqlite3_prepare_v2(r->db, "UPDATE jobs SET round = round + 1 WHERE id = ?", -1, &st, NULL) != SQLITE_OK))
        rc = -1;
    if (rc == 0) {
        sqlite3_bind_int64(st, 1, j->id);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
    }
    if (rc == 0 && sqlite3_prepare_v2(r->db, "DELETE FROM rounds WHERE job = ? AND round = ?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
    }
    if (rc != 0) {
        free(sum);
        return -1;
    }
    s->closed = 1;
    op->resp->status = 200;
    op->resp->content_type = "application/octet-stream";
    op->resp->body = sum;
    op->resp->body_len = len;
    return 0;
}

static int write_round(dprec_relay *r, scratch *s) {
    rjob *j = s->job;
    if (s->closed || s->grad == NULL) return 0; /* a closed round's row is gone; an opened round's row is written */
    sqlite3_stmt *st = NULL;
    unsigned char *g = vec_blob(s->grad, cells(j)), *n = s->noise != NULL ? vec_blob(s->noise, cells(j)) : NULL;
    int rc = -1;
    if (g != NULL && (s->noise == NULL || n != NULL) &&
        sqlite3_prepare_v2(r->db, "UPDATE rounds SET grad = ?, noise = ?, n_grad = ?, n_noise = ? WHERE job = ? AND round = ?",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_blob(st, 1, g, (int)(cells(j) * 8u), SQLITE_STATIC);
        if (n != NULL) sqlite3_bind_blob(st, 2, n, (int)(cells(j) * 8u), SQLITE_STATIC);
        else sqlite3_bind_zeroblob(st, 2, 0);
        sqlite3_bind_int64(st, 3, s->n_grad);
        sqlite3_bind_int64(st, 4, s->n_noise);
        sqlite3_bind_int64(st, 5, j->id);
        sqlite3_bind_int64(st, 6, j->round);
        rc = sqlite3_step(st) == SQLITE_DONE && sqlite3_changes(r->db) == 1 ? 0 : -1;
        sqlite3_finalize(st);
    }
    free(g);
    free(n);
    return rc;
}

static void *writer_main(void *arg) {
    dprec_relay *r = arg;
    enum { SC = 64 };
    scratch sc[SC];
    for (;;) {
        pthread_mutex_lock(&r->q_mu);
        while (r->q_head == NULL && !r->stopping) pthread_cond_wait(&r->q_cv, &r->q_mu);
        relay_op *batch = r->q_head;
        r->q_head = r->q_tail = NULL;
        int stop = r->stopping && batch == NULL;
        pthread_mutex_unlock(&r->q_mu);
        if (stop) break;
        size_t nsc = 0;
        int64_t seq = r->seq;
        int ok = exec_sql(r->db, "BEGIN IMMEDIATE") == 0;
        for (relay_op *op = batch; ok && op != NULL; op = op->next) ok = apply(r, op, sc, &nsc, SC, &seq) == 0;
        for (size_t i = 0; ok && i < nsc; i++) ok = write_round(r, &sc[i]) == 0;
        ok = ok && exec_sql(r->db, "COMMIT") == 0;
        if (!ok) {
            relay_log(r, "error", "commit_failed", sqlite3_errmsg(r->db));
            exec_sql(r->db, "ROLLBACK");
        }
        for (size_t i = 0; ok && i < nsc; i++)
            if (sc[i].closed) {
                char msg[160];
                snprintf(msg, sizeof msg, "job %lld round %lld closed with %u shares (%u with noise); its sum is signed",
                         (long long)sc[i].job->id, (long long)sc[i].job->round, sc[i].n_grad, sc[i].n_noise);
                relay_log(r, "info", "round_closed", msg);
            }
        pthread_mutex_lock(&r->mu);
        if (ok) {
            r->seq = seq;
            r->met.commits++;
            for (size_t i = 0; i < nsc; i++) { /* the committed state becomes the state in memory */
                scratch *s = &sc[i];
                rjob *j = s->job;
                if (s->opened) {
                    memcpy(j->seed, s->seed, 32);
                    memcpy(j->alpha_seed, s->alpha_seed, 32);
                    j->has_seed = 1;
                }
                if (s->closed) {
                    j->round++;
                    j->has_seed = 0;
                    memset(j->grad, 0, cells(j) * sizeof(uint64_t));
                    if (j->noise != NULL) memset(j->noise, 0, cells(j) * sizeof(uint64_t));
                    j->n_grad = j->n_noise = 0;
                    r->met.rounds_closed++;
                } else if (s->grad != NULL) {
                    memcpy(j->grad, s->grad, cells(j) * sizeof(uint64_t));
                    if (j->noise != NULL) memcpy(j->noise, s->noise, cells(j) * sizeof(uint64_t));
                    r->met.shares_accepted += s->n_grad - j->n_grad;
                    j->n_grad = s->n_grad;
                    j->n_noise = s->n_noise;
                }
            }
            for (relay_op *op = batch; op != NULL; op = op->next) {
                if (op->kind == OP_REGISTER) {
                    if (tok_put(r, op->token_hash, op->device) != 0) op->device = 0;
                    r->met.registrations++;
                } else if (op->kind == OP_JOB_CREATE && op->resp->status == 201) {
                    const cJSON *s = op->spec;
                    rjob *j = calloc(1, sizeof *j);
                    rjob **nj = realloc(r->jobs, (r->njobs + 1) * sizeof *nj);
                    if (nj != NULL) r->jobs = nj;
                    if (j != NULL && nj != NULL) {
                        j->id = (int64_t)cJSON_GetObjectItem(s, "job")->valuedouble;
                        j->mode = (int)cJSON_GetObjectItem(s, "mode")->valuedouble;
                        j->m = (uint32_t)cJSON_GetObjectItem(s, "m")->valuedouble;
                        j->coords = (uint32_t)cJSON_GetObjectItem(s, "coords")->valuedouble;
                        j->shares = (uint32_t)cJSON_GetObjectItem(s, "shares")->valuedouble;
                        j->max_shares = (uint32_t)cJSON_GetObjectItem(s, "max_shares")->valuedouble;
                        j->rounds = (int64_t)cJSON_GetObjectItem(s, "rounds")->valuedouble;
                        j->round = 1;
                        j->grad = calloc(cells(j), sizeof(uint64_t));
                        j->noise = j->mode == DPREC_DPMF_DYNAMIC ? calloc(cells(j), sizeof(uint64_t)) : NULL;
                        r->jobs[r->njobs++] = j;
                    } else {
                        free(j);
                    }
                }
            }
        }
        pthread_mutex_unlock(&r->mu);
        for (size_t i = 0; i < nsc; i++) {
            free(sc[i].grad);
            free(sc[i].noise);
            dprec_wipe(sc[i].seed, 32);
            dprec_wipe(sc[i].alpha_seed, 32);
        }
        while (batch != NULL) {
            relay_op *next = batch->next;
            if (!ok) {
                dprec_agg_response_free(batch->resp);
                agg_respond_error(batch->resp, 500, "internal", "the relay's state could not be written");
            }
            complete(batch);
            batch = next;
        }
    }
    return NULL;
}

static void submit(dprec_relay *r, relay_op *op) {
    pthread_mutex_lock(&r->q_mu);
    if (r->stopping) {
        pthread_mutex_unlock(&r->q_mu);
        agg_respond_error(op->resp, 503, "shutting_down", "the relay is stopping");
        complete(op);
        return;
    }
    op->next = NULL;
    if (r->q_tail != NULL) r->q_tail->next = op;
    else r->q_head = op;
    r->q_tail = op;
    pthread_cond_signal(&r->q_cv);
    pthread_mutex_unlock(&r->q_mu);
}

/* ---- open / close --------------------------------------------------------------------------------------- */

void dprec_relay_config_default(dprec_relay_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->max_json_body = 4096;
    cfg->max_share_body = (size_t)32 << 20;
    cfg->sync_full = 1;
}


int dprec_relay_open(const dprec_relay_config *cfg, dprec_relay **out, char *err, size_t errcap) {
    *out = NULL;
    if (cfg == NULL || cfg->state_path == NULL || cfg->signing_key_path == NULL || cfg->admin_token == NULL ||
        strlen(cfg->admin_token) < 16) {
        snprintf(err, errcap, "state_path, signing_key_path and an admin_token of at least 16 characters are required");
        return -1;
    }
    dprec_relay *r = calloc(1, sizeof *r);
    if (r == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    r->cfg = *cfg;
    if (r->cfg.max_json_body == 0) r->cfg.max_json_body = 4096;
    if (r->cfg.max_share_body == 0) r->cfg.max_share_body = (size_t)32 << 20;
    r->admin_token = strdup(cfg->admin_token);
    r->cfg.admin_token = r->admin_token;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->q_mu, NULL);
    pthread_cond_init(&r->q_cv, NULL);
    pthread_mutex_init(&r->rng_mu, NULL);
    pthread_mutex_init(&r->sign_mu, NULL);
    mbedtls_pk_init(&r->key);
    int rc;
    if (cfg->seed != 0) {
        unsigned char seed[8];
        for (int i = 0; i < 8; i++) seed[i] = (unsigned char)(cfg->seed >> (8 * i));
        rc = dprec_rng_init(&r->rng, NULL, seed, sizeof seed, "relay");
    } else {
        rc = dprec_rng_init(&r->rng, &agg_os_port, NULL, 0, "relay");
    }
    if (r->admin_token == NULL || rc != DPREC_OK) {
        snprintf(err, errcap, "could not seed the CSPRNG");
        dprec_relay_close(r);
        return -1;
    }
    if (agg_signing_key_load_or_create(cfg->signing_key_path, &r->key, r->pub_der, sizeof r->pub_der, &r->pub_der_len,
                                       relay_random, r, err, errcap) != 0) {
        dprec_relay_close(r);
        return -1;
    }
    char sync_sql[64];
    snprintf(sync_sql, sizeof sync_sql, "PRAGMA synchronous=%s", cfg->sync_full ? "FULL" : "NORMAL");
    if (sqlite3_open_v2(cfg->state_path, &r->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) !=
            SQLITE_OK ||
        exec_sql(r->db, "PRAGMA journal_mode=WAL") != 0 || exec_sql(r->db, sync_sql) != 0 ||
        exec_sql(r->db, "PRAGMA busy_timeout=5000") != 0 || exec_sql(r->db, schema) != 0) {
        snprintf(err, errcap, "cannot open the relay's state %s: %s", cfg->state_path,
                 r->db != NULL ? sqlite3_errmsg(r->db) : "out of memory");
        dprec_relay_close(r);
        return -1;
    }
    if (load_state(r, err, errcap) != 0) {
        dprec_relay_close(r);
        return -1;
    }
    if (pthread_create(&r->writer, NULL, writer_main, r) != 0) {
        snprintf(err, errcap, "cannot start the writer thread");
        dprec_relay_close(r);
        return -1;
    }
    r->writer_running = 1;
    r->cfg.state_path = r->cfg.signing_key_path = NULL;
    *out = r;
    return 0;
}

void dprec_relay_close(dprec_relay *r) {
    if (r == NULL) return;
    if (r->writer_running) {
        pthread_mutex_lock(&r->q_mu);
        r->stopping = 1;
        pthread_cond_broadcast(&r->q_cv);
        pthread_mutex_unlock(&r->q_mu);
        pthread_join(r->writer, NULL);
    }
    if (r->db != NULL) sqlite3_close(r->db);
    for (size_t i = 0; i < r->njobs; i++) job_free(r->jobs[i]);
    free(r->jobs);
    free(r->tok);
    mbedtls_pk_free(&r->key);
    dprec_rng_free(&r->rng);
    if (r->admin_token != NULL) {
        dprec_wipe(r->admin_token, strlen(r->admin_token));
        free(r->admin_token);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->q_mu);
    pthread_cond_destroy(&r->q_cv);
    pthread_mutex_destroy(&r->rng_mu);
    pthread_mutex_destroy(&r->sign_mu);
    free(r);
}

size_t dprec_relay_public_key(dprec_relay *r, unsigned char *out, size_t cap) {
    if (r == NULL || out == NULL || cap < r->pub_der_len) return 0;
    memcpy(out, r->pub_der, r->pub_der_len);
    return r->pub_der_len;
}

/* ---- routes ---------------------------------------------------------------------------------------------- */

enum route { R_REGISTER, R_ROUND, R_SHARES, R_ADMIN_JOBS, R_ADMIN_JOB, R_ADMIN_CLOSE, R_ADMIN_SUM, R_HEALTHZ, R_NONE };

typedef struct parsed {
    enum route route;
    int64_t job, round;
    int admin;
} parsed;

/* /v1/register, /v1/jobs/J/rounds/R, /v1/jobs/J/shares, /v1/admin/jobs, /v1/admin/jobs/J,
 * /v1/admin/jobs/J/rounds/R/close, /v1/admin/jobs/J/rounds/R/sum, /healthz */
static void route_of(const char *path, parsed *p) {
    char seg[8][32];
    int n = 0;
    memset(p, 0, sizeof *p);
    p->route = R_NONE;
    if (strcmp(path, "/healthz") == 0) {
        p->route = R_HEALTHZ;
        return;
    }
    if (path[0] != '/') return;
    const char *s = path + 1;
    for (;;) {
        const char *e = strchr(s, '/');
        size_t len = e != NULL ? (size_t)(e - s) : strlen(s);
        if (len == 0 || len >= 32 || n == 8) return;
        memcpy(seg[n], s, len);
        seg[n][len] = '\0';
        n++;
        if (e == NULL) break;
        s = e + 1;
    }
    if (strcmp(seg[0], "v1") != 0) return;
    int a = n >= 2 && strcmp(seg[1], "admin") == 0;
    p->admin = a;
    int b = a ? 2 : 1; /* where "jobs" is */
    if (!a && n == 2 && strcmp(seg[1], "register") == 0) {
        p->route = R_REGISTER;
        return;
    }
    if (n <= b || strcmp(seg[b], "jobs") != 0) return;
    if (a && n == 3) {
        p->route = R_ADMIN_JOBS;
        return;
    }
    if (n < b + 2 || (p->job = agg_parse_id(seg[b + 1])) == 0) return;
    if (a && n == 4) p->route = R_ADMIN_JOB;
    else if (!a && n == 4 && strcmp(seg[3], "shares") == 0) p->route = R_SHARES;
    else if (n == b + 4 && strcmp(seg[b + 2], "rounds") == 0 && (p->round = agg_parse_id(seg[b + 3])) != 0 && !a)
        p->route = R_ROUND;
    else if (a && n == 7 && strcmp(seg[4], "rounds") == 0 && (p->round = agg_parse_id(seg[5])) != 0)
        p->route = strcmp(seg[6], "close") == 0 ? R_ADMIN_CLOSE : strcmp(seg[6], "sum") == 0 ? R_ADMIN_SUM : R_NONE;
}

static void count_refusal(dprec_relay *r, const char *code) {
    size_t i = 0;
    while (i + 1 < 8 && strcmp(refusal_names[i], code) != 0) i++;
    pthread_mutex_lock(&r->mu);
    r->met.refused[i]++;
    pthread_mutex_unlock(&r->mu);
}

static int refuse(dprec_relay *r, dprec_agg_response *resp, int status, const char *code, const char *msg) {
    count_refusal(r, code);
    return agg_respond_error(resp, status, code, msg);
}

/* Everything the request line and the headers decide (the front end asks before it reads the body). 1 with the answer
 * in resp, or 0 with *cap the largest body to read and *device the device (device routes). */
static int resolve(dprec_relay *r, const dprec_agg_request *req, parsed *p, size_t *cap, int64_t *device,
                   dprec_agg_response *resp) {
    memset(resp, 0, sizeof *resp);
    route_of(req->path != NULL ? req->path : "", p);
    *cap = r->cfg.max_json_body;
    *device = 0;
    if (p->route == R_NONE) return refuse(r, resp, 404, "not_found", "no such path on the relay"), 1;
    if (p->route == R_HEALTHZ) {
        *cap = 0;
        return 0;
    }
    if ((req->listener == DPREC_LISTENER_ADMIN) != p->admin)
        return refuse(r, resp, 403, "admin_only", "admin paths on the admin listener, device paths on the device one"), 1;
    int post = strcmp(req->method, "POST") == 0, get = strcmp(req->method, "GET") == 0;
    int want_post = p->route == R_REGISTER || p->route == R_SHARES || p->route == R_ADMIN_CLOSE ||
                    (p->route == R_ADMIN_JOBS && !get);
    if (want_post ? !post : !get) return agg_respond_error(resp, 405, "method_not_allowed", want_post ? "use POST" : "use GET"), 1;
    if (p->admin) {
        if (!admin_ok(r, req->authorization)) return refuse(r, resp, 401, "unauthorized", "admin token required"), 1;
        return 0;
    }
    if (p->route == R_REGISTER) return 0;
    *device = device_of(r, req->authorization);
    if (*device == 0) return refuse(r, resp, 401, "unauthorized", "register with the relay first (POST /v1/register)"), 1;
    if (p->route == R_SHARES) {
        pthread_mutex_lock(&r->mu);
        rjob *j = job_find(r, p->job);
        size_t want = j != NULL ? DPREC_ENVELOPE_HEADER + dprec_dpmf_share_size(j->mode, j->m, j->coords) : 0;
        pthread_mutex_unlock(&r->mu);
        if (j == NULL) return refuse(r, resp, 404, "not_found", "no such job on the relay"), 1;
        *cap = want < r->cfg.max_share_body ? want : r->cfg.max_share_body;
    }
    return 0;
}

int dprec_relay_preflight(dprec_relay *r, const dprec_agg_request *req, const dprec_agg_origin *origin,
                          uint64_t content_length, dprec_agg_preflight_result *out, dprec_agg_response *resp) {
    (void)origin;
    parsed p;
    size_t cap;
    int64_t device;
    if (resolve(r, req, &p, &cap, &device, resp)) return resp->body != NULL || resp->status != 0 ? 1 : -1;
    if (content_length != UINT64_MAX && content_length > cap) {
        count_refusal(r, "too_large");
        agg_respond_error(resp, 413, "too_large", "body above the cap (a share: the job's exact size)");
        return 1;
    }
    out->body_cap = cap;
    out->device = device;
    return 0;
}

/* The completion of an operation that waits for the writer: the caller's done, once resp is final. */
typedef struct wait_ctx {
    relay_op op;
    dprec_relay *r;
    dprec_agg_done_fn done;
    void *user;
    char token[65];   /* OP_REGISTER: the token to hand out */
    int64_t job, round;
} wait_ctx;

static void round_view(dprec_relay *r, rjob *j, int64_t round, dprec_agg_response *resp) {
    static const char hex[] = "0123456789abcdef";
    char seed[65];
    pthread_mutex_lock(&r->mu);
    int open = j->round == round && j->has_seed;
    for (int i = 0; i < 32; i++) {
        seed[2 * i] = hex[j->seed[i] >> 4];
        seed[2 * i + 1] = hex[j->seed[i] & 15];
    }
    seed[64] = '\0';
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)j->id);
    cJSON_AddNumberToObject(o, "round", (double)round);
    cJSON_AddStringToObject(o, "mode", dprec_dpmf_mode_name(j->mode));
    cJSON_AddNumberToObject(o, "shares", j->shares);
    cJSON_AddNumberToObject(o, "m", j->m);
    cJSON_AddNumberToObject(o, "coords", j->coords);
    cJSON_AddStringToObject(o, "seed", seed);
    pthread_mutex_unlock(&r->mu);
    dprec_wipe(seed, sizeof seed);
    if (!open) {
        cJSON_Delete(o);
        agg_respond_error(resp, 409, "round_closed", "that round is not open on the relay");
        return;
    }
    agg_respond_json(resp, 200, o);
}

static void on_op_done(void *user) {
    wait_ctx *w = user;
    dprec_relay *r = w->r;
    if (w->op.kind == OP_REGISTER && w->op.resp->status == 0) {
        if (w->op.device == 0) {
            agg_respond_error(w->op.resp, 500, "internal", "could not register");
        } else {
            cJSON *o = cJSON_CreateObject();
            char id[24];
            snprintf(id, sizeof id, "%lld", (long long)w->op.device);
            cJSON_AddStringToObject(o, "device_id", id);
            cJSON_AddStringToObject(o, "token", w->token);
            agg_respond_json(w->op.resp, 201, o);
        }
    } else if (w->op.kind == OP_ROUND_OPEN && w->op.resp->status == 0) {
        pthread_mutex_lock(&r->mu);
        rjob *j = job_find(r, w->job);
        pthread_mutex_unlock(&r->mu);
        if (j != NULL) round_view(r, j, w->round, w->op.resp);
        else agg_respond_error(w->op.resp, 404, "not_found", "no such job");
    }
    if (w->op.resp->status >= 400 && w->op.resp->body != NULL && w->op.kind == OP_SHARE) {
        const char *b = (const char *)w->op.resp->body;
        const char *codes[] = {"round_closed", "already_reported", "cohort_full", "round_not_open"};
        for (int i = 0; i < 4; i++)
            if (strstr(b, codes[i]) != NULL) count_refusal(r, i == 3 ? "round_closed" : codes[i]);
    }
    dprec_wipe(w->token, sizeof w->token);
    dprec_agg_done_fn done = w->done;
    void *u = w->user;
    cJSON_Delete(w->op.spec);
    free(w);
    done(u);
}

static int enqueue(dprec_relay *r, op_kind kind, dprec_agg_response *resp, dprec_agg_done_fn done, void *user,
                   wait_ctx **out) {
    wait_ctx *w = calloc(1, sizeof *w);
    if (w == NULL) return agg_respond_error(resp, 500, "internal", "out of memory"), 0;
    w->r = r;
    w->done = done;
    w->user = user;
    w->op.kind = kind;
    w->op.resp = resp;
    w->op.done = on_op_done;
    w->op.user = w;
    *out = w;
    return PENDING;
}

/* A share's envelope and payload, checked against the job before it is queued. */
static int check_share(dprec_relay *r, const dprec_agg_request *req, int64_t job_id, relay_op *op,
                       dprec_agg_response *resp) {
    dprec_envelope e;
    if (dprec_envelope_parse(req->body, req->body_len, &e) != DPREC_OK)
        return refuse(r, resp, 400, "bad_report", "not a report envelope (magic, version, length)"), -1;
    pthread_mutex_lock(&r->mu);
    rjob *j = job_find(r, job_id);
    int mode = j != NULL ? j->mode : 0;
    uint32_t m = j != NULL ? j->m : 0, C = j != NULL ? j->coords : 0;
    int64_t open = j != NULL ? j->round : 0, rounds = j != NULL ? j->rounds : 0;
    pthread_mutex_unlock(&r->mu);
    if (j == NULL) return refuse(r, resp, 404, "not_found", "no such job on the relay"), -1;
    if (e.protocol != DPREC_PROTO_DPMF || e.job_id != (uint64_t)job_id || e.release_version != e.round)
        return refuse(r, resp, 400, "bad_report", "the envelope's protocol, job or release version is wrong"), -1;
    const unsigned char *pl = e.payload;
    if (e.payload_len != dprec_dpmf_share_size(mode, m, C) || memcmp(pl, DPREC_DPMF_MAGIC_SHARE, 4) != 0 ||
        dprec_ld32(pl + 4) != (uint32_t)mode || dprec_ld32(pl + 8) != C || dprec_ld32(pl + 12) != m)
        return refuse(r, resp, 400, "bad_report", "not a masked share of this job (magic, mode, shape, length)"), -1;
    if ((int64_t)e.round > rounds) return refuse(r, resp, 409, "round_closed", "past the job's rounds"), -1;
    if ((int64_t)e.round != open) return refuse(r, resp, 409, "round_closed", "that round is not open on the relay"), -1;
    op->job = job_id;
    op->round = (int64_t)e.round;
    memcpy(op->report_id, e.report_id, 16);
    op->payload = pl;
    return 0;
}

static int admin_create(dprec_relay *r, const dprec_agg_request *req, dprec_agg_response *resp,
                        dprec_agg_done_fn done, void *user) {
    cJSON *o = agg_parse_object(req, 0);
    if (o == NULL) return agg_respond_error(resp, 400, "bad_json", "the body is not a JSON object"), 0;
    /* {"job": J, "mode": "relay"|"dynamic", "m": M, "d": D, "shares": K, "max_shares": N (dynamic), "rounds": R} */
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
    int md = cJSON_IsString(mode) ? dprec_dpmf_mode_of(mode->valuestring) : 0;
    double v[6];
    const char *names[6] = {"job", "m", "d", "shares", "max_shares", "rounds"};
    int ok = md == DPREC_DPMF_RELAY || md == DPREC_DPMF_DYNAMIC;
    for (int i = 0; i < 6 && ok; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, names[i]);
        v[i] = i == 4 && f == NULL ? (double)DPREC_DPMF_MAX_SHARES : cJSON_IsNumber(f) ? f->valuedouble : -1;
        ok = isfinite(v[i]) && floor(v[i]) == v[i] && v[i] >= 1;
    }
    ok = ok && v[0] <= 9007199254740992.0 && v[2] <= DPREC_DPMF_MAX_D && v[3] <= DPREC_DPMF_MAX_SHARES &&
         v[4] <= DPREC_DPMF_MAX_SHARES && v[5] <= 100000 && v[1] * (v[2] + 1) <= (double)(1u << 20);
    if (!ok) {
        cJSON_Delete(o);
        return agg_respond_error(resp, 400, "bad_field",
                                 "want {\"job\", \"mode\": relay|dynamic, \"m\", \"d\", \"shares\" (K, <= 2^20), "
                                 "\"max_shares\" (dynamic), \"rounds\"}, m (d + 1) <= 2^20"), 0;
    }
    cJSON *spec = cJSON_CreateObject();
    cJSON_AddNumberToObject(spec, "job", v[0]);
    cJSON_AddNumberToObject(spec, "mode", md);
    cJSON_AddNumberToObject(spec, "m", v[1]);
    cJSON_AddNumberToObject(spec, "coords", v[2] + 1);
    cJSON_AddNumberToObject(spec, "shares", v[3]);
    cJSON_AddNumberToObject(spec, "max_shares", md == DPREC_DPMF_RELAY ? v[3] : v[4]);
    cJSON_AddNumberToObject(spec, "rounds", v[5]);
    cJSON_Delete(o);
    wait_ctx *w;
    if (enqueue(r, OP_JOB_CREATE, resp, done, user, &w) != PENDING) {
        cJSON_Delete(spec);
        return 0;
    }
    w->op.spec = spec;
    submit(r, &w->op);
    return PENDING;
}

static void admin_job_view(dprec_relay *r, int64_t id, dprec_agg_response *resp) {
    pthread_mutex_lock(&r->mu);
    rjob *j = job_find(r, id);
    cJSON *o = NULL;
    if (j != NULL) {
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "job", (double)j->id);
        cJSON_AddStringToObject(o, "mode", dprec_dpmf_mode_name(j->mode));
        cJSON_AddNumberToObject(o, "m", j->m);
        cJSON_AddNumberToObject(o, "coords", j->coords);
        cJSON_AddNumberToObject(o, "shares", j->shares);
        cJSON_AddNumberToObject(o, "rounds", (double)j->rounds);
        cJSON_AddNumberToObject(o, "round", (double)j->round);
        cJSON_AddNumberToObject(o, "shares_in_round", j->n_grad);
        cJSON_AddNumberToObject(o, "noise_shares_in_round", j->n_noise);
    }
    pthread_mutex_unlock(&r->mu);
    if (o == NULL) agg_respond_error(resp, 404, "not_found", "no such job on the relay");
    else agg_respond_json(resp, 200, o);
}

int dprec_relay_handle_async(dprec_relay *r, const dprec_agg_request *req, const dprec_agg_origin *origin,
                             dprec_agg_response *resp, dprec_agg_done_fn done, void *user) {
    parsed p;
    size_t cap;
    int64_t device;
    (void)origin;
    if (resolve(r, req, &p, &cap, &device, resp)) return resp->status != 0 ? 0 : -1;
    if (req->body_len > cap) return refuse(r, resp, 413, "too_large", "body above the cap"), 0;
    if (p.route == R_HEALTHZ) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        return agg_respond_json(resp, 200, o), 0;
    }
    wait_ctx *w;
    switch (p.route) {
    case R_REGISTER: {
        if (enqueue(r, OP_REGISTER, resp, done, user, &w) != PENDING) return 0;
        unsigned char raw[32];
        static const char hex[] = "0123456789abcdef";
        if (relay_random(r, raw, sizeof raw) != 0) {
            free(w);
            return agg_respond_error(resp, 500, "internal", "no randomness"), 0;
        }
        for (int i = 0; i < 32; i++) {
            w->token[2 * i] = hex[raw[i] >> 4];
            w->token[2 * i + 1] = hex[raw[i] & 15];
        }
        w->token[64] = '\0';
        dprec_wipe(raw, sizeof raw);
        dprec_sha256((const unsigned char *)w->token, 64, w->op.token_hash);
        submit(r, &w->op);
        return PENDING;
    }
    case R_ROUND: {
        pthread_mutex_lock(&r->mu);
        rjob *j = job_find(r, p.job);
        int open = j != NULL && j->round == p.round && p.round <= j->rounds, seeded = open && j->has_seed;
        pthread_mutex_unlock(&r->mu);
        if (j == NULL) return refuse(r, resp, 404, "not_found", "no such job on the relay"), 0;
        if (!open) return refuse(r, resp, 409, "round_closed", "that round is not open on the relay"), 0;
        if (seeded) return round_view(r, j, p.round, resp), 0;
        if (enqueue(r, OP_ROUND_OPEN, resp, done, user, &w) != PENDING) return 0;
        w->op.job = w->job = p.job;
        w->op.round = w->round = p.round;
        submit(r, &w->op);
        return PENDING;
    }
    case R_SHARES: {
        relay_op tmp;
        memset(&tmp, 0, sizeof tmp);
        if (check_share(r, req, p.job, &tmp, resp) != 0) return 0;
        if (enqueue(r, OP_SHARE, resp, done, user, &w) != PENDING) return 0;
        w->op.job = tmp.job;
        w->op.round = tmp.round;
        w->op.device = device;
        memcpy(w->op.report_id, tmp.report_id, 16);
        w->op.payload = tmp.payload;
        submit(r, &w->op);
        return PENDING;
    }
    case R_ADMIN_JOBS:
        if (strcmp(req->method, "POST") == 0) return admin_create(r, req, resp, done, user);
        {
            cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "jobs");
            pthread_mutex_lock(&r->mu);
            for (size_t i = 0; i < r->njobs; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)r->jobs[i]->id));
            pthread_mutex_unlock(&r->mu);
            return agg_respond_json(resp, 200, o), 0;
        }
    case R_ADMIN_JOB:
        return admin_job_view(r, p.job, resp), 0;
    case R_ADMIN_CLOSE:
    case R_ADMIN_SUM: {
        /* sum: the stored sum of a closed round (a close of a closed round returns it too) */
        pthread_mutex_lock(&r->mu);
        rjob *j = job_find(r, p.job);
        int64_t open = j != NULL ? j->round : 0;
        pthread_mutex_unlock(&r->mu);
        if (j == NULL) return agg_respond_error(resp, 404, "not_found", "no such job on the relay"), 0;
        if (p.route == R_ADMIN_SUM && p.round >= open)
            return agg_respond_error(resp, 409, "round_open", "that round is not closed yet"), 0;
        if (enqueue(r, OP_CLOSE, resp, done, user, &w) != PENDING) return 0;
        w->op.job = p.job;
        w->op.round = p.round;
        submit(r, &w->op);
        return PENDING;
    }
    default:
        return agg_respond_error(resp, 404, "not_found", "no such path on the relay"), 0;
    }
}

int dprec_relay_handle(dprec_relay *r, const dprec_agg_request *req, dprec_agg_response *resp) {
    agg_sync_wait w;
    agg_sync_wait_init(&w);
    memset(resp, 0, sizeof *resp);
    int rc = dprec_relay_handle_async(r, req, NULL, resp, agg_sync_wait_done, &w);
    agg_sync_wait_end(&w, rc == PENDING);
    if (rc == PENDING) rc = resp->status != 0 ? 0 : -1;
    return rc;
}

char *dprec_relay_metrics(dprec_relay *r) {
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (f == NULL) return NULL;
    pthread_mutex_lock(&r->mu);
    relay_metrics m = r->met;
    fprintf(f, "# HELP dprec_relay_shares_accepted_total Shares summed (durable before their 200).\n"
               "# TYPE dprec_relay_shares_accepted_total counter\ndprec_relay_shares_accepted_total %llu\n",
            (unsigned long long)m.shares_accepted);
    fprintf(f, "# HELP dprec_relay_shares_duplicate_total Retries of a stored share, answered 200 duplicate.\n"
               "# TYPE dprec_relay_shares_duplicate_total counter\ndprec_relay_shares_duplicate_total %llu\n",
            (unsigned long long)m.shares_duplicate);
    fprintf(f, "# HELP dprec_relay_refused_total Requests refused, by the error code of the answer.\n"
               "# TYPE dprec_relay_refused_total counter\n");
    for (int i = 0; i < 8; i++)
        fprintf(f, "dprec_relay_refused_total{reason=\"%s\"} %llu\n", refusal_names[i], (unsigned long long)m.refused[i]);
    fprintf(f, "# HELP dprec_relay_registrations_total Devices registered with the relay.\n"
               "# TYPE dprec_relay_registrations_total counter\ndprec_relay_registrations_total %llu\n",
            (unsigned long long)m.registrations);
    fprintf(f, "# HELP dprec_relay_rounds_closed_total Rounds closed with a signed sum.\n"
               "# TYPE dprec_relay_rounds_closed_total counter\ndprec_relay_rounds_closed_total %llu\n",
            (unsigned long long)m.rounds_closed);
    fprintf(f, "# HELP dprec_relay_commits_total Transactions of the writer (each a batch of operations).\n"
               "# TYPE dprec_relay_commits_total counter\ndprec_relay_commits_total %llu\n",
            (unsigned long long)m.commits);
    fprintf(f, "# HELP dprec_relay_job_round The open round of each job.\n# TYPE dprec_relay_job_round gauge\n"
               "# HELP dprec_relay_job_shares_in_round Shares summed in each job's open round.\n"
               "# TYPE dprec_relay_job_shares_in_round gauge\n");
    for (size_t i = 0; i < r->njobs; i++) {
        const rjob *j = r->jobs[i];
        if (j->round > j->rounds) continue; /* a finished job's series are retired */
        fprintf(f, "dprec_relay_job_round{job=\"%lld\"} %lld\n", (long long)j->id, (long long)j->round);
        fprintf(f, "dprec_relay_job_shares_in_round{job=\"%lld\"} %u\n", (long long)j->id, j->n_grad);
    }
    pthread_mutex_unlock(&r->mu);
    fclose(f);
    return out;
}

/* ---- in-process transport ---------------------------------------------------------------------------------- */

static int relay_handler(void *core, const dprec_agg_request *req, dprec_agg_response *resp) {
    return dprec_relay_handle(core, req, resp);
}

static int relay_transport_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                                   dprec_http_response *resp) {
    const dprec_relay_transport *st = ctx;
    return agg_transport_forward(relay_handler, st->relay, 0, req, sink, sink_user, resp);
}

void dprec_relay_transport_init(dprec_transport *t, dprec_relay_transport *state, dprec_relay *r) {
    state->relay = r;
    t->ctx = state;
    t->request = relay_transport_request;
}
