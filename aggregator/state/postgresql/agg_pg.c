/* dprec aggregator core — the PostgreSQL engine of the store (state/agg_store_engine.h), through libpq: every read and
 * write the layers above ask of the state (agg_store.h), each a function with its SQL, and the engine's table.
 *
 * The same guarantees as the SQLite engine, kept by the database itself. Durable before the 200: the writer's session
 * never runs with synchronous_commit off, so COMMIT returns once the WAL is flushed, and the round engine acknowledges a
 * report only after the COMMIT of its batch. Exactly once per (job, report id) and per (job, round, device): unique
 * constraints, met with INSERT ... ON CONFLICT DO NOTHING, so that a retry or a second report is told apart without
 * failing the batch's transaction (in PostgreSQL any error fails the whole transaction: a batch in which a statement
 * fails for another reason fails at its COMMIT, and the round engine answers all of its reports 500, which devices
 * retry). A round finalized exactly once: its commit starts with a conditional UPDATE of the job's row (the round must
 * still be the open one and the job running), which also locks the row until the COMMIT. Releases contiguous and
 * immutable: triggers of the schema (agg_pg_open.c) refuse a release r + 1 without release r, and any UPDATE or DELETE.
 *
 * Every parameter and result travels in libpq's binary format (integers, doubles and bytes are copied, never printed
 * and parsed; a release's megabytes are not hex-encoded). Each statement is prepared once per connection.
 *
 * Several aggregators may share the database (docs/notes/multi-instance.md): every instance inserts reports, and the one
 * holding a job's lease (leases_renew, agg_pg_instances.c with the rest of what instances share) finalizes its rounds,
 * first marking the round closing (round_closing), which the fenced report insert here respects. In each instance, a
 * single writer, as for SQLite: the round engine's writer thread owns the writer's connection, and readers use a pool
 * of read-only connections, so a commit waiting for its flush blocks no reader. A connection that was lost is made
 * again at the start of the next unit of work (a batch, a round's commit, a reader's query). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_pg_priv.h"

/* PostgreSQL's type OIDs (catalog/pg_type.h, stable since the first releases) */
enum { OID_BYTEA = 17, OID_INT8 = 20, OID_TEXT = 25, OID_FLOAT8 = 701 };

/* ---- parameters and columns ------------------------------------------------------------------------------------ */

static void put_be64(unsigned char *b, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8) b[i] = (unsigned char)v;
}

static uint64_t get_be(const unsigned char *b, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | b[i];
    return v;
}

static int p_next(agg_pg_params *p, Oid type) {
    int i = p->n++;
    p->types[i] = type;
    p->values[i] = NULL;
    p->lengths[i] = 0;
    p->formats[i] = 1;
    return i;
}

void agg_pg_p_i64(agg_pg_params *p, int64_t v) {
    int i = p_next(p, OID_INT8);
    put_be64(p->num[i], (uint64_t)v);
    p->values[i] = (const char *)p->num[i];
    p->lengths[i] = 8;
}

void agg_pg_p_f64(agg_pg_params *p, double v) {
    int i = p_next(p, OID_FLOAT8);
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    put_be64(p->num[i], u);
    p->values[i] = (const char *)p->num[i];
    p->lengths[i] = 8;
}

void agg_pg_p_null_f64(agg_pg_params *p) {
    (void)p_next(p, OID_FLOAT8);
}

void agg_pg_p_text(agg_pg_params *p, const char *s) {
    int i = p_next(p, OID_TEXT);
    p->formats[i] = 0;
    p->values[i] = s;
}

void agg_pg_p_bytes(agg_pg_params *p, const void *b, size_t len) {
    int i = p_next(p, OID_BYTEA);
    if (len > (size_t)INT_MAX) { /* libpq's lengths are ints (and a field is at most 1 GB) */
        p->too_long = 1;
        len = 0;
    }
    p->values[i] = b == NULL ? NULL : len > 0 ? (const char *)b : ""; /* NULL is SQL's NULL, "" an empty value */
    p->lengths[i] = (int)len;
}

int64_t agg_pg_col_i64(const PGresult *r, int row, int col) {
    int n = PQgetlength(r, row, col);
    const unsigned char *b = (const unsigned char *)PQgetvalue(r, row, col);
    if (PQgetisnull(r, row, col) || (n != 2 && n != 4 && n != 8)) return 0;
    uint64_t v = get_be(b, n);
    if (n < 8 && (v >> (8 * n - 1)) != 0) v |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    return (int64_t)v;
}

double agg_pg_col_f64(const PGresult *r, int row, int col) {
    if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 8) return NAN;
    uint64_t u = get_be((const unsigned char *)PQgetvalue(r, row, col), 8);
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

const unsigned char *agg_pg_col_bytes(const PGresult *r, int row, int col, size_t *len) {
    *len = PQgetisnull(r, row, col) ? 0 : (size_t)PQgetlength(r, row, col);
    return PQgetisnull(r, row, col) ? NULL : (const unsigned char *)PQgetvalue(r, row, col);
}

/* ---- running statements ------------------------------------------------------------------------------------------ */

