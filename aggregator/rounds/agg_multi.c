/* dprec aggregator core — several instances on one state (PostgreSQL; docs/notes/multi-instance.md): the writer keeps
 * its job table in step with what other instances committed, and finalizes a job's rounds only while it holds the job's
 * lease.
 *
 * The job table (agg_jobs.c) is each instance's cache of the jobs' rows; in a shared state the database decides every
 * write (a report insert is refused once its round is marked closing, a round commits once, agg_store.h), so a cache a
 * moment old costs a 409 or a re-read, never a wrong answer. The writer refreshes it on every tick (once a second in
 * `serve`): one read of every job's state, unknown jobs added. On the same tick it takes or renews, in one statement,
 * the lease of every running job that is free, expired or already its own: the holder (this instance's random id) is
 * the one that finalizes the job's rounds until the lease expires on the database server's clock; an instance that dies
 * stops renewing, and the first other instance to tick after the expiry takes over. The lease saves work and gives one
 * finalizer; exactly once is still the store's conditional commit. Nothing here runs on SQLite (one instance:
 * agg_store_shared is 0). Its own file: the engine's other files decide rounds, this one only who may. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agg_engine_priv.h"
#include "agg_secure.h"
#include "protocols/agg_protocol.h"
#include "state/agg_store.h"

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int agg_multi_init(dprec_agg *a) {
    if (a->cfg.instance_id != NULL && a->cfg.instance_id[0] != '\0') {
        snprintf(a->instance_id, sizeof a->instance_id, "%s", a->cfg.instance_id);
        a->cfg.instance_id = NULL; /* the caller's string: read at open only */
        return 0;
    }
    unsigned char raw[16];
    if (agg_random(a, raw, sizeof raw) != 0) return -1;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        a->instance_id[2 * i] = hex[raw[i] >> 4];
        a->instance_id[2 * i + 1] = hex[raw[i] & 15];
    }
    a->instance_id[32] = '\0';
    return 0;
}

/* The state's view of a known job applied to its slot (a read older than the slot's round is ignored). */
static void apply(dprec_agg *a, agg_slot *s, const agg_store_job_state *st) {
    if (st->round < s->job.round) return;
    pthread_mutex_lock(&a->jobs_mu);
    s->job.round = st->round;
    s->job.deadline = st->deadline;
    s->job.rounds = st->rounds;
    s->job.done = st->done;
    s->in_round = st->in_round;
    s->db_closing = st->closing;
    pthread_mutex_unlock(&a->jobs_mu);
}

/* A job another instance created, added to the table. Its slot, or NULL. */
static agg_slot *add_new(dprec_agg *a, int64_t id, agg_store_job_state *st) {
    agg_job j;
    agg_store_job_state mine;
    if (st == NULL) st = &mine;
    if (agg_store_job_read(a, id, &j, st) != 1) return NULL;
    int rc = agg_jobs_load(a, &j, st->in_round);
    agg_job_free(&j);
    agg_slot *s = rc == 0 ? agg_jobs_find(a, id) : NULL;
    if (s != NULL) {
        s->db_closing = st->closing;
        cJSON *f = cJSON_CreateObject();
        if (f != NULL) cJSON_AddNumberToObject(f, "job", (double)id);
        agg_log(a, "info", "job_discovered", f);
    }
    return s;
}

agg_slot *agg_multi_job(dprec_agg *a, int64_t id) {
    agg_slot *s = agg_jobs_find(a, id);
    if (!agg_store_shared(a)) return s;
    if (s == NULL) return add_new(a, id, NULL);
    agg_job j;
    agg_store_job_state st;
    if (agg_store_job_read(a, id, &j, &st) == 1) {
        agg_job_free(&j);
        apply(a, s, &st);
    }
    return s;
}

