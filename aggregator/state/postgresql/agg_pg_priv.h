/* dprec aggregator core — what the PostgreSQL engine's three files share (not API; state/postgresql/ only): a
 * connection with its prepared statements and its last error, a statement's parameters and columns in libpq's binary
 * format, and the engine's store behind dprec_agg's opaque pointer. agg_pg.c holds the statements and the engine's
 * table, agg_pg_instances.c the statements several instances on one database need, agg_pg_open.c the connections'
 * lifetime and the schema. */
#ifndef DPREC_AGG_PG_PRIV_H
#define DPREC_AGG_PG_PRIV_H

#include <pthread.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "state/agg_store_engine.h"

/* The schema's version, kept in the table dprec_schema (one row). 1: the first; 2: several instances; 3: folded rounds (report_payloads' round and instance, round_sums); 4: round_counts;
 * 5: secure rounds' logs (secagg_log). A state of an older version is brought
 * to this one at open, one step of agg_pg_open.c's list at a time; a newer one is refused. */
#define AGG_PG_SCHEMA_VERSION 5

/* Advisory lock keys: the schema's step takes key + 1 for its transaction (key itself was the single-instance lock of
 * schema 1's builds; not taken any more). */
#define AGG_PG_LOCK_KEY 0x6470726563LL /* "dprec" */

#define AGG_PG_STMT_CACHE 32
#define AGG_PG_READERS 4
#define AGG_PG_MAX_PARAMS 20

struct agg_pg_store;

/* A connection, its prepared statements (named "s<i>" after their slot) and its last failure. */
typedef struct agg_pg_conn {
    PGconn *db;
    pthread_mutex_t mu;          /* one user at a time (libpq connections are not shared between threads) */
    int writer;                  /* 1: the writer's (read-write); 0: a reader's */
    struct agg_pg_store *store;
    const char *stmts[AGG_PG_STMT_CACHE]; /* the call sites' SQL literals, looked up by address */
    size_t nstmts;
    char err[256];               /* the last failure's message, for the logs */
    char sqlstate[6];
} agg_pg_conn;

typedef struct agg_pg_store {
    struct agg_store base;       /* first: the engine's table (agg_store_engine.h) */
    dprec_agg *a;
    agg_pg_conn w;               /* the writer's connection (the writer thread only, once open returned) */
    agg_pg_conn readers[AGG_PG_READERS];
    agg_pg_conn sa;              /* secure rounds' logs (agg_pg_secagg.c): read-write, its own transactions */
    unsigned reader_next;
    /* the writer's open transaction: reports inserted per (job, round), added to round_counts at its commit */
    struct agg_pg_count {
        int64_t job, round, n;
    } *counts;
    size_t n_counts, cap_counts;
} agg_pg_store;

#define PG_STORE(a) ((agg_pg_store *)(a)->store)

/* One statement's parameters: integers, doubles and bytes in binary, text as text, NULL where a pointer is NULL. */
typedef struct agg_pg_params {
    int n;
    Oid types[AGG_PG_MAX_PARAMS];
    const char *values[AGG_PG_MAX_PARAMS];
    int lengths[AGG_PG_MAX_PARAMS];
    int formats[AGG_PG_MAX_PARAMS];
    unsigned char num[AGG_PG_MAX_PARAMS][8];
    int too_long;                /* a value past libpq's int lengths: the statement is not sent */
} agg_pg_params;

void agg_pg_p_i64(agg_pg_params *p, int64_t v);
void agg_pg_p_f64(agg_pg_params *p, double v);
void agg_pg_p_text(agg_pg_params *p, const char *s);
void agg_pg_p_bytes(agg_pg_params *p, const void *b, size_t len);
void agg_pg_p_null_f64(agg_pg_params *p);

/* Runs sql (a literal: it is prepared once per connection, keyed by its address) with p (NULL: none), results in binary.
 * The result when it succeeded (PQclear it), else NULL with c->err and c->sqlstate set. */
