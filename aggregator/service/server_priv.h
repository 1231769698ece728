/* The HTTPS front end of `dprec-aggregator serve` and `dprec-relay serve` — internals shared by its files (not the
 * interface: that is server.h). Two libmicrohttpd daemons (TLS through GnuTLS, epoll, a thread pool each), the
 * device listener and the admin listener, over a backend (server.h: the aggregator's core, serve_agg.c, or the
 * relay's, relay/relay_main.c). One job per file, in the order a connection meets them:
 *
 *   serve_listen.c   the listeners: the listening sockets, the daemons' options (TLS priorities, limits, callbacks)
 *   serve_admit.c    admission: connections counted per client address (refused past the limit, before TLS), the
 *                    deadline of a request's head (a total, whatever trickles in), the listener's budget (a new
 *                    connection displaces the one that has waited longest for a head), the registration rate
 *   serve_request.c  a request's life: strict framing (400 bad_framing), headers and preflight, the body within the
 *                    in-flight budget, the answer, the suspension while the core's writer works
 *   serve_metrics.c  the HTTP metrics: counted per request, rendered with the backend's on /metrics
 *   serve_log.c      the log: one JSON object per line, rate limits for what an attacker can repeat
 *   server.c         the serve command: start-up, the clock and the signals, the drain
 *
 * The server is one static object (server.c) that every callback reaches through its listener_ctx. */
#ifndef DPREC_SRV_SERVER_PRIV_H
#define DPREC_SRV_SERVER_PRIV_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>

#include <pthread.h>
#include <sys/socket.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "server.h"

/* ---- the log (serve_log.c) ----------------------------------------------------------------------------- */

/* The start of a log line: {"ts", "level", "event"}; the caller adds fields and passes it to srv_log_end (which
 * writes and frees it). NULL when out of memory (srv_log_end(NULL) is a no-op). */
