/* dprec relay — the core (relay.h): state, routes, the round's sums. docs/protocol.md "The relay" is the contract.
 *
 * What it holds: its own device registrations (SHA-256 of each token), the jobs an operator created on it (their
 * shape: mode, m, the numbers per item, K, the most shares a round takes, rounds), and per open round the public seed
 * it drew for it (the devices' H, never served to anyone but a registered device) and the running sums mod 2^64 of
 * the shares it accepted, with the report id of each. What it never holds: a gradient in the clear (every number is
 * masked by a key the device drew and gave the recommender only), or anything of the recommender's.
 *
 * This file opens and closes the core and keeps what its other files read (relay_priv.h has the map): the jobs and
 * the device tokens in memory, the log, the CSPRNG, the signing key's public half and the metrics. The routes are
 * relay_routes.c's, the writer and the SQLite state relay_state.c's, what an operation does to a round
 * relay_round.c's. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <mbedtls/pk.h>
#include <sqlite3.h>

#include "base/agg_base.h"
#include "rounds/agg_sign.h"
#include "bytes.h"
#include "dpmf.h"
#include "dprec/status.h"
#include "mbedtls_compat.h"
#include "relay.h"
#include "relay_priv.h"

/* ---- the state in memory ------------------------------------------------------------------------------------- */

void relay_log(dprec_relay *r, const char *level, const char *event, int64_t job, int64_t round, cJSON *fields,
               const char *msg) {
    if (r->cfg.log == NULL) {
        cJSON_Delete(fields);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    char ts[40];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof ts - n, ".%03ldZ", now.tv_nsec / 1000000L);
    cJSON_AddStringToObject(o, "ts", ts);
    cJSON_AddStringToObject(o, "level", level);
    cJSON_AddStringToObject(o, "event", event);
    if (job > 0) cJSON_AddNumberToObject(o, "job", (double)job);
    if (round > 0) cJSON_AddNumberToObject(o, "round", (double)round);
    while (fields != NULL && fields->child != NULL) {
        cJSON *f = cJSON_DetachItemViaPointer(fields, fields->child);
        cJSON_AddItemToObject(o, f->string, f); /* the schema's fields first, then the event's */
    }
    cJSON_Delete(fields);
    if (msg != NULL) cJSON_AddStringToObject(o, "message", msg);
    char *line = cJSON_PrintUnformatted(o);
    if (line != NULL) r->cfg.log(r->cfg.log_user, line);
    free(line);
    cJSON_Delete(o);
}

int relay_random(void *ctx, unsigned char *out, size_t len) {
    dprec_relay *r = ctx;
    pthread_mutex_lock(&r->rng_mu);
    int rc = dprec_rng_bytes(&r->rng, out, len);
    pthread_mutex_unlock(&r->rng_mu);
    return rc == DPREC_OK ? 0 : -1;
}

rjob *relay_job_find(dprec_relay *r, int64_t id) {
    for (size_t i = 0; i < r->njobs; i++)
        if (r->jobs[i]->id == id) return r->jobs[i];
    return NULL;
}

static void job_free(rjob *j) {
    if (j == NULL) return;
    free(j->grad);
    free(j->noise);
    dprec_wipe(j->seed, sizeof j->seed);
    dprec_wipe(j->alpha_seed, sizeof j->alpha_seed);
    free(j);
}

/* ---- device tokens (SHA-256) in memory: open addressing ------------------------------------------------------ */

static size_t tok_index(const unsigned char h[32], size_t cap) {
    uint64_t x = dprec_ld64(h);
    return (size_t)(x % cap);
}

int relay_tok_put(dprec_relay *r, const unsigned char h[32], int64_t id) {
    if ((r->tok_n + 1) * 2 > r->tok_cap) {
        size_t ncap = r->tok_cap ? r->tok_cap * 2 : 1024;
        tok_slot *nt = calloc(ncap, sizeof *nt);
        if (nt == NULL) return -1;
        for (size_t i = 0; i < r->tok_cap; i++)
            if (r->tok[i].id != 0) {
                size_t k = tok_index(r->tok[i].h, ncap);
                while (nt[k].id != 0) k = (k + 1) % ncap;
                nt[k] = r->tok[i];
            }
        free(r->tok);
        r->tok = nt;
        r->tok_cap = ncap;
    }
    size_t k = tok_index(h, r->tok_cap);
    while (r->tok[k].id != 0) k = (k + 1) % r->tok_cap;
    memcpy(r->tok[k].h, h, 32);
    r->tok[k].id = id;
    r->tok_n++;
    return 0;
}

