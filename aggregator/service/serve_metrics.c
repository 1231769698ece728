/* The front end's HTTP metrics: every answered request is counted by listener, route and status, with its latency
 * in a histogram; the limits count what they refuse, and the gauges follow the open connections and the bodies in
 * flight (the other pieces update these atomics in server.metrics directly). GET /metrics, on the admin listener
 * only, answers the backend's metrics followed by these, as Prometheus text (docs/operations.md lists the series).
 *
 * Counting takes no lock (atomics only), so it costs a request nothing it could wait on. Its own file: what is
 * counted and how it is rendered are one table (routes, statuses, buckets, refusals), kept in one place. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_priv.h"

static const char *const route_names[ROUTE_COUNT] = {"healthz", "metrics", "register", "job",
                                                     "release", "reports", "admin",    "other"};
const char *const srv_listener_names[2] = {"device", "admin"};
static const double latency_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                         0.1,    0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
_Static_assert(sizeof latency_buckets / sizeof latency_buckets[0] == N_BUCKETS, "N_BUCKETS: the latency buckets");
/* the statuses counted one by one; anything else counts as "other" */
static const unsigned status_codes[] = {200, 201, 400, 401, 403, 404, 405, 409, 413, 414, 429, 431, 500, 503};
_Static_assert(sizeof status_codes / sizeof status_codes[0] + 1 == N_STATUS, "N_STATUS: the statuses, and other");

static const char *const refusal_names[REFUSED_COUNT] = {"connections_per_address", "inflight_bytes",
                                                         "register_rate", "shutting_down", "bad_framing",
                                                         "connection_limit"};
static const char *const shed_names[SHED_COUNT] = {"head_timeout", "budget"};

enum route srv_classify(const char *path)
{
    if (strcmp(path, "/healthz") == 0) {
        return ROUTE_HEALTHZ;
    }
    if (strcmp(path, "/metrics") == 0) {
        return ROUTE_METRICS;
    }
    if (strcmp(path, "/v1/register") == 0) {
        return ROUTE_REGISTER;
    }
    if (strncmp(path, "/v1/admin/", 10) == 0 || strcmp(path, "/v1/admin") == 0) {
        return ROUTE_ADMIN;
    }
    if (strncmp(path, "/v1/jobs/", 9) == 0) {
        if (strstr(path, "/releases/") != NULL) {
            return ROUTE_RELEASE;
        }
        size_t n = strlen(path);
        if (n > 8 && strcmp(path + n - 8, "/reports") == 0) {
            return ROUTE_REPORTS;
        }
        if (strchr(path + 9, '/') == NULL) {
            return ROUTE_JOB;
        }
    }
    return ROUTE_OTHER;
}

void srv_metrics_record(http_metrics *m, dprec_listener l, enum route r, unsigned status, uint64_t ns)
{
    size_t k = 0;
    while (k < N_STATUS - 1 && status_codes[k] != status) {
        k++;
    }
    atomic_fetch_add(&m->requests[l][r][k], 1);
    double s = (double)ns / 1e9;
    size_t b = 0;
    while (b < N_BUCKETS && s > latency_buckets[b]) {
        b++;
    }
    atomic_fetch_add(&m->latency[b], 1);
    atomic_fetch_add(&m->latency_sum_ns, ns);
    atomic_fetch_add(&m->latency_count, 1);
}

