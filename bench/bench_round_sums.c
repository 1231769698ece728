/* dprec-bench-round-sums: the storage and the finalization time of one large folded round (docs/notes/streaming-sums.md,
 * docs/benchmarks.md "A large dpals round").
 *
 * It opens the aggregator core in process on a fresh state (a SQLite file in SCRATCH_DIR), registers N
 * devices, creates a dpals job of m items, rank d and k items a report, and sends every device's report of round 1 from
 * T threads (each report waits for its group commit: durable before it is acknowledged, as over HTTPS). Then it counts
 * the bytes of the round in the state (the checkpoints, the log, the dedup rows), closes the round (the operator's
 * close: the finalization reads every checkpoint and log row, solves and signs release 2) and times it, and counts the
 * bytes again. It prints key=value figures. Nothing here is a test: it times, and it names no machine (the
 * page that quotes it does).
 *
 * --keep-reports keeps every report's bytes (no checkpoint: the finalization folds them all), the storage and the
 * finalization of rounds before they were folded.
 *
 * usage: dprec-bench-round-sums [--reports N] [--items M] [--rank D] [--k K] [--threads T] [--keep-reports] SCRATCH_DIR */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include "agg.h"
#include "bytes.h"
#include "dpals.h"
#include "report.h"

#define ADMIN "bench-admin-token-0123456789abcdef"

typedef struct bench {
    dprec_agg *a;
    int64_t job;
    uint32_t m, d, k;
    long n, threads;
    char (*tokens)[65];
    long next;
    pthread_mutex_t mu;
    long failed;
} bench;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int call(dprec_agg *a, dprec_listener l, const char *method, const char *path, const char *auth,
                const void *body, size_t len, dprec_agg_response *r) {
    char hdr[128];
    dprec_agg_request q = {l, method, path, NULL, body, len};
    if (auth != NULL) {
        snprintf(hdr, sizeof hdr, "Bearer %s", auth);
        q.authorization = hdr;
    }
    return dprec_agg_handle(a, &q, r) == 0 ? r->status : -1;
}

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Device i's report: w in the clip's ball, k distinct items (a random stride through the catalogue), targets in
 * [-2, 2]. Not a model of real users: the sums' storage and the finalization do not depend on the values. */
static size_t make_report(const bench *b, long i, unsigned char *out) {
    dprec_envelope e;
    memset(&e, 0, sizeof e);
    e.protocol = DPREC_PROTO_DPALS;
    e.job_id = (uint64_t)b->job;
    e.round = 1;
    e.release_version = 1;
    uint64_t s = mix((uint64_t)i);
    memcpy(e.report_id, &s, 8);
    uint64_t s2 = mix(s);
    memcpy(e.report_id + 8, &s2, 8);
    size_t plen = dprec_dpals_payload_size(b->d, b->k);
    e.payload_len = (uint32_t)plen;
    dprec_envelope_write_header(out, &e);
    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    dprec_st32(p, b->d);
    dprec_st32(p + 4, b->k);
    for (uint32_t a = 0; a + 1 < b->d; a++) {
        s = mix(s);
        dprec_stf32(p + 8 + 4 * a, (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.5));
    }
    unsigned char *q = p + 8 + 4 * ((size_t)b->d - 1);
    uint32_t start = (uint32_t)(mix(s) % b->m), stride = 1 + (uint32_t)(mix(s + 1) % (b->m / b->k));
    uint32_t items[4096];
    for (uint32_t j = 0; j < b->k; j++) items[j] = (start + j * stride) % b->m;
    for (uint32_t j = 1; j < b->k; j++) /* strictly increasing, as a device sends them */
        for (uint32_t t = j; t > 0 && items[t - 1] > items[t]; t--) {
            uint32_t x = items[t];
            items[t] = items[t - 1];
            items[t - 1] = x;
        }
    for (uint32_t j = 0; j < b->k; j++) {
        s = mix(s);
        dprec_st32(q + 8 * j, items[j]);
        dprec_stf32(q + 8 * j + 4, (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * 4.0));
    }
    return DPREC_ENVELOPE_HEADER + plen;
}

