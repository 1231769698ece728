/* dprec aggregator core — closing rounds: when (a round full at min_reports, a deadline, the operator, a restart
 * after a crash), the finalizer that computes a round's release, and the commit that makes it the job's.
 *
 * The writer decides when a round closes (min_reports for the early-closing protocols, the deadline, an operator) and
 * marks it closing. Every round closes at its deadline, whatever its count, and is never extended: who is in a round
 * is then the devices whose reports were in before its deadline, whoever else reported (agg_fin_tick). A central or
 * joint round runs its global step on whatever arrived, however few (none: noise only); a local or non-private round
 * with no report, and a secure round with no sum, are released unchanged: release r+1 carries release r's model, and
 * no global step runs. The finalizer thread then reads the round (release r
 * and, unless unchanged, its reports) from a read snapshot of the store, runs the protocol's global step (unless
 * unchanged) and signs release r+1, off the writer and off every request thread; the writer commits it through the
 * store in one transaction that re-checks r is still the job's open round, stores the release, drops the payloads,
 * charges the ledger (an unchanged round as any other) and advances the job. That check makes it exactly-once; a crash
 * before the COMMIT leaves the round open, and dprec_agg_open (or the next tick) closes it again. Reports for a closing
 * round wait (they hold no thread) and are answered once it is closed, exactly as if they had arrived a moment later.
 *
 * Its own file, apart from the writer's queue and group commit (agg_engine.c): this is the rounds' life cycle, and
 * the one place that calls a protocol's global step. */
#define _GNU_SOURCE /* pthread_setname_np: the threads are named in top -H and perf */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_engine_priv.h"
#include "agg_secure.h"
#include "agg_sign.h"
#include "protocols/agg_protocol.h"
#include "state/agg_store.h"

/* ---- the round engine ------------------------------------------------------------------------------------ */

int agg_fin_add_waiter(agg_fin *f, agg_op *op) {
    agg_op **nw = realloc(f->waiters, (f->nwaiters + 1) * sizeof *nw);
    if (nw == NULL) return -1; /* not waited for: answered now, the round closes all the same */
    f->waiters = nw;
    f->waiters[f->nwaiters++] = op;
    op->pending++;
    return 0;
}

/* Marks s's open round closing (the writer only). NULL when it cannot be finalized now: out of memory, or closing
 * down (the finalizer has gone; the round stays open, as after a crash, and open resumes it). */
