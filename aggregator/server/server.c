/* dprec-aggregator serve — the HTTPS front end. Two libmicrohttpd daemons (TLS through GnuTLS, epoll, a
 * thread pool each): the device listener and the admin listener. Every request body is accumulated up to
 * its cap and handed to dprec_agg_handle with the listener it came in on; the core decides everything else.
 * The main thread waits for SIGTERM/SIGINT and drives the round engine's clock (dprec_agg_tick) once a second.
 *
 * Logs are one JSON object per line on stderr. They never contain the admin token, a device token or an
 * Authorization header. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>

#include <cjson/cJSON.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>

#include "agg.h"
#include "dprec/dprec.h"
#include "server.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

/* ---- logging ---------------------------------------------------------------------------------------- */

static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;

static void log_emit_line(const char *line)
{
    pthread_mutex_lock(&log_mutex);
    fputs(line, stderr);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_mutex);
}

static cJSON *log_begin(const char *level, const char *event)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL) {
        return NULL;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char buf[40];
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03ldZ", ts.tv_nsec / 1000000L);
    cJSON_AddStringToObject(o, "ts", buf);
    cJSON_AddStringToObject(o, "level", level);
    cJSON_AddStringToObject(o, "event", event);
    return o;
}

static void log_end(cJSON *o)
{
    if (o == NULL) {
        return;
    }
    char *s = cJSON_PrintUnformatted(o);
    if (s != NULL) {
        log_emit_line(s);
        free(s);
    }
    cJSON_Delete(o);
}

/* A log line with one message field. */
static void log_msg(const char *level, const char *event, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = log_begin(level, event);
    cJSON_AddStringToObject(o, "message", msg);
    log_end(o);
}

/* The core's log sink: it already writes one JSON object per line. */
static void core_log(void *user, const char *json_line)
{
    (void)user;
    log_emit_line(json_line);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) {
        msg[--n] = '\0';
    }
    cJSON *o = log_begin("warn", "http");
    cJSON_AddStringToObject(o, "message", msg);
    log_end(o);
}

/* ---- HTTP metrics ----------------------------------------------------------------------------------- */

enum route {
    ROUTE_HEALTHZ,
    ROUTE_METRICS,
    ROUTE_REGISTER,
    ROUTE_JOB,
    ROUTE_RELEASE,
    ROUTE_REPORTS,
    ROUTE_ADMIN,
    ROUTE_OTHER,
    ROUTE_COUNT
};
static const char *const route_names[ROUTE_COUNT] = {"healthz", "metrics", "register", "job",
                                                     "release", "reports", "admin",    "other"};
static const char *const listener_names[2] = {"device", "admin"};
static const double latency_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                         0.1,    0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
#define N_BUCKETS (sizeof latency_buckets / sizeof latency_buckets[0])

typedef struct http_metrics {
    atomic_uint_fast64_t requests[2][ROUTE_COUNT][5]; /* listener, route, status class 1xx..5xx */
    atomic_uint_fast64_t latency[N_BUCKETS + 1];      /* non-cumulative; last is +Inf */
    atomic_uint_fast64_t latency_sum_ns;
    atomic_uint_fast64_t latency_count;
    atomic_uint_fast64_t too_large;
} http_metrics;

static enum route classify(const char *path)
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

