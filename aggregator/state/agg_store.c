/* dprec aggregator core — the store's seam (agg_store.h): the engine chosen at open, and every call handed to its
 * table (agg_store_engine.h), with what the engines share: the digests the store keys on, a job's fields kept in its
 * spec text, a round's list of reports, and the cache of device tokens.
 *
 * Its own file, apart from every engine, so that what the layers above call and which engine answers are read in one
 * place. Nothing here touches a database. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_store_engine.h"
#include "bytes.h"
#include "dprec/status.h"

/* The engines, in the order they are asked whether the configured state is theirs; the last takes the rest (a path). */
static const agg_store_engine *const engines[] = {
    &agg_store_engine_postgresql,
    &agg_store_engine_sqlite,
};

#define ENGINE(a) ((a)->store->engine)

/* Device tokens already resolved: every device request names its device by its token, and a token's device never
 * changes once its registration committed (a device row is deleted only by the insert that failed to store it, whose
 * token nobody holds yet), so the engine's lookup (a reader's query, about 6% of the server's CPU per report under
 * load: docs/benchmarks.md "Sustained ingest") is made once per token while it stays in the cache. Direct-mapped on
 * the token's SHA-256 (the key the state stores), a fixed 2.6 MB; only found devices are kept (a token unknown here may
 * be registered on another instance a moment later). */
#define TOKEN_CACHE_SLOTS 65536u
#define TOKEN_CACHE_LOCKS 64u
struct agg_token_cache {
    pthread_mutex_t mu[TOKEN_CACHE_LOCKS];
    struct {
        unsigned char h[32];
        int64_t device; /* 0: empty */
    } slot[TOKEN_CACHE_SLOTS];
};

