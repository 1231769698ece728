/* dprec aggregator core — durable state in SQLite: one writer thread, readers on their own connections, and the
 * round engine.
 *
 * Single writer. Every change to the state is an operation (agg_op) queued for the writer thread, which owns the
 * one read-write connection. It takes everything queued, applies the reports and registrations of the batch in one
 * transaction (WAL, synchronous=FULL by default: one fsync for the batch, the group commit), and only then
 * completes them: a report is acknowledged only after the COMMIT of its batch. Reports that arrive while a commit
 * waits for its fsync form the next batch, so batches grow with load without a timer (group_commit_us is not used).
 *
 * Readers (job views, releases, device tokens, health) use a pool of read-only connections and the in-memory job
 * table, which the writer updates after each commit: a reader never waits for a commit's fsync or a global step.
 *
 * Round engine. The writer decides when a round closes (min_reports for the early-closing protocols, the deadline,
 * an operator) and marks it closing; the finalizer thread then reads the round (release r and its reports) from a
 * read snapshot, runs the protocol's global step and signs release r+1, off the writer and off every request
 * thread; the writer commits it in one transaction that re-checks r is still the job's open round, stores the
 * release, drops the payloads, charges the ledger and advances the job. That check makes it exactly-once; a crash
 * before the COMMIT leaves the round open, and dprec_agg_open (or the next tick) closes it again. Reports for a
 * closing round wait (they hold no thread) and are answered once it is closed, exactly as if they had arrived a
 * moment later. */
#define _GNU_SOURCE /* pthread_setname_np: the threads are named in top -H and perf */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/agg_priv.h"
#include "rounds/agg_secure.h"
#include "dprec/release.h"
#include "dprec/status.h"

static const char schema_sql[] =
    "CREATE TABLE IF NOT EXISTS jobs("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, spec TEXT NOT NULL, protocol TEXT NOT NULL,"
    " proto_id INTEGER NOT NULL, d INTEGER NOT NULL, m INTEGER NOT NULL, rating_min REAL NOT NULL,"
    " rating_max REAL NOT NULL, rounds INTEGER NOT NULL, min_reports INTEGER NOT NULL,"
    " round_seconds INTEGER NOT NULL, participation REAL NOT NULL, params TEXT NOT NULL,"
    " budget_epsilon REAL, budget_delta REAL, state TEXT NOT NULL CHECK(state IN ('running','done')),"
    " round INTEGER NOT NULL, deadline INTEGER NOT NULL, created_at INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS devices("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, token_sha256 BLOB NOT NULL UNIQUE, platform TEXT,"
    " created_at INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS reports("
    " id INTEGER PRIMARY KEY, job INTEGER NOT NULL REFERENCES jobs(id), round INTEGER NOT NULL,"
    " device INTEGER NOT NULL REFERENCES devices(id), report_id BLOB NOT NULL, bytes BLOB NOT NULL,"
    " received_at INTEGER NOT NULL, UNIQUE(job, report_id), UNIQUE(job, round, device));"
    /* A report's payload, apart from its row so that dropping a finalized round's payloads frees whole pages
     * (a row of reports keeps 2 KB of an 18 KB blob inline; its page would stay mostly empty). reports.bytes
     * is empty for a report whose payload is here; states written before this table hold it there instead. */
    "CREATE TABLE IF NOT EXISTS report_payloads("
    " id INTEGER PRIMARY KEY REFERENCES reports(id), bytes BLOB NOT NULL);"
    "CREATE TABLE IF NOT EXISTS releases("
    " job INTEGER NOT NULL REFERENCES jobs(id), version INTEGER NOT NULL, bytes BLOB NOT NULL,"
    " created_at INTEGER NOT NULL, PRIMARY KEY(job, version));"
    "CREATE TRIGGER IF NOT EXISTS releases_no_update BEFORE UPDATE ON releases"
    " BEGIN SELECT RAISE(ABORT, 'releases are immutable'); END;"
    "CREATE TRIGGER IF NOT EXISTS releases_no_delete BEFORE DELETE ON releases"
    " BEGIN SELECT RAISE(ABORT, 'releases are immutable'); END;"
    "CREATE TABLE IF NOT EXISTS ledger("
    " job INTEGER PRIMARY KEY REFERENCES jobs(id), epsilon_spent REAL NOT NULL, delta REAL NOT NULL);";

/* ---- connections ---------------------------------------------------------------------------------------- */

static int exec(agg_conn *c, const char *sql) {
    return sqlite3_exec(c->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

static sqlite3_stmt *prep_uncached(agg_conn *c, const char *sql) {
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
        if (c->stmts[i].busy) return prep_uncached(c, sql);
        c->stmts[i].busy = 1;
        return c->stmts[i].st;
    }
    sqlite3_stmt *st = prep_uncached(c, sql);
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

static void conn_close(agg_conn *c) {
    for (size_t i = 0; i < AGG_STMT_CACHE && c->stmts[i].sql != NULL; i++) {
        sqlite3_finalize(c->stmts[i].st);
        c->stmts[i].sql = NULL;
        c->stmts[i].st = NULL;
    }
    if (c->db != NULL) sqlite3_close(c->db);
    c->db = NULL;
}

static void log_db_error(dprec_agg *a, agg_conn *c, const char *what) {
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) {
        cJSON_AddStringToObject(f, "what", what);
        cJSON_AddStringToObject(f, "sqlite", c->db != NULL ? sqlite3_errmsg(c->db) : "no connection");
    }
    agg_log(a, "error", "db_error", f);
}

/* one integer from a query with up to two int64 parameters; returns def when there is no row */
static int64_t query_int(agg_conn *c, const char *sql, int nparams, int64_t p1, int64_t p2, int64_t def) {
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
        pthread_mutex_lock(&a->w.mu);
        return &a->w;
    }
    unsigned start = __atomic_fetch_add(&a->reader_next, 1u, __ATOMIC_RELAXED);
    for (unsigned k = 0; k < AGG_READERS; k++) {
        agg_conn *c = &a->readers[(start + k) % AGG_READERS];
        if (pthread_mutex_trylock(&c->mu) == 0) return c;
    }
    agg_conn *c = &a->readers[start % AGG_READERS];
    pthread_mutex_lock(&c->mu);
    return c;
}

static void reader_put(agg_conn *c) {
    pthread_mutex_unlock(&c->mu);
}

/* ---- the job table ---------------------------------------------------------------------------------------- */

