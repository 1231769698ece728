/* dprec aggregator core — the store's statements (agg_store.h): the connections' statement cache, and every read and
 * write the layers above ask of the database, each a function with its SQL.
 *
 * Single writer. Every write runs on the writer's connection, from the round engine's writer thread, inside the
 * transaction the writer opened (agg_store_begin): the engine decides what is written and when it is committed (a
 * report is acknowledged only after the COMMIT of its batch), the store only writes it. A finalized round is committed
 * in one transaction of its own that first re-checks the round is still the job's open round: that check makes a
 * finalization exactly-once, and a crash before the COMMIT leaves the round open.
 *
 * Readers (releases, device tokens, health, a round being finalized) use a pool of read-only connections, never the
 * writer's, so a commit waiting for its fsync blocks no reader. A state without durability (the in-process fleet's
 * throw-away state) has one connection: its readers share the writer's, between its transactions.
 *
 * Its own file, apart from the database's lifetime (agg_store_open.c), so that this is the one place to read for
 * what the aggregator stores and how; a second backend would implement agg_store.h the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_store_priv.h"
#include "dprec/status.h"

/* ---- connections ---------------------------------------------------------------------------------------- */

int agg_conn_exec(agg_conn *c, const char *sql) {
    return sqlite3_exec(c->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

sqlite3_stmt *agg_conn_prep_uncached(agg_conn *c, const char *sql) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &st, NULL) != SQLITE_OK) {
        sqlite3_finalize(st);
        return NULL;
    }
    return st;
}

/* A statement for a fixed SQL string (a literal at the call site), prepared once per connection and reused:
 * parsing the SQL again for every report was a fifth of a fleet round's time. The caller is the connection's one
 * user (the writer, or a reader holding c->mu) and gives the statement back with finish(). A statement still
 * handed out (a nested use of the same site) or a full cache falls back to a one-off statement. */
static sqlite3_stmt *prep(agg_conn *c, const char *sql) {
    size_t i = 0;
    for (; i < AGG_STMT_CACHE && c->stmts[i].sql != NULL; i++) {
        if (c->stmts[i].sql != sql) continue;
        if (c->stmts[i].busy) return agg_conn_prep_uncached(c, sql);
        c->stmts[i].busy = 1;
        return c->stmts[i].st;
    }
    sqlite3_stmt *st = agg_conn_prep_uncached(c, sql);
    if (st != NULL && i < AGG_STMT_CACHE) {
        c->stmts[i].sql = sql;
        c->stmts[i].st = st;
        c->stmts[i].busy = 1;
    }
    return st;
}

/* gives back a statement from prep(): a cached one is reset with its bindings cleared, a one-off finalized */
static void finish(agg_conn *c, sqlite3_stmt *st) {
    if (st == NULL) return;
    for (size_t i = 0; i < AGG_STMT_CACHE && c->stmts[i].sql != NULL; i++) {
        if (c->stmts[i].st != st) continue;
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
        c->stmts[i].busy = 0;
        return;
    }
    sqlite3_finalize(st);
}

void agg_conn_close(agg_conn *c) {
    for (size_t i = 0; i < AGG_STMT_CACHE && c->stmts[i].sql != NULL; i++) {
        sqlite3_finalize(c->stmts[i].st);
        c->stmts[i].sql = NULL;
        c->stmts[i].st = NULL;
    }
    if (c->db != NULL) sqlite3_close(c->db);
    c->db = NULL;
}

void agg_conn_log_error(dprec_agg *a, agg_conn *c, const char *what) {
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) {
        cJSON_AddStringToObject(f, "what", what);
        cJSON_AddStringToObject(f, "sqlite", c->db != NULL ? sqlite3_errmsg(c->db) : "no connection");
    }
    agg_log(a, "error", "db_error", f);
}