void agg_pg_fail(agg_pg_conn *c, const PGresult *res) {
    const char *m = res != NULL ? PQresultErrorMessage(res) : "";
    if (m == NULL || m[0] == '\0') m = c->db != NULL ? PQerrorMessage(c->db) : "no connection";
    snprintf(c->err, sizeof c->err, "%s", m);
    size_t n = strlen(c->err);
    while (n > 0 && (c->err[n - 1] == '\n' || c->err[n - 1] == ' ')) c->err[--n] = '\0';
    const char *st = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    snprintf(c->sqlstate, sizeof c->sqlstate, "%s", st != NULL ? st : "");
}

/* The slot of sql's prepared statement on c, prepared now if it is new (with p's types); -1 on failure, or when the
 * cache is full (the statement then runs unnamed). */
static int stmt_slot(agg_pg_conn *c, const char *sql, const agg_pg_params *p, int *failed) {
    *failed = 0;
    for (size_t i = 0; i < c->nstmts; i++)
        if (c->stmts[i] == sql) return (int)i;
    if (c->nstmts == AGG_PG_STMT_CACHE) return -1;
    char name[16];
    snprintf(name, sizeof name, "s%zu", c->nstmts);
    PGresult *res = PQprepare(c->db, name, sql, p != NULL ? p->n : 0, p != NULL ? p->types : NULL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        agg_pg_fail(c, res);
        PQclear(res);
        *failed = 1;
        return -1;
    }
    PQclear(res);
    c->stmts[c->nstmts] = sql;
    return (int)c->nstmts++;
}

/* Sends sql with p (prepared where it can be) and leaves its results to be read: 0, or -1 (c->err set). */
static int send(agg_pg_conn *c, const char *sql, const agg_pg_params *p) {
    if (p != NULL && p->too_long) {
        snprintf(c->err, sizeof c->err, "a value is too long for PostgreSQL (at most 1 GB)");
        c->sqlstate[0] = '\0';
        return -1;
    }
    int failed = 0, slot = stmt_slot(c, sql, p, &failed);
    if (failed) return -1;
    int n = p != NULL ? p->n : 0;
    const char *const *v = p != NULL ? p->values : NULL;
    const int *l = p != NULL ? p->lengths : NULL, *f = p != NULL ? p->formats : NULL;
    int ok;
    if (slot >= 0) {
        char name[16];
        snprintf(name, sizeof name, "s%d", slot);
        ok = PQsendQueryPrepared(c->db, name, n, v, l, f, 1);
    } else {
        ok = PQsendQueryParams(c->db, sql, n, p != NULL ? p->types : NULL, v, l, f, 1);
    }
    if (!ok) agg_pg_fail(c, NULL);
    return ok ? 0 : -1;
}

PGresult *agg_pg_run(agg_pg_conn *c, const char *sql, const agg_pg_params *p) {
    if (send(c, sql, p) != 0) return NULL;
    PGresult *res = NULL, *r;
    while ((r = PQgetResult(c->db)) != NULL) { /* the last result is the statement's */
        PQclear(res);
        res = r;
    }
    ExecStatusType st = PQresultStatus(res);
    if (res == NULL || (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)) {
        agg_pg_fail(c, res);
        PQclear(res);
        return NULL;
    }
    return res;
}

int agg_pg_exec(agg_pg_conn *c, const char *sql) {
    PGresult *res = PQexec(c->db, sql);
    ExecStatusType st = PQresultStatus(res);
    int ok = res != NULL && (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK);
    if (!ok) agg_pg_fail(c, res);
    PQclear(res);
    return ok ? 0 : -1;
}

int agg_pg_commit(agg_pg_conn *c) {
    PGresult *res = PQexec(c->db, "COMMIT");
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(res), "COMMIT") == 0;
    if (!ok) {
        agg_pg_fail(c, res);
        if (c->err[0] == '\0' || PQresultStatus(res) == PGRES_COMMAND_OK)
            snprintf(c->err, sizeof c->err, "the transaction failed before its commit (rolled back)");
    }
    PQclear(res);
    return ok ? 0 : -1;
}

int64_t agg_pg_query_i64(agg_pg_conn *c, const char *sql, const agg_pg_params *p, int64_t def) {
    PGresult *res = agg_pg_run(c, sql, p);
    if (res == NULL) return -1;
    int64_t v = PQntuples(res) > 0 && !PQgetisnull(res, 0, 0) ? agg_pg_col_i64(res, 0, 0) : def;
    PQclear(res);
    return v;
}

void agg_pg_log_conn_error(dprec_agg *a, agg_pg_conn *c, const char *what) {
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) {
        cJSON_AddStringToObject(f, "what", what);
        cJSON_AddStringToObject(f, "postgresql", c->err[0] != '\0' ? c->err : "unknown error");
        if (c->sqlstate[0] != '\0') cJSON_AddStringToObject(f, "sqlstate", c->sqlstate);
    }
    agg_log(a, "error", "db_error", f);
}