static void metrics_record(http_metrics *m, dprec_listener l, enum route r, unsigned status, uint64_t ns)
{
    unsigned cls = status / 100;
    if (cls < 1 || cls > 5) {
        cls = 5;
    }
    atomic_fetch_add(&m->requests[l][r][cls - 1], 1);
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
    sb_printf(b, "# HELP dprec_http_requests_total HTTP requests by listener, route and status class.\n"
                 "# TYPE dprec_http_requests_total counter\n");
    for (int l = 0; l < 2; l++) {
        for (int r = 0; r < ROUTE_COUNT; r++) {
            for (int c = 0; c < 5; c++) {
                uint64_t v = atomic_load(&m->requests[l][r][c]);
                if (v != 0) {
                    sb_printf(b, "dprec_http_requests_total{listener=\"%s\",route=\"%s\",code=\"%dxx\"} %" PRIu64 "\n",
                              listener_names[l], route_names[r], c + 1, v);
                }
            }
        }
    }
    sb_printf(b, "# HELP dprec_http_request_too_large_total Requests refused with 413 before reaching the core.\n"
                 "# TYPE dprec_http_request_too_large_total counter\n"
                 "dprec_http_request_too_large_total %" PRIu64 "\n",
              (uint64_t)atomic_load(&m->too_large));
    sb_printf(b, "# HELP dprec_http_request_duration_seconds Time from the request's headers to its response.\n"
                 "# TYPE dprec_http_request_duration_seconds histogram\n");
    uint64_t cum = 0;
    for (size_t i = 0; i < N_BUCKETS; i++) {
        cum += atomic_load(&m->latency[i]);
        sb_printf(b, "dprec_http_request_duration_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", latency_buckets[i], cum);
    }
    cum += atomic_load(&m->latency[N_BUCKETS]);
    sb_printf(b, "dprec_http_request_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", cum);
    sb_printf(b, "dprec_http_request_duration_seconds_sum %.6f\n",
              (double)atomic_load(&m->latency_sum_ns) / 1e9);
    sb_printf(b, "dprec_http_request_duration_seconds_count %" PRIu64 "\n", (uint64_t)atomic_load(&m->latency_count));
}

/* ---- the server ------------------------------------------------------------------------------------- */

typedef struct server server;

typedef struct listener_ctx {
    server *srv;
    dprec_listener which;
} listener_ctx;

struct server {
    dprec_srv_config cfg;
    dprec_agg *agg;
    listener_ctx device, admin;
    http_metrics metrics;
};

typedef struct req_ctx {
    struct timespec t0;
    unsigned char *body;
    size_t len, cap, limit;
    size_t discarded; /* bytes of an oversized body read and dropped */
    int too_large;
    int responded;
} req_ctx;

static uint64_t elapsed_ns(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t ns = (int64_t)(t1.tv_sec - t0->tv_sec) * 1000000000 + (t1.tv_nsec - t0->tv_nsec);
    return ns > 0 ? (uint64_t)ns : 0;
}

static int is_report_post(const char *method, const char *url)
{
    return strcmp(method, "POST") == 0 && classify(url) == ROUTE_REPORTS;
}

/* Queues a response whose body was malloc'd (ownership passes to MHD) and records it. */
static enum MHD_Result respond(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                               const char *url, unsigned status, const char *content_type, unsigned char *body,
                               size_t body_len, uint32_t retry_after)
{
    struct MHD_Response *resp =
        body != NULL ? MHD_create_response_from_buffer_with_free_callback(body_len, body, free)
                     : MHD_create_response_from_buffer(0, (void *)(uintptr_t) "", MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    if (content_type != NULL) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    }
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%" PRIu32, retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    if (ok != MHD_YES) {
        return ok;
    }
    r->responded = 1;
    uint64_t ns = elapsed_ns(&r->t0);
    metrics_record(&L->srv->metrics, L->which, classify(url), status, ns);
    if (L->srv->cfg.log_debug) {
        cJSON *o = log_begin("debug", "request");
        cJSON_AddStringToObject(o, "listener", listener_names[L->which]);
        cJSON_AddStringToObject(o, "method", method);
        cJSON_AddStringToObject(o, "path", url);
        cJSON_AddNumberToObject(o, "status", status);
        cJSON_AddNumberToObject(o, "bytes_in", (double)r->len);
        cJSON_AddNumberToObject(o, "bytes_out", (double)body_len);
        cJSON_AddNumberToObject(o, "ms", (double)ns / 1e6);
        log_end(o);
    }
    return ok;
}