/* one integer from a query with up to two int64 parameters; returns def when there is no row */
int64_t agg_conn_query_int(agg_conn *c, const char *sql, int nparams, int64_t p1, int64_t p2, int64_t def) {
    sqlite3_stmt *st = prep(c, sql);
    if (st == NULL) return -1;
    if (nparams >= 1) sqlite3_bind_int64(st, 1, p1);
    if (nparams >= 2) sqlite3_bind_int64(st, 2, p2);
    int64_t v = def;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    else if (rc != SQLITE_DONE) v = -1;
    finish(c, st);
    return v;
}

/* A read connection from the pool: one that is free if any, else waits for one. A state without durability (the
 * in-process fleet's throw-away state) has one connection, held with an exclusive lock: readers share the writer's,
 * between its transactions (its page cache stays warm, and no lock is taken and dropped around each statement). */
static agg_conn *reader_get(dprec_agg *a) {
    if (!a->cfg.sync_full) {
        pthread_mutex_lock(&a->store->w.mu);
        return &a->store->w;
    }
    unsigned start = __atomic_fetch_add(&a->store->reader_next, 1u, __ATOMIC_RELAXED);
    for (unsigned k = 0; k < AGG_READERS; k++) {
        agg_conn *c = &a->store->readers[(start + k) % AGG_READERS];
        if (pthread_mutex_trylock(&c->mu) == 0) return c;
    }
    agg_conn *c = &a->store->readers[start % AGG_READERS];
    pthread_mutex_lock(&c->mu);
    return c;
}

static void reader_put(agg_conn *c) {
    pthread_mutex_unlock(&c->mu);
}

/* ---- the jobs' rows (open only) -------------------------------------------------------------------------- */

/* Reads one job row; proto is left NULL (the open's job_loaded resolves it: the store knows no protocol). 1 found, 0
 * not found, -1 error. */
int agg_store_job_row(agg_conn *c, int64_t id, agg_job *out) {
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = prep(c, "SELECT proto_id, d, m, rating_min, rating_max, rounds, min_reports, round_seconds,"
                               " participation, params, budget_epsilon, budget_delta, state, round, deadline, spec"
                               " FROM jobs WHERE id = ?");
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        finish(c, st);
        return rc == SQLITE_DONE ? 0 : -1;
    }
    out->id = id;
    out->proto_id = (uint16_t)sqlite3_column_int(st, 0);
    out->d = (uint32_t)sqlite3_column_int64(st, 1);
    out->m = (uint32_t)sqlite3_column_int64(st, 2);
    out->rating_min = sqlite3_column_double(st, 3);
    out->rating_max = sqlite3_column_double(st, 4);
    out->rounds = sqlite3_column_int64(st, 5);
    out->min_reports = sqlite3_column_int64(st, 6);
    out->round_seconds = sqlite3_column_int64(st, 7);
    out->participation = sqlite3_column_double(st, 8);
    const unsigned char *params = sqlite3_column_text(st, 9);
    out->params = strdup(params != NULL ? (const char *)params : "{}");
    out->has_budget = sqlite3_column_type(st, 10) != SQLITE_NULL;
    out->budget_epsilon = sqlite3_column_double(st, 10);
    out->budget_delta = sqlite3_column_double(st, 11);
    const unsigned char *state = sqlite3_column_text(st, 12);
    out->done = state != NULL && strcmp((const char *)state, "done") == 0;
    out->round = sqlite3_column_int64(st, 13);
    out->deadline = sqlite3_column_int64(st, 14);
    const unsigned char *spec = sqlite3_column_text(st, 15);
    cJSON *sj = spec != NULL ? cJSON_Parse((const char *)spec) : NULL;
    const cJSON *bj = sj != NULL ? cJSON_GetObjectItemCaseSensitive(sj, "base_job") : NULL;
    if (cJSON_IsNumber(bj) && bj->valuedouble >= 1) out->base_job = (int64_t)bj->valuedouble;
    const cJSON *re = sj != NULL ? cJSON_GetObjectItemCaseSensitive(sj, "release_encoding") : NULL;
    if (cJSON_IsString(re)) (void)agg_release_encoding_parse(re->valuestring, &out->release_encoding);
    out->release_uncertainty = sj != NULL && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sj, "release_uncertainty"));
    cJSON_Delete(sj);
    finish(c, st);
    if (out->params == NULL) {
        agg_job_free(out);
        return -1;
    }
    return 1;
}