/* the slot of job id (binary search), or NULL; the caller holds jobs_mu or is the writer */
static agg_slot *slot_find(dprec_agg *a, int64_t id) {
    size_t lo = 0, hi = a->njobs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t v = a->jobs[mid]->job.id;
        if (v == id) return a->jobs[mid];
        if (v < id) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static int job_copy(const agg_job *src, agg_job *out) {
    *out = *src;
    out->params = strdup(src->params != NULL ? src->params : "{}");
    return out->params != NULL ? 0 : -1;
}

static size_t report_cap_of(dprec_agg *a, const agg_job *j) {
    size_t cap = a->cfg.max_report_body;
    if (j->proto->max_payload != NULL) {
        uint64_t p = (uint64_t)j->proto->max_payload(j) + DPREC_ENVELOPE_HEADER;
        if (p < cap) cap = (size_t)p;
    }
    return cap;
}

/* Adds a job to the table (ids only grow, so it goes last). The writer, or open. 0 or -1. */
static int slot_add(dprec_agg *a, const agg_job *j, int64_t in_round) {
    agg_slot *s = calloc(1, sizeof *s);
    if (s == NULL || job_copy(j, &s->job) != 0) {
        free(s);
        return -1;
    }
    s->in_round = in_round;
    s->report_cap = report_cap_of(a, &s->job);
    s->held_tail = &s->held;
    pthread_mutex_lock(&a->jobs_mu);
    int rc = 0;
    if (a->njobs == a->jobs_cap) {
        size_t ncap = a->jobs_cap ? a->jobs_cap * 2 : 16;
        agg_slot **nj = realloc(a->jobs, ncap * sizeof *nj);
        if (nj == NULL) rc = -1;
        else a->jobs = nj, a->jobs_cap = ncap;
    }
    if (rc == 0) a->jobs[a->njobs++] = s;
    if (j->id >= a->next_job_id) a->next_job_id = j->id + 1;
    pthread_mutex_unlock(&a->jobs_mu);
    if (rc != 0) {
        agg_job_free(&s->job);
        free(s);
    }
    return rc;
}

int agg_job_get(dprec_agg *a, int64_t id, agg_job *out, int64_t *in_round) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&a->jobs_mu);
    agg_slot *s = slot_find(a, id);
    int rc = 0;
    if (s != NULL) {
        rc = job_copy(&s->job, out) == 0 ? 1 : -1;
        if (in_round != NULL) *in_round = s->in_round;
    }
    pthread_mutex_unlock(&a->jobs_mu);
    return rc;
}

size_t agg_job_report_cap(dprec_agg *a, int64_t id) {
    pthread_mutex_lock(&a->jobs_mu);
    agg_slot *s = slot_find(a, id);
    size_t cap = s != NULL ? s->report_cap : 0;
    pthread_mutex_unlock(&a->jobs_mu);
    return cap;
}

int64_t agg_job_reserve_id(dprec_agg *a) {
    pthread_mutex_lock(&a->jobs_mu);
    int64_t id = a->next_job_id++;
    pthread_mutex_unlock(&a->jobs_mu);
    return id;
}

int agg_job_ids(dprec_agg *a, int64_t **ids, size_t *n) {
    pthread_mutex_lock(&a->jobs_mu);
    *n = a->njobs;
    *ids = malloc((a->njobs > 0 ? a->njobs : 1) * sizeof **ids);
    if (*ids != NULL)
        for (size_t i = 0; i < a->njobs; i++) (*ids)[i] = a->jobs[i]->job.id;
    pthread_mutex_unlock(&a->jobs_mu);
    if (*ids == NULL) {
        *n = 0;
        return -1;
    }
    return 0;
}

/* Reads one job row (open only). 1 found, 0 not found, -1 error. */
static int job_load_row(agg_conn *c, int64_t id, agg_job *out) {
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
    out->proto = agg_protocol_by_id(out->proto_id);
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
    cJSON_Delete(sj);
    finish(c, st);
    if (out->params == NULL || out->proto == NULL) {
        agg_job_free(out);
        return -1;
    }
    return 1;
}

/* ---- reads ------------------------------------------------------------------------------------------------ */

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

int agg_health(dprec_agg *a) {
    agg_conn *c = reader_get(a);
    int64_t v = query_int(c, "SELECT count(*) FROM jobs", 0, 0, 0, 0);
    reader_put(c);
    pthread_mutex_lock(&a->q_mu);
    int running = a->writer_running && a->finalizer_running;
    pthread_mutex_unlock(&a->q_mu);
    return v >= 0 && running ? 0 : -1;
}

/* ---- the writer's queue ----------------------------------------------------------------------------------- */

/* A round being finalized: decided by the writer, computed by the finalizer, committed by the writer. */
typedef struct agg_fin {
    agg_op op;            /* AGG_OP_FIN_DONE, queued for the writer once computed */
    struct agg_fin *next; /* the finalizer's queue */
    agg_job job;          /* a copy of the job as it was when the round began closing */
    int64_t round, count;
    int ok, abandoned;
    char err[AGG_ERRMSG];
    unsigned char *release;
    size_t release_len;
    agg_op **waiters;     /* operations completed once this round is closed (or failed to) */
    size_t nwaiters;
} agg_fin;

static void set_outcome(agg_op *op, int status, const char *code, const char *msg) {
    op->status = status;
    op->code = code;
    snprintf(op->message, sizeof op->message, "%s", msg);
}

/* queues op for the writer; front: ahead of everything queued (held operations going back in) */
static void enqueue(dprec_agg *a, agg_op *op, int front) {
    agg_op *last = op;
    while (last->next != NULL) last = last->next;
    if (front) {
        last->next = a->q_head;
        a->q_head = op;
        if (a->q_tail == NULL) a->q_tail = last;
    } else {
        if (a->q_tail != NULL) a->q_tail->next = op;
        else a->q_head = op;
        a->q_tail = last;
    }
    pthread_cond_signal(&a->q_cv);
}

void agg_submit(dprec_agg *a, agg_op *op) {
    op->next = NULL;
    op->pending = 0;
    pthread_mutex_lock(&a->q_mu);
    if (a->stopping || !a->writer_running) {
        pthread_mutex_unlock(&a->q_mu);
        set_outcome(op, 503, "shutting_down", "the aggregator is shutting down");
        op->done(op);
        return;
    }
    enqueue(a, op, 0);
    pthread_mutex_unlock(&a->q_mu);
}

static void complete(agg_op *op) {
    op->next = NULL;
    op->done(op);
}

/* ---- reports and registrations: the group commit ------------------------------------------------------------ */

/* The report id already stored for this job: 1 (outcome set: 200 duplicate, or 409 if another device's), 0 none,
 * -1 error. */
static int report_known(dprec_agg *a, agg_op *op) {
    sqlite3_stmt *st = prep(&a->w, "SELECT device, round FROM reports WHERE job = ? AND report_id = ?");
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, op->job);
    sqlite3_bind_blob(st, 2, op->report_id, DPREC_REPORT_ID_SIZE, SQLITE_STATIC);
    int rc = sqlite3_step(st), found = 0;
    if (rc == SQLITE_ROW) {
        found = 1;
        int64_t dev = sqlite3_column_int64(st, 0);
        op->accepted_round = (uint64_t)sqlite3_column_int64(st, 1);
        if (dev == op->device) {
            set_outcome(op, 200, NULL, "");
            op->duplicate = 1;
        } else {
            set_outcome(op, 409, "already_reported", "this report id was used by another device");
        }
    }
    finish(&a->w, st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? found : -1;
}

enum { REPORT_DONE = 0, REPORT_INSERTED = 1, REPORT_HELD = 2 };

