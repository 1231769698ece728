/* dprec aggregator core — a protocol's secure-aggregation option (agg_secure_spec.h): the job's params checked and
 * its noise planned, with a few recent plans kept (the planner inverts the accountant, and every request of a
 * secure job asks).
 *
 * Its own file, apart from the rounds (rounds/agg_secure.c), because the protocols call it to validate a job and to
 * publish its plan, and a protocol may not call the round engine above it (docs/architecture.md). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "agg_protocol.h"
#include "agg_secure_spec.h"
#include "dprec/status.h"
#include "secagg.h"

#define SECURE_DEFAULT_K 16u

static int u32_param(const cJSON *params, const char *name, uint32_t dflt, uint32_t lo, uint32_t hi, uint32_t *out,
                     char *err, size_t errcap) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(params, name);
    *out = dflt;
    if (it == NULL) return 0;
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < lo || it->valuedouble > hi) {
        snprintf(err, errcap, "params.%s must be an integer in %u..%u", name, lo, hi);
        return -1;
    }
    *out = (uint32_t)it->valuedouble;
    return 0;
}

int agg_secure_parse(const agg_job *job, const cJSON *params, uint32_t len, double clip, agg_secure_spec *spec,
                     char *err, size_t errcap) {
    const cJSON *agg = cJSON_GetObjectItemCaseSensitive(params, "aggregation");
    if (agg == NULL) return 0;
    if (!cJSON_IsString(agg) || (strcmp(agg->valuestring, "secure") != 0 && strcmp(agg->valuestring, "trusted") != 0)) {
        snprintf(err, errcap, "params.aggregation must be \"trusted\" or \"secure\"");
        return -1;
    }
    if (strcmp(agg->valuestring, "trusted") == 0) return 0;
    if (!job->has_budget) {
        snprintf(err, errcap, "secure aggregation needs the job's budget");
        return -1;
    }
    /* no amplification by subsampling against this adversary: the aggregator sees which devices join a round (their
     * keys), so a device's rounds are known to it and each costs the unamplified mechanism (sdk/secure.c does the same) */
    if (job->participation != 1.0) {
        snprintf(err, errcap, "secure aggregation needs participation 1: the aggregator sees which devices join a round, "
                 "so Poisson sampling gives no amplification against it");
        return -1;
    }
    if (len == 0 || len > DPREC_DDG_MAX_DIM) {
        snprintf(err, errcap, "secure aggregation takes vectors of at most 2^24 numbers; this job's are longer");
        return -1;
    }
    uint32_t n_max_default = job->min_reports > 0 && job->min_reports < UINT32_MAX ? (uint32_t)job->min_reports : 1000u;
    uint32_t n_max, n_min, k, t, bits_max;
    if (u32_param(params, "secagg_max_devices", n_max_default, DPREC_SECURE_MIN_SURVIVORS, 10000000u, &n_max, err,
                  errcap) != 0 ||
        u32_param(params, "secagg_min_survivors", (n_max + 1u) / 2u, DPREC_SECURE_MIN_SURVIVORS, n_max, &n_min, err,
                  errcap) != 0 ||
        u32_param(params, "secagg_neighbours", SECURE_DEFAULT_K, 2u, DPREC_SECAGG_MAX_NEIGHBOURS, &k, err, errcap) != 0 ||
        u32_param(params, "secagg_bits_max", DPREC_DDG_MAX_BITS, 2u, DPREC_DDG_MAX_BITS, &bits_max, err, errcap) != 0)
        return -1;
    if (k % 2 != 0) {
        snprintf(err, errcap, "params.secagg_neighbours must be even (a Harary graph)");
        return -1;
    }
    uint32_t k_eff = k < n_max - 1u ? k : (n_max - 1u) & ~1u;
    if (k_eff < 2) k_eff = 2;
    /* the default threshold is the smallest that is secure (more than half the neighbours): it tolerates the most
     * dropouts; a round aborts if a survivor keeps fewer than t revealing neighbours (docs/privacy.md) */
    if (u32_param(params, "secagg_threshold", k_eff / 2u + 1u, 1u, k, &t, err, errcap) != 0) return -1;
    /* every device must have more than 2t - 1 ... less than 2t neighbours: k_eff / 2 < t <= k_eff */
    if (2u * t <= k_eff || t > k_eff || n_min < t) {
        snprintf(err, errcap, "params.secagg_threshold must exceed half the neighbours (%u) and be at most %u and at "
                 "most secagg_min_survivors", k_eff, k_eff);
        return -1;
    }
    dprec_ddg_job dj = {job->budget_epsilon, job->budget_delta, clip, job->participation, (uint64_t)job->rounds, len,
                        n_max, n_min, bits_max};
    memset(spec, 0, sizeof *spec);
    spec->k = k_eff;
    spec->threshold = t;
    int rc = dprec_ddg_plan_make(&dj, &spec->plan);
    if (rc != DPREC_OK) {
        snprintf(err, errcap, "no secure-aggregation plan fits this job (%s): the sum of %u devices would need more "
                 "than %u bits, or the budget cannot be met", dprec_status_name(rc), n_max, bits_max);
        return -1;
    }
    return 1;
}