/* A reader's connection from the pool, usable (made again if it was lost), or NULL with its error logged. */
agg_pg_conn *agg_pg_reader_get(dprec_agg *a) {
    agg_pg_store *s = PG_STORE(a);
    unsigned start = __atomic_fetch_add(&s->reader_next, 1u, __ATOMIC_RELAXED);
    agg_pg_conn *c = NULL;
    for (unsigned k = 0; k < AGG_PG_READERS && c == NULL; k++) {
        agg_pg_conn *t = &s->readers[(start + k) % AGG_PG_READERS];
        if (pthread_mutex_trylock(&t->mu) == 0) c = t;
    }
    if (c == NULL) {
        c = &s->readers[start % AGG_PG_READERS];
        pthread_mutex_lock(&c->mu);
    }
    if (agg_pg_conn_check(c) != 0) {
        agg_pg_log_conn_error(a, c, "reconnect");
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    return c;
}

void agg_pg_reader_put(agg_pg_conn *c) {
    pthread_mutex_unlock(&c->mu);
}

/* One statement of its own on a reader (its result; the reader held in *held for agg_pg_reader_put, or NULL when none
 * could be had). A session found lost by this statement is made again and the statement run once more: a read outside
 * a transaction changes nothing, so running it again is safe. */
PGresult *agg_pg_reader_run(dprec_agg *a, const char *sql, const agg_pg_params *p, agg_pg_conn **held) {
    agg_pg_conn *c = *held = agg_pg_reader_get(a);
    if (c == NULL) return NULL;
    PGresult *r = agg_pg_run(c, sql, p);
    if (r == NULL && PQstatus(c->db) != CONNECTION_OK && agg_pg_conn_check(c) == 0) r = agg_pg_run(c, sql, p);
    return r;
}

/* `begin` (a BEGIN statement) on c, made again if its session was lost: known lost before, or found lost by this
 * BEGIN (nothing was done in the lost session's transaction, so beginning again on a new one is safe). 0 or -1. */
static int begin_on(agg_pg_conn *c, const char *begin) {
    if (agg_pg_conn_check(c) != 0) return -1;
    if (agg_pg_exec(c, begin) == 0) return 0;
    return PQstatus(c->db) != CONNECTION_OK && agg_pg_conn_check(c) == 0 && agg_pg_exec(c, begin) == 0 ? 0 : -1;
}

/* ---- the jobs' rows (open only) ---------------------------------------------------------------------------------- */

int agg_pg_job_row(agg_pg_conn *c, int64_t id, agg_job *out) {
    memset(out, 0, sizeof *out);
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, id);
    PGresult *r = agg_pg_run(c, "SELECT proto_id, d, m, rating_min, rating_max, rounds, min_reports, round_seconds,"
                                " participation, params, budget_epsilon, budget_delta, state, round, deadline, spec"
                                " FROM jobs WHERE id = $1", &p);
    if (r == NULL) return -1;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return 0;
    }
    out->id = id;
    out->proto_id = (uint16_t)agg_pg_col_i64(r, 0, 0);
    out->d = (uint32_t)agg_pg_col_i64(r, 0, 1);
    out->m = (uint32_t)agg_pg_col_i64(r, 0, 2);
    out->rating_min = agg_pg_col_f64(r, 0, 3);
    out->rating_max = agg_pg_col_f64(r, 0, 4);
    out->rounds = agg_pg_col_i64(r, 0, 5);
    out->min_reports = agg_pg_col_i64(r, 0, 6);
    out->round_seconds = agg_pg_col_i64(r, 0, 7);
    out->participation = agg_pg_col_f64(r, 0, 8);
    out->params = strdup(PQgetisnull(r, 0, 9) ? "{}" : PQgetvalue(r, 0, 9));
    out->has_budget = !PQgetisnull(r, 0, 10);
    out->budget_epsilon = out->has_budget ? agg_pg_col_f64(r, 0, 10) : 0;
    out->budget_delta = out->has_budget ? agg_pg_col_f64(r, 0, 11) : 0;
    out->done = strcmp(PQgetvalue(r, 0, 12), "done") == 0;
    out->round = agg_pg_col_i64(r, 0, 13);
    out->deadline = agg_pg_col_i64(r, 0, 14);
    agg_store_job_spec_fields(PQgetisnull(r, 0, 15) ? NULL : PQgetvalue(r, 0, 15), out);
    PQclear(r);
    if (out->params == NULL) {
        agg_job_free(out);
        return -1;
    }
    return 1;
}

/* ---- reads: any thread ------------------------------------------------------------------------------------------- */

/* A malloc'd copy of column col of row 0 (at least one byte allocated). 0, or -1 out of memory. */
static int copy_bytes(const PGresult *r, int col, unsigned char **out, size_t *len) {
    size_t n;
    const unsigned char *b = agg_pg_col_bytes(r, 0, col, &n);
    *out = malloc(n > 0 ? n : 1);
    if (*out == NULL) return -1;
    if (n > 0) memcpy(*out, b, n);
    *len = n;
    return 0;
}

static int release_get(dprec_agg *a, int64_t job, int64_t version, unsigned char **out, size_t *len) {
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    if (version > 0) agg_pg_p_i64(&p, version);
    agg_pg_conn *c;
    PGresult *r = version > 0
                      ? agg_pg_reader_run(a, "SELECT bytes FROM releases WHERE job = $1 AND version = $2", &p, &c)
                      : agg_pg_reader_run(a, "SELECT bytes FROM releases WHERE job = $1 ORDER BY version DESC LIMIT 1",
                                          &p, &c);
    int result = -1;
    if (r != NULL) result = PQntuples(r) == 0 ? 0 : copy_bytes(r, 0, out, len) == 0 ? 1 : -1;
    PQclear(r);
    if (c != NULL) agg_pg_reader_put(c);
    return result;
}

