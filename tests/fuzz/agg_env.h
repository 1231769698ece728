/* The aggregator the fuzz targets fuzz_agg_report.c and fuzz_agg_job.c talk to, and the seeds fuzz_seeds.c
 * writes for them: one dprec_agg in a temporary directory (state without fsync, a fixed seed), opened once per
 * process, with one job per protocol (AGG_JOB_SPECS, created in this order: job ids 1, 2, ...) and one
 * registered device. Requests go through dprec_agg_handle, the path the HTTPS server and the in-process fleet
 * take, so the fuzzers reach the real routing, envelope and payload checks. */
#ifndef DPREC_FUZZ_AGG_ENV_H
#define DPREC_FUZZ_AGG_ENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "agg.h"

#define AGG_ADMIN_TOKEN "fuzz-admin-token-0123456789"
#define AGG_ADMIN "Bearer " AGG_ADMIN_TOKEN

static const char *const AGG_JOB_SPECS[] = {
    "{\"protocol\":\"plain\",\"d\":3,\"m\":8,\"rating_min\":1,\"rating_max\":5,\"rounds\":50,\"min_reports\":1000,"
    "\"round_seconds\":600}",
    "{\"protocol\":\"ldp-gd\",\"d\":2,\"m\":4,\"rating_min\":1,\"rating_max\":5,\"rounds\":5,\"min_reports\":1000,"
    "\"round_seconds\":600,\"params\":{\"k\":5,\"lr\":100,\"lr_schedule\":\"constant\",\"user_bias\":false},"
    "\"budget\":{\"epsilon\":10,\"delta\":0}}",
    "{\"protocol\":\"ldp-rr\",\"d\":2,\"m\":6,\"rating_min\":1,\"rating_max\":5,\"rounds\":5,\"min_reports\":1000,"
    "\"round_seconds\":600,\"params\":{\"k\":5},\"budget\":{\"epsilon\":10,\"delta\":0}}",
    "{\"protocol\":\"gauss-gd\",\"d\":2,\"m\":5,\"rating_min\":1,\"rating_max\":5,\"rounds\":3,\"min_reports\":1000,"
    "\"round_seconds\":600,\"params\":{\"noise_multiplier\":2,\"max_ratings\":2},\"budget\":{\"epsilon\":50,\"delta\":1e-5}}",
};
#define AGG_JOBS (sizeof AGG_JOB_SPECS / sizeof AGG_JOB_SPECS[0])

typedef struct agg_env {
    char dir[96];
    dprec_agg *a;
    int job_ok[AGG_JOBS];
    char device_auth[80]; /* "Bearer <token>" */
} agg_env;

static int agg_env_call(agg_env *e, dprec_listener l, const char *method, const char *path, const char *auth,
                        const void *body, size_t len, dprec_agg_response *r) {
    dprec_agg_request q = {l, method, path, auth, body, len};
    if (dprec_agg_handle(e->a, &q, r) != 0) {
        fprintf(stderr, "dprec_agg_handle failed\n");
        abort();
    }
    return r->status;
}

static void agg_env_cleanup(void);
static agg_env *agg_env_get(void) {
    static agg_env e;
    static int ready;
    if (ready) return &e;
    const char *tmp = getenv("TMPDIR");
    int n = snprintf(e.dir, sizeof e.dir, "%s/dprec-fuzz-agg-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (n < 0 || (size_t)n >= sizeof e.dir || mkdtemp(e.dir) == NULL) abort();
    char db[sizeof e.dir + 16], key[sizeof e.dir + 16], err[256] = "";
    snprintf(db, sizeof db, "%s/state.db", e.dir);
    snprintf(key, sizeof key, "%s/key.pem", e.dir);
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = db;
    cfg.signing_key_path = key;
    cfg.admin_token = AGG_ADMIN_TOKEN;
    cfg.seed = 42;
    cfg.sync_full = 0;
    if (dprec_agg_open(&cfg, &e.a, err, sizeof err) != 0) {
        fprintf(stderr, "cannot open the aggregator: %s\n", err);
        abort();
    }
    for (size_t i = 0; i < AGG_JOBS; i++) {
        dprec_agg_response r;
        e.job_ok[i] = agg_env_call(&e, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", AGG_ADMIN, AGG_JOB_SPECS[i],
                                   strlen(AGG_JOB_SPECS[i]), &r) == 201;
        if (!e.job_ok[i]) fprintf(stderr, "fuzz: job %zu not created: %.*s\n", i + 1, (int)r.body_len, r.body);
        dprec_agg_response_free(&r);
    }
    dprec_agg_response r;
    if (agg_env_call(&e, DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, "{}", 2, &r) != 201) abort();
    cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
    const cJSON *tok = o ? cJSON_GetObjectItemCaseSensitive(o, "token") : NULL;
    if (!cJSON_IsString(tok)) abort();
    snprintf(e.device_auth, sizeof e.device_auth, "Bearer %s", tok->valuestring);
    cJSON_Delete(o);
    dprec_agg_response_free(&r);
    ready = 1;
    atexit(agg_env_cleanup);
    return &e;
}

static void agg_env_cleanup(void) {
    agg_env *e = agg_env_get();
    dprec_agg_close(e->a);
    char path[sizeof e->dir + 32];
    static const char *const files[] = {"state.db", "state.db-wal", "state.db-shm", "key.pem"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        int n = snprintf(path, sizeof path, "%s/%s", e->dir, files[i]);
        if (n > 0 && (size_t)n < sizeof path) unlink(path);
    }
    rmdir(e->dir);
}

#endif