/* A growable string for the metrics text. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->failed) {
        return;
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p == NULL ? NULL : b->p + b->len, b->p == NULL ? 0 : b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->p != NULL && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = (b->cap == 0 ? 4096 : b->cap * 2) + (size_t)n;
        char *np = realloc(b->p, ncap);
        if (np == NULL) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

static void metrics_render(http_metrics *m, sbuf *b)
{
    sb_printf(b, "# HELP dprec_http_requests_total HTTP requests by listener, route and status (\"other\": a status "
                 "not listed in docs/operations.md).\n# TYPE dprec_http_requests_total counter\n");
    for (int l = 0; l < 2; l++) {
        for (int r = 0; r < ROUTE_COUNT; r++) {
            for (size_t c = 0; c < N_STATUS; c++) {
                uint64_t v = atomic_load(&m->requests[l][r][c]);
                if (v == 0) {
                    continue;
                }
                char code[8];
                if (c < N_STATUS - 1) {
                    snprintf(code, sizeof code, "%u", status_codes[c]);
                } else {
                    snprintf(code, sizeof code, "other");
                }
                sb_printf(b, "dprec_http_requests_total{listener=\"%s\",route=\"%s\",code=\"%s\"} %" PRIu64 "\n",
                          srv_listener_names[l], route_names[r], code, v);
            }
        }
    }
    sb_printf(b, "# HELP dprec_http_request_too_large_total Requests refused with 413 before their body was read.\n"
                 "# TYPE dprec_http_request_too_large_total counter\n"
                 "dprec_http_request_too_large_total %" PRIu64 "\n",
              (uint64_t)atomic_load(&m->too_large));
    sb_printf(b, "# HELP dprec_http_refused_total Connections and requests refused by a limit (docs/operations.md).\n"
                 "# TYPE dprec_http_refused_total counter\n");
    for (int k = 0; k < REFUSED_COUNT; k++) {
        sb_printf(b, "dprec_http_refused_total{limit=\"%s\"} %" PRIu64 "\n", refusal_names[k],
                  (uint64_t)atomic_load(&m->refused[k]));
    }
    sb_printf(b, "# HELP dprec_http_connections_closed_total Connections the server closed before their request's "
                 "head arrived: past its deadline, or displaced by a new connection at connection_limit.\n"
                 "# TYPE dprec_http_connections_closed_total counter\n");
    for (int k = 0; k < SHED_COUNT; k++) {
        sb_printf(b, "dprec_http_connections_closed_total{reason=\"%s\"} %" PRIu64 "\n", shed_names[k],
                  (uint64_t)atomic_load(&m->shed[k]));
    }
    sb_printf(b, "# HELP dprec_http_connections Open connections, both listeners.\n"
                 "# TYPE dprec_http_connections gauge\ndprec_http_connections %" PRId64 "\n"
                 "# HELP dprec_http_inflight_requests Requests received and not yet answered.\n"
                 "# TYPE dprec_http_inflight_requests gauge\ndprec_http_inflight_requests %" PRId64 "\n"
                 "# HELP dprec_http_inflight_body_bytes Request body bytes reserved in memory now.\n"
                 "# TYPE dprec_http_inflight_body_bytes gauge\ndprec_http_inflight_body_bytes %" PRId64 "\n"
                 "# HELP dprec_http_inflight_body_bytes_max The most request body bytes reserved at once since start.\n"
                 "# TYPE dprec_http_inflight_body_bytes_max gauge\ndprec_http_inflight_body_bytes_max %" PRId64 "\n",
              (int64_t)atomic_load(&m->connections), (int64_t)atomic_load(&m->inflight_requests),
              (int64_t)atomic_load(&m->inflight_bytes), (int64_t)atomic_load(&m->inflight_bytes_peak));
    sb_printf(b, "# HELP dprec_http_request_duration_seconds Time from the request's headers to its response.\n"
                 "# TYPE dprec_http_request_duration_seconds histogram\n");
    uint64_t cum = 0;
    for (size_t i = 0; i < N_BUCKETS; i++) {
        cum += atomic_load(&m->latency[i]);
        sb_printf(b, "dprec_http_request_duration_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", latency_buckets[i], cum);
    }
    cum += atomic_load(&m->latency[N_BUCKETS]);
    sb_printf(b, "dprec_http_request_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", cum);
    sb_printf(b, "dprec_http_request_duration_seconds_sum %.6f\n", (double)atomic_load(&m->latency_sum_ns) / 1e9);
    sb_printf(b, "dprec_http_request_duration_seconds_count %" PRIu64 "\n", (uint64_t)atomic_load(&m->latency_count));
}

enum MHD_Result srv_serve_metrics(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                                  const char *url)
{
    sbuf b = {NULL, 0, 0, 0};
    char *core = L->srv->b->metrics(L->srv->core);
    if (core != NULL) {
        sb_printf(&b, "%s", core);
        if (b.len > 0 && b.p[b.len - 1] != '\n') {
            sb_printf(&b, "\n");
        }
        free(core);
    }
    metrics_render(&L->srv->metrics, &b);
    if (b.failed) {
        free(b.p);
        return srv_respond_error(L, c, r, method, url, 500, "internal", "out of memory");
    }
    return srv_respond(L, c, r, method, url, 200, "text/plain; version=0.0.4; charset=utf-8", (unsigned char *)b.p,
                       b.len, 0, 0);
}
