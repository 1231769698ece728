/* dprec aggregator core — what the store's two files share (not API; state/ only): the SQLite connections with their
 * statement cache, and the store behind dprec_agg's opaque pointer. agg_store.c holds the statements,
 * agg_store_open.c the file and the connections' lifetime. */
#ifndef DPREC_AGG_STORE_PRIV_H
#define DPREC_AGG_STORE_PRIV_H

#include <pthread.h>
#include <stdint.h>

#include <sqlite3.h>

#include "agg_store.h"

/* 1: the first; 2: reports.digest (the envelope's SHA-256, kept when a finalized round drops its payload). A
 * version-1 state is brought to 2 when it opens (agg_store_open.c); its rows keep a NULL digest. */
#define AGG_SCHEMA_VERSION 2

/* A connection and its prepared statements. */
#define AGG_STMT_CACHE 32
typedef struct agg_conn {
    sqlite3 *db;
    pthread_mutex_t mu;        /* readers: one user at a time */
    struct agg_stmt {          /* prepared statements kept for the connection's life (agg_store.c: prep) */
        const char *sql;       /* the call site's string literal; looked up by address */
        sqlite3_stmt *st;
        int busy;              /* handed out and not yet given back with finish() */
    } stmts[AGG_STMT_CACHE];
} agg_conn;

#define AGG_READERS 4

typedef struct agg_store {
    agg_conn w;                /* the writer's connection (the writer thread only, once open returned) */
    agg_conn readers[AGG_READERS];
    unsigned reader_next;
    agg_conn ckpt;             /* the checkpointer's connection: WAL checkpoints off the writer's commits */
    pthread_t checkpointer;
    pthread_mutex_t c_mu;      /* guards the flags below */
    pthread_cond_t c_cv;
    int ckpt_running, ckpt_wanted, ckpt_stopping;
} agg_store;

/* agg_store.c, for agg_store_open.c: one SQL text run to its end; a statement prepared outside the cache; one
 * integer from a query (def when no row, -1 on error); a connection's statements finalized and the connection
 * closed; the connection's last error logged as a db_error event; and one job row read (1 found, 0 not, -1 error). */
int agg_conn_exec(agg_conn *c, const char *sql);
sqlite3_stmt *agg_conn_prep_uncached(agg_conn *c, const char *sql);
int64_t agg_conn_query_int(agg_conn *c, const char *sql, int nparams, int64_t p1, int64_t p2, int64_t def);
void agg_conn_close(agg_conn *c);
void agg_conn_log_error(dprec_agg *a, agg_conn *c, const char *what);
int agg_store_job_row(agg_conn *c, int64_t id, agg_job *out);

#endif /* DPREC_AGG_STORE_PRIV_H */