static enum MHD_Result respond_error(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                                     const char *url, unsigned status, const char *code, const char *message)
{
    char tmp[256];
    int n = snprintf(tmp, sizeof tmp, "{\"error\":\"%s\",\"message\":\"%s\"}", code, message);
    size_t len = n > 0 ? (size_t)n : 0;
    if (len >= sizeof tmp) {
        len = sizeof tmp - 1;
    }
    unsigned char *body = malloc(len);
    if (body == NULL) {
        return MHD_NO;
    }
    memcpy(body, tmp, len);
    return respond(L, c, r, method, url, status, "application/json", body, len, 0);
}

static enum MHD_Result serve_metrics(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                                     const char *url)
{
    sbuf b = {NULL, 0, 0, 0};
    char *core = dprec_agg_metrics(L->srv->agg);
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
        return respond_error(L, c, r, method, url, 500, "internal", "out of memory");
    }
    return respond(L, c, r, method, url, 200, "text/plain; version=0.0.4; charset=utf-8", (unsigned char *)b.p,
                   b.len, 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    listener_ctx *L = cls;
    server *s = L->srv;
    req_ctx *r = *con_cls;

    if (r == NULL) {
        r = calloc(1, sizeof *r);
        if (r == NULL) {
            return MHD_NO;
        }
        clock_gettime(CLOCK_MONOTONIC, &r->t0);
        r->limit = is_report_post(method, url) ? s->cfg.max_report_bytes : s->cfg.max_json_bytes;
        *con_cls = r;
        /* An announced oversized body: within 1 MiB of the cap it is read and dropped and 413 answered at the
         * end (the same as an oversized chunked body), because a client that sends its whole body before
         * reading — most do, without Expect: 100-continue — would otherwise hit a closed connection and never
         * see the 413. A larger or unparsable length is refused at once, and the connection closed. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl != NULL) {
            char *end = NULL;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            int bad = errno != 0 || end == cl;
            if (bad || n > r->limit) {
                r->too_large = 1;
                atomic_fetch_add(&s->metrics.too_large, 1);
                if (bad || n > (unsigned long long)r->limit + (1u << 20))
                    return respond_error(L, c, r, method, url, 413, "too_large", "body above the cap");
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->responded || r->too_large) {
            /* Discard the rest of an oversized body, but not forever: past the cap plus 1 MiB, hang up. */
            r->discarded += n;
            return r->discarded > r->limit + (1u << 20) ? MHD_NO : MHD_YES;
        }
        if (n > r->limit - r->len) {
            r->too_large = 1;
            r->discarded = r->len + n;
            free(r->body);
            r->body = NULL;
            r->len = 0;
            atomic_fetch_add(&s->metrics.too_large, 1);
            /* Answer now if MHD allows it mid-upload; otherwise the final call answers 413. */
            (void)respond_error(L, c, r, method, url, 413, "too_large", "body above the cap");
            return MHD_YES;
        }
        if (r->len + n > r->cap) {
            size_t ncap = r->cap == 0 ? 1024 : r->cap;
            while (ncap < r->len + n) {
                ncap *= 2;
            }
            if (ncap > r->limit) {
                ncap = r->limit;
            }
            unsigned char *nb = realloc(r->body, ncap);
            if (nb == NULL) {
                return MHD_NO;
            }
            r->body = nb;
            r->cap = ncap;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        return MHD_YES;
    }
    if (r->responded) {
        return MHD_YES;
    }
    if (r->too_large) {
        return respond_error(L, c, r, method, url, 413, "too_large", "body above the cap");
    }
    if (strcmp(url, "/metrics") == 0) {
        /* admin listener only: the counts of reports (per job and in total) as they arrive would tell anyone who
         * polls the public listener who is reporting when (docs/operations.md, docs/privacy.md) */
        if (L->which != DPREC_LISTENER_ADMIN) {
            return respond_error(L, c, r, method, url, 404, "not_found", "metrics are served on the admin listener");
        }
        if (strcmp(method, "GET") != 0) {
            return respond_error(L, c, r, method, url, 405, "method_not_allowed", "use GET");
        }
        return serve_metrics(L, c, r, method, url);
    }

    dprec_agg_request req = {
        .listener = L->which,
        .method = method,
        .path = url,
        .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
        .body = r->body,
        .body_len = r->len,
    };
    dprec_agg_response resp;
    memset(&resp, 0, sizeof resp);
    if (dprec_agg_handle(s->agg, &req, &resp) != 0) {
        dprec_agg_response_free(&resp);
        return respond_error(L, c, r, method, url, 500, "internal", "out of memory");
    }
    unsigned status = resp.status >= 100 && resp.status <= 599 ? (unsigned)resp.status : 500;
    unsigned char *body = resp.body;
    size_t body_len = resp.body_len;
    resp.body = NULL; /* ownership passes to MHD (malloc'd by the core, released with free) */
    enum MHD_Result ok = respond(L, c, r, method, url, status, resp.content_type, body, body_len, resp.retry_after);
    dprec_agg_response_free(&resp);
    return ok;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    req_ctx *r = *con_cls;
    if (r != NULL) {
        free(r->body);
        free(r);
        *con_cls = NULL;
    }
}

