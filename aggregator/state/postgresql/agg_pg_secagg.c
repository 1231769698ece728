/* dprec aggregator core — the PostgreSQL engine's secure-aggregation round logs (agg_store.h, "secure-aggregation
 * rounds on a shared state"; docs/notes/multi-instance.md): table secagg_log, one row per message that changed an open
 * round of a secure job, which every instance applies, in seq order, to its own copy of the round (rounds/agg_secure.c).
 *
 * Appends are serialized per job by its row in jobs: the appending transaction holds it FOR NO KEY UPDATE (a secure
 * job takes no ordinary report, so nothing else waits for it but the round's commit and the tick's deadline moves;
 * foreign-key checks take KEY SHARE, which it lets through), reads what other instances appended meanwhile, and
 * appends the next seq. Entries therefore commit in seq order, and a plain read sees a
 * prefix of the log. The lock also fences the round: a round that moved on (its commit updated the row) is not
 * appended to, and the commit's DELETE of the round's log runs after its UPDATE, so an append that held the row first
 * is deleted with the rest.
 *
 * Its own connection (agg_pg_store.sa): a transaction spans the caller's check of the message, and must not wait for,
 * or hold up, the writer's batch or a reader. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_pg_priv.h"

/* Fails the open transaction (if any) and logs why. -1. */
static int sa_fail(dprec_agg *a, agg_pg_conn *c, const char *what) {
    agg_pg_log_conn_error(a, c, what);
    if (PQtransactionStatus(c->db) != PQTRANS_IDLE) PQclear(PQexec(c->db, "ROLLBACK"));
    pthread_mutex_unlock(&c->mu);
    return -1;
}

int agg_pg_secagg_read(dprec_agg *a, int64_t job, int64_t round, int64_t after, int lock, agg_store_secagg_entry **out,
                       size_t *n) {
    agg_pg_conn *c = &PG_STORE(a)->sa;
    pthread_mutex_lock(&c->mu);
    if (agg_pg_conn_check(c) != 0) return sa_fail(a, c, "secagg_read");
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    agg_pg_p_i64(&p, round);
    /* a session found lost by the first statement is made again and the statement run once more (nothing was done in
     * the lost one) */
    if (lock) {
        if (agg_pg_exec(c, "BEGIN") != 0 &&
            !(PQstatus(c->db) != CONNECTION_OK && agg_pg_conn_check(c) == 0 && agg_pg_exec(c, "BEGIN") == 0))
            return sa_fail(a, c, "secagg_lock");
        PGresult *r = agg_pg_run(c, "SELECT 1 FROM jobs WHERE id = $1 AND round = $2 AND state = 'running'"
                                    " FOR NO KEY UPDATE", &p);
        if (r == NULL) return sa_fail(a, c, "secagg_lock");
        int open = PQntuples(r) == 1;
        PQclear(r);
        if (!open) {
            agg_pg_exec(c, "ROLLBACK");
            pthread_mutex_unlock(&c->mu);
            return AGG_STORE_ROUND_CLOSED;
        }
    }
    agg_pg_p_i64(&p, after);
    static const char sql[] = "SELECT seq, kind, device, body FROM secagg_log WHERE job = $1 AND round = $2 AND seq > $3"
                              " ORDER BY seq";
    PGresult *r = agg_pg_run(c, sql, &p);
    if (r == NULL && !lock && PQstatus(c->db) != CONNECTION_OK && agg_pg_conn_check(c) == 0) r = agg_pg_run(c, sql, &p);
    if (r == NULL) return sa_fail(a, c, "secagg_read");
    int rows = PQntuples(r), ok = 1;
    *out = rows > 0 ? calloc((size_t)rows, sizeof **out) : NULL;
    if (rows > 0 && *out == NULL) ok = 0;
    for (int i = 0; ok && i < rows; i++) {
        agg_store_secagg_entry *e = &(*out)[i];
        size_t len = 0;
        const unsigned char *b = agg_pg_col_bytes(r, i, 3, &len);
        e->seq = agg_pg_col_i64(r, i, 0);
        e->kind = (int)agg_pg_col_i64(r, i, 1);
        e->device = agg_pg_col_i64(r, i, 2);
        e->body = malloc(len > 0 ? len : 1);
        e->len = len;
        if (e->body == NULL || b == NULL) ok = 0;
        else memcpy(e->body, b, len);
        *n = (size_t)i + 1;
    }
    PQclear(r);
    if (!ok) {
        agg_store_secagg_entries_free(*out, *n);
        *out = NULL;
        *n = 0;
        snprintf(c->err, sizeof c->err, "out of memory reading a secure round's log");
        c->sqlstate[0] = '\0';
        return sa_fail(a, c, "secagg_read");
    }
    if (!lock) pthread_mutex_unlock(&c->mu); /* else held until agg_pg_secagg_unlock */
    return 0;
}

int agg_pg_secagg_unlock(dprec_agg *a, int64_t job, int64_t round, const agg_store_secagg_entry *e) {
    agg_pg_conn *c = &PG_STORE(a)->sa;
    if (e == NULL) { /* nothing to append: the row is given back */
        int rc = agg_pg_exec(c, "ROLLBACK");
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    agg_pg_params p = {0};
    agg_pg_p_i64(&p, job);
    agg_pg_p_i64(&p, round);
    agg_pg_p_i64(&p, e->seq);
    agg_pg_p_i64(&p, e->kind);
    agg_pg_p_i64(&p, e->device);
    agg_pg_p_bytes(&p, e->body, e->len);
    PGresult *r = agg_pg_run(c, "INSERT INTO secagg_log(job, round, seq, kind, device, body)"
                                " VALUES($1, $2, $3, $4::int, $5, $6)", &p);
    if (r == NULL) return sa_fail(a, c, "secagg_append");
    PQclear(r);
    if (agg_pg_commit(c) != 0) return sa_fail(a, c, "secagg_append");
    pthread_mutex_unlock(&c->mu);
    return 0;
}
