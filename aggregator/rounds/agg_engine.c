/* dprec aggregator core — the round engine's writer: its queue, the group commit of reports and registrations, the
 * jobs' creation and close, one pass over the queue, and the engine's lifetime.
 *
 * Single writer. Every change to the state is an operation (agg_op) queued for the writer thread. It takes everything
 * queued, applies the reports and registrations of the batch in one transaction of the store (WAL, synchronous=FULL by
 * default: one fsync for the batch, the group commit), and only then completes them: a report is acknowledged only
 * after the COMMIT of its batch. Reports that arrive while a commit waits for its fsync form the next batch, so
 * batches grow with load without a timer (group_commit_us is not used). The job table (agg_jobs.c) changes only after
 * the commit that changed the job.
 *
 * The writer decides (a report for the open round, a retry, a report for a closing round, which rounds now close);
 * the store (state/agg_store.h) writes what it decided and decides nothing. Closing rounds is agg_finalize.c's: a
 * report that fills an early-closing round starts its finalization, and reports for a closing round wait (they hold
 * no thread) and are answered once it is closed, exactly as if they had arrived a moment later. */
#define _GNU_SOURCE /* pthread_setname_np: the threads are named in top -H and perf */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_engine_priv.h"
#include "agg_secure.h"
#include "protocols/agg_protocol.h"
#include "state/agg_store.h"

/* ---- the writer's queue ----------------------------------------------------------------------------------- */

void agg_engine_outcome(agg_op *op, int status, const char *code, const char *msg) {
    op->status = status;
    op->code = code;
    snprintf(op->message, sizeof op->message, "%s", msg);
}

void agg_engine_enqueue(dprec_agg *a, agg_op *op, int front) {
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
        agg_engine_outcome(op, 503, "shutting_down", "the aggregator is shutting down");
        op->done(op);
        return;
    }
    agg_engine_enqueue(a, op, 0);
    pthread_mutex_unlock(&a->q_mu);
}

static void complete(agg_op *op) {
    op->next = NULL;
    op->done(op);
}

/* ---- reports and registrations: the group commit ------------------------------------------------------------ */

/* The report id already stored for this job: 1 (outcome set: 200 duplicate; 409 if another device's, or if its bytes
 * differ from the stored report's: a retry re-sends the same bytes, so other bytes under an acknowledged id are
 * never a retry, and dropping them silently would tell the device they were taken), 0 none, -1 error. Bytes are
 * compared by SHA-256 digest, which the row keeps after its round drops the payload; a row of a state written before
 * digests were kept, whose payload is gone, cannot be compared and is answered as a duplicate. */
static int report_known(dprec_agg *a, agg_op *op) {
    int64_t dev = 0, round = 0;
    unsigned char stored[32], mine[32];
    int has_digest = 0;
    int found = agg_store_report_find(a, op->job, op->report_id, &dev, &round, stored, &has_digest);
    if (found == 1) {
        op->accepted_round = (uint64_t)round;
        if (dev != op->device) {
            agg_engine_outcome(op, 409, "already_reported", "this report id was used by another device");
        } else if (has_digest && (dprec_sha256(op->bytes, op->len, mine) != 0 || memcmp(mine, stored, 32) != 0)) {
            agg_engine_outcome(op, 409, "report_id_reused",
                               "this report id was accepted with other bytes; a retry must re-send the same report");
        } else {
            agg_engine_outcome(op, 200, NULL, "");
            op->duplicate = 1;
        }
    }
    return found;
}

enum { REPORT_DONE = 0, REPORT_INSERTED = 1, REPORT_HELD = 2 };

