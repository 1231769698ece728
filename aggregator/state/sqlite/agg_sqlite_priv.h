/* dprec aggregator core — what the SQLite engine's two files share (not API; state/sqlite/ only): the connections with
 * their statement cache, and the engine's store behind dprec_agg's opaque pointer. agg_sqlite.c holds the statements
 * and the engine's table, agg_sqlite_open.c the file and the connections' lifetime. */
#ifndef DPREC_AGG_SQLITE_PRIV_H
#define DPREC_AGG_SQLITE_PRIV_H

#include <pthread.h>
#include <stdint.h>

#include <sqlite3.h>

#include "agg_sqlite_keys.h"
#include "state/agg_store_engine.h"

/* 1: the first; 2: reports.digest (the envelope's SHA-256, kept when a finalized round drops its payload). A
 * version-1 state is brought to 2 when it opens (agg_sqlite_open.c); its rows keep a NULL digest. 3: folded rounds
 * (report_payloads' round and instance, round_sums; docs/notes/streaming-sums.md), brought from 2 in place. 4: the open
 * round's uniqueness in the writer's memory (docs/notes/sqlite-open-round-keys.md): `reports` without its two UNIQUE
 * constraints, an index on (job, round), and report_keys, the finalized rounds' keys; `reports` rebuilt from 3 once. */
#define AGG_SCHEMA_VERSION 4

/* A connection and its prepared statements. */
#define AGG_STMT_CACHE 32
typedef struct agg_sqlite_conn {
    sqlite3 *db;
    pthread_mutex_t mu;        /* readers: one user at a time */
    struct agg_stmt {          /* prepared statements kept for the connection's life (agg_sqlite.c: prep) */
        const char *sql;       /* the call site's string literal; looked up by address */
        sqlite3_stmt *st;
        int busy;              /* handed out and not yet given back with finish() */
    } stmts[AGG_STMT_CACHE];
} agg_sqlite_conn;

#define AGG_READERS 4

typedef struct agg_sqlite_store {
    struct agg_store base;     /* first: the engine's table (agg_store_engine.h) */
    agg_sqlite_conn w;                /* the writer's connection (the writer thread only, once open returned) */
    agg_sqlite_conn readers[AGG_READERS];
    unsigned reader_next;
    agg_sqlite_conn ckpt;             /* the checkpointer's connection: WAL checkpoints off the writer's commits */
    pthread_t checkpointer;
    pthread_mutex_t c_mu;      /* guards the flags below */
    pthread_cond_t c_cv;
    int ckpt_running, ckpt_wanted, ckpt_stopping;
    agg_keys keys;             /* the open rounds' report ids and devices (the writer's; agg_sqlite_keys.h) */
    const char *keys_error;    /* why the last report insert failed outside SQLite (its db_error says it), or NULL */
} agg_sqlite_store;

/* The SQLite store behind a->store (the engine's functions are called only with its own). */
#define SQLITE_STORE(a) ((agg_sqlite_store *)(a)->store)

/* agg_sqlite.c, for agg_sqlite_open.c: one SQL text run to its end; a statement prepared outside the cache; one
 * integer from a query (def when no row, -1 on error); a connection's statements finalized and the connection
 * closed; the connection's last error logged as a db_error event; and one job row read (1 found, 0 not, -1 error). */
int agg_sqlite_exec(agg_sqlite_conn *c, const char *sql);
sqlite3_stmt *agg_sqlite_prep_uncached(agg_sqlite_conn *c, const char *sql);
int64_t agg_sqlite_query_int(agg_sqlite_conn *c, const char *sql, int nparams, int64_t p1, int64_t p2, int64_t def);
void agg_sqlite_conn_close(agg_sqlite_conn *c);
void agg_sqlite_log_conn_error(dprec_agg *a, agg_sqlite_conn *c, const char *what);
int agg_sqlite_job_row(agg_sqlite_conn *c, int64_t id, agg_job *out);
/* agg_sqlite.c, for open: the keys of job's open round rebuilt from its committed rows (read once, in storage order).
 * Its report count, or -1 (out of memory, or a database error). */
int64_t agg_sqlite_keys_load(agg_sqlite_store *s, int64_t job, int64_t round);

/* agg_sqlite_open.c, for the engine's table: open and close (agg_store_engine.h). */
int agg_sqlite_open(dprec_agg *a, int (*job_loaded)(dprec_agg *a, agg_job *job, int64_t in_round), int64_t *last_id,
                    char *err, size_t errcap);
void agg_sqlite_close(dprec_agg *a);

#endif /* DPREC_AGG_SQLITE_PRIV_H */
