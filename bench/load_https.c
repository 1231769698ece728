/* dprec-bench-load — HTTPS load on a running (or self-started) dprec-aggregator, loopback only.
 *
 * N threads, each with its own keep-alive libcurl transport, each repeatedly registering a fresh device and
 * posting one plain report for a job whose min_reports is larger than the run, so every report lands in the
 * same open round. A 200 means the report is durable (docs/protocol.md), so "accepted reports per second" is
 * the durable acknowledgement rate. The run stops at --reports reports or --seconds seconds, whichever first.
 *
 *   dprec-bench-load --spawn build/dprec-aggregator [--threads 16] [--reports 20000] [--seconds 30] [--baseline 1]
 *   dprec-bench-load --state-dir DIR [...]   (an aggregator already running with that state directory:
 *                                             reads ports.json, tls-cert.pem and admin-token from it)
 *
 * Host program, not SDK code. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include "dprec/transport_curl.h"
#include "report.h"

typedef struct options {
    const char *spawn;
    const char *state_dir;
    unsigned threads;
    unsigned long reports;
    unsigned seconds;
    unsigned server_threads;
    unsigned d, m;
    int preregister;
    int baseline;
    unsigned long prefill;       /* reports stored (each after its own registration) before the measured run */
    unsigned prefill_threads;    /* the client threads that store them (large batches: the prefill is not measured) */
    const char *spawn_state;     /* --spawn-state URI: the spawned server's --state (PostgreSQL) */
    const char *device_url;      /* --device-url: where the devices connect (e.g. haproxy's front) */
    const char *state_dirs[8];   /* --state-dir, once per instance */
    unsigned n_state_dirs;
    int dpals;                   /* --protocol dpals: a folded round (the writer adds each report to the round's sum) */
    const char *db_comm;         /* --db-cpu NAME: also the CPU of the processes so named (a database server's) */
    unsigned long shuffle;       /* --shuffle SEED: each thread reports for its devices in a random order (0: no) */
} options;

typedef struct shared {
    const options *opt;
    char device_url[64];
    char ca[1100];
    uint64_t job, round, release_version;
    atomic_ulong issued;   /* reports handed out to threads */
    atomic_ulong accepted; /* 200 and not duplicate */
    atomic_ulong failed;
    atomic_int stop;
    double deadline;
    pthread_barrier_t barrier; /* --preregister: registration done, reports start */
    unsigned long progress;    /* print a line to stderr every this many issued reports (0: none) */
    /* Called by run_load when the measured reports start (end 0: after the registrations of --preregister 1) and
     * when they are done (end 1): the server's CPU and commit counters are read around the reports alone. */
    void (*mark)(struct shared *sh, int end);
} shared;

typedef struct worker {
    shared *sh;
    pthread_t tid;
    uint32_t *lat_report_us, *lat_register_us;
    size_t n_report, n_register, cap;
    char (*tokens)[80]; /* --preregister: the devices this thread registered */
    size_t n_tokens;
    unsigned index;     /* the thread's number (its --shuffle permutation's seed) */
    char last_error[160];
} worker;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return -1;
    }
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

static long json_int(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (p == NULL) {
        return -1;
    }
    p += strlen(pat);
    while (*p == ' ' || *p == '"') {
        p++;
    }
    return strtol(p, NULL, 10);
}