cJSON *srv_log_begin(const char *level, const char *event);
void srv_log_end(cJSON *o);
/* A log line with one message field. */
void srv_log_msg(const char *level, const char *event, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Rate limit of a repeatable event (key: the event's name, or when name is NULL an address): 1 to emit, with
 * *suppressed the lines dropped since the last one; 0 to drop this one. */
int srv_log_admit(const void *key, const char *name, uint64_t *suppressed);
/* The backend core's log sink (rate-limits its repeatable events). */
void srv_core_log(void *user, const char *json_line);
/* libmicrohttpd's logger (MHD_OPTION_EXTERNAL_LOGGER), rate-limited per format string. */
void srv_mhd_log(void *cls, const char *fmt, va_list ap);

/* ---- HTTP metrics (serve_metrics.c) --------------------------------------------------------------------- */

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
/* the number of latency buckets (serve_metrics.c: latency_buckets), and of the statuses counted one by one
 * (serve_metrics.c: status_codes) plus one for "other" */
#define N_BUCKETS ((size_t)14)
#define N_STATUS ((size_t)15)

enum refusal {
    REFUSED_PER_ADDRESS,
    REFUSED_INFLIGHT,
    REFUSED_RATE,
    REFUSED_DRAINING,
    REFUSED_FRAMING,
    REFUSED_CONNECTION_LIMIT,
    REFUSED_COUNT
};
/* connections the server closed before they sent a request's head */
enum shed { SHED_HEAD_TIMEOUT, SHED_BUDGET, SHED_COUNT };

typedef struct http_metrics {
    atomic_uint_fast64_t requests[2][ROUTE_COUNT][N_STATUS]; /* listener, route, status */
    atomic_uint_fast64_t latency[N_BUCKETS + 1];             /* non-cumulative; last is +Inf */
    atomic_uint_fast64_t latency_sum_ns;
    atomic_uint_fast64_t latency_count;
    atomic_uint_fast64_t too_large;
    atomic_uint_fast64_t refused[REFUSED_COUNT];
    atomic_uint_fast64_t shed[SHED_COUNT];
    atomic_int_fast64_t inflight_requests;
    atomic_int_fast64_t inflight_bytes;
    atomic_int_fast64_t inflight_bytes_peak;
    atomic_int_fast64_t connections;
} http_metrics;

/* "device", "admin": a dprec_listener's name in logs and metrics. */
extern const char *const srv_listener_names[2];

/* ---- per-address accounting (serve_admit.c) ------------------------------------------------------------ */

/* A client address as a key: IPv4 (also IPv4-mapped IPv6), or the /64 of an IPv6 address (one subscriber's
 * allocation: counting single IPv6 addresses would let one attacker take 2^64 slots). */
typedef struct addr_key {
    unsigned char b[9]; /* family tag, then 4 or 8 bytes */
} addr_key;

#define ADDR_BUCKETS 4096
typedef struct addr_entry addr_entry;

typedef struct addr_table {
    pthread_mutex_t mu;
    addr_entry *b[ADDR_BUCKETS];
    size_t n;
} addr_table;

/* ---- the server ------------------------------------------------------------------------------------- */

typedef struct server server;

/* A connection as admission sees it (serve_admit.c; MHD's socket context): while it waits for a request's head it
 * is on its listener's waiting list, oldest first, with the deadline by which the head must have arrived. */
typedef struct conn_rec conn_rec;

typedef struct listener_ctx {
    server *srv;
    dprec_listener which;
    addr_table conns;   /* open connections per client address on this listener; its mutex guards the fields below */
    conn_rec *wait_head, *wait_tail; /* connections waiting for a request's head, oldest first */
    unsigned open;      /* connections open on this listener */
    unsigned closing;   /* of which shut down by the deadline or the budget, not yet closed by libmicrohttpd */
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

/* A request in flight (serve_request.c). */
typedef struct req_ctx req_ctx;

/* ---- serve_metrics.c ---------------------------------------------------------------------------------- */

/* The route of a path, as the metrics count it. */
enum route srv_classify(const char *path);
/* Counts one answered request: its listener, route, status and latency. */
void srv_metrics_record(http_metrics *m, dprec_listener l, enum route r, unsigned status, uint64_t ns);
/* Answers GET /metrics: the backend's metrics, then the front end's. */
enum MHD_Result srv_serve_metrics(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                                  const char *url);

/* ---- serve_admit.c ------------------------------------------------------------------------------------ */

/* The key of a client address (and its text into text, when not NULL). 0, or -1 for another family. */
int srv_addr_key_of(const struct sockaddr *sa, addr_key *k, char *text, size_t cap);
/* 1 when a registration from this address is admitted (the token bucket of register_per_minute). */
int srv_register_admit(server *s, const struct sockaddr *sa);
/* The daemons' accept policy (before TLS: connections per address) and connection notifications (the counts). */
enum MHD_Result srv_on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
void srv_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);
/* A request's head arrived on c (its deadline no longer runs), and a request on c ended (the next head's deadline,
 * connection_timeout, starts). */
void srv_conn_head_arrived(listener_ctx *L, struct MHD_Connection *c);
void srv_conn_request_ended(listener_ctx *L, struct MHD_Connection *c);
/* Closes the connections of L whose head is late (the server's clock calls it once a second). */
void srv_conn_sweep(listener_ctx *L);
/* libmicrohttpd's own connection limit for a listener of this budget: above it, so that the budget's rule (shed the
 * oldest waiting connection) is what a new connection meets, not libmicrohttpd's refusal. */
unsigned srv_mhd_connection_limit(unsigned budget);

/* ---- serve_request.c ---------------------------------------------------------------------------------- */

/* Queues a response whose body was malloc'd (ownership passes to MHD) and records it. */
enum MHD_Result srv_respond(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                            const char *url, unsigned status, const char *content_type, unsigned char *body,
                            size_t body_len, uint32_t retry_after, int close);
/* Answers an error in the format of docs/protocol.md. */
enum MHD_Result srv_respond_error(listener_ctx *L, struct MHD_Connection *c, req_ctx *r, const char *method,
                                  const char *url, unsigned status, const char *code, const char *message);
/* The daemons' request handler and its completion (MHD_OPTION_NOTIFY_COMPLETED). */
enum MHD_Result srv_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls);
void srv_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);

/* ---- serve_listen.c ----------------------------------------------------------------------------------- */

/* Binds spec (HOST:PORT) and starts listener L's daemon on it, serving cert_pem/key_pem with threads threads;
 * *port_out gets the bound port. NULL with a message in err on failure. */
struct MHD_Daemon *srv_start_listener(server *s, listener_ctx *L, const char *spec, unsigned threads,
                                      const char *cert_pem, const char *key_pem, uint16_t *port_out, char *err,
                                      size_t errcap);

#endif /* DPREC_SRV_SERVER_PRIV_H */
