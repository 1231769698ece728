/* A request's life on the front end, in the order libmicrohttpd calls srv_on_request:
 *   - the first call (headers only): the framing (ambiguous framing is 400 bad_framing and the connection closed,
 *     before anything reads the body or the next request), the head's deadline stopped, the client's address, the
 *     connection's idle timeout, the announced length,
 *     the drain, the head's limits (414, 431), then the backend's preflight (route, method, credentials, the body's
 *     cap), the registration rate and the body's share of the in-flight budget: a request that will be refused
 *     costs no memory for its body;
 *   - the body's calls: the body is read up to its cap (413 past it), its memory taken from the budget as it grows;
 *     the body of a request refused early is read and dropped (up to DISCARD_MAX past its cap), so that a client
 *     that sends its whole body before reading sees the answer;
 *   - the final call: /metrics (serve_metrics.c), or the backend's handle_async. An answer that waits for the
 *     core's writer (a group commit, a round) waits on a suspended connection, which frees the listener's thread
 *     for the others; the core's completion resumes it.
 * srv_on_completed gives back the budget and the request's memory, whatever the request's end.
 *
 * Its own file: the request's state (req_ctx, and the race between the handler and the core's completion) is
 * private to it. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "agg.h"
#include "server_priv.h"

/* An error answered before the body is read: a body announced up to this size is read and dropped first, so that a
 * client that sends its whole body before reading sees the answer; a larger one is answered at once and the
 * connection closed. */
#define DISCARD_MAX (1u << 20)

enum req_state { REQ_RUNNING = 0, REQ_SUSPENDED = 1, REQ_COMPLETED = 2 };

struct req_ctx {
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
};

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
enum MHD_Result srv_respond(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
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
    srv_metrics_record(&L->srv->metrics, L->which, srv_classify(url), status, ns);
    if (L->srv->cfg.log_debug) {
        cJSON *o = srv_log_begin("debug", "request");
        cJSON_AddStringToObject(o, "listener", srv_listener_names[L->which]);
        cJSON_AddStringToObject(o, "client", r->client);
        cJSON_AddStringToObject(o, "method", method);
        cJSON_AddStringToObject(o, "path", url);
        cJSON_AddNumberToObject(o, "status", status);
        cJSON_AddNumberToObject(o, "bytes_in", (double)r->len);
        cJSON_AddNumberToObject(o, "bytes_out", (double)body_len);
        cJSON_AddNumberToObject(o, "ms", (double)ns / 1e6);
        srv_log_end(o);
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
    return srv_respond(L, c, r, method, url, status, r->resp.content_type, body, len, r->resp.retry_after, close);
}

enum MHD_Result srv_respond_error(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
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

/* ---- strict framing ------------------------------------------------------------------------------------ */

/* What the headers say about where the body ends (RFC 9112 6.1-6.3), for frame_error. */
typedef struct framing {
    unsigned n_cl, n_te; /* Content-Length and Transfer-Encoding headers, duplicates counted */
    const char *cl, *te; /* the last value of each */
    int bad_name;        /* a header name with a character outside RFC 9110's tchar (a space before the colon) */
} framing;

static int is_tchar(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

static enum MHD_Result add_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    framing *f = cls;
    if (key == NULL || key[0] == '\0') {
        f->bad_name = 1;
        return MHD_YES;
    }
    for (const char *k = key; *k != '\0'; k++) {
        if (!is_tchar((unsigned char)*k)) {
            f->bad_name = 1;
        }
    }
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        f->n_cl++;
        f->cl = value != NULL ? value : "";
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        f->n_te++;
        f->te = value != NULL ? value : "";
    }
    return MHD_YES;
}

/* Why the request's framing is ambiguous, or NULL when it is not. Two parsers (a proxy in front, this server) that
 * disagree on where a body ends disagree on where the next request starts: request smuggling. So every framing
 * that RFC 9112 lets a server reject is rejected, whatever libmicrohttpd would do with it (it takes the first of two
 * Content-Lengths, and Transfer-Encoding over Content-Length): more than one Content-Length, even equal; a
 * Content-Length that is not 1*DIGIT; Content-Length with Transfer-Encoding; a Transfer-Encoding other than one
 * "chunked" (a body that ends only when the connection does), or in an HTTP/1.0 request; a header name that is not
 * a token ("Content-Length :" is a header another parser may take for Content-Length). */
static const char *frame_error(struct MHD_Connection *c, const char *version)
{
    framing f;
    memset(&f, 0, sizeof f);
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_framing, &f);
    if (f.bad_name) {
        return "a header name holds a character other than a token's (a space before the colon?)";
    }
    if (f.n_cl > 1) {
        return "more than one Content-Length header";
    }
    if (f.n_cl == 1) {
        size_t n = strlen(f.cl);
        if (n == 0 || n > 19 || strspn(f.cl, "0123456789") != n) {
            return "Content-Length is not a decimal number below 10^19";
        }
    }
    if (f.n_te > 0 && f.n_cl > 0) {
        return "both Content-Length and Transfer-Encoding";
    }
    if (f.n_te > 1 || (f.n_te == 1 && strcasecmp(f.te, "chunked") != 0)) {
        return "a Transfer-Encoding other than one 'chunked'";
    }
    if (f.n_te == 1 && version != NULL && strcmp(version, MHD_HTTP_VERSION_1_1) != 0) {
        return "Transfer-Encoding in a request older than HTTP/1.1";
    }
    return NULL;
}