/* Checks and inserts one report inside the batch's transaction. */
static int report_one(dprec_agg *a, agg_op *op, int64_t now) {
    agg_slot *s = slot_find(a, op->job);
    if (s == NULL) {
        set_outcome(op, 404, "not_found", "unknown job");
        return REPORT_DONE;
    }
    int64_t round = s->job.round;
    if (s->job.done || s->closing || op->round != (uint64_t)round || op->release_version != (uint64_t)round) {
        /* idempotency first: a retry after the round closed must still get its 200 */
        int k = report_known(a, op);
        if (k != 0) {
            if (k < 0) goto fail;
            return REPORT_DONE;
        }
        if (s->closing && !s->job.done && op->round == (uint64_t)round) {
            op->next = NULL;
            *s->held_tail = op;
            s->held_tail = &op->next;
            return REPORT_HELD;
        }
        if (s->job.done) set_outcome(op, 409, "job_done", "the job has finished");
        else if (op->round != (uint64_t)round)
            set_outcome(op, 409, "round_closed", "the report's round is not the job's open round");
        else set_outcome(op, 400, "bad_report", "release_version must be the round's release (round r uses release r)");
        return REPORT_DONE;
    }
    sqlite3_stmt *st = prep(&a->w, "INSERT INTO reports(job, round, device, report_id, bytes, received_at)"
                                   " VALUES(?,?,?,?,x'',?)");
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, op->job);
    sqlite3_bind_int64(st, 2, round);
    sqlite3_bind_int64(st, 3, op->device);
    sqlite3_bind_blob(st, 4, op->report_id, DPREC_REPORT_ID_SIZE, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, now);
    int rc = sqlite3_step(st);
    finish(&a->w, st);
    if (rc == SQLITE_CONSTRAINT) {
        /* a stored report id (a retry, or another device's), else this device's other report of the round */
        int k = report_known(a, op);
        if (k < 0) goto fail;
        if (k == 0) set_outcome(op, 409, "already_reported", "this device already has a different report in this round");
        return REPORT_DONE;
    }
    if (rc != SQLITE_DONE) goto fail;
    int64_t rowid = sqlite3_last_insert_rowid(a->w.db);
    st = prep(&a->w, "INSERT INTO report_payloads(id, bytes) VALUES(?, ?)");
    if (st == NULL) goto undo;
    sqlite3_bind_int64(st, 1, rowid);
    sqlite3_bind_blob64(st, 2, op->bytes, op->len, SQLITE_STATIC);
    rc = sqlite3_step(st);
    finish(&a->w, st);
    if (rc != SQLITE_DONE) goto undo;
    set_outcome(op, 200, NULL, "");
    op->accepted_round = (uint64_t)round;
    return REPORT_INSERTED;
undo: /* the batch commits: take the row back out, or it would stay without its payload */
    st = prep(&a->w, "DELETE FROM reports WHERE id = ?");
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, rowid);
        sqlite3_step(st);
        finish(&a->w, st);
    }
fail:
    log_db_error(a, &a->w, "report_insert");
    set_outcome(op, 500, "internal", "state database error");
    return REPORT_DONE;
}

static void start_fin(dprec_agg *a, agg_slot *s, agg_op *waiter);

static void register_one(dprec_agg *a, agg_op *op, int64_t now) {
    sqlite3_stmt *st = prep(&a->w, "INSERT INTO devices(token_sha256, platform, created_at) VALUES(?, ?, ?)");
    op->id = -1;
    if (st != NULL) {
        sqlite3_bind_blob(st, 1, op->token_hash, 32, SQLITE_STATIC);
        if (op->platform != NULL) sqlite3_bind_text(st, 2, op->platform, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, now);
        if (sqlite3_step(st) == SQLITE_DONE) op->id = sqlite3_last_insert_rowid(a->w.db);
        finish(&a->w, st);
    }
    if (op->id > 0) {
        set_outcome(op, 201, NULL, "");
    } else {
        log_db_error(a, &a->w, "register");
        set_outcome(op, 500, "internal", "could not store the device");
    }
}

static agg_fin *fin_new(dprec_agg *a, agg_slot *s);
static int fin_add_waiter(agg_fin *f, agg_op *op);
static void fin_queue(dprec_agg *a, agg_fin *f);

/* One transaction for every report and registration of the batch; the completed ones are appended to *done_tail. */
static void run_batch(dprec_agg *a, agg_op *batch, agg_op ***done_tail) {
    int64_t now = agg_now(a);
    size_t inserted = 0, nops = 0;
    agg_op *kept = NULL, **kept_tail = &kept, *next;
    if (exec(&a->w, "BEGIN IMMEDIATE") != 0) {
        log_db_error(a, &a->w, "begin");
        for (agg_op *op = batch; op != NULL; op = op->next) set_outcome(op, 500, "internal", "state database busy");
        **done_tail = batch;
        while (**done_tail != NULL) *done_tail = &(**done_tail)->next;
        return;
    }
    for (agg_op *op = batch; op != NULL; op = next) {
        next = op->next;
        op->next = NULL;
        nops++;
        if (op->kind == AGG_OP_REGISTER) {
            register_one(a, op, now);
        } else if (report_one(a, op, now) == REPORT_HELD) {
            continue; /* answered once the closing round is closed */
        }
        *kept_tail = op;
        kept_tail = &op->next;
    }
    if (exec(&a->w, "COMMIT") != 0) {
        log_db_error(a, &a->w, "commit");
        exec(&a->w, "ROLLBACK");
        for (agg_op *op = kept; op != NULL; op = op->next)
            if ((op->status == 200 && !op->duplicate) || op->status == 201)
                set_outcome(op, 500, "internal", "commit failed");
    } else {
        /* committed: the counts move, and the early-closing rounds that are now full begin to close */
        pthread_mutex_lock(&a->jobs_mu);
        for (agg_op *op = kept; op != NULL; op = op->next)
            if (op->kind == AGG_OP_REPORT && op->status == 200 && !op->duplicate) {
                agg_slot *s = slot_find(a, op->job);
                if (s != NULL && s->job.round == (int64_t)op->accepted_round) s->in_round++;
                inserted++;
            }
        pthread_mutex_unlock(&a->jobs_mu);
        /* A synchronous caller's report that made its round close is answered after the round closed (the
         * in-process fleet and the tests see the round advance as soon as the report that completed it returns). */
        agg_fin *started[16];
        size_t nstarted = 0;
        for (agg_op *op = kept; op != NULL && inserted > 0; op = op->next) {
            if (op->kind != AGG_OP_REPORT || op->status != 200 || op->duplicate) continue;
            agg_slot *s = slot_find(a, op->job);
            if (s == NULL || s->closing || s->job.done || !agg_closes_early(&s->job) ||
                s->in_round < s->job.min_reports || s->job.round != (int64_t)op->accepted_round)
                continue;
            agg_fin *f = fin_new(a, s);
            if (f != NULL && nstarted < sizeof started / sizeof started[0]) started[nstarted++] = f;
            else if (f != NULL) fin_queue(a, f);
        }
        agg_op **pp = &kept;
        while (*pp != NULL) {
            agg_op *op = *pp;
            agg_fin *f = NULL;
            for (size_t k = 0; op->wait_round && op->kind == AGG_OP_REPORT && k < nstarted; k++)
                if (started[k]->job.id == op->job && started[k]->round == (int64_t)op->accepted_round) f = started[k];
            if (f != NULL && fin_add_waiter(f, op) == 0) {
                *pp = op->next;
                op->next = NULL;
            } else {
                pp = &op->next;
            }
        }
        for (size_t k = 0; k < nstarted; k++) fin_queue(a, started[k]);
    }
    pthread_mutex_lock(&a->m_mu);
    a->metrics.commits++;
    a->metrics.committed_reports += inserted;
    a->metrics.committed_ops += nops;
    pthread_mutex_unlock(&a->m_mu);
    **done_tail = kept;
    while (**done_tail != NULL) *done_tail = &(**done_tail)->next;
}

/* ---- jobs ----------------------------------------------------------------------------------------------- */