/* ---- listeners -------------------------------------------------------------------------------------- */

static int parse_hostport(const char *spec, struct sockaddr_storage *ss, socklen_t *sslen, char *err, size_t errcap)
{
    char host[256];
    const char *port;
    if (spec[0] == '[') {
        const char *close = strchr(spec, ']');
        if (close == NULL || close[1] != ':' || (size_t)(close - spec - 1) >= sizeof host) {
            snprintf(err, errcap, "bad listen address '%s' (want HOST:PORT or [IPv6]:PORT)", spec);
            return -1;
        }
        memcpy(host, spec + 1, (size_t)(close - spec - 1));
        host[close - spec - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(spec, ':');
        if (colon == NULL || (size_t)(colon - spec) >= sizeof host || strchr(spec, ':') != colon) {
            snprintf(err, errcap, "bad listen address '%s' (want HOST:PORT or [IPv6]:PORT)", spec);
            return -1;
        }
        memcpy(host, spec, (size_t)(colon - spec));
        host[colon - spec] = '\0';
        port = colon + 1;
    }
    char *end = NULL;
    unsigned long p = strtoul(port, &end, 10);
    if (*port == '\0' || *end != '\0' || p > 65535) {
        snprintf(err, errcap, "bad port in listen address '%s'", spec);
        return -1;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host[0] != '\0' ? host : NULL, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(err, errcap, "cannot resolve listen address '%s': %s", spec, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sslen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static struct MHD_Daemon *start_listener(server *s, listener_ctx *L, const char *spec, unsigned threads,
                                         const char *cert_pem, const char *key_pem, uint16_t *port_out, char *err,
                                         size_t errcap)
{
    struct sockaddr_storage ss;
    socklen_t sslen = 0;
    if (parse_hostport(spec, &ss, &sslen, err, errcap) != 0) {
        return NULL;
    }
    unsigned flags = MHD_USE_TLS | MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) {
        flags |= MHD_USE_IPv6;
    }
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, &ss},
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)(uintptr_t)cert_pem},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)(uintptr_t)key_pem},
        {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)(uintptr_t) "NORMAL:-VERS-TLS1.0:-VERS-TLS1.1:-VERS-DTLS-ALL"},
        {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)s->cfg.connection_timeout, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)s->cfg.connection_limit, NULL},
        {threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (intptr_t)threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    /* The callbacks go through the varargs (function pointers do not fit an option array's slots). */
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, L, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_ARRAY, opts + 0, MHD_OPTION_END);
    if (d == NULL) {
        snprintf(err, errcap, "cannot start the %s listener on %s (address in use, or bad certificate/key?)",
                 listener_names[L->which], spec);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = info != NULL ? info->port : 0;
    return d;
}

