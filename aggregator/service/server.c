/* dprec-aggregator serve and dprec-relay serve — the HTTPS front end. Two libmicrohttpd daemons (TLS through GnuTLS,
 * epoll, a thread pool each): the device listener and the admin listener, over a backend (server.h: the aggregator's
 * core, serve_agg.c, or the relay's, relay/relay_main.c).
 *
 * A request's headers go to the core first (dprec_agg_preflight: route, method, credentials, the body's cap), so
 * that a request that will be refused costs no memory for its body; the body is then read up to its cap, within a
 * budget for all bodies in flight, and handed to dprec_agg_handle_async. An answer that waits for the core's
 * writer (a group commit, a round) waits on a suspended connection, which frees the listener's thread for the
 * others; the core's completion resumes it. Connections are limited per client address before TLS begins, and a
 * connection that says nothing is closed after the handshake timeout.
 *
 * The main thread waits for SIGTERM/SIGINT and drives the round engine's clock (dprec_agg_tick_async) once a
 * second; on a signal it stops accepting, drains the requests in flight (up to drain_seconds) and stops.
 *
 * Logs are one JSON object per line on stderr, in the core's schema. They never contain the admin token, a device
 * token or an Authorization header. */
#include <arpa/inet.h>
#include <ctype.h>
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
#include <strings.h>
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

/* One JSON object per line on stderr, for the server and the core alike: {"ts": ISO 8601 UTC with milliseconds,
 * "level": "debug"|"info"|"warn"|"error", "event": NAME, ...fields} (docs/operations.md lists the events). */
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

/* Rate limit for events an attacker can repeat at will (refused connections, failed logins, libmicrohttpd's
 * warnings): at most one line per key per LOG_EVERY_S seconds; the next line that goes out says how many were
 * suppressed meanwhile. A key is a string (the event name) or the address of libmicrohttpd's format string. */
#define LOG_EVERY_S 10
#define LOG_KEYS 32
static struct {
    const void *key;
    char name[32];
    time_t last;
    uint64_t suppressed;
} log_keys[LOG_KEYS];

/* 1: emit, with *suppressed the lines dropped since the last one; 0: drop this one. */
static int log_admit(const void *key, const char *name, uint64_t *suppressed)
{
    time_t now = time(NULL);
    pthread_mutex_lock(&log_mutex);
    int k = -1, free_k = -1;
    for (int i = 0; i < LOG_KEYS; i++) {
        if (log_keys[i].key == NULL && log_keys[i].name[0] == '\0') {
            if (free_k < 0) {
                free_k = i;
            }
        } else if (name != NULL ? strcmp(log_keys[i].name, name) == 0 : log_keys[i].key == key) {
            k = i;
            break;
        }
    }
    int emit = 1;
    *suppressed = 0;
    if (k < 0 && free_k >= 0) {
        k = free_k;
        log_keys[k].key = name != NULL ? NULL : key;
        snprintf(log_keys[k].name, sizeof log_keys[k].name, "%s", name != NULL ? name : "");
        log_keys[k].last = now;
    } else if (k >= 0) {
        if (now - log_keys[k].last < LOG_EVERY_S) {
            log_keys[k].suppressed++;
            emit = 0;
        } else {
            *suppressed = log_keys[k].suppressed;
            log_keys[k].suppressed = 0;
            log_keys[k].last = now;
        }
    }
    pthread_mutex_unlock(&log_mutex);
    return emit;
}

/* The core's log sink: it writes the same schema; the events an attacker can repeat are rate-limited here too. */
static void core_log(void *user, const char *json_line)
{
    (void)user;
    static const char *const limited[] = {"\"event\":\"admin_auth_failed\"", "\"event\":\"request_failed\""};
    for (size_t i = 0; i < sizeof limited / sizeof limited[0]; i++) {
        if (strstr(json_line, limited[i]) != NULL) {
            uint64_t sup = 0;
            if (!log_admit(NULL, limited[i] + 9, &sup)) {
                return;
            }
            cJSON *o = sup > 0 ? cJSON_Parse(json_line) : NULL;
            if (o != NULL) {
                cJSON_AddNumberToObject(o, "suppressed", (double)sup);
                log_end(o);
                return;
            }
        }
    }
    log_emit_line(json_line);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    uint64_t sup = 0;
    if (!log_admit(fmt, NULL, &sup)) {
        return;
    }
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) {
        msg[--n] = '\0';
    }
    cJSON *o = log_begin("warn", "http");
    cJSON_AddStringToObject(o, "message", msg);
    if (sup > 0) {
        cJSON_AddNumberToObject(o, "suppressed", (double)sup);
    }
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
/* the statuses counted one by one; anything else counts as "other" */
static const unsigned status_codes[] = {200, 201, 400, 401, 403, 404, 405, 409, 413, 414, 429, 431, 500, 503};
#define N_STATUS (sizeof status_codes / sizeof status_codes[0] + 1)