static int64_t device_by_token(dprec_agg *a, const unsigned char h[32]) {
    agg_pg_params p = {0};
    agg_pg_p_bytes(&p, h, 32);
    agg_pg_conn *c;
    PGresult *r = agg_pg_reader_run(a, "SELECT id FROM devices WHERE token_sha256 = $1", &p, &c);
    int64_t id = r == NULL ? -1 : PQntuples(r) > 0 ? agg_pg_col_i64(r, 0, 0) : 0;
    PQclear(r);
    if (c != NULL) agg_pg_reader_put(c);
    return id;
}

static int health(dprec_agg *a) {
    agg_pg_conn *c;
    PGresult *r = agg_pg_reader_run(a, "SELECT count(*) FROM dprec_schema", NULL, &c);
    PQclear(r);
    if (c != NULL) agg_pg_reader_put(c);
    return r != NULL ? 0 : -1;
}

static int device_enrollment(dprec_agg *a, int64_t device, agg_enrollment *out) {
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, device);
    agg_pg_conn *c;
    PGresult *r =
        agg_pg_reader_run(a, "SELECT identity, token, token_sha256 FROM enrollments WHERE device = $1", &p, &c);
    int result = -1;
    if (r != NULL && PQntuples(r) == 0) {
        result = 0;
    } else if (r != NULL) {
        size_t n, tn, dn;
        const unsigned char *id = agg_pg_col_bytes(r, 0, 0, &n), *tok = agg_pg_col_bytes(r, 0, 1, &tn),
                            *dig = agg_pg_col_bytes(r, 0, 2, &dn);
        if (n == sizeof out->identity && tn <= sizeof out->token) {
            memcpy(out->identity, id, sizeof out->identity);
            out->has_identity = 1;
            if (tn > 0) {
                memcpy(out->token, tok, tn);
                out->token_len = tn;
                if (dn == 32) memcpy(out->token_digest, dig, 32);
            }
            result = 1;
        }
    }
    PQclear(r);
    if (c != NULL) agg_pg_reader_put(c);
    return result;
}

/* ---- a round's inputs, for the finalizer ------------------------------------------------------------------------- */

/* The round's reports in storage order, one row at a time (libpq's single-row mode: the payloads are copied once, not
 * held twice). 0 or -1. */
static int load_reports(agg_pg_conn *c, int64_t job, int64_t round, agg_store_reports *l) {
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    agg_pg_p_i64(&p, round);
    int64_t count = agg_pg_query_i64(c, "SELECT count(*) FROM reports WHERE job = $1 AND round = $2", &p, 0);
    if (count < 0 || agg_store_reports_reserve(l, (size_t)count) != 0) return -1;
    if (count == 0) return 0;
    if (send(c, "SELECT r.device, p.bytes FROM reports r JOIN report_payloads p ON p.id = r.id"
                " WHERE r.job = $1 AND r.round = $2 ORDER BY r.id", &p) != 0)
        return -1;
    int rc = PQsetSingleRowMode(c->db) ? 0 : -1;
    PGresult *r;
    while ((r = PQgetResult(c->db)) != NULL) { /* read to the end whatever happens: the connection stays usable */
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_SINGLE_TUPLE && rc == 0) {
            unsigned char *copy = NULL;
            size_t len = 0;
            if (copy_bytes(r, 1, &copy, &len) != 0 || agg_store_reports_add(l, agg_pg_col_i64(r, 0, 0), copy, len) != 0)
                rc = -1;
        } else if (st != PGRES_SINGLE_TUPLE && st != PGRES_TUPLES_OK) {
            agg_pg_fail(c, r);
            rc = -1;
        }
        PQclear(r);
    }
    return rc == 0 && l->n == (size_t)count ? 0 : -1;
}