static void *registrar(void *arg) {
    bench *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        long i = b->next++;
        pthread_mutex_unlock(&b->mu);
        if (i >= b->n) return NULL;
        dprec_agg_response r;
        const char *body = "{\"platform\":\"bench\"}";
        int s = call(b->a, DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, body, strlen(body), &r);
        cJSON *o = s == 201 ? cJSON_ParseWithLength((const char *)r.body, r.body_len) : NULL;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "token");
        if (cJSON_IsString(t)) snprintf(b->tokens[i], 65, "%s", t->valuestring);
        else {
            pthread_mutex_lock(&b->mu);
            b->failed++;
            pthread_mutex_unlock(&b->mu);
        }
        cJSON_Delete(o);
        dprec_agg_response_free(&r);
    }
}

static void *reporter(void *arg) {
    bench *b = arg;
    unsigned char *buf = malloc(DPREC_ENVELOPE_HEADER + dprec_dpals_payload_size(b->d, b->k));
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/reports", (long long)b->job);
    for (; buf != NULL;) {
        pthread_mutex_lock(&b->mu);
        long i = b->next++;
        pthread_mutex_unlock(&b->mu);
        if (i >= b->n) break;
        size_t len = make_report(b, i, buf);
        dprec_agg_response r;
        if (call(b->a, DPREC_LISTENER_DEVICE, "POST", path, b->tokens[i], buf, len, &r) != 200) {
            pthread_mutex_lock(&b->mu);
            if (b->failed++ == 0) fprintf(stderr, "report %ld: %d %.*s\n", i, r.status, (int)r.body_len, r.body);
            pthread_mutex_unlock(&b->mu);
        }
        dprec_agg_response_free(&r);
    }
    free(buf);
    return NULL;
}

static int run_threads(bench *b, void *(*fn)(void *)) {
    pthread_t th[256];
    b->next = 0;
    for (long t = 0; t < b->threads; t++)
        if (pthread_create(&th[t], NULL, fn, b) != 0) return -1;
    for (long t = 0; t < b->threads; t++) pthread_join(th[t], NULL);
    return b->failed == 0 ? 0 : -1;
}

/* One number from the SQLite state (the bench's own read-only connection). */
static long long q(const char *path, const char *sql) {
    sqlite3 *db;
    sqlite3_stmt *st;
    long long v = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return v;
}

static void storage(const char *path, const char *when) {
    /* dbstat: the bytes each table and index holds in the file (pages, not rows) */
    printf("%s: round_sums_bytes=%lld log_bytes=%lld log_rows=%lld dedup_rows=%lld dedup_table_bytes=%lld "
           "dedup_index_bytes=%lld report_keys_bytes=%lld file_bytes=%lld\n",
           when, q(path, "SELECT coalesce(sum(length(sum)), 0) FROM round_sums"),
           q(path, "SELECT coalesce(sum(length(bytes)), 0) FROM report_payloads"),
           q(path, "SELECT count(*) FROM report_payloads"), q(path, "SELECT count(*) FROM reports"),
           q(path, "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = 'reports'"),
           /* the rows' indexes: (job, round) (schema 4), or the unique ones of a schema-3 state */
           q(path, "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = 'reports_round'"
                   " OR name LIKE 'sqlite_autoindex_reports%'"),
           /* a finalized round's keys (SQLite schema 4: docs/notes/sqlite-open-round-keys.md) */
           q(path, "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = 'report_keys'"),
           q(path, "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"));
}