enum refusal { REFUSED_PER_ADDRESS, REFUSED_INFLIGHT, REFUSED_RATE, REFUSED_DRAINING, REFUSED_COUNT };
static const char *const refusal_names[REFUSED_COUNT] = {"connections_per_address", "inflight_bytes",
                                                         "register_rate", "shutting_down"};

typedef struct http_metrics {
    atomic_uint_fast64_t requests[2][ROUTE_COUNT][N_STATUS]; /* listener, route, status */
    atomic_uint_fast64_t latency[N_BUCKETS + 1];             /* non-cumulative; last is +Inf */
    atomic_uint_fast64_t latency_sum_ns;
    atomic_uint_fast64_t latency_count;
    atomic_uint_fast64_t too_large;
    atomic_uint_fast64_t refused[REFUSED_COUNT];
    atomic_int_fast64_t inflight_requests;
    atomic_int_fast64_t inflight_bytes;
    atomic_int_fast64_t inflight_bytes_peak;
    atomic_int_fast64_t connections;
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
                          listener_names[l], route_names[r], code, v);
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

/* ---- per-address accounting: connections and registrations --------------------------------------------- */

/* A client address as a key: IPv4 (also IPv4-mapped IPv6), or the /64 of an IPv6 address (one subscriber's
 * allocation: counting single IPv6 addresses would let one attacker take 2^64 slots). */
typedef struct addr_key {
    unsigned char b[9]; /* family tag, then 4 or 8 bytes */
} addr_key;

static int addr_key_of(const struct sockaddr *sa, addr_key *k, char *text, size_t cap)
{
    memset(k, 0, sizeof *k);
    if (text != NULL && cap > 0) {
        text[0] = '\0';
    }
    if (sa == NULL) {
        return -1;
    }
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        k->b[0] = 4;
        memcpy(k->b + 1, &in->sin_addr, 4);
        if (text != NULL) {
            inet_ntop(AF_INET, &in->sin_addr, text, (socklen_t)cap);
        }
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        const unsigned char *a = in6->sin6_addr.s6_addr;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            k->b[0] = 4;
            memcpy(k->b + 1, a + 12, 4);
        } else {
            k->b[0] = 6;
            memcpy(k->b + 1, a, 8);
        }
        if (text != NULL) {
            inet_ntop(AF_INET6, &in6->sin6_addr, text, (socklen_t)cap);
        }
        return 0;
    }
    return -1;
}

#define ADDR_BUCKETS 4096
typedef struct addr_entry {
    addr_key key;
    unsigned conns;      /* open connections */
    double tokens;       /* registration bucket */
    double refilled;     /* when the bucket was last refilled (monotonic seconds) */
    struct addr_entry *next;
} addr_entry;

typedef struct addr_table {
    pthread_mutex_t mu;
    addr_entry *b[ADDR_BUCKETS];
    size_t n;
} addr_table;

static unsigned addr_hash(const addr_key *k)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof k->b; i++) {
        h = (h ^ k->b[i]) * 16777619u;
    }
    return h % ADDR_BUCKETS;
}