/* A folded round's log rows (instance NULL: every instance's) and its checkpoints, on c inside its transaction. */
static int load_shards(agg_pg_conn *c, int64_t job, int64_t round, const char *instance, agg_store_reports *log,
                       agg_store_shards *sh) {
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    agg_pg_p_i64(&p, round);
    if (instance != NULL) agg_pg_p_text(&p, instance);
    const int k = instance != NULL;
    int64_t count = agg_pg_query_i64(c, k ? "SELECT count(*) FROM report_payloads WHERE job = $1 AND round = $2"
                                            " AND instance = $3"
                                          : "SELECT count(*) FROM report_payloads WHERE job = $1 AND round = $2", &p, 0);
    if (count < 0 || agg_store_reports_reserve(log, (size_t)count) != 0) return -1;
    int rc = 0;
    if (count > 0) {
        if (send(c, k ? "SELECT r.device, p.bytes FROM report_payloads p JOIN reports r ON r.id = p.id"
                        " WHERE p.job = $1 AND p.round = $2 AND p.instance = $3 ORDER BY p.id"
                      : "SELECT r.device, p.bytes FROM report_payloads p JOIN reports r ON r.id = p.id"
                        " WHERE p.job = $1 AND p.round = $2 ORDER BY p.id", &p) != 0)
            return -1;
        rc = PQsetSingleRowMode(c->db) ? 0 : -1;
        PGresult *r;
        while ((r = PQgetResult(c->db)) != NULL) { /* read to the end whatever happens: the connection stays usable */
            ExecStatusType st = PQresultStatus(r);
            if (st == PGRES_SINGLE_TUPLE && rc == 0) {
                unsigned char *copy = NULL;
                size_t len = 0;
                if (copy_bytes(r, 1, &copy, &len) != 0 ||
                    agg_store_reports_add(log, agg_pg_col_i64(r, 0, 0), copy, len) != 0)
                    rc = -1;
            } else if (st != PGRES_SINGLE_TUPLE && st != PGRES_TUPLES_OK) {
                agg_pg_fail(c, r);
                rc = -1;
            }
            PQclear(r);
        }
        if (rc != 0 || log->n != (size_t)count) return -1;
    }
    PGresult *r = agg_pg_run(c, k ? "SELECT sum, count FROM round_sums WHERE job = $1 AND round = $2 AND instance = $3"
                                  : "SELECT sum, count FROM round_sums WHERE job = $1 AND round = $2", &p);
    if (r == NULL) return -1;
    for (int i = 0; i < PQntuples(r) && rc == 0; i++) {
        size_t n;
        const unsigned char *b = agg_pg_col_bytes(r, i, 0, &n);
        unsigned char *copy = malloc(n > 0 ? n : 1);
        if (copy != NULL && n > 0) memcpy(copy, b, n);
        if (copy == NULL || agg_store_shards_add(sh, copy, n, agg_pg_col_i64(r, i, 1)) != 0) rc = -1;
    }
    PQclear(r);
    return rc;
}

/* Round r's release and, in one snapshot with it, its reports (sh NULL; l NULL: none) or a folded round's log rows
 * and checkpoints (sh not NULL: a checkpoint and the deletion of the log rows it covers commit together, so the
 * snapshot sees every report once). */
static int load_round(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *l,
                      agg_store_shards *sh, char *err, size_t errcap) {
    agg_pg_conn *c = agg_pg_reader_get(a); /* held for the load only: the global step runs without it */
    if (c == NULL) {
        snprintf(err, errcap, "the state database cannot be reached");
        return -1;
    }
    int rc = -1;
    if (begin_on(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") == 0) {
        agg_pg_params p = {0};
        agg_pg_p_i64(&p, job);
        agg_pg_p_i64(&p, round);
        PGresult *r = agg_pg_run(c, "SELECT bytes FROM releases WHERE job = $1 AND version = $2", &p);
        if (r != NULL) {
            size_t n;
            const unsigned char *b = PQntuples(r) > 0 ? agg_pg_col_bytes(r, 0, 0, &n) : NULL;
            if (b != NULL && agg_release_to_model(b, n, prev) == 0) rc = 0;
            else snprintf(err, errcap, "release %lld missing or damaged", (long long)round);
            PQclear(r);
        }
        if (rc == 0 && sh != NULL && load_shards(c, job, round, NULL, l, sh) != 0) {
            snprintf(err, errcap, "loading the round's sum failed");
            rc = -1;
        } else if (rc == 0 && sh == NULL && l != NULL && load_reports(c, job, round, l) != 0) {
            snprintf(err, errcap, "loading the round's reports failed");
            rc = -1;
        }
        agg_pg_exec(c, rc == 0 ? "COMMIT" : "ROLLBACK");
    }
    if (rc != 0 && err[0] == '\0') snprintf(err, errcap, "%s", c->err);
    agg_pg_reader_put(c);
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

/* ---- writes: the writer's connection ----------------------------------------------------------------------------- */

static void writer_lock(dprec_agg *a) {
    pthread_mutex_lock(&PG_STORE(a)->w.mu);
}

static void writer_unlock(dprec_agg *a) {
    pthread_mutex_unlock(&PG_STORE(a)->w.mu);
}

static int writer_begin(agg_pg_conn *w) {
    return begin_on(w, "BEGIN");
}

static int begin(dprec_agg *a) {
    PG_STORE(a)->n_counts = 0;
    return writer_begin(&PG_STORE(a)->w);
}

/* The batch's counts of its rounds (agg_pg_counts_write, agg_pg_instances.c), then its COMMIT: the counts and the rows
 * they count commit together. */
static int commit(dprec_agg *a) {
    if (agg_pg_counts_write(a) != 0) return -1; /* the caller rolls the batch back: nothing of it is acknowledged */
    return agg_pg_commit(&PG_STORE(a)->w);
}

static int rollback(dprec_agg *a) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    PG_STORE(a)->n_counts = 0;
    char keep[sizeof w->err]; /* the failure being rolled back is the one worth logging */
    memcpy(keep, w->err, sizeof keep);
    int rc = agg_pg_exec(w, "ROLLBACK");
    memcpy(w->err, keep, sizeof keep);
    return rc;
}

static void log_error(dprec_agg *a, const char *what) {
    agg_pg_log_conn_error(a, &PG_STORE(a)->w, what);
}

static int report_find(dprec_agg *a, int64_t job, const unsigned char report_id[DPREC_REPORT_ID_SIZE], int64_t *device,
                       int64_t *round, unsigned char digest[32], int *has_digest) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    agg_pg_p_bytes(&p, report_id, DPREC_REPORT_ID_SIZE);
    PGresult *r = agg_pg_run(w, "SELECT device, round, digest FROM reports WHERE job = $1 AND report_id = $2", &p);
    if (r == NULL) return -1;
    int found = PQntuples(r) > 0;
    if (found) {
        *device = agg_pg_col_i64(r, 0, 0);
        *round = agg_pg_col_i64(r, 0, 1);
        size_t n;
        const unsigned char *d = agg_pg_col_bytes(r, 0, 2, &n);
        if (n == 32) {
            memcpy(digest, d, 32);
            *has_digest = 1;
        }
    }
    PQclear(r);
    return found;
}