/* ---- reads: any thread ---------------------------------------------------------------------------------- */

int agg_release_get(dprec_agg *a, int64_t job, int64_t version, unsigned char **out, size_t *len) {
    agg_conn *c = reader_get(a);
    sqlite3_stmt *st = version > 0 ? prep(c, "SELECT bytes FROM releases WHERE job = ? AND version = ?")
                                   : prep(c, "SELECT bytes FROM releases WHERE job = ? ORDER BY version DESC LIMIT 1");
    int result = -1;
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, job);
        if (version > 0) sqlite3_bind_int64(st, 2, version);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            size_t n = (size_t)sqlite3_column_bytes(st, 0);
            *out = malloc(n > 0 ? n : 1);
            if (*out != NULL) {
                memcpy(*out, sqlite3_column_blob(st, 0), n);
                *len = n;
                result = 1;
            }
        } else if (rc == SQLITE_DONE) {
            result = 0;
        }
        finish(c, st);
    }
    reader_put(c);
    return result;
}

int64_t agg_device_by_token(dprec_agg *a, const char *token) {
    unsigned char h[32];
    if (dprec_sha256((const unsigned char *)token, strlen(token), h) != 0) return -1;
    agg_conn *c = reader_get(a);
    sqlite3_stmt *st = prep(c, "SELECT id FROM devices WHERE token_sha256 = ?");
    int64_t id = -1;
    if (st != NULL) {
        sqlite3_bind_blob(st, 1, h, sizeof h, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : rc == SQLITE_DONE ? 0 : -1;
        finish(c, st);
    }
    reader_put(c);
    return id;
}

int agg_store_health(dprec_agg *a) {
    agg_conn *c = reader_get(a);
    int64_t v = agg_conn_query_int(c, "SELECT count(*) FROM jobs", 0, 0, 0, 0);
    reader_put(c);
    return v >= 0 ? 0 : -1;
}

/* ---- a round's inputs, for the finalizer ------------------------------------------------------------------ */

void agg_store_reports_free(agg_store_reports *l) {
    for (size_t i = 0; i < l->n; i++) free(l->bufs[i]);
    free(l->bufs);
    free(l->r);
}

static int load_reports(agg_conn *c, int64_t job, int64_t round, agg_store_reports *l) {
    memset(l, 0, sizeof *l);
    int64_t count = agg_conn_query_int(c, "SELECT count(*) FROM reports WHERE job = ? AND round = ?", 2, job, round, 0);
    if (count < 0) return -1;
    if (count == 0) return 0;
    l->r = calloc((size_t)count, sizeof *l->r);
    l->bufs = calloc((size_t)count, sizeof *l->bufs);
    if (l->r == NULL || l->bufs == NULL) return -1;
    sqlite3_stmt *st = prep(c, "SELECT r.device, coalesce(p.bytes, r.bytes) FROM reports r"
                               " LEFT JOIN report_payloads p ON p.id = r.id WHERE r.job = ? AND r.round = ? ORDER BY r.id");
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && l->n < (size_t)count) {
        const void *b = sqlite3_column_blob(st, 1);
        size_t len = (size_t)sqlite3_column_bytes(st, 1);
        unsigned char *copy = malloc(len > 0 ? len : 1);
        if (copy == NULL) break;
        if (len > 0) memcpy(copy, b, len);
        l->bufs[l->n] = copy;
        dprec_envelope e;
        if (dprec_envelope_parse(copy, len, &e) != DPREC_OK) {
            l->n++;
            finish(c, st);
            return -1; /* stored bytes were checked at intake: this is corruption */
        }
        l->r[l->n].device = sqlite3_column_int64(st, 0);
        l->r[l->n].payload = e.payload;
        l->r[l->n].payload_len = e.payload_len;
        l->n++;
    }
    finish(c, st);
    return (rc == SQLITE_DONE || rc == SQLITE_ROW) && l->n == (size_t)count ? 0 : -1;
}