/* the entry of k (created when create), under t->mu */
static addr_entry *addr_find(addr_table *t, const addr_key *k, int create)
{
    addr_entry **pp = &t->b[addr_hash(k)];
    for (addr_entry *e = *pp; e != NULL; e = e->next) {
        if (memcmp(e->key.b, k->b, sizeof k->b) == 0) {
            return e;
        }
    }
    if (!create) {
        return NULL;
    }
    addr_entry *e = calloc(1, sizeof *e);
    if (e != NULL) {
        e->key = *k;
        e->tokens = -1.0; /* a fresh bucket: full */
        e->next = *pp;
        *pp = e;
        t->n++;
    }
    return e;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* drops entries with no connection and a full bucket (under t->mu), when the table has grown */
static void addr_prune(addr_table *t, double now, unsigned per_minute)
{
    if (t->n < ADDR_BUCKETS * 4) {
        return;
    }
    for (size_t i = 0; i < ADDR_BUCKETS; i++) {
        addr_entry **pp = &t->b[i];
        while (*pp != NULL) {
            addr_entry *e = *pp;
            int full = e->tokens < 0 || per_minute == 0 || e->tokens + (now - e->refilled) * per_minute / 60.0 >= per_minute;
            if (e->conns == 0 && full) {
                *pp = e->next;
                free(e);
                t->n--;
            } else {
                pp = &e->next;
            }
        }
    }
}

/* ---- the server ------------------------------------------------------------------------------------- */

typedef struct server server;

typedef struct listener_ctx {
    server *srv;
    dprec_listener which;
    addr_table conns; /* open connections per client address on this listener */
} listener_ctx;

struct server {
    dprec_srv_config cfg;
    const dprec_srv_backend *b;
    void *core;
    listener_ctx device, admin;
    http_metrics metrics;
    addr_table registers;  /* registration buckets per address */
    atomic_int draining;   /* SIGTERM: finish what is in flight, take nothing new */
};

/* Limits of a request's head, answered in JSON (libmicrohttpd's own limits, past MHD_MEMORY_LIMIT, answer with
 * its built-in HTML page and close: docs/operations.md). */
#define URL_MAX 8192
#define HEADERS_MAX 16384
#define MHD_MEMORY_LIMIT (32u * 1024u)
/* An error answered before the body is read: a body announced up to this size is read and dropped first, so that a
 * client that sends its whole body before reading sees the answer; a larger one is answered at once and the
 * connection closed. */
#define DISCARD_MAX (1u << 20)

enum req_state { REQ_RUNNING = 0, REQ_SUSPENDED = 1, REQ_COMPLETED = 2 };

typedef struct req_ctx {
    struct timespec t0;
    server *srv;
    struct MHD_Connection *conn;
    char client[INET6_ADDRSTRLEN];
    unsigned char *body;
    size_t len, cap, limit;
    size_t reserved;      /* bytes of the in-flight budget held */
    uint64_t announced;   /* Content-Length, or UINT64_MAX */
    size_t discarded;     /* bytes of a refused body read and dropped */
    int refused;          /* an answer is ready in resp before the body was read: drop the body, then send it */
    int too_large;
    int responded;
    int64_t device;       /* from the preflight */
    atomic_int state;     /* enum req_state: the core's completion and the handler meet here */
    dprec_agg_request req;
    dprec_agg_origin origin;
    dprec_agg_response resp;
} req_ctx;

static uint64_t elapsed_ns(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t ns = (int64_t)(t1.tv_sec - t0->tv_sec) * 1000000000 + (t1.tv_nsec - t0->tv_nsec);
    return ns > 0 ? (uint64_t)ns : 0;
}

/* Takes n bytes of the in-flight body budget. 0, or -1 when they do not fit. */
static int inflight_reserve(server *s, req_ctx *r, size_t n)
{
    int64_t cur = atomic_load(&s->metrics.inflight_bytes);
    for (;;) {
        if ((uint64_t)cur + n > s->cfg.max_inflight_bytes) {
            return -1;
        }
        if (atomic_compare_exchange_weak(&s->metrics.inflight_bytes, &cur, cur + (int64_t)n)) {
            break;
        }
    }
    r->reserved += n;
    int64_t now = cur + (int64_t)n, peak = atomic_load(&s->metrics.inflight_bytes_peak);
    while (now > peak && !atomic_compare_exchange_weak(&s->metrics.inflight_bytes_peak, &peak, now)) {
    }
    return 0;
}

/* Queues a response whose body was malloc'd (ownership passes to MHD) and records it. */
static enum MHD_Result respond(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                               const char *url, unsigned status, const char *content_type, unsigned char *body,
                               size_t body_len, uint32_t retry_after, int close)
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
    if (close) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
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
        cJSON_AddStringToObject(o, "client", r->client);
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

/* An error body in the format of docs/protocol.md, into r->resp (sent now or once the body is dropped). */
static void error_into(dprec_agg_response *resp, unsigned status, const char *code, const char *message)
{
    char tmp[256];
    int n = snprintf(tmp, sizeof tmp, "{\"error\":\"%s\",\"message\":\"%s\"}", code, message);
    size_t len = n > 0 ? (size_t)n : 0;
    if (len >= sizeof tmp) {
        len = sizeof tmp - 1;
    }
    dprec_agg_response_free(resp);
    memset(resp, 0, sizeof *resp);
    resp->status = (int)status;
    resp->content_type = "application/json";
    resp->body = malloc(len);
    if (resp->body != NULL) {
        memcpy(resp->body, tmp, len);
        resp->body_len = len;
    }
    resp->retry_after = status == 429 || status == 503 ? 1 : 0;
}

/* Sends r->resp (the core's answer, or an error put there); ownership of its body passes to MHD. */
static enum MHD_Result respond_stored(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                                      const char *url, int close)
{
    unsigned status = r->resp.status >= 100 && r->resp.status <= 599 ? (unsigned)r->resp.status : 500;
    unsigned char *body = r->resp.body;
    size_t len = r->resp.body_len;
    r->resp.body = NULL;
    r->resp.body_len = 0;
    return respond(L, c, r, method, url, status, r->resp.content_type, body, len, r->resp.retry_after, close);
}

static enum MHD_Result respond_error(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                                     const char *url, unsigned status, const char *code, const char *message)
{
    error_into(&r->resp, status, code, message);
    if (r->resp.body == NULL) {
        return MHD_NO;
    }
    return respond_stored(L, c, r, method, url, status == 503 || status == 413 || status == 414 || status == 431);
}

/* An error known before the body: answered now when the body is large (or unknown), else after dropping it. */
static enum MHD_Result refuse_early(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                                    const char *url)
{
    /* a client that asked "Expect: 100-continue" waits for our word before sending its body: answer it now */
    const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    if (r->announced == 0 || r->announced == UINT64_MAX || r->announced > DISCARD_MAX ||
        (expect != NULL && strcasecmp(expect, "100-continue") == 0)) {
        return respond_stored(L, c, r, method, url, 1);
    }
    r->refused = 1;
    return MHD_YES;
}

static enum MHD_Result serve_metrics(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
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
        return respond_error(L, c, r, method, url, 500, "internal", "out of memory");
    }
    return respond(L, c, r, method, url, 200, "text/plain; version=0.0.4; charset=utf-8", (unsigned char *)b.p, b.len,
                   0, 0);
}

