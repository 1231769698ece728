/* dprec aggregator core — the SQLite engine of the store (state/agg_store_engine.h): the connections' statement cache,
 * and every read and write the layers above ask of the state (agg_store.h), each a function with its SQL, and the
 * engine's table.
 *
 * Single writer. Every write runs on the writer's connection, from the round engine's writer thread, inside the
 * transaction the writer opened (agg_store_begin): the engine decides what is written and when it is committed (a
 * report is acknowledged only after the COMMIT of its batch), the store only writes it. A finalized round is committed
 * in one transaction of its own that first re-checks the round is still the job's open round: that check makes a
 * finalization exactly-once, and a crash before the COMMIT leaves the round open.
 *
 * Uniqueness. The open round's rules (a report id once per job, a device once per round) are the writer's, in memory
 * (agg_sqlite_keys.h), not unique indexes whose random keys dirtied a page per report; they follow the writer's
 * transactions (begin/commit/rollback below), and a finalized round's keys move to report_keys in the transaction that
 * commits the round (docs/notes/sqlite-open-round-keys.md).
 *
 * Readers (releases, device tokens, health, a round being finalized) use a pool of read-only connections, never the
 * writer's, so a commit waiting for its fsync blocks no reader. A state without durability (the in-process fleet's
 * throw-away state) has one connection: its readers share the writer's, between its transactions.
 *
 * Its own file, apart from the database's lifetime (agg_sqlite_open.c), so that this is the one place to read for
 * what the aggregator stores in SQLite and how; the PostgreSQL engine (state/postgresql/) is built the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_sqlite_priv.h"
#include "dprec/status.h"

/* ---- connections ---------------------------------------------------------------------------------------- */