int64_t relay_tok_get(dprec_relay *r, const unsigned char h[32]) {
    if (r->tok_cap == 0) return 0;
    size_t k = tok_index(h, r->tok_cap);
    while (r->tok[k].id != 0) {
        if (memcmp(r->tok[k].h, h, 32) == 0) return r->tok[k].id;
        k = (k + 1) % r->tok_cap;
    }
    return 0;
}

/* ---- open / close --------------------------------------------------------------------------------------- */

void dprec_relay_config_default(dprec_relay_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->max_json_body = 4096;
    cfg->max_share_body = (size_t)32 << 20;
    cfg->sync_full = 1;
}

int dprec_relay_open(const dprec_relay_config *cfg, dprec_relay **out, char *err, size_t errcap) {
    *out = NULL;
    if (cfg == NULL || cfg->state_path == NULL || cfg->signing_key_path == NULL || cfg->admin_token == NULL ||
        strlen(cfg->admin_token) < 16) {
        snprintf(err, errcap, "state_path, signing_key_path and an admin_token of at least 16 characters are required");
        return -1;
    }
    dprec_relay *r = calloc(1, sizeof *r);
    if (r == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    r->cfg = *cfg;
    if (r->cfg.max_json_body == 0) r->cfg.max_json_body = 4096;
    if (r->cfg.max_share_body == 0) r->cfg.max_share_body = (size_t)32 << 20;
    r->admin_token = strdup(cfg->admin_token);
    r->cfg.admin_token = r->admin_token;
    r->enroll.token = cfg->registration_token != 0;
    if (r->enroll.token) { /* the caller's key and app id are not kept: copies */
        r->enroll.key = cfg->enrollment_key != NULL ? malloc(cfg->enrollment_key_len) : NULL;
        if (r->enroll.key != NULL) memcpy((unsigned char *)r->enroll.key, cfg->enrollment_key, cfg->enrollment_key_len);
        r->enroll.key_len = r->enroll.key != NULL ? cfg->enrollment_key_len : 0;
        r->enroll.app_id = cfg->app_id != NULL ? strdup(cfg->app_id) : NULL;
    }
    r->cfg.enrollment_key = NULL;
    r->cfg.app_id = NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->q_mu, NULL);
    pthread_cond_init(&r->q_cv, NULL);
    pthread_mutex_init(&r->rng_mu, NULL);
    pthread_mutex_init(&r->sign_mu, NULL);
    mbedtls_pk_init(&r->key);
    int rc;
    if (cfg->seed != 0) {
        unsigned char seed[8];
        for (int i = 0; i < 8; i++) seed[i] = (unsigned char)(cfg->seed >> (8 * i));
        rc = dprec_rng_init(&r->rng, NULL, seed, sizeof seed, "relay");
    } else {
        rc = dprec_rng_init(&r->rng, &agg_os_port, NULL, 0, "relay");
    }
    if (r->admin_token == NULL || rc != DPREC_OK) {
        snprintf(err, errcap, "could not seed the CSPRNG");
        dprec_relay_close(r);
        return -1;
    }
    if (agg_enroll_policy_check(&r->enroll, err, errcap) != 0) {
        dprec_relay_close(r);
        return -1;
    }
    if (agg_signing_key_load_or_create(cfg->signing_key_path, &r->key, r->pub_der, sizeof r->pub_der, &r->pub_der_len,
                                       relay_random, r, err, errcap) != 0) {
        dprec_relay_close(r);
        return -1;
    }
    char sync_sql[64];
    snprintf(sync_sql, sizeof sync_sql, "PRAGMA synchronous=%s", cfg->sync_full ? "FULL" : "NORMAL");
    if (sqlite3_open_v2(cfg->state_path, &r->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) !=
            SQLITE_OK ||
        relay_exec_sql(r->db, "PRAGMA journal_mode=WAL") != 0 || relay_exec_sql(r->db, sync_sql) != 0 ||
        relay_exec_sql(r->db, "PRAGMA busy_timeout=5000") != 0 || relay_exec_sql(r->db, relay_schema) != 0) {
        snprintf(err, errcap, "cannot open the relay's state %s: %s", cfg->state_path,
                 r->db != NULL ? sqlite3_errmsg(r->db) : "out of memory");
        dprec_relay_close(r);
        return -1;
    }
    if (relay_load_state(r, err, errcap) != 0) {
        dprec_relay_close(r);
        return -1;
    }
    if (pthread_create(&r->writer, NULL, relay_writer_main, r) != 0) {
        snprintf(err, errcap, "cannot start the writer thread");
        dprec_relay_close(r);
        return -1;
    }
    r->writer_running = 1;
    r->cfg.state_path = r->cfg.signing_key_path = NULL;
    *out = r;
    return 0;
}