/* The core finished a request (from one of its threads): wake the connection if its handler suspended it. */
static void on_core_done(void *user)
{
    req_ctx *r = user;
    struct MHD_Connection *c = r->conn;
    if (atomic_exchange(&r->state, REQ_COMPLETED) == REQ_SUSPENDED) {
        MHD_resume_connection(c); /* r may be gone once this returns: the handler answers and MHD completes it */
    }
}

/* Sums the lengths of the request's headers (names and values), for the 431 check. */
static enum MHD_Result add_header_len(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    size_t *n = cls;
    *n += (key != NULL ? strlen(key) : 0) + (value != NULL ? strlen(value) : 0) + 4;
    return MHD_YES;
}

/* 1 when a registration from this address is admitted (a token bucket: register_per_minute a minute, bursts of as
 * many). */
static int register_admit(server *s, const struct sockaddr *sa)
{
    unsigned per_minute = s->cfg.register_per_minute;
    addr_key k;
    if (per_minute == 0 || addr_key_of(sa, &k, NULL, 0) != 0) {
        return 1;
    }
    double now = mono_s();
    pthread_mutex_lock(&s->registers.mu);
    addr_prune(&s->registers, now, per_minute);
    addr_entry *e = addr_find(&s->registers, &k, 1);
    int ok = 1;
    if (e != NULL) {
        if (e->tokens < 0) {
            e->tokens = per_minute;
        } else {
            e->tokens += (now - e->refilled) * per_minute / 60.0;
            if (e->tokens > per_minute) {
                e->tokens = per_minute;
            }
        }
        e->refilled = now;
        if (e->tokens >= 1.0) {
            e->tokens -= 1.0;
        } else {
            ok = 0;
        }
    }
    pthread_mutex_unlock(&s->registers.mu);
    return ok;
}