static int report_insert(dprec_agg *a, int64_t job, int64_t round, int64_t device,
                         const unsigned char report_id[DPREC_REPORT_ID_SIZE], const unsigned char *bytes, size_t len,
                         const unsigned char digest[32], int64_t now) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    agg_pg_p_i64(&p, round);
    agg_pg_p_i64(&p, device);
    agg_pg_p_bytes(&p, report_id, DPREC_REPORT_ID_SIZE);
    agg_pg_p_i64(&p, now);
    agg_pg_p_bytes(&p, digest, 32);
    agg_pg_p_bytes(&p, bytes, len);
    agg_pg_p_text(&p, a->instance_id); /* the payload is a folded round's log row of this instance */
    /* the row and its payload in one statement, only while the round is the job's open round and not marked closing
     * (the job's row read FOR SHARE: a finalization's closing mark waits for this batch's COMMIT, so the finalizer's
     * snapshot holds every report this batch acknowledges, and a batch after the mark inserts nothing; share locks of
     * other batches and instances do not wait for each other). A row refused by either uniqueness rule inserts
     * neither, and says so by counting no payload (the transaction goes on). */
    PGresult *r = agg_pg_run(w, "WITH j AS (SELECT id FROM jobs WHERE id = $1 AND round = $2 AND state = 'running'"
                                " AND closing_round < $2 FOR SHARE),"
                                " r AS (INSERT INTO reports(job, round, device, report_id, received_at, digest)"
                                " SELECT $1, $2, $3, $4, $5, $6 FROM j ON CONFLICT DO NOTHING RETURNING id),"
                                " p AS (INSERT INTO report_payloads(id, bytes, job, round, instance)"
                                " SELECT id, $7, $1, $2, $8 FROM r RETURNING id)"
                                " SELECT (SELECT count(*) FROM j), (SELECT count(*) FROM p)", &p);
    if (r == NULL) return -1;
    int rc = PQntuples(r) != 1 ? -1
             : agg_pg_col_i64(r, 0, 0) == 0 ? AGG_STORE_ROUND_CLOSED
             : agg_pg_col_i64(r, 0, 1) == 1 ? 0
                                            : AGG_STORE_CONFLICT;
    PQclear(r);
    if (rc == 0 && agg_pg_count_add(PG_STORE(a), job, round) != 0) return -1;
    return rc;
}

static int64_t device_insert(dprec_agg *a, const unsigned char token_hash[32], const char *platform,
                             const agg_enrollment *en, int64_t now) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    agg_pg_params p = {0};
    agg_pg_p_bytes(&p, token_hash, 32);
    agg_pg_p_text(&p, platform);
    agg_pg_p_i64(&p, now);
    /* a token digest stored already (never, for random tokens) answers no id, as SQLite's failed insert does */
    PGresult *r = agg_pg_run(w, "INSERT INTO devices(token_sha256, platform, created_at) VALUES($1, $2, $3)"
                                " ON CONFLICT DO NOTHING RETURNING id", &p);
    if (r == NULL) return -1;
    int64_t id = PQntuples(r) == 1 ? agg_pg_col_i64(r, 0, 0) : -1;
    PQclear(r);
    if (id <= 0 || en == NULL || !en->has_identity) return id;
    int has_token = en->token_len > 0;
    agg_pg_params q = {0};
    agg_pg_p_i64(&q, id);
    agg_pg_p_bytes(&q, en->identity, sizeof en->identity);
    agg_pg_p_bytes(&q, has_token ? en->token : NULL, has_token ? en->token_len : 0);
    agg_pg_p_bytes(&q, has_token ? en->token_digest : NULL, has_token ? 32 : 0);
    /* the token's digest is unique: a token that registered a device before inserts nothing here */
    r = agg_pg_run(w, "INSERT INTO enrollments(device, identity, token, token_sha256) VALUES($1, $2, $3, $4)"
                      " ON CONFLICT DO NOTHING RETURNING device", &q);
    int64_t result = r == NULL ? -1 : PQntuples(r) == 1 ? id : AGG_STORE_TOKEN_USED;
    PQclear(r);
    if (result == id) return id;
    /* the batch commits: take the device back out, or it would stay registered without its enrollment */
    agg_pg_params d = {0};
    agg_pg_p_i64(&d, id);
    PQclear(agg_pg_run(w, "DELETE FROM devices WHERE id = $1", &d));
    return result;
}