static void job_create(dprec_agg *a, agg_op *op) {
    const agg_job *spec = op->spec;
    int64_t now = agg_now(a);
    int ok = 0;
    if (exec(&a->w, "BEGIN IMMEDIATE") == 0) {
        sqlite3_stmt *st = prep(&a->w, "INSERT INTO jobs(id, spec, protocol, proto_id, d, m, rating_min, rating_max,"
                                       " rounds, min_reports, round_seconds, participation, params, budget_epsilon,"
                                       " budget_delta, state, round, deadline, created_at)"
                                       " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,'running',1,?,?)");
        if (st != NULL) {
            sqlite3_bind_int64(st, 1, spec->id);
            sqlite3_bind_text(st, 2, op->spec_json, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, spec->proto->name, -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 4, spec->proto->id);
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
            finish(&a->w, st);
        }
        if (ok) {
            ok = 0;
            st = prep(&a->w, "INSERT INTO releases(job, version, bytes, created_at) VALUES(?, 1, ?, ?)");
            if (st != NULL) {
                sqlite3_bind_int64(st, 1, spec->id);
                sqlite3_bind_blob64(st, 2, op->release, op->release_len, SQLITE_STATIC);
                sqlite3_bind_int64(st, 3, now);
                ok = sqlite3_step(st) == SQLITE_DONE;
                finish(&a->w, st);
            }
        }
        if (!ok || exec(&a->w, "COMMIT") != 0) {
            log_db_error(a, &a->w, "job_create");
            exec(&a->w, "ROLLBACK");
            ok = 0;
        }
    } else {
        log_db_error(a, &a->w, "begin");
    }
    if (ok) {
        agg_job j = *spec;
        j.proto_id = spec->proto->id;
        j.round = 1;
        j.deadline = now + spec->round_seconds;
        j.done = 0;
        if (slot_add(a, &j, 0) != 0) ok = 0; /* stored, but not served until the next open: say so */
    }
    if (!ok) {
        set_outcome(op, 500, "internal", "could not create the job");
        return;
    }
    set_outcome(op, 201, NULL, "");
    op->id = spec->id;
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) {
        cJSON_AddNumberToObject(f, "job", (double)spec->id);
        cJSON_AddStringToObject(f, "protocol", spec->proto->name);
    }
    agg_log(a, "info", "job_created", f);
}

/* A single-statement change of one job, in its own transaction. 0 or -1. */
static int job_update(dprec_agg *a, const char *sql, int64_t v, int64_t job) {
    if (exec(&a->w, "BEGIN IMMEDIATE") != 0) return -1;
    sqlite3_stmt *st = prep(&a->w, sql);
    int rc = -1;
    if (st != NULL) {
        sqlite3_bind_int64(st, 1, v);
        sqlite3_bind_int64(st, 2, job);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        finish(&a->w, st);
    }
    if (rc != 0 || exec(&a->w, "COMMIT") != 0) {
        log_db_error(a, &a->w, "job_update");
        exec(&a->w, "ROLLBACK");
        return -1;
    }
    return 0;
}

static void job_close(dprec_agg *a, agg_op *op) {
    agg_slot *s = slot_find(a, op->job);
    if (s == NULL) {
        set_outcome(op, 404, "not_found", "unknown job");
        return;
    }
    if (s->job.done) {
        set_outcome(op, 409, "job_done", "the job has finished");
        return;
    }
    int64_t rounds = s->job.rounds < s->job.round ? s->job.rounds : s->job.round;
    if (job_update(a, "UPDATE jobs SET rounds = ? WHERE id = ?", rounds, op->job) != 0) {
        set_outcome(op, 500, "internal", "state database error");
        return;
    }
    pthread_mutex_lock(&a->jobs_mu);
    s->job.rounds = rounds;
    pthread_mutex_unlock(&a->jobs_mu);
    set_outcome(op, 200, NULL, "");
}

/* ---- the round engine ------------------------------------------------------------------------------------ */

static int fin_add_waiter(agg_fin *f, agg_op *op) {
    agg_op **nw = realloc(f->waiters, (f->nwaiters + 1) * sizeof *nw);
    if (nw == NULL) return -1; /* not waited for: answered now, the round closes all the same */
    f->waiters = nw;
    f->waiters[f->nwaiters++] = op;
    op->pending++;
    return 0;
}

/* Marks s's open round closing (the writer only). NULL when it cannot be finalized now: out of memory, or closing
 * down (the finalizer has gone; the round stays open, as after a crash, and open resumes it). */
static agg_fin *fin_new(dprec_agg *a, agg_slot *s) {
    pthread_mutex_lock(&a->q_mu);
    int running = a->finalizer_running && !a->stopping;
    pthread_mutex_unlock(&a->q_mu);
    if (!running) return NULL;
    agg_fin *f = calloc(1, sizeof *f);
    if (f == NULL || job_copy(&s->job, &f->job) != 0) {
        free(f);
        agg_log(a, "error", "round_finalize_failed", NULL);
        return NULL;
    }
    f->round = s->job.round;
    f->count = s->in_round;
    f->op.kind = AGG_OP_FIN_DONE;
    f->op.fin = f;
    s->closing = 1;
    return f;
}

static void fin_queue(dprec_agg *a, agg_fin *f) {
    pthread_mutex_lock(&a->q_mu);
    if (a->f_tail != NULL) a->f_tail->next = f;
    else a->f_head = f;
    a->f_tail = f;
    pthread_cond_signal(&a->f_cv);
    pthread_mutex_unlock(&a->q_mu);
}

/* fin_new, waiter (may be NULL) added, queued. */
static void start_fin(dprec_agg *a, agg_slot *s, agg_op *waiter) {
    agg_fin *f = fin_new(a, s);
    if (f == NULL) return;
    if (waiter != NULL) fin_add_waiter(f, waiter);
    fin_queue(a, f);
}

typedef struct loaded_reports {
    agg_report *r;
    unsigned char **bufs;
    size_t n;
} loaded_reports;

static void loaded_free(loaded_reports *l) {
    for (size_t i = 0; i < l->n; i++) free(l->bufs[i]);
    free(l->bufs);
    free(l->r);
}

static int load_reports(agg_conn *c, int64_t job, int64_t round, loaded_reports *l) {
    memset(l, 0, sizeof *l);
    int64_t count = query_int(c, "SELECT count(*) FROM reports WHERE job = ? AND round = ?", 2, job, round, 0);
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

/* The finalizer's part: release r+1 from a read snapshot of round r, computed and signed. */
static void fin_compute(dprec_agg *a, agg_conn *c, agg_fin *f) {
    agg_model prev, next;
    loaded_reports l;
    memset(&prev, 0, sizeof prev);
    memset(&next, 0, sizeof next);
    memset(&l, 0, sizeof l);
    {
        cJSON *o = cJSON_CreateObject();
        if (o != NULL) {
            cJSON_AddNumberToObject(o, "job", (double)f->job.id);
            cJSON_AddNumberToObject(o, "round", (double)f->round);
            cJSON_AddNumberToObject(o, "reports", (double)f->count);
        }
        agg_log(a, "info", "round_finalize_started", o);
    }
    int rc = -1;
    pthread_mutex_lock(&c->mu); /* the connection only for the load: the global step runs without it */
    if (exec(c, "BEGIN") == 0) { /* one snapshot for the release and the reports */
        sqlite3_stmt *st = prep(c, "SELECT bytes FROM releases WHERE job = ? AND version = ?");
        if (st != NULL) {
            sqlite3_bind_int64(st, 1, f->job.id);
            sqlite3_bind_int64(st, 2, f->round);
            if (sqlite3_step(st) == SQLITE_ROW &&
                agg_release_to_model(sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0), &prev) == 0)
                rc = 0;
            else
                snprintf(f->err, sizeof f->err, "release %lld missing or damaged", (long long)f->round);
            finish(c, st);
        }
        if (rc == 0 && load_reports(c, f->job.id, f->round, &l) != 0) {
            snprintf(f->err, sizeof f->err, "loading the round's reports failed");
            rc = -1;
        }
        exec(c, "COMMIT");
    }
    if (rc != 0 && f->err[0] == '\0') snprintf(f->err, sizeof f->err, "%s", sqlite3_errmsg(c->db));
    pthread_mutex_unlock(&c->mu);
    if (rc == 0) {
        f->count = (int64_t)l.n;
        double *sum = NULL; /* a secure job's round: the unmasked noisy sum (agg_secure.h) */
        if (agg_secure_job(&f->job, NULL)) {
            sum = agg_secure_take_sum(a, f->job.id, f->round, &f->job.secure_survivors);
            f->job.secure_sum = sum;
            f->count = f->job.secure_survivors;
        }
        pthread_mutex_lock(&a->rng_mu);
        rc = f->job.proto->global_step(&f->job, &prev, l.r, l.n, &a->rng, &next, f->err, sizeof f->err);
        pthread_mutex_unlock(&a->rng_mu);
        f->job.secure_sum = NULL;
        free(sum);
    }
    loaded_free(&l);
    if (rc == 0) {
        agg_model_clamp(&next);
        rc = agg_release_build(a, &f->job, &next, (uint64_t)f->round + 1, &f->release, &f->release_len, f->err,
                               sizeof f->err);
    }
    if (rc != 0 && f->err[0] == '\0') snprintf(f->err, sizeof f->err, "the global step failed");
    f->ok = rc == 0;
    agg_model_free(&prev);
    agg_model_free(&next);
}