/* ---- start-up helpers ------------------------------------------------------------------------------- */

static int path_join(char *out, size_t cap, const char *dir, const char *name)
{
    return (size_t)snprintf(out, cap, "%s/%s", dir, name) < cap ? 0 : -1;
}

static int trim_token(char *t)
{
    size_t n = strlen(t);
    while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t')) {
        t[--n] = '\0';
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)t[i];
        if (ch <= 0x20 || ch >= 0x7f) {
            return -1;
        }
    }
    return n >= 16 ? 0 : -1;
}

/* Finds the admin token: --admin-token-file, admin_token, or STATE/admin-token (generated if missing). */
static int resolve_admin_token(dprec_srv_config *cfg, char *token, size_t cap, char *where, size_t wcap)
{
    if (cfg->admin_token_file[0] == '\0' && cfg->admin_token[0] != '\0') {
        snprintf(token, cap, "%s", cfg->admin_token);
        snprintf(where, wcap, "config file (admin_token)");
        if (trim_token(token) != 0) {
            log_msg("error", "config", "admin_token must be at least 16 printable characters without spaces");
            return -1;
        }
        return 0;
    }
    char path[DPREC_SRV_PATH_MAX];
    int generated = 0;
    if (cfg->admin_token_file[0] != '\0') {
        snprintf(path, sizeof path, "%s", cfg->admin_token_file);
    } else {
        if (path_join(path, sizeof path, cfg->state_dir, "admin-token") != 0) {
            return -1;
        }
        if (access(path, F_OK) != 0) {
            unsigned char raw[32];
            char hex[65];
            if (dprec_srv_random(raw, sizeof raw) != 0) {
                log_msg("error", "admin_token", "no randomness for the admin token");
                return -1;
            }
            for (size_t i = 0; i < sizeof raw; i++) {
                snprintf(hex + 2 * i, 3, "%02x", raw[i]);
            }
            hex[64] = '\n';
            if (dprec_srv_write_file(path, hex, 65, 0600) != 0) {
                log_msg("error", "admin_token", "cannot write %s: %s", path, strerror(errno));
                return -1;
            }
            generated = 1;
        }
    }
    size_t len = 0;
    char *text = dprec_srv_read_file(path, 4096, &len);
    if (text == NULL) {
        log_msg("error", "admin_token", "cannot read the admin token file %s: %s", path, strerror(errno));
        return -1;
    }
    snprintf(token, cap, "%s", text);
    free(text);
    if (trim_token(token) != 0) {
        log_msg("error", "admin_token", "the admin token in %s must be at least 16 printable characters", path);
        return -1;
    }
    snprintf(where, wcap, "%s", path);
    if (generated) {
        log_msg("info", "admin_token", "generated a random admin token into %s (mode 0600); send it as "
                "'Authorization: Bearer <token>' to the admin listener", path);
    }
    return 0;
}

/* One server per state directory: an exclusive flock on STATE/lock, held for the life of the process (the kernel
 * drops it when the process ends, kill -9 included, so a stale file never blocks a restart). Two servers on one
 * state each keep their own view of the open rounds and close them wrongly. Returns the descriptor, or -1. */