int main(int argc, char **argv) {
    bench b;
    memset(&b, 0, sizeof b);
    b.n = 100000;
    b.m = 1000;
    b.d = 16;
    b.k = 50;
    b.threads = 32;
    const char *dir = NULL;
    int keep = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dprec-bench-round-sums [--reports N] [--items M] [--rank D] [--k K] [--threads T] [--keep-reports]\n"
                   "                              SCRATCH_DIR\n"
                   "One dpals round of N reports (default 100000; m = 1000 items, d = 16, k = 50, 32 threads) through the\n"
                   "aggregator core in process, on a fresh SQLite state in SCRATCH_DIR: the round's storage before and\n"
                   "after its finalization, and the finalization's time (docs/benchmarks.md). --keep-reports: every\n"
                   "report's bytes kept (keep_report_payloads; no checkpoint), as every report was stored before folding.\n");
            return 0;
        }
        if (i + 1 < argc && !strcmp(argv[i], "--reports")) b.n = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--items")) b.m = (uint32_t)atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--rank")) b.d = (uint32_t)atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--k")) b.k = (uint32_t)atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--threads")) b.threads = atol(argv[++i]);
        else if (!strcmp(argv[i], "--keep-reports")) keep = 1;
        else if (argv[i][0] != '-' && dir == NULL) dir = argv[i];
        else {
            fprintf(stderr, "dprec-bench-round-sums: unknown argument %s (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (dir == NULL || b.n < 1 || b.m < 2 || b.d < 2 || b.d > 64 || b.k < 1 || b.k > b.m || b.k > 4096 ||
        b.threads < 1 || b.threads > 256) {
        fprintf(stderr, "dprec-bench-round-sums: bad arguments (see --help)\n");
        return 2;
    }
    char path[600], key[600];
    snprintf(path, sizeof path, "%s/state.db", dir);
    snprintf(key, sizeof key, "%s/key.pem", dir);
    mkdir(dir, 0700);
    static const char *const files[] = {"", "-wal", "-shm"}; /* a fresh state: the last run's files gone */
    for (int f = 0; f < 3; f++) {
        char old[640];
        snprintf(old, sizeof old, "%s%s", path, files[f]);
        remove(old);
    }
    b.tokens = calloc((size_t)b.n, sizeof *b.tokens);
    pthread_mutex_init(&b.mu, NULL);
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = path;
    cfg.signing_key_path = key;
    cfg.admin_token = ADMIN;
    cfg.keep_report_payloads = keep;
    char err[256] = "";
    if (b.tokens == NULL || dprec_agg_open(&cfg, &b.a, err, sizeof err) != 0) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }
    double t0 = now_s();
    if (run_threads(&b, registrar) != 0) {
        fprintf(stderr, "registrations failed\n");
        return 1;
    }
    double t1 = now_s();
    char spec[512];
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"dpals\",\"d\":%u,\"m\":%u,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,\"min_reports\":1,"
             "\"round_seconds\":86400,\"participation\":1.0,\"params\":{\"max_items\":%u},"
             "\"budget\":{\"epsilon\":8,\"delta\":1e-6}}",
             b.d, b.m, b.k);
    dprec_agg_response r;
    if (call(b.a, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", ADMIN, spec, strlen(spec), &r) != 201) {
        fprintf(stderr, "job: %d %.*s\n", r.status, (int)r.body_len, r.body);
        return 1;
    }
    cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
    b.job = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "job")->valuedouble;
    cJSON_Delete(o);
    dprec_agg_response_free(&r);
    if (run_threads(&b, reporter) != 0) {
        fprintf(stderr, "%ld reports failed\n", b.failed);
        return 1;
    }
    double t2 = now_s();
    const long long sum_bytes = 24 + 8LL * b.m * dprec_dpals_item_coords(b.d), model_bytes = 4LL * b.m * (b.d + 1);
    printf("keep_reports=%d reports=%ld m=%u d=%u k=%u threads=%ld report_bytes=%zu sum_bytes=%lld model_bytes=%lld "
           "register_s=%.1f ingest_s=%.1f ingest_per_s=%.0f\n",
           keep, b.n, b.m, b.d, b.k, b.threads, (size_t)DPREC_ENVELOPE_HEADER + dprec_dpals_payload_size(b.d, b.k), sum_bytes,
           model_bytes, t1 - t0, t2 - t1, (double)b.n / (t2 - t1));
    storage(path, "open_round");
    char close_path[80];
    snprintf(close_path, sizeof close_path, "/v1/admin/jobs/%lld/round/close", (long long)b.job);
    double t3 = now_s();
    int s = call(b.a, DPREC_LISTENER_ADMIN, "POST", close_path, ADMIN, NULL, 0, &r);
    double t4 = now_s();
    dprec_agg_response_free(&r);
    if (s != 200) {
        fprintf(stderr, "round close: %d\n", s);
        return 1;
    }
    char *metrics = dprec_agg_metrics(b.a);
    const char *ck = metrics != NULL ? strstr(metrics, "\ndprec_sum_checkpoints_total ") : NULL;
    printf("finalize_s=%.3f checkpoints=%lld\n", t4 - t3, ck != NULL ? atoll(ck + 29) : -1LL);
    free(metrics);
    storage(path, "finalized");
    dprec_agg_close(b.a);
    free(b.tokens);
    return 0;
}