agg_fin *agg_fin_new(dprec_agg *a, agg_slot *s) {
    pthread_mutex_lock(&a->q_mu);
    int running = a->finalizer_running && !a->stopping;
    pthread_mutex_unlock(&a->q_mu);
    if (!running) return NULL;
    /* a shared state (agg_multi.c): only the lease's holder finalizes, and only once the state has the round marked
     * closing (every report acknowledged in it is then committed, and no other enters it) */
    if (!agg_multi_may_finalize(a, s)) return NULL;
    int marked = agg_store_round_closing(a, s->job.id, s->job.round);
    if (marked != 1) {
        if (marked == 0) agg_multi_job(a, s->job.id); /* finalized elsewhere: the slot catches up */
        return NULL;
    }
    agg_fin *f = calloc(1, sizeof *f);
    if (f == NULL || agg_jobs_copy(&s->job, &f->job) != 0) {
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

void agg_fin_queue(dprec_agg *a, agg_fin *f) {
    pthread_mutex_lock(&a->q_mu);
    if (a->f_tail != NULL) a->f_tail->next = f;
    else a->f_head = f;
    a->f_tail = f;
    pthread_cond_signal(&a->f_cv);
    pthread_mutex_unlock(&a->q_mu);
}

/* agg_fin_new, waiter (may be NULL) added, queued. */
void agg_fin_start(dprec_agg *a, agg_slot *s, agg_op *waiter, int unchanged) {
    agg_fin *f = agg_fin_new(a, s);
    if (f == NULL) return;
    f->unchanged = unchanged;
    if (waiter != NULL) agg_fin_add_waiter(f, waiter);
    agg_fin_queue(a, f);
}

/* The finalizer's part: release r+1 from a read snapshot of round r, computed and signed. A round released unchanged
 * (f->unchanged, or a secure round with no sum) signs release r's model again as version r+1: its reports are not
 * read, so the release is post-processing of release r alone (docs/privacy.md, "Who is in a round"). */
static void fin_compute(dprec_agg *a, agg_fin *f) {
    agg_model prev, next;
    agg_store_reports l;
    memset(&prev, 0, sizeof prev);
    memset(&next, 0, sizeof next);
    memset(&l, 0, sizeof l);
    {
        cJSON *o = cJSON_CreateObject();
        if (o != NULL) {
            cJSON_AddNumberToObject(o, "job", (double)f->job.id);
            cJSON_AddNumberToObject(o, "round", (double)f->round);
            cJSON_AddNumberToObject(o, "reports", (double)f->count);
            if (f->unchanged) cJSON_AddBoolToObject(o, "model_unchanged", 1);
        }
        agg_log(a, "info", "round_finalize_started", o);
    }
    agg_fold_spec spec;
    int folded = !f->unchanged && agg_fold_job(&f->job, &spec); /* its sum, not its reports (agg_sums.c) */
    int rc;
    if (folded) {
        agg_sum sum;
        rc = agg_sums_round(a, &f->job, f->round, &prev, &sum, f->err, sizeof f->err);
        if (rc == 0) {
            f->count = (int64_t)sum.count;
            pthread_mutex_lock(&a->rng_mu);
            rc = agg_fold_sum_step(&f->job, &prev, &sum, &a->rng, &next, f->err, sizeof f->err);
            pthread_mutex_unlock(&a->rng_mu);
            agg_sum_free(&sum);
        }
    } else {
        rc = agg_store_round_load(a, f->job.id, f->round, &prev, f->unchanged ? NULL : &l, f->err, sizeof f->err);
    }
    if (rc == 0 && !f->unchanged && !folded) {
        f->count = (int64_t)l.n;
        double *sum = NULL; /* a secure job's round: the unmasked noisy sum (agg_secure.h) */
        if (agg_secure_job(&f->job, NULL)) {
            if (agg_secure_take_sum(a, &f->job, f->round, &sum, &f->job.secure_survivors) != 0) {
                rc = -1; /* a shared state's log could not be read: the round is not finalized without its sum */
                snprintf(f->err, sizeof f->err, "cannot read the secure round's log from the state");
            }
            f->job.secure_sum = sum;
            f->count = f->job.secure_survivors;
            /* nobody joined, or it could not be unmasked: nothing was learned, and no global step runs */
            if (rc == 0 && sum == NULL) f->unchanged = AGG_ROUND_UNCHANGED_NO_SUM;
        }
        if (rc == 0 && !f->unchanged) {
            pthread_mutex_lock(&a->rng_mu);
            rc = f->job.proto->global_step(&f->job, &prev, l.r, l.n, &a->rng, &next, f->err, sizeof f->err);
            pthread_mutex_unlock(&a->rng_mu);
        }
        f->job.secure_sum = NULL;
        free(sum);
    }
    agg_store_reports_free(&l);
    if (rc == 0) {
        agg_model *out = f->unchanged ? &prev : &next;
        agg_model_clamp(out);
        rc = agg_release_build(a, &f->job, out, (uint64_t)f->round + 1, &f->release, &f->release_len, f->err,
                               sizeof f->err);
    }
    if (rc != 0 && f->err[0] == '\0') snprintf(f->err, sizeof f->err, "the global step failed");
    f->ok = rc == 0;
    if (f->ok) agg_multi_test_pause(a, f->job.id, f->round); /* tests only: a window before the commit */
    agg_model_free(&prev);
    agg_model_free(&next);
}

void *agg_fin_main(void *arg) {
    dprec_agg *a = arg;
    pthread_setname_np(pthread_self(), "dprec-finalize");
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
            fin_compute(a, f);
        }
        pthread_mutex_lock(&a->q_mu);
        f->op.next = NULL;
        agg_engine_enqueue(a, &f->op, 0);
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
    /* the store re-checks that r is still the job's open round in the transaction that commits it (exactly once),
     * stores the release, drops the round's payloads, charges the ledger and advances the job */
    agg_store_round r;
    memset(&r, 0, sizeof r);
    r.job = job;
    r.round = round;
    r.release = f->release;
    r.release_len = f->release_len;
    r.now = now;
    r.deadline = now + s->job.round_seconds;
    r.done = done;
    if (s->job.proto->round_step != NULL) {
        double spent = 0.0;
        agg_budget_check(&s->job, round, &spent);
        r.ledger = 1;
        r.epsilon_spent = spent;
        r.delta = s->job.budget_delta;
    }
    int rc = agg_store_round_commit(a, &r, f->err, sizeof f->err);
    if (rc != 1) return rc;
    pthread_mutex_lock(&a->jobs_mu);
    s->job.round = round + 1;
    s->job.deadline = now + s->job.round_seconds;
    s->job.done = done;
    s->in_round = 0;
    pthread_mutex_unlock(&a->jobs_mu);
    agg_sums_drop(s); /* the round's sum is in its release; the next round's starts empty */
    *done_out = done;
    return 1;
}

/* A finalization came back: commit it, then answer its waiters and put the held operations back in the queue. */
void agg_fin_done(dprec_agg *a, agg_fin *f, agg_op ***done_tail) {
    agg_slot *s = agg_jobs_find(a, f->job.id);
    int done = 0;
    int result = f->abandoned ? 0 : fin_commit(a, s, f, &done);
    cJSON *o = cJSON_CreateObject();
    if (o != NULL) {
        cJSON_AddNumberToObject(o, "job", (double)f->job.id);
        cJSON_AddNumberToObject(o, "round", (double)f->round);
    }
    if (result == 1) {
        agg_count_round(a, f->unchanged);
        if (o != NULL) {
            cJSON_AddNumberToObject(o, "reports", (double)f->count);
            cJSON_AddNumberToObject(o, "release_version", (double)(f->round + 1));
            cJSON_AddBoolToObject(o, "job_done", done);
            if (f->unchanged) cJSON_AddBoolToObject(o, "model_unchanged", 1);
        }
        agg_log(a, "info", "round_finalized", o);
        if (f->unchanged) { /* what the operator looks for when a job's model stops moving (docs/operations.md) */
            cJSON *u = cJSON_CreateObject();
            if (u != NULL) {
                cJSON_AddNumberToObject(u, "job", (double)f->job.id);
                cJSON_AddNumberToObject(u, "round", (double)f->round);
                cJSON_AddNumberToObject(u, "reports", (double)f->count);
                cJSON_AddNumberToObject(u, "min_reports", (double)f->job.min_reports);
                cJSON_AddStringToObject(u, "reason", f->unchanged == AGG_ROUND_UNCHANGED_NO_SUM ? "secure_no_sum"
                                                                                                : "no_reports");
                cJSON_AddNumberToObject(u, "release_version", (double)(f->round + 1));
            }
            agg_log(a, "warn", "round_finalized_unchanged", u);
        }
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
            if (result < 0) agg_engine_outcome(w, 500, "internal", "finalizing the round failed");
            else if (result == 0 && f->abandoned) agg_engine_outcome(w, 503, "shutting_down", "the aggregator is shutting down");
            else if (result == 0) agg_engine_outcome(w, 409, "round_closed", "the round was closed meanwhile");
            else agg_engine_outcome(w, 200, NULL, "");
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
            agg_engine_enqueue(a, s->held, 1);
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

/* Deadlines: every due round closes, whatever its count, and is never extended. Issue 36: extending a central round
 * that had fewer than min_reports reports let late devices in exactly when some device was missing, so with
 * min_reports - 1 others on time one device's presence decided whether later devices joined the round, and
 * neighbouring inputs differed by more than one user (the defect agg_closes_early's comment describes, through the
 * deadline). Now who is in a round is the devices whose reports were committed before the tick that closes it; a
 * central or joint round runs its global step on whatever arrived (a rule that skipped it below a count would reveal
 * whether the count was made: docs/privacy.md "Who is in a round"); an early-closing round with none is released
 * unchanged. A
 * secure job's round is the one exception to "closes now": each deadline closes its open phase, and a phase that is
 * not the last gives the next one its own period (at most three, agg_secure.h); those deadlines share one
 * transaction. */
void agg_fin_tick(dprec_agg *a, agg_op *op) {
    int64_t now = op->now;
    int64_t *phase = NULL;
    size_t nphase = 0;
    int shared = agg_store_shared(a);
    if (shared) { /* what other instances did, then this instance's leases (agg_multi.c) */
        agg_multi_refresh(a);
        agg_multi_leases(a);
    }
    for (size_t i = 0; i < a->njobs; i++) {
        agg_slot *s = a->jobs[i];
        if (s->job.done || s->closing) continue;
        int due = s->job.deadline <= now;
        /* a shared state: a round that other instances' reports filled, or that a holder that died left marked
         * closing, closes at the lease holder's tick (a report's own instance may not hold the lease) */
        if (!due && shared && !agg_secure_job(&s->job, NULL))
            due = s->db_closing || (agg_closes_early(&s->job) && s->in_round >= s->job.min_reports);
        if (!due) continue;
        if (agg_secure_job(&s->job, NULL)) {
            /* unmasked, or with no sum: the finalizer takes what there is (agg_secure_take_sum) */
            int ready = agg_secure_deadline(a, &s->job);
            if (ready < 0) continue; /* a shared state's log failed: the next tick tries again */
            if (ready) {
                agg_fin_start(a, s, op, AGG_ROUND_CHANGED);
                continue;
            }
            int64_t *np = realloc(phase, (nphase + 1) * sizeof *np);
            if (np == NULL) continue; /* the next tick sets it */
            phase = np;
            phase[nphase++] = (int64_t)i;
            continue;
        }
        /* a central or joint round runs its global step on whatever arrived, none included (noise only): its noise is
         * calibrated to one user's contribution, not to a count, so the release is the mechanism's under adding or
         * removing any one user; a rule that skipped the step below a count would tell whether the count was made */
        int empty = s->in_round == 0 && agg_closes_early(&s->job);
        agg_fin_start(a, s, op, empty ? AGG_ROUND_UNCHANGED_NO_REPORTS : AGG_ROUND_CHANGED);
    }
    if (nphase > 0) {
        int ok = agg_store_begin(a) == 0;
        for (size_t k = 0; ok && k < nphase; k++) {
            agg_slot *s = a->jobs[phase[k]];
            ok = agg_store_job_set_deadline(a, s->job.id, now + s->job.round_seconds) == 0;
        }
        if (ok && agg_store_commit(a) == 0) {
            pthread_mutex_lock(&a->jobs_mu);
            for (size_t k = 0; k < nphase; k++)
                a->jobs[phase[k]]->job.deadline = now + a->jobs[phase[k]]->job.round_seconds;
            pthread_mutex_unlock(&a->jobs_mu);
        } else {
            agg_store_log_error(a, "deadline");
            agg_store_rollback(a);
        }
    }
    free(phase);
    agg_engine_outcome(op, 200, NULL, "");
}

/* At open: an early-closing round that holds min_reports but whose finalization never committed (a crash). */
void agg_fin_resume(dprec_agg *a, agg_op *op) {
    for (size_t i = 0; i < a->njobs; i++) {
        agg_slot *s = a->jobs[i];
        if (!s->job.done && !s->closing &&
            ((agg_closes_early(&s->job) && s->in_round >= s->job.min_reports) || s->db_closing))
            agg_fin_start(a, s, op, AGG_ROUND_CHANGED);
    }
    agg_engine_outcome(op, 200, NULL, "");
}

void agg_fin_round_close(dprec_agg *a, agg_op *op, agg_op ***done_tail) {
    agg_slot *s = agg_multi_job(a, op->job); /* a shared state: as the state has it now */
    if (s == NULL) agg_engine_outcome(op, 404, "not_found", "unknown job");
    else if (s->job.done) agg_engine_outcome(op, 409, "job_done", "the job has finished");
    else if (s->closing) { /* after the finalization under way: then this round is closed, or still open */
        op->next = NULL;
        *s->held_tail = op;
        s->held_tail = &op->next;
        return;
    } else if ((int64_t)op->round != s->job.round)
        agg_engine_outcome(op, 409, "round_closed", "the round was closed meanwhile");
    else if (!agg_multi_may_finalize(a, s)) {
        /* another instance holds the job's lease: the round's deadline moves to now in the state, and the holder
         * closes it at its next tick (answered 202: accepted, not yet closed) */
        int64_t now = agg_now(a);
        if (agg_store_begin(a) == 0 && agg_store_job_set_deadline(a, s->job.id, now) == 0 && agg_store_commit(a) == 0) {
            pthread_mutex_lock(&a->jobs_mu);
            s->job.deadline = now;
            pthread_mutex_unlock(&a->jobs_mu);
            agg_engine_outcome(op, 202, NULL, "");
        } else {
            agg_store_log_error(a, "round_close");
            agg_store_rollback(a);
            agg_engine_outcome(op, 500, "internal", "state database error");
        }
    } else {
        agg_fin *f = agg_fin_new(a, s);
        if (f != NULL && agg_fin_add_waiter(f, op) == 0) {
            agg_fin_queue(a, f);
            return;
        }
        if (f != NULL) agg_fin_queue(a, f); /* the round closes; this caller is answered now */
        agg_engine_outcome(op, 503, "shutting_down", "the round cannot be finalized now");
    }
    op->next = NULL;
    **done_tail = op;
    *done_tail = &op->next;
}

/* Whether a round may close as soon as it holds min_reports reports. Only where the guarantee is each device's
 * own (local DP) or there is none: for central and joint protocols, closing at a count makes who is included
 * depend on who else reported (a replace-one relation: the add/remove sensitivity doubles and Poisson
 * amplification no longer applies), so their rounds close at the deadline (or by the operator) and their global
 * step runs on whatever arrived, whatever min_reports says (agg_fin_tick; docs/protocol.md, docs/privacy.md). */
int agg_closes_early(const agg_job *j) {
    dprec_model m = agg_job_model(j);
    return m == DPREC_MODEL_LOCAL || m == DPREC_MODEL_NONE;
}