/* Checks and inserts one report inside the batch's transaction. */
static int report_one(dprec_agg *a, agg_op *op, int64_t now) {
    agg_slot *s = agg_jobs_find(a, op->job);
    /* a shared state: a job another instance created, or a round ahead of this table, is read from the state first */
    if (agg_store_shared(a) && (s == NULL || op->round > (uint64_t)s->job.round)) s = agg_multi_job(a, op->job);
    if (s == NULL) {
        agg_engine_outcome(op, 404, "not_found", "unknown job");
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
        if (s->job.done) agg_engine_outcome(op, 409, "job_done", "the job has finished");
        else if (op->round != (uint64_t)round)
            agg_engine_outcome(op, 409, "round_closed", "the report's round is not the job's open round");
        else agg_engine_outcome(op, 400, "bad_report", "release_version must be the round's release (round r uses release r)");
        return REPORT_DONE;
    }
    /* a folded job: its accumulator ready for this round before the round's first insert of the batch */
    if (agg_sums_prepare(a, s) != 0) goto fail;
    int rc = agg_store_report_insert(a, op->job, round, op->device, op->report_id, op->bytes, op->len, now);
    if (rc == AGG_STORE_ROUND_CLOSED) {
        /* a shared state: the lease holder marked the round closing, or another instance finalized it */
        int k = report_known(a, op);
        if (k < 0) goto fail;
        if (k == 0) agg_engine_outcome(op, 409, "round_closed", "the report's round is not the job's open round");
        agg_multi_job(a, op->job);
        return REPORT_DONE;
    }
    if (rc == AGG_STORE_CONFLICT) {
        /* a stored report id (a retry, or another device's), else this device's other report of the round */
        int k = report_known(a, op);
        if (k < 0) goto fail;
        if (k == 0) agg_engine_outcome(op, 409, "already_reported", "this device already has a different report in this round");
        return REPORT_DONE;
    }
    if (rc != 0) goto fail;
    agg_engine_outcome(op, 200, NULL, "");
    op->accepted_round = (uint64_t)round;
    return REPORT_INSERTED;
fail:
    agg_store_log_error(a, "report_insert");
    agg_engine_outcome(op, 500, "internal", "state database error");
    return REPORT_DONE;
}

static void register_one(dprec_agg *a, agg_op *op, int64_t now) {
    op->id = agg_store_device_insert(a, op->token_hash, op->platform, &op->enroll, now);
    if (op->id > 0) {
        agg_engine_outcome(op, 201, NULL, "");
    } else if (op->id == AGG_STORE_TOKEN_USED) {
        op->id = -1;
        agg_engine_outcome(op, 409, "enrollment_used", "this enrollment token has registered a device already");
    } else {
        agg_store_log_error(a, "register");
        agg_engine_outcome(op, 500, "internal", "could not store the device");
    }
}

