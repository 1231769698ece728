/* dprec aggregator core — what the round engine's three files share (not API; rounds/ only): a job's slot in the
 * table, a round being finalized, and the functions one file calls in another. agg_jobs.c holds the job table,
 * agg_engine.c the writer (its queue, the group commit, jobs, the engine's lifetime), agg_finalize.c the rounds'
 * closing (deadlines, the finalizer, the commit of a finalized round). */
#ifndef DPREC_AGG_ENGINE_PRIV_H
#define DPREC_AGG_ENGINE_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "agg_rounds.h"
#include "base/agg_base.h"

/* A job in memory: what the writer last committed. */
typedef struct agg_slot {
    agg_job job;
    size_t report_cap;         /* the largest report body (envelope included) this job can accept */
    int64_t in_round;          /* reports committed in the open round */
    int closing;               /* writer only: the open round is being finalized */
    agg_op *held;              /* writer only: operations that wait for that finalization */
    agg_op **held_tail;
    /* writer only, a shared state (agg_multi.c) */
    int64_t lease_until_ms;    /* this instance may finalize the job's rounds until then (monotonic ms); 0: not */
    int db_closing;            /* the state has the open round marked closing (a holder died finalizing it) */
    /* writer only, a folded job (agg_sums.c): this instance's shard of round acc_round's sum (NULL: not built yet),
     * and the bytes of the log rows it wrote since its last checkpoint */
    struct agg_sum *acc;
    int64_t acc_round;
    size_t log_bytes;
    int raw; /* the job keeps the raw path (agg_fold_job said 0: fixed by its protocol and params), asked once */
} agg_slot;

/* A round being finalized: decided by the writer, computed by the finalizer, committed by the writer. */
typedef struct agg_fin {
    agg_op op;            /* AGG_OP_FIN_DONE, queued for the writer once computed */
    struct agg_fin *next; /* the finalizer's queue */
    agg_job job;          /* a copy of the job as it was when the round began closing */
    int64_t round, count;
    int ok, abandoned;
    int unchanged;        /* AGG_ROUND_* (base/agg_base.h): why release r+1 carries release r's model, or 0 */
    char err[AGG_ERRMSG];
    unsigned char *release;
    size_t release_len;
    agg_op **waiters;     /* operations completed once this round is closed (or failed to) */
    size_t nwaiters;
} agg_fin;

/* agg_jobs.c: the slot of job id (binary search), or NULL; the caller holds jobs_mu or is the writer. A copy of a job
 * (params duplicated). A job added to the table (ids only grow, so it goes last; the writer, or open). The store's
 * open hands each stored job to agg_jobs_load: its protocol resolved, then added. 0 or -1. */
agg_slot *agg_jobs_find(dprec_agg *a, int64_t id);
int agg_jobs_copy(const agg_job *src, agg_job *out);
int agg_jobs_add(dprec_agg *a, const agg_job *j, int64_t in_round);
int agg_jobs_load(dprec_agg *a, agg_job *j, int64_t in_round);

/* agg_engine.c: an operation's outcome; op queued for the writer (front: ahead of everything queued, for held
 * operations going back in; the caller holds q_mu). */
void agg_engine_outcome(agg_op *op, int status, const char *code, const char *msg);
void agg_engine_enqueue(dprec_agg *a, agg_op *op, int front);

/* agg_finalize.c: a round marked closing (NULL when it cannot be finalized now), an operation that waits for it, the
 * finalization queued for the finalizer; the three at once (waiter may be NULL; unchanged: AGG_ROUND_*, the round is
 * released with its model unchanged); a finalization's result committed and its waiters answered (appended to
 * *done_tail); the finalizer thread. */
agg_fin *agg_fin_new(dprec_agg *a, agg_slot *s);
int agg_fin_add_waiter(agg_fin *f, agg_op *op);
void agg_fin_queue(dprec_agg *a, agg_fin *f);
void agg_fin_start(dprec_agg *a, agg_slot *s, agg_op *waiter, int unchanged);
void agg_fin_done(dprec_agg *a, agg_fin *f, agg_op ***done_tail);
void *agg_fin_main(void *arg);
/* The writer's operations that close rounds: the deadlines (AGG_OP_TICK: every due round closes), the rounds a crash
 * left full (AGG_OP_RESUME), the operator's close (AGG_OP_ROUND_CLOSE, appended to *done_tail unless it waits). */
void agg_fin_tick(dprec_agg *a, agg_op *op);
void agg_fin_resume(dprec_agg *a, agg_op *op);
void agg_fin_round_close(dprec_agg *a, agg_op *op, agg_op ***done_tail);

/* agg_sums.c, the writer's part in a folded round (docs/notes/streaming-sums.md): the slot's accumulator made ready
 * for its open round, inside the batch's transaction, before its first report is inserted (rebuilt from this
 * instance's checkpoint and log rows; 0, also for a job that is not folded, or -1); a committed report folded into it;
 * a checkpoint written when its log passed the sum's size (a transaction of its own, after the batch's commit); the
 * accumulator freed. And the finalizer's: round `round`'s whole sum (every instance's checkpoint and log rows) and
 * release `round` into *prev, from one snapshot (0, or -1 with err). */
struct agg_sum;
int agg_sums_prepare(dprec_agg *a, agg_slot *s);
void agg_sums_committed(dprec_agg *a, agg_slot *s, int64_t round, const unsigned char *bytes, size_t len);
void agg_sums_checkpoint(dprec_agg *a, agg_slot *s);
void agg_sums_drop(agg_slot *s);
int agg_sums_round(dprec_agg *a, const agg_job *job, int64_t round, agg_model *prev, struct agg_sum *sum, char *err,
                   size_t errcap);

/* agg_multi.c, the writer's part in a shared state (several instances on one PostgreSQL; nothing on SQLite): this
 * instance's holder id; the job table refreshed from the state (jobs created, rounds finalized, jobs closed by other
 * instances); every running job's lease taken or renewed; whether this instance may finalize s's rounds now (it holds
 * the lease, renewing it at most twice a second if it does not); one job's slot refreshed (added if it is new; NULL when
 * the state has no such job). Call the last three outside the writer's transactions except agg_multi_job. */
int agg_multi_init(dprec_agg *a);
void agg_multi_refresh(dprec_agg *a);
void agg_multi_leases(dprec_agg *a);
/* At close, after the writer stopped: this instance's leases given up. */
void agg_multi_release(dprec_agg *a);
int agg_multi_may_finalize(dprec_agg *a, agg_slot *s);
agg_slot *agg_multi_job(dprec_agg *a, int64_t id);
/* Test only (the finalizer thread): with DPREC_TEST_FINALIZE_PAUSE_MS=N in the environment, a round's finalization
 * sleeps N ms (1..600000) after its release is computed and signed and before the writer commits it, after logging
 * `test_finalize_pause` (warn), so that a test can kill -9 an instance inside that window (the round marked closing,
 * nothing committed). Unset: nothing. docs/operations.md, "Scaling out". */
void agg_multi_test_pause(dprec_agg *a, int64_t job, int64_t round);

#endif /* DPREC_AGG_ENGINE_PRIV_H */