static enum MHD_Result on_first_call(listener_ctx *L, struct MHD_Connection *c, const char *url, const char *method,
                                     const char *version, req_ctx *r)
{
    server *s = L->srv;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci != NULL ? ci->client_addr : NULL;
    addr_key k;
    srv_addr_key_of(sa, &k, r->client, sizeof r->client); /* the key is not needed here, the text is */
    /* the connection sent a request's head: its deadline stops (serve_admit.c), and from now on it may idle for
     * connection_timeout between requests */
    srv_conn_head_arrived(L, c);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->cfg.connection_timeout);
    /* ambiguous framing: 400 and the connection closed, before anything reads the body or the next request */
    const char *why = frame_error(c, version);
    if (why != NULL) {
        atomic_fetch_add(&s->metrics.refused[REFUSED_FRAMING], 1);
        uint64_t sup = 0;
        if (srv_log_admit(NULL, "bad_framing", &sup)) {
            cJSON *o = srv_log_begin("warn", "bad_framing");
            cJSON_AddStringToObject(o, "listener", srv_listener_names[L->which]);
            cJSON_AddStringToObject(o, "client", r->client);
            cJSON_AddStringToObject(o, "reason", why);
            cJSON_AddNumberToObject(o, "suppressed", (double)sup);
            srv_log_end(o);
        }
        error_into(&r->resp, 400, "bad_framing", why);
        return respond_stored(L, c, r, method, url, 1);
    }
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
        !srv_register_admit(s, sa)) {
        atomic_fetch_add(&s->metrics.refused[REFUSED_RATE], 1);
        uint64_t sup = 0;
        if (srv_log_admit(NULL, "rate_limited", &sup)) {
            cJSON *o = srv_log_begin("warn", "rate_limited");
            cJSON_AddStringToObject(o, "client", r->client);
            cJSON_AddStringToObject(o, "limit", "register_per_minute");
            cJSON_AddNumberToObject(o, "suppressed", (double)sup);
            srv_log_end(o);
        }
        error_into(&r->resp, 429, "rate_limited", "too many registrations from this address; retry later");
        return refuse_early(L, c, r, method, url);
    }
    /* the body's memory is taken from the in-flight budget before it is read (a chunked body: as it grows) */
    if (r->announced != UINT64_MAX && r->announced > 0 && inflight_reserve(s, r, (size_t)r->announced) != 0) {
        atomic_fetch_add(&s->metrics.refused[REFUSED_INFLIGHT], 1);
        uint64_t sup = 0;
        if (srv_log_admit(NULL, "inflight_full", &sup)) {
            cJSON *o = srv_log_begin("warn", "inflight_full");
            cJSON_AddStringToObject(o, "client", r->client);
            cJSON_AddNumberToObject(o, "max_inflight_bytes", (double)s->cfg.max_inflight_bytes);
            cJSON_AddNumberToObject(o, "suppressed", (double)sup);
            srv_log_end(o);
        }
        error_into(&r->resp, 503, "busy", "too many request bodies in flight; retry later");
        return respond_stored(L, c, r, method, url, 1);
    }
    return MHD_YES;
}

enum MHD_Result srv_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls)
{
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
        return on_first_call(L, c, url, method, version, r);
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
        return srv_respond_error(L, c, r, method, url, 413, "too_large", "body above the cap");
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
            return srv_respond_error(L, c, r, method, url, 404, "not_found",
                                     "metrics are served on the admin listener");
        }
        if (strcmp(method, "GET") != 0) {
            return srv_respond_error(L, c, r, method, url, 405, "method_not_allowed", "use GET");
        }
        return srv_serve_metrics(L, c, r, method, url);
    }
    r->req.body = r->body;
    r->req.body_len = r->len;
    int rc = s->b->handle_async(s->core, &r->req, &r->origin, &r->resp, on_core_done, r);
    if (rc < 0) {
        return srv_respond_error(L, c, r, method, url, 500, "internal", "out of memory");
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

void srv_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    listener_ctx *L = cls;
    (void)toe;
    req_ctx *r = *con_cls;
    if (r != NULL) {
        srv_conn_request_ended(L, c); /* the next head's deadline starts */
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
