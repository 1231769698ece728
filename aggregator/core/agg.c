/* dprec aggregator core — the assembly: the core's lifetime (open: the CSPRNG, the signing key, then the round
 * engine and its store; close in reverse), the signer for `dprec-aggregator train`, the public key, and /metrics.
 *
 * The top layer with the request layer (docs/architecture.md): it calls every layer below and none calls it.
 * Host code (a server), so it may use libc, pthreads and the heap. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_core.h"
#include "dprec/status.h"
#include "rounds/agg_rounds.h"
#include "rounds/agg_sign.h"

void dprec_agg_config_default(dprec_agg_config *cfg) {
    if (cfg == NULL) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->max_json_body = 4096;
    cfg->max_report_body = (size_t)16 << 20;
    cfg->sync_full = 1;
    cfg->group_commit_us = 2000;
    cfg->lease_seconds = 10;
}

static void set_err(char *err, size_t errcap, const char *msg) {
    if (err != NULL && errcap > 0) snprintf(err, errcap, "%s", msg);
}

int dprec_agg_open(const dprec_agg_config *cfg, dprec_agg **out, char *err, size_t errcap) {
    if (out != NULL) *out = NULL;
    if (cfg == NULL || out == NULL || cfg->state_path == NULL || cfg->signing_key_path == NULL) {
        set_err(err, errcap, "state_path and signing_key_path are required");
        return -1;
    }
    if (cfg->admin_token == NULL || strlen(cfg->admin_token) < 16) {
        set_err(err, errcap, "admin_token is required (at least 16 characters)");
        return -1;
    }
    dprec_agg *a = calloc(1, sizeof *a);
    if (a == NULL) {
        set_err(err, errcap, "out of memory");
        return -1;
    }
    a->cfg = *cfg;
    if (a->cfg.max_json_body == 0) a->cfg.max_json_body = 4096;
    if (a->cfg.max_report_body == 0) a->cfg.max_report_body = (size_t)16 << 20;
    a->admin_token = strdup(cfg->admin_token);
    a->cfg.admin_token = a->admin_token;
    a->enroll.token = cfg->registration_token != 0;
    if (a->enroll.token) { /* the caller's key and app id are not kept: copies */
        a->enroll.key = cfg->enrollment_key != NULL ? malloc(cfg->enrollment_key_len) : NULL;
        if (a->enroll.key != NULL) memcpy((unsigned char *)a->enroll.key, cfg->enrollment_key, cfg->enrollment_key_len);
        a->enroll.key_len = a->enroll.key != NULL ? cfg->enrollment_key_len : 0;
        a->enroll.app_id = cfg->app_id != NULL ? strdup(cfg->app_id) : NULL;
    }
    a->cfg.enrollment_key = NULL;
    a->cfg.app_id = NULL;
    pthread_mutex_init(&a->rng_mu, NULL);
    pthread_mutex_init(&a->sign_mu, NULL);
    pthread_mutex_init(&a->m_mu, NULL);
    mbedtls_pk_init(&a->key);

    int rc;
    if (cfg->seed != 0) {
        unsigned char seed[8];
        for (int i = 0; i < 8; i++) seed[i] = (unsigned char)(cfg->seed >> (8 * i));
        rc = dprec_rng_init(&a->rng, NULL, seed, sizeof seed, "agg");
    } else {
        rc = dprec_rng_init(&a->rng, &agg_os_port, NULL, 0, "agg");
    }
    if (a->admin_token == NULL || rc != DPREC_OK) {
        set_err(err, errcap, rc != DPREC_OK ? "could not seed the CSPRNG" : "out of memory");
        dprec_agg_close(a);
        return -1;
    }
    if (agg_enroll_policy_check(&a->enroll, err, errcap) != 0 || agg_key_load_or_create(a, err, errcap) != 0 ||
        agg_state_open(a, err, errcap) != 0) {
        dprec_agg_close(a);
        return -1;
    }
    if (agg_builder_start(a) != 0) {
        set_err(err, errcap, "could not start the release builder's thread");
        dprec_agg_close(a);
        return -1;
    }
    a->cfg.state_path = NULL; /* the paths are only needed while opening; the caller's strings are not kept */
    a->cfg.signing_key_path = NULL;
    *out = a;
    return 0;
}