static int json_str(const char *json, const char *key, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (p == NULL) {
        return -1;
    }
    p += strlen(pat);
    while (*p == ' ') {
        p++;
    }
    if (*p != '"') {
        return -1;
    }
    p++;
    size_t n = strcspn(p, "\"");
    if (n >= cap) {
        return -1;
    }
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

typedef struct body {
    char buf[4096];
    size_t len;
} body;

static int body_sink(void *user, const unsigned char *chunk, size_t len)
{
    body *b = user;
    size_t room = sizeof b->buf - 1 - b->len;
    size_t n = len < room ? len : room;
    memcpy(b->buf + b->len, chunk, n);
    b->len += n;
    b->buf[b->len] = '\0';
    return 0;
}

static int call(dprec_transport *t, const char *method, const char *path, const char *bearer, const char *ctype,
                const void *data, size_t len, body *b, int *status)
{
    b->len = 0;
    b->buf[0] = '\0';
    dprec_http_request req = {method, path, bearer, ctype, data, len};
    dprec_http_response resp;
    int rc = t->request(t->ctx, &req, body_sink, b, &resp);
    *status = resp.status;
    return rc;
}

/* The group commits so far, those of them that stored no report (registrations only), and the reports they stored
 * (dprec_commit_reports_count, _bucket{le="0"} and _sum of GET /metrics on the admin listener, docs/operations.md):
 * 0, or -1 when /metrics cannot be read or lacks them. */
typedef struct metrics_text {
    char buf[1 << 16];
    size_t len;
} metrics_text;

static int metrics_sink(void *user, const unsigned char *chunk, size_t len)
{
    metrics_text *m = user;
    size_t room = sizeof m->buf - 1 - m->len;
    size_t n = len < room ? len : room;
    memcpy(m->buf + m->len, chunk, n);
    m->len += n;
    m->buf[m->len] = '\0';
    return 0;
}

static int commit_counts(const char *admin_url, const char *ca, double *commits, double *empty, double *reports)
{
    dprec_transport t;
    dprec_transport_curl st;
    dprec_curl_options co = {0};
    co.ca_file = ca;
    if (dprec_transport_curl_init(&t, &st, admin_url, &co) != DPREC_OK) {
        return -1;
    }
    static metrics_text m;
    m.len = 0;
    m.buf[0] = '\0';
    dprec_http_request req = {"GET", "/metrics", NULL, NULL, NULL, 0};
    dprec_http_response resp;
    int rc = t.request(t.ctx, &req, metrics_sink, &m, &resp);
    dprec_transport_curl_cleanup(&st);
    const char *c = strstr(m.buf, "\ndprec_commit_reports_count ");
    const char *r = strstr(m.buf, "\ndprec_commit_reports_sum ");
    const char *z = strstr(m.buf, "\ndprec_commit_reports_bucket{le=\"0\"} ");
    if (rc != DPREC_OK || resp.status != 200 || c == NULL || r == NULL || z == NULL) {
        return -1;
    }
    *commits = strtod(c + strlen("\ndprec_commit_reports_count "), NULL);
    *empty = strtod(z + strlen("\ndprec_commit_reports_bucket{le=\"0\"} "), NULL);
    *reports = strtod(r + strlen("\ndprec_commit_reports_sum "), NULL);
    return 0;
}

static void fill_random(unsigned char *out, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        /* splitmix64: report ids need only be unique here, not secret */
        uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        out[i] = (unsigned char)(z ^ (z >> 31));
    }
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void put_f32(unsigned char *p, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    put_u32(p, v);
}

/* A plain report: [d][n] u (d floats) then n (item, rating) pairs, items increasing. A dpals report (docs/protocol.md
 * "dpals"): [d][k] w (d - 1 floats) then k = max_items pairs, here all real (k = n). */
static size_t build_report(const shared *sh, unsigned char *out, uint64_t *rng)
{
    unsigned d = sh->opt->d, m = sh->opt->m, n = m < 20 ? m : 20;
    unsigned char *p = out + DPREC_ENVELOPE_HEADER;
    put_u32(p, d);
    put_u32(p + 4, n);
    p += 8;
    for (unsigned k = 0; k < (sh->opt->dpals ? d - 1 : d); k++, p += 4) {
        put_f32(p, 0.05f * (float)(k % 7));
    }
    unsigned char r;
    for (unsigned j = 0; j < n; j++, p += 8) {
        fill_random(&r, 1, rng);
        put_u32(p, j * (m / n));
        put_f32(p + 4, 1.0f + (float)(r % 5));
    }
    dprec_envelope e;
    memset(&e, 0, sizeof e);
    e.protocol = sh->opt->dpals ? DPREC_PROTO_DPALS : DPREC_PROTO_PLAIN;
    e.job_id = sh->job;
    e.round = sh->round;
    fill_random(e.report_id, sizeof e.report_id, rng);
    e.release_version = sh->release_version;
    e.payload_len = (uint32_t)(p - out - DPREC_ENVELOPE_HEADER);
    dprec_envelope_write_header(out, &e);
    return (size_t)(p - out);
}

/* --shuffle: the thread's devices in a random order (Fisher-Yates, from splitmix64 seeded with the seed and the
 * thread's number: the same seed gives the same orders), so that the server does not see devices in their registration
 * order. */
static void shuffle_tokens(worker *w, unsigned long seed)
{
    uint64_t s = (uint64_t)seed ^ ((uint64_t)w->index * 0xd1b54a32d192ed03ull);
    for (size_t i = w->n_tokens; i > 1; i--) {
        unsigned char b[8];
        fill_random(b, sizeof b, &s);
        uint64_t r;
        memcpy(&r, b, sizeof r);
        size_t j = (size_t)(r % i);
        char t[80];
        memcpy(t, w->tokens[i - 1], sizeof t);
        memcpy(w->tokens[i - 1], w->tokens[j], sizeof t);
        memcpy(w->tokens[j], t, sizeof t);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    dprec_transport t;
    dprec_transport_curl st;
    dprec_curl_options co = {0};
    co.ca_file = sh->ca;
    co.timeout_ms = 30000;
    if (dprec_transport_curl_init(&t, &st, sh->device_url, &co) != DPREC_OK) {
        snprintf(w->last_error, sizeof w->last_error, "transport init failed");
        if (sh->opt->preregister) {
            pthread_barrier_wait(&sh->barrier);
            pthread_barrier_wait(&sh->barrier);
        }
        return NULL;
    }
    uint64_t rng = (uint64_t)(uintptr_t)w ^ (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    size_t cap = DPREC_ENVELOPE_HEADER + 8 + 4u * sh->opt->d + 8u * 20;
    unsigned char *report = malloc(cap);
    body b;
    char path[64], token[128];
    snprintf(path, sizeof path, "/v1/jobs/%" PRIu64 "/reports", sh->job);
    if (sh->opt->preregister) {
        /* Phase 1: this thread's share of devices; phase 2 (after the barrier): one report each. */
        while (w->n_tokens < w->cap && now_s() < sh->deadline &&
               atomic_fetch_add(&sh->issued, 1) < sh->opt->reports) {
            int status = 0;
            double t0 = now_s();
            int rc = call(&t, "POST", "/v1/register", NULL, "application/json", "{}", 2, &b, &status);
            double t1 = now_s();
            if (rc != DPREC_OK || status != 201 || json_str(b.buf, "token", w->tokens[w->n_tokens], 80) != 0) {
                atomic_fetch_add(&sh->failed, 1);
                snprintf(w->last_error, sizeof w->last_error, "register: rc %d status %d %.100s", rc, status, b.buf);
                continue;
            }
            w->n_tokens++;
            w->lat_register_us[w->n_register++] = (uint32_t)((t1 - t0) * 1e6);
        }
        if (sh->opt->shuffle != 0) {
            shuffle_tokens(w, sh->opt->shuffle);
        }
        pthread_barrier_wait(&sh->barrier);
        pthread_barrier_wait(&sh->barrier); /* while run_load reads the servers' counters */
        for (size_t i = 0; report != NULL && i < w->n_tokens && now_s() < sh->deadline; i++) {
            int status = 0;
            size_t len = build_report(sh, report, &rng);
            double t0 = now_s();
            int rc = call(&t, "POST", path, w->tokens[i], "application/octet-stream", report, len, &b, &status);
            double t1 = now_s();
            if (rc == DPREC_OK && status == 200 && strstr(b.buf, "\"duplicate\":false") != NULL) {
                atomic_fetch_add(&sh->accepted, 1);
                w->lat_report_us[w->n_report++] = (uint32_t)((t1 - t0) * 1e6);
            } else {
                atomic_fetch_add(&sh->failed, 1);
                snprintf(w->last_error, sizeof w->last_error, "report: rc %d status %d %.100s", rc, status, b.buf);
            }
        }
    }
    while (!sh->opt->preregister && report != NULL && !atomic_load(&sh->stop)) {
        unsigned long issued = atomic_fetch_add(&sh->issued, 1);
        if (issued >= sh->opt->reports || now_s() > sh->deadline) {
            break;
        }
        if (sh->progress != 0 && issued != 0 && issued % sh->progress == 0) {
            fprintf(stderr, "  ... %lu of %lu\n", issued, sh->opt->reports);
        }
        int status = 0;
        double t0 = now_s();
        int rc = call(&t, "POST", "/v1/register", NULL, "application/json", "{}", 2, &b, &status);
        double t1 = now_s();
        if (rc != DPREC_OK || status != 201 || json_str(b.buf, "token", token, sizeof token) != 0) {
            atomic_fetch_add(&sh->failed, 1);
            snprintf(w->last_error, sizeof w->last_error, "register: rc %d status %d %.100s", rc, status, b.buf);
            continue;
        }
        if (w->n_register < w->cap) {
            w->lat_register_us[w->n_register++] = (uint32_t)((t1 - t0) * 1e6);
        }
        size_t len = build_report(sh, report, &rng);
        t0 = now_s();
        rc = call(&t, "POST", path, token, "application/octet-stream", report, len, &b, &status);
        t1 = now_s();
        if (rc == DPREC_OK && status == 200 && strstr(b.buf, "\"duplicate\":false") != NULL) {
            atomic_fetch_add(&sh->accepted, 1);
            if (w->n_report < w->cap) {
                w->lat_report_us[w->n_report++] = (uint32_t)((t1 - t0) * 1e6);
            }
        } else {
            atomic_fetch_add(&sh->failed, 1);
            snprintf(w->last_error, sizeof w->last_error, "report: rc %d status %d %.100s", rc, status, b.buf);
        }
    }
    free(report);
    dprec_transport_curl_cleanup(&st);
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(uint32_t *v, size_t n, double q)
{
    if (n == 0) {
        return 0.0;
    }
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return (double)v[i] / 1000.0;
}

/* What one run measured. */
typedef struct result {
    double reg_per_s, rep_per_s, rep_p50, rep_p99, rep_max, reg_p50, reg_p99;
    unsigned long accepted, failed;
} result;

/* One run of the load against sh->device_url; prints its figures under `label`. 0, or -1 if nothing was accepted. */
static int run_load(shared *sh_in, const char *label, result *res)
{
    shared *shp = sh_in;
    const options *o = shp->opt;
    atomic_store(&shp->issued, 0);
    atomic_store(&shp->accepted, 0);
    atomic_store(&shp->failed, 0);
    atomic_store(&shp->stop, 0);
    memset(res, 0, sizeof *res);
    int rc = -1;
    worker *ws = calloc(o->threads, sizeof *ws);
    if (ws == NULL) {
        return -1;
    }
    size_t per = o->reports / o->threads + 2;
    if (!o->preregister && shp->mark != NULL) {
        shp->mark(shp, 0);
    }
    double t0 = now_s();
    shp->deadline = t0 + o->seconds;
    if (o->preregister && pthread_barrier_init(&shp->barrier, NULL, o->threads + 1) != 0) {
        free(ws);
        return -1;
    }
    for (unsigned i = 0; i < o->threads; i++) {
        ws[i].sh = shp;
        ws[i].index = i;
        ws[i].cap = per;
        ws[i].lat_report_us = calloc(per, sizeof(uint32_t));
        ws[i].lat_register_us = calloc(per, sizeof(uint32_t));
        ws[i].tokens = o->preregister ? calloc(per, sizeof *ws[i].tokens) : NULL;
        if (ws[i].lat_report_us == NULL || ws[i].lat_register_us == NULL ||
            (o->preregister && ws[i].tokens == NULL) || pthread_create(&ws[i].tid, NULL, worker_main, &ws[i]) != 0) {
            fprintf(stderr, "cannot start thread %u\n", i);
            exit(1); /* a half-started barrier cannot be unwound; the run has not begun */
        }
    }
    double t_reg = 0.0;
    if (o->preregister) {
        pthread_barrier_wait(&shp->barrier);
        t_reg = now_s() - t0;
        t0 = now_s();
    }
    if (o->preregister) {
        if (shp->mark != NULL) {
            shp->mark(shp, 0); /* every thread waits at the barrier: nothing in flight */
        }
        pthread_barrier_wait(&shp->barrier);
        t0 = now_s();
    }
    size_t nrep = 0, nreg = 0;
    for (unsigned i = 0; i < o->threads; i++) {
        pthread_join(ws[i].tid, NULL);
        nrep += ws[i].n_report;
        nreg += ws[i].n_register;
    }
    double wall = now_s() - t0;
    if (shp->mark != NULL) {
        shp->mark(shp, 1);
    }
    if (o->preregister) {
        pthread_barrier_destroy(&shp->barrier);
    }
    uint32_t *rep = malloc((nrep + 1) * sizeof *rep), *reg = malloc((nreg + 1) * sizeof *reg);
    size_t a = 0, g = 0;
    const char *err = NULL;
    for (unsigned i = 0; i < o->threads; i++) {
        if (rep != NULL) {
            memcpy(rep + a, ws[i].lat_report_us, ws[i].n_report * sizeof *rep);
        }
        if (reg != NULL) {
            memcpy(reg + g, ws[i].lat_register_us, ws[i].n_register * sizeof *reg);
        }
        a += ws[i].n_report;
        g += ws[i].n_register;
        if (ws[i].last_error[0] != '\0') {
            err = ws[i].last_error;
        }
    }
    if (rep != NULL && reg != NULL && label == NULL) {
        res->accepted = atomic_load(&shp->accepted);
        res->failed = atomic_load(&shp->failed);
        res->rep_per_s = (double)res->accepted / wall;
        rc = res->accepted > 0 ? 0 : -1;
        if (err != NULL) {
            fprintf(stderr, "last error: %s\n", err);
        }
    } else if (rep != NULL && reg != NULL) {
        qsort(rep, nrep, sizeof *rep, cmp_u32);
        qsort(reg, nreg, sizeof *reg, cmp_u32);
        res->accepted = atomic_load(&shp->accepted);
        res->failed = atomic_load(&shp->failed);
        res->rep_per_s = (double)res->accepted / wall;
        res->reg_per_s = t_reg > 0 ? (double)nreg / t_reg : 0.0;
        res->rep_p50 = pct(rep, nrep, 0.5);
        res->rep_p99 = pct(rep, nrep, 0.99);
        res->rep_max = nrep > 0 ? (double)rep[nrep - 1] / 1000.0 : 0.0;
        res->reg_p50 = pct(reg, nreg, 0.5);
        res->reg_p99 = pct(reg, nreg, 0.99);
        printf("== %s: %u client threads, %s d=%u, HTTPS keep-alive on loopback\n", label, o->threads,
               o->dpals ? "dpals (folded)" : "plain", o->d);
        if (o->preregister) {
            printf("registered %zu devices in %.2f s = %.0f registrations/s\n", nreg, t_reg, res->reg_per_s);
        }
        if (o->shuffle != 0) {
            printf("devices reported in a random order per thread (--shuffle %lu)\n", o->shuffle);
        }
        printf("accepted reports: %lu in %.2f s = %.0f reports/s%s\n", res->accepted, wall, res->rep_per_s,
               o->preregister ? "" : " (each after its own registration)");
        printf("failed requests: %lu%s%s\n", res->failed, err != NULL ? "; last: " : "", err != NULL ? err : "");
        printf("report POST latency: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", res->rep_p50, res->rep_p99, res->rep_max);
        printf("register POST latency: p50 %.2f ms, p99 %.2f ms\n", res->reg_p50, res->reg_p99);
        fflush(stdout);
        rc = res->accepted > 0 ? 0 : -1;
    }
    free(rep);
    free(reg);
    for (unsigned i = 0; i < o->threads; i++) {
        free(ws[i].lat_report_us);
        free(ws[i].lat_register_us);
        free(ws[i].tokens);
    }
    free(ws);
    return rc;
}

/* ---- the baseline: the same HTTPS stack answering from memory -------------------------------------------- */

/* libmicrohttpd with GnuTLS, the aggregator's flags, certificate, TLS priorities and thread count, answering every
 * registration and report with a fixed body once the request body is read: what the HTTPS layer alone costs. */
static const char baseline_register[] =
    "{\"device_id\":\"1\",\"token\":\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}";
static const char baseline_report[] = "{\"accepted\":true,\"duplicate\":false,\"round\":1}";

static enum MHD_Result baseline_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                        const char *version, const char *upload_data, size_t *upload_data_size,
                                        void **con_cls)
{
    (void)cls;
    (void)method;
    (void)version;
    (void)upload_data;
    if (*con_cls == NULL) {
        *con_cls = (void *)1;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        *upload_data_size = 0; /* read and dropped, as the aggregator would read it */
        return MHD_YES;
    }
    int reg = strcmp(url, "/v1/register") == 0;
    const char *text = reg ? baseline_register : baseline_report;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)(uintptr_t)text,
                                                             MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result ok = MHD_queue_response(c, reg ? 201 : 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* CPU seconds (user + system) that a /proc/.../stat file reports, or -1 if it cannot be read. */
static double cpu_of_stat(const char *path)
{
    char buf[1024];
    if (read_text(path, buf, sizeof buf) != 0) {
        return -1.0;
    }
    const char *p = strrchr(buf, ')'); /* the name may hold spaces */
    unsigned long ut = 0, st = 0;
    if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) {
        return -1.0;
    }
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds of a process. */
static double cpu_of_pid(long pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    return cpu_of_stat(path);
}

/* CPU seconds of the entries of dir (/proc: processes; /proc/self/task: this process's threads) whose name (comm)
 * starts with prefix. A process or thread that ends between two readings takes its CPU with it. */
static double cpu_of_named(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    double sum = 0.0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        char path[300], name[64] = "";
        if (e->d_name[0] < '1' || e->d_name[0] > '9') {
            continue;
        }
        snprintf(path, sizeof path, "%s/%s/comm", dir, e->d_name);
        if (read_text(path, name, sizeof name) != 0 || strncmp(name, prefix, strlen(prefix)) != 0) {
            continue;
        }
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        double c = cpu_of_stat(path);
        if (c > 0) {
            sum += c;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return sum;
}

/* A database server's processes (PostgreSQL's are all named postgres), and this process's threads (the baseline's). */
static double cpu_of_processes(const char *prefix)
{
    return cpu_of_named("/proc", prefix);
}

static double cpu_of_threads(const char *prefix)
{
    return cpu_of_named("/proc/self/task", prefix);
}

static struct MHD_Daemon *baseline_start(const char *state, unsigned threads, uint16_t *port)
{
    char path[1100];
    static char cert[1 << 16], key[1 << 16];
    snprintf(path, sizeof path, "%s/tls-cert.pem", state);
    if (read_text(path, cert, sizeof cert) != 0) {
        return NULL;
    }
    snprintf(path, sizeof path, "%s/tls-key.pem", state);
    if (read_text(path, key, sizeof key) != 0) {
        return NULL;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, &sa},
        {MHD_OPTION_HTTPS_MEM_CERT, 0, cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, key},
        {MHD_OPTION_HTTPS_PRIORITIES, 0,
         (void *)(uintptr_t) "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-256-GCM:+AES-128-GCM:"
                             "+CHACHA20-POLY1305:-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA"},
        {MHD_OPTION_CONNECTION_TIMEOUT, 30, NULL},
        {threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (intptr_t)threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_TLS | MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME, 0,
                                            NULL, NULL, baseline_request, NULL, MHD_OPTION_ARRAY, opts + 0,
                                            MHD_OPTION_END);
    if (d != NULL) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        *port = info != NULL ? info->port : 0;
    }
    return d;
}

static pid_t spawn_server(const char *bin, const char *state, const char *state_uri, unsigned threads)
{
    char th[16];
    snprintf(th, sizeof th, "%u", threads);
    pid_t pid = fork();
    if (pid == 0) {
        char log[1100];
        snprintf(log, sizeof log, "%s.log", state);
        if (freopen(log, "w", stderr) == NULL || freopen("/dev/null", "w", stdout) == NULL) {
            _exit(127);
        }
        /* every client comes from 127.0.0.1: the per-address limits are for the internet, not for this run */
        if (state_uri != NULL) { /* PostgreSQL: keys and certificates stay in the state directory */
            execl(bin, bin, "serve", "--state-dir", state, "--state", state_uri, "--listen", "127.0.0.1:0",
                  "--admin-listen", "127.0.0.1:0", "--threads", th, "--connections-per-address", "0",
                  "--register-per-minute", "0", (char *)NULL);
        } else {
            execl(bin, bin, "serve", "--state-dir", state, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                  "--threads", th, "--connections-per-address", "0", "--register-per-minute", "0", (char *)NULL);
        }
        _exit(127);
    }
    return pid;
}

static void usage(void)
{
    fputs("usage: dprec-bench-load (--spawn PATH/dprec-aggregator [--spawn-state URI] | --state-dir DIR ...)\n"
          "                        [--threads N] [--reports N] [--prefill N] [--prefill-threads N] [--seconds S]\n"
          "                        [--server-threads N]\n"
          "                        [--d D] [--m M] [--protocol plain|dpals] [--preregister 0|1] [--baseline 0|1]\n"
          "                        [--device-url URL] [--db-cpu NAME] [--shuffle SEED]\n"
          "  --spawn BIN          start BIN serve on 127.0.0.1 with ephemeral ports in a fresh state directory\n"
          "  --spawn-state URI    the spawned server keeps its state in this PostgreSQL database (--state URI)\n"
          "  --state-dir DIR      use the aggregator already running on this state directory (ports.json,\n"
          "                       tls-cert.pem, admin-token); it must listen on loopback. Give it once per\n"
          "                       instance of a several-instance deployment: the job is created on the first,\n"
          "                       the CPU and commits are summed over all (the admin token and TLS\n"
          "                       certificate are the first's)\n"
          "  --db-cpu NAME        also the CPU of the processes named NAME* (e.g. postgres: the database server's)\n"
          "  --device-url URL     where the devices connect (default: the first instance's device listener),\n"
          "                       e.g. https://127.0.0.1:8443, haproxy's front (deploy/run-local.sh)\n"
          "  --threads N          client threads, each with one keep-alive connection (default 16)\n"
          "  --reports N          the measured run: stop after N reports (default 20000, at most 1000000)\n"
          "  --prefill N          first store N reports (each after its own registration), not measured, so the\n"
          "                       measured run meets a state that already holds them (default 0, at most\n"
          "                       5000000; progress on stderr)\n"
          "  --prefill-threads N  client threads of the prefill (default 128: large group commits)\n"
          "  --seconds S          the measured run stops after S seconds (default 30, at most 600)\n"
          "  --server-threads N   --threads for a spawned server, and the baseline's (default 4)\n"
          "  --d D --m M          job dimensions (default 16, 1000)\n"
          "  --protocol P         plain (default: every report stored) or dpals (a folded round: each report is\n"
          "                       added to the round's sum as it is stored; epsilon 1, delta 1e-6, max_items 20)\n"
          "  --preregister 1      register every device first, then time the reports alone (default 0: each\n"
          "                       report follows its own device's registration, both timed)\n"
          "  --baseline 1         first the same load on the same HTTPS stack answering from memory (one\n"
          "                       instance only)\n"
          "  --shuffle SEED       with --preregister 1: each thread reports for its devices in a random order\n"
          "                       (Fisher-Yates from splitmix64 seeded with SEED and the thread's number: the same\n"
          "                       SEED gives the same orders), not in their registration order (default 0: in order)\n",
          stderr);
}

/* One aggregator process under load. */
typedef struct instance {
    char state[1024];
    long pid, device_port, admin_port;
    char admin_url[64];
} instance;

/* What the measured run's start and end read off the servers: their CPU and their group commits. */
typedef struct probe {
    instance *inst;
    unsigned n;
    double cpu[8][2];
    int commits_ok;
    double commits[8][2], empty[8][2], reports[8][2];
    double db_cpu[2];
    const char *ca, *db_comm;
} probe;

static probe g_probe;

static void probe_mark(shared *sh, int end)
{
    (void)sh;
    probe *p = &g_probe;
    p->db_cpu[end] = p->db_comm != NULL ? cpu_of_processes(p->db_comm) : 0.0;
    for (unsigned i = 0; i < p->n; i++) {
        p->cpu[i][end] = p->inst[i].pid > 0 ? cpu_of_pid(p->inst[i].pid) : -1.0;
        if (commit_counts(p->inst[i].admin_url, p->ca, &p->commits[i][end], &p->empty[i][end], &p->reports[i][end]) !=
            0) {
            p->commits_ok = 0;
        }
    }
}

static int wait_ports(instance *in, pid_t spawned)
{
    char path[sizeof in->state + 16], ports[512] = "";
    snprintf(path, sizeof path, "%.1000s/ports.json", in->state);
    for (int i = 0; i < 300; i++) {
        if (read_text(path, ports, sizeof ports) == 0 && json_int(ports, "device") > 0 &&
            (spawned < 0 || json_int(ports, "pid") == (long)spawned)) {
            in->pid = json_int(ports, "pid");
            in->device_port = json_int(ports, "device");
            in->admin_port = json_int(ports, "admin");
            /* Loopback only, whatever the listener's configured host: connect to 127.0.0.1. */
            snprintf(in->admin_url, sizeof in->admin_url, "https://127.0.0.1:%ld", in->admin_port);
            return 0;
        }
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "no aggregator: %s not found or stale\n", path);
    return -1;
}

int main(int argc, char **argv)
{
    options opt;
    memset(&opt, 0, sizeof opt);
    opt.threads = 16;
    opt.reports = 20000;
    opt.seconds = 30;
    opt.server_threads = 4;
    opt.d = 16;
    opt.m = 1000;
    opt.prefill_threads = 128;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) {
            usage();
            return 0;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            usage();
            return 2;
        }
        i++;
        char *end = NULL;
        unsigned long n = strtoul(v, &end, 10);
        int num = end != v && *end == '\0';
        if (strcmp(f, "--spawn") == 0) {
            opt.spawn = v;
        } else if (strcmp(f, "--spawn-state") == 0) {
            opt.spawn_state = v;
        } else if (strcmp(f, "--state-dir") == 0 && opt.n_state_dirs < 8) {
            opt.state_dirs[opt.n_state_dirs++] = v;
        } else if (strcmp(f, "--device-url") == 0 && strlen(v) < sizeof ((shared *)0)->device_url) {
            opt.device_url = v;
        } else if (strcmp(f, "--threads") == 0 && num && n >= 1 && n <= 256) {
            opt.threads = (unsigned)n;
        } else if (strcmp(f, "--reports") == 0 && num && n >= 1 && n <= 1000000) {
            opt.reports = n;
        } else if (strcmp(f, "--prefill") == 0 && num && n <= 5000000) {
            opt.prefill = n;
        } else if (strcmp(f, "--prefill-threads") == 0 && num && n >= 1 && n <= 256) {
            opt.prefill_threads = (unsigned)n;
        } else if (strcmp(f, "--seconds") == 0 && num && n >= 1 && n <= 600) {
            opt.seconds = (unsigned)n;
        } else if (strcmp(f, "--server-threads") == 0 && num && n >= 1 && n <= 256) {
            opt.server_threads = (unsigned)n;
        } else if (strcmp(f, "--d") == 0 && num && n >= 1 && n <= 256) {
            opt.d = (unsigned)n;
        } else if (strcmp(f, "--m") == 0 && num && n >= 1 && n <= 16777216) {
            opt.m = (unsigned)n;
        } else if (strcmp(f, "--protocol") == 0 && (strcmp(v, "plain") == 0 || strcmp(v, "dpals") == 0)) {
            opt.dpals = strcmp(v, "dpals") == 0;
        } else if (strcmp(f, "--db-cpu") == 0 && strlen(v) >= 1 && strlen(v) < 16) {
            opt.db_comm = v;
        } else if (strcmp(f, "--preregister") == 0 && num && n <= 1) {
            opt.preregister = (int)n;
        } else if (strcmp(f, "--baseline") == 0 && num && n <= 1) {
            opt.baseline = (int)n;
        } else if (strcmp(f, "--shuffle") == 0 && num) {
            opt.shuffle = n;
        } else {
            fprintf(stderr, "dprec-bench-load: bad or unknown option %s %s\n", f, v);
            usage();
            return 2;
        }
    }
    if ((opt.spawn == NULL) == (opt.n_state_dirs == 0) || (opt.spawn_state != NULL && opt.spawn == NULL) ||
        (opt.baseline && opt.n_state_dirs > 1) || (opt.shuffle != 0 && !opt.preregister)) {
        usage();
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    static instance inst[8];
    unsigned ninst = opt.spawn != NULL ? 1 : opt.n_state_dirs;
    char tmpdir[64] = "";
    pid_t server = -1;
    if (opt.spawn != NULL) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/dprec-bench-load-XXXXXX");
        if (mkdtemp(tmpdir) == NULL) {
            perror("mkdtemp");
            return 1;
        }
        snprintf(inst[0].state, sizeof inst[0].state, "%s/state", tmpdir);
        server = spawn_server(opt.spawn, inst[0].state, opt.spawn_state, opt.server_threads);
    } else {
        for (unsigned i = 0; i < ninst; i++) {
            snprintf(inst[i].state, sizeof inst[i].state, "%s", opt.state_dirs[i]);
        }
    }
    const char *state = inst[0].state;

    static shared sh;
    sh.opt = &opt;
    char path[1100], admin_token[256] = "";
    int exit_code = 1;
    for (unsigned i = 0; i < ninst; i++) {
        if (wait_ports(&inst[i], i == 0 ? server : -1) != 0) {
            goto out;
        }
    }
    if (opt.device_url != NULL) {
        snprintf(sh.device_url, sizeof sh.device_url, "%s", opt.device_url);
    } else {
        snprintf(sh.device_url, sizeof sh.device_url, "https://127.0.0.1:%ld", inst[0].device_port);
    }
    snprintf(sh.ca, sizeof sh.ca, "%s/tls-cert.pem", state);
    snprintf(path, sizeof path, "%s/admin-token", state);
    if (read_text(path, admin_token, sizeof admin_token) != 0) {
        fprintf(stderr, "cannot read %s\n", path);
        goto out;
    }
    admin_token[strcspn(admin_token, "\r\n")] = '\0';

    {
        dprec_transport t;
        dprec_transport_curl st;
        dprec_curl_options co = {0};
        co.ca_file = sh.ca;
        if (dprec_transport_curl_init(&t, &st, inst[0].admin_url, &co) != DPREC_OK) {
            fprintf(stderr, "transport init failed\n");
            goto out;
        }
        char spec[512];
        if (opt.dpals) {
            snprintf(spec, sizeof spec,
                     "{\"protocol\":\"dpals\",\"d\":%u,\"m\":%u,\"rating_min\":1,\"rating_max\":5,\"rounds\":2,"
                     "\"min_reports\":%lu,\"round_seconds\":604800,\"participation\":1.0,"
                     "\"params\":{\"max_items\":%u,\"seed\":1},\"budget\":{\"epsilon\":1,\"delta\":1e-6}}",
                     opt.d, opt.m, opt.prefill + opt.reports + 1000, opt.m < 20 ? opt.m : 20);
        } else {
            snprintf(spec, sizeof spec,
                     "{\"protocol\":\"plain\",\"d\":%u,\"m\":%u,\"rating_min\":1,\"rating_max\":5,\"rounds\":1000,"
                     "\"min_reports\":%lu,\"round_seconds\":604800,\"participation\":1.0,"
                     "\"params\":{\"lambda\":0.1,\"seed\":1}}",
                     opt.d, opt.m, opt.prefill + opt.reports + 1000);
        }
        body b;
        int status = 0;
        int rc = call(&t, "POST", "/v1/admin/jobs", admin_token, "application/json", spec, strlen(spec), &b, &status);
        long job = rc == DPREC_OK && status == 201 ? json_int(b.buf, "job") : -1;
        dprec_transport_curl_cleanup(&st);
        if (job <= 0) {
            fprintf(stderr, "create job failed: rc %d (%s) status %d %s\n", rc, dprec_strerror(rc), status, b.buf);
            goto out;
        }
        sh.job = (uint64_t)job;
        co.ca_file = sh.ca;
        if (dprec_transport_curl_init(&t, &st, sh.device_url, &co) != DPREC_OK) {
            goto out;
        }
        char p[64], token[128] = "";
        rc = call(&t, "POST", "/v1/register", NULL, "application/json", "{}", 2, &b, &status);
        if (rc == DPREC_OK && status == 201) {
            json_str(b.buf, "token", token, sizeof token);
        }
        snprintf(p, sizeof p, "/v1/jobs/%ld", job);
        rc = call(&t, "GET", p, token, NULL, NULL, 0, &b, &status);
        dprec_transport_curl_cleanup(&st);
        if (rc != DPREC_OK || status != 200) {
            fprintf(stderr, "get job failed: rc %d status %d %s\n", rc, status, b.buf);
            goto out;
        }
        sh.round = (uint64_t)json_int(b.buf, "round");
        sh.release_version = (uint64_t)json_int(b.buf, "release_version");
    }

    result agg_res, base_res;
    if (opt.baseline) {
        uint16_t port = 0;
        struct MHD_Daemon *d = baseline_start(state, opt.server_threads, &port);
        if (d == NULL || port == 0) {
            fprintf(stderr, "cannot start the baseline server (it needs %s/tls-cert.pem and tls-key.pem)\n", state);
            goto out;
        }
        char agg_url[sizeof sh.device_url];
        snprintf(agg_url, sizeof agg_url, "%s", sh.device_url);
        snprintf(sh.device_url, sizeof sh.device_url, "https://127.0.0.1:%u", (unsigned)port);
        double c0 = cpu_of_threads("MHD");
        int brc = run_load(&sh, "baseline (the same HTTPS stack, a fixed answer from memory)", &base_res);
        double c1 = cpu_of_threads("MHD");
        MHD_stop_daemon(d);
        printf("server CPU: %.2f s, %.1f us per request\n", c1 - c0,
               1e6 * (c1 - c0) / (double)(base_res.accepted + (opt.preregister ? base_res.accepted : 0)));
        snprintf(sh.device_url, sizeof sh.device_url, "%s", agg_url);
        if (brc != 0) {
            fprintf(stderr, "the baseline run accepted nothing\n");
            goto out;
        }
    }
    if (opt.prefill > 0) {
        /* Not measured: the state the measured run meets. Each prefill report is its own device's first. */
        options pre = opt;
        pre.reports = opt.prefill;
        pre.threads = opt.prefill_threads;
        pre.preregister = 0;
        pre.seconds = 24 * 3600;
        sh.opt = &pre;
        sh.progress = 100000;
        fprintf(stderr, "prefill: storing %lu reports (each after its own registration) ...\n", opt.prefill);
        double t0 = now_s();
        result pre_res;
        int prc = run_load(&sh, NULL, &pre_res);
        double t1 = now_s();
        sh.opt = &opt;
        sh.progress = 0;
        if (prc != 0 || pre_res.accepted != opt.prefill || pre_res.failed != 0) {
            fprintf(stderr, "prefill failed: %lu of %lu stored, %lu failed\n", pre_res.accepted, opt.prefill,
                    pre_res.failed);
            goto out;
        }
        printf("prefill: %lu reports stored (registration + report each) in %.1f s, not measured\n",
               pre_res.accepted, t1 - t0);
    }
    g_probe.inst = inst;
    g_probe.n = ninst;
    g_probe.ca = sh.ca;
    g_probe.commits_ok = 1;
    g_probe.db_comm = opt.db_comm;
    sh.mark = probe_mark;
    double k0 = cpu_of_pid((long)getpid());
    int arc = run_load(&sh, "dprec-aggregator (every report durable before its 200)", &agg_res);
    double k1 = cpu_of_pid((long)getpid());
    sh.mark = NULL;
    /* what the server did for the measured requests: the reports alone with --preregister 1 (the registrations are
     * read off before them), a registration and a report each otherwise */
    const char *per = opt.preregister ? "durable report" : "registration + durable report";
    double nrep = (double)agg_res.accepted;
    if (arc == 0) {
        double all = 0;
        int cpu_ok = 1;
        for (unsigned i = 0; i < ninst; i++) {
            cpu_ok = cpu_ok && g_probe.cpu[i][0] >= 0 && g_probe.cpu[i][1] >= 0;
            all += g_probe.cpu[i][1] - g_probe.cpu[i][0];
        }
        if (cpu_ok) {
            printf("server CPU (%u instance%s): %.2f s, %.1f us per %s\n", ninst, ninst > 1 ? "s together" : "", all,
                   1e6 * all / nrep, per);
        }
        for (unsigned i = 0; cpu_ok && g_probe.commits_ok && ninst > 1 && i < ninst; i++) {
            double r = g_probe.reports[i][1] - g_probe.reports[i][0];
            double c = g_probe.cpu[i][1] - g_probe.cpu[i][0];
            printf("  instance %u (pid %ld): %.0f reports, %.2f s CPU, %.1f us per %s\n", i + 1, inst[i].pid, r, c,
                   r > 0 ? 1e6 * c / r : 0.0, per);
        }
    }
    if (arc == 0 && opt.db_comm != NULL) {
        double c = g_probe.db_cpu[1] - g_probe.db_cpu[0];
        printf("database CPU (processes named %s*): %.2f s, %.1f us per %s\n", opt.db_comm, c, 1e6 * c / nrep, per);
    }
    if (arc == 0 && k0 >= 0 && k1 >= 0) {
        printf("client CPU (these libcurl clients, same machine): %.2f s, %.1f us per measured report\n", k1 - k0,
               1e6 * (k1 - k0) / nrep);
    }
    /* one group commit is one transaction and one fsync: reports per commit is reports per fsync (the commits of
     * registrations alone are counted apart) */
    if (arc == 0 && g_probe.commits_ok) {
        double c = 0, z = 0, r = 0;
        for (unsigned i = 0; i < ninst; i++) {
            c += g_probe.commits[i][1] - g_probe.commits[i][0];
            z += g_probe.empty[i][1] - g_probe.empty[i][0];
            r += g_probe.reports[i][1] - g_probe.reports[i][0];
        }
        if (c - z > 0) {
            printf("group commits: %.0f (%.0f of registrations alone); %.0f with reports, storing %.0f: %.2f reports "
                   "per commit (fsync)\n", c, z, c - z, r, r / (c - z));
        }
    }
    if (arc == 0) {
        exit_code = 0;
        if (opt.baseline) {
            printf("== ratio aggregator / baseline: reports %.2f (%.0f / %.0f per s), p99 %.2f / %.2f ms",
                   agg_res.rep_per_s / base_res.rep_per_s, agg_res.rep_per_s, base_res.rep_per_s, agg_res.rep_p99,
                   base_res.rep_p99);
            if (opt.preregister) {
                printf("; registrations %.2f (%.0f / %.0f per s)", agg_res.reg_per_s / base_res.reg_per_s,
                       agg_res.reg_per_s, base_res.reg_per_s);
            }
            printf("\n");
        }
    }

out:
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) {
            fprintf(stderr, "could not remove %s\n", tmpdir);
        }
    }
    return exit_code;
}