static void *finalizer_main(void *arg) {
    dprec_agg *a = arg;
    pthread_setname_np(pthread_self(), "dprec-finalize");
    /* shared with the readers (the writer's connection without durability), held for one round's load at a time */
    agg_conn *c = a->cfg.sync_full ? &a->readers[0] : &a->w;
    pthread_mutex_lock(&a->q_mu);
    for (;;) {
        while (a->f_head == NULL && !a->stopping) pthread_cond_wait(&a->f_cv, &a->q_mu);
        agg_fin *f = a->f_head;
        if (f == NULL) break;
        a->f_head = f->next;
        if (a->f_head == NULL) a->f_tail = NULL;
        f->next = NULL;
        a->fin_busy = 1;
        int abandon = a->stopping; /* closing: leave the round open, as a crash would (open resumes it) */
        pthread_mutex_unlock(&a->q_mu);
        if (abandon) {
            f->abandoned = 1;
        } else {
            fin_compute(a, c, f);
        }
        pthread_mutex_lock(&a->q_mu);
        f->op.next = NULL;
        enqueue(a, &f->op, 0);
        a->fin_busy = 0;
    }
    a->finalizer_running = 0;
    pthread_cond_broadcast(&a->q_cv);
    pthread_mutex_unlock(&a->q_mu);
    return NULL;
}

/* The writer's part: commits release r+1 if r is still the job's open round. 1 finalized, 0 not, -1 failed. */
static int fin_commit(dprec_agg *a, agg_slot *s, agg_fin *f, int *done_out) {
    if (!f->ok || s == NULL || s->job.done || s->job.round != f->round) return f->ok ? 0 : -1;
    int64_t job = f->job.id, round = f->round, now = agg_now(a);
    /* the job ends after `rounds` rounds (an operator may have lowered it meanwhile), or earlier if one more round
     * would pass its privacy budget */
    int done = round >= s->job.rounds;
    if (!done && s->job.proto->round_step != NULL) done = agg_budget_check(&s->job, round + 1, NULL) != 1;
    if (exec(&a->w, "BEGIN IMMEDIATE") != 0) goto fail;
    sqlite3_stmt *st = prep(&a->w, "SELECT round, state FROM jobs WHERE id = ?"); /* the exactly-once check */
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, job);
    int rc = sqlite3_step(st);
    int open = rc == SQLITE_ROW && sqlite3_column_int64(st, 0) == round &&
               strcmp((const char *)sqlite3_column_text(st, 1), "running") == 0;
    finish(&a->w, st);
    if (!open) {
        exec(&a->w, "ROLLBACK");
        return 0;
    }
    st = prep(&a->w, "INSERT INTO releases(job, version, bytes, created_at) VALUES(?, ?, ?, ?)");
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int64(st, 2, round + 1);
    sqlite3_bind_blob64(st, 3, f->release, f->release_len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now);
    rc = sqlite3_step(st);
    finish(&a->w, st);
    if (rc != SQLITE_DONE) goto fail;
    /* the payloads did their work: drop them with the finalization, atomically (a crash keeps both or neither).
     * The rows stay for idempotency; SQLite reuses the freed pages for the next round's payloads. The UPDATE
     * empties payloads that a state from before report_payloads holds in the row itself. */
    if (!a->cfg.keep_report_payloads) {
        static const char *const drop[2] = {
            "DELETE FROM report_payloads WHERE id IN (SELECT id FROM reports WHERE job = ? AND round = ?)",
            "UPDATE reports SET bytes = x'' WHERE job = ? AND round = ? AND length(bytes) > 0"};
        for (int k = 0; k < 2; k++) {
            st = prep(&a->w, drop[k]);
            if (st == NULL) goto fail;
            sqlite3_bind_int64(st, 1, job);
            sqlite3_bind_int64(st, 2, round);
            rc = sqlite3_step(st);
            finish(&a->w, st);
            if (rc != SQLITE_DONE) goto fail;
        }
    }
    if (s->job.proto->round_step != NULL) {
        double spent = 0.0;
        agg_budget_check(&s->job, round, &spent);
        st = prep(&a->w, "INSERT OR REPLACE INTO ledger(job, epsilon_spent, delta) VALUES(?, ?, ?)");
        if (st == NULL) goto fail;
        sqlite3_bind_int64(st, 1, job);
        sqlite3_bind_double(st, 2, spent);
        sqlite3_bind_double(st, 3, s->job.budget_delta);
        rc = sqlite3_step(st);
        finish(&a->w, st);
        if (rc != SQLITE_DONE) goto fail;
    }
    st = prep(&a->w, "UPDATE jobs SET round = ?, deadline = ?, state = ? WHERE id = ?");
    if (st == NULL) goto fail;
    sqlite3_bind_int64(st, 1, round + 1);
    sqlite3_bind_int64(st, 2, now + s->job.round_seconds);
    sqlite3_bind_text(st, 3, done ? "done" : "running", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, job);
    rc = sqlite3_step(st);
    finish(&a->w, st);
    if (rc != SQLITE_DONE || exec(&a->w, "COMMIT") != 0) goto fail;
    pthread_mutex_lock(&a->jobs_mu);
    s->job.round = round + 1;
    s->job.deadline = now + s->job.round_seconds;
    s->job.done = done;
    s->in_round = 0;
    pthread_mutex_unlock(&a->jobs_mu);
    *done_out = done;
    return 1;
fail:
    snprintf(f->err, sizeof f->err, "%s", sqlite3_errmsg(a->w.db));
    exec(&a->w, "ROLLBACK");
    return -1;
}