/* One transaction for every report and registration of the batch; the completed ones are appended to *done_tail. */
static void run_batch(dprec_agg *a, agg_op *batch, agg_op ***done_tail) {
    int64_t now = agg_now(a);
    size_t inserted = 0, nops = 0;
    agg_op *kept = NULL, **kept_tail = &kept, *next;
    if (agg_store_begin(a) != 0) {
        agg_store_log_error(a, "begin");
        for (agg_op *op = batch; op != NULL; op = op->next) agg_engine_outcome(op, 500, "internal", "state database busy");
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
    int committed = agg_store_commit(a) == 0;
    if (!committed) {
        agg_store_log_error(a, "commit");
        agg_store_rollback(a);
        for (agg_op *op = kept; op != NULL; op = op->next)
            if ((op->status == 200 && !op->duplicate) || op->status == 201)
                agg_engine_outcome(op, 500, "internal", "commit failed");
    } else {
        /* committed: new devices' tokens are known, the counts move, and the early-closing rounds that are now full
         * begin to close */
        for (agg_op *op = kept; op != NULL; op = op->next)
            if (op->kind == AGG_OP_REGISTER && op->status == 201) agg_store_token_known(a, op->token_hash, op->id);
        pthread_mutex_lock(&a->jobs_mu);
        for (agg_op *op = kept; op != NULL; op = op->next)
            if (op->kind == AGG_OP_REPORT && op->status == 200 && !op->duplicate) {
                agg_slot *s = agg_jobs_find(a, op->job);
                if (s != NULL && s->job.round == (int64_t)op->accepted_round) s->in_round++;
                inserted++;
            }
        pthread_mutex_unlock(&a->jobs_mu);
        /* folded rounds (agg_sums.c): each committed report into its round's accumulator (the writer's own: no lock),
         * then the rounds whose log passed their sum's size checkpointed, each in a transaction of its own */
        for (agg_op *op = kept; op != NULL && inserted > 0; op = op->next) {
            agg_slot *s = op->kind == AGG_OP_REPORT && op->status == 200 && !op->duplicate ? agg_jobs_find(a, op->job)
                                                                                           : NULL;
            if (s != NULL) agg_sums_committed(a, s, (int64_t)op->accepted_round, op->bytes, op->len);
        }
        for (agg_op *op = kept; op != NULL && inserted > 0; op = op->next) {
            agg_slot *s = op->kind == AGG_OP_REPORT && op->status == 200 && !op->duplicate ? agg_jobs_find(a, op->job)
                                                                                           : NULL;
            if (s != NULL) agg_sums_checkpoint(a, s);
        }
        /* A synchronous caller's report that made its round close is answered after the round closed (the
         * in-process fleet and the tests see the round advance as soon as the report that completed it returns). */
        agg_fin *started[16];
        size_t nstarted = 0;
        for (agg_op *op = kept; op != NULL && inserted > 0; op = op->next) {
            if (op->kind != AGG_OP_REPORT || op->status != 200 || op->duplicate) continue;
            agg_slot *s = agg_jobs_find(a, op->job);
            if (s == NULL || s->closing || s->job.done || !agg_closes_early(&s->job) ||
                s->in_round < s->job.min_reports || s->job.round != (int64_t)op->accepted_round)
                continue;
            agg_fin *f = agg_fin_new(a, s);
            if (f != NULL && nstarted < sizeof started / sizeof started[0]) started[nstarted++] = f;
            else if (f != NULL) agg_fin_queue(a, f);
        }
        agg_op **pp = &kept;
        while (*pp != NULL) {
            agg_op *op = *pp;
            agg_fin *f = NULL;
            for (size_t k = 0; op->wait_round && op->kind == AGG_OP_REPORT && k < nstarted; k++)
                if (started[k]->job.id == op->job && started[k]->round == (int64_t)op->accepted_round) f = started[k];
            if (f != NULL && agg_fin_add_waiter(f, op) == 0) {
                *pp = op->next;
                op->next = NULL;
            } else {
                pp = &op->next;
            }
        }
        for (size_t k = 0; k < nstarted; k++) agg_fin_queue(a, started[k]);
    }
    /* a commit that failed stored nothing and is not counted: commits and reports per commit are what became durable */
    int bucket = 0;
    while (bucket < AGG_COMMIT_BUCKETS && inserted > agg_commit_bucket_le(bucket)) bucket++;
    pthread_mutex_lock(&a->m_mu);
    if (committed) {
        a->metrics.commits++;
        a->metrics.committed_reports += inserted;
        a->metrics.committed_ops += nops;
        a->metrics.commit_hist[bucket]++;
    }
    pthread_mutex_unlock(&a->m_mu);
    **done_tail = kept;
    while (**done_tail != NULL) *done_tail = &(**done_tail)->next;
}

/* ---- jobs ----------------------------------------------------------------------------------------------- */

static void job_create(dprec_agg *a, agg_op *op) {
    const agg_job *spec = op->spec;
    int64_t now = agg_now(a);
    int ok = 0;
    if (agg_store_begin(a) == 0) {
        ok = agg_store_job_insert(a, spec, spec->proto->name, spec->proto->id, op->spec_json, op->release,
                                  op->release_len, now) == 0;
        if (!ok || agg_store_commit(a) != 0) {
            agg_store_log_error(a, "job_create");
            agg_store_rollback(a);
            ok = 0;
        }
    } else {
        agg_store_log_error(a, "begin");
    }
    if (ok) {
        agg_job j = *spec;
        j.proto_id = spec->proto->id;
        j.round = 1;
        j.deadline = now + spec->round_seconds;
        j.done = 0;
        if (agg_jobs_add(a, &j, 0) != 0) ok = 0; /* stored, but not served until the next open: say so */
    }
    if (!ok) {
        agg_engine_outcome(op, 500, "internal", "could not create the job");
        return;
    }
    agg_engine_outcome(op, 201, NULL, "");
    op->id = spec->id;
    agg_multi_leases(a); /* a shared state: its lease at once, so that its rounds close without waiting for a tick */
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) {
        cJSON_AddNumberToObject(f, "job", (double)spec->id);
        cJSON_AddStringToObject(f, "protocol", spec->proto->name);
        cJSON *rule = spec->rule != NULL ? cJSON_Parse(spec->rule) : NULL; /* d and rounds the population rule chose */
        if (rule != NULL) {
            cJSON_AddNumberToObject(f, "d", spec->d);
            cJSON_AddNumberToObject(f, "rounds", (double)spec->rounds);
            if (!cJSON_AddItemToObject(f, "population_rule", rule)) cJSON_Delete(rule);
        }
    }
    agg_log(a, "info", "job_created", f);
}