void dprec_relay_close(dprec_relay *r) {
    if (r == NULL) return;
    if (r->writer_running) {
        pthread_mutex_lock(&r->q_mu);
        r->stopping = 1;
        pthread_cond_broadcast(&r->q_cv);
        pthread_mutex_unlock(&r->q_mu);
        pthread_join(r->writer, NULL);
    }
    if (r->db != NULL) sqlite3_close(r->db);
    for (size_t i = 0; i < r->njobs; i++) job_free(r->jobs[i]);
    free(r->jobs);
    free(r->tok);
    mbedtls_pk_free(&r->key);
    dprec_rng_free(&r->rng);
    if (r->admin_token != NULL) {
        dprec_wipe(r->admin_token, strlen(r->admin_token));
        free(r->admin_token);
    }
    free((unsigned char *)r->enroll.key);
    free((char *)r->enroll.app_id);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->q_mu);
    pthread_cond_destroy(&r->q_cv);
    pthread_mutex_destroy(&r->rng_mu);
    pthread_mutex_destroy(&r->sign_mu);
    free(r);
}

size_t dprec_relay_public_key(dprec_relay *r, unsigned char *out, size_t cap) {
    if (r == NULL || out == NULL || cap < r->pub_der_len) return 0;
    memcpy(out, r->pub_der, r->pub_der_len);
    return r->pub_der_len;
}

const char *const relay_refusal_names[8] = {"bad_report", "unauthorized", "round_closed", "already_reported",
                                             "cohort_full", "not_found", "too_large", "other"};

char *dprec_relay_metrics(dprec_relay *r) {
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (f == NULL) return NULL;
    pthread_mutex_lock(&r->mu);
    relay_metrics m = r->met;
    fprintf(f, "# HELP dprec_relay_shares_accepted_total Shares summed (durable before their 200).\n"
               "# TYPE dprec_relay_shares_accepted_total counter\ndprec_relay_shares_accepted_total %llu\n",
            (unsigned long long)m.shares_accepted);
    fprintf(f, "# HELP dprec_relay_shares_duplicate_total Retries of a stored share, answered 200 duplicate.\n"
               "# TYPE dprec_relay_shares_duplicate_total counter\ndprec_relay_shares_duplicate_total %llu\n",
            (unsigned long long)m.shares_duplicate);
    fprintf(f, "# HELP dprec_relay_refused_total Requests refused, by the error code of the answer.\n"
               "# TYPE dprec_relay_refused_total counter\n");
    for (int i = 0; i < 8; i++)
        fprintf(f, "dprec_relay_refused_total{reason=\"%s\"} %llu\n", relay_refusal_names[i],
                (unsigned long long)m.refused[i]);
    fprintf(f, "# HELP dprec_relay_registrations_total Devices registered with the relay.\n"
               "# TYPE dprec_relay_registrations_total counter\ndprec_relay_registrations_total %llu\n",
            (unsigned long long)m.registrations);
    fprintf(f, "# HELP dprec_relay_rounds_closed_total Rounds closed with a signed sum.\n"
               "# TYPE dprec_relay_rounds_closed_total counter\ndprec_relay_rounds_closed_total %llu\n",
            (unsigned long long)m.rounds_closed);
    fprintf(f, "# HELP dprec_relay_commits_total Transactions of the writer (each a batch of operations).\n"
               "# TYPE dprec_relay_commits_total counter\ndprec_relay_commits_total %llu\n",
            (unsigned long long)m.commits);
    fprintf(f, "# HELP dprec_relay_job_round The open round of each job.\n# TYPE dprec_relay_job_round gauge\n"
               "# HELP dprec_relay_job_shares_in_round Shares summed in each job's open round.\n"
               "# TYPE dprec_relay_job_shares_in_round gauge\n");
    for (size_t i = 0; i < r->njobs; i++) {
        const rjob *j = r->jobs[i];
        if (j->round > j->rounds) continue; /* a finished job's series are retired */
        fprintf(f, "dprec_relay_job_round{job=\"%lld\"} %lld\n", (long long)j->id, (long long)j->round);
        fprintf(f, "dprec_relay_job_shares_in_round{job=\"%lld\"} %u\n", (long long)j->id, j->n_grad);
    }
    pthread_mutex_unlock(&r->mu);
    fclose(f);
    return out;
}