/* A finalization came back: commit it, then answer its waiters and put the held operations back in the queue. */
static void fin_done(dprec_agg *a, agg_fin *f, agg_op ***done_tail) {
    agg_slot *s = slot_find(a, f->job.id);
    int done = 0;
    int result = f->abandoned ? 0 : fin_commit(a, s, f, &done);
    cJSON *o = cJSON_CreateObject();
    if (o != NULL) {
        cJSON_AddNumberToObject(o, "job", (double)f->job.id);
        cJSON_AddNumberToObject(o, "round", (double)f->round);
    }
    if (result == 1) {
        agg_count_round(a);
        if (o != NULL) {
            cJSON_AddNumberToObject(o, "reports", (double)f->count);
            cJSON_AddNumberToObject(o, "release_version", (double)(f->round + 1));
            cJSON_AddBoolToObject(o, "job_done", done);
        }
        agg_log(a, "info", "round_finalized", o);
    } else if (result < 0) {
        if (o != NULL) cJSON_AddStringToObject(o, "error", f->err);
        agg_log(a, "error", "round_finalize_failed", o);
    } else if (f->abandoned) {
        if (o != NULL) cJSON_AddStringToObject(o, "message", "shutting down: the round stays open and resumes at the next start");
        agg_log(a, "warn", "round_finalize_abandoned", o);
    } else {
        cJSON_Delete(o);
    }
    for (size_t i = 0; i < f->nwaiters; i++) {
        agg_op *w = f->waiters[i];
        if (result == 1) w->finalized++;
        if (w->kind == AGG_OP_ROUND_CLOSE) {
            if (result < 0) set_outcome(w, 500, "internal", "finalizing the round failed");
            else if (result == 0 && f->abandoned) set_outcome(w, 503, "shutting_down", "the aggregator is shutting down");
            else if (result == 0) set_outcome(w, 409, "round_closed", "the round was closed meanwhile");
            else set_outcome(w, 200, NULL, "");
        }
        if (--w->pending == 0) {
            w->next = NULL;
            **done_tail = w;
            *done_tail = &w->next;
        }
    }
    if (s != NULL) {
        s->closing = 0;
        if (s->held != NULL) {
            pthread_mutex_lock(&a->q_mu);
            enqueue(a, s->held, 1);
            pthread_mutex_unlock(&a->q_mu);
            s->held = NULL;
            s->held_tail = &s->held;
        }
    }
    free(f->waiters);
    free(f->release);
    agg_job_free(&f->job);
    free(f);
}

/* Deadlines: a due round closes, or (no reports; for central and joint protocols, fewer than min_reports) stays
 * open for another period. Extensions share one transaction. */
static void tick(dprec_agg *a, agg_op *op) {
    int64_t now = op->now;
    int64_t *ext = NULL;
    size_t next = 0;
    for (size_t i = 0; i < a->njobs; i++) {
        agg_slot *s = a->jobs[i];
        if (s->job.done || s->closing || s->job.deadline > now) continue;
        int early = agg_closes_early(&s->job);
        /* a secure job's round: each deadline closes its open phase; the unmasked round then finalizes (agg_secure.h) */
        int secure = agg_secure_job(&s->job, NULL);
        if (secure ? !agg_secure_deadline(a, &s->job) : (s->in_round == 0 || (!early && s->in_round < s->job.min_reports))) {
            int64_t *ne = realloc(ext, (next + 1) * sizeof *ne);
            if (ne == NULL) continue;
            ext = ne;
            ext[next++] = (int64_t)i;
        } else {
            start_fin(a, s, op);
        }
    }
    if (next > 0) {
        int ok = exec(&a->w, "BEGIN IMMEDIATE") == 0;
        for (size_t k = 0; ok && k < next; k++) {
            agg_slot *s = a->jobs[ext[k]];
            sqlite3_stmt *st = prep(&a->w, "UPDATE jobs SET deadline = ? WHERE id = ?");
            ok = st != NULL;
            if (ok) {
                sqlite3_bind_int64(st, 1, now + s->job.round_seconds);
                sqlite3_bind_int64(st, 2, s->job.id);
                ok = sqlite3_step(st) == SQLITE_DONE;
                finish(&a->w, st);
            }
        }
        if (ok && exec(&a->w, "COMMIT") == 0) {
            pthread_mutex_lock(&a->jobs_mu);
            for (size_t k = 0; k < next; k++) a->jobs[ext[k]]->job.deadline = now + a->jobs[ext[k]]->job.round_seconds;
            pthread_mutex_unlock(&a->jobs_mu);
            pthread_mutex_lock(&a->m_mu);
            a->metrics.deadlines_extended += next;
            pthread_mutex_unlock(&a->m_mu);
        } else {
            log_db_error(a, &a->w, "deadline");
            exec(&a->w, "ROLLBACK");
        }
    }
    free(ext);
    set_outcome(op, 200, NULL, "");
}

/* At open: an early-closing round that holds min_reports but whose finalization never committed (a crash). */
static void resume(dprec_agg *a, agg_op *op) {
    for (size_t i = 0; i < a->njobs; i++) {
        agg_slot *s = a->jobs[i];
        if (!s->job.done && !s->closing && agg_closes_early(&s->job) && s->in_round >= s->job.min_reports)
            start_fin(a, s, op);
    }
    set_outcome(op, 200, NULL, "");
}

static void round_close(dprec_agg *a, agg_op *op, agg_op ***done_tail) {
    agg_slot *s = slot_find(a, op->job);
    if (s == NULL) set_outcome(op, 404, "not_found", "unknown job");
    else if (s->job.done) set_outcome(op, 409, "job_done", "the job has finished");
    else if (s->closing) { /* after the finalization under way: then this round is closed, or still open */
        op->next = NULL;
        *s->held_tail = op;
        s->held_tail = &op->next;
        return;
    } else if ((int64_t)op->round != s->job.round)
        set_outcome(op, 409, "round_closed", "the round was closed meanwhile");
    else {
        agg_fin *f = fin_new(a, s);
        if (f != NULL && fin_add_waiter(f, op) == 0) {
            fin_queue(a, f);
            return;
        }
        if (f != NULL) fin_queue(a, f); /* the round closes; this caller is answered now */
        set_outcome(op, 503, "shutting_down", "the round cannot be finalized now");
    }
    op->next = NULL;
    **done_tail = op;
    *done_tail = &op->next;
}

/* One pass of the writer over what was queued: the reports and registrations in one transaction, then the rest in
 * order; then every operation that is finished is completed. */
static void run_ops(dprec_agg *a, agg_op *list) {
    agg_op *batch = NULL, **batch_tail = &batch, *rest = NULL, **rest_tail = &rest, *next;
    for (agg_op *op = list; op != NULL; op = next) {
        next = op->next;
        op->next = NULL;
        if (op->kind == AGG_OP_REPORT || op->kind == AGG_OP_REGISTER) *batch_tail = op, batch_tail = &op->next;
        else *rest_tail = op, rest_tail = &op->next;
    }
    agg_op *done = NULL, **done_tail = &done;
    if (batch != NULL) run_batch(a, batch, &done_tail);
    for (agg_op *op = rest; op != NULL; op = next) {
        next = op->next;
        op->next = NULL;
        switch (op->kind) {
        case AGG_OP_JOB_CREATE: job_create(a, op); break;
        case AGG_OP_JOB_CLOSE: job_close(a, op); break;
        case AGG_OP_ROUND_CLOSE: round_close(a, op, &done_tail); continue;
        case AGG_OP_TICK: tick(a, op); break;
        case AGG_OP_RESUME: resume(a, op); break;
        case AGG_OP_FIN_DONE: fin_done(a, op->fin, &done_tail); continue;
        default: set_outcome(op, 500, "internal", "unknown operation"); break;
        }
        if (op->pending > 0) continue; /* completed by the finalizations it waits for */
        *done_tail = op;
        done_tail = &op->next;
    }
    for (agg_op *op = done; op != NULL; op = next) {
        next = op->next;
        complete(op);
    }
}