static void job_close(dprec_agg *a, agg_op *op) {
    agg_slot *s = agg_jobs_find(a, op->job);
    if (s == NULL) {
        agg_engine_outcome(op, 404, "not_found", "unknown job");
        return;
    }
    if (s->job.done) {
        agg_engine_outcome(op, 409, "job_done", "the job has finished");
        return;
    }
    int64_t rounds = s->job.rounds < s->job.round ? s->job.rounds : s->job.round;
    if (agg_store_job_set_rounds(a, op->job, rounds) != 0) {
        agg_engine_outcome(op, 500, "internal", "state database error");
        return;
    }
    pthread_mutex_lock(&a->jobs_mu);
    s->job.rounds = rounds;
    pthread_mutex_unlock(&a->jobs_mu);
    agg_engine_outcome(op, 200, NULL, "");
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
        case AGG_OP_ROUND_CLOSE: agg_fin_round_close(a, op, &done_tail); continue;
        case AGG_OP_TICK: agg_fin_tick(a, op); break;
        case AGG_OP_RESUME: agg_fin_resume(a, op); break;
        case AGG_OP_FIN_DONE: agg_fin_done(a, op->fin, &done_tail); continue;
        default: agg_engine_outcome(op, 500, "internal", "unknown operation"); break;
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
        agg_store_writer_lock(a); /* uncontended unless readers share the connection (no durability) */
        run_ops(a, list);
        agg_store_writer_unlock(a);
        pthread_mutex_lock(&a->q_mu);
    }
    a->writer_running = 0;
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

static void stop_threads(dprec_agg *a) {
    pthread_mutex_lock(&a->q_mu);
    int w = a->writer_running, f = a->finalizer_running;
    a->stopping = 1;
    pthread_cond_broadcast(&a->q_cv);
    pthread_cond_broadcast(&a->f_cv);
    pthread_mutex_unlock(&a->q_mu);
    if (f) pthread_join(a->finalizer, NULL);
    if (w) pthread_join(a->writer, NULL);
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
    a->next_job_id = 1;
    /* the store, and the job table with each open round's report count (agg_jobs_load) */
    int64_t seq = 0;
    if (agg_store_open(a, agg_jobs_load, &seq, err, errcap) != 0) return -1;
    if (seq + 1 > a->next_job_id) a->next_job_id = seq + 1;
    /* a shared state: this instance's holder id, the table as the state has it, the leases it can take now */
    if (agg_multi_init(a) != 0) {
        snprintf(err, errcap, "random generator failure");
        return -1;
    }
    agg_multi_refresh(a);
    agg_multi_leases(a);
    a->writer_running = a->finalizer_running = 1;
    if (pthread_create(&a->writer, NULL, writer_main, a) != 0) {
        a->writer_running = a->finalizer_running = 0;
        snprintf(err, errcap, "cannot start the writer thread");
        return -1;
    }
    if (pthread_create(&a->finalizer, NULL, agg_fin_main, a) != 0) {
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
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) cJSON_AddStringToObject(f, "engine", agg_store_engine_name(a));
    if (f != NULL && agg_store_shared(a)) cJSON_AddStringToObject(f, "instance", a->instance_id);
    agg_log(a, "info", "state_opened", f);
    return 0;
}

void agg_state_close(dprec_agg *a) {
    stop_threads(a);
    if (a->store != NULL) agg_multi_release(a);
    agg_store_close(a);
    for (size_t i = 0; i < a->njobs; i++) {
        agg_sums_drop(a->jobs[i]);
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
}

int agg_health(dprec_agg *a) {
    int db = agg_store_health(a);
    pthread_mutex_lock(&a->q_mu);
    int running = a->writer_running && a->finalizer_running;
    pthread_mutex_unlock(&a->q_mu);
    return db == 0 && running ? 0 : -1;
}
