/* dprec aggregator core — the job table in memory: every job as the writer last committed it, with its open round's
 * report count and the largest report it accepts, for the readers (job views, a report's cap, metrics) and the writer.
 *
 * Readers take jobs_mu and copy; the writer changes a slot under jobs_mu after the commit that changed the job, so a
 * reader never sees a change that is not durable. Loaded from the store at open (agg_jobs_load, the store's
 * callback: the stored protocol id resolved to its table here, since the store knows no protocol). Its own file: the
 * table is what the request layer reads of the engine, apart from the writer's work. */
#include <stdlib.h>
#include <string.h>

#include "agg_engine_priv.h"
#include "protocols/agg_protocol.h"
#include "state/agg_store.h"

agg_slot *agg_jobs_find(dprec_agg *a, int64_t id) {
    size_t lo = 0, hi = a->njobs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t v = a->jobs[mid]->job.id;
        if (v == id) return a->jobs[mid];
        if (v < id) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int agg_jobs_copy(const agg_job *src, agg_job *out) {
    *out = *src;
    out->params = strdup(src->params != NULL ? src->params : "{}");
    out->rule = src->rule != NULL ? strdup(src->rule) : NULL;
    if (out->params == NULL || (src->rule != NULL && out->rule == NULL)) {
        agg_job_free(out);
        return -1;
    }
    return 0;
}

static size_t report_cap_of(dprec_agg *a, const agg_job *j) {
    size_t cap = a->cfg.max_report_body;
    if (j->proto->max_payload != NULL) {
        uint64_t p = (uint64_t)j->proto->max_payload(j) + DPREC_ENVELOPE_HEADER;
        if (p < cap) cap = (size_t)p;
    }
    return cap;
}

int agg_jobs_add(dprec_agg *a, const agg_job *j, int64_t in_round) {
    agg_slot *s = calloc(1, sizeof *s);
    if (s == NULL || agg_jobs_copy(j, &s->job) != 0) {
        free(s);
        return -1;
    }
    s->in_round = in_round;
    s->report_cap = report_cap_of(a, &s->job);
    s->held_tail = &s->held;
    pthread_mutex_lock(&a->jobs_mu);
    int rc = 0;
    if (a->njobs == a->jobs_cap) {
        size_t ncap = a->jobs_cap ? a->jobs_cap * 2 : 16;
        agg_slot **nj = realloc(a->jobs, ncap * sizeof *nj);
        if (nj == NULL) rc = -1;
        else a->jobs = nj, a->jobs_cap = ncap;
    }
    if (rc == 0) {
        /* in id order (agg_jobs_find searches it): a job whose release 1 took longer to build (core/agg_build.c) is
         * stored after a later id */
        size_t at = a->njobs;
        while (at > 0 && a->jobs[at - 1]->job.id > j->id) at--;
        memmove(a->jobs + at + 1, a->jobs + at, (a->njobs - at) * sizeof *a->jobs);
        a->jobs[at] = s;
        a->njobs++;
    }
    if (j->id >= a->next_job_id) a->next_job_id = j->id + 1;
    pthread_mutex_unlock(&a->jobs_mu);
    if (rc != 0) {
        agg_job_free(&s->job);
        free(s);
    }
    return rc;
}

int agg_job_get(dprec_agg *a, int64_t id, agg_job *out, int64_t *in_round) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&a->jobs_mu);
    agg_slot *s = agg_jobs_find(a, id);
    int rc = 0;
    if (s != NULL) {
        rc = agg_jobs_copy(&s->job, out) == 0 ? 1 : -1;
        if (in_round != NULL) *in_round = s->in_round;
    }
    pthread_mutex_unlock(&a->jobs_mu);
    if (s == NULL && agg_store_shared(a)) {
        /* a job another instance created since the writer's last refresh: its row, not added here (the table is the
         * writer's to change) */
        agg_store_job_state st;
        rc = agg_store_job_read(a, id, out, &st);
        if (rc == 1 && (out->proto = agg_protocol_by_id(out->proto_id)) == NULL) {
            agg_job_free(out);
            rc = -1;
        }
        if (rc == 1 && in_round != NULL) *in_round = st.in_round;
    }
    return rc;
}

size_t agg_job_report_cap(dprec_agg *a, int64_t id) {
    pthread_mutex_lock(&a->jobs_mu);
    agg_slot *s = agg_jobs_find(a, id);
    size_t cap = s != NULL ? s->report_cap : 0;
    pthread_mutex_unlock(&a->jobs_mu);
    if (s == NULL && agg_store_shared(a)) { /* a job another instance created since the last refresh */
        agg_job j;
        if (agg_job_get(a, id, &j, NULL) == 1) {
            cap = report_cap_of(a, &j);
            agg_job_free(&j);
        }
    }
    return cap;
}

int64_t agg_job_reserve_id(dprec_agg *a) {
    int64_t id = agg_store_job_id_next(a); /* a shared state's sequence: instances never give the same id */
    if (id < 0) return -1;
    pthread_mutex_lock(&a->jobs_mu);
    if (id == 0) id = a->next_job_id++;
    else if (id >= a->next_job_id) a->next_job_id = id + 1;
    pthread_mutex_unlock(&a->jobs_mu);
    return id;
}

int agg_job_ids(dprec_agg *a, int64_t **ids, size_t *n) {
    pthread_mutex_lock(&a->jobs_mu);
    *n = a->njobs;
    *ids = malloc((a->njobs > 0 ? a->njobs : 1) * sizeof **ids);
    if (*ids != NULL)
        for (size_t i = 0; i < a->njobs; i++) (*ids)[i] = a->jobs[i]->job.id;
    pthread_mutex_unlock(&a->jobs_mu);
    if (*ids == NULL) {
        *n = 0;
        return -1;
    }
    return 0;
}


int agg_jobs_load(dprec_agg *a, agg_job *j, int64_t in_round) {
    j->proto = agg_protocol_by_id(j->proto_id);
    if (j->proto == NULL) return -1;
    return agg_jobs_add(a, j, in_round);
}