static int job_insert(dprec_agg *a, const agg_job *spec, const char *protocol, uint16_t proto_id, const char *spec_json,
                      const unsigned char *release, size_t release_len, int64_t now) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, spec->id);
    agg_pg_p_text(&p, spec_json);
    agg_pg_p_text(&p, protocol);
    agg_pg_p_i64(&p, proto_id);
    agg_pg_p_i64(&p, spec->d);
    agg_pg_p_i64(&p, spec->m);
    agg_pg_p_f64(&p, spec->rating_min);
    agg_pg_p_f64(&p, spec->rating_max);
    agg_pg_p_i64(&p, spec->rounds);
    agg_pg_p_i64(&p, spec->min_reports);
    agg_pg_p_i64(&p, spec->round_seconds);
    agg_pg_p_f64(&p, spec->participation);
    agg_pg_p_text(&p, spec->params);
    if (spec->has_budget) {
        agg_pg_p_f64(&p, spec->budget_epsilon);
        agg_pg_p_f64(&p, spec->budget_delta);
    } else {
        agg_pg_p_null_f64(&p);
        agg_pg_p_null_f64(&p);
    }
    agg_pg_p_i64(&p, now + spec->round_seconds);
    agg_pg_p_i64(&p, now);
    PGresult *r = agg_pg_run(w, "INSERT INTO jobs(id, spec, protocol, proto_id, d, m, rating_min, rating_max, rounds,"
                                " min_reports, round_seconds, participation, params, budget_epsilon, budget_delta,"
                                " state, round, deadline, created_at)"
                                " VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 'running', 1,"
                                " $16, $17)", &p);
    if (r == NULL) return -1;
    PQclear(r);
    agg_pg_params q = {0};
    agg_pg_p_i64(&q, spec->id);
    agg_pg_p_bytes(&q, release, release_len);
    agg_pg_p_i64(&q, now);
    r = agg_pg_run(w, "INSERT INTO releases(job, version, bytes, created_at) VALUES($1, 1, $2, $3)", &q);
    PQclear(r);
    return r != NULL ? 0 : -1;
}

static int job_set_deadline(dprec_agg *a, int64_t job, int64_t deadline) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, deadline);
    agg_pg_p_i64(&p, job);
    PGresult *r = agg_pg_run(w, "UPDATE jobs SET deadline = $1 WHERE id = $2", &p);
    PQclear(r);
    return r != NULL ? 0 : -1;
}

static int job_set_rounds(dprec_agg *a, int64_t job, int64_t rounds) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, rounds);
    agg_pg_p_i64(&p, job);
    PGresult *r = NULL;
    if (writer_begin(w) != 0 || (r = agg_pg_run(w, "UPDATE jobs SET rounds = $1 WHERE id = $2", &p)) == NULL ||
        agg_pg_commit(w) != 0) {
        PQclear(r);
        agg_pg_log_conn_error(a, w, "job_update");
        agg_pg_exec(w, "ROLLBACK");
        return -1;
    }
    PQclear(r);
    return 0;
}

static int round_commit(dprec_agg *a, const agg_store_round *rd, char *err, size_t errcap) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    int64_t job = rd->job, round = rd->round;
    PGresult *r = NULL;
    if (writer_begin(w) != 0) goto fail;
    /* the exactly-once check and the job's move in one statement: the round must still be the job's open round, and
     * the row stays locked until the COMMIT (another session's same UPDATE waits, then finds the round moved on) */
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, round + 1);
    agg_pg_p_i64(&p, rd->deadline);
    agg_pg_p_text(&p, rd->done ? "done" : "running");
    agg_pg_p_i64(&p, job);
    agg_pg_p_i64(&p, round);
    /* a job closed by another instance meanwhile (rounds lowered to this round) ends here too */
    r = agg_pg_run(w, "UPDATE jobs SET round = $1, deadline = $2,"
                      " state = CASE WHEN $3 = 'done' OR $5 >= rounds THEN 'done' ELSE 'running' END"
                      " WHERE id = $4 AND round = $5 AND state = 'running'", &p);
    if (r == NULL) goto fail;
    int moved = strcmp(PQcmdTuples(r), "1") == 0;
    PQclear(r);
    if (!moved) {
        agg_pg_exec(w, "ROLLBACK");
        return 0;
    }
    agg_pg_params q = {0};
    agg_pg_p_i64(&q, job);
    agg_pg_p_i64(&q, round + 1);
    agg_pg_p_bytes(&q, rd->release, rd->release_len);
    agg_pg_p_i64(&q, rd->now);
    if ((r = agg_pg_run(w, "INSERT INTO releases(job, version, bytes, created_at) VALUES($1, $2, $3, $4)", &q)) == NULL)
        goto fail;
    PQclear(r);
    /* the payloads did their work: dropped with the finalization, atomically; the rows stay for idempotency */
    if (!a->cfg.keep_report_payloads) {
        agg_pg_params d = {0};
        agg_pg_p_i64(&d, job);
        agg_pg_p_i64(&d, round);
        if ((r = agg_pg_run(w, "DELETE FROM report_payloads WHERE job = $1 AND round = $2", &d)) == NULL) goto fail;
        PQclear(r);
    }
    {   /* a folded round's checkpoints did their work too, and so did its counts (the rows stay, and count) */
        agg_pg_params d = {0};
        agg_pg_p_i64(&d, job);
        agg_pg_p_i64(&d, round);
        if ((r = agg_pg_run(w, "DELETE FROM round_sums WHERE job = $1 AND round = $2", &d)) == NULL) goto fail;
        PQclear(r);
        if ((r = agg_pg_run(w, "DELETE FROM round_counts WHERE job = $1 AND round = $2", &d)) == NULL) goto fail;
        PQclear(r);
        /* a secure round's log (its keys, envelopes, masked inputs, reveals) did its work: gone with the round. After
         * the UPDATE above: an append that held the job's row committed before it, and is deleted here */
        if ((r = agg_pg_run(w, "DELETE FROM secagg_log WHERE job = $1 AND round <= $2", &d)) == NULL) goto fail;
        PQclear(r);
    }
    if (rd->ledger) {
        agg_pg_params l = {0};
        agg_pg_p_i64(&l, job);
        agg_pg_p_f64(&l, rd->epsilon_spent);
        agg_pg_p_f64(&l, rd->delta);
        if ((r = agg_pg_run(w, "INSERT INTO ledger(job, epsilon_spent, delta) VALUES($1, $2, $3) ON CONFLICT (job)"
                               " DO UPDATE SET epsilon_spent = excluded.epsilon_spent, delta = excluded.delta", &l)) == NULL)
            goto fail;
        PQclear(r);
    }
    if (agg_pg_commit(w) != 0) goto fail;
    return 1;