static void *writer_main(void *arg) {
    dprec_agg *a = arg;
    pthread_setname_np(pthread_self(), "dprec-writer");
    pthread_mutex_lock(&a->q_mu);
    for (;;) {
        /* closing: the queue drains, and the finalizer's last result is committed before the writer leaves */
        while (a->q_head == NULL && !(a->stopping && !a->finalizer_running)) pthread_cond_wait(&a->q_cv, &a->q_mu);
        agg_op *list = a->q_head;
        if (list == NULL) break;
        a->q_head = a->q_tail = NULL;
        pthread_mutex_unlock(&a->q_mu);
        pthread_mutex_lock(&a->w.mu); /* uncontended unless readers share the connection (no durability) */
        run_ops(a, list);
        pthread_mutex_unlock(&a->w.mu);
        pthread_mutex_lock(&a->q_mu);
    }
    a->writer_running = 0;
    pthread_mutex_unlock(&a->q_mu);
    return NULL;
}

/* ---- checkpoints ----------------------------------------------------------------------------------------- */

/* The WAL is copied back into the database by a thread of its own (PASSIVE checkpoints on its own connection), not
 * inside a commit: SQLite's automatic checkpoint runs in the COMMIT that crosses 1000 pages, and its fsyncs of the
 * database file then delay every report of that batch. Durability is the same: a checkpoint only copies what is
 * committed, and a crash in the middle of one is recovered from the WAL. */
#define AGG_CKPT_PAGES 8000 /* 32 MB of WAL: a page the batches rewrite many times is copied once per checkpoint */

static int wal_hook(void *arg, sqlite3 *db, const char *name, int pages) {
    (void)db;
    (void)name;
    dprec_agg *a = arg;
    if (pages >= AGG_CKPT_PAGES) {
        pthread_mutex_lock(&a->q_mu);
        a->ckpt_wanted = 1;
        pthread_cond_signal(&a->c_cv);
        pthread_mutex_unlock(&a->q_mu);
    }
    return SQLITE_OK;
}

static void *checkpointer_main(void *arg) {
    dprec_agg *a = arg;
    pthread_setname_np(pthread_self(), "dprec-checkpt");
    pthread_mutex_lock(&a->q_mu);
    while (!a->stopping) {
        while (!a->ckpt_wanted && !a->stopping) pthread_cond_wait(&a->c_cv, &a->q_mu);
        if (a->stopping) break;
        a->ckpt_wanted = 0;
        pthread_mutex_unlock(&a->q_mu);
        int log = 0, done = 0;
        int rc = sqlite3_wal_checkpoint_v2(a->ckpt.db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
        if (rc != SQLITE_OK && sqlite3_errcode(a->ckpt.db) != SQLITE_BUSY)
            log_db_error(a, &a->ckpt, "checkpoint");
        pthread_mutex_lock(&a->q_mu);
    }
    a->ckpt_running = 0;
    pthread_mutex_unlock(&a->q_mu);
    return NULL;
}

/* ---- synchronous helpers --------------------------------------------------------------------------------- */

typedef struct waiter {
    agg_op op;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} waiter;

static void waiter_done(agg_op *op) {
    waiter *w = (waiter *)op;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Submits a TICK or RESUME and waits for it and the finalizations it started. Returns the rounds finalized. */
static int run_sync(dprec_agg *a, agg_op_kind kind, int64_t now) {
    waiter w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    w.op.kind = kind;
    w.op.now = now;
    w.op.done = waiter_done;
    agg_submit(a, &w.op);
    pthread_mutex_lock(&w.mu);
    while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return w.op.status == 200 ? w.op.finalized : -1;
}

int dprec_agg_tick(dprec_agg *a, int64_t now) {
    if (a == NULL) return 0;
    pthread_mutex_lock(&a->m_mu);
    if (now > a->last_tick) a->last_tick = now;
    pthread_mutex_unlock(&a->m_mu);
    return run_sync(a, AGG_OP_TICK, now);
}

static void free_done(agg_op *op) {
    free(op);
}

void dprec_agg_tick_async(dprec_agg *a, int64_t now) {
    if (a == NULL) return;
    pthread_mutex_lock(&a->m_mu);
    if (now > a->last_tick) a->last_tick = now;
    pthread_mutex_unlock(&a->m_mu);
    agg_op *op = calloc(1, sizeof *op);
    if (op == NULL) return;
    op->kind = AGG_OP_TICK;
    op->now = now;
    op->done = free_done;
    agg_submit(a, op);
}

/* ---- open / close ------------------------------------------------------------------------------------- */

/* The state file and its WAL and shared-memory files hold every device's reports: readable by the owner only
 * (SQLite gives the -wal and -shm files the database file's mode). */
static int make_private(const char *path, char *err, size_t errcap) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errcap, "cannot open the state database %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = fstat(fd, &st) == 0 && ((st.st_mode & 077) == 0 || fchmod(fd, 0600) == 0) ? 0 : -1;
    if (rc != 0) snprintf(err, errcap, "cannot make %s private (0600): %s", path, strerror(errno));
    close(fd);
    static const char *const side[] = {"-wal", "-shm"};
    for (size_t i = 0; rc == 0 && i < 2; i++) {
        char p[4096];
        if ((size_t)snprintf(p, sizeof p, "%s%s", path, side[i]) < sizeof p && stat(p, &st) == 0 && (st.st_mode & 077) != 0)
            (void)chmod(p, 0600);
    }
    return rc;
}

static int conn_open(dprec_agg *a, agg_conn *c, int writer, char *err, size_t errcap) {
    int flags = (writer ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY) | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(a->cfg.state_path, &c->db, flags, NULL) != SQLITE_OK) {
        snprintf(err, errcap, "cannot open the state database %s: %s", a->cfg.state_path,
                 c->db ? sqlite3_errmsg(c->db) : "out of memory");
        return -1;
    }
    sqlite3_busy_timeout(c->db, 5000);
    return 0;
}

static void stop_threads(dprec_agg *a) {
    pthread_mutex_lock(&a->q_mu);
    int w = a->writer_running, f = a->finalizer_running, c = a->ckpt_running;
    a->stopping = 1;
    pthread_cond_broadcast(&a->q_cv);
    pthread_cond_broadcast(&a->f_cv);
    pthread_cond_broadcast(&a->c_cv);
    pthread_mutex_unlock(&a->q_mu);
    if (f) pthread_join(a->finalizer, NULL);
    if (w) pthread_join(a->writer, NULL);
    if (c) pthread_join(a->checkpointer, NULL);
}