static enum MHD_Result on_first_call(listener_ctx *L, struct MHD_Connection *c, const char *url, const char *method,
                                     req_ctx *r)
{
    server *s = L->srv;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci != NULL ? ci->client_addr : NULL;
    addr_key k;
    addr_key_of(sa, &k, r->client, sizeof r->client); /* the key is not needed here, the text is */
    /* the connection sent a request: from now on it may idle for connection_timeout between requests */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->cfg.connection_timeout);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    r->announced = 0;
    if (cl != NULL) {
        char *end = NULL;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        r->announced = errno != 0 || end == cl || *end != '\0' ? UINT64_MAX : (uint64_t)n;
    } else if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL) {
        r->announced = UINT64_MAX;
    }
    if (atomic_load(&s->draining)) {
        atomic_fetch_add(&s->metrics.refused[REFUSED_DRAINING], 1);
        error_into(&r->resp, 503, "shutting_down", "the aggregator is shutting down; retry later");
        return respond_stored(L, c, r, method, url, 1);
    }
    size_t hlen = 0;
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_header_len, &hlen);
    if (strlen(url) > URL_MAX) {
        error_into(&r->resp, 414, "uri_too_long", "the request's path is longer than 8192 bytes");
        return refuse_early(L, c, r, method, url);
    }
    if (hlen > HEADERS_MAX) {
        error_into(&r->resp, 431, "headers_too_large", "the request's headers are larger than 16384 bytes");
        return refuse_early(L, c, r, method, url);
    }
    if (strcmp(url, "/metrics") == 0) {
        r->limit = 0;
        return MHD_YES; /* answered by the server itself on the final call */
    }
    r->req.listener = L->which;
    r->req.method = method;
    r->req.path = url;
    r->req.authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    r->origin.client = r->client;
    dprec_agg_preflight_result pf;
    int rc = s->b->preflight(s->core, &r->req, &r->origin, r->announced, &pf, &r->resp);
    if (rc != 0) {
        if (r->resp.status == 413) {
            atomic_fetch_add(&s->metrics.too_large, 1);
        }
        if (rc < 0 || r->resp.body == NULL) {
            error_into(&r->resp, 500, "internal", "out of memory");
        }
        return refuse_early(L, c, r, method, url);
    }
    r->limit = pf.body_cap;
    r->origin.device = pf.device;
    if (L->which == DPREC_LISTENER_DEVICE && strcmp(url, "/v1/register") == 0 && strcmp(method, "POST") == 0 &&
        !register_admit(s, sa)) {
        atomic_fetch_add(&s->metrics.refused[REFUSED_RATE], 1);
        uint64_t sup = 0;
        if (log_admit(NULL, "rate_limited", &sup)) {
            cJSON *o = log_begin("warn", "rate_limited");
            cJSON_AddStringToObject(o, "client", r->client);
            cJSON_AddStringToObject(o, "limit", "register_per_minute");
            cJSON_AddNumberToObject(o, "suppressed", (double)sup);
            log_end(o);
        }
        error_into(&r->resp, 429, "rate_limited", "too many registrations from this address; retry later");
        return refuse_early(L, c, r, method, url);
    }
    /* the body's memory is taken from the in-flight budget before it is read (a chunked body: as it grows) */
    if (r->announced != UINT64_MAX && r->announced > 0 && inflight_reserve(s, r, (size_t)r->announced) != 0) {
        atomic_fetch_add(&s->metrics.refused[REFUSED_INFLIGHT], 1);
        uint64_t sup = 0;
        if (log_admit(NULL, "inflight_full", &sup)) {
            cJSON *o = log_begin("warn", "inflight_full");
            cJSON_AddStringToObject(o, "client", r->client);
            cJSON_AddNumberToObject(o, "max_inflight_bytes", (double)s->cfg.max_inflight_bytes);
            cJSON_AddNumberToObject(o, "suppressed", (double)sup);
            log_end(o);
        }
        error_into(&r->resp, 503, "busy", "too many request bodies in flight; retry later");
        return respond_stored(L, c, r, method, url, 1);
    }
    return MHD_YES;
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
        r->srv = s;
        r->conn = c;
        atomic_init(&r->state, REQ_RUNNING);
        *con_cls = r;
        atomic_fetch_add(&s->metrics.inflight_requests, 1);
        return on_first_call(L, c, url, method, r);
    }
    if (*upload_data_size != 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->responded || r->too_large || r->refused) {
            /* Drop the rest of a refused body, but not forever: past the cap plus DISCARD_MAX, hang up. */
            r->discarded += n;
            return r->discarded > r->limit + DISCARD_MAX ? MHD_NO : MHD_YES;
        }
        if (n > r->limit - r->len) {
            r->too_large = 1;
            r->discarded = r->len + n;
            free(r->body);
            r->body = NULL;
            r->len = 0;
            atomic_fetch_add(&s->metrics.too_large, 1);
            return MHD_YES; /* answered 413 on the final call */
        }
        if (r->len + n > r->cap) {
            size_t ncap = r->cap == 0 ? 1024 : r->cap;
            while (ncap < r->len + n) {
                ncap *= 2;
            }
            if (ncap > r->limit) {
                ncap = r->limit;
            }
            if (ncap > r->reserved && inflight_reserve(s, r, ncap - r->reserved) != 0) {
                r->refused = 1;
                atomic_fetch_add(&s->metrics.refused[REFUSED_INFLIGHT], 1);
                error_into(&r->resp, 503, "busy", "too many request bodies in flight; retry later");
                free(r->body);
                r->body = NULL;
                r->len = 0;
                return MHD_YES;
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
    if (r->refused) {
        return respond_stored(L, c, r, method, url, 0);
    }
    if (r->too_large) {
        return respond_error(L, c, r, method, url, 413, "too_large", "body above the cap");
    }
    int st = atomic_load(&r->state);
    if (st == REQ_COMPLETED) {
        return respond_stored(L, c, r, method, url, 0); /* resumed: the core's answer is in r->resp */
    }
    if (st == REQ_SUSPENDED) {
        return MHD_YES; /* not reached: a suspended connection is not processed */
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
    r->req.body = r->body;
    r->req.body_len = r->len;
    int rc = s->b->handle_async(s->core, &r->req, &r->origin, &r->resp, on_core_done, r);
    if (rc < 0) {
        return respond_error(L, c, r, method, url, 500, "internal", "out of memory");
    }
    if (rc == 0) {
        atomic_store(&r->state, REQ_COMPLETED);
        return respond_stored(L, c, r, method, url, 0);
    }
    /* The answer waits for the core's writer (a group commit, a round): suspend the connection, which frees this
     * thread for the others. Suspend first, then publish it; if the core finished meanwhile, resume at once. */
    MHD_suspend_connection(c);
    int expected = REQ_RUNNING;
    if (!atomic_compare_exchange_strong(&r->state, &expected, REQ_SUSPENDED)) {
        MHD_resume_connection(c);
    }
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    listener_ctx *L = cls;
    (void)c;
    (void)toe;
    req_ctx *r = *con_cls;
    if (r != NULL) {
        if (r->reserved > 0) {
            atomic_fetch_sub(&L->srv->metrics.inflight_bytes, (int64_t)r->reserved);
        }
        atomic_fetch_sub(&L->srv->metrics.inflight_requests, 1);
        dprec_agg_response_free(&r->resp);
        free(r->body);
        free(r);
        *con_cls = NULL;
    }
}

/* ---- connections: per-address limit, handshake timeout --------------------------------------------------- */

/* Called for every new connection, before TLS: refuses a client address that holds connections_per_address
 * connections on this listener already. The count moves in on_connection (MHD may still drop a connection after
 * this; concurrent accepts may pass a few over the limit, at most one per listener thread). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addrlen;
    listener_ctx *L = cls;
    server *s = L->srv;
    if (s->cfg.connections_per_address == 0) {
        return MHD_YES;
    }
    addr_key k;
    char text[INET6_ADDRSTRLEN];
    if (addr_key_of(addr, &k, text, sizeof text) != 0) {
        return MHD_YES;
    }
    pthread_mutex_lock(&L->conns.mu);
    addr_entry *e = addr_find(&L->conns, &k, 0);
    int full = e != NULL && e->conns >= s->cfg.connections_per_address;
    pthread_mutex_unlock(&L->conns.mu);
    if (!full) {
        return MHD_YES;
    }
    atomic_fetch_add(&s->metrics.refused[REFUSED_PER_ADDRESS], 1);
    uint64_t sup = 0;
    if (log_admit(NULL, "connection_refused", &sup)) {
        cJSON *o = log_begin("warn", "connection_refused");
        cJSON_AddStringToObject(o, "listener", listener_names[L->which]);
        cJSON_AddStringToObject(o, "client", text);
        cJSON_AddStringToObject(o, "limit", "connections_per_address");
        cJSON_AddNumberToObject(o, "connections_per_address", s->cfg.connections_per_address);
        cJSON_AddNumberToObject(o, "suppressed", (double)sup);
        log_end(o);
    }
    return MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    listener_ctx *L = cls;
    server *s = L->srv;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    addr_key k;
    int keyed = ci != NULL && addr_key_of(ci->client_addr, &k, NULL, 0) == 0;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->metrics.connections, 1);
        *socket_context = NULL;
        if (keyed) {
            pthread_mutex_lock(&L->conns.mu);
            addr_prune(&L->conns, mono_s(), 0);
            addr_entry *e = addr_find(&L->conns, &k, 1);
            if (e != NULL) {
                e->conns++;
                *socket_context = e; /* marks the connection as counted */
            }
            pthread_mutex_unlock(&L->conns.mu);
        }
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        atomic_fetch_sub(&s->metrics.connections, 1);
        if (*socket_context != NULL && keyed) {
            pthread_mutex_lock(&L->conns.mu);
            addr_entry *e = addr_find(&L->conns, &k, 0);
            if (e != NULL && e->conns > 0) {
                e->conns--;
            }
            pthread_mutex_unlock(&L->conns.mu);
        }
    }
}