int agg_store_open(dprec_agg *a, int (*job_loaded)(dprec_agg *a, agg_job *job, int64_t in_round), int64_t *last_id,
                   char *err, size_t errcap) {
    size_t n = sizeof engines / sizeof engines[0], i = 0;
    while (i + 1 < n && !engines[i]->claims(a->cfg.state_path)) i++;
    a->store = NULL;
    int rc = engines[i]->open(a, job_loaded, last_id, err, errcap);
    if (rc == 0 && (a->store->tokens = calloc(1, sizeof *a->store->tokens)) == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    for (unsigned k = 0; rc == 0 && k < TOKEN_CACHE_LOCKS; k++) pthread_mutex_init(&a->store->tokens->mu[k], NULL);
    return rc;
}

void agg_store_close(dprec_agg *a) {
    if (a->store != NULL && a->store->tokens != NULL) {
        for (unsigned k = 0; k < TOKEN_CACHE_LOCKS; k++) pthread_mutex_destroy(&a->store->tokens->mu[k]);
        free(a->store->tokens);
        a->store->tokens = NULL;
    }
    if (a->store != NULL) ENGINE(a)->close(a);
    a->store = NULL;
}

const char *agg_store_engine_name(dprec_agg *a) {
    return a->store != NULL ? ENGINE(a)->name : "none";
}

void agg_store_writer_lock(dprec_agg *a) {
    ENGINE(a)->writer_lock(a);
}

void agg_store_writer_unlock(dprec_agg *a) {
    ENGINE(a)->writer_unlock(a);
}

/* ---- reads ---------------------------------------------------------------------------------------------------- */

int agg_release_get(dprec_agg *a, int64_t job, int64_t version, unsigned char **out, size_t *len) {
    return ENGINE(a)->release_get(a, job, version, out, len);
}

static uint32_t token_slot(const unsigned char h[32]) {
    return dprec_ld32(h) % TOKEN_CACHE_SLOTS;
}

void agg_store_token_known(dprec_agg *a, const unsigned char token_hash[32], int64_t device) {
    struct agg_token_cache *c = a->store != NULL ? a->store->tokens : NULL;
    if (c == NULL || device <= 0) return;
    uint32_t k = token_slot(token_hash);
    pthread_mutex_lock(&c->mu[k % TOKEN_CACHE_LOCKS]);
    memcpy(c->slot[k].h, token_hash, 32);
    c->slot[k].device = device;
    pthread_mutex_unlock(&c->mu[k % TOKEN_CACHE_LOCKS]);
}

int64_t agg_device_by_token(dprec_agg *a, const char *token) {
    unsigned char h[32];
    if (dprec_sha256((const unsigned char *)token, strlen(token), h) != 0) return -1;
    struct agg_token_cache *c = a->store->tokens;
    int64_t device = 0;
    if (c != NULL) {
        uint32_t k = token_slot(h);
        pthread_mutex_lock(&c->mu[k % TOKEN_CACHE_LOCKS]);
        if (c->slot[k].device > 0 && memcmp(c->slot[k].h, h, sizeof h) == 0) device = c->slot[k].device;
        pthread_mutex_unlock(&c->mu[k % TOKEN_CACHE_LOCKS]);
        if (device > 0) return device;
    }
    device = ENGINE(a)->device_by_token(a, h);
    agg_store_token_known(a, h, device);
    return device;
}

int agg_store_health(dprec_agg *a) {
    return ENGINE(a)->health(a);
}

int agg_store_device_enrollment(dprec_agg *a, int64_t device, agg_enrollment *out) {
    memset(out, 0, sizeof *out);
    return ENGINE(a)->device_enrollment(a, device, out);
}

void agg_store_reports_free(agg_store_reports *l) {
    for (size_t i = 0; i < l->n; i++) free(l->bufs[i]);
    free(l->bufs);
    free(l->r);
    memset(l, 0, sizeof *l);
}

int agg_store_reports_reserve(agg_store_reports *l, size_t n) {
    agg_store_reports_free(l);
    if (n == 0) return 0;
    l->r = calloc(n, sizeof *l->r);
    l->bufs = calloc(n, sizeof *l->bufs);
    if (l->r == NULL || l->bufs == NULL) {
        agg_store_reports_free(l);
        return -1;
    }
    l->cap = n;
    return 0;
}

int agg_store_reports_add(agg_store_reports *l, int64_t device, unsigned char *bytes, size_t len) {
    if (l->n >= l->cap) {
        free(bytes);
        return -1;
    }
    l->bufs[l->n] = bytes; /* the list owns it from here, parsed or not */
    dprec_envelope e;
    if (dprec_envelope_parse(bytes, len, &e) != DPREC_OK) {
        l->n++;
        return -1;
    }
    l->r[l->n].device = device;
    l->r[l->n].payload = e.payload;
    l->r[l->n].payload_len = e.payload_len;
    l->n++;
    return 0;
}

int agg_store_round_load(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *l, char *err,
                         size_t errcap) {
    if (l != NULL) memset(l, 0, sizeof *l);
    return ENGINE(a)->round_load(a, job, round, prev, l, err, errcap);
}

void agg_store_shards_free(agg_store_shards *s) {
    for (size_t i = 0; i < s->n; i++) free(s->b[i]);
    free(s->b);
    free(s->len);
    free(s->count);
    memset(s, 0, sizeof *s);
}

int agg_store_shards_add(agg_store_shards *s, unsigned char *b, size_t len, int64_t count) {
    unsigned char **nb = realloc(s->b, (s->n + 1) * sizeof *nb);
    if (nb != NULL) s->b = nb;
    size_t *nl = realloc(s->len, (s->n + 1) * sizeof *nl);
    if (nl != NULL) s->len = nl;
    int64_t *nc = realloc(s->count, (s->n + 1) * sizeof *nc);
    if (nc != NULL) s->count = nc;
    if (nb == NULL || nl == NULL || nc == NULL) {
        free(b);
        return -1;
    }
    s->b[s->n] = b;
    s->len[s->n] = len;
    s->count[s->n] = count;
    s->n++;
    return 0;
}

int agg_store_round_load_folded(dprec_agg *a, int64_t job, int64_t round, agg_model *prev, agg_store_reports *log,
                                agg_store_shards *sh, char *err, size_t errcap) {
    memset(log, 0, sizeof *log);
    memset(sh, 0, sizeof *sh);
    return ENGINE(a)->round_load_folded(a, job, round, prev, log, sh, err, errcap);
}

int agg_store_shard_load(dprec_agg *a, int64_t job, int64_t round, agg_store_reports *log, agg_store_shards *sh) {
    memset(log, 0, sizeof *log);
    memset(sh, 0, sizeof *sh);
    return ENGINE(a)->shard_load(a, job, round, log, sh);
}

int agg_store_shard_checkpoint(dprec_agg *a, int64_t job, int64_t round, const unsigned char *sum, size_t len,
                               int64_t count) {
    return ENGINE(a)->shard_checkpoint(a, job, round, sum, len, count);
}

void agg_store_job_spec_fields(const char *spec, agg_job *out) {
    cJSON *sj = spec != NULL ? cJSON_Parse(spec) : NULL;
    const cJSON *bj = sj != NULL ? cJSON_GetObjectItemCaseSensitive(sj, "base_job") : NULL;
    if (cJSON_IsNumber(bj) && bj->valuedouble >= 1) out->base_job = (int64_t)bj->valuedouble;
    const cJSON *re = sj != NULL ? cJSON_GetObjectItemCaseSensitive(sj, "release_encoding") : NULL;
    if (cJSON_IsString(re)) (void)agg_release_encoding_parse(re->valuestring, &out->release_encoding);
    out->release_uncertainty = sj != NULL && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sj, "release_uncertainty"));
    out->base_factors = sj != NULL && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sj, "base_factors"));
    /* the population rule's record, as the request layer stored it in the spec (NULL also when out of memory: the
     * record is what the view shows, the job's d and rounds are its own columns) */
    const cJSON *ru = sj != NULL ? cJSON_GetObjectItemCaseSensitive(sj, "population_rule") : NULL;
    out->rule = cJSON_IsObject(ru) ? cJSON_PrintUnformatted(ru) : NULL;
    cJSON_Delete(sj);
}