int agg_store_round_load(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *l, char *err,
                         size_t errcap) {
    /* shared with the readers (the writer's connection without durability), held for one round's load at a time */
    agg_conn *c = a->cfg.sync_full ? &a->store->readers[0] : &a->store->w;
    int rc = -1;
    pthread_mutex_lock(&c->mu); /* the connection only for the load: the global step runs without it */
    if (agg_conn_exec(c, "BEGIN") == 0) { /* one snapshot for the release and the reports */
        sqlite3_stmt *st = prep(c, "SELECT bytes FROM releases WHERE job = ? AND version = ?");
        if (st != NULL) {
            sqlite3_bind_int64(st, 1, job);
            sqlite3_bind_int64(st, 2, round);
            if (sqlite3_step(st) == SQLITE_ROW &&
                agg_release_to_model(sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0), prev) == 0)
                rc = 0;
            else
                snprintf(err, errcap, "release %lld missing or damaged", (long long)round);
            finish(c, st);
        }
        if (rc == 0 && l != NULL && load_reports(c, job, round, l) != 0) {
            snprintf(err, errcap, "loading the round's reports failed");
            rc = -1;
        }
        agg_conn_exec(c, "COMMIT");
    }
    if (rc != 0 && err[0] == '\0') snprintf(err, errcap, "%s", sqlite3_errmsg(c->db));
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- writes: the writer's connection ------------------------------------------------------------------------ */

void agg_store_writer_lock(dprec_agg *a) {
    pthread_mutex_lock(&a->store->w.mu);
}

void agg_store_writer_unlock(dprec_agg *a) {
    pthread_mutex_unlock(&a->store->w.mu);
}

int agg_store_begin(dprec_agg *a) {
    return agg_conn_exec(&a->store->w, "BEGIN IMMEDIATE");
}

int agg_store_commit(dprec_agg *a) {
    return agg_conn_exec(&a->store->w, "COMMIT");
}

int agg_store_rollback(dprec_agg *a) {
    return agg_conn_exec(&a->store->w, "ROLLBACK");
}

void agg_store_log_error(dprec_agg *a, const char *what) {
    agg_conn_log_error(a, &a->store->w, what);
}