/* A signer without state, for `dprec-aggregator train` (agg_core.h). */
int agg_signer_open(const char *key_path, dprec_agg **out, char *err, size_t errcap) {
    *out = NULL;
    dprec_agg *a = calloc(1, sizeof *a);
    if (a == NULL) {
        set_err(err, errcap, "out of memory");
        return -1;
    }
    pthread_mutex_init(&a->rng_mu, NULL);
    pthread_mutex_init(&a->sign_mu, NULL);
    mbedtls_pk_init(&a->key);
    a->cfg.signing_key_path = key_path;
    int rc = dprec_rng_init(&a->rng, &agg_os_port, NULL, 0, "agg train");
    if (rc != DPREC_OK) set_err(err, errcap, "could not seed the CSPRNG");
    if (rc != DPREC_OK || (key_path != NULL && agg_key_load_or_create(a, err, errcap) != 0)) {
        agg_signer_close(a);
        return -1;
    }
    a->cfg.signing_key_path = NULL;
    *out = a;
    return 0;
}

void agg_signer_close(dprec_agg *a) {
    if (a == NULL) return;
    mbedtls_pk_free(&a->key);
    dprec_rng_free(&a->rng);
    pthread_mutex_destroy(&a->rng_mu);
    pthread_mutex_destroy(&a->sign_mu);
    free(a);
}

void dprec_agg_close(dprec_agg *a) {
    if (a == NULL) return;
    agg_builder_stop(a); /* what it still builds goes to the writer, which stops next */
    agg_state_close(a);
    mbedtls_pk_free(&a->key);
    dprec_rng_free(&a->rng);
    pthread_mutex_destroy(&a->rng_mu);
    pthread_mutex_destroy(&a->sign_mu);
    pthread_mutex_destroy(&a->m_mu);
    if (a->admin_token != NULL) {
        dprec_wipe(a->admin_token, strlen(a->admin_token));
        free(a->admin_token);
    }
    free((unsigned char *)a->enroll.key);
    free((char *)a->enroll.app_id);
    free(a);
}

size_t dprec_agg_public_key(dprec_agg *a, unsigned char *out, size_t cap) {
    if (a == NULL || out == NULL || cap < a->pub_der_len) return 0;
    memcpy(out, a->pub_der, a->pub_der_len);
    return a->pub_der_len;
}

/* ---- metrics -------------------------------------------------------------------------------------- */

static const char *const reason_names[] = {"bad_report", "bad_field", "unauthorized", "round_closed",
                                           "already_reported", "job_done", "too_large", "not_found",
                                           "internal", "enrollment_required", "enrollment_refused",
                                           "enrollment_used", "other"};
enum { N_REASONS = sizeof reason_names / sizeof reason_names[0] };

void agg_count_reject(dprec_agg *a, const char *code) {
    size_t i;
    for (i = 0; i + 1 < N_REASONS; i++)
        if (strcmp(reason_names[i], code) == 0) break;
    pthread_mutex_lock(&a->m_mu);
    a->metrics.rejected[i]++;
    pthread_mutex_unlock(&a->m_mu);
}

typedef struct strbuf {
    char *p;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_printf(strbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *s, const char *fmt, ...) {
    if (s->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->p + s->len, s->cap - s->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->failed = 1;
            return;
        }
        if ((size_t)n < s->cap - s->len) {
            s->len += (size_t)n;
            return;
        }
        size_t ncap = s->cap * 2 + (size_t)n;
        char *np = realloc(s->p, ncap);
        if (np == NULL) {
            s->failed = 1;
            return;
        }
        s->p = np;
        s->cap = ncap;
    }
}

/* route and status labels of the request counters (agg_requests.c indexes them); the last status slot is "other" */
const char *const agg_route_names[8] = {"register", "job", "release", "reports", "admin", "healthz", "metrics",
                                        "other"};