fail:
    snprintf(err, errcap, "%s", w->err);
    agg_pg_exec(w, "ROLLBACK");
    return -1;
}

/* ---- folded rounds: this instance's shard (docs/notes/streaming-sums.md) ------------------------------------------ */

static int shard_load(dprec_agg *a, int64_t job, int64_t round, agg_store_reports *log, agg_store_shards *sh) {
    return load_shards(&PG_STORE(a)->w, job, round, a->instance_id, log, sh);
}

/* The instance's own row only: instances never update one another's, so their checkpoints take no common lock. */
static int shard_checkpoint(dprec_agg *a, int64_t job, int64_t round, const unsigned char *sum, size_t len,
                            int64_t count) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    agg_pg_p_i64(&p, round);
    agg_pg_p_text(&p, a->instance_id);
    agg_pg_p_i64(&p, count);
    agg_pg_p_bytes(&p, sum, len);
    PGresult *r = NULL;
    if (begin_on(w, "BEGIN") != 0) goto fail;
    /* only while the round is the job's open round, its row read FOR SHARE: a round commit (its UPDATE of that row)
     * then waits for this checkpoint, and its DELETE of the round's checkpoints sees it; a checkpoint after the commit
     * writes nothing (the round's log rows are gone with it) */
    if ((r = agg_pg_run(w, "WITH j AS (SELECT id FROM jobs WHERE id = $1 AND round = $2 FOR SHARE)"
                           " INSERT INTO round_sums(job, round, instance, count, sum) SELECT $1, $2, $3, $4, $5 FROM j"
                           " ON CONFLICT (job, round, instance) DO UPDATE SET count = excluded.count, sum = excluded.sum",
                        &p)) == NULL)
        goto fail;
    PQclear(r);
    agg_pg_params d = {0};
    agg_pg_p_i64(&d, job);
    agg_pg_p_i64(&d, round);
    agg_pg_p_text(&d, a->instance_id);
    if ((r = agg_pg_run(w, "DELETE FROM report_payloads WHERE job = $1 AND round = $2 AND instance = $3", &d)) == NULL)
        goto fail;
    PQclear(r);
    if (agg_pg_commit(w) != 0) goto fail;
    return 0;
fail:
    agg_pg_log_conn_error(a, w, "sum_checkpoint");
    agg_pg_exec(w, "ROLLBACK");
    return -1;
}

/* ---- the engine -------------------------------------------------------------------------------------------------- */

/* libpq's URI schemes (a key=value connection string is not taken: the setting must say which engine it means) */
static int claims(const char *state) {
    return state != NULL && (strncmp(state, "postgresql://", 13) == 0 || strncmp(state, "postgres://", 11) == 0);
}

const agg_store_engine agg_store_engine_postgresql = {
    .version = AGG_STORE_ENGINE_VERSION,
    .name = "postgresql",
    .claims = claims,
    .open = agg_pg_open,
    .close = agg_pg_close,
    .writer_lock = writer_lock,
    .writer_unlock = writer_unlock,
    .release_get = release_get,
    .device_by_token = device_by_token,
    .health = health,
    .round_load = round_load,
    .round_load_folded = round_load_folded,
    .shard_load = shard_load,
    .shard_checkpoint = shard_checkpoint,
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
    .job_read = agg_pg_job_read,
    .jobs_state = agg_pg_jobs_state,
    .leases_renew = agg_pg_leases_renew,
    .round_closing = agg_pg_round_closing,
    .job_id_next = agg_pg_job_id_next,
    .secagg_read = agg_pg_secagg_read,
    .secagg_unlock = agg_pg_secagg_unlock,
};