int agg_store_report_find(dprec_agg *a, int64_t job, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                          int64_t *device, int64_t *round, unsigned char digest[32], int *has_digest) {
    agg_conn *w = &a->store->w;
    /* the digest kept with the row; for a row without one (written before digests were kept), the payload's, while
     * the payload is there (the round is open, or keep_reports) */
    sqlite3_stmt *st = prep(w, "SELECT r.device, r.round, r.digest, coalesce(p.bytes, r.bytes) FROM reports r"
                               " LEFT JOIN report_payloads p ON p.id = r.id WHERE r.job = ? AND r.report_id = ?");
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_blob(st, 2, report_id, DPREC_REPORT_ID_SIZE, SQLITE_STATIC);
    int rc = sqlite3_step(st), found = 0;
    *has_digest = 0;
    if (rc == SQLITE_ROW) {
        found = 1;
        *device = sqlite3_column_int64(st, 0);
        *round = sqlite3_column_int64(st, 1);
        if (sqlite3_column_bytes(st, 2) == 32) {
            memcpy(digest, sqlite3_column_blob(st, 2), 32);
            *has_digest = 1;
        } else if (sqlite3_column_bytes(st, 3) > 0) {
            const unsigned char *b = sqlite3_column_blob(st, 3);
            *has_digest = b != NULL && dprec_sha256(b, (size_t)sqlite3_column_bytes(st, 3), digest) == 0;
        }
    }
    finish(w, st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? found : -1;
}

int agg_store_report_insert(dprec_agg *a, int64_t job, int64_t round, int64_t device,
                            const unsigned char report_id[DPREC_REPORT_ID_SIZE], const unsigned char *bytes,
                            size_t len, int64_t now) {
    agg_conn *w = &a->store->w;
    unsigned char digest[32];
    if (dprec_sha256(bytes, len, digest) != 0) return -1;
    sqlite3_stmt *st = prep(w, "INSERT INTO reports(job, round, device, report_id, bytes, received_at, digest)"
                               " VALUES(?,?,?,?,x'',?,?)");
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    sqlite3_bind_int64(st, 3, device);
    sqlite3_bind_blob(st, 4, report_id, DPREC_REPORT_ID_SIZE, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, now);
    sqlite3_bind_blob(st, 6, digest, sizeof digest, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    finish(w, st);
    if (rc == SQLITE_CONSTRAINT) return AGG_STORE_CONFLICT;
    if (rc != SQLITE_DONE) return -1;
    int64_t rowid = sqlite3_last_insert_rowid(w->db);
    st = prep(w, "INSERT INTO report_payloads(id, bytes) VALUES(?, ?)");
    if (st == NULL) goto undo;
    sqlite3_bind_int64(st, 1, rowid);
    sqlite3_bind_blob64(st, 2, bytes, len, SQLITE_STATIC);
    rc = sqlite3_step(st);
    finish(w, st);
    if (rc != SQLITE_DONE) goto undo;
    return 0;
undo: /* the batch commits: take the row back out, or it would stay without its payload */
    st = prep(w, "DELETE FROM reports WHERE id = ?");
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, rowid);
        sqlite3_step(st);
        finish(w, st);
    }
    return -1;
}

int64_t agg_store_device_insert(dprec_agg *a, const unsigned char token_hash[32], const char *platform,
                                const agg_enrollment *en, int64_t now) {
    agg_conn *w = &a->store->w;
    int has_token = en != NULL && en->has_identity && en->token_len > 0;
    if (has_token) { /* the writer is the only one writing: checking first cannot race */
        sqlite3_stmt *st = prep(w, "SELECT device FROM enrollments WHERE token_sha256 = ?");
        if (st == NULL) return -1;
        sqlite3_bind_blob(st, 1, en->token_digest, 32, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        finish(w, st);
        if (rc == SQLITE_ROW) return AGG_STORE_TOKEN_USED;
        if (rc != SQLITE_DONE) return -1;
    }
    sqlite3_stmt *st = prep(w, "INSERT INTO devices(token_sha256, platform, created_at) VALUES(?, ?, ?)");
    int64_t id = -1;
    if (st != NULL) {
        sqlite3_bind_blob(st, 1, token_hash, 32, SQLITE_STATIC);
        if (platform != NULL) sqlite3_bind_text(st, 2, platform, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, now);
        if (sqlite3_step(st) == SQLITE_DONE) id = sqlite3_last_insert_rowid(w->db);
        finish(w, st);
    }
    if (id <= 0 || en == NULL || !en->has_identity) return id;
    st = prep(w, "INSERT INTO enrollments(device, identity, token, token_sha256) VALUES(?, ?, ?, ?)");
    int ok = 0;
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_blob(st, 2, en->identity, sizeof en->identity, SQLITE_STATIC);
        if (has_token) {
            sqlite3_bind_blob(st, 3, en->token, (int)en->token_len, SQLITE_STATIC);
            sqlite3_bind_blob(st, 4, en->token_digest, 32, SQLITE_STATIC);
        }
        ok = sqlite3_step(st) == SQLITE_DONE;
        finish(w, st);
    }
    if (ok) return id;
    /* the batch commits: take the device back out, or it would stay registered without its enrollment */
    st = prep(w, "DELETE FROM devices WHERE id = ?");
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_step(st);
        finish(w, st);
    }
    return -1;
}