static int lock_state_dir(const char *dir)
{
    char path[DPREC_SRV_PATH_MAX];
    if (path_join(path, sizeof path, dir, "lock") != 0) {
        log_msg("error", "start", "state directory path too long");
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_msg("error", "start", "cannot open the lock file %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char owner[32] = "";
        ssize_t n = pread(fd, owner, sizeof owner - 1, 0);
        owner[n > 0 ? n : 0] = '\0';
        owner[strcspn(owner, "\r\n")] = '\0';
        close(fd);
        if (e == EWOULDBLOCK) {
            log_msg("error", "start", "another dprec-aggregator (pid %s) is serving the state directory %s: stop it "
                    "first; two servers on one state directory corrupt each other's view of the rounds",
                    owner[0] != '\0' ? owner : "unknown", dir);
        } else {
            log_msg("error", "start", "cannot lock %s: %s", path, strerror(e));
        }
        return -1;
    }
    char pid[24];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        log_msg("warn", "start", "cannot write the pid into %s: %s", path, strerror(errno));
    }
    return fd;
}

static int write_ports(const char *state_dir, const char *dev_spec, uint16_t dev_port, const char *adm_spec,
                       uint16_t adm_port)
{
    char path[DPREC_SRV_PATH_MAX];
    if (path_join(path, sizeof path, state_dir, "ports.json") != 0) {
        return -1;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "device", dev_port);
    cJSON_AddNumberToObject(o, "admin", adm_port);
    cJSON_AddStringToObject(o, "device_listen", dev_spec);
    cJSON_AddStringToObject(o, "admin_listen", adm_spec);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s == NULL) {
        return -1;
    }
    size_t n = strlen(s);
    s[n] = '\n';
    int rc = dprec_srv_write_file(path, s, n + 1, 0644);
    free(s);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------------------- */