int agg_state_open(dprec_agg *a, char *err, size_t errcap) {
    if (a->secure == NULL && agg_secure_init(a) != 0) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    pthread_mutex_init(&a->jobs_mu, NULL);
    pthread_mutex_init(&a->q_mu, NULL);
    pthread_cond_init(&a->q_cv, NULL);
    pthread_cond_init(&a->f_cv, NULL);
    pthread_cond_init(&a->c_cv, NULL);
    for (int i = 0; i < AGG_READERS; i++) pthread_mutex_init(&a->readers[i].mu, NULL);
    pthread_mutex_init(&a->w.mu, NULL);
    a->next_job_id = 1;
    if (make_private(a->cfg.state_path, err, errcap) != 0 || conn_open(a, &a->w, 1, err, errcap) != 0) return -1;
    char sync_sql[64];
    snprintf(sync_sql, sizeof sync_sql, "PRAGMA synchronous=%s", a->cfg.sync_full ? "FULL" : "NORMAL");
    sqlite3_stmt *st = prep_uncached(&a->w, "PRAGMA journal_mode=WAL");
    const unsigned char *mode = NULL;
    int wal = 0;
    if (st != NULL && sqlite3_step(st) == SQLITE_ROW) {
        mode = sqlite3_column_text(st, 0);
        wal = mode != NULL && strcmp((const char *)mode, "wal") == 0;
    }
    sqlite3_finalize(st);
    /* a page cache that holds the indexes the group commit touches at random (report ids, token hashes): with
     * SQLite's default 2 MB, every batch re-read its index pages from the file */
    if (!wal || exec(&a->w, sync_sql) != 0 || exec(&a->w, "PRAGMA foreign_keys=ON") != 0 ||
        exec(&a->w, "PRAGMA cache_size=-65536") != 0) {
        snprintf(err, errcap, "cannot configure the state database (WAL): %s", sqlite3_errmsg(a->w.db));
        return -1;
    }
    int64_t version = query_int(&a->w, "PRAGMA user_version", 0, 0, 0, 0);
    if (version < 0 || version > AGG_SCHEMA_VERSION) {
        snprintf(err, errcap, "state database schema version %lld is newer than this build (%d)", (long long)version,
                 AGG_SCHEMA_VERSION);
        return -1;
    }
    if (version == 0) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version=%d", AGG_SCHEMA_VERSION);
        if (exec(&a->w, "BEGIN IMMEDIATE") != 0 || exec(&a->w, schema_sql) != 0 || exec(&a->w, sql) != 0 ||
            exec(&a->w, "COMMIT") != 0) {
            snprintf(err, errcap, "cannot create the schema: %s", sqlite3_errmsg(a->w.db));
            exec(&a->w, "ROLLBACK");
            return -1;
        }
    }
    /* the job table, with each open round's report count */
    st = prep_uncached(&a->w, "SELECT id FROM jobs ORDER BY id");
    int rc = st != NULL ? SQLITE_ROW : SQLITE_ERROR;
    while (st != NULL && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        agg_job j;
        int64_t id = sqlite3_column_int64(st, 0);
        if (job_load_row(&a->w, id, &j) != 1) {
            rc = SQLITE_ERROR;
            break;
        }
        int64_t n = j.done ? 0 : query_int(&a->w, "SELECT count(*) FROM reports WHERE job = ? AND round = ?", 2, id, j.round, 0);
        if (n < 0 || slot_add(a, &j, n) != 0) rc = SQLITE_ERROR;
        agg_job_free(&j);
        if (rc == SQLITE_ERROR) break;
    }
    sqlite3_finalize(st);
    int64_t seq = query_int(&a->w, "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'", 0, 0, 0, 0);
    if (rc != SQLITE_DONE || seq < 0) {
        snprintf(err, errcap, "cannot read the jobs: %s", sqlite3_errmsg(a->w.db));
        return -1;
    }
    if (seq + 1 > a->next_job_id) a->next_job_id = seq + 1;
    if (!a->cfg.sync_full) {
        /* a throw-away state (no durability; nothing else opens it): one connection, an exclusive lock kept for the
         * connection's life, SQLite's own checkpoints */
        if (exec(&a->w, "PRAGMA locking_mode=EXCLUSIVE") != 0) {
            snprintf(err, errcap, "cannot configure the state database: %s", sqlite3_errmsg(a->w.db));
            return -1;
        }
    } else {
        for (int i = 0; i < AGG_READERS; i++) {
            if (conn_open(a, &a->readers[i], 0, err, errcap) != 0) return -1;
            exec(&a->readers[i], "PRAGMA query_only=1");
            exec(&a->readers[i], "PRAGMA cache_size=-16384");
        }
        /* the checkpointer's connection must have read the database once to know it is in WAL mode (until then a
         * checkpoint on it does nothing and says log = -1) */
        if (conn_open(a, &a->ckpt, 1, err, errcap) != 0 || exec(&a->ckpt, "PRAGMA journal_mode=WAL") != 0 ||
            query_int(&a->ckpt, "SELECT count(*) FROM sqlite_master", 0, 0, 0, 0) < 0) {
            snprintf(err, errcap, "cannot open the checkpoint connection: %s", sqlite3_errmsg(a->ckpt.db));
            return -1;
        }
        if (exec(&a->w, "PRAGMA wal_autocheckpoint=0") != 0 || exec(&a->w, "PRAGMA journal_size_limit=67108864") != 0) {
            snprintf(err, errcap, "cannot configure the state database: %s", sqlite3_errmsg(a->w.db));
            return -1;
        }
        sqlite3_wal_hook(a->w.db, wal_hook, a);
        a->ckpt_running = 1;
        if (pthread_create(&a->checkpointer, NULL, checkpointer_main, a) != 0) {
            a->ckpt_running = 0;
            snprintf(err, errcap, "cannot start the checkpoint thread");
            return -1;
        }
    }
    a->writer_running = a->finalizer_running = 1;
    if (pthread_create(&a->writer, NULL, writer_main, a) != 0) {
        a->writer_running = a->finalizer_running = 0;
        snprintf(err, errcap, "cannot start the writer thread");
        return -1;
    }
    if (pthread_create(&a->finalizer, NULL, finalizer_main, a) != 0) {
        a->finalizer_running = 0;
        stop_threads(a);
        snprintf(err, errcap, "cannot start the finalizer thread");
        return -1;
    }
    /* resume: a round that has its reports but whose finalization did not commit (crash) closes now; rounds past
     * their deadline are left to the first tick */
    if (run_sync(a, AGG_OP_RESUME, agg_now(a)) < 0) {
        snprintf(err, errcap, "resuming the open rounds failed");
        return -1;
    }
    agg_log(a, "info", "state_opened", NULL);
    return 0;
}

void agg_state_close(dprec_agg *a) {
    stop_threads(a);
    conn_close(&a->ckpt);
    conn_close(&a->w);
    pthread_mutex_destroy(&a->w.mu);
    for (int i = 0; i < AGG_READERS; i++) {
        conn_close(&a->readers[i]);
        pthread_mutex_destroy(&a->readers[i].mu);
    }
    for (size_t i = 0; i < a->njobs; i++) {
        agg_job_free(&a->jobs[i]->job);
        free(a->jobs[i]);
    }
    free(a->jobs);
    a->jobs = NULL;
    a->njobs = a->jobs_cap = 0;
    agg_secure_free(a);
    pthread_mutex_destroy(&a->jobs_mu);
    pthread_mutex_destroy(&a->q_mu);
    pthread_cond_destroy(&a->q_cv);
    pthread_cond_destroy(&a->f_cv);
    pthread_cond_destroy(&a->c_cv);
}

/* Whether a round may close as soon as it holds min_reports reports. Only where the guarantee is each device's
 * own (local DP) or there is none: for central and joint protocols, closing at a count makes who is included
 * depend on who else reported (a replace-one relation: the add/remove sensitivity doubles and Poisson
 * amplification no longer applies), so their rounds close at the deadline (or by the operator), and min_reports
 * is the least they close with (docs/protocol.md, docs/privacy.md). */
int agg_closes_early(const agg_job *j) {
    dprec_model m = agg_job_model(j);
    return m == DPREC_MODEL_LOCAL || m == DPREC_MODEL_NONE;
}