int agg_store_device_enrollment(dprec_agg *a, int64_t device, agg_enrollment *out) {
    memset(out, 0, sizeof *out);
    agg_conn *c = reader_get(a);
    sqlite3_stmt *st = prep(c, "SELECT identity, token, token_sha256 FROM enrollments WHERE device = ?");
    int result = -1;
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, device);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            int n = sqlite3_column_bytes(st, 0), tn = sqlite3_column_bytes(st, 1);
            if (n == (int)sizeof out->identity && tn >= 0 && (size_t)tn <= sizeof out->token) {
                memcpy(out->identity, sqlite3_column_blob(st, 0), sizeof out->identity);
                out->has_identity = 1;
                if (tn > 0) {
                    memcpy(out->token, sqlite3_column_blob(st, 1), (size_t)tn);
                    out->token_len = (size_t)tn;
                    if (sqlite3_column_bytes(st, 2) == 32) memcpy(out->token_digest, sqlite3_column_blob(st, 2), 32);
                }
                result = 1;
            }
        } else if (rc == SQLITE_DONE) {
            result = 0;
        }
        finish(c, st);
    }
    reader_put(c);
    return result;
}

int agg_store_job_insert(dprec_agg *a, const agg_job *spec, const char *protocol, uint16_t proto_id,
                         const char *spec_json, const unsigned char *release, size_t release_len, int64_t now) {
    agg_conn *w = &a->store->w;
    int ok = 0;
    sqlite3_stmt *st = prep(w, "INSERT INTO jobs(id, spec, protocol, proto_id, d, m, rating_min, rating_max,"
                               " rounds, min_reports, round_seconds, participation, params, budget_epsilon,"
                               " budget_delta, state, round, deadline, created_at)"
                               " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,'running',1,?,?)");
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, spec->id);
        sqlite3_bind_text(st, 2, spec_json, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, protocol, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, proto_id);
        sqlite3_bind_int64(st, 5, spec->d);
        sqlite3_bind_int64(st, 6, spec->m);
        sqlite3_bind_double(st, 7, spec->rating_min);
        sqlite3_bind_double(st, 8, spec->rating_max);
        sqlite3_bind_int64(st, 9, spec->rounds);
        sqlite3_bind_int64(st, 10, spec->min_reports);
        sqlite3_bind_int64(st, 11, spec->round_seconds);
        sqlite3_bind_double(st, 12, spec->participation);
        sqlite3_bind_text(st, 13, spec->params, -1, SQLITE_STATIC);
        if (spec->has_budget) {
            sqlite3_bind_double(st, 14, spec->budget_epsilon);
            sqlite3_bind_double(st, 15, spec->budget_delta);
        }
        sqlite3_bind_int64(st, 16, now + spec->round_seconds);
        sqlite3_bind_int64(st, 17, now);
        ok = sqlite3_step(st) == SQLITE_DONE;
        finish(w, st);
    }
    if (ok) {
        ok = 0;
        st = prep(w, "INSERT INTO releases(job, version, bytes, created_at) VALUES(?, 1, ?, ?)");
        if (st != NULL) {
            sqlite3_bind_int64(st, 1, spec->id);
            sqlite3_bind_blob64(st, 2, release, release_len, SQLITE_STATIC);
            sqlite3_bind_int64(st, 3, now);
            ok = sqlite3_step(st) == SQLITE_DONE;
            finish(w, st);
        }
    }
    return ok ? 0 : -1;
}

int agg_store_job_set_deadline(dprec_agg *a, int64_t job, int64_t deadline) {
    agg_conn *w = &a->store->w;
    sqlite3_stmt *st = prep(w, "UPDATE jobs SET deadline = ? WHERE id = ?");
    int ok = st != NULL;
    if (ok) {
        sqlite3_bind_int64(st, 1, deadline);
        sqlite3_bind_int64(st, 2, job);
        ok = sqlite3_step(st) == SQLITE_DONE;
        finish(w, st);
    }
    return ok ? 0 : -1;
}