/* ---- writes --------------------------------------------------------------------------------------------------- */

int agg_store_begin(dprec_agg *a) {
    return ENGINE(a)->begin(a);
}

int agg_store_commit(dprec_agg *a) {
    return ENGINE(a)->commit(a);
}

int agg_store_rollback(dprec_agg *a) {
    return ENGINE(a)->rollback(a);
}

void agg_store_log_error(dprec_agg *a, const char *what) {
    ENGINE(a)->log_error(a, what);
}

int agg_store_report_find(dprec_agg *a, int64_t job, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                          int64_t *device, int64_t *round, unsigned char digest[32], int *has_digest) {
    *has_digest = 0;
    return ENGINE(a)->report_find(a, job, report_id, device, round, digest, has_digest);
}

int agg_store_report_insert(dprec_agg *a, int64_t job, int64_t round, int64_t device,
                            const unsigned char report_id[DPREC_REPORT_ID_SIZE], const unsigned char *bytes,
                            size_t len, int64_t now) {
    unsigned char digest[32];
    if (dprec_sha256(bytes, len, digest) != 0) return -1;
    return ENGINE(a)->report_insert(a, job, round, device, report_id, bytes, len, digest, now);
}

int64_t agg_store_device_insert(dprec_agg *a, const unsigned char token_hash[32], const char *platform,
                                const agg_enrollment *en, int64_t now) {
    return ENGINE(a)->device_insert(a, token_hash, platform, en, now);
}

int agg_store_job_insert(dprec_agg *a, const agg_job *spec, const char *protocol, uint16_t proto_id,
                         const char *spec_json, const unsigned char *release, size_t release_len, int64_t now) {
    return ENGINE(a)->job_insert(a, spec, protocol, proto_id, spec_json, release, release_len, now);
}

int agg_store_job_set_deadline(dprec_agg *a, int64_t job, int64_t deadline) {
    return ENGINE(a)->job_set_deadline(a, job, deadline);
}

int agg_store_job_set_rounds(dprec_agg *a, int64_t job, int64_t rounds) {
    return ENGINE(a)->job_set_rounds(a, job, rounds);
}

int agg_store_round_commit(dprec_agg *a, const agg_store_round *r, char *err, size_t errcap) {
    return ENGINE(a)->round_commit(a, r, err, errcap);
}

/* ---- several instances on one state -------------------------------------------------------------------------- */

int agg_store_shared(dprec_agg *a) {
    return a->store != NULL && ENGINE(a)->jobs_state != NULL;
}

int agg_store_job_read(dprec_agg *a, int64_t id, agg_job *out, agg_store_job_state *st) {
    memset(out, 0, sizeof *out);
    return agg_store_shared(a) ? ENGINE(a)->job_read(a, id, out, st) : 0;
}

int agg_store_jobs_state(dprec_agg *a, agg_store_job_state **out, size_t *n) {
    *out = NULL;
    *n = 0;
    return agg_store_shared(a) ? ENGINE(a)->jobs_state(a, out, n) : 0;
}

int agg_store_leases_renew(dprec_agg *a, const char *holder, int seconds, int64_t **jobs, size_t *n) {
    *jobs = NULL;
    *n = 0;
    return agg_store_shared(a) ? ENGINE(a)->leases_renew(a, holder, seconds, jobs, n) : 0;
}

int agg_store_round_closing(dprec_agg *a, int64_t job, int64_t round) {
    return agg_store_shared(a) ? ENGINE(a)->round_closing(a, job, round) : 1;
}

int64_t agg_store_job_id_next(dprec_agg *a) {
    return agg_store_shared(a) ? ENGINE(a)->job_id_next(a) : 0;
}

void agg_store_secagg_entries_free(agg_store_secagg_entry *e, size_t n) {
    for (size_t i = 0; e != NULL && i < n; i++) free(e[i].body);
    free(e);
}

int agg_store_secagg_read(dprec_agg *a, int64_t job, int64_t round, int64_t after, int lock,
                          agg_store_secagg_entry **out, size_t *n) {
    *out = NULL;
    *n = 0;
    return agg_store_shared(a) && ENGINE(a)->secagg_read != NULL ? ENGINE(a)->secagg_read(a, job, round, after, lock, out, n)
                                                                 : -1;
}

int agg_store_secagg_unlock(dprec_agg *a, int64_t job, int64_t round, const agg_store_secagg_entry *e) {
    return agg_store_shared(a) && ENGINE(a)->secagg_unlock != NULL ? ENGINE(a)->secagg_unlock(a, job, round, e) : -1;
}