int dprec_serve_main(int argc, char **argv)
{
    static server srv; /* large (metrics); one per process */
    server *s = &srv;
    char err[512] = "";
    int rc = dprec_srv_config_load(&s->cfg, argc, argv, err, sizeof err);
    if (rc == 1) {
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "dprec-aggregator serve: %s\n", err);
        return EXIT_USAGE;
    }
    dprec_srv_config *cfg = &s->cfg;
    int exit_code = EXIT_RUNTIME;
    char *cert_pem = NULL, *key_pem = NULL;
    struct MHD_Daemon *dev = NULL, *adm = NULL;
    char token[256] = "", token_where[DPREC_SRV_PATH_MAX] = "";
    int lock_fd = -1;

    /* Signals: blocked before any thread exists (the core's and the daemons' threads inherit the mask), so
     * only the main thread's sigtimedwait sees SIGTERM/SIGINT. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (gnutls_global_init() < 0) {
        log_msg("error", "start", "gnutls_global_init failed");
        return EXIT_RUNTIME;
    }
    {
        cJSON *o = log_begin("info", "start");
        cJSON_AddStringToObject(o, "version", DPREC_VERSION_STRING);
        cJSON_AddStringToObject(o, "state_dir", cfg->state_dir);
        cJSON_AddNumberToObject(o, "threads", cfg->threads);
        cJSON_AddNumberToObject(o, "max_report_bytes", (double)cfg->max_report_bytes);
        log_end(o);
    }
    if (mkdir(cfg->state_dir, 0700) != 0 && errno != EEXIST) {
        log_msg("error", "start", "cannot create the state directory %s: %s", cfg->state_dir, strerror(errno));
        goto out;
    }
    if ((lock_fd = lock_state_dir(cfg->state_dir)) < 0) {
        goto out;
    }

    if (resolve_admin_token(cfg, token, sizeof token, token_where, sizeof token_where) != 0) {
        goto out;
    }

    /* TLS certificate and key. */
    {
        char cert_path[DPREC_SRV_PATH_MAX], key_path[DPREC_SRV_PATH_MAX];
        int generated = 0;
        if (cfg->cert[0] != '\0') {
            snprintf(cert_path, sizeof cert_path, "%s", cfg->cert);
            snprintf(key_path, sizeof key_path, "%s", cfg->key);
        } else {
            if (path_join(cert_path, sizeof cert_path, cfg->state_dir, "tls-cert.pem") != 0 ||
                path_join(key_path, sizeof key_path, cfg->state_dir, "tls-key.pem") != 0) {
                log_msg("error", "tls", "state directory path too long");
                goto out;
            }
            if (access(cert_path, R_OK) != 0 || access(key_path, R_OK) != 0) {
                if (dprec_srv_tls_generate(cert_path, key_path, err, sizeof err) != 0) {
                    log_msg("error", "tls", "cannot generate a self-signed certificate: %s", err);
                    goto out;
                }
                generated = 1;
            }
        }
        size_t cert_len = 0, key_len = 0;
        cert_pem = dprec_srv_read_file(cert_path, 1u << 20, &cert_len);
        key_pem = dprec_srv_read_file(key_path, 1u << 20, &key_len);
        if (cert_pem == NULL || key_pem == NULL) {
            log_msg("error", "tls", "cannot read the certificate %s or key %s: %s", cert_path, key_path,
                    strerror(errno));
            goto out;
        }
        char pin[64] = "";
        if (dprec_srv_tls_pin(cert_pem, cert_len, pin, sizeof pin) != 0) {
            log_msg("error", "tls", "the certificate %s is not a PEM X.509 certificate", cert_path);
            goto out;
        }
        char pin_path[DPREC_SRV_PATH_MAX];
        char pin_line[72];
        int pin_len = snprintf(pin_line, sizeof pin_line, "%s\n", pin);
        if (path_join(pin_path, sizeof pin_path, cfg->state_dir, "tls-pin.txt") != 0 ||
            dprec_srv_write_file(pin_path, pin_line, (size_t)pin_len, 0644) != 0) {
            log_msg("error", "tls", "cannot write the key pin into %s/tls-pin.txt", cfg->state_dir);
            goto out;
        }
        cJSON *o = log_begin(generated ? "warn" : "info", "tls");
        cJSON_AddStringToObject(o, "cert", cert_path);
        cJSON_AddStringToObject(o, "key", key_path);
        cJSON_AddStringToObject(o, "pin", pin);
        cJSON_AddBoolToObject(o, "self_signed_generated", generated);
        cJSON_AddBoolToObject(o, "self_signed", cfg->cert[0] == '\0');
        cJSON_AddStringToObject(o, "message",
                                cfg->cert[0] != '\0' ? "using the configured certificate"
                                : generated ? "generated a self-signed certificate for localhost/127.0.0.1 (local use "
                                              "only): devices trust it as their CA file or pin its key"
                                            : "using the previously generated self-signed certificate");
        log_end(o);
    }

    /* The core. */
    {
        char db[DPREC_SRV_PATH_MAX], sk[DPREC_SRV_PATH_MAX];
        if (path_join(db, sizeof db, cfg->state_dir, "state.db") != 0 ||
            path_join(sk, sizeof sk, cfg->state_dir, "signing-key.pem") != 0) {
            log_msg("error", "start", "state directory path too long");
            goto out;
        }
        dprec_agg_config ac;
        dprec_agg_config_default(&ac);
        ac.state_path = db;
        ac.signing_key_path = sk;
        ac.admin_token = token;
        ac.max_json_body = cfg->max_json_bytes;
        ac.max_report_body = cfg->max_report_bytes;
        if (cfg->group_commit_us >= 0) {
            ac.group_commit_us = cfg->group_commit_us;
        }
        ac.keep_report_payloads = cfg->keep_reports;
        ac.log = core_log;
        ac.log_user = NULL;
        if (dprec_agg_open(&ac, &s->agg, err, sizeof err) != 0) {
            log_msg("error", "start", "cannot open the aggregator state in %s: %s", cfg->state_dir, err);
            s->agg = NULL;
            goto out;
        }
        unsigned char der[512];
        size_t der_len = dprec_agg_public_key(s->agg, der, sizeof der);
        char der_path[DPREC_SRV_PATH_MAX];
        if (der_len == 0 || path_join(der_path, sizeof der_path, cfg->state_dir, "release-key.der") != 0 ||
            dprec_srv_write_file(der_path, der, der_len, 0644) != 0) {
            log_msg("error", "start", "cannot write the release public key into %s", cfg->state_dir);
            goto out;
        }
        unsigned char digest[32];
        char hex[65];
        gnutls_hash_fast(GNUTLS_DIG_SHA256, der, der_len, digest);
        for (size_t i = 0; i < 32; i++) {
            snprintf(hex + 2 * i, 3, "%02x", digest[i]);
        }
        cJSON *o = log_begin("info", "release_key");
        cJSON_AddStringToObject(o, "path", der_path);
        cJSON_AddStringToObject(o, "sha256", hex);
        cJSON_AddStringToObject(o, "message", "devices pin this DER public key to verify releases");
        log_end(o);
    }

    s->device.srv = s;
    s->device.which = DPREC_LISTENER_DEVICE;
    s->admin.srv = s;
    s->admin.which = DPREC_LISTENER_ADMIN;
    uint16_t dev_port = 0, adm_port = 0;
    dev = start_listener(s, &s->device, cfg->listen, cfg->threads, cert_pem, key_pem, &dev_port, err, sizeof err);
    if (dev == NULL) {
        log_msg("error", "listen", "%s", err);
        goto out;
    }
    adm = start_listener(s, &s->admin, cfg->admin_listen, cfg->admin_threads, cert_pem, key_pem, &adm_port, err,
                         sizeof err);
    if (adm == NULL) {
        log_msg("error", "listen", "%s", err);
        goto out;
    }
    if (write_ports(cfg->state_dir, cfg->listen, dev_port, cfg->admin_listen, adm_port) != 0) {
        log_msg("error", "listen", "cannot write %s/ports.json: %s", cfg->state_dir, strerror(errno));
        goto out;
    }
    {
        cJSON *o = log_begin("info", "listen");
        cJSON_AddStringToObject(o, "device", cfg->listen);
        cJSON_AddNumberToObject(o, "device_port", dev_port);
        cJSON_AddStringToObject(o, "admin", cfg->admin_listen);
        cJSON_AddNumberToObject(o, "admin_port", adm_port);
        cJSON_AddStringToObject(o, "admin_token_file", token_where);
        log_end(o);
        printf("dprec-aggregator: device listener https://%s (port %u), admin listener https://%s (port %u)\n",
               cfg->listen, dev_port, cfg->admin_listen, adm_port);
        fflush(stdout);
    }

    /* The clock: tick once a second until SIGTERM or SIGINT. */
    for (;;) {
        struct timespec wait = {1, 0};
        int sig = sigtimedwait(&sigs, NULL, &wait);
        if (sig == SIGTERM || sig == SIGINT) {
            log_msg("info", "shutdown", "received %s; stopping the listeners", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            break;
        }
        if (sig < 0 && errno != EAGAIN && errno != EINTR) {
            log_msg("error", "shutdown", "sigtimedwait: %s", strerror(errno));
            break;
        }
        int n = dprec_agg_tick(s->agg, (int64_t)time(NULL));
        if (n < 0) {
            log_msg("error", "tick", "the round engine failed (%d)", n);
        }
    }
    exit_code = 0;

out:
    if (dev != NULL) {
        MHD_stop_daemon(dev);
    }
    if (adm != NULL) {
        MHD_stop_daemon(adm);
    }
    if (s->agg != NULL) {
        dprec_agg_close(s->agg);
        s->agg = NULL;
    }
    if (key_pem != NULL) {
        gnutls_memset(key_pem, 0, strlen(key_pem));
    }
    gnutls_memset(token, 0, sizeof token);
    free(cert_pem);
    free(key_pem);
    gnutls_global_deinit();
    if (lock_fd >= 0) {
        close(lock_fd); /* releases the state directory */
    }
    log_msg("info", "stopped", exit_code == 0 ? "clean shutdown" : "stopped after an error");
    return exit_code;
}