/* A single-statement change of one job, in its own transaction. 0 or -1. */
static int job_update(dprec_agg *a, const char *sql, int64_t v, int64_t job) {
    agg_conn *w = &a->store->w;
    if (agg_conn_exec(w, "BEGIN IMMEDIATE") != 0) return -1;
    sqlite3_stmt *st = prep(w, sql);
    int rc = -1;
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, v);
        sqlite3_bind_int64(st, 2, job);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        finish(w, st);
    }
    if (rc != 0 || agg_conn_exec(w, "COMMIT") != 0) {
        agg_conn_log_error(a, w, "job_update");
        agg_conn_exec(w, "ROLLBACK");
        return -1;
    }
    return 0;
}

int agg_store_job_set_rounds(dprec_agg *a, int64_t job, int64_t rounds) {
    return job_update(a, "UPDATE jobs SET rounds = ? WHERE id = ?", rounds, job);
}

int agg_store_round_commit(dprec_agg *a, const agg_store_round *r, char *err, size_t errcap) {
    agg_conn *w = &a->store->w;
    int64_t job = r->job, round = r->round, now = r->now;
    if (agg_conn_exec(w, "BEGIN IMMEDIATE") != 0) goto fail;
    sqlite3_stmt *st = prep(w, "SELECT round, state FROM jobs WHERE id = ?"); /* the exactly-once check */
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    int open = rc == SQLITE_ROW && sqlite3_column_int64(st, 0) == round &&
               strcmp((const char *)sqlite3_column_text(st, 1), "running") == 0;
    finish(w, st);
    if (!open) {
        agg_conn_exec(w, "ROLLBACK");
        return 0;
    }
    st = prep(w, "INSERT INTO releases(job, version, bytes, created_at) VALUES(?, ?, ?, ?)");
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round + 1);
    sqlite3_bind_blob64(st, 3, r->release, r->release_len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now);
    rc = sqlite3_step(st);
    finish(w, st);
    if (rc != SQLITE_DONE) goto fail;
    /* the payloads did their work: drop them with the finalization, atomically (a crash keeps both or neither).
     * The rows stay for idempotency; SQLite reuses the freed pages for the next round's payloads. The UPDATE
     * empties payloads that a state from before report_payloads holds in the row itself. */
    if (!a->cfg.keep_report_payloads) {
        static const char *const drop[2] = {
            "DELETE FROM report_payloads WHERE id IN (SELECT id FROM reports WHERE job = ? AND round = ?)",
            "UPDATE reports SET bytes = x'' WHERE job = ? AND round = ? AND length(bytes) > 0"};
        for (int k = 0; k < 2; k++) {
            st = prep(w, drop[k]);
            if (st == NULL) goto fail;
            sqlite3_bind_int64(st, 1, job);
            sqlite3_bind_int64(st, 2, round);
            rc = sqlite3_step(st);
            finish(w, st);
            if (rc != SQLITE_DONE) goto fail;
        }
    }
    if (r->ledger) {
        st = prep(w, "INSERT OR REPLACE INTO ledger(job, epsilon_spent, delta) VALUES(?, ?, ?)");
        if (st == NULL) goto fail;
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_double(st, 2, r->epsilon_spent);
        sqlite3_bind_double(st, 3, r->delta);
        rc = sqlite3_step(st);
        finish(w, st);
        if (rc != SQLITE_DONE) goto fail;
    }
    st = prep(w, "UPDATE jobs SET round = ?, deadline = ?, state = ? WHERE id = ?");
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, round + 1);
    sqlite3_bind_int64(st, 2, r->deadline);
    sqlite3_bind_text(st, 3, r->done ? "done" : "running", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, job);
    rc = sqlite3_step(st);
    finish(w, st);
    if (rc != SQLITE_DONE || agg_conn_exec(w, "COMMIT") != 0) goto fail;
    return 1;
fail:
    snprintf(err, errcap, "%s", sqlite3_errmsg(w->db));
    agg_conn_exec(w, "ROLLBACK");
    return -1;
}