int agg_sqlite_exec(agg_sqlite_conn *c, const char *sql) {
    return sqlite3_exec(c->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

sqlite3_stmt *agg_sqlite_prep_uncached(agg_sqlite_conn *c, const char *sql) {
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
static sqlite3_stmt *prep(agg_sqlite_conn *c, const char *sql) {
    size_t i = 0;
    for (; i < AGG_STMT_CACHE && c->stmts[i].sql != NULL; i++) {
        if (c->stmts[i].sql != sql) continue;
        if (c->stmts[i].busy) return agg_sqlite_prep_uncached(c, sql);
        c->stmts[i].busy = 1;
        return c->stmts[i].st;
    }
    sqlite3_stmt *st = agg_sqlite_prep_uncached(c, sql);
    if (st != NULL && i < AGG_STMT_CACHE) {
        c->stmts[i].sql = sql;
        c->stmts[i].st = st;
        c->stmts[i].busy = 1;
    }
    return st;
}

/* gives back a statement from prep(): a cached one is reset with its bindings cleared, a one-off finalized */
static void finish(agg_sqlite_conn *c, sqlite3_stmt *st) {
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

void agg_sqlite_conn_close(agg_sqlite_conn *c) {
    for (size_t i = 0; i < AGG_STMT_CACHE && c->stmts[i].sql != NULL; i++) {
        sqlite3_finalize(c->stmts[i].st);
        c->stmts[i].sql = NULL;
        c->stmts[i].st = NULL;
    }
    if (c->db != NULL) sqlite3_close(c->db);
    c->db = NULL;
}

void agg_sqlite_log_conn_error(dprec_agg *a, agg_sqlite_conn *c, const char *what) {
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) {
        cJSON_AddStringToObject(f, "what", what);
        cJSON_AddStringToObject(f, "sqlite", c->db != NULL ? sqlite3_errmsg(c->db) : "no connection");
    }
    agg_log(a, "error", "db_error", f);
}

/* one integer from a query with up to two int64 parameters; returns def when there is no row */
int64_t agg_sqlite_query_int(agg_sqlite_conn *c, const char *sql, int nparams, int64_t p1, int64_t p2, int64_t def) {
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
static agg_sqlite_conn *reader_get(dprec_agg *a) {
    if (!a->cfg.sync_full) {
        pthread_mutex_lock(&SQLITE_STORE(a)->w.mu);
        return &SQLITE_STORE(a)->w;
    }
    unsigned start = __atomic_fetch_add(&SQLITE_STORE(a)->reader_next, 1u, __ATOMIC_RELAXED);
    for (unsigned k = 0; k < AGG_READERS; k++) {
        agg_sqlite_conn *c = &SQLITE_STORE(a)->readers[(start + k) % AGG_READERS];
        if (pthread_mutex_trylock(&c->mu) == 0) return c;
    }
    agg_sqlite_conn *c = &SQLITE_STORE(a)->readers[start % AGG_READERS];
    pthread_mutex_lock(&c->mu);
    return c;
}

static void reader_put(agg_sqlite_conn *c) {
    pthread_mutex_unlock(&c->mu);
}

/* ---- the jobs' rows (open only) -------------------------------------------------------------------------- */

/* Reads one job row; proto is left NULL (the open's job_loaded resolves it: the store knows no protocol). 1 found, 0
 * not found, -1 error. */
int agg_sqlite_job_row(agg_sqlite_conn *c, int64_t id, agg_job *out) {
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
    agg_store_job_spec_fields((const char *)sqlite3_column_text(st, 15), out);
    finish(c, st);
    if (out->params == NULL) {
        agg_job_free(out);
        return -1;
    }
    return 1;
}

/* The open round's keys from its rows, in storage order through the (job, round) index: a sequential read of one
 * round. A row without a digest (written before digests were kept) gets its payload's, while the payload is there. */
int64_t agg_sqlite_keys_load(agg_sqlite_store *s, int64_t job, int64_t round) {
    agg_sqlite_conn *w = &s->w;
    int64_t count =
        agg_sqlite_query_int(w, "SELECT count(*) FROM reports WHERE job = ? AND round = ?", 2, job, round, 0);
    agg_keys_round *kr;
    if (count < 0 || count > (int64_t)AGG_KEYS_MAX) return -1;
    if (count == 0) return 0;
    if (agg_keys_reserve(&s->keys, job, round, (uint32_t)count, 0, &kr) != 0) return -1;
    sqlite3_stmt *st = prep(w, "SELECT device, report_id, digest, CASE WHEN digest IS NULL THEN coalesce("
                               "(SELECT p.bytes FROM report_payloads p WHERE p.id = r.id), r.bytes) END"
                               " FROM reports r WHERE job = ? AND round = ? ORDER BY id");
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && (int64_t)kr->n < count) {
        unsigned char digest[32];
        int has = sqlite3_column_bytes(st, 2) == 32;
        if (has) memcpy(digest, sqlite3_column_blob(st, 2), 32);
        else if (sqlite3_column_bytes(st, 3) > 0)
            has = dprec_sha256(sqlite3_column_blob(st, 3), (size_t)sqlite3_column_bytes(st, 3), digest) == 0;
        if (sqlite3_column_bytes(st, 1) != DPREC_REPORT_ID_SIZE) {
            rc = SQLITE_ERROR;
            break;
        }
        agg_keys_add(&s->keys, kr, sqlite3_column_int64(st, 0), sqlite3_column_blob(st, 1), digest, has, 0);
    }
    finish(w, st);
    return (rc == SQLITE_DONE || rc == SQLITE_ROW) && (int64_t)kr->n == count ? count : -1;
}

/* ---- reads: any thread ---------------------------------------------------------------------------------- */

static int release_get(dprec_agg *a, int64_t job, int64_t version, unsigned char **out, size_t *len) {
    agg_sqlite_conn *c = reader_get(a);
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

static int64_t device_by_token(dprec_agg *a, const unsigned char h[32]) {
    agg_sqlite_conn *c = reader_get(a);
    sqlite3_stmt *st = prep(c, "SELECT id FROM devices WHERE token_sha256 = ?");
    int64_t id = -1;
    if (st != NULL) {
        sqlite3_bind_blob(st, 1, h, 32, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : rc == SQLITE_DONE ? 0 : -1;
        finish(c, st);
    }
    reader_put(c);
    return id;
}

static int health(dprec_agg *a) {
    agg_sqlite_conn *c = reader_get(a);
    int64_t v = agg_sqlite_query_int(c, "SELECT count(*) FROM jobs", 0, 0, 0, 0);
    reader_put(c);
    return v >= 0 ? 0 : -1;
}

/* ---- a round's inputs, for the finalizer ------------------------------------------------------------------ */

static int load_reports(agg_sqlite_conn *c, int64_t job, int64_t round, agg_store_reports *l) {
    int64_t count = agg_sqlite_query_int(c, "SELECT count(*) FROM reports WHERE job = ? AND round = ?", 2, job, round, 0);
    if (count < 0 || agg_store_reports_reserve(l, (size_t)count) != 0) return -1;
    if (count == 0) return 0;
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
        if (agg_store_reports_add(l, sqlite3_column_int64(st, 0), copy, len) != 0) {
            finish(c, st);
            return -1;
        }
    }
    finish(c, st);
    return (rc == SQLITE_DONE || rc == SQLITE_ROW) && l->n == (size_t)count ? 0 : -1;
}

/* A folded round's log rows (instance NULL: every instance's) and checkpoints, on c inside its transaction. */
static int load_shards(agg_sqlite_conn *c, int64_t job, int64_t round, const char *instance, agg_store_reports *log,
                       agg_store_shards *sh) {
    static const char *const count_sql[2] = {
        "SELECT count(*) FROM report_payloads WHERE job = ?1 AND round = ?2",
        "SELECT count(*) FROM report_payloads WHERE job = ?1 AND round = ?2 AND instance = ?3"};
    static const char *const rows_sql[2] = {
        "SELECT r.device, p.bytes FROM report_payloads p JOIN reports r ON r.id = p.id"
        " WHERE p.job = ?1 AND p.round = ?2 ORDER BY p.id",
        "SELECT r.device, p.bytes FROM report_payloads p JOIN reports r ON r.id = p.id"
        " WHERE p.job = ?1 AND p.round = ?2 AND p.instance = ?3 ORDER BY p.id"};
    static const char *const sums_sql[2] = {"SELECT sum, count FROM round_sums WHERE job = ?1 AND round = ?2",
                                            "SELECT sum, count FROM round_sums WHERE job = ?1 AND round = ?2"
                                            " AND instance = ?3"};
    const int k = instance != NULL;
    sqlite3_stmt *st = prep(c, count_sql[k]);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    if (k) sqlite3_bind_text(st, 3, instance, -1, SQLITE_STATIC);
    int64_t count = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    finish(c, st);
    if (count < 0 || agg_store_reports_reserve(log, (size_t)count) != 0) return -1;
    int rc = SQLITE_DONE;
    if (count > 0) {
        if ((st = prep(c, rows_sql[k])) == NULL) return -1;
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_int64(st, 2, round);
        if (k) sqlite3_bind_text(st, 3, instance, -1, SQLITE_STATIC);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW && log->n < (size_t)count) {
            size_t len = (size_t)sqlite3_column_bytes(st, 1);
            unsigned char *copy = malloc(len > 0 ? len : 1);
            if (copy != NULL && len > 0) memcpy(copy, sqlite3_column_blob(st, 1), len);
            if (copy == NULL || agg_store_reports_add(log, sqlite3_column_int64(st, 0), copy, len) != 0) {
                finish(c, st);
                return -1;
            }
        }
        finish(c, st);
        if ((rc != SQLITE_DONE && rc != SQLITE_ROW) || log->n != (size_t)count) return -1;
    }
    if ((st = prep(c, sums_sql[k])) == NULL) return -1;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    if (k) sqlite3_bind_text(st, 3, instance, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        size_t len = (size_t)sqlite3_column_bytes(st, 0);
        unsigned char *copy = malloc(len > 0 ? len : 1);
        if (copy != NULL && len > 0) memcpy(copy, sqlite3_column_blob(st, 0), len);
        if (copy == NULL || agg_store_shards_add(sh, copy, len, sqlite3_column_int64(st, 1)) != 0) {
            finish(c, st);
            return -1;
        }
    }
    finish(c, st);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Round r's release and, in the same snapshot, its reports (sh NULL; l NULL: none) or a folded round's log rows and
 * checkpoints (sh not NULL). */
static int load_round(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *l,
                      agg_store_shards *sh, char *err, size_t errcap) {
    /* shared with the readers (the writer's connection without durability), held for one round's load at a time */
    agg_sqlite_conn *c = a->cfg.sync_full ? &SQLITE_STORE(a)->readers[0] : &SQLITE_STORE(a)->w;
    int rc = -1;
    pthread_mutex_lock(&c->mu); /* the connection only for the load: the global step runs without it */
    if (agg_sqlite_exec(c, "BEGIN") == 0) { /* one snapshot for the release and the reports, or the log and sums */
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
        if (rc == 0 && sh != NULL && load_shards(c, job, round, NULL, l, sh) != 0) {
            snprintf(err, errcap, "loading the round's sum failed");
            rc = -1;
        } else if (rc == 0 && sh == NULL && l != NULL && load_reports(c, job, round, l) != 0) {
            snprintf(err, errcap, "loading the round's reports failed");
            rc = -1;
        }
        agg_sqlite_exec(c, "COMMIT");
    }
    if (rc != 0 && err[0] == '\0') snprintf(err, errcap, "%s", sqlite3_errmsg(c->db));
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int round_load(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *l, char *err,
                      size_t errcap) {
    return load_round(a, job, round, prev, l, NULL, err, errcap);
}

static int round_load_folded(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *log,
                             agg_store_shards *sh, char *err, size_t errcap) {
    return load_round(a, job, round, prev, log, sh, err, errcap);
}

/* ---- writes: the writer's connection ------------------------------------------------------------------------ */

static void writer_lock(dprec_agg *a) {
    pthread_mutex_lock(&SQLITE_STORE(a)->w.mu);
}

static void writer_unlock(dprec_agg *a) {
    pthread_mutex_unlock(&SQLITE_STORE(a)->w.mu);
}

static int begin(dprec_agg *a) {
    return agg_sqlite_exec(&SQLITE_STORE(a)->w, "BEGIN IMMEDIATE");
}

/* The open rounds' keys follow the transaction: what it added stays with its COMMIT and is taken back out when it rolls
 * back, or when its COMMIT fails (which wrote nothing; the writer then rolls back, with nothing left to undo). */
static int commit(dprec_agg *a) {
    agg_sqlite_store *s = SQLITE_STORE(a);
    int rc = agg_sqlite_exec(&s->w, "COMMIT");
    if (rc == 0) agg_keys_commit(&s->keys);
    else agg_keys_rollback(&s->keys);
    return rc;
}

static int rollback(dprec_agg *a) {
    agg_sqlite_store *s = SQLITE_STORE(a);
    agg_keys_rollback(&s->keys);
    return agg_sqlite_exec(&s->w, "ROLLBACK");
}

static void log_error(dprec_agg *a, const char *what) {
    agg_sqlite_store *s = SQLITE_STORE(a);
    if (s->keys_error == NULL) {
        agg_sqlite_log_conn_error(a, &s->w, what);
        return;
    }
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) {
        cJSON_AddStringToObject(f, "what", what);
        cJSON_AddStringToObject(f, "sqlite", s->keys_error);
    }
    s->keys_error = NULL;
    agg_log(a, "error", "db_error", f);
}

/* A report id's key: the open round's, from the writer's memory; a finalized round's, from report_keys (filled by the
 * finalization's transaction, and from every finalized row of a state written before schema 4 when it was brought to 4,
 * so that `reports`, which has no index on report ids, is never searched for one). */
static int report_find(dprec_agg *a, int64_t job, const unsigned char report_id[DPREC_REPORT_ID_SIZE], int64_t *device,
                       int64_t *round, unsigned char digest[32], int *has_digest) {
    agg_sqlite_store *s = SQLITE_STORE(a);
    const agg_keys_rec *e = agg_keys_find(&s->keys, job, report_id, round);
    if (e != NULL) {
        *device = e->device;
        *has_digest = (int)e->has_digest;
        if (e->has_digest) memcpy(digest, e->digest, 32);
        return 1;
    }
    sqlite3_stmt *st = prep(&s->w, "SELECT device, round, digest FROM report_keys WHERE job = ? AND report_id = ?");
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
        }
    }
    finish(&s->w, st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? found : -1;
}

static int report_insert(dprec_agg *a, int64_t job, int64_t round, int64_t device,
                         const unsigned char report_id[DPREC_REPORT_ID_SIZE], const unsigned char *bytes, size_t len,
                         const unsigned char digest[32], int64_t now) {
    agg_sqlite_store *s = SQLITE_STORE(a);
    agg_sqlite_conn *w = &s->w;
    /* the uniqueness rules, checked by the one writer: room for the key first, so that a stored row always enters
     * the tables; then the round's devices, every open round's ids, and the finalized rounds' ids of the job (none
     * before its round 2) */
    agg_keys_round *kr;
    if (agg_keys_reserve(&s->keys, job, round, 1, 1, &kr) != 0) {
        s->keys_error = "out of memory, or past 2^30 reports (the open round's report keys)";
        return -1;
    }
    int64_t seen_round;
    if (agg_keys_has_device(&s->keys, kr, device) || agg_keys_find(&s->keys, job, report_id, &seen_round) != NULL)
        return AGG_STORE_CONFLICT;
    sqlite3_stmt *st;
    if (round > 1) {
        st = prep(w, "SELECT 1 FROM report_keys WHERE job = ? AND report_id = ?");
        if (st == NULL) return -1;
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_blob(st, 2, report_id, DPREC_REPORT_ID_SIZE, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        finish(w, st);
        if (rc == SQLITE_ROW) return AGG_STORE_CONFLICT;
        if (rc != SQLITE_DONE) return -1;
    }
    st = prep(w, "INSERT INTO reports(job, round, device, report_id, bytes, received_at, digest)"
                 " VALUES(?,?,?,?,x'',?,?)");
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    sqlite3_bind_int64(st, 3, device);
    sqlite3_bind_blob(st, 4, report_id, DPREC_REPORT_ID_SIZE, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, now);
    sqlite3_bind_blob(st, 6, digest, 32, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    finish(w, st);
    if (rc == SQLITE_CONSTRAINT) return AGG_STORE_CONFLICT;
    if (rc != SQLITE_DONE) return -1;
    int64_t rowid = sqlite3_last_insert_rowid(w->db);
    /* the payload: a folded round's log row, tagged with its round and this instance (docs/notes/streaming-sums.md) */
    st = prep(w, "INSERT INTO report_payloads(id, bytes, job, round, instance) VALUES(?, ?, ?, ?, ?)");
    if (st == NULL) goto undo;
    sqlite3_bind_int64(st, 1, rowid);
    sqlite3_bind_blob64(st, 2, bytes, len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, job);
    sqlite3_bind_int64(st, 4, round);
    sqlite3_bind_text(st, 5, a->instance_id, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    finish(w, st);
    if (rc != SQLITE_DONE) goto undo;
    agg_keys_add(&s->keys, kr, device, report_id, digest, 1, 1);
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

static int64_t device_insert(dprec_agg *a, const unsigned char token_hash[32], const char *platform,
                             const agg_enrollment *en, int64_t now) {
    agg_sqlite_conn *w = &SQLITE_STORE(a)->w;
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

static int device_enrollment(dprec_agg *a, int64_t device, agg_enrollment *out) {
    agg_sqlite_conn *c = reader_get(a);
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

static int job_insert(dprec_agg *a, const agg_job *spec, const char *protocol, uint16_t proto_id, const char *spec_json,
                      const unsigned char *release, size_t release_len, int64_t now) {
    agg_sqlite_conn *w = &SQLITE_STORE(a)->w;
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

static int job_set_deadline(dprec_agg *a, int64_t job, int64_t deadline) {
    agg_sqlite_conn *w = &SQLITE_STORE(a)->w;
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
    agg_sqlite_conn *w = &SQLITE_STORE(a)->w;
    if (agg_sqlite_exec(w, "BEGIN IMMEDIATE") != 0) return -1;
    sqlite3_stmt *st = prep(w, sql);
    int rc = -1;
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, v);
        sqlite3_bind_int64(st, 2, job);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        finish(w, st);
    }
    if (rc != 0 || agg_sqlite_exec(w, "COMMIT") != 0) {
        agg_sqlite_log_conn_error(a, w, "job_update");
        agg_sqlite_exec(w, "ROLLBACK");
        return -1;
    }
    return 0;
}

static int job_set_rounds(dprec_agg *a, int64_t job, int64_t rounds) {
    return job_update(a, "UPDATE jobs SET rounds = ? WHERE id = ?", rounds, job);
}

static int shard_load(dprec_agg *a, int64_t job, int64_t round, agg_store_reports *log, agg_store_shards *sh) {
    return load_shards(&SQLITE_STORE(a)->w, job, round, a->instance_id, log, sh);
}

static int shard_checkpoint(dprec_agg *a, int64_t job, int64_t round, const unsigned char *sum, size_t len,
                            int64_t count) {
    agg_sqlite_conn *w = &SQLITE_STORE(a)->w;
    if (agg_sqlite_exec(w, "BEGIN IMMEDIATE") != 0) goto fail;
    sqlite3_stmt *st = prep(w, "INSERT OR REPLACE INTO round_sums(job, round, instance, count, sum) VALUES(?,?,?,?,?)");
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    sqlite3_bind_text(st, 3, a->instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, count);
    sqlite3_bind_blob64(st, 5, sum, len, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    finish(w, st);
    if (rc != SQLITE_DONE) goto fail;
    st = prep(w, "DELETE FROM report_payloads WHERE job = ? AND round = ? AND instance = ?");
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    sqlite3_bind_text(st, 3, a->instance_id, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    finish(w, st);
    if (rc != SQLITE_DONE || agg_sqlite_exec(w, "COMMIT") != 0) goto fail;
    return 0;
fail:
    agg_sqlite_log_conn_error(a, w, "sum_checkpoint");
    agg_sqlite_exec(w, "ROLLBACK");
    return -1;
}

/* The round's keys into report_keys, in ascending report id: appended this way, each leaf page of the table's B-tree
 * is written once, however random the ids. 0, or -1 (err set). */
static int keys_store(agg_sqlite_store *s, int64_t job, int64_t round, char *err, size_t errcap) {
    agg_keys_round *kr = agg_keys_get(&s->keys, job, round);
    if (kr == NULL || kr->n == 0) return 0;
    const agg_keys_rec **order = agg_keys_sorted(kr);
    if (order == NULL) {
        snprintf(err, errcap, "out of memory (sorting the round's report keys)");
        return -1;
    }
    sqlite3_stmt *st = prep(&s->w, "INSERT INTO report_keys(job, report_id, round, device, digest) VALUES(?,?,?,?,?)");
    int rc = st != NULL ? SQLITE_DONE : SQLITE_ERROR;
    for (uint32_t i = 0; rc == SQLITE_DONE && i < kr->n; i++) {
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_blob(st, 2, order[i]->id, DPREC_REPORT_ID_SIZE, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, round);
        sqlite3_bind_int64(st, 4, order[i]->device);
        if (order[i]->has_digest) sqlite3_bind_blob(st, 5, order[i]->digest, 32, SQLITE_STATIC);
        else sqlite3_bind_null(st, 5);
        rc = sqlite3_step(st);
        sqlite3_reset(st);
    }
    finish(&s->w, st);
    free(order);
    if (rc == SQLITE_DONE) return 0;
    snprintf(err, errcap, "%s", sqlite3_errmsg(s->w.db));
    return -1;
}

static int round_commit(dprec_agg *a, const agg_store_round *r, char *err, size_t errcap) {
    agg_sqlite_store *s = SQLITE_STORE(a);
    agg_sqlite_conn *w = &s->w;
    int64_t job = r->job, round = r->round, now = r->now;
    if (agg_sqlite_exec(w, "BEGIN IMMEDIATE") != 0) goto fail;
    sqlite3_stmt *st = prep(w, "SELECT round, state FROM jobs WHERE id = ?"); /* the exactly-once check */
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    int open = rc == SQLITE_ROW && sqlite3_column_int64(st, 0) == round &&
               strcmp((const char *)sqlite3_column_text(st, 1), "running") == 0;
    finish(w, st);
    if (!open) {
        agg_sqlite_exec(w, "ROLLBACK");
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
    /* the round's keys leave the writer's memory for report_keys, in the transaction that closes the round: a retry
     * of it is answered from there once this commits, and from memory until then */
    if (keys_store(s, job, round, err, errcap) != 0) {
        agg_sqlite_exec(w, "ROLLBACK");
        return -1;
    }
    /* the payloads did their work: drop them with the finalization, atomically (a crash keeps both or neither).
     * The rows stay for idempotency; SQLite reuses the freed pages for the next round's payloads. The UPDATE
     * empties payloads that a state from before report_payloads holds in the row itself. */
    if (!a->cfg.keep_report_payloads) {
        static const char *const drop[2] = {"DELETE FROM report_payloads WHERE job = ? AND round = ?",
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
    /* a folded round's checkpoints did their work too; deleted whatever keep_report_payloads says (they hold no report) */
    st = prep(w, "DELETE FROM round_sums WHERE job = ? AND round = ?");
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round);
    rc = sqlite3_step(st);
    finish(w, st);
    if (rc != SQLITE_DONE) goto fail;
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
    if (rc != SQLITE_DONE || agg_sqlite_exec(w, "COMMIT") != 0) goto fail;
    agg_keys_drop(&s->keys, job, round);
    return 1;
fail:
    snprintf(err, errcap, "%s", sqlite3_errmsg(w->db));
    agg_sqlite_exec(w, "ROLLBACK");
    return -1;
}

/* ---- the engine ------------------------------------------------------------------------------------------------ */

/* Any state that is not another engine's URI is a SQLite file path (the last engine of agg_store.c's list). */
static int claims(const char *state) {
    (void)state;
    return 1;
}

const agg_store_engine agg_store_engine_sqlite = {
    .version = AGG_STORE_ENGINE_VERSION,
    .name = "sqlite",
    .claims = claims,
    .open = agg_sqlite_open,
    .close = agg_sqlite_close,
    .writer_lock = writer_lock,
    .writer_unlock = writer_unlock,
    .release_get = release_get,
    .device_by_token = device_by_token,
    .health = health,
    .round_load = round_load,
    .begin = begin,
    .commit = commit,
    .rollback = rollback,
    .log_error = log_error,
    .report_find = report_find,
    .report_insert = report_insert,
    .device_insert = device_insert,
    .device_enrollment = device_enrollment,
    .job_insert = job_insert,
    .job_set_deadline = job_set_deadline,
    .job_set_rounds = job_set_rounds,
    .round_commit = round_commit,
    .round_load_folded = round_load_folded,
    .shard_load = shard_load,
    .shard_checkpoint = shard_checkpoint,
};