void agg_multi_refresh(dprec_agg *a) {
    agg_store_job_state *st = NULL;
    size_t n = 0;
    if (!agg_store_shared(a) || agg_store_jobs_state(a, &st, &n) != 0) return;
    for (size_t i = 0; i < n; i++) {
        agg_slot *s = agg_jobs_find(a, st[i].id);
        if (s != NULL) apply(a, s, &st[i]);
        else add_new(a, st[i].id, NULL);
        /* a secure round finalized (here or elsewhere): this instance's copy of it goes */
        agg_secure_forget(a, st[i].id, st[i].done ? INT64_MAX : st[i].round);
    }
    free(st);
}

void agg_multi_leases(dprec_agg *a) {
    if (!agg_store_shared(a)) return;
    int seconds = a->cfg.lease_seconds > 1 ? a->cfg.lease_seconds : 10;
    int64_t t0 = mono_ms(), *held = NULL;
    size_t n = 0;
    a->lease_try_ms = t0;
    /* a failed renewal keeps the local deadlines: each runs out on its own, before the lease does in the state */
    if (agg_store_leases_renew(a, a->instance_id, seconds, &held, &n) != 0) return;
    /* held for `seconds` from before the statement, less a margin for this clock against the server's */
    int64_t until = t0 + (int64_t)seconds * 750;
    for (size_t i = 0; i < a->njobs; i++) {
        agg_slot *s = a->jobs[i];
        int mine = 0;
        for (size_t k = 0; k < n && !mine; k++) mine = held[k] == s->job.id;
        if (mine && s->lease_until_ms == 0) {
            cJSON *f = cJSON_CreateObject();
            if (f != NULL) {
                cJSON_AddNumberToObject(f, "job", (double)s->job.id);
                cJSON_AddStringToObject(f, "instance", a->instance_id);
            }
            agg_log(a, "info", "lease_taken", f);
        } else if (!mine && s->lease_until_ms != 0 && !s->job.done) {
            cJSON *f = cJSON_CreateObject();
            if (f != NULL) {
                cJSON_AddNumberToObject(f, "job", (double)s->job.id);
                cJSON_AddStringToObject(f, "instance", a->instance_id);
            }
            agg_log(a, "warn", "lease_lost", f);
        }
        s->lease_until_ms = mine ? until : 0;
    }
    free(held);
}

void agg_multi_release(dprec_agg *a) {
    int64_t *held = NULL;
    size_t n = 0;
    /* renewed to expire now: the next instance to tick takes them at once (this one finalizes nothing more) */
    if (agg_store_shared(a) && agg_store_leases_renew(a, a->instance_id, 0, &held, &n) == 0) free(held);
}

int agg_multi_may_finalize(dprec_agg *a, agg_slot *s) {
    if (!agg_store_shared(a)) return 1;
    int64_t now = mono_ms();
    if (s->lease_until_ms > now) return 1;
    if (now - a->lease_try_ms < 500) return 0;
    agg_multi_leases(a);
    return s->lease_until_ms > mono_ms();
}

void agg_multi_test_pause(dprec_agg *a, int64_t job, int64_t round) {
    const char *v = getenv("DPREC_TEST_FINALIZE_PAUSE_MS");
    if (v == NULL || v[0] == '\0') return;
    char *end;
    long ms = strtol(v, &end, 10);
    cJSON *f = cJSON_CreateObject();
    if (f != NULL) {
        cJSON_AddNumberToObject(f, "job", (double)job);
        cJSON_AddNumberToObject(f, "round", (double)round);
        cJSON_AddStringToObject(f, "instance", a->instance_id);
    }
    if (*end != '\0' || ms < 1 || ms > 600000) { /* said, not guessed at: the knob is for tests only */
        if (f != NULL) cJSON_AddStringToObject(f, "ignored", "DPREC_TEST_FINALIZE_PAUSE_MS is not 1..600000");
        agg_log(a, "warn", "test_finalize_pause", f);
        return;
    }
    if (f != NULL) cJSON_AddNumberToObject(f, "ms", (double)ms);
    agg_log(a, "warn", "test_finalize_pause", f);
    struct timespec ts = {(time_t)(ms / 1000), (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}