/* libmicrohttpd's unescaping of the path, except that %00 stays as it is: a decoded NUL would end the C string
 * early and "/v1/jobs/1/releases/1%00" would be served as ".../1". Kept encoded, the path matches no route (404). */
static size_t unescape_path(void *cls, struct MHD_Connection *c, char *uri)
{
    (void)cls;
    (void)c;
    char *w = uri;
    for (const char *p = uri; *p != '\0'; p++) {
        if (p[0] == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
            unsigned v = (unsigned)strtoul((char[3]){p[1], p[2], '\0'}, NULL, 16);
            if (v != 0) {
                *w++ = (char)v;
                p += 2;
                continue;
            }
        }
        *w++ = *p;
    }
    *w = '\0';
    return (size_t)(w - uri);
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

/* TLS 1.2 and 1.3 only, AEAD ciphers with forward secrecy only (no CBC, no SHA-1 MACs, no static RSA). */
#define TLS_PRIORITIES                                                                                                 \
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-256-GCM:+AES-128-GCM:+CHACHA20-POLY1305:"             \
    "-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA"

/* Binds the listening socket itself, so that a failure says why (address in use, permission, ...). */
static int listen_socket(const char *spec, const char *which, struct sockaddr_storage *ss, char *err, size_t errcap)
{
    socklen_t sslen = 0;
    if (parse_hostport(spec, ss, &sslen, err, errcap) != 0) {
        return -1;
    }
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        (ss->ss_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) ||
        bind(fd, (struct sockaddr *)ss, sslen) != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        snprintf(err, errcap, "cannot listen on %s for the %s listener: %s%s", spec, which, strerror(e),
                 e == EADDRINUSE ? " (another process holds that port)" : "");
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    return fd;
}

static struct MHD_Daemon *start_listener(server *s, listener_ctx *L, const char *spec, unsigned threads,
                                         const char *cert_pem, const char *key_pem, uint16_t *port_out, char *err,
                                         size_t errcap)
{
    struct sockaddr_storage ss;
    int fd = listen_socket(spec, listener_names[L->which], &ss, err, errcap);
    if (fd < 0) {
        return NULL;
    }
    unsigned flags = MHD_USE_TLS | MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
    if (ss.ss_family == AF_INET6) {
        flags |= MHD_USE_IPv6;
    }
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_LISTEN_SOCKET, fd, NULL},
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)(uintptr_t)cert_pem},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)(uintptr_t)key_pem},
        {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)(uintptr_t)TLS_PRIORITIES},
        /* until a connection sends its first request; then on_first_call sets connection_timeout */
        {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)s->cfg.handshake_timeout, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)s->cfg.connection_limit, NULL},
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)MHD_MEMORY_LIMIT, NULL},
        {threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (intptr_t)threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    /* The callbacks go through the varargs (function pointers do not fit an option array's slots). */
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, on_accept, L, on_request, L, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, L, MHD_OPTION_NOTIFY_CONNECTION, on_connection, L, MHD_OPTION_UNESCAPE_CALLBACK, unescape_path,
        NULL, MHD_OPTION_ARRAY, opts + 0, MHD_OPTION_END);
    if (d == NULL) {
        close(fd);
        snprintf(err, errcap, "cannot start the %s listener on %s (libmicrohttpd refused its options; see the "
                 "http lines above)", listener_names[L->which], spec);
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
static int lock_state_dir(const char *program, const char *dir)
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
            log_msg("error", "start", "another %s (pid %s) is serving the state directory %s: stop it "
                    "first; two servers on one state directory corrupt each other's view of the rounds", program,
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

void dprec_srv_log(const char *level, const char *event, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_msg(level, event, "%s", msg);
}

int dprec_srv_write_public_key(const char *state_dir, const char *name, const unsigned char *der, size_t len,
                               const char *what)
{
    char path[DPREC_SRV_PATH_MAX];
    if (len == 0 || path_join(path, sizeof path, state_dir, name) != 0 || dprec_srv_write_file(path, der, len, 0644) != 0) {
        log_msg("error", "start", "cannot write the public key into %s/%s", state_dir, name);
        return -1;
    }
    unsigned char digest[32];
    char hex[65];
    gnutls_hash_fast(GNUTLS_DIG_SHA256, der, len, digest);
    for (size_t i = 0; i < 32; i++) {
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    }
    cJSON *o = log_begin("info", "release_key");
    cJSON_AddStringToObject(o, "path", path);
    cJSON_AddStringToObject(o, "sha256", hex);
    cJSON_AddStringToObject(o, "message", what);
    log_end(o);
    return 0;
}

int dprec_srv_run(const dprec_srv_backend *b, int argc, char **argv)
{
    static server srv; /* large (metrics); one per process */
    server *s = &srv;
    s->b = b;
    pthread_mutex_init(&s->device.conns.mu, NULL);
    pthread_mutex_init(&s->admin.conns.mu, NULL);
    pthread_mutex_init(&s->registers.mu, NULL);
    char err[512] = "";
    int rc = dprec_srv_config_load(b, &s->cfg, argc, argv, err, sizeof err);
    if (rc == 1) {
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "%s serve: %s\n", b->program, err);
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
    if ((lock_fd = lock_state_dir(b->program, cfg->state_dir)) < 0) {
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
        long days_left = -1;
        if (dprec_srv_tls_check(cert_pem, cert_len, key_pem, key_len, &days_left, err, sizeof err) != 0) {
            log_msg("error", "tls", "refusing the certificate %s and key %s: %s", cert_path, key_path, err);
            goto out;
        }
        if (days_left >= 0 && days_left < 30) {
            log_msg("warn", "tls", "the certificate %s expires in %ld day(s): renew it", cert_path, days_left);
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
    s->core = b->open(cfg, token, core_log);
    if (s->core == NULL) {
        goto out;
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
        printf("%s: device listener https://%s (port %u), admin listener https://%s (port %u)\n", b->program,
               cfg->listen, dev_port, cfg->admin_listen, adm_port);
        fflush(stdout);
    }

    /* The clock: tick once a second until SIGTERM or SIGINT (the ticks do not wait for the rounds they close). */
    for (;;) {
        struct timespec wait = {1, 0};
        int sig = sigtimedwait(&sigs, NULL, &wait);
        if (sig == SIGTERM || sig == SIGINT) {
            log_msg("info", "shutdown", "received %s; draining in-flight requests (at most %u s)",
                    sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg->drain_seconds);
            break;
        }
        if (sig < 0 && errno != EAGAIN && errno != EINTR) {
            log_msg("error", "shutdown", "sigtimedwait: %s", strerror(errno));
            break;
        }
        if (b->tick != NULL) {
            b->tick(s->core, (int64_t)time(NULL));
        }
    }
    /* Drain: take no new connection, answer new requests on open ones 503 (Connection: close), and let every
     * request already in flight (a report waiting for its commit, an admin round close waiting for the global
     * step) finish and be answered, up to drain_seconds. */
    atomic_store(&s->draining, 1);
    {
        MHD_socket lfd = MHD_quiesce_daemon(dev);
        if (lfd != MHD_INVALID_SOCKET) {
            close(lfd);
        }
        lfd = MHD_quiesce_daemon(adm);
        if (lfd != MHD_INVALID_SOCKET) {
            close(lfd);
        }
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            int64_t n = atomic_load(&s->metrics.inflight_requests);
            if (n <= 0) {
                break;
            }
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - t0.tv_sec >= (time_t)cfg->drain_seconds) {
                /* Suspended requests cannot be cut off cleanly (libmicrohttpd cannot stop with them): leave as a
                 * crash would. The state is durable: nothing acknowledged is lost, an unfinished round resumes. */
                log_msg("warn", "stopped", "%lld request(s) still in flight after %u s; exiting without answering them",
                        (long long)n, cfg->drain_seconds);
                fflush(stderr);
                _exit(EXIT_RUNTIME);
            }
            struct timespec ms = {0, 20000000L};
            nanosleep(&ms, NULL);
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
    if (s->core != NULL) {
        b->close(s->core);
        s->core = NULL;
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
