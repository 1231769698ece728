/* dprec relay — the durable state: the SQLite schema, its load at open, and the one writer thread that changes it.
 *
 * Every change goes through one writer thread: a batch of operations (shares, registrations, round openings and
 * closings) is applied in one transaction, and each request is answered only once the transaction committed
 * (synchronous=FULL): a share is acknowledged only when it is durable, a retry of an acknowledged share is recognized by
 * its report id, and a kill -9 loses nothing that was acknowledged. The sums in memory change only after a commit.
 *
 * Its own file: this machinery (the queue, the batch, commit or roll back, the committed state into memory, then the
 * answers) is the same for every operation; what an operation does to its round is relay_round.c's. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include "base/agg_base.h"
#include "bytes.h"
#include "dpmf.h"
#include "relay.h"
#include "relay_priv.h"

#define RELAY_SCHEMA_VERSION 1

/* ---- SQLite ------------------------------------------------------------------------------------------------ */

int relay_exec_sql(sqlite3 *db, const char *sql) {
    return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

const char relay_schema[] =
    "CREATE TABLE IF NOT EXISTS devices (id INTEGER PRIMARY KEY, token_hash BLOB NOT NULL UNIQUE, created INTEGER);"
    /* a device's enrollment (docs/protocol.md "Enrollment"), as the aggregator keeps it */
    "CREATE TABLE IF NOT EXISTS enrollments (device INTEGER PRIMARY KEY REFERENCES devices(id), identity BLOB NOT NULL,"
    " token BLOB, token_sha256 BLOB UNIQUE);"
    "CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, mode INTEGER, m INTEGER, coords INTEGER, shares INTEGER,"
    " max_shares INTEGER, rounds INTEGER, round INTEGER);"
    "CREATE TABLE IF NOT EXISTS rounds (job INTEGER, round INTEGER, seed BLOB, alpha_seed BLOB, grad BLOB, noise BLOB,"
    " n_grad INTEGER, n_noise INTEGER, PRIMARY KEY (job, round));"
    "CREATE TABLE IF NOT EXISTS shares (job INTEGER, round INTEGER, report_id BLOB, device INTEGER, noise INTEGER,"
    " seq INTEGER, PRIMARY KEY (job, report_id), UNIQUE (job, round, device));"
    "CREATE TABLE IF NOT EXISTS sums (job INTEGER, round INTEGER, body BLOB, PRIMARY KEY (job, round));";

int relay_load_state(dprec_relay *r, char *err, size_t errcap) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(r->db, "SELECT id, token_hash FROM devices", -1, &st, NULL) != SQLITE_OK) goto fail;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (sqlite3_column_bytes(st, 1) != 32 ||
            relay_tok_put(r, sqlite3_column_blob(st, 1), sqlite3_column_int64(st, 0)) != 0)
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
        j->grad = calloc(relay_cells(j), sizeof(uint64_t));
        j->noise = j->mode == DPREC_DPMF_DYNAMIC ? calloc(relay_cells(j), sizeof(uint64_t)) : NULL;
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
            size_t v = relay_cells(j) * 8u;
            if (sqlite3_column_bytes(st, 0) != 32 || sqlite3_column_bytes(st, 1) != 32 ||
                (size_t)sqlite3_column_bytes(st, 2) != v ||
                (j->noise != NULL && (size_t)sqlite3_column_bytes(st, 3) != v))
                goto fail;
            memcpy(j->seed, sqlite3_column_blob(st, 0), 32);
            memcpy(j->alpha_seed, sqlite3_column_blob(st, 1), 32);
            const unsigned char *g = sqlite3_column_blob(st, 2);
            for (size_t c = 0; c < relay_cells(j); c++) j->grad[c] = dprec_ld64(g + 8 * c);
            if (j->noise != NULL) {
                const unsigned char *nz = sqlite3_column_blob(st, 3);
                for (size_t c = 0; c < relay_cells(j); c++) j->noise[c] = dprec_ld64(nz + 8 * c);
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

static int write_round(dprec_relay *r, scratch *s) {
    rjob *j = s->job;
    if (s->closed || s->grad == NULL) return 0; /* a closed round's row is gone; an opened round's row is written */
    sqlite3_stmt *st = NULL;
    unsigned char *g = vec_blob(s->grad, relay_cells(j));
    unsigned char *n = s->noise != NULL ? vec_blob(s->noise, relay_cells(j)) : NULL;
    int rc = -1;
    if (g != NULL && (s->noise == NULL || n != NULL) &&
        sqlite3_prepare_v2(r->db, "UPDATE rounds SET grad = ?, noise = ?, n_grad = ?, n_noise = ? WHERE job = ? AND round = ?",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_blob(st, 1, g, (int)(relay_cells(j) * 8u), SQLITE_STATIC);
        if (n != NULL) sqlite3_bind_blob(st, 2, n, (int)(relay_cells(j) * 8u), SQLITE_STATIC);
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

void *relay_writer_main(void *arg) {
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
        int ok = relay_exec_sql(r->db, "BEGIN IMMEDIATE") == 0;
        for (relay_op *op = batch; ok && op != NULL; op = op->next) ok = relay_apply(r, op, sc, &nsc, SC, &seq) == 0;
        for (size_t i = 0; ok && i < nsc; i++) ok = write_round(r, &sc[i]) == 0;
        ok = ok && relay_exec_sql(r->db, "COMMIT") == 0;
        if (!ok) {
            relay_log(r, "error", "commit_failed", 0, 0, NULL, sqlite3_errmsg(r->db));
            relay_exec_sql(r->db, "ROLLBACK");
        }
        for (size_t i = 0; ok && i < nsc; i++)
            if (sc[i].closed) {
                cJSON *f = cJSON_CreateObject();
                cJSON_AddNumberToObject(f, "shares", sc[i].n_grad);
                cJSON_AddNumberToObject(f, "noise_shares", sc[i].n_noise);
                relay_log(r, "info", "round_closed", sc[i].job->id, sc[i].job->round, f, "its sum is signed");
            }
        for (relay_op *op = batch; ok && op != NULL; op = op->next)
            if (op->kind == OP_JOB_CREATE && op->resp->status == 201) {
                const cJSON *spec = op->spec;
                cJSON *f = cJSON_CreateObject();
                cJSON_AddStringToObject(f, "mode", (int)cJSON_GetObjectItem(spec, "mode")->valuedouble == DPREC_DPMF_DYNAMIC
                                                       ? "dynamic" : "static");
                static const char *const keys[] = {"m", "coords", "shares", "max_shares", "rounds"};
                for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
                    const cJSON *v = cJSON_GetObjectItem(spec, keys[k]);
                    if (cJSON_IsNumber(v)) cJSON_AddNumberToObject(f, keys[k], v->valuedouble);
                }
                relay_log(r, "info", "job_created", (int64_t)cJSON_GetObjectItem(spec, "job")->valuedouble, 0, f, NULL);
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
                    memset(j->grad, 0, relay_cells(j) * sizeof(uint64_t));
                    if (j->noise != NULL) memset(j->noise, 0, relay_cells(j) * sizeof(uint64_t));
                    j->n_grad = j->n_noise = 0;
                    r->met.rounds_closed++;
                } else if (s->grad != NULL) {
                    memcpy(j->grad, s->grad, relay_cells(j) * sizeof(uint64_t));
                    if (j->noise != NULL) memcpy(j->noise, s->noise, relay_cells(j) * sizeof(uint64_t));
                    r->met.shares_accepted += s->n_grad - j->n_grad;
                    j->n_grad = s->n_grad;
                    j->n_noise = s->n_noise;
                }
            }
            for (relay_op *op = batch; op != NULL; op = op->next) {
                if (op->kind == OP_REGISTER && op->device > 0) { /* not one refused for a used token */
                    if (relay_tok_put(r, op->token_hash, op->device) != 0) op->device = 0;
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
                        j->grad = calloc(relay_cells(j), sizeof(uint64_t));
                        j->noise = j->mode == DPREC_DPMF_DYNAMIC ? calloc(relay_cells(j), sizeof(uint64_t)) : NULL;
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

void relay_submit(dprec_relay *r, relay_op *op) {
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