typedef struct spec_cache_entry {
    int64_t id, rounds, min_reports;
    uint16_t proto;
    uint32_t len;
    double clip, eps, delta, q;
    char params[512];
    int result;
    agg_secure_spec spec;
} spec_cache_entry;
static spec_cache_entry spec_cache[8];
static unsigned spec_cache_next;
static pthread_mutex_t spec_cache_mu = PTHREAD_MUTEX_INITIALIZER;

static int same_job(const spec_cache_entry *e, const agg_job *job, uint32_t len, double clip, const char *ptext) {
    return e->result >= 0 && e->id == job->id && e->proto == job->proto_id && e->rounds == job->rounds &&
           e->min_reports == job->min_reports && e->len == len && e->clip == clip && e->eps == job->budget_epsilon &&
           e->delta == job->budget_delta && e->q == job->participation && strcmp(e->params, ptext) == 0;
}

int agg_secure_spec_for(const agg_job *job, uint32_t len, double clip, agg_secure_spec *spec, char *err, size_t errcap) {
    const char *ptext = job->params != NULL ? job->params : "{}";
    int cacheable = job->id > 0 && strlen(ptext) < sizeof spec_cache[0].params;
    if (cacheable) {
        pthread_mutex_lock(&spec_cache_mu);
        for (unsigned i = 0; i < 8; i++)
            if (same_job(&spec_cache[i], job, len, clip, ptext)) {
                int r = spec_cache[i].result;
                *spec = spec_cache[i].spec;
                pthread_mutex_unlock(&spec_cache_mu);
                return r;
            }
        pthread_mutex_unlock(&spec_cache_mu);
    }
    cJSON *params = cJSON_Parse(ptext);
    if (params == NULL) {
        snprintf(err, errcap, "params are not JSON");
        return -1;
    }
    int rc = agg_secure_parse(job, params, len, clip, spec, err, errcap);
    cJSON_Delete(params);
    if (rc >= 0 && cacheable) {
        pthread_mutex_lock(&spec_cache_mu);
        spec_cache_entry *e = &spec_cache[spec_cache_next++ % 8];
        e->id = job->id;
        e->proto = job->proto_id;
        e->rounds = job->rounds;
        e->min_reports = job->min_reports;
        e->len = len;
        e->clip = clip;
        e->eps = job->budget_epsilon;
        e->delta = job->budget_delta;
        e->q = job->participation;
        strcpy(e->params, ptext);
        e->result = rc;
        e->spec = *spec;
        pthread_mutex_unlock(&spec_cache_mu);
    }
    return rc;
}

void agg_secure_publish(const agg_secure_spec *spec, cJSON *privacy) {
    cJSON *o = cJSON_AddObjectToObject(privacy, "secagg");
    if (o == NULL) return;
    const dprec_ddg_plan *p = &spec->plan;
    cJSON_AddNumberToObject(o, "neighbours", spec->k);
    cJSON_AddNumberToObject(o, "threshold", spec->threshold);
    /* the fewest colluding enrolled devices that could, with the server, recover both of a device's secrets is
     * 2t - k (its k neighbours: t shares of each kind, honest ones reveal one kind each); the plan tolerates one
     * fewer (docs/privacy.md "Secure aggregation") */
    cJSON_AddNumberToObject(o, "colluders", 2.0 * spec->threshold - spec->k - 1.0);
    cJSON_AddNumberToObject(o, "n_min", p->n_min);
    cJSON_AddNumberToObject(o, "n_max", p->n_max);
    cJSON_AddNumberToObject(o, "bits", p->bits);
    cJSON_AddNumberToObject(o, "d", p->d);
    cJSON_AddNumberToObject(o, "dim", p->dim);
    cJSON_AddNumberToObject(o, "gamma_log2", p->gamma_log2);
    cJSON_AddNumberToObject(o, "norm2_bound", (double)p->norm2_bound);
    cJSON_AddNumberToObject(o, "share_num", (double)p->share_num);
    cJSON_AddNumberToObject(o, "clip", p->clip);
}

int agg_secure_job(const agg_job *job, agg_secure_spec *spec) {
    agg_secure_spec tmp;
    return job->proto->secure_spec != NULL && job->proto->secure_spec(job, spec != NULL ? spec : &tmp) == 1;
}