const int agg_status_codes[AGG_STATUS_SLOTS - 1] = {200, 201, 400, 401, 403, 404, 405, 409,
                                                    413, 414, 429, 431, 500, 503, 0};
const double agg_hist_bounds[AGG_HIST_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                  0.05,   0.1,   0.25,   0.5,   1.0,  2.5};

int agg_status_slot(int status) {
    for (int c = 0; c < AGG_STATUS_SLOTS - 1 && agg_status_codes[c] != 0; c++)
        if (agg_status_codes[c] == status) return c;
    return AGG_STATUS_SLOTS - 1;
}

char *dprec_agg_metrics(dprec_agg *a) {
    if (a == NULL) return NULL;
    strbuf s = {malloc(4096), 0, 4096, 0};
    if (s.p == NULL) return NULL;
    s.p[0] = '\0';
    agg_metrics m;
    pthread_mutex_lock(&a->m_mu);
    m = a->metrics;
    pthread_mutex_unlock(&a->m_mu);

    sb_printf(&s, "# HELP dprec_requests_total Requests the core answered, by route and HTTP status (\"other\": a "
                  "status not listed in docs/operations.md).\n# TYPE dprec_requests_total counter\n");
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < AGG_STATUS_SLOTS; c++) {
            if (m.requests[r][c] == 0) continue;
            char code[8];
            if (c < AGG_STATUS_SLOTS - 1 && agg_status_codes[c] != 0) snprintf(code, sizeof code, "%d", agg_status_codes[c]);
            else snprintf(code, sizeof code, "other");
            sb_printf(&s, "dprec_requests_total{route=\"%s\",status=\"%s\"} %llu\n", agg_route_names[r], code,
                      (unsigned long long)m.requests[r][c]);
        }
    sb_printf(&s, "# HELP dprec_reports_accepted_total Reports stored (durable before their 200).\n"
                  "# TYPE dprec_reports_accepted_total counter\ndprec_reports_accepted_total %llu\n",
              (unsigned long long)m.reports_accepted);
    sb_printf(&s, "# HELP dprec_reports_duplicate_total Retries of a stored report, answered 200 duplicate.\n"
                  "# TYPE dprec_reports_duplicate_total counter\ndprec_reports_duplicate_total %llu\n",
              (unsigned long long)m.reports_duplicate);
    sb_printf(&s, "# HELP dprec_reports_rejected_total Reports refused, by the error code of the answer.\n"
                  "# TYPE dprec_reports_rejected_total counter\n");
    for (size_t i = 0; i < N_REASONS; i++)
        sb_printf(&s, "dprec_reports_rejected_total{reason=\"%s\"} %llu\n", reason_names[i],
                  (unsigned long long)m.rejected[i]);
    sb_printf(&s, "# HELP dprec_rounds_finalized_total Rounds closed with a signed release.\n"
                  "# TYPE dprec_rounds_finalized_total counter\ndprec_rounds_finalized_total %llu\n",
              (unsigned long long)m.rounds_finalized);
    sb_printf(&s, "# HELP dprec_rounds_finalized_unchanged_total Rounds finalized without their global step, release r+1 "
                  "carrying release r's model (counted in dprec_rounds_finalized_total too), by reason: no_reports "
                  "(a local or non-private round with no report at its deadline; a central or joint round always runs "
                  "its step), secure_no_sum (a secure round nobody joined or that could not be unmasked).\n"
                  "# TYPE dprec_rounds_finalized_unchanged_total counter\n"
                  "dprec_rounds_finalized_unchanged_total{reason=\"no_reports\"} %llu\n"
                  "dprec_rounds_finalized_unchanged_total{reason=\"secure_no_sum\"} %llu\n",
              (unsigned long long)m.rounds_unchanged[AGG_ROUND_UNCHANGED_NO_REPORTS],
              (unsigned long long)m.rounds_unchanged[AGG_ROUND_UNCHANGED_NO_SUM]);
    sb_printf(&s, "# HELP dprec_commits_total Group commits (transactions of reports and registrations).\n"
                  "# TYPE dprec_commits_total counter\ndprec_commits_total %llu\n",
              (unsigned long long)m.commits);
    sb_printf(&s, "# HELP dprec_committed_reports_total Reports stored by the group commits.\n"
                  "# TYPE dprec_committed_reports_total counter\ndprec_committed_reports_total %llu\n",
              (unsigned long long)m.committed_reports);
    sb_printf(&s, "# HELP dprec_sum_checkpoints_total Checkpoints of folded rounds' sums (each truncates this "
                  "instance's log of the round).\n# TYPE dprec_sum_checkpoints_total counter\n"
                  "dprec_sum_checkpoints_total %llu\n",
              (unsigned long long)m.sum_checkpoints);
    sb_printf(&s, "# HELP dprec_committed_operations_total Reports and registrations handled by the group commits "
                  "(stored or refused).\n# TYPE dprec_committed_operations_total counter\n"
                  "dprec_committed_operations_total %llu\n",
              (unsigned long long)m.committed_ops);
    /* reports per group commit: one transaction and one fsync each (rounds/agg_engine.c); _sum / _count is the mean */
    sb_printf(&s, "# HELP dprec_commit_reports Reports stored by each group commit (one transaction, one fsync); a "
                  "commit of registrations, duplicates or refusals only stores 0.\n"
                  "# TYPE dprec_commit_reports histogram\n");
    uint64_t ccum = 0;
    for (int b = 0; b < AGG_COMMIT_BUCKETS; b++) {
        ccum += m.commit_hist[b];
        sb_printf(&s, "dprec_commit_reports_bucket{le=\"%llu\"} %llu\n", (unsigned long long)agg_commit_bucket_le(b),
                  (unsigned long long)ccum);
    }
    sb_printf(&s, "dprec_commit_reports_bucket{le=\"+Inf\"} %llu\ndprec_commit_reports_sum %llu\n"
                  "dprec_commit_reports_count %llu\n",
              (unsigned long long)(ccum + m.commit_hist[AGG_COMMIT_BUCKETS]), (unsigned long long)m.committed_reports,
              (unsigned long long)m.commits);
    sb_printf(&s, "# HELP dprec_request_seconds Time the core took to answer a request (a report: until durable).\n"
                  "# TYPE dprec_request_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < AGG_HIST_BUCKETS; b++) {
        cum += m.latency_hist[b];
        sb_printf(&s, "dprec_request_seconds_bucket{le=\"%g\"} %llu\n", agg_hist_bounds[b], (unsigned long long)cum);
    }
    sb_printf(&s, "dprec_request_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)m.latency_count);
    sb_printf(&s, "dprec_request_seconds_sum %.6f\ndprec_request_seconds_count %llu\n", m.latency_sum,
              (unsigned long long)m.latency_count);

    /* round progress of the running jobs only: a finished job's series are retired (no longer exported) */
    sb_printf(&s, "# HELP dprec_job_round The open round of each running job.\n# TYPE dprec_job_round gauge\n"
                  "# HELP dprec_job_reports_in_round Reports stored in each running job's open round.\n"
                  "# TYPE dprec_job_reports_in_round gauge\n");
    int64_t *ids = NULL;
    size_t n = 0;
    if (agg_job_ids(a, &ids, &n) == 0) {
        for (size_t i = 0; i < n; i++) {
            agg_job j;
            int64_t in_round = 0;
            if (agg_job_get(a, ids[i], &j, &in_round) != 1) continue;
            if (!j.done) {
                sb_printf(&s, "dprec_job_round{job=\"%lld\"} %lld\n", (long long)j.id, (long long)j.round);
                sb_printf(&s, "dprec_job_reports_in_round{job=\"%lld\"} %lld\n", (long long)j.id, (long long)in_round);
            }
            agg_job_free(&j);
        }
        free(ids);
    }
    if (s.failed) {
        free(s.p);
        return NULL;
    }
    return s.p;
}