PGresult *agg_pg_run(agg_pg_conn *c, const char *sql, const agg_pg_params *p);
/* A command without parameters or rows (BEGIN, SET, DDL; several separated by ';'). 0 or -1 (c->err set). */
int agg_pg_exec(agg_pg_conn *c, const char *sql);
/* COMMIT, checked: a transaction that failed answers COMMIT with ROLLBACK. 0 or -1. */
int agg_pg_commit(agg_pg_conn *c);
/* Records a failure's message and SQLSTATE on c (res may be NULL: the connection's). */
void agg_pg_fail(agg_pg_conn *c, const PGresult *res);
/* Binary columns: an integer (int2, int4, int8), a double, bytes (its length into *len). */
int64_t agg_pg_col_i64(const PGresult *r, int row, int col);
double agg_pg_col_f64(const PGresult *r, int row, int col);
const unsigned char *agg_pg_col_bytes(const PGresult *r, int row, int col, size_t *len);
/* One integer from a query (def when no row; -1 on error). */
int64_t agg_pg_query_i64(agg_pg_conn *c, const char *sql, const agg_pg_params *p, int64_t def);
/* Logs c's last failure as a db_error event with what. */
void agg_pg_log_conn_error(dprec_agg *a, agg_pg_conn *c, const char *what);
/* Reads one job row (proto left NULL): 1 found, 0 not, -1 error. */
int agg_pg_job_row(agg_pg_conn *c, int64_t id, agg_job *out);
/* A reader's connection from the pool, usable (made again if it was lost), or NULL with its error logged; handed back
 * with agg_pg_reader_put. */
agg_pg_conn *agg_pg_reader_get(dprec_agg *a);
void agg_pg_reader_put(agg_pg_conn *c);
/* One statement of its own on a reader: its result (NULL on failure), the reader held in *held for agg_pg_reader_put,
 * or NULL when none could be had. */
PGresult *agg_pg_reader_run(dprec_agg *a, const char *sql, const agg_pg_params *p, agg_pg_conn **held);

/* agg_pg_instances.c: the engine's entries for several instances (agg_store_engine.h says what each does), and the
 * count of each open round's reports: agg_pg_count_add counts one more report of (job, round) in the writer's open
 * transaction (0, or -1 out of memory: the batch then fails); agg_pg_counts_write adds the transaction's counts to
 * this instance's rows of round_counts, just before the batch's COMMIT (0, or -1 with the writer's error set). */
int agg_pg_jobs_state(dprec_agg *a, agg_store_job_state **out, size_t *n);
int agg_pg_job_read(dprec_agg *a, int64_t id, agg_job *out, agg_store_job_state *st);
int agg_pg_leases_renew(dprec_agg *a, const char *holder, int seconds, int64_t **jobs, size_t *n);
int agg_pg_round_closing(dprec_agg *a, int64_t job, int64_t round);
int64_t agg_pg_job_id_next(dprec_agg *a);
int agg_pg_count_add(agg_pg_store *s, int64_t job, int64_t round);
int agg_pg_counts_write(dprec_agg *a);

/* agg_pg_secagg.c: a secure round's log (agg_store.h, "secure-aggregation rounds on a shared state"). */
int agg_pg_secagg_read(dprec_agg *a, int64_t job, int64_t round, int64_t after, int lock, agg_store_secagg_entry **out,
                       size_t *n);
int agg_pg_secagg_unlock(dprec_agg *a, int64_t job, int64_t round, const agg_store_secagg_entry *e);

/* agg_pg_open.c: the engine's open and close; a connection made usable again after it was lost (reconnected, its
 * session set up): 0, or -1 with c->err set. */
int agg_pg_open(dprec_agg *a, int (*job_loaded)(dprec_agg *a, agg_job *job, int64_t in_round), int64_t *last_id,
                char *err, size_t errcap);
void agg_pg_close(dprec_agg *a);
int agg_pg_conn_check(agg_pg_conn *c);

#endif /* DPREC_AGG_PG_PRIV_H */
