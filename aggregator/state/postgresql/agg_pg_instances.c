/* dprec aggregator core — the PostgreSQL engine's part that several aggregators sharing one database need
 * (docs/notes/multi-instance.md): the jobs' state as every instance reads it (refreshed on each tick), the finalization
 * leases, the closing mark of a round, job ids from the database's sequence, and the count of each open round's reports
 * (round_counts, and the writer's per-transaction count map that feeds it). agg_pg.c holds the engine's other
 * statements and its table, agg_pg_open.c the connections' lifetime and the schema these statements read and write.
 *
 * What the instances must agree on, the database decides, not an instance's memory or clock: a lease expires by the
 * database server's clock, the closing mark waits for every batch that inserted into the round, a job id comes from
 * one sequence, and each instance counts its own reports in rows of its own, so that no two instances' batches wait
 * for each other. */
#include <pthread.h>
#include <stdlib.h>

#include "agg_pg_priv.h"

/* ---- the jobs' state, leases, the closing mark and job ids ------------------------------------------------------- */

#define JOB_STATE_SQL                                                                                                  \
    "SELECT j.id, j.round, j.deadline, j.rounds, (j.state = 'done')::int, (j.closing_round >= j.round)::int,"          \
    " CASE WHEN j.state = 'running' THEN (SELECT COALESCE(sum(c.n), 0)::bigint FROM round_counts c"                 \
    " WHERE c.job = j.id AND c.round = j.round) ELSE 0 END FROM jobs j"

static void state_row(const PGresult *r, int i, agg_store_job_state *st) {
    st->id = agg_pg_col_i64(r, i, 0);
    st->round = agg_pg_col_i64(r, i, 1);
    st->deadline = agg_pg_col_i64(r, i, 2);
    st->rounds = agg_pg_col_i64(r, i, 3);
    st->done = agg_pg_col_i64(r, i, 4) != 0;
    st->closing = agg_pg_col_i64(r, i, 5) != 0;
    st->in_round = agg_pg_col_i64(r, i, 6);
}

int agg_pg_jobs_state(dprec_agg *a, agg_store_job_state **out, size_t *n) {
    agg_pg_conn *c;
    PGresult *r = agg_pg_reader_run(a, JOB_STATE_SQL " ORDER BY j.id", NULL, &c);
    int rc = -1;
    if (r != NULL) {
        int rows = PQntuples(r);
        *out = malloc((size_t)(rows > 0 ? rows : 1) * sizeof **out);
        if (*out != NULL) {
            for (int i = 0; i < rows; i++) state_row(r, i, &(*out)[i]);
            *n = (size_t)rows;
            rc = 0;
        }
    }
    if (r == NULL && c != NULL) agg_pg_log_conn_error(a, c, "jobs_state");
    PQclear(r);
    if (c != NULL) agg_pg_reader_put(c);
    return rc;
}

int agg_pg_job_read(dprec_agg *a, int64_t id, agg_job *out, agg_store_job_state *st) {
    agg_pg_conn *c = agg_pg_reader_get(a);
    if (c == NULL) return -1;
    int rc = agg_pg_job_row(c, id, out);
    if (rc == 1 && st != NULL) {
        agg_pg_params p = {0};
        agg_pg_p_i64(&p, id);
        PGresult *r = agg_pg_run(c, JOB_STATE_SQL " WHERE j.id = $1", &p);
        if (r != NULL && PQntuples(r) == 1) state_row(r, 0, st);
        else rc = -1;
        PQclear(r);
    }
    if (rc < 0) {
        agg_pg_log_conn_error(a, c, "job_read");
        if (out->params != NULL) agg_job_free(out);
    }
    agg_pg_reader_put(c);
    return rc;
}

/* One statement of its own on the writer's connection, made usable again first if it was lost: its result (PQclear
 * it), or NULL with the failure, of the connection or of the statement, logged as a db_error event named what. The
 * opening and the error path that the writer's statements below share. */
static PGresult *writer_run(dprec_agg *a, const char *what, const char *sql, const agg_pg_params *p) {
    agg_pg_conn *w = &PG_STORE(a)->w;
    PGresult *r = agg_pg_conn_check(w) == 0 ? agg_pg_run(w, sql, p) : NULL;
    if (r == NULL) agg_pg_log_conn_error(a, w, what);
    return r;
}

int agg_pg_leases_renew(dprec_agg *a, const char *holder, int seconds, int64_t **jobs, size_t *n) {
    agg_pg_params p = {0};
    agg_pg_p_text(&p, holder);
    agg_pg_p_i64(&p, seconds);
    /* one statement, its own transaction: the database server's clock decides expiry, so instances' clocks never
     * matter; a lease is taken only when free, expired, or already the holder's */
    PGresult *r = writer_run(a, "lease",
                             "INSERT INTO leases(job, holder, expires_at)"
                             " SELECT id, $1, extract(epoch FROM clock_timestamp()) + $2"
                             " FROM jobs WHERE state = 'running'"
                             " ON CONFLICT (job) DO UPDATE SET holder = excluded.holder,"
                             " expires_at = excluded.expires_at"
                             " WHERE leases.holder = excluded.holder"
                             " OR leases.expires_at < extract(epoch FROM clock_timestamp())"
                             " RETURNING job", &p);
    if (r == NULL) return -1;
    int rows = PQntuples(r);
    *jobs = malloc((size_t)(rows > 0 ? rows : 1) * sizeof **jobs);
    if (*jobs != NULL)
        for (int i = 0; i < rows; i++) (*jobs)[i] = agg_pg_col_i64(r, i, 0);
    *n = *jobs != NULL ? (size_t)rows : 0;
    PQclear(r);
    return *jobs != NULL ? 0 : -1;
}

int agg_pg_round_closing(dprec_agg *a, int64_t job, int64_t round) {
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    agg_pg_p_i64(&p, round);
    /* waits for every batch that holds the row FOR SHARE (they inserted into this round) to commit */
    PGresult *r = writer_run(a, "round_closing",
                             "UPDATE jobs SET closing_round = $2 WHERE id = $1 AND round = $2 AND state = 'running'"
                             " RETURNING id", &p);
    if (r == NULL) return -1;
    int marked = PQntuples(r) == 1;
    PQclear(r);
    return marked;
}

int64_t agg_pg_job_id_next(dprec_agg *a) {
    pthread_mutex_t *mu = &PG_STORE(a)->w.mu;
    pthread_mutex_lock(mu); /* between two passes of the writer: no transaction is open on it */
    PGresult *r = writer_run(a, "job_id", "SELECT nextval('dprec_job_ids')", NULL);
    pthread_mutex_unlock(mu);
    /* nextval answers one row, a positive id (the sequence counts from 1: agg_pg_open.c), or fails (logged above) */
    int64_t id = r != NULL && PQntuples(r) == 1 ? agg_pg_col_i64(r, 0, 0) : -1;
    PQclear(r);
    return id;
}

/* ---- each open round's count: round_counts ----------------------------------------------------------------------- */

/* One more report of (job, round) in the writer's open transaction. 0, or -1 out of memory (the batch then fails). */
int agg_pg_count_add(agg_pg_store *s, int64_t job, int64_t round) {
    for (size_t i = 0; i < s->n_counts; i++)
        if (s->counts[i].job == job && s->counts[i].round == round) {
            s->counts[i].n++;
            return 0;
        }
    if (s->n_counts == s->cap_counts) {
        size_t cap = s->cap_counts ? 2 * s->cap_counts : 8;
        struct agg_pg_count *c = realloc(s->counts, cap * sizeof *c);
        if (c == NULL) return -1;
        s->counts = c;
        s->cap_counts = cap;
    }
    s->counts[s->n_counts++] = (struct agg_pg_count){job, round, 1};
    return 0;
}

/* The batch's reports added to this instance's row of each round's count (round_counts, schema 4), in the batch's
 * transaction: the count and the rows it counts commit together. Each instance writes only its own rows, so the
 * instances' batches never wait for each other here. */
int agg_pg_counts_write(dprec_agg *a) {
    agg_pg_store *s = PG_STORE(a);
    agg_pg_conn *w = &s->w;
    for (size_t i = 0; i < s->n_counts; i++) {
        agg_pg_params p = {0};
        agg_pg_p_i64(&p, s->counts[i].job);
        agg_pg_p_i64(&p, s->counts[i].round);
        agg_pg_p_text(&p, a->instance_id);
        agg_pg_p_i64(&p, s->counts[i].n);
        PGresult *r = agg_pg_run(w, "INSERT INTO round_counts(job, round, instance, n) VALUES($1, $2, $3, $4)"
                                    " ON CONFLICT (job, round, instance) DO UPDATE SET n = round_counts.n + excluded.n",
                                 &p);
        if (r == NULL) return -1; /* the caller rolls the batch back: nothing of it is acknowledged */
        PQclear(r);
    }
    s->n_counts = 0;
    return 0;
}
